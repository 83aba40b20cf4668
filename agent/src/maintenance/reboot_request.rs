//! Coordinated reboots (what kured does, through the coordinator): while the node reports
//! `RebootRequired` and auto-reboot is on (a policy selecting the node sets `autoReboot`, or
//! the agent's `--auto-reboot`), the agent asks for one Reboot NodeMaintenance per boot. The
//! name derives from the node and the boot id, so asking again is harmless. A request that
//! ended Failed (a drain that ran out of time, a health gate that never passed) is asked for
//! again while the node still requires a reboot, after `reboot.requestRetryAfter`, doubling,
//! at most `reboot.requestRetries` times in a boot.

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;
use kube::{Client, runtime::events::EventType};
use nodeward_api::{
    MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance,
    conditions::node::REBOOT_REQUIRED, labels::AGENT_FIELD_MANAGER,
};
use nodeward_runtime::{backoff::Backoff, events::Events};
use tokio::sync::watch;

use super::{request::Filed, watch::NodeMaintenances};
use crate::{detect::Status, runner::Snapshot};

/// The boot id's first alphanumeric characters, lower case, at most `len`.
fn boot_key(boot_id: &str, len: usize) -> String {
    boot_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(len)
        .collect::<String>()
        .to_ascii_lowercase()
}

/// The maintenance name for a reboot of `node` in the boot `boot_id`.
pub fn name(node: &str, boot_id: &str) -> String {
    retry_name(node, boot_id, 0)
}

/// The name of the `attempt`th request of a boot: the first is `<node>-reboot-<boot8>`, a
/// retry `<node>-reboot-<boot6>r<attempt>` (a boot id is hexadecimal: no `r` in it), so that
/// each fits the eight characters the chart's admission policy allows an agent after
/// `-reboot-`.
pub fn retry_name(node: &str, boot_id: &str, attempt: u32) -> String {
    let key = match attempt {
        0 => boot_key(boot_id, 8),
        n => format!("{}r{n}", boot_key(boot_id, 6)),
    };
    super::request::name(node, "reboot", &key)
}

/// Whether the snapshot says a reboot is required.
pub fn required(snapshot: &Snapshot) -> bool {
    snapshot
        .values()
        .any(|c| c.finding.condition == REBOOT_REQUIRED && c.finding.status == Status::Problem)
}

/// How a failed request is asked for again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// At most this many times in a boot.
    pub retries: u32,
    /// After this long, doubled after each further failure.
    pub after: Duration,
}

/// What became of one of this boot's requests, as the watch of the node's maintenances has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub phase: MaintenancePhase,
    pub finished_at: Option<Timestamp>,
}

/// What the requester does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Ask for the `attempt`th request, at `at` (now, when `None` or past).
    Ask { attempt: u32, at: Option<Timestamp> },
    /// Nothing: the latest request is waiting or under way, or was deleted (an operator's
    /// cancel is not undone), or succeeded.
    Wait,
    /// The latest request failed and no retry is left.
    GaveUp { attempts: u32 },
}

/// What to do next, from the attempt this agent last asked for (none since it started) and
/// this boot's requests by attempt.
pub fn next(asked: Option<u32>, seen: &BTreeMap<u32, Seen>, retry: Retry) -> Next {
    let latest = asked.max(seen.keys().next_back().copied());
    let Some(latest) = latest else {
        return Next::Ask {
            attempt: 0,
            at: None,
        };
    };
    match seen.get(&latest) {
        Some(Seen {
            phase: MaintenancePhase::Failed,
            finished_at,
        }) => {
            if latest >= retry.retries {
                return Next::GaveUp {
                    attempts: latest + 1,
                };
            }
            let wait = retry.after.saturating_mul(1u32 << latest.min(20));
            let at = finished_at.and_then(|f| {
                jiff::SignedDuration::try_from(wait)
                    .ok()
                    .and_then(|w| f.checked_add(w).ok())
            });
            Next::Ask {
                attempt: latest + 1,
                at,
            }
        }
        // Not in the watch yet (just asked) or deleted; or waiting, under way, succeeded.
        _ => Next::Wait,
    }
}

/// This boot's requests of `node` in `maintenances`, by attempt.
fn seen(maintenances: &NodeMaintenances, node: &str, boot_id: &str) -> BTreeMap<u32, Seen> {
    let names: BTreeMap<String, u32> = (0..=super::reboot_method::REQUEST_RETRIES_LIMIT)
        .map(|attempt| (retry_name(node, boot_id, attempt), attempt))
        .collect();
    maintenances
        .store
        .state()
        .iter()
        .filter_map(|m| {
            let attempt = *names.get(m.metadata.name.as_deref()?)?;
            let finished_at = m
                .status
                .as_ref()
                .and_then(|s| s.finished_at.as_ref())
                .map(|t| t.0);
            Some((
                attempt,
                Seen {
                    phase: m.phase(),
                    finished_at,
                },
            ))
        })
        .collect()
}

/// Runs until the senders go away: asks for the reboot when both inputs say so, and again
/// after a failure ([`next`]). A request the cluster refuses (its admission policy, the bound
/// on requests per node) is shown as a Warning Event on the node, once per reason, and asked
/// again with backoff.
pub async fn run(
    (client, events): (Client, Events),
    (node, boot_id): (String, String),
    retry: Retry,
    mut maintenances: NodeMaintenances,
    mut snapshots: watch::Receiver<Snapshot>,
    mut auto_reboot: watch::Receiver<bool>,
) {
    let mut requester = Requester {
        about: crate::node_reference(&node),
        client,
        events,
        node,
        boot_id,
        retry,
        asked: None,
        backoff: Backoff::new(RETRY_FIRST, RETRY_MAX),
        refused_until: None,
        shown: None,
        gave_up_shown: false,
        jitter: BTreeMap::new(),
    };
    loop {
        let wanted = required(&snapshots.borrow_and_update()) && *auto_reboot.borrow_and_update();
        maintenances.changes.borrow_and_update();
        let wake = if wanted {
            requester.step(&maintenances).await
        } else {
            None
        };
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            changed = auto_reboot.changed() => if changed.is_err() { return },
            changed = maintenances.changes.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(wake.unwrap_or_default()), if wake.is_some() => {}
        }
    }
}

/// The requests of one boot, and what the agent said of them.
struct Requester {
    client: Client,
    events: Events,
    about: k8s_openapi::api::core::v1::ObjectReference,
    node: String,
    boot_id: String,
    retry: Retry,
    /// The attempt this agent last asked for (or found asked for) since it started.
    asked: Option<u32>,
    /// Backoff while the cluster refuses a request, and until when.
    backoff: Backoff,
    refused_until: Option<tokio::time::Instant>,
    /// The last refusal shown as an Event, and whether the end of the retries was.
    shown: Option<String>,
    gave_up_shown: bool,
    /// The jitter of each retry, drawn once (up to a tenth of its wait).
    jitter: BTreeMap<u32, Duration>,
}

impl Requester {
    /// Does what [`next`] says while the node requires a reboot; returns when to look again
    /// (besides any change), if at a time.
    async fn step(&mut self, maintenances: &NodeMaintenances) -> Option<Duration> {
        let seen = seen(maintenances, &self.node, &self.boot_id);
        if self.asked.is_none()
            && let Some(latest) = seen.keys().next_back()
        {
            // Started again in a boot that asked before: carry on from there.
            let name = retry_name(&self.node, &self.boot_id, *latest);
            tracing::info!(maintenance = %name, "reboot required: already asked for in this boot");
            self.asked = Some(*latest);
        }
        match next(self.asked, &seen, self.retry) {
            Next::Ask { attempt, at } => {
                let after = self.retry.after;
                let extra = *self
                    .jitter
                    .entry(attempt)
                    .or_insert_with(|| after.mul_f64(rand::random::<f64>() * 0.1));
                // What is left of the wait and its jitter (nothing once it is over).
                let due = at.map(|at| {
                    let left = at.duration_since(Timestamp::now());
                    jiff::SignedDuration::try_from(extra)
                        .ok()
                        .and_then(|extra| left.checked_add(extra))
                        .and_then(|left| Duration::try_from(left).ok())
                        .unwrap_or_default()
                });
                let refused_for = self
                    .refused_until
                    .map(|until| until.saturating_duration_since(tokio::time::Instant::now()))
                    .filter(|d| !d.is_zero());
                match due.filter(|d| attempt > 0 && !d.is_zero()).or(refused_for) {
                    Some(wait) => Some(wait),
                    None => self.ask(attempt).await,
                }
            }
            Next::GaveUp { attempts } if !self.gave_up_shown => {
                self.gave_up_shown = true;
                let message = format!(
                    "the node still requires a reboot, but its {attempts} requests in this boot failed (reboot.requestRetries {}): look at the last one's status, then ask with kubectl nodeward reboot",
                    self.retry.retries
                );
                self.event(EventType::Warning, "RebootRequestsExhausted", message)
                    .await;
                None
            }
            _ => None,
        }
    }

    /// Files the `attempt`th request; on a refusal, returns when to try again.
    async fn ask(&mut self, attempt: u32) -> Option<Duration> {
        let name = retry_name(&self.node, &self.boot_id, attempt);
        match request(&self.client, &self.node, &name, attempt).await {
            Ok(()) => {
                self.asked = Some(attempt);
                self.backoff.reset();
                self.refused_until = None;
                if attempt > 0 {
                    let message = format!(
                        "the node still requires a reboot and the last request failed: asked again ({name}, retry {attempt} of {})",
                        self.retry.retries
                    );
                    self.event(EventType::Normal, "RebootRequestedAgain", message)
                        .await;
                }
                None
            }
            Err(why) => {
                let delay = self.backoff.next_delay();
                self.refused_until = Some(tokio::time::Instant::now() + delay);
                tracing::warn!(error = %why, maintenance = %name, retry = ?delay, "asking for a reboot failed; asking again");
                if self.shown.as_ref() != Some(&why) {
                    let message = format!(
                        "asking for a reboot (NodeMaintenance {name}) failed, asking again with backoff: {why}"
                    );
                    self.event(EventType::Warning, "RebootRequestRefused", message)
                        .await;
                    self.shown = Some(why);
                }
                Some(delay)
            }
        }
    }

    async fn event(&self, type_: EventType, reason: &str, message: String) {
        self.events
            .publish(&self.about, type_, "RebootRequest", reason, message)
            .await;
    }
}

/// The first wait before asking again after the cluster refused a request, and the longest.
const RETRY_FIRST: Duration = Duration::from_secs(30);
const RETRY_MAX: Duration = Duration::from_secs(600);

/// Files the reboot request; the error is what the API server said.
async fn request(client: &Client, node: &str, name: &str, attempt: u32) -> Result<(), String> {
    let why = match attempt {
        0 => "the node reports RebootRequired".to_owned(),
        n => format!("the node reports RebootRequired; retry {n} after a failed request"),
    };
    let maintenance = NodeMaintenance::request(
        name,
        node,
        MaintenanceReason::Reboot,
        MaintenanceAction::Reboot,
        AGENT_FIELD_MANAGER,
        why,
    );
    match super::request::file(client, &maintenance).await? {
        Filed::Created => {
            tracing::info!(maintenance = %name, "reboot required: asked the coordinator for a reboot");
        }
        Filed::Existed => {
            tracing::info!(maintenance = %name, "reboot required: already asked for in this boot");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_per_node_and_boot() {
        let a = name("worker-1", "3f2a9c1e-77aa-4c0b-9f1e-5e0a8d2c4b6a");
        assert_eq!(a, "worker-1-reboot-3f2a9c1e");
        assert_eq!(a, name("worker-1", "3f2a9c1e-77aa-4c0b-9f1e-5e0a8d2c4b6a"));
        assert_ne!(a, name("worker-1", "11111111-0000-0000-0000-000000000000"));
        let long = name(&"n".repeat(300), "abc");
        assert!(long.len() <= 253, "{}", long.len());
    }

    #[test]
    fn a_retry_has_a_name_of_its_own_within_eight_characters_of_its_boot() {
        let boot = "3f2a9c1e-77aa-4c0b-9f1e-5e0a8d2c4b6a";
        assert_eq!(retry_name("w", boot, 0), "w-reboot-3f2a9c1e");
        assert_eq!(retry_name("w", boot, 1), "w-reboot-3f2a9cr1");
        assert_eq!(retry_name("w", boot, 9), "w-reboot-3f2a9cr9");
        // Two boots that share their first six characters still differ in the first request.
        assert_ne!(
            retry_name("w", "3f2a9c00", 0),
            retry_name("w", "3f2a9c11", 0)
        );
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("in range")
    }

    fn failed(seconds: i64) -> Seen {
        Seen {
            phase: MaintenancePhase::Failed,
            finished_at: Some(at(seconds)),
        }
    }

    #[test]
    fn a_failed_request_is_asked_again_after_a_doubling_wait_up_to_the_limit() {
        let retry = Retry {
            retries: 2,
            after: Duration::from_secs(60),
        };
        let ask = |attempt, seconds| Next::Ask {
            attempt,
            at: Some(at(seconds)),
        };
        // Nothing asked yet: now.
        assert_eq!(
            next(None, &BTreeMap::new(), retry),
            Next::Ask {
                attempt: 0,
                at: None
            }
        );
        // Asked, not in the watch yet; then waiting or under way: nothing to do.
        assert_eq!(next(Some(0), &BTreeMap::new(), retry), Next::Wait);
        let pending = Seen {
            phase: MaintenancePhase::Pending,
            finished_at: None,
        };
        assert_eq!(
            next(Some(0), &BTreeMap::from([(0, pending)]), retry),
            Next::Wait
        );
        // The first failed at 100 s: again 60 s later; the retry failed at 300 s: 120 s later.
        let mut seen = BTreeMap::from([(0, failed(100))]);
        assert_eq!(next(Some(0), &seen, retry), ask(1, 160));
        seen.insert(1, failed(300));
        assert_eq!(next(Some(1), &seen, retry), ask(2, 420));
        // After a restart the watch says how far the boot got.
        assert_eq!(next(None, &seen, retry), ask(2, 420));
        seen.insert(2, failed(600));
        assert_eq!(next(Some(2), &seen, retry), Next::GaveUp { attempts: 3 });
        // A success, or an operator's delete of the latest, ends it.
        let succeeded = Seen {
            phase: MaintenancePhase::Succeeded,
            finished_at: Some(at(700)),
        };
        assert_eq!(
            next(Some(0), &BTreeMap::from([(0, succeeded)]), retry),
            Next::Wait
        );
        assert_eq!(
            next(Some(1), &BTreeMap::from([(0, failed(100))]), retry),
            Next::Wait
        );
        // No retries: the first failure is the last.
        let none = Retry {
            retries: 0,
            ..retry
        };
        assert_eq!(
            next(Some(0), &BTreeMap::from([(0, failed(1))]), none),
            Next::GaveUp { attempts: 1 }
        );
    }
}
