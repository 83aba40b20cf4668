//! The shutdown guard: holds a systemd-logind `delay` inhibitor lock on shutdown and, when
//! logind announces a shutdown (`PrepareForShutdown(true)`), taints and cordons the node,
//! drains it within the delay budget minus a safety margin, and releases the lock before the
//! budget ends, always. A cancelled shutdown (`false`) takes the lock again and undoes only
//! what the agent did; after the next boot the agent untaints and uncordons once the node is
//! Ready. The progress lives in the NodeReport so that an agent restarted mid-drain resumes.
//!
//! The bus connection is watched: when it drops or `org.freedesktop.login1` changes owner (a
//! restarted logind forgets every lock), the guard reconnects with backoff and takes the lock
//! again; if `PreparingForShutdown` is already true then, it goes straight to the drain.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use kube::{
    Api, Client,
    runtime::{events::EventType, reflector},
};
use nodeward_api::{
    NodeReport, NodeReportStatus,
    labels::{SHUTDOWN_CORDON_BY, SHUTDOWN_TAINT},
    node::Applied,
    report::{InhibitorState, ShutdownPhase, ShutdownProgress},
};
use nodeward_runtime::{
    cordon,
    events::Events,
    write::{self, Outcome, Part},
};
use zbus::{proxy::CacheProperties, zvariant::OwnedFd};

use super::dropin;
use super::{Settings, notes, record, unrecorded, window::drain_window};
use crate::host::logind::ManagerProxy;
use crate::{
    backoff::Backoff,
    drain::{
        evict::{Drain, Progress},
        plan::{self, Purpose},
        watched::{Report, Watched},
    },
    maintenance::watch::{NodeMaintenances, follow_admissions},
};

/// Field manager for the guard's NodeReport fields (`inhibitor`, `shutdown`), apart from the
/// reporter's so that neither removes the other's fields.
const FIELD_MANAGER: &str = "nodeward-agent-shutdown";
const WHO: &str = "nodeward";
const WHY: &str = "draining the node's pods before it goes down";

/// How long logind delays a shutdown for a delay lock, as the guard found it.
struct Delay {
    /// `InhibitDelayMaxUSec`, after raising it if configured.
    max: Duration,
    /// Drop-ins that override ours.
    overriding: Vec<String>,
    /// Why drains get less than the budget, when they do.
    message: Option<String>,
}

pub struct Guard {
    pub client: Client,
    pub node: String,
    pub boot_id: String,
    pub settings: Settings,
    /// Events about the node.
    pub events: Events,
    /// This node's maintenances, for the reboot gate.
    pub maintenances: NodeMaintenances,
    /// This node as watched (whole objects): the shutdown's cordon writes it without reading.
    pub own_node: reflector::Store<Node>,
}

/// What the guard knows now; written to the NodeReport on change.
#[derive(Clone, Debug, Default)]
struct State {
    inhibitor: InhibitorState,
    shutdown: Option<ShutdownProgress>,
    /// Whether the NodeReport has been written once (it may hold an older run's state).
    written: bool,
}

fn seconds(d: Duration) -> nodeward_api::Duration {
    nodeward_api::Duration::from_secs(d.as_secs())
}

impl Guard {
    /// Runs until the task is dropped.
    pub async fn run(self) {
        let state = Arc::new(Mutex::new(State::default()));
        self.state_init(&state).await;
        let (admitted_tx, admitted) = tokio::sync::watch::channel(false);
        let _following = self
            .settings
            .reboot_gate
            .then(|| tokio::spawn(follow_admissions(self.maintenances.clone(), admitted_tx)));
        let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
        loop {
            match self.session(&state, admitted.clone()).await {
                Ok(()) => backoff.reset(),
                Err(e) => tracing::warn!(error = %e, "shutdown guard: lost logind; reconnecting"),
            }
            self.update(&state, |s| {
                s.inhibitor.delay_held = false;
                s.inhibitor.message = Some("not connected to systemd-logind".into());
            })
            .await;
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// Picks up the record of an earlier run: after a reboot, undoes the cordon and taint
    /// once the node is Ready; within the same boot, the drain is resumed by `session` when
    /// logind is still preparing for shutdown.
    async fn state_init(&self, state: &Arc<Mutex<State>>) {
        let reports: Api<NodeReport> = Api::all(self.client.clone());
        let record = match reports.get_opt(&self.node).await {
            Ok(r) => r.and_then(|r| r.status?.shutdown),
            Err(e) => {
                tracing::warn!(error = %e, "reading the NodeReport for an earlier shutdown");
                None
            }
        };
        let Some(record) = record else {
            return;
        };
        if record.boot_id == self.boot_id {
            lock(state).shutdown = Some(record);
            return;
        }
        tracing::info!(previous_boot = %record.boot_id, "back from a shutdown; restoring the node once it is Ready");
        let applied = Applied {
            cordoned: record.cordoned_by_agent,
            tainted: record.tainted_by_agent,
        };
        self.update(state, |s| {
            s.shutdown = Some(ShutdownProgress {
                phase: ShutdownPhase::Recovering,
                ..record.clone()
            });
        })
        .await;
        let client = self.client.clone();
        let node = self.node.clone();
        let nodes: Api<Node> = Api::all(client.clone());
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        loop {
            let ready = nodes
                .get_opt(&node)
                .await
                .ok()
                .flatten()
                .is_some_and(|n| nodeward_api::node::is_ready(&n));
            if ready
                && cordon::undo(&client, &node, SHUTDOWN_TAINT, &applied)
                    .await
                    .is_ok()
            {
                break;
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
        tracing::info!("node restored after the reboot");
        self.event(
            EventType::Normal,
            "NodeRestored",
            "back from the shutdown and Ready: the agent's taint and cordon are removed".to_owned(),
        )
        .await;
        self.update(state, |s| s.shutdown = None).await;
    }

    /// What the report says of the lock and the delay logind grants.
    fn inhibitor_state(&self, delay: &Delay, delay_held: bool) -> InhibitorState {
        InhibitorState {
            delay_held,
            block_held: false,
            inhibit_delay_max: Some(seconds(delay.max)),
            configured_budget: Some(seconds(self.settings.budget)),
            // Within the report's bounds: a host with more overriding drop-ins than that has
            // bigger problems, and the first ones say what matters.
            overriding_drop_ins: delay
                .overriding
                .iter()
                .take(32)
                .map(|d| nodeward_api::bounds::cut(d, 255))
                .collect(),
            last_acquired: delay_held.then(|| Time(Timestamp::now())),
            message: delay
                .message
                .as_deref()
                .map(|m| nodeward_api::bounds::cut(m, nodeward_api::bounds::MESSAGE_LIMIT)),
        }
    }

    /// One connection to the bus: lock, watch, act. Returns when the connection or logind
    /// goes away.
    async fn session(
        &self,
        state: &Arc<Mutex<State>>,
        mut admitted: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), String> {
        let connection = crate::host::bus::connect().await?;
        let manager = ManagerProxy::builder(&connection)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| e.to_string())?;
        // Subscribe before taking the lock, so that no announcement can fall in between.
        let mut announcements = manager
            .receive_prepare_for_shutdown()
            .await
            .map_err(|e| format!("subscribing to PrepareForShutdown: {e}"))?;
        let bus = zbus::fdo::DBusProxy::new(&connection)
            .await
            .map_err(|e| e.to_string())?;
        let mut owners = bus
            .receive_name_owner_changed_with_args(&[(0, "org.freedesktop.login1")])
            .await
            .map_err(|e| e.to_string())?;
        let delay = self.effective_delay(&manager).await?;
        let mut gate_slot: Option<OwnedFd> = None;
        // A shutdown already under way takes no new locks: straight to the drain.
        let preparing = manager.preparing_for_shutdown().await.unwrap_or(false);
        let mut held = if preparing {
            None
        } else {
            Some(self.inhibit(&manager).await?)
        };
        let delay_held = held.is_some();
        let inhibitor = self.inhibitor_state(&delay, delay_held);
        self.update(state, |s| s.inhibitor = inhibitor).await;
        if preparing {
            tracing::warn!("logind is already preparing for shutdown");
            self.shutdown(state, &mut held, delay.max).await;
        } else {
            tracing::info!(delay_max = ?delay.max, budget = ?self.settings.budget, "holding a logind delay lock on shutdown");
            let mut gate: Option<OwnedFd> = None;
            let now = *admitted.borrow_and_update();
            self.set_gate(state, &manager, &mut gate, now).await?;
            gate_slot = gate;
            self.left_behind(state, &manager, &mut held).await?;
        }
        // The NodeReport may not exist yet when the lock is first taken: write until it does.
        let mut rewrite = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                changed = admitted.changed(), if self.settings.reboot_gate => {
                    if changed.is_err() {
                        return Err("the maintenance watch ended".into());
                    }
                    let now = *admitted.borrow_and_update();
                    self.set_gate(state, &manager, &mut gate_slot, now).await?;
                }
                _ = rewrite.tick() => {
                    if !lock(state).written {
                        self.update(state, |_| {}).await;
                    }
                }
                announcement = announcements.next() => {
                    let Some(signal) = announcement else {
                        return Err("the bus connection closed".into());
                    };
                    let start = signal.args().map(|a| a.start).map_err(|e| e.to_string())?;
                    if start {
                        self.shutdown(state, &mut held, delay.max).await;
                    } else {
                        self.cancelled(state, &manager, &mut held, record::Undo::Cancelled).await?;
                    }
                }
                change = owners.next() => {
                    let Some(change) = change else {
                        return Err("the bus connection closed".into());
                    };
                    let new_owner = change.args().ok().and_then(|a| a.new_owner.as_ref().map(|o| o.to_string()));
                    return Err(format!("org.freedesktop.login1 changed owner (now {new_owner:?}); its locks are gone"));
                }
            }
        }
    }

    /// Restores the node from what an earlier shutdown left, found while logind prepares none:
    /// a drain logind forgot ([`record::forgotten`]), or the taint with no record ([`unrecorded`]).
    async fn left_behind(
        &self,
        state: &Arc<Mutex<State>>,
        manager: &ManagerProxy<'_>,
        held: &mut Option<OwnedFd>,
    ) -> Result<(), String> {
        let record = lock(state).shutdown.clone();
        match record {
            Some(r) if record::forgotten(&r, &self.boot_id) => {
                self.cancelled(state, manager, held, record::Undo::Forgotten)
                    .await
            }
            Some(_) => Ok(()),
            None => {
                let left = unrecorded::restore(&self.client, &self.node).await;
                if let Some((type_, reason, note)) = left {
                    self.event(type_, reason, note).await;
                }
                Ok(())
            }
        }
    }

    /// Holds the reboot gate (a `block` lock) while the gate is on and nothing of this node
    /// is admitted; releases it once a maintenance is.
    async fn set_gate(
        &self,
        state: &Arc<Mutex<State>>,
        manager: &ManagerProxy<'_>,
        gate: &mut Option<OwnedFd>,
        admitted: bool,
    ) -> Result<(), String> {
        let want = self.settings.reboot_gate && !admitted;
        if want && gate.is_none() {
            *gate = Some(
                manager
                    .inhibit(
                        "shutdown",
                        WHO,
                        "no disruption of this node is admitted by the nodeward coordinator",
                        "block",
                    )
                    .await
                    .map_err(|e| format!("taking the logind block lock: {e}"))?,
            );
            tracing::info!("reboot gate closed: uncoordinated shutdowns are refused");
        } else if !want && gate.is_some() {
            gate.take();
            tracing::info!("reboot gate open: a maintenance of this node is admitted");
        }
        let held = gate.is_some();
        self.update(state, |s| s.inhibitor.block_held = held).await;
        Ok(())
    }

    async fn inhibit(&self, manager: &ManagerProxy<'_>) -> Result<OwnedFd, String> {
        manager
            .inhibit("shutdown", WHO, WHY, "delay")
            .await
            .map_err(|e| format!("taking the logind delay lock: {e}"))
    }

    /// logind's `InhibitDelayMaxUSec`, raised to the budget with our drop-in when configured;
    /// with the drop-ins that override ours and a message when it stays below the budget.
    async fn effective_delay(&self, manager: &ManagerProxy<'_>) -> Result<Delay, String> {
        let read = || async {
            manager
                .inhibit_delay_max_usec()
                .await
                .map(Duration::from_micros)
                .map_err(|e| format!("reading InhibitDelayMaxUSec: {e}"))
        };
        let mut delay = read().await?;
        let budget = self.settings.budget;
        let found = dropin::read_all(&self.settings.drop_in_scan);
        if delay < budget
            && let Some(dir) = &self.settings.drop_in_dir
        {
            match dropin::ensure(dir, dropin::wanted_delay(budget, &found)) {
                Ok(_) => {
                    if let Err(e) =
                        crate::host::systemd::reload_or_restart_unit("systemd-logind.service").await
                    {
                        tracing::warn!(error = %e, "reloading logind after writing the drop-in");
                    }
                    // logind reloads asynchronously; give it a moment to answer with the new value.
                    for _ in 0..20 {
                        delay = read().await?;
                        if delay >= budget {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, dir = %dir.display(), "writing the logind drop-in")
                }
            }
        }
        let overriding = dropin::overriding(&dropin::read_all(&self.settings.drop_in_scan));
        let message = (delay < budget).then(|| {
            format!(
                "logind's InhibitDelayMaxSec is {}s, below the {}s budget: drains get {}s{}",
                delay.as_secs(),
                budget.as_secs(),
                drain_window(budget, delay, self.settings.margin).as_secs(),
                if overriding.is_empty() {
                    String::new()
                } else {
                    format!(" (overridden by {})", overriding.join(", "))
                }
            )
        });
        if let Some(m) = &message {
            tracing::warn!("{m}");
        }
        Ok(Delay {
            max: delay,
            overriding,
            message,
        })
    }

    /// The shutdown path: taint and cordon, drain within the budget, release the lock.
    async fn shutdown(
        &self,
        state: &Arc<Mutex<State>>,
        held: &mut Option<OwnedFd>,
        delay: Duration,
    ) {
        let plan = self
            .settings
            .plan
            .clone()
            .unwrap_or_else(|| plan::default_plan(Purpose::MachineDown));
        let (record, deadline, left, resumed) = self.begin(state, delay).await;
        let drain = Drain {
            client: self.client.clone(),
            node: self.node.clone(),
            plan,
            purpose: Purpose::MachineDown,
            own_pod: self.settings.own_pod.clone(),
            deadline: Some(deadline),
            taint: SHUTDOWN_TAINT,
            surges: None, // going down now: nothing can wait for a surge
        };
        let planned = notes::planned(&self.maintenances.store.state());
        let (kind, note) = notes::started(planned.as_deref(), left, resumed);
        let started = self.event(kind, "ShutdownDrainStarted", note);
        let mut announced = Announced::default();
        // Every round trip before the first eviction comes out of the budget: the shutdown
        // record and the Event are written while the drain reads the node's pods (after the
        // cordon: a pod that landed before it is in the plan) and evicts the first group.
        let mut watched = Watched::start(drain);
        tokio::join!(self.update(state, |s| s.shutdown = Some(record)), started);
        let outcome = loop {
            match watched.next().await {
                Report::Tick(Some(p)) => self.record_progress(state, &p, &mut announced).await,
                // Nothing new: retry a record write that has not gone through yet.
                Report::Tick(None) if !lock(state).written => self.update(state, |_| {}).await,
                Report::Tick(None) => {}
                Report::Ended { outcome, last } => {
                    if let Some(p) = last {
                        self.record_progress(state, &p, &mut announced).await;
                    }
                    break outcome;
                }
            }
        };
        let (kind, note) = notes::described(&outcome);
        tracing::warn!(%note, "drain before shutdown ended");
        self.event(
            kind,
            "ShutdownDrainFinished",
            format!("{note}; releasing the logind lock"),
        )
        .await;
        // Releasing is closing the descriptor; logind then goes on with the shutdown.
        held.take();
        tracing::warn!("released the logind delay lock");
        self.update(state, |s| {
            s.inhibitor.delay_held = false;
            if let Some(r) = s.shutdown.as_mut() {
                r.phase = ShutdownPhase::Released;
            }
        })
        .await;
    }

    /// Taints and cordons the node and makes the shutdown record with the drain's start and
    /// deadline (for the caller to write), or, after an agent restart within this shutdown, goes
    /// on with the recorded ones. Returns the record, the deadline, the time left at the start
    /// and whether it resumed.
    async fn begin(
        &self,
        state: &Arc<Mutex<State>>,
        delay: Duration,
    ) -> (ShutdownProgress, tokio::time::Instant, Duration, bool) {
        let (now, at) = (Timestamp::now(), tokio::time::Instant::now());
        let resumed = lock(state)
            .shutdown
            .clone()
            .filter(|s| record::resumable(s, &self.boot_id));
        let window = drain_window(self.settings.budget, delay, self.settings.margin);
        let (deadline, started_at) = match &resumed {
            Some(record) => (record.deadline.0, record.started_at.clone()),
            None => (now.checked_add(window).unwrap_or(now), Time(now)),
        };
        let left = Duration::try_from(deadline.duration_since(now)).unwrap_or(Duration::ZERO);
        tracing::warn!(
            resumed = resumed.is_some(),
            seconds = left.as_secs(),
            "shutdown announced: draining the node"
        );
        // Cordoned from the watched copy: a read fewer before the first eviction.
        let known = self.own_node.get(&reflector::ObjectRef::new(&self.node));
        let known = known.map(|node| Node::clone(&node));
        let cordoning = cordon::apply(
            &self.client,
            known,
            &self.node,
            SHUTDOWN_TAINT,
            SHUTDOWN_CORDON_BY,
        );
        let applied = match cordoning.await {
            Ok(applied) => Applied {
                cordoned: applied.cordoned || resumed.as_ref().is_some_and(|r| r.cordoned_by_agent),
                tainted: applied.tainted || resumed.as_ref().is_some_and(|r| r.tainted_by_agent),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cordoning before shutdown failed; draining anyway");
                Applied::default()
            }
        };
        tracing::info!(
            after_ms = at.elapsed().as_millis(),
            cordoned = applied.cordoned,
            tainted = applied.tainted,
            "node tainted and cordoned for the shutdown"
        );
        let record = ShutdownProgress {
            phase: ShutdownPhase::Draining,
            boot_id: self.boot_id.clone(),
            started_at,
            deadline: Time(deadline),
            pods_total: 0,
            pods_remaining: 0,
            blocking_pods: Vec::new(),
            cordoned_by_agent: applied.cordoned,
            tainted_by_agent: applied.tainted,
        };
        (record, at + left, left, resumed.is_some())
    }

    async fn record_progress(
        &self,
        state: &Arc<Mutex<State>>,
        progress: &Progress,
        announced: &mut Announced,
    ) {
        for blocked in &progress.blocking {
            if announced
                .blocked
                .insert(format!("{}/{}", blocked.namespace, blocked.name))
            {
                self.event(
                    EventType::Warning,
                    "EvictionBlocked",
                    format!(
                        "{}/{}: {} ({}); retrying until the stage deadline",
                        blocked.namespace,
                        blocked.name,
                        blocked.reason,
                        blocked.message.as_deref().unwrap_or("")
                    ),
                )
                .await;
            }
        }
        if !progress.returning.is_empty() && !announced.returning {
            announced.returning = true;
            let mut names: Vec<&str> = progress
                .returning
                .iter()
                .take(10)
                .map(String::as_str)
                .collect();
            if progress.returning.len() > names.len() {
                names.push("...");
            }
            self.event(
                EventType::Warning,
                "PodsWillReturn",
                format!(
                    "{} pods tolerate {SHUTDOWN_TAINT}; their controllers may put them back on this node: {}",
                    progress.returning.len(),
                    names.join(", ")
                ),
            )
            .await;
        }
        self.update(state, |s| {
            if let Some(r) = s.shutdown.as_mut() {
                r.pods_total = i32::try_from(progress.total).unwrap_or(i32::MAX);
                r.pods_remaining = i32::try_from(progress.remaining).unwrap_or(i32::MAX);
                r.blocking_pods = progress.blocking.iter().take(64).cloned().collect();
            }
        })
        .await;
    }

    /// A shutdown that is not going ahead (`why`): the lock again, and undo what the agent did.
    async fn cancelled(
        &self,
        state: &Arc<Mutex<State>>,
        manager: &ManagerProxy<'_>,
        held: &mut Option<OwnedFd>,
        why: record::Undo,
    ) -> Result<(), String> {
        tracing::warn!(
            why = why.says(),
            "shutdown not going ahead: taking the lock again and restoring the node"
        );
        if held.is_none() {
            *held = Some(self.inhibit(manager).await?);
        }
        let record = lock(state).shutdown.clone();
        if let Some(record) = record {
            let applied = Applied {
                cordoned: record.cordoned_by_agent,
                tainted: record.tainted_by_agent,
            };
            if let Err(e) = cordon::undo(&self.client, &self.node, SHUTDOWN_TAINT, &applied).await {
                tracing::warn!(error = %e, "restoring the node after a cancelled shutdown");
            }
            self.event(
                EventType::Normal,
                "ShutdownCancelled",
                format!(
                    "{}: lock taken again, what the agent did is undone",
                    why.says()
                ),
            )
            .await;
        }
        self.update(state, |s| {
            s.inhibitor.delay_held = true;
            s.inhibitor.last_acquired = Some(Time(Timestamp::now()));
            if let Some(r) = s.shutdown.as_mut() {
                r.phase = ShutdownPhase::Cancelled;
            }
        })
        .await;
        Ok(())
    }

    /// An Event about this node (best effort: a failure is logged; a slow one does not hold the
    /// shutdown).
    async fn event(&self, type_: EventType, reason: &str, note: String) {
        let node = crate::node_reference(&self.node);
        nodeward_runtime::events::briefly(self.events.spawn(node, type_, "Shutdown", reason, note))
            .await;
    }

    /// Changes the state and writes the guard's NodeReport fields when they changed.
    async fn update(&self, state: &Arc<Mutex<State>>, change: impl FnOnce(&mut State)) {
        let snapshot = {
            let mut s = lock(state);
            let before = (s.inhibitor.clone(), s.shutdown.clone());
            change(&mut s);
            if before == (s.inhibitor.clone(), s.shutdown.clone()) && s.written {
                return;
            }
            s.written = true;
            s.clone()
        };
        // Only what the guard owns: the reporter owns the rest of the status.
        let status = NodeReportStatus {
            inhibitor: Some(snapshot.inhibitor),
            shutdown: snapshot.shutdown,
            ..NodeReportStatus::default()
        };
        let reports: Api<NodeReport> = Api::all(self.client.clone());
        let apply = || write::apply(&reports, &self.node, Part::Status, FIELD_MANAGER, &status);
        let mut written = apply().await;
        if let Outcome::Gone(_) = written {
            // A shutdown can come before the reporter's first round: create the report here
            // (the reporter makes the Node its owner later).
            let report = crate::report::new_report(&self.node);
            let _ = reports.create(&Default::default(), &report).await;
            written = apply().await;
        }
        let written = written.required();
        if let Err(e) = written {
            tracing::warn!(error = %e, "writing the shutdown state to the NodeReport");
            // Written again with the next change, or the next session.
            lock(state).written = false;
        }
    }
}

/// Events already published during one drain (one per blocked pod, one for returning pods).
#[derive(Default)]
struct Announced {
    blocked: std::collections::HashSet<String>,
    returning: bool,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}
