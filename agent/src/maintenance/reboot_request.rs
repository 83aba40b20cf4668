//! Coordinated reboots (what kured does, through the coordinator): while the node reports
//! `RebootRequired` and auto-reboot is on (a policy selecting the node sets `autoReboot`, or
//! the agent's `--auto-reboot`), the agent asks for one Reboot NodeMaintenance per boot. The
//! name derives from the node and the boot id, so asking again is harmless.

use kube::{Api, Client};
use nodeward_api::{
    MaintenanceAction, MaintenanceReason, NodeMaintenance, conditions::node::REBOOT_REQUIRED,
    labels::AGENT_FIELD_MANAGER,
};
use nodeward_runtime::write::{self, Outcome};
use tokio::sync::watch;

use crate::{detect::Status, runner::Snapshot};

/// The maintenance name for a reboot of `node` in the boot `boot_id` (a DNS subdomain of at
/// most 253 characters).
pub fn name(node: &str, boot_id: &str) -> String {
    let boot: String = boot_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect::<String>()
        .to_ascii_lowercase();
    let suffix = format!("-reboot-{boot}");
    let keep = 253usize.saturating_sub(suffix.len());
    let node: String = node.chars().take(keep).collect();
    format!("{}{suffix}", node.trim_end_matches(['-', '.']))
}

/// Whether the snapshot says a reboot is required.
pub fn required(snapshot: &Snapshot) -> bool {
    snapshot
        .values()
        .any(|c| c.finding.condition == REBOOT_REQUIRED && c.finding.status == Status::Problem)
}

/// Runs until the senders go away: asks for the reboot when both inputs say so.
pub async fn run(
    client: Client,
    node: String,
    boot_id: String,
    mut snapshots: watch::Receiver<Snapshot>,
    mut auto_reboot: watch::Receiver<bool>,
) {
    let name = name(&node, &boot_id);
    let mut asked = false;
    loop {
        let wanted = required(&snapshots.borrow_and_update()) && *auto_reboot.borrow_and_update();
        if wanted && !asked {
            asked = request(&client, &node, &name).await;
        }
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            changed = auto_reboot.changed() => if changed.is_err() { return },
            // Retry a failed request.
            _ = tokio::time::sleep(std::time::Duration::from_secs(30)), if wanted && !asked => {}
        }
    }
}

async fn request(client: &Client, node: &str, name: &str) -> bool {
    let maintenance = NodeMaintenance::request(
        name,
        node,
        MaintenanceReason::Reboot,
        MaintenanceAction::Reboot,
        AGENT_FIELD_MANAGER,
        "the node reports RebootRequired".to_owned(),
    );
    let api = Api::<NodeMaintenance>::all(client.clone());
    match write::create(&api, &maintenance).await {
        Outcome::Written(_) => {
            tracing::info!(maintenance = %name, "reboot required: asked the coordinator for a reboot");
            true
        }
        Outcome::Conflict(_) => {
            tracing::info!(maintenance = %name, "reboot required: already asked for in this boot");
            true
        }
        Outcome::Gone(e) | Outcome::Failed(e) => {
            tracing::warn!(error = %e, maintenance = %name, "asking for a reboot failed; retrying");
            false
        }
    }
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
