//! A round's plan as what it writes: an ordered list of effects, each one write (or, for the
//! budget slots and the denials, one batch the writer orders itself). The coordinator carries
//! them out one after another and counts what became of each.
//!
//! The order is a safety rule, not a convenience: the budget slots stand before the
//! admissions they hold; a slot is freed only after the denial or the return to Pending that
//! fences its admission was written; a node is changed after its maintenance ended.

use std::collections::BTreeMap;

use nodeward_api::DisruptionPolicyStatus;

use super::{
    Admission, DeadlineRecord, Denial, Ending, NodeDeletion, NodeEdit, OutOfService, Overdue,
    PendingTaint, Plan, RemediationRequest, StartupTimeout, Superseded, TakeOver, expire::Expired,
    surge, workload_gate::WorkloadVerdict,
};

/// One write of a round, borrowed from its [`Plan`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Effect<'a> {
    /// The budget slots into the policies' statuses (compare-and-swap), then the admissions
    /// whose slots all stood.
    Admit {
        slots: &'a BTreeMap<String, DisruptionPolicyStatus>,
        admissions: &'a [Admission],
    },
    /// The denials; the writer writes every fence, then what changed, then refreshes.
    Deny(&'a [Denial]),
    Surge(&'a surge::Work),
    WorkloadVerdict(&'a WorkloadVerdict),
    /// A maintenance whose node is gone, ended.
    End(&'a Ending),
    /// An older reboot request of a node, ended Failed.
    Supersede(&'a Superseded),
    Overdue(&'a Overdue),
    /// The slots of the admissions fenced above (denied, or back to Pending), freed.
    Release,
    RecordDeadline(&'a DeadlineRecord),
    TakeOver(&'a TakeOver),
    OutOfService(&'a OutOfService),
    PendingTaint(&'a PendingTaint),
    NodeEdit(&'a NodeEdit),
    DeleteNode(&'a NodeDeletion),
    StartupTimeout(&'a StartupTimeout),
    /// A node Ready after its startup timed out: `StartupTimedOut` set False.
    StartedLate(&'a str),
    Remediate(&'a RemediationRequest),
    /// A finished maintenance past the TTL, deleted.
    Expire(&'a Expired),
}

/// Every effect's name, in the order a round carries them out (the metrics' label values).
pub const EFFECTS: [&str; 18] = [
    "admit",
    "deny",
    "surge",
    "workloadVerdict",
    "end",
    "supersede",
    "overdue",
    "release",
    "recordDeadline",
    "takeOver",
    "outOfService",
    "pendingTaint",
    "nodeEdit",
    "deleteNode",
    "startupTimeout",
    "startedLate",
    "remediate",
    "expire",
];

impl Effect<'_> {
    /// Its name, one of [`EFFECTS`].
    pub fn name(&self) -> &'static str {
        match self {
            Self::Admit { .. } => "admit",
            Self::Deny(_) => "deny",
            Self::Surge(_) => "surge",
            Self::WorkloadVerdict(_) => "workloadVerdict",
            Self::End(_) => "end",
            Self::Supersede(_) => "supersede",
            Self::Overdue(_) => "overdue",
            Self::Release => "release",
            Self::RecordDeadline(_) => "recordDeadline",
            Self::TakeOver(_) => "takeOver",
            Self::OutOfService(_) => "outOfService",
            Self::PendingTaint(_) => "pendingTaint",
            Self::NodeEdit(_) => "nodeEdit",
            Self::DeleteNode(_) => "deleteNode",
            Self::StartupTimeout(_) => "startupTimeout",
            Self::StartedLate(_) => "startedLate",
            Self::Remediate(_) => "remediate",
            Self::Expire(_) => "expire",
        }
    }
}

impl Plan {
    /// What the plan writes, in the order it is written. The slots and the denials come
    /// first even when empty (a round that changes no slot still admits nothing without
    /// them), the release only when something may be fenced.
    pub fn effects(&self) -> Vec<Effect<'_>> {
        let mut effects = vec![
            Effect::Admit {
                slots: &self.policy_status,
                admissions: &self.admit,
            },
            Effect::Deny(&self.deny),
        ];
        effects.extend(self.surges.iter().map(Effect::Surge));
        effects.extend(self.workload_verdicts.iter().map(Effect::WorkloadVerdict));
        effects.extend(self.end.iter().map(Effect::End));
        effects.extend(self.superseded.iter().map(Effect::Supersede));
        effects.extend(self.overdue.iter().map(Effect::Overdue));
        let fences = self.deny.iter().any(|d| d.gives_back_slots)
            || self
                .overdue
                .iter()
                .any(|o| o.to == nodeward_api::MaintenancePhase::Pending);
        if fences {
            effects.push(Effect::Release);
        }
        effects.extend(self.deadlines.iter().map(Effect::RecordDeadline));
        effects.extend(self.take_over.iter().map(Effect::TakeOver));
        effects.extend(self.out_of_service.iter().map(Effect::OutOfService));
        effects.extend(self.pending_taints.iter().map(Effect::PendingTaint));
        effects.extend(self.node_edits.iter().map(Effect::NodeEdit));
        effects.extend(self.delete_nodes.iter().map(Effect::DeleteNode));
        effects.extend(self.startup_timeouts.iter().map(Effect::StartupTimeout));
        effects.extend(self.started_late.iter().map(|n| Effect::StartedLate(n)));
        effects.extend(self.remediate.iter().map(Effect::Remediate));
        effects.extend(self.expire.iter().map(Effect::Expire));
        effects
    }
}

#[cfg(test)]
mod tests {
    use nodeward_api::{MaintenanceAction, MaintenancePhase};

    use super::*;

    fn overdue(maintenance: &str, to: MaintenancePhase) -> Overdue {
        Overdue {
            maintenance: maintenance.into(),
            to,
            reason: "DeadlinePassed",
            message: String::new(),
        }
    }

    fn remediation() -> RemediationRequest {
        RemediationRequest {
            policy: "p".into(),
            node: "n".into(),
            action: MaintenanceAction::Reboot,
            message: String::new(),
            replaces: None,
        }
    }

    fn names(plan: &Plan) -> Vec<&'static str> {
        plan.effects().iter().map(Effect::name).collect()
    }

    #[test]
    fn an_empty_plan_writes_the_slots_and_the_denials_only() {
        assert_eq!(names(&Plan::default()), ["admit", "deny"]);
    }

    #[test]
    fn a_slot_is_freed_only_after_what_fences_it_and_nodes_change_after_their_maintenances_end() {
        let plan = Plan {
            overdue: vec![overdue("m1", MaintenancePhase::Pending)],
            end: vec![Ending {
                maintenance: "m2".into(),
                phase: MaintenancePhase::Failed,
                reason: "NodeDeleted",
                message: String::new(),
            }],
            pending_taints: vec![PendingTaint {
                node: "n1".into(),
                uid: "u1".into(),
                on: false,
            }],
            remediate: vec![remediation()],
            started_late: vec!["n3".into()],
            ..Plan::default()
        };
        assert_eq!(
            names(&plan),
            [
                "admit",
                "deny",
                "end",
                "overdue",
                "release",
                "pendingTaint",
                "startedLate",
                "remediate"
            ]
        );
    }

    #[test]
    fn nothing_to_fence_frees_no_slot() {
        let plan = Plan {
            overdue: vec![overdue("m1", MaintenancePhase::Failed)],
            ..Plan::default()
        };
        assert_eq!(names(&plan), ["admit", "deny", "overdue"]);
    }

    #[test]
    fn a_plan_with_every_kind_of_write_carries_them_out_in_the_order_named() {
        let denial = Denial {
            maintenance: "m".into(),
            rule: "budget",
            reason: "BudgetExhausted",
            message: String::new(),
            gives_back_slots: true,
        };
        let plan = Plan {
            deny: vec![denial],
            surges: vec![surge::Work {
                maintenance: "m".into(),
                node: "n".into(),
                surges: Vec::new(),
                raise: Vec::new(),
                restore: Vec::new(),
                finalizer: surge::Finalizer::Keep,
            }],
            workload_verdicts: vec![WorkloadVerdict {
                maintenance: "m".into(),
                status: "True",
                reason: "Available",
                message: String::new(),
            }],
            end: vec![Ending {
                maintenance: "m".into(),
                phase: MaintenancePhase::Failed,
                reason: "NodeDeleted",
                message: String::new(),
            }],
            superseded: vec![Superseded {
                maintenance: "m".into(),
                by: "m2".into(),
            }],
            overdue: vec![overdue("m", MaintenancePhase::Failed)],
            deadlines: vec![DeadlineRecord {
                maintenance: "m".into(),
                deadline: nodeward_api::maintenance::PhaseDeadline {
                    phase: MaintenancePhase::Draining,
                    since: None,
                    time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        jiff::Timestamp::UNIX_EPOCH,
                    ),
                    then: String::new(),
                },
            }],
            take_over: vec![TakeOver {
                maintenance: "m".into(),
                node: "n".into(),
                takeover: crate::deadlines::Takeover {
                    end_in: None,
                    restore: true,
                    unfinalize: true,
                },
                untaint: true,
                message: String::new(),
            }],
            out_of_service: vec![OutOfService {
                node: "n".into(),
                uid: "u".into(),
                on: true,
                message: String::new(),
            }],
            pending_taints: vec![PendingTaint {
                node: "n".into(),
                uid: "u".into(),
                on: true,
            }],
            node_edits: vec![NodeEdit {
                node: "n".into(),
                uid: "u".into(),
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
                marks: None,
            }],
            delete_nodes: vec![NodeDeletion {
                maintenance: "m".into(),
                node: "n".into(),
                uid: "u".into(),
            }],
            startup_timeouts: vec![StartupTimeout {
                node: "n".into(),
                uid: "u".into(),
                policy: "p".into(),
                message: String::new(),
                action: nodeward_api::policy::StartupAction::None,
                reported: false,
            }],
            started_late: vec!["n".into()],
            remediate: vec![remediation()],
            expire: vec![Expired {
                maintenance: "old".into(),
                uid: "u".into(),
                node: "n".into(),
            }],
            ..Plan::default()
        };
        assert_eq!(names(&plan), EFFECTS);
    }
}
