//! `NodeReport`: the agent's view of its node, named after the node.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Duration, maintenance::BlockingPod};

/// What one node's agent sees: its findings, its inhibitor lock, its shutdown progress and
/// which policy pauses it has acknowledged. Named after the node, owned by the Node once the
/// Node exists; only that node's agent writes it.
#[derive(CustomResource, Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[kube(
    group = "nodeward.io",
    version = "v1alpha1",
    kind = "NodeReport",
    doc = "The agent's view of its node: findings, inhibitor lock, shutdown progress, pause acknowledgements.",
    plural = "nodereports",
    shortname = "nr",
    category = "nodeward",
    status = "NodeReportStatus",
    validation = Rule::new("self.metadata.name == self.spec.nodeName").message("a NodeReport is named after its node: metadata.name must equal spec.nodeName"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".status.mode"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.agentVersion"),
    printcolumn(name = "Problems", type_ = "integer", json_path = ".status.problems"),
    printcolumn(name = "Kernel", type_ = "string", json_path = ".status.inventory.kernel", priority = 1),
    printcolumn(name = "Updates", type_ = "integer", json_path = ".status.inventory.updatesPending"),
    printcolumn(name = "Reported", type_ = "date", json_path = ".status.heartbeatTime"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NodeReportSpec {
    /// The node this report is about (equal to the object's name).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("nodeName is immutable"))]
    pub node_name: String,
}

/// How the agent runs.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentMode {
    /// A pod of the nodeward DaemonSet.
    DaemonSet,
    /// A systemd service on the host.
    Host,
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeReportStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub agent_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<AgentMode>,
    /// The node's current boot id (`/proc/sys/kernel/random/boot_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub boot_id: Option<String>,
    /// When the agent last wrote this report, which it does only when something in it
    /// changed. Its liveness is its Lease (`nodeward-agent-<node>` in nodeward's namespace),
    /// renewed every `reporting.heartbeatInterval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<Time>,
    /// Number of findings whose status is True.
    #[serde(default)]
    pub problems: i32,
    /// Every detector's current finding, problems and passes alike; several detectors may
    /// feed one condition type (e.g. `NetworkProblem`), so the list is keyed by detector.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["detector"]))]
    #[schemars(length(max = FINDINGS_LIMIT))]
    pub findings: Vec<Finding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inhibitor: Option<InhibitorState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown: Option<ShutdownProgress>,
    /// Pauses this agent has seen and obeys: policy name and the generation it observed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["policy"]))]
    #[schemars(length(max = 128))]
    pub pause_acknowledgements: Vec<PauseAcknowledgement>,
    /// The peers this agent finds unreachable now (since when; probed again every round), and
    /// those it reached again (when), the most recent [`PEER_SIGHTINGS_LIMIT`]: what the
    /// coordinator asks of the peers before it treats a node whose agent is silent as dead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = PEER_SIGHTINGS_LIMIT))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub peer_sightings: Vec<PeerSighting>,
    /// The agent's self-fencing, while it keeps a watchdog armed: the coordinator treats this
    /// node as down when it goes silent (the out-of-service taint, a DeleteNode without a
    /// drain) only while this is set, and only once the fencing and the watchdog's reset are
    /// over ([`Fencing`]). An agent that stops feeding its watchdog on purpose clears it first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing: Option<Fencing>,
    /// What the node runs (OS image, kernel, named packages, pending updates), as the agent last
    /// read it from the host: at its start, every `inventory.interval` and after an update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<crate::inventory::Inventory>,
    /// The last kernel log record published as an Event: a restarted agent publishes only
    /// newer ones of the same boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_log: Option<KernelLogPosition>,
    /// Per journal monitor (named by the program whose messages it matches), the last record
    /// published as an Event: a restarted agent publishes only newer ones of the same boot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = JOURNAL_MONITORS_LIMIT))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["identifier"]))]
    pub journal_log: Vec<JournalLogPosition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::bounds::conditions")]
    pub conditions: Vec<Condition>,
}

/// A kernel log record: the boot, where the log was read, and the record's place in it.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KernelLogPosition {
    #[schemars(length(max = 64))]
    pub boot_id: String,
    /// What `sequence` counts (absent: `Kmsg`, as written before there was a choice).
    #[serde(default, skip_serializing_if = "KernelLogSource::is_kmsg")]
    pub source: KernelLogSource,
    #[schemars(range(min = 0))]
    pub sequence: i64,
}

/// The most journal monitors an agent runs (and so positions a NodeReport keeps).
pub const JOURNAL_MONITORS_LIMIT: usize = 16;

/// A journal record of one program (its `SYSLOG_IDENTIFIER`): the boot and the record's place,
/// journald's timestamp of it in microseconds since boot.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct JournalLogPosition {
    #[schemars(length(min = 1, max = 64))]
    pub identifier: String,
    #[schemars(length(max = 64))]
    pub boot_id: String,
    #[schemars(range(min = 0))]
    pub sequence: i64,
}

/// Where an agent reads the kernel log.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelLogSource {
    /// `/dev/kmsg`; a record's place is its sequence number.
    #[default]
    Kmsg,
    /// systemd-journald's files; a record's place is the kernel's timestamp of it,
    /// microseconds since boot (journald keeps no kmsg sequence number).
    Journal,
}

impl KernelLogSource {
    pub fn is_kmsg(&self) -> bool {
        *self == Self::Kmsg
    }
}

/// The most findings a NodeReport lists: the built-in detectors and the custom checks an
/// agent's configuration may add.
pub const FINDINGS_LIMIT: usize = 128;

/// The most peer sightings a NodeReport lists (the CRD's `maxItems`).
pub const PEER_SIGHTINGS_LIMIT: usize = 32;

/// How the agent fences its node: it feeds a watchdog, and stops once it has been
/// `fenceAfterSeconds` without the API server while no more than half of `agents` (itself
/// among them) answered its probes; the watchdog then resets the machine within
/// `timeoutSeconds`. So a node cut off from the API server and from most of its peers stops
/// running its pods before anything else may start them; a node cut off from the API server
/// only, or a fleet whose API server is down, goes on. Peers that are still live record its
/// probes (`peerSightings[].probedAt`), so that the coordinator knows it is running.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Fencing {
    /// The watchdog device the agent feeds, e.g. `/dev/watchdog`.
    #[schemars(length(min = 1, max = 256))]
    pub device: String,
    /// How long without the API server (and without a majority of `agents` answering) before
    /// the agent stops feeding the watchdog.
    #[schemars(range(min = 10, max = 86400))]
    pub fence_after_seconds: i32,
    /// How long after the last feeding the watchdog resets the machine.
    #[schemars(range(min = 1, max = 600))]
    pub timeout_seconds: i32,
    /// The agents the fencing counts, itself among them: without the API server it goes on
    /// feeding the watchdog while more than half of them answer.
    #[schemars(range(min = 1, max = 100000))]
    pub agents: i32,
}

/// One peer whose reachability this agent saw change.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PeerSighting {
    /// The peer's node name.
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    /// Whether any probe (TCP, UDP or ICMP) is answered.
    pub reachable: bool,
    /// Since when.
    pub time: Time,
    /// When the peer's agent, cut off from the API server, last probed this one to count its
    /// peers for its fencing: it was running then, whatever this agent's probes of it find.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probed_at: Option<Time>,
}

/// One detector's verdict, with the same type/status/reason/message shape as a Node condition.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// CamelCase problem type, e.g. `NetworkProblem`, `KubeletUnregistered`.
    #[serde(rename = "type")]
    #[schemars(length(max = 316))]
    pub type_: String,
    /// `True` means the problem is present, `Unknown` that the check could not tell.
    #[schemars(length(max = 7))]
    pub status: String,
    #[schemars(length(max = 1024))]
    pub reason: String,
    #[schemars(length(max = crate::bounds::MESSAGE_LIMIT))]
    pub message: String,
    /// Which detector produced it.
    #[schemars(length(max = 63))]
    pub detector: String,
    /// When the status last changed.
    pub since: Time,
}

/// The agent's systemd-logind inhibitor lock.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InhibitorState {
    /// Whether the `delay` lock on shutdown is held now.
    pub delay_held: bool,
    /// Whether the `block` lock (reboot gate) is held now.
    #[serde(default)]
    pub block_held: bool,
    /// logind's effective `InhibitDelayMaxUSec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inhibit_delay_max: Option<Duration>,
    /// The shutdown budget the agent was configured for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configured_budget: Option<Duration>,
    /// logind.conf.d drop-ins that sort after nodeward's and override its delay.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 255)))]
    pub overriding_drop_ins: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_acquired: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::MESSAGE_LIMIT))]
    pub message: Option<String>,
}

/// Progress of a shutdown the agent is guarding, kept so a restarted agent resumes it.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownProgress {
    pub phase: ShutdownPhase,
    #[schemars(length(max = 64))]
    pub boot_id: String,
    pub started_at: Time,
    /// When the lock will be released whatever happens.
    pub deadline: Time,
    #[serde(default)]
    pub pods_total: i32,
    #[serde(default)]
    pub pods_remaining: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub blocking_pods: Vec<BlockingPod>,
    /// Whether the agent itself cordoned the node for this shutdown.
    #[serde(default)]
    pub cordoned_by_agent: bool,
    #[serde(default)]
    pub tainted_by_agent: bool,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownPhase {
    Draining,
    /// Drained (or out of time) and the lock released; the machine is going down.
    Released,
    /// logind cancelled the shutdown; what the agent did was undone.
    Cancelled,
    /// The node came back with a new boot id; waiting to untaint and uncordon.
    Recovering,
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PauseAcknowledgement {
    #[schemars(length(max = 253))]
    pub policy: String,
    /// The policy generation at which the agent saw `paused: true`.
    pub observed_generation: i64,
}
