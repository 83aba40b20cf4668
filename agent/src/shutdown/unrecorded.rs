//! The shutdown guard's taint and cordon on a node with no record of the shutdown they were
//! for (its NodeReport deleted, or its status lost, while the node went down): found when the
//! guard reaches logind and logind prepares no shutdown, and taken away as after a reboot.
//! Without this a lost record would leave the node cordoned for good.

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, runtime::events::EventType};
use nodeward_api::labels::{SHUTDOWN_CORDON_BY, SHUTDOWN_TAINT};
use nodeward_runtime::{ApiError, cordon};

/// The note of the Event that says the node was restored.
const RESTORED: &str = "the node carried the shutdown guard's taint with no record of its shutdown (its NodeReport was deleted or its status lost) and no shutdown is under way: the agent's taint and cordon are removed";

/// Whether `node` carries the guard's taint (only the guard puts it there).
pub fn carries_shutdown_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == SHUTDOWN_TAINT))
}

/// Takes away what a shutdown with no record left on `node`: the taint, and the cordon if the
/// node's own record of it (`nodeward.io/cordoned-by: shutdown`) says the guard made it. The
/// Event to publish about it, if there was anything to take away: a failure too (a write the
/// cluster refused is shown on the Node), after which the node keeps them until the guard
/// reaches logind again (an agent or logind restart).
pub async fn restore(client: &Client, node: &str) -> Option<(EventType, &'static str, String)> {
    match take_away(client, node).await {
        Ok(true) => Some((EventType::Normal, "NodeRestored", RESTORED.to_owned())),
        Ok(false) => None,
        Err(e) => {
            tracing::warn!(error = %e, "restoring a node left by a shutdown with no record");
            let note = format!("taking away the shutdown taint left with no record failed: {e}");
            Some((EventType::Warning, "NodeNotRestored", note))
        }
    }
}

async fn take_away(client: &Client, node: &str) -> Result<bool, ApiError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get_opt(node)
        .await
        .map_err(|e| ApiError::new("reading", format!("node {node}"), e))?;
    if !current.as_ref().is_some_and(carries_shutdown_taint) {
        return Ok(false);
    }
    cordon::undo_left_by(client, node, SHUTDOWN_TAINT, SHUTDOWN_CORDON_BY, true).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(taints: serde_json::Value) -> Node {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "n"}, "spec": {"taints": taints}}),
        )
        .expect("a node")
    }

    #[test]
    fn only_the_guards_taint_counts() {
        assert!(carries_shutdown_taint(&node(serde_json::json!([
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": "nodeward.io/shutdown", "effect": "NoSchedule"}]))));
        assert!(!carries_shutdown_taint(&node(serde_json::json!([
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": "nodeward.io/maintenance", "effect": "NoSchedule"}]))));
        assert!(!carries_shutdown_taint(&node(serde_json::json!(null))));
    }
}
