//! What the controller watches: its kinds in reflector stores, which of their changes
//! wake a round, and the coordinator's own writes until the watch shows them.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use futures::StreamExt;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store, reflector},
        watcher,
    },
};
use nodeward_api::{
    DisruptionPolicy, MaintenancePhase, NodeMaintenance, NodeReport,
    fleet::{LEASE_LABEL, PEERS_MANAGED_BY, POLICIES_CONFIGMAP},
};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use nodeward_decide::round::Objects;

/// What changed since the controller last looked: maintenances that appeared pending (an
/// admission-only round can decide them) or anything else (a full round).
///
/// It also tells the coordinator's own writes from others', so that they wake nothing (the
/// round that wrote them already decided on them). A write's watch event can arrive before
/// its response: events for an object with a write under way wait until the write returns,
/// and then only those with another resourceVersion count.
#[derive(Default)]
pub struct Changes {
    pub(super) notify: Notify,
    pub(super) seen: std::sync::Mutex<Seen>,
}

#[derive(Default)]
pub(super) struct Seen {
    pub(super) changes: ChangeSet,
    /// resourceVersions written whose watch events have not come yet.
    pub(super) unseen_writes: HashSet<String>,
    /// Objects ("Kind/name") with writes under way: how many, and the resourceVersions of the
    /// watch events seen for them meanwhile.
    pub(super) under_way: HashMap<String, (usize, Vec<String>)>,
}

#[derive(Default)]
pub(super) struct ChangeSet {
    /// Something a full round must look at.
    pub(super) anything: bool,
    /// Names, with when their watch event arrived.
    pub(super) new_pending: Vec<(String, Instant)>,
}

impl Changes {
    pub fn anything(&self) {
        self.update(|set| set.anything = true);
    }

    pub(super) fn new_pending(&self, name: String) {
        self.update(|set| set.new_pending.push((name, Instant::now())));
    }

    /// An object of `kind` changed in a way decisions read. `version`: its resourceVersion
    /// when the coordinator writes objects of that kind (it may be an own write). Returns
    /// whether this wakes a full round now.
    pub(super) fn changed(&self, kind: &str, name: &str, version: Option<String>) -> bool {
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
    pub(super) fn writing(self: &Arc<Self>, kind: &str, name: &str) -> OwnWrite {
        let key = format!("{kind}/{name}");
        self.lock().under_way.entry(key.clone()).or_default().0 += 1;
        OwnWrite {
            changes: self.clone(),
            key,
            finished: false,
        }
    }

    /// A write of `key` returned, with the resourceVersion it wrote (None: it failed).
    pub(super) fn finish(&self, key: &str, written: Option<String>) {
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

    pub(super) fn update(&self, change: impl FnOnce(&mut ChangeSet)) {
        change(&mut self.lock().changes);
        self.notify.notify_one();
    }

    pub(super) fn take(&self) -> ChangeSet {
        std::mem::take(&mut self.lock().changes)
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A write under way (see [`Changes::writing`]); dropped without [`OwnWrite::done`], the
/// write counts as failed.
pub(super) struct OwnWrite {
    pub(super) changes: Arc<Changes>,
    pub(super) key: String,
    pub(super) finished: bool,
}

impl OwnWrite {
    pub(super) fn done(mut self, version: Option<String>) {
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

/// The watched kinds: cluster-wide the four decisions read, and in the coordinator's
/// namespace the agents' Leases (their liveness) and what it publishes for the agents.
#[derive(Clone)]
pub struct Stores {
    pub nodes: Store<Node>,
    pub policies: Store<DisruptionPolicy>,
    pub maintenances: Store<NodeMaintenance>,
    pub reports: Store<NodeReport>,
    pub leases: Store<Lease>,
    pub peers: Store<EndpointSlice>,
    pub published: Store<ConfigMap>,
}

impl Stores {
    /// Starts a reflector for each kind; a change that can matter to a decision wakes
    /// `changed` (heartbeats and Lease renewals do not: at 1,000 nodes they would run a round
    /// every few ms).
    pub fn watch(
        client: &Client,
        namespace: &str,
        changed: &Arc<Changes>,
        tasks: &mut tokio::task::JoinSet<()>,
    ) -> Self {
        let mut watch = Watch { changed, tasks };
        let all = watcher::Config::default;
        Self {
            nodes: watch.reflect(
                Api::all(client.clone()),
                all(),
                Reflected {
                    trim: trim::node,
                    relevance: relevance::node,
                    ..Reflected::default()
                },
            ),
            policies: watch.reflect(
                Api::all(client.clone()),
                all(),
                Reflected {
                    trim: trim::policy,
                    own_writes: true,
                    ..Reflected::default()
                },
            ),
            maintenances: watch.reflect(
                Api::all(client.clone()),
                all(),
                Reflected {
                    trim: trim::maintenance,
                    new_pending: |m: &NodeMaintenance| {
                        m.phase() == MaintenancePhase::Pending
                            && m.metadata.deletion_timestamp.is_none()
                    },
                    own_writes: true,
                    ..Reflected::default()
                },
            ),
            reports: watch.reflect(
                Api::all(client.clone()),
                all(),
                Reflected {
                    trim: trim::report,
                    relevance: relevance::report,
                    ..Reflected::default()
                },
            ),
            leases: watch.reflect(
                Api::namespaced(client.clone(), namespace),
                all().labels(LEASE_LABEL),
                Reflected {
                    trim: trim::lease,
                    relevance: relevance::lease,
                    ..Reflected::default()
                },
            ),
            peers: watch.reflect(
                Api::namespaced(client.clone(), namespace),
                all().labels(&format!(
                    "endpointslice.kubernetes.io/managed-by={PEERS_MANAGED_BY}"
                )),
                Reflected {
                    relevance: relevance::nothing,
                    ..Reflected::default()
                },
            ),
            published: watch.reflect(
                Api::namespaced(client.clone(), namespace),
                all().fields(&format!("metadata.name={POLICIES_CONFIGMAP}")),
                Reflected {
                    relevance: relevance::nothing,
                    ..Reflected::default()
                },
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
        let (e, f, g) = futures::join!(
            self.leases.wait_until_ready(),
            self.peers.wait_until_ready(),
            self.published.wait_until_ready(),
        );
        [a, b, c, d, e, f, g].iter().all(Result::is_ok)
    }

    pub fn objects(&self) -> Objects {
        Objects {
            nodes: self.nodes.state(),
            policies: self.policies.state(),
            maintenances: self.maintenances.state(),
            reports: self.reports.state(),
            leases: self.leases.state(),
            blockers: BTreeMap::new(),
            gates: BTreeMap::new(),
            workloads: BTreeMap::new(),
            availability: BTreeMap::new(),
            scans: BTreeMap::new(),
            surged: BTreeMap::new(),
            finished_ttl: None,
            marks: Vec::new(),
        }
    }
}

/// What each cache drops before it stores an object: what nothing here reads, and is sized by
/// whoever wrote it. Managed fields go from every object.
mod trim {
    use std::collections::BTreeMap;

    use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
    use nodeward_api::{DisruptionPolicy, NodeMaintenance, NodeReport};

    /// Image lists are most of a Node's size and nothing here reads them. Its labels are what
    /// policies select; of its annotations only nodeward's own records are read.
    pub(super) fn node(node: &mut Node) {
        if let Some(status) = node.status.as_mut() {
            status.images = None;
        }
        only_nodewards(&mut node.metadata.annotations);
    }

    pub(super) fn policy(policy: &mut DisruptionPolicy) {
        only_nodewards(&mut policy.metadata.annotations);
    }

    /// Only the spec's drain plan and note can be large, and only the agent reads them.
    /// (Status is kept whole: the coordinator writes it back.)
    pub(super) fn maintenance(m: &mut NodeMaintenance) {
        m.spec.drain_plan = None;
        m.spec.message = None;
        only_nodewards(&mut m.metadata.labels);
        only_nodewards(&mut m.metadata.annotations);
    }

    /// Decisions read the heartbeat, the pause acknowledgements, the peers' sightings and
    /// which detectors report how: not the findings' messages, the inhibitor or the shutdown
    /// progress.
    pub(super) fn report(r: &mut NodeReport) {
        only_nodewards(&mut r.metadata.labels);
        only_nodewards(&mut r.metadata.annotations);
        if let Some(s) = r.status.as_mut() {
            for f in &mut s.findings {
                f.message.clear();
            }
            s.inhibitor = None;
            s.shutdown = None;
            s.conditions.clear();
        }
    }

    pub(super) fn lease(l: &mut Lease) {
        only_nodewards(&mut l.metadata.labels);
        only_nodewards(&mut l.metadata.annotations);
    }

    /// Keeps of labels or annotations only nodeward's own (`nodeward.io/`): nothing here reads
    /// the others, and what they hold is sized by whoever wrote them (a `kubectl apply` record,
    /// an admin's notes).
    pub(super) fn only_nodewards(map: &mut Option<BTreeMap<String, String>>) {
        if let Some(map) = map.as_mut() {
            map.retain(|k, _| k.starts_with("nodeward.io/"));
        }
    }
}

/// How one kind is reflected.
struct Reflected<K> {
    /// Drops what nothing reads, before the object is stored.
    trim: fn(&mut K),
    /// A digest of what decisions read: an update that leaves it alone wakes nothing.
    relevance: fn(&K) -> u64,
    /// Whether a first sighting is one an admission-only round can decide.
    new_pending: fn(&K) -> bool,
    /// Whether the coordinator writes objects of this kind (its own writes then wake nothing).
    own_writes: bool,
}

impl<K: Resource> Default for Reflected<K> {
    fn default() -> Self {
        Self {
            trim: |_| {},
            relevance: relevance::any_change,
            new_pending: |_| false,
            own_writes: false,
        }
    }
}

/// Where reflectors start: the wake-ups, the task set.
struct Watch<'a> {
    changed: &'a Arc<Changes>,
    tasks: &'a mut tokio::task::JoinSet<()>,
}

impl Watch<'_> {
    /// Starts a reflector of the `K` that `api` and `config` select, waking `changed` as `how`
    /// says.
    fn reflect<K>(&mut self, api: Api<K>, config: watcher::Config, how: Reflected<K>) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let Reflected {
            trim,
            relevance,
            new_pending,
            own_writes,
        } = how;
        let (reader, writer) = reflector::store();
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        let changed = self.changed.clone();
        let stream = reflector(
            writer,
            watcher(api, config)
                .default_backoff()
                .modify(move |object: &mut K| {
                    object.managed_fields_mut().clear();
                    trim(object);
                }),
        );
        // What each object looked like to decisions when last seen.
        let mut seen: HashMap<String, u64> = HashMap::new();
        self.tasks.spawn(stream.for_each(move |event| {
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
}

/// Digests of what decisions read from an object, so that other updates wake nothing.
mod relevance {
    use std::hash::{DefaultHasher, Hash, Hasher};

    use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
    use kube::Resource;
    use nodeward_api::NodeReport;

    pub fn any_change<K: Resource>(object: &K) -> u64 {
        let mut h = DefaultHasher::new();
        object.meta().resource_version.hash(&mut h);
        h.finish()
    }

    /// Labels, nodeward's annotations (the cache keeps no others), the cordon and taints (what
    /// tells another actor's disruption), deletion, and each condition's status and transition
    /// (not its heartbeat).
    pub fn node(node: &Node) -> u64 {
        let mut h = DefaultHasher::new();
        node.metadata.labels.hash(&mut h);
        node.metadata.annotations.hash(&mut h);
        if let Some(spec) = node.spec.as_ref() {
            spec.unschedulable.hash(&mut h);
            for t in spec.taints.iter().flatten() {
                (&t.key, &t.effect).hash(&mut h);
            }
        }
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

    /// An agent's Lease: who holds it (a new agent), not its renewals, whose age is checked
    /// on every resync instead.
    pub fn lease(lease: &Lease) -> u64 {
        let mut h = DefaultHasher::new();
        lease.spec.as_ref().map(|s| &s.holder_identity).hash(&mut h);
        h.finish()
    }

    /// What the coordinator publishes: nothing it decides reads it.
    pub fn nothing<K>(_: &K) -> u64 {
        0
    }

    /// Pause acknowledgements and the boot; heartbeat age is checked on every resync instead.
    pub fn report(report: &NodeReport) -> u64 {
        let mut h = DefaultHasher::new();
        report.status.as_ref().map(|s| &s.boot_id).hash(&mut h);
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
pub(super) struct Fresh<K> {
    pub(super) written: HashMap<String, (Option<String>, Arc<K>)>,
}

impl<K: Resource> Fresh<K> {
    pub(super) fn new() -> Self {
        Self {
            written: HashMap::new(),
        }
    }

    pub(super) fn record(&mut self, before: &K, written: K) {
        self.written.insert(
            written.name_any(),
            (before.resource_version(), Arc::new(written)),
        );
    }

    /// Puts what was written in place of the versions it replaced. Records whose object
    /// moved on are dropped; with `complete` (every object of the kind), so are the records
    /// of objects absent.
    pub(super) fn apply(&mut self, objects: &mut [Arc<K>], complete: bool) {
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

#[cfg(test)]
mod tests {
    use super::*;

    const KIND: &str = "NodeMaintenance";

    pub(super) fn full_round(changes: &Changes) -> bool {
        changes.take().anything
    }

    #[test]
    pub(super) fn an_own_write_wakes_no_full_round_whichever_arrives_first() {
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
    pub(super) fn another_writers_change_during_an_own_write_wakes_a_full_round_once_it_returns() {
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
    pub(super) fn other_changes_and_deletions_wake_a_full_round() {
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
    fn the_caches_keep_only_nodewards_own_labels_and_annotations() {
        let mut map = Some(BTreeMap::from([
            ("nodeward.io/cordoned-by".to_owned(), "m1".to_owned()),
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
                "x".repeat(1 << 20),
            ),
            ("example.com/nodeward.io/x".to_owned(), String::new()),
        ]));
        trim::only_nodewards(&mut map);
        let kept: Vec<&String> = map.iter().flat_map(BTreeMap::keys).collect();
        assert_eq!(kept, ["nodeward.io/cordoned-by"]);
        let mut none = None;
        trim::only_nodewards(&mut none);
        assert_eq!(none, None);
    }

    #[test]
    pub(super) fn new_pending_maintenances_are_kept_apart_from_full_round_causes() {
        let changes = Changes::default();
        changes.new_pending("m1".into());
        let taken = changes.take();
        assert!(!taken.anything);
        assert_eq!(taken.new_pending.len(), 1);
        assert_eq!(taken.new_pending[0].0, "m1");
    }
}
