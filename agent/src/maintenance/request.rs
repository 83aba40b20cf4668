//! What the agent's own requests for a maintenance of its node share: a name derived from the
//! node and what it is for (so that asking again is harmless), and filing it.

use kube::{Api, Client};
use nodeward_api::NodeMaintenance;
use nodeward_runtime::write::{self, Outcome};

/// `<node>-<kind>-<key>`, a DNS subdomain of at most 253 characters (the node's name is cut
/// to fit); `key` is at most 8 lowercase letters and digits.
pub fn name(node: &str, kind: &str, key: &str) -> String {
    let suffix = format!("-{kind}-{key}");
    let keep = 253usize.saturating_sub(suffix.len());
    let node: String = node.chars().take(keep).collect();
    format!("{}{suffix}", node.trim_end_matches(['-', '.']))
}

/// Creates `maintenance`; one that exists already (asked for before) is as good. The error is
/// what the API server said, or what kept the request from it.
pub async fn file(client: &Client, maintenance: &NodeMaintenance) -> Result<(), String> {
    let api = Api::<NodeMaintenance>::all(client.clone());
    let name = maintenance.metadata.name.as_deref().unwrap_or_default();
    match write::create(&api, maintenance).await {
        Outcome::Written(_) => {
            tracing::info!(maintenance = %name, "asked the coordinator for a maintenance");
            Ok(())
        }
        Outcome::Conflict(_) => {
            tracing::info!(maintenance = %name, "already asked for");
            Ok(())
        }
        Outcome::Gone(e) | Outcome::Failed(e) => Err(match &e.source {
            kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
            _ => e.to_string(),
        }),
    }
}
