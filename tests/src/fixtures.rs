//! The nodeward objects tests and benches create, labelled as this test's so that its
//! cleanup removes them.

use anyhow::Context;
use kube::{Api, api::PostParams};
use nodeward_api::{DisruptionPolicy, NodeMaintenance};
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

    /// Creates the NodeMaintenance `name` of `node`, asking for `action` for `reason`
    /// (`requestedBy: e2e`).
    pub async fn create_maintenance(
        &self,
        name: &str,
        node: &str,
        reason: &str,
        action: &str,
    ) -> anyhow::Result<()> {
        let maintenance = maintenance(name, node, reason, action, &self.id)?;
        Api::<NodeMaintenance>::all(self.client.clone())
            .create(&PostParams::default(), &maintenance)
            .await
            .with_context(|| format!("creating NodeMaintenance {name}"))?;
        Ok(())
    }
}

/// The NodeMaintenance `name` of `node`, asking for `action` for `reason` (`requestedBy:
/// e2e`), labelled as test `test`'s.
pub fn maintenance(
    name: &str,
    node: &str,
    reason: &str,
    action: &str,
    test: &str,
) -> anyhow::Result<NodeMaintenance> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name, "labels": {TEST_LABEL: test}},
        "spec": {"nodeName": node, "reason": reason, "action": action, "requestedBy": "e2e"},
    }))?)
}
