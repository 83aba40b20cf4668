//! The cost of safety: a rolling reboot of `--nodes` simulated machines (real agents, real
//! logind, the real coordinator) at `maxConcurrent: 1`, with the workload gate on (the
//! default) and off (`checkDisruptionBudgets` and `waitForEvicted` false). On the machines
//! either a Deployment of one replica per machine (`--workload spread`) or, on each machine,
//! its own ReplicaSet of `--pods` pods pinned to it with a `--grace` to stop (`--workload
//! pinned`); pods take `--ready-after` to become Ready, and a machine stays down `--reboot`.
//! Per mode: the wall time from the maintenances' creation to the last Succeeded (median of
//! `--runs`), the fewest Ready pods seen during the rollout, and the ideal: the sum over the
//! nodes of their own work and their workload's return (from Admitted until both the health
//! gate's `for` after Verifying has passed and its evicted pods are Ready again), against
//! which the wall time shows what coordinating adds. Also printed, the bare floor: reboots
//! and grace one after the other, plus the pods' measured return once their node was back.
//! With `--pdb` a PodDisruptionBudget of `minAvailable: all pods - 1` covers the workload.
//!
//!   cargo build --release -p nodeward-agent -p nodeward-coordinator -p nodeward-bench
//!   target/release/workload-gate --nodes 3 --ready-after 5s --runs 3
//!   target/release/workload-gate --nodes 10 --workload pinned --pods 3 --grace 2s \
//!     --reboot 5s --ready-after 0s --runs 2
//!
//! Uses the control plane in $NODEWARD_TEST_CONTROLPLANE if set, else starts one.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use nodeward_api::{MaintenancePhase, NodeMaintenance};
use nodeward_e2e::{
    NodeSpec, TestEnv,
    daemon::Daemon,
    machine::Machine,
    workload::{self, ReadyWatch},
};
use serde_json::json;

/// What runs on the machines.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    /// One Deployment, one replica per machine (required anti-affinity), grace 1 s.
    Spread,
    /// On each machine its own ReplicaSet of `--pods` pods pinned to it, grace `--grace`.
    Pinned,
}

#[derive(Parser)]
struct Args {
    /// Simulated machines.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    #[arg(long, value_enum, default_value_t = Workload::Spread)]
    workload: Workload,
    /// Pods per machine (`--workload pinned`).
    #[arg(long, default_value_t = 3)]
    pods: usize,
    /// The pods' termination grace period (`--workload pinned`).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// How long a machine stays down when it reboots.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    reboot: Duration,
    /// How long a pod takes to become Ready once running.
    #[arg(long, default_value = "5s")]
    ready_after: String,
    /// Rollouts per mode.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// A PodDisruptionBudget of minAvailable nodes - 1 over the Deployment.
    #[arg(long)]
    pdb: bool,
    #[arg(long, default_value = "target/release/nodeward-agent")]
    agent: String,
    #[arg(long, default_value = "target/release/nodeward-coordinator")]
    coordinator: String,
}

/// One rollout: its wall time, the fewest Ready replicas, and its ideal ([`ideal`]).
struct Rollout {
    wall: Duration,
    fewest: usize,
    ideal: Ideal,
}

/// The health gate's `for` of the bench's policy.
const HEALTH_GATE_FOR: jiff::SignedDuration = jiff::SignedDuration::from_secs(1);

/// When this process saw each maintenance enter each phase (a watch: the API server's own
/// times have whole seconds).
type PhasesSeen = Arc<Mutex<BTreeMap<(String, MaintenancePhase), jiff::Timestamp>>>;

fn watch_phases(env: &TestEnv) -> (PhasesSeen, tokio::task::JoinHandle<()>) {
    let seen: PhasesSeen = Arc::default();
    let recorded = seen.clone();
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(m) = event else { continue };
            let phase = m.phase();
            recorded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry((m.name_any(), phase))
                .or_insert_with(jiff::Timestamp::now);
        }
    });
    (seen, task)
}

/// A rollout against its ideal.
#[derive(Default)]
struct Ideal {
    /// The sum over the nodes of Admitted until the later of Verifying + the health gate's
    /// `for` and its evicted pods Ready again.
    total: f64,
    /// The sum over the nodes of Verifying until its evicted pods were Ready again: the
    /// workloads' own return once their node was back.
    returns: f64,
    /// Per node: Succeeded after that point (the wait the gates add beyond the workload's own
    /// return).
    succeeded_after: Vec<f64>,
    /// Between one node's Succeeded and the next one's Admitted.
    gaps: Vec<f64>,
}

/// `nodes[i]` is the node of maintenance `names[i]`, which ran `per_node` Ready pods.
fn ideal(
    names: &[String],
    nodes: &[String],
    per_node: usize,
    phases: &BTreeMap<(String, MaintenancePhase), jiff::Timestamp>,
    readiness: &workload::Readiness,
) -> anyhow::Result<Ideal> {
    let at = |name: &String, phase| {
        phases
            .get(&(name.clone(), phase))
            .copied()
            .with_context(|| format!("{name} never seen {phase:?}"))
    };
    let secs = |d: jiff::SignedDuration| d.as_secs_f64();
    let mut ideal = Ideal::default();
    let mut spans = Vec::new();
    for (name, node) in names.iter().zip(nodes) {
        let (admitted, verifying, succeeded) = (
            at(name, MaintenancePhase::Admitted)?,
            at(name, MaintenancePhase::Verifying)?,
            at(name, MaintenancePhase::Succeeded)?,
        );
        // Its evicted pods Ready again: the first time since it was back that its node had
        // all of them Ready (they come back to it: pinned, or the other nodes are full).
        let back = readiness
            .back_on(node, per_node, verifying)
            .with_context(|| format!("{node}: its pods never seen Ready again"))?;
        ideal.returns += secs(back.duration_since(verifying));
        let done = back.max(verifying.checked_add(HEALTH_GATE_FOR)?);
        spans.push((admitted, done, succeeded));
    }
    spans.sort_by_key(|(admitted, _, _)| *admitted);
    for (i, (admitted, done, succeeded)) in spans.iter().enumerate() {
        ideal.total += secs(done.duration_since(*admitted));
        ideal
            .succeeded_after
            .push(secs(succeeded.duration_since(*done)));
        if let Some((next, _, _)) = spans.get(i + 1) {
            ideal.gaps.push(secs(next.duration_since(*succeeded)));
        }
    }
    Ok(ideal)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pods = match args.workload {
        Workload::Spread => "one replica of a Deployment each, grace 1 s,".to_owned(),
        Workload::Pinned => format!(
            "a ReplicaSet of {} pods pinned to each, grace {},",
            args.pods,
            humantime::format_duration(args.grace)
        ),
    };
    println!(
        "{} machines down {} when they reboot, {pods} Ready {} after they run, maxConcurrent 1, PDB: {}",
        args.nodes,
        humantime::format_duration(args.reboot),
        args.ready_after,
        if args.pdb {
            "minAvailable nodes - 1"
        } else {
            "none"
        }
    );
    for (mode, gate) in [
        ("gate on", json!({})),
        (
            "gate off",
            json!({"checkDisruptionBudgets": false, "waitForEvicted": false}),
        ),
    ] {
        let mut rollouts = Vec::new();
        for run in 0..args.runs {
            let r = rollout(&args, &gate).await?;
            println!(
                "{mode} run {}: {:.1} s, fewest Ready {} of {}, ideal {:.1} s; the bare floor (reboots and grace, {:.1} s, and the pods' return once their node was back, {:.1} s) {:.1} s",
                run + 1,
                r.wall.as_secs_f64(),
                r.fewest,
                total_pods(&args),
                r.ideal.total,
                floor(&args),
                r.ideal.returns,
                floor(&args) + r.ideal.returns,
            );
            rollouts.push(r);
        }
        let mut walls: Vec<f64> = rollouts.iter().map(|r| r.wall.as_secs_f64()).collect();
        walls.sort_by(f64::total_cmp);
        let fewest = rollouts.iter().map(|r| r.fewest).min().unwrap_or(0);
        let mut ratios: Vec<f64> = rollouts
            .iter()
            .map(|r| r.wall.as_secs_f64() / r.ideal.total)
            .collect();
        let mut floors: Vec<f64> = rollouts
            .iter()
            .map(|r| r.wall.as_secs_f64() / (floor(&args) + r.ideal.returns))
            .collect();
        let mut ideals: Vec<f64> = rollouts.iter().map(|r| r.ideal.total).collect();
        let mut after: Vec<f64> = rollouts
            .iter()
            .flat_map(|r| r.ideal.succeeded_after.clone())
            .collect();
        let mut gaps: Vec<f64> = rollouts.iter().flat_map(|r| r.ideal.gaps.clone()).collect();
        println!(
            "{mode}: median {:.1} s (range {:.1}-{:.1} s), fewest Ready in any run {fewest} of {}; ideal median {:.1} s, wall/ideal median {:.2}, wall/bare floor median {:.2}; per node, Succeeded after its own work and its pods' return: median {:.2} s (max {:.2} s), then the next Admitted: median {:.2} s (max {:.2} s)",
            walls[walls.len() / 2],
            walls[0],
            walls[walls.len() - 1],
            total_pods(&args),
            median(&mut ideals),
            median(&mut ratios),
            median(&mut floors),
            median(&mut after),
            after.last().copied().unwrap_or(f64::NAN),
            median(&mut gaps),
            gaps.last().copied().unwrap_or(f64::NAN),
        );
    }
    Ok(())
}

/// The pods over all machines.
fn total_pods(args: &Args) -> usize {
    match args.workload {
        Workload::Spread => args.nodes,
        Workload::Pinned => args.nodes * args.pods,
    }
}

/// Reboots and grace, one node after the other.
fn floor(args: &Args) -> f64 {
    let grace = match args.workload {
        Workload::Spread => Duration::from_secs(1),
        Workload::Pinned => args.grace,
    };
    (args.reboot + grace).as_secs_f64() * args.nodes as f64
}

/// What the rollout went through: the Ready pods over time, and each maintenance's phases and
/// conditions.
async fn print_timeline(
    env: &TestEnv,
    names: &[String],
    seen: &workload::Readiness,
) -> anyhow::Result<()> {
    println!("Ready replicas over the rollout: {:?}", seen.timeline);
    let api: kube::Api<nodeward_api::NodeMaintenance> = kube::Api::all(env.client.clone());
    for name in names {
        let m = api.get(name).await?;
        let s = m.status.unwrap_or_default();
        println!(
            "{name}: {:?} evicted {:?} conditions {:?}",
            s.history
                .iter()
                .map(|h| (h.phase, h.time.0.to_string()))
                .collect::<Vec<_>>(),
            s.evicted_workloads,
            s.conditions
                .iter()
                .map(|c| (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone()
                ))
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// The machines' workload ([`Workload`]), every pod Ready: a watch of them, and how many run
/// on each machine.
async fn start_workload(env: &TestEnv, args: &Args) -> anyhow::Result<(ReadyWatch, usize)> {
    let replicas = i32::try_from(args.nodes)?;
    let per_node = match args.workload {
        Workload::Spread => {
            workload::spread_deployment(env, "web", replicas, &args.ready_after).await?;
            1
        }
        Workload::Pinned => {
            let pods = i32::try_from(args.pods)?;
            workload::pinned_replica_sets(
                env,
                "web",
                args.nodes,
                pods,
                &args.ready_after,
                args.grace,
            )
            .await?;
            args.pods
        }
    };
    if args.pdb {
        let pods = i32::try_from(total_pods(args))?;
        env.pdb("web", &format!("web-{}", env.id), pods - 1).await?;
    }
    let watch = ReadyWatch::start(env, "web");
    nodeward_e2e::wait::eventually("every pod Ready", Duration::from_secs(120), || async {
        Ok((watch.readiness().ready.len() == total_pods(args)).then_some(()))
    })
    .await?;
    Ok((watch, per_node))
}

async fn rollout(args: &Args, gate: &serde_json::Value) -> anyhow::Result<Rollout> {
    let env = TestEnv::new("bench-wgate").await?;
    let specs: Vec<NodeSpec> = (0..args.nodes).map(|_| NodeSpec::worker("a")).collect();
    env.create_nodes(&specs).await?;
    env.create_policy(
        "wgate",
        json!({"maxConcurrent": 1, "healthGate": {"for": "1s"}, "workloadGate": gate}),
    )
    .await?;
    let (watch, per_node) = start_workload(&env, args).await?;
    watch.arm();
    let (phases, phase_watch) = watch_phases(&env);
    let coordinator = Daemon::start(
        &args.coordinator,
        &format!("{}-coordinator", env.id),
        &[
            "run".into(),
            "--lease-namespace".into(),
            env.namespace.clone(),
            "--kubeconfig".into(),
            nodeward_e2e::controlplane::shared()
                .kubeconfig
                .display()
                .to_string(),
        ],
    )?;
    let mut machines = Vec::new();
    for index in 0..args.nodes {
        let mut machine = Machine::start(&env, &args.agent, index, "", false).await?;
        machine.reboot_takes = args.reboot;
        machines.push(machine);
    }
    let started = Instant::now();
    let names = nodeward_e2e::machine::reboot_each(&env, args.nodes).await?;
    nodeward_e2e::machine::reboot_until_succeeded(
        &mut machines,
        &env.client,
        &names,
        Duration::from_secs(600),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", coordinator.output()))?;
    let wall = started.elapsed();
    let fewest = watch.readiness().fewest.unwrap_or(0);
    // With the gate off, the last node's pods may still be on their way back.
    nodeward_e2e::wait::eventually(
        "every pod Ready again",
        Duration::from_secs(120),
        || async { Ok((watch.readiness().ready.len() == total_pods(args)).then_some(())) },
    )
    .await?;
    let seen = watch.readiness();
    // The watch may see the last Succeeded after the rollout's own wait did.
    nodeward_e2e::wait::eventually("every Succeeded seen", Duration::from_secs(10), || async {
        let phases = phases.lock().unwrap_or_else(|p| p.into_inner());
        Ok(names
            .iter()
            .all(|n| phases.contains_key(&(n.clone(), MaintenancePhase::Succeeded)))
            .then_some(()))
    })
    .await?;
    phase_watch.abort();
    let phases = phases.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let nodes: Vec<String> = (0..args.nodes).map(|i| env.node_name(i)).collect();
    let ideal = ideal(&names, &nodes, per_node, &phases, &seen)?;
    if std::env::var_os("WORKLOAD_GATE_TIMELINE").is_some() {
        print_timeline(&env, &names, &seen).await?;
    }
    drop((machines, coordinator, watch));
    env.cleanup().await?;
    Ok(Rollout {
        wall,
        fewest,
        ideal,
    })
}
