//! The admission rules, as one table ([`RULES`]): each has a name (the `rule` label of the
//! coordinator's denial metric, and the row of the coordinator's documentation), the denial
//! reasons it may give (the `Admitted` condition's reason on a maintenance), where its input
//! comes from, and the check itself. A pending maintenance is admitted only if no rule denies
//! it; the first that does, in the table's order, is the one reported. The order says what an
//! operator needs to hear first: the node itself, the policies' own state (invalid, paused,
//! outside a window), what holds the node back, and only then the budgets.

use std::collections::BTreeSet;

use nodeward_api::conditions::denial;

pub use super::cluster::Exception;
use super::cluster::{Cluster, NodeState, Pending, PolicyState};

/// What every rule decides on: the cluster, its NotReady nodes (taken once per round), the node
/// of the maintenance, the maintenance, and the policies that select the node.
pub struct Inputs<'a> {
    pub cluster: &'a Cluster,
    pub not_ready: &'a BTreeSet<String>,
    pub node: &'a NodeState,
    pub pending: &'a Pending,
    pub policies: &'a [&'a PolicyState],
}

/// Why a maintenance is not admitted now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// The [`Rule::name`] that denied it.
    pub rule: &'static str,
    /// One of the rule's [`Rule::reasons`] (see [`denial`]).
    pub reason: &'static str,
    pub message: String,
}

/// A rule's verdict: the denial's reason and message, if it denies.
type Verdict = Result<(), (&'static str, String)>;

/// One admission rule.
pub struct Rule {
    /// camelCase, as the metrics and the documentation name it.
    pub name: &'static str,
    /// The denial reasons it gives.
    pub reasons: &'static [&'static str],
    /// What it decides on, and where the coordinator gets that.
    pub input: &'static str,
    /// The maintenances admitted without it: one whose node goes down anyway
    /// (`spec.disruptionDeadline`, a cloud's notice) waits for no window, blocker,
    /// PodDisruptionBudget, quorum or free slot (waiting only means the disruption comes
    /// undrained); an urgent one for no window or blocker.
    pub waived_for: &'static [Exception],
    check: fn(&Inputs) -> Verdict,
}

impl Rule {
    /// The rule applied to `inputs`.
    pub fn judge(&self, inputs: &Inputs) -> Result<(), Denial> {
        if self.waived_for.iter().any(|e| inputs.pending.is(*e)) {
            return Ok(());
        }
        (self.check)(inputs).map_err(|(reason, message)| Denial {
            rule: self.name,
            reason,
            message,
        })
    }
}

/// The rule that says whether the node can be disrupted at all (it also names a denial for a
/// node that does not exist, decided before the table is consulted).
pub const NODE: &str = "node";

/// The most policies an admission record names (the CRD's bound).
pub const MAX_POLICIES_PER_NODE: usize = 128;

/// Every admission rule, in the order they are checked.
pub const RULES: &[Rule] = &[
    Rule {
        name: NODE,
        reasons: &[denial::BLOCKED],
        input: "the Node and the admitted maintenances: the node exists and has none admitted",
        waived_for: &[],
        check: node_free,
    },
    Rule {
        name: "policiesValid",
        reasons: &[denial::BLOCKED],
        input: "every DisruptionPolicy selecting the node: its selector, limits and windows are valid, and at most 128 select it",
        waived_for: &[],
        check: policies_valid,
    },
    Rule {
        name: "paused",
        reasons: &[denial::PAUSED],
        input: "spec.paused of those policies",
        waived_for: &[],
        check: not_paused,
    },
    Rule {
        name: "failureBudget",
        reasons: &[denial::ROLLOUT_HALTED],
        input: "spec.failureBudget of those policies: the Failed maintenances each admitted within its window, since its last resume",
        waived_for: &[Exception::Unavoidable],
        check: not_halted,
    },
    Rule {
        name: "window",
        reasons: &[denial::OUTSIDE_WINDOW],
        input: "spec.windows of those policies, and the time",
        waived_for: &[Exception::Unavoidable, Exception::Urgent],
        check: window_open,
    },
    Rule {
        name: "blackout",
        reasons: &[denial::IN_BLACKOUT],
        input: "spec.blackouts of those policies, and the time",
        waived_for: &[Exception::Unavoidable],
        check: not_in_blackout,
    },
    Rule {
        name: "blocker",
        reasons: &[denial::BLOCKED],
        input: "spec.rebootBlockers: pods on the node and firing Prometheus alerts, looked up before the round (not for Remediation)",
        waived_for: &[Exception::Unavoidable, Exception::Urgent],
        check: not_blocked,
    },
    Rule {
        name: "gate",
        reasons: &[denial::GATE_CLOSED],
        input: "spec.gates of those policies: CEL expressions over the objects they name, read before the round (not for Remediation)",
        waived_for: &[Exception::Unavoidable],
        check: gates_open,
    },
    Rule {
        name: "canary",
        reasons: &[denial::CANARY_PENDING],
        input: "spec.canary of those policies: their planned reboots (Reboot or Manual, action Reboot) admitted and finished, by node (planned reboots only; an urgent one skips the soak)",
        waived_for: &[Exception::Unavoidable],
        check: canaries_done,
    },
    Rule {
        name: "agent",
        reasons: &[denial::AGENT_UNAVAILABLE],
        input: "the node agent's Lease: a recent heartbeat (for maintenances an agent carries out)",
        waived_for: &[],
        check: agent_available,
    },
    Rule {
        name: "workloads",
        reasons: &[denial::WORKLOAD_NOT_READY],
        input: "the PodDisruptionBudgets of the node's pods (spec.workloadGate.checkDisruptionBudgets)",
        waived_for: &[Exception::Unavoidable],
        check: workloads_allow,
    },
    Rule {
        name: "quorum",
        reasons: &[denial::QUORUM_PROTECTED],
        input: "the control-plane Nodes: every other one Ready and undisrupted, and never the only one unless spec.allowSoleControlPlane",
        waived_for: &[Exception::Unavoidable],
        check: quorum_allows,
    },
    Rule {
        name: "maxUnhealthy",
        reasons: &[denial::TOO_MANY_UNHEALTHY],
        input: "the nodes' health by spec.remediation against spec.maxUnhealthy (Remediation only)",
        waived_for: &[],
        check: health_allows,
    },
    Rule {
        name: "budget",
        reasons: &[denial::BUDGET_EXHAUSTED],
        input: "spec.maxConcurrent against the admitted, unfinished maintenances, the NotReady nodes and the nodes other actors disrupt; spec.maxConcurrentByReason against those of the maintenance's reason",
        waived_for: &[Exception::Unavoidable],
        check: budgets_allow,
    },
    Rule {
        name: "podsKnown",
        reasons: &[denial::WORKLOAD_NOT_READY],
        input: "the scan of the node's pods for the Deployments an admission surges",
        waived_for: &[],
        check: pods_known,
    },
];

fn node_free(i: &Inputs) -> Verdict {
    if i.cluster.disrupted.contains(&i.pending.node) {
        return Err((
            denial::BLOCKED,
            format!(
                "node {} already has an admitted maintenance",
                i.pending.node
            ),
        ));
    }
    Ok(())
}

fn policies_valid(i: &Inputs) -> Verdict {
    if i.policies.len() > MAX_POLICIES_PER_NODE {
        return Err((
            denial::BLOCKED,
            format!(
                "{} policies select the node; an admission names at most {MAX_POLICIES_PER_NODE} (narrow their nodeSelectors)",
                i.policies.len()
            ),
        ));
    }
    match i
        .policies
        .iter()
        .find_map(|p| p.invalid.as_ref().map(|problem| (p, problem)))
    {
        Some((p, problem)) => Err((
            denial::BLOCKED,
            format!("policy {} is invalid: {problem}", p.name),
        )),
        None => Ok(()),
    }
}

fn not_paused(i: &Inputs) -> Verdict {
    match i.policies.iter().find(|p| p.paused) {
        Some(p) => Err((denial::PAUSED, format!("policy {} is paused", p.name))),
        None => Ok(()),
    }
}

/// The first of the node's policies for which `why` gives a reason, with it.
fn first_policy<'a>(
    i: &Inputs<'a>,
    why: impl Fn(&'a PolicyState) -> Option<&'a String>,
) -> Option<(&'a PolicyState, &'a String)> {
    i.policies.iter().find_map(|p| Some((*p, why(p)?)))
}

fn not_halted(i: &Inputs) -> Verdict {
    match first_policy(i, |p| p.halted.as_ref()) {
        Some((p, why)) => Err((
            denial::ROLLOUT_HALTED,
            format!(
                "policy {} is halted ({why}); resume it with kubectl nodeward resume {}",
                p.name, p.name
            ),
        )),
        None => Ok(()),
    }
}

fn window_open(i: &Inputs) -> Verdict {
    match i.policies.iter().find(|p| !p.window_open) {
        Some(p) => Err((
            denial::OUTSIDE_WINDOW,
            format!(
                "policy {} has no maintenance window open now{}",
                p.name,
                p.next_window
                    .map(|t| format!("; the next opens at {t}"))
                    .unwrap_or_default()
            ),
        )),
        None => Ok(()),
    }
}

/// No policy is in one of its blackouts.
fn not_in_blackout(i: &Inputs) -> Verdict {
    match first_policy(i, |p| p.blackout.as_ref()) {
        Some((p, why)) => Err((denial::IN_BLACKOUT, format!("policy {} is {why}", p.name))),
        None => Ok(()),
    }
}

/// No blocker (an alert, a blocking pod) holds the node, unless it is being repaired.
fn not_blocked(i: &Inputs) -> Verdict {
    // Remediation is not held back: a failing node's own alerts must not stop its repair.
    match i
        .node
        .blocker
        .as_ref()
        .filter(|_| !i.pending.is_remediation())
    {
        Some(blocker) => Err((
            denial::BLOCKED,
            format!("disruption of {} is blocked: {blocker}", i.pending.node),
        )),
        None => Ok(()),
    }
}

/// Every gate of every policy holds, unless the node is being repaired (a failing node can be
/// why a gate's object is unhealthy).
fn gates_open(i: &Inputs) -> Verdict {
    if i.pending.is_remediation() {
        return Ok(());
    }
    match first_policy(i, |p| p.gate_closed.as_ref()) {
        Some((p, why)) => Err((denial::GATE_CLOSED, format!("policy {}: {why}", p.name))),
        None => Ok(()),
    }
}

/// A planned reboot goes as a canary, or after the canaries of every policy with a canary
/// stage succeeded (and soaked).
fn canaries_done(i: &Inputs) -> Verdict {
    let Some(planned) = i.pending.planned else {
        return Ok(());
    };
    let p = &i.pending;
    match i.policies.iter().find_map(|policy| {
        let stage = policy.canary.as_ref()?;
        let why = stage
            .judge(&p.node, planned.created, p.urgent, planned.now)
            .err()?;
        Some((policy, why))
    }) {
        Some((policy, why)) => Err((
            denial::CANARY_PENDING,
            format!("policy {}: {why}", policy.name),
        )),
        None => Ok(()),
    }
}

/// The node has an agent to carry the maintenance out, if it needs one: admitting it to a node
/// without one would hold a budget slot that nothing frees until a deadline passes.
fn agent_available(i: &Inputs) -> Verdict {
    match i
        .node
        .agent_unavailable
        .as_ref()
        .filter(|_| i.pending.needs_agent)
    {
        Some(why) => Err((denial::AGENT_UNAVAILABLE, why.clone())),
        None => Ok(()),
    }
}

/// No PodDisruptionBudget of a pod on the node allows no disruption, where a policy (or the
/// default, when none selects the node) checks them and the node's agent would drain it:
/// admitting it would cordon the node and then wait on the Eviction API's refusals.
fn workloads_allow(i: &Inputs) -> Verdict {
    workload_check(i.node.workload.as_ref(), i)
}

/// The node's pods were looked at, where its workloads are checked: last, so that a node the
/// budgets deny anyway is denied for them.
fn pods_known(i: &Inputs) -> Verdict {
    workload_check(i.node.unscanned.as_ref(), i)
}

/// Denies `WorkloadNotReady` for `why`, where a policy checks workloads and an agent drains.
fn workload_check(why: Option<&String>, i: &Inputs) -> Verdict {
    let checked = i.policies.is_empty() || i.policies.iter().any(|p| p.checks_workloads);
    match why.filter(|_| checked && i.pending.needs_agent) {
        Some(why) => Err((denial::WORKLOAD_NOT_READY, why.clone())),
        None => Ok(()),
    }
}

/// A control-plane node goes only while every other is Ready and undisrupted, and the sole
/// one only where every policy allows it.
fn quorum_allows(i: &Inputs) -> Verdict {
    if !i.node.control_plane {
        return Ok(());
    }
    let others: Vec<(&String, &NodeState)> = i
        .cluster
        .nodes
        .iter()
        .filter(|(name, n)| n.control_plane && **name != i.pending.node)
        .collect();
    if let Some((name, other)) = others
        .iter()
        .find(|(name, n)| !n.ready || i.cluster.disrupted.contains(*name))
    {
        let state = if other.ready { "disrupted" } else { "NotReady" };
        return Err((
            denial::QUORUM_PROTECTED,
            format!("control-plane node {name} is {state}; one control-plane node at a time"),
        ));
    }
    let sole_allowed =
        !i.policies.is_empty() && i.policies.iter().all(|p| p.allow_sole_control_plane);
    if others.is_empty() && !sole_allowed {
        return Err((
            denial::QUORUM_PROTECTED,
            format!(
                "{} is the only control-plane node (set allowSoleControlPlane to allow it)",
                i.pending.node
            ),
        ));
    }
    Ok(())
}

/// A repair goes only while no policy counts more unhealthy nodes than its `maxUnhealthy`.
fn health_allows(i: &Inputs) -> Verdict {
    if !i.pending.is_remediation() {
        return Ok(());
    }
    for p in i.policies {
        let unhealthy = p
            .matched
            .iter()
            .filter(|n| i.cluster.nodes.get(*n).is_some_and(|s| s.unhealthy))
            .count();
        if let Some(limit) = p.max_unhealthy.filter(|limit| unhealthy > *limit) {
            return Err((
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

/// Every policy counting the node has a disruption left in its `maxConcurrent`, and one for a
/// maintenance of this reason in its `maxConcurrentByReason`.
fn budgets_allow(i: &Inputs) -> Verdict {
    let reason = i.pending.reason;
    for p in i.policies {
        let in_use = i.cluster.in_use(p, i.not_ready, Some(&i.pending.node));
        if in_use.len() >= p.max_concurrent {
            return Err(exhausted(
                i.cluster,
                &p.name,
                &format!("{} disrupted nodes", p.max_concurrent),
                &in_use,
            ));
        }
        let Some(&limit) = p.max_by_reason.get(&reason) else {
            continue;
        };
        let of_reason: BTreeSet<&String> = i
            .cluster
            .by_reason
            .get(&reason)
            .into_iter()
            .flatten()
            .filter(|n| p.matched.contains(*n))
            .collect();
        if of_reason.len() >= limit {
            return Err(exhausted(
                i.cluster,
                &p.name,
                &format!("{limit} {reason:?} maintenances"),
                &of_reason,
            ));
        }
    }
    Ok(())
}

/// The denial of a policy whose budget of `allowed` is taken by `in_use`.
fn exhausted(
    cluster: &Cluster,
    policy: &str,
    allowed: &str,
    in_use: &BTreeSet<&String>,
) -> (&'static str, String) {
    let count = in_use.len();
    let mut names: Vec<String> = in_use.iter().take(5).map(|n| cluster.named(n)).collect();
    if count > names.len() {
        names.push("...".to_owned());
    }
    (
        denial::BUDGET_EXHAUSTED,
        format!(
            "policy {policy} allows {allowed} at once and has {count} ({})",
            names.join(", ")
        ),
    )
}
