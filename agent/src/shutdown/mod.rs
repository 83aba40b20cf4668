//! Guarding shutdowns with systemd-logind: the delay inhibitor lock, the drain before the
//! machine goes down, the `logind.conf.d` drop-in for the delay budget.

pub mod dropin;
pub mod guard;
pub mod logind;
