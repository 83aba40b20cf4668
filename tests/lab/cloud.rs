//! A cloud's scheduled reboot on a real node, to its end. AWS's metadata emulator announces a
//! `system-reboot` event to the last VM (served at 10.0.2.101 through the lab's uplink,
//! `tests/nodelab/start.sh`), whose host-mode agent watches for cloud notices: it asks for a
//! drain ahead of the event, the coordinator admits it, and the node is drained and held. Then
//! the cloud acts: the event is completed and the machine reboots (`systemctl reboot` in the
//! guest, as the provider's reboot reaches it). The agent, back on its new boot, verifies the
//! node, ends the maintenance Succeeded with the node back in service, reports no notice, and
//! asks for nothing more for that event.

use std::time::Instant;

use jiff::{Timestamp, ToSpan};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use nodeward_api::{MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance};
use nodeward_e2e::{
    imds::{Emulator, Relay},
    wait,
};
use serde_json::json;

use crate::{
    patching::succeeded,
    support::{HOST_AGENT_CONFIG, HostCredential, Lab, Pick, REBOOT},
};

/// The emulator's event id is `instance-event-1234567890abcdef0`: the request's key.
const KEY: &str = "0abcdef0";

/// AWS's emulator with a `system-reboot` event at `not_before` in `state`, IMDSv2 only.
async fn scheduled_reboot(not_before: Timestamp, state: &str) -> anyhow::Result<Emulator> {
    let not_before = not_before.to_string();
    Emulator::start(
        json!({}),
        &[
            "events",
            "--code",
            "system-reboot",
            "--state",
            state,
            "--not-before",
            &not_before,
            "--imdsv2",
        ],
    )
    .await
}

#[tokio::test]
#[ignore = "out of ./tests/run for its time: a VM's reboot beside the other lane's, 288 to 800 s; tests/agent/cloud_notices.rs proves the notice up to the held drain in ./tests/run (BENCHMARKS.md, \"A cold ./tests/run\"); run with --ignored cloud::"]
async fn a_scheduled_reboot_drains_its_node_ahead_and_ends_succeeded_once_the_cloud_rebooted_it()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::beside(Pick::Last).await?;
    let name = format!("{node}-cloud-{KEY}");
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    wait::deleted(&maintenances, &name, REBOOT).await?;

    let not_before =
        Timestamp::from_second(Timestamp::now().as_second())?.checked_add(30.minutes())?;
    let announced = scheduled_reboot(not_before, "active").await?;
    let relay = Relay::listen(&lab.lab.state_dir.join("metadata.sock"), &announced)?;
    let config = HOST_AGENT_CONFIG.replacen(
        "detectors:\n",
        "detectors:\n  cloudNotices: {enabled: true, metadataURL: \"http://10.0.2.101\", drainAhead: 45m}\n",
        1,
    );
    let started = Instant::now();
    lab.host_mode_with(&vm, HostCredential::NodeToken, &config)
        .await?;

    // Drained ahead of the event, and held: the cloud has not acted yet.
    let held = wait::phase(&maintenances, &name, MaintenancePhase::Acting, REBOOT).await?;
    let drained_after = started.elapsed();
    assert_eq!(
        (
            held.spec.reason,
            held.spec.action,
            held.spec.disruption_deadline.as_ref().map(|t| t.0)
        ),
        (
            MaintenanceReason::Reboot,
            MaintenanceAction::DrainOnly,
            Some(not_before)
        )
    );
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let cordoned = nodes.get(&node).await?;
    assert_eq!(
        cordoned.spec.and_then(|s| s.unschedulable),
        Some(true),
        "{node} is held drained"
    );

    // The cloud acts: the event is completed and the machine reboots.
    let completed = scheduled_reboot(not_before, "completed").await?;
    relay.to(&completed);
    drop(announced);
    let boot = vm.boot_id().await?;
    let rebooted = Instant::now();
    // The guest agent may not answer once the shutdown is under way.
    let _ = vm
        .exec_with("systemctl reboot", std::time::Duration::from_secs(20))
        .await;
    vm.wait_rebooted(&boot, REBOOT).await?;

    let done = succeeded(&lab, &name, REBOOT).await?;
    let status = done.status.clone().unwrap_or_default();
    assert!(
        status
            .history
            .iter()
            .any(|h| h.phase == MaintenancePhase::Verifying),
        "verified on the new boot: {:?}",
        status.history
    );
    let ended_after = rebooted.elapsed();
    wait::until(&nodes, &node, "the node back in service", REBOOT, |n| {
        n.is_some_and(nodeward_e2e::node_restored)
    })
    .await?;
    lab.condition(&node, "CloudDisruptionScheduled", "False", "NoNotice")
        .await?;

    // Nothing more asked for that event (nor any other) on the new boot.
    let cloud_requests: Vec<String> = maintenances
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .filter(|n| n.starts_with(&format!("{node}-cloud-")))
        .collect();
    assert_eq!(cloud_requests, std::slice::from_ref(&name));
    println!(
        "{name}: drained and held {:.0} s after the agent started; Succeeded {:.0} s after the reboot was typed",
        drained_after.as_secs_f64(),
        ended_after.as_secs_f64()
    );
    drop(relay);
    Ok(())
}
