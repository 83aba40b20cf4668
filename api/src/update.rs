//! Patching: the update a Reboot maintenance runs on the host after its drain and before its
//! reboot, the hooks around it, and the record of each run in the maintenance's status.
//!
//! Whoever may write these runs programs as root on the nodes they reach: a DisruptionPolicy's
//! writer on every node it selects, a NodeMaintenance's on its node. The chart's admission
//! policy lets only those who may update DisruptionPolicies put a `command` or hooks in a
//! NodeMaintenance, and no agent put either in the reboot requests it files.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Duration;

/// The most words a host command has.
pub const COMMAND_WORDS_LIMIT: usize = 64;
/// The longest word of a host command.
pub const COMMAND_WORD_LIMIT: usize = 4096;
/// The most output a run keeps in the status: its end, where a package manager says what
/// went wrong.
pub const OUTPUT_LIMIT: usize = 2048;
/// How long an update may run when its `timeout` is not given.
pub const DEFAULT_UPDATE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);
/// How long a rollback may run when its `timeout` is not given.
pub const DEFAULT_ROLLBACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15 * 60);
/// How long a hook may run when its `timeout` is not given.
pub const DEFAULT_HOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// What updates the node, run on the host as a transient systemd service once the node is
/// drained. The node then reboots only when the update needs it (`reboot: IfNeeded`, the
/// preset's rule or the sentinel file) or always (`reboot: Always`).
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.preset) != (has(self.command) && size(self.command) > 0)").message("give either preset (Apt, Dnf, Zypper, Bootc, RpmOstree) or command, not both"))]
#[x_kube(validation = Rule::new("!has(self.rebootSentinel) || (has(self.command) && size(self.command) > 0)").message("rebootSentinel is for a command: each preset has its own rule for whether a reboot is needed"))]
pub struct Update {
    /// A package manager's upgrade with its own reboot rule: `Apt` (`apt-get update` and
    /// `dist-upgrade`; reboot when `/var/run/reboot-required` exists), `Dnf` (`dnf upgrade
    /// --refresh`; `dnf needs-restarting -r`), `Zypper` (`zypper update`; its exit code 102 or
    /// `zypper needs-rebooting`), `Bootc` (`bootc upgrade`; a staged deployment), `RpmOstree`
    /// (`rpm-ostree upgrade`; a new deployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<UpdatePreset>,
    /// The program (an absolute path on the host) and its arguments, instead of a preset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::update::host_command")]
    pub command: Vec<String>,
    /// How long it may run before systemd stops it and the maintenance fails (default 30m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// When the node reboots after a successful update.
    #[serde(default)]
    pub reboot: RebootWhen,
    /// For a command with `reboot: IfNeeded`: the host file whose presence after the update
    /// means a reboot is needed (default `/var/run/reboot-required`, kured's sentinel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 4096), regex(pattern = r"^/"))]
    pub reboot_sentinel: Option<String>,
    /// What undoes the update when the node fails its health gate (or its `afterBoot` hook)
    /// after it: run on the host, then the node reboots into what it ran before and is judged
    /// by the gate again. The maintenance ends Failed either way: `RolledBack` when the node
    /// passes on the old version, `RollbackFailed` when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<Rollback>,
}

/// How an update is undone.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.preset) != (has(self.command) && size(self.command) > 0)").message("give either preset (Apt, Bootc, RpmOstree) or command, not both"))]
pub struct Rollback {
    /// `Bootc` (`bootc rollback`: the previous deployment boots next), `RpmOstree`
    /// (`rpm-ostree rollback`), `Apt` (the packages the agent's `inventory.packages` names that
    /// the update changed are installed again at the versions recorded before it, in
    /// `status.versionsBefore`; a package only the update installed stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<RollbackPreset>,
    /// The program (an absolute path on the host) and its arguments, instead of a preset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::update::host_command")]
    pub command: Vec<String>,
    /// How long it may run before systemd stops it (default 15m); the maintenance then ends
    /// `RollbackFailed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RollbackPreset {
    Apt,
    Bootc,
    RpmOstree,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpdatePreset {
    Apt,
    Dnf,
    Zypper,
    Bootc,
    RpmOstree,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RebootWhen {
    /// Only when the update says a reboot is needed; otherwise the node goes straight to its
    /// health gate.
    #[default]
    IfNeeded,
    /// After every successful update.
    Always,
}

/// Host commands around a maintenance. A hook that fails (does not start, exits non-zero or
/// runs past its timeout) fails the maintenance, and the node is put back in service.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Hooks {
    /// Once the node is cordoned, before its pods are evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_drain: Option<HostCommand>,
    /// Once the node is drained, before the update and the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_drain: Option<HostCommand>,
    /// After the reboot (or after an update that needed none), before the health gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_boot: Option<HostCommand>,
}

impl Hooks {
    pub fn get(&self, step: HostStep) -> Option<&HostCommand> {
        match step {
            HostStep::BeforeDrain => self.before_drain.as_ref(),
            HostStep::AfterDrain => self.after_drain.as_ref(),
            HostStep::AfterBoot => self.after_boot.as_ref(),
            HostStep::Update | HostStep::Rollback => None,
        }
    }
}

/// A program run on the host as a transient systemd service.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostCommand {
    /// The program (an absolute path on the host) and its arguments.
    #[schemars(schema_with = "crate::update::host_command")]
    pub command: Vec<String>,
    /// How long it may run before systemd stops it and the maintenance fails (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
}

/// Which host command of a maintenance a run was.
#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub enum HostStep {
    BeforeDrain,
    AfterDrain,
    Update,
    AfterBoot,
    /// The update's rollback, after the node failed its health gate (or `afterBoot` hook).
    Rollback,
}

impl HostStep {
    /// In the order they run.
    pub const ALL: [HostStep; 5] = [
        HostStep::BeforeDrain,
        HostStep::AfterDrain,
        HostStep::Update,
        HostStep::AfterBoot,
        HostStep::Rollback,
    ];
}

/// One host command of a maintenance as it ran: written when it starts, and again when it
/// ends.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostRun {
    pub step: HostStep,
    /// What ran, as one line (cut to 1,024 bytes).
    #[schemars(length(max = 1024))]
    pub command: String,
    pub started_at: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// How it ended; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<HostRunResult>,
    /// Its exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The end of its output (standard output and error), at most 2,048 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = OUTPUT_LIMIT))]
    pub output: Option<String>,
    /// For the update: whether the node reboots after it, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot: Option<bool>,
    /// The boot it ran in (the rollback's: a different one after means the node rebooted
    /// into the old version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::MESSAGE_LIMIT))]
    pub message: Option<String>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRunResult {
    Succeeded,
    /// It exited non-zero (or with a code its preset calls a failure).
    Failed,
    /// It ran past its timeout and systemd stopped it.
    TimedOut,
    /// It could not be started (no such program, no systemd to ask).
    NotStarted,
}

impl HostRun {
    pub fn finished(&self) -> bool {
        self.result.is_some()
    }

    pub fn succeeded(&self) -> bool {
        self.result == Some(HostRunResult::Succeeded)
    }
}

impl HostStep {
    /// The step as a user reads it: "update", "rollback", "AfterBoot hook".
    pub fn named(self) -> String {
        match self {
            HostStep::Update => "update".to_owned(),
            HostStep::Rollback => "rollback".to_owned(),
            hook => format!("{hook:?} hook"),
        }
    }
}

/// What an unfinished maintenance is doing on its host now, as `runs` (its `status.hostRuns`)
/// tell: the step running, or the reboot the last update or rollback asked for, until the
/// agent records a phase after it (`last_entered`: when it last entered one, by the agent's
/// clock, as the runs' times are). `None` when no host step explains the phase: its message
/// says what it does.
pub fn under_way(runs: &[HostRun], last_entered: Option<&Time>) -> Option<String> {
    if let Some(run) = runs.iter().find(|r| !r.finished()) {
        return Some(match run.step {
            HostStep::Update => format!("updating: {}", run.command),
            HostStep::Rollback => format!("rolling back the update: {}", run.command),
            hook => format!("running the {hook:?} hook: {}", run.command),
        });
    }
    let last = runs
        .iter()
        .filter(|r| matches!(r.step, HostStep::Update | HostStep::Rollback))
        .max_by_key(|r| r.finished_at.as_ref().map(|t| t.0))?;
    let ended = last.finished_at.as_ref()?.0;
    if last_entered.is_some_and(|t| t.0 > ended) || !last.succeeded() {
        return None;
    }
    match (last.step, last.reboot) {
        (HostStep::Update, Some(true)) => Some("rebooting: the update asked for it".to_owned()),
        (HostStep::Update, Some(false)) => {
            Some("updated; no reboot needed: going on to the health gate".to_owned())
        }
        (HostStep::Rollback, _) => {
            Some("rebooting into what ran before the update: the rollback asked for it".to_owned())
        }
        _ => None,
    }
}

/// The longest a maintenance's host steps may take in each phase they run in: their timeouts
/// (the update's with time to ask whether it needs a reboot). The coordinator's deadlines for
/// those phases grow by as much.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostTime {
    pub draining: std::time::Duration,
    pub acting: std::time::Duration,
    pub verifying: std::time::Duration,
    /// The rollback's timeout, when the update has one: Verifying then holds a rollback, a
    /// reboot and a second health gate.
    pub rollback: std::time::Duration,
}

/// What the agent allows for asking whether an update needs a reboot, with margin.
const REBOOT_CHECK_ALLOWANCE: std::time::Duration = std::time::Duration::from_secs(180);

impl HostTime {
    pub fn of(update: Option<&Update>, hooks: Option<&Hooks>) -> Self {
        let given =
            |d: Option<&Duration>, default| d.and_then(|d| d.to_std().ok()).unwrap_or(default);
        let hook = |h: Option<&HostCommand>| {
            h.map_or(std::time::Duration::ZERO, |h| {
                given(h.timeout.as_ref(), DEFAULT_HOOK_TIMEOUT)
            })
        };
        let rollback = update
            .and_then(|u| u.rollback.as_ref())
            .map_or(std::time::Duration::ZERO, |r| {
                given(r.timeout.as_ref(), DEFAULT_ROLLBACK_TIMEOUT)
            });
        let update = update.map_or(std::time::Duration::ZERO, |u| {
            given(u.timeout.as_ref(), DEFAULT_UPDATE_TIMEOUT) + REBOOT_CHECK_ALLOWANCE
        });
        Self {
            draining: hook(hooks.and_then(|h| h.before_drain.as_ref())),
            acting: hook(hooks.and_then(|h| h.after_drain.as_ref())) + update,
            verifying: hook(hooks.and_then(|h| h.after_boot.as_ref())),
            rollback,
        }
    }
}

/// A host command: the program (an absolute path) and its arguments.
pub fn host_command(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": COMMAND_WORDS_LIMIT,
        "items": {"type": "string", "maxLength": COMMAND_WORD_LIMIT},
        "x-kubernetes-validations": [{
            "rule": "self[0].startsWith('/')",
            "message": "the program must be an absolute path on the host, e.g. /usr/bin/apt-get"
        }]
    })
}

/// A maintenance's host runs, one per step (each applied by the agent under a field manager of
/// its own).
pub fn host_runs(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let item = generator.subschema_for::<HostRun>();
    schemars::json_schema!({
        "type": "array",
        "maxItems": HostStep::ALL.len(),
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["step"],
        "items": item
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + second).expect("a time"))
    }

    fn run(step: HostStep, ended: Option<i64>, reboot: Option<bool>) -> HostRun {
        HostRun {
            step,
            command: format!("{step:?} command"),
            started_at: at(0),
            finished_at: ended.map(at),
            result: ended.map(|_| HostRunResult::Succeeded),
            exit_code: ended.map(|_| 0),
            output: None,
            reboot,
            boot_id: Some("b1".into()),
            message: None,
        }
    }

    #[test]
    fn what_an_update_and_its_rollback_are_doing_reads_as_the_step_under_way() {
        let update = run(HostStep::Update, None, None);
        assert_eq!(
            under_way(std::slice::from_ref(&update), Some(&at(-5))).as_deref(),
            Some("updating: Update command")
        );
        // Done, asking for a reboot; the agent has recorded no phase since.
        let updated = run(HostStep::Update, Some(30), Some(true));
        assert_eq!(
            under_way(std::slice::from_ref(&updated), Some(&at(-5))).as_deref(),
            Some("rebooting: the update asked for it")
        );
        // Back: Verifying entered after it, whose message says the rest.
        assert_eq!(
            under_way(std::slice::from_ref(&updated), Some(&at(90))),
            None
        );
        // No reboot needed: said until the phase after it says so itself.
        let no_reboot = run(HostStep::Update, Some(30), Some(false));
        assert_eq!(
            under_way(std::slice::from_ref(&no_reboot), Some(&at(-5))).as_deref(),
            Some("updated; no reboot needed: going on to the health gate")
        );
        assert_eq!(
            under_way(std::slice::from_ref(&no_reboot), Some(&at(31))),
            None
        );
        // The hook, then the rollback, then its reboot.
        let hook = run(HostStep::AfterBoot, None, None);
        assert_eq!(
            under_way(&[no_reboot.clone(), hook], Some(&at(31))).as_deref(),
            Some("running the AfterBoot hook: AfterBoot command")
        );
        let rolling = run(HostStep::Rollback, None, None);
        assert_eq!(
            under_way(&[no_reboot.clone(), rolling], Some(&at(31))).as_deref(),
            Some("rolling back the update: Rollback command")
        );
        let rolled = run(HostStep::Rollback, Some(60), None);
        assert_eq!(
            under_way(&[no_reboot.clone(), rolled.clone()], Some(&at(31))).as_deref(),
            Some("rebooting into what ran before the update: the rollback asked for it")
        );
        assert_eq!(under_way(&[no_reboot, rolled], Some(&at(120))), None);
        assert_eq!(HostStep::Rollback.named(), "rollback");
        assert_eq!(HostStep::AfterBoot.named(), "AfterBoot hook");
    }
}
