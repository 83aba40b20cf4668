//! Admission: pending maintenances decided oldest first (those whose node goes down anyway
//! before them, soonest first, then the urgent ones), each admission counting against the
//! ones after it. One loop serves both the full round and the admission-only round that
//! decides maintenances created since ([`admit_new`]), so both decide alike by construction.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use kube_core::{Resource, ResourceExt};
use nodeward_api::{
    DisruptionPolicy, MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance,
    policy::{BudgetSlot, ResolvedDeadlines},
};

use super::{
    Admission, Denial, Plan, Standing, count, slots, timestamp,
    view::{recorded_halt, window_open},
};
use crate::admission::{
    cluster::Planned,
    decide::{self, Cluster, Decision, Pending},
};
use crate::canary;

/// Pending maintenances not being deleted, oldest first (ties by name): the order admission
/// goes in. Of the reboot requests a node's agent made (`<node>-reboot-<boot>`), only the
/// newest waits; the others are superseded (a node asks for one reboot at a time, and a
/// node's identity creating thousands must not cost a decision, a denial and an Event each).
pub(super) fn pending_oldest_first<'a>(
    maintenances: impl Iterator<Item = &'a NodeMaintenance>,
) -> (Vec<&'a NodeMaintenance>, Vec<Superseded>) {
    let mut unfinished: Vec<&NodeMaintenance> = maintenances
        .filter(|m| !m.phase().is_finished() && m.meta().deletion_timestamp.is_none())
        .collect();
    // By reference: a key owning the name would clone it at every comparison. A node going
    // down anyway comes first, the soonest first: its drain cannot wait for the others; then
    // the urgent ones.
    unfinished.sort_by(|a, b| {
        let key = |m: &'a NodeMaintenance| {
            (
                m.spec.disruption_deadline.is_none(),
                m.spec.disruption_deadline.as_ref().map(|t| t.0),
                !m.spec.urgent,
                timestamp(m.metadata.creation_timestamp.as_ref()),
                m.metadata.name.as_deref(),
            )
        };
        key(a).cmp(&key(b))
    });
    // The newest unfinished request of each node, by node.
    let mut newest: BTreeMap<&str, String> = BTreeMap::new();
    for m in unfinished.iter().filter(|m| agent_request(m)) {
        newest.insert(m.spec.node_name.as_str(), m.name_any());
    }
    let mut pending = unfinished;
    pending.retain(|m| m.phase() == MaintenancePhase::Pending);
    let mut superseded = Vec::new();
    pending.retain(|m| {
        let Some(by) = newest
            .get(m.spec.node_name.as_str())
            .filter(|_| agent_request(m))
        else {
            return true;
        };
        if *by == m.name_any() {
            return true;
        }
        superseded.push(Superseded {
            maintenance: m.name_any(),
            by: by.clone(),
        });
        false
    });
    (pending, superseded)
}

/// A reboot its node's agent asked for (the name the agent is pinned to).
fn agent_request(m: &NodeMaintenance) -> bool {
    m.spec.reason == MaintenanceReason::Reboot
        && m.name_any()
            .strip_prefix(m.spec.node_name.as_str())
            .is_some_and(|rest| rest.starts_with("-reboot-"))
}

/// A node's older reboot request, superseded by its newest.
#[derive(Clone, Debug, PartialEq)]
pub struct Superseded {
    pub maintenance: String,
    pub by: String,
}

/// Decides `pending` in order against `cluster`. An admission takes a slot in each policy
/// matching the node (in `slots`, by policy; one it already holds from a half-done admission
/// is not taken twice) and marks the node disrupted; a half-done admission denied keeps its
/// slots until its denial is written ([`Denial::gives_back_slots`]). `disrupted_by` says which maintenances (by uid) keep each node disrupted:
/// a node disrupted only by the maintenance being decided is not disrupted for its decision.
pub(super) fn admit_pending(
    cluster: &mut Cluster,
    not_ready: &BTreeSet<String>,
    slots: &mut BTreeMap<String, Vec<BudgetSlot>>,
    disrupted_by: &BTreeMap<String, BTreeSet<String>>,
    pending: &[&NodeMaintenance],
    now: Timestamp,
    plan: &mut Plan,
) {
    for m in pending {
        let name = m.name_any();
        let uid = m.uid().unwrap_or_default();
        let node = m.spec.node_name.clone();
        let only_self = disrupted_by
            .get(&node)
            .is_some_and(|by| by.len() == 1 && by.contains(&uid));
        if only_self {
            cluster.undisrupt(&node, m.spec.reason);
        }
        let request = Pending {
            maintenance: name.clone(),
            node: node.clone(),
            reason: m.spec.reason,
            // Deleting a dead node is the coordinator's alone: there is nothing to drain.
            needs_agent: !(m.spec.action == MaintenanceAction::DeleteNode
                && cluster.nodes.get(&node).is_some_and(|n| n.dead.is_some())),
            disruption_deadline: m.spec.disruption_deadline.as_ref().map(|t| t.0),
            urgent: m.spec.urgent,
            planned: canary::planned(m).then(|| Planned {
                created: timestamp(m.metadata.creation_timestamp.as_ref()),
                now,
            }),
        };
        match decide::decide(cluster, not_ready, &request) {
            Decision::Admit { policies } => {
                let (node_uid, surges) = cluster
                    .nodes
                    .get(&node)
                    .map(|n| (n.uid.clone(), n.surges.clone()))
                    .unwrap_or_default();
                cluster.disrupt(&node, m.spec.reason);
                if request.planned.is_some() {
                    // The next ones are decided knowing this one is under way (a canary, or
                    // one of the rest).
                    for p in cluster.policies.iter_mut() {
                        if let Some(stage) =
                            p.canary.as_mut().filter(|_| policies.contains(&p.name))
                        {
                            stage.admitted(&node);
                        }
                    }
                }
                let mut new_slots_in = Vec::new();
                for policy in &policies {
                    let list = slots.entry(policy.clone()).or_default();
                    if !list.iter().any(|s| s.uid == uid) {
                        list.push(slots::new(m, &uid, now));
                        new_slots_in.push(policy.clone());
                    }
                }
                let deadlines = ResolvedDeadlines::longest(
                    cluster
                        .policies
                        .iter()
                        .filter(|p| policies.contains(&p.name))
                        .map(|p| p.deadlines),
                );
                plan.admit.push(Admission {
                    maintenance: name,
                    uid,
                    node_uid,
                    policies,
                    new_slots_in,
                    deadlines,
                    surges,
                });
            }
            Decision::Deny(denied) => {
                // A half-done admission that no longer fits keeps its slots and its node for
                // this round. Another coordinator's admission write of it may still be on its
                // way: only a denial written over the very version decided on fences that
                // write out, and the slots go only after it.
                let holds_slots = slots.values().flatten().any(|s| s.uid == uid);
                if holds_slots {
                    cluster.disrupt(&node, m.spec.reason);
                }
                plan.deny.push(Denial {
                    maintenance: name,
                    rule: denied.rule,
                    reason: denied.reason,
                    message: denied.message,
                    gives_back_slots: holds_slots,
                });
            }
        }
    }
}

/// Decides maintenances created since the round that left `standing`, oldest first, as that
/// round would have: a burst of creations then costs a decision each instead of a round over
/// the whole cluster each. Valid only while nothing else changed since (the controller runs a
/// full round on any other change and every resync). `blockers` holds the lookups for the new
/// maintenances' nodes, `workloads` the nodes a PodDisruptionBudget holds back now.
///
/// Returns `None` when `standing` cannot decide them: a node or policy it does not know, a
/// policy whose spec or slots differ from what it decided on (another writer came first), a
/// window that opened or closed since, or a gated policy of a new maintenance's node (its
/// gates' objects are read for full rounds).
pub fn admit_new(
    standing: &mut Standing,
    policies: &[Arc<DisruptionPolicy>],
    new: &[Arc<NodeMaintenance>],
    blockers: &BTreeMap<String, String>,
    workloads: &BTreeMap<String, String>,
    scans: &BTreeMap<String, super::surge::Scan>,
    now: Timestamp,
) -> Option<Plan> {
    if policies.len() != standing.policies.len() {
        return None;
    }
    let by_name: BTreeMap<String, &DisruptionPolicy> = policies
        .iter()
        .map(|p| (p.name_any(), p.as_ref()))
        .collect();
    for (name, mark) in &standing.policies {
        let policy = by_name.get(name)?;
        let slots: BTreeSet<String> = slots::of(policy).iter().map(|s| s.uid.clone()).collect();
        if policy.metadata.generation != mark.generation || slots != mark.slots {
            return None;
        }
    }
    // A window that opened or closed since changes what older pending maintenances get:
    // they go first, in a full round.
    for state in &standing.cluster.policies {
        let policy = by_name.get(&state.name)?;
        if window_open(policy, now, &mut Vec::new()) != state.window_open {
            return None;
        }
        // A halt another coordinator recorded since.
        if state.halted.is_none() && recorded_halt(policy).is_some() {
            return None;
        }
    }
    let (pending, _) = pending_oldest_first(new.iter().map(AsRef::as_ref));
    for m in &pending {
        let uid = m.uid()?;
        if left_to_a_full_round(m, &uid, standing, &by_name) {
            return None;
        }
        let state = standing.cluster.nodes.get_mut(&m.spec.node_name)?;
        // Remediation goes ahead of blockers (decide ignores them), so it needs no lookup.
        if m.spec.reason != MaintenanceReason::Remediation {
            state.blocker = blockers.get(&m.spec.node_name).cloned();
        }
        state.workload = workloads.get(&m.spec.node_name).cloned();
        super::surge::apply_scan(state, scans.get(&m.spec.node_name));
    }

    let mut slots: BTreeMap<String, Vec<BudgetSlot>> = by_name
        .iter()
        .map(|(name, policy)| (name.clone(), slots::of(policy).to_vec()))
        .collect();
    let mut plan = Plan::default();
    admit_pending(
        &mut standing.cluster,
        &standing.not_ready,
        &mut slots,
        &BTreeMap::new(),
        &pending,
        now,
        &mut plan,
    );
    for (name, policy) in &by_name {
        let after = slots.remove(name).unwrap_or_default();
        if after.as_slice() == slots::of(policy) {
            continue;
        }
        let state = standing.cluster.policies.iter().find(|p| p.name == *name)?;
        let mut status = policy.status.clone().unwrap_or_default();
        status.slots = after;
        status.in_maintenance = count(
            standing
                .cluster
                .disrupted
                .iter()
                .filter(|n| state.matched.contains(*n))
                .count(),
        );
        if let Some(mark) = standing.policies.get_mut(name) {
            mark.slots = status.slots.iter().map(|s| s.uid.clone()).collect();
        }
        let in_use = standing
            .cluster
            .in_use(state, &standing.not_ready, None)
            .len();
        plan.budget_use
            .insert(name.clone(), (in_use, state.max_concurrent));
        plan.policy_status.insert(name.clone(), status);
    }
    Some(plan)
}

/// Whether a full round, not [`admit_new`], has to decide the new maintenance `m` (with `uid`).
fn left_to_a_full_round(
    m: &NodeMaintenance,
    uid: &str,
    standing: &Standing,
    by_name: &BTreeMap<String, &DisruptionPolicy>,
) -> bool {
    // Whether it supersedes an older request of its node is a full round's to see.
    agent_request(m)
        // A half-done admission (a slot already written for it).
        || by_name
            .values()
            .any(|p| slots::of(p).iter().any(|s| s.uid == uid))
        // A gate of a policy of its node: gates are read before a full round, only for the
        // nodes pending then. A canary stage: a canary waiting holds back the rest, and a full
        // round is what counts the ones waiting.
        || standing.cluster.policies.iter().any(|state| {
            state.matched.contains(&m.spec.node_name)
                && (state.canary.is_some()
                    || by_name
                        .get(&state.name)
                        .is_some_and(|p| !p.spec.gates.is_empty()))
        })
}
