//! Carrying a drain plan out: stage by stage, priority group by priority group (a group's
//! evictions sent together), each pod evicted through the Eviction API (PodDisruptionBudgets
//! respected; a refusal is retried with backoff and jitter until the stage deadline) with a
//! grace period that never outlasts the stage, then waited for until it is gone. Pods already
//! terminating are only waited for. When a stage's deadline passes, its `onTimeout` applies:
//! `Delete` the pods left (bypassing their budgets), `Continue` with the next stage, or `Fail`
//! the drain.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, EvictParams, ListParams},
    runtime::reflector::{ObjectRef, Store},
};
use nodeward_api::{
    DrainPlan, NodeMaintenance, OnTimeout,
    maintenance::{BlockingPod, EVICTED_WORKLOADS_LIMIT, WorkloadRef},
};
use nodeward_runtime::ApiError;
use tokio::time::Instant;

use super::{
    plan::{self, Ordered, PodInfo, Purpose, Seen},
    pods::{self, NodePods, instant_of, let_go_at},
};
use crate::{Error, backoff::Backoff};

/// How often pods are listed while waiting for them to go, when their watch does not follow
/// them (not yet listed, or failed).
const POLL: Duration = Duration::from_millis(250);

/// How often a group waiting for its pods to go looks again at what no watch wakes it for (a
/// surge that holds a pod back).
const RECHECK: Duration = Duration::from_secs(1);

/// Evictions (or deletions) of one group in flight at once: enough that a large group is asked
/// within a few round trips, few enough not to crowd the agent's client or the API server.
const EVICTIONS_IN_FLIGHT: usize = 16;

/// Where a drain stands, for the NodeReport, the NodeMaintenance and Events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub stage: String,
    pub total: usize,
    pub remaining: usize,
    pub blocking: Vec<BlockingPod>,
    /// Pods in the order their eviction (or deletion) was asked for: `namespace/name`.
    pub evicted: Vec<String>,
    /// Drained pods whose controller may put a replacement right back (they tolerate the
    /// drain taint): `namespace/name`.
    pub returning: Vec<String>,
    /// The controllers of the pods evicted or deleted so far, each once (the first
    /// [`EVICTED_WORKLOADS_LIMIT`]).
    pub workloads: Vec<WorkloadRef>,
}

impl Progress {
    /// Records that `pod` was asked to go: its name, and its controller.
    fn asked(&mut self, pod: &PodInfo) {
        self.evicted.push(pod.key());
        self.going(pod);
    }

    /// Records the controller of `pod`, which is going (asked now or before).
    fn going(&mut self, pod: &PodInfo) {
        if let Some(controller) = &pod.controller
            && !self.workloads.contains(controller)
            && self.workloads.len() < EVICTED_WORKLOADS_LIMIT
        {
            self.workloads.push(controller.clone());
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every pod the plan takes is gone.
    Drained,
    /// Stages ran out of time and went on (`Continue`) or the overall deadline passed: these
    /// pods were still there.
    Incomplete { remaining: Vec<String> },
    /// A stage with `onTimeout: Fail` ran out of time.
    Failed {
        stage: String,
        remaining: Vec<String>,
    },
}

/// What the drain needs to know (owned: a drain runs as a task of its own).
#[derive(Clone)]
pub struct Drain {
    pub client: Client,
    pub node: String,
    pub plan: DrainPlan,
    pub purpose: Purpose,
    /// The agent's own pod (namespace, name), which stays.
    pub own_pod: Option<(String, String)>,
    /// The drain ends by then whatever happens (the shutdown budget), if set.
    pub deadline: Option<Instant>,
    /// The taint the node carries while drained (pods tolerating it may come back).
    pub taint: &'static str,
    /// The maintenance drained (the store holds its live status), whose surges hold their
    /// pods back until the coordinator has their replacement available.
    pub surges: Option<(Store<NodeMaintenance>, String)>,
}

/// Why `pod` waits for a surge of the maintenance being drained, if it does.
fn held_by_surge(drain: &Drain, pod: &PodInfo) -> Option<BlockingPod> {
    let (store, name) = drain.surges.as_ref()?;
    let m = store.get(&ObjectRef::new(name))?;
    let surge = m
        .status
        .as_ref()?
        .surge_holding(&pod.namespace, &pod.name)?;
    Some(BlockingPod {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        reason: "SurgePending".to_owned(),
        message: Some(format!(
            "Deployment {}/{} surges first: {}",
            surge.namespace,
            surge.deployment,
            surge.message.as_deref().unwrap_or("planned")
        )),
    })
}

/// Reads the node's pods (the namespaces' labels at the same time, when the plan selects by
/// them) and orders them by the plan.
pub async fn order(drain: &Drain, pods: &NodePods) -> Result<Ordered, Error> {
    let namespaces = async {
        if !drain.plan.reads_namespace_labels() {
            return Ok(HashMap::new());
        }
        let list = Api::<Namespace>::all(drain.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::from(ApiError::new("listing", "namespaces".to_owned(), e)))?;
        Ok(list
            .items
            .into_iter()
            .map(|n| (n.name_any(), n.labels().clone()))
            .collect::<HashMap<String, BTreeMap<String, String>>>())
    };
    let reading = Instant::now();
    let (on_node, namespaces) = futures::try_join!(pods.current(), namespaces)?;
    tracing::info!(
        pods = on_node.len(),
        after_ms = reading.elapsed().as_millis(),
        "the node's pods read for the drain"
    );
    let pods = on_node
        .values()
        .map(|p| pods::info(p, &namespaces, drain.taint))
        .collect();
    let own = drain
        .own_pod
        .as_ref()
        .map(|(ns, name)| (ns.as_str(), name.as_str()));
    Ok(plan::order(&drain.plan, drain.purpose, pods, own))
}

/// Why an eviction was refused, for the progress record.
fn refusal(pod: &PodInfo, error: &kube::Error) -> BlockingPod {
    let (reason, message) = match error {
        kube::Error::Api(status) if status.code == 429 => {
            let cause = status
                .details
                .as_ref()
                .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"))
                .map(|c| c.message.clone());
            (
                "DisruptionBudget",
                cause.unwrap_or_else(|| status.message.clone()),
            )
        }
        kube::Error::Api(status) => (
            "EvictionError",
            format!("{} ({})", status.message, status.code),
        ),
        other => ("EvictionError", other.to_string()),
    };
    BlockingPod {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        reason: reason.to_owned(),
        message: Some(nodeward_api::bounds::cut(
            &message,
            nodeward_api::bounds::MESSAGE_LIMIT,
        )),
    }
}

/// The pods seen gone so far; `remaining` is the total minus them.
#[derive(Default)]
struct Gone(std::collections::HashSet<String>);

impl Gone {
    /// Records which of `pods` are no longer in `left`; whether `remaining` changed.
    fn saw(&mut self, pods: &[PodInfo], left: &[PodInfo], progress: &mut Progress) -> bool {
        for pod in pods {
            if !left
                .iter()
                .any(|l| l.namespace == pod.namespace && l.name == pod.name)
            {
                self.0.insert(pod.key());
            }
        }
        let remaining = progress.total.saturating_sub(self.0.len());
        let changed = remaining != progress.remaining;
        progress.remaining = remaining;
        changed
    }
}

impl Progress {
    /// Before anything is evicted: every pod of the plan remains.
    fn of(ordered: &Ordered) -> Self {
        let returning: Vec<String> = ordered
            .stages
            .iter()
            .flat_map(|s| s.groups.iter().flatten())
            .filter(|p| p.returns)
            .map(PodInfo::key)
            .collect();
        if !returning.is_empty() {
            tracing::warn!(pods = ?returning, "these pods tolerate the drain taint; their replacements may come back to this node");
        }
        Self {
            total: ordered.total(),
            remaining: ordered.total(),
            returning,
            ..Self::default()
        }
    }
}

/// Runs the drain. `report` is called whenever progress changes.
pub async fn run(drain: &Drain, report: impl FnMut(&Progress)) -> Result<Outcome, Error> {
    let pods = NodePods::watched(&drain.client, &drain.node);
    let mut ordered = order(drain, &pods).await?;
    let mut seen = Seen::default();
    seen.add(&ordered);
    let started = Instant::now();
    let mut run = Run {
        drain,
        pods,
        gone: Gone::default(),
        progress: Progress::of(&ordered),
        report,
        started,
        budget: drain.deadline.map(|d| d.saturating_duration_since(started)),
        carried_over: Vec::new(),
    };
    (run.report)(&run.progress);
    loop {
        for (pod, why) in &ordered.left {
            tracing::debug!(pod = %pod.key(), %why, "left by the drain");
        }
        if let Some(failed) = run.stages(&ordered).await? {
            return Ok(failed);
        }
        if drain.deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        // Pods that came after the read (bound by a scheduler that had not seen the cordon
        // yet, or created with the node named) are drained as well, in the plan's order,
        // after the plan's own; pods their controller would put back are not chased.
        ordered = order(drain, &run.pods).await?.newcomers(&seen);
        seen.add(&ordered);
        if ordered.total() == 0 {
            break;
        }
        let late: Vec<String> = ordered.staged().map(PodInfo::key).collect();
        tracing::warn!(pods = ?late, "pods came to the node during the drain; draining them too");
        run.progress.total += ordered.total();
        run.progress.remaining += ordered.total();
        (run.report)(&run.progress);
    }
    if run.carried_over.is_empty() {
        Ok(Outcome::Drained)
    } else {
        Ok(Outcome::Incomplete {
            remaining: run.carried_over,
        })
    }
}

/// A drain under way: what its passes over the plan share.
struct Run<'a, R> {
    drain: &'a Drain,
    pods: NodePods,
    gone: Gone,
    progress: Progress,
    report: R,
    started: Instant,
    budget: Option<Duration>,
    /// The pods stages that went on (`Continue`) or deleted (`Delete`) left behind.
    carried_over: Vec<String>,
}

impl<R: FnMut(&Progress)> Run<'_, R> {
    /// Drains `ordered` stage by stage; the outcome if a stage failed the drain.
    async fn stages(&mut self, ordered: &Ordered) -> Result<Option<Outcome>, Error> {
        let (drain, started, budget) = (self.drain, self.started, self.budget);
        for (index, stage) in ordered.stages.iter().enumerate() {
            self.progress.stage = stage.stage.name.clone();
            let stage_end =
                started + plan::stage_deadline(ordered, index, started.elapsed(), budget, budget);
            let mut left_in_stage: Vec<PodInfo> = Vec::new();
            for (group_index, group) in stage.groups.iter().enumerate() {
                let remaining = evict_group(
                    drain,
                    &mut self.pods,
                    group,
                    stage_end,
                    &mut self.gone,
                    &mut self.progress,
                    &mut self.report,
                )
                .await?;
                left_in_stage.extend(remaining);
                if Instant::now() >= stage_end {
                    // Out of time: the later groups of this stage are handled by onTimeout too.
                    for later in &stage.groups[group_index + 1..] {
                        left_in_stage.extend(later.iter().cloned());
                    }
                    break;
                }
            }
            if left_in_stage.is_empty() {
                continue;
            }
            let names = why_left(&left_in_stage, &self.progress);
            let name = &stage.stage.name;
            match stage.stage.on_timeout {
                OnTimeout::Fail => {
                    tracing::warn!(stage = %name, remaining = ?names, "drain stage timed out; failing the drain");
                    return Ok(Some(Outcome::Failed {
                        stage: name.clone(),
                        remaining: names,
                    }));
                }
                OnTimeout::Continue => {
                    tracing::warn!(stage = %name, remaining = ?names, "drain stage timed out; going on with the next stage");
                    self.carried_over.extend(names);
                }
                OnTimeout::Delete => {
                    tracing::warn!(stage = %name, remaining = ?names, "drain stage timed out; deleting the pods left");
                    self.delete_left(&left_in_stage).await?;
                }
            }
        }
        Ok(None)
    }

    /// Deletes the pods a stage left (`onTimeout: Delete`) and waits for them until the
    /// overall deadline (or a few seconds); those still there are carried over.
    async fn delete_left(&mut self, left: &[PodInfo]) -> Result<(), Error> {
        let drain = self.drain;
        let deleted = delete(drain, left, DeleteParams::default().grace_period(0)).await;
        for pod in left.iter().filter(|p| deleted.contains(&p.key())) {
            self.progress.asked(pod);
        }
        self.progress.blocking.clear();
        (self.report)(&self.progress);
        let until = drain
            .deadline
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(30));
        let still = wait_gone(
            &mut self.pods,
            left,
            until,
            &mut self.gone,
            &mut self.progress,
            &mut self.report,
        )
        .await?;
        self.carried_over.extend(why_left(&still, &self.progress));
        Ok(())
    }
}

/// The pods a stage left, as `namespace/name` with why each is still there: its eviction
/// refused (and by what), or asked for and the pod not yet gone.
fn why_left(left: &[PodInfo], progress: &Progress) -> Vec<String> {
    left.iter()
        .map(|p| {
            let id = p.key();
            let refused = progress
                .blocking
                .iter()
                .find(|b| b.namespace == p.namespace && b.name == p.name);
            match refused {
                Some(b) => format!(
                    "{id} (eviction refused: {}{})",
                    b.reason,
                    b.message
                        .as_ref()
                        .map(|m| format!(", {m}"))
                        .unwrap_or_default()
                ),
                None if progress.evicted.contains(&id) || p.terminating => {
                    format!("{id} (asked to go, still terminating)")
                }
                None => id,
            }
        })
        .collect()
}

/// Why a drain that ended with `outcome` (`None`: past the policy's `drain_timeout`) did not
/// drain the node; `None` when it did.
pub fn failure(outcome: Option<Outcome>, drain_timeout: Option<Duration>) -> Option<String> {
    let pods =
        |remaining: &[String]| format!("{} pods left: {}", remaining.len(), remaining.join(", "));
    match outcome {
        Some(Outcome::Drained) => None,
        // Stages that went on (`Continue`) left pods behind: the node is not drained.
        Some(Outcome::Incomplete { remaining }) => Some(match drain_timeout {
            Some(t) => format!(
                "the drain did not finish within the policy's drainTimeout ({}s); {}",
                t.as_secs(),
                pods(&remaining)
            ),
            None => format!("the drain stages ran out of time; {}", pods(&remaining)),
        }),
        Some(Outcome::Failed { stage, remaining }) => Some(format!(
            "drain stage {stage} timed out with {}",
            pods(&remaining)
        )),
        None => Some(format!(
            "the drain exceeded the policy's drainTimeout ({}s)",
            drain_timeout.map_or(0, |t| t.as_secs())
        )),
    }
}

/// Deletes `pods` (no eviction: PodDisruptionBudgets do not apply), as many at once as
/// evictions; their names.
async fn delete(drain: &Drain, pods: &[PodInfo], params: DeleteParams) -> Vec<String> {
    futures::stream::iter(pods.iter().cloned())
        .map(|pod: PodInfo| {
            let params = params.clone();
            async move {
                let api: Api<Pod> = Api::namespaced(drain.client.clone(), &pod.namespace);
                match api.delete(&pod.name, &params).await {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(e) => tracing::warn!(error = %e, pod = %pod.name, "deleting a pod failed"),
                }
                pod.key()
            }
        })
        .buffered(EVICTIONS_IN_FLIGHT)
        .collect()
        .await
}

/// Forces a drain that ran out of time through: deletes every pod the plan still takes,
/// each with its own grace period, without waiting. The pods deleted.
pub async fn force(drain: &Drain) -> Result<Vec<String>, Error> {
    let ordered = order(drain, &NodePods::listed(&drain.client, &drain.node)).await?;
    let pods: Vec<PodInfo> = ordered
        .stages
        .iter()
        .flat_map(|s| s.groups.iter().flatten())
        .filter(|p| !p.terminating)
        .cloned()
        .collect();
    Ok(delete(drain, &pods, DeleteParams::default()).await)
}

/// Asks the API server to evict `pod` with `grace` seconds to stop.
async fn evict(drain: &Drain, pod: &PodInfo, grace: i64) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(drain.client.clone(), &pod.namespace);
    let params = EvictParams {
        delete_options: Some(
            DeleteParams::default().grace_period(u32::try_from(grace).unwrap_or(0)),
        ),
        ..EvictParams::default()
    };
    api.evict(&pod.name, &params).await.map(|_| ())
}

/// The pods of `group` to ask now (not asked yet, not held by a surge, not backing off after
/// a refusal), and why the others wait.
fn due(
    drain: &Drain,
    group: &[PodInfo],
    asked: &std::collections::HashSet<String>,
    backoff: &HashMap<String, (Backoff, Instant)>,
    progress: &Progress,
    now: Instant,
) -> (Vec<PodInfo>, Vec<BlockingPod>) {
    let mut blocking = Vec::new();
    let mut due = Vec::new();
    for pod in group {
        let id = pod.key();
        if asked.contains(&id) {
            continue;
        }
        if let Some(held) = held_by_surge(drain, pod) {
            blocking.push(held);
            continue;
        }
        if backoff.get(&id).is_some_and(|(_, next)| *next > now) {
            if let Some(b) = progress
                .blocking
                .iter()
                .find(|b| b.namespace == pod.namespace && b.name == pod.name)
            {
                blocking.push(b.clone());
            }
            continue;
        }
        due.push(pod.clone());
    }
    (due, blocking)
}

/// Evicts one priority group and waits for it to go, until `stage_end`. Returns the pods
/// still there at the end.
async fn evict_group(
    drain: &Drain,
    pods: &mut NodePods,
    group: &[PodInfo],
    stage_end: Instant,
    tracker: &mut Gone,
    progress: &mut Progress,
    report: &mut impl FnMut(&Progress),
) -> Result<Vec<PodInfo>, Error> {
    let mut backoff: HashMap<String, (Backoff, Instant)> = HashMap::new();
    let mut asked: std::collections::HashSet<String> = group
        .iter()
        .filter(|p| p.terminating)
        .map(|p| {
            progress.going(p);
            p.key()
        })
        .collect();
    loop {
        let now = Instant::now();
        let (due, mut blocking) = due(drain, group, &asked, &backoff, progress, now);
        // A group's pods are alike to the plan: their evictions go out together (as kubectl
        // drain's do), so that the last pod of a large group is not asked a second later
        // than the first; the answers are taken in the group's order.
        let answers: Vec<_> = futures::stream::iter(due)
            .map(|pod: PodInfo| async move {
                let grace = plan::grace_period(&pod, stage_end.saturating_duration_since(now));
                let answer = evict(drain, &pod, grace).await;
                (pod, grace, answer)
            })
            .buffered(EVICTIONS_IN_FLIGHT)
            .collect()
            .await;
        for (pod, grace, answer) in answers {
            let id = pod.key();
            match answer {
                Ok(()) => {
                    tracing::info!(pod = %id, grace_seconds = grace, stage = %progress.stage, "evicted");
                    asked.insert(id);
                    progress.asked(&pod);
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    asked.insert(id);
                }
                Err(e) => {
                    let (b, next) = backoff.entry(id.clone()).or_insert_with(|| {
                        (
                            Backoff::new(Duration::from_millis(500), Duration::from_secs(10)),
                            now,
                        )
                    });
                    *next = now + b.next_delay();
                    let why = refusal(&pod, &e);
                    tracing::info!(pod = %id, reason = %why.reason, message = ?why.message, "eviction refused; retrying");
                    blocking.push(why);
                }
            }
        }
        let on_node = pods.current().await?;
        let left: Vec<PodInfo> = group
            .iter()
            .filter(|p| on_node.contains_key(&p.key()))
            .cloned()
            .collect();
        blocking.retain(|b| {
            left.iter()
                .any(|p| p.namespace == b.namespace && p.name == b.name)
        });
        let changed = blocking != progress.blocking;
        progress.blocking = blocking;
        if tracker.saw(group, &left, progress) || changed {
            report(progress);
        }
        if left.is_empty() || Instant::now() >= stage_end {
            return Ok(left);
        }
        // Woken by a change to the node's pods, or when a refused eviction is due again or a
        // pod is let go, whichever comes first.
        let retry = backoff
            .iter()
            .filter(|(id, _)| !asked.contains(*id))
            .map(|(_, (_, next))| *next);
        let wake = retry
            .chain(let_go(&left, &on_node))
            .fold(stage_end.min(Instant::now() + RECHECK), Instant::min);
        pods.change_or(wake, POLL).await;
    }
}

/// When each of `left` (its pod in `on_node`) is let go, if it is terminating.
fn let_go<'a>(
    left: &'a [PodInfo],
    on_node: &'a HashMap<String, Pod>,
) -> impl Iterator<Item = Instant> + 'a {
    left.iter()
        .filter_map(|p| on_node.get(&p.key()))
        .filter_map(let_go_at)
        // Let go once strictly past the instant: a millisecond later.
        .map(|at| instant_of(at) + Duration::from_millis(1))
}

/// Waits until `pods` are gone or `until`; returns those still there.
async fn wait_gone(
    on: &mut NodePods,
    pods: &[PodInfo],
    until: Instant,
    tracker: &mut Gone,
    progress: &mut Progress,
    report: &mut impl FnMut(&Progress),
) -> Result<Vec<PodInfo>, Error> {
    loop {
        let on_node = on.current().await?;
        let left: Vec<PodInfo> = pods
            .iter()
            .filter(|p| on_node.contains_key(&p.key()))
            .cloned()
            .collect();
        if tracker.saw(pods, &left, progress) {
            report(progress);
        }
        if left.is_empty() || Instant::now() >= until {
            return Ok(left);
        }
        let wake = let_go(&left, &on_node).fold(until, Instant::min);
        on.change_or(wake, POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use nodeward_api::PodType;

    use super::*;

    fn left(name: &str, terminating: bool) -> PodInfo {
        PodInfo {
            namespace: "shop".into(),
            name: name.into(),
            pod_type: PodType::Default,
            priority: 0,
            labels: BTreeMap::new(),
            namespace_labels: BTreeMap::new(),
            terminating,
            grace_period_seconds: None,
            returns: false,
            controller: None,
        }
    }

    #[test]
    fn a_pod_left_by_a_stage_says_why_it_is_still_there() {
        let progress = Progress {
            blocking: vec![BlockingPod {
                namespace: "shop".into(),
                name: "web-a".into(),
                reason: "DisruptionBudget".into(),
                message: Some("PodDisruptionBudget shop/web".into()),
            }],
            evicted: vec!["shop/web-b".into()],
            ..Progress::default()
        };
        let pods = [
            left("web-a", false),
            left("web-b", false),
            left("web-c", true),
            left("web-d", false),
        ];
        assert_eq!(
            why_left(&pods, &progress),
            [
                "shop/web-a (eviction refused: DisruptionBudget, PodDisruptionBudget shop/web)",
                "shop/web-b (asked to go, still terminating)",
                "shop/web-c (asked to go, still terminating)",
                "shop/web-d",
            ]
        );
    }

    #[test]
    fn only_a_full_drain_is_no_failure() {
        let left = vec!["a/p".to_owned()];
        let ten = Some(Duration::from_secs(10));
        assert_eq!(failure(Some(Outcome::Drained), ten), None);
        let incomplete = failure(
            Some(Outcome::Incomplete {
                remaining: left.clone(),
            }),
            ten,
        );
        assert_eq!(
            incomplete.as_deref(),
            Some(
                "the drain did not finish within the policy's drainTimeout (10s); 1 pods left: a/p"
            )
        );
        let stage = failure(
            Some(Outcome::Failed {
                stage: "apps".into(),
                remaining: left,
            }),
            None,
        );
        assert_eq!(
            stage.as_deref(),
            Some("drain stage apps timed out with 1 pods left: a/p")
        );
        assert_eq!(
            failure(None, ten).as_deref(),
            Some("the drain exceeded the policy's drainTimeout (10s)")
        );
    }
}
