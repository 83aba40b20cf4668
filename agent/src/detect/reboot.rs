//! Reboot required: a sentinel file (default `/var/run/reboot-required`, as Debian and Ubuntu
//! write it) or a configured command that exits 0 while a reboot is required.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use nodeward_api::conditions::node::REBOOT_REQUIRED;

use super::{AgentContext, Detector, Finding, Section, command};
use crate::flags::{self, Flag};

super::section! {
    pub struct RebootConfig {
        /// A reboot is required while this file exists (kured's `--reboot-sentinel`).
        pub sentinel_file: PathBuf,
        /// When set, a reboot is required while this command exits 0 (kured's
        /// `--reboot-sentinel-command`); it replaces the sentinel file.
        pub sentinel_command: Vec<String>,
        /// Look on the host: the sentinel file with `test -e`, the command as it is, each as a
        /// transient systemd service over the system bus. The DaemonSet does, so that it
        /// mounts nothing of the host's `/var/run`.
        pub on_host: bool,
    }
}

impl Default for RebootConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(30),
            hold: Duration::ZERO,
            sentinel_file: PathBuf::from("/var/run/reboot-required"),
            sentinel_command: Vec::new(),
            on_host: false,
        }
    }
}

impl Section for RebootConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        if self.sentinel_command.first().is_some_and(String::is_empty) {
            return Err(format!(
                "{place}.sentinelCommand[0]: the program must not be empty"
            ));
        }
        if self.on_host
            && self
                .sentinel_command
                .first()
                .is_some_and(|p| !p.starts_with('/'))
        {
            return Err(format!(
                "{place}.sentinelCommand[0]: a command run on the host (onHost) needs an absolute path, e.g. /usr/bin/needs-restarting"
            ));
        }
        Ok(())
    }

    fn detectors(&self, _: Option<&AgentContext>) -> Vec<Detector> {
        self.detector(
            DETECTOR,
            REBOOT_REQUIRED,
            |c| async move { observe(&c).await },
        )
    }

    fn flags(&self) -> Vec<Flag> {
        flags::declare! {
            "reboot-sentinel" ("NODEWARD_REBOOT_SENTINEL") => "sentinelFile": Text, "A reboot is required while this file exists (kured's --reboot-sentinel)";
            "reboot-sentinel-command" ("NODEWARD_REBOOT_SENTINEL_COMMAND") => "sentinelCommand": Words, "A reboot is required while this command exits 0; words split on spaces (kured's --reboot-sentinel-command)";
        }
    }
}

pub const DETECTOR: &str = "reboot-required";

/// What was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// The sentinel file exists (`true`) or not.
    Sentinel { path: String, present: bool },
    /// The sentinel command ran (exit code, `None` for a signal) or could not be run.
    Command {
        command: String,
        result: Result<Option<i32>, String>,
    },
}

pub async fn observe(config: &RebootConfig) -> Finding {
    evaluate(&gather(config).await)
}

async fn gather(config: &RebootConfig) -> Evidence {
    if config.on_host {
        return on_host(config).await;
    }
    if config.sentinel_command.is_empty() {
        let path = config.sentinel_file.display().to_string();
        let present = tokio::fs::try_exists(&config.sentinel_file)
            .await
            .unwrap_or(false)
            || Path::new(&config.sentinel_file).is_symlink();
        return Evidence::Sentinel { path, present };
    }
    Evidence::Command {
        command: config.sentinel_command.join(" "),
        result: command::run(&config.sentinel_command).await.map(|o| o.code),
    }
}

/// The sentinel file or command, looked at on the host.
async fn on_host(config: &RebootConfig) -> Evidence {
    if config.sentinel_command.is_empty() {
        let path = config.sentinel_file.display().to_string();
        let test = vec!["/usr/bin/test".to_owned(), "-e".to_owned(), path.clone()];
        return match command::run_where(&test, true, config.timeout).await {
            Ok(out) if out.code == Some(0) || out.code == Some(1) => Evidence::Sentinel {
                path,
                present: out.code == Some(0),
            },
            Ok(out) => Evidence::Command {
                command: test.join(" "),
                result: Ok(out.code),
            },
            Err(e) => Evidence::Command {
                command: test.join(" "),
                result: Err(e),
            },
        };
    }
    Evidence::Command {
        command: config.sentinel_command.join(" "),
        result: command::run_where(&config.sentinel_command, true, config.timeout)
            .await
            .map(|o| o.code),
    }
}

pub fn evaluate(evidence: &Evidence) -> Finding {
    match evidence {
        Evidence::Sentinel {
            path,
            present: true,
        } => Finding::problem(
            DETECTOR,
            REBOOT_REQUIRED,
            "SentinelFilePresent",
            format!("{path} exists"),
        ),
        Evidence::Sentinel {
            path,
            present: false,
        } => Finding::ok(
            DETECTOR,
            REBOOT_REQUIRED,
            "NoRebootRequired",
            format!("{path} does not exist"),
        ),
        Evidence::Command {
            command,
            result: Ok(Some(0)),
        } => Finding::problem(
            DETECTOR,
            REBOOT_REQUIRED,
            "SentinelCommandSucceeded",
            format!("`{command}` exited 0: a reboot is required"),
        ),
        Evidence::Command {
            command,
            result: Ok(Some(code)),
        } => Finding::ok(
            DETECTOR,
            REBOOT_REQUIRED,
            "NoRebootRequired",
            format!("`{command}` exited {code}"),
        ),
        Evidence::Command {
            command,
            result: Ok(None),
        } => Finding::unknown(
            DETECTOR,
            REBOOT_REQUIRED,
            "SentinelCommandFailed",
            format!("`{command}` was killed by a signal"),
        ),
        Evidence::Command { result: Err(e), .. } => Finding::unknown(
            DETECTOR,
            REBOOT_REQUIRED,
            "SentinelCommandFailed",
            e.clone(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Status;

    #[tokio::test]
    async fn the_sentinel_file_decides() {
        let dir = std::env::temp_dir().join(format!("nodeward-reboot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let config = RebootConfig {
            sentinel_file: dir.join("reboot-required"),
            ..RebootConfig::default()
        };
        assert_eq!(observe(&config).await.status, Status::Ok);
        std::fs::write(&config.sentinel_file, "").expect("sentinel");
        let found = observe(&config).await;
        found.assert_is(Status::Problem, "SentinelFilePresent");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn the_command_replaces_the_file_and_exit_0_means_required() {
        let config = |script: &str| RebootConfig {
            sentinel_file: "/".into(), // exists, but the command wins
            sentinel_command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..RebootConfig::default()
        };
        assert_eq!(observe(&config("exit 0")).await.status, Status::Problem);
        assert_eq!(observe(&config("exit 1")).await.status, Status::Ok);
        let killed = observe(&config("kill -9 $$")).await;
        killed.assert_is(Status::Unknown, "SentinelCommandFailed");
    }
}
