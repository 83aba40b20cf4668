//! The deadlines of admitted maintenances ([`crate::deadlines`]): each one's deadline in its
//! current phase is recorded in its status, and one whose deadline passed is moved on by the
//! coordinator (back to Pending, or Failed), since its agent did not.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use nodeward_api::{MaintenancePhase, maintenance::PhaseDeadline};

use super::{DeadlineRecord, Overdue, Plan, view::Index};
use crate::deadlines::{self, Progress};

/// Records or enforces the deadline of every maintenance in a phase that has one.
pub(super) fn enforce(index: &Index, now: Timestamp, plan: &mut Plan) {
    for m in index.maintenances.values() {
        let phase = m.phase();
        // A maintenance whose node is gone ends another way (see `slots::end_where_node_gone`).
        if phase.is_finished()
            || phase == MaintenancePhase::Pending
            || !index.nodes.contains_key(m.spec.node_name.as_str())
        {
            continue;
        }
        let Some(since) = m.entered(phase).map(|t| t.0) else {
            continue;
        };
        let progress = Progress {
            phase,
            action: m.spec.action,
            since,
        };
        let Some(due) = deadlines::due(progress, index.deadlines_of(m.admitted_policies())) else {
            continue;
        };
        if deadlines::passed(&due, now) {
            plan.overdue.push(Overdue {
                maintenance: m.name_any(),
                to: due.to,
                reason: due.reason,
                message: due.message,
            });
            continue;
        }
        let record = PhaseDeadline {
            phase,
            time: Time(due.at),
            then: due.then,
        };
        let recorded = m.status.as_ref().and_then(|s| s.deadline.as_ref());
        if !recorded.is_some_and(|r| same(r, &record)) {
            plan.deadlines.push(DeadlineRecord {
                maintenance: m.name_any(),
                deadline: record,
            });
        }
    }
}

/// Equal to the second (a status keeps times to the second).
fn same(a: &PhaseDeadline, b: &PhaseDeadline) -> bool {
    a.phase == b.phase && a.then == b.then && a.time.0.as_second() == b.time.0.as_second()
}
