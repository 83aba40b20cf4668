//! Budgets and leaders: maxConcurrent kept through many admissions and two coordinators that
//! both believe they lead, a killed leader replaced, control-plane quorum.

use super::*;

#[tokio::test]
async fn fifty_maintenances_are_admitted_never_more_than_three_at_once() -> anyhow::Result<()> {
    let env = scenario("admit-fifty", &vec![NodeSpec::worker("a"); 50]).await?;
    let history = nodeward_e2e::history::watch(&env);
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 3}))
        .await?;
    // Full rounds on changes, and a resync too rare to meet the probe at rest below.
    let coordinator = start(&env, "c1", &["--resync", "30s"]).await?;
    coordinator.wait_ready(TIMEOUT).await?;

    let mut names = Vec::new();
    for i in 0..50 {
        names.push(create_maintenance(&env, &env.node_name(i)).await?);
    }
    // Some are denied while the budget is used.
    let denied = wait_denied(&env, &names[49], "BudgetExhausted").await?;
    assert!(denied.contains("allows 3"), "the denial says why: {denied}");
    finish_admitted(
        &env,
        &names,
        Duration::from_millis(200),
        Duration::from_secs(120),
    )
    .await?;

    let h = history.lock().expect("history").clone();
    assert_eq!(h.admitted.len(), 50, "every maintenance was admitted once");
    assert!(
        h.max_active <= 3,
        "at most 3 admitted at once, saw {}",
        h.max_active
    );
    assert_eq!(h.max_active, 3, "the budget was used in full");
    assert!(
        h.max_slots <= 3,
        "policy {policy} held {} slots",
        h.max_slots
    );
    let admissions = coordinator
        .metric("nodeward_coordinator_admissions_total")
        .await?;
    assert!(admissions >= 50.0, "admissions metric {admissions}");
    // The first was admitted as soon as it arrived: its own share is measured. (The next two
    // may arrive while a round is under way, on a busy machine, and then share the next one.)
    let measured = coordinator
        .metric("nodeward_coordinator_admission_coordinator_seconds_count")
        .await?;
    assert!(measured >= 1.0, "admissions measured {measured}");
    // Each round's plan is written effect by effect, and counted so: the slots and
    // admissions, and the denials of those that waited.
    for effect in ["admit", "deny"] {
        let written = coordinator
            .metric(&format!(
                "nodeward_coordinator_effects_total{{effect=\"{effect}\",outcome=\"written\"}}"
            ))
            .await?;
        assert!(written >= 1.0, "{effect} effects written: {written}");
    }
    let p = Api::<DisruptionPolicy>::all(env.client.clone())
        .get(&policy)
        .await?;
    wait::eventually("the slots to be freed", TIMEOUT, || async {
        let p = Api::<DisruptionPolicy>::all(env.client.clone())
            .get(&policy)
            .await?;
        Ok(p.status.is_some_and(|s| s.slots.is_empty()).then_some(()))
    })
    .await?;
    assert_eq!(p.status.map(|s| s.matched), Some(50));
    // At rest, a maintenance that arrives is decided by an admission-only round against what
    // the last full round left. (During the burst, whether arrivals meet a full round woken by
    // the nodes' marks or the test's own writes is a matter of timing.)
    admitted_alone_at_rest(&env, &coordinator).await?;
    env.cleanup().await
}

/// Creates a second maintenance on a node of `env` and checks that an admission-only round,
/// and no full round, ran until it was admitted. A full round can still meet it (the resync,
/// a node's trailing change): then another node is tried, three at most.
async fn admitted_alone_at_rest(env: &TestEnv, coordinator: &Daemon) -> anyhow::Result<()> {
    let rounds = |kind: &'static str| async move {
        coordinator
            .metric(&format!(
                "nodeward_coordinator_decision_duration_seconds_count{{round=\"{kind}\"}}"
            ))
            .await
    };
    let mut seen = Vec::new();
    for i in 0..3 {
        let (full, admission) = (rounds("full").await?, rounds("admission").await?);
        let node = env.node_name(i);
        let name = format!("{node}-again");
        env.create_maintenance(&name, &node, "Manual", "DrainOnly")
            .await?;
        wait_admitted(env, &name, TIMEOUT).await?;
        let (full_after, admission_after) = (rounds("full").await?, rounds("admission").await?);
        if full_after == full {
            assert!(
                admission_after > admission,
                "{name} was admitted with no round counted: full {full}, admission \
                 {admission} -> {admission_after}"
            );
            return Ok(());
        }
        seen.push(format!(
            "{name}: full rounds {full} -> {full_after}, admission {admission} -> {admission_after}"
        ));
    }
    anyhow::bail!(
        "a full round met every maintenance created at rest: {}",
        seen.join("; ")
    )
}

#[tokio::test]
async fn two_coordinators_both_acting_as_leader_keep_the_budget() -> anyhow::Result<()> {
    let env = scenario("two-leaders", &vec![NodeSpec::worker("a"); 20]).await?;
    let history = nodeward_e2e::history::watch(&env);
    env.create_policy("pool", json!({"maxConcurrent": 2}))
        .await?;
    let a = start(&env, "a", &["--leader-elect=false"]).await?;
    let b = start(&env, "b", &["--leader-elect=false"]).await?;
    a.wait_ready(TIMEOUT).await?;
    b.wait_ready(TIMEOUT).await?;

    let mut names = Vec::new();
    for i in 0..20 {
        names.push(create_maintenance(&env, &env.node_name(i)).await?);
    }
    finish_admitted(
        &env,
        &names,
        Duration::from_millis(100),
        Duration::from_secs(120),
    )
    .await?;
    let h = history.lock().expect("history").clone();
    assert_eq!(h.admitted.len(), 20);
    assert!(
        h.max_active <= 2,
        "at most 2 admitted at once, saw {}",
        h.max_active
    );
    assert!(h.max_slots <= 2, "at most 2 slots, saw {}", h.max_slots);
    let by: BTreeSet<String> = h.admitted.values().cloned().collect();
    let conflicts = a
        .metric("nodeward_coordinator_slot_conflicts_total")
        .await?
        + b.metric("nodeward_coordinator_slot_conflicts_total")
            .await?;
    eprintln!("two leaders: admissions by {by:?}, {conflicts} conditional writes refused");
    // A refused slot write is what became of its effect: counted as a conflict there too.
    let mut effect_conflicts = 0.0;
    for c in [&a, &b] {
        for effect in ["admit", "release"] {
            effect_conflicts += c
                .metric(&format!(
                    "nodeward_coordinator_effects_total{{effect=\"{effect}\",outcome=\"conflict\"}}"
                ))
                .await?;
        }
    }
    assert_eq!(
        conflicts > 0.0,
        effect_conflicts > 0.0,
        "{conflicts} slot writes refused, {effect_conflicts} slot effects counted as conflicts"
    );
    assert!(a.metric("nodeward_coordinator_leader").await? == 1.0);
    env.cleanup().await
}

#[tokio::test]
async fn a_killed_leader_is_replaced_within_the_lease_duration() -> anyhow::Result<()> {
    let env = scenario("failover", &vec![NodeSpec::worker("a"); 3]).await?;
    let history = nodeward_e2e::history::watch(&env);
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let mut coordinators: BTreeMap<String, Daemon> = BTreeMap::new();
    for identity in ["a", "b"] {
        coordinators.insert(identity.to_owned(), start(&env, identity, &[]).await?);
    }
    let leader = wait::eventually("a leader", TIMEOUT, || lease_holder(&env)).await?;
    let follower = if leader == "a" { "b" } else { "a" };
    let metric = coordinators[follower]
        .metric("nodeward_coordinator_leader")
        .await?;
    assert_eq!(metric, 0.0, "the follower does not lead");

    let first = create_maintenance(&env, &env.node_name(0)).await?;
    let m = wait_admitted(&env, &first, TIMEOUT).await?;
    let by = m.status.and_then(|s| s.admission).map(|a| a.admitted_by);
    assert_eq!(by.as_deref(), Some(leader.as_str()));
    let second = create_maintenance(&env, &env.node_name(1)).await?;
    wait_denied(&env, &second, "BudgetExhausted").await?;

    // Kill the leader without letting it release the Lease; free the slot it gave.
    let killed = coordinators.get(&leader).context("leader process")?;
    killed.signal(Signal::SIGKILL)?;
    let started = Instant::now();
    finish(&env, &first).await?;
    let m = wait_admitted(&env, &second, LEASE + Duration::from_secs(10)).await?;
    let took = started.elapsed();
    let by = m.status.and_then(|s| s.admission).map(|a| a.admitted_by);
    assert_eq!(by.as_deref(), Some(follower), "the follower took over");
    assert!(
        took <= LEASE + Duration::from_secs(5),
        "took over after {took:?}, lease {LEASE:?}"
    );
    eprintln!("failover: next admission {took:?} after the leader was killed (lease {LEASE:?})");
    let h = history.lock().expect("history").clone();
    assert!(
        h.max_active <= 1,
        "no double admission: saw {}",
        h.max_active
    );

    // A leader stopped with SIGTERM releases the Lease: the other takes over at once.
    let mut new_leader = coordinators.remove(follower).context("follower process")?;
    let restarted = start(&env, &leader, &[]).await?;
    restarted.wait_ready(TIMEOUT).await?;
    new_leader.signal(Signal::SIGTERM)?;
    let status = new_leader.wait_exit(Duration::from_secs(10)).await?;
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    // The controller and the election ended between writes, not aborted.
    let output = new_leader.output();
    assert!(daemon::stopped_between_writes(&output), "{output}");
    let released = Instant::now();
    wait::eventually("the restarted coordinator to lead", TIMEOUT, || async {
        Ok((lease_holder(&env).await?.as_deref() == Some(leader.as_str())).then_some(()))
    })
    .await?;
    assert!(
        released.elapsed() < LEASE,
        "a released Lease is taken at once, took {:?}",
        released.elapsed()
    );
    env.cleanup().await
}

#[tokio::test]
async fn a_control_plane_node_is_not_disrupted_while_another_is_not_ready() -> anyhow::Result<()> {
    let env = scenario(
        "quorum",
        &[
            NodeSpec::control_plane("a"),
            NodeSpec::control_plane("b"),
            NodeSpec::worker("a"),
            NodeSpec::worker("b"),
        ],
    )
    .await?;
    // A third control-plane node that never becomes Ready (no kwok to run it).
    let not_ready = env.node_name(9);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": not_ready, "labels": {
            TEST_LABEL: env.id, "node-role.kubernetes.io/control-plane": "",
        }},
    }))?;
    env.nodes().create(&PostParams::default(), &node).await?;
    env.create_policy("all", json!({"maxConcurrent": 3}))
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;

    let cp = create_maintenance(&env, &env.node_name(0)).await?;
    let worker = create_maintenance(&env, &env.node_name(2)).await?;
    let message = wait_denied(&env, &cp, "QuorumProtected").await?;
    // Names a NotReady control-plane node (this test's, or one a failed earlier run left).
    assert!(message.contains("is NotReady"), "{message}");
    let _ = &not_ready;
    wait_admitted(&env, &worker, TIMEOUT).await?;
    let m = Api::<NodeMaintenance>::all(env.client.clone())
        .get(&cp)
        .await?;
    assert_eq!(m.phase(), MaintenancePhase::Pending);
    // An Event tells why.
    env.wait_event(&cp, "", "QuorumProtected").await?;
    env.cleanup().await
}

#[tokio::test]
async fn a_reasons_budget_holds_that_reason_while_others_use_the_rest_of_max_concurrent()
-> anyhow::Result<()> {
    let env = scenario("by-reason", &vec![NodeSpec::worker("a"); 3]).await?;
    let (a, b, c) = (env.node_name(0), env.node_name(1), env.node_name(2));
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 2, "maxConcurrentByReason": {"Remediation": 1}}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;

    // One repair takes the repairs' budget: the next waits, saying so.
    env.create_maintenance("a-repair", &a, "Remediation", "DrainOnly")
        .await?;
    wait_admitted(&env, "a-repair", TIMEOUT).await?;
    env.create_maintenance("b-repair", &b, "Remediation", "DrainOnly")
        .await?;
    let denied = wait_denied(&env, "b-repair", "BudgetExhausted").await?;
    assert!(
        denied.contains(&format!(
            "allows 1 Remediation maintenances at once and has 1 ({a})"
        )),
        "{denied}"
    );
    // An admin's maintenance takes the rest of maxConcurrent meanwhile.
    env.create_maintenance("c-manual", &c, "Manual", "DrainOnly")
        .await?;
    wait_admitted(&env, "c-manual", TIMEOUT).await?;
    // The first repair done, the second goes (with the admin's, two at once).
    finish(&env, "a-repair").await?;
    wait_admitted(&env, "b-repair", TIMEOUT).await?;
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn a_node_another_actor_disrupts_holds_a_slot_and_the_next_maintenance_waits()
-> anyhow::Result<()> {
    let env = scenario("others", &vec![NodeSpec::worker("a"); 3]).await?;
    let (a, b, c) = (env.node_name(0), env.node_name(1), env.node_name(2));
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let taint = |key: &str| json!({"spec": {"taints": [{"key": key, "effect": "NoSchedule"}]}});

    // The cluster autoscaler is removing a: the one slot is taken, and said by whom. The
    // maintenance is asked for once the coordinator has seen the taint (its policy lists it):
    // the Node and the NodeMaintenance come through separate watches, so asked for at once,
    // it may be decided before the taint is seen.
    env.merge_node(&a, taint("ToBeDeletedByClusterAutoscaler"))
        .await?;
    let listed = wait_listed(&policies, &policy, &a, "cluster-autoscaler").await?;
    assert_eq!(listed.disrupted_by_others, 1);
    assert_eq!(listed.other_disruptions.len(), 1);
    let waiting = create_maintenance(&env, &b).await?;
    let denied = wait_denied(&env, &waiting, "BudgetExhausted").await?;
    assert!(
        denied.contains(&format!(
            "{a} (cluster-autoscaler (taint ToBeDeletedByClusterAutoscaler))"
        )),
        "{denied}"
    );

    // Then Karpenter, then an admin's cordon: each holds it in turn, as the policy says (a
    // waiting maintenance's message follows such changes only every 30 s).
    for (patch, by) in [
        (
            taint("karpenter.sh/disrupted"),
            "karpenter (taint karpenter.sh/disrupted)",
        ),
        (
            json!({"spec": {"taints": null, "unschedulable": true}}),
            "cordoned by someone else",
        ),
    ] {
        env.merge_node(&a, patch).await?;
        let listed = wait_listed(&policies, &policy, &a, by).await?;
        assert!(listed.other_disruptions.iter().any(|o| o.by == by), "{by}");
        let still = maintenances.get(&waiting).await?;
        assert_eq!(still.phase(), MaintenancePhase::Pending, "{by}");
    }

    // Back in service: the next one goes.
    env.merge_node(&a, json!({"spec": {"unschedulable": null}}))
        .await?;
    wait_admitted(&env, &waiting, TIMEOUT).await?;
    finish(&env, &waiting).await?;
    // A node an admin cordoned before asking for its own maintenance takes no other's slot
    // (asked for once the coordinator counts the cordon, so that it is the case tested).
    env.merge_node(&c, json!({"spec": {"unschedulable": true}}))
        .await?;
    wait_listed(&policies, &policy, &c, "cordoned by someone else").await?;
    let own = create_maintenance(&env, &c).await?;
    wait_admitted(&env, &own, TIMEOUT).await?;
    finish(&env, &own).await?;
    env.cleanup_after(coordinator).await
}

/// Waits until `policy`'s status lists `node` as disrupted by an actor whose description
/// starts with `by`, and returns that status.
async fn wait_listed(
    policies: &Api<DisruptionPolicy>,
    policy: &str,
    node: &str,
    by: &str,
) -> anyhow::Result<nodeward_api::DisruptionPolicyStatus> {
    wait::until_some(
        policies,
        policy,
        &format!("the policy listing {node} as disrupted by {by}"),
        TIMEOUT,
        |p| {
            let status = p.status.as_ref()?;
            status
                .other_disruptions
                .iter()
                .any(|o| o.node_name == node && o.by.starts_with(by))
                .then(|| status.clone())
        },
    )
    .await
}
