//! Remediation in a round: `maxUnhealthy`, escalation, startup timeouts and DeleteNode.

use super::*;

#[test]
fn remediation_stops_when_more_nodes_than_max_unhealthy_are_unhealthy() {
    let mut objects = cluster(4);
    objects.policies = vec![
        policy(json!({"maxUnhealthy": 1, "remediation": {"enabled": true,
            "unhealthyConditions": [{"type": "Ready", "status": "False", "for": "1m"}]}}))
        .build(),
    ];
    objects.nodes[0] = node("n0").not_ready().build();
    let mut memory = Memory::default();
    let one = plan(&objects, &mut memory, t(0));
    assert_eq!(one.remediate.len(), 1, "{one:?}");
    assert_eq!(one.remediate[0].node, "n0");
    objects.nodes[1] = node("n1").not_ready().build();
    let two = plan(&objects, &mut memory, t(1));
    assert!(two.remediate.is_empty());
    let allowed = two.policy_status["pool"]
        .conditions
        .iter()
        .find(|c| c.type_ == "RemediationAllowed")
        .expect("condition");
    assert_eq!(
        (allowed.status.as_str(), allowed.reason.as_str()),
        ("False", "TooManyUnhealthy")
    );
}

#[test]
fn a_reboot_remediation_that_did_not_help_escalates_to_delete_node() {
    let mut objects = cluster(3);
    objects.policies = vec![
        policy(
            json!({"remediation": {"enabled": true, "escalateAfter": "10m",
            "unhealthyConditions": [{"type": "Ready", "status": "False", "for": "1m"}]}}),
        )
        .build(),
    ];
    objects.nodes[0] = node("n0").not_ready().build();
    objects.maintenances = vec![
        maintenance("r0", "n0")
            .remediation()
            .phase(MaintenancePhase::Verifying)
            .admitted_by(&["pool"])
            .build(),
    ];
    let early = plan(&objects, &mut Memory::default(), t(300));
    assert!(
        early.remediate.is_empty(),
        "not before escalateAfter: {early:?}"
    );
    let late = plan(&objects, &mut Memory::default(), t(601));
    assert_eq!(late.remediate.len(), 1, "{late:?}");
    assert_eq!(late.remediate[0].action, MaintenanceAction::DeleteNode);
    assert_eq!(late.remediate[0].replaces.as_deref(), Some("r0"));
}

#[test]
fn a_node_never_ready_within_the_startup_timeout_gets_the_startup_action() {
    let mut objects = cluster(1);
    objects.nodes.push(node("new").new_at(0).build());
    objects.policies = vec![
        policy(json!({"remediation": {"nodeStartupTimeout": "5m", "startupAction": "DeleteNode"}}))
            .build(),
    ];
    assert!(
        plan(&objects, &mut Memory::default(), t(299))
            .startup_timeouts
            .is_empty()
    );
    let timed_out = plan(&objects, &mut Memory::default(), t(300)).startup_timeouts;
    assert_eq!(timed_out.len(), 1);
    assert_eq!(
        (timed_out[0].node.as_str(), timed_out[0].action),
        ("new", StartupAction::DeleteNode)
    );
    assert!(!timed_out[0].reported);
    // A node seen Ready once is not "never Ready" when it later goes NotReady.
    let mut memory = Memory::default();
    memory.seen_ready.insert("uid-new".into());
    assert!(
        plan(&objects, &mut memory, t(300))
            .startup_timeouts
            .is_empty()
    );
}

#[test]
fn a_node_registered_again_under_its_name_starts_anew() {
    let mut objects = cluster(1);
    objects.nodes.push(node("again").build());
    objects.policies = vec![policy(json!({"remediation": {"nodeStartupTimeout": "5m"}})).build()];
    let mut memory = Memory::default();
    plan(&objects, &mut memory, t(0));
    assert!(memory.seen_ready.contains("uid-again"));
    // Deleted and registered again within one round: a new uid, never Ready yet.
    let mut again = node("again").new_at(0).build().as_ref().clone();
    again.metadata.uid = Some("uid-again-2".into());
    objects.nodes.pop();
    objects.nodes.push(Arc::new(again));
    let timed_out = plan(&objects, &mut memory, t(300)).startup_timeouts;
    assert_eq!(timed_out.len(), 1, "{timed_out:?}");
    assert_eq!(timed_out[0].node, "again");
    assert!(
        !memory.seen_ready.contains("uid-again"),
        "the old uid forgotten"
    );
}

#[test]
fn a_node_ready_after_its_startup_timed_out_has_the_condition_cleared() {
    let mut objects = cluster(0);
    objects.nodes = vec![
        node("late").condition("StartupTimedOut", "True").build(),
        node("still-down")
            .not_ready()
            .condition("StartupTimedOut", "True")
            .build(),
        node("cleared")
            .condition("StartupTimedOut", "False")
            .build(),
        node("never-timed-out").build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(10));
    assert_eq!(round.started_late, ["late"]);
}

#[test]
fn a_drained_delete_node_maintenance_deletes_only_its_node_and_only_if_admitted() {
    let mut objects = cluster(2);
    objects.policies = vec![policy(json!({"maxConcurrent": 2})).slot("d0", "n0").build()];
    let deleting = |name: &str, node: &str| {
        maintenance(name, node)
            .action(MaintenanceAction::DeleteNode)
            .phase(MaintenancePhase::Acting)
    };
    objects.maintenances = vec![
        deleting("d0", "n0").admitted_by(&["pool"]).build(),
        // Acting, but no coordinator admitted it, and it holds no slot.
        deleting("forged", "n1").build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(10));
    assert_eq!(
        round.delete_nodes,
        [NodeDeletion {
            maintenance: "d0".into(),
            node: "n0".into(),
            uid: "uid-n0".into(),
        }]
    );
    let ended: Vec<(&str, MaintenancePhase)> = round
        .end
        .iter()
        .map(|e| (e.maintenance.as_str(), e.phase))
        .collect();
    assert_eq!(ended, [("forged", MaintenancePhase::Failed)]);
    assert!(
        round.end[0].message.contains("node n1 is not deleted"),
        "{:?}",
        round.end
    );
}

#[test]
fn a_startup_deletion_waits_for_pause_and_budget_like_any_disruption() {
    let startup = |extra: serde_json::Value| {
        let mut spec =
            json!({"remediation": {"nodeStartupTimeout": "5m", "startupAction": "DeleteNode"}});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        spec
    };
    let decided = |objects: &Objects| {
        let timed_out = plan(objects, &mut Memory::default(), t(300)).startup_timeouts;
        assert_eq!(timed_out.len(), 1, "{timed_out:?}");
        (timed_out[0].action, timed_out[0].message.clone())
    };
    let mut objects = cluster(2);
    objects.nodes.push(node("new").new_at(0).build());

    objects.policies = vec![policy(startup(json!({"paused": true}))).build()];
    let (action, message) = decided(&objects);
    assert_eq!(action, StartupAction::None);
    assert!(
        message.contains("not deleted now: policy pool is paused"),
        "{message}"
    );

    // Another node holds the one slot: the deletion waits for it.
    objects.policies = vec![
        policy(startup(json!({"maxConcurrent": 1})))
            .slot("m0", "n0")
            .build(),
    ];
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .phase(MaintenancePhase::Draining)
            .admitted_by(&["pool"])
            .build(),
    ];
    let (action, message) = decided(&objects);
    assert_eq!(action, StartupAction::None);
    assert!(
        message.contains("allows 1 disrupted nodes at once"),
        "{message}"
    );

    objects.maintenances.clear();
    objects.policies = vec![policy(startup(json!({"maxConcurrent": 1}))).build()];
    assert_eq!(decided(&objects).0, StartupAction::DeleteNode);
}

#[test]
fn a_node_created_again_under_the_name_is_not_the_one_a_maintenance_was_admitted_for() {
    let mut objects = cluster(2);
    objects.policies = vec![
        policy(json!({"maxConcurrent": 2}))
            .slot("d0", "n0")
            .slot("r1", "n1")
            .build(),
    ];
    objects.maintenances = vec![
        // Drained for the n0 of uid "old-n0"; the n0 there now is another machine.
        maintenance("d0", "n0")
            .action(MaintenanceAction::DeleteNode)
            .phase(MaintenancePhase::Acting)
            .admitted_by(&["pool"])
            .for_node_uid("old-n0")
            .build(),
        maintenance("r1", "n1")
            .phase(MaintenancePhase::Draining)
            .admitted_by(&["pool"])
            .for_node_uid("old-n1")
            .build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(10));
    assert!(round.delete_nodes.is_empty(), "{:?}", round.delete_nodes);
    let ended: Vec<(&str, MaintenancePhase)> = round
        .end
        .iter()
        .map(|e| (e.maintenance.as_str(), e.phase))
        .collect();
    assert_eq!(
        ended,
        [
            ("d0", MaintenancePhase::Succeeded),
            ("r1", MaintenancePhase::Cancelled)
        ]
    );
    assert!(
        round.end[0].message.contains("created again"),
        "{:?}",
        round.end
    );

    // Admitted for the n0 there now: deleted, by its uid.
    objects.maintenances.truncate(1);
    objects.maintenances[0] = maintenance("d0", "n0")
        .action(MaintenanceAction::DeleteNode)
        .phase(MaintenancePhase::Acting)
        .admitted_by(&["pool"])
        .for_node_uid("uid-n0")
        .build();
    let round = plan(&objects, &mut Memory::default(), t(10));
    assert_eq!(round.delete_nodes.len(), 1);
    assert_eq!(round.delete_nodes[0].uid, "uid-n0");
}
