//! What nodeward's daemons (agent and coordinator) share: the API client setup, the
//! `/healthz` `/readyz` `/metrics` server and the limits of every listener, logging, backoff with jitter, and the stop signal.

pub mod args;
pub mod backoff;
pub mod client;
pub mod cordon;
pub mod events;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod server;
pub mod stop;
pub mod telemetry;
pub mod watch;
pub mod write;

/// What `--version` prints: the version, the git revision and the target the binary was built
/// for, e.g. `0.1.0 (revision 1a2b3c4d5e6f, x86_64-unknown-linux-musl)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("NODEWARD_REVISION"),
    ", ",
    env!("NODEWARD_TARGET"),
    ")"
);

/// Failures of the shared plumbing, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to the API server: {0}")]
    Connect(String),
    #[error("serving health and metrics: {0}")]
    Serve(String),
    #[error("installing the signal handler: {0}")]
    Signal(std::io::Error),
}

/// A failed API call: what was being done, to which object, and the API server's answer in
/// one line (its message, code and reason, not the whole status object).
#[derive(Debug, thiserror::Error)]
#[error("{} {}: {}", .action, .object, brief(.source))]
pub struct ApiError {
    pub action: &'static str,
    pub object: String,
    #[source]
    pub source: kube::Error,
}

impl ApiError {
    pub fn new(action: &'static str, object: String, source: kube::Error) -> Self {
        Self {
            action,
            object,
            source,
        }
    }

    /// The API server's status code (404, 409, ...), when it answered.
    pub fn code(&self) -> Option<u16> {
        match &self.source {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }

    /// Whether the cluster refused the write (RBAC, an admission policy or webhook,
    /// validation): retrying does not make it go through, so the daemons show it to whoever
    /// looks at the object, not only in their logs.
    pub fn is_refusal(&self) -> bool {
        matches!(self.code(), Some(400 | 403 | 422))
    }
}

/// The reason of the Warning Event a daemon publishes about an object when the cluster
/// refuses its write to it.
pub const WRITE_REFUSED: &str = "WriteRefused";
/// The reason of the coordinator's Warning Event on a Node when the cluster refuses its change
/// of the Node (its labels, marks, taints).
pub const NODE_WRITE_REFUSED: &str = "NodeWriteRefused";

/// A client error in one line: an API server's answer as its message with code and reason.
pub fn brief(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn stop_signal() -> Result<&'static str, Error> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(Error::Signal)?;
    Ok(tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    })
}
