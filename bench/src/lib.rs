//! What the benchmarks share: percentiles, a process's footprint, and the samples of a
//! Prometheus text exposition.

use std::{collections::BTreeMap, time::Duration};

pub mod fleet;

/// Clock ticks per second of /proc/PID/stat on Linux.
pub const CLK_TCK: f64 = 100.0;

/// The `p`th percentile (nearest rank) of `sorted`.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// The median of `values` (the upper one of an even count), 0 when there are none.
pub fn median_f64(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or_default()
}

pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// (RSS, peak RSS) in MiB and CPU ticks of a process.
pub fn footprint(pid: u32) -> anyhow::Result<(f64, f64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15; after the ")" they are the 12th and 13th.
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((
        kib("VmRSS:") / 1024.0,
        kib("VmHWM:") / 1024.0,
        field(11) + field(12),
    ))
}

// The simulated nodes and the policy's concurrency, for the benches that roll through a fleet
// (a plain comment: clap would take a doc comment for the benches' own description).
#[derive(clap::Args, Debug)]
pub struct Fleet {
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// The DisruptionPolicy's maxConcurrent.
    #[arg(long, default_value_t = 10)]
    pub max_concurrent: usize,
}

/// The only coordinator of `env`'s run, without leader election.
pub fn sole_coordinator(
    binary: &std::path::Path,
    env: &nodeward_e2e::TestEnv,
) -> anyhow::Result<nodeward_e2e::daemon::Daemon> {
    coordinator(binary, env, "coordinator", &["--leader-elect=false"])
}

/// The coordinator at `binary` for `env` (its Lease and what it publishes in the test's
/// namespace, the admin's identity), with `extra` arguments.
pub fn coordinator(
    binary: &std::path::Path,
    env: &nodeward_e2e::TestEnv,
    identity: &str,
    extra: &[&str],
) -> anyhow::Result<nodeward_e2e::daemon::Daemon> {
    let mut argv: Vec<String> = vec![
        "run".into(),
        "--kubeconfig".into(),
        nodeward_e2e::controlplane::shared()
            .kubeconfig
            .display()
            .to_string(),
        "--lease-namespace".into(),
        env.namespace.clone(),
        "--identity".into(),
        identity.into(),
    ];
    argv.extend(extra.iter().map(|a| (*a).to_owned()));
    let program = binary
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("{} is not UTF-8", binary.display()))?;
    nodeward_e2e::daemon::Daemon::start(program, &format!("{}-{identity}", env.id), &argv)
}

/// The samples of a Prometheus text exposition: each series (name and labels, as written)
/// and its value.
pub fn samples(exposition: &str) -> BTreeMap<String, f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The value of `label` in a series such as `name{a="x",b="y"}`.
pub fn label<'a>(series: &'a str, label: &str) -> Option<&'a str> {
    let labels = series.split_once('{')?.1.strip_suffix('}')?;
    labels.split("\",").find_map(|pair| {
        let (name, value) = pair.split_once("=\"")?;
        (name == label).then(|| value.trim_end_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_labels_are_read_from_the_exposition() {
        let text = "# HELP x y\nnodeward_watch_events_total{resource=\"nodes\"} 12\nnodeward_api_received_bytes_total{verb=\"watch\",resource=\"nodes\"} 3400\n";
        let s = samples(text);
        assert_eq!(s["nodeward_watch_events_total{resource=\"nodes\"}"], 12.0);
        let bytes = "nodeward_api_received_bytes_total{verb=\"watch\",resource=\"nodes\"}";
        assert_eq!(s[bytes], 3400.0);
        assert_eq!(label(bytes, "verb"), Some("watch"));
        assert_eq!(label(bytes, "resource"), Some("nodes"));
        assert_eq!(label(bytes, "other"), None);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&d, 50.0), Duration::from_millis(50));
        assert_eq!(median_f64(vec![3.0, 1.0, 2.0]), 2.0);
    }
}
