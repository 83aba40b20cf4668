//! The authorization webhook that lets each agent read the pods of its own node and no others.
//! RBAC grants a verb on every object of a resource, or on objects named in advance; it cannot
//! grant "the pods of the caller's node", so with RBAC alone an agent reads every pod in the
//! cluster, their specs and environments included. With the chart's
//! `agent.podReads: authorizationWebhook`, the agent's ClusterRole grants no pod read and the
//! API server, configured to call this webhook after RBAC (`--authorization-config`), asks here
//! about what RBAC did not allow. An agent may list and watch pods only with the field selector
//! `spec.nodeName=<its node>` (the API server passes the selector's requirements since
//! Kubernetes 1.31, AuthorizeWithSelectors); everything else gets no opinion, with the reason,
//! which the API server adds to its 403.
//!
//! The decision is a pure function of the SubjectAccessReview and who the agents are.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewStatus,
};
use nodeward_api::labels::AGENT_USER_PREFIX;
use serde_json::{Value, json};

use super::{Caller, NODE_CLAIM};

/// The path the API server's authorization configuration calls.
pub const POD_READS_PATH: &str = "/authorize/pod-reads";
/// The field a pod's node is selected by.
const NODE_FIELD: &str = "spec.nodeName";

/// Who the agents are: the agents' service account's user, and the group of host-mode agents'
/// certificates (their users are `nodeward:agent:<node>`). Neither set: nobody is granted
/// anything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Agents {
    pub user: Option<String>,
    pub group: Option<String>,
}

impl Agents {
    /// Whether `user` (in `groups`) is one of them.
    pub fn include(&self, user: &str, groups: &[String]) -> bool {
        self.user.as_deref() == Some(user)
            || self
                .group
                .as_ref()
                .is_some_and(|group| groups.contains(group) && user.starts_with(AGENT_USER_PREFIX))
    }
}

/// What the API server asks: may `caller` (in `groups`) do `resource`.
#[derive(Clone, Debug)]
pub struct Access {
    pub caller: Caller,
    pub groups: Vec<String>,
    pub resource: Option<ResourceAttributes>,
}

/// Reads a SubjectAccessReview (v1); the error says what is wrong with it.
pub fn parse(review: Value) -> Result<Access, String> {
    let review: SubjectAccessReview = serde_json::from_value(review)
        .map_err(|e| format!("the body is not a SubjectAccessReview: {e}"))?;
    let spec = review.spec;
    let claimed = spec
        .extra
        .as_ref()
        .and_then(|extra| extra.get(NODE_CLAIM))
        .and_then(|values| values.first())
        .map(String::as_str);
    Ok(Access {
        caller: Caller::of(spec.user.unwrap_or_default(), claimed),
        groups: spec.groups.unwrap_or_default(),
        resource: spec.resource_attributes,
    })
}

/// Allowed, or why not (the API server carries on with no opinion from here).
pub fn decide(access: &Access, agents: &Agents) -> Result<(), String> {
    if !agents.include(&access.caller.user, &access.groups) {
        return Err(format!(
            "nodeward grants nothing to {}: it is not a nodeward agent",
            access.caller.user
        ));
    }
    let node = access.caller.node()?;
    let own_pods = format!(
        "nodeward-agent on node {node} may list and watch only the pods of its own node, with the field selector {NODE_FIELD}={node}"
    );
    let Some(resource) = &access.resource else {
        return Err(own_pods);
    };
    let text = |field: &Option<String>| field.clone().unwrap_or_default();
    let is_pods = text(&resource.group).is_empty()
        && text(&resource.resource) == "pods"
        && text(&resource.subresource).is_empty()
        && text(&resource.name).is_empty();
    let reads = ["list", "watch"].contains(&text(&resource.verb).as_str());
    // Requirements are ANDed: one that keeps the answer to its node is enough. The raw
    // selector is never parsed here (the API server parses; two parsers could disagree).
    let own_node = resource
        .field_selector
        .as_ref()
        .and_then(|selector| selector.requirements.as_ref())
        .is_some_and(|requirements| {
            requirements.iter().any(|r| {
                r.key == NODE_FIELD
                    && r.operator == "In"
                    && r.values.as_deref() == Some(&[node.to_owned()][..])
            })
        });
    if is_pods && reads && own_node {
        Ok(())
    } else {
        Err(own_pods)
    }
}

/// The SubjectAccessReview answer: allowed, or no opinion with the reason (never a denial:
/// this webhook only grants).
pub fn response(verdict: &Result<(), String>) -> Value {
    let status = match verdict {
        Ok(()) => SubjectAccessReviewStatus {
            allowed: true,
            ..Default::default()
        },
        Err(reason) => SubjectAccessReviewStatus {
            allowed: false,
            reason: Some(reason.clone()),
            ..Default::default()
        },
    };
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "status": status})
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "system:serviceaccount:nodeward-system:nodeward-agent";

    fn agents() -> Agents {
        Agents {
            user: Some(AGENT.to_owned()),
            group: Some("nodeward:agents".to_owned()),
        }
    }

    /// A review of `verb` on pods by `user` (with a token bound to a pod on `claim`), with
    /// the field selector `requirements` (key, operator, values).
    fn review(user: &str, claim: Option<&str>, verb: &str, requirements: Value) -> Access {
        let mut spec = json!({"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "version": "v1", "resource": "pods"}});
        if let Some(node) = claim {
            spec["extra"] = json!({NODE_CLAIM: [node]});
        }
        if !requirements.is_null() {
            spec["resourceAttributes"]["fieldSelector"] = json!({"requirements": requirements});
        }
        parse(json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}))
            .expect("a valid review")
    }

    fn on(node: &str) -> Value {
        json!([{"key": "spec.nodeName", "operator": "In", "values": [node]}])
    }

    #[test]
    fn an_agent_lists_and_watches_the_pods_of_its_own_node_and_no_others() {
        for verb in ["list", "watch"] {
            assert_eq!(
                decide(
                    &review(AGENT, Some("node-a"), verb, on("node-a")),
                    &agents()
                ),
                Ok(())
            );
        }
        let refused = decide(
            &review(AGENT, Some("node-a"), "list", on("node-b")),
            &agents(),
        )
        .expect_err("another node's pods");
        assert_eq!(
            refused,
            "nodeward-agent on node node-a may list and watch only the pods of its own node, with the field selector spec.nodeName=node-a"
        );
        for requirements in [
            Value::Null,
            json!([{"key": "spec.nodeName", "operator": "NotIn", "values": ["node-a"]}]),
            json!([{"key": "spec.nodeName", "operator": "In", "values": ["node-a", "node-b"]}]),
            json!([{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]),
        ] {
            assert!(
                decide(
                    &review(AGENT, Some("node-a"), "list", requirements.clone()),
                    &agents()
                )
                .is_err(),
                "{requirements}"
            );
        }
        // Narrowed further by another requirement: still only its node's pods.
        let narrowed = json!([{"key": "metadata.namespace", "operator": "In", "values": ["shop"]},
            {"key": "spec.nodeName", "operator": "In", "values": ["node-a"]}]);
        assert_eq!(
            decide(&review(AGENT, Some("node-a"), "watch", narrowed), &agents()),
            Ok(())
        );
    }

    #[test]
    fn nothing_but_a_read_of_the_pods_list_is_granted() {
        for verb in [
            "get",
            "delete",
            "create",
            "update",
            "patch",
            "deletecollection",
        ] {
            assert!(
                decide(
                    &review(AGENT, Some("node-a"), verb, on("node-a")),
                    &agents()
                )
                .is_err()
            );
        }
        let mut secrets = review(AGENT, Some("node-a"), "list", on("node-a"));
        if let Some(resource) = secrets.resource.as_mut() {
            resource.resource = Some("secrets".to_owned());
        }
        assert!(decide(&secrets, &agents()).is_err());
        let mut logs = review(AGENT, Some("node-a"), "list", on("node-a"));
        if let Some(resource) = logs.resource.as_mut() {
            resource.subresource = Some("log".to_owned());
        }
        assert!(decide(&logs, &agents()).is_err());
        let mut named = review(AGENT, Some("node-a"), "watch", on("node-a"));
        if let Some(resource) = named.resource.as_mut() {
            resource.name = Some("cart-7".to_owned());
        }
        assert!(decide(&named, &agents()).is_err());
    }

    #[test]
    fn only_the_agents_are_granted_and_only_for_the_node_they_name() {
        // Any pod's token carries its node: another service account is not an agent.
        let other = "system:serviceaccount:shop:cart";
        assert_eq!(
            decide(&review(other, Some("node-a"), "list", on("node-a")), &agents()),
            Err("nodeward grants nothing to system:serviceaccount:shop:cart: it is not a nodeward agent".to_owned())
        );
        // An unbound token of the agent names no node.
        assert!(
            decide(&review(AGENT, None, "list", on("node-a")), &agents())
                .expect_err("no node")
                .contains("names no node")
        );
        // A host-mode certificate: its user names the node, in the agents' group only.
        let mut host = review("nodeward:agent:node-a", None, "list", on("node-a"));
        assert!(decide(&host, &agents()).is_err(), "not in the group");
        host.groups.push("nodeward:agents".to_owned());
        assert_eq!(decide(&host, &agents()), Ok(()));
        assert!(decide(&host, &Agents::default()).is_err(), "no agents set");
        let mut elsewhere = review("nodeward:agent:node-a", None, "list", on("node-b"));
        elsewhere.groups.push("nodeward:agents".to_owned());
        assert!(decide(&elsewhere, &agents()).is_err());
    }

    #[test]
    fn answers_allow_or_carry_the_reason_and_never_deny() {
        assert_eq!(response(&Ok(()))["status"], json!({"allowed": true}));
        assert_eq!(
            response(&Err("no".to_owned()))["status"],
            json!({"allowed": false, "reason": "no"})
        );
        assert!(parse(json!({"spec": "nothing"})).is_err());
    }
}
