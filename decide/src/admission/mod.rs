//! Admission: which pending maintenances may start now. Pure decisions over plain data (the
//! budgets, the maintenance windows, one maintenance against the cluster by the rules of
//! [`rules::RULES`]); the rounds in
//! [`crate::round`] feed them what the controller's watches hold.

pub mod budget;
pub mod cluster;
pub mod decide;
pub mod rules;
pub mod window;
pub mod workload;
