//! nodeward-decide: every decision the coordinator (and `kubectl nodeward`) makes, as pure
//! functions over plain data. Nothing here does I/O: the crate depends on no Kubernetes client,
//! async runtime or socket, so the compiler keeps it that way.
//!
//! - [`admission`]: whether a pending maintenance may go now, rule by rule
//!   ([`admission::rules::RULES`]), with the budget arithmetic and maintenance windows;
//! - [`round`]: one round of the coordinator as named stages, from the watched objects to a
//!   [`round::Plan`];
//! - [`dead`], [`deadlines`], [`health`], [`pause`], [`failures`], [`canary`]: a dead node,
//!   each phase's deadline, node health and the `maxUnhealthy` gate, when a pause has taken
//!   hold, when a rollout has failed often enough to halt, when its canaries let the rest go;
//! - [`progress`]: how far a policy's nodes are patched;
//! - [`blockers`]: what to look up before a round and what its answers block.

pub mod admission;
pub mod blockers;
pub mod canary;
pub mod dead;
pub mod deadlines;
pub mod failures;
pub mod gates;
pub mod health;
pub mod pause;
pub mod progress;
pub mod round;
#[cfg(test)]
mod testing;
