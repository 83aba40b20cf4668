//! The deadlines the coordinator holds nodes' agents to (a policy's `deadlines`): whether a
//! node has an agent to carry a maintenance out at all, and what happens to a maintenance
//! whose agent did not move it on in time. Only the agent moves a maintenance forward, so
//! without these a dead agent or a node that never came back would hold its budget slot
//! forever. Pure functions over plain data.

use std::time::Duration;

use jiff::Timestamp;
use nodeward_api::{
    MaintenanceAction, MaintenancePhase, conditions::overdue, policy::ResolvedDeadlines,
};

/// Why no agent can carry a maintenance of this node out now (None: one can): its NodeReport
/// `heartbeat` is missing or older than `limit`.
pub fn agent_unavailable(
    node: &str,
    heartbeat: Option<Timestamp>,
    now: Timestamp,
    limit: Duration,
) -> Option<String> {
    let Some(beat) = heartbeat else {
        return Some(format!(
            "node {node} has no agent heartbeat (no NodeReport): nothing would carry the maintenance out"
        ));
    };
    let age = Duration::try_from(now.duration_since(beat)).unwrap_or(Duration::ZERO);
    (age > limit).then(|| {
        format!(
            "the agent of node {node} last wrote its heartbeat {}s ago (deadlines.agentHeartbeat {}s)",
            age.as_secs(),
            limit.as_secs()
        )
    })
}

/// A maintenance as its deadlines see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub phase: MaintenancePhase,
    pub action: MaintenanceAction,
    /// When it entered `phase`.
    pub since: Timestamp,
}

/// The deadline of a maintenance's current phase, and what the coordinator does at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    pub phase: MaintenancePhase,
    pub at: Timestamp,
    /// The phase it is moved to: Pending (sent back, its slots freed) or Failed.
    pub to: MaintenancePhase,
    /// The Event's and condition's reason (one of [`overdue`]).
    pub reason: &'static str,
    /// What happens, for the status.
    pub then: String,
    /// Why, once it has passed.
    pub message: String,
}

/// Whether a node's agent counts as lost at `now`: no heartbeat at all, or none for longer than
/// `limit` (`deadlines.agentLost`).
pub fn agent_lost(heartbeat: Option<Timestamp>, now: Timestamp, limit: Duration) -> bool {
    heartbeat.is_none_or(|beat| {
        Duration::try_from(now.duration_since(beat)).unwrap_or(Duration::ZERO) > limit
    })
}

/// The deadline that applies to `m` now, if any: Admitted must become Draining within
/// `start`; Draining must end within `drain`; a Reboot Acting must come back (the agent moves
/// it to Verifying on the new boot) within `reboot`; Verifying must end within `verify`. The
/// agent's own limits (drain timeout, health gate timeout) act first; a DrainOnly or PowerOff
/// Acting holds until deleted.
pub fn due(m: Progress, deadlines: ResolvedDeadlines) -> Option<Due> {
    let after = |limit: Duration| m.since.checked_add(limit).unwrap_or(m.since);
    match (m.phase, m.action) {
        (MaintenancePhase::Admitted, _) => Some(Due {
            phase: m.phase,
            at: after(deadlines.start),
            to: MaintenancePhase::Pending,
            reason: overdue::NOT_STARTED,
            then: format!("back to Pending ({})", overdue::NOT_STARTED),
            message: format!(
                "admitted, but the node's agent did not start draining within {}s (deadlines.start): back to Pending, its budget slots freed",
                deadlines.start.as_secs()
            ),
        }),
        (MaintenancePhase::Draining, _) => Some(Due {
            phase: m.phase,
            at: after(deadlines.drain),
            to: MaintenancePhase::Failed,
            reason: overdue::DRAIN_NOT_FINISHED,
            then: format!("Failed ({})", overdue::DRAIN_NOT_FINISHED),
            message: format!(
                "the node's agent neither finished nor failed its drain within {}s (deadlines.drain)",
                deadlines.drain.as_secs()
            ),
        }),
        (MaintenancePhase::Verifying, _) => Some(Due {
            phase: m.phase,
            at: after(deadlines.verify),
            to: MaintenancePhase::Failed,
            reason: overdue::NOT_VERIFIED,
            then: format!("Failed ({})", overdue::NOT_VERIFIED),
            message: format!(
                "the node's agent neither passed nor failed its health gate within {}s (deadlines.verify)",
                deadlines.verify.as_secs()
            ),
        }),
        (MaintenancePhase::Acting, MaintenanceAction::Reboot) => Some(Due {
            phase: m.phase,
            at: after(deadlines.reboot),
            to: MaintenancePhase::Failed,
            reason: overdue::NODE_DID_NOT_RETURN,
            then: format!("Failed ({})", overdue::NODE_DID_NOT_RETURN),
            message: format!(
                "the node did not come back from its reboot within {}s (deadlines.reboot); it counts against the budget while it is NotReady",
                deadlines.reboot.as_secs()
            ),
        }),
        _ => None,
    }
}

/// A maintenance as the coordinator sees it when its node's agent is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub phase: MaintenancePhase,
    pub action: MaintenanceAction,
    pub deleting: bool,
    /// The agent's finalizer is on it.
    pub finalized: bool,
    /// `NodeRestored=False`: it may have left its taint and cordon on the node.
    pub restore_asked: bool,
}

/// What the coordinator does in place of a lost agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Takeover {
    /// The phase it ends in (None: it has ended, or is going away as it is).
    pub end_in: Option<MaintenancePhase>,
    /// Undo the taint and cordon it may have left on the node.
    pub restore: bool,
    /// Remove the agent's finalizer, so that deleting it is not stuck.
    pub unfinalize: bool,
}

/// What the coordinator finishes for a maintenance whose node's agent is lost (silent for
/// `deadlines.agentLost`), or whose node is gone (`node_exists` false: nothing to restore), as
/// the agent would have: one under way fails (`AgentLost`), one being deleted is released, the
/// node is restored and the agent's finalizer removed. A drained `DrainOnly` holds on purpose
/// and a `DeleteNode` is the coordinator's to finish; neither needs the agent until deleted.
pub fn take_over(m: Held, node_exists: bool) -> Option<Takeover> {
    use MaintenancePhase::*;
    let (end_in, left_something) = match (m.phase, m.action) {
        (Pending, _) => (m.deleting.then_some(Cancelled), m.restore_asked),
        (Admitted | Draining, _) if m.deleting => (Some(Cancelled), true),
        (Acting, MaintenanceAction::DrainOnly | MaintenanceAction::DeleteNode) => {
            (None, m.deleting)
        }
        (Admitted | Draining | Acting | Verifying, _) => (Some(Failed), true),
        (Succeeded | Failed | Cancelled, _) => (None, m.restore_asked),
    };
    let takeover = Takeover {
        end_in,
        restore: left_something && node_exists,
        unfinalize: m.finalized && (end_in.is_some() || m.deleting || m.phase.is_finished()),
    };
    (takeover.end_in.is_some() || takeover.restore || takeover.unfinalize).then_some(takeover)
}

/// Whether a node deleted by a DeleteNode maintenance that finished at `deleted` still holds
/// its share of the budget at `now`, its replacement not yet given `replacement` to join.
pub fn awaiting_replacement(deleted: Timestamp, now: Timestamp, replacement: Duration) -> bool {
    deleted
        .checked_add(replacement)
        .is_ok_and(|until| now < until)
}

/// Whether `due` has passed at `now`.
pub fn passed(due: &Due, now: Timestamp) -> bool {
    now >= due.at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("in range")
    }

    fn defaults() -> ResolvedDeadlines {
        nodeward_api::policy::Deadlines::resolve(None)
    }

    #[test]
    fn an_agent_is_unavailable_without_a_report_or_with_a_stale_heartbeat() {
        let limit = Duration::from_secs(300);
        let missing = agent_unavailable("n1", None, t(1000), limit).expect("no report");
        assert!(missing.contains("no NodeReport"), "{missing}");
        assert_eq!(agent_unavailable("n1", Some(t(700)), t(1000), limit), None);
        let stale = agent_unavailable("n1", Some(t(699)), t(1000), limit).expect("stale");
        assert!(
            stale.contains("301s ago") && stale.contains("deadlines.agentHeartbeat 300s"),
            "{stale}"
        );
        assert_eq!(
            agent_unavailable("n1", Some(t(1010)), t(1000), limit),
            None,
            "a heartbeat ahead of the coordinator's clock is fresh"
        );
    }

    #[test]
    fn an_admitted_maintenance_goes_back_to_pending_after_the_start_deadline() {
        let m = Progress {
            phase: MaintenancePhase::Admitted,
            action: MaintenanceAction::Reboot,
            since: t(1000),
        };
        let due = due(m, defaults()).expect("Admitted has a deadline");
        assert_eq!(due.at, t(1600), "default start deadline 10m");
        assert_eq!(due.to, MaintenancePhase::Pending);
        assert_eq!(due.reason, overdue::NOT_STARTED);
        assert!(!passed(&due, t(1599)));
        assert!(passed(&due, t(1600)));
    }

    #[test]
    fn a_reboot_that_does_not_return_fails_after_the_reboot_deadline() {
        let deadlines = ResolvedDeadlines {
            reboot: Duration::from_secs(120),
            ..defaults()
        };
        let acting = Progress {
            phase: MaintenancePhase::Acting,
            action: MaintenanceAction::Reboot,
            since: t(1000),
        };
        let due = due(acting, deadlines).expect("a reboot under way has a deadline");
        assert_eq!((due.at, due.to), (t(1120), MaintenancePhase::Failed));
        assert_eq!(due.reason, overdue::NODE_DID_NOT_RETURN);
    }

    #[test]
    fn draining_and_verifying_have_the_coordinators_backstop() {
        let deadlines = ResolvedDeadlines {
            drain: Duration::from_secs(600),
            verify: Duration::from_secs(900),
            ..defaults()
        };
        for (phase, at, reason) in [
            (
                MaintenancePhase::Draining,
                1600,
                overdue::DRAIN_NOT_FINISHED,
            ),
            (MaintenancePhase::Verifying, 1900, overdue::NOT_VERIFIED),
        ] {
            let m = Progress {
                phase,
                action: MaintenanceAction::DrainOnly,
                since: t(1000),
            };
            let due = due(m, deadlines).expect("a deadline");
            assert_eq!(
                (due.at, due.to, due.reason),
                (t(at), MaintenancePhase::Failed, reason)
            );
        }
    }

    #[test]
    fn phases_that_hold_on_purpose_or_have_ended_have_no_deadline() {
        for (phase, action) in [
            (MaintenancePhase::Pending, MaintenanceAction::Reboot),
            (MaintenancePhase::Acting, MaintenanceAction::DrainOnly),
            (MaintenancePhase::Acting, MaintenanceAction::DeleteNode),
            (MaintenancePhase::Succeeded, MaintenanceAction::Reboot),
            (MaintenancePhase::Failed, MaintenanceAction::Reboot),
        ] {
            let m = Progress {
                phase,
                action,
                since: t(0),
            };
            assert_eq!(due(m, defaults()), None, "{phase:?} {action:?}");
        }
    }

    fn held(phase: MaintenancePhase, action: MaintenanceAction) -> Held {
        Held {
            phase,
            action,
            deleting: false,
            finalized: true,
            restore_asked: false,
        }
    }

    #[test]
    fn a_lost_agents_maintenance_under_way_fails_and_its_node_is_restored() {
        use MaintenanceAction::*;
        use MaintenancePhase::*;
        for phase in [Admitted, Draining, Acting, Verifying] {
            assert_eq!(
                take_over(held(phase, Reboot), true),
                Some(Takeover {
                    end_in: Some(Failed),
                    restore: true,
                    unfinalize: true
                }),
                "{phase:?}"
            );
        }
        assert_eq!(
            take_over(held(Draining, Reboot), false),
            Some(Takeover {
                end_in: Some(Failed),
                restore: false,
                unfinalize: true
            }),
            "a node that is gone has nothing to restore"
        );
    }

    #[test]
    fn what_holds_on_purpose_waits_until_it_is_deleted() {
        use MaintenanceAction::*;
        use MaintenancePhase::*;
        assert_eq!(take_over(held(Acting, DrainOnly), true), None);
        assert_eq!(take_over(held(Acting, DeleteNode), true), None);
        let deleted = Held {
            deleting: true,
            ..held(Acting, DrainOnly)
        };
        assert_eq!(
            take_over(deleted, true),
            Some(Takeover {
                end_in: None,
                restore: true,
                unfinalize: true
            }),
            "released as the agent would on deletion"
        );
    }

    #[test]
    fn an_ended_maintenance_is_restored_only_if_asked_and_loses_the_finalizer() {
        use MaintenanceAction::*;
        use MaintenancePhase::*;
        assert_eq!(
            take_over(held(Succeeded, Reboot), true),
            Some(Takeover {
                end_in: None,
                restore: false,
                unfinalize: true
            })
        );
        let asked = Held {
            restore_asked: true,
            finalized: false,
            ..held(Failed, Reboot)
        };
        assert_eq!(
            take_over(asked, true),
            Some(Takeover {
                end_in: None,
                restore: true,
                unfinalize: false
            })
        );
        let done = Held {
            finalized: false,
            ..held(Cancelled, Reboot)
        };
        assert_eq!(take_over(done, true), None, "nothing left to do");
        let pending = Held {
            finalized: false,
            ..held(Pending, Reboot)
        };
        assert_eq!(take_over(pending, true), None, "a pending one waits");
    }

    #[test]
    fn a_deleted_node_holds_its_share_until_its_replacement_had_time_to_join() {
        let ten_minutes = Duration::from_secs(600);
        assert!(awaiting_replacement(t(1000), t(1599), ten_minutes));
        assert!(!awaiting_replacement(t(1000), t(1600), ten_minutes));
        assert!(!awaiting_replacement(t(1000), t(1000), Duration::ZERO));
    }

    #[test]
    fn the_longest_deadline_of_several_policies_applies() {
        let short = ResolvedDeadlines {
            agent_heartbeat: Duration::from_secs(60),
            start: Duration::from_secs(900),
            reboot: Duration::from_secs(120),
            agent_lost: Duration::from_secs(7200),
            replacement: Duration::from_secs(60),
            drain: Duration::from_secs(60),
            verify: Duration::from_secs(7200),
        };
        let long = ResolvedDeadlines {
            agent_heartbeat: Duration::from_secs(600),
            start: Duration::from_secs(60),
            reboot: Duration::from_secs(3600),
            agent_lost: Duration::from_secs(60),
            replacement: Duration::ZERO,
            drain: Duration::from_secs(3600),
            verify: Duration::from_secs(60),
        };
        let both = ResolvedDeadlines::longest([short, long]);
        assert_eq!(
            both,
            ResolvedDeadlines {
                agent_heartbeat: Duration::from_secs(600),
                start: Duration::from_secs(900),
                reboot: Duration::from_secs(3600),
                agent_lost: Duration::from_secs(7200),
                replacement: Duration::from_secs(60),
                drain: Duration::from_secs(3600),
                verify: Duration::from_secs(7200),
            }
        );
        assert_eq!(ResolvedDeadlines::longest([]), defaults());
    }
}
