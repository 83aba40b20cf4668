//! The lookups behind admission's workload gate ([`crate::admission::workload`]): every
//! PodDisruptionBudget, and the pods of those that allow no disruption now. Made only while
//! some maintenance is pending under a policy that checks budgets, and reused for a moment
//! (rounds can follow each other closely), so an idle cluster costs nothing and a rollout one
//! list of budgets plus one list per exhausted budget every few seconds.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube::{Api, Client, ResourceExt, api::ListParams, core::Selector};

use crate::admission::workload;

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
}

impl Lookups {
    pub fn new(client: Client) -> Self {
        Self { client, last: None }
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
