//! Fixtures the unit tests of the stages read from maintenances share.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodeward_api::{
    MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance,
    maintenance::{AdmissionRecord, NodeMaintenanceStatus},
};

/// `seconds` after a fixed moment.
pub fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("in range")
}

/// Reboot maintenance `name` of `node` in `phase`, admitted under `policies` 100 s before
/// `ended` (when it is not Pending and names any), finished at `ended` when its phase is a
/// finished one.
pub fn reboot(
    name: &str,
    node: &str,
    policies: &[&str],
    phase: MaintenancePhase,
    ended: i64,
) -> NodeMaintenance {
    let mut m = NodeMaintenance::request(
        name,
        node,
        MaintenanceReason::Reboot,
        MaintenanceAction::Reboot,
        "test",
        String::new(),
    );
    m.status = Some(NodeMaintenanceStatus {
        phase,
        admission: (!policies.is_empty() && phase != MaintenancePhase::Pending).then(|| {
            AdmissionRecord {
                policies: policies.iter().map(|p| (*p).to_owned()).collect(),
                admitted_at: Time(at(ended - 100)),
                admitted_by: "coordinator-0".into(),
                node_uid: None,
            }
        }),
        finished_at: phase.is_finished().then(|| Time(at(ended))),
        message: Some(format!("{name} went wrong")),
        ..NodeMaintenanceStatus::default()
    });
    m
}
