//! Fencing that cannot start: a watchdog device the agent cannot use is said on the Node (a
//! Warning Event) and in the agent's gauge, and the node announces no fencing, so the
//! coordinator never marks it out of service by itself. (The watchdog itself, on a machine
//! that has one: `tests/lab/fencing.rs`.)

use std::time::Duration;

use kube::Api;
use nodeward_api::NodeReport;
use nodeward_e2e::{
    TestEnv,
    daemon::{self, agent_binary},
    scratch, wait,
};

const TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_watchdog_that_cannot_be_armed_is_a_warning_event_and_nothing_is_announced()
-> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("agent-fencing", "zone-a").await?;
    let dir = scratch::dir(&format!("nodeward-fencing-{}", env.id))?;
    // A file, not a device: it opens, and the watchdog's ioctls fail on it.
    let device = dir.join("not-a-watchdog");
    std::fs::write(&device, b"")?;
    let port = daemon::free_port()?;
    let config = scratch::agent_config_file(
        &dir,
        &[&format!(
            "peers: {{port: {port}, interval: 1s, timeout: 1s, probeTimeout: 500ms}}"
        )],
        &format!(
            "shutdownGuard: {{enabled: false}}\nreporting: {{heartbeatInterval: 2s}}\nfencing: {{enabled: true, device: {}, timeout: 10s, fenceAfter: 10s}}\n",
            device.display()
        ),
    )?;
    let agent = daemon::agent(
        agent_binary(),
        &env,
        &node,
        &config,
        daemon::NO_SYSTEM_BUS,
        "fencing",
    )?;
    agent.wait_ready(TIMEOUT).await?;

    let event = env
        .wait_event(&node, "regarding.kind=Node", "FencingNotArmed")
        .await?;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&format!(
            "setting the timeout of the watchdog {}",
            device.display()
        )) && note.contains("this node does not fence itself"),
        "{note}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(agent.metric("nodeward_fencing").await?, 0.0);
    // Reports go on, without an announcement.
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let report = wait::until(&reports, &node, "a report", TIMEOUT, |r| {
        r.and_then(|r| r.status.as_ref())
            .is_some_and(|s| s.heartbeat_time.is_some())
    })
    .await?;
    let status = report.and_then(|r| r.status).unwrap_or_default();
    assert!(status.fencing.is_none(), "{:?}", status.fencing);
    env.cleanup_after(agent).await
}
