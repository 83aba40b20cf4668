//! The host's plumbing, in one place: the system bus ([`bus`]), systemd ([`systemd`]) and
//! systemd-logind ([`logind`]) over it, commands run on the host as transient systemd units
//! ([`commands`]), and reaping what checks leave behind when the agent is PID 1 of its
//! container ([`reaper`]). What nodeward does with them lives with each feature (detectors,
//! the shutdown guard, reboot methods).

pub mod bus;
pub mod commands;
pub mod logind;
pub mod reaper;
pub mod systemd;
