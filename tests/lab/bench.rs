//! The shutdown drain on a real node, as a figure for BENCHMARKS.md ("Shutdown drain on a VM
//! node"): 30 pods in 3 priority groups, `systemctl reboot` typed in the guest, and the time
//! until the agent released logind's lock against the groups' waits that no drain can shorten
//! (until the kubelet stopped each pod, or the drain let it go 10 s past its grace period). The
//! rest, the overhead, is split into the time to the first eviction, the gaps between groups
//! and the time after the last. Not in `./tests/run`: one run takes about ten minutes under
//! software emulation.
//!
//!   NODEWARD_TEST_NODELAB=DIR cargo test -p nodeward-e2e --test nodelab -- --ignored bench:: --show-output

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

use nodeward_e2e::nodelab::Vm;

use crate::{
    recorders::{self, Departure},
    stories,
    support::{self, Lab, REBOOT},
};

const GROUPS: [(&str, i32); 3] = [
    ("bench-low", 100),
    ("bench-mid", 1000),
    ("bench-high", 10000),
];
const PODS_PER_GROUP: i32 = 10;

/// When the test first saw the agent's ShutdownDrainFinished Event about `node`, on the test's
/// clock: the agent sends it just before it closes the lock's descriptor (its Released record
/// comes after, and may not get out before the machine goes down). Events older than a minute
/// before the call are an earlier run's.
fn watch_drain_finished(client: &kube::Client, node: &str) -> Arc<Mutex<Option<Instant>>> {
    let seen: Arc<Mutex<Option<Instant>>> = Arc::default();
    let recorded = seen.clone();
    let since = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
    let events: Api<Event> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("regarding.name={node}"));
    tokio::spawn(
        watcher(events, config)
            .applied_objects()
            .for_each(move |event| {
                // Not an earlier run's: that was a reboot (minutes) ago, and by the guest's clock.
                let finished = event.ok().is_some_and(|e| {
                    let at = e.series.map(|s| s.last_observed_time).or(e.event_time);
                    e.reason.as_deref() == Some("ShutdownDrainFinished")
                        && at.is_some_and(|t| t.0 > since)
                });
                if finished {
                    recorded
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert_with(Instant::now);
                }
                futures::future::ready(())
            }),
    );
    seen
}

/// A group's wait that no drain can shorten, on the test's clock: from its first eviction
/// until each of its pods had stopped or was let go (10 s past its grace period, where the
/// drain stops waiting for a pod the kubelet is slow to report), at the latest the lock's
/// release. `None` when a pod was never asked to go.
fn group_wait(departures: &[&Departure], released: Instant) -> Option<(Instant, Instant)> {
    let first = departures.iter().map(|d| d.asked).min()??;
    let ends: Option<Vec<Instant>> = departures
        .iter()
        .map(|d| [d.stopped, d.let_go].into_iter().flatten().min())
        .collect();
    Some((first, ends?.into_iter().max()?.min(released)))
}

/// How long the kubelet took to stop a group's pods (first eviction to last stopped), or how
/// many it had stopped when the machine went down.
fn kubelet_time(departures: &[&Departure]) -> String {
    let first = departures.iter().filter_map(|d| d.asked).min();
    let stopped: Vec<Instant> = departures.iter().filter_map(|d| d.stopped).collect();
    match (first, stopped.iter().max()) {
        (Some(first), Some(last)) if stopped.len() == departures.len() => {
            format!("{:.1} s", last.duration_since(first).as_secs_f64())
        }
        _ => format!("{} of {} stopped", stopped.len(), departures.len()),
    }
}

/// When the agent logged logind's announcement of the shutdown, on the guest's clock (set to
/// this machine's before the test, within 50 ms): the first such line of the agent's logs
/// after `since`. What comes before it (the guest agent starting `systemctl`, systemctl asking
/// logind, logind announcing) is no part of nodeward.
async fn announced_at(vm: &Vm, since: jiff::Timestamp) -> anyhow::Result<jiff::Timestamp> {
    const ANNOUNCED: &str = "shutdown announced: draining the node";
    let logs = vm
        .exec(&format!(
            "grep -h '{ANNOUNCED}' /var/log/pods/{}_*-agent-*/agent/*.log",
            support::NAMESPACE
        ))
        .await?
        .stdout;
    // A CRI log line: time, stream, tag, then the agent's JSON line.
    logs.lines()
        .filter_map(|line| line.splitn(4, ' ').nth(3))
        .filter_map(|json| serde_json::from_str::<serde_json::Value>(json).ok())
        .filter_map(|entry| entry["timestamp"].as_str()?.parse::<jiff::Timestamp>().ok())
        .filter(|at| *at >= since)
        .min()
        .with_context(|| format!("no \"{ANNOUNCED}\" in the agent's logs after {since}:\n{logs}"))
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[tokio::test]
#[ignore = "a benchmark (BENCHMARKS.md, \"Shutdown drain\", \"On a VM node\"): about ten minutes under emulation; run with --ignored bench::"]
async fn a_shutdown_drain_of_30_pods_in_3_priority_groups_on_a_vm_node() -> anyhow::Result<()> {
    let lab = Lab::get().await?;
    // A node without a coordinator pod: the drain is the bench's pods alone.
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(lab.client.clone(), support::NAMESPACE);
    let coordinators: Vec<String> = pods
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/component=coordinator"))
        .await?
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    let node = lab
        .lab
        .nodes
        .iter()
        .find(|n| !coordinators.contains(n))
        .context("a node without a coordinator pod")?
        .clone();
    let vm = lab.vm(&node);
    for (class, value) in GROUPS {
        lab.apply(
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": class}, "value": value}),
        )
        .await?;
    }
    let namespace = lab.namespace("lab-bench").await?;
    // A group at a time: thirty sandboxes created at once overran the CRI's deadline on an
    // emulated VM.
    for (class, _) in GROUPS {
        lab.apply(recorders::term_recorder(
            &namespace,
            class,
            &node,
            PODS_PER_GROUP,
            Some(class),
        ))
        .await?;
        lab.running(&namespace, &format!("app={class}"), PODS_PER_GROUP as usize)
            .await?;
    }
    support::wait_delay_lock(&lab.client, &vm).await?;

    let departures = recorders::watch_departures(&lab.client, &namespace);
    let release = watch_drain_finished(&lab.client, &node);
    let boot = vm.boot_id().await?;
    let typed = Instant::now();
    let typed_at = jiff::Timestamp::now();
    // The guest agent may not answer once the shutdown is under way.
    let _ = vm
        .exec_with("systemctl reboot", Duration::from_secs(20))
        .await;
    let released = nodeward_e2e::wait::eventually(
        "the agent's ShutdownDrainFinished Event",
        REBOOT,
        || async { Ok(*release.lock().unwrap_or_else(|p| p.into_inner())) },
    )
    .await?;
    vm.wait_rebooted(&boot, REBOOT).await?;
    vm.wait_node_ready(&lab.client, REBOOT).await?;

    let seen = departures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let story = stories::drain_story(&lab.client, &vm).await;
    let announced = announced_at(&vm, typed_at).await?.duration_since(typed_at);
    let announced = Duration::try_from(announced).unwrap_or_default();
    let mut waits = Vec::new();
    let mut gaps = Vec::new();
    let mut kubelet = Vec::new();
    let mut previous_end: Option<Instant> = None;
    let mut drain_started = None;
    for (class, _) in GROUPS {
        // The evicted pods, not their replacements (Pending: the node is cordoned).
        let evicted: Vec<&Departure> = seen
            .values()
            .filter(|d| d.group == class && d.asked.is_some())
            .collect();
        anyhow::ensure!(
            evicted.len() == PODS_PER_GROUP as usize,
            "{class}: {} of {PODS_PER_GROUP} pods asked to go: {seen:?}\n{story}",
            evicted.len()
        );
        let (first, end) = group_wait(&evicted, released)
            .with_context(|| format!("{class}: a pod never asked to go: {seen:?}\n{story}"))?;
        drain_started.get_or_insert(first);
        if let Some(previous) = previous_end {
            // (1 s for the API server's second-precision deletion times.)
            anyhow::ensure!(
                first + Duration::from_secs(1) >= previous,
                "{class} asked to go before the group before it had gone: {seen:?}"
            );
            gaps.push(first.saturating_duration_since(previous));
        }
        previous_end = Some(end);
        waits.push(end.duration_since(first));
        kubelet.push(kubelet_time(&evicted));
    }
    let total = released.duration_since(typed);
    let stage_waits: Duration = waits.iter().sum();
    let start = drain_started.map_or(Duration::ZERO, |f| f.saturating_duration_since(typed));
    let end = previous_end.map_or(Duration::ZERO, |e| released.saturating_duration_since(e));
    let list = |ds: &[Duration]| ds.iter().map(|d| secs(*d)).collect::<Vec<_>>().join(", ");
    let overhead = total.saturating_sub(stage_waits);
    println!(
        "{node}: 30 pods in 3 priority groups: systemctl reboot to the lock released \
         (ShutdownDrainFinished seen) {}; the groups' waits {} ({} in all; the kubelet stopped \
         them in {}); overhead {} ({:.2}x): to the first eviction {} (of it {} to logind's \
         announcement, {} from it), between groups {}, after the last {}; overhead from the \
         announcement {}",
        secs(total),
        list(&waits),
        secs(stage_waits),
        kubelet.join(", "),
        secs(overhead),
        total.as_secs_f64() / stage_waits.as_secs_f64().max(f64::EPSILON),
        secs(start),
        secs(announced),
        secs(start.saturating_sub(announced)),
        list(&gaps),
        secs(end),
        secs(overhead.saturating_sub(announced)),
    );
    lab.delete_namespace(&namespace).await
}
