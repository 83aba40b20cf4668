//! The chaos soak (issue: nothing stuck): a rolling reboot of `--nodes` simulated machines
//! (kwok nodes, each with the real agent and its own real systemd-logind) at `--max-concurrent`,
//! two leader-electing coordinators, and faults injected at random for `--duration`: the leader
//! killed, agents killed and restarted, the API server and etcd restarted, machines that never
//! come back from their reboot, the leader cut off from the API server. Prints, per fault kind,
//! how many and the time to recovery, and fails if a promise broke (budget exceeded, a slot
//! held at the end, a node left cordoned, a maintenance unfinished or unexplained). See
//! `nodeward_e2e::chaos` for the details.
//!
//!   cargo build --release -p nodeward-agent -p nodeward-coordinator -p nodeward-bench
//!   target/release/chaos-soak --nodes 100 --max-concurrent 10 --duration 30m
//!
//! Uses the control plane in $NODEWARD_TEST_CONTROLPLANE if set, else starts one. Run as root
//! (each machine's logind runs in its own mount namespace).

use std::time::Duration;

use clap::Parser;
use nodeward_e2e::{TestEnv, chaos};

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    fleet: nodeward_bench::Fleet,
    /// How long faults are injected.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The mean time between faults.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    mean_fault_interval: Duration,
    /// At most this many machines never come back.
    #[arg(long, default_value_t = 5)]
    max_dead_nodes: usize,
    /// How long every maintenance may take to finish once the faults stopped.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    settle: Duration,
    /// The random seed (default: from the clock); the same seed replays the same faults.
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value = "target/release/nodeward-agent")]
    agent: String,
    #[arg(long, default_value = "target/release/nodeward-coordinator")]
    coordinator: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let seed = args
        .seed
        .unwrap_or_else(|| jiff::Timestamp::now().as_nanosecond().unsigned_abs() as u64);
    let settings = chaos::Settings {
        nodes: args.fleet.nodes,
        max_concurrent: args.fleet.max_concurrent,
        duration: args.duration,
        mean_fault_interval: args.mean_fault_interval,
        max_dead_nodes: args.max_dead_nodes,
        settle: args.settle,
        seed,
        agent: args.agent,
        coordinator: args.coordinator,
    };
    println!(
        "cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let env = TestEnv::new("bench-soak").await?;
    let report = chaos::run(&env, &settings).await?;
    println!("{}", report.summary());
    let violations = report.violations();
    anyhow::ensure!(violations.is_empty(), "violations: {violations:#?}");
    env.cleanup().await
}
