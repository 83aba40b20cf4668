//! The chart's release in the lab: installed once as users install it, with the values every
//! lab test runs with; upgraded by a test that turns on what users may turn on (fencing), and
//! back.

use kube::{Api, Client, api::ListParams};
use nodeward_api::{DisruptionPolicy, NodeMaintenance, NodeReport};
use nodeward_e2e::{
    helm::{self, run},
    wait,
};
use serde_json::{Value, json};

use crate::support::{NAMESPACE, REBOOT, RELEASE};

/// The agent's kubelet, peer and container runtime detectors run every 5 s and report what
/// held 10 s (their defaults: 30 s and 60 s), so that a test sees a finding come and go in
/// seconds; the network's every 10 s, its DNS check resolving the lab's own name through the
/// node's resolver (`nodelab-dns.service`); one custom check runs on the host (the agent's
/// image has no shell, let alone systemctl). The two checks on the host run every 60 s (the
/// reboot sentinel's default): each is a transient systemd unit, which costs an emulated guest
/// about 0.8 s (systemd, D-Bus), and three idle VMs already keep most of the host's two cores
/// busy: every 15 s and 30 s they took about 8 % of each VM's vCPU, every 60 s about 3 %. No
/// test but the chart's sentinel waits on them.
/// Two restarts of containerd in 3 minutes are frequent: on a loaded emulated VM one restart
/// (every sandbox's state restored) took over 90 s, and the test's two crashes fell outside a
/// 90 s window.
/// The inventory reports the version of the package the patching tests publish
/// (`patching.rs`) and the pending updates. Everything else is the chart's default.
const FAST_DETECTORS: &str = r#"agent.config={
  "inventory":{"packages":["nodeward-lab-patch"],"pendingUpdates":true},
  "detectors":{
    "kubelet":{"interval":"5s","timeout":"5s","for":"10s"},
    "peers":{"interval":"5s","timeout":"5s","for":"10s"},
    "rebootRequired":{"interval":"60s","timeout":"15s"},
    "network":{"interval":"10s","timeout":"5s","for":"10s","dns":{"names":["api.nodelab.test"]}},
    "containerRuntime":{"interval":"5s","timeout":"5s","for":"10s",
      "frequentRestarts":{"count":2,"window":"3m"}},
    "custom":[{"name":"containerd-active","condition":"ContainerdDown","reason":"NotActive",
      "command":["/usr/bin/systemctl","is-active","containerd"],"onHost":true,
      "interval":"60s","timeout":"15s"}]}}"#;

/// The coordinators stay off the lab's first VM, so that tests on its lane never disrupt one
/// ([`turns`]); the rest is the chart's default affinity (one replica per node).
fn coordinators_off_the_first(nodes: &[String]) -> String {
    let theirs: Vec<&String> = nodes.iter().skip(1).collect();
    format!(
        "coordinator.affinity={}",
        json!({
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nodelab.nodeward.io/vm", "operator": "In", "values": theirs}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {
                    "app.kubernetes.io/name": "nodeward", "app.kubernetes.io/instance": RELEASE,
                    "app.kubernetes.io/component": "coordinator"}}}]},
        })
    )
}

/// The chart's agent stays off a node whose agent a test runs in host mode.
const NOT_ON_HOST_MODE_NODES: &str = r#"agent.affinity={"nodeAffinity":{
    "requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[
    {"matchExpressions":[{"key":"nodelab.nodeward.io/host-mode","operator":"DoesNotExist"}]}]}}}"#;

/// The values every lab test runs with, as `helm` arguments: [`FAST_DETECTORS`], the agent off
/// host-mode nodes, the coordinators off the first VM; the rest is the chart's default.
fn lab_values(nodes: &[String]) -> Vec<String> {
    [
        FAST_DETECTORS.to_owned(),
        NOT_ON_HOST_MODE_NODES.to_owned(),
        coordinators_off_the_first(nodes),
    ]
    .into_iter()
    .flat_map(|value| ["--set-json".to_owned(), value])
    .collect()
}

/// A test's upgrade replaces every agent at once. The chart's default (10%, at least one
/// node) replaces them one after another, and on emulated nodes each replacement took about
/// 40 s, twice per fencing turn; no lab test is about how a rollout is paced.
const ALL_AGENTS_AT_ONCE: &str =
    r#"agent.updateStrategy={"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":"100%"}}"#;

/// Upgrades the release to the lab's values and `extra` (`--set-json` values; none: back to
/// the lab's own), and waits until every agent and coordinator pod runs the new revision and is
/// Ready (`helm --wait`; the agents are replaced all at once, [`ALL_AGENTS_AT_ONCE`]).
pub async fn upgrade_chart(nodes: &[String], extra: &[&str]) -> anyhow::Result<()> {
    let mut command = helm::command()?;
    command
        .args(["upgrade", RELEASE])
        .arg(helm::chart())
        .args(["--namespace", NAMESPACE, "--wait", "--timeout", "15m"])
        .args(lab_values(nodes))
        .args(["--set-json", ALL_AGENTS_AT_ONCE]);
    for value in extra {
        command.args(["--set-json", value]);
    }
    // Minutes on emulated nodes: off the test's runtime thread, which watches meanwhile.
    tokio::task::spawn_blocking(move || run(&mut command)).await??;
    Ok(())
}

/// Whether a test that failed half-way left the release with values of its own: the agent's
/// fencing on (a watchdog armed on every node) is not for the next test.
pub fn upgraded_by_a_test() -> anyhow::Result<bool> {
    let values = run(helm::command()?.args([
        "get",
        "values",
        RELEASE,
        "--namespace",
        NAMESPACE,
        "--output",
        "json",
    ]))?;
    let values: Value = serde_json::from_str(&values)?;
    Ok(values.pointer("/agent/fencing").is_some())
}

/// The chart as users install it, once per test process, with the lab's values
/// ([`lab_values`]): the images were imported into every node's containerd under the names the
/// chart uses.
pub async fn install_chart(client: &Client, nodes: &[String]) -> anyhow::Result<()> {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_try_init(|| async {
            let releases =
                run(helm::command()?.args(["list", "--namespace", NAMESPACE, "--short"]))?;
            if !releases.lines().any(|r| r == RELEASE) {
                // Earlier tests on this control plane left the CRDs (they are kept on uninstall).
                helm::adopt_crds(client, RELEASE, NAMESPACE).await?;
                run(helm::command()?
                    .args(["install", RELEASE])
                    .arg(helm::chart())
                    .args(["--namespace", NAMESPACE, "--create-namespace"])
                    .args(lab_values(nodes)))?;
            }
            // CRDs just created answer 429 ("storage is (re)initializing") for a moment, each
            // its own (a lab run that began with the network test failed on one not waited for).
            served::<NodeMaintenance>(client).await?;
            served::<DisruptionPolicy>(client).await?;
            served::<NodeReport>(client).await
        })
        .await?;
    Ok(())
}

/// Waits until the API of `K` (a cluster-scoped kind) answers a list.
async fn served<K>(client: &Client) -> anyhow::Result<()>
where
    K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let what = format!("the {} API served", K::kind(&()));
    wait::eventually(&what, REBOOT, || async {
        api.list(&ListParams::default().limit(1)).await?;
        Ok(Some(()))
    })
    .await
}
