//! Agents' heartbeats and each phase's deadline: not started, a reboot that never returns,
//! taking over from a lost agent, node replacements one at a time.

use super::*;

#[test]
fn an_agents_lease_is_its_heartbeat() {
    let mut objects = cluster(2);
    // n1's report was last written long ago (reports are written only on change), but its
    // agent renews its Lease.
    objects.reports = vec![report("n0", -700), report("n1", -700)];
    objects.leases = vec![lease("n1", 150)];
    for i in 0..2 {
        objects
            .maintenances
            .push(maintenance(&format!("m{i}"), &format!("n{i}")).build());
    }
    let plan = plan(&objects, &mut Memory::default(), t(200));
    let admitted: Vec<&str> = plan.admit.iter().map(|a| a.maintenance.as_str()).collect();
    assert_eq!(admitted, ["m1"], "{plan:?}");
    assert_eq!(plan.deny[0].reason, "AgentUnavailable");
}

#[test]
fn a_node_whose_agent_is_silent_is_not_admitted() {
    let mut objects = cluster(3);
    objects.reports = vec![report("n0", 100), report("n1", -700)];
    for i in 0..3 {
        objects
            .maintenances
            .push(maintenance(&format!("m{i}"), &format!("n{i}")).build());
    }
    let plan = plan(&objects, &mut Memory::default(), t(200));
    let admitted: Vec<&str> = plan.admit.iter().map(|a| a.maintenance.as_str()).collect();
    assert_eq!(admitted, ["m0"], "{plan:?}");
    let denied: Vec<(&str, &str)> = plan
        .deny
        .iter()
        .map(|d| (d.maintenance.as_str(), d.reason))
        .collect();
    assert_eq!(
        denied,
        [("m1", "AgentUnavailable"), ("m2", "AgentUnavailable")],
        "a stale heartbeat (900s old, limit 720s) and none at all"
    );
    assert!(
        plan.deny[1].message.contains("no NodeReport"),
        "{:?}",
        plan.deny[1]
    );
}

#[test]
fn an_agent_heartbeat_deadline_is_the_longest_of_the_nodes_policies() {
    let mut objects = cluster(1);
    objects.policies =
        vec![policy(json!({"maxConcurrent": 2, "deadlines": {"agentHeartbeat": "20m"}})).build()];
    objects.reports = vec![report("n0", -900)];
    objects.maintenances.push(maintenance("m0", "n0").build());
    let plan = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(
        plan.admit.len(),
        1,
        "a heartbeat 1100s old is fresh under 20m: {plan:?}"
    );
}

#[test]
fn an_admitted_maintenance_not_started_in_time_goes_back_to_pending_and_gives_its_slot_back() {
    let mut objects = cluster(2);
    objects.policies = vec![
        policy(json!({"maxConcurrent": 1, "deadlines": {"start": "5m"}}))
            .slot("m0", "n0")
            .build(),
    ];
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .admitted_by(&["pool"])
            .entered(MaintenancePhase::Admitted, 0)
            .build(),
        maintenance("m1", "n1").created(1).build(),
    ];
    let before = plan(&objects, &mut Memory::default(), t(299));
    assert!(before.overdue.is_empty(), "{before:?}");
    assert_eq!(before.deadlines.len(), 1, "the deadline is recorded");
    assert_eq!(before.deadlines[0].deadline.time.0, t(300));
    assert_eq!(
        before.deadlines[0].deadline.phase,
        MaintenancePhase::Admitted
    );
    assert_eq!(
        before.deny[0].reason, "BudgetExhausted",
        "m0 holds the one slot"
    );

    let at = plan(&objects, &mut Memory::default(), t(300));
    assert_eq!(
        at.overdue,
        [Overdue {
            maintenance: "m0".into(),
            to: MaintenancePhase::Pending,
            reason: "NotStarted",
            message: at.overdue[0].message.clone(),
        }]
    );
    assert!(
        at.overdue[0].message.contains("300s (deadlines.start)"),
        "{:?}",
        at.overdue
    );

    // Sent back (its agent silent since), and its slot freed by the writer once that was
    // written: the slot goes to the next in line.
    objects.maintenances[0] = maintenance("m0", "n0")
        .phase(MaintenancePhase::Pending)
        .build();
    objects.policies =
        vec![policy(json!({"maxConcurrent": 1, "deadlines": {"start": "5m"}})).build()];
    objects.reports[0] = report("n0", -700);
    let after = plan(&objects, &mut Memory::default(), t(301));
    let admitted: Vec<&str> = after.admit.iter().map(|a| a.maintenance.as_str()).collect();
    assert_eq!(admitted, ["m1"], "{after:?}");
    assert_eq!(after.deny[0].reason, "AgentUnavailable");
    let slots = &after.policy_status["pool"].slots;
    assert_eq!(slots.len(), 1);
    assert_eq!(slots[0].maintenance, "m1");
}

#[test]
fn a_reboot_that_never_returns_fails_and_its_not_ready_node_still_counts() {
    let mut objects = cluster(3);
    objects.policies = vec![
        policy(json!({"maxConcurrent": 1, "deadlines": {"reboot": "10m"}}))
            .slot("m0", "n0")
            .build(),
    ];
    objects.nodes[0] = node("n0").not_ready().build();
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .admitted_by(&["pool"])
            .entered(MaintenancePhase::Acting, 0)
            .build(),
        maintenance("m1", "n1").created(1).build(),
    ];
    // First seen Acting at t(10): the deadline runs from then, whatever the agent's history.
    let recorded = plan(&objects, &mut Memory::default(), t(10));
    assert_eq!(recorded.deadlines[0].deadline.time.0, t(610));
    assert_eq!(
        recorded.deadlines[0].deadline.since.as_ref().map(|s| s.0),
        Some(t(10))
    );
    assert_eq!(
        recorded.deadlines[0].deadline.then,
        "Failed (NodeDidNotReturn)"
    );
    objects.maintenances[0] = maintenance("m0", "n0")
        .admitted_by(&["pool"])
        .entered(MaintenancePhase::Acting, 0)
        .seen(MaintenancePhase::Acting, 0)
        .build();
    let late = plan(&objects, &mut Memory::default(), t(600));
    assert_eq!(late.overdue.len(), 1, "{late:?}");
    assert_eq!(
        (late.overdue[0].to, late.overdue[0].reason),
        (MaintenancePhase::Failed, "NodeDidNotReturn")
    );

    // Failed: the slot is freed, but the NotReady node fills the budget.
    objects.maintenances[0] = maintenance("m0", "n0")
        .admitted_by(&["pool"])
        .entered(MaintenancePhase::Acting, 0)
        .entered(MaintenancePhase::Failed, 600)
        .build();
    objects.reports[1] = report("n1", 590);
    let after = plan(&objects, &mut Memory::default(), t(601));
    assert!(after.admit.is_empty(), "{after:?}");
    assert_eq!(after.deny[0].reason, "BudgetExhausted");
    assert!(after.policy_status["pool"].slots.is_empty());
}

#[test]
fn a_maintenance_draining_or_verifying_too_long_fails_on_the_coordinators_clock_not_the_agents() {
    for (phase, limit, reason) in [
        (MaintenancePhase::Draining, "drain", "DrainNotFinished"),
        (MaintenancePhase::Verifying, "verify", "NotVerified"),
    ] {
        let mut objects = cluster(2);
        objects.policies = vec![
            policy(json!({"maxConcurrent": 1, "deadlines": {limit: "20m"}}))
                .slot("m0", "n0")
                .build(),
        ];
        // The agent's history says the phase began just now, a year on: it moves nothing.
        let held = |seen: Option<i64>| {
            let m = maintenance("m0", "n0")
                .admitted_by(&["pool"])
                .entered(phase, 365 * 86_400);
            match seen {
                Some(at) => m.seen(phase, at),
                None => m,
            }
            .build()
        };
        objects.maintenances = vec![held(None)];
        let first = plan(&objects, &mut Memory::default(), t(100));
        assert!(first.overdue.is_empty(), "{first:?}");
        let record = &first.deadlines[0].deadline;
        assert_eq!(
            (
                record.phase,
                record.since.as_ref().map(|s| s.0),
                record.time.0
            ),
            (phase, Some(t(100)), t(1300)),
            "{phase:?}: first seen now, due 20m later"
        );
        objects.maintenances = vec![held(Some(100))];
        assert!(
            plan(&objects, &mut Memory::default(), t(1299))
                .overdue
                .is_empty()
        );
        let late = plan(&objects, &mut Memory::default(), t(1300));
        assert_eq!(late.overdue.len(), 1, "{phase:?}: {late:?}");
        assert_eq!(
            (late.overdue[0].to, late.overdue[0].reason),
            (MaintenancePhase::Failed, reason)
        );
        assert!(
            late.overdue[0]
                .message
                .contains(&format!("1200s (deadlines.{limit})")),
            "{:?}",
            late.overdue[0]
        );
    }
}

#[test]
fn a_recorded_deadline_is_not_written_again() {
    let mut objects = cluster(1);
    let mut m = maintenance("m0", "n0")
        .admitted_by(&["pool"])
        .entered(MaintenancePhase::Admitted, 0)
        .build();
    let first = plan(&objects, &mut Memory::default(), t(10));
    assert!(first.deadlines.is_empty(), "no maintenance yet");
    objects.maintenances = vec![m.clone()];
    let round = plan(&objects, &mut Memory::default(), t(10));
    let record = round.deadlines[0].deadline.clone();
    Arc::make_mut(&mut m)
        .status
        .as_mut()
        .expect("status")
        .deadline = Some(record);
    objects.maintenances = vec![m];
    assert!(
        plan(&objects, &mut Memory::default(), t(20))
            .deadlines
            .is_empty()
    );
}

#[test]
fn the_coordinator_takes_over_from_a_lost_agent_and_releases_what_a_gone_node_held() {
    let mut objects = cluster(3);
    objects.policies = vec![
        policy(json!({"maxConcurrent": 3, "deadlines": {"agentLost": "10m"}}))
            .slot("m0", "n0")
            .slot("m1", "n1")
            .build(),
    ];
    objects.reports = vec![report("n0", -1000), report("n1", 900), report("n2", -1000)];
    let draining = |name: &str, node: &str| {
        maintenance(name, node)
            .admitted_by(&["pool"])
            .entered(MaintenancePhase::Draining, 0)
            .finalized()
    };
    objects.maintenances = vec![
        draining("m0", "n0").build(),
        draining("m1", "n1").build(),
        maintenance("m2", "n2")
            .action(MaintenanceAction::DrainOnly)
            .entered(MaintenancePhase::Acting, 0)
            .finalized()
            .build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(1000));
    assert_eq!(round.take_over.len(), 1, "{:?}", round.take_over);
    let taken = &round.take_over[0];
    assert_eq!(
        (taken.maintenance.as_str(), taken.node.as_str()),
        ("m0", "n0")
    );
    assert_eq!(
        taken.takeover,
        crate::deadlines::Takeover {
            end_in: Some(MaintenancePhase::Failed),
            restore: true,
            unfinalize: true
        }
    );
    assert!(taken.untaint, "no other maintenance holds n0");
    assert!(
        taken.message.contains("600s (deadlines.agentLost)"),
        "{}",
        taken.message
    );

    // The node is deleted, and confirmed gone: the maintenance's finalizer goes too.
    objects.nodes.retain(|n| n.name_any() != "n1");
    let mut memory = Memory::default();
    memory.confirmed_gone.insert(Gone::Node("n1".into()));
    let round = plan(&objects, &mut memory, t(1000));
    let m1 = round
        .take_over
        .iter()
        .find(|t| t.maintenance == "m1")
        .expect("m1 released");
    assert_eq!(
        m1.takeover,
        crate::deadlines::Takeover {
            end_in: None,
            restore: false,
            unfinalize: true
        },
        "its end is written as the node's deletion's"
    );
    assert!(round.end.iter().any(|e| e.maintenance == "m1"));
}

#[test]
fn delete_node_maintenances_remove_one_node_per_replacement_wait_not_back_to_back() {
    let mut objects = cluster(3);
    objects.policies = vec![policy(json!({"maxConcurrent": 1})).build()];
    // n0 was deleted by m0 at t(100); n1 and n2 wait for theirs.
    objects.nodes.retain(|n| n.name_any() != "n0");
    objects.reports = vec![report("n1", 650), report("n2", 650)];
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .action(MaintenanceAction::DeleteNode)
            .admitted_by(&["pool"])
            .entered(MaintenancePhase::Acting, 50)
            .entered(MaintenancePhase::Succeeded, 100)
            .build(),
        maintenance("m1", "n1")
            .action(MaintenanceAction::DeleteNode)
            .created(1)
            .build(),
        maintenance("m2", "n2")
            .action(MaintenanceAction::DeleteNode)
            .created(2)
            .build(),
    ];
    let waiting = plan(&objects, &mut Memory::default(), t(699));
    assert!(waiting.admit.is_empty(), "{waiting:?}");
    assert_eq!(waiting.deny[0].reason, "BudgetExhausted");
    assert!(
        waiting.deny[0].message.contains("(n0)"),
        "the deleted node holds the budget: {}",
        waiting.deny[0].message
    );
    assert_eq!(waiting.budget_use["pool"], (1, 1));
    let after = plan(&objects, &mut Memory::default(), t(700));
    let admitted: Vec<&str> = after.admit.iter().map(|a| a.maintenance.as_str()).collect();
    assert_eq!(admitted, ["m1"], "one more, after the 10m replacement wait");

    // The round that sees the node gone (its maintenance still Acting, its slot freed once
    // the absence is confirmed) already holds the share.
    objects.maintenances[0] = maintenance("m0", "n0")
        .action(MaintenanceAction::DeleteNode)
        .admitted_by(&["pool"])
        .entered(MaintenancePhase::Acting, 50)
        .build();
    let mut memory = Memory::default();
    memory.confirmed_gone.insert(Gone::Node("n0".into()));
    let deleting = plan(&objects, &mut memory, t(690));
    assert!(
        deleting.end.iter().any(|e| e.maintenance == "m0"),
        "{deleting:?}"
    );
    assert!(deleting.admit.is_empty(), "{deleting:?}");
}
