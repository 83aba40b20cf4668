//! Where the peers are: a directory of agent addresses that follows the Node objects, and
//! the label by which an agent makes its own node one of them.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, runtime::watcher};

use crate::backoff::Backoff;
use nodeward_api::labels::{AGENT_FIELD_MANAGER, AGENT_LABEL};

/// The addresses of the other nodes, kept current by a watch on the Node objects.
#[derive(Clone, Debug, Default)]
pub struct Directory(Arc<RwLock<BTreeMap<String, IpAddr>>>);

impl Directory {
    /// Every known peer except `own`.
    pub fn peers(&self, own: &str) -> Vec<(String, IpAddr)> {
        let map = self
            .0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.iter()
            .filter(|(name, _)| name.as_str() != own)
            .map(|(n, a)| (n.clone(), *a))
            .collect()
    }

    /// Whether `node` is a known peer.
    pub fn contains(&self, node: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .contains_key(node)
    }

    fn set(&self, name: String, address: Option<IpAddr>) {
        let mut map = self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match address {
            Some(a) => map.insert(name, a),
            None => map.remove(&name),
        };
    }

    /// Follows the Node objects that run an agent (labelled [`AGENT_LABEL`]) until dropped; a
    /// re-list (after a lost watch) replaces the whole map, so nodes deleted meanwhile
    /// disappear too.
    pub async fn follow(self, client: kube::Client) {
        let nodes: Api<Node> = Api::all(client);
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let selector = watcher::Config::default().labels(AGENT_LABEL);
        let mut stream = std::pin::pin!(watcher(nodes, selector));
        let mut relisted = BTreeMap::new();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(node)) => self.set(
                    node.metadata.name.clone().unwrap_or_default(),
                    internal_ip(&node),
                ),
                Ok(watcher::Event::Delete(node)) => {
                    self.set(node.metadata.name.clone().unwrap_or_default(), None)
                }
                Ok(watcher::Event::Init) => relisted.clear(),
                Ok(watcher::Event::InitApply(node)) => {
                    if let (Some(name), Some(ip)) = (node.metadata.name.clone(), internal_ip(&node))
                    {
                        relisted.insert(name, ip);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    backoff.reset();
                    let mut map = self
                        .0
                        .write()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    *map = std::mem::take(&mut relisted);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watching nodes for peer addresses failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }
}

/// Labels this agent's own Node as running an agent, so that its peers probe it; retries
/// with backoff until the Node exists and the write succeeds.
pub async fn mark_own_node(client: kube::Client, node_name: String) {
    let nodes: Api<Node> = Api::all(client);
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name, "labels": {AGENT_LABEL: "true"}},
    });
    let params = kube::api::PatchParams::apply(AGENT_FIELD_MANAGER);
    loop {
        match nodes
            .patch(&node_name, &params, &kube::api::Patch::Apply(&patch))
            .await
        {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, node = %node_name, "labelling the node as running an agent; will retry")
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// A node's InternalIP (IPv4 preferred), where its agent answers probes.
pub fn internal_ip(node: &Node) -> Option<IpAddr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    let mut ips: Vec<IpAddr> = addresses
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    ips.sort_by_key(|ip| !ip.is_ipv4());
    ips.first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_ipv4_is_preferred() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"addresses": [
                {"type": "Hostname", "address": "n"},
                {"type": "InternalIP", "address": "fd00::5"},
                {"type": "InternalIP", "address": "10.0.0.5"},
            ]}
        }))
        .expect("node");
        assert_eq!(internal_ip(&node), Some("10.0.0.5".parse().expect("ip")));
    }
}
