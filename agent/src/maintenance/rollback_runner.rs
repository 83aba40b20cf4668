//! The executor's rollback steps ([`super::rollback`]): runs the rollback on the host after
//! the cause it undoes, records the boot after its reboot, and ends the maintenance
//! `RolledBack` or `RollbackFailed`.

use kube::api::ResourceExt;
use nodeward_api::{MaintenancePhase, NodeMaintenance, update::HostStep};

use super::{
    executor::{Executor, Seen, ThisBoot},
    lifecycle::RollbackStep,
    rollback,
};

impl Executor {
    /// Takes `step` of the rollback.
    pub(super) async fn rollback_step(
        &self,
        step: RollbackStep,
        m: &NodeMaintenance,
        seen: Seen<'_>,
        this_boot: &mut ThisBoot,
    ) -> Result<(), crate::Error> {
        match step {
            RollbackStep::Run => {
                let cause = rollback::cause(seen.gate.expired(), seen.runs);
                tracing::warn!(maintenance = %m.name_any(), %cause, "rolling back the update");
                let run = self
                    .run_on_host(m, HostStep::Rollback, Some(&cause))
                    .await?;
                this_boot.ended(m, run);
                Ok(())
            }
            RollbackStep::Verify => {
                this_boot.healthy_since = None;
                self.verify_rollback(m).await
            }
            RollbackStep::Passed => {
                let why = rollback::passed(seen.runs);
                self.fail(m, seen.applied, "RolledBack", why).await
            }
            RollbackStep::Failed => {
                let why = rollback::failed(seen.gate.expired(), seen.runs);
                self.fail(m, seen.applied, "RollbackFailed", why).await
            }
        }
    }

    /// Back after the rollback's reboot: Verifying again, so that the gate judges this boot
    /// from now, with what the node runs now recorded.
    async fn verify_rollback(&self, m: &NodeMaintenance) -> Result<(), crate::Error> {
        let after = self.versions().await;
        let message = "rolled back and rebooted; waiting for the health gate on what the node ran before the update";
        self.transition(m, MaintenancePhase::Verifying, message, |s, _| {
            s.versions_after = after;
        })
        .await?;
        self.normal_event(
            m,
            "RolledBackRebooted",
            format!("{message} (boot id {})", self.boot_id),
        )
        .await;
        Ok(())
    }
}
