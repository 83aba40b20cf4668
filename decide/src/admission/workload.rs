//! Admission that looks ahead at the workloads (`workloadGate.checkDisruptionBudgets`): a node
//! is not disrupted while a PodDisruptionBudget covering one of its pods allows no disruption,
//! since its drain would only cordon the node and then wait on the Eviction API's refusals.
//! The rules follow the Eviction API's: pods that are Pending, finished or already going are
//! let go whatever the budget says, a running pod that is not Ready goes when the budget's
//! `unhealthyPodEvictionPolicy` lets it, and DaemonSet and static pods are not drained at all.

use std::collections::BTreeMap;

use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube_core::ResourceExt;

/// Why each node is held back by a budget, for the budgets that allow no disruption now and
/// the pods each selects (`budgets`: a budget with the pods its selector took in its
/// namespace). One reason per node: the first budget, in the order given, that holds it.
pub fn held_nodes(budgets: &[(PodDisruptionBudget, Vec<Pod>)]) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for (budget, pods) in budgets {
        let Some(why) = allows_none(budget) else {
            continue;
        };
        for pod in pods {
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
                continue;
            };
            if held.contains_key(node) || !eviction_guarded(budget, pod) {
                continue;
            }
            held.insert(
                node.to_owned(),
                format!(
                    "PodDisruptionBudget {}/{} of {} allows no disruption now ({why}), and its pod {} runs on the node",
                    budget.namespace().unwrap_or_default(),
                    budget.name_any(),
                    workload(pod),
                    pod.name_any(),
                ),
            );
        }
    }
    held
}

/// Why `budget` allows no disruption now, if it does not: none allowed, or a status the
/// disruption controller has not yet computed for its current spec (the Eviction API refuses
/// then too).
pub fn allows_none(budget: &PodDisruptionBudget) -> Option<String> {
    let Some(status) = &budget.status else {
        return Some("the disruption controller has not computed it yet".to_owned());
    };
    if status.observed_generation.unwrap_or(0) < budget.metadata.generation.unwrap_or(0) {
        return Some("the disruption controller has not computed its new spec yet".to_owned());
    }
    (status.disruptions_allowed <= 0).then(|| {
        format!(
            "{} of {} pods healthy, {} wanted",
            status.current_healthy, status.expected_pods, status.desired_healthy
        )
    })
}

/// Whether evicting `pod` would be refused under `budget` (which allows no disruption): the
/// pod is one a drain evicts, and evicting it would take a healthy pod away or the budget does
/// not let unhealthy ones go.
fn eviction_guarded(budget: &PodDisruptionBudget, pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() || !drained(pod) {
        return false;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    // The Eviction API lets these go without asking the budget.
    if matches!(phase, Some("Pending" | "Succeeded" | "Failed")) {
        return false;
    }
    if is_ready(pod) {
        return true;
    }
    // A running pod that is not Ready: AlwaysAllow lets it go; IfHealthyBudget (the default)
    // only while the budget's wanted healthy pods are there.
    let always = budget
        .spec
        .as_ref()
        .and_then(|s| s.unhealthy_pod_eviction_policy.as_deref())
        == Some("AlwaysAllow");
    let healthy_enough = budget
        .status
        .as_ref()
        .is_some_and(|s| s.current_healthy >= s.desired_healthy);
    !(always || healthy_enough)
}

/// Whether a drain evicts `pod` at all: DaemonSet pods come back with the node and static
/// (mirror) pods belong to the kubelet.
fn drained(pod: &Pod) -> bool {
    let daemon = pod
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "DaemonSet");
    let mirror = pod
        .annotations()
        .contains_key("kubernetes.io/config.mirror");
    !daemon && !mirror
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What the operator knows the pod by: its Deployment (the ReplicaSet's name less its
/// `pod-template-hash`), or its controller, or the pod itself.
fn workload(pod: &Pod) -> String {
    let namespace = pod.namespace().unwrap_or_default();
    let Some(owner) = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
    else {
        return format!("pod {namespace}/{}", pod.name_any());
    };
    if owner.kind == "ReplicaSet"
        && let Some(hash) = pod.labels().get("pod-template-hash")
        && let Some(deployment) = owner.name.strip_suffix(&format!("-{hash}"))
    {
        return format!("Deployment {namespace}/{deployment}");
    }
    format!("{} {namespace}/{}", owner.kind, owner.name)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn budget(
        name: &str,
        allowed: i32,
        healthy: i32,
        wanted: i32,
        policy: &str,
    ) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "generation": 2},
            "spec": {"minAvailable": wanted, "unhealthyPodEvictionPolicy": policy},
            "status": {"observedGeneration": 2, "disruptionsAllowed": allowed,
                       "currentHealthy": healthy, "desiredHealthy": wanted, "expectedPods": 3}
        }))
        .expect("a budget")
    }

    fn pod(name: &str, node: &str, phase: &str, ready: bool, owner: (&str, &str)) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"pod-template-hash": "5d8f"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner.0, "name": owner.1,
                                              "uid": "u", "controller": true}]},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase,
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .expect("a pod")
    }

    const WEB: (&str, &str) = ("ReplicaSet", "web-5d8f");

    #[test]
    fn a_budget_allowing_no_disruption_holds_the_nodes_of_its_healthy_pods_and_names_the_deployment()
     {
        let held = held_nodes(&[(
            budget("web", 0, 2, 2, "IfHealthyBudget"),
            vec![
                pod("web-a", "n1", "Running", true, WEB),
                pod("web-b", "n2", "Running", true, WEB),
                pod("web-c", "n3", "Pending", false, WEB),
            ],
        )]);
        assert_eq!(held.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        assert_eq!(
            held["n1"],
            "PodDisruptionBudget shop/web of Deployment shop/web allows no disruption now (2 of 3 pods healthy, 2 wanted), and its pod web-a runs on the node"
        );
    }

    #[test]
    fn a_budget_that_allows_a_disruption_holds_nothing() {
        let held = held_nodes(&[(
            budget("web", 1, 3, 2, "IfHealthyBudget"),
            vec![pod("web-a", "n1", "Running", true, WEB)],
        )]);
        assert!(held.is_empty(), "{held:?}");
    }

    #[test]
    fn an_unhealthy_pod_holds_its_node_only_where_the_eviction_api_would_refuse_it() {
        let sick = pod("web-a", "n1", "Running", false, WEB);
        // Wanted healthy pods are there: IfHealthyBudget lets the sick one go.
        assert!(
            held_nodes(&[(
                budget("web", 0, 2, 2, "IfHealthyBudget"),
                vec![sick.clone()]
            )])
            .is_empty()
        );
        // Short of them: it may not go, and the node waits.
        assert!(
            held_nodes(&[(
                budget("web", 0, 1, 2, "IfHealthyBudget"),
                vec![sick.clone()]
            )])
            .contains_key("n1")
        );
        // AlwaysAllow lets it go however short the budget is.
        assert!(held_nodes(&[(budget("web", 0, 1, 2, "AlwaysAllow"), vec![sick])]).is_empty());
    }

    #[test]
    fn pods_a_drain_leaves_or_that_are_already_going_hold_nothing() {
        let daemon = pod("agent-x", "n1", "Running", true, ("DaemonSet", "agent"));
        let mut mirror = pod("etcd-n2", "n2", "Running", true, ("Node", "n2"));
        mirror
            .annotations_mut()
            .insert("kubernetes.io/config.mirror".into(), "x".into());
        let mut going = pod("web-c", "n3", "Running", true, WEB);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let done = pod("job-d", "n4", "Succeeded", false, ("Job", "batch"));
        let held = held_nodes(&[(
            budget("all", 0, 0, 4, "IfHealthyBudget"),
            vec![daemon, mirror, going, done],
        )]);
        assert!(held.is_empty(), "{held:?}");
    }

    #[test]
    fn a_budget_not_yet_computed_for_its_spec_allows_nothing_and_other_controllers_are_named() {
        let mut stale = budget("db", 2, 3, 1, "IfHealthyBudget");
        stale.metadata.generation = Some(3);
        let held = held_nodes(&[(
            stale,
            vec![pod("db-0", "n1", "Running", true, ("StatefulSet", "db"))],
        )]);
        assert!(
            held["n1"].contains("StatefulSet shop/db allows no disruption now (the disruption controller has not computed its new spec yet)"),
            "{held:?}"
        );
        let mut new = budget("db", 2, 3, 1, "IfHealthyBudget");
        new.status = None;
        assert!(allows_none(&new).is_some());
    }
}
