//! A policy's budgets per maintenance reason: tighter limits, within `maxConcurrent`, for
//! nodeward's maintenances of one reason (repairs, patch reboots, admins' requests).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::COUNT_OR_PERCENT_RULE;
use crate::MaintenanceReason;

/// How many of nodeward's maintenances of each reason may be under way at once among the
/// matched nodes, each a count or a percentage as `maxConcurrent` (rounded down, at least 1
/// when above 0%), and each within `maxConcurrent`: `{Remediation: 1}` lets repairs take one
/// node while reboots take the whole budget.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
pub struct ReasonBudgets {
    /// Reboots a node asked for (kernel or package updates).
    #[serde(rename = "Reboot", default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(COUNT_OR_PERCENT_RULE).message("maxConcurrentByReason.Reboot must be an integer >= 0 or a percentage from \"0%\" to \"100%\", e.g. 1 or \"10%\""))]
    pub reboot: Option<IntOrString>,
    /// Repairs of unhealthy nodes.
    #[serde(
        rename = "Remediation",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new(COUNT_OR_PERCENT_RULE).message("maxConcurrentByReason.Remediation must be an integer >= 0 or a percentage from \"0%\" to \"100%\", e.g. 1 or \"10%\""))]
    pub remediation: Option<IntOrString>,
    /// Shutdowns.
    #[serde(rename = "Shutdown", default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(COUNT_OR_PERCENT_RULE).message("maxConcurrentByReason.Shutdown must be an integer >= 0 or a percentage from \"0%\" to \"100%\", e.g. 1 or \"10%\""))]
    pub shutdown: Option<IntOrString>,
    /// What admins asked for.
    #[serde(rename = "Manual", default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(COUNT_OR_PERCENT_RULE).message("maxConcurrentByReason.Manual must be an integer >= 0 or a percentage from \"0%\" to \"100%\", e.g. 1 or \"10%\""))]
    pub manual: Option<IntOrString>,
}

impl ReasonBudgets {
    pub fn is_empty(&self) -> bool {
        self.limits().next().is_none()
    }

    /// Each reason with a limit, with the field that sets it (for messages).
    pub fn limits(&self) -> impl Iterator<Item = (MaintenanceReason, &'static str, &IntOrString)> {
        [
            (
                MaintenanceReason::Reboot,
                "maxConcurrentByReason.Reboot",
                &self.reboot,
            ),
            (
                MaintenanceReason::Remediation,
                "maxConcurrentByReason.Remediation",
                &self.remediation,
            ),
            (
                MaintenanceReason::Shutdown,
                "maxConcurrentByReason.Shutdown",
                &self.shutdown,
            ),
            (
                MaintenanceReason::Manual,
                "maxConcurrentByReason.Manual",
                &self.manual,
            ),
        ]
        .into_iter()
        .filter_map(|(reason, field, limit)| limit.as_ref().map(|l| (reason, field, l)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_keys_as_maintenances_name_them() {
        let budgets: ReasonBudgets =
            serde_json::from_value(serde_json::json!({"Remediation": 1, "Reboot": "10%"}))
                .expect("valid budgets");
        let limits: Vec<_> = budgets
            .limits()
            .map(|(r, f, l)| (r, f, l.clone()))
            .collect();
        assert_eq!(
            limits,
            vec![
                (
                    MaintenanceReason::Reboot,
                    "maxConcurrentByReason.Reboot",
                    IntOrString::String("10%".into())
                ),
                (
                    MaintenanceReason::Remediation,
                    "maxConcurrentByReason.Remediation",
                    IntOrString::Int(1)
                ),
            ]
        );
        assert!(ReasonBudgets::default().is_empty());
        assert_eq!(
            serde_json::to_value(&budgets).expect("serializes"),
            serde_json::json!({"Reboot": "10%", "Remediation": 1})
        );
    }
}
