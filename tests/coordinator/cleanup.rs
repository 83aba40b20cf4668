//! Finished maintenances deleted after `--finished-maintenance-ttl`, each node's latest and the
//! failures a failure budget counts kept.

use super::*;

/// Ends maintenance `name` in `phase` `ago` before now, admitted under `policy` when given.
async fn finished(
    env: &TestEnv,
    name: &str,
    phase: &str,
    ago: Duration,
    policy: Option<&str>,
) -> anyhow::Result<()> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let at = jiff::Timestamp::now() - jiff::SignedDuration::try_from(ago)?;
    let mut status = json!({"phase": phase, "finishedAt": at.to_string(), "message": "ended"});
    if let Some(policy) = policy {
        status["admission"] = json!({
            "policies": [policy], "admittedAt": at.to_string(), "admittedBy": "e2e",
        });
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .with_context(|| format!("ending {name}"))?;
    Ok(())
}

#[tokio::test]
async fn finished_maintenances_past_the_ttl_are_deleted_but_each_nodes_latest_and_counted_failures_stay()
-> anyhow::Result<()> {
    let env = scenario("ttl", &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    let policy = env
        .create_policy(
            "pool",
            json!({"maxConcurrent": 1, "failureBudget": {"maxFailures": 5, "window": "24h"}}),
        )
        .await?;
    let hours = |h: u64| Duration::from_secs(h * 3600);
    // (name, node, phase, ended ago, admitted under the policy, deleted)
    let cases = [
        ("old-ok", &n0, "Succeeded", hours(5), false, true),
        ("counted", &n0, "Failed", hours(4), true, false),
        (
            "recent",
            &n0,
            "Succeeded",
            Duration::from_secs(600),
            false,
            false,
        ),
        ("only", &n1, "Cancelled", hours(6), false, false),
        ("older", &n1, "Failed", hours(7), false, true),
    ];
    let mut names = Vec::new();
    for (name, node, phase, ago, admitted, _) in &cases {
        let name = format!("{node}-{name}");
        env.create_maintenance(&name, node, "Manual", "DrainOnly")
            .await?;
        finished(
            &env,
            &name,
            phase,
            *ago,
            admitted.then_some(policy.as_str()),
        )
        .await?;
        names.push(name);
    }
    let coordinator = start(&env, "c1", &["--finished-maintenance-ttl", "1h"]).await?;
    coordinator.wait_ready(TIMEOUT).await?;

    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let expired: Vec<&String> = names
        .iter()
        .zip(&cases)
        .filter_map(|(name, case)| case.5.then_some(name))
        .collect();
    for name in &expired {
        wait::until(&api, name, "deleted past the TTL", TIMEOUT, |m| m.is_none())
            .await
            .with_context(|| coordinator.output())?;
    }
    assert_eq!(
        coordinator
            .metric("nodeward_coordinator_effects_total{effect=\"expire\",outcome=\"written\"}")
            .await?,
        2.0
    );
    // The round that deleted them kept the rest, and so do the rounds after it.
    const FULL_ROUNDS: &str =
        "nodeward_coordinator_decision_duration_seconds_count{round=\"full\"}";
    let rounds = coordinator.metric(FULL_ROUNDS).await?;
    wait::eventually("two more rounds", TIMEOUT, || async {
        let now = coordinator.metric(FULL_ROUNDS).await?;
        Ok((now >= rounds + 2.0).then_some(()))
    })
    .await?;
    for (name, case) in names.iter().zip(&cases).filter(|(_, case)| !case.5) {
        assert!(
            api.get_opt(name).await?.is_some(),
            "{name} ({}) was deleted",
            case.0
        );
    }
    env.cleanup_after(coordinator).await
}
