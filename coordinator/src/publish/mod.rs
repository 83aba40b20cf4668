//! What the leader publishes for the agents, so that no agent watches what changes with the
//! size of the cluster (see `nodeward_api::fleet`): the peer directory ([`peers`]) and the
//! policies as agents need them ([`policies`]). Both are compared with what is published and
//! only a difference is written, so a steady cluster sees no writes at all.

pub mod peers;
pub mod policies;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::{core::v1::ConfigMap, discovery::v1::EndpointSlice};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use nodeward_api::{
    fleet::{LEASE_PREFIX, PEER_DETECTOR, PEERS_PER_SLICE},
    labels::COORDINATOR_FIELD_MANAGER,
    node,
};
use nodeward_runtime::{ApiError, server::Readiness};
use tokio::sync::watch::Receiver;

use crate::controller::{SYNCED, Stores};
use nodeward_runtime::write::{self, Outcome};

/// An agent silent for this long is no longer a peer: it is gone (uninstalled, its node left
/// for good), and probing it would only fail. A node that dies is judged dead well before
/// (`deadlines.agentHeartbeat`), while its peers still list it unreachable.
pub const PEER_EXPIRY: Duration = Duration::from_secs(30 * 60);

/// Publishes while this coordinator leads, looking every `every`.
pub struct Publisher {
    pub client: Client,
    /// The coordinator's namespace, where the agents read.
    pub namespace: String,
    pub stores: Stores,
    /// Nothing is published before the watches have synced ([`SYNCED`]): a partial view
    /// would drop agents from the directory.
    pub readiness: Arc<Readiness>,
}

impl Publisher {
    pub async fn run(self, mut leader: Receiver<bool>, every: Duration, mut stop: Receiver<bool>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = leader.changed() => {}
                _ = stop.changed() => return,
            }
            // The controller is the stores' one waiter (kube-runtime wakes only one): it
            // passes the gate once they synced.
            if !*leader.borrow() || !self.readiness.passed(SYNCED) {
                continue;
            }
            if let Err(e) = self.publish_peers().await {
                tracing::warn!(error = %e, "publishing the peer directory");
            }
            if let Err(e) = self.publish_policies().await {
                tracing::warn!(error = %e, "publishing the policies for the agents");
            }
        }
    }

    /// The nodes whose agent runs the peer detector, at their InternalIP, against the slices.
    async fn publish_peers(&self) -> Result<(), ApiError> {
        // The nodes whose agent probes its peers (and so answers their probes), unless it has
        // been silent for longer than PEER_EXPIRY (it is gone, not just slow).
        let now = jiff::Timestamp::now();
        let renewed: HashMap<String, jiff::Timestamp> = self
            .stores
            .leases
            .state()
            .iter()
            .filter_map(|l| {
                let node = l.name_any().strip_prefix(LEASE_PREFIX)?.to_owned();
                Some((node, l.spec.as_ref()?.renew_time.as_ref()?.0))
            })
            .collect();
        let with_agent: HashSet<String> = self
            .stores
            .reports
            .state()
            .iter()
            .filter(|r| {
                let Some(status) = r.status.as_ref() else {
                    return false;
                };
                let reported = status.heartbeat_time.as_ref().map(|t| t.0);
                let alive = reported
                    .max(renewed.get(&r.name_any()).copied())
                    .is_some_and(|at| {
                        now.duration_since(at).as_secs() < PEER_EXPIRY.as_secs() as i64
                    });
                alive && status.findings.iter().any(|f| f.detector == PEER_DETECTOR)
            })
            .map(|r| r.name_any())
            .collect();
        let mut desired: BTreeMap<String, IpAddr> = BTreeMap::new();
        for node in self.stores.nodes.state() {
            let name = node.name_any();
            let has_agent = with_agent.contains(&name);
            match node::internal_ip(&node).filter(|_| has_agent) {
                Some(address) if peers::publishable(&address) => {
                    desired.insert(name, address);
                }
                Some(address) => {
                    tracing::debug!(node = %name, %address, "a node's InternalIP cannot stand in an EndpointSlice (loopback, link-local): left out of the peer directory");
                }
                None => {}
            }
        }
        let existing: Vec<peers::Slice> = self
            .stores
            .peers
            .state()
            .iter()
            .filter_map(|s| peers::read(s))
            .collect();
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.namespace);
        for change in peers::plan(&existing, &desired, PEERS_PER_SLICE) {
            match change {
                peers::Change::Create(slice) | peers::Change::Update(slice) => {
                    let object = peers::object(&slice, &self.namespace);
                    api.patch(&slice.name, &apply(), &Patch::Apply(&object))
                        .await
                        .map_err(|e| {
                            ApiError::new("writing", format!("EndpointSlice {}", slice.name), e)
                        })?;
                    tracing::info!(slice = %slice.name, endpoints = slice.endpoints.len(), "peer directory written");
                }
                peers::Change::Delete(name) => {
                    match write::delete(&api, &name, &DeleteParams::default()).await {
                        Outcome::Written(()) | Outcome::Gone(_) => {}
                        Outcome::Conflict(e) | Outcome::Failed(e) => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    /// The policies' names, generations and specs, when they differ from what is published.
    async fn publish_policies(&self) -> Result<(), ApiError> {
        let published = self.stores.published.state();
        let current = published.first().map(|c| c.as_ref());
        let Some(object) =
            policies::wanted(&self.stores.policies.state(), current, &self.namespace)
        else {
            return Ok(());
        };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let name = object.name_any();
        api.patch(&name, &apply(), &Patch::Apply(&object))
            .await
            .map_err(|e| ApiError::new("writing", format!("ConfigMap {name}"), e))?;
        tracing::info!(configmap = %name, "policies published for the agents");
        Ok(())
    }
}

fn apply() -> PatchParams {
    PatchParams::apply(COORDINATOR_FIELD_MANAGER).force()
}
