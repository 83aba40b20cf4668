//! Carrying out a round's surge work ([`nodeward_decide::round::surge`]) for one maintenance: the
//! finalizer first when a raise is due, the record before the raise, the scale changes, what
//! they did, and the finalizer off once nothing stays raised. Each write is a compare-and-swap
//! on the maintenance, so a step cut short is redone from the record by the next round.

use kube::{Api, ResourceExt, runtime::events::EventType};
use nodeward_api::{
    NodeMaintenance,
    labels::SURGE_FINALIZER,
    maintenance::{Surge, SurgeState},
};

use super::{Controller, write::Writer};
use nodeward_decide::round::{
    Objects,
    surge::{Finalizer, Work},
};

use crate::metrics::Applied;
use crate::workloads::{self, Scaled};
use nodeward_runtime::write::Outcome;

impl Controller {
    /// Carries out one maintenance's surge work ([`nodeward_decide::round::surge`]).
    pub(super) async fn surge(&mut self, objects: &Objects, work: &Work) -> Applied {
        match Self::maintenance(objects, &work.maintenance) {
            Some(m) => self.writer.surge(m, work).await,
            None => Applied::Gone,
        }
    }
}

impl Writer {
    /// The steps of `work` up to the first that fails (the next round goes on from the record).
    pub(super) async fn surge(&self, current: &NodeMaintenance, work: &Work) -> Applied {
        let mut current = current.clone();
        let mut applied = Applied::Unchanged;
        if work.finalizer == Finalizer::Add {
            match self.surge_finalizer(&current, true).await {
                Ok(updated) => current = updated,
                Err(refused) => return refused,
            }
            applied = Applied::Written;
        }
        let recorded = current.status.as_ref().map(|s| &s.surges);
        if recorded != Some(&work.surges) {
            match self
                .written_maintenance(&current, |s| s.surges = work.surges.clone())
                .await
            {
                Ok(written) => current = written,
                Err(refused) => return refused,
            }
            applied = Applied::Written;
        }
        let mut surges = work.surges.clone();
        for &index in &work.raise {
            if let Some(surge) = surges.get_mut(index) {
                self.raise(&current, surge).await;
            }
        }
        for &index in &work.restore {
            if let Some(surge) = surges.get_mut(index) {
                self.restore(&current, surge).await;
            }
        }
        if surges != work.surges {
            match self
                .written_maintenance(&current, |s| s.surges = surges.clone())
                .await
            {
                Ok(written) => current = written,
                Err(refused) => return refused,
            }
            applied = Applied::Written;
        }
        let raised = surges.iter().any(|s| s.state.raised());
        let has = current.finalizers().iter().any(|f| f == SURGE_FINALIZER);
        if has && !raised {
            if let Err(refused) = self.surge_finalizer(&current, false).await {
                return refused;
            }
            applied = Applied::Written;
        }
        applied
    }

    /// Raises the Deployment of `surge` to its recorded count plus one.
    async fn raise(&self, m: &NodeMaintenance, surge: &mut Surge) {
        let from = surge.replicas.unwrap_or(1);
        let what = format!("Deployment {}/{}", surge.namespace, surge.deployment);
        match workloads::scale(
            &self.client,
            &surge.namespace,
            &surge.deployment,
            from,
            from + 1,
        )
        .await
        {
            Ok(Scaled::Set) => {
                tracing::info!(maintenance = %m.name_any(), deployment = %what, from, "surged before the drain evicts its pod");
                self.event(
                    m,
                    EventType::Normal,
                    "Surged",
                    format!(
                        "raised {what} from {from} to {} replicas before its pod on {} is evicted",
                        from + 1,
                        m.spec.node_name
                    ),
                );
            }
            Ok(Scaled::Already | Scaled::Changed(_)) => {}
            Ok(Scaled::Gone) => {
                surge.state = SurgeState::Restored;
                surge.message = Some(format!("{what} is gone"));
            }
            Err(e) => {
                tracing::warn!(maintenance = %m.name_any(), error = %e, "surging before the drain; retried next round");
            }
        }
    }

    /// Brings the Deployment of `surge` back to its recorded count, unless someone else
    /// changed it since; either way the surge is over (`Restored`, the message says which).
    async fn restore(&self, m: &NodeMaintenance, surge: &mut Surge) {
        let to = surge.replicas.unwrap_or(1);
        let what = format!("Deployment {}/{}", surge.namespace, surge.deployment);
        let message = match workloads::scale(
            &self.client,
            &surge.namespace,
            &surge.deployment,
            to + 1,
            to,
        )
        .await
        {
            Ok(Scaled::Set | Scaled::Already) => format!("restored {what} to {to} replicas"),
            Ok(Scaled::Changed(n)) => {
                format!("left {what} at {n} replicas: someone changed it during the surge")
            }
            Ok(Scaled::Gone) => format!("{what} is gone"),
            Err(e) => {
                tracing::warn!(maintenance = %m.name_any(), error = %e, "restoring a surged Deployment; retried next round");
                return;
            }
        };
        tracing::info!(maintenance = %m.name_any(), %message, "surge over");
        self.event(m, EventType::Normal, "SurgeRestored", message.clone());
        surge.state = SurgeState::Restored;
        surge.message = Some(message);
    }

    /// Adds or removes the surge finalizer (a compare-and-swap on the finalizer list);
    /// returns the object as patched.
    async fn surge_finalizer(
        &self,
        m: &NodeMaintenance,
        present: bool,
    ) -> Result<NodeMaintenance, Applied> {
        let mut finalizers: Vec<String> = m
            .finalizers()
            .iter()
            .filter(|f| *f != SURGE_FINALIZER)
            .cloned()
            .collect();
        if present {
            finalizers.push(SURGE_FINALIZER.to_owned());
        }
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        match nodeward_runtime::write::swap_finalizers(&api, m, &finalizers).await {
            Outcome::Written(patched) => Ok(patched),
            refused @ (Outcome::Conflict(_) | Outcome::Gone(_)) => Err(Applied::of(&refused)),
            Outcome::Failed(e) => {
                let doing = if present {
                    "adding the surge finalizer"
                } else {
                    "removing the surge finalizer"
                };
                tracing::warn!(error = %e, doing, "surge");
                Err(Applied::Failed)
            }
        }
    }
}
