//! The kernel log on a real node, as the chart's agent reads it by default: from the host's
//! journal files (journald's copy of every kernel message), mounted read-only into a pod that is
//! not privileged.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::{Api, api::ListParams};
use nodeward_api::report::KernelLogSource;
use nodeward_e2e::wait;

use crate::support::{Lab, Pick, REBOOT, agent_pod};

#[tokio::test]
async fn the_chart_agent_reads_kernel_messages_from_the_hosts_journal_without_privilege()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::beside(Pick::At(0)).await?;

    let pod = agent_pod(&lab.client, &node).await?;
    let container = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .cloned()
        .unwrap_or_default();
    let security = container.security_context.unwrap_or_default();
    assert_ne!(security.privileged, Some(true), "{security:?}");
    let mounts: Vec<String> = container
        .volume_mounts
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_path)
        .collect();
    assert!(
        !mounts.iter().any(|m| m == "/dev/kmsg"),
        "no /dev/kmsg in the pod: {mounts:?}"
    );

    // An OOM kill in the real kernel log of the node (root writes a record to /dev/kmsg;
    // journald stores it as it stores the kernel's own): one of the default rules.
    let tag = format!("lab{}", std::process::id());
    vm.run(&format!(
        "echo '<3>Out of memory: Killed process 4242 ({tag}) total-vm:1kB' > /dev/kmsg"
    ))
    .await?;
    let events: Api<Event> = Api::namespaced(lab.client.clone(), "default");
    let event = wait::eventually(
        "the agent's OOMKilling Event about the node",
        REBOOT,
        || async {
            let list = events
                .list(&ListParams::default().fields(&format!("regarding.name={node}")))
                .await?;
            Ok(list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("OOMKilling")
                    && e.note.as_deref().is_some_and(|n| n.contains(&tag))
            }))
        },
    )
    .await?;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some(nodeward_api::labels::AGENT_FIELD_MANAGER),
        "{event:?}"
    );
    // Read from the journal: the NodeReport's position says so. The agent publishes the Event
    // first and records its place in the report's next write, so the position may lag it.
    let position = wait::eventually(
        "the NodeReport's kernel log position",
        Duration::from_secs(60),
        || async { Ok(lab.report(&node).await?.status.and_then(|s| s.kernel_log)) },
    )
    .await?;
    assert_eq!(position.source, KernelLogSource::Journal, "{position:?}");
    Ok(())
}
