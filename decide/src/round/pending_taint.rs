//! The pending taint (`taintWhilePending`, kured's `--prefer-no-schedule-taint`): a node whose
//! maintenance waits for admission, under a policy that asks for it, is tainted
//! `nodeward.io/maintenance-pending:PreferNoSchedule`, so that the pods evicted from the nodes
//! going now are placed elsewhere than on those going next; the taint goes once nothing of
//! the node waits (admitted, ended, deleted, or the policy no longer asks).

use std::collections::BTreeSet;

use kube_core::ResourceExt;
use nodeward_api::{MaintenancePhase, labels::PENDING_TAINT};

use super::{PendingTaint, Plan, view::Index};

pub(super) fn decide(index: &Index, plan: &mut Plan) {
    let waiting: BTreeSet<&str> = index
        .maintenances
        .values()
        .filter(|m| {
            m.phase() == MaintenancePhase::Pending && m.metadata.deletion_timestamp.is_none()
        })
        .map(|m| m.spec.node_name.as_str())
        .filter(|node| {
            index
                .policies
                .iter()
                .any(|p| p.policy.spec.taint_while_pending && p.matched.contains(*node))
        })
        .collect();
    for (name, node) in &index.nodes {
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == PENDING_TAINT));
        let wanted = waiting.contains(*name);
        if tainted != wanted {
            plan.pending_taints.push(PendingTaint {
                node: (*name).to_owned(),
                uid: node.uid().unwrap_or_default(),
                on: wanted,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::super::{Memory, Objects, fixtures::*, plan};
    use super::*;

    #[test]
    fn only_nodes_waiting_under_a_policy_that_asks_are_tainted_and_the_taint_goes_after() {
        let mut tainted = Arc::unwrap_or_clone(node("n2").build());
        tainted
            .spec
            .get_or_insert_with(Default::default)
            .taints
            .get_or_insert_with(Vec::new)
            .push(k8s_openapi::api::core::v1::Taint {
                key: PENDING_TAINT.into(),
                effect: "PreferNoSchedule".into(),
                ..Default::default()
            });
        let objects = |asks: bool| Objects {
            nodes: vec![
                node("n0").build(),
                node("n1").build(),
                Arc::new(tainted.clone()),
            ],
            policies: vec![
                policy(json!({"maxConcurrent": 1, "paused": true, "taintWhilePending": asks}))
                    .build(),
            ],
            maintenances: vec![
                maintenance("m0", "n0").build(),
                // Admitted: it goes now (cordoned and NoSchedule-tainted by its agent).
                maintenance("m1", "n1")
                    .phase(MaintenancePhase::Admitted)
                    .admitted_by(&["pool"])
                    .build(),
            ],
            ..Objects::default()
        };
        let changes = |asks: bool| -> Vec<(String, bool)> {
            plan(&objects(asks), &mut Memory::default(), t(0))
                .pending_taints
                .into_iter()
                .map(|c| (c.node, c.on))
                .collect()
        };
        // n0 waits: tainted; n1 is admitted: not; n2 waits no more: its taint goes.
        assert_eq!(
            changes(true),
            [("n0".to_owned(), true), ("n2".to_owned(), false)]
        );
        // The policy no longer asks: only the stale taint goes.
        assert_eq!(changes(false), [("n2".to_owned(), false)]);
    }
}
