//! The round's decisions, from watched objects to plan.

use super::{fixtures::*, *};
use kube_core::ResourceExt;
use serde_json::json;

#[test]
fn pending_maintenances_are_admitted_oldest_first_up_to_the_budget() {
    let mut objects = cluster(5);
    for i in 0..5 {
        // Created in reverse order of their names: age, not name, decides.
        objects.maintenances.push(
            maintenance(&format!("m{i}"), &format!("n{i}"))
                .created(100 - i as i64)
                .build(),
        );
    }
    let plan = plan(&objects, &mut Memory::default(), t(200));
    let admitted: Vec<&str> = plan.admit.iter().map(|a| a.maintenance.as_str()).collect();
    assert_eq!(admitted, ["m4", "m3"]);
    assert_eq!(plan.admit[0].new_slots_in, ["pool"]);
    assert_eq!(
        plan.admit[0].node_uid, "uid-n4",
        "the Node it is admitted for"
    );
    assert_eq!(plan.deny.len(), 3);
    assert!(
        plan.deny.iter().all(|d| d.reason == "BudgetExhausted"),
        "{:?}",
        plan.deny
    );
    let status = &plan.policy_status["pool"];
    assert_eq!(status.slots.len(), 2);
    assert_eq!((status.matched, status.in_maintenance), (5, 2));
    assert_eq!(plan.budget_use["pool"], (2, 2));
}

/// The objects after a round's writes went through (slots, then admissions).
fn written(mut objects: Objects, plan: &Plan) -> Objects {
    for p in &mut objects.policies {
        if let Some(status) = plan.policy_status.get(&p.name_any()) {
            Arc::make_mut(p).status = Some(status.clone());
        }
    }
    for m in &mut objects.maintenances {
        if plan.admit.iter().any(|a| a.maintenance == m.name_any()) {
            Arc::make_mut(m)
                .status
                .get_or_insert_with(Default::default)
                .phase = MaintenancePhase::Admitted;
        }
    }
    objects
}

fn names<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<String> {
    items.iter().map(|i| name(i).to_owned()).collect()
}

#[test]
fn new_maintenances_are_decided_against_the_standing_as_a_full_round_would() {
    let mut objects = cluster(5);
    objects.maintenances = vec![maintenance("m0", "n0").build()];
    let mut round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(names(&round.admit, |a| &a.maintenance), ["m0"]);
    let mut objects = written(objects, &round);
    let new: Vec<_> = (1..4)
        .map(|i| {
            maintenance(&format!("m{i}"), &format!("n{i}"))
                .created(300 - i)
                .build()
        })
        .collect();

    let fast = admit_new_plainly(&mut round.standing, &objects.policies, &new, 400);
    objects.maintenances.extend(new);
    let full = plan(&objects, &mut Memory::default(), t(400));
    // The oldest new one (m3) takes the second slot; the others find the budget used.
    assert_eq!(names(&fast.admit, |a| &a.maintenance), ["m3"]);
    assert_eq!(fast.admit[0].new_slots_in, ["pool"]);
    assert_eq!(
        names(&fast.admit, |a| &a.maintenance),
        names(&full.admit, |a| &a.maintenance)
    );
    assert_eq!(fast.deny, full.deny);
    let status = &fast.policy_status["pool"];
    assert_eq!(names(&status.slots, |s| &s.maintenance), ["m0", "m3"]);
    assert_eq!(status.in_maintenance, 2);
    assert_eq!(fast.budget_use["pool"], (2, 2));
    assert!(round.standing.policies["pool"].slots.contains("uid-m3"));
    // What it admitted counts against the next burst.
    let next = admit_new_plainly(
        &mut round.standing,
        &written(objects, &fast).policies,
        &[maintenance("m4", "n4").created(500).build()],
        500,
    );
    assert!(next.admit.is_empty());
    assert_eq!(next.deny[0].reason, "BudgetExhausted");
}

#[test]
fn a_not_ready_node_counts_against_the_budget_in_an_admission_only_round_too() {
    // Three nodes, one NotReady, a budget of one: the NotReady node fills it.
    let mut objects = cluster(3);
    objects.nodes[2] = node("n2").not_ready().build();
    objects.policies = vec![policy(json!({"maxConcurrent": 1})).build()];
    let mut round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(round.standing.not_ready, BTreeSet::from(["n2".to_owned()]));
    let objects = written(objects, &round);
    let next = admit_new_plainly(
        &mut round.standing,
        &objects.policies,
        &[maintenance("m0", "n0").created(300).build()],
        400,
    );
    assert!(next.admit.is_empty(), "{next:?}");
    assert_eq!(next.deny[0].reason, "BudgetExhausted");
    assert!(next.deny[0].message.contains("n2"), "{:?}", next.deny);
}

#[test]
fn the_standing_gives_way_to_a_full_round_when_anything_it_decided_on_changed() {
    let objects = cluster(3);
    let round = plan(&objects, &mut Memory::default(), t(200));
    let objects = written(objects, &round);
    let new = [maintenance("m1", "n1").created(300).build()];
    let decide = |policies: &[Arc<DisruptionPolicy>], new: &[Arc<NodeMaintenance>]| {
        admit_new(
            &mut round.standing.clone(),
            policies,
            new,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            t(400),
        )
    };
    assert!(decide(&objects.policies, &new).is_some());

    // Another coordinator took a slot.
    let mut taken = objects.policies.clone();
    Arc::make_mut(&mut taken[0])
        .status
        .get_or_insert_with(Default::default)
        .slots
        .push(budget_slot("other", "n2"));
    assert!(decide(&taken, &new).is_none());
    // The spec changed (e.g. paused).
    let mut edited = objects.policies.clone();
    Arc::make_mut(&mut edited[0]).metadata.generation = Some(4);
    assert!(decide(&edited, &new).is_none());
    // A node the round did not see, or a policy it did not know.
    assert!(
        decide(
            &objects.policies,
            &[maintenance("m9", "n9").created(300).build()]
        )
        .is_none()
    );
    let mut more = objects.policies.clone();
    more.push(policy(json!({"maxConcurrent": 1})).build());
    Arc::make_mut(&mut more[1]).metadata.name = Some("other".into());
    assert!(decide(&more, &new).is_none());
}

#[test]
fn the_standing_looks_at_windows_blockers_and_budgets_again() {
    let mut objects = cluster(3);
    objects.policies = vec![
        policy(json!({"maxConcurrent": 2, "windows": [{"start": "08:00", "end": "09:00"}]}))
            .build(),
    ];
    // t(0) is 08:00 UTC: the window is open for the round, closed an hour later.
    let round = plan(&objects, &mut Memory::default(), t(200));
    let objects = written(objects, &round);
    let new = [maintenance("m1", "n1").created(300).build()];
    let decide_held =
        |blockers: &BTreeMap<String, String>, held: &BTreeMap<String, String>, now: i64| {
            admit_new(
                &mut round.standing.clone(),
                &objects.policies,
                &new,
                blockers,
                held,
                &BTreeMap::new(),
                t(now),
            )
        };
    let decide = |blockers: &BTreeMap<String, String>, now: i64| {
        decide_held(blockers, &BTreeMap::new(), now)
    };
    let open = decide(&BTreeMap::new(), 400).expect("decides");
    assert_eq!(open.admit.len(), 1);
    // Closed since: older pending maintenances may be affected, a full round decides.
    assert!(decide(&BTreeMap::new(), 4_000).is_none());
    let held = BTreeMap::from([("n1".to_owned(), "PodDisruptionBudget ns/web".to_owned())]);
    let waits = decide_held(&BTreeMap::new(), &held, 400).expect("decides");
    assert!(waits.admit.is_empty());
    assert_eq!(waits.deny[0].reason, "WorkloadNotReady");
    let blockers = BTreeMap::from([("n1".to_owned(), "pod ns/p".to_owned())]);
    let blocked = decide(&blockers, 400).expect("decides");
    assert_eq!(blocked.deny[0].reason, "Blocked");
    assert!(
        blocked.deny[0].message.contains("pod ns/p"),
        "{:?}",
        blocked.deny
    );
}

/// The maintenances `round` admits, by name.
fn admitted(round: &Plan) -> Vec<&str> {
    round.admit.iter().map(|a| a.maintenance.as_str()).collect()
}

/// An admission-only round of `new` with no blockers, held nodes or scans.
fn admit_new_plainly(
    standing: &mut Standing,
    policies: &[Arc<DisruptionPolicy>],
    new: &[Arc<NodeMaintenance>],
    now: i64,
) -> Plan {
    let none = BTreeMap::new();
    admit_new(
        standing,
        policies,
        new,
        &none,
        &none,
        &BTreeMap::new(),
        t(now),
    )
    .expect("the standing decides")
}

#[test]
fn a_node_a_disruption_budget_holds_back_waits_and_the_next_one_takes_the_slot() {
    let mut objects = cluster(3);
    objects.policies = vec![policy(json!({"maxConcurrent": 1})).build()];
    objects.maintenances = vec![
        maintenance("m1", "n1").created(1).build(),
        maintenance("m2", "n2").created(2).build(),
    ];
    objects.workloads = BTreeMap::from([(
        "n1".to_owned(),
        "PodDisruptionBudget shop/web of Deployment shop/web allows no disruption now".to_owned(),
    )]);
    let round = plan(&objects, &mut Memory::default(), t(10));
    assert_eq!(
        admitted(&round),
        ["m2"],
        "the older one waits for its workload, the slot goes on"
    );
    let denial = round
        .deny
        .iter()
        .find(|d| d.maintenance == "m1")
        .expect("m1 denied");
    assert_eq!(denial.reason, "WorkloadNotReady");
    assert!(denial.message.contains("shop/web"), "{denial:?}");

    objects.policies = vec![
        policy(json!({"maxConcurrent": 1, "workloadGate": {"checkDisruptionBudgets": false}}))
            .build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(10));
    assert_eq!(
        admitted(&round),
        ["m1"],
        "a policy that does not check budgets takes the oldest"
    );
}

#[test]
fn a_finished_maintenance_frees_its_slot_and_the_next_one_gets_it() {
    let mut objects = cluster(3);
    objects.policies = vec![policy(json!({"maxConcurrent": 1})).slot("m0", "n0").build()];
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .phase(MaintenancePhase::Succeeded)
            .build(),
        maintenance("m1", "n1").created(1).build(),
    ];
    let plan = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(plan.admit.len(), 1);
    assert_eq!(plan.admit[0].maintenance, "m1");
    let slots: Vec<&str> = plan.policy_status["pool"]
        .slots
        .iter()
        .map(|s| s.maintenance.as_str())
        .collect();
    assert_eq!(slots, ["m1"]);
}

#[test]
fn a_slot_whose_maintenance_is_missing_is_freed_only_once_confirmed_gone() {
    let mut objects = cluster(3);
    objects.policies = vec![policy(json!({"maxConcurrent": 1})).slot("m0", "n0").build()];
    objects.maintenances = vec![maintenance("m1", "n1").created(1).build()];
    let mut memory = Memory::default();
    let first = plan(&objects, &mut memory, t(200));
    assert!(
        first.admit.is_empty(),
        "a lagging watch must not free the slot"
    );
    let gone = Gone::Maintenance {
        name: "m0".into(),
        uid: "uid-m0".into(),
    };
    assert!(first.confirm_gone.contains(&gone));
    memory.confirmed_gone.insert(gone);
    let second = plan(&objects, &mut memory, t(201));
    assert_eq!(second.admit.len(), 1, "{second:?}");
}

#[test]
fn a_half_done_admission_is_completed_without_a_second_slot() {
    let mut objects = cluster(3);
    objects.policies = vec![policy(json!({"maxConcurrent": 1})).slot("m0", "n0").build()];
    objects.maintenances = vec![maintenance("m0", "n0").build()];
    let plan = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(plan.admit.len(), 1);
    assert!(plan.admit[0].new_slots_in.is_empty());
    assert!(
        plan.policy_status
            .get("pool")
            .is_none_or(|s| s.slots.len() == 1)
    );
}

#[test]
fn a_half_done_admission_that_no_longer_fits_keeps_its_slot_until_its_denial_is_written() {
    let mut objects = cluster(3);
    objects.policies = vec![
        policy(json!({"maxConcurrent": 1, "paused": true}))
            .slot("m0", "n0")
            .build(),
    ];
    objects.maintenances = vec![
        maintenance("m0", "n0").build(),
        maintenance("m1", "n1").created(1).build(),
    ];
    let plan = plan(&objects, &mut Memory::default(), t(200));
    assert!(plan.admit.is_empty(), "{plan:?}");
    let m0 = plan
        .deny
        .iter()
        .find(|d| d.maintenance == "m0")
        .expect("m0 denied");
    assert_eq!(m0.reason, "Paused");
    assert!(
        m0.gives_back_slots,
        "the writer frees the slot once the denial is written"
    );
    let m1 = plan
        .deny
        .iter()
        .find(|d| d.maintenance == "m1")
        .expect("m1 denied");
    assert!(!m1.gives_back_slots, "m1 holds no slot");
    assert!(
        plan.policy_status
            .get("pool")
            .is_none_or(|s| s.slots.len() == 1 && s.slots[0].maintenance == "m0"),
        "the slot stays in this round: {plan:?}"
    );

    // Denied for its own reason (a blocker) while the budget has room: its node still counts
    // as disrupted in this round, so nothing takes its place before its slot is freed.
    objects.policies = vec![policy(json!({"maxConcurrent": 2})).slot("m0", "n0").build()];
    objects.nodes[2] = node("n2").not_ready().build();
    objects
        .blockers
        .insert("n0".into(), "an alert fires".into());
    let plan = super::plan(&objects, &mut Memory::default(), t(200));
    assert!(plan.admit.is_empty(), "{plan:?}");
    let reasons: Vec<(&str, &str, bool)> = plan
        .deny
        .iter()
        .map(|d| (d.maintenance.as_str(), d.reason, d.gives_back_slots))
        .collect();
    assert_eq!(
        reasons,
        [("m0", "Blocked", true), ("m1", "BudgetExhausted", false)]
    );
    assert_eq!(plan.budget_use["pool"], (2, 2));
}

#[test]
fn a_new_maintenance_that_already_holds_a_slot_is_left_to_a_full_round() {
    // The policy watch showed another coordinator's slot for m0 before the maintenance watch
    // showed m0: the round kept the slot (not yet confirmed gone).
    let mut objects = cluster(2);
    objects.policies = vec![policy(json!({"maxConcurrent": 1})).slot("m0", "n0").build()];
    let round = plan(&objects, &mut Memory::default(), t(200));
    let objects = written(objects, &round);
    let new = [maintenance("m0", "n0").created(150).build()];
    assert_eq!(
        admit_new(
            &mut round.standing.clone(),
            &objects.policies,
            &new,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            t(201)
        ),
        None,
        "a half-done admission is a full round's to decide"
    );
}

#[test]
fn a_nodes_older_reboot_requests_are_superseded_by_its_newest_a_few_a_round() {
    let mut objects = cluster(3);
    objects.policies = vec![policy(json!({"maxConcurrent": 2})).build()];
    // n0's identity asked 50 times (a flood); n1 asked once; an admin's maintenance of n0.
    for i in 0..50 {
        objects.maintenances.push(
            maintenance(&format!("n0-reboot-{i:08}"), "n0")
                .created(i)
                .build(),
        );
    }
    objects
        .maintenances
        .push(maintenance("n1-reboot-aaaaaaaa", "n1").created(10).build());
    objects
        .maintenances
        .push(maintenance("n2-by-admin", "n2").created(20).build());
    let plan = plan(&objects, &mut Memory::default(), t(200));
    let admitted: Vec<&str> = plan.admit.iter().map(|a| a.maintenance.as_str()).collect();
    assert_eq!(admitted, ["n1-reboot-aaaaaaaa", "n2-by-admin"], "{plan:?}");
    assert_eq!(plan.superseded.len(), SUPERSEDED_PER_ROUND);
    assert!(
        plan.superseded
            .iter()
            .all(|s| s.by == "n0-reboot-00000049" && s.maintenance != s.by)
    );
    assert_eq!(
        plan.deny
            .iter()
            .map(|d| d.maintenance.as_str())
            .collect::<Vec<_>>(),
        ["n0-reboot-00000049"],
        "only the newest of n0 is decided (and waits for the budget)"
    );
}

#[test]
fn not_ready_nodes_count_against_the_budget() {
    let mut objects = cluster(3);
    objects.nodes[2] = node("n2").not_ready().build();
    objects.policies = vec![policy(json!({"maxConcurrent": 1})).build()];
    objects.maintenances = vec![maintenance("m0", "n0").build()];
    let plan = plan(&objects, &mut Memory::default(), t(200));
    assert!(plan.admit.is_empty());
    assert_eq!(plan.deny[0].reason, "BudgetExhausted");
    assert!(
        plan.deny[0].message.contains("n2"),
        "{}",
        plan.deny[0].message
    );
}

#[test]
fn an_invalid_selector_blocks_everything_and_says_why() {
    let mut objects = cluster(2);
    objects.policies = vec![policy(json!({"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Sideways"}]}})).build()];
    objects.maintenances = vec![maintenance("m0", "n0").build()];
    let plan = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(plan.deny[0].reason, "Blocked");
    assert!(
        plan.deny[0].message.contains("invalid"),
        "{}",
        plan.deny[0].message
    );
    let valid = plan.policy_status["pool"]
        .conditions
        .iter()
        .find(|c| c.type_ == "Valid")
        .expect("Valid");
    assert_eq!(valid.status, "False");
    assert!(valid.message.contains("nodeSelector"), "{}", valid.message);
}

#[test]
fn paused_is_true_only_when_every_agent_in_scope_acknowledged() {
    let mut objects = cluster(2);
    objects.policies = vec![policy(json!({"paused": true})).build()];
    let report = |name: &str, ack: Option<i64>| -> Arc<NodeReport> {
        let acks: Vec<serde_json::Value> = ack
            .into_iter()
            .map(|g| json!({"policy": "pool", "observedGeneration": g}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
                "metadata": {"name": name}, "spec": {"nodeName": name},
                "status": {"pauseAcknowledgements": acks},
            }))
            .expect("report"),
        )
    };
    objects.reports = vec![report("n0", Some(3)), report("n1", Some(2))];
    let paused = |objects: &Objects| {
        let plan = plan(objects, &mut Memory::default(), t(0));
        let c = plan.policy_status["pool"]
            .conditions
            .iter()
            .find(|c| c.type_ == "Paused")
            .cloned()
            .expect("Paused");
        (c.status, c.message)
    };
    let (status, message) = paused(&objects);
    assert_eq!(status, "False");
    assert!(
        message.contains("n1"),
        "names the agent it waits for: {message}"
    );
    objects.reports[1] = report("n1", Some(3));
    assert_eq!(paused(&objects).0, "True");

    // An admitted maintenance is about to drain (its agent does not hold it): not paused
    // until it has ended; nor while it drains or acts.
    for phase in [
        MaintenancePhase::Admitted,
        MaintenancePhase::Draining,
        MaintenancePhase::Acting,
    ] {
        objects.maintenances = vec![maintenance("m0", "n0").phase(phase).build()];
        let (status, message) = paused(&objects);
        assert_eq!(status, "False", "{phase:?}");
        assert!(
            message.contains("1 maintenance(s) admitted, draining or acting"),
            "{message}"
        );
    }
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .phase(MaintenancePhase::Succeeded)
            .build(),
    ];
    assert_eq!(paused(&objects).0, "True");
}

#[test]
fn an_active_maintenance_of_a_deleted_node_ends_once_the_deletion_is_confirmed() {
    let mut objects = cluster(1);
    objects.maintenances = vec![
        maintenance("m9", "gone")
            .phase(MaintenancePhase::Draining)
            .build(),
    ];
    let mut memory = Memory::default();
    let first = plan(&objects, &mut memory, t(0));
    assert!(first.end.is_empty());
    assert!(first.confirm_gone.contains(&Gone::Node("gone".into())));
    memory.confirmed_gone.insert(Gone::Node("gone".into()));
    let second = plan(&objects, &mut memory, t(1));
    assert_eq!(second.end.len(), 1);
    assert_eq!(second.end[0].phase, MaintenancePhase::Cancelled);
}

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
    let recorded = plan(&objects, &mut Memory::default(), t(10));
    assert_eq!(recorded.deadlines[0].deadline.time.0, t(600));
    assert_eq!(
        recorded.deadlines[0].deadline.then,
        "Failed (NodeDidNotReturn)"
    );
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

/// Three nodes: n0 NotReady since long before `t(0)` with its agent silent, n1 and n2 alive;
/// `n0_answers` is what n1's last probe of n0 (at `t(100)`) got.
fn one_dead_looking_node(spec: serde_json::Value, n0_answers: bool) -> Objects {
    let mut objects = cluster(3);
    objects.policies = vec![policy(spec).build()];
    objects.nodes[0] = node("n0").not_ready().build();
    objects.reports = vec![
        report("n0", -1000),
        report_seeing("n1", 150, &[("n0", n0_answers, 100), ("n2", true, 100)]),
        report("n2", 150),
    ];
    objects
}

#[test]
fn a_dead_node_is_tainted_out_of_service_and_one_its_peers_reach_is_not() {
    let spec =
        json!({"maxConcurrent": 1, "remediation": {"enabled": true, "outOfServiceTaint": true}});
    let dead = plan(
        &one_dead_looking_node(spec.clone(), false),
        &mut Memory::default(),
        t(200),
    );
    assert_eq!(dead.out_of_service.len(), 1, "{:?}", dead.out_of_service);
    let oos = &dead.out_of_service[0];
    assert_eq!(
        (oos.node.as_str(), oos.on, oos.uid.as_str()),
        ("n0", true, "uid-n0")
    );
    assert!(
        oos.message.contains("unreachable from 1 peer(s): n1"),
        "{}",
        oos.message
    );

    let cut_off = plan(
        &one_dead_looking_node(spec.clone(), true),
        &mut Memory::default(),
        t(200),
    );
    assert!(
        cut_off.out_of_service.is_empty(),
        "a peer still reaches it: {cut_off:?}"
    );

    let without = json!({"maxConcurrent": 1, "remediation": {"enabled": true}});
    let off = plan(
        &one_dead_looking_node(without, false),
        &mut Memory::default(),
        t(200),
    );
    assert!(
        off.out_of_service.is_empty(),
        "only where a policy asks for it"
    );
}

#[test]
fn out_of_service_waits_for_the_budget_and_pause() {
    let spec =
        json!({"maxConcurrent": 1, "remediation": {"enabled": true, "outOfServiceTaint": true}});
    let mut objects = one_dead_looking_node(spec, false);
    // Another node is NotReady too: the budget of 1 is taken.
    objects.nodes[2] = node("n2").not_ready().build();
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert!(round.out_of_service.is_empty(), "{round:?}");
    assert!(
        round
            .out_of_service_waits
            .iter()
            .any(|(n, why)| n == "n0"
                && why.contains("allows 1 disrupted nodes at once and has 1 (n2)")),
        "{:?}",
        round.out_of_service_waits
    );
    let paused = json!({"maxConcurrent": 3, "paused": true, "remediation": {"enabled": true, "outOfServiceTaint": true}});
    let round = plan(
        &one_dead_looking_node(paused, false),
        &mut Memory::default(),
        t(200),
    );
    assert!(round.out_of_service.is_empty());
    assert!(round.out_of_service_waits[0].1.contains("paused"));
}

#[test]
fn nodewards_out_of_service_taint_goes_once_the_node_is_ready() {
    let mut objects = cluster(1);
    let mut n0 = node("n0").build().as_ref().clone();
    nodeward_api::node::out_of_service(&mut n0, true, "dead");
    objects.nodes = vec![Arc::new(n0)];
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(round.out_of_service.len(), 1);
    assert!(!round.out_of_service[0].on);
}

#[test]
fn a_delete_node_of_a_dead_node_needs_no_agent_and_goes_straight_to_acting() {
    let spec = json!({"maxConcurrent": 1});
    let mut objects = one_dead_looking_node(spec, false);
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .action(MaintenanceAction::DeleteNode)
            .remediation()
            .build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(
        round.admit.len(),
        1,
        "admitted without its agent: {round:?}"
    );
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .action(MaintenanceAction::DeleteNode)
            .remediation()
            .admitted_by(&["pool"])
            .entered(MaintenancePhase::Admitted, 200)
            .build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(201));
    assert_eq!(round.overdue.len(), 1, "{round:?}");
    assert_eq!(
        (round.overdue[0].to, round.overdue[0].reason),
        (MaintenancePhase::Acting, "NodeDead")
    );
    // A Reboot of it still needs its agent.
    objects.maintenances = vec![maintenance("m0", "n0").remediation().build()];
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(round.deny[0].reason, "AgentUnavailable");
}
