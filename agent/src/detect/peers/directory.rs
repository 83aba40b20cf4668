//! Where the peers are: the agents' addresses as the coordinator publishes them, EndpointSlices
//! labelled `kubernetes.io/service-name: nodeward-agents` in nodeward's namespace (see
//! `nodeward_api::fleet`). They change only when agents come and go, so following them costs
//! an agent nothing while the cluster's nodes report their status or reboot.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, runtime::watcher};
use nodeward_api::fleet::PEERS_SERVICE;

use crate::backoff::Backoff;

/// A slice's endpoints: each node with its agent's address.
type Endpoints = Vec<(String, IpAddr)>;

/// The addresses of the nodes with an agent, by the slice that lists them.
#[derive(Clone, Debug, Default)]
pub struct Directory(Arc<RwLock<BTreeMap<String, Endpoints>>>);

impl Directory {
    /// Every known peer except `own`, each once.
    pub fn peers(&self, own: &str) -> Vec<(String, IpAddr)> {
        let slices = self.0.read().unwrap_or_else(|p| p.into_inner());
        let mut peers: BTreeMap<&String, IpAddr> = BTreeMap::new();
        for (node, address) in slices.values().flatten() {
            if node != own {
                peers.entry(node).or_insert(*address);
            }
        }
        peers.into_iter().map(|(n, a)| (n.clone(), a)).collect()
    }

    /// The node whose agent is at `address`.
    pub fn node_at(&self, address: IpAddr) -> Option<String> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .flatten()
            .find(|(_, a)| a.to_canonical() == address)
            .map(|(n, _)| n.clone())
    }

    /// Whether `node` is a known peer.
    pub fn contains(&self, node: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .flatten()
            .any(|(n, _)| n == node)
    }

    fn set(&self, slice: &EndpointSlice) {
        let Some(name) = slice.metadata.name.clone() else {
            return;
        };
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, endpoints(slice));
    }

    fn remove(&self, slice: &EndpointSlice) {
        if let Some(name) = &slice.metadata.name {
            self.0
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name);
        }
    }

    /// Follows the peer directory's slices in `namespace` until dropped; a re-list (after a
    /// lost watch) replaces the whole directory, so slices deleted meanwhile disappear too.
    pub async fn follow(self, client: kube::Client, namespace: String) {
        let slices: Api<EndpointSlice> = Api::namespaced(client, &namespace);
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let selector = watcher::Config::default()
            .labels(&format!("kubernetes.io/service-name={PEERS_SERVICE}"));
        let mut stream = std::pin::pin!(watcher(slices, selector));
        let mut relisted = BTreeMap::new();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(slice)) => self.set(&slice),
                Ok(watcher::Event::Delete(slice)) => self.remove(&slice),
                Ok(watcher::Event::Init) => relisted.clear(),
                Ok(watcher::Event::InitApply(slice)) => {
                    if let Some(name) = slice.metadata.name.clone() {
                        relisted.insert(name, endpoints(&slice));
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    backoff.reset();
                    *self.0.write().unwrap_or_else(|p| p.into_inner()) =
                        std::mem::take(&mut relisted);
                }
                Err(e) => {
                    tracing::warn!(error = %e, %namespace, "watching the peer directory failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }
}

/// A slice's endpoints: node and first address (those without either are skipped).
fn endpoints(slice: &EndpointSlice) -> Endpoints {
    slice
        .endpoints
        .iter()
        .filter_map(|e| Some((e.node_name.clone()?, e.addresses.first()?.parse().ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, endpoints: &[(&str, &str)]) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "addressType": "IPv4",
            "endpoints": endpoints.iter().map(|(node, address)| serde_json::json!({
                "addresses": [address], "nodeName": node,
            })).collect::<Vec<_>>(),
        }))
        .expect("slice")
    }

    #[test]
    fn peers_are_every_slices_nodes_but_this_one_each_once() {
        let directory = Directory::default();
        directory.set(&slice("s0", &[("a", "10.0.0.1"), ("me", "10.0.0.9")]));
        directory.set(&slice("s1", &[("b", "10.0.0.2"), ("a", "10.0.0.1")]));
        let peers: Vec<String> = directory.peers("me").into_iter().map(|p| p.0).collect();
        assert_eq!(peers, ["a", "b"]);
        assert!(directory.contains("b"));
        directory.remove(&slice("s1", &[]));
        assert!(!directory.contains("b"));
        directory.set(&slice("s0", &[("c", "not an address")]));
        assert!(
            directory.peers("me").is_empty(),
            "an endpoint without an address is skipped"
        );
    }
}
