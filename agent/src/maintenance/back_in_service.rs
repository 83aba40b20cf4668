//! The node goes back into service while a reboot waits for the workloads it evicted (see
//! [`super::workloads`]).

use nodeward_api::node::Applied;
use nodeward_api::{NodeMaintenance, labels::MAINTENANCE_TAINT};
use nodeward_runtime::cordon;

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
                "healthy after the reboot: back in service; waiting for the evicted workloads ({})",
                verdict(m)
            ),
        )
        .await;
        Ok(())
    }
}
