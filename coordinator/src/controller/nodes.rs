//! What the coordinator changes on Nodes themselves, beside the maintenances: the
//! out-of-service taint of dead nodes, the pending taint, the labels around a maintenance.
//! Each is a read-modify-write of the Node with its resourceVersion, only on the Node with the
//! uid the round decided on ([`nodeward_runtime::cordon`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::{ResourceExt, runtime::events::EventType};
use nodeward_runtime::{cordon, events::subject};

use super::Controller;
use crate::metrics::Applied;
use nodeward_decide::round::{self, marks};

impl Controller {
    /// Puts the out-of-service taint on a dead node, or takes nodeward's from one Ready again.
    pub(super) async fn out_of_service(&mut self, change: &round::OutOfService) -> Applied {
        let round::OutOfService {
            node,
            uid,
            on,
            message,
        } = change;
        let changed =
            cordon::set_out_of_service(&self.writer.client, node, uid, *on, message).await;
        let applied = changed_node(&changed);
        match changed {
            Ok(true) => {
                tracing::warn!(%node, on, %message, "out-of-service taint");
                let (type_, reason) = if *on {
                    (EventType::Warning, "OutOfService")
                } else {
                    (EventType::Normal, "BackInService")
                };
                let mut object = Node::default();
                object.metadata.name = Some(node.clone());
                object.metadata.uid = Some(uid.clone());
                self.writer.event(&object, type_, reason, message.clone());
            }
            Ok(false) => {}
            Err(e) => self.refused(node, uid, "its out-of-service taint", &e),
        }
        applied
    }

    /// Tells why a dead-looking node is not marked out of service (yet), once per change of
    /// why: an Event on the Node (its agent does not fence it, its fencing is not over, the
    /// budget or a pause holds it). The why counts seconds ("NotReady for 65s"), so it is
    /// compared by its subject: one Event per reason, not one per round while a node is dead.
    pub(super) fn say_out_of_service_waits(
        &mut self,
        objects: &round::Objects,
        waits: &[(String, String)],
    ) {
        let mut said = BTreeMap::new();
        for (node, why) in waits {
            let subject = subject(why);
            if self.out_of_service_said.get(node) != Some(&subject)
                && let Some(object) = objects.nodes.iter().find(|n| n.name_any() == *node)
            {
                tracing::info!(%node, %why, "a dead-looking node waits for its out-of-service taint");
                self.writer.event(
                    object.as_ref(),
                    EventType::Warning,
                    "OutOfServiceWaits",
                    why.clone(),
                );
            }
            said.insert(node.clone(), subject);
        }
        self.out_of_service_said = said;
    }

    /// Sets or removes the labels and annotations nodeward keeps on a node around its
    /// maintenance.
    pub(super) async fn node_edit(&mut self, edit: &round::NodeEdit) -> Applied {
        let (node, labels) = (&edit.node, &edit.labels);
        let client = &self.writer.client;
        let changed = cordon::relabel(client, node, &edit.uid, labels, &edit.annotations, |n| {
            edit.marks
                .as_ref()
                .is_some_and(|change| marks::apply(&mut n.metadata, change))
        })
        .await;
        let applied = changed_node(&changed);
        match changed {
            Ok(true) => {
                tracing::info!(%node, ?labels, marks = ?edit.marks, "node labels and marks around a maintenance")
            }
            Ok(false) => {}
            Err(e) => self.refused(
                node,
                &edit.uid,
                "its labels and marks around a maintenance",
                &e,
            ),
        }
        applied
    }

    /// Puts nodeward's pending taint on a node, or takes it away.
    pub(super) async fn pending_taint(&mut self, change: &round::PendingTaint) -> Applied {
        let round::PendingTaint { node, uid, on } = change;
        let changed = cordon::set_pending(&self.writer.client, node, uid, *on).await;
        let applied = changed_node(&changed);
        match changed {
            Ok(true) => tracing::info!(%node, on, "pending taint"),
            Ok(false) => {}
            Err(e) => self.refused(node, uid, "its pending taint", &e),
        }
        applied
    }

    /// A Node write that failed: logged, and when the cluster refused it (its RBAC, an
    /// admission policy or webhook, validation) also a Warning Event on the Node, so that who
    /// looks at the node sees it; a refusal does not go away by retrying. Repeats count in
    /// the Event's series.
    fn refused(&self, node: &str, uid: &str, what: &str, e: &nodeward_runtime::ApiError) {
        tracing::warn!(%node, error = %e, "{what} not changed");
        if e.is_refusal() {
            let mut object = Node::default();
            object.metadata.name = Some(node.to_owned());
            object.metadata.uid = Some(uid.to_owned());
            self.writer.event(
                &object,
                EventType::Warning,
                NODE_WRITE_REFUSED,
                format!("the API server refused nodeward-coordinator's change of {what}: {e}"),
            );
        }
    }
}

pub use nodeward_runtime::NODE_WRITE_REFUSED;

/// What became of a Node change that reports whether it changed anything.
fn changed_node(changed: &Result<bool, nodeward_runtime::ApiError>) -> Applied {
    match changed {
        Ok(true) => Applied::Written,
        Ok(false) => Applied::Unchanged,
        Err(e) => match e.code() {
            Some(404) => Applied::Gone,
            Some(409) => Applied::Conflict,
            _ => Applied::Failed,
        },
    }
}
