//! A detector's verdict, shaped like a node condition.

use std::borrow::Cow;

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
    /// The check needs something this run does not have (a cluster, for `check`); it sets
    /// no condition.
    Skipped,
}

impl Status {
    /// What a node condition's status says (`True` means a problem).
    pub fn of_condition(status: &str) -> Self {
        match status {
            "True" => Self::Problem,
            "False" => Self::Ok,
            _ => Self::Unknown,
        }
    }

    /// Its value of the `status` label of `nodeward_check_status`.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Problem => "problem",
            Self::Unknown => "unknown",
            Self::Skipped => "skipped",
        }
    }

    /// The node condition status this maps to (`True` means a problem).
    pub fn condition_status(self) -> &'static str {
        match self {
            Self::Ok => "False",
            Self::Problem => "True",
            Self::Unknown | Self::Skipped => "Unknown",
        }
    }
}

/// One detector's verdict, shaped like a node condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which detector produced it.
    pub detector: Cow<'static, str>,
    /// The node condition type it feeds, e.g. `NetworkProblem`.
    pub condition: Cow<'static, str>,
    pub status: Status,
    /// CamelCase reason, e.g. `NoDefaultRoute`.
    pub reason: String,
    /// What an operator needs to know, in one line.
    pub message: String,
}

/// A name known at compile time (built-in detectors) or read from the configuration.
pub type Name = Cow<'static, str>;

/// `Finding::ok(..)`, `problem(..)`, `unknown(..)`: [`Finding::new`] with that status.
macro_rules! with_status {
    ($($name:ident => $status:ident),*) => {$(
        pub fn $name(
            detector: impl Into<Name>,
            condition: impl Into<Name>,
            reason: &str,
            message: String,
        ) -> Self {
            Self::new(detector, condition, Status::$status, reason, message)
        }
    )*};
}

impl Finding {
    with_status!(ok => Ok, problem => Problem, unknown => Unknown);

    pub fn new(
        detector: impl Into<Name>,
        condition: impl Into<Name>,
        status: Status,
        reason: &str,
        message: String,
    ) -> Self {
        Self {
            detector: detector.into(),
            condition: condition.into(),
            status,
            reason: reason.to_owned(),
            message,
        }
    }
}

#[cfg(test)]
impl Finding {
    /// Asserts its status and reason.
    #[track_caller]
    pub fn assert_is(&self, status: Status, reason: &str) {
        assert_eq!(
            (self.status, self.reason.as_str()),
            (status, reason),
            "{self:?}"
        );
    }

    /// Asserts that its message says `part`.
    #[track_caller]
    pub fn assert_says(&self, part: &str) {
        assert!(
            self.message.contains(part),
            "{:?} does not say {part:?}",
            self.message
        );
    }
}
