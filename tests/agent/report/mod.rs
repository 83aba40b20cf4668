//! `nodeward-agent run` against the real control plane: it writes its node's conditions with
//! server-side apply (leaving the kubelet's own conditions alone), clears them when the check
//! passes again, publishes Events, keeps a NodeReport owned by the Node, serves health and
//! metrics, writes nothing but its Lease while nothing changes, and stops cleanly on SIGTERM.

mod logs;
mod reporting;

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{Api, api::DeleteParams};
use nodeward_api::{
    NodeReport,
    report::{Finding, KernelLogSource, NodeReportStatus},
};
use nodeward_e2e::daemon::agent_binary;
use nodeward_e2e::{NodeSpec, TestEnv, controlplane, daemon, scratch, wait};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(30);
const USER_AGENT_PREFIX: &str = "nodeward-agent/";

/// An agent process for one node, killed if the test ends early.
struct Agent {
    child: Child,
    dir: PathBuf,
    listen: String,
}

/// What an agent under test runs: the reboot-required detector always (reading the sentinel in
/// the agent's own directory), the kubelet and kernel-log detectors as given.
struct Options<'a> {
    /// Kubeconfig to use instead of the admin one (e.g. through a proxy).
    kubeconfig: Option<PathBuf>,
    interval: &'a str,
    heartbeat: &'a str,
    kubelet: &'a str,
    kernel_log: &'a str,
    journal: &'a str,
    /// The `custom` checks (a YAML list).
    custom: &'a str,
    env: Vec<(&'a str, String)>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            interval: "500ms",
            heartbeat: "2s",
            kubelet: "{enabled: false}",
            kernel_log: "{enabled: false}",
            journal: "{}",
            custom: "[]",
            env: Vec::new(),
        }
    }
}

impl Agent {
    fn start(node: &str, env: &TestEnv, interval: &str, heartbeat: &str) -> anyhow::Result<Self> {
        Self::start_with(
            node,
            env,
            Options {
                interval,
                heartbeat,
                ..Options::default()
            },
        )
    }

    fn start_with(node: &str, test: &TestEnv, options: Options<'_>) -> anyhow::Result<Self> {
        let Options {
            kubeconfig,
            interval,
            heartbeat,
            kubelet,
            kernel_log,
            journal,
            custom,
            env,
        } = options;
        let dir = scratch::dir(&format!("nodeward-agent-{}", test.id))?;
        let config = scratch::agent_config_file(
            &dir,
            &[
                &format!("kernelLog: {kernel_log}"),
                &format!("journal: {journal}"),
                &format!("kubelet: {kubelet}"),
                &format!("custom: {custom}"),
                &format!(
                    "rebootRequired: {{interval: {interval}, timeout: {interval}, sentinelFile: {}}}",
                    dir.join("reboot-required").display()
                ),
            ],
            // No logind here; the shutdown guard has its own tests.
            &format!(
                "reporting:\n  heartbeatInterval: {heartbeat}\nshutdownGuard: {{enabled: false}}\n"
            ),
        )?;
        let listen = daemon::free_address()?;
        let log = std::fs::File::create(dir.join("agent.log"))?;
        let child = Command::new(agent_binary())
            .args([
                "run",
                "--node-name",
                node,
                "--listen",
                &listen,
                "--namespace",
                &test.namespace,
                "--kubeconfig",
            ])
            .arg(kubeconfig.unwrap_or_else(|| controlplane::shared().kubeconfig.clone()))
            .arg("--config")
            .arg(&config)
            .envs(env)
            .env("NO_COLOR", "1")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()?;
        Ok(Self { child, dir, listen })
    }

    /// What the agent logged so far.
    fn output(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    fn sentinel(&self) -> PathBuf {
        self.dir.join("reboot-required")
    }

    /// GET one of the agent's endpoints: status code and body.
    async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        daemon::get(&self.listen, path).await
    }

    /// The value of a series in the agent's /metrics.
    async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        daemon::metric(&self.listen, series).await
    }

    /// Waits until `/readyz` answers 200.
    async fn wait_ready(&self) -> anyhow::Result<()> {
        wait::eventually("the agent to be ready", TIMEOUT, || async {
            Ok((self.get("/readyz").await?.0 == 200).then_some(()))
        })
        .await
    }

    fn terminate(&mut self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        Ok(())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("the agent's log:\n{}", self.output());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn condition(node: Option<&Node>, type_: &str) -> Option<(String, String)> {
    wait::node_condition(node, type_)
}

fn has(type_: &'static str, status: &'static str) -> impl Fn(Option<&Node>) -> bool {
    move |n| condition(n, type_).is_some_and(|(s, _)| s == status)
}

/// Waits until `node` carries condition `type_` with `status`; returns the Node then.
/// A test's environment with one worker Node in `zone` and an agent for it that checks every
/// `interval` and renews its Lease every `heartbeat`.
async fn one_node_with_agent(
    test: &str,
    zone: &str,
    interval: &str,
    heartbeat: &str,
) -> anyhow::Result<(TestEnv, String, Agent)> {
    let (env, node) = TestEnv::with_worker(test, zone).await?;
    let agent = Agent::start(&node, &env, interval, heartbeat)?;
    Ok((env, node, agent))
}

async fn wait_condition(
    nodes: &Api<Node>,
    node: &str,
    type_: &'static str,
    status: &'static str,
) -> anyhow::Result<Node> {
    let what = format!("{type_}={status}");
    wait::until(nodes, node, &what, TIMEOUT, has(type_, status))
        .await?
        .ok_or_else(|| anyhow::anyhow!("node {node} disappeared"))
}

/// The reason of condition `type_` on `node`.
fn reason_of(node: &Node, type_: &str) -> Option<String> {
    condition(Some(node), type_).map(|(_, reason)| reason)
}

/// The agent's audited writes about `node`: (resource/subresource, verb).
fn agent_writes(node: &str) -> anyhow::Result<Vec<(String, String)>> {
    let field = |e: &Value, path: &str| {
        e.pointer(path)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    Ok(controlplane::audited_writes()?
        .iter()
        .filter(|e| field(e, "/userAgent").starts_with(USER_AGENT_PREFIX))
        .filter(|e| {
            let name = field(e, "/objectRef/name");
            name == node
                || name.starts_with(&format!("{node}."))
                || Some(name) == nodeward_api::fleet::lease_name(node)
        })
        .map(|e| {
            let resource = match field(e, "/objectRef/subresource").as_str() {
                "" => field(e, "/objectRef/resource"),
                sub => format!("{}/{sub}", field(e, "/objectRef/resource")),
            };
            (resource, field(e, "/verb"))
        })
        .collect())
}

/// `node`'s NodeReport once `accept` takes its status (`what` is reported).
async fn reported(
    env: &TestEnv,
    node: &str,
    what: &str,
    accept: impl Fn(&NodeReportStatus) -> bool,
) -> anyhow::Result<NodeReport> {
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    wait::until_some(&reports, node, &format!("{what} reported"), TIMEOUT, |r| {
        r.status.as_ref().is_some_and(&accept).then(|| r.clone())
    })
    .await
}
