//! What the detectors of a running agent start before their first run: each section's
//! [`Section::start`](crate::detect::Section::start) (the peer directory and probe responder,
//! the followed logs), handed on to the detectors through the [`AgentContext`] and to the
//! reporter as what it publishes of them. This module names no detector; `check` starts none
//! of it.

use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector;
use tokio::task::JoinSet;

use crate::{
    Error,
    config::Config,
    detect::{AgentContext, ForReports, On, cluster::ClusterContext},
};

/// What was started: the detectors' context, and what the reporter publishes of it.
pub struct Started {
    pub agent: AgentContext,
    pub for_reports: ForReports,
}

/// Starts, in `tasks`, what the enabled detectors need running, `on` this agent; the
/// detectors' context holds `own_node`, this node's Node as the agent's watch holds it.
pub async fn start(
    config: &Config,
    on: On<'_>,
    own_node: reflector::Store<Node>,
    tasks: &mut JoinSet<()>,
) -> Result<Started, Error> {
    let mut context = AgentContext::new(ClusterContext {
        client: on.client.clone(),
        node_name: on.node_name.to_owned(),
        started: Instant::now(),
        own_node,
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
    })
}
