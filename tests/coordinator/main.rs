//! The coordinator against the real control plane with kwok nodes: admission under a budget
//! with the history watched, two coordinators both acting as leader, leader failover, quorum,
//! `maxUnhealthy`, the node startup timeout, slots freed on node deletion, pause with
//! acknowledgement, reboot blockers (pods, Prometheus alerts), maintenance windows, dead nodes,
//! node labels, the failure budget (and a halt racing a freed slot under two leaders) and canary
//! stages.
//!
//! A coordinator watches the whole cluster, so these tests run one at a time (they share one
//! control plane with the rest of the run); each one's policy selects only its own nodes.

mod agents;
mod budgets;
mod cleanup;
mod gates;
mod halt;
mod nodes;
mod pause_and_blockers;
mod remediation;
mod rollout;
mod windows;
mod workload_gate;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use anyhow::Context;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use nix::sys::signal::Signal;
use nodeward_api::{DisruptionPolicy, MaintenancePhase, NodeMaintenance, NodeReport};
use nodeward_e2e::daemon::coordinator_binary;
use nodeward_e2e::{
    NodeSpec, Scenario, TestEnv, controlplane,
    daemon::{self, Daemon},
    env::{KWOK_NODE_ANNOTATION, TEST_LABEL},
    node_restored, wait,
};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(60);
/// The lease duration the tests run coordinators with.
const LEASE: Duration = Duration::from_secs(4);

/// The coordinator's election for these tests, as `identity`: a lease of 4 s, renewed within
/// 3 s, tried every 500 ms (the Lease is the one the chart's identity may hold).
fn election(identity: &str) -> [&str; 8] {
    [
        "--identity",
        identity,
        "--lease-duration",
        "4s",
        "--renew-deadline",
        "3s",
        "--retry-period",
        "500ms",
    ]
}

/// A coordinator as `identity` ([`election`]) with `extra` arguments, with the chart's
/// coordinator identity ([`daemon::coordinator`]), its log named for it.
async fn start(env: &TestEnv, identity: &str, extra: &[&str]) -> anyhow::Result<Daemon> {
    let chart = nodeward_e2e::identities::coordinator(env).await?;
    let mut args: Vec<&str> = vec!["run", "--lease-namespace", &env.namespace];
    // Deciding every second, unless the test says otherwise.
    if !extra.contains(&"--resync") {
        args.extend(["--resync", "1s"]);
    }
    args.push("--kubeconfig");
    let kubeconfig = chart.kubeconfig.display().to_string();
    args.extend([kubeconfig.as_str(), "--lease-name", &chart.lease_name]);
    args.extend(election(identity));
    args.extend(extra);
    let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
    Daemon::start(
        coordinator_binary(),
        &format!("{}-{identity}", env.id),
        &args,
    )
}

/// A test's opening: its environment, alone (a coordinator acts on the whole cluster), and
/// kwok nodes per `specs` whose agents report alive.
async fn scenario(test: &str, specs: &[NodeSpec]) -> anyhow::Result<TestEnv> {
    Ok(Scenario::new(test)
        .nodes(specs)
        .reporting()
        .alone()
        .start()
        .await?
        .env)
}

/// Kwok nodes per `specs` whose NodeReports say their agents are alive (a heartbeat written
/// now): no agent runs in these tests, and the coordinator admits nothing to a node without.
async fn reporting_nodes(env: &TestEnv, specs: &[NodeSpec]) -> anyhow::Result<()> {
    env.create_nodes(specs).await?;
    let names: Vec<String> = (0..specs.len()).map(|i| env.node_name(i)).collect();
    env.heartbeats(&names).await
}

/// A DrainOnly maintenance `<node>-m` of `node`; returns its name.
async fn create_maintenance(env: &TestEnv, node: &str) -> anyhow::Result<String> {
    let name = format!("{node}-m");
    env.create_maintenance(&name, node, "Manual", "DrainOnly")
        .await?;
    Ok(name)
}

fn admitted_condition(m: &NodeMaintenance) -> Option<(String, String, String)> {
    m.status.as_ref()?.conditions.iter().find_map(|c| {
        (c.type_ == "Admitted").then(|| (c.status.clone(), c.reason.clone(), c.message.clone()))
    })
}

async fn wait_admitted(
    env: &TestEnv,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<NodeMaintenance> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    wait::until(&api, name, "Admitted", timeout, |m| {
        m.is_some_and(|m| m.phase() != MaintenancePhase::Pending)
    })
    .await?
    .context("the maintenance disappeared")
}

/// Waits until `name` is admitted (the coordinator's log in the error if not), then cleans up.
async fn admitted_then_clean_up(
    env: TestEnv,
    name: &str,
    coordinator: Daemon,
) -> anyhow::Result<()> {
    wait_admitted(&env, name, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    env.cleanup_after(coordinator).await
}

async fn wait_denied(env: &TestEnv, name: &str, reason: &str) -> anyhow::Result<String> {
    wait_denied_saying(env, name, reason, "").await
}

/// Waits until `name` is denied for `reason` with a message containing `saying`; returns the
/// message.
async fn wait_denied_saying(
    env: &TestEnv,
    name: &str,
    reason: &str,
    saying: &str,
) -> anyhow::Result<String> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::until(
        &api,
        name,
        &format!("Admitted=False {reason} saying {saying:?}"),
        TIMEOUT,
        |m| {
            m.and_then(admitted_condition)
                .is_some_and(|(status, r, message)| {
                    status == "False" && r == reason && message.contains(saying)
                })
        },
    )
    .await?
    .context("the maintenance disappeared")?;
    Ok(admitted_condition(&m).map(|c| c.2).unwrap_or_default())
}

/// Plays the agents' part: marks a maintenance finished, as an agent does when done.
async fn finish(env: &TestEnv, name: &str) -> anyhow::Result<()> {
    let now = jiff::Timestamp::now().to_string();
    env.merge_maintenance_status(name, json!({"phase": "Succeeded", "finishedAt": now}))
        .await
}

/// Finishes every admitted maintenance after `hold`, as the agents would, until all of
/// `names` are finished.
async fn finish_admitted(
    env: &TestEnv,
    names: &[String],
    hold: Duration,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let deadline = Instant::now() + timeout;
    let mut admitted_at: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        let listed = api
            .list(&kube::api::ListParams::default().labels(&format!("{TEST_LABEL}={}", env.id)))
            .await?;
        let mut unfinished = 0;
        for m in &listed.items {
            let name = m.name_any();
            if !names.contains(&name) || m.phase().is_finished() {
                continue;
            }
            unfinished += 1;
            if m.phase() == MaintenancePhase::Admitted {
                let since = *admitted_at.entry(name.clone()).or_insert_with(Instant::now);
                if since.elapsed() >= hold {
                    finish(env, &name).await?;
                }
            }
        }
        if unfinished == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{unfinished} maintenances still unfinished after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Resumes `policy` with the operator's tool (`kubectl nodeward resume`); returns what it said.
async fn resume(policy: &str) -> anyhow::Result<String> {
    let cli = tokio::process::Command::new(nodeward_e2e::daemon::cli_binary())
        .arg("--kubeconfig")
        .arg(&controlplane::shared().kubeconfig)
        .args(["resume", policy])
        .output()
        .await?;
    let said = String::from_utf8_lossy(&cli.stdout).into_owned();
    anyhow::ensure!(
        cli.status.success(),
        "kubectl nodeward resume {policy}: {said}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    Ok(said)
}

async fn lease_holder(env: &TestEnv) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    let lease = nodeward_e2e::identities::coordinator(env).await?.lease_name;
    Ok(leases
        .get_opt(&lease)
        .await?
        .and_then(|l| l.spec?.holder_identity))
}

/// Sets a condition on a node as having changed at `since`.
async fn set_condition(
    env: &TestEnv,
    node: &str,
    type_: &str,
    status: &str,
    since: jiff::Timestamp,
) -> anyhow::Result<()> {
    let patch = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "status": {"conditions": [{"type": type_, "status": status, "reason": "E2e",
            "message": "set by the test", "lastTransitionTime": since.to_string(),
            "lastHeartbeatTime": jiff::Timestamp::now().to_string()}]},
    });
    env.nodes()
        .patch_status(
            node,
            &PatchParams::apply("e2e-problem").force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

fn policy_condition(p: &DisruptionPolicy, type_: &str) -> Option<(String, String, String)> {
    p.status.as_ref()?.conditions.iter().find_map(|c| {
        (c.type_ == type_).then(|| (c.status.clone(), c.reason.clone(), c.message.clone()))
    })
}

async fn remediations(env: &TestEnv) -> anyhow::Result<Vec<NodeMaintenance>> {
    let prefix = format!("{}-", env.id);
    Ok(Api::<NodeMaintenance>::all(env.client.clone())
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|m| m.spec.node_name.starts_with(&prefix))
        .filter(|m| m.spec.reason == nodeward_api::MaintenanceReason::Remediation)
        .collect())
}

async fn report_ack(
    env: &TestEnv,
    node: &str,
    policy: &str,
    generation: Option<i64>,
) -> anyhow::Result<()> {
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    if reports.get_opt(node).await?.is_none() {
        let report: NodeReport = serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
            "metadata": {"name": node}, "spec": {"nodeName": node},
        }))?;
        reports.create(&PostParams::default(), &report).await?;
    }
    let acks: Vec<Value> = generation
        .into_iter()
        .map(|g| json!({"policy": policy, "observedGeneration": g}))
        .collect();
    reports
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"pauseAcknowledgements": acks}})),
        )
        .await?;
    Ok(())
}

fn alerts(list: &[(&str, &str)]) -> String {
    let alerts: Vec<Value> = list
        .iter()
        .map(|(name, state)| json!({"labels": {"alertname": name, "severity": "warning"}, "state": state, "activeAt": "2026-11-21T10:00:00Z", "value": "1e+00"}))
        .collect();
    json!({"status": "success", "data": {"alerts": alerts}}).to_string()
}

/// Writes `node`'s agent heartbeat as `age` old: its agent went silent that long ago.
async fn silence_agent(env: &TestEnv, node: &str, age: Duration) -> anyhow::Result<()> {
    let then = jiff::Timestamp::now() - jiff::SignedDuration::try_from(age)?;
    env.heartbeats_at(&[node.to_owned()], then).await
}

/// Writes into `node`'s report that its agent fences it (as an agent with a watchdog does): 60 s
/// without the API server and most of the 10 agents it counts, then a 30 s watchdog.
async fn announce_fencing(env: &TestEnv, node: &str) -> anyhow::Result<()> {
    Api::<NodeReport>::all(env.client.clone())
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"fencing": {
                "device": "/dev/watchdog", "fenceAfterSeconds": 60, "timeoutSeconds": 30,
                "agents": 10}}})),
        )
        .await?;
    Ok(())
}

/// Writes what `peer`'s agent reports of its peers, as of now: `seen` (node, answers), and
/// that its peer detector runs; and renews its Lease.
async fn report_sightings(env: &TestEnv, peer: &str, seen: &[(&str, bool)]) -> anyhow::Result<()> {
    env.heartbeats(&[peer.to_owned()]).await?;
    let now = jiff::Timestamp::now().to_string();
    let sightings: Vec<Value> = seen
        .iter()
        .map(|(node, reachable)| json!({"node": node, "reachable": reachable, "time": now}))
        .collect();
    let probing = json!([{"type": "PeerConnectivityProblem", "status": "False", "reason": "PeersReachable",
        "message": "answered", "detector": "peers", "since": now}]);
    Api::<NodeReport>::all(env.client.clone())
        .patch_status(
            peer,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"peerSightings": sightings, "findings": probing}})),
        )
        .await?;
    Ok(())
}

/// Whether `node` carries nodeward's pending taint (PreferNoSchedule).
fn pending_tainted(node: Option<&Node>) -> bool {
    node.and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.key == nodeward_api::labels::PENDING_TAINT && t.effect == "PreferNoSchedule"
            })
        })
}

/// The node's label `key`, and whether it carries annotation `annotation`.
async fn label_of(env: &TestEnv, node: &str, key: &str) -> anyhow::Result<Option<String>> {
    Ok(env.nodes().get(node).await?.labels().get(key).cloned())
}

/// A Deployment or ReplicaSet `web` of one replica whose pod has nowhere to run: 0 of 1
/// available until it is scaled to 0.
fn web_with_nowhere_to_run() -> Value {
    json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "nodeSelector": {"e2e.nodeward.io/nowhere": "true"},
                    "containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    })
}
