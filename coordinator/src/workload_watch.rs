//! Watches of the workloads a Verifying reboot waits for (`workloadGate.waitForEvicted`): a
//! change of one marks its cached availability stale and wakes a round at once, so that the
//! next node goes as soon as the workloads are back, not at the next resync. One watch per
//! workload (a field selector on its name: the API server sends only that object), and only
//! while some maintenance waits for it.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fmt::Debug,
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet, StatefulSet},
    core::v1::ReplicationController,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use nodeward_api::maintenance::WorkloadRef;
use serde::de::DeserializeOwned;
use tokio::task::AbortHandle;

/// What wakes a round.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

pub struct Followed {
    client: Client,
    wake: Wake,
    tasks: HashMap<WorkloadRef, AbortHandle>,
    /// The workloads whose object changed since the last [`Followed::follow`].
    stale: Arc<Mutex<HashSet<WorkloadRef>>>,
}

impl Followed {
    pub fn new(client: Client, wake: Wake) -> Self {
        Self {
            client,
            wake,
            tasks: HashMap::new(),
            stale: Arc::default(),
        }
    }

    /// Watches exactly `workloads` from now on (stops the others' watches); returns those that
    /// changed since the last call, whose cached answers are out of date.
    pub fn follow(&mut self, workloads: &BTreeSet<WorkloadRef>) -> HashSet<WorkloadRef> {
        self.tasks.retain(|w, task| {
            let wanted = workloads.contains(w);
            if !wanted {
                task.abort();
            }
            wanted
        });
        for w in workloads {
            if self.tasks.contains_key(w) {
                continue;
            }
            let task = tokio::spawn(watch(
                self.client.clone(),
                w.clone(),
                self.stale.clone(),
                self.wake.clone(),
            ));
            self.tasks.insert(w.clone(), task.abort_handle());
        }
        match self.stale.lock() {
            Ok(mut stale) => std::mem::take(&mut *stale),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        for task in self.tasks.values() {
            task.abort();
        }
    }
}

/// Watches the object whose status says how available `workload` is (a ReplicaSet's
/// Deployment, when it has one) until aborted.
async fn watch(
    client: Client,
    workload: WorkloadRef,
    stale: Arc<Mutex<HashSet<WorkloadRef>>>,
    wake: Wake,
) {
    let namespace = workload.namespace.clone();
    let changed = {
        let workload = workload.clone();
        move || {
            if let Ok(mut stale) = stale.lock() {
                stale.insert(workload.clone());
            }
            wake();
        }
    };
    match workload.kind.as_str() {
        "ReplicaSet" => {
            let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &namespace);
            let owner = replica_sets
                .get_opt(&workload.name)
                .await
                .ok()
                .flatten()
                .and_then(|rs| deployment_of(&rs));
            match owner {
                Some(deployment) => {
                    named::<Deployment>(Api::namespaced(client, &namespace), &deployment, changed)
                        .await;
                }
                None => named(replica_sets, &workload.name, changed).await,
            }
        }
        "StatefulSet" => {
            named::<StatefulSet>(Api::namespaced(client, &namespace), &workload.name, changed)
                .await;
        }
        "ReplicationController" => {
            named::<ReplicationController>(
                Api::namespaced(client, &namespace),
                &workload.name,
                changed,
            )
            .await;
        }
        _ => {}
    }
}

/// Calls `changed` at every change of the object `name` (after the first list).
async fn named<K>(api: Api<K>, name: &str, changed: impl Fn())
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => changed(),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, object = %name, "watching a workload the next node waits for failed; retrying with backoff (rounds still look at every resync)");
            }
        }
    }
}

/// The Deployment that controls `rs`, if any.
pub fn deployment_of(rs: &ReplicaSet) -> Option<String> {
    rs.owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Deployment")
        .map(|o| o.name.clone())
}
