//! What the detectors of a running agent start before their first run: each section's
//! [`Section::start`](crate::detect::Section::start) (the peer directory and probe responder,
//! the followed logs), handed on to the detectors through the [`AgentContext`] and to the
//! reporter as what it publishes of them. This module names no detector; `check` starts none
//! of it.

use std::{sync::Arc, time::Instant};

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector;
use tokio::{
    sync::{OnceCell, mpsc},
    task::JoinSet,
};

use crate::{
    Error,
    config::Config,
    detect::{
        AgentContext, ForReports, LOG_EVENTS_WAITING, On, cluster::ClusterContext,
        kernel_log::LogEvent,
    },
    metrics::Metrics,
};

/// This agent, for the sections' start.
pub struct Agent<'a> {
    pub client: &'a kube::Client,
    pub node_name: &'a str,
    pub namespace: &'a str,
    pub boot_id: Option<&'a str>,
    pub metrics: &'a Arc<Metrics>,
    pub own_node: reflector::Store<Node>,
}

/// What was started: the detectors' context, what the reporter publishes of it, and the
/// followed logs' Events it publishes.
pub struct Started {
    pub agent: AgentContext,
    pub for_reports: ForReports,
    pub log_events: mpsc::Receiver<LogEvent>,
}

/// Starts, in `tasks`, what the enabled detectors need running.
pub async fn start(
    config: &Config,
    agent: Agent<'_>,
    tasks: &mut JoinSet<()>,
) -> Result<Started, Error> {
    let (log_events_tx, log_events) = mpsc::channel(LOG_EVENTS_WAITING);
    let on = On {
        client: agent.client,
        node_name: agent.node_name,
        namespace: agent.namespace,
        boot_id: agent.boot_id,
        metrics: agent.metrics,
        log_events: log_events_tx,
        last_report: OnceCell::new(),
    };
    let mut context = AgentContext::new(ClusterContext {
        client: agent.client.clone(),
        node_name: agent.node_name.to_owned(),
        started: Instant::now(),
        own_node: agent.own_node,
    });
    let mut for_reports = ForReports::default();
    for started in config.detectors.start(&on, tasks).await? {
        if let Some(c) = started.context {
            context = context.with_started(c);
        }
        for_reports.add(started.for_reports);
    }
    Ok(Started {
        agent: context,
        for_reports,
        log_events,
    })
}
