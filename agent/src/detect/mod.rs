//! Detectors: each reads one aspect of the node (I/O at the edge) and decides, in a pure
//! function over plain data, whether it is a problem.

pub mod debounce;
pub mod interfaces;
pub mod routes;

use serde::Serialize;

/// What one check concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Status {
    /// The check passed (the node condition is `False`).
    Ok,
    /// The problem is present (the node condition is `True`).
    Problem,
    /// The check could not tell (the node condition is `Unknown`).
    Unknown,
}

impl Status {
    /// The node condition status this maps to (`True` means a problem).
    pub fn condition_status(self) -> &'static str {
        match self {
            Self::Ok => "False",
            Self::Problem => "True",
            Self::Unknown => "Unknown",
        }
    }
}

/// One detector's verdict, shaped like a node condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which detector produced it.
    pub detector: &'static str,
    /// The node condition type it feeds, e.g. `NetworkProblem`.
    pub condition: &'static str,
    pub status: Status,
    /// CamelCase reason, e.g. `NoDefaultRoute`.
    pub reason: String,
    /// What an operator needs to know, in one line.
    pub message: String,
}

impl Finding {
    pub fn ok(
        detector: &'static str,
        condition: &'static str,
        reason: &str,
        message: String,
    ) -> Self {
        Self::new(detector, condition, Status::Ok, reason, message)
    }

    pub fn problem(
        detector: &'static str,
        condition: &'static str,
        reason: &str,
        message: String,
    ) -> Self {
        Self::new(detector, condition, Status::Problem, reason, message)
    }

    pub fn unknown(
        detector: &'static str,
        condition: &'static str,
        reason: &str,
        message: String,
    ) -> Self {
        Self::new(detector, condition, Status::Unknown, reason, message)
    }

    fn new(
        detector: &'static str,
        condition: &'static str,
        status: Status,
        reason: &str,
        message: String,
    ) -> Self {
        Self {
            detector,
            condition,
            status,
            reason: reason.to_owned(),
            message,
        }
    }
}
