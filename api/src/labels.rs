//! Labels, annotations, taints, finalizers and field managers that nodeward reads or writes.

/// The API group of every nodeward resource.
pub const GROUP: &str = "nodeward.io";

/// Pods with this label set to [`DRAIN_SKIP`] are never evicted by a drain plan.
pub const DRAIN_LABEL: &str = "nodeward.io/drain";
pub const DRAIN_SKIP: &str = "skip";

/// Taint put on a node that is shutting down (set with the cordon, removed after boot).
pub const SHUTDOWN_TAINT: &str = "nodeward.io/shutdown";
/// How the shutdown guard's cordon is recorded in `nodeward.io/cordoned-by`.
pub const SHUTDOWN_CORDON_BY: &str = "shutdown";
/// Taint put on a node under an admitted NodeMaintenance.
pub const MAINTENANCE_TAINT: &str = "nodeward.io/maintenance";

/// Taint (`PreferNoSchedule`) on a node whose maintenance waits for admission, under a policy
/// with `taintWhilePending` (kured's `--prefer-no-schedule-taint`): pods evicted from the nodes
/// going now avoid the next ones. nodeward's alone; taken away once nothing waits.
pub const PENDING_TAINT: &str = "nodeward.io/maintenance-pending";

/// Node annotation recording, while a maintenance's `nodeLabels` are on the node, the values
/// the labels it changed had before (JSON: key to value, `null` for absent): what a failed or
/// cancelled maintenance puts back.
pub const LABELS_BEFORE_ANNOTATION: &str = "nodeward.io/labels-before";
/// Node annotation naming the maintenance under way (`nodeLabels.annotate`).
pub const IN_PROGRESS_ANNOTATION: &str = "nodeward.io/maintenance-in-progress";
/// Node annotation telling how and when the last maintenance ended (`nodeLabels.annotate`).
pub const LAST_MAINTENANCE_ANNOTATION: &str = "nodeward.io/last-maintenance";

/// What the other actors that disrupt nodes honour, put on a node while its maintenance is
/// under way (admitted until finished) so that none of them adds its disruption to nodeward's:
/// medik8s' NodeHealthCheck skips a node with this label (`"true"`) ...
pub const EXCLUDE_FROM_REMEDIATION_LABEL: &str = "remediation.medik8s.io/exclude-from-remediation";
/// ... the cluster autoscaler does not scale down a node with this annotation (`"true"`) ...
pub const SCALE_DOWN_DISABLED_ANNOTATION: &str =
    "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// ... and Karpenter does not voluntarily disrupt a node with this annotation (`"true"`).
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";
/// Node annotation recording which of those marks nodeward put on (comma-separated keys; empty
/// when all were there already): only those are taken off when the maintenance ends, so a mark
/// an admin set stays.
pub const MARKS_ANNOTATION: &str = "nodeward.io/marks";

/// Node annotation recording that nodeward (not an admin) cordoned the node, with the
/// maintenance or shutdown that did it, so that only nodeward's own cordon is undone.
pub const CORDONED_BY_ANNOTATION: &str = "nodeward.io/cordoned-by";

/// Kubernetes' non-graceful node shutdown taint: on a NotReady node it has pods force-deleted
/// and their volumes detached, so that stateful pods start elsewhere. Value and effect as
/// Kubernetes documents them.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
/// Node annotation recording that nodeward put [`OUT_OF_SERVICE_TAINT`] there (and why), so that
/// it removes only its own once the node is Ready again.
pub const OUT_OF_SERVICE_ANNOTATION: &str = "nodeward.io/out-of-service";

/// Label the agent puts on its own Node: peers probe only nodes that run an agent.
pub const AGENT_LABEL: &str = "nodeward.io/agent";

/// Label on NodeReports and NodeMaintenances naming the node they are about, for selectors.
pub const NODE_NAME_LABEL: &str = "nodeward.io/node";

/// The labels of an object about `node`: [`NODE_NAME_LABEL`] with its name, or none when the
/// name is longer than a label value may be (63): a truncated one could name another node.
pub fn naming_node(node: &str) -> Option<std::collections::BTreeMap<String, String>> {
    (node.len() <= 63).then(|| [(NODE_NAME_LABEL.to_owned(), node.to_owned())].into())
}

/// Finalizer that keeps a NodeMaintenance until its node's cordon and taint are undone.
pub const MAINTENANCE_FINALIZER: &str = "nodeward.io/maintenance";

/// Finalizer the coordinator keeps on a NodeMaintenance while a Deployment it surged is above
/// the replica count recorded in its status: a deleted maintenance keeps the record until
/// the count is restored.
pub const SURGE_FINALIZER: &str = "nodeward.io/surge";

/// Annotation on a Deployment (value `"true"`) asking that a drain raise it by one replica and
/// wait for the new one to be available before evicting its pod (single-replica Deployments).
pub const SURGE_ANNOTATION: &str = "nodeward.io/surge-before-evict";

/// Field managers for server-side apply; each program owns only its own fields.
pub const AGENT_FIELD_MANAGER: &str = "nodeward-agent";
pub const COORDINATOR_FIELD_MANAGER: &str = "nodeward-coordinator";

/// Well-known node labels nodeward reads.
pub const CONTROL_PLANE_ROLE_LABEL: &str = "node-role.kubernetes.io/control-plane";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// A host-mode agent authenticated by a client certificate is the user
/// `nodeward:agent:<node>` in the group [`AGENT_GROUP`] (as a kubelet is `system:node:<node>`
/// in `system:nodes`): the chart binds the group to the agent's roles, and its admission policy
/// and eviction webhook keep each such user to the node its name carries. Unlike a token bound
/// to the Node, such a credential needs no Node object, so the agent on a node whose kubelet
/// never registered can still report `KubeletUnregistered`.
pub const AGENT_USER_PREFIX: &str = "nodeward:agent:";
pub const AGENT_GROUP: &str = "nodeward:agents";
