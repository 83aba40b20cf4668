//! The identity the chart gives the coordinator, for every test that runs one: the chart is
//! rendered as a release named for the test (in its namespace), and only the coordinator's
//! ServiceAccount, RBAC and admission policy are applied; the daemon then runs with a token of
//! that account. A write the chart does not allow fails the test that needs it, as it would fail
//! in a cluster installed from the chart. [`crate::TestEnv::cleanup`] removes the release's
//! cluster-wide objects.

use std::{collections::HashMap, path::PathBuf, sync::Mutex};

use anyhow::Context;
use k8s_openapi::api::{authentication::v1::TokenRequest, core::v1::ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::{
    Identity, TestEnv,
    controlplane::write_kubeconfig,
    helm::{apply, render},
};

/// The kinds of the chart's documents that make an identity.
const IDENTITY_KINDS: [&str; 7] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// How long the daemon's token is valid: longer than any test.
const TOKEN_SECONDS: i64 = 3 * 3600;

/// The identities made so far, by test id.
static MADE: Mutex<Option<HashMap<String, CoordinatorIdentity>>> = Mutex::new(None);

/// The chart's coordinator identity in a test's environment.
#[derive(Clone, Debug)]
pub struct CoordinatorIdentity {
    /// A kubeconfig acting as the chart's coordinator service account.
    pub kubeconfig: PathBuf,
    /// The leader election Lease its Role lets it hold (`<release>-nodeward-coordinator`).
    pub lease_name: String,
}

/// The chart's coordinator identity for `env`, applied on first use (then the same for the
/// test's other coordinators).
pub async fn coordinator(env: &TestEnv) -> anyhow::Result<CoordinatorIdentity> {
    let made = |id: &str| {
        MADE.lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|m| m.get(id).cloned())
    };
    if let Some(identity) = made(&env.id) {
        return Ok(identity);
    }
    let identity = make(env)
        .await
        .context("applying the chart's coordinator identity")?;
    MADE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(env.id.clone(), identity.clone());
    Ok(identity)
}

async fn make(env: &TestEnv) -> anyhow::Result<CoordinatorIdentity> {
    let name = format!("{}-nodeward-coordinator", env.id);
    let documents: Vec<Value> = render(&env.id, &env.namespace, &[])?
        .into_iter()
        .filter(|d| IDENTITY_KINDS.iter().any(|k| d["kind"] == *k))
        .filter(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&name))
        })
        .collect();
    anyhow::ensure!(
        documents.iter().any(|d| d["kind"] == "ClusterRole"),
        "the chart rendered no ClusterRole {name}"
    );
    apply(&env.client, &documents).await?;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": TOKEN_SECONDS}}))?;
    let issued: TokenRequest =
        Api::<ServiceAccount>::namespaced(env.client.clone(), &env.namespace)
            .create_subresource("token", &name, &PostParams::default(), &request)
            .await
            .with_context(|| format!("a token of {name}"))?;
    let token = issued.status.map(|s| s.token).unwrap_or_default();
    let dir = crate::scratch::dir(&format!("nodeward-identity-{}", env.id))?;
    let kubeconfig = dir.join("coordinator.kubeconfig");
    write_kubeconfig(Identity::Token(token), &kubeconfig)?;
    Ok(CoordinatorIdentity {
        kubeconfig,
        lease_name: name,
    })
}

/// Forgets the identity of the test `id` and removes its kubeconfig (its objects went with the
/// test's namespace and release).
pub fn forget(id: &str) {
    let removed = MADE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|m| m.remove(id));
    if let Some(identity) = removed
        && let Some(dir) = identity.kubeconfig.parent()
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}
