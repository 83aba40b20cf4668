//! `DisruptionPolicy`: the cluster-wide limits for the nodes its selector matches.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::{
    apis::meta::v1::{LabelSelector, Time},
    util::intstr::IntOrString,
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Duration, drain::DrainPlan};

mod by_reason;
mod canary;
mod gate;
mod status;
pub use by_reason::ReasonBudgets;
pub use canary::Canary;
pub use gate::{EXPRESSION_LIMIT, GATES_LIMIT, Gate, GateObject};
pub use status::*;

/// CEL for "an integer >= 0 or a percentage from 0% to 100%".
const COUNT_OR_PERCENT_RULE: &str =
    "type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')";

/// The limits under which nodes matched by `nodeSelector` may be disrupted. When several
/// policies match a node, a maintenance of that node must fit all of them.
#[derive(CustomResource, Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[kube(
    group = "nodeward.io",
    version = "v1alpha1",
    kind = "DisruptionPolicy",
    doc = "Cluster-wide limits (concurrency, windows, pause, remediation) for the nodes its selector matches.",
    plural = "disruptionpolicies",
    shortname = "dp",
    category = "nodeward",
    status = "DisruptionPolicyStatus",
    printcolumn(name = "Max", type_ = "string", json_path = ".spec.maxConcurrent"),
    printcolumn(name = "Matched", type_ = "integer", json_path = ".status.matched"),
    printcolumn(
        name = "Disrupted",
        type_ = "integer",
        json_path = ".status.inMaintenance"
    ),
    printcolumn(name = "Unhealthy", type_ = "integer", json_path = ".status.unhealthy"),
    printcolumn(
        name = "Updated",
        type_ = "integer",
        json_path = ".status.progress.updated"
    ),
    printcolumn(name = "Paused", type_ = "boolean", json_path = ".spec.paused"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.canary) || has(self.failureBudget)").message("canary needs a failureBudget, so that a failed canary halts the rollout instead of passing the update to the next node, e.g. failureBudget: {maxFailures: 1}"))]
pub struct DisruptionPolicySpec {
    /// Nodes this policy applies to; empty or absent selects every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::bounds::optional_selector")]
    pub node_selector: Option<LabelSelector>,
    /// How many matched nodes may be disrupted at once, as a count (`2`) or a percentage of
    /// the matched nodes (`10%`, rounded down, but at least 1 when above 0%). Nodes NotReady
    /// for other reasons count against it.
    #[serde(default = "default_max_concurrent")]
    #[x_kube(validation = Rule::new(COUNT_OR_PERCENT_RULE).message("maxConcurrent must be an integer >= 0 or a percentage from \"0%\" to \"100%\", e.g. 1 or \"10%\""))]
    pub max_concurrent: IntOrString,
    /// Tighter limits for nodeward's maintenances of one reason, within `maxConcurrent`.
    #[serde(default, skip_serializing_if = "ReasonBudgets::is_empty")]
    pub max_concurrent_by_reason: ReasonBudgets,
    /// Remediation stops while more matched nodes than this are unhealthy (count or
    /// percentage, rounded down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(COUNT_OR_PERCENT_RULE).message("maxUnhealthy must be an integer >= 0 or a percentage from \"0%\" to \"100%\", e.g. 3 or \"40%\""))]
    pub max_unhealthy: Option<IntOrString>,
    /// When disruptions may start; none means any time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub windows: Vec<MaintenanceWindow>,
    /// When nothing in scope may start, whatever the windows say: change freezes (a release,
    /// the end of the year). A maintenance already admitted goes on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub blackouts: Vec<Blackout>,
    /// Stops new admissions in this policy's scope. Status condition `Paused=True` says when
    /// everything in scope has stopped.
    #[serde(default)]
    pub paused: bool,
    /// How nodes in scope are drained; the agent's default plan when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_plan: Option<DrainPlan>,
    /// Longest a drain may take before `onDrainTimeout` applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<Duration>,
    /// What a drain that runs out of time (`drainTimeout`, or a stage with `onTimeout: Fail`)
    /// does: fail the maintenance (the default) or force it through.
    #[serde(default)]
    pub on_drain_timeout: DrainTimeoutAction,
    /// Agents in scope create a Reboot maintenance when their node reports RebootRequired.
    #[serde(default)]
    pub auto_reboot: bool,
    /// Nodes in scope whose maintenance waits for admission are tainted
    /// `nodeward.io/maintenance-pending:PreferNoSchedule`, so that pods evicted from the
    /// nodes going now avoid those going next (kured's `--prefer-no-schedule-taint`).
    #[serde(default)]
    pub taint_while_pending: bool,
    /// Conditions under which no reboot is admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot_blockers: Option<RebootBlockers>,
    /// Conditions on cluster state that must all hold before a maintenance in scope is
    /// admitted (not a remediation, nor one whose node goes down anyway): CEL expressions over
    /// named objects, read before each decision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = GATES_LIMIT))]
    #[x_kube(validation = Rule::new("self.all(g, self.exists_one(h, h.name == g.name))").message("gates[].name must be unique within the policy"))]
    pub gates: Vec<Gate>,
    /// What must hold after a reboot before the node is uncordoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_gate: Option<HealthGate>,
    /// Automatic repair of unhealthy nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<Remediation>,
    /// Allow disrupting the only control-plane node in scope (single-node control planes).
    #[serde(default)]
    pub allow_sole_control_plane: bool,
    /// How long the coordinator waits on a node's agent before it acts without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadlines: Option<Deadlines>,
    /// What admission checks of the workloads on a node before disrupting it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_gate: Option<WorkloadGate>,
    /// Labels and annotations the coordinator puts on a node around its maintenances (kured's
    /// `--pre-reboot-node-labels`, `--post-reboot-node-labels`, `--annotate-nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_labels: Option<NodeLabels>,
    /// Halts the rollout after too many failures: once `maxFailures` maintenances it admitted
    /// ended Failed within `window`, nothing more in scope is admitted (`Halted=True` names
    /// them) until an operator resumes it (`kubectl nodeward resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_budget: Option<FailureBudget>,
    /// A canary stage for planned reboots (reason Reboot or Manual, the patch rollout): the
    /// first nodes go alone, and the rest of the scope waits until they succeeded and a soak
    /// time passed (`CanaryPending`). Needs `failureBudget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
    /// Patching: the update a planned Reboot maintenance (reason Reboot or Manual; not a
    /// remediation or shutdown) of a node this policy admitted runs after its drain, before
    /// the reboot, which then happens only when the update needs it. Where several policies
    /// admitted it, the first by name that has one; a maintenance's own `update` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<crate::update::Update>,
    /// Host commands before the drain, after it and after the boot, chosen like `update`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<crate::update::Hooks>,
}

/// Node labels around a maintenance. The values a node had before are recorded on it
/// (`nodeward.io/labels-before`) and put back when the maintenance fails or is cancelled.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeLabels {
    /// Set when a maintenance is admitted, before its drain (e.g.
    /// `node.kubernetes.io/exclude-from-external-load-balancers: "true"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["key"]))]
    pub before_drain: Vec<NodeLabel>,
    /// Set once the maintenance succeeded; the `beforeDrain` labels it does not name get their
    /// earlier values back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["key"]))]
    pub after_success: Vec<NodeLabel>,
    /// Annotate the node `nodeward.io/maintenance-in-progress` (the maintenance, while it
    /// runs) and `nodeward.io/last-maintenance` (how and when the last one ended).
    #[serde(default)]
    pub annotate: bool,
}

impl NodeLabels {
    /// `beforeDrain` as a map.
    pub fn before(&self) -> BTreeMap<String, String> {
        self.before_drain
            .iter()
            .map(|l| (l.key.clone(), l.value.clone()))
            .collect()
    }

    /// `afterSuccess` as a map.
    pub fn after(&self) -> BTreeMap<String, String> {
        self.after_success
            .iter()
            .map(|l| (l.key.clone(), l.value.clone()))
            .collect()
    }
}

/// One node label: not in the Kubernetes or nodeward domains or their subdomains (they carry
/// meaning or privileges), except the load-balancer exclusion. A domain that only ends in those
/// letters (`remediation.medik8s.io`) is another one.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new("self.key == 'node.kubernetes.io/exclude-from-external-load-balancers' || !self.key.matches('^([^/]*[.])?(kubernetes|k8s|nodeward)[.]io/')").message("nodeLabels: a label in the kubernetes.io, k8s.io or nodeward.io domains (or a subdomain) may not be set (node.kubernetes.io/exclude-from-external-load-balancers may)"))]
pub struct NodeLabel {
    #[schemars(
        length(max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
        )
    )]
    pub key: String,
    #[serde(default)]
    #[schemars(
        length(max = 63),
        regex(pattern = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
    )]
    pub value: String,
}

impl DisruptionPolicySpec {
    /// Its deadlines resolved, the coordinator's backstops never shorter than the agent's own
    /// timeouts they back (`drainTimeout`; the health gate's and the workload gate's timeouts)
    /// plus [`Deadlines::BACKSTOP_MARGIN`].
    pub fn resolved_deadlines(&self) -> ResolvedDeadlines {
        let mut resolved = Deadlines::resolve(self.deadlines.as_ref());
        let std = |d: Option<&Duration>| d.and_then(|d| d.to_std().ok());
        if let Some(drain) = std(self.drain_timeout.as_ref()) {
            resolved.drain = resolved.drain.max(drain + Deadlines::BACKSTOP_MARGIN);
        }
        let health = std(self.health_gate.as_ref().and_then(|g| g.timeout.as_ref()));
        if let Some(health) = health {
            let workloads = std(self.workload_gate.as_ref().and_then(|g| g.timeout.as_ref()))
                .unwrap_or(WORKLOAD_GATE_TIMEOUT);
            resolved.verify = resolved
                .verify
                .max(health + workloads + Deadlines::BACKSTOP_MARGIN);
        }
        resolved.with_host_time(crate::update::HostTime::of(
            self.update.as_ref(),
            self.hooks.as_ref(),
        ))
    }

    /// Whether admission looks at the PodDisruptionBudgets of a node's pods first (on unless
    /// `workloadGate.checkDisruptionBudgets` is false).
    pub fn checks_disruption_budgets(&self) -> bool {
        self.workload_gate
            .as_ref()
            .is_none_or(|g| g.check_disruption_budgets)
    }
}

/// Admission that looks ahead at the workloads on a node.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadGate {
    /// Deny a node's maintenance (`WorkloadNotReady`, naming the budget and its workload)
    /// while a PodDisruptionBudget covering one of its evictable, healthy pods allows no
    /// disruption, instead of admitting it, cordoning the node and blocking in the drain.
    /// Where several policies select a node, one that checks is enough.
    #[serde(default = "default_true")]
    pub check_disruption_budgets: bool,
    /// A reboot that evicted pods finishes only once the controllers of those pods
    /// (Deployment or ReplicaSet, StatefulSet, ReplicationController) have all their replicas
    /// available again, or `timeout` passed; its slot is held until then, so the next node
    /// waits. Where several policies admitted a maintenance, one that waits is enough.
    #[serde(default = "default_true")]
    pub wait_for_evicted: bool,
    /// How long after the reboot (Verifying) the wait may last (default 10m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('30s')").message("workloadGate.timeout must be at least 30s, e.g. 10m"))]
    pub timeout: Option<Duration>,
    /// What a wait that runs out of time does: `Succeed` (with `WorkloadsAvailable=False` as
    /// the warning) or `Fail`.
    #[serde(default)]
    pub on_timeout: WorkloadTimeoutAction,
}

/// What happens when the workloads a reboot evicted are not available again in time.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkloadTimeoutAction {
    /// The maintenance succeeds; its `WorkloadsAvailable=False` condition says what is short.
    #[default]
    Succeed,
    /// The maintenance fails (its slot is freed; the node is already back in service).
    Fail,
}

/// The workload gate's timeout when a policy sets none.
pub const WORKLOAD_GATE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

impl WorkloadGate {
    /// Whether `policy` waits for evicted workloads (absent gate: yes).
    pub fn waits(gate: Option<&Self>) -> bool {
        gate.is_none_or(|g| g.wait_for_evicted)
    }
}

impl DisruptionPolicy {
    /// Whether its `nodeSelector` selects a node with `labels` (absent or empty: every node).
    /// A selector that cannot be evaluated is an error: each caller decides which way is safe.
    pub fn selects(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<bool, crate::selector::InvalidSelector> {
        match &self.spec.node_selector {
            None => Ok(true),
            Some(selector) => crate::selector::matches(selector, labels),
        }
    }
}

/// How long the coordinator waits on a node's agent, each with a default. Where several
/// policies admitted a maintenance, the longest of theirs applies.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Deadlines {
    /// A node whose agent has not renewed its Lease (`nodeward-agent-<node>`, the agent's
    /// heartbeat) for this long, or never, is not admitted (`AgentUnavailable`): nothing would
    /// carry the maintenance out. Default 12m; at least 1m. Agents renew every
    /// `reporting.heartbeatInterval` (5m by default): keep this above two of those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m')").message("deadlines.agentHeartbeat must be at least 1m, e.g. 12m"))]
    pub agent_heartbeat: Option<Duration>,
    /// An Admitted maintenance its agent has not started draining within this goes back to
    /// Pending and its budget slots are freed (`NotStarted`). Default 10m; at least 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('30s')").message("deadlines.start must be at least 30s, e.g. 10m"))]
    pub start: Option<Duration>,
    /// A Reboot maintenance still Acting this long after it began (no new boot reported)
    /// fails (`NodeDidNotReturn`); the node still counts against the budget while NotReady.
    /// Default 30m; at least 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('30s')").message("deadlines.reboot must be at least 30s, e.g. 30m"))]
    pub reboot: Option<Duration>,
    /// When a node's agent has been silent this long, the coordinator finishes its
    /// maintenances in its place: one under way fails (`AgentLost`), the taint and cordon it
    /// left are undone and the agent's finalizer removed (a drained DrainOnly holds until it is
    /// deleted, then is released). Default 30m; at least 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m')").message("deadlines.agentLost must be at least 1m, e.g. 30m"))]
    pub agent_lost: Option<Duration>,
    /// A node deleted by a DeleteNode maintenance keeps its share of `maxConcurrent` this long
    /// after the deletion, for its replacement to join: N DeleteNode maintenances do not remove
    /// N nodes back to back. Default 10m; `0s` frees it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<Duration>,
    /// A maintenance still Draining this long after the coordinator saw it start draining
    /// fails (`DrainNotFinished`): the coordinator's own backstop for an agent that neither
    /// finishes its drain nor fails it (the agent applies `drainTimeout` and the stages'
    /// timeouts first). Never shorter than `drainTimeout` plus 10m. Default 2h; at least 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m')").message("deadlines.drain must be at least 1m, e.g. 2h"))]
    pub drain: Option<Duration>,
    /// A maintenance still Verifying this long after the coordinator saw it come back fails
    /// (`NotVerified`): the backstop for an agent that neither passes nor fails its health
    /// gate. Never shorter than `healthGate.timeout` plus the workload gate's timeout plus
    /// 10m. Default 2h; at least 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m')").message("deadlines.verify must be at least 1m, e.g. 2h"))]
    pub verify: Option<Duration>,
}

impl Deadlines {
    pub const DEFAULT_AGENT_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(720);
    pub const DEFAULT_START: std::time::Duration = std::time::Duration::from_secs(600);
    pub const DEFAULT_REBOOT: std::time::Duration = std::time::Duration::from_secs(1800);
    pub const DEFAULT_AGENT_LOST: std::time::Duration = std::time::Duration::from_secs(1800);
    pub const DEFAULT_REPLACEMENT: std::time::Duration = std::time::Duration::from_secs(600);
    pub const DEFAULT_DRAIN: std::time::Duration = std::time::Duration::from_secs(7200);
    pub const DEFAULT_VERIFY: std::time::Duration = std::time::Duration::from_secs(7200);
    /// What the agent's own timeouts get before the coordinator's backstop applies.
    pub const BACKSTOP_MARGIN: std::time::Duration = std::time::Duration::from_secs(600);

    /// Each deadline of `deadlines` (absent: the defaults), resolved.
    pub fn resolve(deadlines: Option<&Deadlines>) -> ResolvedDeadlines {
        let pick =
            |d: Option<&Duration>, default| d.and_then(|d| d.to_std().ok()).unwrap_or(default);
        let d = deadlines.cloned().unwrap_or_default();
        ResolvedDeadlines {
            agent_heartbeat: pick(d.agent_heartbeat.as_ref(), Self::DEFAULT_AGENT_HEARTBEAT),
            start: pick(d.start.as_ref(), Self::DEFAULT_START),
            reboot: pick(d.reboot.as_ref(), Self::DEFAULT_REBOOT),
            agent_lost: pick(d.agent_lost.as_ref(), Self::DEFAULT_AGENT_LOST),
            replacement: pick(d.replacement.as_ref(), Self::DEFAULT_REPLACEMENT),
            drain: pick(d.drain.as_ref(), Self::DEFAULT_DRAIN),
            verify: pick(d.verify.as_ref(), Self::DEFAULT_VERIFY),
        }
    }
}

/// [`Deadlines`] with their defaults filled in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedDeadlines {
    pub agent_heartbeat: std::time::Duration,
    pub start: std::time::Duration,
    pub reboot: std::time::Duration,
    pub agent_lost: std::time::Duration,
    pub replacement: std::time::Duration,
    pub drain: std::time::Duration,
    pub verify: std::time::Duration,
}

impl ResolvedDeadlines {
    /// Longer by the time host steps may take: the phases they run in hold the agent that
    /// much longer.
    pub fn with_host_time(self, host: crate::update::HostTime) -> Self {
        Self {
            drain: self.drain + host.draining,
            reboot: self.reboot + host.acting,
            // A rollback holds Verifying for itself, the reboot after it and a second gate.
            verify: self.verify
                + host.verifying
                + if host.rollback.is_zero() {
                    std::time::Duration::ZERO
                } else {
                    host.rollback + self.reboot + self.verify
                },
            ..self
        }
    }

    /// The longest of each deadline over `all` (none: the defaults).
    pub fn longest(all: impl IntoIterator<Item = ResolvedDeadlines>) -> ResolvedDeadlines {
        all.into_iter()
            .reduce(|a, b| ResolvedDeadlines {
                agent_heartbeat: a.agent_heartbeat.max(b.agent_heartbeat),
                start: a.start.max(b.start),
                reboot: a.reboot.max(b.reboot),
                agent_lost: a.agent_lost.max(b.agent_lost),
                replacement: a.replacement.max(b.replacement),
                drain: a.drain.max(b.drain),
                verify: a.verify.max(b.verify),
            })
            .unwrap_or_else(|| Deadlines::resolve(None))
    }
}

fn default_max_concurrent() -> IntOrString {
    IntOrString::Int(1)
}

/// What happens when a drain runs out of time.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DrainTimeoutAction {
    /// The maintenance fails: its taint and cordon are undone and its slot is freed.
    #[default]
    Fail,
    /// The pods still there are deleted (bypassing their PodDisruptionBudgets) and the
    /// maintenance goes on to its action (kured's `--force-reboot`).
    Force,
}

/// A recurring period in which disruptions may start: either `days` + `start` + `end`, or
/// `cron` + `duration`, in `timeZone`.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.cron) ? (has(self.duration) && !has(self.start) && !has(self.end) && !has(self.days)) : (has(self.start) && has(self.end) && !has(self.duration))")
        .message("a window is either start and end (with optional days) or cron and duration, not a mix of both"),
    validation = Rule::new("!has(self.start) || !has(self.end) || self.start != self.end")
        .message("start and end must differ; a window that crosses midnight has end before start")
)]
pub struct MaintenanceWindow {
    /// Days on which the window opens; empty means every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub days: Vec<Weekday>,
    /// Opening time, HH:MM (24-hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 5), regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: Option<String>,
    /// Closing time, HH:MM; before `start` means the window crosses midnight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 5), regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub end: Option<String>,
    /// Standard 5-field cron expression for when the window opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), regex(pattern = r"^\S+(\s+\S+){4}$"))]
    pub cron: Option<String>,
    /// How long a cron window stays open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<Duration>,
    /// IANA time zone name, e.g. `Europe/Berlin`; default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)*$")
    )]
    // cel-go resolves the name with the API server's tz database; an unknown name fails here.
    #[x_kube(validation = Rule::new("timestamp('2000-01-01T00:00:00Z').getHours(self) >= 0").message("timeZone must be an IANA time zone name such as UTC or Europe/Berlin"))]
    pub time_zone: Option<String>,
}

/// A span of time in which nothing in a policy's scope is admitted.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.start < self.end").message("a blackout's end must be after its start"))]
pub struct Blackout {
    /// Its first moment, RFC 3339 with a zone, e.g. `2026-12-20T00:00:00+01:00`.
    pub start: Time,
    /// The moment it is over.
    pub end: Time,
    /// Why, in the denials it gives, e.g. `year-end change freeze`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub reason: Option<String>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Weekday {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

/// What holds reboots back.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RebootBlockers {
    /// A node running a pod that matches any of these is not rebooted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::bounds::selectors")]
    pub pod_selectors: Vec<LabelSelector>,
    /// Only pods in these namespaces block (with `namespaceSelector`: in both). Unset, pods in
    /// every namespace do, so anyone who may label a pod on a node can hold its reboot: scope
    /// the selectors to the namespaces you trust.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 63),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        )
    )]
    pub namespaces: Vec<String>,
    /// Only pods in namespaces whose labels match this block (with `namespaces`: in both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::bounds::optional_selector")]
    pub namespace_selector: Option<LabelSelector>,
    /// Firing Prometheus alerts that block every reboot in scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusBlocker>,
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusBlocker {
    /// Base URL of the Prometheus HTTP API, e.g. `http://prometheus.monitoring:9090`.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://"))]
    pub url: String,
    /// Only alerts whose name matches this regular expression block reboots (all alerts if
    /// unset). Unanchored: `^...$` matches whole names. kured's `--alert-filter-match-only`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub alert_filter: Option<String>,
    /// Alerts whose name matches this regular expression never block (e.g. `^Watchdog$`).
    /// kured's `--alert-filter-regexp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub ignore_alerts: Option<String>,
    /// Only alerts in state firing block (pending ones are ignored).
    #[serde(default = "default_true")]
    pub firing_only: bool,
}

fn default_true() -> bool {
    true
}

/// How many failed maintenances halt a policy's rollout.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailureBudget {
    /// Failed maintenances (admitted under this policy, whatever made them fail) that halt it.
    #[schemars(range(min = 1, max = 1000))]
    pub max_failures: u32,
    /// How far back a failure counts (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Duration>,
    /// Failures that ended up to this time (to the second) do not count: resuming a halted
    /// policy sets it to the time of the resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_since: Option<Time>,
}

impl FailureBudget {
    /// How far back a failure counts when `window` is absent.
    pub const DEFAULT_WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
}

/// After a reboot the node stays cordoned until this holds.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthGate {
    /// The node must be Ready and free of `problemTypes` findings for this long.
    #[serde(rename = "for")]
    pub for_: Duration,
    /// Node condition types that must be False (default: every nodeward condition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 316)))]
    pub problem_types: Vec<String>,
    /// The maintenance fails when the gate has not passed within this time after boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
}

/// Automatic repair of unhealthy nodes.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Remediation {
    /// Creates Remediation maintenances when true; otherwise only reports.
    #[serde(default)]
    pub enabled: bool,
    /// A node is unhealthy when any of these conditions has held for its duration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub unhealthy_conditions: Vec<UnhealthyCondition>,
    /// A node that has not become Ready this long after it was created is handled by
    /// `startupAction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_startup_timeout: Option<Duration>,
    /// What to do with a node that never became Ready.
    #[serde(default)]
    pub startup_action: StartupAction,
    /// An agent heartbeat older than this makes the node unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout: Option<Duration>,
    /// The remediation maintenance's action.
    #[serde(default = "default_remediation_action")]
    #[x_kube(validation = Rule::new("self == 'Reboot' || self == 'DeleteNode'").message("remediation action must be Reboot or DeleteNode"))]
    pub action: crate::MaintenanceAction,
    /// Escalate a Reboot remediation to DeleteNode when health has not returned in this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_after: Option<Duration>,
    /// After remediation was short-circuited by `maxUnhealthy`, wait this long once the
    /// count is back under the limit before remediating again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown: Option<Duration>,
    /// Put Kubernetes' `node.kubernetes.io/out-of-service` taint on a dead node (NotReady for
    /// `deadlines.agentHeartbeat`, its agent silent, and unreachable from every peer that
    /// probed it since), so that its pods are deleted and their volumes detached and stateful
    /// pods start elsewhere; taken away once the node is Ready again. Decided like any
    /// remediation (pause, windows, budgets, `maxUnhealthy`, the control-plane guard), so that
    /// many nodes cut off at once are not all given up. Only with `enabled`.
    #[serde(default)]
    pub out_of_service_taint: bool,
}

fn default_remediation_action() -> crate::MaintenanceAction {
    crate::MaintenanceAction::Reboot
}

#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyCondition {
    /// Node condition type, e.g. `Ready` or `KubeletProblem`.
    #[schemars(length(min = 1, max = 316))]
    #[serde(rename = "type")]
    pub type_: String,
    /// The status that counts as unhealthy: `True`, `False` or `Unknown`.
    #[schemars(regex(pattern = r"^(True|False|Unknown)$"), length(max = 7))]
    pub status: String,
    /// How long the condition must hold.
    #[serde(rename = "for")]
    pub for_: Duration,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartupAction {
    /// Report it only (Event and condition).
    #[default]
    None,
    /// Delete the Node object so that the infrastructure replaces it.
    DeleteNode,
    /// Create a Remediation maintenance.
    Remediate,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_spec_means_one_at_a_time_unpaused_any_time() {
        let spec: DisruptionPolicySpec = serde_json::from_str("{}").expect("empty spec");
        assert_eq!(spec.max_concurrent, IntOrString::Int(1));
        assert!(!spec.paused && !spec.auto_reboot && spec.windows.is_empty());
        assert!(spec.node_selector.is_none());
    }

    #[test]
    fn the_coordinators_backstops_are_never_shorter_than_the_agents_own_timeouts() {
        let resolved = |spec: serde_json::Value| {
            serde_json::from_value::<DisruptionPolicySpec>(spec)
                .expect("valid spec")
                .resolved_deadlines()
        };
        let defaults = resolved(serde_json::json!({}));
        assert_eq!(defaults.drain.as_secs(), 7200);
        assert_eq!(defaults.verify.as_secs(), 7200);
        let set = resolved(serde_json::json!({"deadlines": {"drain": "30m", "verify": "45m"}}));
        assert_eq!((set.drain.as_secs(), set.verify.as_secs()), (1800, 2700));
        // A drain timeout of 3h gets 10m more; a health gate of 2h plus the workload gate's
        // default 10m, 10m more.
        let longer = resolved(serde_json::json!({
            "deadlines": {"drain": "30m", "verify": "45m"},
            "drainTimeout": "3h", "healthGate": {"for": "1m", "timeout": "2h"},
        }));
        assert_eq!(longer.drain.as_secs(), 3 * 3600 + 600);
        assert_eq!(longer.verify.as_secs(), 2 * 3600 + 600 + 600);
        // Hooks and an update hold their phases for up to their timeouts (the update 3m more,
        // to ask whether it needs a reboot).
        let patching = resolved(serde_json::json!({
            "update": {"preset": "Apt", "timeout": "1h"},
            "hooks": {
                "beforeDrain": {"command": ["/bin/true"], "timeout": "2m"},
                "afterDrain": {"command": ["/bin/true"]},
                "afterBoot": {"command": ["/bin/true"], "timeout": "1m"},
            },
        }));
        assert_eq!(patching.drain.as_secs(), 7200 + 120);
        assert_eq!(patching.reboot.as_secs(), 1800 + 300 + 3600 + 180);
        assert_eq!(patching.verify.as_secs(), 7200 + 60);
        // A rollback holds Verifying for itself, a reboot and a second gate.
        let rolling_back = resolved(serde_json::json!({
            "update": {"preset": "Apt", "rollback": {"preset": "Apt", "timeout": "5m"}},
        }));
        assert_eq!(
            rolling_back.verify.as_secs(),
            7200 + (300 + 1800 + 7200),
            "{rolling_back:?}"
        );
    }

    #[test]
    fn camel_case_fields_round_trip() {
        let json = serde_json::json!({
            "maxConcurrent": "25%",
            "windows": [{"days": ["Sat"], "start": "22:00", "end": "04:00", "timeZone": "Europe/Berlin"}],
            "healthGate": {"for": "5m"},
            "remediation": {"enabled": true, "unhealthyConditions": [{"type": "Ready", "status": "False", "for": "5m"}]},
        });
        let spec: DisruptionPolicySpec = serde_json::from_value(json).expect("valid spec");
        assert_eq!(spec.max_concurrent, IntOrString::String("25%".into()));
        assert_eq!(spec.windows[0].days, vec![Weekday::Sat]);
        let gate = spec.health_gate.as_ref().expect("gate");
        assert_eq!(gate.for_.to_std().map(|d| d.as_secs()), Ok(300));
        let remediation = spec.remediation.as_ref().expect("remediation");
        assert_eq!(
            remediation.action,
            crate::MaintenanceAction::Reboot,
            "the default remediation action"
        );
        let back = serde_json::to_value(&spec).expect("serialize");
        assert_eq!(back["windows"][0]["timeZone"], "Europe/Berlin");
        assert_eq!(back["remediation"]["unhealthyConditions"][0]["for"], "5m");
    }

    #[test]
    fn a_policy_without_a_selector_selects_every_node_and_a_broken_one_is_an_error() {
        let policy = |selector: serde_json::Value| -> DisruptionPolicy {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                "metadata": {"name": "p"}, "spec": {"nodeSelector": selector},
            }))
            .expect("a policy")
        };
        let labels = [("pool".to_owned(), "a".to_owned())].into();
        assert_eq!(policy(serde_json::Value::Null).selects(&labels), Ok(true));
        assert_eq!(policy(serde_json::json!({})).selects(&labels), Ok(true));
        assert_eq!(
            policy(serde_json::json!({"matchLabels": {"pool": "a"}})).selects(&labels),
            Ok(true)
        );
        assert_eq!(
            policy(serde_json::json!({"matchLabels": {"pool": "b"}})).selects(&labels),
            Ok(false)
        );
        let broken = serde_json::json!({"matchExpressions": [{"key": "pool", "operator": "Near"}]});
        assert!(policy(broken).selects(&labels).is_err());
    }
}
