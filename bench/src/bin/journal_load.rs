//! The agent reading the kernel log from a busy journal: a real systemd-journald (private mount
//! namespace, reading this machine's /dev/kmsg) that other programs write `--rate` entries a
//! second to, and the agent following its files for the kernel's records. Measures the agent's
//! CPU (user + system time over `--seconds`) with the journal quiet and busy, and, in each, the
//! delay from a kernel line written to /dev/kmsg to its Event and to its condition on the Node
//! (`--trials` each, medians). Real control plane, the shipped agent build.
//!
//!   cargo build --profile dist -p nodeward-agent
//!   cargo build --release -p nodeward-bench
//!   target/release/journal-load --rate 1000 --seconds 60 --trials 5
//!
//! Uses the control plane in $NODEWARD_TEST_CONTROLPLANE if set, else starts one. Writes to
//! this machine's kernel log: not beside the tests.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodeward_e2e::{TestEnv, journald::Journald, scratch, wait};

#[derive(Parser)]
struct Args {
    /// Entries a second that other programs write to the journal while busy.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// How long the CPU is measured, quiet and busy each.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Kernel lines timed to their Event and condition, quiet and busy each.
    #[arg(long, default_value_t = 5)]
    trials: usize,
    /// The agent binary (the shipped build: `cargo build --profile dist -p nodeward-agent`).
    #[arg(long, default_value = "target/dist/nodeward-agent")]
    agent: String,
}

/// The agent's user + system CPU time so far.
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) in parentheses: utime is the 12th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("/proc/PID/stat")?
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100);
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// Writes `rate` entries a second as another program until `stop`; counts them in `sent`.
fn noise(journald: &Journald, rate: u64, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let socket_path = journald.sockets.join("socket");
    std::thread::spawn(move || {
        let Ok(socket) = std::os::unix::net::UnixDatagram::unbound() else {
            return;
        };
        let started = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            while sent.load(Ordering::Relaxed) < due {
                let n = sent.fetch_add(1, Ordering::Relaxed);
                let entry = format!(
                    "SYSLOG_IDENTIFIER=bench-noise\nPRIORITY=6\nMESSAGE=request {n} served in 12 ms for client 10.0.0.{} with status 200\n",
                    n % 250
                );
                let _ = socket.send_to(entry.as_bytes(), &socket_path);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Writes trial `n`'s kernel lines and waits for the Event and the condition: the delays.
async fn trial(env: &TestEnv, node: &str, tag: &str, n: usize) -> anyhow::Result<(f64, f64)> {
    let nodes: Api<Node> = env.nodes();
    let token = format!("{tag}t{n}x");
    let written = Instant::now();
    std::fs::write(
        "/dev/kmsg",
        format!("<3>Out of memory: Killed process {n} ({token})\n"),
    )?;
    std::fs::write(
        "/dev/kmsg",
        format!("<3>EXT4-fs ({token}): Remounting filesystem read-only\n"),
    )?;
    let (mut event, mut condition) = (None, None);
    while written.elapsed() < Duration::from_secs(60) {
        if event.is_none()
            && env
                .events_about(node, "")
                .await?
                .iter()
                .any(|e| e.note.as_deref().is_some_and(|n| n.contains(&token)))
        {
            event = Some(written.elapsed().as_secs_f64());
        }
        if condition.is_none()
            && wait::node_condition(Some(&nodes.get(node).await?), "BenchReadOnly")
                .is_some_and(|(status, _)| status == "True")
        {
            condition = Some(written.elapsed().as_secs_f64());
        }
        if let Some(both) = event.zip(condition) {
            return Ok(both);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!(
        "trial {n}: no Event or condition within 60 s (event {event:?}, condition {condition:?})"
    )
}

/// CPU over `seconds` and the delays of `trials` lines, while the journal is as it is.
async fn measure(
    args: &Args,
    env: &TestEnv,
    node: &str,
    tag: &str,
    pid: u32,
    first: usize,
) -> anyhow::Result<(f64, f64, f64)> {
    let before = cpu_time(pid)?;
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let cpu = (cpu_time(pid)? - before).as_secs_f64() / args.seconds as f64;
    let nodes: Api<Node> = env.nodes();
    let (mut events, mut conditions) = (Vec::new(), Vec::new());
    for n in first..first + args.trials {
        // Each trial starts from a cleared condition (clearAfter 3 s).
        wait::until(
            &nodes,
            node,
            "BenchReadOnly=False",
            Duration::from_secs(60),
            |n| wait::node_condition(n, "BenchReadOnly").is_some_and(|(s, _)| s == "False"),
        )
        .await?;
        let (event, condition) = trial(env, node, tag, n).await?;
        events.push(event);
        conditions.push(condition);
    }
    Ok((cpu, median(events), median(conditions)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (env, node) = TestEnv::with_worker("bench-journal", "a").await?;
    // Other programs write far past journald's default rate limit (10,000 per 30 s a unit).
    let journald = Journald::start_with(&env.id, "RateLimitIntervalSec=0").await?;
    let tag = env.id.replace('-', "");
    let dir = scratch::dir(&format!("bench-journal-{}", env.id))?;
    let kernel_log = format!(
        "kernelLog: {{source: journal, journalDirectories: ['{}'], interval: 2s, timeout: 1s, patterns: [\
         {{reason: OOMKilling, regex: 'Killed process \\d+ \\({tag}t\\d+x\\)'}}, \
         {{reason: BenchRemount, regex: '{tag}t\\d+x\\): Remounting filesystem read-only', condition: BenchReadOnly, clearAfter: 3s}}]}}",
        journald.dir.display()
    );
    let config = scratch::agent_config_file(
        &dir,
        &[&kernel_log],
        "reporting:\n  heartbeatInterval: 30s\nshutdownGuard: {enabled: false}\n",
    )?;
    let agent = nodeward_e2e::daemon::agent(
        &args.agent,
        &env,
        &node,
        &config,
        nodeward_e2e::daemon::NO_SYSTEM_BUS,
        "agent",
    )?;
    agent
        .wait_ready(Duration::from_secs(60))
        .await
        .with_context(|| agent.output())?;
    let pid = agent.child.id();

    let (quiet_cpu, quiet_event, quiet_condition) = measure(&args, &env, &node, &tag, pid, 0)
        .await
        .with_context(|| agent.output())?;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    noise(&journald, args.rate, stop.clone(), sent.clone());
    let started = Instant::now();
    let (busy_cpu, busy_event, busy_condition) = measure(&args, &env, &node, &tag, pid, 1000)
        .await
        .with_context(|| agent.output())?;
    stop.store(true, Ordering::Relaxed);
    let achieved = sent.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    println!(
        "journal quiet: agent CPU {:.2} millicores; kernel line to Event {quiet_event:.2} s, to condition {quiet_condition:.2} s (medians of {})",
        quiet_cpu * 1000.0,
        args.trials
    );
    println!(
        "journal busy ({achieved:.0} entries/s of another program): agent CPU {:.2} millicores; kernel line to Event {busy_event:.2} s, to condition {busy_condition:.2} s (medians of {}); CPU ratio busy/quiet {:.1}",
        busy_cpu * 1000.0,
        args.trials,
        busy_cpu / quiet_cpu.max(1e-9)
    );
    drop(agent);
    env.cleanup().await
}
