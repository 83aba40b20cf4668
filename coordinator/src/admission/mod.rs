//! Admission: which pending maintenances may start now. Pure decisions over plain data (the
//! budgets, the maintenance windows, one maintenance against the cluster); the rounds in
//! [`crate::round`] feed them what the controller's watches hold.

pub mod budget;
pub mod decide;
pub mod window;
pub mod workload;
