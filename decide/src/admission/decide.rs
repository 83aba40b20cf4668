//! The admission decision: a pending maintenance is admitted only if it breaks none of the
//! rules in [`RULES`] for any policy that matches its node (budgets, pause and windows,
//! blockers, the node's agent, its workloads, control-plane quorum, `maxUnhealthy`). What
//! admission knows of the cluster is plain data here ([`Cluster`]); the rounds in
//! [`crate::round`] build it and take pending maintenances oldest first, each admission
//! counting against the next.

use std::collections::BTreeSet;

use nodeward_api::conditions::denial;

pub use super::cluster::{Cluster, NodeState, Pending, PolicyState};
use super::rules::{self, Inputs};
pub use super::rules::{Denial, Exception, MAX_POLICIES_PER_NODE, RULES};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admitted: a slot in each of these policies.
    Admit { policies: Vec<String> },
    /// Not now: which rule denied it, and why.
    Deny(Denial),
}

/// Decides one pending maintenance against the current state (`not_ready`: the cluster's
/// [`Cluster::not_ready`]): the first of [`RULES`] it breaks denies it, naming the rule.
pub fn decide(cluster: &Cluster, not_ready: &BTreeSet<String>, pending: &Pending) -> Decision {
    let Some(node) = cluster.nodes.get(&pending.node) else {
        return Decision::Deny(Denial {
            rule: rules::NODE,
            reason: denial::BLOCKED,
            message: format!("node {} does not exist", pending.node),
        });
    };
    let policies: Vec<&PolicyState> = cluster
        .policies
        .iter()
        .filter(|p| p.matched.contains(&pending.node))
        .collect();
    let inputs = Inputs {
        cluster,
        not_ready,
        node,
        pending,
        policies: &policies,
    };
    match RULES.iter().find_map(|rule| rule.judge(&inputs).err()) {
        None => Decision::Admit {
            policies: policies.iter().map(|p| p.name.clone()).collect(),
        },
        Some(denied) => Decision::Deny(denied),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nodeward_api::MaintenanceReason;

    use super::*;

    fn decide(cluster: &Cluster, pending: &Pending) -> Decision {
        super::decide(cluster, &cluster.not_ready(), pending)
    }

    fn ready() -> NodeState {
        NodeState {
            ready: true,
            ..NodeState::default()
        }
    }

    fn cluster(workers: usize, control_planes: usize) -> Cluster {
        let mut nodes = BTreeMap::new();
        for i in 0..workers {
            nodes.insert(format!("w{i}"), ready());
        }
        for i in 0..control_planes {
            nodes.insert(
                format!("cp{i}"),
                NodeState {
                    control_plane: true,
                    ..ready()
                },
            );
        }
        Cluster {
            policies: vec![policy("all", nodes.keys().cloned().collect(), 2)],
            nodes,
            disrupted: BTreeSet::new(),
            others: BTreeMap::new(),
            by_reason: BTreeMap::new(),
        }
    }

    fn policy(name: &str, matched: BTreeSet<String>, max_concurrent: usize) -> PolicyState {
        PolicyState {
            name: name.into(),
            matched,
            max_concurrent,
            max_by_reason: BTreeMap::new(),
            max_unhealthy: None,
            paused: false,
            window_open: true,
            next_window: None,
            blackout: None,
            allow_sole_control_plane: false,
            checks_workloads: true,
            invalid: None,
            deadlines: nodeward_api::policy::Deadlines::resolve(None),
            halted: None,
            gate_closed: None,
            canary: None,
        }
    }

    fn node<'a>(c: &'a mut Cluster, name: &str) -> &'a mut NodeState {
        c.nodes.get_mut(name).expect("a node of the test cluster")
    }

    fn pending(node: &str) -> Pending {
        Pending {
            maintenance: format!("m-{node}"),
            node: node.into(),
            reason: MaintenanceReason::Manual,
            needs_agent: true,
            disruption_deadline: None,
            urgent: false,
            planned: None,
        }
    }

    fn reason(decision: &Decision) -> &'static str {
        match decision {
            Decision::Admit { .. } => "Admit",
            Decision::Deny(denied) => denied.reason,
        }
    }

    #[test]
    fn not_ready_nodes_count_against_the_budget_but_not_the_node_itself() {
        let mut c = cluster(4, 0);
        node(&mut c, "w3").ready = false;
        c.disrupted.insert("w0".into());
        let d = decide(&c, &pending("w1"));
        assert_eq!(reason(&d), "BudgetExhausted");
        if let Decision::Deny(Denial { message, .. }) = &d {
            assert!(
                message.contains("allows 2 disrupted nodes at once and has 2 (w0, w3)"),
                "{message}"
            );
        }
        // The NotReady node itself may be repaired within the budget.
        c.disrupted.clear();
        assert_eq!(reason(&decide(&c, &pending("w3"))), "Admit");
    }

    #[test]
    fn a_reasons_budget_holds_its_reason_within_max_concurrent() {
        let mut c = cluster(4, 0);
        c.policies[0].max_concurrent = 3;
        c.policies[0]
            .max_by_reason
            .insert(MaintenanceReason::Remediation, 1);
        c.disrupt("w0", MaintenanceReason::Remediation);
        let repair = Pending {
            reason: MaintenanceReason::Remediation,
            ..pending("w1")
        };
        let d = decide(&c, &repair);
        assert_eq!(reason(&d), "BudgetExhausted");
        if let Decision::Deny(Denial { message, rule, .. }) = &d {
            assert_eq!(*rule, "budget");
            assert_eq!(
                message,
                "policy all allows 1 Remediation maintenances at once and has 1 (w0)"
            );
        }
        // Another reason takes what is left of maxConcurrent.
        assert_eq!(reason(&decide(&c, &pending("w1"))), "Admit");
        c.disrupt("w1", MaintenanceReason::Manual);
        c.disrupt("w2", MaintenanceReason::Reboot);
        assert_eq!(
            reason(&decide(&c, &pending("w3"))),
            "BudgetExhausted",
            "maxConcurrent still holds"
        );
        // A half-done admission decided again is not held back by itself (the round takes
        // its node out first, as here).
        c.undisrupt("w1", MaintenanceReason::Manual);
        c.undisrupt("w2", MaintenanceReason::Reboot);
        c.undisrupt("w0", MaintenanceReason::Remediation);
        let own = Pending {
            reason: MaintenanceReason::Remediation,
            ..pending("w0")
        };
        assert_eq!(reason(&decide(&c, &own)), "Admit");
    }

    #[test]
    fn a_node_going_down_anyway_waits_only_for_its_agent_and_a_pause() {
        let mut c = cluster(3, 1);
        c.policies[0].max_concurrent = 1;
        c.policies[0].window_open = false;
        c.disrupt("w0", MaintenanceReason::Reboot);
        node(&mut c, "w1").blocker = Some("pod a/b blocks reboots".into());
        node(&mut c, "w1").workload = Some("PodDisruptionBudget a/pdb allows 0".into());
        node(&mut c, "cp0").ready = false;
        let notice = |node: &str| Pending {
            disruption_deadline: Some(jiff::Timestamp::UNIX_EPOCH),
            ..pending(node)
        };
        assert_eq!(reason(&decide(&c, &pending("w1"))), denial::OUTSIDE_WINDOW);
        // Outside its window, blocked, its PodDisruptionBudget spent, the budget full and a
        // control-plane node down: the cloud takes it anyway, so it is drained first.
        assert_eq!(reason(&decide(&c, &notice("w1"))), "Admit");
        // What it cannot go without: its agent (who drains it), and an operator's pause.
        node(&mut c, "w1").agent_unavailable = Some("node w1 has no agent heartbeat".into());
        assert_eq!(
            reason(&decide(&c, &notice("w1"))),
            denial::AGENT_UNAVAILABLE
        );
        node(&mut c, "w1").agent_unavailable = None;
        c.policies[0].paused = true;
        assert_eq!(reason(&decide(&c, &notice("w1"))), denial::PAUSED);
        // The rules it is let through are the table's, by name.
        let waived: Vec<&str> = RULES
            .iter()
            .filter(|r| r.waived_for.contains(&Exception::Unavoidable))
            .map(|r| r.name)
            .collect();
        assert_eq!(
            waived,
            [
                "failureBudget",
                "window",
                "blackout",
                "blocker",
                "gate",
                "canary",
                "workloads",
                "quorum",
                "budget"
            ]
        );
    }

    #[test]
    fn an_urgent_one_skips_windows_and_blockers_and_nothing_else() {
        let mut c = cluster(3, 0);
        c.policies[0].window_open = false;
        node(&mut c, "w1").blocker = Some("pod a/b blocks reboots".into());
        let urgent = |node: &str| Pending {
            urgent: true,
            ..pending(node)
        };
        assert_eq!(reason(&decide(&c, &pending("w1"))), denial::OUTSIDE_WINDOW);
        assert_eq!(reason(&decide(&c, &urgent("w1"))), "Admit");
        // Never past a budget, a PodDisruptionBudget, a blackout, a halt or a pause.
        c.policies[0].max_concurrent = 1;
        c.disrupt("w0", MaintenanceReason::Reboot);
        assert_eq!(reason(&decide(&c, &urgent("w1"))), denial::BUDGET_EXHAUSTED);
        c.undisrupt("w0", MaintenanceReason::Reboot);
        node(&mut c, "w1").workload = Some("PodDisruptionBudget a/pdb allows 0".into());
        assert_eq!(
            reason(&decide(&c, &urgent("w1"))),
            denial::WORKLOAD_NOT_READY
        );
        node(&mut c, "w1").workload = None;
        c.policies[0].blackout = Some("year-end freeze until 2027-01-04".into());
        assert_eq!(reason(&decide(&c, &urgent("w1"))), denial::IN_BLACKOUT);
        c.policies[0].blackout = None;
        c.policies[0].halted = Some("2 failed".into());
        assert_eq!(reason(&decide(&c, &urgent("w1"))), denial::ROLLOUT_HALTED);
        c.policies[0].halted = None;
        c.policies[0].paused = true;
        assert_eq!(reason(&decide(&c, &urgent("w1"))), denial::PAUSED);
        let urgent_waives: Vec<&str> = RULES
            .iter()
            .filter(|r| r.waived_for.contains(&Exception::Urgent))
            .map(|r| r.name)
            .collect();
        assert_eq!(urgent_waives, ["window", "blocker"]);
    }

    #[test]
    fn every_matching_policy_must_allow_it() {
        let mut c = cluster(4, 0);
        c.policies
            .push(policy("pool-a", ["w0", "w1"].map(String::from).into(), 1));
        c.disrupted.insert("w1".into());
        assert_eq!(
            reason(&decide(&c, &pending("w0"))),
            "BudgetExhausted",
            "pool-a is full"
        );
        assert_eq!(
            reason(&decide(&c, &pending("w2"))),
            "Admit",
            "w2 is not in pool-a"
        );
    }

    #[test]
    fn paused_and_closed_windows_deny() {
        let mut c = cluster(2, 0);
        c.policies[0].window_open = false;
        assert_eq!(reason(&decide(&c, &pending("w0"))), "OutsideWindow");
        c.policies[0].next_window = Some("2026-11-30T08:00:00Z".parse().expect("a time"));
        match decide(&c, &pending("w0")) {
            Decision::Deny(denied) => assert!(
                denied
                    .message
                    .ends_with("; the next opens at 2026-11-30T08:00:00Z"),
                "{}",
                denied.message
            ),
            other => panic!("{other:?}"),
        }
        c.policies[0].paused = true;
        assert_eq!(
            reason(&decide(&c, &pending("w0"))),
            "Paused",
            "paused is said first"
        );
    }

    #[test]
    fn control_plane_quorum_is_protected() {
        let mut c = cluster(2, 3);
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "Admit");
        node(&mut c, "cp2").ready = false;
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "QuorumProtected");
        assert_eq!(
            reason(&decide(&c, &pending("w0"))),
            "Admit",
            "workers go on"
        );
        node(&mut c, "cp2").ready = true;
        c.disrupted.insert("cp1".into());
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "QuorumProtected");
    }

    #[test]
    fn the_only_control_plane_node_needs_explicit_permission() {
        let mut c = cluster(1, 1);
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "QuorumProtected");
        c.policies[0].allow_sole_control_plane = true;
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "Admit");
    }

    #[test]
    fn remediation_stops_when_too_many_are_unhealthy() {
        let mut c = cluster(5, 0);
        c.policies[0].max_concurrent = 5;
        c.policies[0].max_unhealthy = Some(1);
        for n in ["w0", "w1"] {
            node(&mut c, n).unhealthy = true;
        }
        let mut p = pending("w0");
        p.reason = MaintenanceReason::Remediation;
        assert_eq!(reason(&decide(&c, &p)), "TooManyUnhealthy");
        p.reason = MaintenanceReason::Reboot;
        assert_eq!(
            reason(&decide(&c, &p)),
            "Admit",
            "a planned reboot is not remediation"
        );
    }

    #[test]
    fn blockers_unknown_nodes_and_second_maintenances_are_blocked() {
        let mut c = cluster(2, 0);
        node(&mut c, "w0").blocker = Some("pod db/primary-0 matches a blocking selector".into());
        assert_eq!(reason(&decide(&c, &pending("w0"))), "Blocked");
        assert_eq!(reason(&decide(&c, &pending("ghost"))), "Blocked");
        c.disrupted.insert("w1".into());
        assert_eq!(reason(&decide(&c, &pending("w1"))), "Blocked");
        let repair = Pending {
            reason: MaintenanceReason::Remediation,
            ..pending("w0")
        };
        assert_eq!(
            reason(&decide(&c, &repair)),
            "Admit",
            "blockers do not hold back remediation"
        );
    }

    #[test]
    fn a_node_a_disruption_budget_holds_back_waits_unless_every_policy_of_it_stops_checking() {
        let mut c = cluster(2, 0);
        let why = "PodDisruptionBudget shop/web of Deployment shop/web allows no disruption now";
        node(&mut c, "w0").workload = Some(why.into());
        let denied = decide(&c, &pending("w0"));
        assert_eq!(reason(&denied), denial::WORKLOAD_NOT_READY);
        assert!(
            matches!(&denied, Decision::Deny(d) if d.message == why),
            "{denied:?}"
        );
        assert_eq!(reason(&decide(&c, &pending("w1"))), "Admit");
        let coordinator_action = Pending {
            needs_agent: false,
            ..pending("w0")
        };
        assert_eq!(
            reason(&decide(&c, &coordinator_action)),
            "Admit",
            "nothing is drained"
        );
        // One policy of several checking is enough; none selecting the node checks too.
        let mut second = policy("second", c.policies[0].matched.clone(), 2);
        second.checks_workloads = false;
        c.policies.push(second);
        assert_eq!(reason(&decide(&c, &pending("w0"))), "WorkloadNotReady");
        c.policies[0].checks_workloads = false;
        assert_eq!(reason(&decide(&c, &pending("w0"))), "Admit");
        c.policies.clear();
        assert_eq!(reason(&decide(&c, &pending("w0"))), "WorkloadNotReady");
    }

    #[test]
    fn a_node_without_a_live_agent_is_admitted_only_for_what_needs_none() {
        let mut c = cluster(2, 0);
        node(&mut c, "w0").agent_unavailable = Some("node w0 has no agent heartbeat".into());
        let denied = decide(&c, &pending("w0"));
        assert_eq!(reason(&denied), denial::AGENT_UNAVAILABLE);
        assert!(
            matches!(&denied, Decision::Deny(d) if d.message == "node w0 has no agent heartbeat"),
            "{denied:?}"
        );
        assert_eq!(reason(&decide(&c, &pending("w1"))), "Admit");
        let coordinator_action = Pending {
            needs_agent: false,
            ..pending("w0")
        };
        assert_eq!(reason(&decide(&c, &coordinator_action)), "Admit");
        c.policies[0].paused = true;
        assert_eq!(
            reason(&decide(&c, &pending("w0"))),
            denial::PAUSED,
            "the policy's own state is said first"
        );
    }

    /// Each rule of the table, broken alone, denies under its own name with one of its own
    /// reasons; and a node that breaks several hears the first in the table's order.
    #[test]
    fn each_rule_denies_under_its_name_with_its_reasons() {
        type Breaks = fn(&mut Cluster, &mut Pending);
        let cases: [(&str, Breaks); 15] = [
            ("node", |c, _| {
                c.disrupted.insert("cp0".into());
            }),
            ("policiesValid", |c, _| {
                c.policies[0].invalid = Some("bad selector".into());
            }),
            ("paused", |c, _| c.policies[0].paused = true),
            ("failureBudget", |c, _| {
                c.policies[0].halted = Some("2 of maxFailures 2 failed within 24h".into());
            }),
            ("window", |c, _| c.policies[0].window_open = false),
            ("blackout", |c, _| {
                c.policies[0].blackout = Some("in a blackout until 2027-01-04T00:00:00Z".into());
            }),
            ("blocker", |c, _| {
                node(c, "cp0").blocker = Some("pod db/primary-0".into());
            }),
            ("gate", |c, _| {
                c.policies[0].gate_closed = Some("gate ceph (gates[0]): not read yet".into());
            }),
            ("canary", |c, p| {
                // cp0's planned reboot waits for the canary under way on w0.
                let mut stage =
                    crate::canary::stage("all", &nodeward_api::policy::Canary::default(), None, []);
                stage.admitted("w0");
                c.policies[0].canary = Some(stage);
                p.planned = Some(crate::admission::cluster::Planned {
                    created: jiff::Timestamp::UNIX_EPOCH,
                    now: jiff::Timestamp::UNIX_EPOCH,
                });
            }),
            ("agent", |c, _| {
                node(c, "cp0").agent_unavailable = Some("no heartbeat".into());
            }),
            ("workloads", |c, _| {
                node(c, "cp0").workload = Some("PodDisruptionBudget shop/web".into());
            }),
            ("quorum", |c, _| node(c, "cp1").ready = false),
            ("maxUnhealthy", |c, p| {
                p.reason = MaintenanceReason::Remediation;
                c.policies[0].max_unhealthy = Some(0);
                node(c, "w0").unhealthy = true;
            }),
            ("budget", |c, _| c.policies[0].max_concurrent = 0),
            ("podsKnown", |c, _| {
                node(c, "cp0").unscanned = Some("not scanned yet".into());
            }),
        ];
        let names: Vec<&str> = RULES.iter().map(|r| r.name).collect();
        assert_eq!(
            names,
            cases.map(|(name, _)| name),
            "one case per rule, in order"
        );
        let base = cluster(2, 2);
        assert_eq!(reason(&decide(&base, &pending("cp0"))), "Admit");
        let mut all = base.clone();
        let mut all_pending = pending("cp0");
        for (rule, breaks) in cases.iter().rev() {
            let mut c = base.clone();
            let mut p = pending("cp0");
            breaks(&mut c, &mut p);
            match decide(&c, &p) {
                Decision::Deny(d) => {
                    assert_eq!(d.rule, *rule, "{d:?}");
                    let of = RULES.iter().find(|r| r.name == *rule).expect("in RULES");
                    assert!(of.reasons.contains(&d.reason), "{d:?}");
                }
                admitted => panic!("{rule} broken alone: {admitted:?}"),
            }
            // Only a Remediation breaks maxUnhealthy, and blockers do not hold one back.
            if *rule == "maxUnhealthy" {
                continue;
            }
            breaks(&mut all, &mut all_pending);
            match decide(&all, &all_pending) {
                Decision::Deny(d) => assert_eq!(d.rule, *rule, "the first broken: {d:?}"),
                admitted => panic!("{admitted:?}"),
            }
        }
    }
}
