//! The deadlines of admitted maintenances ([`crate::deadlines`]): each one's deadline in its
//! current phase is recorded in its status, and one whose deadline passed is moved on by the
//! coordinator (back to Pending, or Failed), since its agent did not. The maintenances of a
//! node whose agent is lost, or whose node is gone, the coordinator finishes in its place.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_core::{Resource, ResourceExt};
use nodeward_api::{
    MaintenanceAction, MaintenancePhase,
    conditions::{maintenance as maintenance_conditions, overdue},
    labels::MAINTENANCE_FINALIZER,
    maintenance::PhaseDeadline,
    update::HostTime,
};

use super::{DeadlineRecord, Gone, Memory, Overdue, Plan, TakeOver, view::Index};
use crate::{
    admission::decide::Cluster,
    deadlines::{self, Held, Progress},
};

/// Records or enforces the deadline of every maintenance in a phase that has one; an admitted
/// DeleteNode of a dead node goes straight to Acting (nothing to drain: the coordinator
/// deletes the node).
pub(super) fn enforce(index: &Index, cluster: &Cluster, now: Timestamp, plan: &mut Plan) {
    for m in index.maintenances.values() {
        let phase = m.phase();
        let dead = cluster
            .nodes
            .get(&m.spec.node_name)
            .and_then(|n| n.dead.as_ref());
        if let Some(why) = dead.filter(|_| {
            phase == MaintenancePhase::Admitted && m.spec.action == MaintenanceAction::DeleteNode
        }) {
            plan.overdue.push(Overdue {
                maintenance: m.name_any(),
                to: MaintenancePhase::Acting,
                reason: overdue::NODE_DEAD,
                message: format!("the node is dead ({why}): deleted without a drain"),
            });
            continue;
        }
        // A maintenance whose node is gone ends another way (see `slots::end_where_node_gone`).
        if phase.is_finished()
            || phase == MaintenancePhase::Pending
            || !index.nodes.contains_key(m.spec.node_name.as_str())
        {
            continue;
        }
        let recorded = m.status.as_ref().and_then(|s| s.deadline.as_ref());
        let since = observed_since(m, recorded, now);
        let progress = Progress {
            phase,
            action: m.spec.action,
            since,
        };
        // A maintenance's own hooks and update take their time on top of its policies'.
        let own = HostTime::of(m.spec.update.as_ref(), m.spec.hooks.as_ref());
        let limits = index
            .deadlines_of(m.admitted_policies())
            .with_host_time(own);
        let Some(due) = deadlines::due(progress, limits) else {
            continue;
        };
        if deadlines::passed(&due, now) {
            plan.overdue.push(Overdue {
                maintenance: m.name_any(),
                to: due.to,
                reason: due.reason,
                message: due.message,
            });
            continue;
        }
        let record = PhaseDeadline {
            phase,
            since: Some(Time(since)),
            time: Time(due.at),
            then: due.then,
        };
        if !recorded.is_some_and(|r| same(r, &record)) {
            plan.deadlines.push(DeadlineRecord {
                maintenance: m.name_any(),
                deadline: record,
            });
        }
    }
}

/// When the maintenance entered its phase, on the coordinator's own clock: for Admitted, when
/// it admitted it (its admission record); otherwise when a round first saw it in this phase
/// (recorded with the deadline), or now, this round being the first. Never the phase history:
/// the agent writes that.
fn observed_since(
    m: &nodeward_api::NodeMaintenance,
    recorded: Option<&PhaseDeadline>,
    now: Timestamp,
) -> Timestamp {
    let phase = m.phase();
    let admitted = m
        .status
        .as_ref()
        .and_then(|s| s.admission.as_ref())
        .map(|a| a.admitted_at.0)
        .filter(|_| phase == MaintenancePhase::Admitted);
    let seen = recorded
        .filter(|r| r.phase == phase)
        .and_then(|r| r.since.as_ref())
        .map(|t| t.0);
    // Neither is ever later than now (a clock that went back starts the phase now).
    admitted.or(seen).map_or(now, |t| t.min(now))
}

/// Equal to the second (a status keeps times to the second).
fn same(a: &PhaseDeadline, b: &PhaseDeadline) -> bool {
    let second = |t: Option<&Time>| t.map(|t| t.0.as_second());
    a.phase == b.phase
        && a.then == b.then
        && a.time.0.as_second() == b.time.0.as_second()
        && second(a.since.as_ref()) == second(b.since.as_ref())
}

/// Finishes, in the agent's place, the maintenances of nodes whose agent is lost
/// (`deadlines.agentLost`) and releases those whose node is confirmed gone. `disrupted_by`
/// says which maintenances hold each node: the taint stays while another one does.
pub(super) fn take_over(
    index: &Index,
    memory: &Memory,
    disrupted_by: &BTreeMap<String, BTreeSet<String>>,
    now: Timestamp,
    plan: &mut Plan,
) {
    let overdue: BTreeSet<&str> = plan
        .overdue
        .iter()
        .map(|o| o.maintenance.as_str())
        .collect();
    let mut taken = Vec::new();
    for m in index.maintenances.values() {
        let name = m.name_any();
        let node = m.spec.node_name.as_str();
        let node_exists = index.nodes.contains_key(node);
        let why = if node_exists {
            let limit = index.deadlines_of_node(node).agent_lost;
            if overdue.contains(name.as_str())
                || !deadlines::agent_lost(index.heartbeat(node), now, limit)
            {
                continue;
            }
            format!(
                "the agent of node {node} has been silent for longer than {}s (deadlines.agentLost): the coordinator finished this maintenance in its place",
                limit.as_secs()
            )
        } else if memory.confirmed_gone.contains(&Gone::Node(node.to_owned())) {
            format!("node {node} is gone, and its agent with it")
        } else {
            continue;
        };
        let status = m.status.clone().unwrap_or_default();
        let held = Held {
            phase: m.phase(),
            action: m.spec.action,
            deleting: m.meta().deletion_timestamp.is_some(),
            finalized: m.finalizers().iter().any(|f| f == MAINTENANCE_FINALIZER),
            restore_asked: status
                .conditions
                .iter()
                .any(|c| c.type_ == maintenance_conditions::NODE_RESTORED && c.status == "False"),
        };
        let Some(mut takeover) = deadlines::take_over(held, node_exists) else {
            continue;
        };
        if !node_exists {
            // Its end is `slots::end_where_node_gone`'s to write.
            takeover.end_in = None;
        }
        let uid = m.uid().unwrap_or_default();
        let others_hold = disrupted_by
            .get(node)
            .is_some_and(|by| by.iter().any(|other| *other != uid));
        taken.push(TakeOver {
            maintenance: name,
            node: node.to_owned(),
            takeover,
            untaint: !others_hold,
            message: why,
        });
    }
    plan.take_over.extend(taken);
}
