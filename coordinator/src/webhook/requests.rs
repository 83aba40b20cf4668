//! The agents' reboot requests, bounded per node: an agent may have at most
//! [`REQUESTS_PER_NODE`] requests of its node at once. What it needs is one a boot, and the
//! coordinator deletes finished ones after `--finished-maintenance-ttl`; without a bound one
//! node's identity could create thousands a minute (each name it may use is new), and every one
//! is stored in etcd and in the coordinator's caches. A ValidatingAdmissionPolicy cannot count
//! objects: this webhook counts them in the API server's cache, and adds the ones it allowed
//! moments ago, which that cache may not show yet.
//!
//! The count is exact within one coordinator replica (its answers are taken one at a time);
//! with several replicas behind the webhook's Service a burst may pass the bound by what the
//! others allowed in the same moments.

use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use kube::{Api, Client, api::ListParams};
use nodeward_api::{NodeMaintenance, labels::AGENT_FIELD_MANAGER};
use serde_json::Value;
use tokio::sync::Mutex;

use super::{Caller, ReviewRequest, caller};

/// The path the ValidatingWebhookConfiguration calls for an agent's new maintenance.
pub const REQUEST_PATH: &str = "/validate/request";
/// The most requests filed by its agent one node may have at once.
pub const REQUESTS_PER_NODE: usize = 10;
/// How long an allowed request is counted from memory (until the API server's cache shows it).
const REMEMBERED: Duration = Duration::from_secs(30);

/// What the API server asked about one new maintenance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestReview {
    pub uid: String,
    pub caller: Caller,
    pub name: String,
}

/// Reads the fields the decision needs from an AdmissionReview; the error says what is
/// missing.
pub fn parse(review: &Value) -> Result<RequestReview, String> {
    let request = ReviewRequest::of(review)?;
    Ok(RequestReview {
        uid: request.text("uid")?,
        caller: caller(request.0),
        name: request.text("name")?,
    })
}

/// Whether the request may be created: its node has fewer than `limit` requests filed by its
/// agent (`filed`, by name). A name already there fails on its own (it exists).
pub fn decide(
    request: &RequestReview,
    filed: &BTreeSet<String>,
    limit: usize,
) -> Result<(), String> {
    let node = request.caller.node()?;
    if filed.len() < limit || filed.contains(&request.name) {
        return Ok(());
    }
    let named: Vec<&str> = filed.iter().take(3).map(String::as_str).collect();
    Err(format!(
        "nodeward-agent on node {node} may have at most {limit} reboot requests at once and has {} ({}{}); the coordinator deletes finished ones after --finished-maintenance-ttl, or delete them with kubectl delete nodemaintenance",
        filed.len(),
        named.join(", "),
        if filed.len() > named.len() {
            ", …"
        } else {
            ""
        },
    ))
}

/// The requests this replica allowed in the last [`REMEMBERED`], by node.
#[derive(Debug, Default)]
pub struct Recent {
    allowed: Mutex<HashMap<String, Vec<(String, Instant)>>>,
}

/// Counts the node's requests and decides; remembers what it allowed.
pub async fn review(
    request: &RequestReview,
    client: &Client,
    recent: &Recent,
) -> Result<(), String> {
    let Ok(node) = request.caller.node() else {
        return decide(request, &BTreeSet::new(), REQUESTS_PER_NODE);
    };
    // One answer at a time: the next one counts what this one allowed.
    let mut allowed = recent.allowed.lock().await;
    let now = Instant::now();
    allowed.retain(|_, names| {
        names.retain(|(_, at)| now.duration_since(*at) < REMEMBERED);
        !names.is_empty()
    });
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    // From the API server's cache (any version): the memory above covers what it lags.
    let listed = api
        .list(
            &ListParams::default()
                .fields(&format!("spec.nodeName={node}"))
                .match_any(),
        )
        .await
        .map_err(|e| format!("could not count the reboot requests of node {node}: {e}"))?;
    let mut filed: BTreeSet<String> = listed
        .items
        .iter()
        .filter(|m| m.spec.requested_by.as_deref() == Some(AGENT_FIELD_MANAGER))
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    filed.extend(
        allowed
            .get(node)
            .into_iter()
            .flatten()
            .map(|(name, _)| name.clone()),
    );
    let verdict = decide(request, &filed, REQUESTS_PER_NODE);
    if verdict.is_ok() {
        allowed
            .entry(node.to_owned())
            .or_default()
            .push((request.name.clone(), now));
    }
    verdict
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn review(name: &str) -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "9c1d", "name": name, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:nodeward:nodeward-agent",
                         "extra": {"authentication.kubernetes.io/node-name": ["node-a"]}},
        }})
    }

    fn names(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("node-a-reboot-{i:08}")).collect()
    }

    #[test]
    fn a_node_has_at_most_the_limit_of_requests_from_its_agent() {
        let request = parse(&review("node-a-reboot-0a1b2c3d")).expect("a valid review");
        assert_eq!(request.caller.node(), Ok("node-a"));
        assert_eq!(decide(&request, &names(9), 10), Ok(()));
        let refused = decide(&request, &names(10), 10).expect_err("at the limit");
        assert_eq!(
            refused,
            "nodeward-agent on node node-a may have at most 10 reboot requests at once and has 10 (node-a-reboot-00000000, node-a-reboot-00000001, node-a-reboot-00000002, …); the coordinator deletes finished ones after --finished-maintenance-ttl, or delete them with kubectl delete nodemaintenance"
        );
        // One already there is refused by the API server as existing, not counted twice.
        let again = parse(&review("node-a-reboot-00000004")).expect("a valid review");
        assert_eq!(decide(&again, &names(10), 10), Ok(()));
    }

    #[test]
    fn a_caller_that_names_no_node_is_refused() {
        let mut anonymous = review("x");
        anonymous["request"]["userInfo"] = json!({"username": "someone"});
        let request = parse(&anonymous).expect("a valid review");
        assert!(
            decide(&request, &BTreeSet::new(), 10)
                .expect_err("no node")
                .contains("names no node")
        );
        assert_eq!(
            parse(&json!({"request": {"uid": "1"}})),
            Err("request.name is missing".to_owned())
        );
    }
}
