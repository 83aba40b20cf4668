//! What the agent does next with a NodeMaintenance of its node, as a pure function of the
//! maintenance's phase and the facts around it.
//!
//! Admitted → (finalizer, taint, cordon) Draining → (drain) Acting → the action:
//! `DrainOnly` stays Acting (drained, holding its slot) until the object is deleted, then the
//! node is restored (one the cloud takes down anyway, `spec.disruptionDeadline`, goes on to
//! Verifying once the node has booted again, and ends like a reboot); `Reboot` reboots through logind and, after the next boot, Verifying until
//! the health gate holds, then the node is restored and Succeeded; `PowerOff` is Succeeded
//! just before logind powers off; `DeleteNode` waits in Acting for the coordinator to delete
//! the Node. A reboot whose drain evicted pods waits, once healthy, with the node back in
//! service, until the coordinator finds the controllers of those pods available again
//! (`WorkloadsAvailable`, the policy's `workloadGate`): only then is it Succeeded, so its slot
//! holds the next node back. Deleted before Acting: restored, Cancelled. A health gate that has not passed
//! within its `timeout` after the reboot fails the maintenance (the node is restored: what is
//! wrong with it is for its conditions and remediation to say), unless its update has a rollback
//! ([`super::rollback`]): then the update is undone, the node reboots and is judged again, and
//! the maintenance fails `RolledBack` or `RollbackFailed`. One the coordinator sent back
//! or ended because a deadline passed (`NodeRestored=False`) is restored when the agent next
//! runs (the node came back, or the agent did).

use std::time::Duration;

use nodeward_api::{MaintenanceAction, MaintenancePhase, update::HostStep};

use super::{host_steps::HostState, rollback};

/// The facts a step depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    pub phase: MaintenancePhase,
    pub action: MaintenanceAction,
    /// The object has a deletionTimestamp.
    pub deleting: bool,
    /// The agent's finalizer is on the object.
    pub finalized: bool,
    /// The node's boot id differs from the one recorded when the action started.
    pub rebooted: bool,
    /// The health gate holds (Ready, no problem findings, for long enough).
    pub healthy: bool,
    /// The health gate's timeout has passed without it holding.
    pub gate_expired: bool,
    /// The coordinator moved it on without the agent (a deadline passed: `NodeRestored=False`),
    /// so the node may still carry its taint and cordon.
    pub restore_asked: bool,
    /// The health gate passed earlier and the node is back in service (`NodeRestored=True`
    /// while Verifying): only the workloads are waited for.
    pub back_in_service: bool,
    /// Where the evicted workloads stand.
    pub workloads: Workloads,
    /// Where the maintenance's host commands (hooks, update) of this phase stand.
    pub host: HostState,
    /// This agent asked for the reboot (or power-off) in this boot.
    pub acted: bool,
    /// The node goes down whatever nodeward does (`spec.disruptionDeadline`, a cloud's
    /// notice): a drained `DrainOnly` ends once the node has booted again.
    pub goes_down_anyway: bool,
    /// Where the update's rollback stands.
    pub rollback: rollback::Stage,
}

/// Where the workloads a reboot's drain evicted stand, as the coordinator judged them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workloads {
    /// The drain evicted nothing that comes back elsewhere.
    NotNeeded,
    /// Available again, or not waited for.
    Available,
    /// Short, or not judged yet.
    Waiting,
    /// Short after the policy's timeout; the maintenance succeeds with the warning.
    TimedOut,
    /// Short after the policy's timeout, and the policy says to fail.
    TimedOutFailed,
}

/// The steps of an update's rollback ([`rollback`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RollbackStep {
    /// The updated node failed its gate (or `afterBoot` hook): run the rollback on the host.
    Run,
    /// Back after the rollback's reboot: Verifying again, judged by the gate again.
    Verify,
    /// The rolled-back node passed its gate: restore it, Failed (`RolledBack`).
    Passed,
    /// The rollback failed, or the rolled-back node did not pass its gate: restore it, Failed
    /// (`RollbackFailed`).
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do now.
    Wait,
    /// Add the finalizer, taint and cordon, go to Draining.
    Prepare,
    /// Evict the pods (again, after a restart), then act.
    Drain,
    /// Run a host command (a hook or the update) and record how it ended.
    RunOnHost(HostStep),
    /// A host command failed: restore the node, Failed.
    HostFailed(HostStep),
    /// The update needs no reboot: go to Verifying without one.
    SkipReboot,
    /// Start the action (reboot or power off through logind) after recording the boot id.
    Act,
    /// Back after the reboot: go to Verifying.
    Verify,
    /// The health gate held (and the workloads are back): restore the node, Succeeded.
    Complete,
    /// The health gate held but the evicted workloads are short: restore the node (so that
    /// they may come back to it) and wait for them, still Verifying.
    ReturnToService,
    /// The evicted workloads were not back within the policy's timeout and it says to fail.
    WorkloadsFailed,
    /// The health gate did not hold in time: restore the node, Failed.
    GateFailed,
    /// A step of the rollback of an update.
    Rollback(RollbackStep),
    /// Deleted before the action: restore the node, Cancelled, remove the finalizer.
    Cancel,
    /// Deleted after it finished or while drained (DrainOnly): restore the node (unless
    /// already restored) and remove the finalizer.
    Release,
    /// Sent back to Pending or ended by the coordinator: undo what this maintenance left on
    /// the node, and say so (`NodeRestored=True`).
    Restore,
}

pub fn step(f: Facts) -> Step {
    use MaintenancePhase::*;
    if f.restore_asked && (f.phase == Pending || f.phase.is_finished()) {
        return Step::Restore;
    }
    if f.deleting {
        if !f.finalized {
            return Step::Wait;
        }
        return match f.phase {
            Pending | Admitted | Draining => Step::Cancel,
            // A reboot under way finishes first; the object goes when it is done (one back in
            // service, waiting only for its workloads, goes at once). One still running its
            // hooks or update has asked for no reboot yet: released.
            Acting
                if f.action == MaintenanceAction::Reboot
                    && !f.rebooted
                    && !f.acted
                    && f.host != HostState::Clear =>
            {
                Step::Release
            }
            Acting | Verifying if f.action == MaintenanceAction::Reboot && !f.back_in_service => {
                Step::Wait
            }
            _ => Step::Release,
        };
    }
    if let Some(step) = rolling_back(&f) {
        return step;
    }
    let after_reboot = f.phase == Acting && f.rebooted;
    match f.host {
        HostState::Failed(step) if !after_reboot => return Step::HostFailed(step),
        HostState::Due(step) if !after_reboot && !f.back_in_service => {
            return Step::RunOnHost(step);
        }
        _ => {}
    }
    match (f.phase, f.action) {
        (Admitted, _) => Step::Prepare,
        (Draining, _) => Step::Drain,
        (Acting, MaintenanceAction::Reboot) if f.rebooted => Step::Verify,
        (Acting, MaintenanceAction::DrainOnly) if f.rebooted && f.goes_down_anyway => Step::Verify,
        (Acting, MaintenanceAction::Reboot) if f.host == HostState::NoReboot => Step::SkipReboot,
        (Acting, MaintenanceAction::Reboot | MaintenanceAction::PowerOff) => Step::Act,
        (Verifying, _) if f.healthy || f.back_in_service => match f.workloads {
            Workloads::NotNeeded | Workloads::Available | Workloads::TimedOut => Step::Complete,
            Workloads::TimedOutFailed => Step::WorkloadsFailed,
            Workloads::Waiting if f.back_in_service => Step::Wait,
            Workloads::Waiting => Step::ReturnToService,
        },
        (Verifying, _) if f.gate_expired => Step::GateFailed,
        _ => Step::Wait,
    }
}

/// The rollback's step, once it is under way or due: an updated node that failed its gate
/// (or its `afterBoot` hook) rolls back, reboots (asked like the action, once per boot) and is
/// judged again.
fn rolling_back(f: &Facts) -> Option<Step> {
    if f.phase != MaintenancePhase::Verifying {
        return None;
    }
    match f.rollback {
        rollback::Stage::None => None,
        rollback::Stage::Armed => {
            let passed = f.healthy || f.back_in_service;
            let gate_failed = f.gate_expired && f.host == HostState::Clear && !passed;
            // The hook runs before the gate judges (a node back in service has passed both):
            // its failure is the gate's, however healthy the node's conditions say it is.
            let hook_failed =
                f.host == HostState::Failed(HostStep::AfterBoot) && !f.back_in_service;
            (gate_failed || hook_failed).then_some(Step::Rollback(RollbackStep::Run))
        }
        rollback::Stage::Failed => Some(Step::Rollback(RollbackStep::Failed)),
        rollback::Stage::Ran => Some(Step::Act),
        rollback::Stage::Rebooted { verifying: false } => {
            Some(Step::Rollback(RollbackStep::Verify))
        }
        rollback::Stage::Rebooted { .. } if f.healthy => Some(Step::Rollback(RollbackStep::Passed)),
        rollback::Stage::Rebooted { .. } if f.gate_expired => {
            Some(Step::Rollback(RollbackStep::Failed))
        }
        rollback::Stage::Rebooted { .. } => Some(Step::Wait),
    }
}

/// Where the post-reboot health gate stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    Passed,
    /// Not yet, and why.
    Waiting(String),
    /// Not within the gate's timeout, and why.
    Expired(String),
}

impl Gate {
    /// Why it expired, when it did.
    pub fn expired(&self) -> Option<&str> {
        match self {
            Gate::Expired(why) => Some(why),
            _ => None,
        }
    }
}

/// Judges the gate: the node must be Ready with none of the gate's `problems` True, for
/// `hold`; `healthy_for` is how long it has been so (none: it is not), `waited` how long the
/// maintenance has been Verifying.
pub fn judge(
    ready: bool,
    problems: &[String],
    healthy_for: Option<Duration>,
    hold: Duration,
    waited: Duration,
    timeout: Option<Duration>,
) -> Gate {
    let why = if !ready {
        "the node is not Ready".to_owned()
    } else if !problems.is_empty() {
        format!("the node reports {}", problems.join(", "))
    } else {
        match healthy_for {
            Some(held) if held >= hold => return Gate::Passed,
            Some(held) => format!(
                "healthy for {}s of the {}s the gate asks",
                held.as_secs(),
                hold.as_secs()
            ),
            None => "not healthy yet".to_owned(),
        }
    };
    match timeout {
        Some(t) if waited >= t => Gate::Expired(format!(
            "the health gate did not pass within {}s after the reboot: {why}",
            t.as_secs()
        )),
        _ => Gate::Waiting(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MaintenanceAction::*;
    use MaintenancePhase::*;

    fn facts(phase: MaintenancePhase, action: MaintenanceAction) -> Facts {
        Facts {
            phase,
            action,
            deleting: false,
            finalized: true,
            rebooted: false,
            healthy: false,
            gate_expired: false,
            restore_asked: false,
            back_in_service: false,
            workloads: Workloads::NotNeeded,
            host: HostState::Clear,
            acted: false,
            goes_down_anyway: false,
            rollback: rollback::Stage::None,
        }
    }

    #[test]
    fn host_steps_come_before_what_their_phase_does_and_a_failed_one_fails_it() {
        let due = |phase, step| Facts {
            host: HostState::Due(step),
            ..facts(phase, Reboot)
        };
        assert_eq!(
            step(due(Draining, HostStep::BeforeDrain)),
            Step::RunOnHost(HostStep::BeforeDrain)
        );
        assert_eq!(
            step(due(Acting, HostStep::Update)),
            Step::RunOnHost(HostStep::Update)
        );
        assert_eq!(
            step(due(Verifying, HostStep::AfterBoot)),
            Step::RunOnHost(HostStep::AfterBoot)
        );
        let failed = Facts {
            host: HostState::Failed(HostStep::Update),
            ..facts(Acting, Reboot)
        };
        assert_eq!(step(failed), Step::HostFailed(HostStep::Update));
        let no_reboot = Facts {
            host: HostState::NoReboot,
            ..facts(Acting, Reboot)
        };
        assert_eq!(step(no_reboot), Step::SkipReboot);
        assert_eq!(
            step(facts(Acting, Reboot)),
            Step::Act,
            "the update wants it"
        );
        // After the reboot the Acting steps are history.
        let rebooted = Facts {
            rebooted: true,
            ..failed
        };
        assert_eq!(step(rebooted), Step::Verify);
        // Deleted while its update runs (nothing asked of logind yet): released; once the
        // reboot is asked, it finishes first.
        let deleted = Facts {
            deleting: true,
            ..due(Acting, HostStep::Update)
        };
        assert_eq!(step(deleted), Step::Release);
        assert_eq!(
            step(Facts {
                deleting: true,
                acted: true,
                ..facts(Acting, Reboot)
            }),
            Step::Wait
        );
    }

    #[test]
    fn a_healthy_reboot_that_evicted_pods_returns_to_service_and_waits_for_them() {
        let healthy = Facts {
            healthy: true,
            workloads: Workloads::Waiting,
            ..facts(Verifying, Reboot)
        };
        assert_eq!(step(healthy), Step::ReturnToService);
        let back = Facts {
            back_in_service: true,
            ..healthy
        };
        assert_eq!(step(back), Step::Wait, "back in service: only waiting now");
        // Back in service, the health gate is not judged again: a later wobble fails nothing.
        let wobbling = Facts {
            healthy: false,
            gate_expired: true,
            ..back
        };
        assert_eq!(step(wobbling), Step::Wait);
        for (workloads, then) in [
            (Workloads::Available, Step::Complete),
            (Workloads::TimedOut, Step::Complete),
            (Workloads::TimedOutFailed, Step::WorkloadsFailed),
        ] {
            assert_eq!(
                step(Facts {
                    workloads,
                    ..wobbling
                }),
                then,
                "{workloads:?}"
            );
        }
        assert_eq!(
            step(Facts {
                deleting: true,
                ..back
            }),
            Step::Release,
            "deleted while waiting for its workloads: released at once"
        );
        assert_eq!(
            step(Facts {
                workloads: Workloads::NotNeeded,
                ..healthy
            }),
            Step::Complete,
            "nothing evicted: done once healthy"
        );
        assert_eq!(
            step(Facts {
                healthy: false,
                ..healthy
            }),
            Step::Wait,
            "not healthy yet: the gate first"
        );
    }

    #[test]
    fn the_health_gate_passes_after_holding_and_expires_after_its_timeout() {
        let s = Duration::from_secs;
        assert_eq!(
            judge(true, &[], Some(s(10)), s(10), s(12), None),
            Gate::Passed
        );
        assert_eq!(
            judge(true, &[], Some(s(3)), s(10), s(5), Some(s(60))),
            Gate::Waiting("healthy for 3s of the 10s the gate asks".into())
        );
        assert_eq!(
            judge(false, &[], None, s(10), s(30), Some(s(60))),
            Gate::Waiting("the node is not Ready".into())
        );
        let problems = vec!["NetworkProblem".to_owned()];
        assert_eq!(
            judge(true, &problems, None, s(0), s(61), Some(s(60))),
            Gate::Expired(
                "the health gate did not pass within 60s after the reboot: the node reports NetworkProblem"
                    .into()
            )
        );
        assert!(
            matches!(
                judge(false, &[], None, s(0), s(600), None),
                Gate::Waiting(_)
            ),
            "no timeout: waits as long as it takes"
        );
        let expired = Facts {
            gate_expired: true,
            ..facts(Verifying, Reboot)
        };
        assert_eq!(step(expired), Step::GateFailed);
        assert_eq!(
            step(Facts {
                healthy: true,
                ..expired
            }),
            Step::Complete,
            "a gate that holds wins"
        );
    }

    #[test]
    fn an_updated_node_that_fails_its_gate_rolls_back_reboots_and_is_judged_again() {
        use rollback::Stage;
        let armed = Facts {
            rollback: Stage::Armed,
            ..facts(Verifying, Reboot)
        };
        assert_eq!(step(armed), Step::Wait, "the gate has time left");
        let expired = Facts {
            gate_expired: true,
            ..armed
        };
        assert_eq!(step(expired), Step::Rollback(RollbackStep::Run));
        assert_eq!(
            step(Facts {
                rollback: Stage::None,
                ..expired
            }),
            Step::GateFailed,
            "nothing to roll back: it fails as before"
        );
        assert_eq!(
            step(Facts {
                healthy: true,
                ..expired
            }),
            Step::Complete,
            "a gate that holds wins"
        );
        assert_eq!(
            step(Facts {
                host: HostState::Due(HostStep::AfterBoot),
                ..expired
            }),
            Step::RunOnHost(HostStep::AfterBoot),
            "its hook runs first"
        );
        let hook_failed = Facts {
            host: HostState::Failed(HostStep::AfterBoot),
            ..armed
        };
        assert_eq!(step(hook_failed), Step::Rollback(RollbackStep::Run));
        assert_eq!(
            step(Facts {
                healthy: true,
                ..hook_failed
            }),
            Step::Rollback(RollbackStep::Run),
            "a failed hook fails the gate, whatever the node's conditions (a gate without `for` \
             passes as soon as the node is Ready)"
        );
        // Once it ran, the failed hook and the expired gate of the updated boot are history.
        let ran = Facts {
            rollback: Stage::Ran,
            ..hook_failed
        };
        assert_eq!(step(ran), Step::Act, "the reboot into what it ran before");
        let back = Facts {
            rollback: Stage::Rebooted { verifying: false },
            ..ran
        };
        assert_eq!(step(back), Step::Rollback(RollbackStep::Verify));
        let judged = Facts {
            rollback: Stage::Rebooted { verifying: true },
            host: HostState::Clear,
            ..facts(Verifying, Reboot)
        };
        assert_eq!(step(judged), Step::Wait);
        assert_eq!(
            step(Facts {
                healthy: true,
                ..judged
            }),
            Step::Rollback(RollbackStep::Passed)
        );
        assert_eq!(
            step(Facts {
                gate_expired: true,
                ..judged
            }),
            Step::Rollback(RollbackStep::Failed)
        );
        assert_eq!(
            step(Facts {
                rollback: Stage::Failed,
                ..armed
            }),
            Step::Rollback(RollbackStep::Failed)
        );
        assert_eq!(
            step(Facts {
                deleting: true,
                ..ran
            }),
            Step::Wait,
            "deleted while rolling back: it finishes first"
        );
    }

    #[test]
    fn a_reboot_goes_prepare_drain_act_verify_complete() {
        let rebooted = Facts {
            rebooted: true,
            ..facts(Acting, Reboot)
        };
        let healthy = Facts {
            healthy: true,
            ..facts(Verifying, Reboot)
        };
        let course = [
            (facts(Pending, Reboot), Step::Wait),
            (facts(Admitted, Reboot), Step::Prepare),
            (facts(Draining, Reboot), Step::Drain),
            (facts(Acting, Reboot), Step::Act),
            (rebooted, Step::Verify),
            (facts(Verifying, Reboot), Step::Wait),
            (healthy, Step::Complete),
            (facts(Succeeded, Reboot), Step::Wait),
        ];
        for (at, (facts, next)) in course.into_iter().enumerate() {
            assert_eq!(step(facts), next, "step {at} of the course");
        }
    }

    #[test]
    fn drain_only_and_delete_node_wait_drained() {
        assert_eq!(step(facts(Acting, DrainOnly)), Step::Wait);
        assert_eq!(step(facts(Acting, DeleteNode)), Step::Wait);
        assert_eq!(step(facts(Acting, PowerOff)), Step::Act);
        // Drained ahead of a cloud's notice: the cloud's reboot or stop and start ends it.
        let noticed = Facts {
            goes_down_anyway: true,
            ..facts(Acting, DrainOnly)
        };
        assert_eq!(step(noticed), Step::Wait, "not down yet");
        let back = Facts {
            rebooted: true,
            ..noticed
        };
        assert_eq!(step(back), Step::Verify);
        assert_eq!(
            step(Facts {
                rebooted: true,
                ..facts(Acting, DrainOnly)
            }),
            Step::Wait,
            "an operator's DrainOnly holds through reboots until deleted"
        );
        let healthy = Facts {
            healthy: true,
            ..facts(Verifying, DrainOnly)
        };
        assert_eq!(step(healthy), Step::Complete);
    }

    #[test]
    fn deletion_cancels_before_the_action_and_releases_after() {
        let deleted = |phase, action| Facts {
            deleting: true,
            ..facts(phase, action)
        };
        assert_eq!(step(deleted(Draining, DrainOnly)), Step::Cancel);
        assert_eq!(step(deleted(Admitted, Reboot)), Step::Cancel);
        assert_eq!(step(deleted(Acting, DrainOnly)), Step::Release);
        assert_eq!(step(deleted(Succeeded, Reboot)), Step::Release);
        assert_eq!(
            step(deleted(Acting, Reboot)),
            Step::Wait,
            "a reboot under way finishes"
        );
        assert_eq!(
            step(Facts {
                finalized: false,
                ..deleted(Draining, DrainOnly)
            }),
            Step::Wait,
            "not ours to finalize"
        );
    }

    #[test]
    fn what_the_coordinator_sent_back_or_ended_is_restored_first() {
        let asked = |phase| Facts {
            restore_asked: true,
            ..facts(phase, Reboot)
        };
        for phase in [Pending, Failed, Succeeded, Cancelled] {
            assert_eq!(step(asked(phase)), Step::Restore, "{phase:?}");
            assert_eq!(
                step(Facts {
                    deleting: true,
                    ..asked(phase)
                }),
                Step::Restore,
                "before the deletion is handled: {phase:?}"
            );
        }
        assert_eq!(
            step(asked(Admitted)),
            Step::Prepare,
            "admitted again: it goes ahead"
        );
        assert_eq!(step(asked(Draining)), Step::Drain);
    }
}
