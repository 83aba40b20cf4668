//! The budget slots in the policies' status: written with the resourceVersion they were decided
//! on (a conditional write, so two coordinators can never both take a slot), and freed after a
//! withdrawn admission was fenced.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use kube::{Api, Resource, ResourceExt};
use nodeward_api::{DisruptionPolicy, DisruptionPolicyStatus};

use super::Controller;
use crate::metrics::Applied;
use nodeward_decide::round::Objects;
use nodeward_runtime::write::Outcome;

impl Controller {
    /// Writes each changed policy status with the resourceVersion of the version in
    /// `policies` (the one it was decided on). Returns the policies whose write failed (their
    /// new slots do not exist), and the worst of the writes.
    pub(super) async fn write_policies(
        &mut self,
        policies: &[Arc<DisruptionPolicy>],
        statuses: &BTreeMap<String, DisruptionPolicyStatus>,
    ) -> (BTreeSet<String>, Applied) {
        let api: Api<DisruptionPolicy> = Api::all(self.writer.client.clone());
        let mut failed = BTreeSet::new();
        let mut applied = Vec::new();
        for (name, status) in statuses {
            let Some(current) = policies.iter().find(|p| p.name_any() == *name) else {
                continue;
            };
            let mut updated = current.as_ref().clone();
            updated.status = Some(status.clone());
            let write = self
                .writer
                .changed
                .writing(&DisruptionPolicy::kind(&()), name);
            let outcome = nodeward_runtime::write::replace_status(&api, &updated).await;
            applied.push(Applied::of(&outcome));
            match outcome {
                Outcome::Written(written) => {
                    write.done(written.resource_version());
                    self.fresh_policies.record(current, written);
                }
                Outcome::Conflict(_) => {
                    self.writer.metrics.slot_conflicts.inc();
                    tracing::info!(policy = %name, "policy changed since it was read (another writer); deciding again");
                    failed.insert(name.clone());
                }
                Outcome::Gone(e) | Outcome::Failed(e) => {
                    tracing::warn!(error = %e, "budget write failed");
                    failed.insert(name.clone());
                }
            }
        }
        (failed, Applied::worst(applied))
    }

    /// Frees the budget slots of the maintenances (by uid) in `fenced`: half-done admissions
    /// whose denial, or maintenances whose return to Pending, was just written over the
    /// version decided on. That write is the fence: an admission write of the same
    /// maintenance still on its way from another coordinator (or decided on an older view)
    /// now fails with a conflict, so the slot can go without the maintenance ever running
    /// without one. A slot whose write fails stays; the next full round decides it again.
    pub(super) async fn release(
        &mut self,
        objects: &Objects,
        fenced: &BTreeSet<String>,
    ) -> Applied {
        if fenced.is_empty() {
            return Applied::Unchanged;
        }
        let mut policies = objects.policies.clone();
        self.fresh_policies.apply(&mut policies, false);
        let mut statuses = BTreeMap::new();
        for p in &policies {
            let Some(status) = p.status.as_ref() else {
                continue;
            };
            if status.slots.iter().any(|s| fenced.contains(&s.uid)) {
                let mut status = status.clone();
                status.slots.retain(|s| !fenced.contains(&s.uid));
                statuses.insert(p.name_any(), status);
            }
        }
        let (failed, applied) = self.write_policies(&policies, &statuses).await;
        tracing::info!(maintenances = ?fenced, ?failed, "slots of withdrawn admissions freed");
        // What was decided on no longer stands; a waiting maintenance may take the slot.
        self.standing = None;
        self.writer.changed.anything();
        applied
    }
}
