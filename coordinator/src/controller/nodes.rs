//! What the coordinator changes on Nodes themselves, beside the maintenances: the
//! out-of-service taint of dead nodes, the pending taint, the labels around a maintenance.
//! Each is a read-modify-write of the Node with its resourceVersion, only on the Node with the
//! uid the round decided on ([`nodeward_runtime::cordon`]).

use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::EventType;
use nodeward_runtime::cordon;

use super::Controller;
use nodeward_decide::round::{self, Plan};

impl Controller {
    /// The plan's changes to Nodes: out-of-service taints, pending taints, labels.
    pub(super) async fn change_nodes(&mut self, plan: &Plan) {
        for change in &plan.out_of_service {
            self.out_of_service(change).await;
        }
        for change in &plan.pending_taints {
            self.pending_taint(change).await;
        }
        for edit in &plan.node_edits {
            self.node_edit(edit).await;
        }
    }

    async fn out_of_service(&mut self, change: &round::OutOfService) {
        let round::OutOfService {
            node,
            uid,
            on,
            message,
        } = change;
        match cordon::set_out_of_service(&self.writer.client, node, uid, *on, message).await {
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
            Err(e) => tracing::warn!(error = %e, "out-of-service taint not changed"),
        }
    }

    async fn node_edit(&mut self, edit: &round::NodeEdit) {
        let (node, labels) = (&edit.node, &edit.labels);
        let client = &self.writer.client;
        match cordon::relabel(client, node, &edit.uid, labels, &edit.annotations).await {
            Ok(true) => tracing::info!(%node, ?labels, "node labels around a maintenance"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "node labels not changed"),
        }
    }

    async fn pending_taint(&mut self, change: &round::PendingTaint) {
        let round::PendingTaint { node, uid, on } = change;
        match cordon::set_pending(&self.writer.client, node, uid, *on).await {
            Ok(true) => tracing::info!(%node, on, "pending taint"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "pending taint not changed"),
        }
    }
}
