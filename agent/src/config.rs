//! The agent's configuration file (YAML). Every field is optional; unknown fields are refused
//! so that a typo never silently turns a check off. Durations are written like `30s`, `5m`,
//! `1h30m`.
//!
//! Each section belongs to the part of the agent it configures, which defines its fields,
//! defaults and checks: a detector's in its `detect` module, `notifications` in `notify`,
//! `shutdownGuard` in `shutdown`, `reporting` in `report`, `reboot` in
//! `maintenance::reboot_method`, `npd` (node-problem-detector files) in `npd`. Each detector has `interval` (how
//! often it runs), `timeout` (after which the run counts as Unknown) and `for` (how long a new
//! verdict must hold before it is reported or cleared).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{
    Error,
    detect::Detectors,
    host_stats::HostStatsConfig,
    maintenance::reboot_method::{RebootConfig, RebootMethod},
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

    /// Checks every section; each names its fields' places (`detectors.peers.port`).
    fn validate(&self) -> Result<(), String> {
        self.reporting.validate("reporting")?;
        self.shutdown_guard.validate("shutdownGuard")?;
        self.detectors.validate("detectors")?;
        self.host_stats.validate("hostStats")?;
        self.reboot.validate("reboot")?;
        self.notifications.validate("notifications")
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
    pub reboot_method: Option<RebootMethod>,
    pub reboot_command: Option<Vec<String>>,
    pub reboot_signal: Option<i32>,
    pub npd_configs: Option<Vec<PathBuf>>,
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
        if let Some(method) = o.reboot_method {
            self.reboot.method = method;
        }
        if let Some(command) = &o.reboot_command {
            self.reboot.command = command.clone();
        }
        if let Some(signal) = o.reboot_signal {
            self.reboot.signal = signal;
        }
        if let Some(files) = &o.npd_configs {
            self.npd.configs = files.clone();
        }
        self.validate()?;
        Ok(self)
    }

    /// Loads the node-problem-detector files of the `npd` section (after the overrides): their
    /// kernel rules replace the default kernel-log patterns, their journald monitors join the
    /// journal monitors and their plugins the custom checks; then validates the whole again.
    pub fn with_npd(mut self) -> Result<Self, String> {
        if self.npd.configs.is_empty() {
            return Ok(self);
        }
        let loaded = npd::load(&self.npd)?;
        if !loaded.kernel_patterns.is_empty() {
            self.detectors.kernel_log.patterns = loaded.kernel_patterns;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::detect::{Schedule, routes::Ipv6Mode};

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
