//! Peer connectivity, the missing-security-group-rule problem: each round probes a small random
//! sample of other agents over TCP, UDP and ICMP. One protocol failing to most of them while
//! another works means a rule blocks that protocol; nothing working at all means this node is
//! isolated. The cost per round does not grow with the cluster.

mod directory;
mod probe;
mod respond;
mod sightings;

use std::{collections::BTreeMap, net::IpAddr, sync::Arc, time::Duration};

use futures::future::join_all;
use nodeward_api::conditions::node::PEER_CONNECTIVITY_PROBLEM;
use rand::seq::IndexedRandom;

use super::{
    AgentContext, Background, Detector, Finding, ForReports, On, Section, Starting, Status,
};
use crate::{
    flags::{self, Flag},
    metrics::{Metrics, ProbeLabels},
};
pub use directory::Directory;
pub use probe::{Protocol, probe, probe_fencing};
pub use respond::{answer, respond};
pub use sightings::Sightings;

super::section! {
    pub struct PeersConfig {
        /// The port every agent answers TCP and UDP probes on.
        pub port: u16,
        /// The address this agent answers probes on (default: every address of the node);
        /// peers probe the node's InternalIP, so it must be that one.
        pub listen_address: Option<std::net::IpAddr>,
        /// Peers probed per round, chosen at random.
        pub sample_size: usize,
        pub protocols: Vec<Protocol>,
        /// How long one probe waits for its answer.
        #[serde(deserialize_with = "crate::values::duration")]
        pub probe_timeout: Duration,
        /// Peers to probe besides the agents found through the Node objects (hosts without a
        /// cluster, or machines outside it).
        pub static_peers: Vec<std::net::IpAddr>,
    }
}

impl Default for PeersConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            port: 9471,
            listen_address: None,
            sample_size: 5,
            protocols: vec![Protocol::Tcp, Protocol::Udp, Protocol::Icmp],
            probe_timeout: Duration::from_secs(2),
            static_peers: Vec::new(),
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            hold: Duration::from_secs(60),
        }
    }
}

impl Section for PeersConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        if self.port == 0 {
            return Err(format!(
                "{place}.port: must be a port number from 1 to 65535, e.g. 9471"
            ));
        }
        if !(1..=50).contains(&self.sample_size) {
            return Err(format!(
                "{place}.sampleSize: must be from 1 to 50 (probes per round grow with it, not with the cluster)"
            ));
        }
        if self.probe_timeout.is_zero() || self.probe_timeout > self.timeout {
            return Err(format!(
                "{place}.probeTimeout: must be more than 0s and at most {place}.timeout"
            ));
        }
        if self.protocols.is_empty() {
            return Err(format!(
                "{place}.protocols: name at least one of tcp, udp, icmp"
            ));
        }
        Ok(())
    }

    fn detectors(&self, agent: Option<&AgentContext>) -> Vec<Detector> {
        let input = (
            self.clone(),
            agent.and_then(AgentContext::started::<PeerContext>),
        );
        Detector::new(
            DETECTOR,
            PEER_CONNECTIVITY_PROBLEM,
            self.schedule(),
            input,
            |(c, context)| async move { observe(&c, context.as_deref()).await },
        )
        .if_enabled(self.enabled)
    }

    /// Follows the peer directory and answers other agents' probes; the NodeReport carries
    /// the sightings.
    fn start<'a>(
        &'a self,
        on: &'a On<'a>,
        tasks: &'a mut tokio::task::JoinSet<()>,
    ) -> Starting<'a> {
        Box::pin(async move {
            if !self.enabled {
                return Ok(Background::default());
            }
            let directory = Directory::default();
            tasks.spawn(
                directory
                    .clone()
                    .follow(on.client.clone(), on.namespace.to_owned()),
            );
            let sightings = Sightings::default();
            let fencing_probe = {
                let (directory, sightings) = (directory.clone(), sightings.clone());
                move |from| {
                    if let Some(node) = directory.node_at(from) {
                        sightings.probed(&node, jiff::Timestamp::now());
                    }
                }
            };
            tasks.spawn(respond(self.listen_address, self.port, fencing_probe).await?);
            let background = Background {
                context: None,
                for_reports: ForReports {
                    sightings: Some(sightings.clone()),
                    ..ForReports::default()
                },
            };
            Ok(background.with_context(PeerContext {
                directory,
                node_name: on.node_name.to_owned(),
                metrics: on.metrics.clone(),
                sightings,
            }))
        })
    }

    fn flags(&self) -> Vec<Flag> {
        flags::declare! {
            "peer-port" ("NODEWARD_PEER_PORT") => "port": Scalar, "Port for peer probes over TCP and UDP";
        }
    }
}

pub const DETECTOR: &str = nodeward_api::fleet::PEER_DETECTOR;

/// What the peer detector needs in a running agent.
#[derive(Clone, Debug)]
pub struct PeerContext {
    pub directory: Directory,
    pub node_name: String,
    pub metrics: Arc<Metrics>,
    /// Each sampled peer's last probe, for the NodeReport.
    pub sightings: Sightings,
}

/// Successes and failures of one protocol in one round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub ok: usize,
    pub failed: usize,
}

pub async fn observe(config: &PeersConfig, context: Option<&PeerContext>) -> Finding {
    let mut candidates: Vec<(String, IpAddr)> = context
        .map(|c| c.directory.peers(&c.node_name))
        .unwrap_or_default();
    candidates.extend(config.static_peers.iter().map(|ip| (ip.to_string(), *ip)));
    if context.is_none() && candidates.is_empty() {
        return super::cluster::skipped(DETECTOR, PEER_CONNECTIVITY_PROBLEM);
    }
    let sample: Vec<(String, IpAddr)> = candidates
        .choose_multiple(&mut rand::rng(), config.sample_size)
        .cloned()
        .collect();
    // Peers listed as unreachable are probed again every round (for the sightings only, not
    // the tallies), so that the list says what holds now.
    let rechecks: Vec<(String, IpAddr)> = context
        .map(|c| {
            let listed = c.sightings.unreachable();
            candidates
                .iter()
                .filter(|(name, _)| listed.contains(name) && !sample.iter().any(|(s, _)| s == name))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let (answered, tallies) = futures::join!(
        probe_all(config, &sample, context),
        probe_all(config, &rechecks, context)
    );
    if let Some(c) = context {
        let now = jiff::Timestamp::now();
        let probed = sample
            .iter()
            .zip(answered.0)
            .chain(rechecks.iter().zip(tallies.0));
        for ((name, _), reachable) in probed {
            // Static peers are addresses, not nodes: only nodes are sighted for the coordinator.
            if c.directory.contains(name) {
                c.sightings.record(name, reachable, now);
            }
        }
        c.sightings.keep_only(|node| c.directory.contains(node));
    }
    evaluate(&answered.1, sample.len())
}

/// Probes each of `peers` over every configured protocol: whether each answered at all, and
/// the tallies per protocol.
async fn probe_all(
    config: &PeersConfig,
    peers: &[(String, IpAddr)],
    context: Option<&PeerContext>,
) -> (Vec<bool>, BTreeMap<Protocol, Tally>) {
    let probes = peers.iter().enumerate().flat_map(|(peer, (_, address))| {
        config.protocols.iter().map(move |&protocol| async move {
            let result = probe(protocol, *address, config.port, config.probe_timeout).await;
            (peer, protocol, result)
        })
    });
    let mut tallies: BTreeMap<Protocol, Tally> = config
        .protocols
        .iter()
        .map(|p| (*p, Tally::default()))
        .collect();
    let mut answered = vec![false; peers.len()];
    for (peer, protocol, result) in join_all(probes).await {
        answered[peer] |= result.is_ok();
        let tally = tallies.entry(protocol).or_default();
        if result.is_ok() {
            tally.ok += 1;
        } else {
            tally.failed += 1;
        }
        if let Some(c) = context {
            let labels = ProbeLabels {
                protocol: protocol.name().to_owned(),
                result: if result.is_ok() { "ok" } else { "failed" }.to_owned(),
            };
            c.metrics.probes.get_or_create(&labels).inc();
        }
    }
    (answered, tallies)
}

/// Decides from one round's tallies over `peers` sampled peers.
pub fn evaluate(tallies: &BTreeMap<Protocol, Tally>, peers: usize) -> Finding {
    let summary = tallies
        .iter()
        .map(|(p, t)| format!("{} {}/{}", p.name(), t.ok, t.ok + t.failed))
        .collect::<Vec<_>>()
        .join(", ");
    if peers == 0 {
        return Finding::ok(
            DETECTOR,
            PEER_CONNECTIVITY_PROBLEM,
            "NoPeers",
            "no other agents to probe".into(),
        );
    }
    if tallies.values().all(|t| t.ok == 0) {
        return Finding::problem(
            DETECTOR,
            PEER_CONNECTIVITY_PROBLEM,
            "Isolated",
            format!("no probe to any of {peers} sampled peers was answered ({summary})"),
        );
    }
    let works = |t: &Tally| t.ok > t.failed;
    let mostly_failing = |t: &Tally| t.failed * 2 > t.ok + t.failed;
    let blocked: Vec<Protocol> = tallies
        .iter()
        .filter(|(p, t)| {
            mostly_failing(t) && tallies.iter().any(|(other, o)| other != *p && works(o))
        })
        .map(|(p, _)| *p)
        .collect();
    match blocked.first() {
        // Without the round's counts: a message that changes with every sample would be a
        // write each time.
        None => Finding::ok(
            DETECTOR,
            PEER_CONNECTIVITY_PROBLEM,
            "PeersReachable",
            format!(
                "sampled peers answer over {}",
                tallies
                    .keys()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Some(first) => {
            let names: Vec<String> = blocked.iter().map(|p| p.name().to_uppercase()).collect();
            Finding::new(
                DETECTOR,
                PEER_CONNECTIVITY_PROBLEM,
                Status::Problem,
                &format!("{}Blocked", first.name().to_uppercase()),
                format!(
                    "{} to most sampled peers fails while other protocols work ({summary}): a firewall or security group rule is missing",
                    names.join(" and ")
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tallies(
        tcp: (usize, usize),
        udp: (usize, usize),
        icmp: (usize, usize),
    ) -> BTreeMap<Protocol, Tally> {
        [
            (Protocol::Tcp, tcp),
            (Protocol::Udp, udp),
            (Protocol::Icmp, icmp),
        ]
        .into_iter()
        .map(|(p, (ok, failed))| (p, Tally { ok, failed }))
        .collect()
    }

    #[test]
    fn one_protocol_failing_while_others_work_is_blocked() {
        let found = evaluate(&tallies((5, 0), (0, 5), (5, 0)), 5);
        found.assert_is(Status::Problem, "UDPBlocked");
        assert!(
            found.message.starts_with("UDP to most sampled peers fails"),
            "{}",
            found.message
        );
        found.assert_says("tcp 5/5, udp 0/5, icmp 5/5");
        assert_eq!(
            evaluate(&tallies((1, 4), (5, 0), (5, 0)), 5).reason,
            "TCPBlocked"
        );
        assert_eq!(
            evaluate(&tallies((5, 0), (5, 0), (0, 5)), 5).reason,
            "ICMPBlocked"
        );
    }

    #[test]
    fn nothing_answering_is_isolated() {
        let found = evaluate(&tallies((0, 3), (0, 3), (0, 3)), 3);
        found.assert_is(Status::Problem, "Isolated");
    }

    #[test]
    fn one_unreachable_peer_among_several_is_not_a_problem_here() {
        // One of three peers is cut off: each protocol still works to most.
        let found = evaluate(&tallies((2, 1), (2, 1), (2, 1)), 3);
        assert_eq!(found.status, Status::Ok);
    }

    #[test]
    fn no_peers_is_fine() {
        assert_eq!(
            evaluate(&tallies((0, 0), (0, 0), (0, 0)), 0).reason,
            "NoPeers"
        );
    }
}
