//! The write verbs (`nodeward_runtime::write`) against the real API server: a NodeMaintenance's
//! conditions written by the agent (one server-side apply per condition type) and by the
//! coordinator (a compare-and-swap of the whole status) survive each other's writes, whatever
//! view each writer had, and so does the agent's drain progress; a swap over a stale view is
//! refused as a conflict.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Api, ResourceExt};
use nodeward_api::{
    NodeMaintenance, StatusPatch,
    conditions::maintenance::{ADMITTED, DRAINED, NODE_RESTORED},
    labels::AGENT_FIELD_MANAGER,
};
use nodeward_e2e::TestEnv;
use nodeward_runtime::write::{self, Outcome, Part};

fn condition(type_: &str, status: &str, reason: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: format!("{type_} {reason}"),
        observed_generation: None,
        last_transition_time: Time(Timestamp::now()),
    }
}

/// The coordinator's way: the whole status, read now, with one condition set, swapped.
async fn coordinator_sets(
    api: &Api<NodeMaintenance>,
    name: &str,
    c: Condition,
) -> anyhow::Result<()> {
    let mut current = api.get(name).await?;
    let status = current.status.get_or_insert_with(Default::default);
    nodeward_api::conditions::set(&mut status.conditions, c);
    write::replace_status(api, &current).await.required()?;
    Ok(())
}

/// The agent's way: one condition applied under its own field manager, whatever it read.
async fn agent_sets(api: &Api<NodeMaintenance>, name: &str, c: Condition) -> anyhow::Result<()> {
    write::apply_condition(api, name, AGENT_FIELD_MANAGER, &c)
        .await
        .required()?;
    Ok(())
}

/// The types and reasons of `name`'s conditions, sorted by type.
async fn conditions(
    api: &Api<NodeMaintenance>,
    name: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut found: Vec<(String, String)> = api
        .get(name)
        .await?
        .conditions()
        .iter()
        .map(|c| (c.type_.clone(), c.reason.clone()))
        .collect();
    found.sort();
    Ok(found)
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(t, r)| ((*t).to_owned(), (*r).to_owned()))
        .collect()
}

#[tokio::test]
async fn the_agents_and_the_coordinators_conditions_survive_each_others_writes()
-> anyhow::Result<()> {
    let env = TestEnv::new("writes").await?;
    let node = env.node_name(0);
    let name = format!("{node}-m");
    env.create_maintenance(&name, &node, "Manual", "DrainOnly")
        .await?;
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    // The agent's view, taken before anything below is written.
    let stale = api.get(&name).await?;

    coordinator_sets(&api, &name, condition(ADMITTED, "True", "Admitted")).await?;
    agent_sets(&api, &name, condition(DRAINED, "True", "Drained")).await?;
    assert_eq!(
        conditions(&api, &name).await?,
        pairs(&[(ADMITTED, "Admitted"), (DRAINED, "Drained")]),
        "the agent's apply over its stale view keeps the coordinator's condition"
    );

    coordinator_sets(&api, &name, condition(ADMITTED, "True", "StillAdmitted")).await?;
    agent_sets(&api, &name, condition(NODE_RESTORED, "True", "Restored")).await?;
    // The drain's progress, applied by the agent as the owner of those fields alone.
    let progress = StatusPatch::progress(3, 1, &[]).evicted(&stale, &[]);
    write::apply(&api, &name, Part::Status, AGENT_FIELD_MANAGER, &progress)
        .await
        .required()?;
    assert_eq!(
        conditions(&api, &name).await?,
        pairs(&[
            (ADMITTED, "StillAdmitted"),
            (DRAINED, "Drained"),
            (NODE_RESTORED, "Restored")
        ]),
        "another condition of the agent's, the coordinator's rewrite and the progress drop none"
    );
    let written = api.get(&name).await?;
    let status = written.status.as_ref().expect("a status");
    assert_eq!(
        (status.pods_total, status.pods_remaining),
        (Some(3), Some(1))
    );

    // A compare-and-swap over the stale view is refused, and writes nothing.
    let moved = StatusPatch::enter(
        &stale,
        nodeward_api::MaintenancePhase::Cancelled,
        "stale",
        Time(Timestamp::now()),
    );
    let swapped = write::swap_status(&api, &stale, &moved).await;
    assert!(matches!(swapped, Outcome::Conflict(_)), "{swapped:?}");
    assert_eq!(api.get(&name).await?.phase(), written.phase());
    assert_eq!(
        api.get(&name).await?.resource_version(),
        written.resource_version()
    );
    env.cleanup().await
}
