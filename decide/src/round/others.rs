//! Nodes other actors are disrupting: each uses a slot of every policy that selects it, so that
//! nodeward never adds its disruption on top of theirs (NotReady nodes count already). What
//! tells them, read off the Node:
//!
//! - a cordon nodeward did not record (`nodeward.io/cordoned-by`): an admin, `kubectl drain`,
//!   Cluster API deleting the Machine, the Node Maintenance Operator;
//! - the cluster autoscaler's `ToBeDeletedByClusterAutoscaler` taint (scale-down under way; its
//!   soft `DeletionCandidateOfClusterAutoscaler` is only a candidate and does not count);
//! - Karpenter's disruption taint (`karpenter.sh/disrupted`, and `karpenter.sh/disruption` of
//!   its releases before v1);
//! - medik8s' remediation taint (`medik8s.io/remediation`, self-node-remediation's fence).

use k8s_openapi::api::core::v1::Node;
use kube_core::ResourceExt;
use nodeward_api::labels::CORDONED_BY_ANNOTATION;

/// The taints of other actors that disrupt a node, with who puts them there.
const TAINTS: [(&str, &str); 4] = [
    ("ToBeDeletedByClusterAutoscaler", "cluster-autoscaler"),
    ("karpenter.sh/disrupted", "karpenter"),
    ("karpenter.sh/disruption", "karpenter"),
    ("medik8s.io/remediation", "medik8s"),
];

/// Who disrupts `node` besides nodeward, said for a denial or the policy status; `None` when
/// nobody does.
pub fn disrupted_by_other(node: &Node) -> Option<String> {
    let spec = node.spec.as_ref()?;
    let taint = spec.taints.iter().flatten().find_map(|t| {
        TAINTS
            .iter()
            .find(|(key, _)| *key == t.key)
            .map(|(key, actor)| format!("{actor} (taint {key})"))
    });
    if taint.is_some() {
        return taint;
    }
    let cordoned = spec.unschedulable == Some(true)
        && !node.annotations().contains_key(CORDONED_BY_ANNOTATION);
    cordoned.then(|| "cordoned by someone else".to_owned())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(spec: serde_json::Value, annotations: serde_json::Value) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": "n", "annotations": annotations}, "spec": spec}),
        )
        .expect("node")
    }

    #[test]
    fn each_actor_is_told_by_its_mark_and_nodewards_own_cordon_is_not_another() {
        let taint = |key: &str, effect: &str| json!({"taints": [{"key": key, "effect": effect}]});
        let cases = [
            (node(json!({}), json!({})), None),
            (
                node(json!({"unschedulable": true}), json!({})),
                Some("cordoned by someone else"),
            ),
            (
                node(
                    json!({"unschedulable": true}),
                    json!({CORDONED_BY_ANNOTATION: "maintenance/m"}),
                ),
                None,
            ),
            (
                node(
                    taint("ToBeDeletedByClusterAutoscaler", "NoSchedule"),
                    json!({}),
                ),
                Some("cluster-autoscaler (taint ToBeDeletedByClusterAutoscaler)"),
            ),
            (
                node(
                    taint("DeletionCandidateOfClusterAutoscaler", "PreferNoSchedule"),
                    json!({}),
                ),
                None,
            ),
            (
                node(taint("karpenter.sh/disrupted", "NoSchedule"), json!({})),
                Some("karpenter (taint karpenter.sh/disrupted)"),
            ),
            (
                node(taint("karpenter.sh/disruption", "NoSchedule"), json!({})),
                Some("karpenter (taint karpenter.sh/disruption)"),
            ),
            (
                node(taint("medik8s.io/remediation", "NoExecute"), json!({})),
                Some("medik8s (taint medik8s.io/remediation)"),
            ),
        ];
        for (node, expected) in cases {
            assert_eq!(
                disrupted_by_other(&node).as_deref(),
                expected,
                "{:?}",
                node.spec
            );
        }
    }
}
