//! One test's private corner of the shared control plane: its own namespace and node names,
//! and helpers to create kwok nodes, workloads bound to them and PodDisruptionBudgets.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, ReplicaSet},
        core::v1::{Namespace, Node, Pod},
        policy::v1::PodDisruptionBudget,
        scheduling::v1::PriorityClass,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{controlplane, wait};

/// Annotation that makes kwok simulate a node (and the pods bound to it).
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Label carried by every object a test creates, with the test's id as value.
pub const TEST_LABEL: &str = "e2e.nodeward.io/test";
const FIELD_MANAGER: &str = "nodeward-e2e";

/// Applies `object`, the `kind` named `name`, server-side through `api`: the tests' field manager
/// takes every field it sets.
pub async fn apply<K>(
    api: &Api<K>,
    kind: &str,
    name: &str,
    object: &(impl serde::Serialize + std::fmt::Debug),
) -> anyhow::Result<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(object))
        .await
        .with_context(|| format!("applying {kind} {name}"))
}

/// The role a simulated node plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Worker,
    ControlPlane,
}

/// What a simulated node looks like.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub role: Role,
    pub zone: String,
    pub labels: BTreeMap<String, String>,
}

impl NodeSpec {
    pub fn worker(zone: &str) -> Self {
        Self {
            role: Role::Worker,
            zone: zone.to_owned(),
            labels: BTreeMap::new(),
        }
    }

    pub fn control_plane(zone: &str) -> Self {
        Self {
            role: Role::ControlPlane,
            ..Self::worker(zone)
        }
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }
}

/// How the pods of a workload look.
#[derive(Clone, Debug)]
pub struct PodOptions {
    /// Pod priority; a PriorityClass with this value is created when set.
    pub priority: Option<i32>,
    pub grace_period_seconds: i64,
    pub labels: BTreeMap<String, String>,
    /// ServiceAccount the pods run as (the namespace's `default` when unset).
    pub service_account: Option<String>,
    /// An existing PriorityClass, e.g. `system-cluster-critical` (instead of `priority`).
    pub priority_class_name: Option<String>,
    /// The pods' tolerations; by default every taint (the simulated nodes' own NoExecute
    /// taints must not evict what a test placed there).
    pub tolerations: serde_json::Value,
}

impl Default for PodOptions {
    fn default() -> Self {
        Self {
            priority: None,
            grace_period_seconds: 1,
            labels: BTreeMap::new(),
            service_account: None,
            priority_class_name: None,
            tolerations: json!([{"operator": "Exists"}]),
        }
    }
}

/// A test's namespace, node names and client.
pub struct TestEnv {
    pub client: Client,
    pub namespace: String,
    /// Short unique id of this test, used in every name it creates.
    pub id: String,
    /// Held for the test's life: shared, or alone for a test that acts on the whole cluster.
    _turn: Turn,
}

/// Some tests act on the whole cluster: a coordinator decides over every node and maintenance
/// (a policy of one test may select another's nodes, its remediation and taints reach them),
/// and for a moment after a CRD changes every request for its kind is answered 429 "storage is
/// (re)initializing", which the test clients do not retry. Such a test runs while no other
/// test of the process does; the others overlap freely.
fn turns() -> Arc<tokio::sync::RwLock<()>> {
    static TURNS: LazyLock<Arc<tokio::sync::RwLock<()>>> = LazyLock::new(Default::default);
    TURNS.clone()
}

enum Turn {
    Shared {
        _held: tokio::sync::OwnedRwLockReadGuard<()>,
    },
    Alone {
        _held: tokio::sync::OwnedRwLockWriteGuard<()>,
    },
}

impl TestEnv {
    /// Attaches to (or starts) the shared control plane, installs the CRDs and creates this
    /// test's namespace. `test` is a short name for the test, used in object names.
    pub async fn new(test: &str) -> anyhow::Result<Self> {
        let turn = Turn::Shared {
            _held: turns().read_owned().await,
        };
        Self::with_turn(test, turn).await
    }

    /// As `new`, for a test that acts on the whole cluster (runs a coordinator, changes the
    /// CRDs): it waits until no other test of this process holds an environment, and others
    /// wait until it has ended.
    pub async fn alone(test: &str) -> anyhow::Result<Self> {
        let turn = Turn::Alone {
            _held: turns().write_owned().await,
        };
        let env = Self::with_turn(test, turn).await?;
        env.forget_leftovers().await?;
        Ok(env)
    }

    /// Deletes what earlier tests left on the cluster (one that fails skips its cleanup): the
    /// tests' nodes and policies, and every NodeReport and NodeMaintenance (a test alone has
    /// none yet). Its coordinator acts on the whole cluster, and another test's leftovers would
    /// change its decisions: stale reports are silent agents, which hold back every dead-node
    /// judgement (a failed 50-node test once failed the dead-node tests after it).
    async fn forget_leftovers(&self) -> anyhow::Result<()> {
        let tests = ListParams::default().labels(TEST_LABEL);
        let everything = ListParams::default();
        forget(
            &Api::<nodeward_api::DisruptionPolicy>::all(self.client.clone()),
            &tests,
        )
        .await?;
        // An agent's finalizer whose agent is gone would keep a maintenance (deleted) for good.
        let maintenances: Api<nodeward_api::NodeMaintenance> = Api::all(self.client.clone());
        let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        for m in maintenances.list(&everything).await? {
            if !m.finalizers().is_empty() {
                let _ = maintenances
                    .patch(&m.name_any(), &PatchParams::default(), &release)
                    .await;
            }
        }
        forget(&maintenances, &everything).await?;
        forget(
            &Api::<nodeward_api::NodeReport>::all(self.client.clone()),
            &everything,
        )
        .await?;
        forget(&self.nodes(), &tests).await
    }

    async fn with_turn(test: &str, turn: Turn) -> anyhow::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let client = controlplane::admin_client().await?;
        let id = format!(
            "{}-{}-{}",
            sanitize(test),
            std::process::id() % 100_000,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let env = Self {
            namespace: format!("e2e-{id}"),
            client,
            id,
            _turn: turn,
        };
        install_crds(&env.client).await?;
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": env.namespace, "labels": {TEST_LABEL: env.id}}
        }))?;
        Api::<Namespace>::all(env.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {}", env.namespace))?;
        // Pods need the namespace's default ServiceAccount, made by the serviceaccount controller.
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(env.client.clone(), &env.namespace);
        wait::until(
            &accounts,
            "default",
            "the default ServiceAccount",
            Duration::from_secs(30),
            |sa| sa.is_some(),
        )
        .await?;
        Ok(env)
    }

    /// The name of this test's node number `index`.
    pub fn node_name(&self, index: usize) -> String {
        format!("{}-n{index}", self.id)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Whether this test's pod `name` is gone or being deleted: evicted, as a drain leaves it.
    pub async fn pod_evicted(&self, name: &str) -> anyhow::Result<bool> {
        let pod = self
            .pods()
            .get_opt(name)
            .await
            .with_context(|| format!("reading pod {name}"))?;
        Ok(pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some()))
    }

    /// A test's environment ([`TestEnv::new`]) with one Ready kwok worker in `zone`, named
    /// `node_name(0)`; the environment and the node's name.
    pub async fn with_worker(test: &str, zone: &str) -> anyhow::Result<(Self, String)> {
        Self::with_worker_on(Self::new(test).await?, zone).await
    }

    /// As [`Self::with_worker`], alone ([`Self::alone`]): for a test that runs a coordinator.
    pub async fn alone_with_worker(test: &str, zone: &str) -> anyhow::Result<(Self, String)> {
        Self::with_worker_on(Self::alone(test).await?, zone).await
    }

    async fn with_worker_on(env: Self, zone: &str) -> anyhow::Result<(Self, String)> {
        env.create_nodes(&[NodeSpec::worker(zone)]).await?;
        let node = env.node_name(0);
        Ok((env, node))
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Merge-patches the Node `name` (as an admin or a test's stand-in for a kubelet would).
    pub async fn merge_node(&self, name: &str, patch: serde_json::Value) -> anyhow::Result<Node> {
        self.nodes()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("patching Node {name}"))
    }

    /// Creates one kwok node per spec (named `node_name(0..)`) and waits until all are Ready.
    pub async fn create_nodes(&self, specs: &[NodeSpec]) -> anyhow::Result<Vec<Node>> {
        let mut names = Vec::new();
        for (index, spec) in specs.iter().enumerate() {
            let name = self.node_name(index);
            let mut labels = spec.labels.clone();
            labels.insert("kubernetes.io/hostname".into(), name.clone());
            labels.insert("kubernetes.io/os".into(), "linux".into());
            labels.insert("topology.kubernetes.io/zone".into(), spec.zone.clone());
            labels.insert(TEST_LABEL.into(), self.id.clone());
            let mut taints = Vec::new();
            match spec.role {
                Role::ControlPlane => {
                    labels.insert(
                        nodeward_api::labels::CONTROL_PLANE_ROLE_LABEL.into(),
                        String::new(),
                    );
                    taints.push(json!({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}));
                }
                Role::Worker => {
                    labels.insert("node-role.kubernetes.io/worker".into(), String::new());
                }
            }
            let node: Node = serde_json::from_value(json!({
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                },
                "spec": {"taints": taints},
            }))?;
            self.nodes()
                .create(&PostParams::default(), &node)
                .await
                .with_context(|| format!("creating node {name}"))?;
            names.push(name);
        }
        let mut nodes = Vec::new();
        for name in &names {
            let node = wait::until(
                &self.nodes(),
                name,
                "node Ready",
                Duration::from_secs(60),
                |n| {
                    n.is_some_and(|n| wait::condition_status(n, "Ready").as_deref() == Some("True"))
                },
            )
            .await?
            .with_context(|| format!("node {name} disappeared"))?;
            nodes.push(node);
        }
        Ok(nodes)
    }

    /// Creates `count` plain kwok nodes (named `node_name(0..count)`, 16 creations at a time)
    /// for benchmarks and waits until every one is Ready, polling with one LIST.
    pub async fn create_many_nodes(
        &self,
        count: usize,
        ready_within: Duration,
    ) -> anyhow::Result<()> {
        self.create_many_nodes_for(count, ready_within, "fake")
            .await
    }

    /// As [`TestEnv::create_many_nodes`], for the kwok that manages nodes annotated
    /// `kwok.x-k8s.io/node=<kwok>` (the control plane's own manages `fake`).
    pub async fn create_many_nodes_for(
        &self,
        count: usize,
        ready_within: Duration,
        kwok: &str,
    ) -> anyhow::Result<()> {
        crate::concurrently(0..count, 16, |index| async move {
            let name = self.node_name(index);
            let node: Node = serde_json::from_value(json!({"metadata": {
                "name": name,
                "labels": {TEST_LABEL: self.id, "kubernetes.io/hostname": name},
                "annotations": {KWOK_NODE_ANNOTATION: kwok},
            }}))?;
            self.nodes()
                .create(&PostParams::default(), &node)
                .await
                .with_context(|| format!("creating node {name}"))?;
            anyhow::Ok(())
        })
        .await?;
        // Listing thousands of nodes is not cheap: every 2 s, not every wait::eventually tick.
        let selector = format!("{TEST_LABEL}={}", self.id);
        let deadline = tokio::time::Instant::now() + ready_within;
        loop {
            let listed = self
                .nodes()
                .list(&ListParams::default().labels(&selector))
                .await
                .context("listing the benchmark's nodes")?;
            let ready = listed
                .items
                .iter()
                .filter(|n| wait::condition_status(*n, "Ready").as_deref() == Some("True"))
                .count();
            if ready == count {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "only {ready} of {count} nodes Ready after {ready_within:?}"
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// A PriorityClass with `value`, shared by every test (the name derives from the value).
    pub async fn priority_class(&self, value: i32) -> anyhow::Result<String> {
        let name = format!("e2e-priority-{value}");
        let pc: PriorityClass = serde_json::from_value(json!({
            "metadata": {"name": name},
            "value": value,
            "globalDefault": false,
        }))?;
        let classes = Api::<PriorityClass>::all(self.client.clone());
        apply(&classes, "PriorityClass", &name, &pc).await?;
        Ok(name)
    }

    async fn pod_template(
        &self,
        app: &str,
        node: Option<&str>,
        options: &PodOptions,
    ) -> anyhow::Result<serde_json::Value> {
        let mut labels = options.labels.clone();
        labels.insert("app".into(), app.to_owned());
        labels.insert(TEST_LABEL.into(), self.id.clone());
        let mut spec = json!({
            "terminationGracePeriodSeconds": options.grace_period_seconds,
            "containers": [{"name": "main", "image": "registry.invalid/nodeward-e2e:fake"}],
            "tolerations": options.tolerations,
        });
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        if let Some(account) = &options.service_account {
            spec["serviceAccountName"] = json!(account);
        }
        if let Some(priority) = options.priority {
            spec["priorityClassName"] = json!(self.priority_class(priority).await?);
        }
        if let Some(class) = &options.priority_class_name {
            spec["priorityClassName"] = json!(class);
        }
        Ok(json!({"metadata": {"labels": labels}, "spec": spec}))
    }

    /// A ReplicaSet named `app` whose `replicas` pods are bound to `node`.
    pub async fn replicaset(
        &self,
        app: &str,
        node: &str,
        replicas: i32,
        options: &PodOptions,
    ) -> anyhow::Result<ReplicaSet> {
        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": app, "labels": {TEST_LABEL: self.id}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": app}},
                "template": self.pod_template(app, Some(node), options).await?,
            },
        }))?;
        Api::<ReplicaSet>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &rs)
            .await
            .with_context(|| format!("creating ReplicaSet {app}"))
    }

    /// A DaemonSet named `app` with one pod on each of this test's nodes that carry the label
    /// `node_label` (key, value); the scheduler binds them.
    pub async fn daemonset(
        &self,
        app: &str,
        node_label: (&str, &str),
        options: &PodOptions,
    ) -> anyhow::Result<DaemonSet> {
        let mut template = self.pod_template(app, None, options).await?;
        template["spec"]["nodeSelector"] = json!({node_label.0: node_label.1, TEST_LABEL: self.id});
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": app, "labels": {TEST_LABEL: self.id}},
            "spec": {"selector": {"matchLabels": {"app": app}}, "template": template},
        }))?;
        Api::<DaemonSet>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &ds)
            .await
            .with_context(|| format!("creating DaemonSet {app}"))
    }

    /// One running pod of a ReplicaSet `app` on `node`, guarded by a PodDisruptionBudget
    /// `app` with `minAvailable: 1` whose status the disruption controller has computed (so
    /// that evicting it is refused from the start).
    pub async fn guarded_pod(&self, app: &str, node: &str) -> anyhow::Result<Pod> {
        self.replicaset(app, node, 1, &PodOptions::default())
            .await?;
        self.pdb(app, app, 1).await?;
        let pod = self
            .running_pods(app, 1)
            .await?
            .pop()
            .context("the guarded pod")?;
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &self.namespace);
        wait::until(
            &pdbs,
            app,
            "the PDB's status",
            Duration::from_secs(60),
            |p| {
                p.and_then(|p| p.status.as_ref())
                    .is_some_and(|s| s.current_healthy == 1)
            },
        )
        .await?;
        Ok(pod)
    }

    /// A PodDisruptionBudget named `name` over the pods labelled `app`.
    pub async fn pdb(
        &self,
        name: &str,
        app: &str,
        min_available: i32,
    ) -> anyhow::Result<PodDisruptionBudget> {
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {TEST_LABEL: self.id}},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
        }))?;
        Api::<PodDisruptionBudget>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pdb)
            .await
            .with_context(|| format!("creating PodDisruptionBudget {name}"))
    }

    /// Waits until `count` pods labelled `app` are Running on their nodes, and returns them.
    pub async fn running_pods(&self, app: &str, count: usize) -> anyhow::Result<Vec<Pod>> {
        let pods = self.pods();
        let selector = format!("app={app}");
        wait::eventually(
            &format!("{count} running pods of {app}"),
            Duration::from_secs(60),
            || {
                let pods = pods.clone();
                let selector = selector.clone();
                async move {
                    let list = pods.list(&ListParams::default().labels(&selector)).await?;
                    let running: Vec<Pod> = list
                        .items
                        .into_iter()
                        .filter(|p| {
                            p.metadata.deletion_timestamp.is_none()
                                && p.status.as_ref().and_then(|s| s.phase.as_deref())
                                    == Some("Running")
                        })
                        .collect();
                    Ok((running.len() == count).then_some(running))
                }
            },
        )
        .await
    }

    /// The events.k8s.io Events about the object named `name` (Events about cluster-scoped
    /// objects live in `default`); `field_selector` adds more, e.g. `regarding.kind=Node`.
    pub async fn events_about(
        &self,
        name: &str,
        field_selector: &str,
    ) -> anyhow::Result<Vec<k8s_openapi::api::events::v1::Event>> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), "default");
        let mut selector = format!("regarding.name={name}");
        if !field_selector.is_empty() {
            selector.push(',');
            selector.push_str(field_selector);
        }
        Ok(events
            .list(&ListParams::default().fields(&selector))
            .await?
            .items)
    }

    /// Waits for an Event with `reason` about `name`.
    pub async fn wait_event(
        &self,
        name: &str,
        field_selector: &str,
        reason: &str,
    ) -> anyhow::Result<k8s_openapi::api::events::v1::Event> {
        self.wait_events(name, field_selector, &[reason])
            .await?
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
            .with_context(|| format!("a {reason} Event about {name}"))
    }

    /// Waits for an Event with `reason` and `action` about `name`: for a reason two of a
    /// daemon's writers share (the agent's report and inventory both publish `WriteRefused`),
    /// whichever the cluster refuses first would otherwise be the one found.
    pub async fn wait_event_of(
        &self,
        name: &str,
        field_selector: &str,
        reason: &str,
        action: &str,
    ) -> anyhow::Result<k8s_openapi::api::events::v1::Event> {
        let of = |e: &k8s_openapi::api::events::v1::Event| {
            e.reason.as_deref() == Some(reason) && e.action.as_deref() == Some(action)
        };
        let found = wait::eventually(
            &format!("a {reason} Event of {action} about {name}"),
            Duration::from_secs(30),
            || async {
                let events = self.events_about(name, field_selector).await?;
                Ok(events.into_iter().find(of))
            },
        )
        .await;
        self.with_events_seen(found, name, field_selector).await
    }

    /// Waits until the Events about `name` include every one of `reasons` and returns them all
    /// (Events are published after the state they tell of, so reading them once right after a
    /// phase is seen races with their writer).
    pub async fn wait_events(
        &self,
        name: &str,
        field_selector: &str,
        reasons: &[&str],
    ) -> anyhow::Result<Vec<k8s_openapi::api::events::v1::Event>> {
        let found = wait::eventually(
            &format!("the Events {reasons:?} about {name}"),
            Duration::from_secs(30),
            || async {
                let events = self.events_about(name, field_selector).await?;
                let seen: Vec<String> = events.iter().filter_map(|e| e.reason.clone()).collect();
                let complete = reasons.iter().all(|r| seen.iter().any(|s| s == r));
                Ok(complete.then_some(events))
            },
        )
        .await;
        self.with_events_seen(found, name, field_selector).await
    }

    /// A wait on Events that timed out, with the reasons (and actions) of those there were.
    async fn with_events_seen<T>(
        &self,
        found: anyhow::Result<T>,
        name: &str,
        field_selector: &str,
    ) -> anyhow::Result<T> {
        let Err(error) = found else {
            return found;
        };
        let seen: Vec<String> = self
            .events_about(name, field_selector)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|e| {
                let reason = e.reason.unwrap_or_default();
                format!("{reason} ({})", e.action.unwrap_or_default())
            })
            .collect();
        Err(error.context(format!("the Events seen about {name}: {seen:?}")))
    }

    /// Stops `daemons` (dropped: killed), then [`Self::cleanup`]: a daemon still running
    /// would act on what the cleanup deletes.
    pub async fn cleanup_after<T>(self, daemons: T) -> anyhow::Result<()> {
        drop(daemons);
        self.cleanup().await
    }

    /// Deletes what this test created: its namespace (and so its workloads), its nodes, its
    /// DisruptionPolicies (labelled with the test) and the NodeMaintenances of its nodes.
    pub async fn cleanup(self) -> anyhow::Result<()> {
        let selector = format!("{TEST_LABEL}={}", self.id);
        let policies: Api<nodeward_api::DisruptionPolicy> = Api::all(self.client.clone());
        for policy in policies
            .list(&ListParams::default().labels(&selector))
            .await?
        {
            policies
                .delete(&policy.name_any(), &DeleteParams::default())
                .await?;
        }
        let maintenances: Api<nodeward_api::NodeMaintenance> = Api::all(self.client.clone());
        let prefix = format!("{}-", self.id);
        for m in maintenances.list(&ListParams::default()).await? {
            if m.spec.node_name.starts_with(&prefix) {
                let _ = maintenances
                    .delete(&m.name_any(), &DeleteParams::default())
                    .await;
            }
        }
        let reports: Api<nodeward_api::NodeReport> = Api::all(self.client.clone());
        for report in reports.list(&ListParams::default()).await? {
            if report.spec.node_name.starts_with(&prefix) {
                let _ = reports
                    .delete(&report.name_any(), &DeleteParams::default())
                    .await;
            }
        }
        let nodes = self
            .nodes()
            .list(&ListParams::default().labels(&selector))
            .await?;
        for node in nodes {
            self.nodes()
                .delete(&node.name_any(), &DeleteParams::default())
                .await?;
        }
        self.delete_release_objects().await?;
        crate::identities::forget(&self.id);
        Api::<Namespace>::all(self.client.clone())
            .delete(&self.namespace, &DeleteParams::default())
            .await?;
        Ok(())
    }

    /// The cluster-wide objects of the chart's release named for this test (its identities,
    /// [`crate::identities`]): the namespace takes the rest.
    async fn delete_release_objects(&self) -> anyhow::Result<()> {
        use k8s_openapi::api::{
            admissionregistration::v1::{
                ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
            },
            rbac::v1::{ClusterRole, ClusterRoleBinding},
        };
        let release =
            ListParams::default().labels(&format!("app.kubernetes.io/instance={}", self.id));
        delete_all(
            &Api::<ClusterRoleBinding>::all(self.client.clone()),
            &release,
        )
        .await?;
        delete_all(&Api::<ClusterRole>::all(self.client.clone()), &release).await?;
        delete_all(
            &Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone()),
            &release,
        )
        .await?;
        delete_all(
            &Api::<ValidatingAdmissionPolicy>::all(self.client.clone()),
            &release,
        )
        .await
    }
}

/// Deletes every object of `api` that `list` selects.
async fn delete_all<K>(api: &Api<K>, list: &ListParams) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    for object in api.list(list).await? {
        api.delete(&object.name_any(), &DeleteParams::default())
            .await?;
    }
    Ok(())
}

/// Deletes what `list` finds, each at most once: one gone meanwhile (its test's daemon was
/// still at it) is what was asked.
async fn forget<K>(api: &Api<K>, list: &ListParams) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    for object in api.list(list).await? {
        let _ = api
            .delete(&object.name_any(), &DeleteParams::default())
            .await;
    }
    Ok(())
}

fn sanitize(test: &str) -> String {
    let name: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(20)
        .collect();
    name.trim_matches('-').to_owned()
}

/// Applies nodeward's CRDs and waits until the API server serves them, once per test process:
/// a test that changes them (the chart upgrade) is not undone by another test starting.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_try_init(|| apply_crds(client))
        .await
        .map(|_| ())
}

/// Applies nodeward's CRDs and waits until the API server serves them, on every call: for a
/// test that changed them, to put them back.
pub async fn apply_crds(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in nodeward_api::crds::all() {
        let name = crd.name_any();
        apply(&crds, "CRD", &name, &crd).await?;
        let established = |c: Option<&CustomResourceDefinition>| {
            c.and_then(|c| wait::condition_status(c, "Established"))
                .as_deref()
                == Some("True")
        };
        let within = Duration::from_secs(30);
        wait::until(&crds, &name, "CRD Established", within, established).await?;
        // Established comes before the storage of a new kind: for a moment its requests
        // answer 429 "storage is (re)initializing", which the test clients do not retry.
        let served = crd.spec.versions.iter().find(|v| v.storage);
        let version = served.map(|v| v.name.clone()).unwrap_or_default();
        let resource = kube::api::ApiResource {
            group: crd.spec.group.clone(),
            version: version.clone(),
            api_version: format!("{}/{version}", crd.spec.group),
            kind: crd.spec.names.kind.clone(),
            plural: crd.spec.names.plural.clone(),
        };
        let objects: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
        wait::eventually(
            &format!("{name} served"),
            Duration::from_secs(30),
            || async {
                objects.list(&ListParams::default().limit(1)).await?;
                Ok(Some(()))
            },
        )
        .await?;
    }
    Ok(())
}
