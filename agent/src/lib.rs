//! nodeward-agent: runs on every node, detects node problems and reports them, guards
//! shutdowns with systemd-logind inhibitor locks and carries out admitted maintenances.

pub mod check;
pub mod config;
pub mod detect;
pub mod http;

use std::path::PathBuf;

/// Everything that can go wrong in the agent, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration {}: {message}", path.display())]
    Config { path: PathBuf, message: String },
}
