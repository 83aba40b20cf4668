//! Command-line argument groups both daemons flatten into their own, so that a flag means
//! the same in each.

use std::path::PathBuf;

use crate::telemetry::{self, LogFormat};

/// How to reach the API server.
#[derive(Clone, Debug, clap::Args)]
pub struct ClientArgs {
    /// Kubeconfig (the agent's host mode); without it the in-cluster service account is used.
    #[arg(long, env = "NODEWARD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

impl ClientArgs {
    /// A client identifying itself as `user_agent`.
    pub async fn connect(&self, user_agent: &'static str) -> Result<kube::Client, crate::Error> {
        crate::client::connect(self.kubeconfig.as_deref(), user_agent).await
    }
}

/// How a daemon logs.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl LogArgs {
    /// Starts logging in the chosen format (`RUST_LOG` filters).
    pub fn init(&self) {
        telemetry::init_logging(self.log_format);
    }
}
