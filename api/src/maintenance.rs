//! `NodeMaintenance`: one planned disruption of one node, from request to completion.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::drain::DrainPlan;

/// One planned disruption of one node. Admins create it for a declarative drain, agents when
/// their node needs a reboot, the coordinator for remediation; the coordinator admits it under
/// the limits of every DisruptionPolicy matching the node, and the node's agent carries it out.
#[derive(CustomResource, Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[kube(
    group = "nodeward.io",
    version = "v1alpha1",
    kind = "NodeMaintenance",
    doc = "One planned disruption of one node (drain, then reboot, power off, delete or nothing), admitted by the coordinator and carried out by the node's agent.",
    plural = "nodemaintenances",
    shortname = "nm",
    category = "nodeward",
    status = "NodeMaintenanceStatus",
    selectable = ".spec.nodeName",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".spec.reason"),
    printcolumn(name = "Action", type_ = "string", json_path = ".spec.action"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Remaining",
        type_ = "integer",
        json_path = ".status.podsRemaining",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceSpec {
    /// The node to disrupt.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("nodeName is immutable; delete this NodeMaintenance and create a new one"))]
    pub node_name: String,
    /// Why the node is disrupted.
    #[x_kube(validation = Rule::new("self == oldSelf").message("reason is immutable; delete this NodeMaintenance and create a new one"))]
    pub reason: MaintenanceReason,
    /// What happens to the node once it is drained.
    #[x_kube(validation = Rule::new("self == oldSelf").message("action is immutable; delete this NodeMaintenance and create a new one"))]
    pub action: MaintenanceAction,
    /// Who or what asked for it (a user, `nodeward-agent` or `nodeward-coordinator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub requested_by: Option<String>,
    /// A human note shown in events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// Replaces the drain plan of the matching policies for this maintenance only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_plan: Option<DrainPlan>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaintenanceReason {
    /// The node needs a reboot (kernel or package update).
    Reboot,
    /// The node is unhealthy and is being repaired.
    Remediation,
    /// The node is being shut down.
    Shutdown,
    /// An admin asked for it.
    Manual,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaintenanceAction {
    /// Drain, reboot through logind, and wait for the health gate after boot.
    Reboot,
    /// Drain and power off (decommissioning).
    PowerOff,
    /// Drain and keep the node drained until this object is deleted.
    DrainOnly,
    /// Drain, then the coordinator deletes the Node object.
    DeleteNode,
}

#[derive(
    Serialize,
    Deserialize,
    JsonSchema,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
)]
pub enum MaintenancePhase {
    /// Waiting for admission.
    #[default]
    Pending,
    /// The coordinator reserved a slot in every matching policy.
    Admitted,
    /// The node is tainted and cordoned; pods are being evicted.
    Draining,
    /// The action (reboot, power off, delete) is under way.
    Acting,
    /// After the action: waiting for the health gate.
    Verifying,
    Succeeded,
    Failed,
    /// Deleted or withdrawn before the action; the cordon and taint were undone.
    Cancelled,
}

impl MaintenancePhase {
    /// Whether nothing more will happen to this maintenance (its slot can be freed).
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// Observed state of a NodeMaintenance.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    #[serde(default)]
    pub phase: MaintenancePhase,
    /// Every phase entered, in order, with its time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub history: Vec<PhaseTransition>,
    /// Which policies' budget slots the coordinator took, when, and as which leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionRecord>,
    /// Pods the drain has to evict in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_total: Option<i32>,
    /// Pods still on the node that the drain has to evict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_remaining: Option<i32>,
    /// Pods the drain cannot evict right now, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub blocking_pods: Vec<BlockingPod>,
    /// The node's boot id when the action started; a different one after means it rebooted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Whether nodeward cordoned the node (so only then does it uncordon it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned_by_nodeward: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Human summary of the last thing that happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransition {
    pub phase: MaintenancePhase,
    pub time: Time,
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRecord {
    /// Names of the DisruptionPolicies whose slots this maintenance holds.
    #[serde(default)]
    pub policies: Vec<String>,
    pub admitted_at: Time,
    /// Identity of the coordinator that admitted it (its Lease holder identity).
    pub admitted_by: String,
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BlockingPod {
    pub namespace: String,
    pub name: String,
    /// Short reason, e.g. `DisruptionBudget`, `EvictionError`, `Terminating`.
    pub reason: String,
    /// Details: the PodDisruptionBudget's name, or the error returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_terminal_phases_are_finished() {
        use MaintenancePhase::*;
        for phase in [Pending, Admitted, Draining, Acting, Verifying] {
            assert!(!phase.is_finished(), "{phase:?}");
        }
        for phase in [Succeeded, Failed, Cancelled] {
            assert!(phase.is_finished(), "{phase:?}");
        }
    }
}
