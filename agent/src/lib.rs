//! nodeward-agent: runs on every node, detects node problems and reports them, guards
//! shutdowns with systemd-logind inhibitor locks and carries out admitted maintenances.

pub mod backoff;
pub mod check;
pub mod config;
pub mod detect;
pub mod http;
pub mod metrics;
pub mod peers;
pub mod report;
pub mod runner;
pub mod server;
pub mod systemd;

use std::path::PathBuf;

/// Everything that can go wrong in the agent, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration {}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("connecting to the API server: {0}")]
    Connect(String),
    #[error("serving health and metrics: {0}")]
    Serve(String),
}

impl Error {
    /// A failed API call: what was being done, to which object.
    pub fn kube(action: &'static str, object: String, source: kube::Error) -> Self {
        Self::Kube {
            action,
            object,
            source,
        }
    }
}
