//! Which NotReady nodes are dead ([`crate::dead`]): the evidence gathered from the round's
//! objects, the peers' sightings among it.

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;
use nodeward_api::{fleet::PEER_DETECTOR, node::is_ready, report::PEER_SIGHTINGS_LIMIT};

use super::{timestamp, view::Index};
use crate::{
    dead::{self, Evidence, Fencing},
    deadlines::agent_unavailable,
};

/// The dead nodes, each with why; and those that look dead but are not known to be down (their
/// agents do not fence them, or the fencing is not over), each with why.
#[derive(Debug, Default)]
pub(super) struct Judged<'a> {
    pub dead: BTreeMap<&'a str, String>,
    pub not_known_down: BTreeMap<&'a str, String>,
}

pub(super) fn judged<'a>(index: &Index<'a>, now: Timestamp) -> Judged<'a> {
    let not_ready: Vec<&str> = index
        .nodes
        .iter()
        .filter(|(_, node)| !is_ready(node))
        .map(|(name, _)| *name)
        .collect();
    if not_ready.is_empty() {
        return Judged::default();
    }
    // What live agents saw of their peers: only an agent that still reports speaks for them.
    let mut sightings: BTreeMap<&str, Vec<(String, bool, Timestamp)>> = BTreeMap::new();
    let mut probed: BTreeMap<&str, Vec<(String, Timestamp)>> = BTreeMap::new();
    let mut peers_exist = false;
    let mut silent: Vec<&str> = Vec::new();
    let mut probes_dropped_by: Vec<String> = Vec::new();
    for (peer, report) in &index.reports {
        let limit = index.deadlines_of_node(peer).agent_heartbeat;
        if agent_unavailable(peer, index.heartbeat(peer), now, limit).is_some() {
            silent.push(peer);
            continue;
        }
        let status = report.status.as_ref();
        let seen = status
            .map(|s| s.peer_sightings.as_slice())
            .unwrap_or_default();
        // It probes peers when its peer detector reports (an agent lists a peer only once it
        // finds it unreachable).
        peers_exist |= status.is_some_and(|s| {
            s.findings
                .iter()
                .any(|f| f.detector == PEER_DETECTOR && f.reason != "NoPeers")
        });
        if seen.len() >= PEER_SIGHTINGS_LIMIT && seen.iter().all(|s| s.probed_at.is_some()) {
            probes_dropped_by.push((*peer).to_owned());
        }
        for s in seen {
            sightings.entry(s.node.as_str()).or_default().push((
                (*peer).to_owned(),
                s.reachable,
                s.time.0,
            ));
            if let Some(at) = &s.probed_at {
                probed
                    .entry(s.node.as_str())
                    .or_default()
                    .push(((*peer).to_owned(), at.0));
            }
        }
    }
    let mut judged = Judged::default();
    for name in not_ready {
        let node = index.nodes[name];
        let deadlines = index.deadlines_of_node(name);
        let not_ready_since = nodeward_api::node::condition(node, "Ready")
            .and_then(|c| c.last_transition_time.as_ref())
            .map_or_else(
                || timestamp(node.metadata.creation_timestamp.as_ref()),
                |t| t.0,
            );
        let heard = index.heartbeat(name);
        let evidence = Evidence {
            ready: false,
            not_ready_since,
            agent_unavailable: agent_unavailable(name, heard, now, deadlines.agent_heartbeat),
            sightings: sightings.remove(name).unwrap_or_default(),
            peers_exist,
            heard,
            fencing: index
                .reports
                .get(name)
                .and_then(|r| r.status.as_ref())
                .filter(|s| of_this_boot(s.boot_id.as_deref(), node))
                .and_then(|s| fencing(s.fencing.as_ref()?)),
            probed: probed.remove(name).unwrap_or_default(),
            silent_others: silent.iter().filter(|s| **s != name).count(),
            probes_dropped_by: probes_dropped_by.clone(),
        };
        let Ok(looks) = dead::looks_dead(&evidence, now, deadlines.agent_heartbeat) else {
            continue;
        };
        match dead::known_down(&evidence, &looks, now) {
            Ok(why) => judged.dead.insert(name, why),
            Err(why) => judged.not_known_down.insert(name, why),
        };
    }
    judged
}

/// Whether a report's boot is the one the Node's kubelet reports: an announcement of an
/// earlier boot is not the word of an agent running now (it may never have come back).
fn of_this_boot(reported: Option<&str>, node: &k8s_openapi::api::core::v1::Node) -> bool {
    let kubelet = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.as_str())
        .filter(|b| !b.is_empty());
    match kubelet {
        Some(kubelet) => reported == Some(kubelet),
        None => true,
    }
}

/// An agent's announced fencing in plain durations; one the CRD's bounds would refuse (an
/// object stored before them) counts as no fencing, never as a shorter wait.
fn fencing(f: &nodeward_api::report::Fencing) -> Option<Fencing> {
    let seconds = |s: i32| {
        u64::try_from(s)
            .ok()
            .filter(|s| *s > 0)
            .map(Duration::from_secs)
    };
    Some(Fencing {
        after: seconds(f.fence_after_seconds)?,
        watchdog: seconds(f.timeout_seconds)?,
        agents: u32::try_from(f.agents).ok().filter(|a| *a > 0)?,
    })
}
