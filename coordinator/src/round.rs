//! One reconcile round's decisions, as a pure function of the watched objects, the time and
//! what the coordinator remembers between rounds: which budget slots to free, which pending
//! maintenances to admit or deny (oldest first), each policy's new status (slots, counts,
//! `Paused`, `RemediationAllowed`), which maintenances lost their node, and what remediation
//! to start. The controller carries the plan out; nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::Node,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::{Resource, ResourceExt};
use nodeward_api::{
    DisruptionPolicy, DisruptionPolicyStatus, MaintenanceAction, MaintenancePhase,
    MaintenanceReason, NodeMaintenance, NodeReport,
    conditions::{node as node_conditions, policy as policy_conditions},
    labels::CONTROL_PLANE_ROLE_LABEL,
    node::is_ready,
    policy::{BudgetSlot, Remediation, StartupAction},
};

use crate::{
    admission::{
        budget::{self, Rounding},
        decide::{self, Cluster, Decision, NodeState, Pending, PolicyState},
        window::{self, Window},
    },
    health::{self, Health, Observed, ObservedCondition, RemediationGate, Rules, UnhealthyRule},
    pause,
};

/// The watched objects of one round.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub nodes: Vec<Arc<Node>>,
    pub policies: Vec<Arc<DisruptionPolicy>>,
    pub maintenances: Vec<Arc<NodeMaintenance>>,
    pub reports: Vec<Arc<NodeReport>>,
    /// Why a disruption of a node is blocked now (see [`crate::blockers`]), by node.
    pub blockers: BTreeMap<String, String>,
}

/// What the coordinator carries from one round to the next.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// Nodes seen Ready at least once (a Node object alone does not say whether it ever was).
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
    /// Unfinished maintenances to end because their node is gone.
    pub end: Vec<Ending>,
    /// Remediation maintenances to create.
    pub remediate: Vec<RemediationRequest>,
    /// Nodes that never became Ready within a policy's `nodeStartupTimeout`.
    pub startup_timeouts: Vec<StartupTimeout>,
    /// Per policy: nodes disrupted now (slots plus NotReady) and the `maxConcurrent` count.
    pub budget_use: BTreeMap<String, (usize, usize)>,
    pub unhealthy: BTreeMap<String, usize>,
    /// Every unhealthy node (under any policy's rules, or NotReady), and why.
    pub unhealthy_nodes: BTreeMap<String, String>,
    /// Missing objects to confirm gone before their slots are freed.
    pub confirm_gone: BTreeSet<Gone>,
    /// Nodes whose DeleteNode maintenance is drained (Acting): the coordinator deletes them.
    pub delete_nodes: Vec<(String, String)>,
    /// What maintenances created after this round can be decided against.
    pub standing: Standing,
}

/// The state a round decided on and left, for [`admit_new`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Standing {
    /// The cluster as admission saw it, with this round's admissions.
    pub cluster: Cluster,
    /// Each policy as decided on.
    pub policies: BTreeMap<String, PolicyMark>,
}

/// A policy's generation and the slots (maintenance uids) it holds after a round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyMark {
    pub generation: Option<i64>,
    pub slots: BTreeSet<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub maintenance: String,
    pub uid: String,
    /// Every policy matching the node (its slot in each is written first).
    pub policies: Vec<String>,
    /// Policies whose slot is new in this round; the admission stands only once all are written.
    pub new_slots_in: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Denial {
    pub maintenance: String,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Ending {
    pub maintenance: String,
    pub phase: MaintenancePhase,
    pub message: String,
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
    pub policy: String,
    pub message: String,
    pub action: StartupAction,
    /// Whether the node already carries the condition (then no new Event).
    pub reported: bool,
}

fn timestamp(time: Option<&Time>) -> Timestamp {
    time.map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

fn node_conditions(node: &Node) -> Vec<ObservedCondition> {
    let created = timestamp(node.metadata.creation_timestamp.as_ref());
    node.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .map(|c| ObservedCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            since: c.last_transition_time.as_ref().map_or(created, |t| t.0),
        })
        .collect()
}

/// Whether a node that is not Ready now was Ready before, as far as its Ready condition tells:
/// it changed status well after the node registered (a kubelet that never got Ready posts
/// NotReady at registration and keeps it; one that never posted is `NodeStatusNeverUpdated`).
fn was_ready_before(node: &Node) -> bool {
    let created = timestamp(node.metadata.creation_timestamp.as_ref());
    node.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "Ready")
        .is_some_and(|c| {
            c.reason.as_deref() != Some("NodeStatusNeverUpdated")
                && c.last_transition_time
                    .as_ref()
                    .is_some_and(|t| t.0.duration_since(created).as_secs() > 60)
        })
}

fn std_duration(d: Option<&nodeward_api::Duration>) -> Option<Duration> {
    d.and_then(|d| d.to_std().ok())
}

fn rules(policy: &DisruptionPolicy) -> Rules {
    let Some(r) = policy.spec.remediation.as_ref() else {
        return Rules::default();
    };
    Rules {
        unhealthy: r
            .unhealthy_conditions
            .iter()
            .filter_map(|c| {
                Some(UnhealthyRule {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    for_: c.for_.to_std().ok()?,
                })
            })
            .collect(),
        heartbeat_timeout: std_duration(r.heartbeat_timeout.as_ref()),
        startup_timeout: std_duration(r.node_startup_timeout.as_ref()),
    }
}

/// Sets `type_` in `conditions`, keeping its transition time when the status is unchanged.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    nodeward_api::conditions::set(
        conditions,
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: Time(now),
        },
    );
}

/// A policy as this round sees it.
struct PolicyView<'a> {
    policy: &'a DisruptionPolicy,
    name: String,
    /// Matched by the selector (an invalid selector matches every node: it cannot protect
    /// fewer nodes than it was meant to).
    matched: BTreeSet<String>,
    problem: Option<String>,
    max_concurrent: usize,
    max_unhealthy: Option<usize>,
    window_open: bool,
    rules: Rules,
}

fn name_of<K: Resource>(object: &K) -> &str {
    object.meta().name.as_deref().unwrap_or_default()
}

/// `nodes` by name: in order, so that the matched set is built without sorting.
fn view<'a>(
    policy: &'a DisruptionPolicy,
    nodes: &BTreeMap<&str, &Node>,
    now: Timestamp,
) -> PolicyView<'a> {
    let name = policy.name_any();
    let mut problems = Vec::new();
    let matched: BTreeSet<String> = nodes
        .values()
        .filter(|n| {
            policy.selects(n.labels()).unwrap_or_else(|e| {
                if problems.is_empty() {
                    problems.push(format!("nodeSelector.{e}"));
                }
                true
            })
        })
        .map(|n| n.name_any())
        .collect();
    let max_concurrent = budget::resolve(
        "maxConcurrent",
        &policy.spec.max_concurrent,
        matched.len(),
        Rounding::DownAtLeastOne,
    )
    .unwrap_or_else(|e| {
        problems.push(e.to_string());
        0
    });
    let max_unhealthy = policy.spec.max_unhealthy.as_ref().and_then(|limit| {
        budget::resolve("maxUnhealthy", limit, matched.len(), Rounding::Down)
            .map_err(|e| problems.push(e.to_string()))
            .ok()
    });
    let window_open = window_open(policy, now, &mut problems);
    PolicyView {
        policy,
        matched,
        problem: (!problems.is_empty()).then(|| problems.join("; ")),
        max_concurrent,
        max_unhealthy,
        window_open,
        rules: rules(policy),
        name,
    }
}

/// Whether one of the policy's windows is open at `now` (true when it has none); windows that
/// do not parse add to `problems`.
fn window_open(policy: &DisruptionPolicy, now: Timestamp, problems: &mut Vec<String>) -> bool {
    let windows: Vec<Window> = policy
        .spec
        .windows
        .iter()
        .enumerate()
        .filter_map(|(i, w)| {
            Window::parse(i, w)
                .map_err(|e| problems.push(e.to_string()))
                .ok()
        })
        .collect();
    policy.spec.windows.is_empty() || window::any_open(&windows, now)
}

fn slots(policy: &DisruptionPolicy) -> &[BudgetSlot] {
    policy.status.as_ref().map_or(&[], |s| s.slots.as_slice())
}

/// Decides one round.
pub fn plan(objects: &Objects, memory: &mut Memory, now: Timestamp) -> Plan {
    let mut plan = Plan::default();
    // Keyed by borrowed names: at thousands of nodes, copies of names are much of a round.
    let nodes: BTreeMap<&str, &Node> = objects
        .nodes
        .iter()
        .map(|n| (name_of(n.as_ref()), n.as_ref()))
        .collect();
    for (name, node) in &nodes {
        if is_ready(node) && !memory.seen_ready.contains(*name) {
            memory.seen_ready.insert((*name).to_owned());
        }
    }
    memory.seen_ready.retain(|n| nodes.contains_key(n.as_str()));
    let reports: BTreeMap<&str, &NodeReport> = objects
        .reports
        .iter()
        .map(|r| (name_of(r.as_ref()), r.as_ref()))
        .collect();
    let maintenances: BTreeMap<String, &NodeMaintenance> = objects
        .maintenances
        .iter()
        .map(|m| (m.name_any(), m.as_ref()))
        .collect();
    let mut policies: Vec<PolicyView> = objects
        .policies
        .iter()
        .map(|p| view(p, &nodes, now))
        .collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));

    // Slots stay only for unfinished maintenances (same uid) of nodes that still exist.
    let mut kept: BTreeMap<String, Vec<BudgetSlot>> = BTreeMap::new();
    memory.confirmed_gone.retain(|gone| match gone {
        Gone::Maintenance { name, .. } => !maintenances.contains_key(name),
        Gone::Node(name) => !nodes.contains_key(name.as_str()),
    });
    for p in &policies {
        let mut keep = Vec::new();
        for slot in slots(p.policy) {
            let gone = Gone::Maintenance {
                name: slot.maintenance.clone(),
                uid: slot.uid.clone(),
            };
            let maintenance_holds = match maintenances.get(&slot.maintenance) {
                Some(m) if m.uid().as_deref() == Some(slot.uid.as_str()) => {
                    !m.phase().is_finished()
                }
                // A re-created object of the same name does not inherit the slot.
                Some(_) => false,
                None => {
                    !memory.confirmed_gone.contains(&gone) && {
                        plan.confirm_gone.insert(gone);
                        true
                    }
                }
            };
            let node = Gone::Node(slot.node_name.clone());
            let node_exists = nodes.contains_key(slot.node_name.as_str())
                || (!memory.confirmed_gone.contains(&node) && {
                    plan.confirm_gone.insert(node);
                    true
                });
            if maintenance_holds && node_exists {
                keep.push(slot.clone());
            }
        }
        kept.insert(p.name.clone(), keep);
    }

    // Which maintenances (by uid) hold each node disrupted.
    let mut disrupted_by: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in maintenances.values() {
        if m.is_active() {
            disrupted_by
                .entry(m.spec.node_name.clone())
                .or_default()
                .insert(m.uid().unwrap_or_default());
        }
    }
    for slot in kept.values().flatten() {
        disrupted_by
            .entry(slot.node_name.clone())
            .or_default()
            .insert(slot.uid.clone());
    }

    // Node health under each policy's rules; a node is unhealthy when any policy says so.
    // Only nodes that are not healthy are entered (most are healthy; absent means healthy).
    let mut health: BTreeMap<(usize, &str), Health> = BTreeMap::new();
    let mut unhealthy_nodes = BTreeSet::new();
    for (index, p) in policies.iter().enumerate() {
        let only_readiness = p.rules.unhealthy.is_empty() && p.rules.heartbeat_timeout.is_none();
        for name in &p.matched {
            let Some(node) = nodes.get(name.as_str()) else {
                continue;
            };
            if only_readiness && is_ready(node) {
                continue;
            }
            let observed = Observed {
                created: timestamp(node.metadata.creation_timestamp.as_ref()),
                conditions: node_conditions(node),
                agent_heartbeat: reports
                    .get(name.as_str())
                    .and_then(|r| r.status.as_ref()?.heartbeat_time.as_ref())
                    .map(|t| t.0),
                ever_ready: memory.seen_ready.contains(name) || was_ready_before(node),
            };
            let h = health::assess(&observed, &p.rules, now);
            if let Health::Unhealthy(why) | Health::NeverReady(why) = &h {
                unhealthy_nodes.insert(name.clone());
                plan.unhealthy_nodes
                    .entry(name.clone())
                    .or_insert_with(|| why.clone());
            }
            if h != Health::Healthy {
                health.insert((index, name.as_str()), h);
            }
        }
    }

    for (name, node) in &nodes {
        if !is_ready(node) {
            plan.unhealthy_nodes
                .entry((*name).to_owned())
                .or_insert_with(|| "not Ready".to_owned());
        }
    }

    let mut cluster = Cluster {
        nodes: nodes
            .iter()
            .map(|(name, node)| {
                let state = NodeState {
                    ready: is_ready(node),
                    control_plane: node.labels().contains_key(CONTROL_PLANE_ROLE_LABEL),
                    unhealthy: unhealthy_nodes.contains(*name) || !is_ready(node),
                    blocker: objects.blockers.get(*name).cloned(),
                };
                ((*name).to_owned(), state)
            })
            .collect(),
        policies: policies
            .iter()
            .map(|p| {
                let mut matched = p.matched.clone();
                // A slot counts against its policy even if its node no longer matches.
                matched.extend(kept[&p.name].iter().map(|s| s.node_name.clone()));
                PolicyState {
                    name: p.name.clone(),
                    matched,
                    max_concurrent: p.max_concurrent,
                    max_unhealthy: p.max_unhealthy,
                    paused: p.policy.spec.paused,
                    window_open: p.window_open,
                    allow_sole_control_plane: p.policy.spec.allow_sole_control_plane,
                    invalid: p.problem.clone(),
                }
            })
            .collect(),
        disrupted: disrupted_by.keys().cloned().collect(),
    };

    for m in pending_oldest_first(maintenances.values().copied()) {
        let name = m.name_any();
        let uid = m.uid().unwrap_or_default();
        let node = m.spec.node_name.clone();
        let held_in: Vec<String> = kept
            .iter()
            .filter(|(_, slots)| slots.iter().any(|s| s.uid == uid))
            .map(|(policy, _)| policy.clone())
            .collect();
        let only_self = disrupted_by
            .get(&node)
            .is_some_and(|by| by.len() == 1 && by.contains(&uid));
        if only_self {
            cluster.disrupted.remove(&node);
        }
        let request = Pending {
            maintenance: name.clone(),
            node: node.clone(),
            remediation: m.spec.reason == MaintenanceReason::Remediation,
        };
        match decide::decide(&cluster, &request) {
            Decision::Admit { policies: names } => {
                cluster.disrupted.insert(node.clone());
                let mut new_slots_in = Vec::new();
                for policy in &names {
                    let list = kept.entry(policy.clone()).or_default();
                    if !list.iter().any(|s| s.uid == uid) {
                        list.push(new_slot(m, &uid, now));
                        new_slots_in.push(policy.clone());
                    }
                }
                plan.admit.push(Admission {
                    maintenance: name,
                    uid,
                    policies: names,
                    new_slots_in,
                });
            }
            Decision::Deny { reason, message } => {
                // A half-done admission that no longer fits gives its slots back.
                for policy in &held_in {
                    if let Some(list) = kept.get_mut(policy) {
                        list.retain(|s| s.uid != uid);
                    }
                }
                plan.deny.push(Denial {
                    maintenance: name,
                    reason,
                    message,
                });
            }
        }
    }

    // Maintenances whose node is gone end (a DeleteNode maintenance that got there succeeded).
    for m in maintenances.values() {
        let p = m.phase();
        if m.spec.action == MaintenanceAction::DeleteNode
            && p == MaintenancePhase::Acting
            && nodes.contains_key(m.spec.node_name.as_str())
        {
            plan.delete_nodes
                .push((m.name_any(), m.spec.node_name.clone()));
            continue;
        }
        if p.is_finished()
            || p == MaintenancePhase::Pending
            || nodes.contains_key(m.spec.node_name.as_str())
        {
            continue;
        }
        let gone = Gone::Node(m.spec.node_name.clone());
        if !memory.confirmed_gone.contains(&gone) {
            plan.confirm_gone.insert(gone);
            continue;
        }
        let (phase, message) =
            if m.spec.action == MaintenanceAction::DeleteNode && p == MaintenancePhase::Acting {
                (
                    MaintenancePhase::Succeeded,
                    "the Node was deleted".to_owned(),
                )
            } else {
                (
                    MaintenancePhase::Cancelled,
                    format!("node {} was deleted", m.spec.node_name),
                )
            };
        plan.end.push(Ending {
            maintenance: m.name_any(),
            phase,
            message,
        });
    }

    // Remediation and startup timeouts, policy by policy.
    let unfinished_on: BTreeSet<&str> = maintenances
        .values()
        .filter(|m| !m.phase().is_finished())
        .map(|m| m.spec.node_name.as_str())
        .collect();
    let mut requested: BTreeSet<String> = BTreeSet::new();
    let mut statuses = BTreeMap::new();
    let not_ready: Vec<&String> = cluster
        .nodes
        .iter()
        .filter(|(_, s)| !s.ready)
        .map(|(name, _)| name)
        .collect();
    for (index, p) in policies.iter().enumerate() {
        // Only nodes that are not healthy have an entry.
        let unhealthy: Vec<&str> = health
            .range((index, "")..(index + 1, ""))
            .filter(|(_, h)| matches!(h, Health::Unhealthy(_) | Health::NeverReady(_)))
            .map(|((_, name), _)| *name)
            .collect();
        plan.unhealthy.insert(p.name.clone(), unhealthy.len());
        let remediation = p.policy.spec.remediation.as_ref();
        let gate = remediation.map(|r| {
            let limit = p.max_unhealthy.unwrap_or(usize::MAX);
            let cooldown = std_duration(r.cooldown.as_ref()).unwrap_or(Duration::ZERO);
            memory.gates.entry(p.name.clone()).or_default().allow(
                unhealthy.len(),
                limit,
                cooldown,
                now,
            )
        });
        let allowed = gate.as_ref().is_some_and(Result::is_ok);
        if let Some(r) = remediation {
            for (&(_, name), h) in health.range((index, "")..(index + 1, "")) {
                if let Health::NeverReady(message) = h {
                    plan.startup_timeouts.push(StartupTimeout {
                        node: name.to_owned(),
                        policy: p.name.clone(),
                        message: message.clone(),
                        action: if allowed {
                            r.startup_action
                        } else {
                            StartupAction::None
                        },
                        reported: nodes.get(name).is_some_and(|n| {
                            n.status
                                .iter()
                                .flat_map(|s| s.conditions.iter().flatten())
                                .any(|c| {
                                    c.type_ == node_conditions::STARTUP_TIMED_OUT
                                        && c.status == "True"
                                })
                        }),
                    });
                }
                if !(r.enabled && allowed) || requested.contains(name) {
                    continue;
                }
                let never_ready_remediate = matches!(h, Health::NeverReady(_))
                    && r.startup_action == StartupAction::Remediate;
                if let Some(request) = escalation(p, r, name, h, &maintenances, now) {
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

        // The policy's status as it should be.
        let old = p.policy.status.clone().unwrap_or_default();
        let generation = p.policy.metadata.generation;
        let mut status = DisruptionPolicyStatus {
            slots: kept.remove(&p.name).unwrap_or_default(),
            matched: count(p.matched.len()),
            // NotReady and disrupted nodes are few; matched ones can be thousands.
            ready: count(
                p.matched.len() - not_ready.iter().filter(|n| p.matched.contains(**n)).count(),
            ),
            unhealthy: count(unhealthy.len()),
            in_maintenance: count(
                cluster
                    .disrupted
                    .iter()
                    .filter(|n| p.matched.contains(*n))
                    .count(),
            ),
            conditions: old.conditions.clone(),
            observed_generation: generation,
        };
        let in_use = cluster
            .policies
            .iter()
            .find(|s| s.name == p.name)
            .map_or(0, |s| cluster.in_use(s, None).len());
        plan.budget_use
            .insert(p.name.clone(), (in_use, p.max_concurrent));
        // Acknowledgements matter only while paused (thousands of nodes otherwise).
        let agents: BTreeMap<String, Option<i64>> = p
            .matched
            .iter()
            .filter(|_| p.policy.spec.paused)
            .filter_map(|n| {
                let report = reports.get(n.as_str())?;
                let ack = report.status.as_ref().and_then(|s| {
                    s.pause_acknowledgements
                        .iter()
                        .find(|a| a.policy == p.name)
                        .map(|a| a.observed_generation)
                });
                Some((n.clone(), ack))
            })
            .collect();
        let acting = maintenances
            .values()
            .filter(|m| p.matched.contains(&m.spec.node_name))
            .filter(|m| {
                matches!(
                    m.phase(),
                    MaintenancePhase::Draining | MaintenancePhase::Acting
                )
            })
            .count();
        let (state, reason, message) = pause::pause_state(
            p.policy.spec.paused,
            generation.unwrap_or(0),
            &agents,
            acting,
        )
        .condition();
        set_condition(
            &mut status.conditions,
            policy_conditions::PAUSED,
            state,
            reason,
            message,
            generation,
            now,
        );
        match gate {
            Some(Ok(())) => set_condition(
                &mut status.conditions,
                policy_conditions::REMEDIATION_ALLOWED,
                "True",
                "WithinLimits",
                format!(
                    "{} of {} matched nodes unhealthy{}",
                    unhealthy.len(),
                    p.matched.len(),
                    p.max_unhealthy
                        .map(|l| format!(", maxUnhealthy {l}"))
                        .unwrap_or_default()
                ),
                generation,
                now,
            ),
            Some(Err(why)) => set_condition(
                &mut status.conditions,
                policy_conditions::REMEDIATION_ALLOWED,
                "False",
                nodeward_api::conditions::denial::TOO_MANY_UNHEALTHY,
                why,
                generation,
                now,
            ),
            None => status
                .conditions
                .retain(|c| c.type_ != policy_conditions::REMEDIATION_ALLOWED),
        }
        if let Some(problem) = &p.problem {
            set_condition(
                &mut status.conditions,
                policy_conditions::VALID,
                "False",
                "InvalidSpec",
                format!("{problem}; nothing in scope is admitted until it is fixed"),
                generation,
                now,
            );
        } else {
            status
                .conditions
                .retain(|c| c.type_ != policy_conditions::VALID);
        }
        plan.standing.policies.insert(
            p.name.clone(),
            PolicyMark {
                generation,
                slots: status.slots.iter().map(|s| s.uid.clone()).collect(),
            },
        );
        if status != old {
            statuses.insert(p.name.clone(), status);
        }
    }
    plan.policy_status = statuses;
    plan.standing.cluster = cluster;
    plan
}

/// Decides maintenances created since the round that left `standing`, oldest first, as that
/// round would have: a burst of creations then costs a decision each instead of a round over
/// the whole cluster each. Valid only while nothing else changed since (the controller runs a
/// full round on any other change and every resync). `blockers` holds the lookups for the new
/// maintenances' nodes.
///
/// Returns `None` when `standing` cannot decide them: a node or policy it does not know, a
/// policy whose spec or slots differ from what it decided on (another writer came first), or
/// a window that opened or closed since.
pub fn admit_new(
    standing: &mut Standing,
    policies: &[Arc<DisruptionPolicy>],
    new: &[Arc<NodeMaintenance>],
    blockers: &BTreeMap<String, String>,
    now: Timestamp,
) -> Option<Plan> {
    if policies.len() != standing.policies.len() {
        return None;
    }
    let by_name: BTreeMap<String, &DisruptionPolicy> = policies
        .iter()
        .map(|p| (p.name_any(), p.as_ref()))
        .collect();
    for (name, mark) in &standing.policies {
        let policy = by_name.get(name)?;
        let slots: BTreeSet<String> = slots(policy).iter().map(|s| s.uid.clone()).collect();
        if policy.metadata.generation != mark.generation || slots != mark.slots {
            return None;
        }
    }
    // A window that opened or closed since changes what older pending maintenances get:
    // they go first, in a full round.
    for state in &standing.cluster.policies {
        let policy = by_name.get(&state.name)?;
        if window_open(policy, now, &mut Vec::new()) != state.window_open {
            return None;
        }
    }

    let mut plan = Plan::default();
    for m in pending_oldest_first(new.iter().map(AsRef::as_ref)) {
        let (name, uid, node) = (m.name_any(), m.uid()?, m.spec.node_name.clone());
        let state = standing.cluster.nodes.get_mut(&node)?;
        if m.spec.reason != MaintenanceReason::Remediation {
            state.blocker = blockers.get(&node).cloned();
        }
        let request = Pending {
            maintenance: name.clone(),
            node: node.clone(),
            remediation: m.spec.reason == MaintenanceReason::Remediation,
        };
        match decide::decide(&standing.cluster, &request) {
            Decision::Admit { policies: names } => {
                standing.cluster.disrupted.insert(node.clone());
                for policy in &names {
                    let status = plan
                        .policy_status
                        .entry(policy.clone())
                        .or_insert_with(|| by_name[policy].status.clone().unwrap_or_default());
                    status.slots.push(new_slot(m, &uid, now));
                    if let Some(mark) = standing.policies.get_mut(policy) {
                        mark.slots.insert(uid.clone());
                    }
                }
                plan.admit.push(Admission {
                    maintenance: name,
                    uid,
                    new_slots_in: names.clone(),
                    policies: names,
                });
            }
            Decision::Deny { reason, message } => plan.deny.push(Denial {
                maintenance: name,
                reason,
                message,
            }),
        }
    }
    for (name, status) in &mut plan.policy_status {
        let state = standing.cluster.policies.iter().find(|p| p.name == *name)?;
        status.in_maintenance = count(
            standing
                .cluster
                .disrupted
                .iter()
                .filter(|n| state.matched.contains(*n))
                .count(),
        );
        let in_use = standing.cluster.in_use(state, None).len();
        plan.budget_use
            .insert(name.clone(), (in_use, state.max_concurrent));
    }
    Some(plan)
}

/// Pending maintenances not being deleted, oldest first (ties by name): the order admission
/// goes in.
fn pending_oldest_first<'a>(
    maintenances: impl Iterator<Item = &'a NodeMaintenance>,
) -> Vec<&'a NodeMaintenance> {
    let mut pending: Vec<&NodeMaintenance> = maintenances
        .filter(|m| m.phase() == MaintenancePhase::Pending && m.meta().deletion_timestamp.is_none())
        .collect();
    pending.sort_by_key(|m| {
        (
            timestamp(m.metadata.creation_timestamp.as_ref()),
            m.name_any(),
        )
    });
    pending
}

/// The budget slot admitting `m` takes.
fn new_slot(m: &NodeMaintenance, uid: &str, now: Timestamp) -> BudgetSlot {
    BudgetSlot {
        maintenance: m.name_any(),
        uid: uid.to_owned(),
        node_name: m.spec.node_name.clone(),
        admitted_at: Time(now),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A Reboot remediation of `node` admitted at least `escalateAfter` ago while the node is
/// still unhealthy is replaced by a DeleteNode remediation (when the policy sets
/// `escalateAfter`).
fn escalation(
    p: &PolicyView,
    r: &Remediation,
    node: &str,
    health: &Health,
    maintenances: &BTreeMap<String, &NodeMaintenance>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("timestamp")
    }

    fn node(name: &str, ready: bool) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "creationTimestamp": t(-10_000).to_string(), "labels": {"pool": "a"}},
                "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                    "lastTransitionTime": t(-5_000).to_string()}]},
            }))
            .expect("node"),
        )
    }

    fn policy(spec: serde_json::Value, status: serde_json::Value) -> Arc<DisruptionPolicy> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                "metadata": {"name": "pool", "generation": 3, "resourceVersion": "7"},
                "spec": spec, "status": status,
            }))
            .expect("policy"),
        )
    }

    fn maintenance(
        name: &str,
        node: &str,
        created: i64,
        status: serde_json::Value,
    ) -> Arc<NodeMaintenance> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
                "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": t(created).to_string()},
                "spec": {"nodeName": node, "reason": "Reboot", "action": "Reboot"},
                "status": status,
            }))
            .expect("maintenance"),
        )
    }

    fn slot(name: &str, node: &str) -> serde_json::Value {
        json!({"maintenance": name, "uid": format!("uid-{name}"), "nodeName": node, "admittedAt": t(0).to_string()})
    }

    fn cluster(n: usize) -> Objects {
        Objects {
            nodes: (0..n).map(|i| node(&format!("n{i}"), true)).collect(),
            policies: vec![policy(json!({"maxConcurrent": 2}), json!({}))],
            ..Objects::default()
        }
    }

    #[test]
    fn pending_maintenances_are_admitted_oldest_first_up_to_the_budget() {
        let mut objects = cluster(5);
        for i in 0..5 {
            // Created in reverse order of their names: age, not name, decides.
            objects.maintenances.push(maintenance(
                &format!("m{i}"),
                &format!("n{i}"),
                100 - i as i64,
                json!(null),
            ));
        }
        let plan = plan(&objects, &mut Memory::default(), t(200));
        let admitted: Vec<&str> = plan.admit.iter().map(|a| a.maintenance.as_str()).collect();
        assert_eq!(admitted, ["m4", "m3"]);
        assert_eq!(plan.admit[0].new_slots_in, ["pool"]);
        assert_eq!(plan.deny.len(), 3);
        assert!(
            plan.deny.iter().all(|d| d.reason == "BudgetExhausted"),
            "{:?}",
            plan.deny
        );
        let status = &plan.policy_status["pool"];
        assert_eq!(status.slots.len(), 2);
        assert_eq!((status.matched, status.in_maintenance), (5, 2));
        assert_eq!(plan.budget_use["pool"], (2, 2));
    }

    /// The objects after a round's writes went through (slots, then admissions).
    fn written(mut objects: Objects, plan: &Plan) -> Objects {
        for p in &mut objects.policies {
            if let Some(status) = plan.policy_status.get(&p.name_any()) {
                Arc::make_mut(p).status = Some(status.clone());
            }
        }
        for m in &mut objects.maintenances {
            if plan.admit.iter().any(|a| a.maintenance == m.name_any()) {
                Arc::make_mut(m)
                    .status
                    .get_or_insert_with(Default::default)
                    .phase = MaintenancePhase::Admitted;
            }
        }
        objects
    }

    fn names<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<String> {
        items.iter().map(|i| name(i).to_owned()).collect()
    }

    #[test]
    fn new_maintenances_are_decided_against_the_standing_as_a_full_round_would() {
        let mut objects = cluster(5);
        objects.maintenances = vec![maintenance("m0", "n0", 0, json!(null))];
        let mut round = plan(&objects, &mut Memory::default(), t(200));
        assert_eq!(names(&round.admit, |a| &a.maintenance), ["m0"]);
        let mut objects = written(objects, &round);
        let new: Vec<_> = (1..4)
            .map(|i| maintenance(&format!("m{i}"), &format!("n{i}"), 300 - i, json!(null)))
            .collect();

        let fast = admit_new(
            &mut round.standing,
            &objects.policies,
            &new,
            &BTreeMap::new(),
            t(400),
        )
        .expect("the standing decides");
        objects.maintenances.extend(new);
        let full = plan(&objects, &mut Memory::default(), t(400));
        // The oldest new one (m3) takes the second slot; the others find the budget used.
        assert_eq!(names(&fast.admit, |a| &a.maintenance), ["m3"]);
        assert_eq!(fast.admit[0].new_slots_in, ["pool"]);
        assert_eq!(
            names(&fast.admit, |a| &a.maintenance),
            names(&full.admit, |a| &a.maintenance)
        );
        assert_eq!(fast.deny, full.deny);
        let status = &fast.policy_status["pool"];
        assert_eq!(names(&status.slots, |s| &s.maintenance), ["m0", "m3"]);
        assert_eq!(status.in_maintenance, 2);
        assert_eq!(fast.budget_use["pool"], (2, 2));
        assert!(round.standing.policies["pool"].slots.contains("uid-m3"));
        // What it admitted counts against the next burst.
        let next = admit_new(
            &mut round.standing,
            &written(objects, &fast).policies,
            &[maintenance("m4", "n4", 500, json!(null))],
            &BTreeMap::new(),
            t(500),
        )
        .expect("the standing decides");
        assert!(next.admit.is_empty());
        assert_eq!(next.deny[0].reason, "BudgetExhausted");
    }

    #[test]
    fn the_standing_gives_way_to_a_full_round_when_anything_it_decided_on_changed() {
        let objects = cluster(3);
        let round = plan(&objects, &mut Memory::default(), t(200));
        let objects = written(objects, &round);
        let new = [maintenance("m1", "n1", 300, json!(null))];
        let decide = |policies: &[Arc<DisruptionPolicy>], new: &[Arc<NodeMaintenance>]| {
            admit_new(
                &mut round.standing.clone(),
                policies,
                new,
                &BTreeMap::new(),
                t(400),
            )
        };
        assert!(decide(&objects.policies, &new).is_some());

        // Another coordinator took a slot.
        let mut taken = objects.policies.clone();
        Arc::make_mut(&mut taken[0])
            .status
            .get_or_insert_with(Default::default)
            .slots
            .push(serde_json::from_value(slot("other", "n2")).expect("slot"));
        assert!(decide(&taken, &new).is_none());
        // The spec changed (e.g. paused).
        let mut edited = objects.policies.clone();
        Arc::make_mut(&mut edited[0]).metadata.generation = Some(4);
        assert!(decide(&edited, &new).is_none());
        // A node the round did not see, or a policy it did not know.
        assert!(
            decide(
                &objects.policies,
                &[maintenance("m9", "n9", 300, json!(null))]
            )
            .is_none()
        );
        let mut more = objects.policies.clone();
        more.push(policy(json!({"maxConcurrent": 1}), json!({})));
        Arc::make_mut(&mut more[1]).metadata.name = Some("other".into());
        assert!(decide(&more, &new).is_none());
    }

    #[test]
    fn the_standing_looks_at_windows_and_blockers_again() {
        let mut objects = cluster(3);
        objects.policies = vec![policy(
            json!({"maxConcurrent": 2, "windows": [{"start": "08:00", "end": "09:00"}]}),
            json!({}),
        )];
        // t(0) is 08:00 UTC: the window is open for the round, closed an hour later.
        let round = plan(&objects, &mut Memory::default(), t(200));
        let objects = written(objects, &round);
        let new = [maintenance("m1", "n1", 300, json!(null))];
        let decide = |blockers: &BTreeMap<String, String>, now: i64| {
            admit_new(
                &mut round.standing.clone(),
                &objects.policies,
                &new,
                blockers,
                t(now),
            )
        };
        let open = decide(&BTreeMap::new(), 400).expect("decides");
        assert_eq!(open.admit.len(), 1);
        // Closed since: older pending maintenances may be affected, a full round decides.
        assert!(decide(&BTreeMap::new(), 4_000).is_none());
        let blockers = BTreeMap::from([("n1".to_owned(), "pod ns/p".to_owned())]);
        let blocked = decide(&blockers, 400).expect("decides");
        assert_eq!(blocked.deny[0].reason, "Blocked");
        assert!(
            blocked.deny[0].message.contains("pod ns/p"),
            "{:?}",
            blocked.deny
        );
    }

    #[test]
    fn a_finished_maintenance_frees_its_slot_and_the_next_one_gets_it() {
        let mut objects = cluster(3);
        objects.policies = vec![policy(
            json!({"maxConcurrent": 1}),
            json!({"slots": [slot("m0", "n0")]}),
        )];
        objects.maintenances = vec![
            maintenance("m0", "n0", 0, json!({"phase": "Succeeded"})),
            maintenance("m1", "n1", 1, json!(null)),
        ];
        let plan = plan(&objects, &mut Memory::default(), t(200));
        assert_eq!(plan.admit.len(), 1);
        assert_eq!(plan.admit[0].maintenance, "m1");
        let slots: Vec<&str> = plan.policy_status["pool"]
            .slots
            .iter()
            .map(|s| s.maintenance.as_str())
            .collect();
        assert_eq!(slots, ["m1"]);
    }

    #[test]
    fn a_slot_whose_maintenance_is_missing_is_freed_only_once_confirmed_gone() {
        let mut objects = cluster(3);
        objects.policies = vec![policy(
            json!({"maxConcurrent": 1}),
            json!({"slots": [slot("m0", "n0")]}),
        )];
        objects.maintenances = vec![maintenance("m1", "n1", 1, json!(null))];
        let mut memory = Memory::default();
        let first = plan(&objects, &mut memory, t(200));
        assert!(
            first.admit.is_empty(),
            "a lagging watch must not free the slot"
        );
        let gone = Gone::Maintenance {
            name: "m0".into(),
            uid: "uid-m0".into(),
        };
        assert!(first.confirm_gone.contains(&gone));
        memory.confirmed_gone.insert(gone);
        let second = plan(&objects, &mut memory, t(201));
        assert_eq!(second.admit.len(), 1, "{second:?}");
    }

    #[test]
    fn a_half_done_admission_is_completed_without_a_second_slot() {
        let mut objects = cluster(3);
        objects.policies = vec![policy(
            json!({"maxConcurrent": 1}),
            json!({"slots": [slot("m0", "n0")]}),
        )];
        objects.maintenances = vec![maintenance("m0", "n0", 0, json!(null))];
        let plan = plan(&objects, &mut Memory::default(), t(200));
        assert_eq!(plan.admit.len(), 1);
        assert!(plan.admit[0].new_slots_in.is_empty());
        assert!(
            plan.policy_status
                .get("pool")
                .is_none_or(|s| s.slots.len() == 1)
        );
    }

    #[test]
    fn not_ready_nodes_count_against_the_budget() {
        let mut objects = cluster(3);
        objects.nodes[2] = node("n2", false);
        objects.policies = vec![policy(json!({"maxConcurrent": 1}), json!({}))];
        objects.maintenances = vec![maintenance("m0", "n0", 0, json!(null))];
        let plan = plan(&objects, &mut Memory::default(), t(200));
        assert!(plan.admit.is_empty());
        assert_eq!(plan.deny[0].reason, "BudgetExhausted");
        assert!(
            plan.deny[0].message.contains("n2"),
            "{}",
            plan.deny[0].message
        );
    }

    #[test]
    fn an_invalid_selector_blocks_everything_and_says_why() {
        let mut objects = cluster(2);
        objects.policies = vec![policy(
            json!({"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Sideways"}]}}),
            json!({}),
        )];
        objects.maintenances = vec![maintenance("m0", "n0", 0, json!(null))];
        let plan = plan(&objects, &mut Memory::default(), t(200));
        assert_eq!(plan.deny[0].reason, "Blocked");
        assert!(
            plan.deny[0].message.contains("invalid"),
            "{}",
            plan.deny[0].message
        );
        let valid = plan.policy_status["pool"]
            .conditions
            .iter()
            .find(|c| c.type_ == "Valid")
            .expect("Valid");
        assert_eq!(valid.status, "False");
        assert!(valid.message.contains("nodeSelector"), "{}", valid.message);
    }

    #[test]
    fn paused_is_true_only_when_every_agent_in_scope_acknowledged() {
        let mut objects = cluster(2);
        objects.policies = vec![policy(json!({"paused": true}), json!({}))];
        let report = |name: &str, ack: Option<i64>| -> Arc<NodeReport> {
            let acks: Vec<serde_json::Value> = ack
                .into_iter()
                .map(|g| json!({"policy": "pool", "observedGeneration": g}))
                .collect();
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
                    "metadata": {"name": name}, "spec": {"nodeName": name},
                    "status": {"pauseAcknowledgements": acks},
                }))
                .expect("report"),
            )
        };
        objects.reports = vec![report("n0", Some(3)), report("n1", Some(2))];
        let paused = |objects: &Objects| {
            let plan = plan(objects, &mut Memory::default(), t(0));
            let c = plan.policy_status["pool"]
                .conditions
                .iter()
                .find(|c| c.type_ == "Paused")
                .cloned()
                .expect("Paused");
            (c.status, c.message)
        };
        let (status, message) = paused(&objects);
        assert_eq!(status, "False");
        assert!(
            message.contains("n1"),
            "names the agent it waits for: {message}"
        );
        objects.reports[1] = report("n1", Some(3));
        assert_eq!(paused(&objects).0, "True");
    }

    #[test]
    fn an_active_maintenance_of_a_deleted_node_ends_once_the_deletion_is_confirmed() {
        let mut objects = cluster(1);
        objects.maintenances = vec![maintenance("m9", "gone", 0, json!({"phase": "Draining"}))];
        let mut memory = Memory::default();
        let first = plan(&objects, &mut memory, t(0));
        assert!(first.end.is_empty());
        assert!(first.confirm_gone.contains(&Gone::Node("gone".into())));
        memory.confirmed_gone.insert(Gone::Node("gone".into()));
        let second = plan(&objects, &mut memory, t(1));
        assert_eq!(second.end.len(), 1);
        assert_eq!(second.end[0].phase, MaintenancePhase::Cancelled);
    }

    #[test]
    fn remediation_stops_when_more_nodes_than_max_unhealthy_are_unhealthy() {
        let mut objects = cluster(4);
        objects.policies = vec![policy(
            json!({"maxUnhealthy": 1, "remediation": {"enabled": true,
                "unhealthyConditions": [{"type": "Ready", "status": "False", "for": "1m"}]}}),
            json!({}),
        )];
        objects.nodes[0] = node("n0", false);
        let mut memory = Memory::default();
        let one = plan(&objects, &mut memory, t(0));
        assert_eq!(one.remediate.len(), 1, "{one:?}");
        assert_eq!(one.remediate[0].node, "n0");
        objects.nodes[1] = node("n1", false);
        let two = plan(&objects, &mut memory, t(1));
        assert!(two.remediate.is_empty());
        let allowed = two.policy_status["pool"]
            .conditions
            .iter()
            .find(|c| c.type_ == "RemediationAllowed")
            .expect("condition");
        assert_eq!(
            (allowed.status.as_str(), allowed.reason.as_str()),
            ("False", "TooManyUnhealthy")
        );
    }

    #[test]
    fn a_reboot_remediation_that_did_not_help_escalates_to_delete_node() {
        let mut objects = cluster(3);
        objects.policies = vec![policy(
            json!({"remediation": {"enabled": true, "escalateAfter": "10m",
                "unhealthyConditions": [{"type": "Ready", "status": "False", "for": "1m"}]}}),
            json!({}),
        )];
        objects.nodes[0] = node("n0", false);
        let mut reboot = maintenance(
            "r0",
            "n0",
            0,
            json!({"phase": "Verifying", "admission": {"policies": ["pool"], "admittedAt": t(0).to_string(), "admittedBy": "c"}}),
        );
        Arc::make_mut(&mut reboot).spec.reason = MaintenanceReason::Remediation;
        objects.maintenances = vec![reboot];
        let early = plan(&objects, &mut Memory::default(), t(300));
        assert!(
            early.remediate.is_empty(),
            "not before escalateAfter: {early:?}"
        );
        let late = plan(&objects, &mut Memory::default(), t(601));
        assert_eq!(late.remediate.len(), 1, "{late:?}");
        assert_eq!(late.remediate[0].action, MaintenanceAction::DeleteNode);
        assert_eq!(late.remediate[0].replaces.as_deref(), Some("r0"));
    }

    #[test]
    fn a_node_never_ready_within_the_startup_timeout_gets_the_startup_action() {
        let mut objects = cluster(1);
        let fresh: Node = serde_json::from_value(json!({
            "metadata": {"name": "new", "creationTimestamp": t(0).to_string()},
        }))
        .expect("node");
        objects.nodes.push(Arc::new(fresh));
        objects.policies = vec![policy(
            json!({"remediation": {"nodeStartupTimeout": "5m", "startupAction": "DeleteNode"}}),
            json!({}),
        )];
        assert!(
            plan(&objects, &mut Memory::default(), t(299))
                .startup_timeouts
                .is_empty()
        );
        let timed_out = plan(&objects, &mut Memory::default(), t(300)).startup_timeouts;
        assert_eq!(timed_out.len(), 1);
        assert_eq!(
            (timed_out[0].node.as_str(), timed_out[0].action),
            ("new", StartupAction::DeleteNode)
        );
        assert!(!timed_out[0].reported);
        // A node seen Ready once is not "never Ready" when it later goes NotReady.
        let mut memory = Memory::default();
        memory.seen_ready.insert("new".into());
        assert!(
            plan(&objects, &mut memory, t(300))
                .startup_timeouts
                .is_empty()
        );
    }
}
