//! The coordinator at scale, against the real test control plane: `--nodes` kwok nodes with a
//! NodeReport each, one policy selecting them all, and the release coordinator. Measures the
//! time from start to ready, RSS and CPU, and the admission latency from a NodeMaintenance's
//! creation to the moment a watch sees it Admitted, next to the API server's own write latency
//! (the create call) in the same run.
//!
//!   cargo build --release -p nodeward-coordinator
//!   cargo run --release -p nodeward-bench --bin coordinator-scale -- --nodes 1000
//!
//! Uses the control plane in $NODEWARD_TEST_CONTROLPLANE if set, else starts one.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clap::Parser;
use futures::StreamExt;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use nodeward_api::{MaintenancePhase, NodeMaintenance, NodeReport};
use nodeward_bench::{CLK_TCK, footprint, median, ms, percentile};
use nodeward_e2e::{TestEnv, daemon::Daemon, env::TEST_LABEL};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Simulated nodes, each with a NodeReport.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Maintenances created per run.
    #[arg(long, default_value_t = 100)]
    maintenances: usize,
    /// Runs of `--maintenances` admissions (medians are over runs).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Pause between two creations.
    #[arg(long, default_value = "50ms", value_parser = humantime_ms)]
    pace: Duration,
    /// The coordinator binary (a release build).
    #[arg(long, default_value = "target/release/nodeward-coordinator")]
    coordinator: PathBuf,
}

fn humantime_ms(text: &str) -> Result<Duration, String> {
    text.strip_suffix("ms")
        .and_then(|n| n.parse().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?}: give milliseconds, e.g. 50ms"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let env = TestEnv::new("bench-scale").await?;
    let client = env.client.clone();
    let reports: Api<NodeReport> = Api::all(client.clone());

    seed(&env, &reports, args.nodes).await?;
    let selector = format!("{TEST_LABEL}={}", env.id);

    // One policy over every node of the run, allowing them all at once; the seeded heartbeats
    // are not refreshed, so it trusts them for the run.
    env.create_policy(
        "all",
        json!({"maxConcurrent": "100%", "deadlines": {"agentHeartbeat": "24h", "agentLost": "24h"}}),
    )
    .await?;

    let spawned = Instant::now();
    let coordinator = nodeward_bench::sole_coordinator(&args.coordinator, &env)?;
    coordinator.wait_ready(Duration::from_secs(300)).await?;
    let time_to_ready = spawned.elapsed();
    let pid = coordinator.child.id();
    let (rss_ready, _, _) = footprint(pid)?;

    // Admission latency: creation (call start) to a watch seeing it Admitted.
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let admitted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watching = tokio::spawn(note_admissions(
        maintenances.clone(),
        selector,
        admitted.clone(),
    ));
    let (_, _, ticks_before) = footprint(pid)?;
    let load_started = Instant::now();
    let runs = admission_runs(&env, &args, &maintenances, &admitted).await?;
    let load_elapsed = load_started.elapsed();
    let (rss_loaded, peak, ticks_after) = footprint(pid)?;
    let load_millicores =
        (ticks_after - ticks_before) as f64 / CLK_TCK / load_elapsed.as_secs_f64() * 1000.0;
    // Idle: nothing changes but the kwok heartbeats.
    let (rss_idle, peak_end, idle_millicores) =
        idle_footprint(pid, Duration::from_secs(30)).await?;
    let metrics = coordinator_metrics(&coordinator).await?;
    watching.abort();

    let p50 = median(runs.admission_p50);
    let p99 = median(runs.admission_p99);
    let w50 = median(runs.create_p50);
    let w99 = median(runs.create_p99);
    println!("cores: {cores}");
    println!("nodes: {} (each with a NodeReport)", args.nodes);
    println!("time to ready after start: {}", ms(time_to_ready));
    println!(
        "RSS: {rss_ready:.1} MiB at ready, {rss_loaded:.1} MiB after the runs, {rss_idle:.1} MiB idle; peak {:.1} MiB",
        peak.max(peak_end)
    );
    println!("CPU: {load_millicores:.0} millicores during the runs, {idle_millicores:.1} idle");
    println!(
        "admission latency (creation to Admitted seen), median of {} runs of {}: p50 {} p99 {}",
        args.runs,
        args.maintenances,
        ms(p50),
        ms(p99)
    );
    println!(
        "API server create latency, same runs: p50 {} p99 {}; coordinator share of p99: {}",
        ms(w50),
        ms(w99),
        ms(p99.saturating_sub(w99))
    );
    metrics.print();

    drop(coordinator);
    for report in reports.list(&ListParams::default()).await? {
        if report.name_any().starts_with(&format!("{}-", env.id)) {
            let _ = reports
                .delete(&report.name_any(), &DeleteParams::default())
                .await;
        }
    }
    env.cleanup().await
}

fn jiff_now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

/// `nodes` Ready kwok nodes, each with a NodeReport as its agent would write it.
async fn seed(env: &TestEnv, reports: &Api<NodeReport>, nodes: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    env.create_many_nodes(nodes, Duration::from_secs(900))
        .await?;
    eprintln!(
        "created {} nodes, all Ready after {:.1} s",
        nodes,
        started.elapsed().as_secs_f64()
    );
    nodeward_e2e::concurrently(0..nodes, 16, |i| {
            let (reports, name) = (reports.clone(), env.node_name(i));
            async move {
                let report: NodeReport = serde_json::from_value(json!({
                    "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
                    "metadata": {"name": name}, "spec": {"nodeName": name},
                }))?;
                reports.create(&PostParams::default(), &report).await?;
                reports
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {
                            "agentVersion": "bench", "heartbeatTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff_now()),
                            "findings": [{"type": "RebootRequired", "status": "False", "reason": "NoSentinel",
                                "message": "no reboot required", "detector": "reboot-required",
                                "since": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff_now())}],
                        }})),
                    )
                    .await?;
                anyhow::Ok(())
            }
        }).await?;
    Ok(())
}

/// Each run's admission and API create latencies (p50, p99).
#[derive(Default)]
struct Runs {
    admission_p50: Vec<Duration>,
    admission_p99: Vec<Duration>,
    create_p50: Vec<Duration>,
    create_p99: Vec<Duration>,
}

/// `args.runs` runs of `args.maintenances` maintenances each, every one timed from its
/// creation to `admitted` (filled by a watch) having it; each run's are finished, as agents
/// would, so that the next starts from free slots.
async fn admission_runs(
    env: &TestEnv,
    args: &Args,
    maintenances: &Api<NodeMaintenance>,
    admitted: &Mutex<HashMap<String, Instant>>,
) -> anyhow::Result<Runs> {
    let mut runs = Runs::default();
    for run in 0..args.runs {
        let mut created = Vec::new();
        for i in 0..args.maintenances {
            let node = env.node_name((run * args.maintenances + i) % args.nodes);
            let name = format!("{node}-r{run}");
            let m: NodeMaintenance = serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
                "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
                "spec": {"nodeName": node, "reason": "Manual", "action": "DrainOnly"},
            }))?;
            let start = Instant::now();
            maintenances.create(&PostParams::default(), &m).await?;
            created.push((name, start, start.elapsed()));
            tokio::time::sleep(args.pace).await;
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        let latencies = loop {
            let seen = admitted
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .clone();
            let all: Option<Vec<Duration>> = created
                .iter()
                .map(|(name, start, _)| seen.get(name).map(|t| t.duration_since(*start)))
                .collect();
            if let Some(all) = all {
                break all;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "run {run}: not all admitted in 120 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut latencies = latencies;
        latencies.sort();
        let mut writes: Vec<Duration> = created.iter().map(|c| c.2).collect();
        writes.sort();
        eprintln!(
            "run {run}: admission p50 {} p99 {}; API create p50 {} p99 {}",
            ms(percentile(&latencies, 50.0)),
            ms(percentile(&latencies, 99.0)),
            ms(percentile(&writes, 50.0)),
            ms(percentile(&writes, 99.0))
        );
        runs.admission_p50.push(percentile(&latencies, 50.0));
        runs.admission_p99.push(percentile(&latencies, 99.0));
        runs.create_p50.push(percentile(&writes, 50.0));
        runs.create_p99.push(percentile(&writes, 99.0));
        // Finish them, as agents would, so that the next run starts from free slots.
        for (name, _, _) in &created {
            maintenances
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
                )
                .await?;
        }
    }
    Ok(runs)
}

/// What the coordinator's metrics tell.
struct CoordinatorMetrics {
    /// Admissions it timed.
    admissions: f64,
    /// Per bucket bound (seconds), the admissions whose own share was within it.
    within: Vec<(&'static str, f64)>,
    /// Per kind of round: how many, and the mean decision time (seconds).
    rounds: Vec<(&'static str, f64, f64)>,
}

impl CoordinatorMetrics {
    fn print(&self) {
        println!(
            "coordinator's own share of {:.0} admissions (watch event to admission write, less the budget writes): {}",
            self.admissions,
            within(&self.within, self.admissions).join(", ")
        );
        for (kind, count, mean) in &self.rounds {
            println!(
                "{kind} rounds: {count:.0}, mean decision time {:.3} ms",
                mean * 1000.0
            );
        }
    }
}

async fn coordinator_metrics(coordinator: &Daemon) -> anyhow::Result<CoordinatorMetrics> {
    // The coordinator's own share of each admission (its histogram; exact at the bounds).
    let own = "nodeward_coordinator_admission_coordinator_seconds";
    let own_count = coordinator.metric(&format!("{own}_count")).await?;
    let mut own_buckets = Vec::new();
    for le in ["0.01", "0.025", "0.05", "0.1", "0.25"] {
        let series = format!("{own}_bucket{{le=\"{le}\"}}");
        own_buckets.push((le, coordinator.metric(&series).await?));
    }
    let mut rounds = Vec::new();
    for kind in ["full", "admission"] {
        let series = |what: &str| {
            format!("nodeward_coordinator_decision_duration_seconds_{what}{{round=\"{kind}\"}}")
        };
        let count = coordinator.metric(&series("count")).await?;
        let sum = coordinator.metric(&series("sum")).await?;
        rounds.push((kind, count, sum / count.max(1.0)));
    }
    Ok(CoordinatorMetrics {
        admissions: own_count,
        within: own_buckets,
        rounds,
    })
}

/// Notes when each maintenance selected by `selector` is first seen out of Pending.
async fn note_admissions(
    maintenances: Api<NodeMaintenance>,
    selector: String,
    seen: Arc<Mutex<HashMap<String, Instant>>>,
) {
    watcher(
        maintenances.clone(),
        watcher::Config::default().labels(&selector),
    )
    .for_each(move |event| {
        if let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = event
            && m.status
                .as_ref()
                .is_some_and(|s| s.phase != MaintenancePhase::Pending)
        {
            seen.lock()
                .map(|mut s| {
                    s.entry(m.name_any())
                        .or_insert_with(Instant::now)
                        .to_owned()
                })
                .ok();
        }
        futures::future::ready(())
    })
    .await
}

/// Each bucket's share of `count`, as "x% <= y ms".
fn within(buckets: &[(&str, f64)], count: f64) -> Vec<String> {
    buckets
        .iter()
        .map(|(le, n)| {
            let ms = le.parse::<f64>().unwrap_or_default() * 1000.0;
            format!("{:.1}% <= {ms:.0} ms", n / count.max(1.0) * 100.0)
        })
        .collect()
}

/// RSS, peak RSS (MiB) and CPU (millicores) of `pid` over `idle`.
async fn idle_footprint(pid: u32, idle: Duration) -> anyhow::Result<(f64, f64, f64)> {
    let (_, _, before) = footprint(pid)?;
    tokio::time::sleep(idle).await;
    let (rss, peak, after) = footprint(pid)?;
    Ok((
        rss,
        peak,
        (after - before) as f64 / CLK_TCK / idle.as_secs_f64() * 1000.0,
    ))
}
