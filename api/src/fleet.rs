//! What keeps an agent's API cost independent of the cluster's size: objects in nodeward's
//! namespace that change only when agents come and go or policies are edited, not with every
//! node status, admission or heartbeat.
//!
//! - Each agent's liveness is a Lease named [`lease_name`] (a small object, renewed at a low
//!   rate), not its NodeReport, which is written only when something in it changes.
//! - The coordinator publishes where the agents are, for their peer probes, as EndpointSlices
//!   labelled `kubernetes.io/service-name: `[`PEERS_SERVICE`]: one endpoint per node whose agent
//!   runs the peer detector (its NodeReport has a [`PEER_DETECTOR`] finding), at the Node's
//!   InternalIP.
//! - The coordinator publishes the DisruptionPolicies as agents need them (name, generation,
//!   spec) in the ConfigMap [`POLICIES_CONFIGMAP`], rewritten only when a spec changes, so that
//!   agents never see the policies' status, which changes with every admission.

use serde::{Deserialize, Serialize};

use crate::{DisruptionPolicy, DisruptionPolicySpec};

/// An agent's Lease is this prefix and its node's name.
pub const LEASE_PREFIX: &str = "nodeward-agent-";
/// Label on every agent Lease (the coordinator watches those).
pub const LEASE_LABEL: &str = "nodeward.io/agent-lease";

/// The name of `node`'s agent Lease; None when the name would be longer than an object name
/// may be (253), which only a node name of more than 238 characters makes.
pub fn lease_name(node: &str) -> Option<String> {
    let name = format!("{LEASE_PREFIX}{node}");
    (name.len() <= 253).then_some(name)
}

/// The agent's peer detector, as its findings name it. An agent whose NodeReport carries a
/// finding of it probes its peers and answers their probes: only those are peers.
pub const PEER_DETECTOR: &str = "peers";

/// The `kubernetes.io/service-name` of the peer directory's EndpointSlices (a selector-less
/// Service of that name may exist for discovery; nothing needs it).
pub const PEERS_SERVICE: &str = "nodeward-agents";
/// `endpointslice.kubernetes.io/managed-by` of those slices.
pub const PEERS_MANAGED_BY: &str = "coordinator.nodeward.io";
/// Endpoints per slice, as Kubernetes' own EndpointSlice controller keeps them: a node joining
/// or leaving rewrites one slice of at most this many.
pub const PEERS_PER_SLICE: usize = 100;

/// The ConfigMap in which the coordinator publishes the policies for the agents.
pub const POLICIES_CONFIGMAP: &str = "nodeward-agent-policies";
/// Its key holding [`PublishedPolicies`] as JSON.
pub const POLICIES_KEY: &str = "policies.json";

/// The policies as the coordinator publishes them for agents.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PublishedPolicies {
    /// Every DisruptionPolicy, by name.
    pub policies: Vec<PublishedPolicy>,
}

/// One policy: what agents act on (pause, autoReboot, the drain plan and timeout, the health
/// gate) is all in its spec; `generation` is what a pause acknowledgement names.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PublishedPolicy {
    pub name: String,
    pub generation: i64,
    pub spec: DisruptionPolicySpec,
}

impl PublishedPolicies {
    /// What to publish for `policies`: sorted by name, so that the same policies always give
    /// the same text and an unchanged set writes nothing.
    pub fn of<'a>(policies: impl IntoIterator<Item = &'a DisruptionPolicy>) -> Self {
        let mut policies: Vec<PublishedPolicy> = policies
            .into_iter()
            .filter_map(|p| {
                Some(PublishedPolicy {
                    name: p.metadata.name.clone()?,
                    generation: p.metadata.generation.unwrap_or(0),
                    spec: p.spec.clone(),
                })
            })
            .collect();
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        Self { policies }
    }

    /// The published policies as DisruptionPolicy objects (name, generation and spec; no
    /// status), as agents read them.
    pub fn to_policies(&self) -> Vec<DisruptionPolicy> {
        self.policies
            .iter()
            .map(|p| {
                let mut policy = DisruptionPolicy::new(&p.name, p.spec.clone());
                policy.metadata.generation = Some(p.generation);
                policy
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_fit_an_object_name() {
        assert_eq!(lease_name("n1").as_deref(), Some("nodeward-agent-n1"));
        assert!(lease_name(&"a".repeat(238)).is_some());
        assert_eq!(lease_name(&"a".repeat(239)), None);
    }

    #[test]
    fn published_policies_are_sorted_and_read_back_with_their_generation() {
        let policy = |name: &str, generation: i64| {
            let mut p: DisruptionPolicy = serde_json::from_value(serde_json::json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                "metadata": {"name": name, "generation": generation},
                "spec": {"paused": true, "autoReboot": true},
                "status": {"slots": [{"maintenance": "m", "uid": "u", "nodeName": "n", "admittedAt": "2026-11-25T00:00:00Z"}]},
            }))
            .expect("policy");
            p.metadata.resource_version = Some("7".into());
            p
        };
        let published = PublishedPolicies::of(&[policy("b", 3), policy("a", 5)]);
        let names: Vec<&str> = published.policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let text = serde_json::to_string(&published).expect("json");
        assert!(!text.contains("slots"), "no status is published: {text}");
        let back: PublishedPolicies = serde_json::from_str(&text).expect("read back");
        let policies = back.to_policies();
        assert_eq!(policies[0].metadata.generation, Some(5));
        assert!(policies[0].spec.paused && policies[0].spec.auto_reboot);
    }
}
