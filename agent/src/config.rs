//! The agent's configuration file (YAML). Every field is optional; unknown fields are refused
//! so that a typo never silently turns a check off. Durations are written like `30s`, `5m`,
//! `1h30m`.
//!
//! Each detector has `interval` (how often it runs), `timeout` (after which the run counts as
//! Unknown) and `for` (how long a new verdict must hold before it is reported or cleared).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Deserializer};

use crate::Error;

/// Where the agent looks for its configuration when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/nodeward/agent.yaml";

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Config {
    pub detectors: Detectors,
    pub reporting: ReportingConfig,
    pub shutdown_guard: ShutdownGuardConfig,
    pub notifications: NotificationsConfig,
}

/// Webhook notifications about this node's maintenances (JSON POST with retries; a failed
/// notification never holds a maintenance up).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NotificationsConfig {
    /// Where to POST; none sent when empty.
    pub url: String,
    /// Extra request headers, e.g. `Authorization` (keep the file private then).
    pub headers: std::collections::BTreeMap<String, String>,
    /// The events sent; all when empty.
    pub events: Vec<crate::notify::NoticeKind>,
    /// The body's `text` per event, with placeholders `{node}`, `{maintenance}`, `{reason}`,
    /// `{action}`, `{message}`, `{correlation}`.
    pub templates: std::collections::BTreeMap<crate::notify::NoticeKind, String>,
    /// Tries per notification, the first included.
    pub attempts: u32,
    /// Longest one try may take.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            headers: std::collections::BTreeMap::new(),
            events: Vec::new(),
            templates: std::collections::BTreeMap::new(),
            attempts: 5,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The systemd-logind shutdown guard.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ShutdownGuardConfig {
    pub enabled: bool,
    /// How long the drain before a shutdown may take; logind's `InhibitDelayMaxSec` must be
    /// at least this (see `writeDropIn`).
    #[serde(deserialize_with = "duration")]
    pub budget: Duration,
    /// The lock is released this long before the budget (or logind's delay) ends; unset, a
    /// twentieth of the drain's time, from 1s to 5s (`shutdown::guard::margin`).
    #[serde(deserialize_with = "optional_duration")]
    pub safety_margin: Option<Duration>,
    /// Write a `logind.conf.d` drop-in raising `InhibitDelayMaxSec` to the budget, and reload
    /// logind, when its delay is shorter (on by default: logind's own default, 5s, leaves a
    /// drain almost nothing).
    pub write_drop_in: bool,
    /// Where the drop-in goes.
    pub drop_in_dir: PathBuf,
    /// The drain plan before a shutdown (default: ordinary pods by priority, critical pods,
    /// DaemonSet pods).
    pub drain_plan: Option<nodeward_api::DrainPlan>,
    /// Hold a logind `block` lock while no maintenance of this node is admitted, so that
    /// uncoordinated reboots and shutdowns are refused.
    pub reboot_gate: bool,
}

impl Default for ShutdownGuardConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            budget: Duration::from_secs(120),
            safety_margin: None,
            write_drop_in: true,
            drop_in_dir: PathBuf::from("/etc/systemd/logind.conf.d"),
            drain_plan: None,
            reboot_gate: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ReportingConfig {
    /// How often the NodeReport's heartbeat is refreshed (the only periodic write).
    #[serde(deserialize_with = "duration")]
    pub heartbeat_interval: Duration,
}

impl Default for ReportingConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(60),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Detectors {
    pub network: NetworkConfig,
    pub reboot_required: RebootConfig,
    pub filesystem: FilesystemConfig,
    pub security_groups: SecurityGroupsConfig,
    pub kubelet: KubeletConfig,
    pub peers: PeersConfig,
    pub kernel_log: KernelLogConfig,
    pub custom: Vec<CustomCheckConfig>,
}

/// When and how long a detector runs, and how long a verdict must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub interval: Duration,
    pub timeout: Duration,
    pub hold: Duration,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NetworkConfig {
    pub enabled: bool,
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(rename = "for", deserialize_with = "duration")]
    pub hold: Duration,
    pub interfaces: InterfacesConfig,
    pub default_route: RoutesConfig,
    pub dns: DnsConfig,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            hold: Duration::from_secs(30),
            interfaces: InterfacesConfig::default(),
            default_route: RoutesConfig::default(),
            dns: DnsConfig::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct InterfacesConfig {
    /// Interfaces that never count as the node's network: exact names, or prefixes ending in
    /// `*`. By default the bridges and veths that container runtimes and CNIs create.
    pub ignore: Vec<String>,
}

impl Default for InterfacesConfig {
    fn default() -> Self {
        let defaults = [
            "veth*",
            "docker*",
            "cni*",
            "cali*",
            "flannel*",
            "cilium_*",
            "kube-ipvs*",
            "virbr*",
            "lxc*",
            "tunl*",
        ];
        Self {
            ignore: defaults.into_iter().map(String::from).collect(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RoutesConfig {
    pub ipv6: Ipv6Mode,
}

/// Whether an IPv6 default route is expected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum Ipv6Mode {
    /// Expected when the node has a global IPv6 address.
    #[default]
    Auto,
    Required,
    Ignored,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DnsConfig {
    /// Names that must resolve through the node's resolver; none means no DNS check.
    pub names: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RebootConfig {
    pub enabled: bool,
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(rename = "for", deserialize_with = "duration")]
    pub hold: Duration,
    /// A reboot is required while this file exists (kured's `--reboot-sentinel`).
    pub sentinel_file: PathBuf,
    /// When set, a reboot is required while this command exits 0 (kured's
    /// `--reboot-sentinel-command`); it replaces the sentinel file.
    pub sentinel_command: Vec<String>,
}

impl Default for RebootConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(30),
            hold: Duration::ZERO,
            sentinel_file: PathBuf::from("/var/run/reboot-required"),
            sentinel_command: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct FilesystemConfig {
    pub enabled: bool,
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(rename = "for", deserialize_with = "duration")]
    pub hold: Duration,
    /// Paths that must be on writable filesystems; paths that do not exist are skipped.
    pub paths: Vec<PathBuf>,
}

impl Default for FilesystemConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            hold: Duration::ZERO,
            paths: ["/var/lib/kubelet", "/var/lib/containerd", "/var/log"]
                .map(PathBuf::from)
                .to_vec(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SecurityGroupsConfig {
    /// Security groups this node must be a member of; none turns the check off.
    pub expected: Vec<String>,
    /// Base URL of the EC2-compatible instance metadata service (AWS, OpenStack).
    #[serde(rename = "metadataURL")]
    pub metadata_url: String,
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(rename = "for", deserialize_with = "duration")]
    pub hold: Duration,
}

impl Default for SecurityGroupsConfig {
    fn default() -> Self {
        Self {
            expected: Vec::new(),
            metadata_url: "http://169.254.169.254".to_owned(),
            interval: Duration::from_secs(300),
            timeout: Duration::from_secs(5),
            hold: Duration::ZERO,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct KubeletConfig {
    pub enabled: bool,
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(rename = "for", deserialize_with = "duration")]
    pub hold: Duration,
    /// The kubelet's health endpoint.
    #[serde(rename = "healthzURL")]
    pub healthz_url: String,
    /// A node whose Node object does not exist this long after the agent started is
    /// reported as `KubeletUnregistered`.
    #[serde(deserialize_with = "duration")]
    pub registration_timeout: Duration,
    /// The kubelet's systemd unit, read over the system bus when systemd is there.
    pub unit: String,
    /// This many restarts of the unit within the window are a problem (`FrequentRestarts`).
    pub frequent_restarts: RestartLimit,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RestartLimit {
    pub count: u32,
    #[serde(deserialize_with = "duration")]
    pub window: Duration,
}

impl Default for RestartLimit {
    fn default() -> Self {
        Self {
            count: 3,
            window: Duration::from_secs(600),
        }
    }
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            hold: Duration::from_secs(60),
            healthz_url: "http://127.0.0.1:10248/healthz".to_owned(),
            registration_timeout: Duration::from_secs(600),
            unit: "kubelet.service".to_owned(),
            frequent_restarts: RestartLimit::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PeersConfig {
    pub enabled: bool,
    /// The port every agent answers TCP and UDP probes on.
    pub port: u16,
    /// Peers probed per round, chosen at random.
    pub sample_size: usize,
    pub protocols: Vec<crate::peers::Protocol>,
    /// How long one probe waits for its answer.
    #[serde(deserialize_with = "duration")]
    pub probe_timeout: Duration,
    /// Peers to probe besides the agents found through the Node objects (hosts without a
    /// cluster, or machines outside it).
    pub static_peers: Vec<std::net::IpAddr>,
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(rename = "for", deserialize_with = "duration")]
    pub hold: Duration,
}

impl Default for PeersConfig {
    fn default() -> Self {
        use crate::peers::Protocol;
        Self {
            enabled: true,
            port: 9471,
            sample_size: 5,
            protocols: vec![Protocol::Tcp, Protocol::Udp, Protocol::Icmp],
            probe_timeout: Duration::from_secs(2),
            static_peers: Vec::new(),
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            hold: Duration::from_secs(60),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct KernelLogConfig {
    pub enabled: bool,
    /// The kernel log device, read from its current end on.
    pub device: PathBuf,
    /// How often the condition patterns are evaluated (matching itself is immediate).
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(rename = "for", deserialize_with = "duration")]
    pub hold: Duration,
    pub patterns: Vec<KernelPatternConfig>,
}

/// A kernel log pattern: an Event, or (with `condition`) a condition.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KernelPatternConfig {
    /// CamelCase reason of the Event or condition, e.g. `OOMKilling`.
    pub reason: String,
    /// Regular expression (Rust `regex` syntax) matched against each kernel message.
    pub regex: String,
    /// Node condition type this pattern sets while it matched within `clearAfter`.
    #[serde(default)]
    pub condition: Option<String>,
    #[serde(default = "kernel_clear_after", deserialize_with = "duration")]
    pub clear_after: Duration,
}

fn kernel_clear_after() -> Duration {
    Duration::from_secs(3600)
}

impl Default for KernelLogConfig {
    fn default() -> Self {
        let pattern = |reason: &str, regex: &str, condition: Option<&str>| KernelPatternConfig {
            reason: reason.to_owned(),
            regex: regex.to_owned(),
            condition: condition.map(str::to_owned),
            clear_after: kernel_clear_after(),
        };
        Self {
            enabled: true,
            device: PathBuf::from("/dev/kmsg"),
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            hold: Duration::ZERO,
            patterns: vec![
                pattern(
                    "OOMKilling",
                    r"(Out of memory|Memory cgroup out of memory): Kill(ed)? process \d+",
                    None,
                ),
                pattern(
                    "TaskHung",
                    r"task \S+:\w+ blocked for more than \w+ seconds\.",
                    None,
                ),
                pattern(
                    "KernelOops",
                    r"BUG: unable to handle kernel|Oops: \d+",
                    None,
                ),
                pattern(
                    "FilesystemIsReadOnly",
                    r"Remounting filesystem read-only",
                    Some(nodeward_api::conditions::node::READONLY_FILESYSTEM),
                ),
            ],
        }
    }
}

/// A check in node-problem-detector's plugin protocol: exit 0 ok, 1 problem, anything else
/// unknown; the first line of output is the message.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CustomCheckConfig {
    /// Unique name of the check (the detector name in reports).
    pub name: String,
    /// The node condition type it sets, CamelCase, e.g. `NTPProblem`.
    pub condition: String,
    /// The condition reason when the check finds a problem, CamelCase.
    pub reason: String,
    /// Program and arguments.
    pub command: Vec<String>,
    #[serde(default = "custom_interval", deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(default = "custom_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(default, rename = "for", deserialize_with = "duration")]
    pub hold: Duration,
    /// Longest message kept from the output (node-problem-detector's default is 80).
    #[serde(default = "custom_max_output")]
    pub max_output_length: usize,
}

fn custom_interval() -> Duration {
    Duration::from_secs(60)
}

fn custom_timeout() -> Duration {
    Duration::from_secs(30)
}

fn custom_max_output() -> usize {
    80
}

/// Reads a Go-style duration string (`30s`, `5m`, `1h30m`).
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    nodeward_api::Duration::parse(text)
        .and_then(|d| d.to_std())
        .map_err(serde::de::Error::custom)
}

fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}

impl Config {
    /// Reads `path`, or [`DEFAULT_PATH`] when none is given and it exists; the defaults when
    /// neither.
    pub fn load(path: Option<&Path>) -> Result<Self, Error> {
        let path = match path {
            Some(p) => p.to_path_buf(),
            None if Path::new(DEFAULT_PATH).exists() => PathBuf::from(DEFAULT_PATH),
            None => return Ok(Self::default()),
        };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Config {
            path: path.clone(),
            message: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text).map_err(|message| Error::Config { path, message })
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

    fn validate(&self) -> Result<(), String> {
        if self.reporting.heartbeat_interval < Duration::from_secs(1) {
            return Err("reporting.heartbeatInterval: must be at least 1s, e.g. 60s".to_owned());
        }
        let guard = &self.shutdown_guard;
        if let Some(margin) = guard.safety_margin
            && margin >= guard.budget
        {
            return Err(format!(
                "shutdownGuard.safetyMargin: {}s leaves nothing of the {}s budget; use less than shutdownGuard.budget, e.g. 5s, or leave it out (a twentieth of the drain's time, 1s to 5s)",
                margin.as_secs(),
                guard.budget.as_secs()
            ));
        }
        let d = &self.detectors;
        for (index, pattern) in d.network.interfaces.ignore.iter().enumerate() {
            let star = pattern.find('*');
            if pattern.is_empty() || star.is_some_and(|at| at != pattern.len() - 1) {
                return Err(format!(
                    "detectors.network.interfaces.ignore[{index}]: {pattern:?} is not an interface name or a prefix ending in a single '*' (e.g. \"eth0\" or \"veth*\")"
                ));
            }
        }
        let schedules = [
            ("detectors.network", d.network.schedule()),
            ("detectors.rebootRequired", d.reboot_required.schedule()),
            ("detectors.filesystem", d.filesystem.schedule()),
            ("detectors.securityGroups", d.security_groups.schedule()),
            ("detectors.kubelet", d.kubelet.schedule()),
            ("detectors.peers", d.peers.schedule()),
            ("detectors.kernelLog", d.kernel_log.schedule()),
        ];
        let custom = d.custom.iter().enumerate().map(|(i, c)| (i, c.schedule()));
        for (place, schedule) in schedules
            .into_iter()
            .map(|(p, s)| (p.to_owned(), s))
            .chain(custom.map(|(i, s)| (format!("detectors.custom[{i}]"), s)))
        {
            if schedule.interval.is_zero() {
                return Err(format!("{place}.interval: must be more than 0s, e.g. 30s"));
            }
            if schedule.timeout.is_zero() || schedule.timeout > schedule.interval {
                return Err(format!(
                    "{place}.timeout: must be more than 0s and at most the interval ({:?}), so that runs never overlap",
                    schedule.interval
                ));
            }
        }
        for url in [
            (
                "detectors.securityGroups.metadataURL",
                &d.security_groups.metadata_url,
            ),
            ("detectors.kubelet.healthzURL", &d.kubelet.healthz_url),
        ] {
            if !url.1.starts_with("http://") && !url.1.starts_with("https://") {
                return Err(format!(
                    "{}: {:?} is not an http:// or https:// URL",
                    url.0, url.1
                ));
            }
        }
        let n = &self.notifications;
        if !n.url.is_empty() && !n.url.starts_with("http://") && !n.url.starts_with("https://") {
            return Err(format!(
                "notifications.url: {:?} is not an http:// or https:// URL",
                n.url
            ));
        }
        if n.attempts == 0 {
            return Err("notifications.attempts: must be at least 1, e.g. 5".to_owned());
        }
        if n.timeout.is_zero() {
            return Err("notifications.timeout: must be more than 0s, e.g. 10s".to_owned());
        }
        for (kind, template) in &n.templates {
            crate::notify::check_template(template)
                .map_err(|e| format!("notifications.templates.{kind:?}: {e}"))?;
        }
        for name in n.headers.keys() {
            if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!(
                    "notifications.headers: {name:?} is not a valid HTTP header name"
                ));
            }
        }
        if d.reboot_required
            .sentinel_command
            .first()
            .is_some_and(String::is_empty)
        {
            return Err(
                "detectors.rebootRequired.sentinelCommand[0]: the program must not be empty"
                    .to_owned(),
            );
        }
        if d.kubelet.frequent_restarts.count == 0 {
            return Err(
                "detectors.kubelet.frequentRestarts.count: must be at least 1, e.g. 3".to_owned(),
            );
        }
        if d.peers.port == 0 {
            return Err(
                "detectors.peers.port: must be a port number from 1 to 65535, e.g. 9471".to_owned(),
            );
        }
        if !(1..=50).contains(&d.peers.sample_size) {
            return Err(
                "detectors.peers.sampleSize: must be from 1 to 50 (probes per round grow with it, not with the cluster)"
                    .to_owned(),
            );
        }
        if d.peers.probe_timeout.is_zero() || d.peers.probe_timeout > d.peers.timeout {
            return Err("detectors.peers.probeTimeout: must be more than 0s and at most detectors.peers.timeout".to_owned());
        }
        if d.peers.protocols.is_empty() {
            return Err(
                "detectors.peers.protocols: name at least one of tcp, udp, icmp".to_owned(),
            );
        }
        crate::detect::kernel_log::compile(&d.kernel_log)?;
        for (index, pattern) in d.kernel_log.patterns.iter().enumerate() {
            let place = format!("detectors.kernelLog.patterns[{index}]");
            if !is_camel_case(&pattern.reason) {
                return Err(format!(
                    "{place}.reason: {:?} must be CamelCase, e.g. OOMKilling",
                    pattern.reason
                ));
            }
            if pattern
                .condition
                .as_deref()
                .is_some_and(|c| !is_camel_case(c))
            {
                return Err(format!(
                    "{place}.condition: {:?} must be CamelCase, e.g. ReadonlyFilesystem",
                    pattern.condition
                ));
            }
            if let Some(condition) = pattern.condition.as_deref() {
                not_owned_by_others(&format!("{place}.condition"), condition)?;
            }
            if pattern.condition.is_some() && pattern.clear_after.is_zero() {
                return Err(format!("{place}.clearAfter: must be more than 0s, e.g. 1h"));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (index, check) in d.custom.iter().enumerate() {
            let place = format!("detectors.custom[{index}]");
            if check.name.is_empty() || !names.insert(check.name.as_str()) {
                return Err(format!(
                    "{place}.name: {:?} must be non-empty and unique among the custom checks",
                    check.name
                ));
            }
            for (field, value) in [("condition", &check.condition), ("reason", &check.reason)] {
                if !is_camel_case(value) {
                    return Err(format!(
                        "{place}.{field}: {value:?} must be CamelCase, e.g. NTPProblem"
                    ));
                }
            }
            not_owned_by_others(&format!("{place}.condition"), &check.condition)?;
            if check.command.first().is_none_or(String::is_empty) {
                return Err(format!(
                    "{place}.command: give the program and its arguments, e.g. [\"/usr/local/bin/check-ntp\"]"
                ));
            }
            if check.max_output_length == 0 {
                return Err(format!("{place}.maxOutputLength: must be at least 1"));
            }
        }
        Ok(())
    }
}

/// Settings given as flags or environment variables; each replaces the file's value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    pub reboot_sentinel: Option<PathBuf>,
    pub reboot_sentinel_command: Option<Vec<String>>,
    pub heartbeat_interval: Option<String>,
    pub metadata_url: Option<String>,
    pub expected_security_groups: Option<Vec<String>>,
    pub peer_port: Option<u16>,
    pub registration_timeout: Option<String>,
    pub kubelet_healthz_url: Option<String>,
    pub shutdown_guard: Option<bool>,
    pub shutdown_budget: Option<String>,
    pub logind_drop_in_dir: Option<PathBuf>,
    pub notify_url: Option<String>,
}

impl Config {
    /// Applies flag and environment overrides, then validates the result again. Errors name
    /// the flag.
    pub fn with_overrides(mut self, o: &Overrides) -> Result<Self, String> {
        let d = &mut self.detectors;
        if let Some(path) = &o.reboot_sentinel {
            d.reboot_required.sentinel_file = path.clone();
        }
        if let Some(command) = &o.reboot_sentinel_command {
            d.reboot_required.sentinel_command = command.clone();
        }
        let parse = |flag: &str, value: &str| {
            nodeward_api::Duration::parse(value)
                .and_then(|d| d.to_std())
                .map_err(|e| format!("--{flag}: {e}"))
        };
        if let Some(value) = &o.heartbeat_interval {
            self.reporting.heartbeat_interval = parse("heartbeat-interval", value)?;
        }
        let d = &mut self.detectors;
        if let Some(url) = &o.metadata_url {
            d.security_groups.metadata_url = url.clone();
        }
        if let Some(groups) = &o.expected_security_groups {
            d.security_groups.expected = groups.clone();
        }
        if let Some(port) = o.peer_port {
            d.peers.port = port;
        }
        if let Some(value) = &o.registration_timeout {
            d.kubelet.registration_timeout = parse("registration-timeout", value)?;
        }
        if let Some(url) = &o.kubelet_healthz_url {
            d.kubelet.healthz_url = url.clone();
        }
        if let Some(enabled) = o.shutdown_guard {
            self.shutdown_guard.enabled = enabled;
        }
        if let Some(value) = &o.shutdown_budget {
            self.shutdown_guard.budget = parse("shutdown-budget", value)?;
        }
        if let Some(dir) = &o.logind_drop_in_dir {
            self.shutdown_guard.write_drop_in = true;
            self.shutdown_guard.drop_in_dir = dir.clone();
        }
        if let Some(url) = &o.notify_url {
            self.notifications.url = url.clone();
        }
        self.validate()?;
        Ok(self)
    }
}

/// A condition type the kubelet, the network plugin or the coordinator owns is not the agent's
/// to write (and the chart's admission policy would refuse it).
fn not_owned_by_others(place: &str, condition: &str) -> Result<(), String> {
    if nodeward_api::conditions::node::OWNED_BY_OTHERS.contains(&condition) {
        return Err(format!(
            "{place}: {condition:?} is written by the kubelet, the network plugin or the coordinator; \
             name the agent's own condition, e.g. NTPProblem"
        ));
    }
    Ok(())
}

fn is_camel_case(value: &str) -> bool {
    value.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && value.chars().all(|c| c.is_ascii_alphanumeric())
}

macro_rules! schedule_of {
    ($($config:ty),*) => {$(
        impl $config {
            pub fn schedule(&self) -> Schedule {
                Schedule { interval: self.interval, timeout: self.timeout, hold: self.hold }
            }
        }
    )*};
}
schedule_of!(
    NetworkConfig,
    RebootConfig,
    FilesystemConfig,
    SecurityGroupsConfig,
    KubeletConfig,
    PeersConfig,
    KernelLogConfig,
    CustomCheckConfig
);

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn flags_and_environment_override_the_file() {
        let file = Config::parse("detectors:\n  peers:\n    port: 9000\n").expect("valid");
        let overrides = Overrides {
            reboot_sentinel: Some("/run/needs-reboot".into()),
            heartbeat_interval: Some("2m".into()),
            expected_security_groups: Some(vec!["k8s-nodes".into()]),
            peer_port: Some(9999),
            ..Overrides::default()
        };
        let config = file.with_overrides(&overrides).expect("valid overrides");
        assert_eq!(
            config.detectors.reboot_required.sentinel_file,
            PathBuf::from("/run/needs-reboot")
        );
        assert_eq!(
            config.reporting.heartbeat_interval,
            Duration::from_secs(120)
        );
        assert_eq!(config.detectors.security_groups.expected, vec!["k8s-nodes"]);
        assert_eq!(config.detectors.peers.port, 9999);
        let err = Config::default()
            .with_overrides(&Overrides {
                heartbeat_interval: Some("soon".into()),
                ..Overrides::default()
            })
            .expect_err("bad duration");
        assert!(
            err.starts_with("--heartbeat-interval: \"soon\" is not a duration"),
            "{err}"
        );
        let err = Config::default()
            .with_overrides(&Overrides {
                peer_port: Some(0),
                ..Overrides::default()
            })
            .expect_err("bad port");
        assert!(err.starts_with("detectors.peers.port"), "{err}");
    }

    #[test]
    fn missing_file_is_an_error_naming_the_path() {
        let err = Config::load(Some(Path::new("/nonexistent/nodeward.yaml"))).expect_err("missing");
        assert!(
            err.to_string().contains("/nonexistent/nodeward.yaml"),
            "{err}"
        );
    }
}
