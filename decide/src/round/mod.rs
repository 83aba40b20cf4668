//! One reconcile round's decisions, as a pure function of the watched objects, the time and
//! what the coordinator remembers between rounds: which budget slots to free, which pending
//! maintenances to admit or deny (oldest first), each policy's new status (slots, counts,
//! `Paused`, `RemediationAllowed`), which maintenances lost their node, and what remediation
//! to start. The controller carries the plan out; nothing here does I/O.
//!
//! A round goes in stages, one module each: [`view`] indexes the objects and resolves each
//! policy, [`slots`] keeps the budget slots that still hold and ends maintenances whose node is
//! gone, [`remediate`] judges node health and asks for remediation, [`admit`] decides pending
//! maintenances, [`overdue`] holds admitted ones to their deadlines, [`out_of_service`]
//! taints dead nodes ([`dead_nodes`] judges them), and [`policy_status`] writes each policy's
//! status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Node},
    apimachinery::pkg::apis::meta::v1::Time,
};
use nodeward_api::{
    DisruptionPolicy, DisruptionPolicyStatus, MaintenanceAction, MaintenancePhase, NodeMaintenance,
    NodeReport,
    maintenance::{PhaseDeadline, WorkloadRef},
    policy::{ResolvedDeadlines, StartupAction},
};

use crate::{admission::decide::Cluster, health::RemediationGate};

mod admit;
mod dead_nodes;
mod effects;
pub mod expire;
#[cfg(test)]
mod fixtures;
pub mod marks;
mod node_labels;
pub mod others;
mod out_of_service;
mod overdue;
mod pending_taint;
mod policy_status;
mod remediate;
mod slots;
pub mod surge;
#[cfg(test)]
mod tests;
mod view;
pub mod workload_gate;

pub use admit::{Superseded, admit_new};
pub use effects::{EFFECTS, Effect};

/// The most superseded requests a round ends: the rest wait for the next rounds, so that a
/// flood of them never holds up a round's other writes.
pub const SUPERSEDED_PER_ROUND: usize = 20;
pub use policy_status::set_condition;

/// The watched objects of one round.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub nodes: Vec<Arc<Node>>,
    pub policies: Vec<Arc<DisruptionPolicy>>,
    pub maintenances: Vec<Arc<NodeMaintenance>>,
    pub reports: Vec<Arc<NodeReport>>,
    /// The agents' Leases (their liveness).
    pub leases: Vec<Arc<Lease>>,
    /// Why a disruption of a node is blocked now (see [`crate::blockers`]), by node.
    pub blockers: BTreeMap<String, String>,
    /// The objects of the policies' gates as read before the round ([`crate::gates::wanted`]).
    pub gates: BTreeMap<nodeward_api::policy::GateObject, crate::gates::Looked>,
    /// Which PodDisruptionBudget holds a node back now (see [`crate::workloads`]), by node.
    pub workloads: BTreeMap<String, String>,
    /// The availability of the workloads Verifying reboots evicted ([`workload_gate::wanted`]).
    pub availability: BTreeMap<WorkloadRef, workload_gate::Seen>,
    /// The single-replica Deployments on the nodes of pending maintenances, by node (see
    /// [`surge`]); an error (the lookup failed, or was not made yet) holds the node back.
    pub scans: BTreeMap<String, surge::Scan>,
    /// The surged Deployments ([`surge::wanted`]) as read now.
    pub surged: BTreeMap<(String, String, String), surge::Looked>,
    /// Not an object but the coordinator's `--finished-maintenance-ttl`: finished maintenances
    /// older than this are deleted ([`expire`]); `None` keeps them.
    pub finished_ttl: Option<Duration>,
    /// Not an object but the coordinator's `--mark-for-other-actors`: the marks a node carries
    /// while its maintenance is under way ([`marks`]).
    pub marks: Vec<marks::Mark>,
}

/// What the coordinator carries from one round to the next.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// The uids of the Nodes seen Ready at least once (a Node object alone does not say whether
    /// it ever was).
    pub seen_ready: BTreeSet<String>,
    /// The `maxUnhealthy` gate of each policy, with its cooldown.
    pub gates: BTreeMap<String, RemediationGate>,
    /// Objects confirmed gone by a direct read. A watch can lag: a slot whose maintenance or
    /// node is missing from this coordinator's view is freed only once its absence is
    /// confirmed, or a lagging coordinator could free a slot another one just took.
    pub confirmed_gone: BTreeSet<Gone>,
}

/// An object missing from the watched state.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Gone {
    /// A NodeMaintenance: name and the uid the slot recorded.
    Maintenance {
        name: String,
        uid: String,
    },
    Node(String),
}

/// Everything a round decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Policies whose status must change (to be written with their resourceVersion).
    pub policy_status: BTreeMap<String, DisruptionPolicyStatus>,
    /// Maintenances to mark Admitted, with every policy whose slot they hold.
    pub admit: Vec<Admission>,
    pub deny: Vec<Denial>,
    /// Surges to record, raise, mark or restore ([`surge::work`]).
    pub surges: Vec<surge::Work>,
    /// `WorkloadsAvailable` conditions to write on Verifying reboots.
    pub workload_verdicts: Vec<workload_gate::WorkloadVerdict>,
    /// Unfinished maintenances to end because their node is gone.
    pub end: Vec<Ending>,
    /// Maintenances whose deadline passed, to move on without their agent.
    pub overdue: Vec<Overdue>,
    /// Deadlines to record in maintenances' statuses.
    pub deadlines: Vec<DeadlineRecord>,
    /// Maintenances to finish in place of their lost agent.
    pub take_over: Vec<TakeOver>,
    /// Dead nodes to taint out of service, and nodes Ready again to take nodeward's taint from.
    pub out_of_service: Vec<OutOfService>,
    /// Labels and annotations to change on nodes around their maintenances ([`node_labels`]).
    pub node_edits: Vec<NodeEdit>,
    /// Nodes to put nodeward's pending taint on, or take it from ([`pending_taint`]).
    pub pending_taints: Vec<PendingTaint>,
    /// Dead nodes a policy would taint out of service, and why not now.
    pub out_of_service_waits: Vec<(String, String)>,
    /// Remediation maintenances to create.
    pub remediate: Vec<RemediationRequest>,
    /// Nodes that never became Ready within a policy's `nodeStartupTimeout`.
    pub startup_timeouts: Vec<StartupTimeout>,
    /// Nodes Ready after all whose `StartupTimedOut` is still True: it is set False.
    pub started_late: Vec<String>,
    /// Per policy: nodes disrupted now (slots plus NotReady) and the `maxConcurrent` count.
    pub budget_use: BTreeMap<String, (usize, usize)>,
    pub unhealthy: BTreeMap<String, usize>,
    /// Every unhealthy node (under any policy's rules, or NotReady), and why.
    pub unhealthy_nodes: BTreeMap<String, String>,
    /// A node's older reboot requests, superseded by its newest (ended Failed, a few a round).
    pub superseded: Vec<Superseded>,
    /// Missing objects to confirm gone before their slots are freed.
    pub confirm_gone: BTreeSet<Gone>,
    /// Nodes whose DeleteNode maintenance is drained (Acting): the coordinator deletes them.
    pub delete_nodes: Vec<NodeDeletion>,
    /// Finished maintenances past the TTL, to delete ([`expire`]).
    pub expire: Vec<expire::Expired>,
    /// What maintenances created after this round can be decided against.
    pub standing: Standing,
}

/// The state a round decided on and left, for [`admit_new`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Standing {
    /// The cluster as admission saw it, with this round's admissions.
    pub cluster: Cluster,
    /// Its NotReady nodes ([`Cluster::not_ready`]): readiness changes only in a full round.
    pub not_ready: BTreeSet<String>,
    /// Each policy as decided on.
    pub policies: BTreeMap<String, PolicyMark>,
}

/// A policy's generation and the slots (maintenance uids) it holds after a round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyMark {
    pub generation: Option<i64>,
    pub slots: BTreeSet<String>,
}

/// Labels and annotations to set (`Some`) or remove (`None`) on the Node `node` with `uid`, and
/// the other actors' marks to put on or take off ([`marks::apply`], against the Node written).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeEdit {
    pub node: String,
    pub uid: String,
    pub labels: std::collections::BTreeMap<String, Option<String>>,
    pub annotations: std::collections::BTreeMap<String, Option<String>>,
    pub marks: Option<marks::MarksChange>,
}

/// The pending taint on a node (`on`) or off it.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingTaint {
    pub node: String,
    pub uid: String,
    pub on: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub maintenance: String,
    pub uid: String,
    /// The uid of its Node as admission saw it.
    pub node_uid: String,
    /// Every policy matching the node (its slot in each is written first).
    pub policies: Vec<String>,
    /// Policies whose slot is new in this round; the admission stands only once all are written.
    pub new_slots_in: Vec<String>,
    /// Those policies' deadlines, the longest of each (its start deadline is written with it).
    pub deadlines: ResolvedDeadlines,
    /// The surges planned for the node's single-replica Deployments that ask for one.
    pub surges: Vec<nodeward_api::maintenance::Surge>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Denial {
    pub maintenance: String,
    /// The admission rule that denied it ([`crate::admission::rules::RULES`]).
    pub rule: &'static str,
    pub reason: &'static str,
    pub message: String,
    /// A half-done admission (its slots written, the maintenance still Pending) that no longer
    /// fits: its slots stay in this round's plan, and the writer frees them only once this
    /// denial is written over the version decided on (see `controller::Controller::release`).
    pub gives_back_slots: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Ending {
    pub maintenance: String,
    pub phase: MaintenancePhase,
    /// Why, in one word (`status.reason`).
    pub reason: &'static str,
    pub message: String,
}

/// A maintenance whose deadline passed (see [`crate::deadlines`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Overdue {
    pub maintenance: String,
    /// Pending (sent back, its admission undone) or Failed.
    pub to: MaintenancePhase,
    /// The Event's reason (one of `conditions::overdue`).
    pub reason: &'static str,
    pub message: String,
}

/// The out-of-service taint to put on a dead node (`on`) or to take from one Ready again.
#[derive(Clone, Debug, PartialEq)]
pub struct OutOfService {
    pub node: String,
    /// The Node's uid as this round saw it.
    pub uid: String,
    pub on: bool,
    pub message: String,
}

/// A maintenance the coordinator finishes in place of its lost agent.
#[derive(Clone, Debug, PartialEq)]
pub struct TakeOver {
    pub maintenance: String,
    pub node: String,
    pub takeover: crate::deadlines::Takeover,
    /// Whether the maintenance taint goes with it (no other maintenance holds the node).
    pub untaint: bool,
    pub message: String,
}

/// The deadline of a maintenance's current phase, to record in its status.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadlineRecord {
    pub maintenance: String,
    pub deadline: PhaseDeadline,
}

/// A Node to delete for its drained DeleteNode maintenance; `uid` is the Node's as this
/// round saw it, the delete's precondition (a Node re-created under the name stays).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeDeletion {
    pub maintenance: String,
    pub node: String,
    pub uid: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RemediationRequest {
    pub policy: String,
    pub node: String,
    pub action: MaintenanceAction,
    pub message: String,
    /// A Reboot remediation that did not bring health back: it is failed and replaced.
    pub replaces: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StartupTimeout {
    pub node: String,
    /// The Node's uid as this round saw it: a delete's precondition.
    pub uid: String,
    pub policy: String,
    pub message: String,
    pub action: StartupAction,
    /// Whether the node already carries the condition (then no new Event).
    pub reported: bool,
}

/// Decides one round.
pub fn plan(objects: &Objects, memory: &mut Memory, now: Timestamp) -> Plan {
    let mut plan = Plan::default();
    let index = view::Index::new(objects, memory, now);
    let mut slots = slots::kept(&index, memory, &mut plan.confirm_gone);
    let disrupted_by = slots::disrupted_by(&index, &slots);
    let health = remediate::assess(&index, memory, now, &mut plan.unhealthy_nodes);
    let judged = dead_nodes::judged(&index, now);
    let mut cluster = view::cluster(
        &index,
        &objects.blockers,
        &health.unhealthy,
        &slots,
        &disrupted_by,
        &judged.dead,
        now,
    );
    for (node, why) in &objects.workloads {
        if let Some(state) = cluster.nodes.get_mut(node) {
            state.workload = Some(why.clone());
        }
    }
    for (node, state) in &mut cluster.nodes {
        surge::apply_scan(state, objects.scans.get(node));
    }
    let not_ready = cluster.not_ready();
    let (pending, superseded) = admit::pending_oldest_first(index.maintenances.values().copied());
    // Written a few at a time: one node's identity may have created thousands.
    plan.superseded = superseded.into_iter().take(SUPERSEDED_PER_ROUND).collect();
    admit::admit_pending(
        &mut cluster,
        &not_ready,
        &mut slots,
        &disrupted_by,
        &pending,
        now,
        &mut plan,
    );
    slots::end_where_node_gone(&index, memory, &slots, &mut plan);
    overdue::enforce(&index, &cluster, now, &mut plan);
    overdue::take_over(&index, memory, &disrupted_by, now, &mut plan);
    let gates = remediate::remediate(&index, &health, &cluster, memory, now, &mut plan);
    plan.started_late = remediate::started_late(&index);
    out_of_service::decide(&index, &cluster, &judged.not_known_down, &mut plan);
    pending_taint::decide(&index, &mut plan);
    node_labels::decide(&index, &mut plan);
    marks::decide(&index, &objects.marks, &mut plan);
    workload_gate::judge(objects, &objects.availability, now, &mut plan);
    plan.surges = surge_work(objects);
    expire::decide(&index, objects.finished_ttl, now, &mut plan);
    let listed = policy_status::Listed {
        slots,
        scans: &objects.scans,
        not_ready: &not_ready,
    };
    policy_status::write(&index, &health, &cluster, listed, &gates, now, &mut plan);
    plan.standing.cluster = cluster;
    plan.standing.not_ready = not_ready;
    plan
}

/// The surge work of every maintenance that has some.
fn surge_work(objects: &Objects) -> Vec<surge::Work> {
    let cordoned: BTreeSet<&str> = objects
        .nodes
        .iter()
        .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    objects
        .maintenances
        .iter()
        .filter_map(|m| {
            surge::work(
                m,
                cordoned.contains(m.spec.node_name.as_str()),
                &objects.surged,
            )
        })
        .collect()
}

fn timestamp(time: Option<&Time>) -> Timestamp {
    time.map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

fn std_duration(d: Option<&nodeward_api::Duration>) -> Option<Duration> {
    d.and_then(|d| d.to_std().ok())
}

/// A count for a status field.
fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
