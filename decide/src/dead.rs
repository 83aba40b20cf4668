//! Whether a node is dead, so that the coordinator may act on it without its agent (the
//! `node.kubernetes.io/out-of-service` taint, a DeleteNode that needs no drain): NotReady for
//! a while, its own agent silent, and, where other agents probe their peers, some live peer
//! lists it as unreachable now and none reached it since it went NotReady. A node that is
//! merely cut off from the API server still answers its peers, and is not dead. And it must be
//! known to be down: only a node whose agent fences itself ([`Fencing`]) is, once the fencing
//! and its watchdog's reset are over; any other may still be running its pods, and only an
//! operator who knows it is off marks it. Pure functions over plain data.
//!
//! A fencing agent cut off from the API server probes every peer, and goes on feeding its
//! watchdog while more than half of the agents it counts answer (so a fleet whose API server is
//! down does not reset itself). Peers record those probes: a live one's record moves the time
//! by which the node is down, and while more than half of the agents are silent, the answers
//! may have come from them, so no node is known to be down. Nor while a live peer's list is
//! full of probes: it dropped its oldest to record a newer one.
//!
//! A peer lists a node when a probe of it fails and probes it again every round while it is
//! listed (`agent/src/detect/peers/sightings.rs`): an unreachable entry holds now, whenever it
//! began, as long as the peer's agent is alive; a reachable one records when the node answered
//! again.

use std::time::Duration;

use jiff::Timestamp;
use nodeward_api::report::PEER_SIGHTINGS_LIMIT;

/// Added to a fencing node's wait: clocks that disagree (the agent writes its heartbeat by its
/// own clock), the agent's own checking interval, a peer's record of its probes (moved at most
/// every 15 s, `agent/src/detect/peers/sightings.rs`), a late answer's report on its way.
pub const FENCE_MARGIN: Duration = Duration::from_secs(30);

/// A node's self-fencing, as its agent announced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fencing {
    /// How long without the API server and without any peer before it stops its watchdog.
    pub after: Duration,
    /// How long the watchdog then takes to reset the machine.
    pub watchdog: Duration,
    /// The agents it counts, itself among them: cut off from the API server, it goes on while
    /// more than half of them answer its probes.
    pub agents: u32,
}

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
    /// When its agent was last heard from (its heartbeat).
    pub heard: Option<Timestamp>,
    /// How its agent fences it, if it does.
    pub fencing: Option<Fencing>,
    /// When live peers last had a probe from its agent counting its peers for its fencing:
    /// each peer with the time.
    pub probed: Vec<(String, Timestamp)>,
    /// How many other agents are silent: its probes may have been answered by them unseen.
    pub silent_others: usize,
    /// Live peers whose lists are full of fencing probes: each dropped its oldest probe to
    /// record a newer one (`agent/src/detect/peers/sightings.rs`), which may have been this
    /// node's last.
    pub probes_dropped_by: Vec<String>,
}

/// When a node whose agent fences is down at the latest: counted from the latest of when it
/// was last heard from, when it went NotReady and the last of its probes a live peer recorded
/// (an answer it may count for `after`), its agent has stopped feeding its watchdog `after`
/// later, and the watchdog has reset it by `watchdog` after that. (While the silent agents are
/// too few to be a majority: [`known_down`].)
pub fn down_by(e: &Evidence, fencing: Fencing) -> Timestamp {
    let since = e
        .probed
        .iter()
        .map(|(_, at)| *at)
        .chain(e.heard)
        .fold(e.not_ready_since, Timestamp::max);
    let wait = fencing.after + fencing.watchdog + FENCE_MARGIN;
    since.checked_add(wait).unwrap_or(Timestamp::MAX)
}

/// Whether it looks dead (why) or not (why not): NotReady, silent, unreachable. Whether it is
/// known to be down is [`known_down`]'s.
pub fn looks_dead(e: &Evidence, now: Timestamp, grace: Duration) -> Result<String, String> {
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

/// Whether a node that looks dead (`looks`: why) is known to be down: its agent fences it and
/// the fencing and the watchdog's reset are over. Dead (why) or not yet (why not).
pub fn known_down(e: &Evidence, looks: &str, now: Timestamp) -> Result<String, String> {
    let Some(fencing) = e.fencing else {
        return Err(format!(
            "{looks}; but its agent does not fence it (NodeReport status.fencing), so it may still be running its pods: once it is known to be off, an operator marks it (kubectl nodeward out-of-service NODE)"
        ));
    };
    let silent = e.silent_others.saturating_add(1);
    if silent.saturating_mul(2) > fencing.agents as usize {
        return Err(format!(
            "{looks}; but {silent} of the {} agents its fencing counts are silent, and without the API server it goes on while more than half of them answer: the silent ones may be answering it",
            fencing.agents
        ));
    }
    if !e.probes_dropped_by.is_empty() {
        return Err(format!(
            "{looks}; but peer(s) {} list fencing probes from {PEER_SIGHTINGS_LIMIT} nodes, all a list holds: a probe from it may have been dropped, so when its fencing began is not known",
            e.probes_dropped_by.join(", ")
        ));
    }
    let down = down_by(e, fencing);
    if now < down {
        return Err(format!(
            "{looks}; its agent fences it after {}s without the API server and its peers, and its watchdog resets it {}s later: down by {down}",
            fencing.after.as_secs(),
            fencing.watchdog.as_secs()
        ));
    }
    Ok(format!(
        "{looks}, fenced by its agent ({}s without the API server and its peers, then its watchdog's {}s)",
        fencing.after.as_secs(),
        fencing.watchdog.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dead (why) or not (why not), as the round judges it: looks dead, then known to be down.
    /// `grace` is how long it must have been NotReady.
    fn judge(e: &Evidence, now: Timestamp, grace: Duration) -> Result<String, String> {
        let looks = looks_dead(e, now, grace)?;
        known_down(e, &looks, now)
    }

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
            heard: Some(t(-30)),
            fencing: Some(FENCING),
            probed: Vec::new(),
            silent_others: 0,
            probes_dropped_by: Vec::new(),
        }
    }

    const FENCING: Fencing = Fencing {
        after: Duration::from_secs(60),
        watchdog: Duration::from_secs(30),
        agents: 5,
    };

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn notready_silent_and_unreachable_from_its_peers_is_dead() {
        let why = judge(&dead_looking(), t(200), GRACE).expect("dead");
        assert!(
            why.contains("NotReady for 200s")
                && why.contains("its agent is silent")
                && why.contains("unreachable from 2 peer(s): p1, p2")
                && why.contains("fenced by its agent"),
            "{why}"
        );
    }

    #[test]
    fn a_node_whose_agent_does_not_fence_is_never_dead_and_an_operator_is_told_how() {
        let unfenced = Evidence {
            fencing: None,
            ..dead_looking()
        };
        let why = judge(&unfenced, t(100_000), GRACE).expect_err("not known to be down");
        assert!(
            why.contains("does not fence") && why.contains("kubectl nodeward out-of-service NODE"),
            "{why}"
        );
    }

    #[test]
    fn a_fencing_node_is_dead_once_its_fencing_and_its_watchdog_are_over() {
        // NotReady at 0, last heard at -30: the fencing (60 s), the watchdog (30 s) and the
        // margin (30 s) run from the later of the two.
        assert_eq!(down_by(&dead_looking(), FENCING), t(120));
        let why = judge(&dead_looking(), t(119), GRACE).expect_err("still fencing");
        assert!(why.contains("down by"), "{why}");
        assert!(judge(&dead_looking(), t(120), GRACE).is_ok());
        // Heard from after it went NotReady (its kubelet stopped first): from then.
        let heard_late = Evidence {
            heard: Some(t(50)),
            ..dead_looking()
        };
        assert_eq!(down_by(&heard_late, FENCING), t(170));
        assert!(judge(&heard_late, t(169), GRACE).is_err());
        assert!(judge(&heard_late, t(170), GRACE).is_ok());
        // Never heard from: from when it went NotReady.
        let never = Evidence {
            heard: None,
            ..dead_looking()
        };
        assert_eq!(down_by(&never, FENCING), t(120));
    }

    #[test]
    fn a_probe_of_its_fencing_that_a_live_peer_recorded_moves_the_time_it_is_down_by() {
        // It counted the peer's answer at 150 for its 60 s: the watchdog and the margin after.
        let probed = Evidence {
            probed: vec![("p1".into(), t(150)), ("p2".into(), t(100))],
            ..dead_looking()
        };
        assert_eq!(down_by(&probed, FENCING), t(270));
        assert!(judge(&probed, t(269), GRACE).is_err());
        assert!(judge(&probed, t(270), GRACE).is_ok());
    }

    #[test]
    fn no_node_is_known_down_while_the_silent_agents_could_be_the_majority_it_counts() {
        // 5 agents counted: itself and one other silent are 2, no majority; itself and two
        // others are 3, which may be answering it, as when the API server's side of a
        // partition is the smaller one.
        let two = Evidence {
            silent_others: 1,
            ..dead_looking()
        };
        assert!(judge(&two, t(200), GRACE).is_ok());
        let three = Evidence {
            silent_others: 2,
            ..dead_looking()
        };
        let why = judge(&three, t(100_000), GRACE).expect_err("may have a majority");
        assert!(
            why.contains("3 of the 5 agents its fencing counts are silent"),
            "{why}"
        );
    }

    // More nodes probe a peer than its list holds (a big partition): the one dropped may have
    // been this node's latest, which would have put its fencing later.
    #[test]
    fn no_node_is_known_down_while_a_peer_may_have_dropped_its_probe() {
        let dropped = Evidence {
            probes_dropped_by: vec!["p4".into()],
            ..dead_looking()
        };
        let why = judge(&dropped, t(100_000), GRACE).expect_err("a probe may be missing");
        assert!(
            why.contains("peer(s) p4 list fencing probes from 32 nodes"),
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
