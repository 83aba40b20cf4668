//! Finished maintenances are deleted once they are older than the coordinator's
//! `--finished-maintenance-ttl`, so that etcd does not only grow. What stays whatever its age:
//! the latest finished maintenance of each node (what `kubectl nodeward status` and the node's
//! next request read), a Failed one a failure budget still counts (deleting it would lift a
//! halt), and one a budget slot still names (its slot is freed first).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube_core::ResourceExt;
use nodeward_api::NodeMaintenance;

use super::{Plan, view::Index};

/// The most maintenances a round deletes: the rest go in the next rounds, so that a backlog
/// (the first round after an upgrade, or after the TTL was shortened) never holds a round up.
pub const EXPIRED_PER_ROUND: usize = 50;

/// A finished maintenance to delete; `uid` is the delete's precondition (an object created
/// again under the name stays).
#[derive(Clone, Debug, PartialEq)]
pub struct Expired {
    pub maintenance: String,
    pub uid: String,
    pub node: String,
}

pub(super) fn decide(index: &Index, ttl: Option<Duration>, now: Timestamp, plan: &mut Plan) {
    let Some(ttl) = ttl else {
        return;
    };
    let mut kept: BTreeSet<&str> = index
        .policies
        .iter()
        .flat_map(|p| p.failures.iter().flat_map(|s| &s.failures))
        .map(|f| f.maintenance.as_str())
        .collect();
    kept.extend(
        index
            .policies
            .iter()
            .filter_map(|p| p.policy.status.as_ref())
            .flat_map(|s| &s.slots)
            .map(|slot| slot.maintenance.as_str()),
    );
    plan.expire = expired(index.maintenances.values().copied(), &kept, ttl, now);
}

/// The maintenances of `maintenances` to delete at `now` under `ttl`, oldest first and at most
/// [`EXPIRED_PER_ROUND`]; `kept` (by name) stay whatever their age.
pub fn expired<'a>(
    maintenances: impl IntoIterator<Item = &'a NodeMaintenance>,
    kept: &BTreeSet<&str>,
    ttl: Duration,
    now: Timestamp,
) -> Vec<Expired> {
    let Some(before) = SignedDuration::try_from(ttl)
        .ok()
        .and_then(|ttl| now.checked_sub(ttl).ok())
    else {
        return Vec::new();
    };
    let mut finished: Vec<(Timestamp, &NodeMaintenance)> = maintenances
        .into_iter()
        .filter(|m| m.phase().is_finished() && m.metadata.deletion_timestamp.is_none())
        .map(|m| (finished_at(m), m))
        .collect();
    finished.sort_by(|(a, m), (b, n)| (a, m.name_any()).cmp(&(b, n.name_any())));
    // Each node's latest, kept: the last of its finished maintenances in that order.
    let latest: BTreeMap<&str, &str> = finished
        .iter()
        .map(|(_, m)| {
            (
                m.spec.node_name.as_str(),
                m.metadata.name.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    finished
        .into_iter()
        .filter(|(at, _)| *at < before)
        .filter(|(_, m)| {
            let name = m.metadata.name.as_deref().unwrap_or_default();
            !kept.contains(name) && latest.get(m.spec.node_name.as_str()) != Some(&name)
        })
        .take(EXPIRED_PER_ROUND)
        .map(|(_, m)| Expired {
            maintenance: m.name_any(),
            uid: m.uid().unwrap_or_default(),
            node: m.spec.node_name.clone(),
        })
        .collect()
}

/// When `m` finished: its `finishedAt`, else when its history says it entered its last phase,
/// else when it was created (an object with no record of its end is as old as it is).
fn finished_at(m: &NodeMaintenance) -> Timestamp {
    let status = m.status.as_ref();
    status
        .and_then(|s| s.finished_at.as_ref())
        .or_else(|| status.and_then(|s| s.history.last()).map(|h| &h.time))
        .or(m.metadata.creation_timestamp.as_ref())
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nodeward_api::MaintenancePhase;
    use serde_json::json;

    use super::super::{Memory, Objects, fixtures::*, plan};
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn ended(name: &str, node: &str, phase: MaintenancePhase, at: i64) -> Arc<NodeMaintenance> {
        maintenance(name, node).entered(phase, at).build()
    }

    fn names(expired: &[Expired]) -> Vec<&str> {
        expired.iter().map(|e| e.maintenance.as_str()).collect()
    }

    #[test]
    fn only_finished_maintenances_older_than_the_ttl_go_and_each_nodes_latest_stays() {
        use MaintenancePhase::*;
        let maintenances = [
            ended("a-old", "a", Succeeded, 0),
            ended("a-older", "a", Failed, -100),
            ended("a-latest", "a", Cancelled, 10),
            ended("b-only", "b", Succeeded, 0),
            ended("c-recent", "c", Succeeded, 3_000),
            ended("c-latest", "c", Succeeded, 3_500),
            maintenance("c-draining", "c")
                .entered(Draining, -5_000)
                .build(),
            maintenance("a-pending", "a").created(-9_000).build(),
        ];
        let now = t(3_600 + 1_000);
        let expired = expired(
            maintenances.iter().map(AsRef::as_ref),
            &BTreeSet::new(),
            HOUR,
            now,
        );
        assert_eq!(names(&expired), ["a-older", "a-old"]);
        assert_eq!(expired[0].uid, "uid-a-older");
        assert_eq!(expired[0].node, "a");
        // One second earlier, a-old is not an hour old yet.
        let earlier = super::expired(
            maintenances.iter().map(AsRef::as_ref),
            &BTreeSet::new(),
            HOUR,
            t(3_600),
        );
        assert_eq!(names(&earlier), ["a-older"]);
    }

    #[test]
    fn what_is_kept_by_name_stays_and_a_round_deletes_a_bounded_number() {
        let maintenances: Vec<Arc<NodeMaintenance>> = (0..120)
            .map(|i| ended(&format!("m{i:03}"), "n", MaintenancePhase::Succeeded, i))
            .collect();
        let kept = BTreeSet::from(["m000", "m001"]);
        let expired = expired(
            maintenances.iter().map(AsRef::as_ref),
            &kept,
            HOUR,
            t(10 * 3_600),
        );
        assert_eq!(expired.len(), EXPIRED_PER_ROUND);
        assert_eq!(
            expired[0].maintenance, "m002",
            "oldest first, kept ones skipped"
        );
    }

    #[test]
    fn an_end_is_read_from_finished_at_then_the_history_then_the_creation() {
        let mut m = Arc::unwrap_or_clone(maintenance("m", "n").created(-50).build());
        m.status.get_or_insert_with(Default::default).phase = MaintenancePhase::Failed;
        assert_eq!(finished_at(&m), t(-50));
        m.status.get_or_insert_with(Default::default).enter(
            MaintenancePhase::Failed,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(7)),
        );
        assert_eq!(finished_at(&m), t(7));
        m.status.get_or_insert_with(Default::default).finished_at =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(9)));
        assert_eq!(finished_at(&m), t(9));
    }

    #[test]
    fn a_round_keeps_the_failures_a_budget_counts_and_what_a_slot_names() {
        use MaintenancePhase::*;
        let counted = maintenance("counted", "n0")
            .admitted_by(&["pool"])
            .entered(Failed, 20 * 3_600)
            .build();
        let objects = Objects {
            policies: vec![
                policy(json!({"maxConcurrent": 2, "failureBudget": {"maxFailures": 3}}))
                    .slot("slotted", "n1")
                    .build(),
            ],
            maintenances: vec![
                counted,
                ended("n0-latest", "n0", Succeeded, 21 * 3_600),
                ended("slotted", "n1", Succeeded, 0),
                ended("n1-latest", "n1", Succeeded, 1),
                ended("gone", "n1", Failed, 0),
            ],
            finished_ttl: Some(HOUR),
            ..cluster(2)
        };
        let plan = plan(&objects, &mut Memory::default(), t(22 * 3_600));
        assert_eq!(names(&plan.expire), ["gone"]);
        // Without a TTL nothing goes.
        let objects = Objects {
            finished_ttl: None,
            ..objects
        };
        let plan = super::super::plan(&objects, &mut Memory::default(), t(22 * 3_600));
        assert!(plan.expire.is_empty(), "{:?}", plan.expire);
    }
}
