//! `kubectl nodeward migrate`: what a cluster running kured or node-problem-detector is
//! configured to do, as the DisruptionPolicy and Helm values that do the same with nodeward,
//! and what cannot be carried over (with what to do instead). The reading is pure ([`kured`],
//! [`npd`]); this module reads the input (files, or the objects in the cluster) and prints.

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::ConfigMap};
use kube::{Api, Client};
use serde_json::{Value, json};

pub mod kured;
pub mod npd;

/// What a migration gives.
#[derive(Clone, Debug, PartialEq)]
pub struct Migration {
    /// The DisruptionPolicy's spec.
    pub policy_spec: Value,
    /// Helm values for the nodeward chart.
    pub values: Value,
    /// What was not carried over, and what to do instead.
    pub notes: Vec<String>,
}

/// The DaemonSet's pod spec.
pub(super) fn pod_spec(
    daemonset: &DaemonSet,
) -> Result<&k8s_openapi::api::core::v1::PodSpec, String> {
    daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .ok_or_else(|| "the DaemonSet has no pod template spec".to_owned())
}

/// The DaemonSet's container named like `program` or running an image whose name holds it.
pub(super) fn program_container(
    daemonset: &DaemonSet,
    program: &str,
) -> Result<k8s_openapi::api::core::v1::Container, String> {
    pod_spec(daemonset)?
        .containers
        .iter()
        .find(|c| {
            c.name.contains(program) || c.image.as_deref().is_some_and(|i| i.contains(program))
        })
        .cloned()
        .ok_or_else(|| format!("no {program} container (by name or image) in the DaemonSet"))
}

/// A container's command and arguments as flags, in order: `--flag=value`, `--flag value`, or a
/// bare `--switch` (`true`); words that are no flag are skipped.
pub fn container_flags(container: &k8s_openapi::api::core::v1::Container) -> Vec<(String, String)> {
    let mut words = container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .cloned()
        .peekable();
    let mut flags = Vec::new();
    while let Some(word) = words.next() {
        let Some(flag) = word.strip_prefix("--").or_else(|| word.strip_prefix('-')) else {
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => match words.peek() {
                Some(next) if !next.starts_with('-') => {
                    (flag.to_owned(), words.next().unwrap_or_default())
                }
                _ => (flag.to_owned(), "true".to_owned()),
            },
        };
        flags.push((name, value));
    }
    flags
}

/// Reads kured's DaemonSet from `file` (YAML; the first DaemonSet document in it).
pub fn read_file(file: &std::path::Path) -> Result<DaemonSet, String> {
    let text =
        std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = <Value as serde::Deserialize>::deserialize(document)
            .map_err(|e| format!("{}: not YAML: {e}", file.display()))?;
        if value.get("kind").and_then(Value::as_str) == Some("DaemonSet") {
            return serde_json::from_value(value)
                .map_err(|e| format!("{}: not a DaemonSet: {e}", file.display()));
        }
    }
    Err(format!("{}: no DaemonSet in it", file.display()))
}

/// Reads node-problem-detector's DaemonSet and the ConfigMaps in `files` (YAML documents).
pub fn read_npd_files(files: &[std::path::PathBuf]) -> Result<(DaemonSet, Vec<ConfigMap>), String> {
    let mut daemonset = None;
    let mut configmaps = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = <Value as serde::Deserialize>::deserialize(document)
                .map_err(|e| format!("{}: not YAML: {e}", file.display()))?;
            let read = |what| format!("{}: not a {what}", file.display());
            match value.get("kind").and_then(Value::as_str) {
                Some("DaemonSet") if daemonset.is_none() => {
                    daemonset = Some(
                        serde_json::from_value(value)
                            .map_err(|e| format!("{}: {e}", read("DaemonSet")))?,
                    );
                }
                Some("ConfigMap") => configmaps.push(
                    serde_json::from_value(value)
                        .map_err(|e| format!("{}: {e}", read("ConfigMap")))?,
                ),
                _ => {}
            }
        }
    }
    let daemonset = daemonset.ok_or("no DaemonSet in the --npd files")?;
    Ok((daemonset, configmaps))
}

/// Reads node-problem-detector's DaemonSet `namespace/name` and the ConfigMaps its pods mount.
pub async fn read_npd_cluster(
    client: Client,
    namespace: &str,
    name: &str,
) -> Result<(DaemonSet, Vec<ConfigMap>), String> {
    let daemonset = read_cluster(client.clone(), namespace, name).await?;
    let api = Api::<ConfigMap>::namespaced(client, namespace);
    let mut configmaps = Vec::new();
    let volumes = pod_spec(&daemonset)?.volumes.clone().unwrap_or_default();
    for source in volumes.iter().filter_map(|v| v.config_map.as_ref()) {
        let configmap = api
            .get(&source.name)
            .await
            .map_err(|e| format!("reading ConfigMap {namespace}/{}: {e}", source.name))?;
        configmaps.push(configmap);
    }
    Ok((daemonset, configmaps))
}

/// Migrates node-problem-detector's DaemonSet with its ConfigMaps: the rendered output.
pub fn from_npd(
    daemonset: &DaemonSet,
    configmaps: &[ConfigMap],
    name: &str,
) -> Result<String, String> {
    Ok(render(name, &npd::migrate(daemonset, configmaps)?))
}

/// Reads kured's DaemonSet `namespace/name` from the cluster.
pub async fn read_cluster(
    client: Client,
    namespace: &str,
    name: &str,
) -> Result<DaemonSet, String> {
    Api::<DaemonSet>::namespaced(client, namespace)
        .get(name)
        .await
        .map_err(|e| format!("reading DaemonSet {namespace}/{name}: {e}"))
}

/// The DisruptionPolicy `name` and the Helm values, as YAML documents, the notes as comments.
pub fn render(name: &str, migration: &Migration) -> String {
    let policy = json!({
        "apiVersion": "nodeward.io/v1alpha1",
        "kind": "DisruptionPolicy",
        "metadata": {"name": name},
        "spec": migration.policy_spec,
    });
    let mut out =
        String::from("# kubectl nodeward migrate: the DisruptionPolicy (kubectl apply -f)\n");
    out.push_str(&serde_yaml::to_string(&policy).unwrap_or_default());
    out.push_str("---\n# Helm values for the nodeward chart (helm install -f): as a comment, not an object\n");
    for line in serde_yaml::to_string(&migration.values)
        .unwrap_or_default()
        .lines()
    {
        out.push_str("# ");
        out.push_str(line);
        out.push('\n');
    }
    if !migration.notes.is_empty() {
        out.push_str("#\n# What differs, or is not carried over:\n");
        for note in &migration.notes {
            out.push_str("# - ");
            out.push_str(note);
            out.push('\n');
        }
    }
    out
}

/// Migrates kured's DaemonSet: the rendered output.
pub fn from_kured(daemonset: &DaemonSet, name: &str) -> Result<String, String> {
    let (flags, container) = kured::flags(daemonset)?;
    Ok(render(name, &kured::migrate(daemonset, &flags, &container)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_is_a_policy_the_api_types_read_and_the_rest_comments() {
        let ds: DaemonSet =
            serde_yaml::from_str(include_str!("testdata/kured-ds.yaml")).expect("kured's manifest");
        let out = from_kured(&ds, "kured").expect("migrated");
        let first = serde_yaml::Deserializer::from_str(&out)
            .next()
            .expect("a document");
        let policy: nodeward_api::DisruptionPolicy =
            serde::Deserialize::deserialize(first).expect("a DisruptionPolicy");
        assert_eq!(
            policy.spec.max_concurrent,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2)
        );
        assert!(policy.spec.taint_while_pending);
        assert!(out.contains("# What differs, or is not carried over:"));
        assert!(
            out.contains("#   notifyURL: https://hooks.slack.com/services/T0/B0/x"),
            "{out}"
        );
    }
}
