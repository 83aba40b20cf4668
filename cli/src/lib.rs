//! kubectl-nodeward: the verbs an operator runs against nodeward (`kubectl nodeward status`,
//! `reboot`, `drain`, `cancel`/`uncordon`, `pause`/`resume`, `why`). It creates and reads the
//! same objects as everything else: a reboot or drain is a NodeMaintenance the coordinator
//! admits under the policies' budgets, a cancel deletes it (the node's agent undoes its taint
//! and cordon), a pause is the policy's `spec.paused`. What to write and what to say are pure
//! functions ([`request`], [`why`]); the API calls are in [`cluster`].

pub mod cluster;
pub mod request;
pub mod why;

/// Everything a verb can fail on, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] nodeward_runtime::ApiError),
    #[error(transparent)]
    Coordinator(#[from] nodeward_coordinator::Error),
    #[error("connecting to the API server: {0}")]
    Connect(String),
    /// What the verb could not do for some of its arguments, one line each (the others were
    /// done).
    #[error("{}", .0.join("\n"))]
    Refused(Vec<String>),
}
