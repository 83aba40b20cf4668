//! Detectors: each reads one aspect of the node (I/O at the edge) and decides, in a pure
//! function over plain data, whether it is a problem.

pub mod cluster;
pub mod command;
pub mod custom;
pub mod debounce;
pub mod dns;
pub mod filesystem;
pub mod interfaces;
pub mod kernel_log;
pub mod kubelet;
pub mod network;
pub mod peers;
pub mod reboot;
pub mod routes;
pub mod security_groups;

use std::borrow::Cow;

use std::time::Duration;

use nodeward_api::conditions::node;
use serde::{Deserialize, Serialize};

use self::{
    cluster::Cluster, custom::CustomCheckConfig, filesystem::FilesystemConfig,
    kernel_log::KernelLogConfig, kubelet::KubeletConfig, network::NetworkConfig,
    peers::PeersConfig, reboot::RebootConfig, security_groups::SecurityGroupsConfig,
};

/// The `detectors` section of the configuration: each detector's own section.
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

impl Detectors {
    /// Checks every section; `place` is this section's (`detectors`).
    pub fn validate(&self, place: &str) -> Result<(), String> {
        let at = |section: &str| format!("{place}.{section}");
        let schedules = [
            ("network", self.network.schedule()),
            ("rebootRequired", self.reboot_required.schedule()),
            ("filesystem", self.filesystem.schedule()),
            ("securityGroups", self.security_groups.schedule()),
            ("kubelet", self.kubelet.schedule()),
            ("peers", self.peers.schedule()),
            ("kernelLog", self.kernel_log.schedule()),
        ];
        for (section, schedule) in schedules {
            schedule.validate(&at(section))?;
        }
        for (index, check) in self.custom.iter().enumerate() {
            check
                .schedule()
                .validate(&at(&format!("custom[{index}]")))?;
        }
        self.network.validate(&at("network"))?;
        self.reboot_required.validate(&at("rebootRequired"))?;
        self.security_groups.validate(&at("securityGroups"))?;
        self.kubelet.validate(&at("kubelet"))?;
        self.peers.validate(&at("peers"))?;
        self.kernel_log.validate(&at("kernelLog"))?;
        custom::validate_all(&self.custom, &at("custom"))
    }
}

/// When and how long a detector runs, and how long a verdict must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub interval: Duration,
    pub timeout: Duration,
    pub hold: Duration,
}

impl Schedule {
    /// Runs never overlap: a timeout within the interval, both more than zero.
    pub fn validate(&self, place: &str) -> Result<(), String> {
        if self.interval.is_zero() {
            return Err(format!("{place}.interval: must be more than 0s, e.g. 30s"));
        }
        if self.timeout.is_zero() || self.timeout > self.interval {
            return Err(format!(
                "{place}.timeout: must be more than 0s and at most the interval ({:?}), so that runs never overlap",
                self.interval
            ));
        }
        Ok(())
    }
}

/// Every detector section has `interval`, `timeout` and `for` (`hold`).
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

/// What one check concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Status {
    /// The check passed (the node condition is `False`).
    Ok,
    /// The problem is present (the node condition is `True`).
    Problem,
    /// The check could not tell (the node condition is `Unknown`).
    Unknown,
    /// The check needs something this run does not have (a cluster, for `check`); it sets
    /// no condition.
    Skipped,
}

impl Status {
    /// The node condition status this maps to (`True` means a problem).
    pub fn condition_status(self) -> &'static str {
        match self {
            Self::Ok => "False",
            Self::Problem => "True",
            Self::Unknown | Self::Skipped => "Unknown",
        }
    }
}

/// One detector's verdict, shaped like a node condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which detector produced it.
    pub detector: Cow<'static, str>,
    /// The node condition type it feeds, e.g. `NetworkProblem`.
    pub condition: Cow<'static, str>,
    pub status: Status,
    /// CamelCase reason, e.g. `NoDefaultRoute`.
    pub reason: String,
    /// What an operator needs to know, in one line.
    pub message: String,
}

/// A name known at compile time (built-in detectors) or read from the configuration.
pub type Name = Cow<'static, str>;

impl Finding {
    pub fn ok(
        detector: impl Into<Name>,
        condition: impl Into<Name>,
        reason: &str,
        message: String,
    ) -> Self {
        Self::new(
            detector.into(),
            condition.into(),
            Status::Ok,
            reason,
            message,
        )
    }

    pub fn problem(
        detector: impl Into<Name>,
        condition: impl Into<Name>,
        reason: &str,
        message: String,
    ) -> Self {
        Self::new(
            detector.into(),
            condition.into(),
            Status::Problem,
            reason,
            message,
        )
    }

    pub fn unknown(
        detector: impl Into<Name>,
        condition: impl Into<Name>,
        reason: &str,
        message: String,
    ) -> Self {
        Self::new(
            detector.into(),
            condition.into(),
            Status::Unknown,
            reason,
            message,
        )
    }

    pub fn new(
        detector: Name,
        condition: Name,
        status: Status,
        reason: &str,
        message: String,
    ) -> Self {
        Self {
            detector,
            condition,
            status,
            reason: reason.to_owned(),
            message,
        }
    }
}

/// One configured detector. Each runs on its own schedule; a run that exceeds its timeout is
/// abandoned (its child processes killed) and counts as Unknown.
#[derive(Clone, Debug)]
pub enum Detector {
    Interfaces(NetworkConfig),
    DefaultRoute(NetworkConfig),
    Dns(NetworkConfig),
    RebootRequired(RebootConfig),
    Filesystem(FilesystemConfig),
    SecurityGroups(SecurityGroupsConfig),
    Kubelet(
        KubeletConfig,
        std::sync::Arc<std::sync::Mutex<kubelet::RestartHistory>>,
    ),
    ApiServer(NetworkConfig, Option<Cluster>),
    Registration(KubeletConfig, Option<Cluster>),
    Peers(PeersConfig, Option<peers::PeerContext>),
    /// One per condition type the kernel-log patterns set.
    KernelLog {
        config: KernelLogConfig,
        condition: String,
        log: kernel_log::KernelLog,
    },
    Custom(CustomCheckConfig),
}

/// What the detectors of a running agent have that `check` does not.
#[derive(Clone, Debug)]
pub struct AgentContext {
    pub cluster: Cluster,
    pub peers: Option<peers::PeerContext>,
    pub kernel_log: Option<kernel_log::KernelLog>,
}

impl Detector {
    /// Every detector the configuration enables, in a stable order. Without an agent context
    /// (`check`) the cluster detectors are listed too, and report that they were skipped; the
    /// kernel log, which is followed from the agent's start, is left out.
    pub fn all(d: &Detectors, agent: Option<&AgentContext>) -> Vec<Self> {
        let cluster = agent.map(|a| &a.cluster);
        let mut all = Vec::new();
        if d.network.enabled {
            all.push(Self::Interfaces(d.network.clone()));
            all.push(Self::DefaultRoute(d.network.clone()));
            if !d.network.dns.names.is_empty() {
                all.push(Self::Dns(d.network.clone()));
            }
            all.push(Self::ApiServer(d.network.clone(), cluster.cloned()));
        }
        if d.reboot_required.enabled {
            all.push(Self::RebootRequired(d.reboot_required.clone()));
        }
        if d.filesystem.enabled {
            all.push(Self::Filesystem(d.filesystem.clone()));
        }
        if !d.security_groups.expected.is_empty() {
            all.push(Self::SecurityGroups(d.security_groups.clone()));
        }
        if d.kubelet.enabled {
            all.push(Self::Kubelet(d.kubelet.clone(), std::sync::Arc::default()));
            all.push(Self::Registration(d.kubelet.clone(), cluster.cloned()));
        }
        if d.peers.enabled {
            all.push(Self::Peers(
                d.peers.clone(),
                agent.and_then(|a| a.peers.clone()),
            ));
        }
        if let Some(log) = agent.and_then(|a| a.kernel_log.as_ref()) {
            let mut conditions: Vec<&String> = log
                .patterns
                .iter()
                .filter_map(|p| p.condition.as_ref())
                .collect();
            conditions.sort();
            conditions.dedup();
            all.extend(conditions.into_iter().map(|condition| Self::KernelLog {
                config: d.kernel_log.clone(),
                condition: condition.clone(),
                log: log.clone(),
            }));
        }
        all.extend(d.custom.iter().cloned().map(Self::Custom));
        all
    }

    pub fn name(&self) -> Name {
        match self {
            Self::Interfaces(_) => interfaces::DETECTOR.into(),
            Self::DefaultRoute(_) => routes::DETECTOR.into(),
            Self::Dns(_) => dns::DETECTOR.into(),
            Self::RebootRequired(_) => reboot::DETECTOR.into(),
            Self::Filesystem(_) => filesystem::DETECTOR.into(),
            Self::SecurityGroups(_) => security_groups::DETECTOR.into(),
            Self::Kubelet(..) => kubelet::DETECTOR.into(),
            Self::ApiServer(..) => cluster::APISERVER_DETECTOR.into(),
            Self::Registration(..) => cluster::REGISTRATION_DETECTOR.into(),
            Self::Peers(..) => peers::DETECTOR.into(),
            Self::KernelLog { condition, .. } => {
                format!("{}/{condition}", kernel_log::DETECTOR).into()
            }
            Self::Custom(c) => c.name.clone().into(),
        }
    }

    /// The node condition type this detector feeds.
    pub fn condition(&self) -> Name {
        match self {
            Self::Interfaces(_) | Self::DefaultRoute(_) | Self::Dns(_) | Self::ApiServer(..) => {
                node::NETWORK_PROBLEM.into()
            }
            Self::Registration(..) => node::KUBELET_UNREGISTERED.into(),
            Self::Peers(..) => node::PEER_CONNECTIVITY_PROBLEM.into(),
            Self::KernelLog { condition, .. } => condition.clone().into(),
            Self::RebootRequired(_) => node::REBOOT_REQUIRED.into(),
            Self::Filesystem(_) => node::READONLY_FILESYSTEM.into(),
            Self::SecurityGroups(_) => node::SECURITY_GROUP_PROBLEM.into(),
            Self::Kubelet(..) => node::KUBELET_PROBLEM.into(),
            Self::Custom(c) => c.condition.clone().into(),
        }
    }

    pub fn schedule(&self) -> Schedule {
        match self {
            Self::Interfaces(c) | Self::DefaultRoute(c) | Self::Dns(c) | Self::ApiServer(c, _) => {
                c.schedule()
            }
            Self::Registration(c, _) => c.schedule(),
            Self::Peers(c, _) => c.schedule(),
            Self::KernelLog { config, .. } => config.schedule(),
            Self::RebootRequired(c) => c.schedule(),
            Self::Filesystem(c) => c.schedule(),
            Self::SecurityGroups(c) => c.schedule(),
            Self::Kubelet(c, _) => c.schedule(),
            Self::Custom(c) => c.schedule(),
        }
    }

    /// Runs the check once, unbounded.
    pub async fn observe(&self) -> Finding {
        match self {
            Self::Interfaces(c) => interfaces::observe(&c.interfaces),
            Self::DefaultRoute(c) => routes::observe(&c.interfaces, &c.default_route).await,
            // Each lookup gets most of the timeout, so a slow resolver is a DNS failure
            // rather than a timed-out detector.
            Self::Dns(c) => dns::observe(&c.dns.names, c.timeout.mul_f32(0.9)).await,
            Self::RebootRequired(c) => reboot::observe(c).await,
            Self::Filesystem(c) => filesystem::observe(c).await,
            Self::SecurityGroups(c) => security_groups::observe(c).await,
            Self::Kubelet(c, history) => kubelet::observe(c, history).await,
            Self::ApiServer(_, c) => cluster::observe_apiserver(c.as_ref()).await,
            Self::Registration(k, c) => {
                cluster::observe_registration(c.as_ref(), k.registration_timeout).await
            }
            Self::Peers(c, context) => peers::observe(c, context.as_ref()).await,
            Self::KernelLog { condition, log, .. } => {
                let mut finding =
                    kernel_log::evaluate(&log.patterns, &log.seen, std::time::Instant::now())
                        .into_iter()
                        .find(|f| f.condition == condition.as_str())
                        .unwrap_or_else(|| {
                            Finding::ok(
                                kernel_log::DETECTOR,
                                condition.clone(),
                                "NoKernelProblem",
                                String::new(),
                            )
                        });
                finding.detector = self.name();
                finding
            }
            Self::Custom(c) => custom::observe(c).await,
        }
    }

    /// Runs the check once within its timeout; past it the run is dropped and the finding
    /// is Unknown.
    pub async fn observe_bounded(&self) -> Finding {
        let timeout = self.schedule().timeout;
        match tokio::time::timeout(timeout, self.observe()).await {
            Ok(finding) => finding,
            Err(_) => Finding::unknown(
                self.name(),
                self.condition(),
                "DetectorTimedOut",
                format!("the check did not finish within its {timeout:?} timeout"),
            ),
        }
    }
}
