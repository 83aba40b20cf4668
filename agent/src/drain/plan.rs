//! Which pods a drain terminates, in what order: pure functions over plain data.
//!
//! A plan is ordered stages; each pod goes to the first stage that takes it (by pod type,
//! priority range, pod and namespace labels). Within a stage pods go in groups of ascending
//! priority. Static and mirror pods are the kubelet's and never evicted; pods marked to stay
//! (the agent's own pod, label `nodeward.io/drain=skip`, the plan's `skip` rules) are left.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use nodeward_api::{
    DrainPlan, DrainStage, MaintenanceAction, OnTimeout, PodRule, PodType, PriorityRange,
    labels::{DRAIN_LABEL, DRAIN_SKIP},
};

/// Priority of `system-cluster-critical`; `system-node-critical` is above it.
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// What a drain is for: DaemonSet pods go only when the machine goes down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Shutdown or reboot: the node's DaemonSet pods stop too.
    MachineDown,
    /// The node stays up (DrainOnly, DeleteNode): DaemonSet pods stay.
    NodeStays,
}

impl Purpose {
    /// What a maintenance's drain is for.
    pub fn of(action: MaintenanceAction) -> Self {
        match action {
            MaintenanceAction::Reboot | MaintenanceAction::PowerOff => Self::MachineDown,
            MaintenanceAction::DrainOnly | MaintenanceAction::DeleteNode => Self::NodeStays,
        }
    }
}

/// A pod's key in the drain: `namespace/name`.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A pod as the plan sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub pod_type: PodType,
    pub priority: i32,
    pub labels: BTreeMap<String, String>,
    pub namespace_labels: BTreeMap<String, String>,
    /// Already being deleted: waited for, not evicted again.
    pub terminating: bool,
    pub grace_period_seconds: Option<i64>,
    /// Owned by a controller and tolerating the drain taint: its replacement may be scheduled
    /// right back onto this node.
    pub returns: bool,
    /// The controller that brings it back elsewhere once evicted (a ReplicaSet, StatefulSet
    /// or ReplicationController).
    pub controller: Option<nodeward_api::maintenance::WorkloadRef>,
}

impl PodInfo {
    /// Its key in the drain: `namespace/name`.
    pub fn key(&self) -> String {
        key(&self.namespace, &self.name)
    }
}

/// Whether `toleration` tolerates the taint `key` with effect `NoSchedule` (and no value), by
/// the API's rules: an empty key with `Exists` tolerates everything; otherwise the key must
/// match, and the effect when given.
pub fn tolerates(toleration: &k8s_openapi::api::core::v1::Toleration, key: &str) -> bool {
    let key_matches = match toleration.key.as_deref() {
        None | Some("") => toleration.operator.as_deref() == Some("Exists"),
        Some(k) => {
            k == key
                && match toleration.operator.as_deref() {
                    Some("Exists") => true,
                    // Equal (the default) with an empty value matches our value-less taint.
                    _ => toleration.value.as_deref().unwrap_or("").is_empty(),
                }
        }
    };
    let effect_matches = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == "NoSchedule");
    key_matches && effect_matches
}

/// The pods of one stage, in groups of equal priority, lowest first.
#[derive(Clone, Debug, PartialEq)]
pub struct StagePods {
    pub stage: DrainStage,
    pub groups: Vec<Vec<PodInfo>>,
}

/// The plan applied to the pods of one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ordered {
    pub stages: Vec<StagePods>,
    /// Pods the drain leaves, and why (static, marked to stay, in no stage).
    pub left: Vec<(PodInfo, &'static str)>,
}

impl Ordered {
    pub fn total(&self) -> usize {
        self.stages
            .iter()
            .flat_map(|s| s.groups.iter())
            .map(Vec::len)
            .sum()
    }

    /// Every pod of the order, staged or left, as `namespace/name`.
    pub fn keys(&self) -> BTreeSet<String> {
        self.pods().map(PodInfo::key).collect()
    }

    /// The pods the drain takes, stage by stage and group by group.
    pub fn staged(&self) -> impl Iterator<Item = &PodInfo> {
        self.stages.iter().flat_map(|s| s.groups.iter().flatten())
    }

    fn pods(&self) -> impl Iterator<Item = &PodInfo> {
        self.staged().chain(self.left.iter().map(|(pod, _)| pod))
    }

    /// The pods of this order the drain has not seen yet (`seen`), in the same stages and
    /// groups; not those a controller would put back (`returns`) nor those of a controller
    /// whose pods the drain already took (likely their replacements): chasing them would
    /// hold the drain until its deadline.
    pub fn newcomers(mut self, seen: &Seen) -> Self {
        let new = |p: &PodInfo| {
            !p.returns
                && !seen.pods.contains(&p.key())
                && p.controller
                    .as_ref()
                    .is_none_or(|c| !seen.controllers.contains(c))
        };
        for stage in &mut self.stages {
            for group in &mut stage.groups {
                group.retain(new);
            }
            stage.groups.retain(|g| !g.is_empty());
        }
        self.left.retain(|(p, _)| new(p));
        self
    }
}

/// The pods, and their controllers, a drain has met so far.
#[derive(Debug, Default)]
pub struct Seen {
    pub pods: BTreeSet<String>,
    pub controllers: BTreeSet<nodeward_api::maintenance::WorkloadRef>,
}

impl Seen {
    /// Adds the pods of `ordered` and their controllers.
    pub fn add(&mut self, ordered: &Ordered) {
        self.pods.extend(ordered.keys());
        self.controllers
            .extend(ordered.pods().filter_map(|p| p.controller.clone()));
    }
}

fn stage(
    name: &str,
    pod_types: Vec<PodType>,
    priority: PriorityRange,
    timeout: Duration,
) -> DrainStage {
    DrainStage {
        name: name.to_owned(),
        pod_types,
        priority: Some(priority),
        selector: None,
        timeout: nodeward_api::Duration::from_secs(timeout.as_secs()),
        on_timeout: OnTimeout::Continue,
    }
}

/// The default plan: ordinary pods below critical priority, then critical ordinary pods,
/// then (when the machine goes down) DaemonSet pods. Each stage moves on when it times out;
/// the shutdown budget bounds the whole drain anyway.
pub fn default_plan(purpose: Purpose) -> DrainPlan {
    let mut stages = vec![
        stage(
            "workloads",
            vec![PodType::Default],
            PriorityRange {
                min: None,
                max: Some(CRITICAL_PRIORITY - 1),
            },
            Duration::from_secs(300),
        ),
        stage(
            "critical",
            vec![PodType::Default],
            PriorityRange {
                min: Some(CRITICAL_PRIORITY),
                max: None,
            },
            Duration::from_secs(60),
        ),
    ];
    if purpose == Purpose::MachineDown {
        stages.push(stage(
            "daemonsets",
            vec![PodType::DaemonSet],
            PriorityRange::default(),
            Duration::from_secs(30),
        ));
    }
    DrainPlan {
        stages,
        skip: Vec::new(),
    }
}

fn rule_matches(rule: &PodRule, pod: &PodInfo) -> bool {
    let matches = |selector: &Option<_>, labels| {
        selector.as_ref().is_none_or(|s| {
            // An invalid selector in a CRD matches nothing rather than everything.
            nodeward_api::selector::matches(s, labels).unwrap_or(false)
        })
    };
    matches(&rule.pod_selector, &pod.labels)
        && matches(&rule.namespace_selector, &pod.namespace_labels)
}

fn stage_takes(stage: &DrainStage, purpose: Purpose, pod: &PodInfo) -> bool {
    let types: &[PodType] = if stage.pod_types.is_empty() {
        &[PodType::Default]
    } else {
        &stage.pod_types
    };
    if !types.contains(&pod.pod_type) {
        return false;
    }
    if pod.pod_type == PodType::DaemonSet && purpose == Purpose::NodeStays {
        return false;
    }
    let in_range = stage.priority.as_ref().is_none_or(|r| {
        r.min.is_none_or(|min| pod.priority >= min) && r.max.is_none_or(|max| pod.priority <= max)
    });
    in_range
        && stage
            .selector
            .as_ref()
            .is_none_or(|rule| rule_matches(rule, pod))
}

/// Orders the pods of a node by `plan`. `own_pod` is the agent's own pod (namespace, name),
/// which always stays.
pub fn order(
    plan: &DrainPlan,
    purpose: Purpose,
    pods: Vec<PodInfo>,
    own_pod: Option<(&str, &str)>,
) -> Ordered {
    let mut ordered = Ordered {
        stages: plan
            .stages
            .iter()
            .map(|s| StagePods {
                stage: s.clone(),
                groups: Vec::new(),
            })
            .collect(),
        left: Vec::new(),
    };
    let mut by_stage: Vec<BTreeMap<i32, Vec<PodInfo>>> = vec![BTreeMap::new(); plan.stages.len()];
    for pod in pods {
        if pod.pod_type == PodType::Static {
            ordered
                .left
                .push((pod, "static or mirror pod, left to the kubelet"));
            continue;
        }
        if own_pod.is_some_and(|(ns, name)| pod.namespace == ns && pod.name == name) {
            ordered.left.push((pod, "the agent's own pod"));
            continue;
        }
        if pod.labels.get(DRAIN_LABEL).map(String::as_str) == Some(DRAIN_SKIP) {
            ordered.left.push((pod, "labelled nodeward.io/drain=skip"));
            continue;
        }
        if plan.skip.iter().any(|rule| rule_matches(rule, &pod)) {
            ordered
                .left
                .push((pod, "matches a skip rule of the drain plan"));
            continue;
        }
        match plan
            .stages
            .iter()
            .position(|s| stage_takes(s, purpose, &pod))
        {
            Some(index) => by_stage[index].entry(pod.priority).or_default().push(pod),
            None if pod.pod_type == PodType::DaemonSet && purpose == Purpose::NodeStays => {
                ordered.left.push((pod, "DaemonSet pod; the node stays up"));
            }
            None => ordered.left.push((pod, "in no stage of the drain plan")),
        }
    }
    for (stage, groups) in ordered.stages.iter_mut().zip(by_stage) {
        stage.groups = groups
            .into_values()
            .map(|mut group| {
                group.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
                group
            })
            .collect();
    }
    ordered
}

/// When stage `index` must end: its own timeout from `started`, but early enough to leave each
/// later stage that has pods its share of the overall deadline (its timeout, at most a fifth of
/// the budget), as the kubelet reserves time for critical pods. A later stage with nothing to
/// drain keeps no share: on a node without critical pods the workloads get that time too.
pub fn stage_deadline(
    ordered: &Ordered,
    index: usize,
    started: Duration,
    overall_deadline: Option<Duration>,
    budget: Option<Duration>,
) -> Duration {
    let timeout = |s: &StagePods| s.stage.timeout.to_std().unwrap_or_default();
    let own = ordered.stages.get(index).map(timeout).unwrap_or_default();
    let by_timeout = started + own;
    match (overall_deadline, budget) {
        (Some(deadline), Some(budget)) => {
            let reserved: Duration = ordered
                .stages
                .iter()
                .skip(index + 1)
                .filter(|s| !s.groups.is_empty())
                .map(|s| timeout(s).min(budget / 5))
                .sum();
            by_timeout.min(deadline.saturating_sub(reserved).max(started))
        }
        (Some(deadline), None) => by_timeout.min(deadline),
        _ => by_timeout,
    }
}

/// The grace period to ask for: the pod's own, but never past the stage deadline.
pub fn grace_period(pod: &PodInfo, left_in_stage: Duration) -> i64 {
    let left = i64::try_from(left_in_stage.as_secs()).unwrap_or(i64::MAX);
    pod.grace_period_seconds.unwrap_or(30).min(left).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, pod_type: PodType, priority: i32) -> PodInfo {
        PodInfo {
            namespace: "ns".into(),
            name: name.into(),
            pod_type,
            priority,
            labels: BTreeMap::new(),
            namespace_labels: BTreeMap::new(),
            terminating: false,
            grace_period_seconds: Some(30),
            returns: false,
            controller: None,
        }
    }

    /// `pods` ordered by the default plan for `purpose`, none of them the agent's own.
    fn by_default_plan(purpose: Purpose, pods: Vec<PodInfo>) -> Ordered {
        order(&default_plan(purpose), purpose, pods, None)
    }

    fn names(ordered: &Ordered) -> Vec<Vec<Vec<String>>> {
        ordered
            .stages
            .iter()
            .map(|s| {
                s.groups
                    .iter()
                    .map(|g| g.iter().map(|p| p.name.clone()).collect())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_default_plan_goes_by_priority_then_critical_then_daemonsets() {
        let pods = vec![
            pod("ds", PodType::DaemonSet, 0),
            pod("high", PodType::Default, 1000),
            pod("crit", PodType::Default, CRITICAL_PRIORITY),
            pod("low-b", PodType::Default, -10),
            pod("low-a", PodType::Default, -10),
            pod("static", PodType::Static, CRITICAL_PRIORITY + 1000),
            pod("mid", PodType::Default, 0),
        ];
        let ordered = by_default_plan(Purpose::MachineDown, pods);
        assert_eq!(
            names(&ordered),
            vec![
                vec![
                    vec!["low-a".to_owned(), "low-b".into()],
                    vec!["mid".into()],
                    vec!["high".into()]
                ],
                vec![vec!["crit".into()]],
                vec![vec!["ds".into()]],
            ]
        );
        assert_eq!(ordered.total(), 6);
        assert_eq!(ordered.left.len(), 1);
        assert_eq!(ordered.left[0].0.name, "static");
    }

    #[test]
    fn pods_met_later_are_drained_unless_seen_or_put_back_by_their_controller() {
        let plan = default_plan(Purpose::MachineDown);
        let order_of = |pods| order(&plan, Purpose::MachineDown, pods, None);
        let controlled = |name, owner: &str| PodInfo {
            controller: Some(nodeward_api::maintenance::WorkloadRef {
                kind: "ReplicaSet".into(),
                namespace: "ns".into(),
                name: owner.into(),
            }),
            ..pod(name, PodType::Default, 0)
        };
        let first = order_of(vec![
            controlled("web-1", "web"),
            pod("crit", PodType::Default, CRITICAL_PRIORITY),
        ]);
        let mut seen = Seen::default();
        seen.add(&first);

        let returning = PodInfo {
            returns: true,
            ..pod("tolerant", PodType::Default, 0)
        };
        let later = order_of(vec![
            controlled("web-1", "web"),
            // web-1's replacement, from the controller the drain already took a pod of
            controlled("web-2", "web"),
            controlled("api-1", "api"),
            pod("late-crit", PodType::Default, CRITICAL_PRIORITY),
            pod("crit", PodType::Default, CRITICAL_PRIORITY),
            returning,
        ])
        .newcomers(&seen);
        assert_eq!(
            names(&later),
            vec![
                vec![vec!["api-1".to_owned()]],
                vec![vec!["late-crit".into()]],
                vec![]
            ],
            "in the plan's stages and order"
        );
        seen.add(&later);
        let again = order_of(vec![
            controlled("api-1", "api"),
            pod("late-crit", PodType::Default, CRITICAL_PRIORITY),
        ]);
        assert_eq!(again.newcomers(&seen).total(), 0, "met once, drained once");
    }

    #[test]
    fn daemonset_pods_stay_when_the_node_stays_up() {
        let pods = vec![
            pod("ds", PodType::DaemonSet, 0),
            pod("app", PodType::Default, 0),
        ];
        let ordered = by_default_plan(Purpose::NodeStays, pods);
        assert_eq!(ordered.total(), 1);
        assert_eq!(ordered.left[0].1, "DaemonSet pod; the node stays up");
    }

    #[test]
    fn pods_marked_to_stay_are_left() {
        let mut skip_label = pod("skipped", PodType::Default, 0);
        skip_label
            .labels
            .insert(DRAIN_LABEL.into(), DRAIN_SKIP.into());
        let mut logging = pod("fluent", PodType::DaemonSet, 0);
        logging
            .namespace_labels
            .insert("team".into(), "logging".into());
        let mut plan = default_plan(Purpose::MachineDown);
        plan.skip.push(PodRule {
            pod_selector: None,
            namespace_selector: Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: Some([("team".to_owned(), "logging".to_owned())].into()),
                    ..Default::default()
                },
            ),
        });
        let me = pod("nodeward-agent-x", PodType::DaemonSet, 0);
        let ordered = order(
            &plan,
            Purpose::MachineDown,
            vec![skip_label, logging, me, pod("app", PodType::Default, 0)],
            Some(("ns", "nodeward-agent-x")),
        );
        assert_eq!(names(&ordered)[0], vec![vec!["app".to_owned()]]);
        let reasons: Vec<&str> = ordered.left.iter().map(|(_, why)| *why).collect();
        assert_eq!(
            reasons,
            [
                "labelled nodeward.io/drain=skip",
                "matches a skip rule of the drain plan",
                "the agent's own pod"
            ]
        );
    }

    #[test]
    fn a_pod_goes_to_the_first_stage_that_takes_it() {
        let plan: DrainPlan = serde_json::from_value(serde_json::json!({"stages": [
            {"name": "web", "selector": {"podSelector": {"matchLabels": {"app": "web"}}}, "timeout": "30s"},
            {"name": "rest", "podTypes": ["Default", "DaemonSet"], "timeout": "30s", "onTimeout": "Delete"},
        ]}))
        .expect("plan");
        let mut web = pod("web-1", PodType::Default, 100);
        web.labels.insert("app".into(), "web".into());
        let ordered = order(
            &plan,
            Purpose::MachineDown,
            vec![
                pod("db", PodType::Default, 0),
                web,
                pod("ds", PodType::DaemonSet, 0),
            ],
            None,
        );
        assert_eq!(
            names(&ordered),
            vec![
                vec![vec!["web-1".to_owned()]],
                vec![vec!["db".to_owned(), "ds".into()]]
            ]
        );
    }

    #[test]
    fn later_stages_with_pods_keep_their_share_of_the_budget() {
        let plan = default_plan(Purpose::MachineDown);
        let pods = vec![
            pod("web", PodType::Default, 0),
            pod("dns", PodType::Default, CRITICAL_PRIORITY),
            pod("ds", PodType::DaemonSet, 0),
        ];
        let ordered = order(&plan, Purpose::MachineDown, pods.clone(), None);
        let budget = Duration::from_secs(100);
        // workloads (300s) must leave critical min(60, 20) + daemonsets min(30, 20) = 40s.
        let deadline = |ordered: &Ordered, index, started| {
            stage_deadline(ordered, index, started, Some(budget), Some(budget))
        };
        assert_eq!(
            deadline(&ordered, 0, Duration::ZERO),
            Duration::from_secs(60)
        );
        assert_eq!(
            deadline(&ordered, 2, Duration::from_secs(90)),
            Duration::from_secs(100)
        );
        // No critical pod on the node: the workloads keep the critical stage's share.
        let no_critical: Vec<PodInfo> = pods.iter().filter(|p| p.name != "dns").cloned().collect();
        let ordered = order(&plan, Purpose::MachineDown, no_critical, None);
        assert_eq!(
            deadline(&ordered, 0, Duration::ZERO),
            Duration::from_secs(80)
        );
        // Nothing after them: the whole budget.
        let only_web: Vec<PodInfo> = pods.into_iter().filter(|p| p.name == "web").collect();
        let ordered = order(&plan, Purpose::MachineDown, only_web, None);
        assert_eq!(
            deadline(&ordered, 0, Duration::ZERO),
            Duration::from_secs(100)
        );
        // Without a deadline (a maintenance drain) each stage has its own timeout.
        assert_eq!(
            stage_deadline(&ordered, 1, Duration::from_secs(7), None, None),
            Duration::from_secs(67)
        );
    }

    #[test]
    fn tolerations_follow_the_api_rules() {
        use k8s_openapi::api::core::v1::Toleration;
        let t = |key: Option<&str>,
                 operator: Option<&str>,
                 value: Option<&str>,
                 effect: Option<&str>| Toleration {
            key: key.map(Into::into),
            operator: operator.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        };
        let taint = "nodeward.io/shutdown";
        assert!(tolerates(&t(None, Some("Exists"), None, None), taint));
        assert!(tolerates(
            &t(Some(taint), Some("Exists"), None, Some("NoSchedule")),
            taint
        ));
        assert!(tolerates(&t(Some(taint), None, None, None), taint));
        assert!(!tolerates(
            &t(Some(taint), Some("Equal"), Some("x"), None),
            taint
        ));
        assert!(!tolerates(
            &t(Some(taint), Some("Exists"), None, Some("NoExecute")),
            taint
        ));
        assert!(!tolerates(
            &t(Some("other"), Some("Exists"), None, None),
            taint
        ));
        assert!(!tolerates(&t(None, None, None, None), taint));
    }

    #[test]
    fn the_grace_period_never_outlasts_the_stage() {
        let p = pod("a", PodType::Default, 0);
        assert_eq!(grace_period(&p, Duration::from_secs(10)), 10);
        assert_eq!(grace_period(&p, Duration::from_secs(100)), 30);
    }
}
