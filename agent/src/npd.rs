//! node-problem-detector's monitor configurations, loaded as they are (`--npd-config FILE`):
//! a system-log monitor reading the kernel log (`"plugin": "kmsg"`) becomes the kernel-log
//! patterns, one reading a program's journal messages (`"plugin": "journald"`) a journal
//! monitor, a custom plugin monitor (`"plugin": "custom"`) becomes custom checks that run its
//! plugin scripts unchanged. Permanent rules set conditions, temporary rules only Events; the
//! plugin monitor's interval, timeouts, output length and concurrency carry over.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use crate::detect::{
    custom::{Concurrency, CustomCheckConfig},
    journal_log::JournalMonitorConfig,
    kernel_log::KernelPatternConfig,
};
use crate::flags::{self, Flag};

/// The flags of the `npd` section.
pub fn flags() -> Vec<Flag> {
    flags::declare! {
        "npd-config" ("NODEWARD_NPD_CONFIG") => "configs": List, "node-problem-detector monitor files (kmsg, journald and custom plugin monitors) to load as they are; repeat the flag or separate with commas";
    }
}

/// The `npd` section: which node-problem-detector files to load and how to run their plugins.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NpdConfig {
    /// Monitor configuration files (JSON), e.g. `/config/kernel-monitor.json`.
    pub configs: Vec<PathBuf>,
    /// Relative plugin paths (`./config/plugin/check_ntp.sh`) are taken from here, as
    /// node-problem-detector takes them from its working directory (`/` in its image).
    pub plugin_root: PathBuf,
    /// Run the plugins on the host (transient systemd services) rather than in the agent's
    /// container, which has no shell: the scripts and their interpreter must be on the host.
    pub on_host: bool,
    /// The kernel rules of the files replace the kernel-log patterns configured (the
    /// defaults); otherwise those stay behind them, for the wordings the files' rules miss.
    pub replace_kernel_patterns: bool,
}

impl Default for NpdConfig {
    fn default() -> Self {
        Self {
            configs: Vec::new(),
            plugin_root: PathBuf::from("/"),
            on_host: false,
            replace_kernel_patterns: false,
        }
    }
}

/// One monitor file, as node-problem-detector reads it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Monitor {
    plugin: String,
    #[serde(default)]
    plugin_config: serde_json::Value,
    #[serde(default)]
    log_path: Option<String>,
    #[serde(default)]
    lookback: Option<String>,
    #[serde(default)]
    buffer_size: Option<u32>,
    source: String,
    #[serde(default)]
    metrics_reporting: Option<bool>,
    #[serde(default)]
    skip_initial_status: Option<bool>,
    #[serde(default)]
    conditions: Vec<DefaultCondition>,
    #[serde(default)]
    rules: Vec<Rule>,
}

/// A condition's reason and message while no rule finds a problem.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultCondition {
    #[serde(rename = "type")]
    type_: String,
    reason: String,
    #[serde(default)]
    message: String,
}

#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RuleType {
    Temporary,
    Permanent,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    #[serde(rename = "type")]
    type_: RuleType,
    #[serde(default)]
    condition: Option<String>,
    reason: String,
    /// System-log rules: the regular expression.
    #[serde(default)]
    pattern: Option<String>,
    /// System-log rules: said after the matched lines (`lines; suffix`).
    #[serde(default, rename = "patternGeneratedMessageSuffix")]
    message_suffix: Option<String>,
    /// Custom plugin rules: the plugin and its arguments.
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    timeout: Option<String>,
}

/// A custom plugin monitor's `pluginConfig`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginConfig {
    #[serde(default)]
    invoke_interval: Option<String>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    max_output_length: Option<usize>,
    #[serde(default)]
    concurrency: Option<usize>,
    /// Condition messages follow the output here always.
    #[serde(default)]
    enable_message_change_based_condition_update: Option<bool>,
}

/// What the files add to the agent's configuration.
#[derive(Debug, Default, PartialEq)]
pub struct Loaded {
    /// The kernel-log rules: before the configured patterns, or in their place.
    pub kernel_patterns: Vec<KernelPatternConfig>,
    /// The journald monitors of programs other than the kernel.
    pub journal_monitors: Vec<JournalMonitorConfig>,
    pub checks: Vec<CustomCheckConfig>,
}

/// Reads every file of `config`; the error names the file and the field.
pub fn load(config: &NpdConfig) -> Result<Loaded, String> {
    let mut loaded = Loaded::default();
    for path in &config.configs {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--npd-config {}: cannot read it: {e}", path.display()))?;
        parse(&text, config, &mut loaded)
            .map_err(|e| format!("--npd-config {}: {e}", path.display()))?;
    }
    Ok(loaded)
}

/// Adds one monitor file's rules to `loaded`.
pub fn parse(text: &str, config: &NpdConfig, loaded: &mut Loaded) -> Result<(), String> {
    let monitor: Monitor = serde_path_to_error::deserialize(
        &mut serde_json::Deserializer::from_str(text),
    )
    .map_err(|e| match e.path().to_string().as_str() {
        "." => e.into_inner().to_string(),
        path => format!("{path}: {}", e.into_inner()),
    })?;
    let _ = (&monitor.metrics_reporting, &monitor.skip_initial_status);
    match monitor.plugin.as_str() {
        "kmsg" => {
            loaded.kernel_patterns.extend(log_rules(&monitor)?);
            Ok(())
        }
        "journald" => journald_rules(&monitor, loaded),
        "custom" => custom_rules(&monitor, config, loaded),
        "filelog" => Err(format!(
            "plugin: \"filelog\" ({}) is not read here: the agent reads the kernel log from the journal or /dev/kmsg (kernelLog) and programs' messages from the journal; load kmsg, journald and custom monitors",
            monitor.log_path.as_deref().unwrap_or("no logPath")
        )),
        other => Err(format!(
            "plugin: {other:?} is not a node-problem-detector monitor plugin this agent loads (kmsg, journald, custom)"
        )),
    }
}

fn duration(place: &str, value: &str) -> Result<Duration, String> {
    nodeward_api::Duration::parse(value)
        .and_then(|d| d.to_std())
        .map_err(|e| format!("{place}: {e}"))
}

fn condition_of<'a>(
    monitor: &'a Monitor,
    index: usize,
    rule: &'a Rule,
) -> Result<Option<&'a str>, String> {
    match (rule.type_, rule.condition.as_deref()) {
        (RuleType::Temporary, _) => Ok(None),
        (RuleType::Permanent, Some(c)) if monitor.conditions.iter().any(|d| d.type_ == c) => {
            Ok(Some(c))
        }
        (RuleType::Permanent, Some(c)) => Err(format!(
            "rules[{index}].condition: {c:?} is not among the monitor's conditions; add it there with its default reason"
        )),
        (RuleType::Permanent, None) => Err(format!(
            "rules[{index}].condition: a permanent rule names the condition it sets"
        )),
    }
}

/// A journald monitor reads the journal messages of the program its `pluginConfig.source`
/// names (their SYSLOG_IDENTIFIER); `kernel` is the kernel log, which the kernel-log patterns
/// read (from the journal too, where it has files).
fn journald_rules(monitor: &Monitor, loaded: &mut Loaded) -> Result<(), String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct JournaldConfig {
        source: String,
    }
    let plugin: JournaldConfig = serde_path_to_error::deserialize(&monitor.plugin_config)
        .map_err(|e| {
            let place = match e.path().to_string().as_str() {
                "." => "pluginConfig".to_owned(),
                path => format!("pluginConfig.{path}"),
            };
            format!(
                "{place}: {} (a journald monitor names the program it reads: {{\"source\": \"systemd\"}})",
                e.inner()
            )
        })?;
    let patterns = log_rules(monitor)?;
    if plugin.source == "kernel" {
        loaded.kernel_patterns.extend(patterns);
        return Ok(());
    }
    let lookback = match monitor.lookback.as_deref() {
        None | Some("") => Duration::from_secs(300),
        Some(v) => duration("lookback", v)?,
    };
    loaded.journal_monitors.push(JournalMonitorConfig {
        identifier: plugin.source,
        lookback,
        patterns,
    });
    Ok(())
}

/// node-problem-detector's `bufferSize` when a monitor sets none.
const NPD_BUFFER_SIZE: u32 = 10;

/// A system-log monitor's rules as patterns, matched as node-problem-detector matches them:
/// against its last `bufferSize` lines joined with newlines, the pattern with `\z` appended as
/// it appends it (which, after a top-level alternation, binds only to the last branch).
fn log_rules(monitor: &Monitor) -> Result<Vec<KernelPatternConfig>, String> {
    if let Some(lookback) = monitor.lookback.as_deref().filter(|l| !l.is_empty()) {
        duration("lookback", lookback)?;
    }
    let lines = monitor.buffer_size.unwrap_or(NPD_BUFFER_SIZE);
    if lines == 0 || lines > 100 {
        return Err(format!(
            "bufferSize: {lines} lines; from 1 to 100 are read (node-problem-detector's default is 10)"
        ));
    }
    let mut patterns = Vec::new();
    for (index, rule) in monitor.rules.iter().enumerate() {
        let condition = condition_of(monitor, index, rule)?;
        let pattern = required(
            &rule.pattern,
            index,
            "pattern",
            "a log rule needs its pattern",
        )?;
        regex::Regex::new(pattern)
            .map_err(|e| format!("rules[{index}].pattern: not a regular expression: {e}"))?;
        let healthy = condition.and_then(|c| monitor.conditions.iter().find(|d| d.type_ == c));
        let mut loaded =
            KernelPatternConfig::new(&rule.reason, &format!("{pattern}\\z"), condition);
        loaded.lines = lines as usize;
        loaded.ok_reason = healthy.map(|d| d.reason.clone());
        loaded.ok_message = healthy.map(|d| d.message.clone());
        loaded.message_suffix = rule.message_suffix.clone().filter(|s| !s.is_empty());
        patterns.push(loaded);
    }
    Ok(patterns)
}

/// The field `rules[index].field` that a rule of its kind must have.
fn required<'a>(
    value: &'a Option<String>,
    index: usize,
    field: &str,
    why: &str,
) -> Result<&'a str, String> {
    value
        .as_deref()
        .ok_or_else(|| format!("rules[{index}].{field}: {why}"))
}

fn custom_rules(monitor: &Monitor, config: &NpdConfig, loaded: &mut Loaded) -> Result<(), String> {
    let plugin: PluginConfig = if monitor.plugin_config.is_null() {
        PluginConfig::default()
    } else {
        serde_path_to_error::deserialize(&monitor.plugin_config)
            .map_err(|e| format!("pluginConfig.{}: {}", e.path(), e.inner()))?
    };
    let _ = plugin.enable_message_change_based_condition_update;
    // node-problem-detector's defaults.
    let interval = match &plugin.invoke_interval {
        Some(v) => duration("pluginConfig.invoke_interval", v)?,
        None => Duration::from_secs(30),
    };
    let timeout = match &plugin.timeout {
        Some(v) => duration("pluginConfig.timeout", v)?,
        None => Duration::from_secs(5),
    };
    let concurrency = Concurrency::new(plugin.concurrency.unwrap_or(3));
    for (index, rule) in monitor.rules.iter().enumerate() {
        let condition = condition_of(monitor, index, rule)?;
        let path = required(&rule.path, index, "path", "a custom rule names its plugin")?;
        let program = if Path::new(path).is_absolute() {
            PathBuf::from(path)
        } else {
            config.plugin_root.join(path.trim_start_matches("./"))
        };
        let timeout = match &rule.timeout {
            Some(v) => duration(&format!("rules[{index}].timeout"), v)?,
            None => timeout,
        };
        let default = condition.and_then(|c| monitor.conditions.iter().find(|d| d.type_ == c));
        let mut command = vec![program.display().to_string()];
        command.extend(rule.args.iter().cloned());
        loaded.checks.push(CustomCheckConfig {
            name: check_name(&monitor.source, index),
            // A temporary rule's finding is named by its reason, in the NodeReport only.
            condition: condition.unwrap_or(&rule.reason).to_owned(),
            reason: rule.reason.clone(),
            command,
            interval,
            timeout: timeout.min(interval),
            max_output_length: plugin.max_output_length.unwrap_or(80),
            on_host: config.on_host,
            events_only: condition.is_none(),
            ok_reason: default.map(|d| d.reason.clone()),
            ok_message: default.map(|d| d.message.clone()).filter(|m| !m.is_empty()),
            concurrency: Some(concurrency.clone()),
            ..CustomCheckConfig::default()
        });
    }
    Ok(())
}

/// `<source>-<rule index>`, within the 48 characters of a check name.
fn check_name(source: &str, index: usize) -> String {
    let suffix = format!("-{index}");
    let keep = 48 - suffix.len();
    let source: String = source.chars().take(keep).collect();
    format!("{source}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// node-problem-detector's own monitor configurations (kubernetes/node-problem-detector,
    /// config/, Apache-2.0), as shipped.
    const KERNEL_MONITOR: &str = include_str!("npd/testdata/kernel-monitor.json");
    const CUSTOM_PLUGIN_MONITOR: &str = include_str!("npd/testdata/custom-plugin-monitor.json");
    const NETWORK_PROBLEM_MONITOR: &str = include_str!("npd/testdata/network-problem-monitor.json");
    const SYSTEMD_MONITOR: &str = include_str!("npd/testdata/systemd-monitor.json");

    fn loaded(text: &str) -> Loaded {
        let mut loaded = Loaded::default();
        parse(text, &NpdConfig::default(), &mut loaded).expect("loads");
        loaded
    }

    #[test]
    fn the_shipped_kernel_monitor_becomes_kernel_patterns_with_its_conditions() {
        let kernel = loaded(KERNEL_MONITOR).kernel_patterns;
        assert!(kernel.len() >= 10, "{kernel:?}");
        let oom = kernel
            .iter()
            .find(|p| p.reason == "OOMKilling")
            .expect("OOMKilling");
        assert_eq!(oom.condition, None, "temporary: an Event");
        let hung = kernel
            .iter()
            .find(|p| p.reason == "DockerHung")
            .expect("DockerHung");
        assert_eq!(hung.condition.as_deref(), Some("KernelDeadlock"));
        let fatal = kernel
            .iter()
            .find(|p| p.reason == "CperHardwareErrorFatal")
            .expect("CperHardwareErrorFatal");
        assert_eq!(fatal.condition.as_deref(), Some("CperHardwareErrorFatal"));
        let line = "[Hardware Error]: event severity: fatal";
        assert!(
            regex::Regex::new(&fatal.regex)
                .expect("regex")
                .is_match(line),
            "node-problem-detector's (RE2) pattern reads as written"
        );
    }

    #[test]
    fn the_shipped_custom_plugin_monitors_become_checks_with_their_timeouts_and_turns() {
        let checks = loaded(CUSTOM_PLUGIN_MONITOR).checks;
        let [temporary, permanent] = checks.as_slice() else {
            panic!("two rules: {checks:?}");
        };
        assert_eq!(temporary.name, "ntp-custom-plugin-monitor-0");
        assert!(temporary.events_only);
        assert_eq!(temporary.condition, "NTPIsDown");
        assert!(!permanent.events_only);
        assert_eq!(permanent.condition, "NTPProblem");
        assert_eq!(permanent.reason, "NTPIsDown");
        assert_eq!(permanent.ok_reason.as_deref(), Some("NTPIsUp"));
        assert_eq!(permanent.ok_message.as_deref(), Some("ntp service is up"));
        assert_eq!(permanent.command, ["/config/plugin/check_ntp.sh"]);
        assert_eq!(permanent.interval, Duration::from_secs(30));
        assert_eq!(
            permanent.timeout,
            Duration::from_secs(3),
            "the rule's own timeout"
        );
        assert_eq!(permanent.max_output_length, 80);
        assert_eq!(
            permanent.concurrency, temporary.concurrency,
            "one monitor's rules share its concurrency"
        );
        let network = loaded(NETWORK_PROBLEM_MONITOR).checks;
        assert_eq!(network.len(), 2);
        assert!(network.iter().all(|c| c.events_only));
        assert_ne!(network[0].concurrency, permanent.concurrency);
    }

    #[test]
    fn the_shipped_systemd_monitor_becomes_a_journal_monitor_of_systemds_messages() {
        let loaded = loaded(SYSTEMD_MONITOR);
        let [monitor] = loaded.journal_monitors.as_slice() else {
            panic!("one journal monitor: {loaded:?}");
        };
        assert_eq!(monitor.identifier, "systemd");
        assert_eq!(monitor.lookback, Duration::from_secs(300));
        let reasons: Vec<&str> = monitor.patterns.iter().map(|p| p.reason.as_str()).collect();
        assert_eq!(reasons, ["KubeletStart", "DockerStart", "ContainerdStart"]);
        assert!(monitor.patterns.iter().all(|p| p.condition.is_none()));
        // What systemd 257 writes when the kubelet starts.
        let kubelet = regex::Regex::new(&monitor.patterns[0].regex).expect("regex");
        assert!(kubelet.is_match("Started kubelet.service - kubelet: The Kubernetes Node Agent."));
        assert!(loaded.kernel_patterns.is_empty());
        // A journald monitor of the kernel's messages is the kernel log.
        let kernel = r#"{"plugin": "journald", "pluginConfig": {"source": "kernel"}, "source": "kernel-monitor",
            "rules": [{"type": "temporary", "reason": "OOMKilling", "pattern": "Killed process \\d+"}]}"#;
        let kernel = super::tests::loaded(kernel);
        assert!(kernel.journal_monitors.is_empty());
        assert_eq!(kernel.kernel_patterns[0].reason, "OOMKilling");
    }

    /// Feeds `lines` in order through the patterns of `text`: the reasons of the Events.
    fn events_of(text: &str, lines: &[&str]) -> Vec<(String, String)> {
        use crate::detect::kernel_log::{KernelLogConfig, Seen, compile, feed};
        let config = KernelLogConfig {
            patterns: loaded(text).kernel_patterns,
            ..KernelLogConfig::default()
        };
        let patterns = compile(&config).expect("compiled");
        let seen = std::sync::Mutex::new(Seen::default());
        lines
            .iter()
            .flat_map(|line| feed(&patterns, &seen, line, std::time::Instant::now()))
            .map(|e| (e.reason, e.note))
            .collect()
    }

    #[test]
    fn a_rule_matches_as_node_problem_detector_does_up_to_the_newest_line_across_its_buffer() {
        // As node-problem-detector's deployment/ ConfigMap writes its OOM rule: two lines.
        let text = r#"{"plugin": "kmsg", "source": "kernel-monitor", "bufferSize": 10, "rules": [
            {"type": "temporary", "reason": "OOMKilling",
             "pattern": "Kill process \\d+ (.+) score \\d+ or sacrifice child\\nKilled process \\d+ (.+) total-vm:\\d+kB, anon-rss:\\d+kB, file-rss:\\d+kB.*"},
            {"type": "temporary", "reason": "TaskHung", "pattern": "task [\\S ]+:\\w+ blocked for more than \\w+ seconds\\."}]}"#;
        let kill = "Kill process 2592 (stress) score 900 or sacrifice child";
        let killed = "Killed process 2592 (stress) total-vm:8240kB, anon-rss:4096kB, file-rss:0kB";
        let both = events_of(text, &[kill, killed]);
        assert_eq!(both.len(), 1, "{both:?}");
        assert_eq!(
            both[0],
            ("OOMKilling".to_owned(), format!("{kill}\n{killed}"))
        );
        assert!(
            events_of(text, &[killed]).is_empty(),
            "its first line is missing"
        );
        // The pattern must match up to the end of the newest line (node-problem-detector
        // appends \z): text after the period is another message.
        let hung = "INFO: task jbd2/sda1-8:123 blocked for more than 120 seconds.";
        assert_eq!(events_of(text, &[hung]).len(), 1);
        let suffixed = text.replace(
            r#""reason": "TaskHung","#,
            r#""reason": "TaskHung", "patternGeneratedMessageSuffix": "see runbook 7","#,
        );
        assert_eq!(
            events_of(&suffixed, &[hung])[0].1,
            format!("{hung}; see runbook 7")
        );
        assert!(events_of(text, &[&format!("{hung} (and more)")]).is_empty());
    }

    /// node-problem-detector v1.36.0's own verdicts on the corpus (`tests/npd/record-verdicts`):
    /// the Events per reason, and the conditions it ends with. Loaded from the same monitors
    /// and fed the same lines, nodeward publishes the same Events (a temporary rule's each
    /// match, a permanent rule's the condition turning True) and ends with the same conditions.
    #[test]
    fn node_problem_detectors_monitors_report_here_what_it_reports_itself() {
        use crate::detect::{
            Status,
            kernel_log::{KernelLogConfig, Seen, compile, evaluate, feed},
        };
        use std::collections::BTreeMap;
        let recorded: serde_json::Value =
            serde_json::from_str(include_str!("npd/testdata/npd-verdicts.json")).expect("JSON");
        let mut loaded = loaded(KERNEL_MONITOR);
        let quirks = include_str!("npd/testdata/quirks-monitor.json");
        parse(quirks, &NpdConfig::default(), &mut loaded).expect("loads");
        let config = KernelLogConfig {
            patterns: loaded.kernel_patterns,
            ..KernelLogConfig::default()
        };
        let patterns = compile(&config).expect("compiled");
        let seen = std::sync::Mutex::new(Seen::default());
        let mut events: BTreeMap<String, u64> = BTreeMap::new();
        let mut problems: BTreeMap<String, String> = BTreeMap::new();
        let now = std::time::Instant::now();
        for line in include_str!("npd/testdata/kernel-corpus.txt").lines() {
            for event in feed(&patterns, &seen, line, now) {
                *events.entry(event.reason).or_default() += 1;
            }
            for finding in evaluate(&patterns, &seen, now) {
                let condition = finding.condition.to_string();
                if finding.status == Status::Problem && !problems.contains_key(&condition) {
                    *events.entry(finding.reason.to_string()).or_default() += 1;
                    problems.insert(condition, finding.reason.to_string());
                }
            }
        }
        let as_json = |map: BTreeMap<String, serde_json::Value>| {
            serde_json::Value::Object(map.into_iter().collect())
        };
        assert_eq!(
            as_json(events.into_iter().map(|(k, v)| (k, v.into())).collect()),
            recorded["events"],
            "Events per reason"
        );
        assert_eq!(
            as_json(problems.into_iter().map(|(k, v)| (k, v.into())).collect()),
            recorded["conditions"],
            "conditions"
        );
    }

    #[test]
    fn a_bad_monitor_file_names_the_field() {
        let mut loaded = Loaded::default();
        let config = NpdConfig::default();
        for (text, says) in [
            (
                r#"{"plugin": "kmsg", "source": "k", "rules": [{"type": "sometimes", "reason": "X"}]}"#,
                "rules[0].type",
            ),
            (
                r#"{"plugin": "kmsg", "source": "k", "rules": [{"type": "temporary", "reason": "X", "pattern": "("}]}"#,
                "rules[0].pattern: not a regular expression",
            ),
            (
                r#"{"plugin": "kmsg", "source": "k", "rules": [{"type": "permanent", "condition": "C", "reason": "X", "pattern": "x"}]}"#,
                "rules[0].condition: \"C\" is not among the monitor's conditions",
            ),
            (
                r#"{"plugin": "custom", "source": "c", "pluginConfig": {"invoke_interval": "often"}, "rules": []}"#,
                "pluginConfig.invoke_interval",
            ),
            (
                r#"{"plugin": "custom", "source": "c", "pluginConfig": {"threads": 2}, "rules": []}"#,
                "pluginConfig.threads",
            ),
            (
                r#"{"plugin": "custom", "source": "c", "rules": [{"type": "temporary", "reason": "X"}]}"#,
                "rules[0].path",
            ),
            (
                r#"{"plugin": "journald", "source": "systemd-monitor", "rules": []}"#,
                "pluginConfig: invalid type: null",
            ),
            (
                r#"{"plugin": "filelog", "source": "f", "logPath": "/var/log/syslog", "rules": []}"#,
                "plugin: \"filelog\" (/var/log/syslog) is not read here",
            ),
            (
                r#"{"plugin": "kmsg", "source": "k", "rulez": []}"#,
                "unknown field `rulez`",
            ),
        ] {
            let e = parse(text, &config, &mut loaded).expect_err(says);
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    /// node-problem-detector's network monitor with its two shipped scripts, run unchanged
    /// from a plugin root laid out as its image is (`config/plugin/`).
    #[tokio::test]
    async fn shipped_plugin_scripts_run_unchanged_and_report_as_node_problem_detector_would() {
        let root = std::env::temp_dir().join(format!("nodeward-npd-{}", std::process::id()));
        let plugins = root.join("config/plugin");
        std::fs::create_dir_all(&plugins).expect("plugin dir");
        for script in ["network_problem.sh", "dns_problem.sh"] {
            let from = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("src/npd/testdata/plugin")
                .join(script);
            std::fs::copy(&from, plugins.join(script)).expect("copy the script");
        }
        let config = NpdConfig {
            plugin_root: root.clone(),
            ..NpdConfig::default()
        };
        let mut loaded = Loaded::default();
        parse(NETWORK_PROBLEM_MONITOR, &config, &mut loaded).expect("loads");
        let [conntrack, dns] = loaded.checks.as_slice() else {
            panic!("two rules: {:?}", loaded.checks);
        };
        let conntrack = crate::detect::custom::observe(conntrack).await;
        let dns = crate::detect::custom::observe(dns).await;
        let _ = std::fs::remove_dir_all(&root);
        // This machine's conntrack table is far from full.
        assert_eq!(conntrack.status, crate::detect::Status::Ok, "{conntrack:?}");
        assert_eq!(conntrack.reason, "NoConntrackFull");
        assert!(
            conntrack.message.starts_with("Conntrack table usage: "),
            "{}",
            conntrack.message
        );
        // No cluster DNS here: the script exits 1 (NONOK).
        assert_eq!(dns.status, crate::detect::Status::Problem, "{dns:?}");
        assert_eq!(dns.reason, "DNSUnreachable");
        assert_eq!(
            dns.message,
            "DNS lookup to kubernetes.default is not working"
        );
    }
}
