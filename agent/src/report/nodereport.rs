//! The NodeReport: written when something in it changes (its identity, the findings, the
//! pauses obeyed, the peers' sightings, the fencing it announces, where the followed logs stand),
//! made again when it was deleted, owned by its Node once there is one.

use k8s_openapi::{
    api::core::v1::Node,
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
    jiff::Timestamp,
};
use kube::{Api, Resource, api::GetParams};
use nodeward_api::{
    NodeReport, NodeReportStatus,
    bounds::{MESSAGE_LIMIT, cut},
    labels::AGENT_FIELD_MANAGER,
    report::{Finding as ReportedFinding, PauseAcknowledgement},
};
use nodeward_runtime::{
    ApiError,
    write::{self, Part},
};
use tokio::sync::watch;

use super::{Reporter, aggregate, transitions};
use crate::{
    Error,
    detect::{Status, kernel_log::LogName, peers::Sightings},
    fencing::Claim,
    runner::{Current, Snapshot},
};

impl Reporter {
    /// A stopping agent's last write, when the report announces fencing: without it (the
    /// fencing stops its watchdog only once it is written).
    pub(super) async fn take_back_claim(
        &mut self,
        snapshots: &watch::Receiver<Snapshot>,
        pauses: &watch::Receiver<Vec<PauseAcknowledgement>>,
    ) {
        let Some(claim) = &self.claim else { return };
        if claim.written().is_none() {
            return;
        }
        claim.want(None);
        let snapshot = snapshots.borrow().clone();
        let acknowledged = pauses.borrow().clone();
        if let Err(e) = self.write_report(&snapshot, &acknowledged).await {
            tracing::error!(error = %e, node = %self.identity.node_name, "taking back the fencing announcement failed");
        }
    }

    pub(super) async fn write_report(
        &mut self,
        snapshot: &Snapshot,
        pauses: &[PauseAcknowledgement],
    ) -> Result<(), Error> {
        let sent = std::time::Instant::now();
        let claim = self.claim.as_ref().and_then(Claim::wanted);
        let reports: Api<NodeReport> = Api::all(self.client.clone());
        let name = self.identity.node_name.clone();
        if !self.report_owned {
            self.report_owned = self.ensure_report(&reports).await?;
        }
        let findings: Vec<ReportedFinding> = snapshot
            .values()
            .filter(|c| c.finding.status != Status::Skipped)
            .map(reported)
            .collect();
        let problems = findings.iter().filter(|f| f.status == "True").count();
        // Only the fields the reporter owns: the shutdown guard owns the inhibitor and the
        // shutdown under a field manager of its own.
        let status = NodeReportStatus {
            agent_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            mode: Some(self.identity.mode),
            boot_id: self.identity.boot_id.clone(),
            heartbeat_time: Some(Time(Timestamp::now())),
            problems: i32::try_from(problems).unwrap_or(i32::MAX),
            findings,
            pause_acknowledgements: pauses.to_vec(),
            peer_sightings: self
                .sightings
                .as_ref()
                .map(Sightings::latest)
                .unwrap_or_default(),
            kernel_log: self.kernel_position(),
            journal_log: self.journal_positions(),
            fencing: claim.clone(),
            ..NodeReportStatus::default()
        };
        let applied =
            write::apply(&reports, &name, Part::Status, AGENT_FIELD_MANAGER, &status).await;
        let report = match applied {
            write::Outcome::Written(report) => report,
            write::Outcome::Gone(e) => {
                // Deleted (with its Node, whose dependent it is, or by hand): the retry makes
                // it again.
                self.report_owned = false;
                return Err(e.into());
            }
            write::Outcome::Conflict(e) | write::Outcome::Failed(e) => return Err(e.into()),
        };
        self.contact.took(sent);
        if let Some(c) = &self.claim {
            c.wrote(claim);
        }
        // Report-only findings (an unregistered kubelet, events-only checks) have no Node
        // condition: their Events go on the NodeReport, named as the Node is.
        let report_only = aggregate(
            snapshot
                .values()
                .map(|c| &c.finding)
                .filter(|f| !self.on_node(&f.condition)),
        );
        if report_only != self.report_only {
            let before = std::mem::replace(&mut self.report_only, report_only.clone());
            self.publish(&report.object_ref(&()), transitions(&before, &report_only))
                .await;
        }
        Ok(())
    }

    /// Where the kernel log's Events stand, for the report (none before the first).
    fn kernel_position(&self) -> Option<nodeward_api::report::KernelLogPosition> {
        let (source, places) = &self.published;
        Some(nodeward_api::report::KernelLogPosition {
            boot_id: self.identity.boot_id.clone()?,
            source: *source,
            sequence: i64::try_from(*places.get(&LogName::Kernel)?).ok()?,
        })
    }

    /// Where each journal monitor's Events stand, for the report.
    fn journal_positions(&self) -> Vec<nodeward_api::report::JournalLogPosition> {
        let Some(boot_id) = &self.identity.boot_id else {
            return Vec::new();
        };
        self.published
            .1
            .iter()
            .filter_map(|(log, place)| match log {
                LogName::Journal(identifier) => Some(nodeward_api::report::JournalLogPosition {
                    identifier: identifier.clone(),
                    boot_id: boot_id.clone(),
                    sequence: i64::try_from(*place).ok()?,
                }),
                LogName::Kernel => None,
            })
            .collect()
    }

    /// Whether the NodeReport is gone, read from the API server's cache. A failed read says
    /// no: the next write or look finds out.
    pub(super) async fn report_deleted(&self) -> bool {
        let reports: Api<NodeReport> = Api::all(self.client.clone());
        match reports
            .get_metadata_opt_with(&self.identity.node_name, &GetParams::any())
            .await
        {
            Ok(found) => found.is_none(),
            Err(e) => {
                tracing::debug!(error = %e, node = %self.identity.node_name, "looking for the NodeReport failed");
                false
            }
        }
    }

    /// Creates the NodeReport if it is missing and makes its Node its owner once the Node
    /// exists (so that deleting the Node deletes the report). Returns whether it is owned.
    async fn ensure_report(&self, reports: &Api<NodeReport>) -> Result<bool, Error> {
        let name = &self.identity.node_name;
        let object = format!("NodeReport {name}");
        let node = Api::<Node>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(|e| ApiError::new("reading", format!("node {name}"), e))?;
        let owner = node.and_then(|n| n.metadata.uid).map(|uid| OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.clone(),
            uid,
            ..OwnerReference::default()
        });
        let existing = reports
            .get_opt(name)
            .await
            .map_err(|e| ApiError::new("reading", object.clone(), e))?;
        match existing {
            None => {
                let mut report = new_report(name);
                report.metadata.owner_references = owner.clone().map(|o| vec![o]);
                let created = write::create(reports, &report).await;
                self.metrics.api_write("nodereports", created.is_written());
                match created {
                    write::Outcome::Written(_) => {}
                    write::Outcome::Conflict(_) => return Ok(false),
                    write::Outcome::Gone(e) | write::Outcome::Failed(e) => return Err(e.into()),
                }
            }
            Some(report)
                if owner.is_some()
                    && report
                        .metadata
                        .owner_references
                        .as_ref()
                        .is_none_or(Vec::is_empty) =>
            {
                if let Some(owner) = &owner {
                    let applied =
                        write::apply_owner(reports, name, AGENT_FIELD_MANAGER, owner).await;
                    self.metrics.api_write("nodereports", applied.is_written());
                    applied.required()?;
                }
            }
            Some(_) => {}
        }
        Ok(owner.is_some())
    }
}

fn reported(current: &Current) -> ReportedFinding {
    let f = &current.finding;
    ReportedFinding {
        type_: f.condition.to_string(),
        status: f.status.condition_status().to_owned(),
        reason: cut(&f.reason, 1024),
        message: cut(&f.message, MESSAGE_LIMIT),
        detector: f.detector.to_string(),
        since: Time(Timestamp::try_from(current.since).unwrap_or_else(|_| Timestamp::now())),
    }
}

/// A new, empty NodeReport for `node`, labelled with its name (for list selectors).
pub fn new_report(node: &str) -> NodeReport {
    let mut report = NodeReport::new(
        node,
        nodeward_api::NodeReportSpec {
            node_name: node.to_owned(),
        },
    );
    report.metadata.labels = nodeward_api::labels::naming_node(node);
    report
}
