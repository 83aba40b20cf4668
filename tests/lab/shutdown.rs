//! A reboot nobody coordinated, typed in the guest (`systemctl reboot`), with the chart's
//! default values on a stock node: the agent drains within a budget that really exists, in
//! plan order, a PDB-blocked pod holds its group until the stage deadline, and the VM really
//! reboots and comes back uncordoned and untainted.

use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{Api, api::ListParams};
use nodeward_api::labels::SHUTDOWN_TAINT as SHUTDOWN;
use serde_json::json;

use crate::support::{self, Lab, REBOOT};

/// The gap between the last of one group's SIGTERMs and the first of the next: each group is
/// evicted once the one before is gone.
fn after(log: &[(f64, String, String)], earlier: &str, later: &str) -> anyhow::Result<(f64, f64)> {
    let times = |group: &str| -> Vec<f64> {
        log.iter()
            .filter(|(_, _, g)| g == group)
            .map(|(t, _, _)| *t)
            .collect()
    };
    let (before, next) = (times(earlier), times(later));
    anyhow::ensure!(
        !before.is_empty() && !next.is_empty(),
        "no SIGTERM of {earlier} or {later} in {log:?}"
    );
    let last = before.iter().copied().fold(f64::MIN, f64::max);
    let first = next.iter().copied().fold(f64::MAX, f64::min);
    anyhow::ensure!(
        last <= first,
        "{later} got SIGTERM ({first}) before {earlier} was done ({last}): {log:?}"
    );
    Ok((last, first))
}

#[tokio::test]
async fn a_reboot_typed_in_the_guest_drains_in_plan_order_and_the_node_really_reboots()
-> anyhow::Result<()> {
    let lab = Lab::get().await?;
    let node = lab.lab.nodes[0].clone();
    let vm = lab.vm(&node);
    for (name, value) in [("lab-low", 100), ("lab-mid", 1000), ("lab-high", 10000)] {
        lab.apply(
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value}),
        )
        .await?;
    }
    let namespace = lab.namespace("lab-shutdown").await?;
    support::clear_term_log(&vm).await?;
    for (group, class) in [("low", "lab-low"), ("mid", "lab-mid"), ("high", "lab-high")] {
        lab.apply(support::term_recorder(
            &namespace,
            group,
            &node,
            2,
            Some(class),
        ))
        .await?;
    }
    // In the highest group too, and never evictable: its PodDisruptionBudget allows nothing.
    lab.apply(support::term_recorder(
        &namespace,
        "blocked",
        &node,
        1,
        Some("lab-high"),
    ))
    .await?;
    lab.apply(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "blocked", "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "blocked"}}}}),
    )
    .await?;
    lab.apply(support::term_recorder_daemonset(
        &namespace, "daemon", &node,
    ))
    .await?;
    for (app, count) in [
        ("low", 2),
        ("mid", 2),
        ("high", 2),
        ("blocked", 1),
        ("daemon", 1),
    ] {
        lab.running(&namespace, &format!("app={app}"), count)
            .await?;
    }

    let boot = vm.boot_id().await?;
    let typed = Instant::now();
    // The guest agent may not answer once the shutdown is under way.
    let _ = vm
        .exec_with("systemctl reboot", Duration::from_secs(20))
        .await;
    let new_boot = vm.wait_rebooted(&boot, REBOOT).await?;
    let back = typed.elapsed();
    assert_ne!(new_boot, boot);
    vm.wait_node_ready(&lab.client, REBOOT).await?;

    // Back: uncordoned and untainted by the agent.
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let restored = nodeward_e2e::wait::until(
        &nodes,
        &node,
        "the node uncordoned and untainted",
        REBOOT,
        |n| {
            n.and_then(|n| n.spec.as_ref()).is_some_and(|s| {
                s.unschedulable != Some(true)
                    && !s.taints.iter().flatten().any(|t| t.key == SHUTDOWN)
            })
        },
    )
    .await?;
    assert!(restored.is_some());

    // The drain, as the pods saw it: low, then mid, then high (the blocked pod held that group
    // until the stage's deadline), then the DaemonSet stage.
    let groups = ["low", "mid", "high", "blocked", "daemon"];
    let log: Vec<_> = support::term_log(&vm)
        .await?
        .into_iter()
        .filter(|(_, _, group)| groups.contains(&group.as_str()))
        .collect();
    let (_, mid_started) = after(&log, "low", "mid")?;
    let (_, high_started) = after(&log, "mid", "high")?;
    let (_, daemon_evicted) = after(&log, "high", "daemon")?;
    let first = log.iter().map(|(t, _, _)| *t).fold(f64::MAX, f64::min);
    // The default plan leaves the later stages their share (a fifth of the budget each) of the
    // 115 s a 120 s delay gives (5 s margin): the workloads stage ends 67 s after the start.
    let held = daemon_evicted - first;
    assert!(
        (55.0..100.0).contains(&held),
        "the blocked pod held the drain {held:.1} s (expected its stage's deadline, ~67 s): {log:?}"
    );
    if let Some((blocked_term, _, _)) = log.iter().find(|(_, _, g)| g == "blocked") {
        assert!(
            *blocked_term >= daemon_evicted,
            "the blocked pod was never evicted before the deadline: {log:?}"
        );
    }
    println!(
        "{node}: low->mid {:.1} s, mid->high {:.1} s, drain to the DaemonSet stage {held:.1} s, back with a new boot id after {:.0} s",
        mid_started - first,
        high_started - first,
        back.as_secs_f64()
    );

    // The drain stayed within the delay logind really grants (the agent raised it to 120 s).
    let events: Api<Event> = Api::all(lab.client.clone());
    let list = events
        .list(&ListParams::default().fields(&format!("regarding.name={node}")))
        .await?;
    let time_of = |reason: &str| {
        list.items
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .max()
    };
    let started = time_of("ShutdownDrainStarted").context("no ShutdownDrainStarted Event")?;
    let finished = time_of("ShutdownDrainFinished").context("no ShutdownDrainFinished Event")?;
    let drained = finished.duration_since(started).as_secs_f64();
    assert!(
        drained <= 120.0,
        "the drain took {drained} s, past logind's 120 s"
    );
    println!("{node}: lock held {drained:.0} s of logind's 120 s");
    lab.delete_namespace(&namespace).await
}
