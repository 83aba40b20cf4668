//! Remediation and DeleteNode: maxUnhealthy, startup timeouts, deleted nodes freeing slots,
//! dead nodes tainted out of service, one replacement at a time.

use super::*;

#[tokio::test]
async fn max_unhealthy_short_circuits_remediation() -> anyhow::Result<()> {
    let env = scenario("max-unhealthy", &vec![NodeSpec::worker("a"); 4]).await?;
    let policy = env
        .create_policy(
            "pool",
            json!({"maxConcurrent": 1, "maxUnhealthy": 1, "remediation": {
                "enabled": true, "action": "Reboot",
                "unhealthyConditions": [{"type": "E2eProblem", "status": "True", "for": "3s"}],
            }}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    wait::until(
        &policies,
        &policy,
        "RemediationAllowed=True",
        TIMEOUT,
        |p| {
            p.and_then(|p| policy_condition(p, "RemediationAllowed"))
                .is_some_and(|c| c.0 == "True")
        },
    )
    .await?;

    // Two nodes go bad at the same instant, so that no round can see one past the 3s the
    // condition must hold and the other not yet: over the limit.
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    let storm = jiff::Timestamp::now();
    set_condition(&env, &n0, "E2eProblem", "True", storm).await?;
    set_condition(&env, &n1, "E2eProblem", "True", storm).await?;
    let p = wait::until(
        &policies,
        &policy,
        "RemediationAllowed=False",
        TIMEOUT,
        |p| {
            p.and_then(|p| policy_condition(p, "RemediationAllowed"))
                .is_some_and(|c| c.0 == "False")
        },
    )
    .await?
    .context("policy")?;
    let (_, reason, message) = policy_condition(&p, "RemediationAllowed").context("condition")?;
    assert_eq!(reason, "TooManyUnhealthy");
    assert!(message.contains("maxUnhealthy 1"), "{message}");
    assert_eq!(p.status.as_ref().map(|s| s.unhealthy), Some(2));
    assert!(
        remediations(&env).await?.is_empty(),
        "no remediation during a storm"
    );

    // One recovers: back within the limit, the other one is remediated.
    set_condition(&env, &n0, "E2eProblem", "False", jiff::Timestamp::now()).await?;
    let created = wait::eventually("a remediation maintenance", TIMEOUT, || async {
        Ok(Some(remediations(&env).await?).filter(|r| !r.is_empty()))
    })
    .await?;
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(created[0].spec.node_name, n1);
    assert_eq!(
        created[0].spec.action,
        nodeward_api::MaintenanceAction::Reboot
    );
    let m = wait_admitted(&env, &created[0].name_any(), TIMEOUT).await?;
    assert_eq!(m.spec.requested_by.as_deref(), Some("nodeward-coordinator"));
    env.cleanup().await
}

#[tokio::test]
async fn a_node_that_never_becomes_ready_times_out_and_is_deleted() -> anyhow::Result<()> {
    let env = TestEnv::alone("startup-timeout").await?;
    env.create_policy("pool",
        json!({"remediation": {"enabled": false, "nodeStartupTimeout": "3s", "startupAction": "DeleteNode"}}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = env.node_name(0);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
    }))?;
    let created = Instant::now();
    env.nodes().create(&PostParams::default(), &node).await?;
    wait::until(&env.nodes(), &name, "StartupTimedOut=True", TIMEOUT, |n| {
        wait::node_condition(n, "StartupTimedOut").is_some_and(|(status, _)| status == "True")
    })
    .await?;
    // creationTimestamp has whole seconds: the 3s can end up to 1s before our own clock says.
    assert!(
        created.elapsed() >= Duration::from_secs(2),
        "not before the timeout: {:?}",
        created.elapsed()
    );
    wait::until(&env.nodes(), &name, "the node deleted", TIMEOUT, |n| {
        n.is_none()
    })
    .await?;
    env.wait_event(&name, "regarding.kind=Node", "NodeStartupTimeout")
        .await?;
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn deleting_the_node_frees_its_slot() -> anyhow::Result<()> {
    let env = scenario("node-deleted", &vec![NodeSpec::worker("a"); 2]).await?;
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let first = create_maintenance(&env, &env.node_name(0)).await?;
    wait_admitted(&env, &first, TIMEOUT).await?;
    let second = create_maintenance(&env, &env.node_name(1)).await?;
    wait_denied(&env, &second, "BudgetExhausted").await?;

    env.nodes()
        .delete(&env.node_name(0), &DeleteParams::default())
        .await?;
    wait_admitted(&env, &second, TIMEOUT).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::phase(&maintenances, &first, MaintenancePhase::Cancelled, TIMEOUT).await?;
    let message = m.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("was deleted"), "{message}");
    let p = Api::<DisruptionPolicy>::all(env.client.clone())
        .get(&policy)
        .await?;
    let slots: Vec<String> = p
        .status
        .map(|s| s.slots.into_iter().map(|s| s.maintenance).collect())
        .unwrap_or_default();
    assert_eq!(slots, vec![second]);
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn a_delete_node_maintenance_acting_without_an_admission_deletes_no_node()
-> anyhow::Result<()> {
    let env = scenario("forged-delete", &[NodeSpec::worker("a")]).await?;
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let node = env.node_name(0);
    let name = format!("{node}-forged");
    env.create_maintenance(&name, &node, "Manual", "DeleteNode")
        .await?;
    // Whoever may write the status moves it to Acting, the phase in which the coordinator
    // deletes a drained DeleteNode maintenance's node, without any admission.
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    env.merge_maintenance_status(&name, json!({"phase": "Acting"}))
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let m = wait::phase(&maintenances, &name, MaintenancePhase::Failed, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    let message = m.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("is not deleted"), "{message}");
    assert!(
        env.nodes().get_opt(&node).await?.is_some(),
        "the node is still there"
    );
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn a_startup_deletion_waits_while_its_policy_is_paused() -> anyhow::Result<()> {
    let env = TestEnv::alone("startup-paused").await?;
    let policy = env
        .create_policy(
            "pool",
            json!({"paused": true, "remediation": {"nodeStartupTimeout": "3s", "startupAction": "DeleteNode"}}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = env.node_name(0);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
    }))?;
    env.nodes().create(&PostParams::default(), &node).await?;
    let event = env
        .wait_event(&name, "regarding.kind=Node", "NodeStartupTimeout")
        .await?;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&format!("not deleted now: policy {policy} is paused")),
        "{note}"
    );
    assert!(
        env.nodes().get_opt(&name).await?.is_some(),
        "kept while paused"
    );
    env.merge_policy_spec(&policy, json!({"paused": false}))
        .await?;
    wait::until(&env.nodes(), &name, "the node deleted", TIMEOUT, |n| {
        n.is_none()
    })
    .await
    .with_context(|| coordinator.output())?;
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn a_delete_node_maintenance_deletes_no_node_created_again_under_the_name()
-> anyhow::Result<()> {
    let env = scenario("recreated", &[NodeSpec::worker("a")]).await?;
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let node = env.node_name(0);
    let old_uid = env.nodes().get(&node).await?.uid().context("uid")?;
    let name = format!("{node}-delete");
    env.create_maintenance(&name, &node, "Manual", "DeleteNode")
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let m = wait_admitted(&env, &name, TIMEOUT).await?;
    let recorded = m.status.and_then(|s| s.admission?.node_uid);
    assert_eq!(recorded.as_deref(), Some(old_uid.as_str()));
    drop(coordinator);

    // While no coordinator runs, the machine is replaced under the same name, and the
    // maintenance reaches Acting (drained, as its agent would report it).
    env.nodes().delete(&node, &DeleteParams::default()).await?;
    wait::until(&env.nodes(), &node, "the old node gone", TIMEOUT, |n| {
        n.is_none()
    })
    .await?;
    reporting_nodes(&env, &[NodeSpec::worker("a")]).await?;
    let new_uid = env.nodes().get(&node).await?.uid().context("uid")?;
    assert_ne!(new_uid, old_uid);
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    env.merge_maintenance_status(&name, json!({"phase": "Acting"}))
        .await?;

    let coordinator = start(&env, "c2", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let m = wait::until(&maintenances, &name, "ended", TIMEOUT, |m| {
        m.is_some_and(|m| m.phase().is_finished())
    })
    .await
    .with_context(|| coordinator.output())?
    .context("maintenance")?;
    let message = m.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("created again"), "{message}");
    let now = env
        .nodes()
        .get_opt(&node)
        .await?
        .context("the new node stays")?;
    assert_eq!(now.uid().as_deref(), Some(new_uid.as_str()));
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn delete_node_maintenances_remove_one_node_per_replacement_wait() -> anyhow::Result<()> {
    let env = scenario("replacement", &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "deadlines": {"replacement": "20s"}}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let first = format!("{n0}-delete");
    env.create_maintenance(&first, &n0, "Manual", "DeleteNode")
        .await?;
    wait_admitted(&env, &first, TIMEOUT).await?;
    let second = format!("{n1}-delete");
    env.create_maintenance(&second, &n1, "Manual", "DeleteNode")
        .await?;
    wait_denied(&env, &second, "BudgetExhausted").await?;
    // The first node drained (as its agent would report it): the coordinator deletes it.
    env.merge_maintenance_status(&first, json!({"phase": "Acting"}))
        .await?;
    let deleted = wait::phase(&maintenances, &first, MaintenancePhase::Succeeded, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    let deleted_at = deleted
        .status
        .and_then(|s| s.finished_at)
        .context("finishedAt")?
        .0;
    assert!(env.nodes().get_opt(&n0).await?.is_none(), "n0 deleted");
    // Its share of the budget is held for its replacement: the second waits that long.
    let admitted = wait_admitted(&env, &second, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    let admitted_at = admitted
        .status
        .and_then(|s| s.admission)
        .context("admission")?
        .admitted_at
        .0;
    let held = admitted_at.duration_since(deleted_at).as_secs_f64();
    assert!(
        held >= 19.0,
        "admitted {held:.1}s after the first node's deletion, within the 20s replacement wait"
    );
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn a_dead_node_is_tainted_out_of_service_its_pods_go_and_the_taint_goes_when_it_returns()
-> anyhow::Result<()> {
    let env = scenario("dead-node", &vec![NodeSpec::worker("a"); 3]).await?;
    let (n0, n1, n2) = (env.node_name(0), env.node_name(1), env.node_name(2));
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "deadlines": {"agentHeartbeat": "1m"},
               "remediation": {"enabled": true, "outOfServiceTaint": true}}),
    )
    .await?;
    // Like a stateful pod: it waits out its node being unreachable for as long as it takes, so
    // only the out-of-service taint moves it.
    let stays = nodeward_e2e::PodOptions {
        tolerations: json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        ]),
        ..Default::default()
    };
    env.replicaset("stateful", &n0, 1, &stays).await?;
    let pod = env
        .running_pods("stateful", 1)
        .await?
        .pop()
        .context("the pod on n0")?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;

    // n0 dies: its peers' probes of it go unanswered (reported first: a coordinator that
    // saw n0 dead before any agent probed peers would rightly act without asking them),
    // nothing runs it any more (kwok lets it go), it has been NotReady for ten minutes, and
    // its agent, which fences it, silent as long. First without the fencing: nothing marks
    // a node that may still be running its pods.
    report_sightings(&env, &n1, &[(&n0, false), (&n2, true)]).await?;
    env.merge_node(
        &n0,
        json!({"metadata": {"annotations": {KWOK_NODE_ANNOTATION: "dead"}}}),
    )
    .await?;
    let ten_minutes_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(10);
    set_condition(&env, &n0, "Ready", "False", ten_minutes_ago).await?;
    silence_agent(&env, &n0, Duration::from_secs(900)).await?;
    let waits = env
        .wait_event(&n0, "", "OutOfServiceWaits")
        .await
        .with_context(|| coordinator.output())?;
    let why = waits.note.unwrap_or_default();
    assert!(
        why.contains("does not fence") && why.contains("kubectl nodeward out-of-service"),
        "{why}"
    );
    let n0_now = env.nodes().get(&n0).await?;
    assert!(
        wait::out_of_service_taint(Some(&n0_now)).is_none(),
        "a node whose agent does not fence was marked out of service: {}",
        coordinator.output()
    );
    // Said once: the why counts seconds, and each round restates it (three more rounds).
    let rounds = r#"nodeward_coordinator_decision_duration_seconds_count{round="full"}"#;
    let seen = coordinator.metric(rounds).await?;
    wait::eventually("three more full rounds", TIMEOUT, || async {
        Ok((coordinator.metric(rounds).await? >= seen + 3.0).then_some(()))
    })
    .await?;
    let told: Vec<String> = env
        .events_about(&n0, "")
        .await?
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("OutOfServiceWaits"))
        .filter_map(|e| e.note)
        .collect();
    assert_eq!(told.len(), 1, "one Event while the why stays: {told:#?}");
    announce_fencing(&env, &n0).await?;

    let tainted = wait::until(
        &env.nodes(),
        &n0,
        "the out-of-service taint",
        TIMEOUT,
        |n| {
            n.and_then(|n| n.spec.as_ref()?.taints.as_ref())
                .is_some_and(|t| {
                    t.iter().any(|t| {
                        t.key == "node.kubernetes.io/out-of-service"
                            && t.value.as_deref() == Some("nodeshutdown")
                            && t.effect == "NoExecute"
                    })
                })
        },
    )
    .await
    .with_context(|| coordinator.output())?
    .context("n0")?;
    let record = tainted
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("nodeward.io/out-of-service")
        .context("nodeward's record")?;
    assert!(
        record.contains(&format!("unreachable from 1 peer(s): {n1}")),
        "{record}"
    );
    env.wait_event(&n0, "", "OutOfService").await?;
    // Kubernetes does the rest: the pod is evicted and, its kubelet gone, deleted for good.
    let pods = env.pods();
    let pod_name = pod.name_any();
    wait::until(
        &pods,
        &pod_name,
        "the dead node's pod deleted",
        Duration::from_secs(90),
        |p| p.is_none(),
    )
    .await?;

    // n0 comes back: nodeward's taint goes.
    set_condition(&env, &n0, "Ready", "True", jiff::Timestamp::now()).await?;
    wait::until(&env.nodes(), &n0, "the taint taken away", TIMEOUT, |n| {
        n.is_some_and(|n| {
            wait::out_of_service_taint(Some(n)).is_none()
                && !n.annotations().contains_key("nodeward.io/out-of-service")
        })
    })
    .await
    .with_context(|| coordinator.output())?;
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn a_delete_node_remediation_of_a_dead_node_completes_without_its_agent() -> anyhow::Result<()>
{
    let env = scenario("dead-delete", &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    env.merge_node(
        &n0,
        json!({"metadata": {"annotations": {KWOK_NODE_ANNOTATION: "dead"}}}),
    )
    .await?;
    // NotReady for longer than deadlines.agentHeartbeat (default 12m), its agent as long.
    let fifteen_minutes_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(15);
    set_condition(&env, &n0, "Ready", "False", fifteen_minutes_ago).await?;
    silence_agent(&env, &n0, Duration::from_secs(900)).await?;
    announce_fencing(&env, &n0).await?;
    report_sightings(&env, &n1, &[(&n0, false)]).await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = format!("{n0}-delete");
    env.create_maintenance(&name, &n0, "Remediation", "DeleteNode")
        .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let done = wait::phase(&maintenances, &name, MaintenancePhase::Succeeded, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    assert!(
        env.nodes().get_opt(&n0).await?.is_none(),
        "the dead node is deleted"
    );
    let phases: Vec<MaintenancePhase> = done
        .status
        .map(|s| s.history.into_iter().map(|h| h.phase).collect())
        .unwrap_or_default();
    assert_eq!(
        phases,
        [
            MaintenancePhase::Pending,
            MaintenancePhase::Admitted,
            MaintenancePhase::Acting,
            MaintenancePhase::Succeeded
        ],
        "no drain: nothing runs there"
    );
    env.wait_event(&name, "", "NodeDead").await?;
    env.cleanup_after(coordinator).await
}
