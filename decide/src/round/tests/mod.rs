//! The round's decisions, from watched objects to plan, tested by stage; the helpers they
//! share are here.

use super::{fixtures::*, *};
use kube_core::ResourceExt;
use serde_json::json;

mod admission;
mod dead_nodes;
mod deadlines;
mod remediation;

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
