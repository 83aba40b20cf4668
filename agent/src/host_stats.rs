//! Host statistics as Prometheus gauges, as node-problem-detector's system-stats-monitor
//! exports them: CPU use, load, memory and swap, uptime, each filesystem's size and free
//! space, and each interface's bytes received and sent. Read with `sysinfo` every
//! `hostStats.interval`. Labels name mounts and interfaces of this node only, at most
//! [`LABELS_LIMIT`] of each, so the series stay few; the interfaces the network detector
//! ignores (container veths and bridges) are left out.

use std::time::Duration;

use serde::Deserialize;
use sysinfo::{Disks, MemoryRefreshKind, Networks, System};

use crate::{
    detect::interfaces::{InterfacesConfig, is_ignored},
    metrics::{FilesystemLabels, HostMetrics, InterfaceLabels, StateLabels, WindowLabels},
};

/// The most filesystems and interfaces labelled.
pub const LABELS_LIMIT: usize = 32;

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct HostStatsConfig {
    pub enabled: bool,
    #[serde(deserialize_with = "crate::values::duration")]
    pub interval: Duration,
    /// Interfaces left out, as the network detector's `interfaces.ignore` (default the same).
    pub ignore_interfaces: Vec<String>,
}

impl Default for HostStatsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(60),
            ignore_interfaces: InterfacesConfig::default().ignore,
        }
    }
}

impl HostStatsConfig {
    pub fn validate(&self, place: &str) -> Result<(), String> {
        if self.interval < Duration::from_secs(1) {
            return Err(format!("{place}.interval: must be at least 1s, e.g. 60s"));
        }
        InterfacesConfig {
            ignore: self.ignore_interfaces.clone(),
        }
        .validate(&format!("{place}.ignoreInterfaces"))
        .map_err(|e| e.replace(".ignoreInterfaces.ignore", ".ignoreInterfaces"))
    }
}

/// One reading of the host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub cpu_usage: f64,
    pub load: [f64; 3],
    pub memory_total: u64,
    pub memory_available: u64,
    pub memory_used: u64,
    pub swap_total: u64,
    pub swap_used: u64,
    pub uptime: u64,
    /// Mount point, filesystem type, total and available bytes.
    pub filesystems: Vec<(String, String, u64, u64)>,
    /// Interface, bytes received and transmitted.
    pub interfaces: Vec<(String, u64, u64)>,
}

/// What `sample` keeps: the filesystems (first by mount point) and interfaces not ignored,
/// at most [`LABELS_LIMIT`] of each.
pub fn kept(mut sample: Sample, ignore: &[String]) -> Sample {
    sample.filesystems.sort();
    sample.filesystems.dedup_by(|a, b| a.0 == b.0);
    sample.filesystems.truncate(LABELS_LIMIT);
    sample
        .interfaces
        .retain(|(name, _, _)| name != "lo" && !is_ignored(name, ignore));
    sample.interfaces.sort();
    sample.interfaces.truncate(LABELS_LIMIT);
    sample
}

/// Sets the gauges to `sample`; filesystems and interfaces gone since the last one go too.
pub fn record(metrics: &HostMetrics, sample: &Sample) {
    let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    metrics.cpu.set(sample.cpu_usage);
    for (window, value) in ["1m", "5m", "15m"].into_iter().zip(sample.load) {
        metrics
            .load
            .get_or_create(&WindowLabels {
                window: window.to_owned(),
            })
            .set(value);
    }
    for (family, values) in [
        (
            &metrics.memory,
            vec![
                ("total", sample.memory_total),
                ("available", sample.memory_available),
                ("used", sample.memory_used),
            ],
        ),
        (
            &metrics.swap,
            vec![("total", sample.swap_total), ("used", sample.swap_used)],
        ),
    ] {
        for (state, value) in values {
            family
                .get_or_create(&StateLabels {
                    state: state.to_owned(),
                })
                .set(gauge(value));
        }
    }
    metrics.uptime.set(gauge(sample.uptime));
    metrics.filesystem.clear();
    for (mount, fstype, total, available) in &sample.filesystems {
        for (state, value) in [("total", total), ("available", available)] {
            metrics
                .filesystem
                .get_or_create(&FilesystemLabels {
                    mount: mount.clone(),
                    fstype: fstype.clone(),
                    state: state.to_owned(),
                })
                .set(gauge(*value));
        }
    }
    metrics.network.clear();
    for (interface, received, transmitted) in &sample.interfaces {
        for (direction, value) in [("received", received), ("transmitted", transmitted)] {
            metrics
                .network
                .get_or_create(&InterfaceLabels {
                    interface: interface.clone(),
                    direction: direction.to_owned(),
                })
                .set(gauge(*value));
        }
    }
}

/// Reads the host: what `sysinfo` finds in `/proc` and `/sys` (in a pod, its own mounts and,
/// without the host network, its own interfaces).
pub struct Reader {
    system: System,
    disks: Disks,
    networks: Networks,
}

impl Reader {
    /// The reader; the error says what of the host cannot be read.
    pub fn new() -> Result<Self, String> {
        fn what(part: &'static str) -> impl Fn(sysinfo::Error) -> String {
            move |e| format!("reading the host's {part}: {e}")
        }
        Ok(Self {
            system: System::new().map_err(what("CPU and memory"))?,
            disks: Disks::new_with_refreshed_list().map_err(what("filesystems"))?,
            networks: Networks::new_with_refreshed_list().map_err(what("interfaces"))?,
        })
    }

    /// A sample now (CPU use is measured since the previous one); what cannot be read counts
    /// as 0.
    pub fn sample(&mut self) -> Sample {
        self.system.refresh_cpu_usage();
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::everything());
        self.disks.refresh(true);
        self.networks.refresh(true);
        let load = System::load_average().map_or([0.0; 3], |l| [l.one, l.five, l.fifteen]);
        Sample {
            cpu_usage: f64::from(self.system.global_cpu_usage()) / 100.0,
            load,
            memory_total: self.system.total_memory(),
            memory_available: self.system.available_memory(),
            memory_used: self.system.used_memory(),
            swap_total: self.system.total_swap(),
            swap_used: self.system.used_swap(),
            uptime: System::uptime().unwrap_or_default(),
            filesystems: self
                .disks
                .iter()
                .map(|d| {
                    (
                        d.mount_point().display().to_string(),
                        d.file_system().to_string_lossy().into_owned(),
                        d.total_space(),
                        d.available_space(),
                    )
                })
                .collect(),
            interfaces: self
                .networks
                .iter()
                .map(|(name, data)| {
                    (
                        name.to_string_lossy().into_owned(),
                        data.total_received(),
                        data.total_transmitted(),
                    )
                })
                .collect(),
        }
    }
}

/// Samples the host every `config.interval` into `metrics`, until the task is dropped.
pub async fn run(config: HostStatsConfig, metrics: std::sync::Arc<crate::metrics::Metrics>) {
    let mut reader = match Reader::new() {
        Ok(reader) => reader,
        Err(e) => {
            tracing::warn!(error = %e, "host statistics are off");
            return;
        }
    };
    let mut tick = tokio::time::interval(config.interval);
    loop {
        tick.tick().await;
        let sample = kept(reader.sample(), &config.ignore_interfaces);
        record(&metrics.host, &sample);
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn container_interfaces_and_loopback_are_left_out_and_the_labels_bounded() {
        let mut sample = Sample {
            interfaces: vec![
                ("eth0".into(), 10, 20),
                ("lo".into(), 1, 1),
                ("veth12ab".into(), 5, 5),
                ("cni0".into(), 5, 5),
            ],
            filesystems: (0..40)
                .map(|i| (format!("/mnt/{i:02}"), "ext4".to_owned(), 100, 50))
                .collect(),
            ..Sample::default()
        };
        sample
            .filesystems
            .push(("/mnt/00".into(), "ext4".into(), 100, 50));
        let kept = kept(sample, &HostStatsConfig::default().ignore_interfaces);
        assert_eq!(kept.interfaces, vec![("eth0".to_owned(), 10, 20)]);
        assert_eq!(kept.filesystems.len(), LABELS_LIMIT);
        assert_eq!(kept.filesystems[0].0, "/mnt/00");
        assert_eq!(
            kept.filesystems[1].0, "/mnt/01",
            "a mount listed twice counts once"
        );
    }

    #[test]
    fn this_machine_is_read_and_exported() {
        let mut registry = Registry::with_prefix("nodeward");
        let metrics = HostMetrics::register(&mut registry);
        let mut reader = Reader::new().expect("this machine's /proc");
        let sample = kept(reader.sample(), &[]);
        assert!(sample.memory_total > 0 && sample.memory_available <= sample.memory_total);
        assert!(sample.uptime > 0);
        assert!((0.0..=1.0).contains(&sample.cpu_usage));
        record(&metrics, &sample);
        let text = nodeward_runtime::metrics::encode(&registry);
        let total = format!(
            "nodeward_host_memory_bytes{{state=\"total\"}} {}",
            sample.memory_total
        );
        assert!(text.contains(&total), "{text}");
        assert!(
            text.contains("nodeward_host_load_average{window=\"15m\"}"),
            "{text}"
        );
        assert!(text.contains("nodeward_host_uptime_seconds "), "{text}");
        // An interface gone since the last sample leaves no series behind.
        let mut later = sample.clone();
        later.interfaces = vec![("eth9".into(), 1, 2)];
        record(&metrics, &later);
        let text = nodeward_runtime::metrics::encode(&registry);
        assert!(
            text.contains(
                "nodeward_host_network_bytes{interface=\"eth9\",direction=\"received\"} 1"
            ),
            "{text}"
        );
        for (gone, _, _) in &sample.interfaces {
            assert!(
                !text.contains(&format!("interface=\"{gone}\"")),
                "{gone} left behind"
            );
        }
    }
}
