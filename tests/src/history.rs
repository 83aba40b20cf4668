//! What a test saw happen to its maintenances and policies, from a watch started before
//! anything was created: the most maintenances ever admitted-and-unfinished at once and the
//! most slots a policy ever held (the budget assertions), who admitted each, and when each
//! reached each phase.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Instant,
};

use futures::StreamExt;
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use nodeward_api::{DisruptionPolicy, MaintenancePhase, NodeMaintenance};

use crate::{TestEnv, env::TEST_LABEL};

#[derive(Clone, Debug, Default)]
pub struct History {
    /// Maintenances admitted and not finished, now.
    pub active: BTreeSet<String>,
    pub max_active: usize,
    /// The leader identity that admitted each maintenance.
    pub admitted: BTreeMap<String, String>,
    pub max_slots: usize,
    /// When the watch first saw each maintenance in each phase.
    pub phases: BTreeMap<String, BTreeMap<MaintenancePhase, Instant>>,
}

/// Starts watching the maintenances of this test's nodes (whoever created them) and the
/// policies labelled with this test's id.
pub fn watch(env: &TestEnv) -> Arc<Mutex<History>> {
    let prefix = format!("{}-", env.id);
    watch_where(
        &env.client,
        move |m| m.spec.node_name.starts_with(&prefix),
        &format!("{TEST_LABEL}={}", env.id),
    )
}

/// Starts watching the maintenances `ours` takes and the policies matching `policy_selector`
/// (a label selector; empty: every policy).
pub fn watch_where(
    client: &kube::Client,
    ours: impl Fn(&NodeMaintenance) -> bool + Send + 'static,
    policy_selector: &str,
) -> Arc<Mutex<History>> {
    let history = Arc::new(Mutex::new(History::default()));
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let recorded = history.clone();
    tokio::spawn(
        watcher(maintenances, watcher::Config::default())
            .default_backoff()
            .for_each(move |event| {
                if let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = event
                    && ours(&m)
                {
                    let mut h = recorded.lock().unwrap_or_else(|p| p.into_inner());
                    let p = m.phase();
                    h.phases
                        .entry(m.name_any())
                        .or_default()
                        .entry(p)
                        .or_insert_with(Instant::now);
                    // Sent back to Pending (a deadline passed), it no longer holds its node.
                    if p.is_finished() || p == MaintenancePhase::Pending {
                        h.active.remove(&m.name_any());
                    } else if p != MaintenancePhase::Pending {
                        h.active.insert(m.name_any());
                        if let Some(by) = m.status.as_ref().and_then(|s| s.admission.as_ref()) {
                            h.admitted.insert(m.name_any(), by.admitted_by.clone());
                        }
                    }
                    h.max_active = h.max_active.max(h.active.len());
                }
                futures::future::ready(())
            }),
    );
    let policies: Api<DisruptionPolicy> = Api::all(client.clone());
    let recorded = history.clone();
    let mut config = watcher::Config::default();
    if !policy_selector.is_empty() {
        config = config.labels(policy_selector);
    }
    tokio::spawn(
        watcher(policies, config)
            .default_backoff()
            .for_each(move |event| {
                if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = event {
                    let slots = p.status.as_ref().map_or(0, |s| s.slots.len());
                    let mut h = recorded.lock().unwrap_or_else(|p| p.into_inner());
                    h.max_slots = h.max_slots.max(slots);
                }
                futures::future::ready(())
            }),
    );
    history
}
