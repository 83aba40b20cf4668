//! Coordinated reboots (what kured does, through the coordinator): while the node reports
//! `RebootRequired` and auto-reboot is on (a policy selecting the node sets `autoReboot`, or
//! the agent's `--auto-reboot`), the agent asks for one Reboot NodeMaintenance per boot. The
//! name derives from the node and the boot id, so asking again is harmless.

use std::time::Duration;

use kube::{Client, runtime::events::EventType};
use nodeward_api::{
    MaintenanceAction, MaintenanceReason, NodeMaintenance, conditions::node::REBOOT_REQUIRED,
    labels::AGENT_FIELD_MANAGER,
};
use nodeward_runtime::{backoff::Backoff, events::Events};
use tokio::sync::watch;

use super::request::Filed;
use crate::{detect::Status, runner::Snapshot};

/// The maintenance name for a reboot of `node` in the boot `boot_id`.
pub fn name(node: &str, boot_id: &str) -> String {
    let boot: String = boot_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect::<String>()
        .to_ascii_lowercase();
    super::request::name(node, "reboot", &boot)
}

/// Whether the snapshot says a reboot is required.
pub fn required(snapshot: &Snapshot) -> bool {
    snapshot
        .values()
        .any(|c| c.finding.condition == REBOOT_REQUIRED && c.finding.status == Status::Problem)
}

/// Runs until the senders go away: asks for the reboot when both inputs say so. A request
/// the cluster refuses (its admission policy, the bound on requests per node) is shown as a
/// Warning Event on the node, once per reason, and asked again with backoff.
pub async fn run(
    client: Client,
    events: Events,
    node: String,
    boot_id: String,
    mut snapshots: watch::Receiver<Snapshot>,
    mut auto_reboot: watch::Receiver<bool>,
) {
    let name = name(&node, &boot_id);
    let about = crate::node_reference(&node);
    let mut asked = false;
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
    let mut retry = RETRY_FIRST;
    let mut shown: Option<String> = None;
    loop {
        let wanted = required(&snapshots.borrow_and_update()) && *auto_reboot.borrow_and_update();
        if wanted && !asked {
            match request(&client, &node, &name).await {
                Ok(()) => {
                    asked = true;
                    backoff.reset();
                }
                Err(why) => {
                    retry = backoff.next_delay();
                    tracing::warn!(error = %why, maintenance = %name, ?retry, "asking for a reboot failed; asking again");
                    if shown.as_ref() != Some(&why) {
                        events
                            .publish(
                                &about,
                                EventType::Warning,
                                "RebootRequest",
                                "RebootRequestRefused",
                                format!(
                                    "asking for a reboot (NodeMaintenance {name}) failed, asking again with backoff: {why}"
                                ),
                            )
                            .await;
                        shown = Some(why);
                    }
                }
            }
        }
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            changed = auto_reboot.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(retry), if wanted && !asked => {}
        }
    }
}

/// The first wait before asking again after a failure, and the longest.
const RETRY_FIRST: Duration = Duration::from_secs(30);
const RETRY_MAX: Duration = Duration::from_secs(600);

/// Files the reboot request; the error is what the API server said.
async fn request(client: &Client, node: &str, name: &str) -> Result<(), String> {
    let maintenance = NodeMaintenance::request(
        name,
        node,
        MaintenanceReason::Reboot,
        MaintenanceAction::Reboot,
        AGENT_FIELD_MANAGER,
        "the node reports RebootRequired".to_owned(),
    );
    match super::request::file(client, &maintenance).await? {
        Filed::Created => {
            tracing::info!(maintenance = %name, "reboot required: asked the coordinator for a reboot");
        }
        Filed::Existed => {
            tracing::info!(maintenance = %name, "reboot required: already asked for in this boot");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_per_node_and_boot() {
        let a = name("worker-1", "3f2a9c1e-77aa-4c0b-9f1e-5e0a8d2c4b6a");
        assert_eq!(a, "worker-1-reboot-3f2a9c1e");
        assert_eq!(a, name("worker-1", "3f2a9c1e-77aa-4c0b-9f1e-5e0a8d2c4b6a"));
        assert_ne!(a, name("worker-1", "11111111-0000-0000-0000-000000000000"));
        let long = name(&"n".repeat(300), "abc");
        assert!(long.len() <= 253, "{}", long.len());
    }
}
