//! The agent's configuration file (YAML). Every field is optional; unknown fields are refused
//! so that a typo never silently turns a check off. Durations are written like `30s`, `5m`,
//! `1h30m`.
//!
//! Each section belongs to the part of the agent it configures, which defines its fields,
//! defaults and checks: a detector's in its `detect` module, `notifications` in `notify`,
//! `shutdownGuard` in `shutdown`, `reporting` in `report`, `reboot` in
//! `maintenance::reboot_method`, `npd` (node-problem-detector files) in `npd`, `fencing` (the
//! watchdog) in `fencing`, `inventory` (what the host runs) in `inventory`. Each detector has `interval` (how often it runs), `timeout` (after
//! which the run counts as Unknown) and `for` (how long a new verdict must hold before it is
//! reported or cleared).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{
    Error,
    detect::Detectors,
    fencing::FencingConfig,
    flags::{self, Given, Placed},
    host_stats::HostStatsConfig,
    inventory::InventoryConfig,
    maintenance::reboot_method::RebootConfig,
    notify::NotificationsConfig,
    npd::{self, NpdConfig},
    report::ReportingConfig,
    shutdown::ShutdownGuardConfig,
};

/// Where the agent looks for its configuration when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/nodeward/agent.yaml";

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Config {
    pub detectors: Detectors,
    pub host_stats: HostStatsConfig,
    pub reporting: ReportingConfig,
    pub shutdown_guard: ShutdownGuardConfig,
    pub notifications: NotificationsConfig,
    pub reboot: RebootConfig,
    pub npd: NpdConfig,
    pub fencing: FencingConfig,
    pub inventory: InventoryConfig,
}

impl Config {
    /// Reads `path`, or [`DEFAULT_PATH`] when none is given and it exists; the defaults when
    /// neither.
    pub fn load(path: Option<&Path>) -> Result<Self, Error> {
        match Self::read(path)? {
            Some((path, text)) => {
                Self::parse(&text).map_err(|message| Error::Config { path, message })
            }
            None => Ok(Self::default()),
        }
    }

    /// The file's path and text: `path`, or [`DEFAULT_PATH`] when none is given and it
    /// exists; `None` when neither.
    fn read(path: Option<&Path>) -> Result<Option<(PathBuf, String)>, Error> {
        let path = match path {
            Some(p) => p.to_path_buf(),
            None if Path::new(DEFAULT_PATH).exists() => PathBuf::from(DEFAULT_PATH),
            None => return Ok(None),
        };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Config {
            path: path.clone(),
            message: format!("cannot read it: {e}"),
        })?;
        Ok(Some((path, text)))
    }

    /// Parses and validates configuration text; the error names the field and the fix.
    pub fn parse(text: &str) -> Result<Self, String> {
        // An empty file is the defaults, as an empty YAML document would be.
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let config: Self = serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(
            text,
        ))
        .map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            // serde_yaml names the place itself, but only down to the enclosing map for a
            // field whose own parser (durations) refused the value: name the field itself.
            match inner.split_once(": ") {
                Some((place, rest)) if path != "." && path.starts_with(place) => {
                    format!("{path}: {rest}")
                }
                _ if path != "." && !inner.starts_with(&path) => format!("{path}: {inner}"),
                _ => inner,
            }
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every section; each names its fields' places (`detectors.peers.port`).
    fn validate(&self) -> Result<(), String> {
        self.reporting.validate("reporting")?;
        self.shutdown_guard.validate("shutdownGuard")?;
        self.detectors.validate("detectors")?;
        self.host_stats.validate("hostStats")?;
        self.reboot.validate("reboot")?;
        self.fencing.validate(
            "fencing",
            self.reporting.heartbeat_interval,
            self.detectors.peers.enabled,
        )?;
        self.inventory.validate("inventory")?;
        self.notifications.validate("notifications")
    }
}

impl Config {
    /// Every flag the sections declare, at their places: each sets one field, as the file
    /// would (see [`crate::flags`]).
    pub fn flags() -> Vec<Placed> {
        let mut flags = Detectors::flags("detectors");
        flags.extend(Placed::at("reporting", &crate::report::flags()));
        flags.extend(Placed::at("shutdownGuard", &crate::shutdown::flags()));
        flags.extend(Placed::at("notifications", &crate::notify::flags()));
        flags.extend(Placed::at(
            "reboot",
            &crate::maintenance::reboot_method::flags(),
        ));
        flags.extend(Placed::at("npd", &npd::flags()));
        flags.extend(Placed::at("fencing", &crate::fencing::flags()));
        flags.extend(Placed::at("inventory", &crate::inventory::flags()));
        flags
    }

    /// [`Self::load`], with `given` (flags, `--set`) written into the file's YAML before it
    /// is parsed and checked; an error about a field a flag set names the flag.
    pub fn load_with(path: Option<&Path>, given: &[Given]) -> Result<Self, String> {
        let (path, text) = match Self::read(path).map_err(|e| e.to_string())? {
            Some((path, text)) => (Some(path), text),
            None => (None, String::new()),
        };
        if given.is_empty() {
            return Self::parse(&text).map_err(|message| in_file(path.as_deref(), message));
        }
        let mut document: serde_yaml::Value = if text.trim().is_empty() {
            serde_yaml::Value::Null
        } else {
            serde_yaml::from_str(&text).map_err(|e| in_file(path.as_deref(), e.to_string()))?
        };
        flags::write_into(&mut document, given)?;
        let text = serde_yaml::to_string(&document).map_err(|e| e.to_string())?;
        Self::parse(&text).map_err(|message| {
            match given.iter().rev().find(|g| message.starts_with(&g.path)) {
                Some(g) => format!("{message} (set by {})", g.from),
                None => in_file(path.as_deref(), message),
            }
        })
    }

    /// Loads the node-problem-detector files of the `npd` section (after the flags): their
    /// kernel rules go before the kernel-log patterns configured (the defaults), which then
    /// report only what no rule of the same reason did (`npd.replaceKernelPatterns` drops
    /// them), their journald monitors join the journal monitors and their plugins the custom
    /// checks; then validates the whole again.
    pub fn with_npd(mut self) -> Result<Self, String> {
        if self.npd.configs.is_empty() {
            return Ok(self);
        }
        let loaded = npd::load(&self.npd)?;
        if !loaded.kernel_patterns.is_empty() {
            let configured = std::mem::replace(
                &mut self.detectors.kernel_log.patterns,
                loaded.kernel_patterns,
            );
            if !self.npd.replace_kernel_patterns {
                self.detectors
                    .kernel_log
                    .patterns
                    .extend(configured.into_iter().map(|mut p| {
                        p.fallback = true;
                        p
                    }));
            }
        }
        self.detectors
            .journal
            .monitors
            .extend(loaded.journal_monitors);
        self.detectors.custom.extend(loaded.checks);
        self.validate()
            .map_err(|e| format!("with the --npd-config files: {e}"))?;
        Ok(self)
    }
}

/// `message` about the file at `path` (none: the defaults), as [`Error::Config`] says it.
fn in_file(path: Option<&Path>, message: String) -> String {
    match path {
        Some(path) => Error::Config {
            path: path.to_path_buf(),
            message,
        }
        .to_string(),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::detect::{Schedule, routes::Ipv6Mode};

    /// node-problem-detector's kernel monitor loaded: its rules first, the defaults behind
    /// them for the wordings it misses (a line both match is one Event), unless replaced.
    #[test]
    fn node_problem_detectors_kernel_rules_keep_the_defaults_behind_them_unless_replaced() {
        use crate::detect::kernel_log::{Seen, compile, feed};
        let monitor = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/npd/testdata/kernel-monitor.json"
        );
        let reasons = |replace: bool, line: &str| -> Vec<String> {
            let config = Config::parse(&format!(
                "npd: {{configs: [{monitor}], replaceKernelPatterns: {replace}}}"
            ))
            .and_then(Config::with_npd)
            .expect("loads");
            let patterns = compile(&config.detectors.kernel_log).expect("compiled");
            let seen = std::sync::Mutex::new(Seen::default());
            feed(&patterns, &seen, line, std::time::Instant::now())
                .into_iter()
                .map(|e| e.reason)
                .collect()
        };
        // Both match: node-problem-detector's rule speaks, once.
        let both = "Out of memory: Killed process 2592 (stress) total-vm:8240kB, anon-rss:4096kB, file-rss:0kB, shmem-rss:0kB";
        assert_eq!(reasons(false, both), ["OOMKilling"]);
        // Only the defaults know today's wordings.
        let newer = "BUG: kernel NULL pointer dereference, address: 0000000000000008";
        assert_eq!(reasons(false, newer), ["KernelOops"]);
        assert!(
            reasons(true, newer).is_empty(),
            "replaced: node-problem-detector's alone"
        );
    }

    #[test]
    fn empty_text_is_the_defaults() {
        assert_eq!(Config::parse(""), Ok(Config::default()));
        assert!(Config::default().detectors.network.enabled);
    }

    #[test]
    fn reads_every_field() {
        let config = Config::parse(
            r#"
detectors:
  network:
    enabled: false
    interval: 1m
    timeout: 5s
    for: 2m
    interfaces:
      ignore: ["eth9", "tap*"]
    defaultRoute:
      ipv6: Required
    dns:
      names: [kubernetes.default.svc.cluster.local]
  rebootRequired:
    sentinelCommand: ["/usr/bin/needs-restarting", "-r"]
  securityGroups:
    expected: [k8s-nodes]
    metadataURL: http://127.0.0.1:8775
  custom:
  - name: ntp
    condition: NTPProblem
    reason: ClockNotSynchronized
    command: ["/usr/local/bin/check-ntp"]
    for: 30s
"#,
        )
        .expect("valid");
        let network = &config.detectors.network;
        assert!(!network.enabled);
        assert_eq!(
            network.schedule(),
            Schedule {
                interval: Duration::from_secs(60),
                timeout: Duration::from_secs(5),
                hold: Duration::from_secs(120)
            }
        );
        assert_eq!(network.interfaces.ignore, vec!["eth9", "tap*"]);
        assert_eq!(network.default_route.ipv6, Ipv6Mode::Required);
        assert_eq!(
            network.dns.names,
            vec!["kubernetes.default.svc.cluster.local"]
        );
        assert_eq!(
            config.detectors.reboot_required.sentinel_command,
            vec!["/usr/bin/needs-restarting", "-r"]
        );
        assert_eq!(
            config.detectors.security_groups.metadata_url,
            "http://127.0.0.1:8775"
        );
        let ntp = &config.detectors.custom[0];
        assert_eq!(
            (ntp.interval, ntp.hold, ntp.max_output_length),
            (Duration::from_secs(60), Duration::from_secs(30), 80)
        );
    }

    #[test]
    fn unknown_field_is_named_with_its_place() {
        let err = Config::parse("detectors:\n  network:\n    enabled: true\n    interfacez: {}\n")
            .expect_err("typo");
        assert!(
            err.contains("detectors.network") && err.contains("interfacez"),
            "{err}"
        );
        assert!(err.contains("expected one of"), "{err}");
    }

    #[test]
    fn wrong_enum_value_lists_the_allowed_ones() {
        let err = Config::parse("detectors:\n  network:\n    defaultRoute:\n      ipv6: always\n")
            .expect_err("bad enum");
        assert!(
            err.contains("ipv6") && err.contains("Auto") && err.contains("Required"),
            "{err}"
        );
    }

    #[test]
    fn bad_duration_is_named_with_the_fix() {
        let err = Config::parse("detectors:\n  kubelet:\n    interval: 10 minutes\n")
            .expect_err("bad duration");
        assert!(
            err.starts_with("detectors.kubelet.interval: \"10 minutes\" is not a duration"),
            "{err}"
        );
        assert!(err.contains("write it like 90s, 10m or 1h30m"), "{err}");
    }

    #[test]
    fn timeout_longer_than_interval_is_refused() {
        let err = Config::parse("detectors:\n  filesystem:\n    interval: 10s\n    timeout: 20s\n")
            .expect_err("overlap");
        assert!(err.starts_with("detectors.filesystem.timeout"), "{err}");
    }

    #[test]
    fn bad_ignore_pattern_names_the_entry_and_the_fix() {
        let err = Config::parse(
            "detectors:\n  network:\n    interfaces:\n      ignore: [\"eth0\", \"*eth\"]\n",
        )
        .expect_err("bad pattern");
        assert!(
            err.starts_with("detectors.network.interfaces.ignore[1]"),
            "{err}"
        );
        assert!(err.contains("prefix ending in a single '*'"), "{err}");
    }

    #[test]
    fn custom_checks_need_unique_names_camel_case_types_and_a_command() {
        let check = |name: &str, condition: &str, command: &str| {
            format!(
                "detectors:\n  custom:\n  - {{name: a, condition: AProblem, reason: Bad, command: [/bin/true]}}\n  - {{name: {name}, condition: {condition}, reason: Bad, command: {command}}}\n"
            )
        };
        let err = Config::parse(&check("a", "AProblem", "[/bin/true]")).expect_err("duplicate");
        assert!(err.starts_with("detectors.custom[1].name"), "{err}");
        let err =
            Config::parse(&check("b", "a-problem", "[/bin/true]")).expect_err("not CamelCase");
        assert!(err.starts_with("detectors.custom[1].condition"), "{err}");
        let err = Config::parse(&check("b", "BProblem", "[]")).expect_err("no command");
        assert!(err.starts_with("detectors.custom[1].command"), "{err}");
        let err = Config::parse(&check("b", "Ready", "[/bin/true]")).expect_err("the kubelet's");
        assert!(
            err.starts_with("detectors.custom[1].condition: \"Ready\" is written by the kubelet"),
            "{err}"
        );
        assert!(Config::parse(&check("b", "BProblem", "[/bin/false, -x]")).is_ok());
    }

    #[test]
    fn host_commands_need_absolute_paths_and_checks_are_bounded() {
        let err = Config::parse(
            "detectors:\n  custom:\n  - {name: a, condition: AProblem, reason: Bad, command: [systemctl, is-active, x], onHost: true}\n",
        )
        .expect_err("relative on the host");
        assert!(
            err.starts_with("detectors.custom[0].command[0]: a command run on the host"),
            "{err}"
        );
        let err = Config::parse(
            "detectors:\n  rebootRequired: {onHost: true, sentinelCommand: [needs-restarting, -r]}\n",
        )
        .expect_err("relative on the host");
        assert!(
            err.starts_with("detectors.rebootRequired.sentinelCommand[0]"),
            "{err}"
        );
        let many: String = (0..65)
            .map(|i| {
                format!(
                    "  - {{name: c{i}, condition: AProblem, reason: Bad, command: [/bin/true]}}\n"
                )
            })
            .collect();
        let err = Config::parse(&format!("detectors:\n  custom:\n{many}")).expect_err("65 checks");
        assert!(err.contains("at most 64 custom checks"), "{err}");
    }

    #[test]
    fn metadata_url_must_be_http() {
        let err =
            Config::parse("detectors:\n  securityGroups:\n    metadataURL: 169.254.169.254\n")
                .expect_err("no scheme");
        assert!(
            err.starts_with("detectors.securityGroups.metadataURL"),
            "{err}"
        );
    }

    #[test]
    fn peers_kernel_log_and_kubelet_settings_are_checked() {
        for (text, place) in [
            ("detectors:\n  peers: {port: 0}\n", "detectors.peers.port"),
            (
                "detectors:\n  peers: {sampleSize: 0}\n",
                "detectors.peers.sampleSize",
            ),
            (
                "detectors:\n  peers: {protocols: []}\n",
                "detectors.peers.protocols",
            ),
            (
                "detectors:\n  peers: {probeTimeout: 20s}\n",
                "detectors.peers.probeTimeout",
            ),
            (
                "detectors:\n  kubelet: {frequentRestarts: {count: 0}}\n",
                "detectors.kubelet.frequentRestarts.count",
            ),
            (
                "detectors:\n  kernelLog: {patterns: [{reason: Bad, regex: '(unclosed'}]}\n",
                "detectors.kernelLog.patterns[0].regex",
            ),
            (
                "detectors:\n  kernelLog: {patterns: [{reason: bad-reason, regex: 'x'}]}\n",
                "detectors.kernelLog.patterns[0].reason",
            ),
        ] {
            let err = Config::parse(text).expect_err(text);
            assert!(err.starts_with(place), "{text}: {err}");
        }
        let err = Config::parse("detectors:\n  peers: {protocols: [sctp]}\n")
            .expect_err("unknown protocol");
        assert!(
            err.contains("tcp") && err.contains("udp") && err.contains("icmp"),
            "{err}"
        );
    }

    /// The flags the sections declare: parsed as the agent's command line parses them,
    /// written over the file, and checked as the file is.
    fn with_flags(file: &str, args: &[&str]) -> Result<Config, String> {
        let flags = Config::flags();
        let command = flags.iter().fold(
            clap::Command::new("nodeward-agent").arg(flags::set_arg()),
            |c, f| c.arg(f.arg()),
        );
        let matches = command
            .try_get_matches_from(std::iter::once("nodeward-agent").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        let given = flags::given(&matches, &flags)?;
        // Under the run's scratch directory when `tests/run` gives one (it removes it).
        let root = std::env::var_os("NODEWARD_TEST_SCRATCH")
            .map_or_else(std::env::temp_dir, std::path::PathBuf::from);
        let dir = root.join(format!("nodeward-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let path = dir.join(format!("{}.yaml", file.len()));
        std::fs::write(&path, file).map_err(|e| e.to_string())?;
        Config::load_with(Some(&path), &given)
    }

    #[test]
    fn flags_and_environment_override_the_file() {
        let config = with_flags(
            "detectors:\n  peers:\n    port: 9000\n    sampleSize: 3\n",
            &[
                "--reboot-sentinel=/run/needs-reboot",
                "--heartbeat-interval=2m",
                "--expected-security-groups=k8s-nodes,web",
                "--peer-port=9999",
                "--logind-drop-in-dir=/run/systemd/logind.conf.d",
                "--reboot-command=/sbin/reboot now",
                "--set=detectors.kubelet.healthzURL=http://127.0.0.1:10248/healthz",
            ],
        )
        .expect("valid flags");
        let d = &config.detectors;
        assert_eq!(
            d.reboot_required.sentinel_file,
            PathBuf::from("/run/needs-reboot")
        );
        assert_eq!(
            config.reporting.heartbeat_interval,
            Duration::from_secs(120)
        );
        assert_eq!(d.security_groups.expected, vec!["k8s-nodes", "web"]);
        assert_eq!(
            (d.peers.port, d.peers.sample_size),
            (9999, 3),
            "the file's other fields stay"
        );
        assert!(config.shutdown_guard.write_drop_in);
        assert_eq!(config.reboot.command, vec!["/sbin/reboot", "now"]);
        assert_eq!(d.kubelet.healthz_url, "http://127.0.0.1:10248/healthz");

        let err = with_flags("", &["--heartbeat-interval=soon"]).expect_err("bad duration");
        assert!(
            err.starts_with("reporting.heartbeatInterval: \"soon\" is not a duration")
                && err.ends_with("(set by --heartbeat-interval)"),
            "{err}"
        );
        let err = with_flags("", &["--peer-port=0"]).expect_err("bad port");
        assert!(
            err.starts_with("detectors.peers.port") && err.contains("--peer-port"),
            "{err}"
        );
        let err = with_flags("", &["--set=detectors.peers.porrt=1"]).expect_err("a typo");
        assert!(
            err.contains("porrt") && err.contains("expected one of"),
            "{err}"
        );
    }

    #[test]
    fn every_declared_flag_is_one_field_of_the_configuration() {
        let flags = Config::flags();
        let mut longs: Vec<&str> = flags.iter().map(|f| f.flag.long).collect();
        longs.sort_unstable();
        longs.dedup();
        assert_eq!(longs.len(), flags.len(), "a flag declared twice");
        // Each flag's field exists: a value of the wrong type is refused by that field's own
        // parser, not as an unknown field.
        for f in &flags {
            let given = [flags::Given {
                path: f.path(),
                value: serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(
                    Default::default(),
                )]),
                from: format!("--{}", f.flag.long),
            }];
            let err = Config::load_with(Some(Path::new("/dev/null")), &given).expect_err(&f.path());
            assert!(!err.contains("unknown field"), "{}: {err}", f.path());
        }
    }

    #[test]
    fn missing_file_is_an_error_naming_the_path() {
        let err = Config::load(Some(Path::new("/nonexistent/nodeward.yaml"))).expect_err("missing");
        assert!(
            err.to_string().contains("/nonexistent/nodeward.yaml"),
            "{err}"
        );
    }

    #[test]
    fn fencing_is_refused_where_a_healthy_node_would_fence_or_no_peer_could_be_asked() {
        let on = Config::parse("fencing: {enabled: true}").expect("the defaults fit");
        assert_eq!(on.fencing.fence_after.as_secs(), 600);
        for (text, says) in [
            (
                "fencing: {enabled: true}\nreporting: {heartbeatInterval: 6m}",
                "fencing.fenceAfter: must be at least twice reporting.heartbeatInterval (360s)",
            ),
            (
                "fencing: {enabled: true, fenceAfter: 5s}",
                "fencing.fenceAfter: must be from 10s to 24h",
            ),
            (
                "fencing: {enabled: true, timeout: 0s}",
                "fencing.timeout: must be whole seconds from 1s to 600s",
            ),
            (
                "fencing: {enabled: true, timeout: 1500ms}",
                "fencing.timeout: must be whole seconds",
            ),
            (
                "fencing: {enabled: true, device: ''}",
                "fencing.device: name the watchdog device",
            ),
            (
                "fencing: {enabled: true}\ndetectors: {peers: {enabled: false}}",
                "fencing.enabled: fencing asks the peers",
            ),
            (
                "fencing: {enabled: true, after: 1m}",
                "unknown field `after`",
            ),
        ] {
            let err = Config::parse(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
        // Off, nothing is checked.
        Config::parse("fencing: {timeout: 0s}").expect("off");
    }
}

#[cfg(test)]
mod documented {
    use super::Config;

    /// The configuration reference in docs/agent.md is a file the agent takes as it is.
    #[test]
    fn the_documented_configuration_parses_and_passes_its_checks() {
        let doc = include_str!("../../docs/agent.md");
        let section = doc
            .split_once("## Configuration")
            .map(|(_, rest)| rest)
            .expect("docs/agent.md has a Configuration section");
        let yaml = section
            .split_once("```yaml\n")
            .and_then(|(_, rest)| rest.split_once("```"))
            .map(|(yaml, _)| yaml)
            .expect("a yaml block in it");
        if let Err(e) = Config::parse(yaml) {
            panic!("docs/agent.md's configuration is refused: {e}");
        }
    }
}
