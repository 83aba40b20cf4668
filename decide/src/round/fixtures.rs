//! The round tests' objects, as builders: `node("n0").not_ready()`,
//! `policy(json!({"maxConcurrent": 1})).slot("m0", "n0")`,
//! `maintenance("m0", "n0").created(5).phase(MaintenancePhase::Draining)`, each ending in
//! `build()`. Times are `t(seconds)` from a fixed instant (08:00 UTC).

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use nodeward_api::{
    DisruptionPolicy, MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance,
    NodeReport, maintenance::AdmissionRecord, policy::BudgetSlot,
};
use serde_json::{Value, json};

use super::Objects;

/// `seconds` after the tests' fixed instant.
pub fn t(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("timestamp")
}

/// `n` Ready nodes `n0`… labelled `pool=a`, each with an agent that wrote its heartbeat at
/// `t(100)`, under one policy `pool` allowing 2 at once.
pub fn cluster(n: usize) -> Objects {
    Objects {
        nodes: (0..n).map(|i| node(&format!("n{i}")).build()).collect(),
        policies: vec![policy(json!({"maxConcurrent": 2})).build()],
        reports: (0..n).map(|i| report(&format!("n{i}"), 100)).collect(),
        ..Objects::default()
    }
}

/// The NodeReport of `node`'s agent, its heartbeat written at `t(heartbeat)`.
pub fn report(node: &str, heartbeat: i64) -> Arc<NodeReport> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
            "metadata": {"name": node},
            "spec": {"nodeName": node},
            "status": {"heartbeatTime": t(heartbeat).to_string()},
        }))
        .expect("report"),
    )
}

/// `report` with its agent fencing the node: 60 s without the API server and most of the 10
/// agents it counts, then a 30 s watchdog.
pub fn fencing(report: Arc<NodeReport>) -> Arc<NodeReport> {
    let mut report = report.as_ref().clone();
    if let Some(status) = report.status.as_mut() {
        status.fencing = Some(nodeward_api::report::Fencing {
            device: "/dev/watchdog".into(),
            fence_after_seconds: 60,
            timeout_seconds: 30,
            agents: 10,
        });
    }
    Arc::new(report)
}

/// The Lease of `node`'s agent, renewed at `t(renewed)`.
pub fn lease(node: &str, renewed: i64) -> Arc<k8s_openapi::api::coordination::v1::Lease> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("nodeward-agent-{node}"), "namespace": "nodeward-system"},
            "spec": {"holderIdentity": node, "renewTime": format!("{}", t(renewed))},
        }))
        .expect("lease"),
    )
}

/// The NodeReport of `node`'s agent (heartbeat at `t(heartbeat)`) with its last probes of
/// `peers`: name, whether it answered, at `t(seconds)`.
pub fn report_seeing(node: &str, heartbeat: i64, peers: &[(&str, bool, i64)]) -> Arc<NodeReport> {
    let sightings: Vec<Value> = peers
        .iter()
        .map(|(peer, reachable, at)| json!({"node": peer, "reachable": reachable, "time": t(*at).to_string()}))
        .collect();
    let mut report = report(node, heartbeat).as_ref().clone();
    if let Some(status) = report.status.as_mut() {
        status.peer_sightings = serde_json::from_value(Value::Array(sightings)).expect("sightings");
        // Its peer detector runs.
        status.findings = serde_json::from_value(json!([{
            "type": "PeerConnectivityProblem", "status": "False", "reason": "PeersReachable",
            "message": "answered", "detector": "peers", "since": t(0).to_string(),
        }]))
        .expect("finding");
    }
    Arc::new(report)
}

pub struct NodeFixture(Node);

/// A Ready node (uid `uid-<name>`) labelled `pool=a`, created long before `t(0)`.
pub fn node(name: &str) -> NodeFixture {
    NodeFixture(
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": t(-10_000).to_string(), "labels": {"pool": "a"}},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                "lastTransitionTime": t(-5_000).to_string()}]},
        }))
        .expect("node"),
    )
}

impl NodeFixture {
    /// NotReady since long before `t(0)`.
    pub fn not_ready(mut self) -> Self {
        for c in self
            .0
            .status
            .iter_mut()
            .flat_map(|s| s.conditions.iter_mut().flatten())
        {
            c.status = "False".into();
        }
        self
    }

    /// With the condition `type_` at `status` (added to the others).
    pub fn condition(mut self, type_: &str, status: &str) -> Self {
        let condition = serde_json::from_value(json!({"type": type_, "status": status,
            "lastTransitionTime": t(-5_000).to_string()}))
        .expect("condition");
        if let Some(s) = self.0.status.as_mut() {
            s.conditions.get_or_insert_default().push(condition);
        }
        self
    }

    /// Tainted `key` (NoSchedule), as another actor that disrupts it taints it.
    pub fn tainted(mut self, key: &str) -> Self {
        let taint =
            serde_json::from_value(json!({"key": key, "effect": "NoSchedule"})).expect("taint");
        self.0
            .spec
            .get_or_insert_default()
            .taints
            .get_or_insert_default()
            .push(taint);
        self
    }

    /// Cordoned without nodeward's record of it (an admin's cordon).
    pub fn cordoned(mut self) -> Self {
        self.0.spec.get_or_insert_default().unschedulable = Some(true);
        self
    }

    /// Created at `t(seconds)` and never Ready (no status yet).
    pub fn new_at(mut self, seconds: i64) -> Self {
        self.0.metadata.creation_timestamp = Some(Time(t(seconds)));
        self.0.metadata.labels = None;
        self.0.status = None;
        self
    }

    pub fn build(self) -> Arc<Node> {
        Arc::new(self.0)
    }
}

pub struct PolicyFixture(DisruptionPolicy);

/// The policy `pool` (generation 3) with `spec`.
pub fn policy(spec: Value) -> PolicyFixture {
    PolicyFixture(
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": "pool", "generation": 3, "resourceVersion": "7"},
            "spec": spec,
        }))
        .expect("policy"),
    )
}

impl PolicyFixture {
    /// Holding a budget slot for maintenance `name` (uid `uid-<name>`) of `node`.
    pub fn slot(mut self, name: &str, node: &str) -> Self {
        self.0
            .status
            .get_or_insert_with(Default::default)
            .slots
            .push(budget_slot(name, node));
        self
    }

    pub fn build(self) -> Arc<DisruptionPolicy> {
        Arc::new(self.0)
    }
}

/// The slot maintenance `name` (uid `uid-<name>`) of `node` holds since `t(0)`.
pub fn budget_slot(name: &str, node: &str) -> BudgetSlot {
    BudgetSlot {
        maintenance: name.to_owned(),
        uid: format!("uid-{name}"),
        node_name: node.to_owned(),
        admitted_at: Time(t(0)),
    }
}

pub struct MaintenanceFixture(NodeMaintenance);

/// A pending Reboot maintenance `name` (uid `uid-<name>`) of `node`, created at `t(0)`.
pub fn maintenance(name: &str, node: &str) -> MaintenanceFixture {
    MaintenanceFixture(
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": t(0).to_string()},
            "spec": {"nodeName": node, "reason": "Reboot", "action": "Reboot"},
        }))
        .expect("maintenance"),
    )
}

impl MaintenanceFixture {
    /// Created at `t(seconds)`.
    pub fn created(mut self, seconds: i64) -> Self {
        self.0.metadata.creation_timestamp = Some(Time(t(seconds)));
        self
    }

    pub fn phase(mut self, phase: MaintenancePhase) -> Self {
        self.0.status.get_or_insert_with(Default::default).phase = phase;
        self
    }

    /// In `phase` since `t(seconds)`, as its history records.
    pub fn entered(mut self, phase: MaintenancePhase, seconds: i64) -> Self {
        self.0
            .status
            .get_or_insert_with(Default::default)
            .enter(phase, Time(t(seconds)));
        self
    }

    /// Ended in `phase` at `t(seconds)` by its agent's clock (`status.finishedAt`), with `reason`.
    pub fn finished(mut self, phase: MaintenancePhase, seconds: i64, reason: &str) -> Self {
        let status = self.0.status.get_or_insert_with(Default::default);
        status.enter(phase, Time(t(seconds)));
        status.finished_at = Some(Time(t(seconds)));
        status.reason = Some(reason.to_owned());
        self
    }

    /// Seen by the coordinator in `phase` since `t(seconds)` (its deadline record).
    pub fn seen(mut self, phase: MaintenancePhase, seconds: i64) -> Self {
        self.0.status.get_or_insert_with(Default::default).deadline =
            Some(nodeward_api::maintenance::PhaseDeadline {
                phase,
                since: Some(Time(t(seconds))),
                time: Time(t(seconds)),
                then: String::new(),
            });
        self
    }

    /// Admitted at `t(0)` by coordinator `c` under `policies`.
    pub fn admitted_by(mut self, policies: &[&str]) -> Self {
        self.0.status.get_or_insert_with(Default::default).admission = Some(AdmissionRecord {
            policies: policies.iter().map(|p| (*p).to_owned()).collect(),
            admitted_at: Time(t(0)),
            admitted_by: "c".into(),
            node_uid: None,
        });
        self
    }

    pub fn action(mut self, action: MaintenanceAction) -> Self {
        self.0.spec.action = action;
        self
    }

    /// Admitted for the Node with `uid` (see [`Self::admitted_by`]).
    pub fn for_node_uid(mut self, uid: &str) -> Self {
        if let Some(admission) = self.0.status.as_mut().and_then(|s| s.admission.as_mut()) {
            admission.node_uid = Some(uid.to_owned());
        }
        self
    }

    /// Carrying the agent's finalizer.
    pub fn finalized(mut self) -> Self {
        self.0.metadata.finalizers =
            Some(vec![nodeward_api::labels::MAINTENANCE_FINALIZER.to_owned()]);
        self
    }

    /// Its node goes down at `seconds` whatever nodeward decides (a cloud's notice).
    pub fn deadline(mut self, seconds: i64) -> Self {
        self.0.spec.disruption_deadline = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(seconds)),
        );
        self
    }

    /// An emergency (`spec.urgent`).
    pub fn urgent(mut self) -> Self {
        self.0.spec.urgent = true;
        self
    }

    /// Asked by remediation.
    pub fn remediation(mut self) -> Self {
        self.0.spec.reason = MaintenanceReason::Remediation;
        self
    }

    pub fn build(self) -> Arc<NodeMaintenance> {
        Arc::new(self.0)
    }
}
