//! From debounced findings to Node conditions: several detectors may feed one condition type
//! (interfaces, default route and DNS all feed `NetworkProblem`); the condition is `True` when
//! any of them reports a problem, `Unknown` when none does but one cannot tell, else `False`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

use crate::detect::{Finding, Status};

/// The agent's view of one Node condition (without timestamps).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCondition {
    pub type_: String,
    pub status: Status,
    pub reason: String,
    pub message: String,
}

/// Node condition messages are for humans; a long one is cut here.
const MAX_MESSAGE: usize = 1024;

/// Finding types that live only in the NodeReport (and Events), never on the Node.
pub const REPORT_ONLY: &[&str] = &[nodeward_api::conditions::node::KUBELET_UNREGISTERED];

/// Whether findings of this type become a Node condition.
pub fn is_node_condition(type_: &str) -> bool {
    !REPORT_ONLY.contains(&type_)
}

/// One condition per type among `findings`, in type order. Skipped checks count for nothing.
pub fn aggregate<'a>(findings: impl IntoIterator<Item = &'a Finding>) -> Vec<NodeCondition> {
    let mut by_type: BTreeMap<&str, Vec<&Finding>> = BTreeMap::new();
    for finding in findings.into_iter().filter(|f| f.status != Status::Skipped) {
        by_type
            .entry(finding.condition.as_ref())
            .or_default()
            .push(finding);
    }
    by_type
        .into_iter()
        .map(|(type_, mut findings)| {
            // Deterministic order: detectors by name, so that the message never reshuffles.
            findings.sort_by(|a, b| a.detector.cmp(&b.detector));
            let pick =
                |status: Status| findings.iter().filter(move |f| f.status == status).copied();
            let (status, chosen): (Status, Vec<&Finding>) =
                if pick(Status::Problem).next().is_some() {
                    (Status::Problem, pick(Status::Problem).collect())
                } else if pick(Status::Unknown).next().is_some() {
                    (Status::Unknown, pick(Status::Unknown).collect())
                } else {
                    (Status::Ok, findings.clone())
                };
            let reason = match chosen.as_slice() {
                [only] => only.reason.clone(),
                _ if status == Status::Ok => "NoProblem".to_owned(),
                [first, ..] => first.reason.clone(),
                [] => "NoProblem".to_owned(),
            };
            let message = chosen
                .iter()
                .map(|f| format!("{}: {}", f.detector, f.message))
                .collect::<Vec<_>>()
                .join("; ");
            NodeCondition {
                type_: type_.to_owned(),
                status,
                reason,
                message: nodeward_api::bounds::cut(&message, MAX_MESSAGE),
            }
        })
        .collect()
}

/// The condition types `manager` owns in a Node's status, as its managed fields record them
/// (server-side apply keeps one entry per manager): the agent's conditions, also those of a
/// check since removed from its configuration.
pub fn owned_types(managed: &[ManagedFieldsEntry], manager: &str) -> BTreeSet<String> {
    managed
        .iter()
        .filter(|m| {
            m.manager.as_deref() == Some(manager) && m.subresource.as_deref() == Some("status")
        })
        .filter_map(|m| m.fields_v1.as_ref())
        .filter_map(|fields| fields.0.get("f:status")?.get("f:conditions")?.as_object())
        .flat_map(|conditions| conditions.keys())
        .filter_map(|key| {
            let keyed: serde_json::Value = serde_json::from_str(key.strip_prefix("k:")?).ok()?;
            Some(keyed.get("type")?.as_str()?.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    impl NodeCondition {
        #[track_caller]
        fn assert_is(&self, status: Status, reason: &str) {
            assert_eq!(
                (self.status, self.reason.as_str()),
                (status, reason),
                "{self:?}"
            );
        }
    }

    fn finding(
        detector: &'static str,
        condition: &'static str,
        status: Status,
        reason: &str,
    ) -> Finding {
        Finding::new(
            detector,
            condition,
            status,
            reason,
            format!("{reason} seen"),
        )
    }

    #[test]
    fn any_problem_makes_the_condition_true_with_its_reason() {
        let findings = [
            finding("interfaces", "NetworkProblem", Status::Ok, "InterfacesUp"),
            finding(
                "default-route",
                "NetworkProblem",
                Status::Problem,
                "NoDefaultRoute",
            ),
            finding("dns", "NetworkProblem", Status::Unknown, "Timeout"),
            finding(
                "reboot-required",
                "RebootRequired",
                Status::Ok,
                "NoRebootRequired",
            ),
        ];
        let conditions = aggregate(&findings);
        assert_eq!(conditions.len(), 2);
        assert_eq!(
            conditions[0],
            NodeCondition {
                type_: "NetworkProblem".into(),
                status: Status::Problem,
                reason: "NoDefaultRoute".into(),
                message: "default-route: NoDefaultRoute seen".into(),
            }
        );
        conditions[1].assert_is(Status::Ok, "NoRebootRequired");
    }

    #[test]
    fn unknown_wins_over_ok_and_ok_summarises_every_detector() {
        let unknown = aggregate(&[
            finding("interfaces", "NetworkProblem", Status::Ok, "InterfacesUp"),
            finding("dns", "NetworkProblem", Status::Unknown, "DetectorTimedOut"),
        ]);
        unknown[0].assert_is(Status::Unknown, "DetectorTimedOut");
        let ok = aggregate(&[
            finding("interfaces", "NetworkProblem", Status::Ok, "InterfacesUp"),
            finding(
                "default-route",
                "NetworkProblem",
                Status::Ok,
                "DefaultRoutePresent",
            ),
        ]);
        ok[0].assert_is(Status::Ok, "NoProblem");
        assert_eq!(
            ok[0].message,
            "default-route: DefaultRoutePresent seen; interfaces: InterfacesUp seen"
        );
    }

    #[test]
    fn skipped_checks_make_no_condition() {
        let skipped = finding("apiserver", "NetworkProblem", Status::Skipped, "NoCluster");
        assert!(aggregate([&skipped]).is_empty());
        assert!(!is_node_condition("KubeletUnregistered") && is_node_condition("NetworkProblem"));
    }

    #[test]
    fn the_order_of_findings_does_not_change_the_condition() {
        let a = finding("a", "X", Status::Problem, "A");
        let b = finding("b", "X", Status::Problem, "B");
        assert_eq!(aggregate([&a, &b]), aggregate([&b, &a]));
    }

    #[test]
    fn the_types_a_manager_owns_are_read_from_its_status_entry_only() {
        let managed: Vec<ManagedFieldsEntry> = serde_json::from_value(serde_json::json!([
            {"manager": "nodeward-agent", "operation": "Apply", "subresource": "status",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {
                 "k:{\"type\":\"RebootRequired\"}": {".": {}, "f:status": {}},
                 "k:{\"type\":\"FooProblem\"}": {".": {}, "f:status": {}}}}}},
            {"manager": "kubelet", "operation": "Update", "subresource": "status",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {
                 "k:{\"type\":\"Ready\"}": {".": {}}}}}},
            {"manager": "nodeward-agent", "operation": "Apply",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}
        ]))
        .expect("managed fields");
        assert_eq!(
            owned_types(&managed, "nodeward-agent"),
            BTreeSet::from(["FooProblem".to_owned(), "RebootRequired".to_owned()])
        );
        assert!(owned_types(&managed, "someone-else").is_empty());
    }
}
