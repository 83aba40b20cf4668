//! Reporting to the cluster: the node's conditions (server-side apply under the agent's own
//! field manager, written only when a condition changes) and the NodeReport (only when
//! something in it changes: the findings, the pauses obeyed, the peers found unreachable; the
//! agent's liveness is its Lease, [`crate::liveness`]). Failed writes are retried with
//! backoff; detection goes on meanwhile. Once per heartbeat interval the agent reads whether
//! its NodeReport is still there (from the API server's cache) and makes it again if it was
//! deleted, by hand or with a Node registered again under its name.

pub mod conditions;
pub mod events;
pub mod floods;
mod nodereport;

pub use nodereport::new_report;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Node, NodeCondition as Condition, NodeStatus},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{Api, Client, Resource, runtime::events::EventType};
use nodeward_api::{
    labels::AGENT_FIELD_MANAGER,
    report::PauseAcknowledgement,
    report::{AgentMode, KernelLogSource},
};
use nodeward_runtime::{
    ApiError, WRITE_REFUSED,
    events::Events,
    stop::{self, Stopping},
    write::{self, Part},
};
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

use self::{
    conditions::{NodeCondition, aggregate, is_node_condition, owned_types},
    events::transitions,
};
use crate::{
    Error,
    backoff::Backoff,
    detect::kernel_log::{LogEvent, LogName, NodeEvent},
    detect::peers::Sightings,
    detect::{ForReports, Status},
    fencing::Claim,
    flags::{self, Flag},
    liveness::ApiContact,
    metrics::{Metrics, TypeLabels},
    runner::Snapshot,
    server::Readiness,
};

/// The flags of the `reporting` section.
pub fn flags() -> Vec<Flag> {
    flags::declare! {
        "heartbeat-interval" ("NODEWARD_HEARTBEAT_INTERVAL") => "heartbeatInterval": Text, "How often the agent's liveness is written and its report looked at, e.g. 60s";
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ReportingConfig {
    /// How often the agent renews its Lease (its liveness; the only periodic write). The
    /// coordinator's `deadlines.agentHeartbeat` must be longer.
    #[serde(deserialize_with = "crate::values::duration")]
    pub heartbeat_interval: Duration,
}

impl Default for ReportingConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: DEFAULT_HEARTBEAT,
        }
    }
}

/// One renewal per agent every 5 minutes: 17 writes/s for 5,000 nodes, small ones.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(300);

impl ReportingConfig {
    pub fn validate(&self, place: &str) -> Result<(), String> {
        if self.heartbeat_interval < Duration::from_secs(1) {
            return Err(format!(
                "{place}.heartbeatInterval: must be at least 1s, e.g. 5m"
            ));
        }
        if self.heartbeat_interval > Duration::from_secs(3600) {
            return Err(format!(
                "{place}.heartbeatInterval: must be at most 1h (the coordinator counts an agent silent for longer than deadlines.agentHeartbeat as gone), e.g. 5m"
            ));
        }
        Ok(())
    }
}

/// At most this many Events at once, then one per [`EVENT_REFILL`], whatever they are about.
const EVENT_BURST: u32 = 20;
const EVENT_REFILL: Duration = Duration::from_secs(10);
/// Within that, per reason of a followed log's Events: a flood of one reason is summarised
/// ([`floods`]) and leaves room for the others.
const LOG_EVENT_BURST: u32 = 5;
const LOG_EVENT_REFILL: Duration = Duration::from_secs(30);
/// How often held-back log Events are looked at for a summary.
const SUMMARY_CHECK: Duration = Duration::from_secs(1);

/// Who the agent is, for the NodeReport.
#[derive(Clone, Debug)]
pub struct Identity {
    pub node_name: String,
    pub mode: AgentMode,
    pub boot_id: Option<String>,
}

/// The readiness gate the first written NodeReport opens.
pub const FIRST_REPORT: &str = "the first detection round has not been reported yet";

pub struct Reporter {
    client: Client,
    identity: Identity,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    events: Events,
    /// The conditions the Node carries as far as the agent knows (read once, then as
    /// written), and when each took its current status.
    written: Option<Vec<NodeCondition>>,
    /// Per condition type, the status it has and since when.
    status_since: BTreeMap<String, (Status, Timestamp)>,
    /// Report-only findings (no Node to carry them) as last published in Events.
    report_only: Vec<NodeCondition>,
    /// The NodeReport exists and, once the Node does, is owned by it.
    report_owned: bool,
    /// The peer detector's sightings, when it runs.
    sightings: Option<Sightings>,
    /// Where the kernel log is read, and per log the place of the last record published as an
    /// Event on this boot.
    published: (KernelLogSource, BTreeMap<LogName, u64>),
    /// Finding types of events-only checks: in the NodeReport and Events, never on the Node.
    events_only: BTreeSet<String>,
    /// How often to look whether the NodeReport was deleted.
    recheck: Duration,
    /// The followed logs' Events per reason, within their allowance or summarised.
    floods: floods::Floods,
    /// The condition types this agent's detectors write (until each first reports, the Node's
    /// is kept as it is); another that the agent applied before is removed.
    writing: BTreeSet<String>,
    /// The fencing the report announces, when the agent fences its node.
    claim: Option<Claim>,
    /// Told of each heartbeat the API server took.
    contact: ApiContact,
}

impl Reporter {
    pub fn new(
        client: Client,
        identity: Identity,
        metrics: Arc<Metrics>,
        readiness: Arc<Readiness>,
    ) -> Self {
        Self {
            events: crate::events(client.clone(), &identity.node_name)
                .limited(EVENT_BURST, EVENT_REFILL),
            client,
            identity,
            metrics,
            readiness,
            written: None,
            status_since: BTreeMap::new(),
            report_only: Vec::new(),
            report_owned: false,
            sightings: None,
            published: (KernelLogSource::Kmsg, BTreeMap::new()),
            events_only: BTreeSet::new(),
            recheck: DEFAULT_HEARTBEAT,
            floods: floods::Floods::new(LOG_EVENT_BURST, LOG_EVENT_REFILL),
            writing: BTreeSet::new(),
            claim: None,
            contact: ApiContact::default(),
        }
    }

    /// Tells `contact` of each heartbeat the API server took.
    pub fn telling(mut self, contact: ApiContact) -> Self {
        self.contact = contact;
        self
    }

    /// Announces the fencing `claim` wants (and takes it back before the agent stops).
    pub fn announcing(mut self, claim: Claim) -> Self {
        self.claim = Some(claim);
        self
    }

    /// The condition types the detectors write ([`Detector::condition`]).
    pub fn writing(mut self, types: BTreeSet<String>) -> Self {
        self.writing = types;
        self
    }

    /// Looks every `every` whether the NodeReport was deleted (the heartbeat interval).
    pub fn with_recheck(mut self, every: Duration) -> Self {
        self.recheck = every;
        self
    }

    /// Publishes what the detectors' sections started: the peers' sightings, the followed
    /// logs' places (read from the NodeReport at start, kept until newer ones), and which
    /// findings are events-only (node-problem-detector's temporary rules).
    pub fn publishing(mut self, started: ForReports) -> Self {
        self.sightings = started.sightings;
        self.published = (
            started.log_source.unwrap_or(KernelLogSource::Kmsg),
            started.published,
        );
        self.events_only = started.events_only;
        self
    }

    /// Whether findings of this type become a Node condition.
    fn on_node(&self, type_: &str) -> bool {
        is_node_condition(type_) && !self.events_only.contains(type_)
    }

    /// Writes what the snapshots say, and publishes the kernel-log Events, until the snapshot
    /// sender goes away.
    pub async fn run(
        mut self,
        mut snapshots: watch::Receiver<Snapshot>,
        mut kernel_events: mpsc::Receiver<LogEvent>,
        mut pauses: watch::Receiver<Vec<PauseAcknowledgement>>,
        mut stopping: Stopping,
    ) {
        let mut pauses_open = true;
        let mut kernel_open = true;
        let mut sightings = self.sightings.as_ref().map(Sightings::changes);
        let mut sightings_open = sightings.is_some();
        let mut claims = self.claim.as_ref().map(Claim::changes);
        let mut claims_open = claims.is_some();
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let mut report_due = true;
        let mut retry_at: Option<tokio::time::Instant> = None;
        let mut recheck =
            tokio::time::interval_at(tokio::time::Instant::now() + self.recheck, self.recheck);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                // Between writes: a write under way is finished first.
                () = stop::asked(&mut stopping) => {
                    self.take_back_claim(&snapshots, &pauses).await;
                    return;
                }
                changed = async { claims.as_mut()?.changed().await.ok() }, if claims_open => {
                    match changed {
                        Some(()) => report_due = true,
                        None => claims_open = false,
                    }
                }
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    report_due = true;
                }
                changed = async { sightings.as_mut()?.changed().await.ok() }, if sightings_open => {
                    match changed {
                        Some(()) => report_due = true,
                        None => sightings_open = false,
                    }
                }
                changed = pauses.changed(), if pauses_open => {
                    match changed {
                        Ok(()) => report_due = true,
                        Err(_) => pauses_open = false,
                    }
                }
                event = kernel_events.recv(), if kernel_open => {
                    match event {
                        Some(first) => {
                            self.publish_logged(first, &mut kernel_events).await;
                            report_due = true;
                        }
                        None => kernel_open = false,
                    }
                }
                () = tokio::time::sleep(SUMMARY_CHECK), if self.floods.holding() => {
                    let due = self.floods.due(std::time::Instant::now());
                    let node = crate::node_reference(&self.identity.node_name);
                    self.publish(&node, due).await;
                }
                _ = async { tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)).await }, if retry_at.is_some() => {}
                _ = recheck.tick(), if !report_due => {
                    if self.report_deleted().await {
                        tracing::info!(node = %self.identity.node_name, "the NodeReport was deleted; writing it again");
                        self.report_owned = false;
                        report_due = true;
                    }
                }
            }
            // A snapshot that changed while the last write was on its way counts whichever arm
            // woke the loop: taking it below marks it seen, and its own arm would not fire.
            if snapshots.has_changed().unwrap_or(false) {
                report_due = true;
            }
            let snapshot = snapshots.borrow_and_update().clone();
            retry_at = None;
            let acknowledged = report_due.then(|| pauses.borrow_and_update().clone());
            let failed = self
                .write(&snapshot, acknowledged.as_deref(), &mut report_due)
                .await;
            if failed {
                retry_at = Some(tokio::time::Instant::now() + backoff.next_delay());
            } else {
                backoff.reset();
            }
        }
    }

    /// Writes the node's conditions and, when `acknowledged` (the pauses obeyed) is given, the
    /// NodeReport (no longer due once written); whether a write failed.
    async fn write(
        &mut self,
        snapshot: &Snapshot,
        acknowledged: Option<&[PauseAcknowledgement]>,
        report_due: &mut bool,
    ) -> bool {
        let mut failed = false;
        if let Err(e) = self.write_conditions(snapshot).await {
            tracing::warn!(error = %e, node = %self.identity.node_name, "writing node conditions failed; will retry");
            self.refused(&e).await;
            failed = true;
        }
        let Some(acknowledged) = acknowledged else {
            return failed;
        };
        let result = self.write_report(snapshot, acknowledged).await;
        self.metrics.api_write("nodereports/status", result.is_ok());
        match result {
            Ok(()) => {
                *report_due = false;
                self.readiness.pass(FIRST_REPORT);
            }
            Err(e) => {
                tracing::warn!(error = %e, node = %self.identity.node_name, "writing the NodeReport failed; will retry");
                self.refused(&e).await;
                failed = true;
            }
        }
        failed
    }

    /// Publishes `first` of the followed logs' Events and those already queued behind it
    /// (those past their reason's allowance are held for a summary, and lost if the agent stops
    /// first), and records where each log stands (one report then records the last).
    async fn publish_logged(&mut self, first: LogEvent, queued: &mut mpsc::Receiver<LogEvent>) {
        let node = crate::node_reference(&self.identity.node_name);
        let mut next = Some(first);
        while let Some(LogEvent {
            event,
            log,
            sequence,
        }) = next
        {
            let now = std::time::Instant::now();
            let allowed = self.floods.offer(event, now);
            self.publish(&node, allowed.into_iter().collect()).await;
            self.published.1.insert(log, sequence);
            next = queued.try_recv().ok();
        }
    }

    /// Applies the node's conditions if they differ from what the Node carries, and publishes
    /// an Event for each problem that started or cleared. A Node that does not exist yet has
    /// no conditions to carry: nothing is written until it does.
    async fn write_conditions(&mut self, snapshot: &Snapshot) -> Result<(), Error> {
        let desired = aggregate(
            snapshot
                .values()
                .map(|c| &c.finding)
                .filter(|f| self.on_node(&f.condition)),
        );
        for c in &desired {
            let problem = i64::from(c.status == Status::Problem);
            self.metrics
                .finding
                .get_or_create(&TypeLabels {
                    r#type: c.type_.clone(),
                })
                .set(problem);
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let name = self.identity.node_name.clone();
        if self.written.is_none() {
            // First look since start: what the Node already carries (a restarted agent writes
            // nothing and emits no Event when nothing changed).
            let Some(node) = nodes
                .get_opt(&name)
                .await
                .map_err(|e| ApiError::new("reading", format!("node {name}"), e))?
            else {
                return Ok(());
            };
            // Besides the detectors' types, those the agent applied before (a check since
            // removed from its configuration): carried, so that the next apply leaves them
            // out and the API server removes them.
            let owned = owned_types(
                node.metadata.managed_fields.as_deref().unwrap_or_default(),
                AGENT_FIELD_MANAGER,
            );
            let mut carried = Vec::new();
            for c in node.status.and_then(|s| s.conditions).unwrap_or_default() {
                let written =
                    |t: &String| desired.iter().any(|d| &d.type_ == t) || self.writing.contains(t);
                if !written(&c.type_) && !owned.contains(&c.type_) {
                    continue;
                }
                if !written(&c.type_) {
                    tracing::info!(condition = %c.type_, "removing a condition no check of this agent writes any more");
                }
                let status = Status::of_condition(&c.status);
                if let Some(time) = c.last_transition_time {
                    self.status_since.insert(c.type_.clone(), (status, time.0));
                }
                carried.push(NodeCondition {
                    type_: c.type_,
                    status,
                    reason: c.reason.unwrap_or_default(),
                    message: c.message.unwrap_or_default(),
                });
            }
            carried.sort_by(|a, b| a.type_.cmp(&b.type_));
            self.written = Some(carried);
        }
        let before = self.written.clone().unwrap_or_default();
        let desired = self.kept_until_reported(desired, &before);
        if before == desired {
            return Ok(());
        }
        let now = Timestamp::now();
        let conditions: Vec<Condition> = desired
            .iter()
            .map(|c| {
                let since = match self.status_since.get(&c.type_) {
                    Some((status, since)) if *status == c.status => *since,
                    _ => now,
                };
                self.status_since.insert(c.type_.clone(), (c.status, since));
                Condition {
                    type_: c.type_.clone(),
                    status: c.status.condition_status().to_owned(),
                    reason: Some(c.reason.clone()),
                    message: Some(c.message.clone()),
                    last_transition_time: Some(Time(since)),
                    last_heartbeat_time: Some(Time(now)),
                }
            })
            .collect();
        let Some(node) = self.apply_conditions(&nodes, &name, conditions).await? else {
            // The Node was deleted: its conditions go to the next one, as to a first, once the
            // kubelet registers it again.
            tracing::info!(node = %name, "the Node is gone: its conditions are written once it is registered again");
            self.written = None;
            return Ok(());
        };
        tracing::info!(node = %name, conditions = ?desired.iter().map(|c| (&c.type_, c.status.condition_status())).collect::<Vec<_>>(), "node conditions written");
        self.written = Some(desired.clone());
        self.publish(&node.object_ref(&()), transitions(&before, &desired))
            .await;
        Ok(())
    }

    /// `desired` with what the Node carries of the detectors' types that have not reported yet
    /// (an apply without them would remove them): each is the agent's until it is judged.
    fn kept_until_reported(
        &self,
        mut desired: Vec<NodeCondition>,
        before: &[NodeCondition],
    ) -> Vec<NodeCondition> {
        let unreported: Vec<NodeCondition> = before
            .iter()
            .filter(|c| self.writing.contains(&c.type_))
            .filter(|c| !desired.iter().any(|d| d.type_ == c.type_))
            .cloned()
            .collect();
        desired.extend(unreported);
        desired.sort_by(|a, b| a.type_.cmp(&b.type_));
        desired
    }

    /// Applies `conditions` to the Node `name` (the agent owns them; the kubelet's stay): the
    /// Node as written, `None` if it is gone.
    async fn apply_conditions(
        &self,
        nodes: &Api<Node>,
        name: &str,
        conditions: Vec<Condition>,
    ) -> Result<Option<Node>, Error> {
        let status = NodeStatus {
            conditions: Some(conditions),
            ..NodeStatus::default()
        };
        let applied = write::apply(nodes, name, Part::Status, AGENT_FIELD_MANAGER, &status).await;
        self.metrics.api_write("nodes/status", applied.is_written());
        Ok(applied.or_gone()?)
    }

    /// A write the cluster refused, as a Warning Event about the Node: who looks at it sees
    /// why its conditions or report do not change (repeats count in the Event's series).
    async fn refused(&mut self, e: &crate::Error) {
        let Some(refused) = e.refusal() else { return };
        let node = crate::node_reference(&self.identity.node_name);
        let note = format!("the API server refused nodeward-agent's write: {refused}");
        let published = self
            .events
            .publish(&node, EventType::Warning, "Report", WRITE_REFUSED, note)
            .await;
        if let Some(published) = published {
            self.metrics.api_write("events", published);
        }
    }

    /// Publishes Events about `reference`, within the rate limit.
    async fn publish(
        &mut self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        events: Vec<NodeEvent>,
    ) {
        for event in events {
            let type_ = if event.warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            let published = self
                .events
                .publish(reference, type_, "Detect", &event.reason, event.note)
                .await;
            if let Some(published) = published {
                self.metrics.api_write("events", published);
            }
        }
    }
}

#[cfg(test)]
mod tests;
