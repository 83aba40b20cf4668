//! The coordinator's own clock: what the agent writes into a maintenance's status moves no
//! deadline, so one node's identity cannot hold a budget slot for as long as it likes. Its
//! phase history and start time it may no longer rewrite at all (`phases.rs`); what it may
//! write while Draining, its drain progress, it writes here as often as it likes.

use super::*;

#[tokio::test]
async fn an_agent_reporting_drain_progress_cannot_hold_its_slot_past_the_drain_deadline()
-> anyhow::Result<()> {
    let (env, dir, documents, node, agent) = chart_and_agent_alone("clock").await?;
    env.heartbeats(std::slice::from_ref(&node)).await?;
    // A policy over the test's nodes with the shortest drain backstop there is.
    env.create_policy(
        "backstop",
        json!({"maxConcurrent": 1, "deadlines": {"drain": "1m"}}),
    )
    .await?;
    let webhook =
        EvictionWebhook::serving(&env, &dir, &documents, &["--leader-elect=false"]).await?;

    let name = format!("{}-held", env.id);
    env.create_maintenance(&name, &node, "Manual", "DrainOnly")
        .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    wait::phase(
        &maintenances,
        &name,
        MaintenancePhase::Admitted,
        Duration::from_secs(60),
    )
    .await
    .with_context(|| webhook.coordinator.output())?;
    let as_agent: Api<NodeMaintenance> = Api::all(agent);
    as_agent
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Draining"}})),
        )
        .await?;
    let draining = std::time::Instant::now();

    // Its history and start time are not the agent's to rewrite.
    let now = jiff::Timestamp::now().to_string();
    let rewrite = json!({"status": {
        "history": [{"phase": "Admitted", "time": now}, {"phase": "Draining", "time": now}],
        "startedAt": now}});
    let said = refusal(
        as_agent
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(rewrite))
            .await,
    );
    assert!(said.starts_with("403"), "{said}");

    // The attack: every 3 s the agent reports progress (one pod fewer, one more, ...): a live,
    // busy drain as far as anything it writes says.
    let mut reports = 0;
    let failed = loop {
        let current = maintenances.get(&name).await?;
        if current.phase() == MaintenancePhase::Failed {
            break current;
        }
        anyhow::ensure!(
            draining.elapsed() < Duration::from_secs(180),
            "still {:?} after {:?}: the agent's progress held it\n{}",
            current.phase(),
            draining.elapsed(),
            webhook.coordinator.output()
        );
        let progress = json!({"status": {"podsTotal": 10, "podsRemaining": 5 + reports % 2}});
        as_agent
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(progress))
            .await
            .context("the agent's progress report")?;
        reports += 1;
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    let took = draining.elapsed();
    let message = failed.message().to_owned();
    assert!(
        message.contains("within 60s (deadlines.drain)"),
        "{message}\n{}",
        webhook.coordinator.output()
    );
    assert!(
        took >= Duration::from_secs(55) && reports >= 10,
        "failed after {took:?} and {reports} progress reports: not on the drain deadline"
    );
    println!(
        "a maintenance held Draining by {reports} progress reports failed {:.0} s after it began draining (deadlines.drain 60 s)",
        took.as_secs_f64()
    );
    drop(webhook);
    remove_chart(env, &documents).await
}
