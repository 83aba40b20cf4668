//! The executor's host steps: runs a hook or the update on the host ([`crate::host::commands`]),
//! records it in the maintenance's `status.hostRuns` when it starts and when it ends (each
//! step's entry applied under a field manager of its own), with an Event; fails the
//! maintenance when one failed; moves an update that needs no reboot on to the health gate.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Api, ResourceExt, runtime::events::EventType};
use nodeward_api::{
    MaintenancePhase, NodeMaintenance,
    bounds::tail,
    labels::AGENT_FIELD_MANAGER,
    node::Applied,
    update::{HostRun, HostRunResult, HostStep, OUTPUT_LIMIT},
};
use nodeward_runtime::write::{self, Part};
use serde::Serialize;

use super::{
    executor::Executor,
    rollback,
    update::{self, Ended, Plan, Verdict},
};
use crate::policies;

/// The most of a run's output an Event quotes.
const EVENT_OUTPUT: usize = 512;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct HostRuns<'a> {
    host_runs: [&'a HostRun; 1],
}

fn ended(ran: &Result<crate::host::commands::Ran, String>) -> Ended {
    match ran {
        Err(why) => Ended::NotStarted(why.clone()),
        Ok(ran) => ran.code.map_or(Ended::Stopped, Ended::Exited),
    }
}

impl Executor {
    /// Runs `step` of `m` on the host and records how it ended, after `cause` when there is
    /// one (what a rollback undoes); returns the record.
    pub(super) async fn run_on_host(
        &self,
        m: &NodeMaintenance,
        step: HostStep,
        cause: Option<&str>,
    ) -> Result<Option<HostRun>, crate::Error> {
        policies::wait_for_admitting(m, &self.policies).await;
        let steps = policies::effective(m, &self.policies).await.host;
        let plan = match step {
            HostStep::Rollback => self.rollback_plan(m, &steps).await,
            _ => update::plan(step, &steps),
        };
        let Some(plan) = plan else {
            return Ok(None);
        };
        // A run the status shows started and not ended was cut short by this agent's restart:
        // the same unit, waited for (`run_logged`), under its first start time.
        let started_at = m
            .status
            .as_ref()
            .and_then(|s| s.host_runs.iter().find(|r| r.step == step && !r.finished()))
            .map_or_else(|| Time(Timestamp::now()), |r| r.started_at.clone());
        let mut run = HostRun {
            step,
            command: nodeward_api::bounds::cut(&plan.describe(), 1024),
            started_at,
            finished_at: None,
            result: None,
            exit_code: None,
            output: None,
            reboot: None,
            boot_id: Some(self.boot_id.clone()),
            message: Some(format!(
                "running on the host (timeout {}s)",
                plan.timeout.as_secs()
            )),
        };
        self.record(m, &run).await?;
        tracing::info!(maintenance = %m.name_any(), ?step, command = %run.command, "running on the host");
        self.normal_event(
            m,
            started_reason(step),
            format!("running {:?} on the host", run.command),
        )
        .await;
        let unit = format!(
            "nodeward-{}-{}.service",
            slug(step),
            m.uid().unwrap_or_default()
        );
        let ran = match &plan.unplannable {
            Some(why) => Err(why.clone()),
            None => crate::host::commands::run_logged(&unit, &plan.argv, plan.timeout).await,
        };
        let took = Duration::try_from(Timestamp::now().duration_since(run.started_at.0))
            .unwrap_or_default();
        let output = ran.as_ref().map(|r| r.output.clone()).unwrap_or_default();
        let verdict = self
            .reboot_verdict(&plan, update::judge(&plan, &ended(&ran), took))
            .await;
        run.finished_at = Some(Time(Timestamp::now()));
        run.result = Some(verdict.result);
        run.exit_code = verdict.exit_code;
        run.output = Some(tail(&output, OUTPUT_LIMIT)).filter(|o| !o.is_empty());
        run.reboot = verdict.reboot;
        let message = match cause {
            Some(cause) => format!("{cause}; {}", verdict.message),
            None => verdict.message.clone(),
        };
        run.message = Some(nodeward_api::bounds::cut(
            &message,
            nodeward_api::bounds::MESSAGE_LIMIT,
        ));
        self.record(m, &run).await?;
        let quoted = tail(&output, EVENT_OUTPUT);
        let note = if quoted.is_empty() {
            verdict.message.clone()
        } else {
            format!("{}; output: {quoted}", verdict.message)
        };
        let (type_, reason) = match verdict.result {
            HostRunResult::Succeeded => (EventType::Normal, succeeded_reason(step)),
            _ => (EventType::Warning, failed_reason(step)),
        };
        tracing::info!(maintenance = %m.name_any(), ?step, result = ?verdict.result, message = %verdict.message, "ran on the host");
        self.event(m, type_, reason, note).await;
        Ok(Some(run))
    }

    /// What undoes `m`'s update (None: none configured). A rollback that cannot be planned
    /// (nothing recorded to reinstall) is a plan that does not start, so that the run records
    /// why and the maintenance ends `RollbackFailed`.
    async fn rollback_plan(
        &self,
        m: &NodeMaintenance,
        steps: &policies::HostSteps,
    ) -> Option<Plan> {
        let rollback = steps.update.as_ref()?.rollback.as_ref()?;
        let status = m.status.clone().unwrap_or_default();
        let now = self.versions().await.or(status.versions_after);
        let planned = rollback::plan(rollback, status.versions_before.as_ref(), now.as_ref());
        Some(planned.unwrap_or_else(|why| Plan::unplannable(HostStep::Rollback, why)))
    }

    /// For a successful update whose exit code did not say whether a reboot is needed: asks
    /// the host by the plan's check. A check that cannot tell fails the update: rebooting
    /// blind, or not, could both be wrong.
    async fn reboot_verdict(&self, plan: &Plan, verdict: Verdict) -> Verdict {
        let (Some(check), HostRunResult::Succeeded, None) =
            (&plan.check, verdict.result, verdict.reboot)
        else {
            return verdict;
        };
        let ran = crate::host::commands::run(check.argv(), update::CHECK_TIMEOUT).await;
        let output = ran
            .as_ref()
            .map(|r| r.output.as_slice())
            .unwrap_or_default();
        match update::judge_check(check, &ended(&ran), output) {
            Ok(reboot) => Verdict {
                reboot: Some(reboot),
                message: format!(
                    "{}; {}",
                    verdict.message,
                    if reboot {
                        "it needs a reboot"
                    } else {
                        "no reboot needed"
                    }
                ),
                ..verdict
            },
            Err(why) => Verdict {
                result: HostRunResult::Failed,
                message: format!(
                    "{}, but whether it needs a reboot is unknown: {why}",
                    verdict.message
                ),
                ..verdict
            },
        }
    }

    /// Writes `run` as `m`'s entry for its step.
    async fn record(&self, m: &NodeMaintenance, run: &HostRun) -> Result<(), crate::Error> {
        let api = Api::<NodeMaintenance>::all(self.client.clone());
        let manager = format!("{AGENT_FIELD_MANAGER}/host-run-{:?}", run.step);
        let fields = HostRuns { host_runs: [run] };
        write::apply(&api, &m.name_any(), Part::Status, &manager, &fields)
            .await
            .required()?;
        Ok(())
    }

    /// A host step failed: the node goes back in service and the maintenance fails.
    pub(super) async fn host_failed(
        &self,
        m: &NodeMaintenance,
        applied: &Applied,
        step: HostStep,
        runs: &[HostRun],
    ) -> Result<(), crate::Error> {
        let why = runs
            .iter()
            .find(|r| r.step == step)
            .and_then(|r| r.message.clone())
            .unwrap_or_else(|| format!("{step:?} failed"));
        self.fail(m, applied, failed_reason(step), why).await
    }

    /// What the host runs now (for `versionsBefore` and `versionsAfter`): a fresh reading, or
    /// the last one when none comes in time.
    pub(super) async fn versions(&self) -> Option<nodeward_api::inventory::Inventory> {
        let fresh = self.inventories.fresh().await;
        fresh.or_else(|| {
            let latest = self.inventories.latest();
            let at = latest.as_ref().and_then(|i| i.read_at.as_ref()).map(|t| t.0);
            tracing::warn!(node = %self.node, read_at = ?at, "no fresh inventory reading in time: recording the last one");
            latest
        })
    }

    /// The update needs no reboot: Verifying at once, for the health gate.
    pub(super) async fn skip_reboot(&self, m: &NodeMaintenance) -> Result<(), crate::Error> {
        let message = "updated; no reboot needed: waiting for the health gate";
        let after = self.versions().await;
        self.transition(m, MaintenancePhase::Verifying, message, |s, _| {
            s.versions_after = after;
        })
        .await?;
        self.normal_event(m, "RebootNotNeeded", message).await;
        Ok(())
    }
}

/// `step` in a unit name.
fn slug(step: HostStep) -> &'static str {
    match step {
        HostStep::BeforeDrain => "before-drain",
        HostStep::AfterDrain => "after-drain",
        HostStep::Update => "update",
        HostStep::AfterBoot => "after-boot",
        HostStep::Rollback => "rollback",
    }
}

fn started_reason(step: HostStep) -> &'static str {
    match step {
        HostStep::Update => "UpdateStarted",
        HostStep::Rollback => "RollbackStarted",
        _ => "HookStarted",
    }
}

fn succeeded_reason(step: HostStep) -> &'static str {
    match step {
        HostStep::Update => "Updated",
        HostStep::Rollback => "RollbackRan",
        _ => "HookSucceeded",
    }
}

fn failed_reason(step: HostStep) -> &'static str {
    match step {
        HostStep::Update => "UpdateFailed",
        HostStep::Rollback => "RollbackFailed",
        _ => "HookFailed",
    }
}
