//! nodeward-coordinator: decides which nodes may be disrupted now, under cluster-wide limits.
//! Leader election on a Lease ([`election`]); the decisions as pure functions ([`admission`],
//! [`dead`], [`deadlines`], [`health`], [`pause`], one round of them in [`round`]); the
//! control loop that watches the cluster and writes the decisions ([`controller`]); the
//! `status` report ([`cli_status`]).

pub mod admission;
pub mod blockers;
pub mod cli_status;
pub mod controller;
pub mod dead;
pub mod deadlines;
pub mod election;
#[doc(hidden)]
pub mod fuzzing;
pub mod health;
pub mod metrics;
pub mod migrate;
pub mod pause;
pub mod policy_bootstrap;
pub mod publish;
pub mod round;
pub mod webhook;
pub mod workloads;

/// Everything that can go wrong in the coordinator, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] nodeward_runtime::ApiError),
    #[error("the eviction webhook: {0}")]
    Webhook(String),
    #[error(transparent)]
    Runtime(#[from] nodeward_runtime::Error),
}
