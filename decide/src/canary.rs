//! The canary stage (`spec.canary`): a patch rollout's first nodes go alone. A planned reboot
//! (reason `Reboot` or `Manual`, action `Reboot`: what runs the policy's update) of any other
//! node in scope waits until the canaries succeeded and `soak` passed. The stage is read from
//! the maintenances themselves, as the failure budget is: a canary's success stands for the
//! maintenances created up to `validFor` after it, so the next rollout has canaries of its own
//! and nothing is stored but the maintenances.

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use nodeward_api::{
    MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance, policy::Canary,
};

/// The most nodes a canary message names (the rest are counted).
const NAMED: usize = 5;

/// Which nodes are canaries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Canaries {
    /// The first this many nodes whose planned reboots are admitted (`canary.nodes`).
    First(usize),
    /// The matched nodes `canary.nodeSelector` selects.
    Selected(BTreeSet<String>),
}

/// A policy's canary stage as of one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    pub canaries: Canaries,
    pub soak: SignedDuration,
    pub valid_for: SignedDuration,
    /// `soak` and `validFor` as written (their defaults when absent), for the messages.
    pub written: (String, String),
    /// Each node's latest successful planned reboot admitted under the policy: when it ended.
    pub succeeded: BTreeMap<String, Timestamp>,
    /// Nodes with a planned reboot admitted under the policy and not finished.
    pub under_way: BTreeSet<String>,
    /// Canary nodes (of [`Canaries::Selected`]) with a planned reboot waiting for admission.
    pub waiting: BTreeSet<String>,
}

/// Whether `m` is a planned reboot: what a policy's update runs in, and what the stage holds.
pub fn planned(m: &NodeMaintenance) -> bool {
    m.spec.action == MaintenanceAction::Reboot
        && matches!(
            m.spec.reason,
            MaintenanceReason::Reboot | MaintenanceReason::Manual
        )
        && m.spec.disruption_deadline.is_none()
}

/// `policy`'s stage over `maintenances` (`selected`: the matched nodes its `nodeSelector`
/// picks, when it has one). A duration that does not parse counts as its default (the CRD
/// refuses one).
pub fn stage<'a>(
    policy: &str,
    canary: &Canary,
    selected: Option<BTreeSet<String>>,
    maintenances: impl IntoIterator<Item = &'a NodeMaintenance>,
) -> Stage {
    let (soak, soak_text) = written(canary.soak.as_ref(), std::time::Duration::ZERO, "0s");
    let (valid_for, valid_for_text) =
        written(canary.valid_for.as_ref(), Canary::DEFAULT_VALID_FOR, "24h");
    let canaries = match selected {
        Some(nodes) => Canaries::Selected(nodes),
        None => Canaries::First(
            usize::try_from(canary.nodes.unwrap_or(Canary::DEFAULT_NODES)).unwrap_or(usize::MAX),
        ),
    };
    let mut stage = Stage {
        soak,
        valid_for,
        written: (soak_text, valid_for_text),
        succeeded: BTreeMap::new(),
        under_way: BTreeSet::new(),
        waiting: BTreeSet::new(),
        canaries,
    };
    for m in maintenances.into_iter().filter(|m| planned(m)) {
        let node = &m.spec.node_name;
        let status = m.status.as_ref();
        let admitted_here = status
            .and_then(|s| s.admission.as_ref())
            .is_some_and(|a| a.policies.iter().any(|p| p == policy));
        match m.phase() {
            MaintenancePhase::Pending => {
                let deleted = m.metadata.deletion_timestamp.is_some();
                if !deleted && stage.is_canary(node) {
                    stage.waiting.insert(node.clone());
                }
            }
            MaintenancePhase::Succeeded if admitted_here => {
                if let Some(at) = status.and_then(|s| s.finished_at.as_ref()).map(|t| t.0) {
                    let latest = stage.succeeded.entry(node.clone()).or_insert(at);
                    *latest = (*latest).max(at);
                }
            }
            phase if admitted_here && !phase.is_finished() => {
                stage.under_way.insert(node.clone());
            }
            _ => {}
        }
    }
    stage
}

/// A duration of the spec, and its text for the messages: `default` and `text` when absent or
/// unreadable.
fn written(
    d: Option<&nodeward_api::Duration>,
    default: std::time::Duration,
    text: &str,
) -> (SignedDuration, String) {
    let value = |d: std::time::Duration| SignedDuration::try_from(d).ok();
    match d.and_then(|d| Some((value(d.to_std().ok()?)?, d.to_string()))) {
        Some(read) => read,
        None => (
            value(default).unwrap_or(SignedDuration::ZERO),
            text.to_owned(),
        ),
    }
}

impl Stage {
    /// Whether `node` is one of the selected canaries (never, for [`Canaries::First`]).
    fn is_canary(&self, node: &str) -> bool {
        matches!(&self.canaries, Canaries::Selected(nodes) if nodes.contains(node))
    }

    /// Whether `m`, a planned reboot admitted under the policy, went as one of its canaries:
    /// its node is a selected canary, or fewer than `canary.nodes` successes of other nodes
    /// stood for it when it was admitted. (Each node's latest success is kept: one that
    /// succeeded again since is not counted, and a failure is then taken for a canary's, the
    /// side that halts.)
    pub fn went_as_canary(&self, m: &NodeMaintenance) -> bool {
        if !planned(m) {
            return false;
        }
        let node = m.spec.node_name.as_str();
        match &self.canaries {
            Canaries::Selected(nodes) => nodes.contains(node),
            Canaries::First(count) => {
                let Some(admitted) = m
                    .status
                    .as_ref()
                    .and_then(|s| s.admission.as_ref())
                    .map(|a| a.admitted_at.0)
                else {
                    return false;
                };
                let created = m
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(admitted, |t| t.0);
                let stood = self
                    .succeeded_for(created)
                    .into_iter()
                    .filter(|(n, at)| *n != node && *at <= admitted)
                    .count();
                stood < *count
            }
        }
    }

    /// Records that a planned reboot of `node` was admitted under the policy this round.
    pub fn admitted(&mut self, node: &str) {
        self.waiting.remove(node);
        self.under_way.insert(node.to_owned());
    }

    /// Whether a planned reboot of `node`, created at `created`, may go now: as a canary, or
    /// because the canaries succeeded (and soaked, unless `urgent`). Why not, if not.
    pub fn judge(
        &self,
        node: &str,
        created: Timestamp,
        urgent: bool,
        now: Timestamp,
    ) -> Result<(), String> {
        match &self.canaries {
            Canaries::Selected(_) if self.is_canary(node) => Ok(()),
            Canaries::First(count) => {
                let succeeded = self.succeeded_for(created);
                let canaries: BTreeSet<&str> = succeeded
                    .iter()
                    .map(|(n, _)| *n)
                    .chain(self.under_way.iter().map(String::as_str))
                    .collect();
                if canaries.len() < *count {
                    return Ok(());
                }
                self.rest_may_go(created, urgent, now)
            }
            Canaries::Selected(_) => self.rest_may_go(created, urgent, now),
        }
    }

    /// Whether the stage is over for a planned reboot of a node that is no canary, created at
    /// `created`: the `CanaryPassed` condition, and the denial of one that is held.
    pub fn rest_may_go(
        &self,
        created: Timestamp,
        urgent: bool,
        now: Timestamp,
    ) -> Result<(), String> {
        let (needed, counted, mut message) = match &self.canaries {
            Canaries::First(count) => (
                *count,
                None,
                format!("the first {count} planned reboots are canaries"),
            ),
            Canaries::Selected(nodes) if nodes.is_empty() => {
                return Err("canary.nodeSelector selects none of the policy's nodes: label a canary or change the selector".to_owned());
            }
            Canaries::Selected(nodes) => {
                let ahead: BTreeSet<&String> = self
                    .waiting
                    .iter()
                    .chain(self.under_way.iter().filter(|n| nodes.contains(*n)))
                    .collect();
                if !ahead.is_empty() {
                    let ahead: Vec<&str> = ahead.into_iter().map(String::as_str).collect();
                    return Err(format!("canaries go first: waiting for {}", named(&ahead)));
                }
                (
                    1,
                    Some(nodes),
                    format!(
                        "the canaries are the {} nodes canary.nodeSelector selects",
                        nodes.len()
                    ),
                )
            }
        };
        // When each success that stands for this maintenance has soaked, soonest first.
        let mut soaked_at: Vec<Timestamp> = self
            .succeeded_for(created)
            .into_iter()
            .filter(|(node, _)| counted.is_none_or(|nodes| nodes.contains(*node)))
            .map(|(_, at)| {
                if urgent {
                    at
                } else {
                    at.checked_add(self.soak).unwrap_or(Timestamp::MAX)
                }
            })
            .collect();
        soaked_at.sort();
        match soaked_at.get(needed.saturating_sub(1)) {
            Some(at) if *at <= now => return Ok(()),
            Some(at) => message.push_str(&format!(
                ": {} succeeded; the rest wait for canary.soak {} until {at}",
                soaked_at.len(),
                self.written.0
            )),
            None => message.push_str(&format!(
                ": {} of {needed} succeeded since canary.validFor {} before it was asked for",
                soaked_at.len(),
                self.written.1
            )),
        }
        let under_way: Vec<&str> = self.under_way.iter().map(String::as_str).collect();
        if counted.is_none() && !under_way.is_empty() {
            message.push_str(&format!("; under way: {}", named(&under_way)));
        }
        if counted.is_some() && soaked_at.is_empty() {
            message.push_str("; give a canary a planned reboot (kubectl nodeward reboot NODE)");
        }
        Err(message)
    }

    /// The successes that stand for a maintenance created at `created`, by node, oldest first.
    fn succeeded_for(&self, created: Timestamp) -> Vec<(&str, Timestamp)> {
        let since = created
            .checked_sub(self.valid_for)
            .unwrap_or(Timestamp::MIN);
        let mut all: Vec<(&str, Timestamp)> = self
            .succeeded
            .iter()
            .filter(|(_, at)| **at >= since)
            .map(|(n, at)| (n.as_str(), *at))
            .collect();
        all.sort_by_key(|(n, at)| (*at, *n));
        all
    }
}

/// The first [`NAMED`] of `nodes`, and how many more.
fn named(nodes: &[&str]) -> String {
    let mut text = nodes
        .iter()
        .take(NAMED)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if nodes.len() > NAMED {
        text.push_str(&format!(" and {} more", nodes.len() - NAMED));
    }
    text
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use nodeward_api::Duration;

    use super::*;

    /// `minutes` after a fixed moment.
    fn at(minutes: i64) -> Timestamp {
        crate::testing::at(minutes * 60)
    }

    /// A planned reboot of `node` in `phase`, admitted under `policies`, ended at `ended`
    /// (minutes) when finished.
    fn reboot(
        node: &str,
        phase: MaintenancePhase,
        policies: &[&str],
        ended: i64,
    ) -> NodeMaintenance {
        crate::testing::reboot(
            &format!("{node}-{ended}"),
            node,
            policies,
            phase,
            ended * 60,
        )
    }

    fn spec(nodes: Option<u32>, soak: &str) -> Canary {
        Canary {
            nodes,
            soak: Some(Duration::parse(soak).expect("a duration")),
            ..Canary::default()
        }
    }

    #[test]
    fn the_first_planned_reboots_go_alone_and_the_rest_wait_for_their_success_and_soak() {
        let mut stage = stage("p", &spec(Some(2), "30m"), None, []);
        let created = at(0);
        // Two canaries go, one after the other in the same round; the third waits.
        assert_eq!(stage.judge("a", created, false, at(1)), Ok(()));
        stage.admitted("a");
        assert_eq!(stage.judge("b", created, false, at(1)), Ok(()));
        stage.admitted("b");
        let held = stage.judge("c", created, false, at(1)).expect_err("held");
        assert_eq!(
            held,
            "the first 2 planned reboots are canaries: 0 of 2 succeeded since canary.validFor 24h before it was asked for; under way: a, b"
        );
        // Both succeed at minutes 20 and 25: the rest wait 30m from the later.
        let maintenances = [
            reboot("a", MaintenancePhase::Succeeded, &["p"], 20),
            reboot("b", MaintenancePhase::Succeeded, &["p"], 25),
        ];
        let stage = super::stage("p", &spec(Some(2), "30m"), None, &maintenances);
        let soaking = stage
            .judge("c", created, false, at(30))
            .expect_err("soaking");
        assert_eq!(
            soaking,
            format!(
                "the first 2 planned reboots are canaries: 2 succeeded; the rest wait for canary.soak 30m until {}",
                at(55)
            )
        );
        assert_eq!(stage.judge("c", created, false, at(55)), Ok(()));
        // An urgent one waits for the canaries' success, not for the soak.
        assert_eq!(stage.judge("c", created, true, at(30)), Ok(()));
        let one = [reboot("a", MaintenancePhase::Succeeded, &["p"], 20)];
        let one = super::stage("p", &spec(Some(2), "30m"), None, &one);
        assert_eq!(
            one.judge("c", created, true, at(30)),
            Ok(()),
            "c is the second canary"
        );
        let mut one = one;
        one.admitted("c");
        assert!(
            one.judge("d", created, true, at(30)).is_err(),
            "b has not succeeded"
        );
    }

    #[test]
    fn a_success_stands_only_for_maintenances_created_within_valid_for_after_it() {
        let maintenances = [reboot("a", MaintenancePhase::Succeeded, &["p"], 0)];
        let stage = stage("p", &spec(None, "0s"), None, &maintenances);
        // A straggler of the same rollout, a day later to the minute: a's success stands.
        assert_eq!(
            stage.rest_may_go(at(24 * 60), false, at(24 * 60 + 5)),
            Ok(())
        );
        // The next rollout, a minute later still: it needs a canary of its own, and gets one.
        let next = at(24 * 60 + 1);
        assert!(stage.rest_may_go(next, false, next).is_err());
        assert_eq!(
            stage.judge("b", next, false, next),
            Ok(()),
            "b is its canary"
        );
    }

    #[test]
    fn only_successes_of_planned_reboots_under_the_policy_count_each_nodes_latest() {
        let mut remediation = reboot("x", MaintenancePhase::Succeeded, &["p"], 5);
        remediation.spec.reason = MaintenanceReason::Remediation;
        let mut notice = reboot("y", MaintenancePhase::Succeeded, &["p"], 5);
        notice.spec.disruption_deadline = Some(Time(at(4)));
        let mut drain_only = reboot("z", MaintenancePhase::Succeeded, &["p"], 5);
        drain_only.spec.action = MaintenanceAction::DrainOnly;
        let maintenances = [
            reboot("a", MaintenancePhase::Succeeded, &["p"], 1),
            reboot("a", MaintenancePhase::Succeeded, &["p"], 3),
            reboot("b", MaintenancePhase::Succeeded, &["other"], 2),
            reboot("c", MaintenancePhase::Failed, &["p"], 2),
            reboot("d", MaintenancePhase::Draining, &["p"], 0),
            reboot("e", MaintenancePhase::Pending, &[], 0),
            remediation,
            notice,
            drain_only,
        ];
        let stage = stage("p", &spec(None, "0s"), None, &maintenances);
        assert_eq!(stage.succeeded, BTreeMap::from([("a".to_owned(), at(3))]));
        assert_eq!(stage.under_way, BTreeSet::from(["d".to_owned()]));
        assert!(stage.waiting.is_empty(), "no selected canaries");
    }

    #[test]
    fn selected_canaries_go_first_and_the_rest_wait_for_one_to_succeed_and_soak() {
        let selected = BTreeSet::from(["c1".to_owned(), "c2".to_owned()]);
        let canary = Canary {
            node_selector: Some(Default::default()),
            ..spec(None, "10m")
        };
        let pending = [
            reboot("c1", MaintenancePhase::Pending, &[], 0),
            reboot("w1", MaintenancePhase::Pending, &[], 0),
        ];
        let mut stage = stage("p", &canary, Some(selected.clone()), &pending);
        assert_eq!(stage.waiting, BTreeSet::from(["c1".to_owned()]));
        assert_eq!(
            stage.judge("c1", at(0), false, at(0)),
            Ok(()),
            "a canary goes"
        );
        assert_eq!(
            stage.judge("w1", at(0), false, at(0)),
            Err("canaries go first: waiting for c1".to_owned())
        );
        stage.admitted("c1");
        assert_eq!(
            stage.judge("w1", at(0), true, at(0)),
            Err("canaries go first: waiting for c1".to_owned()),
            "even an urgent one"
        );
        // c1 succeeded at minute 20; c2 has nothing to do.
        let done = [
            reboot("c1", MaintenancePhase::Succeeded, &["p"], 20),
            reboot("w1", MaintenancePhase::Pending, &[], 0),
        ];
        let stage = super::stage("p", &canary, Some(selected.clone()), &done);
        assert!(stage.judge("w1", at(0), false, at(25)).is_err(), "soaking");
        assert_eq!(stage.judge("w1", at(0), false, at(30)), Ok(()));
        // Nothing succeeded: the operator is told what to do.
        let none = super::stage("p", &canary, Some(selected), []);
        let why = none.rest_may_go(at(0), false, at(0)).expect_err("held");
        assert!(
            why.contains("0 of 1 succeeded") && why.contains("kubectl nodeward reboot NODE"),
            "{why}"
        );
        let empty = super::stage("p", &canary, Some(BTreeSet::new()), []);
        assert!(
            empty
                .rest_may_go(at(0), false, at(0))
                .expect_err("held")
                .starts_with("canary.nodeSelector selects none")
        );
    }
}
