//! The agent's Prometheus metrics. Labels carry detector names, condition types and protocols
//! (small, fixed sets), never a peer or pod, so their number does not grow with the cluster.

use std::sync::{Arc, atomic::AtomicU64};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DetectorLabels {
    pub detector: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckStatusLabels {
    pub detector: String,
    /// `ok`, `problem` or `unknown`.
    pub status: String,
}

/// The values of `nodeward_check_status`'s `status` label: one of them is 1 per detector.
const CHECK_STATUSES: [&str; 3] = ["ok", "problem", "unknown"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `nodes/status`, `nodereports`, `nodereports/status`, `events`.
    pub resource: String,
    /// `ok` or `error`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
    pub verb: String,
    /// E.g. `nodes`, `nodes/status`, `pods/eviction`.
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub protocol: String,
    pub result: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SystemLabels {
    pub os_image: String,
    pub kernel: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PackageLabels {
    pub package: String,
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WindowLabels {
    pub window: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FilesystemLabels {
    pub mount: String,
    pub fstype: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InterfaceLabels {
    pub interface: String,
    pub direction: String,
}

/// The host's gauges ([`crate::host_stats`] sets them).
#[derive(Debug, Default)]
pub struct HostMetrics {
    pub cpu: FloatGauge,
    pub load: Family<WindowLabels, FloatGauge>,
    pub memory: Family<StateLabels, Gauge>,
    pub swap: Family<StateLabels, Gauge>,
    pub uptime: Gauge,
    pub filesystem: Family<FilesystemLabels, Gauge>,
    pub network: Family<InterfaceLabels, Gauge>,
}

impl HostMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let host = registry.sub_registry_with_prefix("host");
        host.register(
            "cpu_usage_ratio",
            "Share of CPU time in use (0 to 1), all CPUs",
            m.cpu.clone(),
        );
        host.register(
            "load_average",
            "Load average over 1m, 5m and 15m",
            m.load.clone(),
        );
        host.register(
            "memory_bytes",
            "Memory: total, available, used",
            m.memory.clone(),
        );
        host.register("swap_bytes", "Swap: total, used", m.swap.clone());
        host.register("uptime_seconds", "Time since boot", m.uptime.clone());
        host.register(
            "filesystem_bytes",
            "Each filesystem's size and space available, by mount point",
            m.filesystem.clone(),
        );
        host.register(
            "network_bytes",
            "Bytes received and transmitted since boot, by interface",
            m.network.clone(),
        );
        m
    }
}

fn check_duration_histogram() -> Histogram {
    Histogram::new([0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 30.0])
}

type HistogramFamily = Family<DetectorLabels, Histogram, fn() -> Histogram>;

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// 1 while the node condition of this type is True (a problem), else 0.
    pub finding: Family<TypeLabels, Gauge>,
    /// Per detector, 1 for its reported (debounced) status and 0 for the others: a condition
    /// fed by several detectors (`NetworkProblem`) shows which of them found the problem.
    check_status: Family<CheckStatusLabels, Gauge>,
    pub check_duration: HistogramFamily,
    pub api_writes: Family<WriteLabels, Counter>,
    /// Every request sent to the API server (reads and watches included).
    pub api_requests: Family<RequestLabels, Counter>,
    /// Bytes of the API server's responses, by the request's verb and resource.
    pub api_received_bytes: Family<RequestLabels, Counter>,
    /// Events received on watches, by resource (bookmarks included).
    pub watch_events: Family<ResourceLabels, Counter>,
    /// Of those, the bookmarks (the API server's periodic note of its resourceVersion).
    pub watch_bookmarks: Family<ResourceLabels, Counter>,
    pub probes: Family<ProbeLabels, Counter>,
    /// 0: this node does not fence itself; 1: its watchdog is armed and fed; 2: fencing (the
    /// watchdog is no longer fed).
    pub fencing: Gauge,
    /// CPU, memory, filesystems and interfaces of the host ([`crate::host_stats`]).
    pub host: HostMetrics,
    /// What the host runs ([`crate::inventory`]).
    pub inventory: InventoryMetrics,
}

/// The inventory's last reading: labels only from the host's own OS and from the packages the
/// configuration names (at most 32), so they stay few.
#[derive(Debug)]
pub struct InventoryMetrics {
    /// 1 for the OS image and kernel last read.
    pub system: Family<SystemLabels, Gauge>,
    /// 1 per named package and its installed version (`version` empty: not installed).
    pub package: Family<PackageLabels, Gauge>,
    /// The upgrades the package manager knows of; -1 while not known.
    pub updates_pending: Gauge,
}

impl InventoryMetrics {
    fn register(registry: &mut Registry) -> Self {
        let system = Family::<SystemLabels, Gauge>::default();
        registry.register(
            "system_info",
            "1 for the host's OS image and running kernel, as the inventory last read them",
            system.clone(),
        );
        let package = Family::<PackageLabels, Gauge>::default();
        registry.register(
            "package_info",
            "1 for each package named in inventory.packages and its installed version (empty: not installed)",
            package.clone(),
        );
        let updates_pending = Gauge::default();
        updates_pending.set(-1);
        registry.register(
            "updates_pending",
            "Upgrades the host's package manager knows of (inventory.pendingUpdates); -1 while not known",
            updates_pending.clone(),
        );
        Self {
            system,
            package,
            updates_pending,
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodeward");
        let finding = Family::<TypeLabels, Gauge>::default();
        registry.register(
            "finding",
            "1 while the node condition of this type reports a problem",
            finding.clone(),
        );
        let check_status = Family::<CheckStatusLabels, Gauge>::default();
        registry.register(
            "check_status",
            "1 for each detector's reported status (ok, problem or unknown, after its 'for'), 0 for the others",
            check_status.clone(),
        );
        let check_duration = HistogramFamily::new_with_constructor(check_duration_histogram);
        registry.register(
            "check_duration_seconds",
            "How long each detector's check took",
            check_duration.clone(),
        );
        let api_writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "api_writes",
            "Writes to the Kubernetes API, by resource and result",
            api_writes.clone(),
        );
        let api_requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "api_requests",
            "Requests sent to the Kubernetes API, by verb and resource (a watch counts when it is opened)",
            api_requests.clone(),
        );
        let api_received_bytes = Family::<RequestLabels, Counter>::default();
        registry.register(
            "api_received_bytes",
            "Bytes received from the Kubernetes API, by the request's verb and resource",
            api_received_bytes.clone(),
        );
        let watch_events = Family::<ResourceLabels, Counter>::default();
        registry.register(
            "watch_events",
            "Events received on watches of the Kubernetes API, by resource",
            watch_events.clone(),
        );
        let watch_bookmarks = Family::<ResourceLabels, Counter>::default();
        registry.register(
            "watch_bookmarks",
            "Bookmarks among the events received on watches, by resource",
            watch_bookmarks.clone(),
        );
        let probes = Family::<ProbeLabels, Counter>::default();
        registry.register(
            "peer_probes",
            "Peer probes sent, by protocol and result",
            probes.clone(),
        );
        let fencing = Gauge::default();
        registry.register(
            "fencing",
            "0: the node does not fence itself; 1: its watchdog is armed and fed; 2: fencing it (the watchdog is no longer fed)",
            fencing.clone(),
        );
        let host = HostMetrics::register(&mut registry);
        let inventory = InventoryMetrics::register(&mut registry);
        Self {
            inventory,
            fencing,
            registry,
            host,
            finding,
            check_status,
            check_duration,
            api_writes,
            api_requests,
            api_received_bytes,
            watch_events,
            watch_bookmarks,
            probes,
        }
    }

    /// Sets `detector`'s reported status (one of [`CHECK_STATUSES`]; another, as `skipped`,
    /// which the daemon never reports, leaves all three 0).
    pub fn check_verdict(&self, detector: &str, status: &str) {
        for value in CHECK_STATUSES {
            let labels = CheckStatusLabels {
                detector: detector.to_owned(),
                status: value.to_owned(),
            };
            self.check_status
                .get_or_create(&labels)
                .set(i64::from(value == status));
        }
    }

    pub fn api_write(&self, resource: &str, ok: bool) {
        let labels = WriteLabels {
            resource: resource.to_owned(),
            result: if ok { "ok" } else { "error" }.to_owned(),
        };
        self.api_writes.get_or_create(&labels).inc();
    }

    /// What the API server is asked and sends: see [`nodeward_runtime::client::ApiCost`].
    pub fn api_cost(self: &Arc<Self>) -> Arc<dyn nodeward_runtime::client::ApiCost> {
        Arc::new(Cost(self.clone()))
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        nodeward_runtime::metrics::encode(&self.registry)
    }

    /// The encoder the health and metrics server calls.
    pub fn encoder(self: &Arc<Self>) -> nodeward_runtime::server::Encode {
        nodeward_runtime::metrics::encoder(self.clone(), |m| &m.registry)
    }
}

/// The agent's metrics as the client's [`nodeward_runtime::client::ApiCost`].
struct Cost(Arc<Metrics>);

impl nodeward_runtime::client::ApiCost for Cost {
    fn request(&self, verb: &'static str, resource: &str) {
        self.0
            .api_requests
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
            })
            .inc();
    }

    fn received(
        &self,
        verb: &'static str,
        resource: &str,
        bytes: usize,
        events: nodeward_runtime::client::Events,
    ) {
        self.0
            .api_received_bytes
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
            })
            .inc_by(bytes as u64);
        let labels = ResourceLabels {
            resource: resource.to_owned(),
        };
        if events.all > 0 {
            self.0
                .watch_events
                .get_or_create(&labels)
                .inc_by(events.all as u64);
        }
        if events.bookmarks > 0 {
            self.0
                .watch_bookmarks
                .get_or_create(&labels)
                .inc_by(events.bookmarks as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_findings_durations_and_writes() {
        let m = Metrics::new();
        m.finding
            .get_or_create(&TypeLabels {
                r#type: "RebootRequired".into(),
            })
            .set(1);
        m.check_duration
            .get_or_create(&DetectorLabels {
                detector: "dns".into(),
            })
            .observe(0.02);
        m.api_write("nodes/status", true);
        m.api_write("nodes/status", false);
        m.check_verdict("default-route", "unknown");
        m.check_verdict("default-route", "problem");
        let text = m.encode();
        for (status, value) in [("ok", 0), ("problem", 1), ("unknown", 0)] {
            let line = format!(
                "nodeward_check_status{{detector=\"default-route\",status=\"{status}\"}} {value}"
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(
            text.contains("nodeward_finding{type=\"RebootRequired\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "nodeward_check_duration_seconds_bucket{le=\"0.025\",detector=\"dns\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("nodeward_api_writes_total{resource=\"nodes/status\",result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "nodeward_api_writes_total{resource=\"nodes/status\",result=\"error\"} 1"
            ),
            "{text}"
        );
    }
}
