//! The node goes back into service: while a reboot waits for the workloads it evicted (see
//! [`super::workloads`]), once its maintenance is deleted, and after the coordinator moved a
//! maintenance on without this agent.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{ResourceExt, runtime::reflector};
use nodeward_api::node::Applied;
use nodeward_api::{
    MaintenancePhase, NodeMaintenance, conditions::maintenance as maintenance_conditions,
    labels::MAINTENANCE_TAINT,
};
use nodeward_runtime::cordon;

use crate::notify::NoticeKind;

use super::{
    executor::Executor,
    workloads::{BACK_IN_SERVICE, back_in_service_condition, verdict},
};

impl Executor {
    /// Healthy after the reboot but the workloads it evicted are short: the node goes back
    /// into service (so that they may come back to it too) while the maintenance, and its
    /// slot, wait for them.
    pub(super) async fn return_to_service(
        &self,
        m: &NodeMaintenance,
        applied: &Applied,
    ) -> Result<(), crate::Error> {
        cordon::undo(&self.client, &self.node, MAINTENANCE_TAINT, applied).await?;
        self.set_condition(m, back_in_service_condition(m)).await?;
        self.normal_event(
            m,
            BACK_IN_SERVICE,
            format!(
                "{}: back in service; waiting for the evicted workloads ({})",
                super::workloads::healthy_after(m),
                verdict(m)
            ),
        )
        .await;
        Ok(())
    }

    /// Undoes what `m` left on the node after the coordinator sent it back or ended it: its
    /// cordon if the node's record names it, the taint unless another maintenance of this node
    /// holds the node; then `NodeRestored=True`.
    pub(super) async fn restore(
        &self,
        m: &NodeMaintenance,
        store: &reflector::Store<NodeMaintenance>,
    ) -> Result<(), crate::Error> {
        let others_hold = store.state().iter().any(|other| {
            other.uid() != m.uid()
                && matches!(
                    other.phase(),
                    MaintenancePhase::Draining
                        | MaintenancePhase::Acting
                        | MaintenancePhase::Verifying
                )
        });
        let by = format!("maintenance/{}", m.name_any());
        cordon::undo_left_by(
            &self.client,
            &self.node,
            MAINTENANCE_TAINT,
            &by,
            !others_hold,
        )
        .await?;
        let condition = Condition {
            type_: maintenance_conditions::NODE_RESTORED.to_owned(),
            status: "True".to_owned(),
            reason: "Restored".to_owned(),
            message: "the agent undid the taint and cordon this maintenance left".to_owned(),
            observed_generation: m.metadata.generation,
            last_transition_time: Time(Timestamp::now()),
        };
        self.set_condition(m, condition).await?;
        self.normal_event(
            m,
            "Restored",
            format!(
                "{:?} without this agent: the taint and cordon it left are undone",
                m.phase()
            ),
        )
        .await;
        Ok(())
    }

    /// Deleted after it ended: the node's taint and cordon undone, the finalizer removed.
    pub(super) async fn release(
        &self,
        m: &NodeMaintenance,
        applied: &Applied,
    ) -> Result<(), crate::Error> {
        cordon::undo(&self.client, &self.node, MAINTENANCE_TAINT, applied).await?;
        self.normal_event(
            m,
            "Restored",
            "the maintenance is deleted; taint and cordon undone",
        )
        .await;
        self.notify(m, NoticeKind::Restored, "the maintenance is deleted");
        self.finalizer(m, false).await
    }
}
