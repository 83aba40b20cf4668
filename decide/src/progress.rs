//! A policy's patch progress (`status.progress` and the `Updated` condition): where each matched
//! node stands, read from its planned reboots (what a policy's update runs in) and what the
//! node says it still needs (`RebootRequired`, updates pending in its inventory).

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use nodeward_api::{
    MaintenancePhase, NodeMaintenance,
    policy::{FAILED_NODES_LIMIT, Progress},
};

use crate::canary::planned;

/// Where one node stands, in the order the counts take them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Standing {
    InProgress,
    Pending,
    Failed,
    Updated,
}

/// `policy`'s progress over its `matched` nodes: `needs` says whether a node reports that it
/// still needs something (a reboot, pending updates).
pub fn progress<'a>(
    policy: &str,
    matched: &BTreeSet<String>,
    maintenances: impl IntoIterator<Item = &'a NodeMaintenance>,
    needs: impl Fn(&str) -> bool,
) -> Progress {
    let mut unfinished: BTreeMap<&str, Standing> = BTreeMap::new();
    // The latest finished planned reboot this policy admitted, by node: when, and whether it
    // failed.
    let mut latest: BTreeMap<&str, (Timestamp, bool)> = BTreeMap::new();
    for m in maintenances.into_iter().filter(|m| planned(m)) {
        let node = m.spec.node_name.as_str();
        if !matched.contains(node) {
            continue;
        }
        let phase = m.phase();
        if !phase.is_finished() {
            if m.metadata.deletion_timestamp.is_none() {
                let standing = if phase == MaintenancePhase::Pending {
                    Standing::Pending
                } else {
                    Standing::InProgress
                };
                let entry = unfinished.entry(node).or_insert(standing);
                *entry = (*entry).min(standing);
            }
            continue;
        }
        let status = m.status.as_ref();
        let here = status
            .and_then(|s| s.admission.as_ref())
            .is_some_and(|a| a.policies.iter().any(|p| p == policy));
        let Some(at) = status.and_then(|s| s.finished_at.as_ref()).map(|t| t.0) else {
            continue;
        };
        if here && latest.get(node).is_none_or(|(seen, _)| at > *seen) {
            latest.insert(node, (at, phase == MaintenancePhase::Failed));
        }
    }
    let mut progress = Progress::default();
    for node in matched {
        let standing = unfinished.get(node.as_str()).copied().unwrap_or_else(|| {
            if latest.get(node.as_str()).is_some_and(|(_, failed)| *failed) {
                Standing::Failed
            } else if needs(node) {
                Standing::Pending
            } else {
                Standing::Updated
            }
        });
        match standing {
            Standing::InProgress => progress.in_progress += 1,
            Standing::Pending => progress.pending += 1,
            Standing::Failed => {
                progress.failed += 1;
                if progress.failed_nodes.len() < FAILED_NODES_LIMIT {
                    progress.failed_nodes.push(node.clone());
                }
            }
            Standing::Updated => progress.updated += 1,
        }
    }
    progress
}

/// What the `Updated` condition says: whether every node is updated, and the counts.
pub fn summary(progress: &Progress) -> (bool, String) {
    let total = progress.updated + progress.in_progress + progress.pending + progress.failed;
    if progress.updated == total {
        return (true, format!("all {total} matched nodes are updated"));
    }
    let mut message = format!(
        "{} of {total} matched nodes updated; {} in progress, {} pending, {} failed",
        progress.updated, progress.in_progress, progress.pending, progress.failed
    );
    if !progress.failed_nodes.is_empty() {
        message.push_str(&format!(
            " ({}{})",
            progress
                .failed_nodes
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if progress.failed > 5 { ", ..." } else { "" }
        ));
    }
    (false, message)
}

#[cfg(test)]
mod tests {
    use nodeward_api::MaintenanceReason;

    use super::*;

    fn reboot(node: &str, phase: MaintenancePhase, policy: &str, ended: i64) -> NodeMaintenance {
        crate::testing::reboot(&format!("{node}-{ended}"), node, &[policy], phase, ended)
    }

    #[test]
    fn each_node_counts_once_in_the_first_standing_that_applies() {
        let matched: BTreeSet<String> = ["a", "b", "c", "d", "e", "f", "g"]
            .into_iter()
            .map(String::from)
            .collect();
        let mut remediation = reboot("g", MaintenancePhase::Failed, "p", 9);
        remediation.spec.reason = MaintenanceReason::Remediation;
        let maintenances = [
            // a: failed, then succeeded: updated.
            reboot("a", MaintenancePhase::Failed, "p", 1),
            reboot("a", MaintenancePhase::Succeeded, "p", 2),
            // b: succeeded, then failed: failed.
            reboot("b", MaintenancePhase::Succeeded, "p", 1),
            reboot("b", MaintenancePhase::Failed, "p", 2),
            // c: failed, and a new one waits: pending.
            reboot("c", MaintenancePhase::Failed, "p", 1),
            reboot("c", MaintenancePhase::Pending, "p", 3),
            // d: draining: in progress.
            reboot("d", MaintenancePhase::Draining, "p", 3),
            // e: failed under another policy: not this one's failure.
            reboot("e", MaintenancePhase::Failed, "other", 1),
            // g: a failed remediation is no patch.
            remediation,
            // Outside the scope.
            reboot("z", MaintenancePhase::Failed, "p", 1),
        ];
        // f reports RebootRequired (or pending updates).
        let progress = progress("p", &matched, &maintenances, |n| n == "f");
        assert_eq!(
            progress,
            Progress {
                updated: 3,
                in_progress: 1,
                pending: 2,
                failed: 1,
                failed_nodes: vec!["b".into()],
            }
        );
        let (all, message) = summary(&progress);
        assert!(!all);
        assert_eq!(
            message,
            "3 of 7 matched nodes updated; 1 in progress, 2 pending, 1 failed (b)"
        );
        let done = Progress {
            updated: 7,
            ..Progress::default()
        };
        assert_eq!(
            summary(&done),
            (true, "all 7 matched nodes are updated".to_owned())
        );
    }
}
