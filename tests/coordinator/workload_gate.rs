//! The workload gate between nodes, driven by the workloads themselves: a reboot back and
//! Verifying waits for the ReplicaSet its drain evicted, and the ReplicaSet's change ends the
//! wait though the coordinator's own rounds come only every 10 minutes (its watch of the
//! ReplicaSet wakes a round).

use super::*;

#[tokio::test]
async fn a_workload_back_ends_the_wait_at_once_without_waiting_for_a_resync() -> anyhow::Result<()>
{
    let env = scenario("gate-watch", &[NodeSpec::worker("a")]).await?;
    let node = env.node_name(0);
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    // A ReplicaSet whose pod has nowhere to run: 0 of 1 available.
    let replica_sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(env.client.clone(), &env.namespace);
    let web = serde_json::from_value(web_with_nowhere_to_run())?;
    replica_sets.create(&PostParams::default(), &web).await?;
    let coordinator = start(&env, "c1", &["--resync", "10m"]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = format!("{node}-m");
    env.create_maintenance(&name, &node, "Manual", "Reboot")
        .await?;
    wait_admitted(&env, &name, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;

    // Played as the agent would: drained it, rebooted, back and Verifying.
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let mut history = maintenances
        .get(&name)
        .await?
        .status
        .unwrap_or_default()
        .history;
    for phase in ["Draining", "Acting", "Verifying"] {
        history.push(serde_json::from_value(
            json!({"phase": phase, "time": jiff::Timestamp::now().to_string()}),
        )?);
    }
    let evicted = json!([{"kind": "ReplicaSet", "namespace": env.namespace, "name": "web"}]);
    env.merge_maintenance_status(
        &name,
        json!({"phase": "Verifying", "history": history, "evictedWorkloads": evicted}),
    )
    .await?;
    let gate = |status: &'static str| {
        move |m: Option<&NodeMaintenance>| {
            m.and_then(|m| m.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "WorkloadsAvailable" && c.status == status)
            })
        }
    };
    let waiting = wait::until(
        &maintenances,
        &name,
        "waiting for web",
        TIMEOUT,
        gate("False"),
    )
    .await
    .with_context(|| coordinator.output())?;
    let said = waiting
        .and_then(|m| m.status)
        .map(|s| s.conditions)
        .unwrap_or_default();
    assert!(
        said.iter().any(|c| c.message.contains("0 of 1")),
        "{said:?}"
    );

    // Its owner scales it to nothing: available as asked, and the wait ends with no resync.
    // The deadline is short on purpose: the watch wakes a round within a second; without it
    // only something else changing would (in a run without the watch, once after 12 s).
    replica_sets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await?;
    wait::until(
        &maintenances,
        &name,
        "web available",
        Duration::from_secs(8),
        gate("True"),
    )
    .await
    .with_context(|| coordinator.output())?;
    env.cleanup_after(coordinator).await
}
