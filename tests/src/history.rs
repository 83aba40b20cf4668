//! What a test saw happen to its maintenances and policies, from a watch started before
//! anything was created: the most maintenances ever admitted-and-unfinished at once and the
//! most slots a policy ever held (the budget assertions), who admitted each, when each
//! reached each phase, and any slot a policy took while its status recorded a halt.
//!
//! A watch that restarts (the API server went away, or its resourceVersion expired) lists
//! everything again. The list is taken in as one state at its end, not object by object: the
//! objects of a list arrive in name order, so applying them one at a time would show a state
//! the API server never held (one maintenance already admitted, the one whose slot it took
//! not yet seen finished).

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
    /// The maintenances active together when `max_active` was first reached.
    pub max_active_were: BTreeSet<String>,
    /// The leader identity that admitted each maintenance.
    pub admitted: BTreeMap<String, String>,
    pub max_slots: usize,
    /// When the watch first saw each maintenance in each phase.
    pub phases: BTreeMap<String, BTreeMap<MaintenancePhase, Instant>>,
    /// How many halts the policies' statuses recorded (`Halted=True` for their spec).
    pub halts: usize,
    /// The policies halted now: their generation, the slots they held when the halt was
    /// recorded, and when the watch saw it.
    pub halted: BTreeMap<String, (Option<i64>, BTreeSet<String>, Instant)>,
    /// Slots a policy took after its status recorded a halt and before a resume changed its
    /// spec (the failure budget's promise: nothing more in scope is admitted; the soak has no
    /// maintenance of a node that goes down anyway, the one kind a halt lets through).
    pub admitted_after_halt: Vec<String>,
}

impl History {
    /// Takes in one maintenance's new state.
    fn apply(&mut self, m: &NodeMaintenance) {
        let name = m.name_any();
        let p = m.phase();
        self.phases
            .entry(name.clone())
            .or_default()
            .entry(p)
            .or_insert_with(Instant::now);
        // Sent back to Pending (a deadline passed), it no longer holds its node.
        if p.is_finished() || p == MaintenancePhase::Pending {
            self.active.remove(&name);
        } else {
            self.active.insert(name.clone());
            if let Some(by) = m.status.as_ref().and_then(|s| s.admission.as_ref()) {
                self.admitted.insert(name, by.admitted_by.clone());
            }
        }
    }

    /// Takes in a whole list: what it does not name is gone.
    fn relisted(&mut self, listed: &[NodeMaintenance]) {
        self.active.clear();
        for m in listed {
            self.apply(m);
        }
        self.count();
    }

    /// Takes in one version of a policy: a slot it took while halted, a halt recorded, a
    /// resume (its spec changed).
    fn policy(&mut self, p: &DisruptionPolicy) {
        let name = p.name_any();
        let generation = p.metadata.generation;
        let slots: BTreeSet<String> = p
            .status
            .iter()
            .flat_map(|s| &s.slots)
            .map(|s| s.uid.clone())
            .collect();
        if let Some((halted_at, held, _)) = self.halted.get(&name) {
            if *halted_at == generation {
                for added in p.status.iter().flat_map(|s| &s.slots) {
                    if !held.contains(&added.uid) {
                        self.admitted_after_halt.push(format!(
                            "{} took a slot for {} after its halt",
                            name, added.maintenance
                        ));
                    }
                }
            } else {
                self.halted.remove(&name);
            }
        }
        let recorded = p.status.iter().flat_map(|s| &s.conditions).any(|c| {
            c.type_ == nodeward_api::conditions::policy::HALTED
                && c.status == "True"
                && c.observed_generation == generation
        });
        if recorded && !self.halted.contains_key(&name) {
            self.halts += 1;
            self.halted
                .insert(name, (generation, slots, Instant::now()));
        }
    }

    fn count(&mut self) {
        if self.active.len() > self.max_active {
            self.max_active = self.active.len();
            self.max_active_were = self.active.clone();
        }
    }
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
    // The objects of a list under way, taken in at its end.
    let mut listing: Vec<NodeMaintenance> = Vec::new();
    tokio::spawn(
        watcher(maintenances, watcher::Config::default())
            .default_backoff()
            .for_each(move |event| {
                let mut h = recorded.lock().unwrap_or_else(|p| p.into_inner());
                match event {
                    Ok(watcher::Event::Init) => listing.clear(),
                    Ok(watcher::Event::InitApply(m)) if ours(&m) => listing.push(m),
                    Ok(watcher::Event::InitDone) => h.relisted(&std::mem::take(&mut listing)),
                    Ok(watcher::Event::Apply(m)) if ours(&m) => {
                        h.apply(&m);
                        h.count();
                    }
                    Ok(watcher::Event::Delete(m)) => {
                        h.active.remove(&m.name_any());
                    }
                    _ => {}
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
                    h.policy(&p);
                }
                futures::future::ready(())
            }),
    );
    history
}
