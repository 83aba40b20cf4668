//! helm as the tests run it: built from its Go module by `tests/tools/helm.sh` (cached per
//! version), pointed at the test control plane.

use std::{path::PathBuf, process::Command};

use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

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
