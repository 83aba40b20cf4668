//! The workload gate between nodes (`workloadGate.waitForEvicted`): a reboot whose drain
//! evicted pods is Succeeded by its agent only once the coordinator says the controllers of
//! those pods are available again (`WorkloadsAvailable=True`), or that the policy's timeout
//! passed; until then its slot holds the next node back. The coordinator judges, because only
//! it may read workloads cluster-wide; an agent reads its own maintenance.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use kube_core::ResourceExt;
use nodeward_api::{
    DisruptionPolicy, MaintenancePhase, NodeMaintenance,
    conditions::{maintenance::WORKLOADS_AVAILABLE, workloads as reasons},
    maintenance::WorkloadRef,
    policy::{WORKLOAD_GATE_TIMEOUT, WorkloadGate, WorkloadTimeoutAction},
};

use super::{Objects, Plan};

/// How many replicas of a workload are available, as its controller's status says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Availability {
    /// What the operator knows it by: `Deployment shop/web` for a Deployment's ReplicaSet.
    pub shown: String,
    pub available: i32,
    pub desired: i32,
}

/// A workload's availability as looked up: `None` when it no longer exists (nothing to wait
/// for), an error when it could not be read.
pub type Looked = Option<Result<Availability, String>>;

/// A lookup and when it was made: a verdict counts only lookups made after the maintenance
/// came back (Verifying), since before that the evicted pods may not yet show as missing.
pub type Seen = (Timestamp, Looked);

/// A `WorkloadsAvailable` condition to write on a maintenance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadVerdict {
    pub maintenance: String,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// The longest verdict message (the shortest listed first).
const MESSAGE_LIMIT: usize = 1024;

/// The workloads to look up: those of every maintenance waiting in Verifying.
pub fn wanted(objects: &Objects) -> BTreeSet<WorkloadRef> {
    objects
        .maintenances
        .iter()
        .filter(|m| judged(m))
        .flat_map(|m| {
            m.status
                .iter()
                .flat_map(|s| s.evicted_workloads.iter().cloned())
        })
        .collect()
}

/// Whether `m` is one the gate judges: a reboot back and Verifying whose drain evicted pods.
fn judged(m: &NodeMaintenance) -> bool {
    m.phase() == MaintenancePhase::Verifying
        && m.metadata.deletion_timestamp.is_none()
        && m.status
            .as_ref()
            .is_some_and(|s| !s.evicted_workloads.is_empty())
}

/// Puts into `plan` each verdict that differs from what the maintenance carries.
pub(super) fn judge(
    objects: &Objects,
    availability: &BTreeMap<WorkloadRef, Seen>,
    now: Timestamp,
    plan: &mut Plan,
) {
    for m in objects.maintenances.iter().filter(|m| judged(m)) {
        let verdict = verdict(m, &objects.policies, availability, now);
        let carried = m
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == WORKLOADS_AVAILABLE));
        let same = carried.is_some_and(|c| {
            c.status == verdict.status && c.reason == verdict.reason && c.message == verdict.message
        });
        if !same {
            plan.workload_verdicts.push(verdict);
        }
    }
}

/// `m`'s verdict under the policies that admitted it (the default gate when none is left):
/// one that waits is enough, the longest timeout applies, and `Fail` if any says so.
pub fn verdict(
    m: &NodeMaintenance,
    policies: &[std::sync::Arc<DisruptionPolicy>],
    availability: &BTreeMap<WorkloadRef, Seen>,
    now: Timestamp,
) -> WorkloadVerdict {
    let admitted: Vec<Option<&WorkloadGate>> = policies
        .iter()
        .filter(|p| m.admitted_policies().contains(&p.name_any()))
        .map(|p| p.spec.workload_gate.as_ref())
        .collect();
    let gates = if admitted.is_empty() {
        vec![None]
    } else {
        admitted
    };
    let to = |status, reason, message| WorkloadVerdict {
        maintenance: m.name_any(),
        status,
        reason,
        message,
    };
    if !gates.iter().any(|g| WorkloadGate::waits(*g)) {
        return to(
            "True",
            reasons::NOT_CHECKED,
            "no policy of this maintenance waits for its evicted workloads".to_owned(),
        );
    }
    let timeout = gates
        .iter()
        .map(|g| {
            g.and_then(|g| g.timeout.as_ref())
                .and_then(|t| t.to_std().ok())
                .unwrap_or(WORKLOAD_GATE_TIMEOUT)
        })
        .max()
        .unwrap_or(WORKLOAD_GATE_TIMEOUT);
    let fail = gates
        .iter()
        .any(|g| g.is_some_and(|g| g.on_timeout == WorkloadTimeoutAction::Fail));
    let evicted = m
        .status
        .as_ref()
        .map(|s| s.evicted_workloads.as_slice())
        .unwrap_or_default();
    let verifying = m.entered(MaintenancePhase::Verifying).map_or(now, |t| t.0);
    let (short, back) = tally(evicted, availability, verifying);
    if short.is_empty() {
        let message = if back.is_empty() {
            "the evicted workloads no longer exist".to_owned()
        } else {
            back.join("; ")
        };
        return to("True", reasons::AVAILABLE, cut(message));
    }
    let waited = now.duration_since(verifying).as_secs();
    let limit = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX);
    let shortfall = short.join("; ");
    if waited >= limit {
        let (reason, then) = if fail {
            (reasons::TIMED_OUT_FAILED, "the maintenance fails")
        } else {
            (
                reasons::TIMED_OUT,
                "the maintenance succeeds with this warning",
            )
        };
        return to(
            "False",
            reason,
            cut(format!(
                "still short {}s after the reboot (workloadGate.timeout), {then}: {shortfall}",
                timeout.as_secs()
            )),
        );
    }
    to("False", reasons::WAITING, cut(shortfall))
}

/// The evicted workloads that are short (or not known to be back) and those back, each as a
/// line of the verdict, counting only lookups made since `verifying`.
fn tally(
    evicted: &[WorkloadRef],
    availability: &BTreeMap<WorkloadRef, Seen>,
    verifying: Timestamp,
) -> (Vec<String>, Vec<String>) {
    let mut short = Vec::new();
    let mut back = Vec::new();
    for workload in evicted {
        let looked = availability
            .get(workload)
            .filter(|(at, _)| *at >= verifying)
            .map(|(_, looked)| looked);
        match looked {
            Some(None) => {}
            Some(Some(Ok(a))) if a.available >= a.desired => {
                back.push(format!(
                    "{} {} of {} available",
                    a.shown, a.available, a.desired
                ));
            }
            Some(Some(Ok(a))) => {
                short.push(format!(
                    "{} {} of {} available",
                    a.shown, a.available, a.desired
                ));
            }
            Some(Some(Err(e))) => short.push(format!("{workload}: cannot check ({e})")),
            None => short.push(format!("{workload}: not looked up since the reboot yet")),
        }
    }
    (short, back)
}

fn cut(mut message: String) -> String {
    if message.len() > MESSAGE_LIMIT {
        let mut end = MESSAGE_LIMIT - 3;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    message
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn web() -> WorkloadRef {
        WorkloadRef {
            kind: "ReplicaSet".into(),
            namespace: "shop".into(),
            name: "web-5d8f".into(),
        }
    }

    fn verifying(entered: &str) -> NodeMaintenance {
        serde_json::from_value(json!({
            "metadata": {"name": "w1-reboot"},
            "spec": {"nodeName": "w1", "reason": "Reboot", "action": "Reboot"},
            "status": {"phase": "Verifying",
                       "history": [{"phase": "Verifying", "time": entered}],
                       "admission": {"policies": ["pool"], "admittedAt": "2026-11-25T11:50:00Z", "admittedBy": "c"},
                       "evictedWorkloads": [web()]}
        }))
        .expect("a maintenance")
    }

    fn policy(gate: serde_json::Value) -> Vec<Arc<DisruptionPolicy>> {
        vec![Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                "metadata": {"name": "pool"},
                "spec": {"maxConcurrent": 1, "workloadGate": gate}
            }))
            .expect("a policy"),
        )]
    }

    /// Web's availability as looked up at 12:00:30, after the reboot.
    fn web_available(available: i32) -> BTreeMap<WorkloadRef, Seen> {
        BTreeMap::from([(
            web(),
            (
                at("2026-11-25T12:00:30Z"),
                Some(Ok(Availability {
                    shown: "Deployment shop/web".into(),
                    available,
                    desired: 3,
                })),
            ),
        )])
    }

    fn at(t: &str) -> Timestamp {
        t.parse().expect("a time")
    }

    #[test]
    fn a_short_workload_waits_and_a_full_one_lets_the_reboot_finish() {
        let m = verifying("2026-11-25T12:00:00Z");
        let now = at("2026-11-25T12:01:00Z");
        let waiting = verdict(&m, &policy(json!({})), &web_available(2), now);
        assert_eq!((waiting.status, waiting.reason), ("False", "Waiting"));
        assert_eq!(waiting.message, "Deployment shop/web 2 of 3 available");
        let back = verdict(&m, &policy(json!({})), &web_available(3), now);
        assert_eq!((back.status, back.reason), ("True", "Available"));
        let gone = BTreeMap::from([(web(), (now, None))]);
        assert_eq!(verdict(&m, &policy(json!({})), &gone, now).status, "True");
        let unreadable = BTreeMap::from([(web(), (now, Some(Err("forbidden".to_owned()))))]);
        let unknown = verdict(&m, &policy(json!({})), &unreadable, now);
        assert_eq!(
            unknown.reason, "Waiting",
            "a check that failed does not pass"
        );
        assert!(unknown.message.contains("cannot check (forbidden)"));
        // Looked up before the reboot: the pods it evicted may not show as missing yet.
        let mut early = web_available(3);
        if let Some(seen) = early.get_mut(&web()) {
            seen.0 = at("2026-11-25T11:59:59Z");
        }
        let stale = verdict(&m, &policy(json!({})), &early, now);
        assert_eq!((stale.status, stale.reason), ("False", "Waiting"));
        assert!(
            stale.message.contains("not looked up since the reboot yet"),
            "{stale:?}"
        );
    }

    #[test]
    fn the_timeout_ends_the_wait_as_the_policy_says_and_a_gate_turned_off_waits_for_nothing() {
        let m = verifying("2026-11-25T12:00:00Z");
        let late = at("2026-11-25T12:10:00Z");
        let late_under =
            |gate, available| verdict(&m, &policy(gate), &web_available(available), late);
        let succeed = late_under(json!({}), 2);
        assert_eq!((succeed.status, succeed.reason), ("False", "TimedOut"));
        assert!(
            succeed
                .message
                .starts_with("still short 600s after the reboot"),
            "{succeed:?}"
        );
        let fail = late_under(json!({"onTimeout": "Fail"}), 2);
        assert_eq!(fail.reason, "TimedOutFailed");
        let longer = late_under(json!({"timeout": "20m"}), 2);
        assert_eq!(longer.reason, "Waiting");
        let off = late_under(json!({"waitForEvicted": false}), 0);
        assert_eq!((off.status, off.reason), ("True", "NotChecked"));
    }

    #[test]
    fn only_verifying_reboots_that_evicted_pods_are_judged_and_only_changes_are_written() {
        let mut objects = Objects {
            policies: policy(json!({})),
            maintenances: vec![Arc::new(verifying("2026-11-25T12:00:00Z"))],
            ..Objects::default()
        };
        assert_eq!(wanted(&objects), BTreeSet::from([web()]));
        let now = at("2026-11-25T12:01:00Z");
        let mut plan = Plan::default();
        judge(&objects, &web_available(2), now, &mut plan);
        assert_eq!(plan.workload_verdicts.len(), 1);
        // Written: the same verdict again is not.
        let written = plan.workload_verdicts[0].clone();
        let m = Arc::make_mut(&mut objects.maintenances[0]);
        if let Some(s) = m.status.as_mut() {
            super::super::set_condition(
                &mut s.conditions,
                WORKLOADS_AVAILABLE,
                written.status,
                written.reason,
                written.message,
                None,
                now,
            );
        }
        let mut again = Plan::default();
        judge(&objects, &web_available(2), now, &mut again);
        assert!(again.workload_verdicts.is_empty());
        // Acting (not back yet): not judged.
        if let Some(s) = Arc::make_mut(&mut objects.maintenances[0]).status.as_mut() {
            s.phase = MaintenancePhase::Acting;
        }
        assert!(wanted(&objects).is_empty());
    }
}
