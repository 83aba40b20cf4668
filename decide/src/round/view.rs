//! The round's view of the cluster: the objects indexed by name, each policy resolved (its
//! matched nodes, budgets, open windows, health rules and what is wrong with its spec), and
//! the cluster as admission sees it.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube_core::{Resource, ResourceExt};
use nodeward_api::{
    DisruptionPolicy, MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance,
    NodeReport,
    fleet::LEASE_PREFIX,
    labels::CONTROL_PLANE_ROLE_LABEL,
    node::is_ready,
    policy::{BudgetSlot, ResolvedDeadlines},
};

use super::{Memory, Objects, std_duration, timestamp};
use crate::{
    admission::{
        budget::{self, Rounding},
        decide::{Cluster, NodeState, PolicyState},
        window::{self, Window},
    },
    canary,
    deadlines::{agent_unavailable, awaiting_replacement},
    failures::{self, Spending},
    gates,
    health::{ObservedCondition, Rules, UnhealthyRule},
};

/// The objects of one round by name, and the policies as it sees them (sorted by name).
pub(super) struct Index<'a> {
    // Keyed by borrowed names: at thousands of nodes, copies of names are much of a round.
    pub nodes: BTreeMap<&'a str, &'a Node>,
    pub reports: BTreeMap<&'a str, &'a NodeReport>,
    /// When each node's agent last renewed its Lease.
    pub renewed: BTreeMap<&'a str, Timestamp>,
    pub maintenances: BTreeMap<&'a str, &'a NodeMaintenance>,
    pub policies: Vec<PolicyView<'a>>,
    /// The nodes a policy with deadlines of its own matches, with the longest of each deadline
    /// of the policies matching them (the rest have the defaults): a round asks for them once
    /// per node and once per maintenance.
    deadlines: BTreeMap<&'a str, ResolvedDeadlines>,
    default_deadlines: ResolvedDeadlines,
}

impl<'a> Index<'a> {
    /// Indexes `objects`; remembers the nodes Ready now as seen Ready (by uid: a Node registered
    /// again under the same name starts anew).
    pub fn new(objects: &'a Objects, memory: &mut Memory, now: Timestamp) -> Self {
        let nodes: BTreeMap<&str, &Node> = objects
            .nodes
            .iter()
            .map(|n| (name_of(n.as_ref()), n.as_ref()))
            .collect();
        for node in nodes.values() {
            if let Some(uid) = node.metadata.uid.as_ref().filter(|_| is_ready(node))
                && !memory.seen_ready.contains(uid)
            {
                memory.seen_ready.insert(uid.clone());
            }
        }
        let present: BTreeSet<&str> = nodes
            .values()
            .filter_map(|n| n.metadata.uid.as_deref())
            .collect();
        memory
            .seen_ready
            .retain(|uid| present.contains(uid.as_str()));
        let placed = Placed::new(&objects.maintenances);
        let mut policies: Vec<PolicyView> = objects
            .policies
            .iter()
            .map(|p| {
                let mut view = view(p, &nodes, now);
                view.maintenances = placed.of(&view.name, &view.matched);
                if !p.spec.gates.is_empty() {
                    let judged = gates::judge(&p.spec.gates, &objects.gates);
                    view.gate_closed = judged.closed;
                    view.add_problems(judged.problems);
                }
                if let Some(spec) = &p.spec.canary {
                    let selected = canary_nodes(spec, &view.matched, &nodes)
                        .map_err(|problem| view.add_problems(vec![problem]))
                        .unwrap_or_default();
                    let maintenances = view.maintenances.iter().copied();
                    view.canary = Some(canary::stage(&view.name, spec, selected, maintenances));
                }
                view.failures = p.spec.failure_budget.as_ref().map(|budget| {
                    let maintenances = view.maintenances.iter().copied();
                    let mut spending = failures::spending(&view.name, budget, maintenances, now);
                    if let Some(stage) = &view.canary {
                        let by_name: BTreeMap<&str, &NodeMaintenance> = view
                            .maintenances
                            .iter()
                            .map(|m| (name_of(*m), *m))
                            .collect();
                        spending.mark_canaries(|name| {
                            by_name.get(name).is_some_and(|m| stage.went_as_canary(m))
                        });
                    }
                    spending
                });
                view.recorded_halt = recorded_halt(p);
                view
            })
            .collect();
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            deadlines: deadlines_by_node(&policies, &nodes),
            default_deadlines: ResolvedDeadlines::longest([]),
            renewed: objects
                .leases
                .iter()
                .filter_map(|l| {
                    let node = l.metadata.name.as_deref()?.strip_prefix(LEASE_PREFIX)?;
                    Some((node, l.spec.as_ref()?.renew_time.as_ref()?.0))
                })
                .collect(),
            reports: objects
                .reports
                .iter()
                .map(|r| (name_of(r.as_ref()), r.as_ref()))
                .collect(),
            maintenances: objects
                .maintenances
                .iter()
                .map(|m| (name_of(m.as_ref()), m.as_ref()))
                .collect(),
            nodes,
            policies,
        }
    }
}

impl<'a> Index<'a> {
    /// The last sign of life of `node`'s agent, if it gave one: its Lease's renewal, or the
    /// heartbeat in its NodeReport (agents of earlier versions), the later of the two.
    pub fn heartbeat(&self, node: &str) -> Option<Timestamp> {
        let reported = self
            .reports
            .get(node)
            .and_then(|r| Some(r.status.as_ref()?.heartbeat_time.as_ref()?.0));
        reported.max(self.renewed.get(node).copied())
    }

    /// The deadlines of the policies matching `node`, the longest of each.
    pub fn deadlines_of_node(&self, node: &str) -> ResolvedDeadlines {
        self.deadlines
            .get(node)
            .copied()
            .unwrap_or(self.default_deadlines)
    }

    /// Nodes deleted by a DeleteNode maintenance whose replacement may not have joined yet
    /// (`deadlines.replacement`), each with the policies that admitted it: they still count
    /// against those policies' budgets.
    pub fn awaiting_replacement(&self, now: Timestamp) -> Vec<(&'a str, &'a [String])> {
        self.maintenances
            .values()
            .filter(|m| {
                m.spec.action == MaintenanceAction::DeleteNode
                    && matches!(
                        m.phase(),
                        MaintenancePhase::Acting | MaintenancePhase::Succeeded
                    )
                    && !self.nodes.contains_key(m.spec.node_name.as_str())
            })
            .filter_map(|m| {
                // Still Acting: deleted just now, and ended Succeeded by this round.
                let deleted = match m.phase() {
                    MaintenancePhase::Acting => now,
                    _ => {
                        let status = m.status.as_ref()?;
                        status
                            .finished_at
                            .as_ref()
                            .or_else(|| m.entered(MaintenancePhase::Succeeded))?
                            .0
                    }
                };
                let replacement = self.deadlines_of(m.admitted_policies()).replacement;
                awaiting_replacement(deleted, now, replacement)
                    .then(|| (m.spec.node_name.as_str(), m.admitted_policies()))
            })
            .collect()
    }

    /// The deadlines of the policies named (those a maintenance was admitted under), the
    /// longest of each.
    pub fn deadlines_of(&self, policies: &[String]) -> ResolvedDeadlines {
        ResolvedDeadlines::longest(
            self.policies
                .iter()
                .filter(|p| policies.contains(&p.name))
                .map(|p| p.deadlines),
        )
    }
}

/// A policy as this round sees it.
pub(super) struct PolicyView<'a> {
    pub policy: &'a DisruptionPolicy,
    pub name: String,
    /// Matched by the selector (an invalid selector matches every node: it cannot protect
    /// fewer nodes than it was meant to).
    pub matched: BTreeSet<String>,
    /// The maintenances on its matched nodes and those it admitted on nodes it no longer
    /// selects ([`Placed::of`]): all that its failure budget, canary stage, progress and pause
    /// read.
    pub maintenances: Vec<&'a NodeMaintenance>,
    pub problem: Option<String>,
    /// Its failure budget as of now, if it has one.
    pub failures: Option<Spending>,
    /// The halt its status records for its current spec, if one does ([`recorded_halt`]).
    pub recorded_halt: Option<String>,
    /// Its canary stage, if it has one.
    pub canary: Option<canary::Stage>,
    pub max_concurrent: usize,
    pub max_by_reason: BTreeMap<MaintenanceReason, usize>,
    pub max_unhealthy: Option<usize>,
    pub window_open: bool,
    pub next_window: Option<Timestamp>,
    /// Why it admits nothing now (one of its blackouts), if so.
    pub blackout: Option<String>,
    /// Why one of its gates holds the rollout now, if one does.
    pub gate_closed: Option<String>,
    pub rules: Rules,
    pub deadlines: ResolvedDeadlines,
}

impl PolicyView<'_> {
    /// Adds `problems` to what is wrong with the policy's spec.
    fn add_problems(&mut self, problems: Vec<String>) {
        if problems.is_empty() {
            return;
        }
        let mut all: Vec<String> = self.problem.take().into_iter().collect();
        all.extend(problems);
        self.problem = Some(all.join("; "));
    }
}

/// The nodes a policy with deadlines of its own matches, each with the longest of each
/// deadline of the policies matching it. Every other node has the defaults, whether policies
/// with the default deadlines match it or none does; most clusters set none, and the map is
/// then empty. Asking every policy's matched set for each node and each maintenance was most
/// of a round of thousands of nodes under tens of policies.
fn deadlines_by_node<'a>(
    policies: &[PolicyView],
    nodes: &BTreeMap<&'a str, &'a Node>,
) -> BTreeMap<&'a str, ResolvedDeadlines> {
    let defaults = ResolvedDeadlines::longest([]);
    let (plain, own): (Vec<&PolicyView>, Vec<&PolicyView>) =
        policies.iter().partition(|p| p.deadlines == defaults);
    let mut by_node: BTreeMap<&'a str, ResolvedDeadlines> = BTreeMap::new();
    for p in own {
        for name in &p.matched {
            let Some((&node, _)) = nodes.get_key_value(name.as_str()) else {
                continue;
            };
            by_node
                .entry(node)
                .and_modify(|d| *d = ResolvedDeadlines::longest([*d, p.deadlines]))
                .or_insert(p.deadlines);
        }
    }
    for (node, deadlines) in &mut by_node {
        if plain.iter().any(|p| p.matched.contains(*node)) {
            *deadlines = ResolvedDeadlines::longest([*deadlines, defaults]);
        }
    }
    by_node
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
    let max_by_reason = policy
        .spec
        .max_concurrent_by_reason
        .limits()
        .filter_map(|(reason, field, limit)| {
            budget::resolve(field, limit, matched.len(), Rounding::DownAtLeastOne)
                .map_err(|e| problems.push(e.to_string()))
                .ok()
                .map(|count| (reason, count))
        })
        .collect();
    let max_unhealthy = policy.spec.max_unhealthy.as_ref().and_then(|limit| {
        budget::resolve("maxUnhealthy", limit, matched.len(), Rounding::Down)
            .map_err(|e| problems.push(e.to_string()))
            .ok()
    });
    let window_open = window_open(policy, now, &mut problems);
    let next_window = (!window_open).then(|| next_window(policy, now)).flatten();
    PolicyView {
        next_window,
        policy,
        matched,
        problem: (!problems.is_empty()).then(|| problems.join("; ")),
        max_concurrent,
        max_by_reason,
        max_unhealthy,
        window_open,
        blackout: window::in_blackout(&policy.spec.blackouts, now),
        gate_closed: None,
        rules: rules(policy),
        deadlines: policy.spec.resolved_deadlines(),
        failures: None,
        recorded_halt: None,
        canary: None,
        maintenances: Vec::new(),
        name,
    }
}

/// The round's maintenances by node and by the policies that admitted them, so that each
/// policy finds its own instead of passing over every maintenance (a cluster's history of
/// finished ones included) once for each of its failure budget, canary stage, progress and
/// pause.
struct Placed<'a> {
    on_node: BTreeMap<&'a str, Vec<&'a NodeMaintenance>>,
    admitted_by: BTreeMap<&'a str, Vec<&'a NodeMaintenance>>,
}

impl<'a> Placed<'a> {
    fn new(maintenances: &'a [Arc<NodeMaintenance>]) -> Self {
        let mut placed = Self {
            on_node: BTreeMap::new(),
            admitted_by: BTreeMap::new(),
        };
        for m in maintenances.iter().map(AsRef::as_ref) {
            placed
                .on_node
                .entry(m.spec.node_name.as_str())
                .or_default()
                .push(m);
            let admission = m.status.as_ref().and_then(|s| s.admission.as_ref());
            for policy in admission.into_iter().flat_map(|a| &a.policies) {
                placed
                    .admitted_by
                    .entry(policy.as_str())
                    .or_default()
                    .push(m);
            }
        }
        placed
    }

    /// The maintenances on the `matched` nodes, and those `policy` admitted on other nodes
    /// (its selector changed since), each once.
    fn of(&self, policy: &str, matched: &BTreeSet<String>) -> Vec<&'a NodeMaintenance> {
        // Walks the smaller side: a policy of thousands of nodes, of which a few have
        // maintenances, or a small policy in a cluster where most nodes have some.
        let on_matched: Vec<&'a NodeMaintenance> = if self.on_node.len() <= matched.len() {
            self.on_node
                .iter()
                .filter(|(node, _)| matched.contains(**node))
                .flat_map(|(_, ms)| ms.iter().copied())
                .collect()
        } else {
            matched
                .iter()
                .filter_map(|node| self.on_node.get(node.as_str()))
                .flat_map(|ms| ms.iter().copied())
                .collect()
        };
        let elsewhere = self
            .admitted_by
            .get(policy)
            .into_iter()
            .flatten()
            .filter(|m| !matched.contains(&m.spec.node_name))
            .copied();
        on_matched.into_iter().chain(elsewhere).collect()
    }
}

/// The halt `policy`'s status records for its current generation (`Halted=True` written for
/// it), if one does. A halt takes part in the order of the policy's conditional writes this
/// way: the status write that frees a failed node's slot records the halt with it, so a
/// coordinator that reads that version admits nothing more, even if its own view of the
/// maintenances has not caught up with the failure yet (its write of any older version is
/// refused). A resume changes the spec, and with it the generation: the record no longer
/// holds, and the next status write says what the failures say now.
pub(super) fn recorded_halt(policy: &DisruptionPolicy) -> Option<String> {
    let generation = policy.metadata.generation?;
    policy
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| {
            c.type_ == nodeward_api::conditions::policy::HALTED
                && c.status == "True"
                && c.observed_generation == Some(generation)
        })
        .map(|c| {
            let counted = c.message.split(failures::UNTIL_RESUMED).next();
            format!("as its status records: {}", counted.unwrap_or_default())
        })
}

/// The matched nodes `canary.nodeSelector` selects, if it has one; a selector that cannot be
/// evaluated is a problem of the policy's spec.
fn canary_nodes(
    spec: &nodeward_api::policy::Canary,
    matched: &BTreeSet<String>,
    nodes: &BTreeMap<&str, &Node>,
) -> Result<Option<BTreeSet<String>>, String> {
    let Some(selector) = &spec.node_selector else {
        return Ok(None);
    };
    let mut selected = BTreeSet::new();
    for name in matched {
        let Some(node) = nodes.get(name.as_str()) else {
            continue;
        };
        if nodeward_api::selector::matches(selector, node.labels())
            .map_err(|e| format!("canary.nodeSelector.{e}"))?
        {
            selected.insert(name.clone());
        }
    }
    Ok(Some(selected))
}

/// Whether one of the policy's windows is open at `now` (true when it has none); windows that
/// do not parse add to `problems`.
pub(super) fn window_open(
    policy: &DisruptionPolicy,
    now: Timestamp,
    problems: &mut Vec<String>,
) -> bool {
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

/// When the first of `policy`'s windows opens next (those that do not parse never do).
fn next_window(policy: &DisruptionPolicy, now: Timestamp) -> Option<Timestamp> {
    let windows: Vec<Window> = policy
        .spec
        .windows
        .iter()
        .enumerate()
        .filter_map(|(i, w)| Window::parse(i, w).ok())
        .collect();
    window::next_opening(&windows, now)
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

pub(super) fn node_conditions(node: &Node) -> Vec<ObservedCondition> {
    let created = timestamp(node.metadata.creation_timestamp.as_ref());
    nodeward_api::node::conditions(node)
        .iter()
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
pub(super) fn was_ready_before(node: &Node) -> bool {
    let created = timestamp(node.metadata.creation_timestamp.as_ref());
    nodeward_api::node::condition(node, "Ready").is_some_and(|c| {
        c.reason.as_deref() != Some("NodeStatusNeverUpdated")
            && c.last_transition_time
                .as_ref()
                .is_some_and(|t| t.0.duration_since(created).as_secs() > 60)
    })
}

/// The nodes `disrupted_by` maintenances, by those maintenances' reasons (a slot whose
/// maintenance is gone counts under none).
fn by_reason(
    index: &Index,
    disrupted_by: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<MaintenanceReason, BTreeSet<String>> {
    let mut by_reason: BTreeMap<MaintenanceReason, BTreeSet<String>> = BTreeMap::new();
    for m in index.maintenances.values() {
        let node = &m.spec.node_name;
        let disrupts = disrupted_by
            .get(node)
            .is_some_and(|uids| m.uid().is_some_and(|uid| uids.contains(&uid)));
        if disrupts {
            by_reason
                .entry(m.spec.reason)
                .or_default()
                .insert(node.clone());
        }
    }
    by_reason
}

/// The cluster as admission sees it: every node's state, each policy with the nodes it
/// counts (matched, and those holding one of its `slots` though no longer matched), and the
/// nodes `disrupted_by` some maintenance. A node is unhealthy if it is not Ready or is in
/// `unhealthy` (by some policy's rules); its agent is unavailable if its heartbeat is older
/// than the longest `deadlines.agentHeartbeat` of the policies matching it at `now`; `dead`
/// says which are dead, and why. A node a
/// DeleteNode maintenance deleted counts as disrupted in the policies that admitted it until
/// its replacement had time to join.
pub(super) fn cluster(
    index: &Index,
    blockers: &BTreeMap<String, String>,
    unhealthy: &BTreeSet<String>,
    slots: &BTreeMap<String, Vec<BudgetSlot>>,
    disrupted_by: &BTreeMap<String, BTreeSet<String>>,
    dead: &BTreeMap<&str, String>,
    now: Timestamp,
) -> Cluster {
    let awaiting = index.awaiting_replacement(now);
    let mut cluster = Cluster {
        nodes: index
            .nodes
            .iter()
            .map(|(name, node)| {
                let state = NodeState {
                    uid: node.uid().unwrap_or_default(),
                    ready: is_ready(node),
                    control_plane: node.labels().contains_key(CONTROL_PLANE_ROLE_LABEL),
                    unhealthy: unhealthy.contains(*name) || !is_ready(node),
                    blocker: blockers.get(*name).cloned(),
                    workload: None,
                    surges: Vec::new(),
                    unscanned: None,
                    agent_unavailable: agent_unavailable(
                        name,
                        index.heartbeat(name),
                        now,
                        index.deadlines_of_node(name).agent_heartbeat,
                    ),
                    dead: dead.get(*name).cloned(),
                };
                ((*name).to_owned(), state)
            })
            .collect(),
        policies: index
            .policies
            .iter()
            .map(|p| {
                let mut matched = p.matched.clone();
                // A slot counts against its policy even if its node no longer matches.
                matched.extend(slots[&p.name].iter().map(|s| s.node_name.clone()));
                PolicyState {
                    name: p.name.clone(),
                    matched,
                    max_concurrent: p.max_concurrent,
                    max_by_reason: p.max_by_reason.clone(),
                    max_unhealthy: p.max_unhealthy,
                    paused: p.policy.spec.paused,
                    window_open: p.window_open,
                    next_window: p.next_window,
                    blackout: p.blackout.clone(),
                    allow_sole_control_plane: p.policy.spec.allow_sole_control_plane,
                    checks_workloads: p.policy.spec.checks_disruption_budgets(),
                    invalid: p.problem.clone(),
                    deadlines: p.deadlines,
                    halted: p
                        .failures
                        .as_ref()
                        .filter(|f| f.halted())
                        .map(Spending::message)
                        .or_else(|| p.recorded_halt.clone()),
                    gate_closed: p.gate_closed.clone(),
                    canary: p.canary.clone(),
                }
            })
            .collect(),
        disrupted: disrupted_by.keys().cloned().collect(),
        by_reason: by_reason(index, disrupted_by),
        others: index
            .nodes
            .iter()
            .filter_map(|(name, node)| {
                super::others::disrupted_by_other(node).map(|by| ((*name).to_owned(), by))
            })
            .collect(),
    };
    for (node, policies) in awaiting {
        cluster.disrupted.insert(node.to_owned());
        for p in cluster
            .policies
            .iter_mut()
            .filter(|p| policies.contains(&p.name))
        {
            p.matched.insert(node.to_owned());
        }
    }
    cluster
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, sync::Arc, time::Duration};

    use nodeward_api::policy::ResolvedDeadlines;
    use serde_json::json;

    use super::{Index, Placed};
    use crate::round::{
        Memory,
        fixtures::{cluster, maintenance, node, policy, t},
    };

    fn names(of: Vec<&nodeward_api::NodeMaintenance>) -> BTreeSet<String> {
        of.iter()
            .map(|m| m.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_policy_finds_the_maintenances_of_its_nodes_and_those_it_admitted_each_once() {
        let maintenances = vec![
            maintenance("on-a", "a").admitted_by(&["p"]).build(),
            maintenance("on-a-by-q", "a").admitted_by(&["q"]).build(),
            maintenance("on-b-pending", "b").build(),
            // Admitted under p before its selector let go of node c.
            maintenance("on-c-by-p", "c")
                .admitted_by(&["p", "q"])
                .build(),
            maintenance("on-d-by-q", "d").admitted_by(&["q"]).build(),
        ];
        let placed = Placed::new(&maintenances);
        let wanted: BTreeSet<String> = ["on-a", "on-a-by-q", "on-b-pending", "on-c-by-p"]
            .map(String::from)
            .into();
        // Both ways of walking: fewer matched nodes than nodes with maintenances, and more.
        let few: BTreeSet<String> = ["a", "b"].map(String::from).into();
        let many: BTreeSet<String> = ["a", "b", "x", "y", "z"].map(String::from).into();
        for matched in [few, many] {
            let of = placed.of("p", &matched);
            assert_eq!(of.len(), wanted.len(), "each once: {:?}", names(of.clone()));
            assert_eq!(names(of), wanted);
        }
        assert!(placed.of("r", &BTreeSet::new()).is_empty());
    }

    #[test]
    fn a_nodes_deadlines_are_the_longest_of_each_of_the_policies_matching_it() {
        let mut objects = cluster(2);
        let labelled = |name: &str, labels: &[(&str, &str)]| {
            let mut n = node(name).build();
            let all = Arc::make_mut(&mut n)
                .metadata
                .labels
                .get_or_insert_default();
            for (key, value) in labels {
                all.insert((*key).to_owned(), (*value).to_owned());
            }
            n
        };
        objects.nodes.extend([
            labelled("n2", &[("canary", "yes")]),
            labelled("n3", &[("pool", "b")]),
            labelled("n4", &[("pool", "b"), ("speed", "fast")]),
            labelled("n5", &[("pool", "b"), ("speed", "fast"), ("zone", "z")]),
        ]);
        let named = |name: &str, spec: serde_json::Value| {
            let mut p = policy(spec).build();
            Arc::make_mut(&mut p).metadata.name = Some(name.to_owned());
            p
        };
        objects.policies = vec![
            named(
                "pool",
                json!({"nodeSelector": {"matchLabels": {"pool": "a"}},
                "deadlines": {"agentHeartbeat": "20m", "drain": "2h"}}),
            ),
            named(
                "narrow",
                json!({"nodeSelector": {"matchLabels": {"canary": "yes"}},
                "deadlines": {"agentHeartbeat": "30m", "drain": "1m"}}),
            ),
            named(
                "short",
                json!({"nodeSelector": {"matchLabels": {"speed": "fast"}},
                "deadlines": {"agentHeartbeat": "2m"}}),
            ),
            named(
                "plain",
                json!({"nodeSelector": {"matchLabels": {"zone": "z"}}}),
            ),
        ];
        let index = Index::new(&objects, &mut Memory::default(), t(0));
        let minutes = |m: u64| Duration::from_secs(m * 60);
        let defaults = ResolvedDeadlines::longest([]);
        let n0 = index.deadlines_of_node("n0");
        assert_eq!((n0.agent_heartbeat, n0.drain), (minutes(20), minutes(120)));
        // Both match n2: the longer heartbeat of one, the longer drain of the other.
        let n2 = index.deadlines_of_node("n2");
        assert_eq!((n2.agent_heartbeat, n2.drain), (minutes(30), minutes(120)));
        assert_eq!(
            index.deadlines_of_node("n3"),
            defaults,
            "no policy matches n3"
        );
        assert_eq!(index.deadlines_of_node("gone"), defaults, "no such node");
        // A heartbeat shorter than the default, alone and beside a policy with the defaults.
        assert_eq!(index.deadlines_of_node("n4").agent_heartbeat, minutes(2));
        assert_eq!(index.deadlines_of_node("n5"), defaults);
    }
}
