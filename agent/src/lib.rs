//! nodeward-agent: runs on every node, detects node problems and reports them, guards
//! shutdowns with systemd-logind inhibitor locks and carries out admitted maintenances.

pub use nodeward_runtime::{backoff, http, server};

pub mod background;
pub mod check;
pub mod config;
pub mod detect;
mod drain;
pub mod fencing;
pub mod flags;
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
pub mod host_stats;
pub mod inventory;
pub mod liveness;
pub mod maintenance;
pub mod metrics;
pub mod notify;
mod npd;
pub mod policies;
pub mod report;
pub mod runner;
pub mod shutdown;
mod values;

use std::path::PathBuf;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use nodeward_runtime::events::Events;

/// The Events an agent publishes: reported by nodeward-agent from its node and related to its
/// Node (the chart's admission policy lets an agent publish only about its own things).
pub fn events(client: Client, node: &str) -> Events {
    Events::new(
        client,
        nodeward_api::labels::AGENT_FIELD_MANAGER,
        node.to_owned(),
    )
    .related_to(node_reference(node))
}

/// A reference to the Node `node`, what its Events are about.
pub fn node_reference(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Node".to_owned()),
        name: Some(node.to_owned()),
        ..Default::default()
    }
}

/// Everything that can go wrong in the agent, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration {}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    #[error(transparent)]
    Kube(#[from] nodeward_runtime::ApiError),
    #[error(
        "NodeMaintenance {maintenance} is {found:?} now, no longer {expected:?}: deciding its next step again"
    )]
    Moved {
        maintenance: String,
        expected: nodeward_api::MaintenancePhase,
        found: nodeward_api::MaintenancePhase,
    },
    #[error("serving peer probes: {0}")]
    PeerProbes(String),
    #[error("the drain's task ended without an outcome: {0}")]
    DrainTask(String),
    #[error(transparent)]
    Runtime(#[from] nodeward_runtime::Error),
}

impl Error {
    /// The write the cluster refused, if that is what went wrong
    /// ([`nodeward_runtime::ApiError::is_refusal`]).
    pub fn refusal(&self) -> Option<&nodeward_runtime::ApiError> {
        match self {
            Self::Kube(e) if e.is_refusal() => Some(e),
            _ => None,
        }
    }
}
