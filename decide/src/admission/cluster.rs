//! What admission knows of the cluster, as plain data: each node's state, each policy with its
//! limits resolved to counts, the disrupted nodes, and the maintenance to decide. The rounds in
//! [`crate::round`] build it from the watched objects; [`super::rules`] judge by it.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use nodeward_api::{MaintenanceReason, policy::ResolvedDeadlines};

/// What admission needs to know of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    /// The Node object's uid.
    pub uid: String,
    pub ready: bool,
    pub control_plane: bool,
    /// Unhealthy by the remediation rules (NotReady, conditions held too long, stale agent).
    pub unhealthy: bool,
    /// Why a disruption of this node is blocked right now (a blocking pod, a firing alert);
    /// does not hold back remediation.
    pub blocker: Option<String>,
    /// Which PodDisruptionBudget allows no disruption of a pod on the node now (see
    /// [`super::workload`]).
    pub workload: Option<String>,
    /// The surges an admission of the node plans (see [`crate::round::surge`]).
    pub surges: Vec<nodeward_api::maintenance::Surge>,
    /// Why the node's pods are not known (not looked at yet, or the lookup failed): without
    /// them an admission could not plan the surges its Deployments ask for.
    pub unscanned: Option<String>,
    /// Why no agent can carry a maintenance of this node out (a missing or stale heartbeat).
    pub agent_unavailable: Option<String>,
    /// Why the node is dead (NotReady, its agent silent, unreachable from its peers), if it is:
    /// the coordinator may then act on it without its agent.
    pub dead: Option<String>,
}

/// One policy, with its limits already resolved to counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyState {
    pub name: String,
    /// The nodes its selector matches.
    pub matched: BTreeSet<String>,
    pub max_concurrent: usize,
    /// `maxConcurrentByReason`, resolved: the most of nodeward's maintenances of a reason at
    /// once.
    pub max_by_reason: BTreeMap<MaintenanceReason, usize>,
    pub max_unhealthy: Option<usize>,
    pub paused: bool,
    /// Whether one of its windows is open now (true when it has none).
    pub window_open: bool,
    /// When its next window opens, while none is open.
    pub next_window: Option<jiff::Timestamp>,
    /// Why it admits nothing now, while one of its blackouts holds ([`super::window::in_blackout`]).
    pub blackout: Option<String>,
    pub allow_sole_control_plane: bool,
    /// `workloadGate.checkDisruptionBudgets`.
    pub checks_workloads: bool,
    /// Why the policy cannot be applied (an invalid selector, limit or window): nothing in
    /// its scope is admitted until it is fixed.
    pub invalid: Option<String>,
    /// Its deadlines, defaults filled in.
    pub deadlines: ResolvedDeadlines,
    /// Why it is halted ([`crate::failures`]): its failure budget is spent.
    pub halted: Option<String>,
    /// Why one of its `gates` holds the rollout ([`crate::gates`]).
    pub gate_closed: Option<String>,
    /// Its canary stage, if it has one ([`crate::canary`]).
    pub canary: Option<crate::canary::Stage>,
}

/// The cluster as admission sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cluster {
    pub nodes: BTreeMap<String, NodeState>,
    pub policies: Vec<PolicyState>,
    /// Nodes with an admitted, unfinished maintenance.
    pub disrupted: BTreeSet<String>,
    /// Nodes another actor is disrupting (cordoned by someone else, being removed by the
    /// cluster autoscaler or Karpenter, fenced by medik8s), with who: they count against the
    /// budgets as nodeward's own do.
    pub others: BTreeMap<String, String>,
    /// The nodes of `disrupted` by the reasons of the maintenances that disrupt them.
    pub by_reason: BTreeMap<MaintenanceReason, BTreeSet<String>>,
}

impl Cluster {
    /// Its NotReady nodes. Readiness stays put while a round decides (only `disrupted` grows),
    /// so a round takes this once instead of scanning every node for each decision: thousands
    /// of pending maintenances would cost thousands of scans of thousands of nodes.
    pub fn not_ready(&self) -> BTreeSet<String> {
        self.nodes
            .iter()
            .filter(|(_, s)| !s.ready)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The nodes of `policy` that count against its budget: disrupted by nodeward or another
    /// actor, or NotReady (of `not_ready`, [`Self::not_ready`]), except `except`, the node being
    /// decided: its own NotReady is what its maintenance fixes, and another actor's disruption of
    /// it (an admin's cordon before asking for the reboot) takes no other node.
    pub fn in_use<'a>(
        &'a self,
        policy: &PolicyState,
        not_ready: &'a BTreeSet<String>,
        except: Option<&str>,
    ) -> BTreeSet<&'a String> {
        // Disrupted and NotReady nodes are few; a policy can match thousands.
        let not_own = |n: &&String| Some(n.as_str()) != except;
        self.disrupted
            .iter()
            .chain(not_ready.iter().filter(not_own))
            .chain(self.others.keys().filter(not_own))
            .filter(|n| policy.matched.contains(*n))
            .collect()
    }

    /// Marks `node` disrupted by a maintenance of `reason`.
    pub fn disrupt(&mut self, node: &str, reason: MaintenanceReason) {
        self.disrupted.insert(node.to_owned());
        self.by_reason
            .entry(reason)
            .or_default()
            .insert(node.to_owned());
    }

    /// Forgets that `node` is disrupted by a maintenance of `reason` (it was the one being
    /// decided).
    pub fn undisrupt(&mut self, node: &str, reason: MaintenanceReason) {
        self.disrupted.remove(node);
        if let Some(nodes) = self.by_reason.get_mut(&reason) {
            nodes.remove(node);
        }
    }

    /// `node` as a denial names it: with the other actor disrupting it, if one is.
    pub fn named(&self, node: &str) -> String {
        match self.others.get(node) {
            Some(actor) if !self.disrupted.contains(node) => format!("{node} ({actor})"),
            _ => node.to_owned(),
        }
    }
}

/// A maintenance waiting for admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub maintenance: String,
    pub node: String,
    /// Its reason (`Remediation` is subject to `maxUnhealthy`; each to its
    /// `maxConcurrentByReason`).
    pub reason: MaintenanceReason,
    /// Whether the node's agent carries it out (a coordinator action, such as deleting a node
    /// that never became Ready, needs none).
    pub needs_agent: bool,
    /// When its node goes down whatever nodeward decides (`spec.disruptionDeadline`).
    pub disruption_deadline: Option<Timestamp>,
    /// An emergency (`spec.urgent`).
    pub urgent: bool,
    /// Set for a planned reboot, which a canary stage holds ([`crate::canary::planned`]).
    pub planned: Option<Planned>,
}

/// What a canary stage needs to know of a planned reboot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    /// When it was created: the canaries whose success stands for it succeeded at most
    /// `canary.validFor` before.
    pub created: Timestamp,
    /// The time of the decision.
    pub now: Timestamp,
}

impl Pending {
    /// Whether it claims `exception` (see [`super::rules::Rule::waived_for`]).
    pub fn is(&self, exception: Exception) -> bool {
        match exception {
            Exception::Unavoidable => self.disruption_deadline.is_some(),
            Exception::Urgent => self.urgent,
        }
    }

    pub fn is_remediation(&self) -> bool {
        self.reason == MaintenanceReason::Remediation
    }
}

/// What lets a maintenance through a rule that holds the others ([`super::rules::Rule::waived_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exception {
    /// Its node goes down anyway (`spec.disruptionDeadline`).
    Unavoidable,
    /// An emergency (`spec.urgent`).
    Urgent,
}

impl Exception {
    /// The spec field that claims it.
    pub fn field(self) -> &'static str {
        match self {
            Self::Unavoidable => "disruptionDeadline",
            Self::Urgent => "urgent",
        }
    }
}
