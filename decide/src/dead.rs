//! Whether a node is dead, so that the coordinator may act on it without its agent (the
//! `node.kubernetes.io/out-of-service` taint, a DeleteNode that needs no drain): NotReady for
//! a while, its own agent silent, and, where other agents probe their peers, some live peer
//! lists it as unreachable now and none reached it since it went NotReady. A node that is
//! merely cut off from the API server still answers its peers, and is not dead. Pure functions
//! over plain data.
//!
//! A peer lists a node when a probe of it fails and probes it again every round while it is
//! listed (`agent/src/detect/peers/sightings.rs`): an unreachable entry holds now, whenever it
//! began, as long as the peer's agent is alive; a reachable one records when the node answered
//! again.

use std::time::Duration;

use jiff::Timestamp;

/// What is known of a node that may be dead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    pub ready: bool,
    /// Since when its Ready condition has not been True.
    pub not_ready_since: Timestamp,
    /// Why its own agent cannot speak for it (None: it still writes its heartbeat).
    pub agent_unavailable: Option<String>,
    /// What peers whose own agents are alive list of it: who, whether it answers, since when.
    pub sightings: Vec<(String, bool, Timestamp)>,
    /// Whether any live agent in the cluster probes its peers at all.
    pub peers_exist: bool,
}

/// Dead (why) or not (why not). `grace` is how long it must have been NotReady.
pub fn judge(e: &Evidence, now: Timestamp, grace: Duration) -> Result<String, String> {
    if e.ready {
        return Err("it is Ready".to_owned());
    }
    let not_ready_for =
        Duration::try_from(now.duration_since(e.not_ready_since)).unwrap_or(Duration::ZERO);
    if not_ready_for < grace {
        return Err(format!(
            "NotReady for {}s, less than {}s",
            not_ready_for.as_secs(),
            grace.as_secs()
        ));
    }
    let Some(silent) = &e.agent_unavailable else {
        return Err("its agent still writes its heartbeat".to_owned());
    };
    if let Some((peer, _, at)) = e
        .sightings
        .iter()
        .find(|(_, reachable, at)| *reachable && *at > e.not_ready_since)
    {
        return Err(format!(
            "peer {peer} reached it at {at} although it is NotReady (cut off from the API server, not down)"
        ));
    }
    let mut unreachable: Vec<&str> = e
        .sightings
        .iter()
        .filter(|(_, reachable, _)| !reachable)
        .map(|(peer, _, _)| peer.as_str())
        .collect();
    unreachable.sort_unstable();
    unreachable.dedup();
    let peers = match (unreachable.len(), e.peers_exist) {
        (0, true) => {
            return Err("no peer finds it unreachable (yet)".to_owned());
        }
        (0, false) => "no agent probes peers to ask".to_owned(),
        (n, _) => format!("unreachable from {n} peer(s): {}", unreachable.join(", ")),
    };
    Ok(format!(
        "NotReady for {}s, {silent}, {peers}",
        not_ready_for.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("in range")
    }

    fn dead_looking() -> Evidence {
        Evidence {
            ready: false,
            not_ready_since: t(0),
            agent_unavailable: Some("its agent is silent".into()),
            sightings: vec![("p1".into(), false, t(100)), ("p2".into(), false, t(120))],
            peers_exist: true,
        }
    }

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn notready_silent_and_unreachable_from_its_peers_is_dead() {
        let why = judge(&dead_looking(), t(200), GRACE).expect("dead");
        assert!(
            why.contains("NotReady for 200s")
                && why.contains("its agent is silent")
                && why.contains("unreachable from 2 peer(s): p1, p2"),
            "{why}"
        );
    }

    #[test]
    fn a_node_a_peer_still_reaches_is_only_cut_off_and_not_dead() {
        let mut e = dead_looking();
        e.sightings.push(("p3".into(), true, t(150)));
        let why = judge(&e, t(200), GRACE).expect_err("reachable");
        assert!(why.contains("peer p3 reached it"), "{why}");
    }

    #[test]
    fn each_piece_of_evidence_is_needed() {
        let ready = Evidence {
            ready: true,
            ..dead_looking()
        };
        assert!(judge(&ready, t(200), GRACE).is_err());
        assert!(
            judge(&dead_looking(), t(59), GRACE).is_err(),
            "not NotReady for long enough"
        );
        let speaking = Evidence {
            agent_unavailable: None,
            ..dead_looking()
        };
        assert!(judge(&speaking, t(200), GRACE).is_err());
        let unreachable_before = Evidence {
            sightings: vec![("p1".into(), false, t(-10))],
            ..dead_looking()
        };
        assert!(
            judge(&unreachable_before, t(200), GRACE).is_ok(),
            "unreachable since before it went NotReady, and still"
        );
        let reached_before = Evidence {
            sightings: vec![("p1".into(), true, t(-10))],
            ..dead_looking()
        };
        assert_eq!(
            judge(&reached_before, t(200), GRACE),
            Err("no peer finds it unreachable (yet)".to_owned()),
            "reached again before it went NotReady, and not found unreachable since"
        );
        let no_peers = Evidence {
            sightings: Vec::new(),
            peers_exist: false,
            ..dead_looking()
        };
        let why = judge(&no_peers, t(200), GRACE).expect("dead without peers to ask");
        assert!(why.contains("no agent probes peers"), "{why}");
    }
}
