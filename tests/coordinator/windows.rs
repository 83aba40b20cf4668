//! Maintenance windows through the real API server: a request outside its policy's window is
//! denied `OutsideWindow` (the window read in its own time zone), and admitted once a window
//! that is open now is configured; a blackout denies `InBlackout` until it is over; an urgent
//! one is admitted outside the window, and still never past a full budget.

use super::*;

/// `HH:MM` in `zone`, `hours` from now.
fn clock(zone: &str, hours: i64) -> anyhow::Result<String> {
    let at = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(hours))?
        .in_tz(zone)?;
    Ok(format!("{:02}:{:02}", at.hour(), at.minute()))
}

#[tokio::test]
async fn a_request_outside_its_window_is_denied_and_admitted_once_a_window_opens()
-> anyhow::Result<()> {
    let env = scenario("windows", &[NodeSpec::worker("a")]).await?;
    let zone = "Asia/Tokyo";
    // Opens in two hours and closes in three, in Tokyo's time.
    let closed = json!([{"start": clock(zone, 2)?, "end": clock(zone, 3)?, "timeZone": zone}]);
    let policy = env
        .create_policy("windows", json!({"maxConcurrent": 1, "windows": closed}))
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = create_maintenance(&env, &env.node_name(0)).await?;
    let message = wait_denied(&env, &name, "OutsideWindow")
        .await
        .with_context(|| coordinator.output())?;
    assert!(
        message.contains(&format!(
            "policy {policy} has no maintenance window open now; the next opens at "
        )),
        "{message}"
    );

    // Open from an hour ago to an hour from now: admitted.
    let open = json!([{"start": clock(zone, -1)?, "end": clock(zone, 1)?, "timeZone": zone}]);
    env.merge_policy_spec(&policy, json!({"windows": open}))
        .await?;
    admitted_then_clean_up(env, &name, coordinator).await
}

#[tokio::test]
async fn a_blackout_denies_whatever_the_windows_say_and_admits_once_it_is_over()
-> anyhow::Result<()> {
    let env = scenario("blackout", &[NodeSpec::worker("a")]).await?;
    let now = jiff::Timestamp::now();
    let from_now = |minutes: i64| -> anyhow::Result<String> {
        Ok(now
            .checked_add(jiff::SignedDuration::from_mins(minutes))?
            .to_string())
    };
    // A window open all day, and a freeze from an hour ago until tomorrow.
    let policy = env
        .create_policy(
            "freeze",
            json!({"maxConcurrent": 1, "windows": [{"start": "00:00", "end": "23:59"}],
                "blackouts": [{"start": from_now(-60)?, "end": from_now(24 * 60)?, "reason": "year-end freeze"}]}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = create_maintenance(&env, &env.node_name(0)).await?;
    let message = wait_denied(&env, &name, "InBlackout")
        .await
        .with_context(|| coordinator.output())?;
    assert!(
        message.contains(&format!(
            "policy {policy} is in a blackout (year-end freeze) until "
        )),
        "{message}"
    );

    // The freeze ended a minute ago: admitted.
    let over = json!([{"start": from_now(-60)?, "end": from_now(-1)?}]);
    env.merge_policy_spec(&policy, json!({"blackouts": over}))
        .await?;
    admitted_then_clean_up(env, &name, coordinator).await
}

#[tokio::test]
async fn an_urgent_request_passes_a_closed_window_and_a_blocker_but_never_a_full_budget()
-> anyhow::Result<()> {
    let workers = [
        NodeSpec::worker("a"),
        NodeSpec::worker("b"),
        NodeSpec::worker("c"),
    ];
    let env = scenario("urgent", &workers).await?;
    let zone = "UTC";
    let closed = json!([{"start": clock(zone, 2)?, "end": clock(zone, 3)?, "timeZone": zone}]);
    let blockers = json!({"podSelectors": [{"matchLabels": {"e2e-blocks-reboot": "true"}}]});
    env.create_policy(
        "urgent",
        json!({"maxConcurrent": 1, "windows": closed, "rebootBlockers": blockers}),
    )
    .await?;
    // A pod that blocks reboots on the node the urgent one is for.
    let options = nodeward_e2e::PodOptions {
        labels: [("e2e-blocks-reboot".to_owned(), "true".to_owned())].into(),
        ..Default::default()
    };
    env.replicaset("blocker", &env.node_name(1), 1, &options)
        .await?;
    env.running_pods("blocker", 1).await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let planned = create_maintenance(&env, &env.node_name(0)).await?;
    wait_denied(&env, &planned, "OutsideWindow")
        .await
        .with_context(|| coordinator.output())?;

    // An operator marks the next one urgent: admitted though its window is closed and a pod
    // blocks its reboot, the older one still waiting.
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let urgent = |name: String| async {
        maintenances
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"urgent": true}})),
            )
            .await?;
        anyhow::Ok(name)
    };
    let first = urgent(create_maintenance(&env, &env.node_name(1)).await?).await?;
    wait_admitted(&env, &first, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    let second = urgent(create_maintenance(&env, &env.node_name(2)).await?).await?;
    let message = wait_denied(&env, &second, "BudgetExhausted")
        .await
        .with_context(|| coordinator.output())?;
    assert!(message.contains(&env.node_name(1)), "{message}");
    let waiting = maintenances.get(&planned).await?;
    assert_eq!(waiting.phase(), MaintenancePhase::Pending);
    env.cleanup_after(coordinator).await
}
