//! Cloud notices against AWS's own emulator of the instance metadata service
//! (amazon-ec2-metadata-mock, IMDSv2 only): the detector reads a spot interruption, a scheduled
//! event and a rebalance recommendation as the service writes them; a spot interruption drains
//! its node before the notice's time, admitted by the real coordinator outside its policy's
//! window; a scheduled reboot becomes a maintenance once it is `drainAhead` away. Replies that
//! are no notice (huge, malformed, slow) come from a stand-in on the same paths: a clear
//! finding, and nothing drained.

use std::time::Duration;

use anyhow::Context;
use jiff::{Timestamp, ToSpan, tz::TimeZone};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use nodeward_agent::{
    config::Config,
    detect::{Detector, Finding, Status, cloud_notices::CloudNoticesConfig},
};
use nodeward_api::{MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance};
use nodeward_e2e::{
    NodeSpec, PodOptions, TestEnv, daemon::Daemon, daemon::agent_binary, imds::Emulator, scratch,
    wait,
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

/// AWS's emulator, IMDSv2 only, run with `args` (a subcommand and its flags, space-separated).
async fn emulated(args: &str) -> anyhow::Result<Emulator> {
    let mut args: Vec<&str> = args.split(' ').collect();
    args.push("--imdsv2");
    Emulator::start(json!({}), &args).await
}

fn detector(url: &str) -> Detector {
    let mut config = Config::default();
    config.detectors.cloud_notices = CloudNoticesConfig {
        enabled: true,
        metadata_url: url.to_owned(),
        timeout: Duration::from_secs(2),
        ..CloudNoticesConfig::default()
    };
    config
        .detectors
        .enabled(None)
        .into_iter()
        .find(|d| d.name == "cloud-notices")
        .expect("the detector is on")
}

#[track_caller]
fn is(found: &Finding, status: Status, reason: &str) {
    assert_eq!(
        (found.status, found.reason.as_str()),
        (status, reason),
        "{found:?}"
    );
}

/// An RFC 3339 time `seconds` from now, to the second (as the service writes it).
fn from_now(seconds: i64) -> anyhow::Result<Timestamp> {
    let at = Timestamp::now().checked_add(seconds.seconds())?;
    Ok(Timestamp::from_second(at.as_second())?)
}

#[tokio::test]
async fn the_emulators_spot_interruption_event_and_rebalance_are_read_as_announced()
-> anyhow::Result<()> {
    let at = from_now(120)?;
    let spot = emulated(&format!("spot --action stop --time {at}")).await?;
    let found = detector(&spot.url).observe_bounded().await;
    is(&found, Status::Problem, "SpotInterruption");
    assert!(
        found.message.starts_with(&format!(
            "spot interruption: the instance is stopped at {at}; rebalance recommended at "
        )),
        "{found:?}"
    );
    assert_eq!(found.condition, "CloudDisruptionScheduled");

    let events = emulated(&format!(
        "events --code system-maintenance --not-before {at}"
    ))
    .await?;
    let found = detector(&events.url).observe_bounded().await;
    is(&found, Status::Problem, "ScheduledMaintenance");
    assert!(
        found.message.starts_with(&format!(
            "scheduled event system-maintenance (instance-event-1234567890abcdef0) between {at} and "
        )),
        "{found:?}"
    );
    let canceled = emulated("events --code system-reboot --state canceled").await?;
    is(
        &detector(&canceled.url).observe_bounded().await,
        Status::Ok,
        "NoNotice",
    );
    Ok(())
}

#[tokio::test]
async fn what_is_no_notice_is_a_clear_finding_and_drains_nothing() -> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("cloud-bad", "a").await?;
    let service = nodeward_e2e::http::Endpoint::start().await?;
    let spot = "/latest/meta-data/spot/instance-action";
    service.reply(spot, 200, &"x".repeat(100 * 1024));
    let found = detector(&service.url).observe_bounded().await;
    is(&found, Status::Unknown, "MetadataMalformed");
    assert!(
        found.message.contains("not a notice, so nothing is drained for it: the reply has 102400 bytes, more than the 65536 a notice may have"),
        "{found:?}"
    );
    service.reply(
        spot,
        200,
        r#"{"action": "terminate", "time": "in two minutes"}"#,
    );
    let found = detector(&service.url).observe_bounded().await;
    is(&found, Status::Unknown, "MetadataMalformed");
    assert!(
        found
            .message
            .contains("time \"in two minutes\" is not an RFC 3339 time"),
        "{found:?}"
    );
    service.reply(spot, 500, "boom");
    is(
        &detector(&service.url).observe_bounded().await,
        Status::Unknown,
        "MetadataError",
    );
    let notice = format!(r#"{{"action": "terminate", "time": "{}"}}"#, from_now(120)?);
    service.reply_after(spot, 200, &notice, Duration::from_secs(5));
    let slow = detector(&service.url).observe_bounded().await;
    is(&slow, Status::Unknown, "DetectorTimedOut");

    // The running agent: a slow notice is no notice, so nothing is asked for, and its
    // finding is on the Node.
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &[]).await?;
    let agent = agent(&env, &node, &service.url, "1h")?;
    coordinator.wait_ready(TIMEOUT).await?;
    agent.wait_ready(TIMEOUT).await?;
    let finding = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| {
                c.iter()
                    .find(|c| c.type_ == "CloudDisruptionScheduled")
                    .cloned()
            })
    };
    let node_now = wait::until(
        &env.nodes(),
        &node,
        "the finding on the Node",
        TIMEOUT,
        |n| n.and_then(finding).is_some(),
    )
    .await
    .with_context(|| agent.output())?;
    let condition = node_now
        .as_ref()
        .and_then(finding)
        .context("the condition")?;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_deref()),
        ("Unknown", Some("DetectorTimedOut")),
        "{condition:?}"
    );
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let asked: Vec<String> = maintenances
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|m| m.spec.node_name == node)
        .map(ResourceExt::name_any)
        .collect();
    assert!(
        asked.is_empty(),
        "nothing drained for a slow reply: {asked:?}"
    );
    env.cleanup_after((coordinator, agent)).await
}

/// The agent of `node` with cloud notices from `url` (every second), no other detector and no
/// shutdown guard.
fn agent(env: &TestEnv, node: &str, url: &str, drain_ahead: &str) -> anyhow::Result<Daemon> {
    let dir = scratch::dir(&format!("nodeward-cloud-{}", env.id))?;
    let config = scratch::agent_config_file(
        &dir,
        &[&format!(
            "cloudNotices: {{enabled: true, metadataURL: \"{url}\", interval: 1s, timeout: 800ms, drainAhead: {drain_ahead}}}"
        )],
        "shutdownGuard: {enabled: false}\n",
    )?;
    nodeward_e2e::daemon::agent(
        agent_binary(),
        env,
        node,
        &config,
        nodeward_e2e::daemon::NO_SYSTEM_BUS,
        "agent",
    )
}

/// The name the agent gives its request for a spot interruption: the node and its boot.
fn spot_request(node: &str) -> anyhow::Result<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let key: String = boot
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    Ok(format!("{node}-cloud-{key}"))
}

/// A policy over the test's nodes whose only window opens in two hours.
async fn closed_window_policy(env: &TestEnv) -> anyhow::Result<String> {
    let clock = |hours: i64| -> anyhow::Result<String> {
        let at = Timestamp::now()
            .checked_add(hours.hours())?
            .to_zoned(TimeZone::UTC);
        Ok(at.strftime("%H:%M").to_string())
    };
    let closed = json!([{"start": clock(2)?, "end": clock(3)?, "timeZone": "UTC"}]);
    env.create_policy("pool", json!({"maxConcurrent": 1, "windows": closed}))
        .await
}

#[tokio::test]
async fn a_spot_interruption_drains_its_node_before_the_notices_time_outside_any_window()
-> anyhow::Result<()> {
    let env = TestEnv::alone("cloud-spot").await?;
    env.create_nodes(&[NodeSpec::worker("a"), NodeSpec::worker("b")])
        .await?;
    let (node, other) = (env.node_name(0), env.node_name(1));
    env.replicaset("app", &node, 2, &PodOptions::default())
        .await?;
    let pods = env.running_pods("app", 2).await?;
    let policy = closed_window_policy(&env).await?;
    let at = from_now(120)?;
    let service = emulated(&format!("spot --action terminate --time {at}")).await?;
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &[]).await?;
    let agent = agent(&env, &node, &service.url, "1h")?;
    coordinator.wait_ready(TIMEOUT).await?;
    agent.wait_ready(TIMEOUT).await?;

    let name = spot_request(&node)?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::phase(&maintenances, &name, MaintenancePhase::Acting, TIMEOUT)
        .await
        .with_context(|| format!("{}\n{}", agent.output(), coordinator.output()))?;
    let drained_at = Timestamp::now();
    assert!(
        drained_at < at,
        "drained at {drained_at}, before the notice's {at}"
    );
    assert_eq!(
        (
            m.spec.reason,
            m.spec.action,
            m.spec.disruption_deadline.as_ref().map(|t| t.0)
        ),
        (
            MaintenanceReason::Shutdown,
            MaintenanceAction::DrainOnly,
            Some(at)
        )
    );
    assert_eq!(m.spec.requested_by.as_deref(), Some("nodeward-agent"));
    let status = m.status.clone().context("status")?;
    let admission = status.admission.context("admitted")?;
    assert_eq!(
        admission.policies,
        vec![policy.clone()],
        "admitted in {policy}, whose window is closed"
    );
    for pod in &pods {
        assert!(
            env.pod_evicted(&pod.name_any()).await?,
            "{} evicted",
            pod.name_any()
        );
    }
    // An operator's maintenance of another node waits for the window.
    let manual = format!("{other}-manual");
    env.create_maintenance(&manual, &other, "Manual", "DrainOnly")
        .await?;
    wait::until(
        &maintenances,
        &manual,
        "denied: outside its window",
        TIMEOUT,
        |m| {
            m.and_then(|m| m.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Admitted" && c.reason == "OutsideWindow")
            })
        },
    )
    .await?;
    env.cleanup_after((coordinator, agent)).await
}

#[tokio::test]
async fn a_scheduled_reboot_becomes_a_maintenance_once_it_is_drain_ahead_away() -> anyhow::Result<()>
{
    let (env, node) = TestEnv::alone_with_worker("cloud-event", "a").await?;
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let not_before = from_now(30 * 60)?;
    let service = emulated(&format!(
        "events --code system-reboot --not-before {not_before}"
    ))
    .await?;
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &[]).await?;
    let agent = agent(&env, &node, &service.url, "45m")?;
    coordinator.wait_ready(TIMEOUT).await?;
    agent.wait_ready(TIMEOUT).await?;
    // The emulator's event id is instance-event-1234567890abcdef0.
    let name = format!("{node}-cloud-0abcdef0");
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::phase(&maintenances, &name, MaintenancePhase::Acting, TIMEOUT)
        .await
        .with_context(|| agent.output())?;
    assert_eq!(
        (
            m.spec.reason,
            m.spec.action,
            m.spec.disruption_deadline.as_ref().map(|t| t.0)
        ),
        (
            MaintenanceReason::Reboot,
            MaintenanceAction::DrainOnly,
            Some(not_before)
        )
    );
    assert!(
        m.spec.message.as_deref().unwrap_or_default().starts_with(
            "scheduled event system-reboot (instance-event-1234567890abcdef0): the cloud acts from "
        ),
        "{:?}",
        m.spec.message
    );
    env.cleanup_after((coordinator, agent)).await
}
