//! What the coordinator writes of a DisruptionPolicy: its budget slots and counts, the nodes
//! other actors disrupt, rollout risks and conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Observed state of a DisruptionPolicy.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionPolicyStatus {
    /// Budget slots held by admitted, unfinished maintenances. Written only with a
    /// resourceVersion precondition so that concurrent coordinators cannot overbook.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = SLOTS_LIMIT))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["maintenance"]))]
    pub slots: Vec<BudgetSlot>,
    /// Nodes the selector matches.
    #[serde(default)]
    pub matched: i32,
    #[serde(default)]
    pub ready: i32,
    #[serde(default)]
    pub unhealthy: i32,
    /// Matched nodes with an admitted, unfinished maintenance.
    #[serde(default)]
    pub in_maintenance: i32,
    /// Matched nodes another actor is disrupting (cordoned by someone else, being removed by
    /// the cluster autoscaler or Karpenter, fenced by medik8s): each holds a slot of this
    /// budget as a maintenance does.
    #[serde(default)]
    pub disrupted_by_others: i32,
    /// The first [`OTHER_DISRUPTIONS_LIMIT`] of them, with who disrupts each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = OTHER_DISRUPTIONS_LIMIT))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["nodeName"]))]
    pub other_disruptions: Vec<OtherDisruption>,
    /// Where the matched nodes stand in patching, each counted once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Single-replica Deployments that the drains of this policy's pending maintenances
    /// would take out of service (no surge asked for), the first [`ROLLOUT_RISKS_LIMIT`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = ROLLOUT_RISKS_LIMIT))]
    pub rollout_risks: Vec<RolloutRisk>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::bounds::conditions")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The most nodes disrupted by other actors a policy status lists.
pub const OTHER_DISRUPTIONS_LIMIT: usize = 32;

/// A node another actor is disrupting.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct OtherDisruption {
    #[schemars(length(max = 253))]
    pub node_name: String,
    /// Who, and what on the Node tells it (e.g. `karpenter (taint karpenter.sh/disrupted)`).
    #[schemars(length(max = 256))]
    pub by: String,
}

/// The most failed nodes a policy's progress names.
pub const FAILED_NODES_LIMIT: usize = 32;

/// The matched nodes by where they stand in patching (planned reboots: reason Reboot or
/// Manual, action Reboot). Each node is counted once, in the first that applies: in progress,
/// pending, failed, updated.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Nothing left that nodeward knows of: no planned reboot waiting or under way, the last
    /// one this policy admitted did not fail, no `RebootRequired`, no updates pending in its
    /// NodeReport's inventory.
    #[serde(default)]
    pub updated: i32,
    /// A planned reboot admitted and not finished.
    #[serde(default)]
    pub in_progress: i32,
    /// A planned reboot waiting for admission, or the node reports `RebootRequired` or
    /// updates pending.
    #[serde(default)]
    pub pending: i32,
    /// The last planned reboot this policy admitted failed, and none waits.
    #[serde(default)]
    pub failed: i32,
    /// The first [`FAILED_NODES_LIMIT`] failed nodes, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = FAILED_NODES_LIMIT), inner(length(max = 253)))]
    pub failed_nodes: Vec<String>,
}

/// The most rollout risks a policy status lists.
pub const ROLLOUT_RISKS_LIMIT: usize = 32;

/// A Deployment whose only replica runs on a node waiting for maintenance.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct RolloutRisk {
    #[schemars(length(max = 63))]
    pub namespace: String,
    #[schemars(length(max = 253))]
    pub deployment: String,
    /// The node whose drain would evict it.
    #[schemars(length(max = 253))]
    pub node_name: String,
}

/// The most slots a policy holds: its `maxConcurrent` at 100% of the largest cluster
/// Kubernetes supports (5,000 nodes), twice over.
pub const SLOTS_LIMIT: usize = 10_000;

/// One admitted maintenance holding part of a policy's budget.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BudgetSlot {
    /// Name of the NodeMaintenance.
    #[schemars(length(max = 253))]
    pub maintenance: String,
    /// Its uid, so that a re-created object of the same name does not inherit the slot.
    #[schemars(length(max = 64))]
    pub uid: String,
    #[schemars(length(max = 253))]
    pub node_name: String,
    pub admitted_at: Time,
}
