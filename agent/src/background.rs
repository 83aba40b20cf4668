//! What the detectors of a running agent start before their first run, and hand on: the
//! cluster context (this node's Node as a watch holds it), the peer directory followed and the
//! probe responder (`detectors.peers`), and the followed logs (`detectors.kernelLog`,
//! `detectors.journal`); what the reporter publishes from them (sightings, the logs' places,
//! their Events, the events-only checks). `check` starts none of it.

use std::{collections::BTreeSet, sync::Arc, time::Instant};

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector;
use tokio::{sync::mpsc, task::JoinSet};

use crate::{
    Error,
    config::Config,
    detect::{
        AgentContext,
        cluster::ClusterContext,
        kernel_log::LogEvent,
        peers::{self, Directory, PeerContext, Sightings},
    },
    logs,
    metrics::Metrics,
    report::Reporter,
};

/// Where the detectors run.
pub struct On<'a> {
    pub client: &'a kube::Client,
    pub node_name: &'a str,
    /// nodeward's namespace, where the coordinator publishes the peer directory.
    pub namespace: &'a str,
    pub boot_id: Option<&'a str>,
    pub metrics: &'a Arc<Metrics>,
    pub own_node: reflector::Store<Node>,
}

/// What was started: the detectors' context, and what the reporter publishes of it.
pub struct Started {
    pub agent: AgentContext,
    pub for_reports: ForReports,
}

/// What the detectors give the reporter.
pub struct ForReports {
    sightings: Option<Sightings>,
    followed: logs::Followed,
    log_events: mpsc::Receiver<LogEvent>,
    events_only: BTreeSet<String>,
}

impl ForReports {
    /// `reporter`, publishing what the detectors give it, and the followed logs' Events to
    /// run it with.
    pub fn give(self, reporter: Reporter) -> (Reporter, mpsc::Receiver<LogEvent>) {
        let reporter = reporter
            .with_sightings(self.sightings)
            .with_published(self.followed.source, self.followed.published)
            .with_events_only(self.events_only);
        (reporter, self.log_events)
    }
}

/// Starts, in `tasks`, what the enabled detectors need running.
pub async fn start(config: &Config, on: On<'_>, tasks: &mut JoinSet<()>) -> Result<Started, Error> {
    let cluster = ClusterContext {
        client: on.client.clone(),
        node_name: on.node_name.to_owned(),
        started: Instant::now(),
        own_node: on.own_node,
    };
    let p = &config.detectors.peers;
    let peers = if p.enabled {
        let directory = Directory::default();
        let following = directory
            .clone()
            .follow(on.client.clone(), on.namespace.to_owned());
        tasks.spawn(following);
        tasks.spawn(peers::respond(p.listen_address, p.port).await?);
        Some(PeerContext {
            directory,
            node_name: on.node_name.to_owned(),
            metrics: on.metrics.clone(),
            sightings: Sightings::default(),
        })
    } else {
        None
    };
    let (log_events_tx, log_events) = mpsc::channel(64);
    let node = logs::Node {
        name: on.node_name,
        boot_id: on.boot_id,
    };
    let mut followed = logs::start(config, on.client, &node, &log_events_tx).await;
    let agent = AgentContext {
        cluster,
        kernel_log: followed.kernel.take(),
        journal_logs: std::mem::take(&mut followed.journal),
        peers,
    };
    let for_reports = ForReports {
        sightings: agent.peers.as_ref().map(|p| p.sightings.clone()),
        followed,
        log_events,
        events_only: config
            .detectors
            .custom
            .iter()
            .filter(|c| c.events_only)
            .map(|c| c.condition.clone())
            .collect(),
    };
    Ok(Started { agent, for_reports })
}
