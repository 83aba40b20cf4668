//! kubectl-nodeward: the one tool an operator runs against nodeward (`kubectl nodeward status`,
//! `reboot`, `drain`, `cancel`/`uncordon`, `pause`/`resume`, `why`, `migrate`). It creates and
//! reads the same objects as everything else: a reboot or drain is a NodeMaintenance the
//! coordinator admits under the policies' budgets, a cancel deletes it (the node's agent undoes
//! its taint and cordon), a pause is the policy's `spec.paused`. What to write and what to say
//! are pure functions ([`request`], [`status`], [`why`], and [`migrate`]'s readers of kured's
//! and node-problem-detector's configuration), deciding with the coordinator's own
//! [`nodeward_decide`]; the API calls are in [`cluster`].

pub mod cluster;
pub mod migrate;
pub mod request;
pub mod status;
pub mod why;

/// Everything a verb can fail on, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] nodeward_runtime::ApiError),
    /// What `migrate` could not read or carry over.
    #[error("{0}")]
    Migrate(String),
    #[error("connecting to the API server: {0}")]
    Connect(String),
    /// What the verb could not do for some of its arguments, one line each (the others were
    /// done).
    #[error("{}", .0.join("\n"))]
    Refused(Vec<String>),
}
