//! Admission in a round: budgets, oldest first, the standing of an admission-only round,
//! slots freed and half-done admissions, superseded requests, invalid policies and pause.

use super::*;

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

#[test]
fn nodes_going_down_anyway_go_first_soonest_first_and_past_a_full_budget_then_urgent_ones() {
    let mut objects = cluster(5);
    objects.maintenances = vec![
        maintenance("old", "n0").created(10).build(),
        maintenance("later", "n1").created(50).deadline(400).build(),
        maintenance("sooner", "n2")
            .created(60)
            .deadline(300)
            .build(),
        maintenance("older", "n3").created(5).build(),
        maintenance("urgent", "n4").created(70).urgent().build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(200));
    let admitted: Vec<&str> = round.admit.iter().map(|a| a.maintenance.as_str()).collect();
    // The pool allows 2: both notices take them, and the others wait.
    assert_eq!(admitted, ["sooner", "later"]);
    assert!(
        round.deny.iter().all(|d| d.reason == "BudgetExhausted"),
        "{:?}",
        round.deny
    );
    // Without the notices, the urgent one goes before the older ones.
    objects
        .maintenances
        .retain(|m| m.spec.disruption_deadline.is_none());
    let round = plan(&objects, &mut Memory::default(), t(200));
    let admitted: Vec<&str> = round.admit.iter().map(|a| a.maintenance.as_str()).collect();
    assert_eq!(admitted, ["urgent", "older"]);
    // With the budget already full, a notice is still admitted, and counted.
    objects.maintenances = vec![
        maintenance("a", "n0").admitted_by(&["pool"]).build(),
        maintenance("b", "n1").admitted_by(&["pool"]).build(),
        maintenance("spot", "n2").deadline(260).build(),
    ];
    objects.policies = vec![
        policy(json!({"maxConcurrent": 2}))
            .slot("a", "n0")
            .slot("b", "n1")
            .build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(200));
    let admitted: Vec<&str> = round.admit.iter().map(|a| a.maintenance.as_str()).collect();
    assert_eq!(admitted, ["spot"]);
    assert_eq!(round.budget_use["pool"], (3, 2));
}

#[test]
fn nodes_other_actors_disrupt_use_the_budget_but_not_their_own_maintenances() {
    let mut objects = cluster(4);
    // Karpenter is taking n0 away and an admin cordoned n1: the policy's two slots are used.
    objects.nodes[0] = node("n0").tainted("karpenter.sh/disrupted").build();
    objects.nodes[1] = node("n1").cordoned().build();
    objects.maintenances = vec![maintenance("m2", "n2").build()];
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert!(round.admit.is_empty(), "{:?}", round.admit);
    let message = &round.deny[0].message;
    assert!(
        message.contains("n0 (karpenter (taint karpenter.sh/disrupted))")
            && message.contains("n1 (cordoned by someone else)"),
        "{message}"
    );
    let status = &round.policy_status["pool"];
    assert_eq!(status.disrupted_by_others, 2);
    assert_eq!(status.other_disruptions[1].by, "cordoned by someone else");
    assert_eq!(round.budget_use["pool"], (2, 2));

    // The cordoned node's own maintenance takes no other's slot: one is free for it.
    objects.nodes[0] = node("n0").build();
    objects.maintenances = vec![maintenance("m1", "n1").build()];
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(names(&round.admit, |a| &a.maintenance), ["m1"]);
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
    // Another coordinator recorded a halt (its status only: no slot changed).
    let mut halted = objects.policies.clone();
    set_condition(
        &mut Arc::make_mut(&mut halted[0])
            .status
            .get_or_insert_with(Default::default)
            .conditions,
        "Halted",
        "True",
        "FailureBudgetSpent",
        "1 of maxFailures 1 failed within 24h".into(),
        Some(3),
        t(350),
    );
    assert!(decide(&halted, &new).is_none());
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

/// A policy `pool` allowing 2 at once with one gate on Deployment `shop/web`.
fn gated_policy(expression: &str) -> Arc<DisruptionPolicy> {
    policy(json!({"maxConcurrent": 2, "gates": [{"name": "web-available",
        "object": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "web"},
        "expression": expression}]}))
    .build()
}

fn web(available: i64) -> BTreeMap<nodeward_api::policy::GateObject, crate::gates::Looked> {
    let object = nodeward_api::policy::GateObject {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        namespace: Some("shop".into()),
        name: "web".into(),
    };
    let found = json!({"spec": {"replicas": 3}, "status": {"availableReplicas": available}});
    BTreeMap::from([(object, crate::gates::Looked::Found(found))])
}

#[test]
fn a_closed_gate_denies_all_but_a_repair_and_a_node_going_down_anyway() {
    let mut objects = cluster(4);
    objects.policies = vec![gated_policy(
        "object.status.availableReplicas == object.spec.replicas",
    )];
    objects.maintenances = vec![
        maintenance("reboot", "n0").created(10).build(),
        maintenance("repair", "n1")
            .created(20)
            .remediation()
            .build(),
        maintenance("spot", "n2").created(30).deadline(400).build(),
    ];
    objects.gates = web(2);
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(admitted(&round), ["spot", "repair"]);
    assert_eq!(round.deny.len(), 1, "{:?}", round.deny);
    assert_eq!(round.deny[0].reason, "GateClosed");
    assert_eq!(
        round.deny[0].message,
        "policy pool: gate web-available (gates[0]): object.status.availableReplicas == object.spec.replicas is false of Deployment shop/web"
    );
    // Available again: the reboot goes.
    objects.maintenances.truncate(1);
    objects.gates = web(3);
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(admitted(&round), ["reboot"]);
}

#[test]
fn a_gate_that_does_not_compile_makes_its_policy_invalid_with_the_field_named() {
    let mut objects = cluster(2);
    objects.policies = vec![gated_policy("object.status.((")];
    objects.maintenances = vec![maintenance("m0", "n0").build()];
    objects.gates = web(3);
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(round.deny[0].reason, "Blocked");
    let valid = round.policy_status["pool"]
        .conditions
        .iter()
        .find(|c| c.type_ == "Valid")
        .expect("Valid");
    assert_eq!(valid.status, "False");
    assert!(
        valid
            .message
            .starts_with("gates[0].expression: not a CEL expression"),
        "{}",
        valid.message
    );
}

#[test]
fn a_new_maintenance_under_a_gated_policy_is_left_to_a_full_round() {
    let mut objects = cluster(3);
    objects.policies = vec![gated_policy("true")];
    objects.gates = web(3);
    let round = plan(&objects, &mut Memory::default(), t(200));
    let mut standing = round.standing.clone();
    let new = [maintenance("m0", "n0").build()];
    assert!(
        admit_new(
            &mut standing,
            &objects.policies,
            &new,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            t(201),
        )
        .is_none()
    );
}

/// The newcomer's rollout (review 2026-12-07, §2): the canary n0 succeeded, n1 failed and
/// spent the failure budget, n2 waits. The round that sees n1's failure frees its slot, and
/// must not give it to n2, whether n1's agent's clock (which wrote `finishedAt`) is behind the
/// coordinator's, with it, or ahead of it.
#[test]
fn the_round_in_which_a_failure_spends_the_budget_admits_nothing_whatever_slot_it_frees() {
    for agent_clock in [-30, 0, 1, 5, 120] {
        let now = 1_000;
        let mut objects = cluster(3);
        objects.reports = (0..3).map(|i| report(&format!("n{i}"), now)).collect();
        objects.policies = vec![
            policy(
                json!({"maxConcurrent": 1, "failureBudget": {"maxFailures": 1},
                "canary": {"nodes": 1, "soak": "1m", "validFor": "5m"}}),
            )
            .slot("m1", "n1")
            .build(),
        ];
        objects.maintenances = vec![
            maintenance("m0", "n0")
                .admitted_by(&["pool"])
                .finished(MaintenancePhase::Succeeded, 300, "Succeeded")
                .build(),
            maintenance("m1", "n1")
                .admitted_by(&["pool"])
                .finished(MaintenancePhase::Failed, now + agent_clock, "RolledBack")
                .build(),
            maintenance("m2", "n2").build(),
        ];
        let round = plan(&objects, &mut Memory::default(), t(now));
        assert!(
            round.admit.is_empty(),
            "agent's clock {agent_clock} s off: {:?}",
            admitted(&round)
        );
        assert_eq!(
            round.deny.iter().map(|d| d.reason).collect::<Vec<_>>(),
            ["RolloutHalted"],
            "agent's clock {agent_clock} s off"
        );
        let status = &round.policy_status["pool"];
        assert!(status.slots.is_empty(), "the failure's slot is freed");
        let halted = status.conditions.iter().find(|c| c.type_ == "Halted");
        assert_eq!(
            halted.map(|c| c.status.as_str()),
            Some("True"),
            "agent's clock {agent_clock} s off"
        );
    }
}

/// Two coordinators: the other one saw n0's failure, freed its slot and recorded the halt in
/// the policy's status; this one's watch of the maintenances has not caught up (n0 still
/// Verifying). The recorded halt holds the free slot all the same, until the spec changes
/// (a resume).
#[test]
fn a_halt_the_policys_status_records_holds_a_coordinator_that_has_not_seen_the_failure_yet() {
    let now = 1_000;
    let recorded = |generation: i64| {
        let mut p =
            policy(json!({"maxConcurrent": 2, "failureBudget": {"maxFailures": 1}})).build();
        let status = Arc::make_mut(&mut p).status.get_or_insert_default();
        set_condition(
            &mut status.conditions,
            "Halted",
            "True",
            "FailureBudgetSpent",
            "1 of maxFailures 1 failed within 24h: n0 (m0): RolledBack: the hook failed; nothing in scope is admitted until kubectl nodeward resume pool".into(),
            Some(generation),
            t(now - 1),
        );
        p
    };
    let mut objects = cluster(3);
    objects.reports = (0..3).map(|i| report(&format!("n{i}"), now)).collect();
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .admitted_by(&["pool"])
            .phase(MaintenancePhase::Verifying)
            .build(),
        maintenance("m1", "n1").build(),
    ];
    objects.policies = vec![recorded(3)];
    let round = plan(&objects, &mut Memory::default(), t(now));
    assert!(round.admit.is_empty(), "{:?}", admitted(&round));
    let denial = &round.deny[0];
    assert_eq!(denial.reason, "RolloutHalted");
    assert_eq!(
        denial.message,
        "policy pool is halted (as its status records: 1 of maxFailures 1 failed within 24h: n0 (m0): RolledBack: the hook failed); resume it with kubectl nodeward resume pool"
    );
    // Nor does this coordinator lift the halt it cannot see the cause of.
    let kept = round.policy_status.get("pool").map_or_else(
        || objects.policies[0].status.clone().unwrap_or_default(),
        Clone::clone,
    );
    let halted = kept.conditions.iter().find(|c| c.type_ == "Halted");
    assert_eq!(halted.map(|c| c.status.as_str()), Some("True"));
    // Resumed (the spec changed since the halt was recorded): this view's failures decide.
    objects.policies = vec![recorded(2)];
    let round = plan(&objects, &mut Memory::default(), t(now));
    assert_eq!(admitted(&round), ["m1"]);
    let halted = round.policy_status["pool"]
        .conditions
        .iter()
        .find(|c| c.type_ == "Halted")
        .map(|c| c.status.clone());
    assert_eq!(halted.as_deref(), Some("False"));
}

/// A canary's failure halts the rollout though `maxFailures` allows more: the next planned
/// reboot would otherwise go as a new canary with the same update.
#[test]
fn a_failed_canary_halts_the_rollout_whatever_max_failures_allows() {
    let now = 1_000;
    let mut objects = cluster(3);
    objects.reports = (0..3).map(|i| report(&format!("n{i}"), now)).collect();
    objects.policies = vec![
        policy(
            json!({"maxConcurrent": 1, "failureBudget": {"maxFailures": 3},
            "canary": {"nodes": 1}}),
        )
        .build(),
    ];
    objects.maintenances = vec![
        maintenance("m0", "n0")
            .admitted_by(&["pool"])
            .finished(MaintenancePhase::Failed, now - 10, "RolledBack")
            .build(),
        maintenance("m1", "n1").build(),
    ];
    let round = plan(&objects, &mut Memory::default(), t(now));
    assert!(round.admit.is_empty(), "{:?}", admitted(&round));
    assert_eq!(round.deny[0].reason, "RolloutHalted");
    assert!(
        round.deny[0].message.contains("n0 (m0, a canary)"),
        "{}",
        round.deny[0].message
    );
    // Not a canary (one succeeded before it was admitted): one failure of three goes on.
    objects.maintenances.push(
        maintenance("m2", "n2")
            .admitted_by(&["pool"])
            .finished(MaintenancePhase::Succeeded, -10, "Succeeded")
            .build(),
    );
    let round = plan(&objects, &mut Memory::default(), t(now));
    assert_eq!(admitted(&round), ["m1"]);
}
