//! Undoing an update that broke the node (`update.rollback`): what runs on the host for each
//! preset, and where a maintenance's rollback stands, from its recorded runs. Pure; the
//! executor runs it ([`super::host_runner`]) and [`super::lifecycle`] decides when.
//!
//! Verifying, after an update ran: the health gate expires (or the `afterBoot` hook fails) →
//! the rollback runs on the host → the node reboots → Verifying again on the new boot, judged
//! by the gate again → Failed, `RolledBack` when it passes, `RollbackFailed` when not (or when
//! the rollback itself failed).

use jiff::Timestamp;
use nodeward_api::{
    inventory::Inventory,
    update::{DEFAULT_ROLLBACK_TIMEOUT, HostRun, HostStep, Rollback, RollbackPreset},
};

use super::{
    host_steps::HostSteps,
    update::{Plan, timeout, words},
};

/// Where a maintenance's rollback stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// None configured, or nothing to undo (no update succeeded).
    None,
    /// Configured and the update ran: it runs if the node fails its gate.
    Armed,
    /// It ran and succeeded in this boot: the node reboots into what it ran before.
    Ran,
    /// It ran and the node has booted since; `verifying` once the agent recorded the new boot
    /// (Verifying entered again after the rollback ended).
    Rebooted { verifying: bool },
    /// It failed (did not start, exited non-zero, ran past its timeout).
    Failed,
}

/// Where the rollback of a maintenance with `steps` stands, from its `runs`, on boot `boot_id`;
/// `verifying_since` is when it last entered Verifying.
pub fn stage(
    steps: &HostSteps,
    runs: &[HostRun],
    boot_id: &str,
    verifying_since: Option<Timestamp>,
) -> Stage {
    let configured = steps.update.as_ref().is_some_and(|u| u.rollback.is_some());
    let updated = runs
        .iter()
        .any(|r| r.step == HostStep::Update && r.succeeded());
    if !configured || !updated {
        return Stage::None;
    }
    let Some(run) = runs.iter().find(|r| r.step == HostStep::Rollback) else {
        return Stage::Armed;
    };
    match (run.finished(), run.succeeded()) {
        // Cut short by a restart of the agent (or of the machine): it runs again.
        (false, _) => Stage::Armed,
        (true, false) => Stage::Failed,
        (true, true) if run.boot_id.as_deref() == Some(boot_id) => Stage::Ran,
        (true, true) => {
            let ended = run.finished_at.as_ref().map(|t| t.0);
            Stage::Rebooted {
                verifying: verifying_since.zip(ended).is_some_and(|(v, e)| v > e),
            }
        }
    }
}

/// What the rollback undoes: the gate that expired (`gate_expired`, why) or the `afterBoot`
/// hook that failed, after the update.
pub fn cause(gate_expired: Option<&str>, runs: &[HostRun]) -> String {
    let hook = || {
        runs.iter()
            .find(|r| r.step == HostStep::AfterBoot && r.finished() && !r.succeeded())
            .and_then(|r| r.message.clone())
    };
    let why = gate_expired
        .map(str::to_owned)
        .or_else(hook)
        .unwrap_or_else(|| "the node failed its health gate".to_owned());
    format!("after the update, {why}: rolling back")
}

fn said(runs: &[HostRun]) -> String {
    runs.iter()
        .find(|r| r.step == HostStep::Rollback)
        .and_then(|r| r.message.clone())
        .unwrap_or_else(|| {
            "after the update the node failed its health gate; rolled back".to_owned()
        })
}

/// Why a maintenance ends `RolledBack`: what the rollback undid, and that the node passed.
pub fn passed(runs: &[HostRun]) -> String {
    format!(
        "{}; rebooted into what it ran before, the node passed its health gate (status.versionsAfter)",
        said(runs)
    )
}

/// Why a maintenance ends `RollbackFailed`: the rollback's own failure, or the gate that
/// expired (`gate_expired`) after it.
pub fn failed(gate_expired: Option<&str>, runs: &[HostRun]) -> String {
    let ran = runs
        .iter()
        .find(|r| r.step == HostStep::Rollback)
        .is_some_and(HostRun::succeeded);
    match gate_expired {
        Some(why) if ran => format!("{}; rebooted, but {why}", said(runs)),
        _ => said(runs),
    }
}

/// What runs to undo the update: the command, or the preset's. For `Apt`, the packages of
/// `before` (the versions recorded when the node was taken out of service) whose version `now`
/// differs are installed again at their recorded version; none to undo is an error naming why.
pub fn plan(
    rollback: &Rollback,
    before: Option<&Inventory>,
    now: Option<&Inventory>,
) -> Result<Plan, String> {
    let argv = match rollback.preset {
        None => rollback.command.clone(),
        Some(RollbackPreset::Bootc) => words(&["/usr/bin/bootc", "rollback"]),
        Some(RollbackPreset::RpmOstree) => words(&["/usr/bin/rpm-ostree", "rollback"]),
        Some(RollbackPreset::Apt) => apt(before, now)?,
    };
    let limit = timeout(rollback.timeout.as_ref(), DEFAULT_ROLLBACK_TIMEOUT);
    Ok(Plan::exit_zero(HostStep::Rollback, argv, limit))
}

/// `apt-get install --allow-downgrades NAME=VERSION...` for each package `now` runs at
/// another version than `before` recorded.
fn apt(before: Option<&Inventory>, now: Option<&Inventory>) -> Result<Vec<String>, String> {
    let before = before.ok_or(
        "no versions were recorded before the update (status.versionsBefore): the Apt rollback reinstalls those, so name the packages in the agent's inventory.packages",
    )?;
    let mut pins = Vec::new();
    for package in &before.packages {
        let Some(version) = package.version.as_deref() else {
            continue;
        };
        if now.and_then(|n| n.version_of(&package.name)) == Some(version) {
            continue;
        }
        if !debian_name(&package.name) || !debian_version(version) {
            return Err(format!(
                "the recorded {}={version} is no Debian package name and version: not passed to apt-get",
                package.name
            ));
        }
        pins.push(format!("{}={version}", package.name));
    }
    if pins.is_empty() {
        return Err(format!(
            "none of the packages recorded before the update ({}) changed: nothing for the Apt rollback to reinstall (it undoes only what the agent's inventory.packages names)",
            names(before)
        ));
    }
    let mut argv = words(&[
        "/usr/bin/env",
        "DEBIAN_FRONTEND=noninteractive",
        "/usr/bin/apt-get",
        "-q",
        "-y",
        "--allow-downgrades",
        "-o",
        "DPkg::Lock::Timeout=600",
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
        "install",
    ]);
    argv.extend(pins);
    Ok(argv)
}

fn names(inventory: &Inventory) -> String {
    if inventory.packages.is_empty() {
        return "none".to_owned();
    }
    let names: Vec<&str> = inventory.packages.iter().map(|p| p.name.as_str()).collect();
    names.join(", ")
}

/// Debian policy 5.6.1: lower case letters, digits, `+ - .`, starting alphanumeric (so never
/// an option to apt-get).
fn debian_name(name: &str) -> bool {
    name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

/// Debian policy 5.6.12: an optional epoch, alphanumerics and `. + ~ - :`, starting with a digit.
fn debian_version(version: &str) -> bool {
    version.starts_with(|c: char| c.is_ascii_digit())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+~-:".contains(c))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use nodeward_api::{
        inventory::PackageVersion,
        update::{HostRunResult, RebootWhen, Update, UpdatePreset},
    };

    use super::*;

    fn inventory(packages: &[(&str, Option<&str>)]) -> Inventory {
        Inventory {
            packages: packages
                .iter()
                .map(|(name, version)| PackageVersion {
                    name: (*name).to_owned(),
                    version: version.map(str::to_owned),
                })
                .collect(),
            ..Inventory::default()
        }
    }

    fn rollback(preset: Option<RollbackPreset>, command: &[&str]) -> Rollback {
        Rollback {
            preset,
            command: words(command),
            timeout: None,
        }
    }

    #[test]
    fn apt_reinstalls_the_recorded_versions_of_what_changed_and_nothing_else() {
        let before = inventory(&[
            ("kubelet", Some("1.34.1-1.1")),
            ("libc6", Some("2.41-12")),
            ("only-new", None),
        ]);
        let now = inventory(&[
            ("kubelet", Some("1.34.2-1.1")),
            ("libc6", Some("2.41-12")),
            ("only-new", Some("1")),
        ]);
        let apt = plan(
            &rollback(Some(RollbackPreset::Apt), &[]),
            Some(&before),
            Some(&now),
        )
        .expect("a plan");
        assert_eq!(apt.step, HostStep::Rollback);
        assert_eq!(apt.timeout, DEFAULT_ROLLBACK_TIMEOUT);
        assert!(apt.argv.contains(&"--allow-downgrades".to_owned()));
        assert_eq!(
            apt.argv.last().map(String::as_str),
            Some("kubelet=1.34.1-1.1")
        );
        assert_eq!(
            apt.argv.iter().filter(|w| w.contains('=')).count(),
            5,
            "the environment, three options and one pin: {:?}",
            apt.argv
        );
        // Nothing read now: everything recorded is pinned.
        let blind = plan(
            &rollback(Some(RollbackPreset::Apt), &[]),
            Some(&before),
            None,
        )
        .expect("a plan");
        assert!(blind.argv.contains(&"libc6=2.41-12".to_owned()));
    }

    #[test]
    fn apt_with_nothing_to_undo_or_a_forged_record_says_why_and_runs_nothing() {
        let apt = rollback(Some(RollbackPreset::Apt), &[]);
        let none = plan(&apt, None, None).expect_err("no record");
        assert!(none.contains("status.versionsBefore"), "{none}");
        assert!(none.contains("inventory.packages"), "{none}");
        let same = inventory(&[("kubelet", Some("1"))]);
        let unchanged = plan(&apt, Some(&same), Some(&same)).expect_err("nothing changed");
        assert!(unchanged.contains("(kubelet) changed"), "{unchanged}");
        for (name, version) in [("-oAPT::Foo=1", "1"), ("kubelet", "--purge"), ("a b", "1")] {
            let forged = inventory(&[(name, Some(version))]);
            let refused = plan(&apt, Some(&forged), None).expect_err("forged");
            assert!(refused.contains("no Debian package name"), "{refused}");
        }
    }

    #[test]
    fn images_roll_back_with_their_own_tool_and_a_command_runs_as_given() {
        for (preset, program) in [
            (RollbackPreset::Bootc, "/usr/bin/bootc"),
            (RollbackPreset::RpmOstree, "/usr/bin/rpm-ostree"),
        ] {
            let image = plan(&rollback(Some(preset), &[]), None, None).expect("a plan");
            assert_eq!(image.argv, words(&[program, "rollback"]));
        }
        let own = plan(
            &rollback(None, &["/usr/local/bin/undo", "--all"]),
            None,
            None,
        )
        .expect("a plan");
        assert_eq!(own.describe(), "/usr/local/bin/undo --all");
    }

    fn ran(step: HostStep, result: Option<HostRunResult>, boot: &str, at: i64) -> HostRun {
        HostRun {
            step,
            command: String::new(),
            started_at: Time(Timestamp::from_second(at).expect("a time")),
            finished_at: result.map(|_| Time(Timestamp::from_second(at + 10).expect("a time"))),
            result,
            exit_code: None,
            output: None,
            reboot: None,
            boot_id: Some(boot.to_owned()),
            message: None,
        }
    }

    #[test]
    fn the_stage_follows_the_runs_and_the_boots() {
        let steps = HostSteps {
            update: Some(Update {
                preset: Some(UpdatePreset::Apt),
                command: vec![],
                timeout: None,
                reboot: RebootWhen::IfNeeded,
                reboot_sentinel: None,
                rollback: Some(rollback(Some(RollbackPreset::Apt), &[])),
            }),
            hooks: Default::default(),
        };
        let ok = Some(HostRunResult::Succeeded);
        let updated = ran(HostStep::Update, ok, "boot-1", 100);
        let at = |s| Some(Timestamp::from_second(s).expect("a time"));
        assert_eq!(
            stage(&steps, &[], "boot-2", None),
            Stage::None,
            "no update ran"
        );
        let failed_update = ran(HostStep::Update, Some(HostRunResult::Failed), "boot-1", 100);
        assert_eq!(stage(&steps, &[failed_update], "boot-1", None), Stage::None);
        assert_eq!(
            stage(
                &HostSteps::default(),
                std::slice::from_ref(&updated),
                "b",
                None
            ),
            Stage::None,
            "no rollback configured"
        );
        assert_eq!(
            stage(&steps, std::slice::from_ref(&updated), "boot-2", at(300)),
            Stage::Armed
        );
        let running = ran(HostStep::Rollback, None, "boot-2", 400);
        assert_eq!(
            stage(&steps, &[updated.clone(), running], "boot-2", at(300)),
            Stage::Armed,
            "cut short: runs again"
        );
        let rolled = ran(HostStep::Rollback, ok, "boot-2", 400);
        let runs = [updated.clone(), rolled];
        assert_eq!(stage(&steps, &runs, "boot-2", at(300)), Stage::Ran);
        assert_eq!(
            stage(&steps, &runs, "boot-3", at(300)),
            Stage::Rebooted { verifying: false }
        );
        assert_eq!(
            stage(&steps, &runs, "boot-3", at(500)),
            Stage::Rebooted { verifying: true }
        );
        let broken = ran(
            HostStep::Rollback,
            Some(HostRunResult::TimedOut),
            "boot-2",
            400,
        );
        assert_eq!(
            stage(&steps, &[updated, broken], "boot-2", at(300)),
            Stage::Failed
        );
    }
}
