//! Reading a Node's status, the one way every part of nodeward does, and nodeward's changes to
//! a Node as pure edits: cordon and taint recording what nodeward did (so that undoing them never
//! uncordons a node an admin had cordoned), the out-of-service and pending taints. Writing them
//! is `nodeward_runtime::cordon`'s.

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};

use crate::labels::{
    CORDONED_BY_ANNOTATION, OUT_OF_SERVICE_ANNOTATION, OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE,
    PENDING_TAINT,
};

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

/// What `apply` did, so that `undo` reverts exactly that.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub cordoned: bool,
    pub tainted: bool,
}

/// Cordons unless already cordoned (recording `by`),
/// add the `taint` (NoSchedule) unless present.
pub fn cordon_and_taint(node: &mut Node, taint: &str, by: &str) -> Applied {
    // Our own cordon from an earlier try (a restart between cordoning and recording it, or a
    // step repeated on a stale view) is still ours to undo.
    let already_ours = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDONED_BY_ANNOTATION))
        .is_some_and(|recorded| recorded == by);
    let spec = node.spec.get_or_insert_with(Default::default);
    let mut applied = Applied::default();
    if spec.unschedulable == Some(true) && already_ours {
        applied.cordoned = true;
    } else if spec.unschedulable != Some(true) {
        spec.unschedulable = Some(true);
        node.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CORDONED_BY_ANNOTATION.to_owned(), by.to_owned());
        applied.cordoned = true;
    }
    let taints = spec.taints.get_or_insert_with(Vec::new);
    if !taints.iter().any(|t| t.key == taint) {
        taints.push(Taint {
            key: taint.to_owned(),
            effect: "NoSchedule".to_owned(),
            value: None,
            time_added: None,
        });
        applied.tainted = true;
    }
    applied
}

/// Reverts `applied`: uncordons only if nodeward's record is still there (an admin who
/// cordoned in the meantime keeps the cordon), removes only the taint it added.
pub fn revert(node: &mut Node, taint: &str, applied: &Applied) -> bool {
    let mut changed = false;
    let ours = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CORDONED_BY_ANNOTATION));
    if applied.cordoned && ours {
        if let Some(spec) = node.spec.as_mut() {
            spec.unschedulable = None;
        }
        if let Some(annotations) = node.metadata.annotations.as_mut() {
            annotations.remove(CORDONED_BY_ANNOTATION);
        }
        changed = true;
    }
    if applied.tainted
        && let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut())
    {
        let before = taints.len();
        taints.retain(|t| t.key != taint);
        changed |= taints.len() != before;
    }
    changed
}

/// What a step recorded as `by` may have left on `node` without recording it in its status:
/// the cordon if the node's record names `by`, and the `taint` if `taint_ours` (no one else
/// holds the node under it).
pub fn left_by(node: &Node, by: &str, taint_ours: bool) -> Applied {
    let recorded = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDONED_BY_ANNOTATION));
    Applied {
        cordoned: recorded.is_some_and(|r| r == by),
        tainted: taint_ours,
    }
}

/// Puts the out-of-service taint on `node` with nodeward's record of `why` (`on`), or takes
/// away the one nodeward put there (not one an admin put); returns whether it changed the node.
pub fn out_of_service(node: &mut Node, on: bool, why: &str) -> bool {
    let recorded = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(OUT_OF_SERVICE_ANNOTATION));
    let spec = node.spec.get_or_insert_with(Default::default);
    let taints = spec.taints.get_or_insert_with(Vec::new);
    let tainted = taints.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT);
    if on && !tainted {
        taints.push(Taint {
            key: OUT_OF_SERVICE_TAINT.to_owned(),
            value: Some(OUT_OF_SERVICE_VALUE.to_owned()),
            effect: "NoExecute".to_owned(),
            time_added: None,
        });
        node.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(OUT_OF_SERVICE_ANNOTATION.to_owned(), why.to_owned());
        return true;
    }
    if !on && recorded {
        taints.retain(|t| t.key != OUT_OF_SERVICE_TAINT);
        if let Some(annotations) = node.metadata.annotations.as_mut() {
            annotations.remove(OUT_OF_SERVICE_ANNOTATION);
        }
        return true;
    }
    false
}

/// Puts nodeward's pending taint (`PreferNoSchedule`) on `node` or takes it away; returns
/// whether the node changed.
pub fn pending(node: &mut Node, on: bool) -> bool {
    let spec = node.spec.get_or_insert_with(Default::default);
    let taints = spec.taints.get_or_insert_with(Vec::new);
    let tainted = taints.iter().any(|t| t.key == PENDING_TAINT);
    match (on, tainted) {
        (true, false) => {
            taints.push(Taint {
                key: PENDING_TAINT.to_owned(),
                value: None,
                effect: "PreferNoSchedule".to_owned(),
                time_added: None,
            });
            true
        }
        (false, true) => {
            taints.retain(|t| t.key != PENDING_TAINT);
            true
        }
        _ => false,
    }
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

    #[test]
    fn an_admin_cordon_is_kept_and_only_our_taint_goes() {
        let mut node = Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                unschedulable: Some(true),
                taints: Some(vec![Taint {
                    key: "other".into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]),
                ..Default::default()
            }),
            ..Node::default()
        };
        let applied = cordon_and_taint(&mut node, "nodeward.io/shutdown", "shutdown");
        assert_eq!(
            applied,
            Applied {
                cordoned: false,
                tainted: true
            }
        );
        assert!(revert(&mut node, "nodeward.io/shutdown", &applied));
        let spec = node.spec.as_ref().expect("spec");
        assert_eq!(spec.unschedulable, Some(true), "the admin's cordon stays");
        assert_eq!(spec.taints.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn our_cordon_is_undone_unless_the_record_is_gone() {
        let mut node = Node::default();
        let applied = cordon_and_taint(&mut node, "t", "shutdown");
        assert_eq!(
            applied,
            Applied {
                cordoned: true,
                tainted: true
            }
        );
        // Applied again (a repeated step): still ours.
        let mut again = node.clone();
        assert!(cordon_and_taint(&mut again, "t", "shutdown").cordoned);
        assert!(!cordon_and_taint(&mut again, "t", "maintenance/x").cordoned);
        let mut taken_over = node.clone();
        assert!(revert(&mut node, "t", &applied));
        assert_eq!(node.spec.as_ref().and_then(|s| s.unschedulable), None);
        // An admin who removed our record (took the cordon over) keeps it.
        taken_over.metadata.annotations = None;
        revert(&mut taken_over, "t", &applied);
        assert_eq!(
            taken_over.spec.as_ref().and_then(|s| s.unschedulable),
            Some(true)
        );
    }

    #[test]
    fn only_the_cordon_recorded_for_a_step_is_left_by_it() {
        let mut node = Node::default();
        cordon_and_taint(&mut node, "t", "maintenance/a");
        assert_eq!(
            left_by(&node, "maintenance/a", true),
            Applied {
                cordoned: true,
                tainted: true
            }
        );
        assert_eq!(
            left_by(&node, "maintenance/b", false),
            Applied::default(),
            "another maintenance's cordon, and a taint someone else holds, stay"
        );
    }

    #[test]
    fn only_the_out_of_service_taint_nodeward_put_is_taken_away() {
        let mut node = Node::default();
        assert!(out_of_service(&mut node, true, "dead"));
        assert!(!out_of_service(&mut node, true, "dead"), "once");
        let taint = &node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()[0];
        assert_eq!(
            (
                taint.key.as_str(),
                taint.value.as_deref(),
                taint.effect.as_str()
            ),
            (
                OUT_OF_SERVICE_TAINT,
                Some(OUT_OF_SERVICE_VALUE),
                "NoExecute"
            )
        );
        assert!(out_of_service(&mut node, false, ""));
        assert_eq!(
            node.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .map(Vec::len),
            Some(0)
        );

        // An admin's (no record) stays.
        let mut admins = Node::default();
        out_of_service(&mut admins, true, "admin");
        admins.metadata.annotations = None;
        assert!(!out_of_service(&mut admins, false, ""));
        assert_eq!(admins.spec.and_then(|s| s.taints).map(|t| t.len()), Some(1));
    }
}
