//! Pause acknowledged by every agent in scope, reboot blockers (pods, Prometheus alerts), and
//! a rollout halted by its failure budget until it is resumed.

use super::*;

#[tokio::test]
async fn paused_appears_only_after_every_agent_in_scope_acknowledged() -> anyhow::Result<()> {
    let env = scenario("pause", &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 2, "paused": true}))
        .await?;
    report_ack(&env, &n0, &policy, None).await?;
    report_ack(&env, &n1, &policy, None).await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let generation = policies
        .get(&policy)
        .await?
        .metadata
        .generation
        .context("generation")?;

    let pending = create_maintenance(&env, &n0).await?;
    wait_denied(&env, &pending, "Paused").await?;
    let paused = |status: &'static str, mentions: Option<String>| {
        let policies = policies.clone();
        let policy = policy.clone();
        async move {
            wait::until(
                &policies,
                &policy,
                &format!("Paused={status}"),
                TIMEOUT,
                |p| {
                    p.and_then(|p| policy_condition(p, "Paused"))
                        .is_some_and(|c| {
                            c.0 == status
                                && mentions.as_ref().is_none_or(|m| c.2.contains(m.as_str()))
                        })
                },
            )
            .await
        }
    };
    paused("False", Some(n0.clone())).await?;

    // Once n0 acknowledged, only n1 is waited for (the wait fails if n0 stays named).
    report_ack(&env, &n0, &policy, Some(generation)).await?;
    wait::until(
        &policies,
        &policy,
        "Paused=False waiting for n1 only",
        TIMEOUT,
        |p| {
            p.and_then(|p| policy_condition(p, "Paused"))
                .is_some_and(|c| c.0 == "False" && c.2.contains(&n1) && !c.2.contains(&n0))
        },
    )
    .await?;

    report_ack(&env, &n1, &policy, Some(generation)).await?;
    paused("True", None).await?;

    // Unpausing clears it and admission resumes.
    env.merge_policy_spec(&policy, json!({"paused": false}))
        .await?;
    paused("False", None).await?;
    wait_admitted(&env, &pending, TIMEOUT).await?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    for node in [&n0, &n1] {
        reports.delete(node, &DeleteParams::default()).await?;
    }
    env.cleanup().await
}

/// Reboot blockers, against a stand-in for the Prometheus HTTP API (`GET /api/v1/alerts`,
/// Prometheus itself does not run here): a firing alert blocks the policy's scope, an
/// ignored or pending one does not, an unreachable Prometheus blocks; a pod matching a
/// blocking selector holds its node back until it is gone.
/// A tenant who may create pods cannot hold reboots by labelling one like a blocker: blockers
/// scoped to trusted namespaces ignore pods elsewhere.
#[tokio::test]
async fn a_tenants_pod_outside_the_blockers_namespaces_holds_no_reboot() -> anyhow::Result<()> {
    let env = scenario("tenant", &[NodeSpec::worker("a"), NodeSpec::worker("b")]).await?;
    let trusted = format!("{}-trusted", env.id);
    let policy = env
        .create_policy(
            "tenant",
            json!({"maxConcurrent": 2, "rebootBlockers": {
                "podSelectors": [{"matchLabels": {"e2e-blocks-reboot": "true"}}],
                "namespaceSelector": {"matchLabels": {"e2e.nodeward.io/trusted": trusted}},
            }}),
        )
        .await?;
    let labels = BTreeMap::from([("e2e-blocks-reboot".to_owned(), "true".to_owned())]);
    let options = nodeward_e2e::PodOptions {
        labels,
        ..Default::default()
    };
    // The tenant's pod (the test namespace is not trusted) on the first node.
    env.replicaset("tenant", &env.node_name(0), 1, &options)
        .await?;
    env.running_pods("tenant", 1).await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let first = create_maintenance(&env, &env.node_name(0)).await?;
    wait_admitted(&env, &first, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;

    // The same pod in a trusted namespace blocks the second node, and is named.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    namespaces
        .patch(
            &env.namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e.nodeward.io/trusted": trusted}}})),
        )
        .await?;
    env.replicaset("batch", &env.node_name(1), 1, &options)
        .await?;
    let pod = env.running_pods("batch", 1).await?.remove(0);
    let second = create_maintenance(&env, &env.node_name(1)).await?;
    let message = wait_denied(&env, &second, "Blocked").await?;
    assert!(
        message.contains(&format!(
            "pod {}/{} matches rebootBlockers.podSelectors[0] of policy {policy}",
            env.namespace,
            pod.name_any()
        )),
        "{message}"
    );
    env.cleanup().await
}

#[tokio::test]
async fn reboot_blockers_hold_nodes_back_and_say_why() -> anyhow::Result<()> {
    let env = scenario("blockers", &[NodeSpec::worker("a"), NodeSpec::worker("b")]).await?;
    let prometheus = nodeward_e2e::http::Endpoint::start().await?;
    prometheus.reply(
        "/api/v1/alerts",
        200,
        &alerts(&[
            ("KernelUpgradeInProgress", "firing"),
            ("Watchdog", "firing"),
        ]),
    );
    let policy = env
        .create_policy(
            "blockers",
            json!({"maxConcurrent": 2, "rebootBlockers": {
                "podSelectors": [{"matchLabels": {"e2e-blocks-reboot": "true"}}],
                "prometheus": {"url": prometheus.url, "ignoreAlerts": "^Watchdog$"},
            }}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;

    let first = create_maintenance(&env, &env.node_name(0)).await?;
    let message = wait_denied(&env, &first, "Blocked").await?;
    assert!(
        message
            .contains("firing alerts KernelUpgradeInProgress (rebootBlockers.prometheus of policy")
            && message.contains(&policy)
            && !message.contains("Watchdog"),
        "{message}"
    );
    assert!(
        prometheus
            .received()
            .iter()
            .any(|r| r.method == "GET" && r.path == "/api/v1/alerts"),
        "the coordinator asked Prometheus"
    );

    // A pod matching the selector on the second node: named, before any alert.
    let labels = BTreeMap::from([("e2e-blocks-reboot".to_owned(), "true".to_owned())]);
    env.replicaset(
        "batch",
        &env.node_name(1),
        1,
        &nodeward_e2e::PodOptions {
            labels,
            ..Default::default()
        },
    )
    .await?;
    let pod = env.running_pods("batch", 1).await?.remove(0);
    let second = create_maintenance(&env, &env.node_name(1)).await?;
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let wanted = format!(
        "pod {}/{} matches rebootBlockers.podSelectors[0] of policy {policy}",
        env.namespace,
        pod.name_any()
    );
    wait::until(&api, &second, "blocked by the pod", TIMEOUT, |m| {
        m.and_then(admitted_condition)
            .is_some_and(|(_, reason, message)| reason == "Blocked" && message.contains(&wanted))
    })
    .await
    .with_context(|| coordinator.output())?;

    // Prometheus failing blocks too, and says so.
    prometheus.reply("/api/v1/alerts", 503, "service unavailable");
    wait::until(&api, &first, "blocked by the failed check", TIMEOUT, |m| {
        m.and_then(admitted_condition)
            .is_some_and(|(_, reason, message)| {
                reason == "Blocked"
                    && message.contains("cannot check rebootBlockers.prometheus")
                    && message.contains("503")
            })
    })
    .await
    .with_context(|| coordinator.output())?;

    // Only ignored and pending alerts left: the first goes; the second waits for its pod.
    prometheus.reply(
        "/api/v1/alerts",
        200,
        &alerts(&[
            ("Watchdog", "firing"),
            ("KernelUpgradeInProgress", "pending"),
        ]),
    );
    wait_admitted(&env, &first, TIMEOUT).await?;
    assert_eq!(api.get(&second).await?.phase(), MaintenancePhase::Pending);
    Api::<k8s_openapi::api::apps::v1::ReplicaSet>::namespaced(env.client.clone(), &env.namespace)
        .delete("batch", &DeleteParams::foreground())
        .await?;
    wait_admitted(&env, &second, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    // An Event tells why.
    env.wait_event(&second, "", "Blocked").await?;
    env.cleanup().await
}

#[tokio::test]
async fn a_pause_is_not_reported_while_a_maintenance_admitted_before_it_will_still_drain()
-> anyhow::Result<()> {
    let env = scenario("pause-admitted", &[NodeSpec::worker("a")]).await?;
    let n0 = env.node_name(0);
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    report_ack(&env, &n0, &policy, None).await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let admitted = create_maintenance(&env, &n0).await?;
    wait_admitted(&env, &admitted, TIMEOUT).await?;

    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let generation = env
        .merge_policy_spec(&policy, json!({"paused": true}))
        .await?;
    report_ack(&env, &n0, &policy, Some(generation)).await?;
    // Every agent acknowledged, but the admitted maintenance's agent starts it regardless.
    wait::until(
        &policies,
        &policy,
        "Paused=False for the admitted maintenance",
        TIMEOUT,
        |p| {
            p.and_then(|p| policy_condition(p, "Paused"))
                .is_some_and(|c| {
                    c.0 == "False"
                        && c.2.contains("waiting for 0 agent(s)")
                        && c.2
                            .contains("1 maintenance(s) admitted, draining or acting")
                })
        },
    )
    .await
    .with_context(|| coordinator.output())?;
    // It ends (as its agent would end it): now nothing in scope is disrupted.
    env.merge_maintenance_status(&admitted, json!({"phase": "Succeeded"}))
        .await?;
    wait::until(&policies, &policy, "Paused=True", TIMEOUT, |p| {
        p.and_then(|p| policy_condition(p, "Paused"))
            .is_some_and(|c| c.0 == "True")
    })
    .await
    .with_context(|| coordinator.output())?;
    env.cleanup_after(coordinator).await
}

/// Plays an agent whose maintenance went wrong: marks it Failed, saying why.
async fn fail(env: &TestEnv, name: &str, why: &str) -> anyhow::Result<()> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Failed",
            "finishedAt": jiff::Timestamp::now().to_string(),
            "message": why,
        }})),
    )
    .await
    .with_context(|| format!("failing {name}"))?;
    Ok(())
}

#[tokio::test]
async fn a_rollout_halts_once_its_failure_budget_is_spent_and_goes_on_when_resumed()
-> anyhow::Result<()> {
    let env = scenario("halt", &vec![NodeSpec::worker("a"); 3]).await?;
    let (n0, n1, n2) = (env.node_name(0), env.node_name(1), env.node_name(2));
    let policy = env
        .create_policy(
            "pool",
            json!({"maxConcurrent": 1, "failureBudget": {"maxFailures": 2, "window": "1h"}}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());

    // Two nodes fail in turn: the first leaves the budget one failure short.
    let first = create_maintenance(&env, &n0).await?;
    wait_admitted(&env, &first, TIMEOUT).await?;
    fail(&env, &first, "the health gate never passed: KernelDeadlock").await?;
    wait::until(&policies, &policy, "one failure counted", TIMEOUT, |p| {
        p.and_then(|p| policy_condition(p, "Halted"))
            .is_some_and(|(status, reason, message)| {
                status == "False"
                    && reason == "WithinFailureBudget"
                    && message.starts_with("1 of maxFailures 2 failed within 1h")
            })
    })
    .await?;
    let second = create_maintenance(&env, &n1).await?;
    wait_admitted(&env, &second, TIMEOUT).await?;
    fail(&env, &second, "drain timed out").await?;

    // Halted: the condition names both, an Event says so, and the next node waits.
    let halted = wait::until(&policies, &policy, "Halted=True", TIMEOUT, |p| {
        p.and_then(|p| policy_condition(p, "Halted"))
            .is_some_and(|(status, _, _)| status == "True")
    })
    .await?
    .context("the policy")?;
    let (_, reason, message) = policy_condition(&halted, "Halted").context("Halted")?;
    assert_eq!(reason, "FailureBudgetSpent");
    for named in [
        format!("{n1} ({second}): drain timed out"),
        format!("{n0} ({first}): the health gate never passed"),
    ] {
        assert!(message.contains(&named), "{named} in {message}");
    }
    env.wait_event(&policy, "", "RolloutHalted").await?;
    let third = create_maintenance(&env, &n2).await?;
    let denied = wait_denied(&env, &third, "RolloutHalted").await?;
    assert!(
        denied.contains(&format!("policy {policy} is halted"))
            && denied.contains(&format!("kubectl nodeward resume {policy}")),
        "{denied}"
    );

    // Resumed by the operator's tool: the failures so far are forgiven, the next node goes.
    let said = resume(&policy).await?;
    assert!(
        said.contains("failures its failureBudget counted until now are forgiven"),
        "{said}"
    );
    let resumed = policies.get(&policy).await?;
    assert!(
        resumed
            .spec
            .failure_budget
            .and_then(|b| b.count_since)
            .is_some(),
        "the resume moved countSince"
    );
    wait_admitted(&env, &third, TIMEOUT).await?;
    let halt = policies.get(&policy).await?;
    assert_eq!(
        policy_condition(&halt, "Halted").map(|(status, reason, _)| (status, reason)),
        Some(("False".to_owned(), "WithinFailureBudget".to_owned()))
    );
    env.wait_event(&policy, "", "RolloutResumed").await?;
    env.cleanup_after(coordinator).await
}
