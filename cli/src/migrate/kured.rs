//! kured's configuration, read from its DaemonSet (the container's flags and `KURED_*`
//! environment variables), as a DisruptionPolicy and Helm values; what has no equivalent is
//! named with what to do instead.

use std::collections::BTreeMap;

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Container};
use serde_json::{Map, Value, json};

use super::Migration;

/// kured's flags as given: name (without `--`) to value (`"true"` for a bare switch).
pub type Flags = BTreeMap<String, String>;

/// The kured container's flags: its command and args (`--flag=value`, `--flag value`, or a
/// bare `--switch`), then its `KURED_<FLAG>` environment variables where no flag set them
/// (kured reads both). Repeated flags (`--blocking-pod-selector`) are joined with `;`.
pub fn flags(daemonset: &DaemonSet) -> Result<(Flags, Container), String> {
    let container = super::program_container(daemonset, "kured")?;
    let mut flags = Flags::new();
    for (name, value) in super::container_flags(&container) {
        let value = value.trim_matches('"').to_owned();
        flags
            .entry(name)
            .and_modify(|v| {
                v.push(';');
                v.push_str(&value);
            })
            .or_insert(value);
    }
    for env in container.env.iter().flatten() {
        let (Some(flag), Some(value)) = (env.name.strip_prefix("KURED_"), env.value.as_ref())
        else {
            continue;
        };
        let name = flag.to_lowercase().replace('_', "-");
        flags.entry(name).or_insert_with(|| value.clone());
    }
    Ok((flags, container))
}

/// The host path a path inside the kured container is, through its volume mounts and the
/// DaemonSet's hostPath volumes (`/sentinel/reboot-required` with `/sentinel` from
/// `/var/run` is `/var/run/reboot-required`); the path itself when no mount covers it.
pub fn host_path(daemonset: &DaemonSet, container: &Container, path: &str) -> String {
    let volumes = super::pod_spec(daemonset)
        .ok()
        .and_then(|s| s.volumes.as_ref());
    for mount in container.volume_mounts.iter().flatten() {
        let Some(rest) = path.strip_prefix(mount.mount_path.trim_end_matches('/')) else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with('/')) {
            continue;
        }
        let host = volumes
            .into_iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.host_path.as_ref());
        if let Some(host) = host {
            return format!("{}{rest}", host.path.trim_end_matches('/'));
        }
    }
    path.to_owned()
}

/// kured's day names (`sun`, `mon`, ... or `sunday`) as the policy's (`Sun`, `Mon`, ...).
fn day(name: &str) -> Option<&'static str> {
    let lower = name.trim().to_lowercase();
    let days = [
        ("sun", "Sun"),
        ("mon", "Mon"),
        ("tue", "Tue"),
        ("wed", "Wed"),
        ("thu", "Thu"),
        ("fri", "Fri"),
        ("sat", "Sat"),
    ];
    days.iter()
        .find(|(short, _)| lower.starts_with(short))
        .map(|(_, day)| *day)
}

/// kured's `H:MM[:SS]` as `HH:MM` (seconds dropped: a window's minute covers them).
fn clock(value: &str) -> Option<String> {
    let mut parts = value.trim().split(':');
    let hours: u32 = parts.next()?.parse().ok()?;
    let minutes: u32 = parts.next().unwrap_or("0").parse().ok()?;
    (hours < 24 && minutes < 60).then(|| format!("{hours:02}:{minutes:02}"))
}

/// `key=value,key2=value2` as a LabelSelector's `matchLabels`.
fn match_labels(selector: &str) -> Value {
    let labels: Map<String, Value> = selector
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), Value::String(v.trim().to_owned())))
        .collect();
    json!({"matchLabels": labels})
}

/// kured's flags, read.
struct Read<'a> {
    flags: &'a Flags,
}

impl Read<'_> {
    /// The flag's value, unless empty.
    fn flag(&self, name: &str) -> Option<&str> {
        self.flags
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn truthy(&self, name: &str) -> bool {
        self.flag(name).is_some_and(|v| v == "true")
    }
}

/// What a migration builds up.
#[derive(Default)]
struct Out {
    spec: Map<String, Value>,
    agent_config: Map<String, Value>,
    values: Map<String, Value>,
    notes: Vec<String>,
}

impl Out {
    /// Sets the chart's `agent.<key>`.
    fn agent_value(&mut self, key: &str, value: Value) {
        let agent = self.values.entry("agent").or_insert_with(|| json!({}));
        if let Some(agent) = agent.as_object_mut() {
            agent.insert(key.into(), value);
        }
    }
}

/// The policy spec, Helm values and notes for kured's `flags` (from `daemonset`).
pub fn migrate(daemonset: &DaemonSet, flags: &Flags, container: &Container) -> Migration {
    let r = Read { flags };
    let mut out = Out::default();
    out.spec.insert("autoReboot".into(), json!(true));
    if let Some(n) = r.flag("concurrency") {
        match n.parse::<u32>() {
            Ok(n) => {
                out.spec.insert("maxConcurrent".into(), json!(n));
            }
            Err(_) => out.notes.push(format!(
                "--concurrency={n} is not a count; maxConcurrent stays 1"
            )),
        }
    }
    sentinel(&r, daemonset, container, &mut out);
    window(&r, &mut out);
    if let Some(timeout) = r.flag("drain-timeout").filter(|t| *t != "0" && *t != "0s") {
        out.spec.insert("drainTimeout".into(), json!(timeout));
    }
    if r.truthy("force-reboot") {
        out.spec.insert("onDrainTimeout".into(), json!("Force"));
    }
    blockers(&r, &mut out);
    node_labels(&r, &mut out);
    notifications(&r, &mut out);
    reboot_method(&r, &mut out);
    not_carried(&r, &mut out);
    let Out {
        spec,
        agent_config,
        mut values,
        notes,
    } = out;
    if !agent_config.is_empty() {
        let agent = values.entry("agent").or_insert_with(|| json!({}));
        if let Some(agent) = agent.as_object_mut() {
            agent.insert("config".into(), Value::Object(agent_config));
        }
    }
    Migration {
        policy_spec: Value::Object(spec),
        values: Value::Object(values),
        notes,
    }
}

/// The reboot sentinel: on the host, through systemd (the chart's rebootRequired.onHost).
fn sentinel(r: &Read, daemonset: &DaemonSet, container: &Container, out: &mut Out) {
    let mut reboot = Map::new();
    if let Some(path) = r.flag("reboot-sentinel") {
        reboot.insert(
            "sentinelFile".into(),
            json!(host_path(daemonset, container, path)),
        );
    }
    if let Some(command) = r.flag("reboot-sentinel-command") {
        let words: Vec<&str> = command.split_whitespace().collect();
        reboot.insert("sentinelCommand".into(), json!(words));
    }
    if let Some(period) = r.flag("period") {
        reboot.insert("interval".into(), json!(period));
    }
    if !reboot.is_empty() {
        reboot.insert("onHost".into(), json!(true));
        out.agent_config
            .insert("detectors".into(), json!({"rebootRequired": reboot}));
    }
}

/// The window: days, start and end, time zone.
fn window(r: &Read, out: &mut Out) {
    let days: Vec<&str> = r
        .flag("reboot-days")
        .map(|d| d.split(',').filter_map(day).collect())
        .unwrap_or_default();
    let (start, end) = (r.flag("start-time"), r.flag("end-time"));
    let all_week = days.is_empty() || days.len() == 7;
    let all_day = start.and_then(clock).is_none_or(|s| s == "00:00")
        && end.and_then(clock).is_none_or(|e| e == "23:59");
    if !(all_week && all_day) {
        let mut window = Map::new();
        if !all_week {
            window.insert("days".into(), json!(days));
        }
        window.insert(
            "start".into(),
            json!(start.and_then(clock).unwrap_or_else(|| "00:00".into())),
        );
        // kured's end is inclusive to the second; a window's end is the minute after.
        let end = end.and_then(clock).unwrap_or_else(|| "23:59".into());
        window.insert(
            "end".into(),
            json!(if end == "23:59" {
                "00:00".to_owned()
            } else {
                end
            }),
        );
        if let Some(zone) = r.flag("time-zone") {
            window.insert(
                "timeZone".into(),
                json!(if zone == "Local" { "UTC" } else { zone }),
            );
            if zone == "Local" {
                out.notes.push(
                    "--time-zone=Local: the window is in UTC; set timeZone to the nodes' zone"
                        .into(),
                );
            }
        }
        out.spec.insert("windows".into(), json!([window]));
    }
}

/// Blockers (pods and Prometheus alerts) and the pending taint.
fn blockers(r: &Read, out: &mut Out) {
    let mut blockers = Map::new();
    if let Some(selectors) = r.flag("blocking-pod-selector") {
        let selectors: Vec<Value> = selectors.split(';').map(match_labels).collect();
        blockers.insert("podSelectors".into(), json!(selectors));
        out.notes.push("rebootBlockers.podSelectors: any pod in any namespace matching them holds a reboot, as with kured; scope them with rebootBlockers.namespaces".into());
    }
    if let Some(url) = r.flag("prometheus-url") {
        let mut prometheus = Map::new();
        prometheus.insert("url".into(), json!(url));
        if let Some(filter) = r.flag("alert-filter-regexp") {
            let key = if r.truthy("alert-filter-match-only") {
                "alertFilter"
            } else {
                "ignoreAlerts"
            };
            prometheus.insert(key.into(), json!(filter));
        }
        prometheus.insert("firingOnly".into(), json!(r.truthy("alert-firing-only")));
        blockers.insert("prometheus".into(), Value::Object(prometheus));
    }
    if !blockers.is_empty() {
        out.spec
            .insert("rebootBlockers".into(), Value::Object(blockers));
    }
    if let Some(taint) = r.flag("prefer-no-schedule-taint") {
        out.spec.insert("taintWhilePending".into(), json!(true));
        out.notes.push(format!(
            "--prefer-no-schedule-taint={taint}: the taint is nodeward.io/maintenance-pending; tolerations of {taint} must change"
        ));
    }
}

/// Labels and annotations around the reboot.
fn node_labels(r: &Read, out: &mut Out) {
    let pairs = |name: &str| -> Vec<Value> {
        r.flag(name)
            .map(|list| {
                list.split([',', ';'])
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(k, v)| json!({"key": k.trim(), "value": v.trim()}))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (before, after) = (
        pairs("pre-reboot-node-labels"),
        pairs("post-reboot-node-labels"),
    );
    if !before.is_empty() || !after.is_empty() || r.truthy("annotate-nodes") {
        out.spec.insert(
            "nodeLabels".into(),
            json!({"beforeDrain": before, "afterSuccess": after, "annotate": r.truthy("annotate-nodes")}),
        );
    }
}

/// kured's reboot method. Its default, `systemctl reboot` run in the host's namespaces, asks
/// logind, which is nodeward's default too; another command or the signal carries over.
fn reboot_method(r: &Read, out: &mut Out) {
    let method = r.flag("reboot-method").unwrap_or("command");
    match method {
        "signal" => {
            out.agent_value("rebootMethod", json!("signal"));
            if let Some(signal) = r.flag("reboot-signal") {
                match signal.parse::<u8>() {
                    Ok(n) if (1..=64).contains(&n) => out.agent_value("rebootSignal", json!(n)),
                    _ => out.notes.push(format!(
                        "--reboot-signal={signal} is not a signal number (1-64); rebootSignal stays 39 (SIGRTMIN+5)"
                    )),
                }
            }
        }
        "command" => {
            let command = r.flag("reboot-command").unwrap_or(KURED_REBOOT_COMMAND);
            if command.split_whitespace().ne(KURED_REBOOT_COMMAND.split_whitespace()) {
                out.agent_value("rebootMethod", json!("command"));
                out.agent_value("rebootCommand", json!(command));
                if !command.starts_with('/') {
                    out.notes.push(format!(
                        "--reboot-command={command}: the chart needs the program's absolute path on the host in agent.rebootCommand"
                    ));
                }
            }
        }
        other => out.notes.push(format!(
            "--reboot-method={other} is neither command nor signal; the agent asks logind (rebootMethod: logind)"
        )),
    }
}

/// kured's default `--reboot-command`: asks logind, as nodeward's default method does.
const KURED_REBOOT_COMMAND: &str = "/bin/systemctl reboot";

/// The notification URL and templates.
fn notifications(r: &Read, out: &mut Out) {
    let hook = r.flag("notify-url").or(r.flag("slack-hook-url"));
    if let Some(url) = hook {
        // The agent reads webhook URLs and shoutrrr's slack, mattermost, generic and smtp ones;
        // other services (telegram, pushover, ...) it cannot send to, and teams:// names an
        // Office 365 connector, which Microsoft retired.
        let scheme = url.split("://").next().unwrap_or_default();
        let sent = [
            "http",
            "https",
            "slack",
            "mattermost",
            "generic",
            "generic+http",
            "generic+https",
            "teams+http",
            "teams+https",
            "smtp",
        ];
        if sent.contains(&scheme) {
            out.agent_value("notifyURL", json!(url));
        } else if scheme == "teams" {
            out.notes.push(format!(
                "--notify-url {url}: teams:// is an Office 365 connector webhook, which Microsoft retired; create a Workflows webhook in the channel and set agent.notifyURL to its https:// URL"
            ));
        } else {
            out.notes.push(format!(
                "--notify-url {url}: nodeward sends to webhooks (http(s), a Teams Workflows URL, and shoutrrr's slack://, mattermost://, generic://) and smtp://, not to {scheme}://; point it at a webhook"
            ));
        }
    }
    let mut templates = Map::new();
    for (flag_name, kind) in [
        ("message-template-drain", "DrainStarted"),
        ("message-template-reboot", "Rebooting"),
        ("message-template-uncordon", "Succeeded"),
    ] {
        if let Some(template) = r.flag(flag_name) {
            templates.insert(kind.into(), json!(template.replace("%s", "{node}")));
        }
    }
    if !templates.is_empty() {
        out.agent_config
            .insert("notifications".into(), json!({"templates": templates}));
    }
}

/// kured's flags with no equivalent, and why each is not needed or what to do instead.
const NOT_CARRIED: &[(&str, &str)] = &[
    (
        "ds-name",
        "the lock is the policy's slot list, not a DaemonSet annotation",
    ),
    (
        "ds-namespace",
        "the lock is the policy's slot list, not a DaemonSet annotation",
    ),
    (
        "lock-annotation",
        "the lock is the policy's slot list, not a DaemonSet annotation",
    ),
    (
        "lock-ttl",
        "a slot is freed when its maintenance ends, is deleted or its node goes; deadlines.* bound each phase",
    ),
    (
        "lock-release-delay",
        "the next node waits for healthGate.for after the reboot and, with workloadGate, for the workloads",
    ),
    (
        "drain-delay",
        "a drain starts once admitted; blockers and windows decide when",
    ),
    (
        "reboot-delay",
        "the reboot follows the drain; healthGate and workloadGate pace the rollout",
    ),
    (
        "drain-grace-period",
        "each pod gets its own grace period, capped by its drain stage's time left (drainPlan.stages[].timeout)",
    ),
    (
        "skip-wait-for-delete-timeout",
        "built in: a pod let go is waited for until 10 s past its grace period",
    ),
    (
        "drain-pod-selector",
        "write a drainPlan: skip rules keep pods (or label them nodeward.io/drain=skip), stages[].selector picks pods per stage",
    ),
    (
        "slack-channel",
        "a Slack incoming webhook posts to its own channel",
    ),
    (
        "slack-username",
        "a Slack incoming webhook posts under its own name",
    ),
    ("log-format", "the chart's logFormat value (text or json)"),
    (
        "metrics-host",
        "the agent serves /metrics on --listen (0.0.0.0:9470)",
    ),
    (
        "metrics-port",
        "the agent serves /metrics on --listen (0.0.0.0:9470)",
    ),
    ("node-id", "the chart passes the node name (NODE_NAME)"),
];

/// kured's flags this migration carries over.
const CARRIED: &[&str] = &[
    "reboot-method",
    "reboot-command",
    "reboot-signal",
    "concurrency",
    "reboot-sentinel",
    "reboot-sentinel-command",
    "period",
    "reboot-days",
    "start-time",
    "end-time",
    "time-zone",
    "drain-timeout",
    "force-reboot",
    "blocking-pod-selector",
    "prometheus-url",
    "alert-filter-regexp",
    "alert-filter-match-only",
    "alert-firing-only",
    "prefer-no-schedule-taint",
    "pre-reboot-node-labels",
    "post-reboot-node-labels",
    "annotate-nodes",
    "notify-url",
    "slack-hook-url",
    "message-template-drain",
    "message-template-reboot",
    "message-template-uncordon",
];

/// What has no equivalent, and why it is not needed or what to do; flags this migration does
/// not know.
fn not_carried(r: &Read, out: &mut Out) {
    for (name, instead) in NOT_CARRIED {
        if let Some(value) = r.flag(name) {
            out.notes
                .push(format!("--{name}={value}: not carried over: {instead}"));
        }
    }
    for (name, value) in r.flags {
        if !CARRIED.contains(&name.as_str()) && !NOT_CARRIED.iter().any(|(n, _)| *n == name) {
            out.notes.push(format!(
                "--{name}={value}: unknown to this migration; carried over as nothing"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kured's own manifest (kured-ds.yaml of release 1.20, kubereboot/kured, Apache-2.0), as
    /// shipped but with its commented flags given, as a user would.
    const KURED_DS: &str = include_str!("testdata/kured-ds.yaml");

    fn daemonset() -> DaemonSet {
        serde_yaml::from_str(KURED_DS).expect("kured's manifest")
    }

    #[test]
    fn kureds_own_manifest_becomes_a_policy_with_its_window_blockers_and_labels() {
        let ds = daemonset();
        let (flags, container) = flags(&ds).expect("flags");
        assert_eq!(flags["reboot-sentinel"], "/sentinel/reboot-required");
        assert_eq!(
            flags["blocking-pod-selector"],
            "runtime=long,cost=expensive;name=temperamental"
        );
        let m = migrate(&ds, &flags, &container);
        let spec = &m.policy_spec;
        assert_eq!(spec["maxConcurrent"], json!(2));
        assert_eq!(spec["autoReboot"], json!(true));
        assert_eq!(
            spec["windows"],
            json!([{"days": ["Mon", "Tue", "Wed", "Thu", "Fri"], "start": "02:00", "end": "05:30", "timeZone": "Europe/Berlin"}])
        );
        assert_eq!(spec["drainTimeout"], json!("15m"));
        assert_eq!(spec["onDrainTimeout"], json!("Force"));
        assert_eq!(
            spec["rebootBlockers"]["podSelectors"],
            json!([{"matchLabels": {"runtime": "long", "cost": "expensive"}}, {"matchLabels": {"name": "temperamental"}}])
        );
        assert_eq!(
            spec["rebootBlockers"]["prometheus"],
            json!({"url": "http://prometheus.monitoring.svc.cluster.local", "ignoreAlerts": "^RebootRequired$", "firingOnly": false})
        );
        assert_eq!(spec["taintWhilePending"], json!(true));
        assert_eq!(
            spec["nodeLabels"],
            json!({"beforeDrain": [{"key": "zalando", "value": "notready"}], "afterSuccess": [{"key": "zalando", "value": "ready"}], "annotate": true})
        );
        // The sentinel, as the host sees it (the DaemonSet mounts /var/run at /sentinel).
        assert_eq!(
            m.values["agent"]["config"]["detectors"]["rebootRequired"],
            json!({"sentinelFile": "/var/run/reboot-required", "interval": "1h", "onHost": true})
        );
        assert_eq!(
            m.values["agent"]["notifyURL"],
            json!("https://hooks.slack.com/services/T0/B0/x")
        );
        assert_eq!(
            m.values["agent"]["config"]["notifications"]["templates"]["DrainStarted"],
            json!("Draining node {node}")
        );
        for named in [
            "--lock-ttl",
            "--reboot-delay=90s",
            "--prefer-no-schedule-taint=weave.works/kured-node-reboot",
            "--slack-channel=alerting",
        ] {
            assert!(
                m.notes.iter().any(|n| n.contains(named)),
                "{named}: {:?}",
                m.notes
            );
        }
    }

    #[test]
    fn flags_come_from_args_as_pairs_and_from_kured_environment_variables() {
        let ds: DaemonSet = serde_yaml::from_str(
            r#"
spec:
  selector: {matchLabels: {name: kured}}
  template:
    spec:
      containers:
      - name: kured
        image: ghcr.io/kubereboot/kured:1.20.0
        args: ["--period", "30m", "--force-reboot", "--concurrency=3"]
        env:
        - {name: KURED_REBOOT_DAYS, value: "sat,sun"}
        - {name: KURED_PERIOD, value: "2h"}
"#,
        )
        .expect("daemonset");
        let (flags, _) = flags(&ds).expect("flags");
        assert_eq!(flags["period"], "30m", "a flag wins over its variable");
        assert_eq!(flags["force-reboot"], "true");
        assert_eq!(flags["concurrency"], "3");
        assert_eq!(flags["reboot-days"], "sat,sun");
    }

    #[test]
    fn a_retired_teams_connector_url_is_not_carried_and_a_workflows_url_is() {
        let ds = daemonset();
        let (_, container) = flags(&ds).expect("flags");
        let url = |url: &str| {
            let flags = Flags::from([("notify-url".to_owned(), url.to_owned())]);
            let m = migrate(&ds, &flags, &container);
            (m.values["agent"].get("notifyURL").cloned(), m.notes)
        };
        let (carried, notes) = url("teams://g@t/a/o?host=contoso.webhook.office.com");
        assert_eq!(carried, None);
        assert!(
            notes.iter().any(
                |n| n.contains("Microsoft retired") && n.contains("create a Workflows webhook")
            ),
            "{notes:?}"
        );
        let workflow = "https://prod-1.westeurope.logic.azure.com/workflows/a/triggers/manual/paths/invoke?sig=s";
        assert_eq!(url(workflow).0, Some(json!(workflow)));
    }

    #[test]
    fn a_whole_week_all_day_needs_no_window_and_clock_times_are_checked() {
        assert_eq!(clock("0:00"), Some("00:00".into()));
        assert_eq!(clock("23:59:59"), Some("23:59".into()));
        assert_eq!(clock("25:00"), None);
        let ds = daemonset();
        let (_, container) = flags(&ds).expect("flags");
        let all = Flags::from([
            (
                "reboot-days".to_owned(),
                "sun,mon,tue,wed,thu,fri,sat".to_owned(),
            ),
            ("start-time".to_owned(), "0:00".to_owned()),
            ("end-time".to_owned(), "23:59:59".to_owned()),
        ]);
        assert!(
            migrate(&ds, &all, &container)
                .policy_spec
                .get("windows")
                .is_none()
        );
    }

    #[test]
    fn kureds_reboot_methods_carry_over_and_its_default_command_becomes_logind() {
        let ds = daemonset();
        let (_, container) = flags(&ds).expect("flags");
        let values = |pairs: &[(&str, &str)]| {
            let flags: Flags = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let m = migrate(&ds, &flags, &container);
            (m.values.get("agent").cloned().unwrap_or_default(), m.notes)
        };
        let (agent, _) = values(&[("reboot-method", "command")]);
        assert_eq!(
            agent.get("rebootMethod"),
            None,
            "systemctl reboot asks logind"
        );
        let (agent, _) = values(&[("reboot-method", "signal"), ("reboot-signal", "40")]);
        assert_eq!(agent["rebootMethod"], "signal");
        assert_eq!(agent["rebootSignal"], 40);
        let (agent, _) = values(&[("reboot-command", "/usr/local/bin/safe-reboot --now")]);
        assert_eq!(agent["rebootMethod"], "command");
        assert_eq!(agent["rebootCommand"], "/usr/local/bin/safe-reboot --now");
        let (_, notes) = values(&[("reboot-command", "reboot")]);
        assert!(
            notes.iter().any(|n| n.contains("absolute path")),
            "{notes:?}"
        );
        let (_, notes) = values(&[("reboot-method", "signal"), ("reboot-signal", "99")]);
        assert!(
            notes.iter().any(|n| n.contains("--reboot-signal=99")),
            "{notes:?}"
        );
    }
}
