//! Carrying out a round's plan: its effects ([`Plan::effects`]) one after another, in their
//! order, each counted by what became of it (`nodeward_coordinator_effects_total`), the time
//! spent on each a wait on the API server ([`super::api_waits`]).

use std::{collections::BTreeSet, time::Instant};

use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use nodeward_api::{MaintenancePhase, NodeMaintenance};
use nodeward_decide::round::{self, Effect, Objects, Plan, Standing};
use nodeward_runtime::write::{self, Outcome};

use super::{Controller, write::only};
use crate::metrics::{Applied, EffectLabels};

impl Controller {
    /// Writes `plan` over `objects`. `standing` is what it decided on: it stands for the next
    /// admission-only rounds once every slot and admission is written.
    pub(super) async fn carry_out(&mut self, objects: &Objects, plan: &Plan, standing: Standing) {
        let mut standing = Some(standing);
        // The maintenances (by uid) whose admission a written denial or return to Pending
        // fenced: their slots are freed by the release that follows.
        let mut fenced = BTreeSet::new();
        for effect in plan.effects() {
            let started = Instant::now();
            let applied = match effect {
                Effect::Admit { slots, admissions } => {
                    // Records its own waits on the API server.
                    let (applied, complete) =
                        self.admit_all(objects, slots, admissions, &plan.deny).await;
                    if complete {
                        self.standing = standing.take();
                    }
                    applied
                }
                Effect::Deny(denials) => self.deny_all(objects, denials, &mut fenced).await,
                Effect::Surge(work) => self.surge(objects, work).await,
                Effect::WorkloadVerdict(verdict) => self.write_verdict(objects, verdict).await,
                Effect::End(ending) => {
                    let round::Ending {
                        maintenance,
                        phase,
                        reason,
                        message,
                    } = ending;
                    self.end(objects, maintenance, *phase, reason, message)
                        .await
                }
                Effect::Supersede(s) => {
                    let message = format!(
                        "superseded by {}: a node's agent asks for one reboot at a time",
                        s.by
                    );
                    let failed = MaintenancePhase::Failed;
                    self.end(objects, &s.maintenance, failed, "Superseded", &message)
                        .await
                }
                Effect::Overdue(overdue) => {
                    let applied = self.overdue(objects, overdue).await;
                    if applied.is_written() && overdue.to == MaintenancePhase::Pending {
                        fenced.extend(
                            Self::maintenance(objects, &overdue.maintenance).and_then(|m| m.uid()),
                        );
                    }
                    applied
                }
                Effect::Release => self.release(objects, &fenced).await,
                Effect::RecordDeadline(record) => self.record_deadline(objects, record).await,
                Effect::TakeOver(taking) => self.take_over(objects, taking).await,
                Effect::OutOfService(change) => self.out_of_service(change).await,
                Effect::PendingTaint(change) => self.pending_taint(change).await,
                Effect::NodeEdit(edit) => self.node_edit(edit).await,
                Effect::DeleteNode(deletion) => self.delete_node(deletion).await,
                Effect::StartupTimeout(timeout) => self.startup_timeout(timeout).await,
                Effect::StartedLate(node) => self.started_late(node).await,
                Effect::Remediate(request) => self.remediate(objects, request).await,
                Effect::Expire(expired) => self.expire(expired).await,
            };
            if !matches!(effect, Effect::Admit { .. }) {
                self.api_waits.since(started);
            }
            self.writer
                .metrics
                .effects
                .get_or_create(&EffectLabels {
                    effect: effect.name(),
                    outcome: applied.name(),
                })
                .inc();
        }
    }

    /// Deletes a finished maintenance past the TTL (only the one the round saw).
    async fn expire(&mut self, expired: &round::expire::Expired) -> Applied {
        let maintenances: Api<NodeMaintenance> = Api::all(self.writer.client.clone());
        let deleted = write::delete(&maintenances, &expired.maintenance, &only(&expired.uid)).await;
        let applied = Applied::of(&deleted);
        match deleted {
            Outcome::Written(()) => tracing::info!(
                maintenance = %expired.maintenance,
                node = %expired.node,
                "deleted a finished maintenance past --finished-maintenance-ttl"
            ),
            Outcome::Gone(_) => {}
            Outcome::Conflict(e) | Outcome::Failed(e) => tracing::warn!(
                error = %e,
                maintenance = %expired.maintenance,
                "deleting a finished maintenance past --finished-maintenance-ttl"
            ),
        }
        applied
    }

    /// Deletes the Node of a drained DeleteNode maintenance (only the Node the round saw).
    async fn delete_node(&mut self, deletion: &round::NodeDeletion) -> Applied {
        let round::NodeDeletion {
            maintenance,
            node,
            uid,
        } = deletion;
        let nodes: Api<Node> = Api::all(self.writer.client.clone());
        let deleted = write::delete(&nodes, node, &only(uid)).await;
        let applied = Applied::of(&deleted);
        match deleted {
            Outcome::Written(()) => {
                tracing::warn!(%maintenance, %node, "deleted the Node of a drained DeleteNode maintenance")
            }
            Outcome::Gone(_) => {}
            Outcome::Conflict(e) | Outcome::Failed(e) => {
                tracing::warn!(error = %e, "DeleteNode maintenance")
            }
        }
        applied
    }
}
