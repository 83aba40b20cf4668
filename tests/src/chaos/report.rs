//! What a soak reports: per fault kind, how many and the time to recovery; the promises
//! checked at the end.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use nodeward_api::MaintenancePhase;

use super::Fault;
use crate::history::History;

/// One injected fault: when, and the maintenance it held up, if one.
#[derive(Clone, Debug)]
pub(super) struct Injected {
    pub fault: Fault,
    pub at: Instant,
    pub maintenance: Option<String>,
}

/// What a soak saw.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub settings_summary: String,
    pub ran_for: Duration,
    /// Everything finished within the settle time once the faults stopped.
    pub settled: bool,
    /// Per fault kind: how many were injected and the time to recovery of each that recovered
    /// (a fault after which nothing more was to happen has none).
    pub faults: BTreeMap<Fault, (usize, Vec<Duration>)>,
    pub maintenances: usize,
    pub succeeded: usize,
    /// Maintenances that did not succeed, by their message.
    pub not_succeeded: BTreeMap<String, usize>,
    pub max_admitted: usize,
    /// The maintenances active together at that peak.
    pub max_admitted_were: Vec<String>,
    pub max_slots: usize,
    pub budget: usize,
    /// Slots still held at the end.
    pub leaked_slots: usize,
    /// Nodes still cordoned or tainted by nodeward at the end.
    pub left_cordoned: Vec<String>,
    /// Maintenances not finished at the end.
    pub not_finished: Vec<String>,
    /// Maintenances that ended other than Succeeded without saying why.
    pub unexplained: Vec<String>,
    /// Halts the policy's status recorded, and resumes by the soak.
    pub halts: usize,
    pub resumes: usize,
    /// Slots taken while the policy was halted (see [`History::admitted_after_halt`]).
    pub admitted_after_halt: Vec<String>,
}

impl Report {
    /// Every broken promise; empty when the soak passed.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if !self.settled {
            v.push("not everything finished within the settle time".to_owned());
        }
        if self.max_admitted > self.budget || self.max_slots > self.budget {
            v.push(format!(
                "the budget {} was exceeded: {} admitted ({:?}), {} slots at once",
                self.budget, self.max_admitted, self.max_admitted_were, self.max_slots
            ));
        }
        if self.leaked_slots > 0 {
            v.push(format!("{} slots held at the end", self.leaked_slots));
        }
        if !self.left_cordoned.is_empty() {
            v.push(format!(
                "left cordoned or tainted: {:?}",
                self.left_cordoned
            ));
        }
        if !self.not_finished.is_empty() {
            v.push(format!("not finished: {:?}", self.not_finished));
        }
        if !self.unexplained.is_empty() {
            v.push(format!("ended without a reason: {:?}", self.unexplained));
        }
        if !self.admitted_after_halt.is_empty() {
            v.push(format!(
                "admitted while halted, before a resume: {:?}",
                self.admitted_after_halt
            ));
        }
        v
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} for {:.0} s: {} maintenances, {} succeeded; most admitted at once {} (slots {}) of a budget of {}; slots held at the end {}; nodes left cordoned {}; not finished {}; unexplained {}; halts {} (resumed {}), admitted while halted {}\n",
            self.settings_summary,
            self.ran_for.as_secs_f64(),
            self.maintenances,
            self.succeeded,
            self.max_admitted,
            self.max_slots,
            self.budget,
            self.leaked_slots,
            self.left_cordoned.len(),
            self.not_finished.len(),
            self.unexplained.len(),
            self.halts,
            self.resumes,
            self.admitted_after_halt.len(),
        );
        for (fault, (count, recoveries)) in &self.faults {
            let mut r = recoveries.clone();
            r.sort();
            let median = r.get(r.len() / 2).map_or("-".into(), |d| secs(*d));
            let max = r.last().map_or("-".into(), |d| secs(*d));
            s.push_str(&format!(
                "  {fault:?}: {count} injected; time to {}: median {median}, max {max} ({} measured)\n",
                fault.recovery(),
                r.len()
            ));
        }
        for (message, count) in &self.not_succeeded {
            s.push_str(&format!("  not succeeded x{count}: {message}\n"));
        }
        s
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The time from a fault to its recovery, from the watched history (see [`Fault::recovery`]).
pub(super) fn recovery(f: &Injected, h: &History) -> Option<Duration> {
    let first_after = |t: Instant, phases: &mut dyn Iterator<Item = Instant>| {
        phases
            .filter(|p| *p > t)
            .min()
            .map(|p| p.duration_since(f.at))
    };
    match f.fault {
        Fault::LeaderKilled | Fault::ApiServerRestarted | Fault::LeaderCutOff => first_after(
            f.at,
            &mut h
                .phases
                .values()
                .filter_map(|p| p.get(&MaintenancePhase::Admitted).copied()),
        ),
        Fault::AgentKilled | Fault::NodeNeverReturned => {
            let phases = h.phases.get(f.maintenance.as_deref()?)?;
            let wanted = |p: &MaintenancePhase| {
                f.fault == Fault::AgentKilled || p.is_finished() || *p == MaintenancePhase::Pending
            };
            first_after(
                f.at,
                &mut phases.iter().filter(|(p, _)| wanted(p)).map(|(_, t)| *t),
            )
        }
    }
}
