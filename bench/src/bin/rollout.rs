//! Rollout pace and leader failover, against the real test control plane: `--nodes` kwok
//! nodes, one policy with `maxConcurrent`, one Reboot maintenance per node, the release
//! coordinator, and simulated agents that take a maintenance from Admitted to Succeeded in a
//! fixed `--reboot` time.
//!
//! Pace (default): all maintenances created at once; the wall time from the first creation to
//! the last Succeeded against the ideal, ceil(nodes / maxConcurrent) x the reboot time.
//!
//!   cargo build --release -p nodeward-coordinator
//!   cargo run --release -p nodeward-bench --bin rollout -- --nodes 100 --max-concurrent 10
//!
//! Failover (`--leader-kills N`): two coordinators electing a leader; during one long rollout
//! (a node asks again once its maintenance ended) the leader is SIGKILLed N times and
//! restarted; for each kill, the time to the next admission, and the most maintenances ever
//! admitted at once (from a watch started before anything) against the budget. Reboots take
//! 0.5x to 1.5x `--reboot` here, so that slots free one by one and the gap after a kill is the
//! failover's, not a wave's.
//!
//!   cargo run --release -p nodeward-bench --bin rollout -- --leader-kills 20
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
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::watcher,
};
use nix::sys::signal::Signal;
use nodeward_api::{MaintenancePhase, NodeMaintenance};
use nodeward_e2e::{TestEnv, daemon::Daemon, env::TEST_LABEL, history};
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    fleet: nodeward_bench::Fleet,
    /// How long a simulated reboot takes (Admitted to Succeeded).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    reboot: Duration,
    /// Rollouts (pace mode; medians over runs).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Failover mode: kill the leader this many times during one rollout.
    #[arg(long)]
    leader_kills: Option<usize>,
    /// The coordinator binary (a release build).
    #[arg(long, default_value = "target/release/nodeward-coordinator")]
    coordinator: PathBuf,
}

/// The simulated agents: every maintenance of this run seen Admitted is Succeeded `reboot`
/// later (spread over 0.5x to 1.5x of it with `spread`, so that slots free one by one).
/// Records when each was seen admitted.
fn simulate_agents(
    api: Api<NodeMaintenance>,
    selector: String,
    reboot: Duration,
    spread: bool,
    admitted: Arc<Mutex<BTreeMap<String, Instant>>>,
) -> tokio::task::JoinHandle<()> {
    let taken: Arc<Mutex<HashSet<String>>> = Arc::default();
    let patcher = api.clone();
    tokio::spawn(
        watcher(api, watcher::Config::default().labels(&selector)).for_each(move |event| {
            if let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = event
                && m.phase() == MaintenancePhase::Admitted
                && taken.lock().is_ok_and(|mut t| t.insert(m.name_any()))
            {
                if let Ok(mut a) = admitted.lock() {
                    a.insert(m.name_any(), Instant::now());
                }
                let api = patcher.clone();
                let takes = if spread {
                    use std::hash::{Hash, Hasher};
                    let mut hasher = std::collections::hash_map::DefaultHasher::new();
                    m.name_any().hash(&mut hasher);
                    reboot.mul_f64(0.5 + (hasher.finish() % 1000) as f64 / 1000.0)
                } else {
                    reboot
                };
                tokio::spawn(async move {
                    tokio::time::sleep(takes).await;
                    let done = json!({"status": {"phase": "Succeeded", "finishedAt": jiff::Timestamp::now().to_string()}});
                    match api
                        .patch_status(&m.name_any(), &PatchParams::default(), &Patch::Merge(done))
                        .await
                    {
                        // Deleted meanwhile (the bench's cleanup): nothing to finish.
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Ok(_) => {}
                        Err(e) => eprintln!("finishing {}: {e}", m.name_any()),
                    }
                });
            }
            futures::future::ready(())
        }),
    )
}

fn coordinator(args: &Args, env: &TestEnv, identity: &str, elect: bool) -> anyhow::Result<Daemon> {
    let electing = [
        "--lease-duration",
        "2s",
        "--renew-deadline",
        "1500ms",
        "--retry-period",
        "500ms",
    ];
    let extra: &[&str] = if elect {
        &electing
    } else {
        &["--leader-elect=false"]
    };
    nodeward_bench::coordinator(&args.coordinator, env, identity, extra)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let env = TestEnv::new("bench-rollout").await?;
    env.create_many_nodes(args.fleet.nodes, Duration::from_secs(300))
        .await?;
    // The simulated agents' heartbeats, written once: the policy trusts them for the run.
    let names: Vec<String> = (0..args.fleet.nodes).map(|i| env.node_name(i)).collect();
    env.heartbeats(&names).await?;
    let history = history::watch(&env);
    env.create_policy(
        "all",
        json!({"maxConcurrent": args.fleet.max_concurrent, "deadlines": {"agentHeartbeat": "24h", "agentLost": "24h"}}),
    )
    .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let selector = format!("{TEST_LABEL}={}", env.id);
    let admitted: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let agents = simulate_agents(
        maintenances.clone(),
        selector,
        args.reboot,
        args.leader_kills.is_some(),
        admitted.clone(),
    );

    println!("cores: {cores}");
    match args.leader_kills {
        None => pace(&args, &env, &maintenances).await?,
        Some(kills) => failover(&args, &env, &maintenances, &admitted, kills).await?,
    }
    let h = history
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    println!(
        "most maintenances admitted at once: {} (slots {}), budget {}",
        h.max_active, h.max_slots, args.fleet.max_concurrent
    );
    anyhow::ensure!(
        h.max_active <= args.fleet.max_concurrent && h.max_slots <= args.fleet.max_concurrent,
        "the budget was exceeded"
    );
    agents.abort();
    env.cleanup().await
}

async fn pace(
    args: &Args,
    env: &TestEnv,
    maintenances: &Api<NodeMaintenance>,
) -> anyhow::Result<()> {
    let coordinator = coordinator(args, env, "pace", false)?;
    coordinator.wait_ready(Duration::from_secs(120)).await?;
    let waves = args.fleet.nodes.div_ceil(args.fleet.max_concurrent);
    let ideal = args.reboot * u32::try_from(waves)?;
    let mut totals = Vec::new();
    for run in 0..args.runs {
        let started = Instant::now();
        nodeward_e2e::concurrently(0..args.fleet.nodes, 16, |i| {
            let node = env.node_name(i);
            let name = format!("{node}-r{run}");
            async move {
                env.create_maintenance(&name, &node, "Reboot", "Reboot")
                    .await
            }
        })
        .await?;
        nodeward_e2e::wait::eventually(
            "the rollout",
            ideal * 4 + Duration::from_secs(60),
            || async {
                let listed = maintenances
                    .list(
                        &kube::api::ListParams::default()
                            .labels(&format!("{TEST_LABEL}={}", env.id)),
                    )
                    .await?;
                let done = listed
                    .items
                    .iter()
                    .filter(|m| {
                        m.name_any().ends_with(&format!("-r{run}"))
                            && m.phase() == MaintenancePhase::Succeeded
                    })
                    .count();
                Ok((done == args.fleet.nodes).then_some(()))
            },
        )
        .await
        .with_context(|| coordinator.output())?;
        let total = started.elapsed();
        eprintln!(
            "run {run}: {:.2} s against the ideal {:.2} s (ratio {:.3})",
            total.as_secs_f64(),
            ideal.as_secs_f64(),
            total.as_secs_f64() / ideal.as_secs_f64()
        );
        totals.push(total);
    }
    totals.sort();
    let median = totals[totals.len() / 2];
    println!(
        "rollout of {} nodes at maxConcurrent {}, reboot {:?}: median {:.2} s over {} runs (range {:.2}-{:.2} s); ideal {} waves x {:?} = {:.2} s; ratio {:.3}",
        args.fleet.nodes,
        args.fleet.max_concurrent,
        args.reboot,
        median.as_secs_f64(),
        args.runs,
        totals[0].as_secs_f64(),
        totals[totals.len() - 1].as_secs_f64(),
        waves,
        args.reboot,
        ideal.as_secs_f64(),
        median.as_secs_f64() / ideal.as_secs_f64()
    );
    Ok(())
}

/// One long rollout: each of `names` asks for a reboot again once its last maintenance ended,
/// until `stop`.
async fn feed(
    api: Api<NodeMaintenance>,
    env_id: String,
    names: Vec<String>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut round: BTreeMap<String, usize> = BTreeMap::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let listed = api
            .list(&kube::api::ListParams::default().labels(&format!("{TEST_LABEL}={env_id}")))
            .await;
        if let Ok(listed) = listed {
            for node in &names {
                let open = listed
                    .items
                    .iter()
                    .any(|m| &m.spec.node_name == node && !m.phase().is_finished());
                if !open {
                    let n = round.entry(node.clone()).or_default();
                    *n += 1;
                    let m: NodeMaintenance = match serde_json::from_value(json!({
                        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
                        "metadata": {"name": format!("{node}-k{n}"), "labels": {TEST_LABEL: env_id}},
                        "spec": {"nodeName": node, "reason": "Reboot", "action": "Reboot", "requestedBy": "bench"},
                    })) {
                        Ok(m) => m,
                        Err(_) => continue,
                    };
                    let _ = api.create(&PostParams::default(), &m).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn failover(
    args: &Args,
    env: &TestEnv,
    maintenances: &Api<NodeMaintenance>,
    admitted: &Arc<Mutex<BTreeMap<String, Instant>>>,
    kills: usize,
) -> anyhow::Result<()> {
    let mut replicas: BTreeMap<String, Daemon> = BTreeMap::new();
    for identity in ["replica-a", "replica-b"] {
        replicas.insert(identity.to_owned(), coordinator(args, env, identity, true)?);
    }
    for replica in replicas.values() {
        replica.wait_ready(Duration::from_secs(120)).await?;
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let names: Vec<String> = (0..args.fleet.nodes).map(|i| env.node_name(i)).collect();
    let feeding = tokio::spawn(feed(
        maintenances.clone(),
        env.id.clone(),
        names,
        stop.clone(),
    ));
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    let mut gaps = Vec::new();
    // Let the rollout get going.
    tokio::time::sleep(args.reboot * 2).await;
    for kill in 0..kills {
        let holder =
            nodeward_e2e::wait::eventually("a leader", Duration::from_secs(30), || async {
                Ok(leases
                    .get_opt("nodeward-coordinator")
                    .await?
                    .and_then(|l| l.spec?.holder_identity)
                    .filter(|h| replicas.contains_key(h)))
            })
            .await?;
        let killed_at = Instant::now();
        replicas
            .get(&holder)
            .context("the leader's process")?
            .signal(Signal::SIGKILL)?;
        let next = nodeward_e2e::wait::eventually(
            "an admission after the kill",
            Duration::from_secs(60),
            || async {
                Ok(admitted
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .values()
                    .filter(|t| **t > killed_at)
                    .min()
                    .copied())
            },
        )
        .await?;
        let gap = next.duration_since(killed_at);
        eprintln!(
            "kill {kill}: {holder} killed; next admission {:.2} s later",
            gap.as_secs_f64()
        );
        gaps.push(gap);
        replicas.insert(holder.clone(), coordinator(args, env, &holder, true)?);
        replicas[&holder]
            .wait_ready(Duration::from_secs(60))
            .await?;
        // A slot or two turn over before the next kill.
        tokio::time::sleep(args.reboot).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = feeding.await;
    gaps.sort();
    println!(
        "{} leader kills (lease 2s, renew 1.5s, retry 0.5s; reboots 0.5x-1.5x {:?}): time to the next admission median {:.2} s, min {:.2} s, max {:.2} s",
        gaps.len(),
        args.reboot,
        gaps[gaps.len() / 2].as_secs_f64(),
        gaps[0].as_secs_f64(),
        gaps[gaps.len() - 1].as_secs_f64()
    );
    Ok(())
}
