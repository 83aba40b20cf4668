//! helm as the tests run it: built from its Go module by `tests/tools/helm.sh` (cached per
//! version), pointed at the test control plane.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams},
    discovery::{self, Scope},
};
use serde_json::{Value, json};

use crate::controlplane;

/// The chart in this checkout.
pub fn chart() -> PathBuf {
    crate::repo_root().join("charts/nodeward")
}

/// The helm binary.
pub fn binary() -> anyhow::Result<PathBuf> {
    let output = Command::new(crate::repo_root().join("tests/tools/helm.sh"))
        .output()
        .context("running tests/tools/helm.sh")?;
    anyhow::ensure!(
        output.status.success(),
        "tests/tools/helm.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

/// helm with the test control plane's admin kubeconfig.
pub fn command() -> anyhow::Result<Command> {
    let mut command = Command::new(binary()?);
    command
        .arg("--kubeconfig")
        .arg(&controlplane::shared().kubeconfig);
    Ok(command)
}

/// Runs `command`; its stdout, or an error with both of its outputs.
pub fn run(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// The README's one-time step before installing a release over CRDs that exist already (from
/// an install of 0.1.0, `kubectl apply`, or another release): label and annotate them so that
/// `release` in `namespace` adopts them.
pub async fn adopt_crds(client: &Client, release: &str, namespace: &str) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in nodeward_api::crds::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        if crds.get_opt(&name).await?.is_none() {
            continue;
        }
        crds.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
                "annotations": {
                    "meta.helm.sh/release-name": release,
                    "meta.helm.sh/release-namespace": namespace,
                },
            }})),
        )
        .await
        .with_context(|| format!("letting release {release} adopt CRD {name}"))?;
    }
    Ok(())
}

/// The Kubernetes version the chart is rendered for (the test control plane's).
pub const KUBE_VERSION: &str = "1.34.4";

/// `helm template` with `values` files: the rendered text.
pub fn render_text(release: &str, namespace: &str, values: &[&Path]) -> anyhow::Result<String> {
    let mut command = Command::new(binary()?);
    command.args(["template", release]).arg(chart()).args([
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
    ]);
    for file in values {
        command.arg("--values").arg(file);
    }
    run(&mut command)
}

/// The documents of a rendered (or any multi-document) YAML text.
pub fn documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

/// `helm template` with `values` files: the rendered documents.
pub fn render(release: &str, namespace: &str, values: &[&Path]) -> anyhow::Result<Vec<Value>> {
    documents(&render_text(release, namespace, values)?)
}

/// Applies every document server-side, as `kubectl apply --server-side` does.
pub async fn apply(client: &Client, documents: &[Value]) -> anyhow::Result<()> {
    let params = PatchParams::apply("nodeward-e2e-chart").force();
    for document in documents {
        let (api, name) = dynamic_api(client, document).await?;
        let patch = Patch::Apply(document);
        api.patch(&name, &params, &patch)
            .await
            .with_context(|| format!("applying {} {name}", document["kind"]))?;
    }
    Ok(())
}

/// The API of `document`'s kind (discovered), in its namespace when it has one, and its name.
pub async fn dynamic_api(
    client: &Client,
    document: &Value,
) -> anyhow::Result<(Api<DynamicObject>, String)> {
    let api_version = document["apiVersion"].as_str().context("apiVersion")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = document["kind"].as_str().context("kind")?;
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    let name = document["metadata"]["name"]
        .as_str()
        .context("name")?
        .to_owned();
    let api = match (
        capabilities.scope,
        document["metadata"]["namespace"].as_str(),
    ) {
        (Scope::Namespaced, Some(namespace)) => {
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    Ok((api, name))
}
