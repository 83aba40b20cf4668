//! What a fleet of agents costs the API server, against the real test control plane.
//!
//! `--nodes` kwok nodes, each made to look like a real one (an InternalIP, 50 images in its
//! status, a Lease renewed and a status report every `--node-status-interval`, as the kubelet's
//! `nodeStatusReportFrequency`: a kwok of the benchmark's own with `bench/kwok/`'s stages),
//! and each with an agent: `--agents` real agents (release
//! builds, each its own process, client and watches, probing the others on its own loopback
//! address), and for the other nodes simulated agents that write what an agent of this
//! version writes at its rhythm (its liveness). One DisruptionPolicy over every node, and the
//! release coordinator.
//!
//! Measured from each real agent's own metrics (`nodeward_watch_events_total`, of them
//! `nodeward_watch_bookmarks_total`, `nodeward_api_received_bytes_total`,
//! `nodeward_api_requests_total`), per minute:
//! - steady state, after `--warmup`, over `--window`;
//! - during a rolling reboot of the simulated nodes at `--max-concurrent` (simulated agents
//!   cordon, take the node NotReady for `--reboot` and back, as a reboot does), over `--window`.
//!
//! From the API server's own metrics over the same windows, for the whole cluster (agents,
//! simulated agents, coordinator, kwok and the benchmark together): watch events and bytes
//! sent by resource (`apiserver_watch_events_total`, `apiserver_watch_events_sizes_sum`) and
//! writes by resource (`apiserver_request_total`), a cross-check of the agents' figures.
//!
//! The medians over the real agents are what one agent costs; the fleet's cost is that times
//! the number of nodes, since every node runs one agent and each agent's cost is measured in a
//! cluster of that size. The coordinator's RSS, CPU and own admission latency are measured in
//! the same runs (it sees every node's liveness).
//!
//!   cargo build --release -p nodeward-agent -p nodeward-coordinator
//!   cargo run --release -p nodeward-bench --bin fleet -- --nodes 1000 --agents 50
//!
//! Uses the control plane in $NODEWARD_TEST_CONTROLPLANE if set, else starts one.

use std::{
    collections::{BTreeMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use kube::Api;
use nodeward_api::NodeMaintenance;
use nodeward_bench::{
    CLK_TCK,
    fleet::{
        AgentAddresses, KWOK, agent_address, kubelet_rhythm_kwok, liveness, make_real,
        simulate_reboots,
    },
    footprint, label, median_f64, samples,
};
use nodeward_e2e::{TestEnv, controlplane, daemon::Daemon};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Nodes in the cluster, each with an agent (real or simulated).
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Real agents (the first nodes); at most 250.
    #[arg(long, default_value_t = 50)]
    agents: usize,
    /// Runs (the figures are medians over them), each with its own fleet.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Windows of each phase per run: steady state is measured this many windows in a row,
    /// then the rollout as many (it lasts long enough: about 4,950 reboots at
    /// `--max-concurrent`); each pair counts as one sample of the medians.
    #[arg(long, default_value_t = 1)]
    windows: usize,
    /// Time for the agents' first findings and writes to settle before measuring.
    #[arg(long, default_value = "150s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// How long each phase is measured.
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
    window: Duration,
    /// How often each node's status is reported (the kubelet's nodeStatusReportFrequency).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    node_status_interval: Duration,
    /// How often a simulated agent writes its liveness (as a real one of this version).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    heartbeat: Duration,
    /// What a simulated agent writes as its liveness: its Lease, or (agents before the
    /// Lease) its NodeReport's heartbeat.
    #[arg(long, value_enum, default_value = "lease")]
    liveness: liveness::Kind,
    /// The rollout's maxConcurrent.
    #[arg(long, default_value_t = 50)]
    max_concurrent: usize,
    /// How long a simulated node's reboot takes, NotReady included.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    reboot: Duration,
    #[arg(long, default_value = "target/release/nodeward-agent")]
    agent: PathBuf,
    #[arg(long, default_value = "target/release/nodeward-coordinator")]
    coordinator: PathBuf,
}

/// One agent's cost over a phase, per minute.
#[derive(Clone, Debug, Default)]
struct Cost {
    /// Watch events by resource.
    events: BTreeMap<String, f64>,
    /// Of them, the bookmarks (no change; agents before the metric count none).
    bookmarks: BTreeMap<String, f64>,
    /// Bytes received by resource (every verb).
    bytes: BTreeMap<String, f64>,
    /// Requests by verb.
    requests: BTreeMap<String, f64>,
}

impl Cost {
    /// One agent's cost from the rates of its `/metrics` series ([`per_minute`]).
    fn from_rates<'a>(rates: impl Iterator<Item = (&'a String, f64)>) -> Self {
        let mut cost = Cost::default();
        for (series, delta) in rates {
            let into = if series.starts_with("nodeward_watch_events_total{") {
                label(series, "resource").map(|r| (&mut cost.events, r))
            } else if series.starts_with("nodeward_watch_bookmarks_total{") {
                label(series, "resource").map(|r| (&mut cost.bookmarks, r))
            } else if series.starts_with("nodeward_api_received_bytes_total{") {
                label(series, "resource").map(|r| (&mut cost.bytes, r))
            } else if series.starts_with("nodeward_api_requests_total{") {
                label(series, "verb").map(|v| (&mut cost.requests, v))
            } else {
                None
            };
            if let Some((map, key)) = into {
                *map.entry(key.to_owned()).or_default() += delta;
            }
        }
        cost
    }

    fn events_total(&self) -> f64 {
        self.events.values().sum()
    }

    /// Watch events that carry a change: all but the bookmarks.
    fn changes_total(&self) -> f64 {
        self.events_total() - self.bookmarks.values().sum::<f64>()
    }

    fn bytes_total(&self) -> f64 {
        self.bytes.values().sum()
    }

    fn writes(&self) -> f64 {
        ["create", "update", "patch", "delete"]
            .iter()
            .filter_map(|v| self.requests.get(*v))
            .sum()
    }

    /// Per key, the median over `costs`.
    fn median(costs: &[Cost]) -> Cost {
        let keys = |pick: fn(&Cost) -> &BTreeMap<String, f64>| {
            costs
                .iter()
                .flat_map(|c| pick(c).keys().cloned())
                .collect::<HashSet<_>>()
        };
        let of = |pick: fn(&Cost) -> &BTreeMap<String, f64>| {
            keys(pick)
                .into_iter()
                .map(|k| {
                    let values = costs
                        .iter()
                        .map(|c| pick(c).get(&k).copied().unwrap_or(0.0))
                        .collect();
                    (k, median_f64(values))
                })
                .collect()
        };
        Cost {
            events: of(|c| &c.events),
            bookmarks: of(|c| &c.bookmarks),
            bytes: of(|c| &c.bytes),
            requests: of(|c| &c.requests),
        }
    }

    fn describe(&self) -> String {
        let fmt = |m: &BTreeMap<String, f64>, unit: &str| {
            m.iter()
                .filter(|(_, v)| **v >= 0.005)
                .map(|(k, v)| {
                    let k = if k.is_empty() {
                        "discovery"
                    } else {
                        k.as_str()
                    };
                    format!("{k} {v:.2}{unit}")
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "watch events {:.2}/min ({}), of them changes {:.2}/min (bookmarks: {}); received {:.1} KiB/min ({}); requests/min {}; writes {:.2}/min",
            self.events_total(),
            fmt(&self.events, ""),
            self.changes_total(),
            fmt(&self.bookmarks, ""),
            self.bytes_total() / 1024.0,
            fmt(
                &self
                    .bytes
                    .iter()
                    .map(|(k, v)| (k.clone(), v / 1024.0))
                    .collect(),
                " KiB"
            ),
            fmt(&self.requests, ""),
            self.writes()
        )
    }
}

/// Each series' growth between two snapshots of a `/metrics`, per minute of `over`.
fn per_minute<'a>(
    before: &'a BTreeMap<String, f64>,
    after: &'a BTreeMap<String, f64>,
    over: Duration,
) -> impl Iterator<Item = (&'a String, f64)> {
    let scale = 60.0 / over.as_secs_f64();
    after.iter().map(move |(series, value)| {
        (
            series,
            (value - before.get(series).copied().unwrap_or(0.0)) * scale,
        )
    })
}

/// What the API server sent and took over a phase, per minute, for the whole cluster.
#[derive(Clone, Debug, Default)]
struct ServerCost {
    /// Watch events sent, by resource.
    events: BTreeMap<String, f64>,
    /// Watch bytes sent, by resource.
    bytes: BTreeMap<String, f64>,
    /// Writes (create, update, patch, delete) taken, by resource.
    writes: BTreeMap<String, f64>,
}

impl ServerCost {
    /// The cluster's cost from the rates of the API server's `/metrics` series ([`per_minute`]).
    fn from_rates<'a>(rates: impl Iterator<Item = (&'a String, f64)>) -> Self {
        let mut cost = ServerCost::default();
        for (series, delta) in rates {
            let into = if series.starts_with("apiserver_watch_events_total{") {
                Some(&mut cost.events)
            } else if series.starts_with("apiserver_watch_events_sizes_sum{") {
                Some(&mut cost.bytes)
            } else if series.starts_with("apiserver_request_total{")
                && label(series, "verb")
                    .is_some_and(|v| ["POST", "PUT", "PATCH", "DELETE", "APPLY"].contains(&v))
            {
                Some(&mut cost.writes)
            } else {
                None
            };
            if let (Some(map), Some(resource)) = (into, label(series, "resource"))
                && delta >= 0.005
            {
                *map.entry(resource.to_owned()).or_default() += delta;
            }
        }
        cost
    }

    fn describe(&self) -> String {
        let top = |m: &BTreeMap<String, f64>, scale: f64, unit: &str| {
            let mut v: Vec<_> = m.iter().collect();
            v.sort_by(|a, b| b.1.total_cmp(a.1));
            v.iter()
                .take(6)
                .map(|(k, n)| format!("{k} {:.1}{unit}", *n / scale))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "watch events {:.0}/min ({}); watch egress {:.0} KiB/min ({}); writes {:.1}/s ({})",
            self.events.values().sum::<f64>(),
            top(&self.events, 1.0, ""),
            self.bytes.values().sum::<f64>() / 1024.0,
            top(&self.bytes, 1024.0, " KiB"),
            self.writes.values().sum::<f64>() / 60.0,
            top(&self.writes, 60.0, "/s"),
        )
    }
}

/// What one run measured.
struct Figures {
    /// Per-agent cost, medians over the real agents.
    steady: Cost,
    rollout: Cost,
    /// The API server's, whole cluster.
    server_steady: ServerCost,
    server_rollout: ServerCost,
    /// The most any one agent received during the rollout (events per minute).
    rollout_max_events: f64,
    admissions_per_minute: f64,
    agent_rss_mib: f64,
    /// The coordinator's RSS at the end of the steady window, and after the rollout's.
    coordinator_rss_steady_mib: f64,
    coordinator_rss_mib: f64,
    coordinator_mcores_steady: f64,
    coordinator_mcores_rollout: f64,
    /// The coordinator's own share of admission latency, p99 (bucket bound) and how many.
    coordinator_own_p99: Option<f64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        (1..=250).contains(&args.agents) && args.agents < args.nodes,
        "--agents: from 1 to 250, and fewer than --nodes"
    );
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "cores: {cores}; {} nodes, {} real agents, node status every {:?}, simulated liveness every {:?}",
        args.nodes, args.agents, args.node_status_interval, args.heartbeat
    );
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        for (window, figures) in one_run(&args).await?.into_iter().enumerate() {
            print_figures(
                &format!("run {run}, window {}", window + 1),
                &args,
                &figures,
            );
            runs.push(figures);
        }
    }
    let pick = |f: fn(&Figures) -> f64| median_f64(runs.iter().map(f).collect());
    let steady = Cost::median(&runs.iter().map(|f| f.steady.clone()).collect::<Vec<_>>());
    let rollout = Cost::median(&runs.iter().map(|f| f.rollout.clone()).collect::<Vec<_>>());
    println!(
        "\nmedians of {} samples at {} nodes:",
        runs.len(),
        args.nodes
    );
    println!("  steady, per agent: {}", steady.describe());
    println!(
        "  rollout at maxConcurrent {} ({:.0} admissions/min), per agent: {} (max over agents {:.1} events/min)",
        args.max_concurrent,
        pick(|f| f.admissions_per_minute),
        rollout.describe(),
        pick(|f| f.rollout_max_events)
    );
    println!(
        "  all {} agents' writes in steady state: {:.2}/s (per agent {:.3}/min x {} nodes)",
        args.nodes,
        steady.writes() * args.nodes as f64 / 60.0,
        steady.writes(),
        args.nodes
    );
    println!(
        "  agent RSS {:.1} MiB; coordinator RSS {:.1} MiB steady, {:.1} MiB after the rollout, CPU {:.0} mc steady / {:.0} mc rollout, own admission share p99 <= {}",
        pick(|f| f.agent_rss_mib),
        pick(|f| f.coordinator_rss_steady_mib),
        pick(|f| f.coordinator_rss_mib),
        pick(|f| f.coordinator_mcores_steady),
        pick(|f| f.coordinator_mcores_rollout),
        runs.iter()
            .filter_map(|f| f.coordinator_own_p99)
            .map(|p| format!("{:.0} ms", p * 1000.0))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    Ok(())
}

fn print_figures(title: &str, args: &Args, f: &Figures) {
    println!("{title}:");
    println!(
        "  steady, per agent (median of {}): {}",
        args.agents,
        f.steady.describe()
    );
    println!(
        "  rollout ({:.0} admissions/min), per agent: {} (max {:.1} events/min)",
        f.admissions_per_minute,
        f.rollout.describe(),
        f.rollout_max_events
    );
    println!(
        "  API server, whole cluster, steady: {}",
        f.server_steady.describe()
    );
    println!(
        "  API server, whole cluster, rollout: {}",
        f.server_rollout.describe()
    );
    println!(
        "  agent RSS {:.1} MiB; coordinator RSS {:.1} MiB steady, {:.1} MiB after the rollout, {:.0} mc steady, {:.0} mc rollout, own p99 {:?}",
        f.agent_rss_mib,
        f.coordinator_rss_steady_mib,
        f.coordinator_rss_mib,
        f.coordinator_mcores_steady,
        f.coordinator_mcores_rollout,
        f.coordinator_own_p99
    );
}

/// The running fleet of one run.
struct Fleet {
    env: TestEnv,
    _kwok: Daemon,
    _addresses: AgentAddresses,
    simulated: Vec<String>,
    liveness: tokio::task::JoinHandle<()>,
    coordinator: Daemon,
    agents: Vec<Daemon>,
}

/// One fleet: `--windows` steady windows, then the rollout's; the figures of each pair.
async fn one_run(args: &Args) -> anyhow::Result<Vec<Figures>> {
    let fleet = start_fleet(args).await?;
    println!(
        "{} agents ready; warming up for {:?}",
        fleet.agents.len(),
        args.warmup
    );
    tokio::time::sleep(args.warmup).await;
    let coordinator_pid = fleet.coordinator.child.id();
    let mut steady = Vec::new();
    for _ in 0..args.windows {
        let window = measure(&fleet, coordinator_pid, args.window).await?;
        steady.push((window, footprint(coordinator_pid)?.0));
    }

    // The rolling reboot of the simulated nodes, played by their simulated agents.
    let env = &fleet.env;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let admitted = Arc::new(Mutex::new(0usize));
    let simulating = simulate_reboots(env, maintenances, args.reboot, admitted.clone());
    for node in &fleet.simulated {
        env.create_maintenance(&format!("{node}-reboot"), node, "Reboot", "Reboot")
            .await?;
    }
    let count = || *admitted.lock().unwrap_or_else(|p| p.into_inner());
    // The first wave admitted; then the windows.
    nodeward_e2e::wait::eventually("the rollout to start", Duration::from_secs(120), || {
        let n = count();
        async move { Ok((n > 0).then_some(())) }
    })
    .await?;
    let mut figures = Vec::new();
    for ((steady, server_steady, _, coordinator_mcores_steady), coordinator_rss_steady_mib) in
        steady
    {
        let before = count();
        let (rollout, server_rollout, rollout_max_events, coordinator_mcores_rollout) =
            measure(&fleet, coordinator_pid, args.window).await?;
        let admissions_per_minute = (count() - before) as f64 * 60.0 / args.window.as_secs_f64();
        let agent_rss = fleet
            .agents
            .iter()
            .filter_map(|a| footprint(a.child.id()).ok().map(|f| f.0))
            .collect();
        // Cumulative over the rollout so far: its admissions are mostly its first wave's.
        let coordinator_own_p99 = histogram_p99(
            &samples(&fleet.coordinator.get("/metrics").await?.1),
            "nodeward_coordinator_admission_coordinator_seconds_bucket",
        );
        figures.push(Figures {
            steady: Cost::median(&steady),
            rollout: Cost::median(&rollout),
            server_steady,
            server_rollout,
            rollout_max_events,
            admissions_per_minute,
            agent_rss_mib: median_f64(agent_rss),
            coordinator_rss_steady_mib,
            coordinator_rss_mib: footprint(coordinator_pid)?.0,
            coordinator_mcores_steady,
            coordinator_mcores_rollout,
            coordinator_own_p99,
        });
    }
    simulating.abort();
    fleet.liveness.abort();
    drop(fleet.agents);
    drop(fleet.coordinator);
    fleet.env.cleanup().await?;
    Ok(figures)
}

/// The nodes, the simulated agents' liveness, one policy over every node, the coordinator and
/// the real agents, all ready.
async fn start_fleet(args: &Args) -> anyhow::Result<Fleet> {
    let env = TestEnv::new("fleet").await?;
    let kwok = kubelet_rhythm_kwok(&env, args.node_status_interval)?;
    let addresses = AgentAddresses::add(args.agents)?;
    let started = Instant::now();
    env.create_many_nodes_for(args.nodes, Duration::from_secs(600), KWOK)
        .await?;
    let names: Vec<String> = (0..args.nodes).map(|i| env.node_name(i)).collect();
    make_real(&env, &names, args.agents).await?;
    println!(
        "{} nodes ready and dressed in {:.0} s",
        args.nodes,
        started.elapsed().as_secs_f64()
    );
    let simulated = names[args.agents..].to_vec();
    liveness::first(&env, &simulated).await?;
    let liveness = tokio::spawn(liveness::keep(
        env.client.clone(),
        env.namespace.clone(),
        simulated.clone(),
        args.heartbeat,
        args.liveness,
    ));
    env.create_policy(
        "fleet",
        json!({"maxConcurrent": args.max_concurrent,
               "deadlines": {"agentHeartbeat": "24h", "agentLost": "24h", "start": "1h", "reboot": "1h"}}),
    )
    .await?;
    let coordinator = nodeward_bench::sole_coordinator(&args.coordinator, &env)?;
    coordinator.wait_ready(Duration::from_secs(120)).await?;
    let agents = start_agents(args, &env, &names[..args.agents])?;
    for agent in &agents {
        agent.wait_ready(Duration::from_secs(300)).await?;
    }
    Ok(Fleet {
        env,
        _kwok: kwok,
        _addresses: addresses,
        simulated,
        liveness,
        coordinator,
        agents,
    })
}

/// Every agent's cost over `window` (per minute), the API server's, the most events any one
/// agent received per minute, and the coordinator's CPU in millicores meanwhile.
async fn measure(
    fleet: &Fleet,
    coordinator: u32,
    window: Duration,
) -> anyhow::Result<(Vec<Cost>, ServerCost, f64, f64)> {
    let agents = &fleet.agents;
    let server_before = server_metrics(&fleet.env).await?;
    let before = snapshot(agents).await?;
    let ticks = footprint(coordinator)?.2;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after = snapshot(agents).await?;
    let server_after = server_metrics(&fleet.env).await?;
    let elapsed = started.elapsed();
    let used = (footprint(coordinator)?.2 - ticks) as f64 / CLK_TCK;
    let costs: Vec<Cost> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| Cost::from_rates(per_minute(b, a, elapsed)))
        .collect();
    let max_events = costs.iter().map(Cost::events_total).fold(0.0, f64::max);
    Ok((
        costs,
        ServerCost::from_rates(per_minute(&server_before, &server_after, elapsed)),
        max_events,
        used * 1000.0 / elapsed.as_secs_f64(),
    ))
}

/// The API server's own metrics.
async fn server_metrics(env: &TestEnv) -> anyhow::Result<BTreeMap<String, f64>> {
    let request = hyper::Request::get("/metrics").body(Vec::new())?;
    let text = env
        .client
        .request_text(request)
        .await
        .context("reading the API server's /metrics")?;
    Ok(samples(&text))
}

async fn snapshot(agents: &[Daemon]) -> anyhow::Result<Vec<BTreeMap<String, f64>>> {
    futures::stream::iter(agents)
        .map(|a| async move { Ok::<_, anyhow::Error>(samples(&a.get("/metrics").await?.1)) })
        .buffered(16)
        .try_collect()
        .await
}

/// The upper bound of the bucket holding the 99th percentile of a histogram's samples.
fn histogram_p99(samples: &BTreeMap<String, f64>, bucket: &str) -> Option<f64> {
    let mut buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|(series, _)| series.starts_with(bucket))
        .filter_map(|(series, count)| {
            let le = label(series, "le")?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, *count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, count)| *count >= 0.99 * total)
        .map(|(bound, _)| *bound)
}

/// Starts one real agent per node in `nodes`, each answering probes on its own loopback
/// address.
fn start_agents(args: &Args, env: &TestEnv, nodes: &[String]) -> anyhow::Result<Vec<Daemon>> {
    let dir = std::env::temp_dir().join(format!("nodeward-fleet-{}", env.id));
    std::fs::create_dir_all(&dir)?;
    let program = args.agent.to_str().context("agent path is not UTF-8")?;
    let mut agents = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let config = dir.join(format!("{node}.yaml"));
        std::fs::write(
            &config,
            format!(
                "shutdownGuard: {{enabled: false}}\ndetectors:\n  peers: {{listenAddress: \"{}\"}}\n",
                agent_address(i, args.agents)
            ),
        )?;
        agents.push(Daemon::start_with_env(
            program,
            &format!("{}-agent-{i}", env.id),
            // Not --namespace: the namespace comes by its environment variable, which agents
            // before the flag (measured for the "before" figures) ignore.
            &[
                "run".into(),
                "--node-name".into(),
                node.clone(),
                "--kubeconfig".into(),
                controlplane::shared().kubeconfig.display().to_string(),
                "--config".into(),
                config.display().to_string(),
            ],
            &[("POD_NAMESPACE", &env.namespace)],
        )?);
    }
    Ok(agents)
}
