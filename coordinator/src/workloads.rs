//! The lookups behind the workload gates: for admission ([`crate::admission::workload`]),
//! every PodDisruptionBudget and the pods of those that allow no disruption now, made only
//! while some maintenance is pending; between nodes ([`crate::round::workload_gate`]), the
//! controllers a Verifying reboot evicted pods of, read one by one. Each answer is reused for
//! a moment (rounds can follow each other closely), so an idle cluster costs nothing and a
//! rollout one list of budgets, one list per exhausted budget and a read per evicted workload
//! every few seconds.

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
use kube::{Api, Client, ResourceExt, api::ListParams, core::Selector};
use nodeward_api::maintenance::WorkloadRef;

use crate::{
    admission::workload,
    round::workload_gate::{Availability, Looked, Seen},
};

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
    last: Option<(Instant, Held)>,
    /// Evicted workloads' availability, by workload.
    available: HashMap<WorkloadRef, (Instant, Seen)>,
}

impl Lookups {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            last: None,
            available: HashMap::new(),
        }
    }

    /// How available each of `workloads` is now.
    pub async fn availability(
        &mut self,
        workloads: &BTreeSet<WorkloadRef>,
    ) -> BTreeMap<WorkloadRef, Seen> {
        self.available
            .retain(|w, (at, _)| at.elapsed() < TTL && workloads.contains(w));
        let missing: Vec<WorkloadRef> = workloads
            .iter()
            .filter(|w| !self.available.contains_key(*w))
            .cloned()
            .collect();
        let client = self.client.clone();
        let looked: Vec<(WorkloadRef, Looked)> = stream::iter(missing)
            .map(move |w| {
                let client = client.clone();
                async move {
                    let looked = available(&client, &w).await;
                    (w, looked)
                }
            })
            .buffered(CONCURRENT_LISTS)
            .collect()
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
            let deployment = rs
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true) && o.kind == "Deployment")
                .map(|o| o.name.clone());
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
