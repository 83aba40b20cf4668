//! nodeward-coordinator: decides which nodes may be disrupted now, under cluster-wide limits
//! (leader election, admission, cluster health, pause). So far the pure decisions: admission
//! (budget math, windows, the five rules), node health and the `maxUnhealthy` gate, pause
//! acknowledgement. The controller and the binary arrive with the rest of the coordinator
//! issue.

pub mod admission;
pub mod health;
pub mod pause;
