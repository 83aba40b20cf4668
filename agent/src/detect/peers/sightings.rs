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

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodeward_api::report::{PEER_SIGHTINGS_LIMIT, PeerSighting};
use tokio::sync::watch;

/// Each listed peer: whether it answers now, and since when.
type Listed = BTreeMap<String, (bool, Timestamp)>;

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
        let mut listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
        let changed = match listed.get(node) {
            Some((was, _)) if *was == reachable => false,
            None if reachable => false,
            _ => {
                listed.insert(node.to_owned(), (reachable, at));
                trim(&mut listed);
                true
            }
        };
        drop(listed);
        if changed {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// Forgets peers that are no longer peers (they left the directory).
    pub fn keep_only(&self, is_peer: impl Fn(&str) -> bool) {
        let mut listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
        let before = listed.len();
        listed.retain(|node, _| is_peer(node));
        let changed = listed.len() != before;
        drop(listed);
        if changed {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// The peers listed as unreachable: probed again every round.
    pub fn unreachable(&self) -> Vec<String> {
        self.listed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, (reachable, _))| !reachable)
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// The list as published, newest change first.
    pub fn latest(&self) -> Vec<PeerSighting> {
        let listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<(&String, &(bool, Timestamp))> = listed.iter().collect();
        all.sort_by(|a, b| b.1.1.cmp(&a.1.1).then_with(|| a.0.cmp(b.0)));
        all.into_iter()
            .map(|(node, (reachable, at))| PeerSighting {
                node: node.clone(),
                reachable: *reachable,
                time: Time(*at),
            })
            .collect()
    }

    /// Told of every change of the list.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Keeps the list within [`PEER_SIGHTINGS_LIMIT`]: the peers reached again go first, oldest
/// first, then the oldest unreachable ones.
fn trim(listed: &mut Listed) {
    while listed.len() > PEER_SIGHTINGS_LIMIT {
        let oldest = listed
            .iter()
            .min_by_key(|(node, (reachable, at))| (!*reachable, *at, (*node).clone()))
            .map(|(node, _)| node.clone());
        match oldest {
            Some(node) => listed.remove(&node),
            None => return,
        };
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
}
