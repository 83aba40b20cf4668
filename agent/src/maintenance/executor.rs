//! Carries out the admitted NodeMaintenances of this node (see [`super::lifecycle`]): on every
//! change of them ([`super::watch`]), and every few seconds, takes the next step. Every log line and
//! Event about a maintenance carries its uid as the correlation id.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{events::EventType, reflector},
};
use nodeward_api::{
    DisruptionPolicy, MaintenanceAction, MaintenancePhase, NodeMaintenance, StatusPatch,
    conditions::maintenance as maintenance_conditions,
    labels::{AGENT_FIELD_MANAGER, MAINTENANCE_FINALIZER, MAINTENANCE_TAINT},
    node::Applied,
    update::HostRun,
};
use nodeward_runtime::{
    ApiError, WRITE_REFUSED, cordon,
    events::Events,
    stop::{self, Stopping},
    write::{self, Part},
};

use super::{
    host_steps::{self, HostState},
    lifecycle::{self, Facts, Gate, Step},
    reboot_method::RebootConfig,
    rollback, workloads,
};
use crate::{
    drain::{
        evict::{self, Drain, Progress},
        plan::Purpose,
        watched::{Report, Watched},
    },
    maintenance::watch::NodeMaintenances,
    notify::{Notice, NoticeKind, Notifier},
    policies,
};

/// What the executor remembers within this boot.
#[derive(Default)]
pub(super) struct ThisBoot {
    /// Since when the health gate has held.
    pub(super) healthy_since: Option<Timestamp>,
    /// When a holding health gate's `for` runs out: the executor looks again then, not only
    /// on its resync, so that a healthy node passes its gate when it may.
    pub(super) gate_due_in: Option<Duration>,
    /// Maintenances whose action was asked of logind.
    acted: HashSet<String>,
    /// The host runs this agent ended, per maintenance uid (a watch may not show them yet).
    ran: HashMap<String, Vec<HostRun>>,
}

/// What a step of a maintenance was decided on.
pub(super) struct Seen<'a> {
    /// What it left on the node.
    pub applied: &'a Applied,
    pub gate: &'a Gate,
    /// Its host runs, this agent's over what the status shows.
    pub runs: &'a [HostRun],
}

impl ThisBoot {
    /// Remembers the host run this agent ended for `m`.
    pub(super) fn ended(&mut self, m: &NodeMaintenance, run: Option<HostRun>) {
        if let Some(run) = run {
            let ran = self.ran.entry(uid(m)).or_default();
            ran.retain(|r| r.step != run.step);
            ran.push(run);
        }
    }
}

/// The longest the last notification before a reboot or power-off is waited for.
const LAST_WORD: Duration = Duration::from_secs(5);

/// Re-examined at least this often (health gates and reboots move with time).
const RESYNC: Duration = Duration::from_secs(5);

/// The shortest wait for a holding health gate (no busy loop on a gate about to pass).
const GATE_LOOK_AT_LEAST: Duration = Duration::from_millis(20);

pub struct Executor {
    pub client: Client,
    pub node: String,
    pub boot_id: String,
    pub own_pod: Option<(String, String)>,
    pub notifier: Notifier,
    /// Events about the maintenances.
    pub events: Events,
    /// The DisruptionPolicies (a live store): which plan, timeout and gate apply.
    pub policies: reflector::Store<DisruptionPolicy>,
    /// How a drained node reboots.
    pub reboot: RebootConfig,
    /// What the host runs: recorded before and after the maintenance.
    pub inventories: crate::inventory::Inventories,
    /// The phase this agent last wrote, per maintenance uid (start empty).
    pub written: Mutex<HashMap<String, MaintenancePhase>>,
    /// Told of every change of this node's Node ([`crate::policies::Follow::node_changed`]).
    pub node_changed: std::sync::Arc<tokio::sync::Notify>,
}

impl Executor {
    /// Runs until a stop is asked for: a step under way (its writes) is finished first.
    pub async fn run(self, maintenances: NodeMaintenances, mut stopping: Stopping) {
        let NodeMaintenances { store, mut changes } = maintenances;
        let mut this_boot = ThisBoot::default();
        loop {
            let look_again = this_boot
                .gate_due_in
                .take()
                .map_or(RESYNC, |due| due.clamp(GATE_LOOK_AT_LEAST, RESYNC));
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = self.node_changed.notified() => {}
                _ = tokio::time::sleep(look_again) => {}
                () = stop::asked(&mut stopping) => return,
            }
            let mut maintenances = store.state();
            maintenances.sort_by_key(|m| m.metadata.creation_timestamp.clone());
            for m in maintenances {
                if let Err(e) = self.advance(&m, &store, &mut this_boot).await {
                    tracing::warn!(maintenance = %m.name_any(), correlation = %uid(&m), error = %e, "maintenance step failed; retrying");
                    if let Some(refused) = e.refusal() {
                        let note =
                            format!("the API server refused nodeward-agent's write: {refused}");
                        self.event(&m, EventType::Warning, WRITE_REFUSED, note)
                            .await;
                    }
                }
            }
        }
    }

    async fn advance(
        &self,
        m: &NodeMaintenance,
        store: &reflector::Store<NodeMaintenance>,
        this_boot: &mut ThisBoot,
    ) -> Result<(), crate::Error> {
        let status = m.status.clone().unwrap_or_default();
        // The watch has not shown our last write yet: a step on this view would repeat one.
        let stale = self
            .written
            .lock()
            .map(|w| w.get(&uid(m)).is_some_and(|ours| status.phase < *ours))
            .unwrap_or(false);
        if stale {
            return Ok(());
        }
        let ours = this_boot.ran.get(&uid(m)).cloned().unwrap_or_default();
        let runs = host_steps::overlaid(&status.host_runs, &ours);
        let (facts, gate) = self.facts(m, &runs, this_boot).await?;
        let applied = Applied {
            cordoned: status.cordoned_by_nodeward.unwrap_or(false),
            tainted: true,
        };
        match lifecycle::step(facts) {
            Step::Wait => Ok(()),
            Step::Prepare => self.prepare(m).await,
            Step::RunOnHost(step) => {
                let run = self.run_on_host(m, step, None).await?;
                this_boot.ended(m, run);
                Ok(())
            }
            Step::Rollback(next) => {
                let seen = Seen {
                    applied: &applied,
                    gate: &gate,
                    runs: &runs,
                };
                self.rollback_step(next, m, seen, this_boot).await
            }
            Step::HostFailed(step) => self.host_failed(m, &applied, step, &runs).await,
            Step::SkipReboot => {
                this_boot.healthy_since = None;
                self.skip_reboot(m).await
            }
            Step::Drain => self.drain(m, store, &applied).await,
            // Asked once per boot: the machine goes down after the shutdown drain.
            Step::Act if this_boot.acted.contains(&uid(m)) => Ok(()),
            Step::Act => {
                this_boot.acted.insert(uid(m));
                self.act(m, &applied).await
            }
            Step::Verify => {
                this_boot.healthy_since = None;
                self.verify(m).await
            }
            Step::Complete => {
                self.end(
                    m,
                    &applied,
                    MaintenancePhase::Succeeded,
                    "Succeeded",
                    workloads::completion(facts.workloads, m),
                )
                .await
            }
            Step::ReturnToService => self.return_to_service(m, &applied).await,
            Step::WorkloadsFailed => {
                let why = format!(
                    "the evicted workloads were not available again within the workload gate's timeout (onTimeout: Fail): {}",
                    workloads::verdict(m)
                );
                self.fail(m, &applied, "WorkloadsUnavailable", why).await
            }
            Step::GateFailed => {
                let why = gate
                    .expired()
                    .unwrap_or("the health gate did not pass in time")
                    .to_owned();
                self.fail(m, &applied, "HealthGateFailed", why).await
            }
            Step::Cancel => {
                self.end(
                    m,
                    &applied,
                    MaintenancePhase::Cancelled,
                    "Cancelled",
                    "deleted before the action".into(),
                )
                .await?;
                self.finalizer(m, false).await
            }
            Step::Release => self.release(m, &applied).await,
            Step::Restore => self.restore(m, store).await,
        }
    }

    /// What the next step of `m` depends on, and where its health gate stands.
    async fn facts(
        &self,
        m: &NodeMaintenance,
        runs: &[HostRun],
        this_boot: &mut ThisBoot,
    ) -> Result<(Facts, Gate), crate::Error> {
        let status = m.status.clone().unwrap_or_default();
        let recorded_boot = status.boot_id.clone().unwrap_or_default();
        let gate = if status.phase == MaintenancePhase::Verifying {
            let (gate, due_in) = self.health_gate(m, &mut this_boot.healthy_since).await?;
            this_boot.gate_due_in = match (this_boot.gate_due_in, due_in) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            gate
        } else {
            Gate::Waiting(String::new())
        };
        let (host, rollback) = self.host_state(m, runs).await;
        let facts = Facts {
            phase: status.phase,
            action: m.spec.action,
            deleting: m.metadata.deletion_timestamp.is_some(),
            finalized: m.finalizers().iter().any(|f| f == MAINTENANCE_FINALIZER),
            rebooted: !recorded_boot.is_empty() && recorded_boot != self.boot_id,
            healthy: gate == Gate::Passed,
            gate_expired: matches!(gate, Gate::Expired(_)),
            restore_asked: status
                .conditions
                .iter()
                .any(|c| c.type_ == maintenance_conditions::NODE_RESTORED && c.status == "False"),
            back_in_service: workloads::back_in_service(m),
            workloads: workloads::judged(m),
            host,
            acted: this_boot.acted.contains(&uid(m)),
            goes_down_anyway: m.spec.disruption_deadline.is_some(),
            rollback,
        };
        Ok((facts, gate))
    }

    /// Where `m`'s host steps of its phase stand, and its rollback, given the `runs` recorded.
    async fn host_state(
        &self,
        m: &NodeMaintenance,
        runs: &[HostRun],
    ) -> (HostState, rollback::Stage) {
        if !matches!(
            m.phase(),
            MaintenancePhase::Draining | MaintenancePhase::Acting | MaintenancePhase::Verifying
        ) {
            return (HostState::Clear, rollback::Stage::None);
        }
        let steps = policies::effective(m, &self.policies).await.host;
        let verifying_since = m.entered(MaintenancePhase::Verifying).map(|t| t.0);
        (
            host_steps::state(m.phase(), &steps, runs),
            rollback::stage(&steps, runs, &self.boot_id, verifying_since),
        )
    }

    /// Takes the node out of service: finalizer, taint and cordon, then Draining.
    async fn prepare(&self, m: &NodeMaintenance) -> Result<(), crate::Error> {
        self.finalizer(m, true).await?;
        let by = format!("maintenance/{}", m.name_any());
        let done = cordon::apply(&self.client, None, &self.node, MAINTENANCE_TAINT, &by).await?;
        let before = self.versions().await;
        self.transition(
            m,
            MaintenancePhase::Draining,
            "tainted and cordoned; draining",
            |s, _| {
                s.cordoned_by_nodeward = Some(done.cordoned);
                s.started_at = Some(Time(Timestamp::now()));
                s.versions_before = before;
            },
        )
        .await?;
        self.normal_event(m, "DrainStarted", "tainted and cordoned; draining the node")
            .await;
        self.notify(m, NoticeKind::DrainStarted, "");
        Ok(())
    }

    /// Back after the reboot: Verifying, until the health gate passes.
    async fn verify(&self, m: &NodeMaintenance) -> Result<(), crate::Error> {
        let after = self.versions().await;
        self.transition(
            m,
            MaintenancePhase::Verifying,
            "back after the reboot; waiting for the health gate",
            |s, _| s.versions_after = after,
        )
        .await?;
        self.normal_event(
            m,
            "Rebooted",
            format!(
                "back after the reboot (boot id {}); waiting for the health gate",
                self.boot_id
            ),
        )
        .await;
        Ok(())
    }

    async fn drain(
        &self,
        m: &NodeMaintenance,
        store: &reflector::Store<NodeMaintenance>,
        applied: &Applied,
    ) -> Result<(), crate::Error> {
        policies::wait_for_admitting(m, &self.policies).await;
        let effective = policies::effective(m, &self.policies).await;
        let started = m
            .status
            .as_ref()
            .and_then(|s| s.started_at.as_ref())
            .map_or_else(Timestamp::now, |t| t.0);
        let deadline = effective.drain_timeout.map(|t| {
            let end = started.checked_add(t).unwrap_or(started);
            let left =
                Duration::try_from(end.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO);
            tokio::time::Instant::now() + left
        });
        let drain = Drain {
            client: self.client.clone(),
            node: self.node.clone(),
            plan: effective.plan.clone(),
            purpose: Purpose::of(m.spec.action),
            own_pod: self.own_pod.clone(),
            deadline,
            taint: MAINTENANCE_TAINT,
            surges: Some((store.clone(), m.name_any())),
        };
        let mut watched = Watched::start(drain.clone());
        let outcome = loop {
            match watched.next().await {
                Report::Tick(progress) => {
                    if let Some(p) = progress {
                        self.progress(m, &p).await;
                    }
                    // Deleted (or replaced) mid-drain: stop; the next step restores the node.
                    let current = store.get(&reflector::ObjectRef::new(&m.name_any()));
                    if current.is_none_or(|c| {
                        c.metadata.deletion_timestamp.is_some() || c.uid() != m.uid()
                    }) {
                        tracing::info!(maintenance = %m.name_any(), correlation = %uid(m), "deleted during the drain; stopping it");
                        return Ok(());
                    }
                }
                Report::Ended { outcome, last } => {
                    if let Some(p) = last {
                        self.progress(m, &p).await;
                    }
                    break outcome.transpose()?;
                }
            }
        };
        drop(watched);
        let drained = match (
            evict::failure(outcome, effective.drain_timeout),
            effective.force_on_timeout,
        ) {
            (None, _) => Ok("every pod of the drain plan is gone".to_owned()),
            (Some(why), true) => {
                let deleted = evict::force(&drain).await?;
                let forced = format!(
                    "{why}; forced (onDrainTimeout: Force): deleted {} pods bypassing their PodDisruptionBudgets: {}",
                    deleted.len(),
                    deleted.join(", ")
                );
                tracing::warn!(maintenance = %m.name_any(), correlation = %uid(m), %forced, "drain forced");
                self.event(m, EventType::Warning, "DrainForced", forced.clone())
                    .await;
                Err(forced)
            }
            (Some(why), false) => return self.fail(m, applied, "DrainFailed", why).await,
        };
        self.drained(m, drained).await
    }

    /// Records the drain's end and moves on to the action: `drained` is how (`Err`: forced).
    async fn drained(
        &self,
        m: &NodeMaintenance,
        drained: Result<String, String>,
    ) -> Result<(), crate::Error> {
        let message = match m.spec.action {
            MaintenanceAction::DrainOnly if m.spec.disruption_deadline.is_some() => {
                "drained ahead of its disruptionDeadline; the maintenance ends once the node has booted again"
            }
            MaintenanceAction::DrainOnly => {
                "drained; the node stays drained until this maintenance is deleted"
            }
            MaintenanceAction::DeleteNode => "drained; the coordinator deletes the Node",
            MaintenanceAction::Reboot => "drained; rebooting",
            MaintenanceAction::PowerOff => "drained; powering off",
        };
        let (reason, how) = match drained {
            Ok(how) => ("Drained", how),
            Err(how) => ("Forced", how),
        };
        let boot = self.boot_id.clone();
        let condition = Condition {
            type_: nodeward_api::conditions::maintenance::DRAINED.to_owned(),
            status: "True".to_owned(),
            reason: reason.to_owned(),
            message: how,
            observed_generation: m.metadata.generation,
            last_transition_time: Time(Timestamp::now()),
        };
        self.transition(m, MaintenancePhase::Acting, message, |s, current| {
            s.boot_id = Some(boot);
            *s = std::mem::take(s).condition(current, condition);
        })
        .await?;
        self.normal_event(m, "Drained", message).await;
        Ok(())
    }

    async fn act(&self, m: &NodeMaintenance, applied: &Applied) -> Result<(), crate::Error> {
        let host_command = match m.spec.action {
            MaintenanceAction::Reboot => self.reboot.host_command(),
            _ => None,
        };
        let how = match host_command {
            Some(_) => self.reboot.describe(),
            None => "through logind".to_owned(),
        };
        if m.spec.action == MaintenanceAction::PowerOff {
            // Nothing runs after the power-off: this is the last word.
            self.transition(m, MaintenancePhase::Succeeded, "powering off", |s, _| {
                s.finished_at = Some(Time(Timestamp::now()));
                s.reason = Some("Succeeded".to_owned());
            })
            .await?;
        }
        let kind = match m.spec.action {
            MaintenanceAction::Reboot => NoticeKind::Rebooting,
            _ => NoticeKind::PoweringOff,
        };
        self.notifier
            .send_before(self.notice(m, kind, ""), LAST_WORD)
            .await;
        tracing::warn!(maintenance = %m.name_any(), correlation = %uid(m), action = ?m.spec.action, %how, "acting");
        self.event(
            m,
            EventType::Normal,
            "Acting",
            format!("{:?} {how}", m.spec.action),
        )
        .await;
        let asked = match host_command {
            Some(argv) => match self.reboot.run_on_host(&argv).await {
                // A signal to PID 1 (or a command) that started the shutdown may have its own
                // unit stopped by it before it is seen to exit: the machine is going down, as
                // asked, and the next boot carries the maintenance on.
                Err(e) if crate::host::systemd::going_down().await => {
                    tracing::warn!(maintenance = %m.name_any(), error = %e, "the reboot command's unit ended as the machine goes down; waiting for the boot");
                    Ok(())
                }
                ran => ran,
            },
            None => crate::host::logind::act(m.spec.action == MaintenanceAction::Reboot).await,
        };
        if let Err(e) = asked {
            // The machine stays up: it must not stay cordoned by us.
            self.fail(m, applied, "ActionFailed", e).await?;
        }
        Ok(())
    }

    /// Fails the maintenance with `why` (Event `reason`): see [`Self::end`].
    pub(super) async fn fail(
        &self,
        m: &NodeMaintenance,
        applied: &Applied,
        reason: &str,
        why: String,
    ) -> Result<(), crate::Error> {
        self.end(m, applied, MaintenancePhase::Failed, reason, why)
            .await
    }

    /// Ends the maintenance in `phase` (Succeeded, Cancelled or Failed): the node's taint and
    /// cordon undone, the phase with `why` and the finish time, an Event `reason` and a
    /// notification.
    async fn end(
        &self,
        m: &NodeMaintenance,
        applied: &Applied,
        phase: MaintenancePhase,
        reason: &str,
        why: String,
    ) -> Result<(), crate::Error> {
        cordon::undo(&self.client, &self.node, MAINTENANCE_TAINT, applied).await?;
        self.transition(
            m,
            phase,
            &format!("{why}; the node's taint and cordon are undone"),
            |s, _| {
                s.finished_at = Some(Time(Timestamp::now()));
                s.reason = Some(reason.to_owned());
            },
        )
        .await?;
        let (type_, kind) = match phase {
            MaintenancePhase::Succeeded => (EventType::Normal, NoticeKind::Succeeded),
            MaintenancePhase::Cancelled => (EventType::Normal, NoticeKind::Cancelled),
            _ => (EventType::Warning, NoticeKind::Failed),
        };
        self.notify(m, kind, &why);
        self.event(m, type_, reason, why).await;
        Ok(())
    }

    fn notice(&self, m: &NodeMaintenance, kind: NoticeKind, message: &str) -> Notice {
        Notice {
            kind,
            node: self.node.clone(),
            maintenance: m.name_any(),
            correlation: uid(m),
            reason: format!("{:?}", m.spec.reason),
            action: format!("{:?}", m.spec.action),
            message: message.to_owned(),
        }
    }

    pub(super) fn notify(&self, m: &NodeMaintenance, kind: NoticeKind, message: &str) {
        self.notifier.send(self.notice(m, kind, message));
    }

    /// The drain's progress, applied by the agent alone (it owns these fields): no view of the
    /// rest of the status is needed.
    async fn progress(&self, m: &NodeMaintenance, p: &Progress) {
        let patch =
            StatusPatch::progress(p.total, p.remaining, &p.blocking).evicted(m, &p.workloads);
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let name = m.name_any();
        let applied = write::apply(&api, &name, Part::Status, AGENT_FIELD_MANAGER, &patch);
        if let Err(e) = applied.await.required() {
            tracing::warn!(maintenance = %m.name_any(), correlation = %uid(m), error = %e, "writing drain progress");
        }
    }

    /// Moves the maintenance to `phase` (with a history entry and message); `extra` adds
    /// status fields, given the maintenance as it is now. A compare-and-swap on the phase the
    /// step was decided on: the coordinator moves a maintenance too (when a deadline passes),
    /// and a step taken on an older view must not undo that.
    pub(super) async fn transition(
        &self,
        m: &NodeMaintenance,
        phase: MaintenancePhase,
        message: &str,
        extra: impl FnOnce(&mut StatusPatch, &NodeMaintenance),
    ) -> Result<(), crate::Error> {
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let name = m.name_any();
        let context = |e| {
            ApiError::new(
                "writing the status of",
                format!("NodeMaintenance {name}"),
                e,
            )
        };
        let current = api.get(&name).await.map_err(context)?;
        if current.uid() != m.uid() || current.phase() != m.phase() {
            return Err(crate::Error::Moved {
                maintenance: name,
                expected: m.phase(),
                found: current.phase(),
            });
        }
        let mut patch = StatusPatch::enter(&current, phase, message, Time(Timestamp::now()));
        extra(&mut patch, &current);
        // Conditional on nothing having changed since `current` was read.
        write::swap_status(&api, &current, &patch)
            .await
            .required()?;
        if let Ok(mut written) = self.written.lock() {
            written.insert(uid(m), phase);
        }
        tracing::info!(maintenance = %name, correlation = %uid(m), ?phase, %message, "maintenance phase");
        Ok(())
    }

    pub(super) async fn finalizer(
        &self,
        m: &NodeMaintenance,
        present: bool,
    ) -> Result<(), crate::Error> {
        let mut finalizers: Vec<String> = m.finalizers().to_vec();
        let has = finalizers.iter().any(|f| f == MAINTENANCE_FINALIZER);
        if has == present {
            return Ok(());
        }
        if present {
            finalizers.push(MAINTENANCE_FINALIZER.to_owned());
        } else {
            finalizers.retain(|f| f != MAINTENANCE_FINALIZER);
        }
        // A compare-and-swap on the finalizer list.
        let maintenances = Api::<NodeMaintenance>::all(self.client.clone());
        write::swap_finalizers(&maintenances, m, &finalizers)
            .await
            .required()?;
        Ok(())
    }

    /// Sets `condition` on `m`'s status (keeping its transition time while its status stays the
    /// same), applied as the only owner of that condition type: the coordinator's conditions and
    /// the agent's others stay, whatever view `m` is.
    pub(super) async fn set_condition(
        &self,
        m: &NodeMaintenance,
        condition: Condition,
    ) -> Result<(), crate::Error> {
        let condition = nodeward_api::conditions::carried(m.conditions(), condition);
        let api = Api::<NodeMaintenance>::all(self.client.clone());
        write::apply_condition(&api, &m.name_any(), AGENT_FIELD_MANAGER, &condition)
            .await
            .required()?;
        Ok(())
    }

    /// A `Normal` Event about `m`: a step of its maintenance taken as planned.
    pub(super) async fn normal_event(
        &self,
        m: &NodeMaintenance,
        reason: &str,
        note: impl Into<String>,
    ) {
        self.event(m, EventType::Normal, reason, note.into()).await;
    }

    pub(super) async fn event(
        &self,
        m: &NodeMaintenance,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let note = format!("{note} (correlation {})", uid(m));
        let publishing = self
            .events
            .spawn(m.object_ref(&()), type_, "Maintenance", reason, note);
        nodeward_runtime::events::briefly(publishing).await;
    }
}

fn uid(m: &NodeMaintenance) -> String {
    m.uid().unwrap_or_default()
}
