//! A replicated workload spread one replica per node, and a watch of how many of its replicas
//! are Ready: what the workload-gate tests and benchmarks roll nodes under. Its pods can be
//! slow to start (`e2e.nodeward.io/ready-after`: the simulated nodes make them Ready that long
//! after they run), as applications are.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
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

/// How many pods of a workload were Ready (and not terminating) at each change seen.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    /// Ready pods now, by name.
    pub ready: std::collections::BTreeSet<String>,
    /// The fewest Ready pods seen since the watch was armed (`None` before).
    pub fewest: Option<usize>,
    /// Each change of the count: when, and how many.
    pub timeline: Vec<(jiff::Timestamp, usize)>,
}

/// Watches the Ready pods of `name` (a [`spread_deployment`]); the task ends when the returned
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
                let mut seen = recorded.lock().unwrap_or_else(|p| p.into_inner());
                let before = seen.ready.len();
                if ready {
                    seen.ready.insert(pod.name_any());
                } else {
                    seen.ready.remove(&pod.name_any());
                }
                let now = seen.ready.len();
                if now != before {
                    seen.timeline.push((jiff::Timestamp::now(), now));
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
