//! Writing a round's denials. In a large rollout nearly every maintenance waits: 5,000 created
//! at once are 5,000 denials, and each denial whose message follows the rollout's progress
//! wants a refresh. Written one after another, they held the decision loop for minutes (at 44
//! writes/s on a loaded API server), so that slots freed meanwhile stayed unused and new
//! maintenances waited. So a round writes what fences slots (always), then first denials and
//! changed reasons, then refreshes, oldest first, and at most [`WRITES_PER_ROUND`] of the last
//! two: the rest follow in the next rounds, which it asks for.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{ResourceExt, runtime::events::EventType};
use nodeward_api::{
    MaintenancePhase, NodeMaintenance,
    conditions::{denial, maintenance as maintenance_conditions},
};

use super::Controller;
use nodeward_decide::round::{self, Objects};

use crate::metrics::{Applied, DenialLabels};

/// A denial whose reason is unchanged and whose message follows the rollout's progress is
/// rewritten (new message) at most this often.
const REFRESH: Duration = Duration::from_secs(30);

/// Denials (other than fences) one round writes at most: at a few tens of writes a second,
/// a round's writes stay within a few seconds.
const WRITES_PER_ROUND: usize = 64;

/// Whether a denial's message changes as the cluster moves on (which nodes hold slots, which
/// are unhealthy or NotReady): with many maintenances waiting, rewriting each of them on every
/// change would be a write storm, so those refresh every [`REFRESH`]. The others (blocked,
/// paused, outside a window) change only when their cause does, and an operator should see
/// that at once.
fn message_follows_progress(reason: &str) -> bool {
    matches!(
        reason,
        denial::BUDGET_EXHAUSTED
            | denial::TOO_MANY_UNHEALTHY
            | denial::QUORUM_PROTECTED
            // Its budget's healthy count moves as the evicted replicas come back.
            | denial::WORKLOAD_NOT_READY
    )
}

/// Why a denial is written, most urgent first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Write {
    /// It gives a half-done admission's slots back: the write is what fences them.
    Fence,
    /// The first denial, or a new reason, or a message that does not follow progress.
    Change,
    /// The same reason with a newer progress message.
    Refresh,
}

/// Whether (and why) `denial` is written, given the maintenance's Admitted condition now and
/// whether its denial was written within [`REFRESH`].
fn triage(existing: Option<&Condition>, denial: &round::Denial, recently: bool) -> Option<Write> {
    if denial.gives_back_slots {
        return Some(Write::Fence);
    }
    if !same_reason(existing, denial) {
        return Some(Write::Change);
    }
    if existing.is_some_and(|c| c.message == denial.message) {
        return None;
    }
    if !message_follows_progress(denial.reason) {
        return Some(Write::Change);
    }
    (!recently).then_some(Write::Refresh)
}

/// Which of `wanted` (in the plan's order, each with why) a round writes: every fence, then the
/// others by urgency, stable, up to `limit`. Returns their indexes in writing order, and
/// whether any was left for a later round.
fn chosen(wanted: &[(usize, Write)], limit: usize) -> (Vec<usize>, bool) {
    let mut order: Vec<(usize, Write)> = wanted.to_vec();
    order.sort_by_key(|&(_, why)| why);
    let mut taken = Vec::new();
    let mut others = 0;
    let mut left = false;
    for (index, why) in order {
        if why == Write::Fence {
            taken.push(index);
        } else if others < limit {
            others += 1;
            taken.push(index);
        } else {
            left = true;
        }
    }
    (taken, left)
}

/// Whether the maintenance is denied already, for the same reason (then a new message is no
/// new denial: no Event, no count).
fn same_reason(existing: Option<&Condition>, denial: &round::Denial) -> bool {
    existing.is_some_and(|c| c.status == "False" && c.reason == denial.reason)
}

fn admitted_condition(m: &NodeMaintenance) -> Option<&Condition> {
    m.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == maintenance_conditions::ADMITTED)
    })
}

impl Controller {
    /// Writes the denials this round should (see the module); adds to `fenced` the uids of
    /// the half-done admissions whose denial was written, so that their slots can be freed.
    /// Returns the worst of the writes.
    pub(super) async fn deny_all(
        &mut self,
        objects: &Objects,
        denials: &[round::Denial],
        fenced: &mut BTreeSet<String>,
    ) -> Applied {
        self.denied_at.retain(|_, t| t.elapsed() < REFRESH);
        let by_name: HashMap<String, &Arc<NodeMaintenance>> = objects
            .maintenances
            .iter()
            .map(|m| (m.name_any(), m))
            .collect();
        // Each denial with its maintenance as the round saw it, looked up once.
        let found: Vec<(&round::Denial, &Arc<NodeMaintenance>)> = denials
            .iter()
            .filter_map(|denial| Some((denial, *by_name.get(&denial.maintenance)?)))
            .collect();
        let wanted: Vec<(usize, Write)> = found
            .iter()
            .enumerate()
            .filter_map(|(index, (denial, current))| {
                let recently = self.denied_at.contains_key(&denial.maintenance);
                Some((
                    index,
                    triage(admitted_condition(current), denial, recently)?,
                ))
            })
            .collect();
        let (taken, left) = chosen(&wanted, WRITES_PER_ROUND);
        let mut written = 0;
        let mut applied = Vec::new();
        for index in taken {
            let (denial, current) = found[index];
            let outcome = self.deny(current, denial).await;
            applied.push(outcome);
            if outcome.is_written() {
                written += 1;
                if denial.gives_back_slots {
                    fenced.extend(current.uid());
                }
            }
        }
        // The next round goes on with the rest, if these went through (when the API server
        // refuses them, the next change or resync does, not a tight loop).
        if left && written > 0 {
            tracing::debug!(
                wanted = wanted.len(),
                written,
                "more denials to write than a round writes; the next round goes on"
            );
            self.writer.changed.anything();
        }
        Applied::worst(applied)
    }

    /// Writes one denial.
    async fn deny(&mut self, current: &Arc<NodeMaintenance>, denial: &round::Denial) -> Applied {
        let new_reason = !same_reason(admitted_condition(current), denial);
        let now = Timestamp::now();
        let generation = current.metadata.generation;
        let written = self
            .writer
            .write_maintenance(current, |status| {
                status.phase = MaintenancePhase::Pending;
                if denial.gives_back_slots {
                    status.withdraw_admission();
                }
                round::set_condition(
                    &mut status.conditions,
                    maintenance_conditions::ADMITTED,
                    "False",
                    denial.reason,
                    denial.message.clone(),
                    generation,
                    now,
                );
            })
            .await;
        if written.is_written() {
            self.denied_at
                .insert(denial.maintenance.clone(), Instant::now());
            if new_reason {
                self.writer
                    .metrics
                    .denials
                    .get_or_create(&DenialLabels {
                        rule: denial.rule,
                        reason: denial.reason,
                    })
                    .inc();
                self.writer.event(
                    current.as_ref(),
                    EventType::Normal,
                    denial.reason,
                    denial.message.clone(),
                );
            }
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn denial(reason: &'static str, message: &str, gives_back_slots: bool) -> round::Denial {
        round::Denial {
            maintenance: "m".into(),
            rule: "budget",
            reason,
            message: message.into(),
            gives_back_slots,
        }
    }

    fn condition(reason: &str, message: &str) -> Condition {
        Condition {
            type_: maintenance_conditions::ADMITTED.into(),
            status: "False".into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn only_denials_whose_message_follows_progress_are_throttled() {
        for reason in [
            denial::BUDGET_EXHAUSTED,
            denial::TOO_MANY_UNHEALTHY,
            denial::QUORUM_PROTECTED,
            denial::WORKLOAD_NOT_READY,
        ] {
            assert!(message_follows_progress(reason), "{reason}");
        }
        for reason in [
            denial::BLOCKED,
            denial::PAUSED,
            denial::OUTSIDE_WINDOW,
            denial::IN_BLACKOUT,
        ] {
            assert!(!message_follows_progress(reason), "{reason}");
        }
    }

    #[test]
    fn a_denial_is_written_when_new_changed_or_due_for_a_refresh() {
        let budget = denial::BUDGET_EXHAUSTED;
        let paused = denial::PAUSED;
        let now = denial(budget, "50 of 50 slots in use; 4,000 waiting", false);
        // First denial, and a new reason.
        assert_eq!(triage(None, &now, false), Some(Write::Change));
        let was_paused = condition(paused, "paused");
        assert_eq!(triage(Some(&was_paused), &now, true), Some(Write::Change));
        // The same words: nothing to write.
        let same = condition(budget, "50 of 50 slots in use; 4,000 waiting");
        assert_eq!(triage(Some(&same), &now, false), None);
        // Progress only: refreshed, but not within the refresh interval.
        let older = condition(budget, "50 of 50 slots in use; 4,050 waiting");
        assert_eq!(triage(Some(&older), &now, false), Some(Write::Refresh));
        assert_eq!(triage(Some(&older), &now, true), None);
        // A message that does not follow progress changed: its cause did, written at once.
        let pause = denial(paused, "paused by policy b", false);
        let other_pause = condition(paused, "paused by policy a");
        assert_eq!(
            triage(Some(&other_pause), &pause, true),
            Some(Write::Change)
        );
        // A fence is always written, whatever it says.
        let fence = denial(budget, "50 of 50 slots in use; 4,000 waiting", true);
        assert_eq!(triage(Some(&same), &fence, true), Some(Write::Fence));
    }

    #[test]
    fn a_round_writes_every_fence_then_changes_then_refreshes_up_to_its_limit() {
        let wanted = [
            (0, Write::Refresh),
            (1, Write::Change),
            (2, Write::Fence),
            (3, Write::Refresh),
            (4, Write::Change),
            (5, Write::Fence),
            (6, Write::Fence),
        ];
        let (taken, left) = chosen(&wanted, 3);
        // All three fences although the limit is 3, then the changes in plan order, then the
        // oldest refresh.
        assert_eq!(taken, vec![2, 5, 6, 1, 4, 0]);
        assert!(left, "refresh 3 waits for the next round");
        let (taken, left) = chosen(&wanted, 10);
        assert_eq!(taken.len(), wanted.len());
        assert!(!left);
    }
}
