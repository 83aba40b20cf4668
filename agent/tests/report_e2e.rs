//! `nodeward-agent run` against the real control plane: it writes its node's conditions with
//! server-side apply (leaving the kubelet's own conditions alone), clears them when the check
//! passes again, keeps a NodeReport owned by the Node, and stops cleanly on SIGTERM.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodeward_api::NodeReport;
use nodeward_e2e::{NodeSpec, TestEnv, controlplane, wait};

const AGENT: &str = env!("CARGO_BIN_EXE_nodeward-agent");
const TIMEOUT: Duration = Duration::from_secs(30);

/// The agent process, killed if the test ends early.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn condition(node: Option<&Node>, type_: &str) -> Option<(String, String)> {
    let c = node?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

#[tokio::test]
async fn agent_reports_conditions_and_node_report_and_stops_on_sigterm() -> anyhow::Result<()> {
    let env = TestEnv::new("agent-report").await?;
    let node = env.node_name(0);
    env.create_nodes(&[NodeSpec::worker("zone-a")]).await?;

    let dir = std::env::temp_dir().join(format!("nodeward-report-{}", env.id));
    std::fs::create_dir_all(&dir)?;
    let sentinel: PathBuf = dir.join("reboot-required");
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "detectors:\n  network: {{enabled: false}}\n  filesystem: {{enabled: false}}\n  kubelet: {{enabled: false}}\n  rebootRequired:\n    interval: 500ms\n    timeout: 500ms\n    sentinelFile: {}\nreporting:\n  heartbeatInterval: 2s\n",
            sentinel.display()
        ),
    )?;
    let mut agent = Agent(
        Command::new(AGENT)
            .args(["run", "--node-name", &node, "--kubeconfig"])
            .arg(&controlplane::shared().kubeconfig)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?,
    );

    let nodes: Api<Node> = env.nodes();
    let has = |type_: &'static str, status: &'static str| {
        move |n: Option<&Node>| condition(n, type_).is_some_and(|(s, _)| s == status)
    };
    wait::until(
        &nodes,
        &node,
        "RebootRequired=False",
        TIMEOUT,
        has("RebootRequired", "False"),
    )
    .await?;

    std::fs::write(&sentinel, "")?;
    let tainted = wait::until(
        &nodes,
        &node,
        "RebootRequired=True",
        TIMEOUT,
        has("RebootRequired", "True"),
    )
    .await?;
    assert_eq!(
        condition(tainted.as_ref(), "RebootRequired")
            .map(|(_, r)| r)
            .as_deref(),
        Some("SentinelFilePresent")
    );
    assert_eq!(
        condition(tainted.as_ref(), "Ready")
            .map(|(s, _)| s)
            .as_deref(),
        Some("True"),
        "the kubelet's (kwok's) own conditions are untouched"
    );

    std::fs::remove_file(&sentinel)?;
    wait::until(
        &nodes,
        &node,
        "RebootRequired=False again",
        TIMEOUT,
        has("RebootRequired", "False"),
    )
    .await?;

    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let report = wait::until(
        &reports,
        &node,
        "a NodeReport with a heartbeat",
        TIMEOUT,
        |r| {
            r.and_then(|r| r.status.as_ref())
                .is_some_and(|s| s.heartbeat_time.is_some())
        },
    )
    .await?
    .expect("report");
    let owner = report
        .metadata
        .owner_references
        .as_ref()
        .and_then(|o| o.first())
        .expect("owned by its Node");
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", node.as_str())
    );
    let status = report.status.as_ref().expect("status");
    assert_eq!(status.mode, Some(nodeward_api::report::AgentMode::Host));
    assert!(
        status
            .findings
            .iter()
            .any(|f| f.detector == "reboot-required" && f.status == "False")
    );
    let first_beat = status.heartbeat_time.clone();
    wait::until(&reports, &node, "the next heartbeat", TIMEOUT, |r| {
        r.and_then(|r| r.status.as_ref())
            .is_some_and(|s| s.heartbeat_time != first_beat)
    })
    .await?;

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    let exited = wait::eventually("the agent to exit after SIGTERM", TIMEOUT, || {
        let status = agent.0.try_wait();
        async move { Ok(status?) }
    })
    .await?;
    assert!(exited.success(), "the agent exited with {exited}");
    std::fs::remove_dir_all(&dir).ok();
    env.cleanup().await
}
