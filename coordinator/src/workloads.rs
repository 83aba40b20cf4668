//! The lookups behind the workload gates: for admission ([`nodeward_decide::admission::workload`]),
//! every PodDisruptionBudget and the pods of those that allow no disruption now, made only
//! while some maintenance is pending; between nodes ([`nodeward_decide::round::workload_gate`]), the
//! controllers a Verifying reboot evicted pods of, read one by one, and watched while waited
//! for ([`crate::workload_watch`]: a change wakes a round). Each answer is reused for a moment
//! (rounds can follow each other closely) unless its watch saw a change, so an idle cluster
//! costs nothing and a rollout one list of budgets, one list per exhausted budget and a read
//! per evicted workload and change.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet, StatefulSet},
    core::v1::{Pod, ReplicationController},
    policy::v1::PodDisruptionBudget,
};
use k8s_openapi::{
    api::autoscaling::v1::{Scale, ScaleSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, Client, ResourceExt, api::ListParams, core::Selector};
use nodeward_api::maintenance::WorkloadRef;

use crate::workload_watch::{Followed, Wake};

use nodeward_decide::{
    admission::workload,
    round::{
        surge::{self, Observed, Scan},
        workload_gate::{Availability, Looked, Seen},
    },
};

/// How long a scan of a node's pods is reused.
const SCAN_TTL: Duration = Duration::from_secs(30);
/// The most nodes scanned in one [`SCAN_WINDOW`] (the others say they wait for it, and go
/// next): rounds may follow each other closely in a busy rollout.
const SCANS_PER_WINDOW: usize = 32;
const SCAN_WINDOW: Duration = Duration::from_secs(5);

/// How long one answer is reused.
const TTL: Duration = Duration::from_secs(2);
/// The longest one list may take before the lookup counts as failed (and so as holding).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Exhausted budgets whose pods are listed at once.
const CONCURRENT_LISTS: usize = 8;

/// Why each node is held back by a budget now (absent: not held), or why that could not be
/// checked.
pub type Held = Result<BTreeMap<String, String>, String>;

pub struct Lookups {
    client: Client,
    /// Watches of the evicted workloads waited for, which mark their answers stale.
    followed: Followed,
    last: Option<(Instant, Held)>,
    /// Evicted workloads' availability, by workload.
    available: HashMap<WorkloadRef, (Instant, Seen)>,
    /// The single-replica Deployments found on each pending node, by node.
    scans: HashMap<String, (Instant, Scan)>,
    /// When the current scan window began, and the scans made in it.
    scan_window: (Instant, usize),
}

impl Lookups {
    pub fn new(client: Client, wake: Wake) -> Self {
        Self {
            followed: Followed::new(client.clone(), wake),
            client,
            last: None,
            available: HashMap::new(),
            scans: HashMap::new(),
            scan_window: (Instant::now(), 0),
        }
    }

    /// The single-replica Deployments on each of `nodes` (pending ones, oldest first): a scan
    /// is reused for [`SCAN_TTL`]; at most [`SCANS_PER_WINDOW`] are made in a window, and a
    /// node left for a later round gets an error saying so.
    pub async fn scans(&mut self, nodes: &[String]) -> BTreeMap<String, Scan> {
        let wanted: BTreeSet<&String> = nodes.iter().collect();
        self.scans
            .retain(|n, (at, _)| at.elapsed() < SCAN_TTL && wanted.contains(n));
        if self.scan_window.0.elapsed() >= SCAN_WINDOW {
            self.scan_window = (Instant::now(), 0);
        }
        let missing: Vec<String> = nodes
            .iter()
            .filter(|n| !self.scans.contains_key(*n))
            .take(SCANS_PER_WINDOW.saturating_sub(self.scan_window.1))
            .cloned()
            .collect();
        self.scan_window.1 += missing.len();
        let scanned = each(&self.client, missing, |client, node| async move {
            let found = scan(&client, &node).await;
            (node, found)
        })
        .await;
        let now = Instant::now();
        for (node, found) in scanned {
            if let Err(e) = &found {
                tracing::warn!(%node, error = %e, "cannot look at the pods of a node waiting for maintenance");
            }
            self.scans.insert(node, (now, found));
        }
        nodes
            .iter()
            .map(|n| {
                let found = self.scans.get(n).map_or_else(
                    || Err("its pods are looked at in a later round".to_owned()),
                    |(_, s)| s.clone(),
                );
                (n.clone(), found)
            })
            .collect()
    }

    /// The surged Deployments of `wanted` (namespace, name, node), read now.
    pub async fn surged(
        &self,
        wanted: &BTreeSet<(String, String, String)>,
    ) -> BTreeMap<(String, String, String), surge::Looked> {
        each(
            &self.client,
            wanted.iter().cloned(),
            |client, key| async move {
                let looked = observe(&client, &key.0, &key.1, &key.2).await;
                (key, looked)
            },
        )
        .await
        .into_iter()
        .collect()
    }

    /// How available each of `workloads` is now.
    pub async fn availability(
        &mut self,
        workloads: &BTreeSet<WorkloadRef>,
    ) -> BTreeMap<WorkloadRef, Seen> {
        let changed = self.followed.follow(workloads);
        self.available.retain(|w, (at, _)| {
            at.elapsed() < TTL && workloads.contains(w) && !changed.contains(w)
        });
        let missing: Vec<WorkloadRef> = workloads
            .iter()
            .filter(|w| !self.available.contains_key(*w))
            .cloned()
            .collect();
        let looked = each(&self.client, missing, |client, w| async move {
            let looked = available(&client, &w).await;
            (w, looked)
        })
        .await;
        let (now, at) = (Instant::now(), jiff::Timestamp::now());
        for (w, l) in looked {
            self.available.insert(w, (now, (at, l)));
        }
        workloads
            .iter()
            .filter_map(|w| Some((w.clone(), self.available.get(w)?.1.clone())))
            .collect()
    }

    /// The nodes held back by a budget now.
    pub async fn held(&mut self) -> Held {
        if let Some((at, held)) = &self.last
            && at.elapsed() < TTL
        {
            return held.clone();
        }
        let held = self.look_up().await;
        if let Err(e) = &held {
            tracing::warn!(error = %e, "the workload gate cannot check PodDisruptionBudgets; nodes it covers wait");
        }
        self.last = Some((Instant::now(), held.clone()));
        held
    }

    async fn look_up(&self) -> Held {
        let budgets: Api<PodDisruptionBudget> = Api::all(self.client.clone());
        let listed = tokio::time::timeout(LOOKUP_TIMEOUT, budgets.list(&ListParams::default()))
            .await
            .map_err(|_| {
                format!("listing PodDisruptionBudgets timed out after {LOOKUP_TIMEOUT:?}")
            })?
            .map_err(|e| format!("listing PodDisruptionBudgets: {e}"))?;
        let exhausted = listed
            .items
            .into_iter()
            .filter(|b| workload::allows_none(b).is_some());
        let with_pods: Vec<Result<(PodDisruptionBudget, Vec<Pod>), String>> =
            stream::iter(exhausted)
                .map(|budget| async move {
                    let pods = self.pods_of(&budget).await?;
                    Ok((budget, pods))
                })
                .buffered(CONCURRENT_LISTS)
                .collect()
                .await;
        let with_pods = with_pods.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(workload::held_nodes(&with_pods))
    }

    /// The pods `budget` selects in its namespace (none for a budget without a selector, as
    /// the disruption controller sees it).
    async fn pods_of(&self, budget: &PodDisruptionBudget) -> Result<Vec<Pod>, String> {
        let namespace = budget.namespace().unwrap_or_default();
        let name = format!("PodDisruptionBudget {namespace}/{}", budget.name_any());
        let Some(selector) = budget.spec.as_ref().and_then(|s| s.selector.clone()) else {
            return Ok(Vec::new());
        };
        let selector =
            Selector::try_from(selector).map_err(|e| format!("the selector of {name}: {e}"))?;
        let params = ListParams::default().labels_from(&selector);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        match tokio::time::timeout(LOOKUP_TIMEOUT, pods.list(&params)).await {
            Err(_) => Err(format!(
                "listing the pods of {name} timed out after {LOOKUP_TIMEOUT:?}"
            )),
            Ok(Err(e)) => Err(format!("listing the pods of {name}: {e}")),
            Ok(Ok(list)) => Ok(list.items),
        }
    }
}

/// How available `workload` is: a ReplicaSet through its Deployment, when it has one (a
/// Deployment's replicas may have moved to a newer ReplicaSet).
async fn available(client: &Client, workload: &WorkloadRef) -> Looked {
    let ns = &workload.namespace;
    let found = |kind: &str, name: &str, available: Option<i32>, desired: Option<i32>| {
        Ok(Availability {
            shown: format!("{kind} {ns}/{name}"),
            available: available.unwrap_or(0),
            desired: desired.unwrap_or(1),
        })
    };
    let name = &workload.name;
    match workload.kind.as_str() {
        "ReplicaSet" => {
            let rs = match get::<ReplicaSet>(client, ns, name).await {
                Err(e) => return Some(Err(e)),
                Ok(rs) => rs?,
            };
            let deployment = crate::workload_watch::deployment_of(&rs);
            match deployment {
                Some(d) => get::<Deployment>(client, ns, &d)
                    .await
                    .transpose()
                    .map(|r| {
                        r.map(|d| {
                            found(
                                "Deployment",
                                &d.name_any(),
                                d.status.and_then(|s| s.available_replicas),
                                d.spec.and_then(|s| s.replicas),
                            )
                        })?
                    }),
                None => Some(found(
                    "ReplicaSet",
                    name,
                    rs.status.as_ref().and_then(|s| s.available_replicas),
                    rs.spec.and_then(|s| s.replicas),
                )),
            }
        }
        "StatefulSet" => get::<StatefulSet>(client, ns, name)
            .await
            .transpose()
            .map(|r| {
                r.map(|s| {
                    found(
                        "StatefulSet",
                        name,
                        s.status.and_then(|s| s.available_replicas),
                        s.spec.and_then(|s| s.replicas),
                    )
                })?
            }),
        "ReplicationController" => get::<ReplicationController>(client, ns, name)
            .await
            .transpose()
            .map(|r| {
                r.map(|rc| {
                    found(
                        "ReplicationController",
                        name,
                        rc.status.and_then(|s| s.available_replicas),
                        rc.spec.and_then(|s| s.replicas),
                    )
                })?
            }),
        // Recorded by an agent of another version: nothing this coordinator can wait for.
        _ => None,
    }
}

/// The `K` named `name` in `namespace` (None: it does not exist), within [`LOOKUP_TIMEOUT`].
async fn get<K>(client: &Client, namespace: &str, name: &str) -> Result<Option<K>, String>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let what = format!("{} {namespace}/{name}", K::kind(&()));
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(name)).await {
        Err(_) => Err(format!("reading {what} timed out after {LOOKUP_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("reading {what}: {e}")),
        Ok(Ok(found)) => Ok(found),
    }
}

/// `look` at each of `items` with a client of its own, [`CONCURRENT_LISTS`] at a time, in order.
async fn each<T, R, F, Fut>(client: &Client, items: impl IntoIterator<Item = T>, look: F) -> Vec<R>
where
    F: Fn(Client, T) -> Fut,
    Fut: Future<Output = R>,
{
    stream::iter(items)
        .map(|item| look(client.clone(), item))
        .buffered(CONCURRENT_LISTS)
        .collect()
        .await
}

/// The single-replica Deployments with pods on `node`.
async fn scan(client: &Client, node: &str) -> Scan {
    let pods: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = match tokio::time::timeout(LOOKUP_TIMEOUT, pods.list(&params)).await {
        Err(_) => {
            return Err(format!(
                "listing its pods timed out after {LOOKUP_TIMEOUT:?}"
            ));
        }
        Ok(Err(e)) => return Err(format!("listing its pods: {e}")),
        Ok(Ok(list)) => list.items,
    };
    let names: BTreeSet<(String, String)> = pods
        .iter()
        .filter_map(|p| Some((p.namespace()?, surge::deployment_of(p)?)))
        .collect();
    let mut deployments = Vec::new();
    for (namespace, name) in names {
        if let Some(d) = get::<Deployment>(client, &namespace, &name).await? {
            deployments.push(d);
        }
    }
    Ok(surge::single_replicas(&pods, &deployments))
}

/// A surged Deployment as it is now, with its pods on `node` that are not terminating.
async fn observe(client: &Client, namespace: &str, name: &str, node: &str) -> surge::Looked {
    let Some(d) = get::<Deployment>(client, namespace, name).await? else {
        return Ok(None);
    };
    let selector = d
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .ok_or_else(|| format!("Deployment {namespace}/{name} has no spec"))?;
    let selector = Selector::try_from(selector)
        .map_err(|e| format!("the selector of Deployment {namespace}/{name}: {e}"))?;
    let params = ListParams::default()
        .labels_from(&selector)
        .fields(&format!("spec.nodeName={node}"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let on_node = match tokio::time::timeout(LOOKUP_TIMEOUT, pods.list(&params)).await {
        Err(_) => {
            return Err(format!(
                "listing the pods of Deployment {namespace}/{name} timed out after {LOOKUP_TIMEOUT:?}"
            ));
        }
        Ok(Err(e)) => {
            return Err(format!(
                "listing the pods of Deployment {namespace}/{name}: {e}"
            ));
        }
        Ok(Ok(list)) => list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect(),
    };
    let status = d.status.clone().unwrap_or_default();
    Ok(Some(Observed {
        replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        available: status.available_replicas.unwrap_or(0),
        current: status.observed_generation >= d.metadata.generation,
        annotated: d
            .annotations()
            .get(nodeward_api::labels::SURGE_ANNOTATION)
            .is_some_and(|v| v == "true"),
        on_node,
    }))
}

/// What a change of a Deployment's replica count found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scaled {
    /// Set to the count asked for.
    Set,
    /// It was at that count already.
    Already,
    /// Someone else set it to this count (neither the one expected nor the one asked for):
    /// left alone.
    Changed(i32),
    Gone,
}

/// Sets Deployment `namespace/name` to `to` replicas through its scale subresource, only if
/// it is at `from` now (a compare-and-swap on its resourceVersion).
pub async fn scale(
    client: &Client,
    namespace: &str,
    name: &str,
    from: i32,
    to: i32,
) -> Result<Scaled, String> {
    let what = format!("Deployment {namespace}/{name}");
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let current = match tokio::time::timeout(LOOKUP_TIMEOUT, api.get_scale(name)).await {
        Err(_) => return Err(format!("reading the scale of {what} timed out")),
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => return Ok(Scaled::Gone),
        Ok(Err(e)) => return Err(format!("reading the scale of {what}: {e}")),
        Ok(Ok(s)) => s,
    };
    let replicas = current.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    if replicas == to {
        return Ok(Scaled::Already);
    }
    if replicas != from {
        return Ok(Scaled::Changed(replicas));
    }
    // A compare-and-swap: the resourceVersion read, and the replicas to set.
    let patch = Scale {
        metadata: ObjectMeta {
            resource_version: current.metadata.resource_version,
            ..ObjectMeta::default()
        },
        spec: Some(ScaleSpec { replicas: Some(to) }),
        status: None,
    };
    let params = kube::api::PatchParams::default();
    match tokio::time::timeout(
        LOOKUP_TIMEOUT,
        api.patch_scale(name, &params, &kube::api::Patch::Merge(&patch)),
    )
    .await
    {
        Err(_) => Err(format!("scaling {what} to {to} timed out")),
        Ok(Err(e)) => Err(format!("scaling {what} from {from} to {to}: {e}")),
        Ok(Ok(_)) => Ok(Scaled::Set),
    }
}
