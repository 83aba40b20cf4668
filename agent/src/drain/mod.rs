//! Draining a node: the plan (which pods, in what order, pure), the node's pods (watched while
//! a drain runs), the evictions (through the Eviction API, waiting for pods to go, stage
//! deadlines and on-timeout actions) and a drain under watch (its progress each second, its
//! deadline).

pub mod evict;
pub mod plan;
pub mod pods;
pub mod watched;
