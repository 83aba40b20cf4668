//! nodeward-coordinator: decides which nodes may be disrupted now, under cluster-wide limits.
//! The decisions are pure functions in [`nodeward_decide`]; this crate is the daemon around
//! them: leader election on a Lease ([`election`]), the lookups a round needs before it decides
//! ([`blockers`], [`gates`], [`workloads`]), the control loop that watches the cluster and writes the
//! decisions ([`controller`]), what the leader publishes for the agents ([`publish`]) and the
//! eviction webhook ([`webhook`]).

pub mod blockers;
pub mod controller;
pub mod election;
#[doc(hidden)]
pub mod fuzzing;
pub mod gates;
pub mod metrics;
pub mod policy_bootstrap;
pub mod publish;
pub mod webhook;
pub mod workload_watch;
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
