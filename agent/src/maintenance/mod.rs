//! Carrying out the admitted NodeMaintenances of this node: the lifecycle (pure) and the
//! executor that drives it.

pub mod executor;
pub mod lifecycle;
pub mod reboot_request;
pub mod watch;
