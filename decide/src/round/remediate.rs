//! Node health under each policy's rules, and what it leads to: remediation maintenances
//! (within `maxUnhealthy` and its cooldown), escalation of reboots that did not help, and
//! nodes that never became Ready in time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use kube_core::ResourceExt;
use nodeward_api::{
    MaintenanceAction, MaintenanceReason, NodeMaintenance,
    conditions::node as node_conditions,
    node::is_ready,
    policy::{Remediation, StartupAction},
};

use super::{
    Memory, Plan, RemediationRequest, StartupTimeout, std_duration, timestamp,
    view::{Index, PolicyView, node_conditions, was_ready_before},
};
use crate::{
    admission::decide::{Cluster, Decision, Pending, decide},
    health::{self, Health, Observed},
};

/// Node health as this round judged it.
#[derive(Default)]
pub(super) struct Assessed<'a> {
    /// By policy (its index in [`Index::policies`]) and node; only nodes that are not healthy
    /// are entered (most are healthy; absent means healthy).
    by_policy: BTreeMap<(usize, &'a str), Health>,
    /// Nodes unhealthy under any policy's rules.
    pub unhealthy: BTreeSet<String>,
}

impl<'a> Assessed<'a> {
    /// The nodes that are not healthy under the policy at `index`, with how.
    pub fn under(&self, index: usize) -> impl Iterator<Item = (&'a str, &Health)> {
        self.by_policy
            .range((index, "")..(index + 1, ""))
            .map(|(&(_, name), h)| (name, h))
    }

    /// How many nodes are unhealthy (or never became Ready) under the policy at `index`.
    pub fn unhealthy_under(&self, index: usize) -> usize {
        self.under(index)
            .filter(|(_, h)| matches!(h, Health::Unhealthy(_) | Health::NeverReady(_)))
            .count()
    }
}

/// Judges every matched node under each policy's rules. Every unhealthy node, and every node
/// that is not Ready, goes into `unhealthy_nodes` with why.
pub(super) fn assess<'a>(
    index: &Index<'a>,
    memory: &Memory,
    now: Timestamp,
    unhealthy_nodes: &mut BTreeMap<String, String>,
) -> Assessed<'a> {
    let mut assessed = Assessed::default();
    for (position, p) in index.policies.iter().enumerate() {
        let only_readiness = p.rules.unhealthy.is_empty() && p.rules.heartbeat_timeout.is_none();
        for name in &p.matched {
            let Some((&name, node)) = index.nodes.get_key_value(name.as_str()) else {
                continue;
            };
            if only_readiness && is_ready(node) {
                continue;
            }
            let observed = Observed {
                created: timestamp(node.metadata.creation_timestamp.as_ref()),
                conditions: node_conditions(node),
                agent_heartbeat: index.heartbeat(name),
                ever_ready: node
                    .metadata
                    .uid
                    .as_ref()
                    .is_some_and(|uid| memory.seen_ready.contains(uid))
                    || was_ready_before(node),
            };
            let h = health::assess(&observed, &p.rules, now);
            if let Health::Unhealthy(why) | Health::NeverReady(why) = &h {
                assessed.unhealthy.insert(name.to_owned());
                unhealthy_nodes
                    .entry(name.to_owned())
                    .or_insert_with(|| why.clone());
            }
            if h != Health::Healthy {
                assessed.by_policy.insert((position, name), h);
            }
        }
    }
    for (name, node) in &index.nodes {
        if !is_ready(node) {
            unhealthy_nodes
                .entry((*name).to_owned())
                .or_insert_with(|| "not Ready".to_owned());
        }
    }
    assessed
}

/// A policy's `maxUnhealthy` gate this round: none without remediation, else whether it lets
/// remediation start (and why not).
pub(super) type Gate = Option<Result<(), String>>;

/// The cluster as the coordinator's own actions of a round decide on it, with its NotReady nodes.
pub(super) type Deciding = (Cluster, BTreeSet<String>);

/// Whether the coordinator may act on `node` without its agent now (delete a node that never
/// became Ready, taint a dead one out of service): as a remediation maintenance of it would be
/// admitted (budgets, windows, pause, control-plane quorum, `maxUnhealthy`), counting what
/// this round already allowed (in `deciding`, made from `cluster` at the first with its NotReady
/// nodes, which stay put while the round decides). Why not, if
/// not.
pub(super) fn admit_without_agent(
    cluster: &Cluster,
    deciding: &mut Option<Deciding>,
    node: &str,
) -> Result<(), String> {
    let (deciding, not_ready) =
        deciding.get_or_insert_with(|| (cluster.clone(), cluster.not_ready()));
    if deciding.disrupted.contains(node) {
        return Ok(());
    }
    let pending = Pending {
        maintenance: format!("coordinator action on {node}"),
        node: node.to_owned(),
        reason: MaintenanceReason::Remediation,
        // The coordinator acts itself: such a node has no agent to speak of.
        needs_agent: false,
        disruption_deadline: None,
        urgent: false,
        planned: None,
    };
    match decide(deciding, not_ready, &pending) {
        Decision::Admit { .. } => {
            deciding.disrupt(node, MaintenanceReason::Remediation);
            Ok(())
        }
        Decision::Deny(denied) => Err(denied.message),
    }
}

/// Per policy (in [`Index::policies`] order): counts its unhealthy nodes, opens or closes its
/// remediation gate, and asks for remediation and startup actions where it allows them (one
/// request per node in all). Returns each policy's gate.
/// The nodes that became Ready after their startup timed out (whatever policy said so): their
/// `StartupTimedOut` condition is to be set False.
pub(super) fn started_late(index: &Index) -> Vec<String> {
    index
        .nodes
        .iter()
        .filter(|(_, node)| {
            nodeward_api::node::is_ready(node)
                && nodeward_api::node::condition(node, node_conditions::STARTUP_TIMED_OUT)
                    .is_some_and(|c| c.status == "True")
        })
        .map(|(name, _)| (*name).to_owned())
        .collect()
}

pub(super) fn remediate(
    index: &Index,
    health: &Assessed,
    cluster: &Cluster,
    memory: &mut Memory,
    now: Timestamp,
    plan: &mut Plan,
) -> Vec<Gate> {
    let unfinished_on: BTreeSet<&str> = index
        .maintenances
        .values()
        .filter(|m| !m.phase().is_finished())
        .map(|m| m.spec.node_name.as_str())
        .collect();
    let mut requested: BTreeSet<String> = BTreeSet::new();
    // The cluster with this round's startup deletions counted, made at the first one.
    let mut deciding: Option<Deciding> = None;
    let mut gates = Vec::with_capacity(index.policies.len());
    for (position, p) in index.policies.iter().enumerate() {
        let unhealthy = health.unhealthy_under(position);
        plan.unhealthy.insert(p.name.clone(), unhealthy);
        let remediation = p.policy.spec.remediation.as_ref();
        let gate = remediation.map(|r| {
            let limit = p.max_unhealthy.unwrap_or(usize::MAX);
            let cooldown = std_duration(r.cooldown.as_ref()).unwrap_or(Duration::ZERO);
            memory
                .gates
                .entry(p.name.clone())
                .or_default()
                .allow(unhealthy, limit, cooldown, now)
        });
        let allowed = gate.as_ref().is_some_and(Result::is_ok);
        gates.push(gate);
        let Some(r) = remediation else {
            continue;
        };
        for (name, h) in health.under(position) {
            if let Health::NeverReady(message) = h {
                let (action, message) = match r.startup_action {
                    _ if !allowed => (StartupAction::None, message.clone()),
                    StartupAction::DeleteNode => {
                        match admit_without_agent(cluster, &mut deciding, name) {
                            Ok(()) => (StartupAction::DeleteNode, message.clone()),
                            Err(why) => (
                                StartupAction::None,
                                format!("{message}; not deleted now: {why}"),
                            ),
                        }
                    }
                    action => (action, message.clone()),
                };
                plan.startup_timeouts.push(StartupTimeout {
                    node: name.to_owned(),
                    uid: index
                        .nodes
                        .get(name)
                        .and_then(|n| n.uid())
                        .unwrap_or_default(),
                    policy: p.name.clone(),
                    message,
                    action,
                    reported: index.nodes.get(name).is_some_and(|n| {
                        nodeward_api::node::condition(n, node_conditions::STARTUP_TIMED_OUT)
                            .is_some_and(|c| c.status == "True")
                    }),
                });
            }
            if !(r.enabled && allowed) || requested.contains(name) {
                continue;
            }
            let never_ready_remediate =
                matches!(h, Health::NeverReady(_)) && r.startup_action == StartupAction::Remediate;
            if let Some(request) = escalation(p, r, name, h, &index.maintenances, now) {
                requested.insert(name.to_owned());
                plan.remediate.push(request);
            } else if (matches!(h, Health::Unhealthy(_)) || never_ready_remediate)
                && !unfinished_on.contains(name)
                && !cluster.disrupted.contains(name)
            {
                let (Health::Unhealthy(why) | Health::NeverReady(why)) = h else {
                    continue;
                };
                requested.insert(name.to_owned());
                plan.remediate.push(RemediationRequest {
                    policy: p.name.clone(),
                    node: name.to_owned(),
                    action: r.action,
                    message: format!("unhealthy under policy {}: {why}", p.name),
                    replaces: None,
                });
            }
        }
    }
    gates
}

/// A Reboot remediation of `node` admitted at least `escalateAfter` ago while the node is
/// still unhealthy is replaced by a DeleteNode remediation (when the policy sets
/// `escalateAfter`).
fn escalation(
    p: &PolicyView,
    r: &Remediation,
    node: &str,
    health: &Health,
    maintenances: &BTreeMap<&str, &NodeMaintenance>,
    now: Timestamp,
) -> Option<RemediationRequest> {
    let after = std_duration(r.escalate_after.as_ref())?;
    if !matches!(health, Health::Unhealthy(_)) {
        return None;
    }
    let on_node: Vec<&&NodeMaintenance> = maintenances
        .values()
        .filter(|m| m.spec.node_name == node && m.spec.reason == MaintenanceReason::Remediation)
        .collect();
    if on_node
        .iter()
        .any(|m| m.spec.action == MaintenanceAction::DeleteNode)
    {
        return None;
    }
    let latest = on_node
        .iter()
        .filter(|m| m.spec.action == MaintenanceAction::Reboot)
        .filter_map(|m| {
            let admitted = m.status.as_ref()?.admission.as_ref()?.admitted_at.0;
            Some((admitted, m))
        })
        .max_by_key(|(admitted, _)| *admitted)?;
    let (admitted, m) = latest;
    let after_secs = i64::try_from(after.as_secs()).unwrap_or(i64::MAX);
    if now.duration_since(admitted).as_secs() < after_secs {
        return None;
    }
    // A reboot that ended long ago is history, not a remediation that failed to help.
    let finished = m.status.as_ref().and_then(|s| s.finished_at.as_ref());
    if finished.is_some_and(|f| now.duration_since(f.0).as_secs() >= after_secs) {
        return None;
    }
    Some(RemediationRequest {
        policy: p.name.clone(),
        node: node.to_owned(),
        action: MaintenanceAction::DeleteNode,
        message: format!(
            "health did not return within escalateAfter {}s of rebooting remediation {}",
            after.as_secs(),
            m.name_any()
        ),
        replaces: (!m.phase().is_finished()).then(|| m.name_any()),
    })
}
