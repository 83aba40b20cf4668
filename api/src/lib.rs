//! nodeward's Kubernetes API (group `nodeward.io`, version `v1alpha1`): the custom resources,
//! and the names of the conditions, labels, annotations and taints nodeward uses.
//!
//! The CRD manifests in `charts/nodeward/files/crds/` are generated from these types by
//! `cargo run -p nodeward-api --bin crdgen`; a test fails when they are out of date.

// `#[kube(printcolumn(type_ = ...))]` repeats keys across columns by design.
#![allow(clippy::duplicated_attributes)]

pub mod bounds;
pub mod conditions;
pub mod crds;
pub mod drain;
mod duration;
pub mod fleet;
pub mod inventory;
pub mod labels;
pub mod maintenance;
pub mod node;
pub mod policy;
pub mod report;
pub mod selector;
pub mod update;

pub use drain::{DrainPlan, DrainStage, OnTimeout, PodRule, PodType, PriorityRange};
pub use duration::{DURATION_PATTERN, Duration, InvalidDuration};
pub use maintenance::{
    MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance, NodeMaintenanceSpec,
    NodeMaintenanceStatus, StatusPatch,
};
pub use policy::{
    DisruptionPolicy, DisruptionPolicySpec, DisruptionPolicyStatus, MaintenanceWindow,
};
pub use report::{NodeReport, NodeReportSpec, NodeReportStatus};
