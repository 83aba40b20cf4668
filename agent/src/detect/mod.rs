//! Detectors: each reads one aspect of the node (I/O at the edge) and decides, in a pure
//! function over plain data, whether it is a problem.
//!
//! A detector module owns its configuration section (fields, defaults, checks) and says, as a
//! [`Section`], which detectors the section enables. Adding one is its module and one line in
//! the registry below.

pub mod cloud_notices;
pub mod cluster;
pub mod command;
pub mod container_runtime;
pub mod cri;
pub mod custom;
pub mod dns;
pub mod filesystem;
mod finding;
pub mod imds;
pub mod interfaces;
pub mod journal_log;
pub mod kernel_log;
pub mod kubelet;
pub mod network;
pub mod peers;
pub mod reboot;
pub mod routes;
pub mod security_groups;

use std::{
    any::{Any, TypeId},
    collections::{BTreeMap, BTreeSet},
    future::Future,
    pin::Pin,
    sync::Arc,
    time::Duration,
};

use nodeward_api::report::{KernelLogSource, NodeReport, NodeReportStatus};
use serde::Deserialize;
use tokio::{
    sync::{OnceCell, mpsc},
    task::JoinSet,
};

pub use self::finding::{Finding, Name, Status};
use self::{
    cloud_notices::CloudNoticesConfig,
    cluster::ClusterContext,
    container_runtime::ContainerRuntimeConfig,
    custom::CustomCheckConfig,
    filesystem::FilesystemConfig,
    journal_log::JournalLogConfig,
    kernel_log::KernelLogConfig,
    kernel_log::{LogEvent, LogName},
    kubelet::KubeletConfig,
    network::NetworkConfig,
    peers::PeersConfig,
    peers::Sightings,
    reboot::RebootConfig,
    security_groups::SecurityGroupsConfig,
};
use crate::{
    Error,
    flags::{Flag, Placed},
    metrics::Metrics,
};

/// The registry: the `detectors` section of the configuration, one field per detector
/// section (its key as written in the file, its field, its type), in the order the detectors
/// run and report.
macro_rules! registry {
    ($($key:literal $field:ident: $section:ty,)*) => {
        /// The `detectors` section of the configuration: each detector's own section.
        #[derive(Clone, Debug, Default, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct Detectors {
            $(#[serde(rename = $key)] pub $field: $section,)*
        }

        impl Detectors {
            fn sections(&self) -> Vec<(&'static str, &dyn Section)> {
                vec![$(($key, &self.$field)),*]
            }
        }
    };
}

registry! {
    "network" network: NetworkConfig,
    "rebootRequired" reboot_required: RebootConfig,
    "filesystem" filesystem: FilesystemConfig,
    "securityGroups" security_groups: SecurityGroupsConfig,
    "cloudNotices" cloud_notices: CloudNoticesConfig,
    "kubelet" kubelet: KubeletConfig,
    "containerRuntime" container_runtime: ContainerRuntimeConfig,
    "peers" peers: PeersConfig,
    "kernelLog" kernel_log: KernelLogConfig,
    "journal" journal: JournalLogConfig,
    "custom" custom: Vec<CustomCheckConfig>,
}

/// One section of `detectors`, owned by its detector module.
pub trait Section: Sync {
    /// Checks the section's fields (its schedule among them); `place` names the section
    /// (`detectors.peers`) and each error names the field and the fix.
    fn validate(&self, place: &str) -> Result<(), String>;

    /// The detectors this section enables. Without an agent context (`check`) the cluster
    /// detectors are listed too and report that they were skipped.
    fn detectors(&self, agent: Option<&AgentContext>) -> Vec<Detector>;

    /// The flags that set its fields from the command line (none by default).
    fn flags(&self) -> Vec<Flag> {
        Vec::new()
    }

    /// Starts, in a running agent, what its detectors need beside their checks (a followed
    /// log, a responder) in `tasks`; returns their context and what the reporter publishes of
    /// it. Nothing by default.
    fn start<'a>(&'a self, _on: &'a On<'a>, _tasks: &'a mut JoinSet<()>) -> Starting<'a> {
        Box::pin(std::future::ready(Ok(Background::default())))
    }
}

/// A section's start under way.
pub type Starting<'a> = Pin<Box<dyn Future<Output = Result<Background, Error>> + Send + 'a>>;

impl Detectors {
    /// Checks every section; `place` is this section's (`detectors`).
    pub fn validate(&self, place: &str) -> Result<(), String> {
        self.sections()
            .into_iter()
            .try_for_each(|(key, section)| section.validate(&format!("{place}.{key}")))
    }

    /// Every detector section's flags, at `place` (`detectors`).
    pub fn flags(place: &str) -> Vec<Placed> {
        Self::default()
            .sections()
            .into_iter()
            .flat_map(|(key, section)| Placed::at(&format!("{place}.{key}"), &section.flags()))
            .collect()
    }

    /// Starts every section's background, in the registry's order.
    pub async fn start(
        &self,
        on: &On<'_>,
        tasks: &mut JoinSet<()>,
    ) -> Result<Vec<Background>, Error> {
        let mut started = Vec::new();
        for (_, section) in self.sections() {
            started.push(section.start(on, tasks).await?);
        }
        Ok(started)
    }

    /// Every detector the configuration enables, in a stable order.
    pub fn enabled(&self, agent: Option<&AgentContext>) -> Vec<Detector> {
        self.sections()
            .into_iter()
            .flat_map(|(_, section)| section.detectors(agent))
            .collect()
    }
}

/// How many followed-log Events may wait for the reporter.
pub const LOG_EVENTS_WAITING: usize = 64;

/// Where the detectors run, as a section's start sees it.
pub struct On<'a> {
    pub client: &'a kube::Client,
    pub node_name: &'a str,
    /// nodeward's namespace, where the coordinator publishes the peer directory.
    pub namespace: &'a str,
    pub boot_id: Option<&'a str>,
    pub metrics: &'a Arc<Metrics>,
    /// Where a followed log sends its Events; the reporter publishes them.
    pub log_events: mpsc::Sender<LogEvent>,
    last_report: OnceCell<Option<NodeReportStatus>>,
}

impl<'a> On<'a> {
    /// This node's agent: its client, node, nodeward's namespace, boot and metrics; its
    /// followed logs send their Events to `log_events`.
    pub fn new(
        client: &'a kube::Client,
        node_name: &'a str,
        namespace: &'a str,
        boot_id: Option<&'a str>,
        metrics: &'a Arc<Metrics>,
        log_events: mpsc::Sender<LogEvent>,
    ) -> Self {
        Self {
            client,
            node_name,
            namespace,
            boot_id,
            metrics,
            log_events,
            last_report: OnceCell::new(),
        }
    }

    /// This node's NodeReport as the agent before this one left it, read once, when a section
    /// first asks. None when there is none or it cannot be read (said in the log).
    pub async fn last_report(&self) -> Option<&NodeReportStatus> {
        self.last_report
            .get_or_init(|| async {
                let reports: kube::Api<NodeReport> = kube::Api::all(self.client.clone());
                match reports.get_opt(self.node_name).await {
                    Ok(report) => report.and_then(|r| r.status),
                    Err(e) => {
                        tracing::warn!(error = %e, node = self.node_name, "cannot read this node's NodeReport for what the last agent published; Events within the lookback may repeat");
                        None
                    }
                }
            })
            .await
            .as_ref()
    }

    /// Whether `boot_id` is this boot's.
    pub fn this_boot(&self, boot_id: &str) -> bool {
        Some(boot_id) == self.boot_id
    }
}

/// What a section started: what its detectors read, and what the reporter publishes of it.
#[derive(Default)]
pub struct Background {
    /// Its detectors' context, found again by its type (`AgentContext::started`).
    pub context: Option<Arc<dyn Any + Send + Sync>>,
    pub for_reports: ForReports,
}

impl Background {
    /// Its detectors read `context`.
    pub fn with_context<T: Any + Send + Sync>(mut self, context: T) -> Self {
        self.context = Some(Arc::new(context));
        self
    }
}

/// What the detectors give the reporter to publish.
#[derive(Default)]
pub struct ForReports {
    /// The peers' sightings, for the NodeReport.
    pub sightings: Option<Sightings>,
    /// Where the kernel log is read, for the NodeReport.
    pub log_source: Option<KernelLogSource>,
    /// Per followed log, the place of the last record published as an Event on this boot.
    pub published: BTreeMap<LogName, u64>,
    /// Finding types that stay in the NodeReport and Events, never on the Node.
    pub events_only: BTreeSet<String>,
}

impl ForReports {
    pub(crate) fn add(&mut self, other: Self) {
        self.sightings = self.sightings.take().or(other.sightings);
        self.log_source = self.log_source.take().or(other.log_source);
        self.published.extend(other.published);
        self.events_only.extend(other.events_only);
    }
}

/// What the detectors of a running agent have that `check` does not: the cluster, and what
/// their sections started (each found by its type).
#[derive(Clone)]
pub struct AgentContext {
    pub cluster: ClusterContext,
    started: BTreeMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl AgentContext {
    pub fn new(cluster: ClusterContext) -> Self {
        Self {
            cluster,
            started: BTreeMap::new(),
        }
    }

    /// With what a section started.
    pub fn with_started(mut self, started: Arc<dyn Any + Send + Sync>) -> Self {
        self.started.insert((*started).type_id(), started);
        self
    }

    /// What a section started, of type `T`, if it did.
    pub fn started<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let started = self.started.get(&TypeId::of::<T>())?;
        Arc::downcast(started.clone()).ok()
    }
}

impl std::fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentContext")
            .field("cluster", &self.cluster)
            .field("started", &self.started.len())
            .finish()
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

/// A detector section: the fields every one has (`enabled`, `interval`, `timeout`, `for`),
/// then its own; and its [`Schedule`]. Its module writes its `Default`.
macro_rules! section {
    ($(#[$attr:meta])* pub struct $name:ident { $($fields:tt)* }) => {
        $(#[$attr])*
        #[derive(Clone, Debug, PartialEq, serde::Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase", default)]
        pub struct $name {
            /// Whether its detectors run.
            pub enabled: bool,
            /// How often they run.
            #[serde(deserialize_with = "crate::values::duration")]
            pub interval: std::time::Duration,
            /// After this a run counts as Unknown; at most the interval.
            #[serde(deserialize_with = "crate::values::duration")]
            pub timeout: std::time::Duration,
            /// How long a new verdict must hold before it is reported or cleared.
            #[serde(rename = "for", deserialize_with = "crate::values::duration")]
            pub hold: std::time::Duration,
            $($fields)*
        }

        impl $name {
            pub fn schedule(&self) -> $crate::detect::Schedule {
                $crate::detect::Schedule {
                    interval: self.interval,
                    timeout: self.timeout,
                    hold: self.hold,
                }
            }

            /// The section's one detector when enabled: each run is `check` of a copy of it.
            pub fn detector<F, Fut>(
                &self,
                name: &'static str,
                condition: &'static str,
                check: F,
            ) -> Vec<$crate::detect::Detector>
            where
                F: Fn(Self) -> Fut + Send + Sync + 'static,
                Fut: std::future::Future<Output = $crate::detect::Finding> + Send + 'static,
            {
                $crate::detect::Detector::new(name, condition, self.schedule(), self.clone(), check)
                    .if_enabled(self.enabled)
            }
        }
    };
}
pub(crate) use section;

type Check = dyn Fn() -> Pin<Box<dyn Future<Output = Finding> + Send>> + Send + Sync;

/// One configured detector. Each runs on its own schedule; a run that exceeds its timeout is
/// abandoned (its child processes killed) and counts as Unknown.
#[derive(Clone)]
pub struct Detector {
    pub name: Name,
    /// The node condition type it feeds.
    pub condition: Name,
    pub schedule: Schedule,
    check: Arc<Check>,
    /// Runs it at once, between its intervals, whenever it changes (a followed log's match).
    pub wake: Option<tokio::sync::watch::Receiver<u64>>,
}

impl std::fmt::Debug for Detector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detector")
            .field("name", &self.name)
            .field("condition", &self.condition)
            .field("schedule", &self.schedule)
            .finish_non_exhaustive()
    }
}

impl Detector {
    /// A detector whose every run is `check(input)`; the input is cloned for each run (it is
    /// the detector's configuration and what it keeps between runs, behind an `Arc`).
    pub fn new<I, F, Fut>(
        name: impl Into<Name>,
        condition: impl Into<Name>,
        schedule: Schedule,
        input: I,
        check: F,
    ) -> Self
    where
        I: Clone + Send + Sync + 'static,
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Finding> + Send + 'static,
    {
        Self {
            name: name.into(),
            condition: condition.into(),
            schedule,
            check: Arc::new(move || Box::pin(check(input.clone()))),
            wake: None,
        }
    }

    /// Also run whenever `wake` changes, not only every interval.
    pub fn woken_by(mut self, wake: tokio::sync::watch::Receiver<u64>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// This detector if `enabled`, none otherwise: a section's one detector.
    pub fn if_enabled(self, enabled: bool) -> Vec<Self> {
        if enabled { vec![self] } else { Vec::new() }
    }

    /// Runs the check once, unbounded.
    pub async fn observe(&self) -> Finding {
        (self.check)().await
    }

    /// Runs the check once within its timeout; past it the run is dropped and the finding
    /// is Unknown.
    pub async fn observe_bounded(&self) -> Finding {
        let timeout = self.schedule.timeout;
        match tokio::time::timeout(timeout, self.observe()).await {
            Ok(finding) => finding,
            Err(_) => Finding::unknown(
                self.name.clone(),
                self.condition.clone(),
                "DetectorTimedOut",
                format!("the check did not finish within its {timeout:?} timeout"),
            ),
        }
    }
}
