//! The status fields of the phase it is in: on a maintenance of its own node the agent writes
//! what the phase it is in gives it (the history by the phase it enters, the start time as the
//! drain begins, the boot id as the action begins, the finish time as it ends, the drain's
//! progress while Draining, the host runs of the phase's steps) and nothing else, so that its
//! own unadmitted request carries no record of a drain or a reboot that never happened.

use super::*;

/// A write the agent tries on its maintenance: what it is, the status merged in, and what the
/// refusal says (`None`: allowed).
type Write = (&'static str, Value, Option<&'static str>);

#[tokio::test]
async fn an_agent_writes_only_the_status_fields_of_the_phase_its_maintenance_is_in()
-> anyhow::Result<()> {
    let (env, _dir, documents) = own_chart("phases").await?;
    let node = env.node_name(0);
    let identities = super::metadata::identities_of(&env, &node).await?;
    held_to_its_own_node(&identities[0].1, &node, &env.node_name(1)).await?;
    for (index, (how, agent)) in identities.into_iter().enumerate() {
        let as_agent: Api<NodeMaintenance> = Api::all(agent);
        let own = format!("{node}-reboot-e2e0000{index}");
        let request: NodeMaintenance = serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": own, "labels": {"nodeward.io/node": node}},
            "spec": {"nodeName": node, "reason": "Reboot", "action": "Reboot", "requestedBy": "nodeward-agent"},
        }))?;
        as_agent
            .create(&PostParams::default(), &request)
            .await
            .with_context(|| format!("{how}: its request"))?;
        through_the_phases(&env, &as_agent, &own)
            .await
            .with_context(|| format!("as the agent with {how}"))?;
    }
    remove_chart(env, &documents).await
}

/// Tries what each phase gives the agent and what it does not, on its request `own`.
async fn through_the_phases(
    env: &TestEnv,
    as_agent: &Api<NodeMaintenance>,
    own: &str,
) -> anyhow::Result<()> {
    let at = AT;
    // Its own request, not admitted: no record of anything that has not happened.
    writes(as_agent, own, on_its_unadmitted_request()).await?;

    // Admitted by "the coordinator" (the admin here), then Draining by the agent with its
    // history entry and start time, as the agent moves it.
    env.merge_maintenance_status(
        own,
        json!({"phase": "Admitted", "history": [{"phase": "Admitted", "time": at}]}),
    )
    .await?;
    let draining = json!({"phase": "Draining", "startedAt": at, "cordonedByNodeward": true,
        "message": "tainted and cordoned; draining",
        "history": [{"phase": "Admitted", "time": at}, {"phase": "Draining", "time": "2026-11-28T10:00:01Z"}]});
    writes(
        as_agent,
        own,
        vec![("the move to Draining", draining, None)],
    )
    .await?;
    writes(as_agent, own, while_draining()).await?;

    // Acting, with the boot id and Drained as the drain ends; the progress is then history.
    let acting = json!({"phase": "Acting", "bootId": "0a1b2c3d", "message": "drained; rebooting",
        "history": [{"phase": "Admitted", "time": at}, {"phase": "Draining", "time": "2026-11-28T10:00:01Z"}, {"phase": "Acting", "time": "2026-11-28T10:00:02Z"}],
        "conditions": [{"type": "Drained", "status": "True", "reason": "Drained", "message": "drained", "lastTransitionTime": at}]});
    writes(as_agent, own, vec![("the move to Acting", acting, None)]).await?;
    writes(as_agent, own, while_acting()).await?;

    // Verifying; the update's rollback, and Verifying again only once it succeeded.
    let mut history = vec![
        json!({"phase": "Admitted", "time": at}),
        json!({"phase": "Draining", "time": "2026-11-28T10:00:01Z"}),
        json!({"phase": "Acting", "time": "2026-11-28T10:00:02Z"}),
        json!({"phase": "Verifying", "time": "2026-11-28T10:00:03Z"}),
    ];
    let verifying = json!({"phase": "Verifying", "message": "back after the reboot",
        "history": history});
    writes(
        as_agent,
        own,
        vec![("the move to Verifying", verifying, None)],
    )
    .await?;
    history.push(json!({"phase": "Verifying", "time": "2026-11-28T10:00:04Z"}));
    writes(as_agent, own, while_verifying(&history)).await
}

/// What the agent tries while its maintenance is Verifying: `again` is its history with
/// Verifying entered a second time.
fn while_verifying(again: &[Value]) -> Vec<Write> {
    let rollback = |result: Option<&str>| {
        let mut run = json!({"step": "Rollback", "command": "true", "startedAt": AT});
        if let Some(result) = result {
            run["result"] = json!(result);
            run["finishedAt"] = json!(AT);
        }
        // The runs of the phases before stay as they are.
        let mut runs = run_list(&["BeforeDrain", "Update"]);
        runs.push(run);
        json!({"hostRuns": runs})
    };
    let reentered = json!({"message": "rolled back and rebooted", "history": again});
    vec![
        ("the rollback's run", rollback(None), None),
        (
            "Verifying again before the rollback succeeded",
            reentered.clone(),
            Some("only by the one entry of the phase it enters (Verifying)"),
        ),
        (
            "a reason before the end",
            json!({"reason": "RolledBack"}),
            Some("finishedAt and reason only as it ends"),
        ),
        ("the rollback's end", rollback(Some("Succeeded")), None),
        ("Verifying again after it", reentered, None),
        (
            "the end, rolled back",
            json!({"phase": "Failed", "reason": "RolledBack", "finishedAt": AT,
                "message": "rolled back"}),
            None,
        ),
    ]
}

/// What the agent tries on its own request before any admission.
fn on_its_unadmitted_request() -> Vec<Write> {
    let at = AT;
    vec![
        (
            "a history of a drain",
            json!({"history": [{"phase": "Admitted", "time": at}, {"phase": "Draining", "time": at}]}),
            Some("only by the one entry of the phase it enters (Pending)"),
        ),
        (
            "a start time",
            json!({"startedAt": at}),
            Some("startedAt and cordonedByNodeward only as it moves from Admitted to Draining"),
        ),
        (
            "a finish time",
            json!({"finishedAt": at}),
            Some("finishedAt and reason only as it ends"),
        ),
        (
            "a boot id",
            json!({"bootId": "0a1b2c3d"}),
            Some("bootId only from Draining to Acting"),
        ),
        (
            "a message",
            json!({"message": "rebooted"}),
            Some("a message only as it enters a phase"),
        ),
        (
            "evicted workloads",
            json!({"evictedWorkloads": [{"kind": "ReplicaSet", "namespace": "shop", "name": "web"}]}),
            Some("only while it is Draining, not Pending"),
        ),
        (
            "a host run",
            json!({"hostRuns": run(&["Update"])}),
            Some("(Pending: none)"),
        ),
        (
            "a Drained condition",
            json!({"conditions": [{"type": "Drained", "status": "True", "reason": "Drained", "message": "", "lastTransitionTime": at}]}),
            Some("only the conditions NodeRestored"),
        ),
    ]
}

/// What the agent tries while its maintenance is Draining.
fn while_draining() -> Vec<Write> {
    let at = AT;
    vec![
        (
            "its drain progress",
            json!({"podsTotal": 3, "podsRemaining": 2}),
            None,
        ),
        (
            "the before-drain hook's run",
            json!({"hostRuns": run(&["BeforeDrain"])}),
            None,
        ),
        (
            "the update's run",
            json!({"hostRuns": run(&["BeforeDrain", "Update"])}),
            Some("(Draining: BeforeDrain)"),
        ),
        (
            "a later start",
            json!({"startedAt": "2026-11-28T11:00:00Z"}),
            Some("startedAt and cordonedByNodeward only"),
        ),
        (
            "a boot id before acting",
            json!({"bootId": "0a1b2c3d"}),
            Some("bootId only from Draining to Acting"),
        ),
        (
            "a history rewritten",
            json!({"history": [{"phase": "Admitted", "time": "2026-11-28T11:00:00Z"}, {"phase": "Draining", "time": "2026-11-28T11:00:00Z"}]}),
            Some("only by the one entry of the phase it enters"),
        ),
        (
            "Drained before the drain ends",
            json!({"conditions": [{"type": "Drained", "status": "True", "reason": "Drained", "message": "", "lastTransitionTime": at}]}),
            Some("only the conditions NodeRestored"),
        ),
    ]
}

/// What the agent tries while its maintenance is Acting.
fn while_acting() -> Vec<Write> {
    let at = AT;
    vec![
        (
            "the update's run",
            json!({"hostRuns": run(&["BeforeDrain", "Update"])}),
            None,
        ),
        (
            "the before-drain hook's run again",
            json!({"hostRuns": run(&["Update"])}),
            Some("(Acting: AfterDrain, Update)"),
        ),
        (
            "fewer pods left",
            json!({"podsRemaining": 0}),
            Some("only while it is Draining, not Acting"),
        ),
        (
            "another boot id",
            json!({"bootId": "ffffffff"}),
            Some("bootId only from Draining to Acting"),
        ),
        (
            "a finish time before the end",
            json!({"finishedAt": at}),
            Some("finishedAt and reason only as it ends"),
        ),
    ]
}

/// A time the writes below name.
const AT: &str = "2026-11-28T10:00:00Z";

/// The host runs of `steps`, just started.
fn run(steps: &[&str]) -> Value {
    Value::Array(run_list(steps))
}

fn run_list(steps: &[&str]) -> Vec<Value> {
    steps
        .iter()
        .map(|step| json!({"step": step, "command": "true", "startedAt": AT}))
        .collect()
}

/// Tries each of `attempts` on the maintenance `name`: allowed, or refused saying what each
/// expects.
async fn writes(
    api: &Api<NodeMaintenance>,
    name: &str,
    attempts: Vec<Write>,
) -> anyhow::Result<()> {
    for (what, status, refused) in attempts {
        let result = api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await;
        match refused {
            None => {
                result.with_context(|| format!("{what}: refused"))?;
            }
            Some(expected) => {
                let said = refusal(result);
                anyhow::ensure!(
                    said.starts_with("403") && said.contains(expected),
                    "{what}: {said}"
                );
            }
        }
    }
    Ok(())
}
