//! Carrying a round's plan out: budget slots as conditional writes of each policy's status,
//! then the maintenances' statuses (admitted, denied, ended), remediation requests, Events and
//! the plan's metrics.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeStatus},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Preconditions},
    runtime::events::EventType,
};
use nodeward_api::{
    MaintenancePhase, MaintenanceReason, NodeMaintenance,
    conditions::{maintenance as maintenance_conditions, node as node_conditions, overdue},
    labels::{
        COORDINATOR_FIELD_MANAGER, MAINTENANCE_FINALIZER, MAINTENANCE_TAINT, SHUTDOWN_CORDON_BY,
        SHUTDOWN_TAINT,
    },
    maintenance::{AdmissionRecord, PhaseDeadline, PhaseTransition},
    policy::StartupAction,
};
use nodeward_runtime::{cordon, events::Events};

use super::{
    Controller,
    watch::{Changes, Fresh},
};
use nodeward_decide::{
    deadlines,
    round::{self, Objects, Plan},
};

use crate::metrics::{Applied, Metrics, PolicyLabels, ReasonLabels};
use nodeward_runtime::write::{Outcome, Part};

/// A remediation just requested is not requested again for this long (the watch shows it).
const REMEDIATION_DEBOUNCE: Duration = Duration::from_secs(60);

/// What writing a maintenance's status needs. Cloned into the task that writes a round's
/// admissions, so that the loop decides the next round meanwhile.
#[derive(Clone)]
pub(super) struct Writer {
    pub(super) client: Client,
    pub(super) identity: String,
    pub(super) metrics: Arc<Metrics>,
    pub(super) events: Events,
    /// Told of each write, so that its watch event wakes no round.
    pub(super) changed: Arc<Changes>,
    /// Shared with the admission tasks.
    pub(super) fresh_maintenances: Arc<std::sync::Mutex<Fresh<NodeMaintenance>>>,
}

impl Controller {
    pub(super) fn export(&self, plan: &Plan) {
        for (policy, (used, max)) in &plan.budget_use {
            let labels = PolicyLabels {
                policy: policy.clone(),
            };
            self.writer
                .metrics
                .budget_used
                .get_or_create(&labels)
                .set(i64::try_from(*used).unwrap_or(i64::MAX));
            self.writer
                .metrics
                .budget_max
                .get_or_create(&labels)
                .set(i64::try_from(*max).unwrap_or(i64::MAX));
        }
        for (policy, unhealthy) in &plan.unhealthy {
            self.writer
                .metrics
                .unhealthy
                .get_or_create(&PolicyLabels {
                    policy: policy.clone(),
                })
                .set(i64::try_from(*unhealthy).unwrap_or(i64::MAX));
        }
    }

    pub(super) fn maintenance<'a>(
        objects: &'a Objects,
        name: &str,
    ) -> Option<&'a Arc<NodeMaintenance>> {
        objects.maintenances.iter().find(|m| m.name_any() == name)
    }

    pub(super) async fn end(
        &mut self,
        objects: &Objects,
        maintenance: &str,
        phase: MaintenancePhase,
        reason: &str,
        message: &str,
    ) -> Applied {
        let Some(current) = Self::maintenance(objects, maintenance) else {
            return Applied::Gone;
        };
        let now = Timestamp::now();
        let written = self
            .writer
            .write_maintenance(current, |status| {
                status.enter(phase, Time(now));
                status.finished_at = Some(Time(now));
                status.reason = Some(reason.to_owned());
                status.message = Some(message.to_owned());
            })
            .await;
        if written.is_written() {
            tracing::info!(%maintenance, ?phase, %message, "maintenance ended");
            let kind = if phase == MaintenancePhase::Succeeded {
                EventType::Normal
            } else {
                EventType::Warning
            };
            self.writer.event(
                current.as_ref(),
                kind,
                &format!("{phase:?}"),
                message.to_owned(),
            );
        }
        written
    }

    /// Moves a maintenance on without its agent: back to Pending (its admission undone, so that
    /// its slots are freed) or Failed when a deadline passed, or on to Acting (a DeleteNode of a
    /// dead node). A node sent back or failed may still carry the maintenance's taint and
    /// cordon: `NodeRestored=False` asks the agent to undo them.
    pub(super) async fn overdue(&mut self, objects: &Objects, overdue: &round::Overdue) -> Applied {
        let Some(current) = Self::maintenance(objects, &overdue.maintenance) else {
            return Applied::Gone;
        };
        let now = Timestamp::now();
        let generation = current.metadata.generation;
        let written = self
            .writer
            .write_maintenance(current, |status| {
                status.enter(overdue.to, Time(now));
                status.deadline = None;
                status.message = Some(overdue.message.clone());
                if overdue.to == MaintenancePhase::Pending {
                    status.admission = None;
                    status.withdraw_admission();
                    round::set_condition(
                        &mut status.conditions,
                        maintenance_conditions::ADMITTED,
                        "False",
                        overdue.reason,
                        overdue.message.clone(),
                        generation,
                        now,
                    );
                }
                if overdue.to.is_finished() {
                    status.finished_at = Some(Time(now));
                    status.reason = Some(overdue.reason.to_owned());
                }
                if overdue.to == MaintenancePhase::Acting {
                    // On to the node's deletion: there is nothing on it to restore.
                    return;
                }
                round::set_condition(
                    &mut status.conditions,
                    maintenance_conditions::NODE_RESTORED,
                    "False",
                    overdue.reason,
                    "the node may still carry this maintenance's taint and cordon: its agent undoes them when it runs again".to_owned(),
                    generation,
                    now,
                );
            })
            .await;
        if written.is_written() {
            tracing::warn!(maintenance = %overdue.maintenance, to = ?overdue.to, reason = overdue.reason, message = %overdue.message, "deadline passed");
            self.writer
                .deadline_passed(current.as_ref(), overdue.reason, &overdue.message);
        }
        written
    }

    /// Finishes a maintenance in place of its lost agent: undoes what it left on the node,
    /// removes the agent's finalizer, then records how it ended. Each step is retried by the
    /// next round if it fails.
    pub(super) async fn take_over(
        &mut self,
        objects: &Objects,
        taking: &round::TakeOver,
    ) -> Applied {
        let Some(current) = Self::maintenance(objects, &taking.maintenance) else {
            return Applied::Gone;
        };
        let round::TakeOver {
            maintenance,
            node,
            takeover,
            untaint,
            message,
        } = taking;
        if takeover.restore {
            let by = format!("maintenance/{maintenance}");
            // The shutdown guard's taint and cordon too: a node that went down for the
            // maintenance's reboot and never came back keeps them, and no one else takes them
            // away (the agent would, after the next boot).
            let client = &self.writer.client;
            let undone = async {
                cordon::undo_left_by(client, node, MAINTENANCE_TAINT, &by, *untaint).await?;
                cordon::undo_left_by(client, node, SHUTDOWN_TAINT, SHUTDOWN_CORDON_BY, true).await
            }
            .await;
            if let Err(e) = undone {
                tracing::warn!(error = %e, %maintenance, "restoring the node of a lost agent");
                return Applied::Failed;
            }
        }
        let mut current = current.as_ref().clone();
        if takeover.unfinalize {
            let finalizers: Vec<String> = current
                .finalizers()
                .iter()
                .filter(|f| *f != MAINTENANCE_FINALIZER)
                .cloned()
                .collect();
            // A compare-and-swap on the finalizer list.
            let api: Api<NodeMaintenance> = Api::all(self.writer.client.clone());
            match nodeward_runtime::write::swap_finalizers(&api, &current, &finalizers).await {
                Outcome::Written(patched) => current = patched,
                refused @ (Outcome::Conflict(_) | Outcome::Gone(_)) => {
                    return Applied::of(&refused);
                }
                Outcome::Failed(e) => {
                    tracing::warn!(error = %e, "taking over from a lost agent: removing its finalizer");
                    return Applied::Failed;
                }
            }
            if current.metadata.deletion_timestamp.is_some() {
                tracing::warn!(%maintenance, %message, "released in place of a lost agent");
                return Applied::Written;
            }
        }
        if takeover.end_in.is_none() && !takeover.restore {
            return if takeover.unfinalize {
                Applied::Written
            } else {
                Applied::Unchanged
            };
        }
        let now = Timestamp::now();
        let generation = current.metadata.generation;
        let written = self
            .writer
            .write_maintenance(&current, |status| {
                if let Some(phase) = takeover.end_in {
                    status.enter(phase, Time(now));
                    status.finished_at = Some(Time(now));
                    status.reason = Some(overdue::AGENT_LOST.to_owned());
                    status.deadline = None;
                    status.message = Some(message.clone());
                }
                if takeover.restore {
                    round::set_condition(
                        &mut status.conditions,
                        maintenance_conditions::NODE_RESTORED,
                        "True",
                        "RestoredByCoordinator",
                        "the coordinator undid the taint and cordon this maintenance left, in place of its lost agent".to_owned(),
                        generation,
                        now,
                    );
                }
            })
            .await;
        if written.is_written() {
            tracing::warn!(%maintenance, end_in = ?takeover.end_in, restored = takeover.restore, %message, "took over from a lost agent");
            if takeover.end_in.is_some() {
                self.writer
                    .deadline_passed(&current, overdue::AGENT_LOST, message);
            }
        }
        written
    }

    /// Puts the out-of-service taint on a dead node, or takes nodeward's from one Ready again.
    /// Records the deadline of a maintenance's current phase in its status.
    pub(super) async fn record_deadline(
        &mut self,
        objects: &Objects,
        record: &round::DeadlineRecord,
    ) -> Applied {
        let Some(current) = Self::maintenance(objects, &record.maintenance) else {
            return Applied::Gone;
        };
        self.writer
            .write_maintenance(current, |status| {
                status.deadline = Some(record.deadline.clone());
            })
            .await
    }

    /// Records that a node never became Ready within a policy's `nodeStartupTimeout` (once),
    /// and deletes it when the policy says so.
    pub(super) async fn startup_timeout(&mut self, timeout: &round::StartupTimeout) -> Applied {
        let mut applied = Applied::Unchanged;
        let nodes: Api<Node> = Api::all(self.writer.client.clone());
        if !timeout.reported {
            let message = format!("{} (policy {})", timeout.message, timeout.policy);
            let status = startup_condition("True", "NeverBecameReady", &message);
            let written = nodeward_runtime::write::apply(
                &nodes,
                &timeout.node,
                Part::Status,
                COORDINATOR_FIELD_MANAGER,
                &status,
            )
            .await;
            let recorded = Applied::of(&written);
            match written.required() {
                Ok(node) => {
                    applied = recorded;
                    tracing::warn!(node = %timeout.node, message = %timeout.message, "node startup timeout");
                    self.writer.event(
                        &node,
                        EventType::Warning,
                        "NodeStartupTimeout",
                        format!("{} (policy {})", timeout.message, timeout.policy),
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "startup timeout not recorded");
                    return recorded;
                }
            }
        }
        if timeout.action == StartupAction::DeleteNode {
            let deleted =
                nodeward_runtime::write::delete(&nodes, &timeout.node, &only(&timeout.uid)).await;
            applied = Applied::of(&deleted);
            match deleted {
                Outcome::Written(()) => {
                    tracing::warn!(node = %timeout.node, policy = %timeout.policy, "deleted a node that never became Ready");
                }
                Outcome::Gone(_) => {}
                Outcome::Conflict(e) | Outcome::Failed(e) => {
                    tracing::warn!(error = %e, "startup action failed")
                }
            }
        }
        applied
    }

    /// Sets `node`'s `StartupTimedOut` False: it became Ready after its startup timed out.
    pub(super) async fn started_late(&mut self, node: &str) -> Applied {
        let status = startup_condition("False", "BecameReady", "Ready after its startup timed out");
        let nodes = Api::<Node>::all(self.writer.client.clone());
        let applied = nodeward_runtime::write::apply(
            &nodes,
            node,
            Part::Status,
            COORDINATOR_FIELD_MANAGER,
            &status,
        )
        .await;
        let outcome = Applied::of(&applied);
        match applied.required() {
            Ok(written) => {
                tracing::info!(%node, "node Ready after its startup timed out");
                self.writer.event(
                    &written,
                    EventType::Normal,
                    "NodeBecameReady",
                    "Ready after its startup timed out".to_owned(),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "startup condition left True")
            }
        }
        outcome
    }

    pub(super) async fn remediate(
        &mut self,
        objects: &Objects,
        request: &round::RemediationRequest,
    ) -> Applied {
        self.remediated_at
            .retain(|_, t| t.elapsed() < REMEDIATION_DEBOUNCE);
        if self.remediated_at.contains_key(&request.node) {
            return Applied::Unchanged;
        }
        if let Some(replaced) = &request.replaces
            && Self::maintenance(objects, replaced).is_some()
        {
            self.end(
                objects,
                replaced,
                MaintenancePhase::Failed,
                "Replaced",
                &request.message,
            )
            .await;
        }
        let mut maintenance = NodeMaintenance::request(
            "",
            &request.node,
            MaintenanceReason::Remediation,
            request.action,
            COORDINATOR_FIELD_MANAGER,
            request.message.clone(),
        );
        maintenance.metadata.name = None;
        maintenance.metadata.generate_name =
            Some(format!("remediation-{}-", truncate(&request.node, 40)));
        let api: Api<NodeMaintenance> = Api::all(self.writer.client.clone());
        let created = nodeward_runtime::write::create(&api, &maintenance).await;
        let applied = Applied::of(&created);
        match created.required() {
            Ok(created) => {
                self.remediated_at
                    .insert(request.node.clone(), Instant::now());
                self.writer.metrics.remediations.inc();
                tracing::warn!(node = %request.node, maintenance = %created.name_any(), action = ?request.action, message = %request.message, "remediation requested");
                self.writer.event(
                    &created,
                    EventType::Warning,
                    "RemediationRequested",
                    request.message.clone(),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, node = %request.node, "remediation not requested")
            }
        }
        applied
    }
}

impl Writer {
    /// Replaces a maintenance's status with its resourceVersion as precondition; a conflict
    /// means someone changed it first, and the next round looks again.
    pub(super) async fn write_maintenance(
        &self,
        current: &NodeMaintenance,
        change: impl FnOnce(&mut nodeward_api::NodeMaintenanceStatus),
    ) -> Applied {
        match self.written_maintenance(current, change).await {
            Ok(_) => Applied::Written,
            Err(refused) => refused,
        }
    }

    /// [`Self::write_maintenance`], returning the object as written.
    pub(super) async fn written_maintenance(
        &self,
        current: &NodeMaintenance,
        change: impl FnOnce(&mut nodeward_api::NodeMaintenanceStatus),
    ) -> Result<NodeMaintenance, Applied> {
        let name = current.name_any();
        let mut updated = current.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        if status.history.is_empty() {
            status.history.push(PhaseTransition {
                phase: MaintenancePhase::Pending,
                time: current
                    .metadata
                    .creation_timestamp
                    .clone()
                    .unwrap_or(Time(Timestamp::now())),
            });
        }
        change(status);
        status.observed_generation = current.metadata.generation;
        // Within the CRD's bounds, whatever the message was made of (node names, errors).
        if let Some(message) = status.message.as_mut() {
            *message = nodeward_api::bounds::cut(message, nodeward_api::bounds::MESSAGE_LIMIT);
        }
        for c in &mut status.conditions {
            c.message = nodeward_api::bounds::cut(
                &c.message,
                nodeward_api::bounds::CONDITION_MESSAGE_LIMIT,
            );
        }
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let write = self.changed.writing(&NodeMaintenance::kind(&()), &name);
        match nodeward_runtime::write::replace_status(&api, &updated).await {
            Outcome::Written(written) => {
                write.done(written.resource_version());
                self.fresh_maintenances().record(current, written.clone());
                Ok(written)
            }
            refused @ (Outcome::Conflict(_) | Outcome::Gone(_)) => Err(Applied::of(&refused)),
            Outcome::Failed(e) => {
                tracing::warn!(error = %e, "maintenance status write failed");
                Err(Applied::Failed)
            }
        }
    }

    pub(super) fn fresh_maintenances(&self) -> std::sync::MutexGuard<'_, Fresh<NodeMaintenance>> {
        self.fresh_maintenances
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a maintenance Admitted; returns whether that was written.
    pub(super) async fn admit(
        &self,
        current: &NodeMaintenance,
        admission: &round::Admission,
    ) -> bool {
        let now = Timestamp::now();
        let record = AdmissionRecord {
            policies: admission.policies.clone(),
            admitted_at: Time(now),
            admitted_by: self.identity.clone(),
            node_uid: Some(admission.node_uid.clone()).filter(|u| !u.is_empty()),
        };
        let message = if admission.policies.is_empty() {
            "no DisruptionPolicy matches the node; admitted without limits".to_owned()
        } else {
            format!("holds a slot in policies {}", admission.policies.join(", "))
        };
        let generation = current.metadata.generation;
        let note = message.clone();
        let start = deadlines::due(
            deadlines::Progress {
                phase: MaintenancePhase::Admitted,
                action: current.spec.action,
                since: now,
            },
            admission.deadlines,
        )
        .map(|due| PhaseDeadline {
            phase: due.phase,
            since: Some(Time(now)),
            time: Time(due.at),
            then: due.then,
        });
        let written = self
            .write_maintenance(current, |status| {
                status.enter(MaintenancePhase::Admitted, Time(now));
                status.admission = Some(record);
                // A surge still raised keeps its record until it is restored.
                status.surges.retain(|s| s.state.raised());
                for planned in &admission.surges {
                    let known = status.surges.iter().any(|s| {
                        s.namespace == planned.namespace && s.deployment == planned.deployment
                    });
                    if !known && status.surges.len() < nodeward_api::maintenance::SURGES_LIMIT {
                        status.surges.push(planned.clone());
                    }
                }
                status.deadline = start;
                status.message = Some(message.clone());
                round::set_condition(
                    &mut status.conditions,
                    maintenance_conditions::ADMITTED,
                    "True",
                    "Admitted",
                    message,
                    generation,
                    now,
                );
            })
            .await;
        if written.is_written() {
            self.metrics.admissions.inc();
            if let Some(created) = current.metadata.creation_timestamp.as_ref() {
                let latency = now.duration_since(created.0).as_secs_f64().max(0.0);
                self.metrics.admission_latency_seconds.observe(latency);
            }
            tracing::info!(maintenance = %admission.maintenance, node = %current.spec.node_name, policies = ?admission.policies, "admitted");
            self.event(current, EventType::Normal, "Admitted", note);
        }
        written.is_written()
    }

    /// Counts a maintenance moved on because its agent missed a deadline, with an Event.
    fn deadline_passed(&self, m: &NodeMaintenance, reason: &'static str, message: &str) {
        self.metrics
            .deadlines_passed
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
        self.event(m, EventType::Warning, reason, message.to_owned());
    }

    /// Publishes an Event off the decision path: a round does not wait for it.
    pub(super) fn event<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        self.events
            .spawn(object.object_ref(&()), type_, "Admission", reason, note);
    }
}

fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].trim_end_matches(['-', '.'])
}

/// Delete parameters that delete only the object with `uid` (not one re-created under its
/// name since it was seen).
pub(super) fn only(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

/// A Node status with the coordinator's one condition, `StartupTimedOut`, as of now.
fn startup_condition(status: &str, reason: &str, message: &str) -> NodeStatus {
    let now = Time(Timestamp::now());
    NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: node_conditions::STARTUP_TIMED_OUT.to_owned(),
            status: status.to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            last_transition_time: Some(now.clone()),
            last_heartbeat_time: Some(now),
        }]),
        ..NodeStatus::default()
    }
}
