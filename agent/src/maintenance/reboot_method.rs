//! How the drained node is rebooted (kured's `--reboot-method`): by asking logind (the
//! default: shutdown inhibitors are honoured), by a command, or by a signal to the host's
//! PID 1. The command and the signal run on the host as transient systemd services
//! ([`crate::host::commands`]), so the agent needs neither the host's PID namespace nor its binaries.

use std::time::Duration;

use serde::Deserialize;

use crate::flags::{self, Flag};

/// `SIGRTMIN+5`: systemd starts `reboot.target` on it (kured's default `--reboot-signal`).
pub const SYSTEMD_REBOOT_SIGNAL: i32 = 39;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RebootMethod {
    /// logind's Reboot: delay inhibitors (the shutdown guard's among them) are honoured.
    #[default]
    Logind,
    /// `command`, run on the host.
    Command,
    /// `signal` sent to the host's PID 1 (systemd reboots on SIGRTMIN+5).
    Signal,
}

/// The `reboot` section: how a Reboot maintenance reboots the node once it is drained.
/// The flags of the `reboot` section (kured's names).
pub fn flags() -> Vec<Flag> {
    flags::declare! {
        "reboot-method" ("NODEWARD_REBOOT_METHOD") => "method": Text, "How a drained node reboots: logind, command or signal";
        "reboot-command" ("NODEWARD_REBOOT_COMMAND") => "command": Words, "The host command of --reboot-method command, words split on spaces";
        "reboot-signal" ("NODEWARD_REBOOT_SIGNAL") => "signal": Scalar, "The signal sent to the host's PID 1 by --reboot-method signal";
        "reboot-request-retries" ("NODEWARD_REBOOT_REQUEST_RETRIES") => "requestRetries": Scalar, "How often a failed automatic reboot request is asked again in the same boot (0-9)";
        "reboot-request-retry-after" ("NODEWARD_REBOOT_REQUEST_RETRY_AFTER") => "requestRetryAfter": Text, "How long after a failed automatic reboot request it is asked again (doubling), e.g. 1h";
    }
}

/// A PowerOff maintenance always asks logind.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RebootConfig {
    pub method: RebootMethod,
    /// Program and arguments for `method: command` (kured's `--reboot-command`).
    pub command: Vec<String>,
    /// Signal number for `method: signal` (kured's `--reboot-signal`).
    pub signal: i32,
    /// How long the command (or `kill`) may take before the reboot counts as failed.
    #[serde(deserialize_with = "crate::values::duration")]
    pub timeout: Duration,
    /// How often a reboot the agent asked for on its own (auto-reboot) that ended Failed is
    /// asked for again in the same boot, while the node still requires one (0-9; kured asks
    /// every `--period`).
    pub request_retries: u32,
    /// How long after such a failure the agent asks again; doubled after each further
    /// failure (with up to a tenth more as jitter).
    #[serde(deserialize_with = "crate::values::duration")]
    pub request_retry_after: Duration,
}

impl Default for RebootConfig {
    fn default() -> Self {
        Self {
            method: RebootMethod::Logind,
            command: vec!["/bin/systemctl".into(), "reboot".into()],
            signal: SYSTEMD_REBOOT_SIGNAL,
            timeout: Duration::from_secs(60),
            request_retries: 3,
            request_retry_after: Duration::from_secs(3600),
        }
    }
}

/// The most retries of a failed reboot request (a request's name has room for one digit).
pub const REQUEST_RETRIES_LIMIT: u32 = 9;

impl RebootConfig {
    pub fn validate(&self, place: &str) -> Result<(), String> {
        match self.command.first() {
            None => {
                return Err(format!(
                    "{place}.command: give the program and its arguments, e.g. [/bin/systemctl, reboot]"
                ));
            }
            Some(program) if !program.starts_with('/') => {
                return Err(format!(
                    "{place}.command: {program:?} must be an absolute path on the host, e.g. /bin/systemctl"
                ));
            }
            Some(_) => {}
        }
        if !(1..=64).contains(&self.signal) {
            return Err(format!(
                "{place}.signal: {} is not a signal number (1-64); systemd reboots on {SYSTEMD_REBOOT_SIGNAL} (SIGRTMIN+5)",
                self.signal
            ));
        }
        if self.timeout.is_zero() {
            return Err(format!("{place}.timeout: must be more than 0s, e.g. 60s"));
        }
        if self.request_retries > REQUEST_RETRIES_LIMIT {
            return Err(format!(
                "{place}.requestRetries: {} is more than {REQUEST_RETRIES_LIMIT}, e.g. 3",
                self.request_retries
            ));
        }
        if self.request_retry_after < Duration::from_secs(1)
            || self.request_retry_after > Duration::from_secs(7 * 24 * 3600)
        {
            return Err(format!(
                "{place}.requestRetryAfter: must be from 1s to 7d, e.g. 1h"
            ));
        }
        Ok(())
    }

    /// What runs on the host for this method; none for logind.
    pub fn host_command(&self) -> Option<Vec<String>> {
        match self.method {
            RebootMethod::Logind => None,
            RebootMethod::Command => Some(self.command.clone()),
            RebootMethod::Signal => Some(vec![
                "/bin/kill".into(),
                "-s".into(),
                self.signal.to_string(),
                "1".into(),
            ]),
        }
    }

    /// How the reboot is asked for, for Events and logs.
    pub fn describe(&self) -> String {
        match self.method {
            RebootMethod::Logind => "through logind".to_owned(),
            RebootMethod::Command => format!("by running {:?} on the host", self.command.join(" ")),
            RebootMethod::Signal => format!("by signal {} to the host's PID 1", self.signal),
        }
    }

    /// Runs the host command of a command or signal reboot: `Ok` once it exited 0. The
    /// machine may go down before it returns.
    pub async fn run_on_host(&self, argv: &[String]) -> Result<(), String> {
        let ran = crate::host::commands::run(argv, self.timeout).await?;
        match ran.code {
            Some(0) => Ok(()),
            code => {
                let output = String::from_utf8_lossy(&ran.output);
                let first = output.lines().next().unwrap_or_default();
                Err(format!(
                    "{:?} on the host ended with {}: {first}",
                    argv.join(" "),
                    code.map_or("a signal (its timeout?)".to_owned(), |c| format!(
                        "exit code {c}"
                    ))
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_runs_what_kured_ran() {
        let mut config = RebootConfig::default();
        assert_eq!(config.host_command(), None, "logind by default");
        config.method = RebootMethod::Command;
        assert_eq!(
            config.host_command(),
            Some(vec!["/bin/systemctl".to_owned(), "reboot".to_owned()])
        );
        config.method = RebootMethod::Signal;
        assert_eq!(
            config.host_command(),
            Some(["/bin/kill", "-s", "39", "1"].map(String::from).to_vec())
        );
        assert_eq!(config.describe(), "by signal 39 to the host's PID 1");
    }

    #[test]
    fn a_bad_reboot_section_names_the_field() {
        let bad = [
            (
                RebootConfig {
                    command: vec![],
                    ..Default::default()
                },
                "reboot.command: give",
            ),
            (
                RebootConfig {
                    command: vec!["systemctl".into(), "reboot".into()],
                    ..Default::default()
                },
                "must be an absolute path",
            ),
            (
                RebootConfig {
                    signal: 0,
                    ..Default::default()
                },
                "reboot.signal: 0 is not a signal",
            ),
            (
                RebootConfig {
                    timeout: Duration::ZERO,
                    ..Default::default()
                },
                "reboot.timeout",
            ),
            (
                RebootConfig {
                    request_retries: 10,
                    ..Default::default()
                },
                "reboot.requestRetries: 10 is more than 9",
            ),
            (
                RebootConfig {
                    request_retry_after: Duration::from_millis(500),
                    ..Default::default()
                },
                "reboot.requestRetryAfter: must be from 1s to 7d",
            ),
        ];
        for (config, says) in bad {
            let e = config.validate("reboot").expect_err(says);
            assert!(e.contains(says), "{e}");
        }
        RebootConfig::default()
            .validate("reboot")
            .expect("the defaults are valid");
    }
}
