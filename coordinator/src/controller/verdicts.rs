//! Writing the workload gate's verdicts ([`nodeward_decide::round::workload_gate`]) on Verifying
//! reboots: the `WorkloadsAvailable` condition their agents wait for, and an Event when the
//! verdict's reason changes.

use jiff::Timestamp;
use kube::runtime::events::EventType;
use nodeward_api::conditions::{maintenance::WORKLOADS_AVAILABLE, workloads as reasons};

use super::Controller;
use crate::metrics::Applied;
use nodeward_decide::round::{self, Objects, workload_gate::WorkloadVerdict};

impl Controller {
    /// Writes `verdict` (conditionally on the maintenance's version: a lost race is decided
    /// again in the next round).
    pub(super) async fn write_verdict(
        &self,
        objects: &Objects,
        verdict: &WorkloadVerdict,
    ) -> Applied {
        let Some(current) = Self::maintenance(objects, &verdict.maintenance) else {
            return Applied::Gone;
        };
        let before = current.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == WORKLOADS_AVAILABLE)
                .map(|c| c.reason.clone())
        });
        let generation = current.metadata.generation;
        let written = self
            .writer
            .write_maintenance(current, |status| {
                round::set_condition(
                    &mut status.conditions,
                    WORKLOADS_AVAILABLE,
                    verdict.status,
                    verdict.reason,
                    verdict.message.clone(),
                    generation,
                    Timestamp::now(),
                );
            })
            .await;
        if written.is_written() && before.as_deref() != Some(verdict.reason) {
            let type_ = match verdict.reason {
                reasons::TIMED_OUT | reasons::TIMED_OUT_FAILED => EventType::Warning,
                _ => EventType::Normal,
            };
            let reason = format!("Workloads{}", verdict.reason);
            self.writer
                .event(current.as_ref(), type_, &reason, verdict.message.clone());
        }
        written
    }
}
