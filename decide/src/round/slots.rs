//! Budget slots that still hold, the nodes each maintenance keeps disrupted, and the
//! maintenances that end because their node is gone.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_core::ResourceExt;
use nodeward_api::{
    DisruptionPolicy, MaintenanceAction, MaintenancePhase, NodeMaintenance, policy::BudgetSlot,
};

use super::{Ending, Gone, Memory, NodeDeletion, Plan, view::Index};

/// A policy's slots as its status records them.
pub(super) fn of(policy: &DisruptionPolicy) -> &[BudgetSlot] {
    policy.status.as_ref().map_or(&[], |s| s.slots.as_slice())
}

/// The budget slot admitting `m` takes.
pub(super) fn new(m: &NodeMaintenance, uid: &str, now: Timestamp) -> BudgetSlot {
    BudgetSlot {
        maintenance: m.name_any(),
        uid: uid.to_owned(),
        node_name: m.spec.node_name.clone(),
        admitted_at: Time(now),
    }
}

/// Each policy's slots that stay: those of unfinished maintenances (same uid) of nodes that
/// still exist. A slot whose maintenance or node is missing stays until `memory` confirms it
/// gone (asked for in `confirm_gone`).
pub(super) fn kept(
    index: &Index,
    memory: &mut Memory,
    confirm_gone: &mut BTreeSet<Gone>,
) -> BTreeMap<String, Vec<BudgetSlot>> {
    memory.confirmed_gone.retain(|gone| match gone {
        Gone::Maintenance { name, .. } => !index.maintenances.contains_key(name.as_str()),
        Gone::Node(name) => !index.nodes.contains_key(name.as_str()),
    });
    let mut missing = |gone: Gone| {
        !memory.confirmed_gone.contains(&gone) && {
            confirm_gone.insert(gone);
            true
        }
    };
    let mut kept = BTreeMap::new();
    for p in &index.policies {
        let mut keep = Vec::new();
        for slot in of(p.policy) {
            let maintenance_holds = match index.maintenances.get(slot.maintenance.as_str()) {
                Some(m) if m.uid().as_deref() == Some(slot.uid.as_str()) => {
                    !m.phase().is_finished()
                }
                // A re-created object of the same name does not inherit the slot.
                Some(_) => false,
                None => missing(Gone::Maintenance {
                    name: slot.maintenance.clone(),
                    uid: slot.uid.clone(),
                }),
            };
            let node_exists = index.nodes.contains_key(slot.node_name.as_str())
                || missing(Gone::Node(slot.node_name.clone()));
            if maintenance_holds && node_exists {
                keep.push(slot.clone());
            }
        }
        kept.insert(p.name.clone(), keep);
    }
    kept
}

/// Which maintenances (by uid) hold each node disrupted: the active ones, and those holding
/// a slot.
pub(super) fn disrupted_by(
    index: &Index,
    slots: &BTreeMap<String, Vec<BudgetSlot>>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut disrupted_by: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in index.maintenances.values() {
        if m.is_active() {
            disrupted_by
                .entry(m.spec.node_name.clone())
                .or_default()
                .insert(m.uid().unwrap_or_default());
        }
    }
    for slot in slots.values().flatten() {
        disrupted_by
            .entry(slot.node_name.clone())
            .or_default()
            .insert(slot.uid.clone());
    }
    disrupted_by
}

/// Maintenances whose node is gone end (a DeleteNode maintenance that got there succeeded)
/// once the node's absence is confirmed, or at once when the watch shows a Node of that name
/// with another uid than the admission recorded (re-created: another machine); a drained
/// DeleteNode maintenance's node is deleted, but only if the maintenance holds the `slots`
/// its admission names: one that reached Acting without this coordinator's admission fails
/// instead.
pub(super) fn end_where_node_gone(
    index: &Index,
    memory: &Memory,
    slots: &BTreeMap<String, Vec<BudgetSlot>>,
    plan: &mut Plan,
) {
    for m in index.maintenances.values() {
        let phase = m.phase();
        let node = m.spec.node_name.as_str();
        let deleting =
            m.spec.action == MaintenanceAction::DeleteNode && phase == MaintenancePhase::Acting;
        let admitted_for = m
            .status
            .as_ref()
            .and_then(|s| s.admission.as_ref()?.node_uid.as_deref());
        let recreated = index
            .nodes
            .get(node)
            .and_then(|n| n.uid())
            .zip(admitted_for)
            .is_some_and(|(now, then)| now != then);
        if recreated && !phase.is_finished() {
            plan.end.push(Ending {
                maintenance: m.name_any(),
                phase: if deleting {
                    MaintenancePhase::Succeeded
                } else {
                    MaintenancePhase::Cancelled
                },
                reason: "NodeRecreated",
                message: format!(
                    "node {node} was deleted and created again (another machine): the Node this maintenance was admitted for is gone"
                ),
            });
            continue;
        }
        if let Some(existing) = index.nodes.get(node).filter(|_| deleting) {
            if holds_its_slots(m, index, slots) {
                plan.delete_nodes.push(NodeDeletion {
                    maintenance: m.name_any(),
                    node: node.to_owned(),
                    uid: existing.uid().unwrap_or_default(),
                });
            } else {
                plan.end.push(Ending {
                    maintenance: m.name_any(),
                    phase: MaintenancePhase::Failed,
                    reason: "NotAdmitted",
                    message: format!(
                        "Acting without holding the budget slots of an admission by the coordinator: node {node} is not deleted"
                    ),
                });
            }
            continue;
        }
        if phase.is_finished()
            || phase == MaintenancePhase::Pending
            || index.nodes.contains_key(node)
        {
            continue;
        }
        let gone = Gone::Node(node.to_owned());
        if !memory.confirmed_gone.contains(&gone) {
            plan.confirm_gone.insert(gone);
            continue;
        }
        let (phase, message) = if deleting {
            (
                MaintenancePhase::Succeeded,
                "the Node was deleted".to_owned(),
            )
        } else {
            (
                MaintenancePhase::Cancelled,
                format!("node {node} was deleted"),
            )
        };
        plan.end.push(Ending {
            maintenance: m.name_any(),
            phase,
            reason: "NodeDeleted",
            message,
        });
    }
}

/// Whether `m` was admitted (it has an admission record) and holds a slot, with its uid, in
/// each policy the record names that still exists.
fn holds_its_slots(
    m: &NodeMaintenance,
    index: &Index,
    slots: &BTreeMap<String, Vec<BudgetSlot>>,
) -> bool {
    let Some(admission) = m.status.as_ref().and_then(|s| s.admission.as_ref()) else {
        return false;
    };
    let uid = m.uid().unwrap_or_default();
    admission
        .policies
        .iter()
        .filter(|p| index.policies.iter().any(|view| &view.name == *p))
        .all(|p| {
            slots
                .get(p)
                .is_some_and(|held| held.iter().any(|s| s.uid == uid))
        })
}
