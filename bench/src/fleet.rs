//! The simulated cluster of the fleet benchmark (`bench/src/bin/fleet.rs`): nodes dressed as
//! real ones under a kwok that keeps the kubelet's rhythm, and the simulated agents of the
//! nodes no real agent runs on (their liveness, their part in a rolling reboot).

use std::{
    collections::HashSet,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::watcher,
};
use nodeward_api::{MaintenancePhase, NodeMaintenance};
use nodeward_e2e::{TestEnv, controlplane, daemon::Daemon, env::TEST_LABEL};
use serde_json::json;

/// The address of node `index`'s agent: the real agents each have their own address on this
/// machine's loopback interface ([`AgentAddresses`]); a simulated node shares a real agent's,
/// so that whichever peer an agent samples answers.
pub fn agent_address(index: usize, agents: usize) -> String {
    let real = index % agents;
    format!("10.254.{}.{}", real / 250, real % 250 + 1)
}

/// The real agents' addresses on the loopback interface (not 127.0.0.0/8, which an
/// EndpointSlice may not hold), removed when dropped. Needs root.
pub struct AgentAddresses(Vec<String>);

impl AgentAddresses {
    pub fn add(agents: usize) -> anyhow::Result<Self> {
        let mut added = Vec::new();
        for i in 0..agents {
            let address = format!("{}/32", agent_address(i, agents));
            let out = std::process::Command::new("ip")
                .args(["addr", "replace", &address, "dev", "lo"])
                .output()?;
            anyhow::ensure!(
                out.status.success(),
                "ip addr replace {address} dev lo (the fleet benchmark needs root): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            added.push(address);
        }
        Ok(Self(added))
    }
}

impl Drop for AgentAddresses {
    fn drop(&mut self) {
        for address in &self.0 {
            let _ = std::process::Command::new("ip")
                .args(["addr", "del", address, "dev", "lo"])
                .output();
        }
    }
}

/// Makes each node look like a real one: labelled as running an agent, an InternalIP where an
/// agent answers probes, and 50 images in its status (a kubelet reports up to 50).
pub async fn make_real(env: &TestEnv, names: &[String], agents: usize) -> anyhow::Result<()> {
    let nodes = env.nodes();
    let images: Vec<serde_json::Value> = (0..50)
        .map(|k| {
            json!({
                "names": [
                    format!("registry.example.com/team-{k}/service-{k}@sha256:{:064x}", k * 7919),
                    format!("registry.example.com/team-{k}/service-{k}:v1.{k}.3"),
                ],
                "sizeBytes": 50_000_000 + k * 1_000_003,
            })
        })
        .collect();
    nodeward_e2e::concurrently(names.iter().enumerate(), 16, |(i, name)| {
        let nodes = nodes.clone();
        let images = images.clone();
        async move {
            let labels =
                json!({"metadata": {"labels": {nodeward_api::labels::AGENT_LABEL: "true"}}});
            nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(&labels))
                .await
                .with_context(|| format!("labelling node {name}"))?;
            let status = json!({"status": {
                "addresses": [
                    {"type": "InternalIP", "address": agent_address(i, agents)},
                    {"type": "Hostname", "address": name},
                ],
                "images": images,
            }});
            nodes
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .with_context(|| format!("dressing node {name}"))?;
            anyhow::Ok(())
        }
    })
    .await?;
    Ok(())
}

/// The kwok annotation value of the benchmark's nodes.
pub const KWOK: &str = "kubelet-rhythm";

/// A kwok of the benchmark's own for its nodes: each renews its Lease and reports its status
/// every `interval`, as a kubelet does. Stops when dropped.
pub fn kubelet_rhythm_kwok(env: &TestEnv, interval: Duration) -> anyhow::Result<Daemon> {
    let root = nodeward_e2e::repo_root();
    let bin = std::process::Command::new(root.join("tests/controlplane/build.sh")).output()?;
    anyhow::ensure!(bin.status.success(), "tests/controlplane/build.sh failed");
    let kwok = PathBuf::from(String::from_utf8(bin.stdout)?.trim()).join("kwok");
    let millis = interval.as_millis();
    let stages = std::fs::read_to_string(root.join("bench/kwok/kubelet-rhythm.yaml"))?
        // kwok waits a random time between the two: 1x to 1.1x the interval.
        .replace("HEARTBEAT_JITTER_MS", &(millis * 11 / 10).to_string())
        .replace("HEARTBEAT_MS", &millis.to_string());
    let config = std::env::temp_dir().join(format!("nodeward-fleet-kwok-{}.yaml", env.id));
    std::fs::write(&config, stages)?;
    let state = &controlplane::shared().state_dir;
    Daemon::start_plain(
        kwok.to_str().context("kwok path is not UTF-8")?,
        &format!("{}-kwok", env.id),
        &[
            "--kubeconfig".into(),
            state.join("kwok.kubeconfig").display().to_string(),
            "--config".into(),
            config.display().to_string(),
            "-v".into(),
            "WARN".into(),
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector".into(),
            format!("{}={KWOK}", nodeward_e2e::env::KWOK_NODE_ANNOTATION),
            "--node-lease-duration-seconds".into(),
            "40".into(),
            "--node-ip".into(),
            "10.251.0.1".into(),
            "--server-address".into(),
            nodeward_e2e::daemon::free_address()?,
        ],
    )
}

/// The liveness a simulated agent writes: its Lease (this version) or, as agents before it
/// did, its NodeReport's heartbeat (`--liveness report`, to measure those).
pub mod liveness {
    use std::time::Duration;

    use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
    use kube::{
        Api,
        api::{Patch, PatchParams},
    };
    use nodeward_api::{NodeReport, fleet::lease_name};
    use nodeward_e2e::TestEnv;
    use serde_json::json;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
    pub enum Kind {
        Lease,
        Report,
    }

    /// The NodeReports of `nodes` and their Leases, renewed now.
    pub async fn first(env: &TestEnv, nodes: &[String]) -> anyhow::Result<()> {
        env.heartbeats(nodes).await
    }

    /// Writes each node's liveness every `interval`, spread evenly.
    pub async fn keep(
        client: kube::Client,
        namespace: String,
        nodes: Vec<String>,
        interval: Duration,
        kind: Kind,
    ) {
        let reports: Api<NodeReport> = Api::all(client.clone());
        let leases: Api<Lease> = Api::namespaced(client, &namespace);
        let mut tick = tokio::time::interval(interval.div_f64(nodes.len().max(1) as f64));
        for node in nodes.iter().cycle() {
            tick.tick().await;
            let now = MicroTime(jiff::Timestamp::now());
            let _ = match kind {
                Kind::Report => reports
                    .patch_status(
                        node,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"heartbeatTime": now}})),
                    )
                    .await
                    .map(|_| ()),
                Kind::Lease => leases
                    .patch(
                        &lease_name(node).unwrap_or_default(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"renewTime": now}})),
                    )
                    .await
                    .map(|_| ()),
            };
        }
    }
}

/// Plays the simulated nodes' agents in a rolling reboot: an admitted maintenance drains (the
/// node cordoned and tainted), acts (the node NotReady for `reboot`), and succeeds (the node
/// Ready and uncordoned). Counts the admissions it saw.
pub fn simulate_reboots(
    env: &TestEnv,
    maintenances: Api<NodeMaintenance>,
    reboot: Duration,
    admitted: Arc<Mutex<usize>>,
) -> tokio::task::JoinHandle<()> {
    let nodes = env.nodes();
    let selector = format!("{TEST_LABEL}={}", env.id);
    let taken: Arc<Mutex<HashSet<String>>> = Arc::default();
    let patcher = maintenances.clone();
    tokio::spawn(
        watcher(maintenances, watcher::Config::default().labels(&selector)).for_each(
            move |event| {
                if let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = event
                    && m.phase() == MaintenancePhase::Admitted
                    && taken.lock().is_ok_and(|mut t| t.insert(m.name_any()))
                {
                    *admitted.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                    tokio::spawn(reboot_one(
                        patcher.clone(),
                        nodes.clone(),
                        m.name_any(),
                        m.spec.node_name.clone(),
                        reboot,
                    ));
                }
                futures::future::ready(())
            },
        ),
    )
}

async fn reboot_one(
    maintenances: Api<NodeMaintenance>,
    nodes: Api<Node>,
    name: String,
    node: String,
    reboot: Duration,
) {
    let phase = |phase: &str| json!({"status": {"phase": phase, "finishedAt": (phase == "Succeeded").then(|| jiff::Timestamp::now().to_string())}});
    let ready = |status: &str| {
        let now = jiff::Timestamp::now().to_string();
        json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": "Reboot", "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
    };
    let cordon = |on: bool| json!({"spec": {"unschedulable": on, "taints": if on { json!([{"key": "nodeward.io/maintenance", "effect": "NoSchedule"}]) } else { json!([]) }}});
    let steps: Vec<(
        Duration,
        serde_json::Value,
        Option<serde_json::Value>,
        Option<serde_json::Value>,
    )> = vec![
        (Duration::ZERO, phase("Draining"), None, Some(cordon(true))),
        (
            Duration::from_secs(1),
            phase("Acting"),
            Some(ready("Unknown")),
            None,
        ),
        (
            reboot,
            phase("Succeeded"),
            Some(ready("True")),
            Some(cordon(false)),
        ),
    ];
    for (wait, status, node_status, node_spec) in steps {
        tokio::time::sleep(wait).await;
        if let Some(s) = node_status {
            let _ = nodes
                .patch_status(&node, &PatchParams::default(), &Patch::Strategic(&s))
                .await;
        }
        if let Some(s) = node_spec {
            let _ = nodes
                .patch(&node, &PatchParams::default(), &Patch::Merge(&s))
                .await;
        }
        if maintenances
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .is_err()
        {
            return;
        }
    }
}
