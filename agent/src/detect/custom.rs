//! Custom checks in node-problem-detector's plugin protocol: exit 0 ok, 1 problem, anything
//! else (or a signal, or no way to run it) unknown; the first line of output is the message.

use std::time::Duration;

use serde::Deserialize;

use super::{
    AgentContext, Background, Detector, Finding, ForReports, On, Schedule, Section, Starting,
    Status, command,
};
use crate::values;

/// A check in node-problem-detector's plugin protocol: exit 0 ok, 1 problem, anything else
/// unknown; the first line of output is the message.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CustomCheckConfig {
    /// Unique name of the check (the detector name in reports).
    pub name: String,
    /// The node condition type it sets, CamelCase, e.g. `NTPProblem`.
    pub condition: String,
    /// The condition reason when the check finds a problem, CamelCase.
    pub reason: String,
    /// Program and arguments.
    pub command: Vec<String>,
    #[serde(
        default = "custom_interval",
        deserialize_with = "crate::values::duration"
    )]
    pub interval: Duration,
    #[serde(
        default = "custom_timeout",
        deserialize_with = "crate::values::duration"
    )]
    pub timeout: Duration,
    #[serde(default, rename = "for", deserialize_with = "crate::values::duration")]
    pub hold: Duration,
    /// Longest message kept from the output (node-problem-detector's default is 80).
    #[serde(default = "custom_max_output")]
    pub max_output_length: usize,
    /// Run it on the host (a transient systemd service over the system bus), with the host's
    /// tools and view, rather than in the agent's container.
    #[serde(default)]
    pub on_host: bool,
    /// Only Events, no Node condition (node-problem-detector's `temporary` rules): a problem
    /// is a Warning Event with `reason` when it starts; `condition` then names the finding in
    /// the NodeReport only.
    #[serde(default)]
    pub events_only: bool,
    /// The reason while all is well (default `No<reason>`), e.g. node-problem-detector's
    /// default condition reason `NTPIsUp`.
    #[serde(default)]
    pub ok_reason: Option<String>,
    /// The message while all is well (default: the check's output).
    #[serde(default)]
    pub ok_message: Option<String>,
    /// Shared with the other checks of one node-problem-detector plugin monitor: at most its
    /// `concurrency` run at once.
    #[serde(skip)]
    pub concurrency: Option<Concurrency>,
}

/// A limit on checks running at once, shared by the checks that hold a clone of it.
#[derive(Clone, Debug)]
pub struct Concurrency(pub std::sync::Arc<tokio::sync::Semaphore>);

impl Concurrency {
    pub fn new(at_once: usize) -> Self {
        Self(std::sync::Arc::new(tokio::sync::Semaphore::new(
            at_once.max(1),
        )))
    }
}

impl PartialEq for Concurrency {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

fn custom_interval() -> Duration {
    Duration::from_secs(60)
}

fn custom_timeout() -> Duration {
    Duration::from_secs(30)
}

fn custom_max_output() -> usize {
    80
}

impl Default for CustomCheckConfig {
    /// No name, condition, reason or command (a check must name them), the defaults else.
    fn default() -> Self {
        Self {
            name: String::new(),
            condition: String::new(),
            reason: String::new(),
            command: Vec::new(),
            interval: custom_interval(),
            timeout: custom_timeout(),
            hold: Duration::ZERO,
            max_output_length: custom_max_output(),
            on_host: false,
            events_only: false,
            ok_reason: None,
            ok_message: None,
            concurrency: None,
        }
    }
}

impl CustomCheckConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule {
            interval: self.interval,
            timeout: self.timeout,
            hold: self.hold,
        }
    }
}

/// The `custom` list: each check is one detector.
/// The most custom checks an agent runs: with the built-in detectors, they stay within a
/// NodeReport's bounded list of findings.
pub const MAX_CHECKS: usize = 64;

impl Section for Vec<CustomCheckConfig> {
    /// Checks every custom check; `place` is the list's.
    fn validate(&self, place: &str) -> Result<(), String> {
        if self.len() > MAX_CHECKS {
            return Err(format!(
                "{place}: at most {MAX_CHECKS} custom checks (each is a finding in the NodeReport, whose list is bounded), not {}",
                self.len()
            ));
        }
        let on_node: std::collections::BTreeSet<&str> = self
            .iter()
            .filter(|c| !c.events_only)
            .map(|c| c.condition.as_str())
            .collect();
        let mut names = std::collections::BTreeSet::new();
        for (index, check) in self.iter().enumerate() {
            let place = format!("{place}[{index}]");
            check.schedule().validate(&place)?;
            if check.name.is_empty() || check.name.len() > 48 || !names.insert(check.name.as_str())
            {
                return Err(format!(
                    "{place}.name: {:?} must be 1 to 48 characters and unique among the custom checks",
                    check.name
                ));
            }
            for (field, value) in [("condition", &check.condition), ("reason", &check.reason)] {
                values::camel_case(&format!("{place}.{field}"), value, "NTPProblem")?;
            }
            if check.events_only && on_node.contains(check.condition.as_str()) {
                return Err(format!(
                    "{place}.condition: {:?} is a Node condition of another check; an events-only check needs a name of its own",
                    check.condition
                ));
            }
            if let Some(reason) = &check.ok_reason {
                values::camel_case(&format!("{place}.okReason"), reason, "NTPIsUp")?;
            }
            values::not_owned_by_others(&format!("{place}.condition"), &check.condition)?;
            if check.command.first().is_none_or(String::is_empty) {
                return Err(format!(
                    "{place}.command: give the program and its arguments, e.g. [\"/usr/local/bin/check-ntp\"]"
                ));
            }
            if check.max_output_length == 0 {
                return Err(format!("{place}.maxOutputLength: must be at least 1"));
            }
            if check.on_host && !check.command[0].starts_with('/') {
                return Err(format!(
                    "{place}.command[0]: a command run on the host (onHost) needs an absolute path, e.g. /usr/bin/systemctl"
                ));
            }
        }
        Ok(())
    }

    fn detectors(&self, _: Option<&AgentContext>) -> Vec<Detector> {
        self.iter()
            .map(|check| {
                let (name, condition) = (check.name.clone(), check.condition.clone());
                Detector::new(
                    name,
                    condition,
                    check.schedule(),
                    check.clone(),
                    |c| async move { observe(&c).await },
                )
            })
            .collect()
    }

    /// Starts nothing; the NodeReport is told which checks are events-only.
    fn start<'a>(&'a self, _: &'a On<'a>, _: &'a mut tokio::task::JoinSet<()>) -> Starting<'a> {
        let events_only = self
            .iter()
            .filter(|c| c.events_only)
            .map(|c| c.condition.clone())
            .collect();
        Box::pin(std::future::ready(Ok(Background {
            context: None,
            for_reports: ForReports {
                events_only,
                ..ForReports::default()
            },
        })))
    }
}

pub async fn observe(check: &CustomCheckConfig) -> Finding {
    // Waiting for a turn counts against the run's timeout, as in node-problem-detector.
    let _turn = match &check.concurrency {
        Some(limit) => limit.0.acquire().await.ok(),
        None => None,
    };
    evaluate(
        check,
        command::run_where(&check.command, check.on_host, check.timeout).await,
    )
}

pub fn evaluate(check: &CustomCheckConfig, outcome: Result<command::Outcome, String>) -> Finding {
    let (status, reason, message) = match outcome {
        Ok(out) => {
            let message = nodeward_api::bounds::cut(&out.first_line, check.max_output_length);
            match out.code {
                Some(0) => (
                    Status::Ok,
                    check
                        .ok_reason
                        .clone()
                        .unwrap_or_else(|| format!("No{}", check.reason)),
                    check.ok_message.clone().unwrap_or(message),
                ),
                Some(1) => (Status::Problem, check.reason.clone(), message),
                Some(code) => (
                    Status::Unknown,
                    "CheckFailed".to_owned(),
                    format!("exit status {code}: {message}"),
                ),
                None => (
                    Status::Unknown,
                    "CheckFailed".to_owned(),
                    format!("killed by a signal: {message}"),
                ),
            }
        }
        Err(e) => (Status::Unknown, "CheckFailed".to_owned(), e),
    };
    Finding::new(
        check.name.clone(),
        check.condition.clone(),
        status,
        &reason,
        message,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(script: &str) -> CustomCheckConfig {
        CustomCheckConfig {
            name: "ntp".into(),
            condition: "NTPProblem".into(),
            reason: "ClockNotSynchronized".into(),
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            interval: std::time::Duration::from_secs(60),
            timeout: std::time::Duration::from_secs(10),
            hold: std::time::Duration::ZERO,
            max_output_length: 12,
            on_host: false,
            events_only: false,
            ok_reason: None,
            ok_message: None,
            concurrency: None,
        }
    }

    #[tokio::test]
    async fn exit_codes_map_to_ok_problem_unknown() {
        let ok = observe(&check("echo synced; exit 0")).await;
        assert_eq!(
            (ok.status, ok.reason.as_str(), ok.message.as_str()),
            (Status::Ok, "NoClockNotSynchronized", "synced")
        );
        let problem = observe(&check("echo offset 2.5s too large; exit 1")).await;
        assert_eq!(problem.status, Status::Problem);
        assert_eq!(problem.reason, "ClockNotSynchronized");
        assert_eq!(problem.message, "offset 2.5s…", "capped at maxOutputLength");
        assert_eq!(
            (problem.detector.as_ref(), problem.condition.as_ref()),
            ("ntp", "NTPProblem")
        );
        let unknown = observe(&check("echo confused; exit 2")).await;
        assert_eq!(
            (unknown.status, unknown.message.as_str()),
            (Status::Unknown, "exit status 2: confused")
        );
    }

    #[tokio::test]
    async fn an_unrunnable_check_is_unknown_with_the_reason() {
        let mut c = check("");
        c.command = vec!["/nonexistent/check-ntp".into()];
        let found = observe(&c).await;
        assert_eq!(found.status, Status::Unknown);
        found.assert_says("cannot run /nonexistent/check-ntp");
    }
}
