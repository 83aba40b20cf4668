//! The cost of safety: a rolling reboot of `--nodes` simulated machines (real agents, real
//! logind, the real coordinator) under a Deployment of one replica per node whose pods take
//! `--ready-after` to become Ready, at `maxConcurrent: 1`, with the workload gate on (the
//! default) and off (`checkDisruptionBudgets` and `waitForEvicted` false). Per mode: the wall
//! time from the maintenances' creation to the last Succeeded (median of `--runs`), and the
//! fewest Ready replicas seen during the rollout. With `--pdb` a PodDisruptionBudget of
//! `minAvailable: nodes - 1` covers the Deployment.
//!
//!   cargo build --release -p nodeward-agent -p nodeward-coordinator -p nodeward-bench
//!   target/release/workload-gate --nodes 3 --ready-after 5s --runs 3
//!
//! Uses the control plane in $NODEWARD_TEST_CONTROLPLANE if set, else starts one.

use std::time::{Duration, Instant};

use clap::Parser;
use nodeward_e2e::{
    NodeSpec, TestEnv,
    daemon::Daemon,
    machine::Machine,
    workload::{self, ReadyWatch},
};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Simulated machines (and replicas, one per machine).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// How long a replica takes to become Ready once running.
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

/// One rollout: its wall time and the fewest Ready replicas.
struct Rollout {
    wall: Duration,
    fewest: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!(
        "{} machines, one replica each Ready {} after it runs, maxConcurrent 1, PDB: {}",
        args.nodes,
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
                "{mode} run {}: {:.1} s, fewest Ready {} of {}",
                run + 1,
                r.wall.as_secs_f64(),
                r.fewest,
                args.nodes
            );
            rollouts.push(r);
        }
        let mut walls: Vec<f64> = rollouts.iter().map(|r| r.wall.as_secs_f64()).collect();
        walls.sort_by(f64::total_cmp);
        let fewest = rollouts.iter().map(|r| r.fewest).min().unwrap_or(0);
        println!(
            "{mode}: median {:.1} s (range {:.1}-{:.1} s), fewest Ready in any run {fewest} of {}",
            walls[walls.len() / 2],
            walls[0],
            walls[walls.len() - 1],
            args.nodes
        );
    }
    Ok(())
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
    let replicas = i32::try_from(args.nodes)?;
    workload::spread_deployment(&env, "web", replicas, &args.ready_after).await?;
    if args.pdb {
        env.pdb("web", &format!("web-{}", env.id), replicas - 1)
            .await?;
    }
    let watch = ReadyWatch::start(&env, "web");
    nodeward_e2e::wait::eventually("every replica Ready", Duration::from_secs(120), || async {
        Ok((watch.readiness().ready.len() == args.nodes).then_some(()))
    })
    .await?;
    watch.arm();
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
        machines.push(Machine::start(&env, &args.agent, index, "", false).await?);
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
    let seen = watch.readiness();
    let fewest = seen.fewest.unwrap_or(0);
    if std::env::var_os("WORKLOAD_GATE_TIMELINE").is_some() {
        println!("Ready replicas over the rollout: {:?}", seen.timeline);
        let api: kube::Api<nodeward_api::NodeMaintenance> = kube::Api::all(env.client.clone());
        for name in &names {
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
    }
    drop((machines, coordinator, watch));
    env.cleanup().await?;
    Ok(Rollout { wall, fewest })
}
