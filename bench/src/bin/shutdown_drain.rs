//! Shutdown drain: the time from logind's `PowerOff` (it announces `PrepareForShutdown`) to
//! the moment logind goes on (`StartUnit("poweroff.target")`, right after the agent releases
//! its delay lock), for 50 (or `--pods-per-group` x 5) pods of 1 s grace in 5 priority groups
//! on a kwok node, against the sum of the stage waits the plan cannot avoid (each priority
//! group waits for its pods' 1 s grace: 5 s); and the agent's peak RSS. Real systemd-logind
//! on a private bus, real control plane, the shipped agent build.
//!
//!   cargo build --profile dist -p nodeward-agent
//!   cargo build --release -p nodeward-bench
//!   target/release/shutdown-drain --runs 5 --pods-per-group 20
//!
//! Uses the control plane in $NODEWARD_TEST_CONTROLPLANE if set, else starts one.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use nodeward_e2e::{PodOptions, TestEnv, logind::Logind, scratch, wait};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Pods in each of the 5 priority groups (10: 50 pods; 20: 100 pods).
    #[arg(long, default_value_t = 10)]
    pods_per_group: usize,
    /// The agent binary (the shipped build: `cargo build --profile dist -p nodeward-agent`).
    #[arg(long, default_value = "target/dist/nodeward-agent")]
    agent: String,
}

const GROUPS: usize = 5;

fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

async fn run_once(args: &Args) -> anyhow::Result<(Duration, f64)> {
    let (env, node) = TestEnv::with_worker("bench-shutdown", "a").await?;
    for group in 0..GROUPS {
        let options = PodOptions {
            priority: Some(i32::try_from(group)? * 100),
            grace_period_seconds: 1,
            ..PodOptions::default()
        };
        env.replicaset(
            &format!("p{group}"),
            &node,
            i32::try_from(args.pods_per_group)?,
            &options,
        )
        .await?;
    }
    for group in 0..GROUPS {
        env.running_pods(&format!("p{group}"), args.pods_per_group)
            .await?;
    }
    let logind = Logind::start(&env.id, 120).await?;
    let config = scratch::agent_config_file(
        &scratch::dir(&format!("nodeward-bench-{}", env.id))?,
        &[],
        "shutdownGuard: {budget: 100s, safetyMargin: 5s}\n",
    )?;
    let agent = nodeward_e2e::daemon::agent(
        &args.agent,
        &env,
        &node,
        &config,
        &logind.bus.address,
        "agent",
    )?;
    agent.wait_ready(Duration::from_secs(60)).await?;
    // The lock is taken once the guard's session is up.
    wait::eventually("the delay lock", Duration::from_secs(30), || async {
        let connection = logind.connect().await?;
        let reply = connection
            .call_method(
                Some("org.freedesktop.login1"),
                "/org/freedesktop/login1",
                Some("org.freedesktop.login1.Manager"),
                "ListInhibitors",
                &(),
            )
            .await?;
        let locks: Vec<(String, String, String, String, u32, u32)> = reply.body().deserialize()?;
        Ok(locks.iter().any(|l| l.1 == "nodeward").then_some(()))
    })
    .await?;
    let connection = logind.connect().await?;
    let asked = Instant::now();
    connection
        .call_method(
            Some("org.freedesktop.login1"),
            "/org/freedesktop/login1",
            Some("org.freedesktop.login1.Manager"),
            "PowerOff",
            &(false,),
        )
        .await?;
    let started = wait::eventually(
        "StartUnit(poweroff.target)",
        Duration::from_secs(120),
        || async {
            Ok(logind
                .systemd
                .started_at
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .first()
                .copied())
        },
    )
    .await
    .with_context(|| agent.output())?;
    let peak = peak_rss_mib(agent.child.id());
    drop(agent);
    drop(logind);
    env.cleanup().await?;
    Ok((started.duration_since(asked), peak))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut times = Vec::new();
    let mut peaks = Vec::new();
    for run in 0..args.runs {
        let (took, peak) = run_once(&args).await?;
        eprintln!("run {run}: PowerOff to lock release {took:.2?}, agent peak RSS {peak:.1} MiB");
        times.push(took);
        peaks.push(peak);
    }
    times.sort();
    peaks.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let ideal = Duration::from_secs(u64::try_from(GROUPS)?);
    println!("cores: {cores}");
    println!(
        "{} pods of 1 s grace in {GROUPS} priority groups; median of {} runs: {median:.2?} from PowerOff to the lock's release; stage waits {ideal:?}; overhead {:.2?} ({:.2}x)",
        GROUPS * args.pods_per_group,
        args.runs,
        median.saturating_sub(ideal),
        median.as_secs_f64() / ideal.as_secs_f64()
    );
    println!(
        "agent peak RSS: median {:.1} MiB, max {:.1} MiB",
        peaks[peaks.len() / 2],
        peaks.last().copied().unwrap_or_default()
    );
    Ok(())
}
