//! The nodeward objects tests and benches create, labelled as this test's so that its
//! cleanup removes them.

use anyhow::Context;
use k8s_openapi::{
    api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use nodeward_api::{DisruptionPolicy, NodeMaintenance, NodeReport};
use serde_json::{Value, json};

use crate::{TestEnv, env::TEST_LABEL};

impl TestEnv {
    /// Creates the DisruptionPolicy `<test id>-<name>` with `spec`, over this test's nodes
    /// unless `spec` names a `nodeSelector`; returns its name.
    pub async fn create_policy(&self, name: &str, mut spec: Value) -> anyhow::Result<String> {
        let name = format!("{}-{name}", self.id);
        if spec.get("nodeSelector").is_none() {
            spec["nodeSelector"] = json!({"matchLabels": {TEST_LABEL: self.id}});
        }
        let policy: DisruptionPolicy = serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": name, "labels": {TEST_LABEL: self.id}},
            "spec": spec,
        }))?;
        Api::<DisruptionPolicy>::all(self.client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .with_context(|| format!("creating DisruptionPolicy {name}"))?;
        Ok(name)
    }

    /// Gives each of `nodes` a NodeReport (created if missing) and a Lease renewed now, as
    /// their agents would: for tests in which no agent runs but the coordinator must see one
    /// alive, since it admits nothing to a node without (`deadlines.agentHeartbeat`).
    pub async fn heartbeats(&self, nodes: &[String]) -> anyhow::Result<()> {
        self.heartbeats_at(nodes, Timestamp::now()).await
    }

    /// As [`TestEnv::heartbeats`], the Leases last renewed at `at` (in the past: an agent
    /// silent since).
    pub async fn heartbeats_at(&self, nodes: &[String], at: Timestamp) -> anyhow::Result<()> {
        let reports: Api<NodeReport> = Api::all(self.client.clone());
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        for node in nodes {
            if reports.get_opt(node).await?.is_none() {
                let report: NodeReport = serde_json::from_value(json!({
                    "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
                    "metadata": {"name": node, "labels": {TEST_LABEL: self.id}},
                    "spec": {"nodeName": node},
                }))?;
                reports
                    .create(&PostParams::default(), &report)
                    .await
                    .with_context(|| format!("creating NodeReport {node}"))?;
            }
            let name = nodeward_api::fleet::lease_name(node)
                .with_context(|| format!("node name {node} too long for a Lease"))?;
            let lease: Lease = serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "labels": {nodeward_api::fleet::LEASE_LABEL: "true"}},
                "spec": {"holderIdentity": node, "renewTime": MicroTime(at)},
            }))?;
            crate::env::apply(&leases, "Lease", &name, &lease).await?;
        }
        Ok(())
    }

    /// Creates the NodeMaintenance `name` of `node`, asking for `action` for `reason`
    /// (`requestedBy: e2e`).
    pub async fn create_maintenance(
        &self,
        name: &str,
        node: &str,
        reason: &str,
        action: &str,
    ) -> anyhow::Result<()> {
        let spec = MaintenanceSpec {
            node,
            reason,
            action,
        };
        create_maintenance(&self.client, name, spec, (TEST_LABEL, &self.id)).await
    }

    /// A ValidatingAdmissionPolicy of the cluster's own beside the chart's, named `name` after
    /// the test (and labelled as its release, so that its cleanup deletes it): requests to
    /// `resource_rules` for which `when` holds are refused with `message` unless `allowed`
    /// holds. The API server enforces it a moment later: wait for a refusal before relying on
    /// it.
    pub async fn refusing_policy(
        &self,
        name: &str,
        resource_rules: Value,
        when: &str,
        allowed: &str,
        message: &str,
    ) -> anyhow::Result<()> {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let name = format!("{}-{name}", self.id);
        let metadata = json!({"name": name, "labels": {"app.kubernetes.io/instance": self.id}});
        crate::env::apply(
            &Api::<ValidatingAdmissionPolicy>::all(self.client.clone()),
            "ValidatingAdmissionPolicy",
            &name,
            &json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                "metadata": metadata,
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": resource_rules},
                    "matchConditions": [{"name": "this-test", "expression": when}],
                    "validations": [{"expression": allowed, "message": message}],
                },
            }),
        )
        .await?;
        crate::env::apply(
            &Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone()),
            "ValidatingAdmissionPolicyBinding",
            &name,
            &json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": metadata,
                "spec": {"policyName": name, "validationActions": ["Deny"]},
            }),
        )
        .await?;
        Ok(())
    }

    /// Merges `spec` into the DisruptionPolicy `name`'s spec, as an operator's edit would;
    /// returns the policy's new generation.
    pub async fn merge_policy_spec(&self, name: &str, spec: Value) -> anyhow::Result<i64> {
        let policy = Api::<DisruptionPolicy>::all(self.client.clone())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .with_context(|| format!("patching the spec of DisruptionPolicy {name}"))?;
        policy
            .metadata
            .generation
            .with_context(|| format!("DisruptionPolicy {name} has no generation"))
    }

    /// Merges `status` into the NodeMaintenance `name`'s status, as whoever may write it (an
    /// agent, the coordinator, or a forger) would: for tests that play the other daemon.
    pub async fn merge_maintenance_status(&self, name: &str, status: Value) -> anyhow::Result<()> {
        Api::<NodeMaintenance>::all(self.client.clone())
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .with_context(|| format!("patching the status of NodeMaintenance {name}"))?;
        Ok(())
    }
}

/// What a test asks of a node: `action` on `node` for `reason`.
pub struct MaintenanceSpec<'a> {
    pub node: &'a str,
    pub reason: &'a str,
    pub action: &'a str,
}

/// Creates the NodeMaintenance `name` asking for `spec` (`requestedBy: e2e`), labelled `label`
/// = `test` (the end-to-end tests' label and a test's id, or the lab's and a turn's).
pub async fn create_maintenance(
    client: &kube::Client,
    name: &str,
    spec: MaintenanceSpec<'_>,
    (label, test): (&str, &str),
) -> anyhow::Result<()> {
    let maintenance: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name, "labels": {label: test}},
        "spec": {"nodeName": spec.node, "reason": spec.reason, "action": spec.action,
                 "requestedBy": "e2e"},
    }))?;
    Api::<NodeMaintenance>::all(client.clone())
        .create(&PostParams::default(), &maintenance)
        .await
        .with_context(|| format!("creating NodeMaintenance {name}"))?;
    Ok(())
}
