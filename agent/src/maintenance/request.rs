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

/// Whether a request was created now or had been before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filed {
    Created,
    /// Asked for before (in this boot, or for this notice): as good.
    Existed,
}

/// Creates `maintenance`. The error is what the API server said, or what kept the request
/// from it.
pub async fn file(client: &Client, maintenance: &NodeMaintenance) -> Result<Filed, String> {
    let api = Api::<NodeMaintenance>::all(client.clone());
    match write::create(&api, maintenance).await {
        Outcome::Written(_) => Ok(Filed::Created),
        Outcome::Conflict(_) => Ok(Filed::Existed),
        Outcome::Gone(e) | Outcome::Failed(e) => Err(match &e.source {
            kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
            _ => e.to_string(),
        }),
    }
}
