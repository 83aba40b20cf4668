//! What this agent last saw of each peer it probed, for its NodeReport: the coordinator asks
//! the peers whether a node whose agent went silent is really unreachable before it treats the
//! node as dead.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodeward_api::report::{PEER_SIGHTINGS_LIMIT, PeerSighting};

/// The last probe of each peer, shared by the peer detector (which records) and the reporter
/// (which publishes the most recent).
#[derive(Clone, Debug, Default)]
pub struct Sightings(Arc<Mutex<BTreeMap<String, (bool, Timestamp)>>>);

impl Sightings {
    /// Records that `node` was (or was not) reachable at `at`.
    pub fn record(&self, node: &str, reachable: bool, at: Timestamp) {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.insert(node.to_owned(), (reachable, at));
        // Peers that left the directory are forgotten with the oldest: the map stays small.
        if seen.len() > 4 * PEER_SIGHTINGS_LIMIT {
            let keep = latest(&seen, 2 * PEER_SIGHTINGS_LIMIT);
            seen.retain(|name, _| keep.iter().any(|s| s.node == *name));
        }
    }

    /// The most recent sightings, newest first, at most [`PEER_SIGHTINGS_LIMIT`].
    pub fn latest(&self) -> Vec<PeerSighting> {
        latest(
            &self.0.lock().unwrap_or_else(|p| p.into_inner()),
            PEER_SIGHTINGS_LIMIT,
        )
    }
}

/// The `limit` most recent of `seen`, newest first (ties by name).
fn latest(seen: &BTreeMap<String, (bool, Timestamp)>, limit: usize) -> Vec<PeerSighting> {
    let mut all: Vec<(&String, &(bool, Timestamp))> = seen.iter().collect();
    all.sort_by(|a, b| b.1.1.cmp(&a.1.1).then_with(|| a.0.cmp(b.0)));
    all.into_iter()
        .take(limit)
        .map(|(node, (reachable, at))| PeerSighting {
            node: node.clone(),
            reachable: *reachable,
            time: Time(*at),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("in range")
    }

    #[test]
    fn the_newest_sighting_of_each_peer_is_kept_and_the_most_recent_are_published() {
        let sightings = Sightings::default();
        sightings.record("a", true, t(10));
        sightings.record("a", false, t(20));
        sightings.record("b", true, t(15));
        let latest = sightings.latest();
        assert_eq!(latest.len(), 2);
        assert_eq!(
            (latest[0].node.as_str(), latest[0].reachable),
            ("a", false),
            "the last probe of a peer is what counts"
        );
        assert_eq!(latest[1].node, "b");
    }

    #[test]
    fn at_most_the_limit_is_published_and_the_map_stays_bounded() {
        let sightings = Sightings::default();
        for i in 0..(5 * PEER_SIGHTINGS_LIMIT) {
            sightings.record(&format!("n{i:03}"), true, t(i as i64));
        }
        let latest = sightings.latest();
        assert_eq!(latest.len(), PEER_SIGHTINGS_LIMIT);
        assert_eq!(
            latest[0].node,
            format!("n{:03}", 5 * PEER_SIGHTINGS_LIMIT - 1)
        );
        let kept = sightings.0.lock().expect("lock").len();
        assert!(kept <= 4 * PEER_SIGHTINGS_LIMIT, "{kept}");
    }
}
