//! The host commands of a maintenance (its hooks and its update): which apply, and which is
//! due in the phase the maintenance is in, from what its status records of their runs.
//!
//! Draining: `beforeDrain` before the eviction. Acting: `afterDrain`, then the update (a
//! Reboot only), then the reboot unless the update said none is needed. Verifying:
//! `afterBoot` before the health gate. Each runs once; a run that failed fails the
//! maintenance; one the status shows started but not ended (the agent restarted while it ran)
//! runs again.

use nodeward_api::{
    MaintenancePhase,
    update::{HostRun, HostStep},
};

pub use crate::policies::HostSteps;

/// Where a maintenance's host steps stand in its current phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostState {
    /// Nothing to run now: none configured, or this phase's have run.
    Clear,
    /// This step runs now.
    Due(HostStep),
    /// This step failed: so does the maintenance.
    Failed(HostStep),
    /// The update ran and needs no reboot: the node goes on to its health gate.
    NoReboot,
}

/// Whether `steps` has `step`.
fn has(steps: &HostSteps, step: HostStep) -> bool {
    match step {
        HostStep::Update => steps.update.is_some(),
        hook => steps.hooks.get(hook).is_some(),
    }
}

/// The steps of `phase`, in order.
fn of_phase(phase: MaintenancePhase) -> &'static [HostStep] {
    match phase {
        MaintenancePhase::Draining => &[HostStep::BeforeDrain],
        MaintenancePhase::Acting => &[HostStep::AfterDrain, HostStep::Update],
        MaintenancePhase::Verifying => &[HostStep::AfterBoot],
        _ => &[],
    }
}

/// Where the host steps of a maintenance in `phase` stand, given those that apply and the
/// runs recorded.
pub fn state(phase: MaintenancePhase, steps: &HostSteps, runs: &[HostRun]) -> HostState {
    let run = |step: HostStep| runs.iter().find(|r| r.step == step);
    for &step in of_phase(phase) {
        if !has(steps, step) {
            continue;
        }
        match run(step) {
            Some(r) if r.succeeded() => {}
            Some(r) if r.finished() => return HostState::Failed(step),
            _ => return HostState::Due(step),
        }
    }
    let update_said_no = steps.update.is_some()
        && run(HostStep::Update).is_some_and(|r| r.succeeded() && r.reboot == Some(false));
    if phase == MaintenancePhase::Acting && update_said_no {
        return HostState::NoReboot;
    }
    HostState::Clear
}

/// `recorded` with `ours` over it: the runs this agent ended, which a watch may not show yet.
pub fn overlaid(recorded: &[HostRun], ours: &[HostRun]) -> Vec<HostRun> {
    let mut runs: Vec<HostRun> = recorded
        .iter()
        .filter(|r| !ours.iter().any(|o| o.step == r.step))
        .cloned()
        .collect();
    runs.extend(ours.iter().cloned());
    runs
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use nodeward_api::update::{HostCommand, HostRunResult, RebootWhen};

    use nodeward_api::{
        DisruptionPolicySpec, MaintenanceAction, MaintenanceReason, NodeMaintenanceSpec,
        update::{Hooks, Update},
    };

    use super::*;
    use MaintenancePhase::*;

    fn hook(program: &str) -> Option<HostCommand> {
        Some(HostCommand {
            command: vec![program.to_owned()],
            timeout: None,
        })
    }

    fn apt() -> Update {
        Update {
            preset: Some(nodeward_api::update::UpdatePreset::Apt),
            command: vec![],
            timeout: None,
            reboot: RebootWhen::IfNeeded,
            reboot_sentinel: None,
            rollback: None,
        }
    }

    fn all() -> HostSteps {
        HostSteps {
            update: Some(apt()),
            hooks: Hooks {
                before_drain: hook("/before"),
                after_drain: hook("/after"),
                after_boot: hook("/boot"),
            },
        }
    }

    fn ran(step: HostStep, result: Option<HostRunResult>, reboot: Option<bool>) -> HostRun {
        HostRun {
            step,
            command: String::new(),
            started_at: Time(Timestamp::UNIX_EPOCH),
            finished_at: None,
            result,
            exit_code: None,
            output: None,
            reboot,
            boot_id: None,
            message: None,
        }
    }

    const OK: Option<HostRunResult> = Some(HostRunResult::Succeeded);

    #[test]
    fn each_phase_runs_its_steps_in_order_once() {
        let steps = all();
        assert_eq!(
            state(Draining, &steps, &[]),
            HostState::Due(HostStep::BeforeDrain)
        );
        let before = ran(HostStep::BeforeDrain, OK, None);
        assert_eq!(
            state(Draining, &steps, std::slice::from_ref(&before)),
            HostState::Clear
        );
        assert_eq!(
            state(Acting, &steps, std::slice::from_ref(&before)),
            HostState::Due(HostStep::AfterDrain)
        );
        let after = ran(HostStep::AfterDrain, OK, None);
        assert_eq!(
            state(Acting, &steps, &[before.clone(), after.clone()]),
            HostState::Due(HostStep::Update)
        );
        let updated = ran(HostStep::Update, OK, Some(true));
        assert_eq!(
            state(Acting, &steps, &[before.clone(), after.clone(), updated]),
            HostState::Clear,
            "the update wants its reboot"
        );
        let no_reboot = ran(HostStep::Update, OK, Some(false));
        let runs = [before, after, no_reboot];
        assert_eq!(state(Acting, &steps, &runs), HostState::NoReboot);
        assert_eq!(
            state(Verifying, &steps, &runs),
            HostState::Due(HostStep::AfterBoot)
        );
    }

    #[test]
    fn a_failed_step_fails_and_one_cut_short_runs_again() {
        let steps = all();
        for result in [
            HostRunResult::Failed,
            HostRunResult::TimedOut,
            HostRunResult::NotStarted,
        ] {
            assert_eq!(
                state(
                    Draining,
                    &steps,
                    &[ran(HostStep::BeforeDrain, Some(result), None)]
                ),
                HostState::Failed(HostStep::BeforeDrain),
                "{result:?}"
            );
        }
        assert_eq!(
            state(Draining, &steps, &[ran(HostStep::BeforeDrain, None, None)]),
            HostState::Due(HostStep::BeforeDrain),
            "started, never ended: the agent restarted while it ran"
        );
        // The agent's own ended run over a view that still shows it running.
        let ours = [ran(
            HostStep::BeforeDrain,
            Some(HostRunResult::Failed),
            None,
        )];
        let seen = [ran(HostStep::BeforeDrain, None, None)];
        assert_eq!(
            state(Draining, &steps, &overlaid(&seen, &ours)),
            HostState::Failed(HostStep::BeforeDrain)
        );
    }

    #[test]
    fn the_maintenance_chooses_first_and_a_policys_update_is_for_planned_reboots() {
        let spec = |reason, action, update: Option<Update>| NodeMaintenanceSpec {
            node_name: "n1".into(),
            reason,
            action,
            requested_by: None,
            message: None,
            drain_plan: None,
            update,
            hooks: None,
            disruption_deadline: None,
            urgent: false,
        };
        let policy: DisruptionPolicySpec = serde_json::from_value(serde_json::json!({
            "update": {"preset": "Dnf"},
            "hooks": {"afterBoot": {"command": ["/check"]}},
        }))
        .expect("a policy");
        let from_policy = HostSteps::of(
            &spec(MaintenanceReason::Reboot, MaintenanceAction::Reboot, None),
            &[&policy],
        );
        assert_eq!(
            from_policy.update.and_then(|u| u.preset),
            Some(nodeward_api::update::UpdatePreset::Dnf)
        );
        assert_eq!(from_policy.hooks, policy.hooks.clone().expect("hooks"));
        let own = HostSteps::of(
            &spec(
                MaintenanceReason::Manual,
                MaintenanceAction::Reboot,
                Some(apt()),
            ),
            &[&policy],
        );
        assert_eq!(own.update, Some(apt()), "the maintenance's own wins");
        for (reason, action) in [
            (MaintenanceReason::Remediation, MaintenanceAction::Reboot),
            (MaintenanceReason::Shutdown, MaintenanceAction::Reboot),
            (MaintenanceReason::Reboot, MaintenanceAction::DrainOnly),
        ] {
            let steps = HostSteps::of(&spec(reason, action, None), &[&policy]);
            assert_eq!(steps.update, None, "{reason:?} {action:?}");
            assert!(steps.hooks.after_boot.is_some(), "hooks still apply");
        }
        assert_eq!(
            state(Acting, &HostSteps::default(), &[]),
            HostState::Clear,
            "nothing configured"
        );
    }
}
