//! The agent's side of the workload gate: what the coordinator judged of the workloads a
//! reboot's drain evicted (`WorkloadsAvailable`), and the record that the node went back into
//! service before they were all back (`NodeRestored=True`, reason `BackInService`), so that the
//! health gate is not judged again while the agent waits.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use nodeward_api::{
    MaintenancePhase, NodeMaintenance,
    conditions::{maintenance as maintenance_conditions, workloads as reasons},
};

use super::lifecycle::Workloads;

/// The reason of `NodeRestored=True` while the maintenance waits for its workloads.
pub const BACK_IN_SERVICE: &str = "BackInService";

/// Where `m`'s evicted workloads stand: not waited for when the drain evicted none, else as
/// the coordinator's `WorkloadsAvailable` says (waiting until it says anything).
pub fn judged(m: &NodeMaintenance) -> Workloads {
    let Some(status) = m
        .status
        .as_ref()
        .filter(|s| !s.evicted_workloads.is_empty())
    else {
        return Workloads::NotNeeded;
    };
    let verdict = status
        .conditions
        .iter()
        .find(|c| c.type_ == maintenance_conditions::WORKLOADS_AVAILABLE);
    match verdict {
        Some(c) if c.status == "True" => Workloads::Available,
        Some(c) if c.reason == reasons::TIMED_OUT => Workloads::TimedOut,
        Some(c) if c.reason == reasons::TIMED_OUT_FAILED => Workloads::TimedOutFailed,
        _ => Workloads::Waiting,
    }
}

/// What the coordinator last said of the workloads (empty before it said anything).
pub fn verdict(m: &NodeMaintenance) -> String {
    m.status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == maintenance_conditions::WORKLOADS_AVAILABLE)
        })
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Whether `m` went back into service while Verifying, waiting for its workloads.
pub fn back_in_service(m: &NodeMaintenance) -> bool {
    m.phase() == MaintenancePhase::Verifying
        && m.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == maintenance_conditions::NODE_RESTORED
                    && c.status == "True"
                    && c.reason == BACK_IN_SERVICE
            })
        })
}

/// What the node is healthy after: its reboot, or an update that needed none (then it never
/// rebooted, and saying so would mislead).
pub fn healthy_after(m: &NodeMaintenance) -> &'static str {
    let no_reboot = m.status.as_ref().is_some_and(|s| {
        s.host_runs
            .iter()
            .any(|r| r.step == nodeward_api::update::HostStep::Update && r.reboot == Some(false))
    });
    if no_reboot {
        "healthy after the update, which needed no reboot"
    } else {
        "healthy after the reboot"
    }
}

/// The condition that records it.
pub fn back_in_service_condition(m: &NodeMaintenance) -> Condition {
    Condition {
        type_: maintenance_conditions::NODE_RESTORED.to_owned(),
        status: "True".to_owned(),
        reason: BACK_IN_SERVICE.to_owned(),
        message: format!(
            "{}: taint and cordon undone; waiting for the evicted workloads to be available again",
            healthy_after(m)
        ),
        observed_generation: m.metadata.generation,
        last_transition_time: Time(Timestamp::now()),
    }
}

/// How a healthy reboot ends, given where its workloads stand.
pub fn completion(workloads: Workloads, m: &NodeMaintenance) -> String {
    let healthy = healthy_after(m);
    match workloads {
        Workloads::TimedOut => format!(
            "{healthy}, the node is back in service; the evicted workloads were not all available again within the workload gate's timeout: {}",
            verdict(m)
        ),
        Workloads::Available => format!(
            "{healthy}, the node is back in service, and the workloads it evicted are available again"
        ),
        _ => format!("{healthy}, the node is back in service"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn maintenance(evicted: bool, conditions: serde_json::Value) -> NodeMaintenance {
        let workloads = if evicted {
            json!([{"kind": "ReplicaSet", "namespace": "shop", "name": "web-5d8f"}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": {"name": "w1-reboot"},
            "spec": {"nodeName": "w1", "reason": "Reboot", "action": "Reboot"},
            "status": {"phase": "Verifying", "evictedWorkloads": workloads, "conditions": conditions}
        }))
        .expect("a maintenance")
    }

    fn said(status: &str, reason: &str) -> serde_json::Value {
        json!([{"type": "WorkloadsAvailable", "status": status, "reason": reason,
                "message": "Deployment shop/web: 2 of 3 available", "lastTransitionTime": "2026-11-25T12:00:00Z"}])
    }

    #[test]
    fn a_node_an_update_left_without_a_reboot_is_not_said_to_have_rebooted() {
        let plain = maintenance(false, json!([]));
        assert_eq!(
            completion(Workloads::NotNeeded, &plain),
            "healthy after the reboot, the node is back in service"
        );
        let mut updated = plain.clone();
        updated.status.get_or_insert_default().host_runs =
            serde_json::from_value(json!([{"step": "Update", "command": "apt-get dist-upgrade",
                "startedAt": "2026-12-07T13:57:26Z", "finishedAt": "2026-12-07T13:58:18Z",
                "result": "Succeeded", "exitCode": 0, "reboot": false}]))
            .expect("a run");
        assert_eq!(
            completion(Workloads::NotNeeded, &updated),
            "healthy after the update, which needed no reboot, the node is back in service"
        );
        assert!(
            back_in_service_condition(&updated)
                .message
                .starts_with("healthy after the update, which needed no reboot: ")
        );
    }

    #[test]
    fn the_coordinators_verdict_is_read_and_nothing_evicted_needs_none() {
        assert_eq!(judged(&maintenance(false, json!([]))), Workloads::NotNeeded);
        assert_eq!(
            judged(&maintenance(true, json!([]))),
            Workloads::Waiting,
            "not judged yet"
        );
        for (status, reason, verdict) in [
            ("False", "Waiting", Workloads::Waiting),
            ("True", "Available", Workloads::Available),
            ("True", "NotChecked", Workloads::Available),
            ("False", "TimedOut", Workloads::TimedOut),
            ("False", "TimedOutFailed", Workloads::TimedOutFailed),
        ] {
            let said = maintenance(true, said(status, reason));
            assert_eq!(judged(&said), verdict, "{status} {reason}");
        }
        let timed_out = maintenance(true, said("False", "TimedOut"));
        assert!(
            completion(Workloads::TimedOut, &timed_out)
                .ends_with("Deployment shop/web: 2 of 3 available"),
            "the warning says what is short"
        );
    }

    #[test]
    fn back_in_service_is_remembered_only_while_verifying() {
        let mut m = maintenance(true, json!([]));
        assert!(!back_in_service(&m));
        let condition = back_in_service_condition(&m);
        if let Some(s) = m.status.as_mut() {
            s.conditions.push(condition);
        }
        assert!(back_in_service(&m));
        if let Some(s) = m.status.as_mut() {
            s.phase = MaintenancePhase::Succeeded;
        }
        assert!(!back_in_service(&m));
    }
}
