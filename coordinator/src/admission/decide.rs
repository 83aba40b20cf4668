//! The admission decision: a pending maintenance is admitted only if, for every policy that
//! matches its node, (1) the disrupted nodes (admitted and unfinished, plus nodes NotReady for
//! other reasons) stay under `maxConcurrent`, (2) a window is open and the policy is not
//! paused, (3) for remediation, unhealthy nodes are within `maxUnhealthy`, (4) control-plane
//! quorum holds, (5) no reboot blocker is active, (6) the node's agent is alive to carry it
//! out, and (7) no PodDisruptionBudget covering its pods allows no disruption (the workload
//! gate, for maintenances its agent drains). Pending maintenances are taken oldest first, each admission counting against the
//! next.

use std::collections::{BTreeMap, BTreeSet};

use nodeward_api::{conditions::denial, policy::ResolvedDeadlines};

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
    pub max_unhealthy: Option<usize>,
    pub paused: bool,
    /// Whether one of its windows is open now (true when it has none).
    pub window_open: bool,
    pub allow_sole_control_plane: bool,
    /// `workloadGate.checkDisruptionBudgets`.
    pub checks_workloads: bool,
    /// Why the policy cannot be applied (an invalid selector, limit or window): nothing in
    /// its scope is admitted until it is fixed.
    pub invalid: Option<String>,
    /// Its deadlines, defaults filled in.
    pub deadlines: ResolvedDeadlines,
}

/// The cluster as admission sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cluster {
    pub nodes: BTreeMap<String, NodeState>,
    pub policies: Vec<PolicyState>,
    /// Nodes with an admitted, unfinished maintenance.
    pub disrupted: BTreeSet<String>,
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

    /// The nodes of `policy` that count against its budget: disrupted, or NotReady (of
    /// `not_ready`, [`Self::not_ready`]) except `except`, the node being decided, whose own
    /// NotReady is what its maintenance fixes.
    pub fn in_use<'a>(
        &'a self,
        policy: &PolicyState,
        not_ready: &'a BTreeSet<String>,
        except: Option<&str>,
    ) -> BTreeSet<&'a String> {
        // Disrupted and NotReady nodes are few; a policy can match thousands.
        self.disrupted
            .iter()
            .chain(not_ready.iter().filter(|n| Some(n.as_str()) != except))
            .filter(|n| policy.matched.contains(*n))
            .collect()
    }
}

/// A maintenance waiting for admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub maintenance: String,
    pub node: String,
    /// Reason `Remediation` (subject to `maxUnhealthy`).
    pub remediation: bool,
    /// Whether the node's agent carries it out (a coordinator action, such as deleting a node
    /// that never became Ready, needs none).
    pub needs_agent: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admitted: a slot in each of these policies.
    Admit { policies: Vec<String> },
    /// Not now; `reason` is one of [`denial`]'s.
    Deny {
        reason: &'static str,
        message: String,
    },
}

fn deny(reason: &'static str, message: String) -> Decision {
    Decision::Deny { reason, message }
}

/// Decides one pending maintenance against the current state (`not_ready`: the cluster's
/// [`Cluster::not_ready`]): the first rule it breaks denies it, checked in this order: the
/// node, its policies' state, blockers, the node's agent, the workloads on it, control-plane
/// quorum, `maxUnhealthy`, the budgets, and last whether its pods are known.
pub fn decide(cluster: &Cluster, not_ready: &BTreeSet<String>, pending: &Pending) -> Decision {
    let Some(node) = cluster.nodes.get(&pending.node) else {
        return deny(
            denial::BLOCKED,
            format!("node {} does not exist", pending.node),
        );
    };
    if cluster.disrupted.contains(&pending.node) {
        return deny(
            denial::BLOCKED,
            format!("node {} already has an admitted maintenance", pending.node),
        );
    }
    let policies: Vec<&PolicyState> = cluster
        .policies
        .iter()
        .filter(|p| p.matched.contains(&pending.node))
        .collect();
    let verdict = policies_allow(&policies)
        .and_then(|()| not_blocked(node, pending))
        .and_then(|()| agent_available(node, pending))
        .and_then(|()| workloads_allow(node, pending, &policies))
        .and_then(|()| quorum_allows(cluster, node, pending, &policies))
        .and_then(|()| health_allows(cluster, pending, &policies))
        .and_then(|()| budgets_allow(cluster, not_ready, pending, &policies))
        .and_then(|()| pods_known(node, pending, &policies));
    match verdict {
        Ok(()) => Decision::Admit {
            policies: policies.iter().map(|p| p.name.clone()).collect(),
        },
        Err(denied) => denied,
    }
}

/// The most policies an admission record names (the CRD's bound).
pub const MAX_POLICIES_PER_NODE: usize = 128;

/// Every policy counting the node is valid, not paused and in its window.
fn policies_allow(policies: &[&PolicyState]) -> Result<(), Decision> {
    if policies.len() > MAX_POLICIES_PER_NODE {
        return Err(deny(
            denial::BLOCKED,
            format!(
                "{} policies select the node; an admission names at most {MAX_POLICIES_PER_NODE} (narrow their nodeSelectors)",
                policies.len()
            ),
        ));
    }
    if let Some((p, problem)) = policies
        .iter()
        .find_map(|p| p.invalid.as_ref().map(|problem| (p, problem)))
    {
        return Err(deny(
            denial::BLOCKED,
            format!("policy {} is invalid: {problem}", p.name),
        ));
    }
    if let Some(p) = policies.iter().find(|p| p.paused) {
        return Err(deny(denial::PAUSED, format!("policy {} is paused", p.name)));
    }
    if let Some(p) = policies.iter().find(|p| !p.window_open) {
        return Err(deny(
            denial::OUTSIDE_WINDOW,
            format!("policy {} has no maintenance window open now", p.name),
        ));
    }
    Ok(())
}

/// No PodDisruptionBudget of a pod on the node allows no disruption, where a policy (or the
/// default, when none selects the node) checks them and the node's agent would drain it:
/// admitting it would cordon the node and then wait on the Eviction API's refusals.
fn workloads_allow(
    node: &NodeState,
    pending: &Pending,
    policies: &[&PolicyState],
) -> Result<(), Decision> {
    workload_check(node.workload.as_ref(), pending, policies)
}

/// The node's pods were looked at, where its workloads are checked: last, so that a node the
/// budgets deny anyway is denied for them.
fn pods_known(
    node: &NodeState,
    pending: &Pending,
    policies: &[&PolicyState],
) -> Result<(), Decision> {
    workload_check(node.unscanned.as_ref(), pending, policies)
}

/// Denies `WorkloadNotReady` for `why`, where a policy checks workloads and an agent drains.
fn workload_check(
    why: Option<&String>,
    pending: &Pending,
    policies: &[&PolicyState],
) -> Result<(), Decision> {
    let checked = policies.is_empty() || policies.iter().any(|p| p.checks_workloads);
    match why.filter(|_| checked && pending.needs_agent) {
        Some(why) => Err(deny(denial::WORKLOAD_NOT_READY, why.clone())),
        None => Ok(()),
    }
}

/// No blocker (an alert, a blocking pod) holds the node, unless it is being repaired.
fn not_blocked(node: &NodeState, pending: &Pending) -> Result<(), Decision> {
    // Remediation is not held back: a failing node's own alerts must not stop its repair.
    match node.blocker.as_ref().filter(|_| !pending.remediation) {
        Some(blocker) => Err(deny(
            denial::BLOCKED,
            format!("disruption of {} is blocked: {blocker}", pending.node),
        )),
        None => Ok(()),
    }
}

/// The node has an agent to carry the maintenance out, if it needs one: admitting it to a node
/// without one would hold a budget slot that nothing frees until a deadline passes.
fn agent_available(node: &NodeState, pending: &Pending) -> Result<(), Decision> {
    match node
        .agent_unavailable
        .as_ref()
        .filter(|_| pending.needs_agent)
    {
        Some(why) => Err(deny(denial::AGENT_UNAVAILABLE, why.clone())),
        None => Ok(()),
    }
}

/// A control-plane node goes only while every other is Ready and undisrupted, and the sole
/// one only where every policy allows it.
fn quorum_allows(
    cluster: &Cluster,
    node: &NodeState,
    pending: &Pending,
    policies: &[&PolicyState],
) -> Result<(), Decision> {
    if !node.control_plane {
        return Ok(());
    }
    let others: Vec<(&String, &NodeState)> = cluster
        .nodes
        .iter()
        .filter(|(name, n)| n.control_plane && **name != pending.node)
        .collect();
    if let Some((name, other)) = others
        .iter()
        .find(|(name, n)| !n.ready || cluster.disrupted.contains(*name))
    {
        let state = if other.ready { "disrupted" } else { "NotReady" };
        return Err(deny(
            denial::QUORUM_PROTECTED,
            format!("control-plane node {name} is {state}; one control-plane node at a time"),
        ));
    }
    let sole_allowed = !policies.is_empty() && policies.iter().all(|p| p.allow_sole_control_plane);
    if others.is_empty() && !sole_allowed {
        return Err(deny(
            denial::QUORUM_PROTECTED,
            format!(
                "{} is the only control-plane node (set allowSoleControlPlane to allow it)",
                pending.node
            ),
        ));
    }
    Ok(())
}

/// A repair goes only while no policy counts more unhealthy nodes than its `maxUnhealthy`.
fn health_allows(
    cluster: &Cluster,
    pending: &Pending,
    policies: &[&PolicyState],
) -> Result<(), Decision> {
    if !pending.remediation {
        return Ok(());
    }
    for p in policies {
        let unhealthy = p
            .matched
            .iter()
            .filter(|n| cluster.nodes.get(*n).is_some_and(|s| s.unhealthy))
            .count();
        if let Some(limit) = p.max_unhealthy.filter(|limit| unhealthy > *limit) {
            return Err(deny(
                denial::TOO_MANY_UNHEALTHY,
                format!(
                    "{unhealthy} nodes of policy {} are unhealthy, more than maxUnhealthy {limit}",
                    p.name
                ),
            ));
        }
    }
    Ok(())
}

/// Every policy counting the node has a disruption left in its `maxConcurrent`.
fn budgets_allow(
    cluster: &Cluster,
    not_ready: &BTreeSet<String>,
    pending: &Pending,
    policies: &[&PolicyState],
) -> Result<(), Decision> {
    for p in policies {
        let in_use = cluster.in_use(p, not_ready, Some(&pending.node));
        if in_use.len() >= p.max_concurrent {
            let count = in_use.len();
            let mut names: Vec<&str> = in_use.iter().take(5).map(|n| n.as_str()).collect();
            if count > names.len() {
                names.push("...");
            }
            return Err(deny(
                denial::BUDGET_EXHAUSTED,
                format!(
                    "policy {} allows {} disrupted nodes at once and has {count} ({})",
                    p.name,
                    p.max_concurrent,
                    names.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(cluster: &Cluster, pending: &Pending) -> Decision {
        super::decide(cluster, &cluster.not_ready(), pending)
    }

    fn ready() -> NodeState {
        NodeState {
            ready: true,
            ..NodeState::default()
        }
    }

    fn cluster(workers: usize, control_planes: usize) -> Cluster {
        let mut nodes = BTreeMap::new();
        for i in 0..workers {
            nodes.insert(format!("w{i}"), ready());
        }
        for i in 0..control_planes {
            nodes.insert(
                format!("cp{i}"),
                NodeState {
                    control_plane: true,
                    ..ready()
                },
            );
        }
        Cluster {
            policies: vec![policy("all", nodes.keys().cloned().collect(), 2)],
            nodes,
            disrupted: BTreeSet::new(),
        }
    }

    fn policy(name: &str, matched: BTreeSet<String>, max_concurrent: usize) -> PolicyState {
        PolicyState {
            name: name.into(),
            matched,
            max_concurrent,
            max_unhealthy: None,
            paused: false,
            window_open: true,
            allow_sole_control_plane: false,
            checks_workloads: true,
            invalid: None,
            deadlines: nodeward_api::policy::Deadlines::resolve(None),
        }
    }

    fn node<'a>(c: &'a mut Cluster, name: &str) -> &'a mut NodeState {
        c.nodes.get_mut(name).expect("a node of the test cluster")
    }

    fn pending(node: &str) -> Pending {
        Pending {
            maintenance: format!("m-{node}"),
            node: node.into(),
            remediation: false,
            needs_agent: true,
        }
    }

    fn reason(decision: &Decision) -> &'static str {
        match decision {
            Decision::Admit { .. } => "Admit",
            Decision::Deny { reason, .. } => reason,
        }
    }

    #[test]
    fn not_ready_nodes_count_against_the_budget_but_not_the_node_itself() {
        let mut c = cluster(4, 0);
        node(&mut c, "w3").ready = false;
        c.disrupted.insert("w0".into());
        let d = decide(&c, &pending("w1"));
        assert_eq!(reason(&d), "BudgetExhausted");
        if let Decision::Deny { message, .. } = &d {
            assert!(
                message.contains("allows 2 disrupted nodes at once and has 2 (w0, w3)"),
                "{message}"
            );
        }
        // The NotReady node itself may be repaired within the budget.
        c.disrupted.clear();
        assert_eq!(reason(&decide(&c, &pending("w3"))), "Admit");
    }

    #[test]
    fn every_matching_policy_must_allow_it() {
        let mut c = cluster(4, 0);
        c.policies
            .push(policy("pool-a", ["w0", "w1"].map(String::from).into(), 1));
        c.disrupted.insert("w1".into());
        assert_eq!(
            reason(&decide(&c, &pending("w0"))),
            "BudgetExhausted",
            "pool-a is full"
        );
        assert_eq!(
            reason(&decide(&c, &pending("w2"))),
            "Admit",
            "w2 is not in pool-a"
        );
    }

    #[test]
    fn paused_and_closed_windows_deny() {
        let mut c = cluster(2, 0);
        c.policies[0].window_open = false;
        assert_eq!(reason(&decide(&c, &pending("w0"))), "OutsideWindow");
        c.policies[0].paused = true;
        assert_eq!(
            reason(&decide(&c, &pending("w0"))),
            "Paused",
            "paused is said first"
        );
    }

    #[test]
    fn control_plane_quorum_is_protected() {
        let mut c = cluster(2, 3);
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "Admit");
        node(&mut c, "cp2").ready = false;
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "QuorumProtected");
        assert_eq!(
            reason(&decide(&c, &pending("w0"))),
            "Admit",
            "workers go on"
        );
        node(&mut c, "cp2").ready = true;
        c.disrupted.insert("cp1".into());
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "QuorumProtected");
    }

    #[test]
    fn the_only_control_plane_node_needs_explicit_permission() {
        let mut c = cluster(1, 1);
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "QuorumProtected");
        c.policies[0].allow_sole_control_plane = true;
        assert_eq!(reason(&decide(&c, &pending("cp0"))), "Admit");
    }

    #[test]
    fn remediation_stops_when_too_many_are_unhealthy() {
        let mut c = cluster(5, 0);
        c.policies[0].max_concurrent = 5;
        c.policies[0].max_unhealthy = Some(1);
        for n in ["w0", "w1"] {
            node(&mut c, n).unhealthy = true;
        }
        let mut p = pending("w0");
        p.remediation = true;
        assert_eq!(reason(&decide(&c, &p)), "TooManyUnhealthy");
        p.remediation = false;
        assert_eq!(
            reason(&decide(&c, &p)),
            "Admit",
            "a planned reboot is not remediation"
        );
    }

    #[test]
    fn blockers_unknown_nodes_and_second_maintenances_are_blocked() {
        let mut c = cluster(2, 0);
        node(&mut c, "w0").blocker = Some("pod db/primary-0 matches a blocking selector".into());
        assert_eq!(reason(&decide(&c, &pending("w0"))), "Blocked");
        assert_eq!(reason(&decide(&c, &pending("ghost"))), "Blocked");
        c.disrupted.insert("w1".into());
        assert_eq!(reason(&decide(&c, &pending("w1"))), "Blocked");
        let repair = Pending {
            remediation: true,
            ..pending("w0")
        };
        assert_eq!(
            reason(&decide(&c, &repair)),
            "Admit",
            "blockers do not hold back remediation"
        );
    }

    #[test]
    fn a_node_a_disruption_budget_holds_back_waits_unless_every_policy_of_it_stops_checking() {
        let mut c = cluster(2, 0);
        let why = "PodDisruptionBudget shop/web of Deployment shop/web allows no disruption now";
        node(&mut c, "w0").workload = Some(why.into());
        let denied = decide(&c, &pending("w0"));
        assert_eq!(reason(&denied), denial::WORKLOAD_NOT_READY);
        assert!(
            matches!(&denied, Decision::Deny { message, .. } if message == why),
            "{denied:?}"
        );
        assert_eq!(reason(&decide(&c, &pending("w1"))), "Admit");
        let coordinator_action = Pending {
            needs_agent: false,
            ..pending("w0")
        };
        assert_eq!(
            reason(&decide(&c, &coordinator_action)),
            "Admit",
            "nothing is drained"
        );
        // One policy of several checking is enough; none selecting the node checks too.
        let mut second = policy("second", c.policies[0].matched.clone(), 2);
        second.checks_workloads = false;
        c.policies.push(second);
        assert_eq!(reason(&decide(&c, &pending("w0"))), "WorkloadNotReady");
        c.policies[0].checks_workloads = false;
        assert_eq!(reason(&decide(&c, &pending("w0"))), "Admit");
        c.policies.clear();
        assert_eq!(reason(&decide(&c, &pending("w0"))), "WorkloadNotReady");
    }

    #[test]
    fn a_node_without_a_live_agent_is_admitted_only_for_what_needs_none() {
        let mut c = cluster(2, 0);
        node(&mut c, "w0").agent_unavailable = Some("node w0 has no agent heartbeat".into());
        let denied = decide(&c, &pending("w0"));
        assert_eq!(reason(&denied), denial::AGENT_UNAVAILABLE);
        assert!(
            matches!(&denied, Decision::Deny { message, .. } if message == "node w0 has no agent heartbeat"),
            "{denied:?}"
        );
        assert_eq!(reason(&decide(&c, &pending("w1"))), "Admit");
        let coordinator_action = Pending {
            needs_agent: false,
            ..pending("w0")
        };
        assert_eq!(reason(&decide(&c, &coordinator_action)), "Admit");
        c.policies[0].paused = true;
        assert_eq!(
            reason(&decide(&c, &pending("w0"))),
            denial::PAUSED,
            "the policy's own state is said first"
        );
    }
}
