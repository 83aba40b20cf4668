//! What nodeward's daemons (agent and coordinator) share: the API client setup, the
//! `/healthz` `/readyz` `/metrics` server, logging, backoff with jitter, and the stop signal.

pub mod backoff;
pub mod client;
pub mod http;
pub mod server;
pub mod telemetry;
pub mod watch;

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

/// Resolves on SIGTERM or SIGINT.
pub async fn stop_signal() -> Result<&'static str, Error> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(Error::Signal)?;
    Ok(tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    })
}
