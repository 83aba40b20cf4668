//! The peers this agent cannot reach, for its NodeReport: the coordinator asks the peers
//! whether a node whose agent went silent is really unreachable before it treats the node as
//! dead. Kept as changes, not as a log of probes: a peer enters the list when a probe of it
//! fails, is probed again every round while it is listed, and is marked reachable (with the
//! time) when it answers again. So the list, and the report, change only when a peer's
//! reachability does, and an entry says what holds now for as long as this agent is alive.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodeward_api::report::{PEER_SIGHTINGS_LIMIT, PeerSighting};
use tokio::sync::watch;

/// How often a peer's fencing probes move its recorded time (each move is a report write):
/// the coordinator's margin after a fencing node's last recorded probe covers it.
pub const PROBED_REFRESH: SignedDuration = SignedDuration::from_secs(15);

/// What this agent holds of one listed peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    /// Whether it answers now, and since when.
    reachable: bool,
    since: Timestamp,
    /// When it last sent a fencing probe (cut off from the API server, counting its peers).
    probed_at: Option<Timestamp>,
}

impl Entry {
    fn latest(&self) -> Timestamp {
        self.probed_at.map_or(self.since, |p| p.max(self.since))
    }
}

type Listed = BTreeMap<String, Entry>;

/// Shared by the peer detector (which records) and the reporter (which publishes, told of
/// every change).
#[derive(Clone, Debug)]
pub struct Sightings {
    listed: Arc<Mutex<Listed>>,
    changed: Arc<watch::Sender<u64>>,
}

impl Default for Sightings {
    fn default() -> Self {
        Self {
            listed: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

impl Sightings {
    /// Records a probe of `node` at `at`: a failure lists it as unreachable (since `at`, if it
    /// was not already), an answer from a listed one marks it reachable again.
    pub fn record(&self, node: &str, reachable: bool, at: Timestamp) {
        self.change(|listed| match listed.get_mut(node) {
            Some(e) if e.reachable == reachable => false,
            None if reachable => false,
            Some(e) => {
                e.reachable = reachable;
                e.since = at;
                true
            }
            None => {
                let entry = Entry {
                    reachable,
                    since: at,
                    probed_at: None,
                };
                listed.insert(node.to_owned(), entry);
                true
            }
        });
    }

    /// Records a fencing probe `node` sent at `at` (and answered): it is running, whatever
    /// this agent's own probes of it find. Moved at most every [`PROBED_REFRESH`].
    pub fn probed(&self, node: &str, at: Timestamp) {
        self.change(|listed| match listed.get_mut(node) {
            Some(e) => {
                let due = e
                    .probed_at
                    .is_none_or(|p| at.duration_since(p) >= PROBED_REFRESH);
                if due {
                    e.probed_at = Some(at);
                }
                due
            }
            None => {
                let entry = Entry {
                    reachable: true,
                    since: at,
                    probed_at: Some(at),
                };
                listed.insert(node.to_owned(), entry);
                true
            }
        });
    }

    /// Applies `change` (which says whether it changed anything), keeps the list bounded and
    /// tells of the change.
    fn change(&self, change: impl FnOnce(&mut Listed) -> bool) {
        let mut listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
        let changed = change(&mut listed);
        if changed {
            trim(&mut listed);
        }
        drop(listed);
        if changed {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// Forgets peers that are no longer peers (they left the directory).
    pub fn keep_only(&self, is_peer: impl Fn(&str) -> bool) {
        self.change(|listed| {
            let before = listed.len();
            listed.retain(|node, _| is_peer(node));
            listed.len() != before
        });
    }

    /// The peers listed as unreachable: probed again every round.
    pub fn unreachable(&self) -> Vec<String> {
        self.listed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, e)| !e.reachable)
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// The list as published, newest change first.
    pub fn latest(&self) -> Vec<PeerSighting> {
        let listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<(&String, &Entry)> = listed.iter().collect();
        all.sort_by(|a, b| b.1.latest().cmp(&a.1.latest()).then_with(|| a.0.cmp(b.0)));
        all.into_iter()
            .map(|(node, e)| PeerSighting {
                node: node.clone(),
                reachable: e.reachable,
                time: Time(e.since),
                probed_at: e.probed_at.map(Time),
            })
            .collect()
    }

    /// Told of every change of the list.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Keeps the list within [`PEER_SIGHTINGS_LIMIT`], dropping first what the coordinator can best
/// do without, the oldest of each kind first: peers that answer again (no danger in that), then
/// unreachable ones (without them a dead node is marked later, or by an operator), and fencing
/// probes last. A probe is the evidence that its node still runs and may still be feeding its
/// watchdog: dropped, the coordinator would count the node's fencing from an earlier time and
/// could mark it out of service while it runs its pods. A list full of probes tells the
/// coordinator that one may have been dropped (`decide/src/dead.rs`).
fn trim(listed: &mut Listed) {
    while listed.len() > PEER_SIGHTINGS_LIMIT {
        let oldest = listed
            .iter()
            .min_by_key(|(node, e)| (dropped_before(e), e.latest(), (*node).clone()))
            .map(|(node, _)| node.clone());
        match oldest {
            Some(node) => listed.remove(&node),
            None => return,
        };
    }
}

/// The order in which [`trim`] drops kinds of entries: lowest first.
fn dropped_before(e: &Entry) -> u8 {
    match (e.probed_at.is_some(), e.reachable) {
        (false, true) => 0,
        (false, false) => 1,
        (true, _) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("in range")
    }

    #[test]
    fn only_changes_of_reachability_are_listed_and_told() {
        let sightings = Sightings::default();
        let changes = sightings.changes();
        sightings.record("a", true, t(10));
        assert!(
            sightings.latest().is_empty(),
            "a peer that answers is not listed"
        );
        assert!(!changes.has_changed().expect("open"));

        sightings.record("a", false, t(20));
        sightings.record("a", false, t(30));
        let latest = sightings.latest();
        assert_eq!(latest.len(), 1);
        assert!(!latest[0].reachable);
        assert_eq!(
            latest[0].time.0,
            t(20),
            "unreachable since the first failed probe"
        );
        assert_eq!(sightings.unreachable(), ["a"]);
        assert_eq!(*changes.borrow(), 1, "one change told");

        sightings.record("a", true, t(40));
        let latest = sightings.latest();
        assert!(latest[0].reachable && latest[0].time.0 == t(40));
        assert!(sightings.unreachable().is_empty());
        assert_eq!(*changes.borrow(), 2);
        sightings.record("a", true, t(50));
        assert_eq!(*changes.borrow(), 2, "answering again changes nothing");
    }

    #[test]
    fn the_list_stays_bounded_and_forgets_former_peers() {
        let sightings = Sightings::default();
        sightings.record("reached", false, t(0));
        sightings.record("reached", true, t(1));
        for i in 0..PEER_SIGHTINGS_LIMIT {
            sightings.record(&format!("n{i:03}"), false, t(10 + i as i64));
        }
        let latest = sightings.latest();
        assert_eq!(latest.len(), PEER_SIGHTINGS_LIMIT);
        assert!(
            latest.iter().all(|s| s.node != "reached"),
            "one reached again goes before any unreachable one"
        );
        sightings.record("extra", false, t(100));
        assert!(
            sightings.latest().iter().all(|s| s.node != "n000"),
            "then the oldest unreachable one"
        );
        sightings.keep_only(|node| node != "extra");
        assert!(sightings.latest().iter().all(|s| s.node != "extra"));
    }

    // A zone of dead nodes fills the list with unreachable ones while a node cut off from the
    // API server, not from this peer, still probes it: its probe is what keeps the coordinator
    // from counting its fencing as over.
    #[test]
    fn a_fencing_probe_outlasts_any_number_of_unreachable_peers_and_probes_go_oldest_first() {
        let sightings = Sightings::default();
        sightings.probed("cut-off", t(0));
        for i in 0..PEER_SIGHTINGS_LIMIT + 8 {
            sightings.record(&format!("dead{i:03}"), false, t(10 + i as i64));
        }
        let latest = sightings.latest();
        assert_eq!(latest.len(), PEER_SIGHTINGS_LIMIT);
        assert!(
            latest
                .iter()
                .any(|s| s.node == "cut-off" && s.probed_at == Some(Time(t(0)))),
            "the probe is kept: {latest:?}"
        );

        for i in 0..PEER_SIGHTINGS_LIMIT {
            sightings.probed(&format!("probing{i:03}"), t(100 + i as i64));
        }
        let latest = sightings.latest();
        assert!(
            latest.iter().all(|s| s.probed_at.is_some()),
            "every unreachable one went before a probe: {latest:?}"
        );
        assert!(
            latest.iter().all(|s| s.node != "cut-off"),
            "then the oldest probe"
        );
    }

    #[test]
    fn a_fencing_probe_is_recorded_whatever_the_peers_reachability_and_moves_at_most_every_refresh()
    {
        let sightings = Sightings::default();
        let changes = sightings.changes();
        sightings.probed("cut-off", t(100));
        let latest = sightings.latest();
        assert_eq!(latest.len(), 1);
        assert!(latest[0].reachable);
        assert_eq!(latest[0].probed_at, Some(Time(t(100))));
        sightings.probed("cut-off", t(110));
        assert_eq!(
            sightings.latest()[0].probed_at,
            Some(Time(t(100))),
            "within the refresh"
        );
        assert_eq!(*changes.borrow(), 1);
        sightings.probed("cut-off", t(115));
        assert_eq!(sightings.latest()[0].probed_at, Some(Time(t(115))));
        // Its inbound rules broke: this agent's probes of it fail, its own still arrive.
        sightings.record("cut-off", false, t(120));
        let latest = sightings.latest();
        assert!(!latest[0].reachable);
        assert_eq!(latest[0].probed_at, Some(Time(t(115))), "kept");
        assert_eq!(*changes.borrow(), 3);
    }
}
