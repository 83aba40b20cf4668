//! Custom checks in node-problem-detector's plugin protocol: exit 0 ok, 1 problem, anything
//! else (or a signal, or no way to run it) unknown; the first line of output is the message.

use super::{Finding, Status, command};
use crate::config::CustomCheckConfig;

pub async fn observe(check: &CustomCheckConfig) -> Finding {
    evaluate(check, command::run(&check.command).await)
}

pub fn evaluate(check: &CustomCheckConfig, outcome: Result<command::Outcome, String>) -> Finding {
    let (status, reason, message) = match outcome {
        Ok(out) => {
            let message = command::cap(&out.first_line, check.max_output_length);
            match out.code {
                Some(0) => (Status::Ok, format!("No{}", check.reason), message),
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
        check.name.clone().into(),
        check.condition.clone().into(),
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
        assert!(
            found.message.contains("cannot run /nonexistent/check-ntp"),
            "{}",
            found.message
        );
    }
}
