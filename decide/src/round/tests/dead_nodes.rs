//! Dead nodes: the out-of-service taint under budgets and pause, and taken away once Ready.

use super::*;

/// Three nodes: n0 NotReady since long before `t(0)` with its agent silent (last heard at
/// `t(-1000)`, when it announced its fencing), n1 and n2 alive; `n0_answers` is what n1's last
/// probe of n0 (at `t(100)`) got.
fn one_dead_looking_node(spec: serde_json::Value, n0_answers: bool) -> Objects {
    let mut objects = cluster(3);
    objects.policies = vec![policy(spec).build()];
    objects.nodes[0] = node("n0").not_ready().build();
    objects.reports = vec![
        fencing(report("n0", -1000)),
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

    // Its agent does not fence it: it may still run its pods, and nothing marks it.
    let mut unfenced = one_dead_looking_node(spec.clone(), false);
    unfenced.reports[0] = report("n0", -1000);
    let round = plan(&unfenced, &mut Memory::default(), t(200));
    assert!(round.out_of_service.is_empty(), "{round:?}");
    assert!(
        round
            .out_of_service_waits
            .iter()
            .any(|(n, why)| n == "n0" && why.contains("does not fence")),
        "{:?}",
        round.out_of_service_waits
    );

    // Announced on a boot before the one the kubelet reports: the agent never came back.
    let mut rebooted = one_dead_looking_node(spec.clone(), false);
    let mut node = rebooted.nodes[0].as_ref().clone();
    if let Some(status) = node.status.as_mut() {
        status.node_info = Some(k8s_openapi::api::core::v1::NodeSystemInfo {
            boot_id: "boot-2".into(),
            ..Default::default()
        });
    }
    rebooted.nodes[0] = Arc::new(node);
    let round = plan(&rebooted, &mut Memory::default(), t(200));
    assert!(round.out_of_service.is_empty(), "{round:?}");
    assert!(round.out_of_service_waits[0].1.contains("does not fence"));
    let mut n0 = rebooted.reports[0].as_ref().clone();
    if let Some(status) = n0.status.as_mut() {
        status.boot_id = Some("boot-2".into());
    }
    rebooted.reports[0] = Arc::new(n0);
    let round = plan(&rebooted, &mut Memory::default(), t(200));
    assert_eq!(round.out_of_service.len(), 1, "announced on this boot");

    // Silent for 100 s (past the policy's agentHeartbeat of 60 s), but its fencing (60 s), its
    // watchdog (30 s) and the margin (30 s) since are not over yet.
    let quick = json!({"maxConcurrent": 1, "deadlines": {"agentHeartbeat": "60s"},
        "remediation": {"enabled": true, "outOfServiceTaint": true}});
    let mut recent = one_dead_looking_node(quick, false);
    recent.reports[0] = fencing(report("n0", 100));
    let round = plan(&recent, &mut Memory::default(), t(200));
    assert!(round.out_of_service.is_empty(), "{round:?}");
    assert!(
        round.out_of_service_waits[0].1.contains("down by"),
        "{:?}",
        round.out_of_service_waits
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
fn a_fencing_nodes_probes_recorded_by_live_peers_a_peer_full_of_probes_and_silent_agents_hold_the_taint()
 {
    let spec =
        json!({"maxConcurrent": 1, "remediation": {"enabled": true, "outOfServiceTaint": true}});
    let waits_for = |objects: &Objects, what: &str| {
        let round = plan(objects, &mut Memory::default(), t(200));
        assert!(round.out_of_service.is_empty(), "{round:?}");
        assert!(
            round
                .out_of_service_waits
                .iter()
                .any(|(n, why)| n == "n0" && why.contains(what)),
            "{what}: {:?}",
            round.out_of_service_waits
        );
    };
    // n1 recorded a probe of n0's fencing at 150: n0 may count that answer for its 60 s.
    let mut probed = one_dead_looking_node(spec.clone(), false);
    let mut n1 = probed.reports[1].as_ref().clone();
    if let Some(status) = n1.status.as_mut() {
        status.peer_sightings[0].probed_at = Some(Time(t(150)));
    }
    probed.reports[1] = Arc::new(n1);
    waits_for(&probed, "down by");
    assert_eq!(
        plan(&probed, &mut Memory::default(), t(270))
            .out_of_service
            .len(),
        1
    );

    // n2's list is full of other nodes' fencing probes (a big partition): it may have
    // dropped n0's.
    let mut full = one_dead_looking_node(spec.clone(), false);
    let mut n2 = full.reports[2].as_ref().clone();
    if let Some(status) = n2.status.as_mut() {
        status.peer_sightings = (0..nodeward_api::report::PEER_SIGHTINGS_LIMIT)
            .map(|i| {
                serde_json::from_value(json!({"node": format!("far{i}"), "reachable": true,
                    "time": t(100).to_string(), "probedAt": t(100).to_string()}))
                .expect("sighting")
            })
            .collect();
    }
    full.reports[2] = Arc::new(n2);
    waits_for(&full, "peer(s) n2 list fencing probes from 32 nodes");

    // n0 counts 3 agents and n2 is silent too: n2 may be answering n0's probes unseen.
    let mut partitioned = one_dead_looking_node(spec, false);
    let mut n0 = partitioned.reports[0].as_ref().clone();
    if let Some(fencing) = n0.status.as_mut().and_then(|s| s.fencing.as_mut()) {
        fencing.agents = 3;
    }
    partitioned.reports[0] = Arc::new(n0);
    partitioned.reports[2] = report("n2", -1000);
    waits_for(
        &partitioned,
        "2 of the 3 agents its fencing counts are silent",
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
    // Not without its fencing: the node may still run its pods, and deleting its Node would
    // start them elsewhere.
    let mut unfenced = objects.clone();
    unfenced.reports[0] = report("n0", -1000);
    let round = plan(&unfenced, &mut Memory::default(), t(201));
    assert!(round.overdue.is_empty(), "{round:?}");
    // A Reboot of it still needs its agent.
    objects.maintenances = vec![maintenance("m0", "n0").remediation().build()];
    let round = plan(&objects, &mut Memory::default(), t(200));
    assert_eq!(round.deny[0].reason, "AgentUnavailable");
}
