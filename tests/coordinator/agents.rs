//! Agents: silent ones not admitted to, deadlines when none starts, half-done admissions, and
//! a lost agent's maintenances finished by the coordinator.

use super::*;

#[tokio::test]
async fn a_node_whose_agent_is_silent_is_admitted_only_once_it_reports() -> anyhow::Result<()> {
    let env = TestEnv::alone("agentless").await?;
    // n0 without a NodeReport: as if no agent ever ran there (a Windows node, a virtual
    // kubelet); n1's agent last renewed its Lease 15 minutes ago (crash-looping since).
    env.create_nodes(&vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    silence_agent(&env, &n1, Duration::from_secs(900)).await?;
    env.create_policy("pool", json!({"maxConcurrent": 2}))
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let m0 = create_maintenance(&env, &n0).await?;
    let message = wait_denied(&env, &m0, "AgentUnavailable")
        .await
        .with_context(|| coordinator.output())?;
    assert!(
        message.contains(&n0) && message.contains("no NodeReport"),
        "{message}"
    );

    // An agent whose Lease was renewed longer ago than deadlines.agentHeartbeat (default 12m)
    // is none.
    let m1 = create_maintenance(&env, &n1).await?;
    let message = wait_denied(&env, &m1, "AgentUnavailable").await?;
    assert!(
        message.contains("last wrote its heartbeat")
            && message.contains("deadlines.agentHeartbeat 720s"),
        "{message}"
    );

    // The agents report: both are admitted.
    env.heartbeats(&[n0, n1]).await?;
    for m in [&m0, &m1] {
        wait_admitted(&env, m, TIMEOUT)
            .await
            .with_context(|| coordinator.output())?;
    }
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn an_admitted_maintenance_no_agent_starts_goes_back_to_pending_and_frees_its_slot()
-> anyhow::Result<()> {
    let env = scenario("not-started", &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    let history = nodeward_e2e::history::watch(&env);
    let policy = env
        .create_policy(
            "pool",
            json!({"maxConcurrent": 1, "deadlines": {"start": "30s"}}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let stuck = create_maintenance(&env, &n0).await?;
    let admitted = wait_admitted(&env, &stuck, TIMEOUT).await?;
    let status = admitted.status.clone().unwrap_or_default();
    let deadline = status
        .deadline
        .context("the start deadline is in the status")?;
    let admitted_at = status.admission.context("admission")?.admitted_at.0;
    assert_eq!(deadline.phase, MaintenancePhase::Admitted);
    assert_eq!(deadline.then, "back to Pending (NotStarted)");
    assert_eq!(
        deadline.time.0.as_second() - admitted_at.as_second(),
        30,
        "deadlines.start after the admission"
    );
    let waiting = create_maintenance(&env, &n1).await?;
    wait_denied(&env, &waiting, "BudgetExhausted").await?;
    // The stuck node's agent dies before starting: nothing moves the maintenance on.
    silence_agent(&env, &n0, Duration::from_secs(900)).await?;

    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let sent_back = wait::until(
        &maintenances,
        &stuck,
        "back to Pending (NotStarted)",
        Duration::from_secs(90),
        |m| {
            m.and_then(admitted_condition)
                .is_some_and(|(status, reason, _)| status == "False" && reason == "NotStarted")
        },
    )
    .await
    .with_context(|| coordinator.output())?
    .context("the maintenance disappeared")?;
    let status = sent_back.status.clone().unwrap_or_default();
    assert_eq!(status.phase, MaintenancePhase::Pending);
    assert!(status.admission.is_none(), "its admission is undone");
    let phases: Vec<MaintenancePhase> = status.history.iter().map(|h| h.phase).collect();
    assert_eq!(
        phases,
        [
            MaintenancePhase::Pending,
            MaintenancePhase::Admitted,
            MaintenancePhase::Pending
        ]
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "NodeRestored" && c.status == "False" && c.reason == "NotStarted"),
        "the agent is asked to undo what it may have left: {:?}",
        status.conditions
    );
    // Its slot goes to the next in line, and it waits for its agent.
    wait_admitted(&env, &waiting, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    wait_denied(&env, &stuck, "AgentUnavailable").await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let slots: Vec<String> = policies
        .get(&policy)
        .await?
        .status
        .map(|s| s.slots.into_iter().map(|s| s.maintenance).collect())
        .unwrap_or_default();
    assert_eq!(slots, vec![waiting.clone()]);
    env.wait_event(&stuck, "", "NotStarted").await?;
    let h = history.lock().expect("history").clone();
    assert_eq!(h.max_active, 1, "never more than maxConcurrent at once");
    assert_eq!(h.max_slots, 1);
    env.cleanup_after(coordinator).await
}

/// A leader writes a maintenance's slot, then its admission write is delayed (a partition, a
/// slow connection) and another coordinator takes over, denies the maintenance and frees the
/// slot. The late write must not land, or the maintenance would run without a slot while
/// another one takes it.
#[tokio::test]
async fn a_half_done_admission_given_back_cannot_be_admitted_by_a_late_write() -> anyhow::Result<()>
{
    let env = scenario("fence", &[NodeSpec::worker("a")]).await?;
    let n0 = env.node_name(0);
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 1, "paused": true}))
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = create_maintenance(&env, &n0).await?;
    wait_denied(&env, &name, "Paused").await?;
    drop(coordinator);

    // The other leader's half-done admission: its slot stood, and it holds the admission
    // write over the version it decided on.
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let decided_on = maintenances.get(&name).await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    policies
        .patch_status(
            &policy,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"slots": [{
                "maintenance": name,
                "uid": decided_on.uid(),
                "nodeName": n0,
                "admittedAt": jiff::Timestamp::now().to_string(),
            }]}})),
        )
        .await?;

    // This coordinator finds the slot of a maintenance that is still Pending under a paused
    // policy, and gives it back.
    let coordinator = start(&env, "c2", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    wait::until(&policies, &policy, "the slot given back", TIMEOUT, |p| {
        p.is_some_and(|p| p.status.as_ref().is_some_and(|s| s.slots.is_empty()))
    })
    .await
    .with_context(|| coordinator.output())?;

    let mut late = decided_on.clone();
    let status = late.status.get_or_insert_with(Default::default);
    status.phase = MaintenancePhase::Admitted;
    let written = maintenances
        .replace_status(&name, &PostParams::default(), &late)
        .await;
    assert!(
        matches!(&written, Err(kube::Error::Api(e)) if e.code == 409),
        "the late admission write is refused once the slot is given back: {:?}\n{}",
        written.map(|m| m.phase()),
        coordinator.output()
    );
    let now = maintenances.get(&name).await?;
    assert_eq!(now.phase(), MaintenancePhase::Pending);
    assert_eq!(
        now.status.and_then(|s| s.admissions_withdrawn),
        Some(1),
        "the withdrawal is counted"
    );
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn a_lost_agents_maintenances_are_finished_and_its_node_restored_by_the_coordinator()
-> anyhow::Result<()> {
    let env = scenario("agent-lost", &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    let policy = env
        .create_policy(
            "pool",
            json!({"maxConcurrent": 2, "deadlines": {"agentLost": "1m"}}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    // Each node's agent (played here) takes its maintenance: finalizer, taint, recorded cordon;
    // n0's shutdown guard had begun too (its taint) when the agent died.
    let draining = create_maintenance(&env, &n0).await?;
    let drained = create_maintenance(&env, &n1).await?;
    for (name, node, phase) in [(&draining, &n0, "Draining"), (&drained, &n1, "Acting")] {
        let mut taints = vec![json!({"key": "nodeward.io/maintenance", "effect": "NoSchedule"})];
        if node == &n0 {
            taints.push(json!({"key": "nodeward.io/shutdown", "effect": "NoSchedule"}));
        }
        wait_admitted(&env, name, TIMEOUT).await?;
        maintenances
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": ["nodeward.io/maintenance"]}})),
            )
            .await?;
        env.merge_node(node, json!({
                    "metadata": {"annotations": {"nodeward.io/cordoned-by": format!("maintenance/{name}")}},
                    "spec": {"unschedulable": true, "taints": taints},
                })).await?;
        env.merge_maintenance_status(name, json!({"phase": phase, "cordonedByNodeward": true}))
            .await?;
    }
    // Both agents die. The draining maintenance is finished for its agent at once (its last
    // heartbeat is long past deadlines.agentLost); the drained DrainOnly one holds on purpose.
    silence_agent(&env, &n0, Duration::from_secs(900)).await?;
    silence_agent(&env, &n1, Duration::from_secs(900)).await?;
    let failed = wait::until(
        &maintenances,
        &draining,
        "Failed, finalizer removed",
        TIMEOUT,
        |m| m.is_some_and(|m| m.phase() == MaintenancePhase::Failed && m.finalizers().is_empty()),
    )
    .await
    .with_context(|| coordinator.output())?
    .context("the maintenance disappeared")?;
    let status = failed.status.clone().unwrap_or_default();
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("deadlines.agentLost"),
        "{status:?}"
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "NodeRestored" && c.status == "True"),
        "{:?}",
        status.conditions
    );
    assert!(
        node_restored(&env.nodes().get(&n0).await?),
        "n0 uncordoned and untainted, the shutdown guard's taint gone too"
    );
    assert!(
        !node_restored(&env.nodes().get(&n1).await?),
        "the DrainOnly node stays drained until its maintenance is deleted"
    );
    env.wait_event(&draining, "", "AgentLost").await?;

    // Deleting the DrainOnly maintenance is not stuck on the lost agent's finalizer.
    maintenances
        .delete(&drained, &DeleteParams::default())
        .await?;
    wait::until(&maintenances, &drained, "gone", TIMEOUT, |m| m.is_none())
        .await
        .with_context(|| coordinator.output())?;
    wait::until(&env.nodes(), &n1, "n1 restored", TIMEOUT, |n| {
        n.is_some_and(node_restored)
    })
    .await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    wait::until(&policies, &policy, "every slot freed", TIMEOUT, |p| {
        p.is_some_and(|p| p.status.as_ref().is_some_and(|s| s.slots.is_empty()))
    })
    .await?;
    env.cleanup_after(coordinator).await
}
