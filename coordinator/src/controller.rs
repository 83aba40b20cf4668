//! The coordinator's control loop: watches Nodes, DisruptionPolicies, NodeMaintenances and
//! NodeReports into reflector stores, and while it leads, runs a round ([`crate::round`]) on
//! every change (and every `resync`, for windows and durations that pass with time) and
//! carries the plan out: budget slots first, as conditional writes of each policy's status,
//! then the maintenances they admit, denials, endings and remediation.
//!
//! When the only change is new pending maintenances, an admission-only round decides them
//! against what the last full round left ([`round::admit_new`]): a burst of creations in a
//! large cluster then costs a decision each, not a pass over every node each.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::Node,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::{
        WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, Store, reflector},
        watcher,
    },
};
use nodeward_api::{
    DisruptionPolicy, MaintenancePhase, MaintenanceReason, NodeMaintenance, NodeReport,
    conditions::{denial, maintenance as maintenance_conditions, node as node_conditions},
    labels::COORDINATOR_FIELD_MANAGER,
    maintenance::{AdmissionRecord, PhaseTransition},
    policy::StartupAction,
};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};

use crate::{
    Error,
    blockers::{self, Lookups},
    metrics::{Metrics, PolicyLabels, ReasonLabels, RoundLabels},
    round::{self, Gone, Memory, Objects, Plan, Standing},
};

/// The readiness gate the synced watches open: nothing is decided before.
pub const SYNCED: &str = "the watches have not synced yet";

/// A denial whose reason is unchanged and whose message follows the rollout's progress is
/// rewritten (new message) at most this often.
const DENIAL_REFRESH: Duration = Duration::from_secs(30);

/// Whether a denial's message changes as the cluster moves on (which nodes hold slots, which
/// are unhealthy or NotReady): with many maintenances waiting, rewriting each of them on every
/// change would be a write storm, so those refresh every [`DENIAL_REFRESH`]. The others
/// (blocked, paused, outside a window) change only when their cause does, and an operator
/// should see that at once.
fn message_follows_progress(reason: &str) -> bool {
    matches!(
        reason,
        denial::BUDGET_EXHAUSTED | denial::TOO_MANY_UNHEALTHY | denial::QUORUM_PROTECTED
    )
}
/// A remediation just requested is not requested again for this long (the watch shows it).
const REMEDIATION_DEBOUNCE: Duration = Duration::from_secs(60);

/// What changed since the controller last looked: maintenances that appeared pending (an
/// admission-only round can decide them) or anything else (a full round).
///
/// It also tells the coordinator's own writes from others', so that they wake nothing (the
/// round that wrote them already decided on them). A write's watch event can arrive before
/// its response: events for an object with a write under way wait until the write returns,
/// and then only those with another resourceVersion count.
#[derive(Default)]
pub struct Changes {
    notify: Notify,
    seen: std::sync::Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    changes: ChangeSet,
    /// resourceVersions written whose watch events have not come yet.
    unseen_writes: HashSet<String>,
    /// Objects ("Kind/name") with writes under way: how many, and the resourceVersions of the
    /// watch events seen for them meanwhile.
    under_way: HashMap<String, (usize, Vec<String>)>,
}

#[derive(Default)]
struct ChangeSet {
    /// Something a full round must look at.
    anything: bool,
    /// Names, with when their watch event arrived.
    new_pending: Vec<(String, Instant)>,
}

impl Changes {
    pub fn anything(&self) {
        self.update(|set| set.anything = true);
    }

    fn new_pending(&self, name: String) {
        self.update(|set| set.new_pending.push((name, Instant::now())));
    }

    /// An object of `kind` changed in a way decisions read. `version`: its resourceVersion
    /// when the coordinator writes objects of that kind (it may be an own write). Returns
    /// whether this wakes a full round now.
    fn changed(&self, kind: &str, name: &str, version: Option<String>) -> bool {
        let mut seen = self.lock();
        if let Some(version) = version {
            if seen.unseen_writes.remove(&version) {
                return false;
            }
            if let Some((_, meanwhile)) = seen.under_way.get_mut(&format!("{kind}/{name}")) {
                meanwhile.push(version);
                return false;
            }
        }
        seen.changes.anything = true;
        drop(seen);
        self.notify.notify_one();
        true
    }

    /// Marks a write of `kind`/`name` under way until the returned guard is done or dropped.
    fn writing(self: &Arc<Self>, kind: &str, name: &str) -> OwnWrite {
        let key = format!("{kind}/{name}");
        self.lock().under_way.entry(key.clone()).or_default().0 += 1;
        OwnWrite {
            changes: self.clone(),
            key,
            finished: false,
        }
    }

    /// A write of `key` returned, with the resourceVersion it wrote (None: it failed).
    fn finish(&self, key: &str, written: Option<String>) {
        let mut guard = self.lock();
        let seen = &mut *guard;
        let Some((count, meanwhile)) = seen.under_way.get_mut(key) else {
            return;
        };
        if let Some(version) = written {
            if let Some(at) = meanwhile.iter().position(|v| *v == version) {
                meanwhile.swap_remove(at);
            } else {
                // Events lost to a re-list never come back: keep the set bounded.
                if seen.unseen_writes.len() > 10_000 {
                    seen.unseen_writes.clear();
                }
                seen.unseen_writes.insert(version);
            }
        }
        *count -= 1;
        if *count > 0 {
            return;
        }
        let others = seen
            .under_way
            .remove(key)
            .is_some_and(|(_, m)| !m.is_empty());
        if others {
            tracing::debug!(object = %key, "another writer's change wakes a full round");
            seen.changes.anything = true;
            drop(guard);
            self.notify.notify_one();
        }
    }

    fn update(&self, change: impl FnOnce(&mut ChangeSet)) {
        change(&mut self.lock().changes);
        self.notify.notify_one();
    }

    fn take(&self) -> ChangeSet {
        std::mem::take(&mut self.lock().changes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A write under way (see [`Changes::writing`]); dropped without [`OwnWrite::done`], the
/// write counts as failed.
struct OwnWrite {
    changes: Arc<Changes>,
    key: String,
    finished: bool,
}

impl OwnWrite {
    fn done(mut self, version: Option<String>) {
        self.finished = true;
        self.changes.finish(&self.key, version);
    }
}

impl Drop for OwnWrite {
    fn drop(&mut self) {
        if !self.finished {
            self.changes.finish(&self.key, None);
        }
    }
}

/// The four watched kinds.
#[derive(Clone)]
pub struct Stores {
    pub nodes: Store<Node>,
    pub policies: Store<DisruptionPolicy>,
    pub maintenances: Store<NodeMaintenance>,
    pub reports: Store<NodeReport>,
}

impl Stores {
    /// Starts a reflector for each kind; a change that can matter to a decision wakes
    /// `changed` (heartbeats do not: at 1,000 nodes they would run a round every few ms).
    pub fn watch(
        client: &Client,
        changed: &Arc<Changes>,
        tasks: &mut tokio::task::JoinSet<()>,
    ) -> Self {
        Self {
            nodes: reflect(
                Api::all(client.clone()),
                changed,
                tasks,
                |node: &mut Node| {
                    // Image lists are most of a Node's size and nothing here reads them.
                    if let Some(status) = node.status.as_mut() {
                        status.images = None;
                    }
                },
                relevance::node,
                |_| false,
                false,
            ),
            policies: reflect(
                Api::all(client.clone()),
                changed,
                tasks,
                |_| {},
                relevance::any_change,
                |_| false,
                true,
            ),
            maintenances: reflect(
                Api::all(client.clone()),
                changed,
                tasks,
                |_| {},
                relevance::any_change,
                |m: &NodeMaintenance| {
                    m.phase() == MaintenancePhase::Pending
                        && m.metadata.deletion_timestamp.is_none()
                },
                true,
            ),
            reports: reflect(
                Api::all(client.clone()),
                changed,
                tasks,
                |_| {},
                relevance::report,
                |_| false,
                false,
            ),
        }
    }

    /// Resolves once every store holds a complete initial list.
    pub async fn synced(&self) -> bool {
        let (a, b, c, d) = futures::join!(
            self.nodes.wait_until_ready(),
            self.policies.wait_until_ready(),
            self.maintenances.wait_until_ready(),
            self.reports.wait_until_ready(),
        );
        a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok()
    }

    pub fn objects(&self) -> Objects {
        Objects {
            nodes: self.nodes.state(),
            policies: self.policies.state(),
            maintenances: self.maintenances.state(),
            reports: self.reports.state(),
            blockers: BTreeMap::new(),
        }
    }
}

/// `new_pending`: whether a first sighting of an object is one an admission-only round can
/// decide. `own_writes`: whether the coordinator writes objects of this kind (its own writes
/// then wake nothing).
fn reflect<K>(
    api: Api<K>,
    changed: &Arc<Changes>,
    tasks: &mut tokio::task::JoinSet<()>,
    trim: fn(&mut K),
    relevance: fn(&K) -> u64,
    new_pending: fn(&K) -> bool,
    own_writes: bool,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let changed = changed.clone();
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(move |object: &mut K| {
                object.managed_fields_mut().clear();
                trim(object);
            }),
    );
    // What each object looked like to decisions when last seen.
    let mut seen: HashMap<String, u64> = HashMap::new();
    tasks.spawn(stream.for_each(move |event| {
        match &event {
            Ok(watcher::Event::Apply(object)) => {
                let name = object.name_any();
                let digest = relevance(object);
                let before = seen.insert(name.clone(), digest);
                if before == Some(digest) {
                    // Nothing decisions read changed.
                } else if before.is_none() && new_pending(object) {
                    changed.new_pending(name);
                } else {
                    let version = object.resource_version().filter(|_| own_writes);
                    if changed.changed(&kind, &name, version) {
                        tracing::debug!(%kind, %name, "change wakes a full round");
                    }
                }
            }
            Ok(watcher::Event::Delete(object)) => {
                let name = object.name_any();
                tracing::debug!(%kind, %name, "deletion wakes a full round");
                seen.remove(&name);
                changed.anything();
            }
            Ok(watcher::Event::Init) => seen.clear(),
            Ok(watcher::Event::InitApply(object)) => {
                seen.insert(object.name_any(), relevance(object));
            }
            Ok(watcher::Event::InitDone) => changed.anything(),
            Err(e) => {
                tracing::warn!(error = %e, %kind, "watch failed; retrying with backoff");
            }
        }
        futures::future::ready(())
    }));
    reader
}

/// Digests of what decisions read from an object, so that other updates wake nothing.
mod relevance {
    use std::hash::{DefaultHasher, Hash, Hasher};

    use k8s_openapi::api::core::v1::Node;
    use kube::Resource;
    use nodeward_api::NodeReport;

    pub fn any_change<K: Resource>(object: &K) -> u64 {
        let mut h = DefaultHasher::new();
        object.meta().resource_version.hash(&mut h);
        h.finish()
    }

    /// Labels, deletion, and each condition's status and transition (not its heartbeat).
    pub fn node(node: &Node) -> u64 {
        let mut h = DefaultHasher::new();
        node.metadata.labels.hash(&mut h);
        node.metadata.deletion_timestamp.is_some().hash(&mut h);
        for c in node
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
        {
            (&c.type_, &c.status, &c.reason).hash(&mut h);
            c.last_transition_time.as_ref().map(|t| t.0).hash(&mut h);
        }
        h.finish()
    }

    /// Pause acknowledgements; heartbeat age is checked on every resync instead.
    pub fn report(report: &NodeReport) -> u64 {
        let mut h = DefaultHasher::new();
        for a in report
            .status
            .iter()
            .flat_map(|s| s.pause_acknowledgements.iter())
        {
            (&a.policy, a.observed_generation).hash(&mut h);
        }
        h.finish()
    }
}

/// Objects this coordinator wrote, used until the watch delivers them, so that the next round
/// does not decide on the version it just replaced.
struct Fresh<K> {
    written: HashMap<String, (Option<String>, Arc<K>)>,
}

impl<K: Resource> Fresh<K> {
    fn new() -> Self {
        Self {
            written: HashMap::new(),
        }
    }

    fn record(&mut self, before: &K, written: K) {
        self.written.insert(
            written.name_any(),
            (before.resource_version(), Arc::new(written)),
        );
    }

    /// Puts what was written in place of the versions it replaced. Records whose object
    /// moved on are dropped; with `complete` (every object of the kind), so are the records
    /// of objects absent.
    fn apply(&mut self, objects: &mut [Arc<K>], complete: bool) {
        let mut current = BTreeSet::new();
        for object in objects.iter_mut() {
            let name = object.name_any();
            match self.written.get(&name) {
                Some((before, written)) if object.resource_version() == *before => {
                    *object = written.clone();
                    current.insert(name);
                }
                Some(_) => {
                    self.written.remove(&name);
                }
                None => {}
            }
        }
        if complete {
            self.written.retain(|name, _| current.contains(name));
        }
    }
}

/// What writing a maintenance's status needs. Cloned into the task that writes a round's
/// admissions, so that the loop decides the next round meanwhile.
#[derive(Clone)]
struct Writer {
    client: Client,
    identity: String,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    /// Told of each write, so that its watch event wakes no round.
    changed: Arc<Changes>,
    /// Shared with the admission tasks.
    fresh_maintenances: Arc<std::sync::Mutex<Fresh<NodeMaintenance>>>,
}

pub struct Controller {
    /// The client, identity and metrics too.
    writer: Writer,
    /// Admission writes of earlier rounds still under way (a full round waits for them).
    writes: tokio::task::JoinSet<bool>,
    memory: Memory,
    fresh_policies: Fresh<DisruptionPolicy>,
    denied_at: HashMap<String, Instant>,
    remediated_at: HashMap<String, Instant>,
    blockers: Lookups,
    /// What the last full round left, while everything it decided was written.
    standing: Option<Standing>,
    /// When each maintenance first seen pending arrived, until it is admitted or denied.
    arrived: HashMap<String, Instant>,
}

impl Controller {
    pub fn new(
        client: Client,
        identity: String,
        metrics: Arc<Metrics>,
        changed: Arc<Changes>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: COORDINATOR_FIELD_MANAGER.to_owned(),
                instance: Some(identity.clone()),
            },
        );
        Self {
            blockers: Lookups::new(client.clone()),
            writer: Writer {
                client,
                identity,
                metrics,
                recorder,
                changed,
                fresh_maintenances: Arc::new(std::sync::Mutex::new(Fresh::new())),
            },
            writes: tokio::task::JoinSet::new(),
            memory: Memory::default(),
            fresh_policies: Fresh::new(),
            denied_at: HashMap::new(),
            remediated_at: HashMap::new(),
            standing: None,
            arrived: HashMap::new(),
        }
    }

    /// Runs rounds while leading, until `stop` fires. Nothing is decided before every watch
    /// has synced: the coordinator never admits on a partial view.
    pub async fn run(
        mut self,
        stores: Stores,
        mut leader: watch::Receiver<bool>,
        resync: Duration,
        readiness: Arc<nodeward_runtime::server::Readiness>,
        mut stop: watch::Receiver<bool>,
    ) {
        let changed = self.writer.changed.clone();
        // The only waiter on the stores' readiness: kube-runtime wakes just one.
        tokio::select! {
            synced = stores.synced() => if !synced { return },
            _ = stop.changed() => return,
        }
        readiness.pass(SYNCED);
        tracing::info!("watches synced");
        let mut last_full: Option<Instant> = None;
        loop {
            let resync_at = last_full.map_or_else(Instant::now, |at| at + resync);
            let leadership_changed = tokio::select! {
                _ = changed.notify.notified() => false,
                _ = tokio::time::sleep_until(resync_at.into()) => false,
                _ = leader.changed() => true,
                _ = stop.changed() => break,
            };
            if !*leader.borrow() {
                self.standing = None;
                last_full = Some(Instant::now());
                continue;
            }
            let changes = changed.take();
            let mut names = Vec::new();
            for (name, at) in changes.new_pending {
                self.arrived.entry(name.clone()).or_insert(at);
                names.push(name);
            }
            let due = leadership_changed || last_full.is_none_or(|at| at.elapsed() >= resync);
            self.reap_writes();
            if !due && !changes.anything {
                // A wake whose change an earlier round already took.
                if names.is_empty() {
                    continue;
                }
                if self.admission_round(&stores, &names, &leader).await {
                    continue;
                }
            }
            let confirm = self.round(&stores, &leader).await;
            last_full = Some(Instant::now());
            if self.confirm_gone(confirm).await {
                changed.anything();
            }
        }
        // Admissions whose slots were written are finished before stopping; one cut short
        // would be completed by the next leader, which sees the slot.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.settle_writes()).await;
    }

    /// One round: decide, then write. Returns the missing objects to confirm gone.
    async fn round(&mut self, stores: &Stores, leader: &watch::Receiver<bool>) -> BTreeSet<Gone> {
        self.standing = None;
        self.settle_writes().await;
        let mut objects = stores.objects();
        self.fresh_policies.apply(&mut objects.policies, true);
        self.writer
            .fresh_maintenances()
            .apply(&mut objects.maintenances, true);
        if !self.arrived.is_empty() {
            let pending: BTreeSet<String> = objects
                .maintenances
                .iter()
                .filter(|m| m.phase() == MaintenancePhase::Pending)
                .map(|m| m.name_any())
                .collect();
            self.arrived.retain(|name, _| pending.contains(name));
        }
        let lookups = blockers::wanted(
            &objects.maintenances,
            &objects.policies,
            blockers::by_labels(&objects.nodes),
        );
        if !lookups.is_empty() {
            objects.blockers = self.blockers.blocked(&lookups).await;
        }
        let started = Instant::now();
        let mut plan = round::plan(&objects, &mut self.memory, Timestamp::now());
        if !self.decided("full", started, &plan, leader) {
            return BTreeSet::new();
        }
        if self.admit_all(&objects, &plan).await {
            self.standing = Some(std::mem::take(&mut plan.standing));
        }
        for denial in &plan.deny {
            self.deny(&objects, denial).await;
        }
        for ending in &plan.end {
            self.end(&objects, &ending.maintenance, ending.phase, &ending.message)
                .await;
        }
        for (maintenance, node) in &plan.delete_nodes {
            let nodes: Api<Node> = Api::all(self.writer.client.clone());
            match nodes.delete(node, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::warn!(%maintenance, %node, "deleted the Node of a drained DeleteNode maintenance")
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(error = %Error::kube("deleting", format!("Node {node}"), e), "DeleteNode maintenance")
                }
            }
        }
        for timeout in &plan.startup_timeouts {
            self.startup_timeout(timeout).await;
        }
        for request in &plan.remediate {
            self.remediate(&objects, request).await;
        }
        plan.confirm_gone
    }

    /// Decides maintenances that appeared pending since the last full round against what it
    /// left, and writes the outcome. Returns false when the standing cannot decide them (then
    /// a full round must).
    async fn admission_round(
        &mut self,
        stores: &Stores,
        names: &[String],
        leader: &watch::Receiver<bool>,
    ) -> bool {
        let Some(mut standing) = self.standing.take() else {
            return false;
        };
        let mut objects = Objects {
            policies: stores.policies.state(),
            maintenances: names
                .iter()
                .filter_map(|name| stores.maintenances.get(&reflector::ObjectRef::new(name)))
                .collect(),
            ..Objects::default()
        };
        self.fresh_policies.apply(&mut objects.policies, true);
        self.writer
            .fresh_maintenances()
            .apply(&mut objects.maintenances, false);
        let lookups = blockers::wanted(&objects.maintenances, &objects.policies, |policy, node| {
            standing.cluster.nodes.contains_key(node).then(|| {
                let name = policy.name_any();
                standing
                    .cluster
                    .policies
                    .iter()
                    .any(|p| p.name == name && p.matched.contains(node))
            })
        });
        let blocked = if lookups.is_empty() {
            BTreeMap::new()
        } else {
            self.blockers.blocked(&lookups).await
        };
        let started = Instant::now();
        let Some(plan) = round::admit_new(
            &mut standing,
            &objects.policies,
            &objects.maintenances,
            &blocked,
            Timestamp::now(),
        ) else {
            return false;
        };
        if !self.decided("admission", started, &plan, leader) {
            return true;
        }
        if self.admit_all(&objects, &plan).await {
            self.standing = Some(standing);
        }
        for denial in &plan.deny {
            self.deny(&objects, denial).await;
        }
        true
    }

    /// Writes the plan's budget slots, then starts writing the admissions they hold (the
    /// loop goes on meanwhile; a failed admission write wakes a full round). Returns whether
    /// every slot stood and every admission is being written: what the plan left standing is
    /// then what the cluster holds, or more (a failed admission write keeps its slot until
    /// a full round looks), never less.
    async fn admit_all(&mut self, objects: &Objects, plan: &Plan) -> bool {
        let started = Instant::now();
        let failed = self.write_policies(objects, plan).await;
        let slot_writes = started.elapsed();
        // The coordinator's own share of each admission: from its watch event to its write,
        // less the budget writes (API server time).
        for admission in &plan.admit {
            if let Some(arrived) = self.arrived.remove(&admission.maintenance) {
                let own = arrived.elapsed().saturating_sub(slot_writes);
                self.writer
                    .metrics
                    .admission_coordinator_seconds
                    .observe(own.as_secs_f64());
            }
        }
        for denial in &plan.deny {
            self.arrived.remove(&denial.maintenance);
        }
        let admissions: Vec<(Arc<NodeMaintenance>, round::Admission)> = plan
            .admit
            .iter()
            .filter(|a| !a.new_slots_in.iter().any(|p| failed.contains(p)))
            .filter_map(|a| {
                Some((
                    Self::maintenance(objects, &a.maintenance)?.clone(),
                    a.clone(),
                ))
            })
            .collect();
        let complete = failed.is_empty() && admissions.len() == plan.admit.len();
        if !admissions.is_empty() {
            // Each admission is its own object: written side by side once the slots stand.
            let writer = self.writer.clone();
            let changed = self.writer.changed.clone();
            self.writes.spawn(async move {
                let written = futures::future::join_all(
                    admissions
                        .iter()
                        .map(|(current, a)| writer.admit(current, a)),
                )
                .await;
                let all = written.iter().all(|ok| *ok);
                if !all {
                    changed.anything();
                }
                all
            });
        }
        complete
    }

    /// Collects admission writes that finished; a failed one ends the standing.
    fn reap_writes(&mut self) {
        while let Some(done) = self.writes.try_join_next() {
            if !matches!(done, Ok(true)) {
                self.standing = None;
            }
        }
    }

    /// Waits for every admission write under way, so that a full round decides on them.
    async fn settle_writes(&mut self) {
        while self.writes.join_next().await.is_some() {}
    }

    /// Records a round's decision time and exports its plan; returns whether this coordinator
    /// still leads (only then is the plan written).
    fn decided(
        &self,
        round: &'static str,
        started: Instant,
        plan: &Plan,
        leader: &watch::Receiver<bool>,
    ) -> bool {
        self.writer
            .metrics
            .decision_seconds
            .get_or_create(&RoundLabels { round })
            .observe(started.elapsed().as_secs_f64());
        self.export(plan);
        *leader.borrow()
    }

    fn export(&self, plan: &Plan) {
        for (policy, (used, max)) in &plan.budget_use {
            let labels = PolicyLabels {
                policy: policy.clone(),
            };
            self.writer
                .metrics
                .budget_used
                .get_or_create(&labels)
                .set(i64::try_from(*used).unwrap_or(i64::MAX));
            self.writer
                .metrics
                .budget_max
                .get_or_create(&labels)
                .set(i64::try_from(*max).unwrap_or(i64::MAX));
        }
        for (policy, unhealthy) in &plan.unhealthy {
            self.writer
                .metrics
                .unhealthy
                .get_or_create(&PolicyLabels {
                    policy: policy.clone(),
                })
                .set(i64::try_from(*unhealthy).unwrap_or(i64::MAX));
        }
    }

    /// Writes each changed policy status with the resourceVersion it was decided on. Returns
    /// the policies whose write failed (their new slots do not exist).
    async fn write_policies(&mut self, objects: &Objects, plan: &Plan) -> BTreeSet<String> {
        let api: Api<DisruptionPolicy> = Api::all(self.writer.client.clone());
        let mut failed = BTreeSet::new();
        for (name, status) in &plan.policy_status {
            let Some(current) = objects.policies.iter().find(|p| p.name_any() == *name) else {
                continue;
            };
            let mut updated = current.as_ref().clone();
            updated.status = Some(status.clone());
            let write = self
                .writer
                .changed
                .writing(&DisruptionPolicy::kind(&()), name);
            match api
                .replace_status(name, &PostParams::default(), &updated)
                .await
            {
                Ok(written) => {
                    write.done(written.resource_version());
                    self.fresh_policies.record(current, written);
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    self.writer.metrics.slot_conflicts.inc();
                    tracing::info!(policy = %name, "policy changed since it was read (another writer); deciding again");
                    failed.insert(name.clone());
                }
                Err(e) => {
                    tracing::warn!(error = %Error::kube("writing the status of", format!("DisruptionPolicy {name}"), e), "budget write failed");
                    failed.insert(name.clone());
                }
            }
        }
        failed
    }

    fn maintenance<'a>(objects: &'a Objects, name: &str) -> Option<&'a Arc<NodeMaintenance>> {
        objects.maintenances.iter().find(|m| m.name_any() == name)
    }

    async fn deny(&mut self, objects: &Objects, denial: &round::Denial) {
        let Some(current) = Self::maintenance(objects, &denial.maintenance) else {
            return;
        };
        let existing: Option<&Condition> = current.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == maintenance_conditions::ADMITTED)
        });
        let same_reason =
            existing.is_some_and(|c| c.status == "False" && c.reason == denial.reason);
        if same_reason && existing.is_some_and(|c| c.message == denial.message) {
            return;
        }
        let recently = self
            .denied_at
            .get(&denial.maintenance)
            .is_some_and(|t| t.elapsed() < DENIAL_REFRESH);
        if same_reason && recently && message_follows_progress(denial.reason) {
            return;
        }
        let now = Timestamp::now();
        let generation = current.metadata.generation;
        let written = self
            .writer
            .write_maintenance(current, |status| {
                status.phase = MaintenancePhase::Pending;
                round::set_condition(
                    &mut status.conditions,
                    maintenance_conditions::ADMITTED,
                    "False",
                    denial.reason,
                    denial.message.clone(),
                    generation,
                    now,
                );
            })
            .await;
        if written {
            self.denied_at
                .insert(denial.maintenance.clone(), Instant::now());
            self.denied_at.retain(|_, t| t.elapsed() < DENIAL_REFRESH);
            if !same_reason {
                self.writer
                    .metrics
                    .denials
                    .get_or_create(&ReasonLabels {
                        reason: denial.reason.to_owned(),
                    })
                    .inc();
                self.writer
                    .event(
                        current.as_ref(),
                        EventType::Normal,
                        denial.reason,
                        denial.message.clone(),
                    )
                    .await;
            }
        }
    }

    async fn end(
        &mut self,
        objects: &Objects,
        maintenance: &str,
        phase: MaintenancePhase,
        message: &str,
    ) {
        let Some(current) = Self::maintenance(objects, maintenance) else {
            return;
        };
        let now = Timestamp::now();
        let written = self
            .writer
            .write_maintenance(current, |status| {
                status.enter(phase, Time(now));
                status.finished_at = Some(Time(now));
                status.message = Some(message.to_owned());
            })
            .await;
        if written {
            tracing::info!(%maintenance, ?phase, %message, "maintenance ended");
            let kind = if phase == MaintenancePhase::Succeeded {
                EventType::Normal
            } else {
                EventType::Warning
            };
            self.writer
                .event(
                    current.as_ref(),
                    kind,
                    &format!("{phase:?}"),
                    message.to_owned(),
                )
                .await;
        }
    }

    async fn startup_timeout(&mut self, timeout: &round::StartupTimeout) {
        let nodes: Api<Node> = Api::all(self.writer.client.clone());
        if !timeout.reported {
            let condition = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": timeout.node},
                "status": {"conditions": [{
                    "type": node_conditions::STARTUP_TIMED_OUT,
                    "status": "True",
                    "reason": "NeverBecameReady",
                    "message": format!("{} (policy {})", timeout.message, timeout.policy),
                    "lastTransitionTime": Time(Timestamp::now()),
                    "lastHeartbeatTime": Time(Timestamp::now()),
                }]},
            });
            let applied = nodes
                .patch_status(
                    &timeout.node,
                    &PatchParams::apply(COORDINATOR_FIELD_MANAGER).force(),
                    &Patch::Apply(&condition),
                )
                .await;
            match applied {
                Ok(node) => {
                    tracing::warn!(node = %timeout.node, message = %timeout.message, "node startup timeout");
                    self.writer
                        .event(
                            &node,
                            EventType::Warning,
                            "NodeStartupTimeout",
                            format!("{} (policy {})", timeout.message, timeout.policy),
                        )
                        .await;
                }
                Err(e) => {
                    tracing::warn!(error = %Error::kube("writing the startup condition of", format!("Node {}", timeout.node), e), "startup timeout not recorded");
                    return;
                }
            }
        }
        if timeout.action == StartupAction::DeleteNode {
            match nodes.delete(&timeout.node, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::warn!(node = %timeout.node, policy = %timeout.policy, "deleted a node that never became Ready");
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(error = %Error::kube("deleting", format!("Node {}", timeout.node), e), "startup action failed")
                }
            }
        }
    }

    async fn remediate(&mut self, objects: &Objects, request: &round::RemediationRequest) {
        self.remediated_at
            .retain(|_, t| t.elapsed() < REMEDIATION_DEBOUNCE);
        if self.remediated_at.contains_key(&request.node) {
            return;
        }
        if let Some(replaced) = &request.replaces
            && Self::maintenance(objects, replaced).is_some()
        {
            self.end(
                objects,
                replaced,
                MaintenancePhase::Failed,
                &request.message,
            )
            .await;
        }
        let mut maintenance = NodeMaintenance::request(
            "",
            &request.node,
            MaintenanceReason::Remediation,
            request.action,
            COORDINATOR_FIELD_MANAGER,
            request.message.clone(),
        );
        maintenance.metadata.name = None;
        maintenance.metadata.generate_name =
            Some(format!("remediation-{}-", truncate(&request.node, 40)));
        let api: Api<NodeMaintenance> = Api::all(self.writer.client.clone());
        match api.create(&PostParams::default(), &maintenance).await {
            Ok(created) => {
                self.remediated_at
                    .insert(request.node.clone(), Instant::now());
                self.writer.metrics.remediations.inc();
                tracing::warn!(node = %request.node, maintenance = %created.name_any(), action = ?request.action, message = %request.message, "remediation requested");
                self.writer
                    .event(
                        &created,
                        EventType::Warning,
                        "RemediationRequested",
                        request.message.clone(),
                    )
                    .await;
            }
            Err(e) => {
                tracing::warn!(error = %Error::kube("creating a remediation NodeMaintenance for", format!("Node {}", request.node), e), "remediation not requested")
            }
        }
    }

    /// Confirms with a direct read that objects missing from the watch are gone; returns
    /// whether any was (a new round can then free their slots).
    async fn confirm_gone(&mut self, missing: BTreeSet<Gone>) -> bool {
        let mut any = false;
        for gone in missing {
            let absent = match &gone {
                Gone::Maintenance { name, uid } => {
                    let api: Api<NodeMaintenance> = Api::all(self.writer.client.clone());
                    match api.get_opt(name).await {
                        Ok(found) => found.is_none_or(|m| m.uid().as_deref() != Some(uid)),
                        Err(_) => false,
                    }
                }
                Gone::Node(name) => {
                    let api: Api<Node> = Api::all(self.writer.client.clone());
                    matches!(api.get_opt(name).await, Ok(None))
                }
            };
            if absent {
                self.memory.confirmed_gone.insert(gone);
                any = true;
            }
        }
        any
    }
}

impl Writer {
    /// Replaces a maintenance's status with its resourceVersion as precondition; a conflict
    /// means someone changed it first, and the next round looks again.
    async fn write_maintenance(
        &self,
        current: &NodeMaintenance,
        change: impl FnOnce(&mut nodeward_api::NodeMaintenanceStatus),
    ) -> bool {
        let name = current.name_any();
        let mut updated = current.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        if status.history.is_empty() {
            status.history.push(PhaseTransition {
                phase: MaintenancePhase::Pending,
                time: current
                    .metadata
                    .creation_timestamp
                    .clone()
                    .unwrap_or(Time(Timestamp::now())),
            });
        }
        change(status);
        status.observed_generation = current.metadata.generation;
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let write = self.changed.writing(&NodeMaintenance::kind(&()), &name);
        match api
            .replace_status(&name, &PostParams::default(), &updated)
            .await
        {
            Ok(written) => {
                write.done(written.resource_version());
                self.fresh_maintenances().record(current, written);
                true
            }
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => false,
            Err(e) => {
                tracing::warn!(error = %Error::kube("writing the status of", format!("NodeMaintenance {name}"), e), "maintenance status write failed");
                false
            }
        }
    }

    fn fresh_maintenances(&self) -> std::sync::MutexGuard<'_, Fresh<NodeMaintenance>> {
        self.fresh_maintenances
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a maintenance Admitted; returns whether that was written.
    async fn admit(&self, current: &NodeMaintenance, admission: &round::Admission) -> bool {
        let now = Timestamp::now();
        let record = AdmissionRecord {
            policies: admission.policies.clone(),
            admitted_at: Time(now),
            admitted_by: self.identity.clone(),
        };
        let message = if admission.policies.is_empty() {
            "no DisruptionPolicy matches the node; admitted without limits".to_owned()
        } else {
            format!("holds a slot in policies {}", admission.policies.join(", "))
        };
        let generation = current.metadata.generation;
        let note = message.clone();
        let written = self
            .write_maintenance(current, |status| {
                status.enter(MaintenancePhase::Admitted, Time(now));
                status.admission = Some(record);
                status.message = Some(message.clone());
                round::set_condition(
                    &mut status.conditions,
                    maintenance_conditions::ADMITTED,
                    "True",
                    "Admitted",
                    message,
                    generation,
                    now,
                );
            })
            .await;
        if written {
            self.metrics.admissions.inc();
            if let Some(created) = current.metadata.creation_timestamp.as_ref() {
                let latency = now.duration_since(created.0).as_secs_f64().max(0.0);
                self.metrics.admission_latency_seconds.observe(latency);
            }
            tracing::info!(maintenance = %admission.maintenance, node = %current.spec.node_name, policies = ?admission.policies, "admitted");
            self.event(current, EventType::Normal, "Admitted", note)
                .await;
        }
        written
    }

    /// Publishes an Event off the decision path: a round does not wait for it.
    async fn event<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let reference = object.object_ref(&());
        let recorder = self.recorder.clone();
        let reason = reason.to_owned();
        tokio::spawn(async move {
            let published = recorder
                .publish(
                    &Event {
                        type_,
                        reason: reason.clone(),
                        note: Some(note),
                        action: "Admission".to_owned(),
                        secondary: None,
                    },
                    &reference,
                )
                .await;
            if let Err(e) = published {
                tracing::warn!(error = %e, %reason, "publishing an event failed");
            }
        });
    }
}

fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].trim_end_matches(['-', '.'])
}

/// Lists every watched kind once (for `status`).
pub async fn list_all(client: &Client) -> Result<Objects, Error> {
    async fn list<K>(client: &Client) -> Result<Vec<Arc<K>>, Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let api: Api<K> = Api::all(client.clone());
        let listed = api
            .list(&Default::default())
            .await
            .map_err(|e| Error::kube("listing", K::plural(&()).into_owned(), e))?;
        Ok(listed.items.into_iter().map(Arc::new).collect())
    }
    Ok(Objects {
        nodes: list(client).await?,
        policies: list(client).await?,
        maintenances: list(client).await?,
        reports: list(client).await?,
        blockers: BTreeMap::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIND: &str = "NodeMaintenance";

    fn full_round(changes: &Changes) -> bool {
        changes.take().anything
    }

    #[test]
    fn an_own_write_wakes_no_full_round_whichever_arrives_first() {
        let changes = Arc::new(Changes::default());
        // Response first, then the watch event.
        changes.writing(KIND, "m").done(Some("10".into()));
        assert!(!changes.changed(KIND, "m", Some("10".into())));
        assert!(!full_round(&changes));
        // Watch event first (it waits), then the response.
        let write = changes.writing(KIND, "m");
        assert!(!changes.changed(KIND, "m", Some("11".into())));
        write.done(Some("11".into()));
        assert!(!full_round(&changes));
    }

    #[test]
    fn another_writers_change_during_an_own_write_wakes_a_full_round_once_it_returns() {
        let changes = Arc::new(Changes::default());
        let write = changes.writing(KIND, "m");
        assert!(!changes.changed(KIND, "m", Some("11".into())));
        assert!(!changes.changed(KIND, "m", Some("12".into())));
        assert!(!full_round(&changes));
        write.done(Some("12".into()));
        assert!(full_round(&changes));
        // A failed write (dropped guard): whatever came meanwhile was someone else's.
        let write = changes.writing(KIND, "m");
        assert!(!changes.changed(KIND, "m", Some("13".into())));
        drop(write);
        assert!(full_round(&changes));
    }

    #[test]
    fn other_changes_and_deletions_wake_a_full_round() {
        let changes = Arc::new(Changes::default());
        let _write = changes.writing(KIND, "m");
        // Another object, and a kind the coordinator does not write (no version).
        assert!(changes.changed(KIND, "other", Some("20".into())));
        assert!(full_round(&changes));
        assert!(changes.changed("Node", "m", None));
        assert!(full_round(&changes));
        assert!(!full_round(&changes));
    }

    #[test]
    fn only_denials_whose_message_follows_progress_are_throttled() {
        for reason in [
            denial::BUDGET_EXHAUSTED,
            denial::TOO_MANY_UNHEALTHY,
            denial::QUORUM_PROTECTED,
        ] {
            assert!(message_follows_progress(reason), "{reason}");
        }
        for reason in [denial::BLOCKED, denial::PAUSED, denial::OUTSIDE_WINDOW] {
            assert!(!message_follows_progress(reason), "{reason}");
        }
    }

    #[test]
    fn new_pending_maintenances_are_kept_apart_from_full_round_causes() {
        let changes = Changes::default();
        changes.new_pending("m1".into());
        let taken = changes.take();
        assert!(!taken.anything);
        assert_eq!(taken.new_pending.len(), 1);
        assert_eq!(taken.new_pending[0].0, "m1");
    }
}
