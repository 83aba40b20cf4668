//! Reporting to the cluster: the node's conditions (server-side apply under the agent's own
//! field manager, written only when a condition changes) and the NodeReport (on every change
//! of the findings, and as a heartbeat). Failed writes are retried with backoff; detection
//! goes on meanwhile.

pub mod conditions;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::Node,
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams, PostParams},
};
use nodeward_api::{
    NodeReport,
    labels::AGENT_FIELD_MANAGER,
    report::{AgentMode, Finding as ReportedFinding},
};
use serde_json::json;
use tokio::sync::watch;

use self::conditions::{NodeCondition, aggregate};
use crate::{
    Error,
    backoff::Backoff,
    detect::Status,
    runner::{Current, Snapshot},
};

/// Who the agent is, for the NodeReport.
#[derive(Clone, Debug)]
pub struct Identity {
    pub node_name: String,
    pub mode: AgentMode,
    pub boot_id: Option<String>,
}

pub struct Reporter {
    client: Client,
    identity: Identity,
    heartbeat: Duration,
    /// The conditions last written to the Node, and when each took its current status.
    written: Option<Vec<NodeCondition>>,
    transitions: BTreeMap<String, (&'static str, Timestamp)>,
}

impl Reporter {
    pub fn new(client: Client, identity: Identity, heartbeat: Duration) -> Self {
        Self {
            client,
            identity,
            heartbeat,
            written: None,
            transitions: BTreeMap::new(),
        }
    }

    /// Writes what the snapshots say until the sender goes away.
    pub async fn run(mut self, mut snapshots: watch::Receiver<Snapshot>) {
        let mut heartbeat = tokio::time::interval(self.heartbeat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let mut report_due = true;
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    report_due = true;
                }
                _ = heartbeat.tick() => report_due = true,
                _ = async { tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)).await }, if retry_at.is_some() => {}
            }
            let snapshot = snapshots.borrow_and_update().clone();
            retry_at = None;
            let mut failed = false;
            if let Err(e) = self.write_conditions(&snapshot).await {
                tracing::warn!(error = %e, node = %self.identity.node_name, "writing node conditions failed; will retry");
                failed = true;
            }
            if report_due {
                match self.write_report(&snapshot).await {
                    Ok(()) => report_due = false,
                    Err(e) => {
                        tracing::warn!(error = %e, node = %self.identity.node_name, "writing the NodeReport failed; will retry");
                        failed = true;
                    }
                }
            }
            if failed {
                retry_at = Some(tokio::time::Instant::now() + backoff.next_delay());
            } else {
                backoff.reset();
            }
        }
    }

    /// Applies the node's conditions if they differ from what was last written. A Node that
    /// does not exist yet has no conditions to carry: nothing is written, and it is tried
    /// again with the next change or retry.
    async fn write_conditions(&mut self, snapshot: &Snapshot) -> Result<(), Error> {
        let desired = aggregate(snapshot.values().map(|c| &c.finding));
        if self.written.as_ref() == Some(&desired) || desired.is_empty() {
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let name = &self.identity.node_name;
        if self.written.is_none() {
            // First write since start: keep the transition times the Node already shows.
            match nodes
                .get_opt(name)
                .await
                .map_err(|e| Error::kube("reading", format!("node {name}"), e))?
            {
                Some(node) => {
                    for c in node.status.and_then(|s| s.conditions).unwrap_or_default() {
                        if let (Some(time), status) = (c.last_transition_time, c.status.as_str()) {
                            let status = match status {
                                "True" => Status::Problem.condition_status(),
                                "False" => Status::Ok.condition_status(),
                                _ => Status::Unknown.condition_status(),
                            };
                            self.transitions.insert(c.type_, (status, time.0));
                        }
                    }
                }
                None => return Ok(()),
            }
        }
        let now = Timestamp::now();
        let conditions: Vec<serde_json::Value> = desired
            .iter()
            .map(|c| {
                let since = match self.transitions.get(&c.type_) {
                    Some((status, since)) if *status == c.status => *since,
                    _ => now,
                };
                self.transitions.insert(c.type_.clone(), (c.status, since));
                json!({
                    "type": c.type_,
                    "status": c.status,
                    "reason": c.reason,
                    "message": c.message,
                    "lastTransitionTime": Time(since),
                    "lastHeartbeatTime": Time(now),
                })
            })
            .collect();
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "status": {"conditions": conditions},
        });
        nodes
            .patch_status(
                name,
                &PatchParams::apply(AGENT_FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| Error::kube("applying conditions to", format!("node {name}"), e))?;
        tracing::info!(node = %name, conditions = ?desired.iter().map(|c| (&c.type_, c.status)).collect::<Vec<_>>(), "node conditions written");
        self.written = Some(desired);
        Ok(())
    }

    async fn write_report(&self, snapshot: &Snapshot) -> Result<(), Error> {
        let reports: Api<NodeReport> = Api::all(self.client.clone());
        let name = &self.identity.node_name;
        let object = format!("NodeReport {name}");
        if reports
            .get_opt(name)
            .await
            .map_err(|e| Error::kube("reading", object.clone(), e))?
            .is_none()
        {
            let mut report = NodeReport::new(
                name,
                nodeward_api::NodeReportSpec {
                    node_name: name.clone(),
                },
            );
            report.metadata.labels = Some(
                [(
                    nodeward_api::labels::NODE_NAME_LABEL.to_owned(),
                    name.clone(),
                )]
                .into(),
            );
            // Owned by its Node, so that deleting the Node deletes the report.
            let node = Api::<Node>::all(self.client.clone())
                .get_opt(name)
                .await
                .map_err(|e| Error::kube("reading", format!("node {name}"), e))?;
            if let Some(uid) = node.and_then(|n| n.metadata.uid) {
                report.metadata.owner_references = Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: name.clone(),
                    uid,
                    ..OwnerReference::default()
                }]);
            }
            match reports.create(&PostParams::default(), &report).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(e) => return Err(Error::kube("creating", object, e)),
            }
        }
        let findings: Vec<ReportedFinding> = snapshot.values().map(reported).collect();
        let problems = findings.iter().filter(|f| f.status == "True").count();
        let patch = json!({
            "apiVersion": NodeReport::api_version(&()),
            "kind": NodeReport::kind(&()),
            "metadata": {"name": name},
            "status": {
                "agentVersion": env!("CARGO_PKG_VERSION"),
                "mode": self.identity.mode,
                "bootId": self.identity.boot_id,
                "heartbeatTime": Time(Timestamp::now()),
                "problems": problems,
                "findings": findings,
            },
        });
        reports
            .patch_status(
                name,
                &PatchParams::apply(AGENT_FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| Error::kube("applying the status of", object, e))?;
        Ok(())
    }
}

fn reported(current: &Current) -> ReportedFinding {
    let f = &current.finding;
    ReportedFinding {
        type_: f.condition.to_string(),
        status: f.status.condition_status().to_owned(),
        reason: f.reason.clone(),
        message: f.message.clone(),
        detector: f.detector.to_string(),
        since: Time(Timestamp::try_from(current.since).unwrap_or_else(|_| Timestamp::now())),
    }
}
