//! A reboot nobody coordinated, typed in the guest (`systemctl reboot`), with the chart's
//! default values on a stock node: the agent drains within a budget that really exists, in
//! plan order, a PDB-blocked pod holds its group until the stage deadline, and the VM really
//! reboots and comes back uncordoned and untainted; a shutdown taint then left with no record
//! is taken away. And logind restarted in the middle of such a drain: the lock stays, and the
//! node the reboot never came for is restored.

use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use nodeward_api::{
    NodeReport,
    labels::{CORDONED_BY_ANNOTATION, SHUTDOWN_CORDON_BY, SHUTDOWN_TAINT as SHUTDOWN},
    report::ShutdownPhase,
};
use nodeward_e2e::nodelab::Vm;
use serde_json::json;

use crate::{
    recorders, stories,
    support::{self, Lab, Pick, REBOOT},
};

/// One pod of `group`, of priority class `class`, on `node`, recording its SIGTERM.
fn one_recorder(namespace: &str, group: &str, node: &str, class: &str) -> serde_json::Value {
    recorders::term_recorder(namespace, group, node, 1, Some(class))
}

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

/// The priority classes of the pods the tests drain, lowest first.
const CLASSES: [(&str, i32); 2] = [("lab-low", 100), ("lab-high", 10000)];

async fn priority_classes(lab: &Lab) -> anyhow::Result<()> {
    for (name, value) in CLASSES {
        lab.apply(
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value}),
        )
        .await?;
    }
    Ok(())
}

/// Types `systemctl reboot` in `vm` and waits until it is back with a new boot id, Ready, and
/// uncordoned and untainted by the agent. Returns when it was typed and how long the VM took
/// to come back with a new boot id.
async fn reboot_typed(lab: &Lab, vm: &Vm) -> anyhow::Result<(Instant, Duration)> {
    let boot = vm.boot_id().await?;
    let typed = Instant::now();
    // The guest agent may not answer once the shutdown is under way.
    let _ = vm
        .exec_with("systemctl reboot", Duration::from_secs(20))
        .await;
    let new_boot = vm.wait_rebooted(&boot, REBOOT).await?;
    let back = typed.elapsed();
    anyhow::ensure!(new_boot != boot, "{}: the same boot id", vm.name);
    vm.wait_node_ready(&lab.client, REBOOT).await?;
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let restored = nodeward_e2e::wait::until(
        &nodes,
        &vm.name,
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
    anyhow::ensure!(restored.is_some(), "{} is gone", vm.name);
    Ok((typed, back))
}

#[tokio::test]
async fn a_reboot_typed_in_the_guest_drains_in_plan_order_and_the_node_really_reboots()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::beside(Pick::At(0)).await?;
    priority_classes(&lab).await?;
    let namespace = lab.namespace("lab-shutdown").await?;
    recorders::clear_term_log(&vm).await?;
    // One pod per group: under software emulation the kubelet takes tens of seconds to stop a
    // pod, and the default plan's workloads stage has 92 s here.
    for (group, class) in [("low", "lab-low"), ("high", "lab-high")] {
        lab.apply(one_recorder(&namespace, group, &node, class))
            .await?;
    }
    // In the high group too, and never evictable: its PodDisruptionBudget allows nothing.
    lab.apply(one_recorder(&namespace, "blocked", &node, "lab-high"))
        .await?;
    lab.apply(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "blocked", "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "blocked"}}}}),
    )
    .await?;
    lab.apply(recorders::term_recorder_daemonset(
        &namespace, "daemon", &node,
    ))
    .await?;
    for app in ["low", "high", "blocked", "daemon"] {
        lab.running(&namespace, &format!("app={app}"), 1).await?;
    }

    // The drain rests on the agent's delay lock: taken before the reboot is typed, or the
    // test says why not.
    support::wait_delay_lock(&lab.client, &vm).await?;
    let departures = recorders::watch_departures(&lab.client, &namespace);
    let (_, back) = reboot_typed(&lab, &vm).await?;

    // The drain, as the API server saw it: low, then high once low had stopped; the blocked
    // pod held the high group until the stage's deadline and was never evicted (the default
    // plan goes on at a deadline); then the DaemonSet stage. The default plan leaves each later
    // stage with pods its share (a fifth of the budget) of the 115 s a 120 s delay gives (5 s
    // margin): the workloads stage ends 92 s after the start here (69 s on a node with a
    // coordinator pod, the critical stage; the lab keeps them off this one).
    let seen = departures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let asked = |group: &str| -> Vec<Instant> {
        seen.values()
            .filter(|d| d.group == group)
            .filter_map(|d| d.asked)
            .collect()
    };
    let timeline = {
        let first = seen.values().filter_map(|d| d.asked).min();
        let since = |t: Option<Instant>| match (t, first) {
            (Some(t), Some(f)) => format!("{:.1} s", t.duration_since(f).as_secs_f64()),
            _ => "never".to_owned(),
        };
        let mut lines: Vec<String> = seen
            .iter()
            .map(|(pod, d)| {
                format!(
                    "{pod} asked {} stopped {}",
                    since(d.asked),
                    since(d.stopped)
                )
            })
            .collect();
        lines.sort();
        lines.join("; ")
    };
    // A group never asked to go: what the agent and the coordinator said, for the failure.
    let story = if ["low", "high", "daemon"]
        .iter()
        .all(|group| !asked(group).is_empty())
    {
        String::new()
    } else {
        stories::drain_story(&lab.client, &vm).await
    };
    // The evicted pod, not its replacement (Pending: the node is cordoned). The drain waits
    // for it to stop, or (a kubelet slow to report) until 10 s past its grace period.
    let low = seen
        .values()
        .find(|d| d.group == "low" && d.asked.is_some())
        .with_context(|| format!("the low pod was never asked to go: {timeline}\n{story}"))?;
    let low_done = [low.stopped, low.let_go]
        .into_iter()
        .flatten()
        .min()
        .with_context(|| format!("the evicted low pod never stopped: {timeline}\n{story}"))?;
    let high_asked = asked("high")
        .into_iter()
        .min()
        .with_context(|| format!("the high pod was never asked to go: {timeline}\n{story}"))?;
    // (1 s for the conversion of the API server's second-precision time to this clock.)
    assert!(
        high_asked + Duration::from_secs(1) >= low_done,
        "high asked to go before low had stopped or was let go: {timeline}"
    );
    let start = asked("low")
        .into_iter()
        .min()
        .context("the drain's start")?;
    let daemon = asked("daemon")
        .into_iter()
        .min()
        .with_context(|| format!("the DaemonSet pod was never asked to go: {timeline}\n{story}"))?;
    assert!(
        asked("blocked").iter().all(|t| *t > daemon),
        "the PDB-blocked pod was deleted by the drain: {timeline}"
    );
    let held = daemon.duration_since(start).as_secs_f64();
    assert!(
        (80.0..110.0).contains(&held),
        "the blocked pod held the drain {held:.1} s (expected its stage's deadline, 92 s): {timeline}"
    );

    // The pods really got SIGTERM from the kubelet before the machine went down, in that order.
    let groups = ["low", "high", "daemon"];
    let log: Vec<_> = recorders::term_log(&vm)
        .await?
        .into_iter()
        .filter(|(_, _, group)| groups.contains(&group.as_str()))
        .collect();
    let (_, high_started) = after(&log, "low", "high")?;
    after(&log, "low", "daemon")?;
    let first = log.iter().map(|(t, _, _)| *t).fold(f64::MAX, f64::min);
    println!(
        "{node}: SIGTERM low->high {:.1} s; API: {timeline}; DaemonSet stage after {held:.1} s; back with a new boot id after {:.0} s",
        high_started - first,
        back.as_secs_f64()
    );

    // The drain stayed within the delay logind really grants (the agent raised it to 120 s).
    let events = stories::node_events(&lab.client, &node).await?;
    let time_of = |reason: &str| {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(stories::last_seen)
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
    lab.delete_namespace(&namespace).await?;
    a_taint_with_no_record_is_taken_away(&lab, &node, &vm).await
}

/// Back from the reboot, the node's NodeReport holds no shutdown record. The guard's taint and
/// cordon put back by hand then have none (as when a NodeReport is deleted while its node goes
/// down): once the guard reaches logind again (logind restarted here) and logind prepares no
/// shutdown, the chart's agent takes them away, with the identity and admission policy the
/// chart gives it, and says so in a `NodeRestored` Event.
async fn a_taint_with_no_record_is_taken_away(
    lab: &Lab,
    node: &str,
    vm: &Vm,
) -> anyhow::Result<()> {
    let reports: Api<NodeReport> = Api::all(lab.client.clone());
    nodeward_e2e::wait::until(&reports, node, "no shutdown record", REBOOT, |r| {
        r.and_then(|r| r.status.as_ref())
            .is_some_and(|s| s.shutdown.is_none())
    })
    .await?;
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let mut taints = nodes
        .get(node)
        .await?
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default();
    taints.push(serde_json::from_value(
        json!({"key": SHUTDOWN, "effect": "NoSchedule"}),
    )?);
    let left = json!({
        "metadata": {"annotations": {CORDONED_BY_ANNOTATION: SHUTDOWN_CORDON_BY}},
        "spec": {"unschedulable": true, "taints": taints},
    });
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(left))
        .await
        .with_context(|| format!("leaving the shutdown taint on {node} as an admin"))?;
    let occurrences = || async {
        let events = stories::node_events(&lab.client, node).await?;
        anyhow::Ok(
            events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("NodeRestored"))
                .filter(|e| e.note.as_deref().is_some_and(|n| n.contains("no record")))
                .map(|e| e.series.as_ref().map_or(1, |s| s.count))
                .sum::<i32>(),
        )
    };
    let before = occurrences().await?;

    let restarted = Instant::now();
    vm.run("systemctl restart systemd-logind").await?;
    nodeward_e2e::wait::until(&nodes, node, "uncordoned and untainted", REBOOT, |n| {
        n.and_then(|n| n.spec.as_ref()).is_some_and(|s| {
            s.unschedulable != Some(true) && !s.taints.iter().flatten().any(|t| t.key == SHUTDOWN)
        })
    })
    .await
    .with_context(|| format!("{node}'s agent left the taint with no record"))?;
    nodeward_e2e::wait::eventually("a NodeRestored Event saying why", REBOOT, || async {
        Ok((occurrences().await? > before).then_some(()))
    })
    .await?;
    let annotations = nodes
        .get(node)
        .await?
        .metadata
        .annotations
        .unwrap_or_default();
    assert!(
        !annotations.contains_key(CORDONED_BY_ANNOTATION),
        "the cordon's record stayed: {annotations:?}"
    );
    println!(
        "{node}: a taint with no record taken away {:.0} s after logind's restart",
        restarted.elapsed().as_secs_f64()
    );
    support::wait_delay_lock(&lab.client, vm).await?;
    Ok(())
}

/// The same reboot with the kubelet's own graceful node shutdown on (30 s): both hold a delay
/// lock and both act on logind's announcement; logind's delay stays nodeward's (its drop-in
/// sorts after the kubelet's `99-kubelet.conf`), nodeward drains through the API, and the test
/// prints which of the two reached the pod first (its `DisruptionTarget` condition).
#[tokio::test]
#[ignore = "out of ./tests/run for its time: the node-lab tests ran past CI's limit (BENCHMARKS.md, \"A cold ./tests/run\"); run with --ignored shutdown::with_the_kubelets"]
async fn with_the_kubelets_graceful_node_shutdown_both_act_and_nodewards_delay_stands()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::beside(Pick::At(1)).await?;
    vm.run(support::KUBELET_SHUTDOWN_ON).await?;
    vm.wait_node_ready(&lab.client, REBOOT).await?;
    nodeward_e2e::wait::eventually("the kubelet's delay lock", REBOOT, || async {
        Ok(support::has_shutdown_delay(&support::locks_of(&vm, "kubelet").await?).then_some(()))
    })
    .await?;
    support::wait_delay_lock(&lab.client, &vm).await?;
    let delay = vm
        .run("busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec")
        .await?;
    assert_eq!(
        delay.trim(),
        "t 120000000",
        "logind's delay with both drop-ins"
    );

    priority_classes(&lab).await?;
    let namespace = lab.namespace("lab-kubelet-shutdown").await?;
    lab.apply(one_recorder(&namespace, "low", &node, "lab-low"))
        .await?;
    lab.running(&namespace, "app=low", 1).await?;
    let departures = recorders::watch_departures(&lab.client, &namespace);
    // (1 s back for the guest's clock, set from this host's at boot.)
    let since = jiff::Timestamp::now().checked_sub(jiff::SignedDuration::from_secs(1))?;
    let (typed, _) = reboot_typed(&lab, &vm).await?;

    // nodeward drained (its Events), whatever the kubelet did meanwhile.
    let drained = stories::node_events(&lab.client, &node)
        .await?
        .iter()
        .any(|e| {
            e.reason.as_deref() == Some("ShutdownDrainStarted")
                && stories::last_seen(e).is_some_and(|t| t >= since)
        });
    let seen = departures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let story = stories::drain_story(&lab.client, &vm).await;
    anyhow::ensure!(
        drained,
        "no ShutdownDrainStarted since the reboot: {seen:?}\n{story}"
    );
    let low = seen
        .iter()
        .find(|(_, d)| d.group == "low" && d.disrupted_by.is_some())
        .with_context(|| {
            format!("neither the kubelet nor nodeward reached the low pod: {seen:?}\n{story}")
        })?;
    println!(
        "{node}, kubelet's graceful shutdown on: logind's delay {}; the low pod {} was reached first by {}{}; back after {:.0} s",
        delay.trim(),
        low.0,
        low.1.disrupted_by.as_deref().unwrap_or_default(),
        if low.1.asked.is_some() {
            " and asked to go through the API"
        } else {
            ""
        },
        typed.elapsed().as_secs_f64()
    );
    vm.run(support::KUBELET_SHUTDOWN_OFF).await?;
    vm.wait_node_ready(&lab.client, REBOOT).await?;
    lab.delete_namespace(&namespace).await
}

/// logind restarted on a node while the agent's drain holds a shutdown: the agent's delay lock
/// is held again at once, the restarted logind has no shutdown to go on with (it keeps no
/// delayed shutdown across a restart, and says no `PrepareForShutdown(false)` for it), and the
/// agent, its drain over and logind preparing nothing, undoes its cordon and taint: the VM did
/// not reboot and is back in service.
#[tokio::test]
async fn logind_restarted_during_a_held_shutdown_keeps_the_lock_and_the_node_is_restored()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::beside(Pick::At(0)).await?;
    let namespace = lab.namespace("lab-logind-restart").await?;
    // Held: the pod's PodDisruptionBudget refuses its eviction until the stage's deadline.
    lab.apply(recorders::term_recorder(&namespace, "held", &node, 1, None))
        .await?;
    lab.apply(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "held", "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}}}),
    )
    .await?;
    lab.running(&namespace, "app=held", 1).await?;
    support::wait_delay_lock(&lab.client, &vm).await?;
    let boot = vm.boot_id().await?;
    // Returns at once: logind waits for the delay lock.
    vm.run("systemctl reboot").await?;
    let reports: Api<NodeReport> = Api::all(lab.client.clone());
    let shutdown_phase =
        |r: Option<&NodeReport>| r.and_then(|r| r.status.as_ref()?.shutdown.clone());
    nodeward_e2e::wait::until(&reports, &node, "the drain held by the PDB", REBOOT, |r| {
        shutdown_phase(r).is_some_and(|s| {
            s.phase == ShutdownPhase::Draining && s.boot_id == boot && !s.blocking_pods.is_empty()
        })
    })
    .await?;

    let restarted = Instant::now();
    vm.run("systemctl restart systemd-logind").await?;
    let locks = support::wait_delay_lock(&lab.client, &vm).await?;
    println!(
        "{node}: nodeward's locks {:.1} s after logind's restart was asked: {locks:?}",
        restarted.elapsed().as_secs_f64()
    );
    let preparing = vm
        .run("busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager PreparingForShutdown")
        .await?;
    assert_eq!(
        preparing.trim(),
        "b false",
        "the restarted logind's shutdown"
    );

    // The drain ends at its stage's deadline; then the agent finds nothing going down.
    nodeward_e2e::wait::until(&reports, &node, "the shutdown undone", REBOOT, |r| {
        shutdown_phase(r).is_some_and(|s| s.phase == ShutdownPhase::Cancelled)
    })
    .await
    .with_context(|| format!("{node}'s agent did not undo the forgotten shutdown"))?;
    let nodes: Api<Node> = Api::all(lab.client.clone());
    nodeward_e2e::wait::until(&nodes, &node, "uncordoned and untainted", REBOOT, |n| {
        n.and_then(|n| n.spec.as_ref()).is_some_and(|s| {
            s.unschedulable != Some(true) && !s.taints.iter().flatten().any(|t| t.key == SHUTDOWN)
        })
    })
    .await?;
    support::wait_delay_lock(&lab.client, &vm).await?;
    assert_eq!(vm.boot_id().await?, boot, "{} rebooted", vm.name);
    let cancelled = stories::node_events(&lab.client, &node)
        .await?
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ShutdownCancelled"))
        .filter_map(|e| e.note)
        .any(|note| note.contains("logind was restarted during the shutdown"));
    assert!(cancelled, "no ShutdownCancelled Event saying why");
    println!(
        "{node}: restored {:.0} s after logind's restart",
        restarted.elapsed().as_secs_f64()
    );
    lab.delete_namespace(&namespace).await
}
