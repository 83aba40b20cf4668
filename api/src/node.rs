//! Reading a Node's status, the one way every part of nodeward does.

use k8s_openapi::api::core::v1::{Node, NodeCondition};

/// The node's condition of `type_`, if it has one.
pub fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    conditions(node).iter().find(|c| c.type_ == type_)
}

/// The node's conditions (none before the kubelet first posts its status).
pub fn conditions(node: &Node) -> &[NodeCondition] {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

/// Whether the node's `Ready` condition is `True`.
pub fn is_ready(node: &Node) -> bool {
    condition(node, "Ready").is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeStatus;

    use super::*;

    fn node(conditions: &[(&str, &str)]) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(type_, status)| NodeCondition {
                            type_: (*type_).into(),
                            status: (*status).into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn ready_only_when_the_ready_condition_is_true() {
        assert!(is_ready(&node(&[
            ("DiskPressure", "False"),
            ("Ready", "True")
        ])));
        assert!(!is_ready(&node(&[("Ready", "False")])));
        assert!(!is_ready(&node(&[("Ready", "Unknown")])));
        assert!(!is_ready(&node(&[("NetworkUnavailable", "True")])));
        assert!(!is_ready(&Node::default()), "no status yet");
    }

    #[test]
    fn a_condition_is_found_by_type() {
        let n = node(&[("Ready", "True"), ("KubeletProblem", "True")]);
        assert_eq!(
            condition(&n, "KubeletProblem").map(|c| c.status.as_str()),
            Some("True")
        );
        assert!(condition(&n, "ReadonlyFilesystem").is_none());
    }
}
