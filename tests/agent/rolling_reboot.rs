//! A coordinated rolling reboot end to end: six kwok nodes in two pools, each with its own
//! agent process and its own real systemd-logind (private bus, private mount namespace), the
//! real coordinator, and a policy with `maxConcurrent: 2`, `autoReboot` and a reboot blocker.
//! Every node reports RebootRequired (sentinel file), asks for its Reboot maintenance, is
//! admitted, drained, and reboots through logind's delay-inhibitor path. A node "reboots"
//! when its systemd stand-in records `StartUnit("reboot.target")`: the harness then stops
//! its agent, bus and logind, gives it a new boot id, clears the sentinel, and starts them
//! again; the agent sees the new boot, waits for the health gate and completes. The same
//! machines carry out a PowerOff (logind powers off once drained) and a DeleteNode (the
//! coordinator deletes the drained Node).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::Context;
use kube::{Api, ResourceExt, api::DeleteParams};
use nodeward_api::{MaintenancePhase, NodeMaintenance};
use nodeward_e2e::daemon::agent_binary;
use nodeward_e2e::{
    NodeSpec, PodOptions, Scenario, TestEnv, env::TEST_LABEL, history, machine::Machine, workload,
};
use serde_json::json;

const NODES: usize = 6;
const MAX_CONCURRENT: usize = 2;
/// The node whose blocking pod holds it back.
const BLOCKED: usize = 5;
const BLOCKER_LABEL: &str = "e2e-blocks-reboot";

/// A machine for node `index` whose agent sends its notifications to `hook`.
async fn machine(
    env: &TestEnv,
    index: usize,
    hook: &str,
    reboot_required: bool,
) -> anyhow::Result<Machine> {
    let notify = format!("notifications: {{url: {hook}}}\n");
    Machine::start(env, agent_binary(), index, &notify, reboot_required).await
}

fn denial(m: &NodeMaintenance) -> Option<(String, String)> {
    m.status.as_ref()?.conditions.iter().find_map(|c| {
        (c.type_ == "Admitted" && c.status == "False")
            .then(|| (c.reason.clone(), c.message.clone()))
    })
}

/// A notification receiver answering 200 at `/hook`, and that URL.
async fn hook_receiver() -> anyhow::Result<(nodeward_e2e::http::Endpoint, String)> {
    let receiver = nodeward_e2e::http::Endpoint::start().await?;
    receiver.reply("/hook", 200, "ok");
    let hook = format!("{}/hook", receiver.url);
    Ok((receiver, hook))
}

/// Waits until every machine's webhook notifications arrived, and checks their order.
async fn wait_for_notices(
    receiver: &nodeward_e2e::http::Endpoint,
    machines: &[Machine],
) -> anyhow::Result<()> {
    let per_node = || {
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in receiver.received() {
            if let Ok(body) = serde_json::from_str::<serde_json::Value>(&r.body) {
                seen.entry(body["node"].as_str().unwrap_or_default().to_owned())
                    .or_default()
                    .push(body["event"].as_str().unwrap_or_default().to_owned());
            }
        }
        seen
    };
    let all_done = |seen: &BTreeMap<String, Vec<String>>| {
        machines.iter().all(|m| {
            seen.get(&m.name)
                .is_some_and(|events| events.iter().any(|e| e == "Succeeded"))
        })
    };
    nodeward_e2e::wait::eventually(
        "every node's notifications",
        Duration::from_secs(30),
        || {
            let seen = per_node();
            async move { Ok(all_done(&seen).then_some(())) }
        },
    )
    .await?;
    for (node, events) in per_node() {
        assert_eq!(
            events,
            ["DrainStarted", "Rebooting", "Succeeded"],
            "{node}'s notifications"
        );
    }
    Ok(())
}

#[tokio::test]
async fn six_nodes_reboot_two_at_a_time_and_a_blocking_pod_holds_one_back() -> anyhow::Result<()> {
    let pools: Vec<NodeSpec> = (0..NODES)
        .map(|i| {
            let pool = if i < NODES / 2 { "a" } else { "b" };
            NodeSpec::worker(pool).label("pool", pool)
        })
        .collect();
    let policy = json!({
        "maxConcurrent": MAX_CONCURRENT,
        "autoReboot": true,
        "healthGate": {"for": "1s"},
        "rebootBlockers": {"podSelectors": [{"matchLabels": {BLOCKER_LABEL: "true"}}]},
    });
    let mut scene = Scenario::new("rolling")
        .nodes(&pools)
        .policy("rolling", policy)
        .coordinator(&[])
        .start()
        .await?;
    let coordinator = scene.coordinator.take().context("the coordinator")?;
    let env = scene.env;
    app_per_node(&env, NODES).await?;
    env.replicaset(
        "batch",
        &env.node_name(BLOCKED),
        1,
        &PodOptions {
            labels: BTreeMap::from([(BLOCKER_LABEL.to_owned(), "true".to_owned())]),
            ..PodOptions::default()
        },
    )
    .await?;
    env.running_pods("batch", 1).await?;
    let history = history::watch(&env);
    let (receiver, hook) = hook_receiver().await?;
    let started = Instant::now();
    let mut machines = Vec::new();
    for i in 0..NODES {
        machines.push(machine(&env, i, &hook, true).await?);
    }

    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut unblocked = false;
    let mut blocked_denial = None;
    loop {
        for machine in &mut machines {
            if machine.reboot_requested() {
                machine.reboot().await?;
            }
        }
        let mine: Vec<NodeMaintenance> = maintenances
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|m| m.spec.node_name.starts_with(&format!("{}-", env.id)))
            .collect();
        let succeeded = |i: usize| {
            mine.iter().any(|m| {
                m.spec.node_name == env.node_name(i) && m.phase() == MaintenancePhase::Succeeded
            })
        };
        if !unblocked && (0..NODES).filter(|i| *i != BLOCKED).all(succeeded) {
            // The others are done; the blocked node has not moved.
            let held = mine
                .iter()
                .find(|m| m.spec.node_name == env.node_name(BLOCKED))
                .context("the blocked node asked for its reboot")?;
            assert_eq!(
                held.phase(),
                MaintenancePhase::Pending,
                "held back by its pod"
            );
            blocked_denial = denial(held);
            Api::<k8s_openapi::api::apps::v1::ReplicaSet>::namespaced(
                env.client.clone(),
                &env.namespace,
            )
            .delete("batch", &DeleteParams::foreground())
            .await?;
            unblocked = true;
        }
        if (0..NODES).all(succeeded) {
            break;
        }
        if Instant::now() > deadline {
            let states: Vec<String> = mine
                .iter()
                .map(|m| {
                    format!(
                        "{} {:?} {:?}",
                        m.name_any(),
                        m.phase(),
                        m.status.as_ref().and_then(|s| s.message.clone())
                    )
                })
                .collect();
            let logs: Vec<String> = machines
                .iter()
                .map(|m| format!("== {}\n{}", m.name, m.output()))
                .collect();
            anyhow::bail!(
                "not every node rebooted within 300 s: {states:#?}\ncoordinator:\n{}\n{}",
                coordinator.output(),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total = started.elapsed();

    let (reason, message) = blocked_denial.context("the blocked node's maintenance was denied")?;
    assert_eq!(reason, "Blocked");
    assert!(
        message.contains(&format!(
            "matches rebootBlockers.podSelectors[0] of policy {}-rolling",
            env.id
        )),
        "{message}"
    );
    let h = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        h.max_active <= MAX_CONCURRENT && h.max_slots <= MAX_CONCURRENT,
        "never more than {MAX_CONCURRENT} admitted: saw {} admitted, {} slots",
        h.max_active,
        h.max_slots
    );
    assert_eq!(h.max_active, MAX_CONCURRENT, "the budget was used");
    rebooted_once_and_restored(&env, &machines).await?;
    // Each node notified drain start, reboot and completion, in that order.
    wait_for_notices(&receiver, &machines).await?;
    // Every maintenance went through every phase, in order.
    print_pace(&h, &env.node_name(BLOCKED), total)?;
    drop(machines);
    env.cleanup_after(coordinator).await
}

/// Each machine booted twice (rebooted once), and its node is left uncordoned and untainted.
async fn rebooted_once_and_restored(env: &TestEnv, machines: &[Machine]) -> anyhow::Result<()> {
    for machine in machines {
        assert_eq!(machine.boots, 2, "{} rebooted exactly once", machine.name);
        assert_eq!(machine.rebooted_at.len(), 1);
        let node = env.nodes().get(&machine.name).await?;
        let spec = node.spec.unwrap_or_default();
        assert_ne!(
            spec.unschedulable,
            Some(true),
            "{} uncordoned",
            machine.name
        );
        assert!(
            spec.taints
                .unwrap_or_default()
                .iter()
                .all(|t| !t.key.starts_with("nodeward.io/")),
            "{} untainted",
            machine.name
        );
        // The shutdown its maintenance asked for is expected: told as Normal, naming it.
        let started = env
            .wait_events(
                &machine.name,
                "regarding.kind=Node",
                &["ShutdownDrainStarted"],
            )
            .await?;
        for event in started
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ShutdownDrainStarted"))
        {
            let note = event.note.as_deref().unwrap_or_default();
            assert!(
                event.type_.as_deref() == Some("Normal")
                    && note.starts_with("the shutdown of maintenance "),
                "{}: {:?} {note}",
                machine.name,
                event.type_
            );
        }
    }
    Ok(())
}

/// Checks that every maintenance of the roll went through every phase in order, and prints
/// its pace: per node, and the unblocked nodes' whole roll against the ideal of one median
/// per wave.
fn print_pace(h: &history::History, blocked_node: &str, total: Duration) -> anyhow::Result<()> {
    let mut per_node = Vec::new();
    let mut first_admitted: Option<Instant> = None;
    let mut last_unblocked_done: Option<Instant> = None;
    for (name, phases) in &h.phases {
        use MaintenancePhase::*;
        let mut seen: Vec<(Instant, MaintenancePhase)> =
            phases.iter().map(|(p, t)| (*t, *p)).collect();
        seen.sort();
        let order: Vec<MaintenancePhase> = seen.into_iter().map(|(_, p)| p).collect();
        assert_eq!(
            order,
            [Pending, Admitted, Draining, Acting, Verifying, Succeeded],
            "{name} went through every phase in order"
        );
        let (admitted, done) = (phases[&Admitted], phases[&Succeeded]);
        per_node.push(done.duration_since(admitted));
        first_admitted = Some(first_admitted.map_or(admitted, |f| f.min(admitted)));
        if !name.starts_with(blocked_node) {
            last_unblocked_done = Some(last_unblocked_done.map_or(done, |l| l.max(done)));
        }
    }
    assert_eq!(
        per_node.len(),
        NODES,
        "one maintenance per node: {:?}",
        h.phases.keys()
    );
    per_node.sort();
    let median = per_node[NODES / 2];
    // The five unblocked nodes roll in ceil(5/2) = 3 waves; the blocked one goes after.
    let waves = u32::try_from((NODES - 1).div_ceil(MAX_CONCURRENT))?;
    let rollout = last_unblocked_done
        .zip(first_admitted)
        .map(|(l, f)| l.duration_since(f))
        .context("timings")?;
    let ideal = median * waves;
    println!(
        "rolling reboot, {NODES} nodes at maxConcurrent {MAX_CONCURRENT}: per node (Admitted to Succeeded) median {:.1} s (range {:.1}-{:.1} s); the {} unblocked nodes from first admission to last Succeeded {:.1} s against the ideal {waves} waves x median = {:.1} s (ratio {:.2}); all six including the blocked one {:.1} s",
        median.as_secs_f64(),
        per_node[0].as_secs_f64(),
        per_node[NODES - 1].as_secs_f64(),
        NODES - 1,
        rollout.as_secs_f64(),
        ideal.as_secs_f64(),
        rollout.as_secs_f64() / ideal.as_secs_f64(),
        total.as_secs_f64(),
    );
    Ok(())
}

/// Whether `d` has its replica available.
fn available(d: Option<&k8s_openapi::api::apps::v1::Deployment>) -> i32 {
    d.and_then(|d| d.status.as_ref()?.available_replicas)
        .unwrap_or(0)
}

/// A Deployment `web` of one replica that runs only on a node labelled `e2e-web=<id>` (so it
/// cannot come back before the test lets it), once available.
async fn web_only_where_labelled(
    env: &TestEnv,
) -> anyhow::Result<Api<k8s_openapi::api::apps::v1::Deployment>> {
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(env.client.clone(), &env.namespace);
    let app = format!("web-{}", env.id);
    deployments
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": app}},
                    "template": {
                        "metadata": {"labels": {"app": app, TEST_LABEL: env.id}},
                        "spec": {
                            "terminationGracePeriodSeconds": 1,
                            "nodeSelector": {"e2e-web": env.id},
                            "containers": [{"name": "main", "image": "registry.invalid/nodeward-e2e:fake"}],
                            "tolerations": [
                                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
                            ],
                        },
                    },
                },
            }))?,
        )
        .await?;
    nodeward_e2e::wait::until(
        &deployments,
        "web",
        "web available",
        Duration::from_secs(60),
        |d| available(d) == 1,
    )
    .await?;
    Ok(deployments)
}

/// For 3 s: the reboot stays Verifying and the next maintenance Pending, denied for the
/// budget.
async fn the_next_waits(
    maintenances: &Api<NodeMaintenance>,
    reboot: &str,
    drain: &str,
) -> anyhow::Result<()> {
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            maintenances.get(reboot).await?.phase(),
            MaintenancePhase::Verifying
        );
        let next = maintenances.get(drain).await?;
        assert_eq!(
            next.phase(),
            MaintenancePhase::Pending,
            "the next node waits"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let denied = denial(&maintenances.get(drain).await?);
    assert_eq!(
        denied.as_ref().map(|d| d.0.as_str()),
        Some("BudgetExhausted"),
        "{denied:?}"
    );

    Ok(())
}

/// `next` was admitted after `done` succeeded.
fn admitted_after(next: &NodeMaintenance, done: &NodeMaintenance) -> anyhow::Result<()> {
    let succeeded_at = done
        .entered(MaintenancePhase::Succeeded)
        .context("Succeeded")?
        .0;
    let admitted_at = next
        .status
        .as_ref()
        .and_then(|s| s.admission.as_ref())
        .context("admission")?
        .admitted_at
        .0;
    assert!(
        admitted_at >= succeeded_at,
        "the next node was admitted at {admitted_at}, before the reboot finished at {succeeded_at}"
    );
    Ok(())
}

/// One single-replica ReplicaSet `app-<i>` bound to each of the first `count` nodes.
async fn app_per_node(env: &TestEnv, count: usize) -> anyhow::Result<()> {
    for i in 0..count {
        let app = format!("app-{i}");
        env.replicaset(&app, &env.node_name(i), 1, &PodOptions::default())
            .await?;
    }
    Ok(())
}

async fn succeeded(api: &Api<NodeMaintenance>, name: &str) -> anyhow::Result<NodeMaintenance> {
    let within = Duration::from_secs(60);
    nodeward_e2e::wait::phase(api, name, MaintenancePhase::Succeeded, within).await
}

#[tokio::test]
async fn power_off_and_delete_node_maintenances_end_as_they_should() -> anyhow::Result<()> {
    let env = TestEnv::alone("actions").await?;
    env.create_nodes(&[NodeSpec::worker("a"), NodeSpec::worker("b")])
        .await?;
    app_per_node(&env, 2).await?;
    env.create_policy(
        "actions",
        json!({"nodeSelector": {"matchLabels": {TEST_LABEL: env.id}}, "maxConcurrent": 2}),
    )
    .await?;
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &[]).await?;
    let (receiver, hook) = hook_receiver().await?;
    let power_off = machine(&env, 0, &hook, false).await?;
    let delete = machine(&env, 1, &hook, false).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    for (machine, action) in [(&power_off, "PowerOff"), (&delete, "DeleteNode")] {
        let name = format!("{}-{}", machine.name, action.to_lowercase());
        env.create_maintenance(&name, &machine.name, "Manual", action)
            .await?;
    }

    // PowerOff: Succeeded, then logind runs the drain-and-release path and powers off.
    let name = format!("{}-poweroff", power_off.name);
    let m = succeeded(&maintenances, &name)
        .await
        .with_context(|| power_off.output())?;
    assert_eq!(
        m.status.and_then(|s| s.message).as_deref(),
        Some("powering off")
    );
    nodeward_e2e::wait::eventually(
        "StartUnit(poweroff.target)",
        Duration::from_secs(30),
        || async { Ok(power_off.logind.started("poweroff.target").then_some(())) },
    )
    .await
    .with_context(|| power_off.output())?;
    let pods = env.pods().list(&Default::default()).await?;
    assert!(
        pods.items.iter().all(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(power_off.name.as_str())
                || p.metadata.deletion_timestamp.is_some()
                || p.metadata.creation_timestamp > m.metadata.creation_timestamp
        }),
        "the pods there before were drained"
    );

    // DeleteNode: drained, then the coordinator deletes the Node; the maintenance Succeeded.
    let name = format!("{}-deletenode", delete.name);
    let m = succeeded(&maintenances, &name)
        .await
        .with_context(|| format!("{}\n{}", delete.output(), coordinator.output()))?;
    assert_eq!(
        m.status.and_then(|s| s.message).as_deref(),
        Some("the Node was deleted")
    );
    assert!(
        env.nodes().get_opt(&delete.name).await?.is_none(),
        "the Node is gone"
    );
    let events: Vec<String> = receiver
        .received()
        .iter()
        .filter_map(|r| serde_json::from_str::<serde_json::Value>(&r.body).ok())
        .filter(|b| b["node"] == power_off.name.as_str())
        .map(|b| b["event"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(events, ["DrainStarted", "PoweringOff"]);
    env.cleanup_after((power_off, delete, coordinator)).await
}

#[tokio::test]
async fn a_health_gate_that_never_passes_fails_the_reboot_and_restores_the_node()
-> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("gate", "a").await?;
    // A problem the gate looks for, there before and after the reboot.
    env.nodes()
        .patch_status(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(json!({"status": {"conditions": [{
                "type": "E2EProblem", "status": "True", "reason": "Broken", "message": "e2e",
                "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
                "lastTransitionTime": jiff::Timestamp::now().to_string(),
            }]}})),
        )
        .await?;
    env.create_policy(
        "gate",
        json!({
            "nodeSelector": {"matchLabels": {TEST_LABEL: env.id}},
            "healthGate": {"for": "1s", "timeout": "3s", "problemTypes": ["E2EProblem"]},
        }),
    )
    .await?;
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &[]).await?;
    let mut machine = machine(&env, 0, "http://127.0.0.1:9/unused", false).await?;
    let name = format!("{node}-reboot");
    env.create_maintenance(&name, &node, "Manual", "Reboot")
        .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    nodeward_e2e::wait::eventually("the reboot", Duration::from_secs(60), || async {
        Ok(machine.reboot_requested().then_some(()))
    })
    .await
    .with_context(|| format!("{}\n{}", machine.output(), coordinator.output()))?;
    machine.reboot().await?;
    let within = Duration::from_secs(60);
    let m = nodeward_e2e::wait::phase(&maintenances, &name, MaintenancePhase::Failed, within)
        .await
        .with_context(|| machine.output())?;
    let message = m.message().to_owned();
    assert!(
        message.contains(
            "the health gate did not pass within 3s after the reboot: the node reports E2EProblem"
        ) && message.contains("taint and cordon are undone"),
        "{message}"
    );
    let phases: Vec<MaintenancePhase> = m
        .status
        .as_ref()
        .map(|s| s.history.iter().map(|h| h.phase).collect())
        .unwrap_or_default();
    assert_eq!(phases.last(), Some(&MaintenancePhase::Failed));
    assert!(phases.contains(&MaintenancePhase::Verifying), "{phases:?}");
    let spec = env.nodes().get(&node).await?.spec.unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true), "uncordoned");
    assert!(
        spec.taints
            .unwrap_or_default()
            .iter()
            .all(|t| !t.key.starts_with("nodeward.io/")),
        "untainted"
    );
    env.wait_events(&name, "", &["Rebooted", "HealthGateFailed"])
        .await?;
    env.cleanup_after((machine, coordinator)).await
}

#[tokio::test]
async fn a_reboot_that_does_not_return_in_time_fails_and_the_node_is_restored_once_back()
-> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("no-return", "a").await?;
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "deadlines": {"reboot": "30s"}}),
    )
    .await?;
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &[]).await?;
    let mut machine = machine(&env, 0, "http://127.0.0.1:9/unused", false).await?;
    let name = format!("{node}-reboot");
    env.create_maintenance(&name, &node, "Manual", "Reboot")
        .await?;
    nodeward_e2e::wait::eventually("the reboot", Duration::from_secs(60), || async {
        Ok(machine.reboot_requested().then_some(()))
    })
    .await
    .with_context(|| format!("{}\n{}", machine.output(), coordinator.output()))?;
    // The machine goes down and stays down: nothing of it runs.
    machine.kill_agent();
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let deadline = nodeward_e2e::wait::until_some(
        &maintenances,
        &name,
        "the reboot deadline in the status",
        Duration::from_secs(30),
        |m| {
            let deadline = m.status.as_ref()?.deadline.clone();
            deadline.filter(|d| d.phase == MaintenancePhase::Acting)
        },
    )
    .await
    .with_context(|| coordinator.output())?;
    assert_eq!(deadline.phase, MaintenancePhase::Acting);
    assert_eq!(deadline.then, "Failed (NodeDidNotReturn)");
    let within = Duration::from_secs(90);
    let failed = nodeward_e2e::wait::phase(&maintenances, &name, MaintenancePhase::Failed, within)
        .await
        .with_context(|| coordinator.output())?;
    let message = failed.message().to_owned();
    assert!(
        message.contains("did not come back from its reboot within 30s"),
        "{message}"
    );
    let spec = env.nodes().get(&node).await?.spec.unwrap_or_default();
    assert_eq!(
        spec.unschedulable,
        Some(true),
        "still cordoned while the machine is down: only the agent knows it is back"
    );

    // It comes back: its agent undoes the maintenance's taint and cordon, and says so.
    machine.reboot().await?;
    let restored = nodeward_e2e::wait::until(
        &maintenances,
        &name,
        "NodeRestored=True",
        Duration::from_secs(60),
        |m| {
            m.and_then(|m| m.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "NodeRestored" && c.status == "True")
            })
        },
    )
    .await
    .with_context(|| machine.output())?
    .context("maintenance")?;
    assert_eq!(
        restored.phase(),
        MaintenancePhase::Failed,
        "it stays Failed"
    );
    // The maintenance's taint and cordon are undone by the step above; the shutdown guard's
    // own taint, if it took the node before it went down, by its recovery after the boot.
    nodeward_e2e::wait::until(
        &env.nodes(),
        &node,
        "uncordoned and untainted",
        Duration::from_secs(30),
        |n| n.is_some_and(nodeward_e2e::node_restored),
    )
    .await
    .with_context(|| machine.output())?;
    for reason in ["NodeDidNotReturn", "Restored"] {
        env.wait_event(&name, "", reason).await?;
    }
    env.cleanup_after((machine, coordinator)).await
}

/// The `WorkloadsAvailable` condition of `m`: status, reason, message.
fn workloads_verdict(m: &NodeMaintenance) -> Option<(String, String, String)> {
    m.status.as_ref()?.conditions.iter().find_map(|c| {
        (c.type_ == "WorkloadsAvailable")
            .then(|| (c.status.clone(), c.reason.clone(), c.message.clone()))
    })
}

#[tokio::test]
async fn a_reboot_holds_its_slot_until_the_workload_it_evicted_is_available_again()
-> anyhow::Result<()> {
    let env = TestEnv::alone("wgate").await?;
    // The web replica may run only where the test says (the label), so it cannot come back
    // before the test lets it.
    env.create_nodes(&[
        NodeSpec::worker("a").label("e2e-web", &env.id),
        NodeSpec::worker("a"),
    ])
    .await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    env.create_policy(
        "wgate",
        json!({"maxConcurrent": 1, "healthGate": {"for": "1s"}}),
    )
    .await?;
    let deployments = web_only_where_labelled(&env).await?;
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &[]).await?;
    let mut first = machine(&env, 0, "http://127.0.0.1:9/unused", false).await?;
    let second = machine(&env, 1, "http://127.0.0.1:9/unused", false).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let (reboot, drain) = (format!("{n0}-reboot"), format!("{n1}-drain"));
    env.create_maintenance(&reboot, &n0, "Manual", "Reboot")
        .await?;
    let output = |first: &Machine| {
        format!(
            "{}\n{}\n{}",
            first.output(),
            second.output(),
            coordinator.output()
        )
    };

    nodeward_e2e::wait::eventually("the reboot", Duration::from_secs(60), || async {
        Ok(first.reboot_requested().then_some(()))
    })
    .await
    .with_context(|| output(&first))?;
    // Drained: web's replica was evicted. The next maintenance asks now; it must wait.
    env.create_maintenance(&drain, &n1, "Manual", "DrainOnly")
        .await?;
    env.merge_node(&n0, json!({"metadata": {"labels": {"e2e-web": null}}}))
        .await?;
    first.reboot().await?;

    // Healthy again: back in service (uncordoned) but Verifying, its slot held, while web is
    // short; the coordinator says so.
    let waiting = nodeward_e2e::wait::until(
        &maintenances,
        &reboot,
        "WorkloadsAvailable=False Waiting",
        Duration::from_secs(60),
        |m| {
            m.and_then(workloads_verdict)
                .is_some_and(|(status, reason, _)| status == "False" && reason == "Waiting")
        },
    )
    .await
    .with_context(|| output(&first))?
    .context("maintenance")?;
    let (_, _, message) = workloads_verdict(&waiting).context("verdict")?;
    assert_eq!(
        message,
        format!("Deployment {}/web 0 of 1 available", env.namespace)
    );
    assert_eq!(
        waiting.status.as_ref().map(|s| s
            .evicted_workloads
            .iter()
            .map(|w| w.kind.as_str())
            .collect::<Vec<_>>()),
        Some(vec!["ReplicaSet"])
    );
    nodeward_e2e::wait::eventually("back in service", Duration::from_secs(30), || async {
        let spec = env.nodes().get(&n0).await?.spec.unwrap_or_default();
        Ok((spec.unschedulable != Some(true)).then_some(()))
    })
    .await
    .with_context(|| output(&first))?;
    the_next_waits(&maintenances, &reboot, &drain).await?;

    // Web may come back: it does, on the node back in service; then the reboot succeeds and
    // only then is the next node admitted.
    env.merge_node(&n0, json!({"metadata": {"labels": {"e2e-web": env.id}}}))
        .await?;
    let done = succeeded(&maintenances, &reboot)
        .await
        .with_context(|| output(&first))?;
    assert_eq!(
        workloads_verdict(&done).map(|v| (v.0, v.1)),
        Some(("True".to_owned(), "Available".to_owned()))
    );
    assert!(
        done.status
            .as_ref()
            .and_then(|s| s.message.clone())
            .is_some_and(|m| m.contains("the workloads it evicted are available again")),
        "{:?}",
        done.status
    );
    let next = nodeward_e2e::wait::until(
        &maintenances,
        &drain,
        "the next node admitted",
        Duration::from_secs(60),
        |m| m.is_some_and(|m| !m.admitted_policies().is_empty()),
    )
    .await
    .with_context(|| output(&first))?
    .context("maintenance")?;
    admitted_after(&next, &done)?;
    let web = deployments.get("web").await?;
    assert_eq!(available(Some(&web)), 1);
    env.wait_events(
        &reboot,
        "",
        &["BackInService", "WorkloadsWaiting", "WorkloadsAvailable"],
    )
    .await?;
    maintenances
        .delete(&drain, &DeleteParams::default())
        .await?;
    nodeward_e2e::wait::until(
        &maintenances,
        &drain,
        "gone",
        Duration::from_secs(60),
        |m| m.is_none(),
    )
    .await
    .with_context(|| output(&first))?;
    env.cleanup_after((first, second, coordinator)).await
}

#[tokio::test]
async fn three_replicas_under_a_budget_of_two_stay_two_ready_while_their_nodes_reboot_in_turn()
-> anyhow::Result<()> {
    let env = TestEnv::alone("wroll").await?;
    env.create_nodes(&[
        NodeSpec::worker("a"),
        NodeSpec::worker("a"),
        NodeSpec::worker("a"),
    ])
    .await?;
    env.create_policy(
        "wroll",
        json!({"maxConcurrent": 1, "healthGate": {"for": "1s"}}),
    )
    .await?;
    // Three replicas, one per node, each Ready 3 s after it runs; at least two must be up.
    workload::spread_deployment(&env, "web", 3, "3s").await?;
    env.pdb("web", &format!("web-{}", env.id), 2).await?;
    let watch = workload::ReadyWatch::start(&env, "web");
    nodeward_e2e::wait::eventually(
        "three web replicas Ready",
        Duration::from_secs(60),
        || async { Ok((watch.readiness().ready.len() == 3).then_some(())) },
    )
    .await?;
    watch.arm();
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &[]).await?;
    let mut machines = Vec::new();
    for index in 0..3 {
        machines.push(machine(&env, index, "http://127.0.0.1:9/unused", false).await?);
    }
    let names = nodeward_e2e::machine::reboot_each(&env, 3).await?;
    nodeward_e2e::machine::reboot_until_succeeded(
        &mut machines,
        &env.client,
        &names,
        Duration::from_secs(240),
    )
    .await
    .with_context(|| coordinator.output())?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());

    let seen = watch.readiness();
    assert_eq!(
        seen.fewest,
        Some(2),
        "never fewer than two Ready, and one down at a time: {:?}",
        seen.timeline
    );
    // In admission order, each node went only after the last one's evicted replica was
    // Ready again (its maintenance finished on WorkloadsAvailable=True).
    let mut done: Vec<NodeMaintenance> = Vec::new();
    for name in &names {
        done.push(maintenances.get(name).await?);
    }
    let admitted = |m: &NodeMaintenance| {
        m.status
            .as_ref()
            .and_then(|s| s.admission.as_ref())
            .map(|a| a.admitted_at.0)
    };
    done.sort_by_key(admitted);
    for pair in done.windows(2) {
        let (last, next) = (&pair[0], &pair[1]);
        assert_eq!(
            workloads_verdict(last).map(|v| (v.0, v.1)),
            Some(("True".to_owned(), "Available".to_owned())),
            "{}",
            last.name_any()
        );
        let finished = last
            .entered(MaintenancePhase::Succeeded)
            .context("Succeeded")?
            .0;
        let started = admitted(next).context("admitted")?;
        assert!(
            started >= finished,
            "{} admitted at {started}, before {} finished at {finished}",
            next.name_any(),
            last.name_any()
        );
    }
    println!("web replicas Ready over the rollout: {:?}", seen.timeline);
    env.cleanup_after((machines, coordinator)).await
}
