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

/// The node's InternalIP (IPv4 preferred): where its agent answers peers' probes.
pub fn internal_ip(node: &Node) -> Option<std::net::IpAddr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    let mut ips: Vec<std::net::IpAddr> = addresses
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    ips.sort_by_key(|ip| !ip.is_ipv4());
    ips.first().copied()
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
