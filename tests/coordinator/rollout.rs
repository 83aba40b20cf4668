//! A patch rollout: the canary stage (the first nodes go alone, the rest wait for their
//! success and the soak; a failed canary halts the rollout, and after the resume a new canary
//! goes first again), and the policy's progress counts.

use super::*;

/// Creates a planned reboot (reason Manual, action Reboot) `<node>-<suffix>` of `node`.
async fn planned_reboot(env: &TestEnv, node: &str, suffix: &str) -> anyhow::Result<String> {
    let name = format!("{node}-{suffix}");
    env.create_maintenance(&name, node, "Manual", "Reboot")
        .await?;
    Ok(name)
}

/// Waits until `policy`'s `CanaryPassed` condition has `status`; returns its message.
async fn canary_passed(env: &TestEnv, policy: &str, status: &str) -> anyhow::Result<String> {
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let found = wait::until(
        &policies,
        policy,
        &format!("CanaryPassed={status}"),
        TIMEOUT,
        |p| {
            p.and_then(|p| policy_condition(p, "CanaryPassed"))
                .is_some_and(|(s, _, _)| s == status)
        },
    )
    .await?
    .context("the policy")?;
    Ok(policy_condition(&found, "CanaryPassed")
        .map(|c| c.2)
        .unwrap_or_default())
}

#[tokio::test]
async fn the_first_node_goes_alone_and_the_rest_wait_for_its_success_and_the_soak()
-> anyhow::Result<()> {
    let env = scenario("canary", &vec![NodeSpec::worker("a"); 4]).await?;
    let nodes: Vec<String> = (0..4).map(|i| env.node_name(i)).collect();
    let policy = env
        .create_policy(
            "pool",
            json!({
                "maxConcurrent": 2,
                "canary": {"nodes": 1, "soak": "8s"},
                "failureBudget": {"maxFailures": 1},
            }),
        )
        .await?;
    // One at a time, so that the first is the oldest: admission goes oldest first.
    let mut reboots = Vec::new();
    for node in &nodes {
        reboots.push(planned_reboot(&env, node, "patch").await?);
    }
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;

    // The oldest goes as the canary; the rest are told whom they wait for, though the budget
    // has room for one more.
    wait_admitted(&env, &reboots[0], TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    for waiting in &reboots[1..] {
        let why = wait_denied(&env, waiting, "CanaryPending").await?;
        assert!(
            why.contains(&format!(
                "policy {policy}: the first 1 planned reboots are canaries: 0 of 1 succeeded"
            )) && why.contains(&format!("under way: {}", nodes[0])),
            "{why}"
        );
    }
    let held = canary_passed(&env, &policy, "False").await?;
    assert!(held.contains("0 of 1 succeeded"), "{held}");

    // The canary succeeds: the rest wait out the soak, and are told until when.
    finish(&env, &reboots[0]).await?;
    let succeeded = jiff::Timestamp::now();
    let soaking = wait_denied_saying(
        &env,
        &reboots[1],
        "CanaryPending",
        "the rest wait for canary.soak 8s until",
    )
    .await
    .with_context(|| coordinator.output())?;
    assert!(soaking.contains("1 succeeded"), "{soaking}");

    // After the soak, the rest go under the budget: two at a time.
    let admitted = wait_admitted(&env, &reboots[1], TIMEOUT).await?;
    let admitted_at = admitted
        .status
        .as_ref()
        .and_then(|s| s.admission.as_ref())
        .map(|a| a.admitted_at.0)
        .context("an admission record")?;
    assert!(
        admitted_at >= succeeded + jiff::SignedDuration::from_secs(7),
        "admitted at {admitted_at}, before the soak of 8 s after {succeeded} was over"
    );
    wait_admitted(&env, &reboots[2], TIMEOUT).await?;
    let third = wait_denied(&env, &reboots[3], "BudgetExhausted").await?;
    assert!(third.contains("allows 2 disrupted nodes"), "{third}");
    let passed = canary_passed(&env, &policy, "True").await?;
    assert!(passed.contains("the rest of the scope may go"), "{passed}");
    env.wait_event(&policy, "", "CanaryPassed").await?;
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn a_failed_canary_halts_the_rollout_and_after_the_resume_a_new_canary_goes_first()
-> anyhow::Result<()> {
    let specs = [
        NodeSpec::worker("a").label("example.com/canary", "true"),
        NodeSpec::worker("a"),
        NodeSpec::worker("a"),
    ];
    let env = scenario("canary-halt", &specs).await?;
    let (canary, n1, n2) = (env.node_name(0), env.node_name(1), env.node_name(2));
    let policy = env
        .create_policy(
            "pool",
            json!({
                "maxConcurrent": 2,
                "canary": {"nodeSelector": {"matchLabels": {"example.com/canary": "true"}}},
                "failureBudget": {"maxFailures": 1},
            }),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;

    // The rest's requests come first; no canary has one yet.
    let first = planned_reboot(&env, &n1, "v3").await?;
    let why = wait_denied(&env, &first, "CanaryPending").await?;
    assert!(
        why.contains("the canaries are the 1 nodes canary.nodeSelector selects: 0 of 1 succeeded")
            && why.contains("give a canary a planned reboot"),
        "{why}"
    );
    // The canary's request goes first, and the rest wait for it by name.
    let bad = planned_reboot(&env, &canary, "v3").await?;
    wait_admitted(&env, &bad, TIMEOUT).await?;
    let why = wait_denied_saying(
        &env,
        &first,
        "CanaryPending",
        &format!("waiting for {canary}"),
    )
    .await?;
    assert!(
        why.starts_with(&format!("policy {policy}: canaries go first")),
        "{why}"
    );

    // The canary fails: the rollout halts on it, and nothing else in scope goes.
    env.merge_maintenance_status(
        &bad,
        json!({"phase": "Failed", "finishedAt": jiff::Timestamp::now().to_string(),
            "message": "RolledBack: the health gate failed after the update"}),
    )
    .await?;
    let halted = wait_denied(&env, &first, "RolloutHalted").await?;
    assert!(
        halted.contains(&format!("{canary} ({bad}, a canary): RolledBack")),
        "{halted}"
    );
    let second = planned_reboot(&env, &n2, "v3").await?;
    wait_denied(&env, &second, "RolloutHalted").await?;

    // Resumed: the rest still wait, for a canary of the fixed update.
    resume(&policy).await?;
    let why = wait_denied(&env, &first, "CanaryPending").await?;
    assert!(why.contains("0 of 1 succeeded"), "{why}");
    let good = planned_reboot(&env, &canary, "v4").await?;
    wait_admitted(&env, &good, TIMEOUT).await?;
    finish(&env, &good).await?;
    wait_admitted(&env, &first, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    wait_admitted(&env, &second, TIMEOUT).await?;
    canary_passed(&env, &policy, "True").await?;
    env.cleanup_after(coordinator).await
}

/// Waits until `policy`'s progress is `(updated, in progress, pending, failed)`; returns its
/// `Updated` condition's status and message.
async fn progress_is(
    env: &TestEnv,
    policy: &str,
    counts: (i32, i32, i32, i32),
) -> anyhow::Result<(String, String)> {
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let found = wait::until(
        &policies,
        policy,
        &format!("progress {counts:?}"),
        TIMEOUT,
        |p| {
            p.and_then(|p| p.status.as_ref()?.progress.as_ref())
                .is_some_and(|g| (g.updated, g.in_progress, g.pending, g.failed) == counts)
        },
    )
    .await?
    .context("the policy")?;
    let (status, _, message) = policy_condition(&found, "Updated").context("Updated")?;
    Ok((status, message))
}

#[tokio::test]
async fn the_progress_counts_each_node_once_and_says_when_all_are_updated() -> anyhow::Result<()> {
    let env = scenario("progress", &vec![NodeSpec::worker("a"); 4]).await?;
    let nodes: Vec<String> = (0..4).map(|i| env.node_name(i)).collect();
    let policy = env
        .create_policy(
            "pool",
            json!({"maxConcurrent": 1, "failureBudget": {"maxFailures": 3}}),
        )
        .await?;
    // n0 and n1 get planned reboots (n0 first, admitted; n1 waits); n2 requires a reboot;
    // n3 has nothing to do.
    let first = planned_reboot(&env, &nodes[0], "patch").await?;
    let second = planned_reboot(&env, &nodes[1], "patch").await?;
    set_condition(
        &env,
        &nodes[2],
        "RebootRequired",
        "True",
        jiff::Timestamp::now(),
    )
    .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    wait_admitted(&env, &first, TIMEOUT).await?;
    let (status, message) = progress_is(&env, &policy, (1, 1, 2, 0))
        .await
        .with_context(|| coordinator.output())?;
    assert_eq!(status, "False");
    assert_eq!(
        message,
        "1 of 4 matched nodes updated; 1 in progress, 2 pending, 0 failed"
    );

    // n0 fails: it is named; n1 goes.
    env.merge_maintenance_status(
        &first,
        json!({"phase": "Failed", "finishedAt": jiff::Timestamp::now().to_string(), "message": "the health gate never passed"}),
    )
    .await?;
    wait_admitted(&env, &second, TIMEOUT).await?;
    let (_, message) = progress_is(&env, &policy, (1, 1, 1, 1)).await?;
    assert!(
        message.ends_with(&format!("1 failed ({})", nodes[0])),
        "{message}"
    );
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let listed = policies.get(&policy).await?;
    let progress = listed.status.and_then(|s| s.progress).context("progress")?;
    assert_eq!(progress.failed_nodes, vec![nodes[0].clone()]);

    // n1 succeeds, n0 is patched again and succeeds, n2 no longer requires a reboot: all
    // updated.
    finish(&env, &second).await?;
    let again = planned_reboot(&env, &nodes[0], "again").await?;
    wait_admitted(&env, &again, TIMEOUT).await?;
    finish(&env, &again).await?;
    set_condition(
        &env,
        &nodes[2],
        "RebootRequired",
        "False",
        jiff::Timestamp::now(),
    )
    .await?;
    let (status, message) = progress_is(&env, &policy, (4, 0, 0, 0)).await?;
    assert_eq!(
        (status.as_str(), message.as_str()),
        ("True", "all 4 matched nodes are updated")
    );
    env.cleanup_after(coordinator).await
}
