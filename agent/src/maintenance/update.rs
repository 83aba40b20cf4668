//! What a host step runs (a hook's command, an update's preset or command), and what its end
//! means: success or failure, and for an update whether the node now needs its reboot (each
//! preset's own rule: the reboot-required sentinel, `needs-restarting -r`, a staged
//! deployment). Pure; [`super::host_runner`] runs them.

use std::time::Duration;

use nodeward_api::update::{
    DEFAULT_HOOK_TIMEOUT, DEFAULT_UPDATE_TIMEOUT, HostRunResult, HostStep, RebootWhen, Update,
    UpdatePreset,
};

use super::host_steps::HostSteps;

/// kured's sentinel, which Debian's and Ubuntu's packages create when they need a reboot.
pub const REBOOT_REQUIRED: &str = "/var/run/reboot-required";

/// How long a check of whether a reboot is needed may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// Apt, non-interactive: the package lists refreshed, then every upgrade (new dependencies
/// and kernels included), keeping changed configuration files, waiting up to 10 minutes for
/// another apt or dpkg to finish.
const APT: &str = "apt-get -q -o DPkg::Lock::Timeout=600 update && \
    DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600 \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold dist-upgrade";

/// How a step's command ended, as far as its judging goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It never ran (systemd not reachable, the unit not started), and why.
    NotStarted(String),
    Exited(i32),
    /// A signal ended it: systemd stopping it at its timeout, or someone killing it.
    Stopped,
}

/// What runs for one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub step: HostStep,
    pub argv: Vec<String>,
    pub timeout: Duration,
    /// Exit codes that mean it worked.
    ok: &'static [i32],
    /// Exit codes that say a reboot is needed, or is not, without asking further.
    reboot_codes: &'static [i32],
    no_reboot_codes: &'static [i32],
    /// Asked after a successful update whose exit code said neither.
    pub check: Option<Check>,
    reboot: RebootWhen,
    /// Why nothing can run (the step is recorded as not started, saying so).
    pub unplannable: Option<String>,
}

/// How to ask the host whether an update needs a reboot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// `argv` exits `needed` when it does, `not_needed` when it does not.
    Exit {
        argv: Vec<String>,
        needed: i32,
        not_needed: i32,
    },
    /// `bootc status` in JSON: a staged deployment waits for the reboot.
    BootcStaged { argv: Vec<String> },
}

impl Check {
    pub fn argv(&self) -> &[String] {
        match self {
            Check::Exit { argv, .. } | Check::BootcStaged { argv } => argv,
        }
    }
}

pub(super) fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

pub(super) fn timeout(given: Option<&nodeward_api::Duration>, default: Duration) -> Duration {
    given.and_then(|d| d.to_std().ok()).unwrap_or(default)
}

/// What runs for `step` of `steps` (None: nothing configured for it).
/// A rollback's plan is [`super::rollback::plan`]: it depends on the versions recorded.
pub fn plan(step: HostStep, steps: &HostSteps) -> Option<Plan> {
    match step {
        HostStep::Update => steps.update.as_ref().map(update_plan),
        HostStep::Rollback => None,
        hook => steps.hooks.get(hook).map(|h| {
            let limit = timeout(h.timeout.as_ref(), DEFAULT_HOOK_TIMEOUT);
            Plan::exit_zero(hook, h.command.clone(), limit)
        }),
    }
}

fn update_plan(update: &Update) -> Plan {
    let exit = |argv: &[&str], needed, not_needed| {
        Some(Check::Exit {
            argv: words(argv),
            needed,
            not_needed,
        })
    };
    let sentinel = |path: &str| exit(&["/usr/bin/test", "-e", path], 0, 1);
    let (argv, ok, reboot_codes, no_reboot_codes, check): (_, &'static [i32], _, _, _) =
        match update.preset {
            Some(UpdatePreset::Apt) => (
                words(&["/bin/sh", "-c", APT]),
                &[0],
                &[][..],
                &[][..],
                sentinel(REBOOT_REQUIRED),
            ),
            Some(UpdatePreset::Dnf) => (
                words(&["/usr/bin/dnf", "-y", "upgrade", "--refresh"]),
                &[0],
                &[],
                &[],
                exit(&["/usr/bin/dnf", "needs-restarting", "-r"], 1, 0),
            ),
            // zypper's 102: installed, a reboot is needed; 103: it updated itself.
            Some(UpdatePreset::Zypper) => (
                words(&["/usr/bin/zypper", "--non-interactive", "update"]),
                &[0, 102, 103],
                &[102],
                &[],
                exit(&["/usr/bin/zypper", "needs-rebooting"], 102, 0),
            ),
            Some(UpdatePreset::Bootc) => (
                words(&["/usr/bin/bootc", "upgrade"]),
                &[0],
                &[],
                &[],
                Some(Check::BootcStaged {
                    argv: words(&["/usr/bin/bootc", "status", "--format=json"]),
                }),
            ),
            // 0: a new deployment is staged; 77: nothing changed.
            Some(UpdatePreset::RpmOstree) => (
                words(&["/usr/bin/rpm-ostree", "upgrade", "--unchanged-exit-77"]),
                &[0, 77],
                &[0],
                &[77],
                None,
            ),
            None => (
                update.command.clone(),
                &[0],
                &[],
                &[],
                sentinel(update.reboot_sentinel.as_deref().unwrap_or(REBOOT_REQUIRED)),
            ),
        };
    Plan {
        step: HostStep::Update,
        argv,
        timeout: timeout(update.timeout.as_ref(), DEFAULT_UPDATE_TIMEOUT),
        ok,
        reboot_codes,
        no_reboot_codes,
        check,
        reboot: update.reboot,
        unplannable: None,
    }
}

impl Plan {
    /// `argv` for `step`, which worked when it exited 0, within `timeout`.
    pub fn exit_zero(step: HostStep, argv: Vec<String>, timeout: Duration) -> Self {
        Plan {
            step,
            argv,
            timeout,
            ok: &[0],
            reboot_codes: &[],
            no_reboot_codes: &[],
            check: None,
            reboot: RebootWhen::Always,
            unplannable: None,
        }
    }

    /// Nothing can run for `step`, and why.
    pub fn unplannable(step: HostStep, why: String) -> Self {
        Plan {
            unplannable: Some(why),
            ..Plan::exit_zero(step, Vec::new(), Duration::ZERO)
        }
    }

    /// The command as one line, for the status and Events.
    pub fn describe(&self) -> String {
        self.argv.join(" ")
    }

    fn what(&self) -> String {
        match self.step {
            HostStep::Update => "the update".to_owned(),
            HostStep::Rollback => "the rollback".to_owned(),
            hook => format!("the {hook:?} hook"),
        }
    }
}

/// What a step's end means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub result: HostRunResult,
    pub exit_code: Option<i32>,
    pub message: String,
    /// For a successful update: whether the node reboots (None: ask [`Plan::check`]).
    pub reboot: Option<bool>,
}

/// Judges how `plan`'s command ended after running for `took`.
pub fn judge(plan: &Plan, ended: &Ended, took: Duration) -> Verdict {
    let what = plan.what();
    let (result, exit_code, message) = match ended {
        Ended::NotStarted(why) => (
            HostRunResult::NotStarted,
            None,
            format!("{what} did not start: {why}"),
        ),
        Ended::Stopped if took >= plan.timeout => (
            HostRunResult::TimedOut,
            None,
            format!(
                "{what} ran past its timeout ({}s) and was stopped",
                plan.timeout.as_secs()
            ),
        ),
        Ended::Stopped => (
            HostRunResult::Failed,
            None,
            format!("{what} was ended by a signal"),
        ),
        // systemd's own exit statuses for a command it could not start (systemd.exec(5)).
        Ended::Exited(203) => (
            HostRunResult::NotStarted,
            Some(203),
            format!(
                "{what} did not start: the host has no executable {} (systemd status 203/EXEC)",
                plan.argv.first().map_or("", String::as_str)
            ),
        ),
        Ended::Exited(code @ 200..=243) => (
            HostRunResult::NotStarted,
            Some(*code),
            format!(
                "{what} did not start: systemd failed to set it up (status {code}, see systemd.exec(5))"
            ),
        ),
        Ended::Exited(code) if plan.ok.contains(code) => (
            HostRunResult::Succeeded,
            Some(*code),
            format!("{what} succeeded in {}s", took.as_secs()),
        ),
        Ended::Exited(code) => (
            HostRunResult::Failed,
            Some(*code),
            format!("{what} exited with {code} after {}s", took.as_secs()),
        ),
    };
    let reboot = match (result, exit_code) {
        (HostRunResult::Succeeded, _) if plan.step != HostStep::Update => None,
        (HostRunResult::Succeeded, _) if plan.reboot == RebootWhen::Always => Some(true),
        (HostRunResult::Succeeded, Some(code)) if plan.reboot_codes.contains(&code) => Some(true),
        (HostRunResult::Succeeded, Some(code)) if plan.no_reboot_codes.contains(&code) => {
            Some(false)
        }
        (HostRunResult::Succeeded, _) if plan.check.is_none() => Some(true),
        _ => None,
    };
    Verdict {
        result,
        exit_code,
        message,
        reboot,
    }
}

/// Whether `check` says the node needs a reboot, from how it ended and its output.
pub fn judge_check(check: &Check, ended: &Ended, output: &[u8]) -> Result<bool, String> {
    let line = || check.argv().join(" ");
    match (check, ended) {
        (_, Ended::NotStarted(why)) => Err(format!("{} did not start: {why}", line())),
        (_, Ended::Stopped) => Err(format!("{} was stopped (its timeout?)", line())),
        (
            Check::Exit {
                needed, not_needed, ..
            },
            Ended::Exited(code),
        ) => {
            if code == needed {
                Ok(true)
            } else if code == not_needed {
                Ok(false)
            } else {
                Err(format!(
                    "{} exited with {code}, neither {needed} (reboot needed) nor {not_needed} (not needed)",
                    line()
                ))
            }
        }
        (Check::BootcStaged { .. }, Ended::Exited(0)) => {
            let status: serde_json::Value = serde_json::from_slice(output)
                .map_err(|e| format!("{} printed no JSON: {e}", line()))?;
            let staged = status
                .pointer("/status/staged")
                .ok_or_else(|| format!("{} has no status.staged: is this bootc?", line()))?;
            Ok(!staged.is_null())
        }
        (Check::BootcStaged { .. }, Ended::Exited(code)) => {
            Err(format!("{} exited with {code}", line()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(preset: Option<UpdatePreset>, command: &[&str]) -> HostSteps {
        HostSteps {
            update: Some(Update {
                preset,
                command: words(command),
                timeout: None,
                reboot: RebootWhen::IfNeeded,
                reboot_sentinel: None,
                rollback: None,
            }),
            hooks: Default::default(),
        }
    }

    fn plan_of(steps: &HostSteps) -> Plan {
        plan(HostStep::Update, steps).expect("an update")
    }

    const S: Duration = Duration::from_secs(3);

    #[test]
    fn each_preset_decides_its_reboot_by_its_own_rule() {
        let apt = plan_of(&update(Some(UpdatePreset::Apt), &[]));
        assert_eq!(apt.argv[..2], words(&["/bin/sh", "-c"]));
        let verdict = judge(&apt, &Ended::Exited(0), S);
        assert_eq!(verdict.result, HostRunResult::Succeeded);
        assert_eq!(verdict.reboot, None, "the sentinel decides");
        let sentinel = apt.check.clone().expect("a check");
        assert_eq!(
            sentinel.argv(),
            words(&["/usr/bin/test", "-e", REBOOT_REQUIRED])
        );
        assert_eq!(judge_check(&sentinel, &Ended::Exited(0), b""), Ok(true));
        assert_eq!(judge_check(&sentinel, &Ended::Exited(1), b""), Ok(false));

        let zypper = plan_of(&update(Some(UpdatePreset::Zypper), &[]));
        assert_eq!(judge(&zypper, &Ended::Exited(102), S).reboot, Some(true));
        let updated_itself = judge(&zypper, &Ended::Exited(103), S);
        assert_eq!(updated_itself.result, HostRunResult::Succeeded);
        assert_eq!(updated_itself.reboot, None, "needs-rebooting decides");
        assert_eq!(
            judge(&zypper, &Ended::Exited(104), S).result,
            HostRunResult::Failed
        );

        let ostree = plan_of(&update(Some(UpdatePreset::RpmOstree), &[]));
        assert_eq!(judge(&ostree, &Ended::Exited(0), S).reboot, Some(true));
        assert_eq!(judge(&ostree, &Ended::Exited(77), S).reboot, Some(false));

        let dnf = plan_of(&update(Some(UpdatePreset::Dnf), &[]));
        let check = dnf.check.expect("needs-restarting");
        assert_eq!(judge_check(&check, &Ended::Exited(1), b""), Ok(true));
        assert_eq!(judge_check(&check, &Ended::Exited(0), b""), Ok(false));
        let odd = judge_check(&check, &Ended::Exited(2), b"").expect_err("2 is neither");
        assert!(odd.contains("neither 1"), "{odd}");

        let bootc = plan_of(&update(Some(UpdatePreset::Bootc), &[]));
        let check = bootc.check.expect("bootc status");
        let staged = br#"{"status":{"staged":{"image":{}},"booted":{}}}"#;
        let none = br#"{"status":{"staged":null,"booted":{}}}"#;
        assert_eq!(judge_check(&check, &Ended::Exited(0), staged), Ok(true));
        assert_eq!(judge_check(&check, &Ended::Exited(0), none), Ok(false));
        let garbage = judge_check(&check, &Ended::Exited(0), b"<html>").expect_err("no JSON");
        assert!(garbage.contains("no JSON"), "{garbage}");
    }

    #[test]
    fn a_command_uses_its_sentinel_and_always_means_always() {
        let mut steps = update(None, &["/usr/local/bin/patch"]);
        let command = plan_of(&steps);
        assert_eq!(command.argv, words(&["/usr/local/bin/patch"]));
        assert_eq!(
            command.check.expect("the sentinel").argv()[2],
            REBOOT_REQUIRED
        );
        if let Some(u) = steps.update.as_mut() {
            u.reboot_sentinel = Some("/run/patched".into());
            u.reboot = RebootWhen::Always;
        }
        let always = plan_of(&steps);
        assert_eq!(
            always.check.as_ref().expect("check").argv()[2],
            "/run/patched"
        );
        assert_eq!(judge(&always, &Ended::Exited(0), S).reboot, Some(true));
        assert_eq!(
            judge(&always, &Ended::Exited(1), S).reboot,
            None,
            "a failed update never reboots"
        );
    }

    #[test]
    fn every_way_to_fail_is_named() {
        let steps = HostSteps {
            update: None,
            hooks: nodeward_api::update::Hooks {
                before_drain: Some(nodeward_api::update::HostCommand {
                    command: words(&["/usr/local/bin/quiesce"]),
                    timeout: Some(nodeward_api::Duration::from_secs(10)),
                }),
                ..Default::default()
            },
        };
        let hook = plan(HostStep::BeforeDrain, &steps).expect("the hook");
        assert_eq!(hook.timeout, Duration::from_secs(10));
        assert_eq!(plan(HostStep::AfterBoot, &steps), None);
        let cases = [
            (
                Ended::Exited(0),
                S,
                HostRunResult::Succeeded,
                "succeeded in 3s",
            ),
            (
                Ended::Exited(3),
                S,
                HostRunResult::Failed,
                "exited with 3 after 3s",
            ),
            (
                Ended::Stopped,
                Duration::from_secs(10),
                HostRunResult::TimedOut,
                "ran past its timeout (10s)",
            ),
            (
                Ended::Stopped,
                S,
                HostRunResult::Failed,
                "ended by a signal",
            ),
            (
                Ended::Exited(203),
                S,
                HostRunResult::NotStarted,
                "no executable /usr/local/bin/quiesce",
            ),
            (
                Ended::NotStarted("no system bus".into()),
                S,
                HostRunResult::NotStarted,
                "did not start: no system bus",
            ),
        ];
        for (ended, took, result, says) in cases {
            let verdict = judge(&hook, &ended, took);
            assert_eq!(verdict.result, result, "{ended:?}");
            assert!(verdict.message.contains(says), "{}", verdict.message);
            assert!(
                verdict.message.contains("BeforeDrain hook"),
                "{}",
                verdict.message
            );
            assert_eq!(verdict.reboot, None, "a hook says nothing of reboots");
        }
    }
}
