//! `spec.gates`: conditions on cluster state that must hold before anything in a policy's
//! scope is admitted (a storage cluster healthy, a Deployment fully available), each a CEL
//! expression over one named object that the coordinator reads.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The most gates a policy has.
pub const GATES_LIMIT: usize = 16;
/// The longest gate expression, in characters.
pub const EXPRESSION_LIMIT: usize = 1024;

/// One gate: `expression` must be true of `object` (bound as `object`, the whole object as the
/// API server returns it) before a maintenance in scope is admitted.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Gate {
    /// Names the gate in denials and in the policy's status; unique within the policy.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// The object the expression reads. The coordinator needs `get` on its kind (the chart's
    /// `coordinator.gateReads`); a kind it may not read makes the policy invalid.
    pub object: GateObject,
    /// A CEL expression over `object` that is true when the next node may go, e.g.
    /// `object.status.ceph.health == "HEALTH_OK"` or
    /// `object.status.availableReplicas == object.spec.replicas`. False, an error (a field
    /// the object lacks) or an object that does not exist holds the rollout.
    #[schemars(length(min = 1, max = EXPRESSION_LIMIT))]
    pub expression: String,
}

/// An object by kind and name.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct GateObject {
    /// `v1`, or `group/version` (e.g. `apps/v1`, `ceph.rook.io/v1`).
    #[schemars(
        length(min = 1, max = 317),
        regex(pattern = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?v[0-9]+((alpha|beta)[0-9]+)?$")
    )]
    pub api_version: String,
    /// The kind, e.g. `Deployment`, `CephCluster`.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[A-Z][A-Za-z0-9]*$"))]
    pub kind: String,
    /// Its namespace; absent for a cluster-scoped kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
    /// Its name.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
}

impl std::fmt::Display for GateObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{} {namespace}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}
