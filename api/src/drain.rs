//! Drain plans: the ordered stages in which a node's pods are terminated.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Duration;

/// Ordered stages; each stage starts when the previous one has finished or timed out (with
/// `onTimeout: Continue`). Pods matched by no stage are not evicted.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DrainPlan {
    /// Stages in the order they run. Stage names are unique.
    #[schemars(length(min = 1, max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub stages: Vec<DrainStage>,
    /// Pods matching any of these rules are never evicted (in addition to pods labelled
    /// `nodeward.io/drain=skip`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub skip: Vec<PodRule>,
}

/// One stage of a drain plan.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.priority) || !has(self.priority.min) || !has(self.priority.max) || self.priority.min <= self.priority.max").message("priority.min must not be greater than priority.max").field_path(".priority"))]
pub struct DrainStage {
    /// Name of the stage, shown in progress and events.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Which kinds of pods this stage takes (default: Default only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub pod_types: Vec<PodType>,
    /// Inclusive range of pod priorities this stage takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<PriorityRange>,
    /// Only pods matching these label and namespace selectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<PodRule>,
    /// How long the stage may take before `onTimeout` applies.
    pub timeout: Duration,
    /// What happens to pods still there when the stage times out.
    #[serde(default)]
    pub on_timeout: OnTimeout,
}

/// Kinds of pods, as a drain plan sees them.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodType {
    /// Pods owned by anything but a DaemonSet, and bare pods.
    Default,
    /// Pods owned by a DaemonSet (evicted only for shutdown and reboot).
    DaemonSet,
    /// Static and mirror pods; the kubelet owns them, nodeward only reports them.
    Static,
}

/// An inclusive range of pod priorities; either end may be left open.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PriorityRange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<i32>,
}

/// Selects pods by their labels and their namespace's labels; both must match when both are
/// set.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.podSelector) || has(self.namespaceSelector)").message("set podSelector, namespaceSelector or both"))]
pub struct PodRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::bounds::optional_selector")]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::bounds::optional_selector")]
    pub namespace_selector: Option<LabelSelector>,
}

impl DrainPlan {
    /// Whether a rule of the plan selects by namespace labels: only then does a drain read
    /// the cluster's namespaces (all of them, which in a large cluster is a large read).
    pub fn reads_namespace_labels(&self) -> bool {
        self.stages
            .iter()
            .filter_map(|s| s.selector.as_ref())
            .chain(&self.skip)
            .any(|rule| rule.namespace_selector.is_some())
    }
}

/// What a drain stage does with the pods left when its timeout expires.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnTimeout {
    /// Fail the drain (the maintenance fails and its cordon is undone).
    #[default]
    Fail,
    /// Delete the remaining pods, bypassing their PodDisruptionBudgets.
    Delete,
    /// Leave them and go on with the next stage.
    Continue,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(selector: Option<PodRule>) -> DrainStage {
        serde_json::from_value::<DrainStage>(serde_json::json!({"name": "s", "timeout": "1m"}))
            .map(|s| DrainStage { selector, ..s })
            .expect("a stage")
    }

    #[test]
    fn only_a_rule_with_a_namespace_selector_makes_a_drain_read_namespace_labels() {
        let by_pod = PodRule {
            pod_selector: Some(LabelSelector::default()),
            namespace_selector: None,
        };
        let by_namespace = PodRule {
            pod_selector: None,
            namespace_selector: Some(LabelSelector::default()),
        };
        let plan = |stages, skip| DrainPlan { stages, skip };
        assert!(!plan(vec![stage(None)], vec![]).reads_namespace_labels());
        assert!(
            !plan(vec![stage(Some(by_pod.clone()))], vec![by_pod.clone()]).reads_namespace_labels()
        );
        assert!(plan(vec![stage(Some(by_namespace.clone()))], vec![]).reads_namespace_labels());
        assert!(plan(vec![stage(None)], vec![by_pod, by_namespace]).reads_namespace_labels());
    }
}
