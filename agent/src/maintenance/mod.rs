//! Carrying out the admitted NodeMaintenances of this node: the lifecycle (pure) and the
//! executor that drives it; the agent's side of the workload gate.

mod back_in_service;
pub mod cloud_request;
pub mod executor;
mod health_gate;
pub mod host_runner;
pub mod host_steps;
pub mod lifecycle;
pub mod reboot_method;
pub mod reboot_request;
mod request;
pub mod rollback;
mod rollback_runner;
pub mod update;
pub mod watch;
pub mod workloads;
