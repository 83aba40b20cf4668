//! The workloads the drain tests watch: busybox pods that write when they got SIGTERM to a
//! log on their node, and a watch of how each pod left as the API server saw it.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt, runtime::watcher};
use nodeward_e2e::nodelab::Vm;
use serde_json::{Value, json};

use crate::support::{BUSYBOX, TERM_LOG_DIR};

/// A Deployment of `replicas` busybox pods on `node` with `priority_class`, each writing
/// "<uptime> <pod> TERM" to the node's TERM log when it gets SIGTERM.
pub fn term_recorder(
    namespace: &str,
    name: &str,
    node: &str,
    replicas: i32,
    priority_class: Option<&str>,
) -> Value {
    let mut spec = pod_spec(node, name);
    if let Some(class) = priority_class {
        spec["priorityClassName"] = json!(class);
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    })
}

/// A DaemonSet of the same recorder, on `node` only.
pub fn term_recorder_daemonset(namespace: &str, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec(node, name)},
        },
    })
}

fn pod_spec(node: &str, group: &str) -> Value {
    // `sleep & wait` so that the trap runs as soon as the signal comes; a long sleep, because
    // every wakeup forks, which an emulated VM running thirty of these pods pays for.
    let script = format!(
        "trap 'echo $(cut -d\" \" -f1 /proc/uptime) $HOSTNAME {group} TERM >> /log/term; exit 0' TERM; \
         while :; do sleep 3600 & wait $!; done"
    );
    json!({
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 30,
        "containers": [{
            "name": "busybox", "image": BUSYBOX, "imagePullPolicy": "Never",
            "command": ["/bin/busybox", "sh", "-c", script],
            "volumeMounts": [{"name": "log", "mountPath": "/log"}],
            "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}},
        }],
        "volumes": [{"name": "log", "hostPath": {"path": TERM_LOG_DIR, "type": "DirectoryOrCreate"}}],
    })
}

/// The TERM log of a node: (uptime seconds, pod, group), in the order they were written.
pub async fn term_log(vm: &Vm) -> anyhow::Result<Vec<(f64, String, String)>> {
    let text = vm
        .exec(&format!("cat {TERM_LOG_DIR}/term 2>/dev/null"))
        .await?
        .stdout;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let uptime = words.next()?.parse().ok()?;
            let pod = words.next()?.to_owned();
            let group = words.next()?.to_owned();
            Some((uptime, pod, group))
        })
        .collect())
}

/// Clears a node's TERM log.
pub async fn clear_term_log(vm: &Vm) -> anyhow::Result<()> {
    vm.run(&format!(
        "mkdir -p {TERM_LOG_DIR} && : > {TERM_LOG_DIR}/term"
    ))
    .await?;
    Ok(())
}

/// A pod's way out as the API server showed it, on the test's clock: when it was asked to go
/// (an eviction or deletion set its deletionTimestamp, or removed it outright) and when it had
/// stopped (the kubelet reported it Succeeded or Failed, or it was removed: what a drain
/// waits for).
#[derive(Clone, Debug)]
pub struct Departure {
    /// The pod's `app` label: its workload.
    pub group: String,
    pub asked: Option<Instant>,
    pub stopped: Option<Instant>,
    /// When a drain stops waiting for it: 10 s past its grace period's end (its
    /// `deletionTimestamp`), as the agent's drain does (kubectl's
    /// `--skip-wait-for-delete-timeout=10`).
    pub let_go: Option<Instant>,
    /// The reason of its first `DisruptionTarget` condition: who reached it first
    /// (`EvictionByEvictionAPI`: an eviction; `TerminationByKubelet`: the kubelet's own
    /// graceful node shutdown).
    pub disrupted_by: Option<String>,
}

/// Starts watching the pods of `namespace`; what it saw, by pod name. Unlike the pods' own
/// SIGTERM log this times what the drain did, not how long the kubelet took to act on it.
pub fn watch_departures(
    client: &Client,
    namespace: &str,
) -> Arc<Mutex<BTreeMap<String, Departure>>> {
    let seen: Arc<Mutex<BTreeMap<String, Departure>>> = Arc::default();
    let recorded = seen.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    tokio::spawn(
        watcher(pods, watcher::Config::default()).for_each(move |event| {
            let (pod, deleted) = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                Ok(watcher::Event::Delete(p)) => (p, true),
                _ => return futures::future::ready(()),
            };
            let now = Instant::now();
            let terminal = matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            let mut seen = recorded.lock().unwrap_or_else(|p| p.into_inner());
            let entry = seen.entry(pod.name_any()).or_insert_with(|| Departure {
                group: pod.labels().get("app").cloned().unwrap_or_default(),
                asked: None,
                stopped: None,
                let_go: None,
                disrupted_by: None,
            });
            if deleted || pod.metadata.deletion_timestamp.is_some() {
                entry.asked.get_or_insert(now);
            }
            if let Some(deletion) = pod.metadata.deletion_timestamp.as_ref() {
                // The API server's second-precision time, as an instant of this clock.
                let ahead = deletion.0.duration_since(jiff::Timestamp::now());
                let by = std::time::Duration::try_from(ahead.abs()).unwrap_or_default();
                let end = if ahead.is_negative() {
                    now.checked_sub(by).unwrap_or(now)
                } else {
                    now + by
                };
                entry
                    .let_go
                    .get_or_insert(end + std::time::Duration::from_secs(10));
            }
            if entry.disrupted_by.is_none() {
                entry.disrupted_by = pod
                    .status
                    .iter()
                    .flat_map(|s| s.conditions.iter().flatten())
                    .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
                    .and_then(|c| c.reason.clone());
            }
            if deleted || terminal {
                entry.stopped.get_or_insert(now);
            }
            futures::future::ready(())
        }),
    );
    seen
}
