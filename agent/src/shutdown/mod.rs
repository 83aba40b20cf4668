//! Guarding shutdowns with systemd-logind: the delay inhibitor lock, the drain before the
//! machine goes down, the `logind.conf.d` drop-in for the delay budget.

use serde::Deserialize;
use std::{path::PathBuf, time::Duration};

use crate::flags::{self, Flag};

pub mod dropin;
pub mod guard;
mod notes;
mod record;
mod unrecorded;
pub mod window;

/// The flags of the `shutdownGuard` section.
pub fn flags() -> Vec<Flag> {
    flags::declare! {
        "shutdown-guard" ("NODEWARD_SHUTDOWN_GUARD") => "enabled": Scalar, "Hold a logind delay lock and drain before shutdown: true or false";
        "shutdown-budget" ("NODEWARD_SHUTDOWN_BUDGET") => "budget": Text, "How long the drain before a shutdown may take, e.g. 120s";
        "logind-drop-in-dir" ("NODEWARD_LOGIND_DROP_IN_DIR") => "dropInDir": Text, "Write the logind.conf.d drop-in raising InhibitDelayMaxSec into this directory (and writeDropIn)", also ["writeDropIn" = "true"];
    }
}

/// The systemd-logind shutdown guard.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ShutdownGuardConfig {
    pub enabled: bool,
    /// How long the drain before a shutdown may take; logind's `InhibitDelayMaxSec` must be
    /// at least this (see `writeDropIn`).
    #[serde(deserialize_with = "crate::values::duration")]
    pub budget: Duration,
    /// The lock is released this long before the budget (or logind's delay) ends; unset, a
    /// twentieth of the drain's time, from 1s to 5s (`shutdown::window::margin`).
    #[serde(deserialize_with = "crate::values::optional_duration")]
    pub safety_margin: Option<Duration>,
    /// Write a `logind.conf.d` drop-in raising `InhibitDelayMaxSec` to the budget, and reload
    /// logind, when its delay is shorter (on by default: logind's own default, 5s, leaves a
    /// drain almost nothing).
    pub write_drop_in: bool,
    /// Where the drop-in goes.
    pub drop_in_dir: PathBuf,
    /// The drain plan before a shutdown (default: ordinary pods by priority, critical pods,
    /// DaemonSet pods).
    pub drain_plan: Option<nodeward_api::DrainPlan>,
    /// Hold a logind `block` lock while no maintenance of this node is admitted, so that
    /// uncoordinated reboots and shutdowns are refused.
    pub reboot_gate: bool,
}

impl Default for ShutdownGuardConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            budget: Duration::from_secs(120),
            safety_margin: None,
            write_drop_in: true,
            drop_in_dir: PathBuf::from("/etc/systemd/logind.conf.d"),
            drain_plan: None,
            reboot_gate: false,
        }
    }
}

impl ShutdownGuardConfig {
    pub fn validate(&self, place: &str) -> Result<(), String> {
        if let Some(margin) = self.safety_margin
            && margin >= self.budget
        {
            return Err(format!(
                "{place}.safetyMargin: {}s leaves nothing of the {}s budget; use less than {place}.budget, e.g. 5s, or leave it out (a twentieth of the drain's time, 1s to 5s)",
                margin.as_secs(),
                self.budget.as_secs()
            ));
        }
        Ok(())
    }
}

/// What the shutdown guard runs with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long a drain before shutdown may take (the lock is released by then).
    pub budget: Duration,
    /// Released this long before the budget (or logind's delay) runs out; `None`: [`window::margin`].
    pub margin: Option<Duration>,
    /// Where to write the `logind.conf.d` drop-in raising `InhibitDelayMaxSec` to the budget
    /// (none: do not write one).
    pub drop_in_dir: Option<PathBuf>,
    /// Directories scanned for drop-ins that override ours.
    pub drop_in_scan: Vec<PathBuf>,
    pub plan: Option<nodeward_api::DrainPlan>,
    pub own_pod: Option<(String, String)>,
    /// Hold a `block` lock on shutdown while no maintenance of this node is admitted, so
    /// that logind refuses uncoordinated shutdowns and reboots.
    pub reboot_gate: bool,
}

impl Settings {
    /// The settings `config` gives, for an agent whose own pod is `own_pod`. Our drop-in
    /// directory is scanned first, then systemd's.
    pub fn new(config: &ShutdownGuardConfig, own_pod: Option<(String, String)>) -> Self {
        let mut scan: Vec<PathBuf> = dropin::DIRECTORIES.iter().map(PathBuf::from).collect();
        if !scan.contains(&config.drop_in_dir) {
            scan.insert(0, config.drop_in_dir.clone());
        }
        Self {
            budget: config.budget,
            margin: config.safety_margin,
            drop_in_dir: config.write_drop_in.then(|| config.drop_in_dir.clone()),
            drop_in_scan: scan,
            plan: config.drain_plan.clone(),
            own_pod,
            reboot_gate: config.reboot_gate,
        }
    }
}
