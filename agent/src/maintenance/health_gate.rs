//! The executor's post-reboot health gate: reads the node and judges it
//! ([`super::lifecycle::judge`]) under the gate that applies ([`crate::policies`]).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodeward_api::{MaintenancePhase, NodeMaintenance};
use nodeward_runtime::ApiError;

use super::{
    executor::Executor,
    lifecycle::{self, Gate},
};
use crate::policies;

impl Executor {
    /// Ready, and none of the gate's problem conditions True, for the gate's `for`; expired
    /// when that has not happened within the gate's `timeout` of entering Verifying. With it,
    /// while the node is healthy and the gate holds, how long until its `for` runs out.
    pub(super) async fn health_gate(
        &self,
        m: &NodeMaintenance,
        healthy_since: &mut Option<Timestamp>,
    ) -> Result<(Gate, Option<Duration>), crate::Error> {
        let gate = policies::effective(m, &self.policies).await.health_gate;
        let node = Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await
            .map_err(|e| ApiError::new("reading", format!("node {}", self.node), e))?;
        let ready = nodeward_api::node::is_ready(&node);
        let problems: Vec<String> = nodeward_api::node::conditions(&node)
            .iter()
            .filter(|c| c.status == "True" && gate.problem_types.contains(&c.type_))
            .map(|c| c.type_.clone())
            .collect();
        let now = Timestamp::now();
        let since = |t: Timestamp| Duration::try_from(now.duration_since(t)).unwrap_or_default();
        if !ready || !problems.is_empty() {
            *healthy_since = None;
        } else if healthy_since.is_none() {
            *healthy_since = Some(now);
        }
        let verifying_since = m.entered(MaintenancePhase::Verifying).map_or(now, |t| t.0);
        let held = healthy_since.map(since);
        let judged = lifecycle::judge(
            ready,
            &problems,
            held,
            gate.hold,
            since(verifying_since),
            gate.timeout,
        );
        let due_in = match judged {
            Gate::Waiting(_) => held.map(|held| gate.hold.saturating_sub(held)),
            _ => None,
        };
        Ok((judged, due_in))
    }
}
