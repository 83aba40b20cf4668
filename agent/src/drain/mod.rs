//! Draining a node: the plan (which pods, in what order, pure) and the executor (evictions
//! through the Eviction API, waiting for pods to go, stage deadlines and on-timeout actions).

pub mod evict;
pub mod plan;
