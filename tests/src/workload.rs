//! A replicated workload spread one replica per node, and a watch of how many of its replicas
//! are Ready: what the workload-gate tests and benchmarks roll nodes under. Its pods can be
//! slow to start (`e2e.nodeward.io/ready-after`: the simulated nodes make them Ready that long
//! after they run), as applications are.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::Pod,
};
use kube::{
    Api, ResourceExt,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

use crate::{TestEnv, env::TEST_LABEL};

/// The pod annotation the simulated nodes read as the time a pod takes to become Ready.
pub const READY_AFTER: &str = "e2e.nodeward.io/ready-after";

/// A Deployment `name` of `replicas` pods, at most one per node of `env` (required
/// anti-affinity), each Ready `ready_after` (e.g. "3s") after it runs.
pub async fn spread_deployment(
    env: &TestEnv,
    name: &str,
    replicas: i32,
    ready_after: &str,
) -> anyhow::Result<Deployment> {
    let app = format!("{name}-{}", env.id);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {
                    "labels": {"app": app, TEST_LABEL: env.id},
                    "annotations": {READY_AFTER: ready_after},
                },
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {TEST_LABEL: env.id},
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": app}}}
                    ]}},
                    "containers": [{"name": "main", "image": "registry.invalid/nodeward-e2e:fake"}],
                    // Only the simulated nodes' own NoExecute taints: a cordoned node takes none.
                    "tolerations": [
                        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
                    ],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &deployment)
        .await
        .with_context(|| format!("creating Deployment {name}"))
}

/// `nodes` ReplicaSets `name-<index>` of `pods` pods each, pinned to node `index` of `env`
/// (its hostname label), each pod Ready `ready_after` after it runs and given `grace` (e.g.
/// "2s") to stop: a node's own replicated service, which comes back only when its node does.
/// One `app` label over all of them, so that one [`ReadyWatch`] sees them all.
pub async fn pinned_replica_sets(
    env: &TestEnv,
    name: &str,
    nodes: usize,
    pods: i32,
    ready_after: &str,
    grace: std::time::Duration,
) -> anyhow::Result<()> {
    let app = format!("{name}-{}", env.id);
    let api: Api<ReplicaSet> = Api::namespaced(env.client.clone(), &env.namespace);
    for index in 0..nodes {
        let set = format!("{name}-{index}");
        let replica_set: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": set, "labels": {TEST_LABEL: env.id}},
            "spec": {
                "replicas": pods,
                "selector": {"matchLabels": {"app": app, "set": set}},
                "template": {
                    "metadata": {
                        "labels": {"app": app, "set": set, TEST_LABEL: env.id},
                        "annotations": {READY_AFTER: ready_after},
                    },
                    "spec": {
                        "terminationGracePeriodSeconds": grace.as_secs(),
                        "nodeSelector": {"kubernetes.io/hostname": env.node_name(index)},
                        "containers": [{"name": "main", "image": "registry.invalid/nodeward-e2e:fake"}],
                        "tolerations": [
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
                        ],
                    },
                },
            },
        }))?;
        api.create(&PostParams::default(), &replica_set)
            .await
            .with_context(|| format!("creating ReplicaSet {set}"))?;
    }
    Ok(())
}

/// How many pods of a workload were Ready (and not terminating) at each change seen.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    /// Ready pods now, by name, with the node each runs on.
    pub ready: std::collections::BTreeMap<String, String>,
    /// The fewest Ready pods seen since the watch was armed (`None` before).
    pub fewest: Option<usize>,
    /// Each change of the count: when, and how many.
    pub timeline: Vec<(jiff::Timestamp, usize)>,
    /// Each change of a node's count: when, which node, and how many Ready there.
    pub on_node: Vec<(jiff::Timestamp, String, usize)>,
}

impl Readiness {
    /// When `node` first had `count` Ready pods again at or after `since`.
    pub fn back_on(
        &self,
        node: &str,
        count: usize,
        since: jiff::Timestamp,
    ) -> Option<jiff::Timestamp> {
        self.on_node
            .iter()
            .find(|(at, on, n)| *at >= since && on == node && *n >= count)
            .map(|(at, _, _)| *at)
    }

    /// Ready pods on `node` now.
    pub fn ready_on(&self, node: &str) -> usize {
        self.ready.values().filter(|on| *on == node).count()
    }
}

/// Watches the Ready pods of `name` (a [`spread_deployment`] or [`pinned_replica_sets`]); the task ends when the returned
/// handle is dropped.
pub struct ReadyWatch {
    pub seen: Arc<Mutex<Readiness>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    pub fn start(env: &TestEnv, name: &str) -> Self {
        let seen: Arc<Mutex<Readiness>> = Arc::default();
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
        let config = watcher::Config::default().labels(&format!("app={name}-{}", env.id));
        let recorded = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(pods, config).applied_objects().boxed();
            while let Some(event) = events.next().await {
                let Ok(pod) = event else { continue };
                let ready = pod.metadata.deletion_timestamp.is_none()
                    && pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| {
                            c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        });
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                let mut seen = recorded.lock().unwrap_or_else(|p| p.into_inner());
                let before = seen.ready.len();
                if ready {
                    seen.ready.insert(pod.name_any(), node.clone());
                } else {
                    seen.ready.remove(&pod.name_any());
                }
                let now = seen.ready.len();
                if now != before {
                    let at = jiff::Timestamp::now();
                    let there = seen.ready_on(&node);
                    seen.on_node.push((at, node, there));
                    seen.timeline.push((at, now));
                    if let Some(fewest) = seen.fewest.as_mut() {
                        *fewest = (*fewest).min(now);
                    }
                }
            }
        });
        Self { seen, task }
    }

    /// Starts counting the fewest Ready pods from now on.
    pub fn arm(&self) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.fewest = Some(seen.ready.len());
    }

    /// What was seen so far.
    pub fn readiness(&self) -> Readiness {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
