//! Each policy's status as the round leaves it: its slots and counts, and its `Paused`,
//! `RemediationAllowed` and `Valid` conditions. Only statuses that change are written.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use nodeward_api::{
    DisruptionPolicyStatus, MaintenancePhase,
    conditions::policy as policy_conditions,
    policy::{BudgetSlot, OTHER_DISRUPTIONS_LIMIT, OtherDisruption},
};

use super::{
    Plan, PolicyMark, count,
    remediate::{Assessed, Gate},
    surge,
    view::{Index, PolicyView},
};
use crate::{admission::decide::Cluster, pause, progress};

/// Sets `type_` in `conditions`, keeping its transition time when the status is unchanged.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    nodeward_api::conditions::set(
        conditions,
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: Time(now),
        },
    );
}

/// What each policy's status lists from this round's decisions, by policy.
pub(super) struct Listed<'a> {
    /// The slots each keeps after admission.
    pub slots: BTreeMap<String, Vec<BudgetSlot>>,
    /// The single-replica Deployments on the nodes of its pending maintenances, as scanned.
    pub scans: &'a BTreeMap<String, surge::Scan>,
    /// The cluster's NotReady nodes.
    pub not_ready: &'a BTreeSet<String>,
}

/// Puts each policy's new status into `plan` where it changed, with its budget use and the
/// mark a later admission-only round checks: `gates` are their remediation gates (in
/// [`Index::policies`] order).
pub(super) fn write(
    index: &Index,
    health: &Assessed,
    cluster: &Cluster,
    listed: Listed<'_>,
    gates: &[Gate],
    now: Timestamp,
    plan: &mut Plan,
) {
    let Listed {
        mut slots,
        scans,
        not_ready,
    } = listed;
    let pending: BTreeSet<&str> = index
        .maintenances
        .values()
        .filter(|m| m.phase() == MaintenancePhase::Pending)
        .map(|m| m.spec.node_name.as_str())
        .collect();
    for (position, p) in index.policies.iter().enumerate() {
        let old = p.policy.status.clone().unwrap_or_default();
        let generation = p.policy.metadata.generation;
        let unhealthy = health.unhealthy_under(position);
        let mut status = DisruptionPolicyStatus {
            slots: slots.remove(&p.name).unwrap_or_default(),
            matched: count(p.matched.len()),
            ready: count(
                p.matched.len() - not_ready.iter().filter(|n| p.matched.contains(*n)).count(),
            ),
            unhealthy: count(unhealthy),
            in_maintenance: count(
                cluster
                    .disrupted
                    .iter()
                    .filter(|n| p.matched.contains(*n))
                    .count(),
            ),
            disrupted_by_others: count(
                cluster
                    .others
                    .keys()
                    .filter(|n| p.matched.contains(*n))
                    .count(),
            ),
            other_disruptions: cluster
                .others
                .iter()
                .filter(|(n, _)| p.matched.contains(*n))
                .take(OTHER_DISRUPTIONS_LIMIT)
                .map(|(node, by)| OtherDisruption {
                    node_name: node.clone(),
                    by: by.clone(),
                })
                .collect(),
            conditions: old.conditions.clone(),
            progress: Some(progress::progress(
                &p.name,
                &p.matched,
                p.maintenances.iter().copied(),
                |node| needs_more(index, node),
            )),
            rollout_risks: surge::risks(
                pending.iter().copied().filter(|n| p.matched.contains(*n)),
                scans,
            ),
            observed_generation: generation,
        };
        let in_use = cluster
            .policies
            .iter()
            .find(|s| s.name == p.name)
            .map_or(0, |s| cluster.in_use(s, not_ready, None).len());
        plan.budget_use
            .insert(p.name.clone(), (in_use, p.max_concurrent));
        let gate = gates.get(position).cloned().flatten();
        set_conditions(&mut status, index, p, (unhealthy, gate), now);
        plan.standing.policies.insert(
            p.name.clone(),
            PolicyMark {
                generation,
                slots: status.slots.iter().map(|s| s.uid.clone()).collect(),
            },
        );
        if status != old {
            plan.policy_status.insert(p.name.clone(), status);
        }
    }
}

/// Every condition of `p`'s new `status`: `unhealthy` and `gate` are its remediation gate's.
fn set_conditions(
    status: &mut DisruptionPolicyStatus,
    index: &Index,
    p: &PolicyView,
    (unhealthy, gate): (usize, Gate),
    now: Timestamp,
) {
    let conditions = &mut status.conditions;
    set_paused(conditions, index, p, now);
    set_remediation_allowed(conditions, p, unhealthy, gate, now);
    set_valid(conditions, p, now);
    set_halted(conditions, p, now);
    set_canary_passed(conditions, p, now);
    if let Some(progress) = &status.progress {
        let (all, message) = progress::summary(progress);
        let (state, reason) = if all {
            ("True", "AllUpdated")
        } else {
            ("False", "Updating")
        };
        set_condition(
            conditions,
            policy_conditions::UPDATED,
            state,
            reason,
            message,
            p.policy.metadata.generation,
            now,
        );
    }
}

/// Whether `node` says it needs more than it has: a reboot (`RebootRequired`), or updates its
/// inventory counts as pending.
fn needs_more(index: &Index, node: &str) -> bool {
    let reboot = index.nodes.get(node).is_some_and(|n| {
        nodeward_api::node::condition(n, nodeward_api::conditions::node::REBOOT_REQUIRED)
            .is_some_and(|c| c.status == "True")
    });
    let updates = index.reports.get(node).is_some_and(|r| {
        r.status
            .as_ref()
            .and_then(|s| s.inventory.as_ref())
            .and_then(|i| i.updates_pending)
            .is_some_and(|n| n > 0)
    });
    reboot || updates
}

/// `Paused`: true only once every agent in scope acknowledged the pause and nothing is
/// admitted (about to drain), draining or acting.
fn set_paused(conditions: &mut Vec<Condition>, index: &Index, p: &PolicyView, now: Timestamp) {
    let generation = p.policy.metadata.generation;
    // Acknowledgements matter only while paused (thousands of nodes otherwise).
    let agents: BTreeMap<String, Option<i64>> = p
        .matched
        .iter()
        .filter(|_| p.policy.spec.paused)
        .filter_map(|n| {
            let report = index.reports.get(n.as_str())?;
            let ack = report.status.as_ref().and_then(|s| {
                s.pause_acknowledgements
                    .iter()
                    .find(|a| a.policy == p.name)
                    .map(|a| a.observed_generation)
            });
            Some((n.clone(), ack))
        })
        .collect();
    let acting = p
        .maintenances
        .iter()
        .filter(|m| p.matched.contains(&m.spec.node_name))
        .filter(|m| {
            // Admitted: its agent starts draining it whether paused or not.
            matches!(
                m.phase(),
                MaintenancePhase::Admitted | MaintenancePhase::Draining | MaintenancePhase::Acting
            )
        })
        .count();
    let (state, reason, message) = pause::pause_state(
        p.policy.spec.paused,
        generation.unwrap_or(0),
        &agents,
        acting,
    )
    .condition();
    set_condition(
        conditions,
        policy_conditions::PAUSED,
        state,
        reason,
        message,
        generation,
        now,
    );
}

/// `RemediationAllowed`: the `maxUnhealthy` gate's verdict; absent without remediation.
fn set_remediation_allowed(
    conditions: &mut Vec<Condition>,
    p: &PolicyView,
    unhealthy: usize,
    gate: Gate,
    now: Timestamp,
) {
    let generation = p.policy.metadata.generation;
    match gate {
        Some(Ok(())) => set_condition(
            conditions,
            policy_conditions::REMEDIATION_ALLOWED,
            "True",
            "WithinLimits",
            format!(
                "{unhealthy} of {} matched nodes unhealthy{}",
                p.matched.len(),
                p.max_unhealthy
                    .map(|l| format!(", maxUnhealthy {l}"))
                    .unwrap_or_default()
            ),
            generation,
            now,
        ),
        Some(Err(why)) => set_condition(
            conditions,
            policy_conditions::REMEDIATION_ALLOWED,
            "False",
            nodeward_api::conditions::denial::TOO_MANY_UNHEALTHY,
            why,
            generation,
            now,
        ),
        None => conditions.retain(|c| c.type_ != policy_conditions::REMEDIATION_ALLOWED),
    }
}

/// `Valid`: false, saying what to fix, while the spec cannot be applied; absent otherwise.
/// `Halted`: whether the failure budget is spent (absent without one). A halt recorded for
/// the current spec stays until a resume changes the spec, even once this round's failures no
/// longer spend the budget: a coordinator whose watch has not caught up with a failure must not
/// lift the halt another one recorded for it, and the docs promise a halt until a resume.
fn set_halted(conditions: &mut Vec<Condition>, p: &PolicyView, now: Timestamp) {
    let Some(spending) = &p.failures else {
        conditions.retain(|c| c.type_ != policy_conditions::HALTED);
        return;
    };
    if !spending.halted() && p.recorded_halt.is_some() {
        return;
    }
    let (state, reason, message) = if spending.halted() {
        (
            "True",
            "FailureBudgetSpent",
            format!(
                "{}{}{}",
                spending.message(),
                crate::failures::UNTIL_RESUMED,
                p.name
            ),
        )
    } else {
        ("False", "WithinFailureBudget", spending.message())
    };
    set_condition(
        conditions,
        policy_conditions::HALTED,
        state,
        reason,
        message,
        p.policy.metadata.generation,
        now,
    );
}

/// `CanaryPassed`: whether the rest of the scope may go (for a maintenance created now);
/// absent without a canary stage.
fn set_canary_passed(conditions: &mut Vec<Condition>, p: &PolicyView, now: Timestamp) {
    let Some(stage) = &p.canary else {
        conditions.retain(|c| c.type_ != policy_conditions::CANARY_PASSED);
        return;
    };
    let (state, reason, message) = match stage.rest_may_go(now, false, now) {
        Ok(()) => (
            "True",
            "CanariesSucceeded",
            "the canaries succeeded and soaked: the rest of the scope may go".to_owned(),
        ),
        Err(why) => (
            "False",
            nodeward_api::conditions::denial::CANARY_PENDING,
            why,
        ),
    };
    set_condition(
        conditions,
        policy_conditions::CANARY_PASSED,
        state,
        reason,
        message,
        p.policy.metadata.generation,
        now,
    );
}

fn set_valid(conditions: &mut Vec<Condition>, p: &PolicyView, now: Timestamp) {
    if let Some(problem) = &p.problem {
        set_condition(
            conditions,
            policy_conditions::VALID,
            "False",
            "InvalidSpec",
            format!("{problem}; nothing in scope is admitted until it is fixed"),
            p.policy.metadata.generation,
            now,
        );
    } else {
        conditions.retain(|c| c.type_ != policy_conditions::VALID);
    }
}
