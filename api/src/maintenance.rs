//! `NodeMaintenance`: one planned disruption of one node, from request to completion.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    drain::DrainPlan,
    update::{Hooks, HostRun, Update},
};

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
#[x_kube(validation = Rule::new("!has(self.update) || self.action == 'Reboot'").message("update runs before a reboot: it needs action Reboot"))]
#[x_kube(validation = Rule::new("has(self.update) == has(oldSelf.update) && (!has(self.update) || self.update == oldSelf.update)").message("update is immutable; delete this NodeMaintenance and create a new one"))]
#[x_kube(validation = Rule::new("has(self.hooks) == has(oldSelf.hooks) && (!has(self.hooks) || self.hooks == oldSelf.hooks)").message("hooks are immutable; delete this NodeMaintenance and create a new one"))]
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
    #[schemars(length(max = SPEC_MESSAGE_LIMIT))]
    pub message: Option<String>,
    /// Replaces the drain plan of the matching policies for this maintenance only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_plan: Option<DrainPlan>,
    /// The update run once the node is drained, before the reboot (a Reboot maintenance
    /// only); replaces the policies' `update` for this maintenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<Update>,
    /// Host commands around this maintenance; replace the policies' `hooks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<Hooks>,
    /// When the node goes down whatever nodeward decides: a cloud provider's notice (a spot
    /// interruption, a scheduled stop or reboot). The coordinator admits such a maintenance
    /// ahead of the others and without waiting for a window, a blocker, a
    /// PodDisruptionBudget, the control plane's quorum or a free budget slot (the disruption
    /// comes anyway, and a drain first is gentler); it still counts in every budget, so
    /// nodeward starts nothing else while they are full. Only `paused` holds it. A `DrainOnly`
    /// maintenance with it ends once the node has booted again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("disruptionDeadline is immutable; delete this NodeMaintenance and create a new one"))]
    pub disruption_deadline: Option<Time>,
    /// An emergency (a patch for an exploited flaw): the coordinator admits it ahead of the
    /// other pending maintenances and without waiting for a maintenance window or a reboot
    /// blocker; never past a budget, a PodDisruptionBudget, the control plane's quorum, a
    /// blackout, a halted rollout or a pause. Agents may not ask for one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub urgent: bool,
}

#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
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

    /// Whether a maintenance in this phase holds its node disrupted (and a budget slot).
    pub fn is_active(self) -> bool {
        matches!(
            self,
            Self::Admitted | Self::Draining | Self::Acting | Self::Verifying
        )
    }
}

/// The most phase transitions a status keeps (the CRD's `maxItems` for `history`): the oldest
/// go first.
pub const HISTORY_LIMIT: usize = 16;

/// The longest note a maintenance's `spec.message` takes (the CRD's `maxLength`).
pub const SPEC_MESSAGE_LIMIT: usize = 1024;

impl NodeMaintenance {
    /// A maintenance of `node` as nodeward's own parts ask for one, labelled with the node's
    /// name for selectors ([`crate::labels::naming_node`]).
    pub fn request(
        name: &str,
        node: &str,
        reason: MaintenanceReason,
        action: MaintenanceAction,
        requested_by: &str,
        message: String,
    ) -> Self {
        let mut maintenance = Self::new(
            name,
            NodeMaintenanceSpec {
                node_name: node.to_owned(),
                reason,
                action,
                requested_by: Some(requested_by.to_owned()),
                message: Some(message),
                drain_plan: None,
                update: None,
                hooks: None,
                disruption_deadline: None,
                urgent: false,
            },
        );
        maintenance.metadata.labels = crate::labels::naming_node(node);
        maintenance
    }

    /// Its phase (Pending until a status says otherwise).
    pub fn phase(&self) -> MaintenancePhase {
        self.status.as_ref().map(|s| s.phase).unwrap_or_default()
    }

    /// Its status's message (empty before one).
    pub fn message(&self) -> &str {
        self.status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .unwrap_or_default()
    }

    /// Its status's conditions (none before a status).
    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map_or(&[], |s| s.conditions.as_slice())
    }

    /// Whether it holds its node disrupted: see [`MaintenancePhase::is_active`].
    pub fn is_active(&self) -> bool {
        self.phase().is_active()
    }

    /// The policies whose slots it holds (none before admission).
    pub fn admitted_policies(&self) -> &[String] {
        self.status
            .as_ref()
            .and_then(|s| s.admission.as_ref())
            .map_or(&[], |a| a.policies.as_slice())
    }

    /// When it last entered `phase`, as its history tells.
    pub fn entered(&self, phase: MaintenancePhase) -> Option<&Time> {
        let history = &self.status.as_ref()?.history;
        history
            .iter()
            .rev()
            .find(|h| h.phase == phase)
            .map(|h| &h.time)
    }
}

impl NodeMaintenanceStatus {
    /// Moves to `phase` at `now`, recording it in the history (capped at [`HISTORY_LIMIT`]).
    pub fn enter(&mut self, phase: MaintenancePhase, now: Time) {
        self.phase = phase;
        self.history = entered(&self.history, phase, now);
    }

    /// Counts one more admission withdrawn ([`Self::admissions_withdrawn`]).
    pub fn withdraw_admission(&mut self) {
        self.admissions_withdrawn = Some(self.admissions_withdrawn.unwrap_or(0).saturating_add(1));
    }
}

/// `history` with `phase` entered at `now` appended, capped at [`HISTORY_LIMIT`].
fn entered(
    history: &[PhaseTransition],
    phase: MaintenancePhase,
    now: Time,
) -> Vec<PhaseTransition> {
    let keep = history.len().saturating_sub(HISTORY_LIMIT - 1);
    let mut history = history[keep..].to_vec();
    history.push(PhaseTransition { phase, time: now });
    history
}

/// A merge patch of a NodeMaintenance's status that writes only the fields set, for the
/// agent, which shares the status with the coordinator (the coordinator's admission record
/// and `Admitted` condition stay as they are).
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<MaintenancePhase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<PhaseTransition>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods_total: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods_remaining: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocking_pods: Option<Vec<BlockingPod>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evicted_workloads: Option<Vec<WorkloadRef>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cordoned_by_nodeward: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versions_before: Option<crate::inventory::Inventory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versions_after: Option<crate::inventory::Inventory>,
    /// A merge patch replaces the whole list: set through [`StatusPatch::condition`], which
    /// keeps the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// The most blocking pods a status lists (the CRD's `maxItems`).
pub const BLOCKING_PODS_LIMIT: usize = 64;

impl StatusPatch {
    /// Moves `current` to `phase` at `now` with `message`.
    pub fn enter(
        current: &NodeMaintenance,
        phase: MaintenancePhase,
        message: &str,
        now: Time,
    ) -> Self {
        let history = current
            .status
            .as_ref()
            .map(|s| s.history.as_slice())
            .unwrap_or_default();
        Self {
            phase: Some(phase),
            history: Some(entered(history, phase, now)),
            message: Some(crate::bounds::cut(message, crate::bounds::MESSAGE_LIMIT)),
            ..Self::default()
        }
    }

    /// A drain's progress: pods in all, still there, and those blocking (the first
    /// [`BLOCKING_PODS_LIMIT`]).
    pub fn progress(total: usize, remaining: usize, blocking: &[BlockingPod]) -> Self {
        let count = |n: usize| Some(i32::try_from(n).unwrap_or(i32::MAX));
        Self {
            pods_total: count(total),
            pods_remaining: count(remaining),
            blocking_pods: Some(blocking.iter().take(BLOCKING_PODS_LIMIT).cloned().collect()),
            ..Self::default()
        }
    }

    /// Adds `workloads` to the evicted workloads `current` records (each once, the first
    /// [`EVICTED_WORKLOADS_LIMIT`]): a drain resumed after a restart keeps the earlier ones.
    pub fn evicted(mut self, current: &NodeMaintenance, workloads: &[WorkloadRef]) -> Self {
        let mut all = current
            .status
            .as_ref()
            .map(|s| s.evicted_workloads.clone())
            .unwrap_or_default();
        for w in workloads {
            if !all.contains(w) && all.len() < EVICTED_WORKLOADS_LIMIT {
                all.push(w.clone());
            }
        }
        self.evicted_workloads = Some(all);
        self
    }

    /// Sets `condition` on `current`'s conditions, keeping the others and, while its status
    /// stays the same, its transition time.
    pub fn condition(mut self, current: &NodeMaintenance, condition: Condition) -> Self {
        let mut conditions = current
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        crate::conditions::set(&mut conditions, condition);
        self.conditions = Some(conditions);
        self
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
    #[schemars(length(max = HISTORY_LIMIT))]
    pub history: Vec<PhaseTransition>,
    /// Which policies' budget slots the coordinator took, when, and as which leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionRecord>,
    /// How many times the coordinator withdrew an admission of this maintenance (a deadline
    /// passed before its agent started, or a half-done admission no longer fit). Each
    /// withdrawal is written before its budget slots are freed: the write changes the
    /// object, so an admission write still on its way, made over the version before, fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("admissionsWithdrawn counts withdrawals: 0 or more"))]
    pub admissions_withdrawn: Option<i32>,
    /// The deadline the coordinator holds this maintenance to in its current phase: what it
    /// does if the maintenance is still in `phase` at `time` (see the policy's `deadlines`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<PhaseDeadline>,
    /// Pods the drain has to evict in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_total: Option<i32>,
    /// Pods still on the node that the drain has to evict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_remaining: Option<i32>,
    /// Pods the drain cannot evict right now, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = BLOCKING_PODS_LIMIT))]
    pub blocking_pods: Vec<BlockingPod>,
    /// The controllers of the pods the drain evicted (the first [`EVICTED_WORKLOADS_LIMIT`]):
    /// with the policy's `workloadGate.waitForEvicted`, a reboot finishes only once they are
    /// available again (`WorkloadsAvailable`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = EVICTED_WORKLOADS_LIMIT))]
    pub evicted_workloads: Vec<WorkloadRef>,
    /// Single-replica Deployments opted in to surge before their pods here are evicted
    /// (`nodeward.io/surge-before-evict`): the coordinator plans them at admission, raises
    /// each by one once the node is cordoned, and restores the count it recorded here; the
    /// drain holds their pods until the surge is available. Written by the coordinator only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = SURGES_LIMIT))]
    pub surges: Vec<Surge>,
    /// The node's boot id when the action started; a different one after means it rebooted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub boot_id: Option<String>,
    /// Whether nodeward cordoned the node (so only then does it uncordon it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned_by_nodeward: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// What the node ran when it was taken out of service (its agent's last inventory then):
    /// OS image, kernel, the packages its agent is asked about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions_before: Option<crate::inventory::Inventory>,
    /// What it ran once the action was over (read after the reboot, or after an update that
    /// needed none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions_after: Option<crate::inventory::Inventory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Why it ended, in one word (the reason of its last Event): `Succeeded`, `Cancelled`,
    /// or what failed, e.g. `DrainFailed`, `UpdateFailed`, `HealthGateFailed`, `RolledBack`,
    /// `RollbackFailed`, `NodeDidNotReturn`, `AgentLost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub reason: Option<String>,
    /// Human summary of the last thing that happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::MESSAGE_LIMIT))]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::bounds::conditions")]
    pub conditions: Vec<Condition>,
    /// The hooks and the update as they ran on the host, one per step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::update::host_runs")]
    pub host_runs: Vec<HostRun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransition {
    pub phase: MaintenancePhase,
    pub time: Time,
}

/// A deadline of one phase, as the coordinator enforces it.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PhaseDeadline {
    pub phase: MaintenancePhase,
    /// When the coordinator first saw the maintenance in `phase` (for Admitted, when it
    /// admitted it): deadlines run on the coordinator's own clock, never on the history the
    /// agent writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    pub time: Time,
    /// What happens then, e.g. `back to Pending (NotStarted)`.
    #[schemars(length(max = 256))]
    pub then: String,
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRecord {
    /// Names of the DisruptionPolicies whose slots this maintenance holds.
    #[serde(default)]
    #[schemars(length(max = 128), inner(length(max = 253)))]
    pub policies: Vec<String>,
    pub admitted_at: Time,
    /// Identity of the coordinator that admitted it (its Lease holder identity).
    #[schemars(length(max = 253))]
    pub admitted_by: String,
    /// The uid of the Node it was admitted for: a Node re-created under the same name is
    /// another machine, which this maintenance no longer concerns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub node_uid: Option<String>,
}

/// The most surges a status lists (the CRD's `maxItems`).
pub const SURGES_LIMIT: usize = 16;
/// The most pods one surge goes before.
pub const SURGE_PODS_LIMIT: usize = 8;

/// One Deployment raised by one replica before its pods on the node are evicted.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Surge {
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// The Deployment's name.
    #[schemars(length(max = 253))]
    pub deployment: String,
    /// Its pods on the node, which the drain holds until the surge is available.
    #[serde(default)]
    #[schemars(length(max = SURGE_PODS_LIMIT), inner(length(max = 253)))]
    pub pods: Vec<String>,
    pub state: SurgeState,
    /// The replica count before the surge, recorded before it is raised: what is restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Why it is in this state (how many are available, why it was skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::MESSAGE_LIMIT))]
    pub message: Option<String>,
}

/// Where a surge is: `Planned` → `Surging` → `Ready` → `Restored`, or `Skipped`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SurgeState {
    /// Planned at admission; raised once the node is cordoned. The drain holds its pods.
    Planned,
    /// Raised by one; waiting for the new replica to be available. The drain holds its pods.
    Surging,
    /// The new replica is available: the drain may evict.
    Ready,
    /// Back to the recorded count (or left as someone else set it, said in the message).
    Restored,
    /// Not raised (the drain ended first, the Deployment changed or is gone): its pods are
    /// drained as any other.
    Skipped,
}

impl SurgeState {
    /// Whether the drain holds the surge's pods.
    pub fn holds(self) -> bool {
        matches!(self, Self::Planned | Self::Surging)
    }

    /// Whether the Deployment may be above its recorded count (so a restore is owed).
    pub fn raised(self) -> bool {
        matches!(self, Self::Surging | Self::Ready)
    }
}

impl NodeMaintenanceStatus {
    /// The surge that holds pod `namespace/name` back from eviction now, if any.
    pub fn surge_holding(&self, namespace: &str, name: &str) -> Option<&Surge> {
        self.surges.iter().find(|s| {
            s.state.holds() && s.namespace == namespace && s.pods.iter().any(|p| p == name)
        })
    }
}

/// The most evicted workloads a status lists (the CRD's `maxItems`).
pub const EVICTED_WORKLOADS_LIMIT: usize = 64;

/// A controller of evicted pods: a ReplicaSet, StatefulSet or ReplicationController.
#[derive(
    Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRef {
    #[schemars(length(max = 63))]
    pub kind: String,
    #[schemars(length(max = 63))]
    pub namespace: String,
    #[schemars(length(max = 253))]
    pub name: String,
}

impl WorkloadRef {
    /// Kinds whose pods a drain evicts and that bring them back elsewhere (DaemonSet pods come
    /// back with the node; Jobs finish rather than serve).
    pub const KINDS: &[&str] = &["ReplicaSet", "StatefulSet", "ReplicationController"];
}

impl std::fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BlockingPod {
    #[schemars(length(max = 63))]
    pub namespace: String,
    #[schemars(length(max = 253))]
    pub name: String,
    /// Short reason, e.g. `DisruptionBudget`, `EvictionError`, `Terminating`.
    #[schemars(length(max = 128))]
    pub reason: String,
    /// Details: the PodDisruptionBudget's name, or the error returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::MESSAGE_LIMIT))]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;

    use super::*;
    use crate::conditions::tests::condition;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).expect("a valid time"))
    }

    #[test]
    fn entering_a_phase_records_it_and_keeps_only_the_last_sixteen() {
        let mut status = NodeMaintenanceStatus::default();
        for second in 0..20 {
            status.enter(MaintenancePhase::Draining, at(second));
        }
        status.enter(MaintenancePhase::Acting, at(20));
        assert_eq!(status.phase, MaintenancePhase::Acting);
        assert_eq!(status.history.len(), HISTORY_LIMIT);
        assert_eq!(status.history[0].time, at(5), "the oldest go first");
        assert_eq!(
            status.history[HISTORY_LIMIT - 1].phase,
            MaintenancePhase::Acting
        );
    }

    #[test]
    fn a_status_patch_enters_the_phase_from_the_current_history_and_writes_nothing_else() {
        let mut m = NodeMaintenance::request(
            "m",
            "node-a",
            MaintenanceReason::Manual,
            MaintenanceAction::Reboot,
            "test",
            "why".into(),
        );
        let mut status = NodeMaintenanceStatus::default();
        status.enter(MaintenancePhase::Admitted, at(1));
        m.status = Some(status);
        let patch = serde_json::json!({
            "status": StatusPatch::enter(&m, MaintenancePhase::Draining, "draining", at(2))
        });
        assert_eq!(
            patch,
            serde_json::json!({"status": {
                "phase": "Draining",
                "history": [
                    {"phase": "Admitted", "time": "1970-01-01T00:00:01Z"},
                    {"phase": "Draining", "time": "1970-01-01T00:00:02Z"},
                ],
                "message": "draining",
            }})
        );
    }

    #[test]
    fn a_status_patch_condition_keeps_the_others() {
        let mut m = NodeMaintenance::request(
            "m",
            "node-a",
            MaintenanceReason::Manual,
            MaintenanceAction::Reboot,
            "test",
            "why".into(),
        );
        let admitted = condition("Admitted", "True", 1);
        m.status = Some(NodeMaintenanceStatus {
            conditions: vec![admitted.clone()],
            ..Default::default()
        });
        let patch = StatusPatch::default().condition(&m, condition("Drained", "True", 2));
        let types: Vec<&str> = patch
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, ["Admitted", "Drained"]);
    }

    #[test]
    fn a_requested_maintenance_is_labelled_with_its_node_unless_the_name_cannot_be_a_label() {
        let short = NodeMaintenance::request(
            "m",
            "node-a",
            MaintenanceReason::Reboot,
            MaintenanceAction::Reboot,
            "nodeward-agent",
            "why".into(),
        );
        assert_eq!(
            short
                .labels()
                .get(crate::labels::NODE_NAME_LABEL)
                .map(String::as_str),
            Some("node-a")
        );
        let long_name = format!("{}.example.com", "n".repeat(60));
        let long = NodeMaintenance::request(
            "m",
            &long_name,
            MaintenanceReason::Reboot,
            MaintenanceAction::Reboot,
            "nodeward-agent",
            "why".into(),
        );
        assert!(long.labels().get(crate::labels::NODE_NAME_LABEL).is_none());
        assert_eq!(long.spec.node_name, long_name);
    }

    #[test]
    fn only_admitted_to_verifying_are_active() {
        use MaintenancePhase::*;
        for phase in [Admitted, Draining, Acting, Verifying] {
            assert!(phase.is_active(), "{phase:?}");
        }
        for phase in [Pending, Succeeded, Failed, Cancelled] {
            assert!(!phase.is_active(), "{phase:?}");
        }
    }

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
