//! Self-fencing: the agent feeds a watchdog, and stops feeding it once it has gone `fenceAfter`
//! without the API server taking its heartbeat while no more than half of the agents it counts
//! answer its probes ([`verdict`]); the watchdog then resets the machine. The NodeReport
//! announces it (`status.fencing`), and only then does the coordinator treat the node as down
//! once that time has passed, and mark it out of service so that its pods start elsewhere.
//!
//! Armed after the first heartbeat the API server took on this boot; the claim is published
//! after the watchdog runs and taken back before it is stopped. An agent that stops without
//! taking the claim back leaves the watchdog running: the machine resets unless the agent is
//! back within the watchdog's timeout. Peers record the fencing probes they answer (their
//! NodeReports' `peerSightings[].probedAt`), so the coordinator knows a node that still
//! reaches them is running.

mod verdict;
mod watchdog;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use kube::runtime::events::EventType;
use nodeward_api::report::Fencing;
use nodeward_runtime::stop::{self, Stopping};
use serde::Deserialize;
use tokio::sync::watch;

use crate::{
    detect::peers::{self, PeerContext},
    flags::{self, Flag},
    liveness::ApiContact,
    metrics::Metrics,
};
pub use verdict::{Contacts, Verdict, probing, verdict};
pub use watchdog::Watchdog;

/// The flags of the `fencing` section.
pub fn flags() -> Vec<Flag> {
    flags::declare! {
        "fencing" ("NODEWARD_FENCING") => "enabled": Scalar, "Fence this node with its watchdog when it is cut off from the API server and most of its peers (true/false)";
        "fence-after" ("NODEWARD_FENCE_AFTER") => "fenceAfter": Text, "How long cut off before the agent stops feeding the watchdog, e.g. 2m";
        "watchdog-device" ("NODEWARD_WATCHDOG_DEVICE") => "device": Text, "The watchdog device the agent feeds, e.g. /dev/watchdog";
        "watchdog-timeout" ("NODEWARD_WATCHDOG_TIMEOUT") => "timeout": Text, "How long after the last feeding the watchdog resets the machine, e.g. 60s";
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct FencingConfig {
    pub enabled: bool,
    /// The watchdog device, one no other process holds (systemd holds the first one when
    /// `RuntimeWatchdogSec` is set).
    pub device: PathBuf,
    /// How long after the last feeding the watchdog resets the machine.
    #[serde(deserialize_with = "crate::values::duration")]
    pub timeout: Duration,
    /// How long without the API server (and without a majority of the agents answering)
    /// before the agent stops feeding the watchdog.
    #[serde(deserialize_with = "crate::values::duration")]
    pub fence_after: Duration,
}

impl Default for FencingConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            device: PathBuf::from("/dev/watchdog"),
            timeout: Duration::from_secs(60),
            fence_after: Duration::from_secs(600),
        }
    }
}

impl FencingConfig {
    /// Checked against the heartbeat interval (the API server must take a heartbeat at least
    /// twice within `fenceAfter`, or a healthy node would fence) and whether peers are probed
    /// (the fencing asks them).
    pub fn validate(
        &self,
        place: &str,
        heartbeat: Duration,
        peers_enabled: bool,
    ) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        if !(1..=600).contains(&self.timeout.as_secs()) || self.timeout.subsec_nanos() != 0 {
            return Err(format!(
                "{place}.timeout: must be whole seconds from 1s to 600s, e.g. 60s"
            ));
        }
        if !(10..=86400).contains(&self.fence_after.as_secs()) {
            return Err(format!(
                "{place}.fenceAfter: must be from 10s to 24h, e.g. 2m"
            ));
        }
        if self.fence_after < heartbeat * 2 {
            return Err(format!(
                "{place}.fenceAfter: must be at least twice reporting.heartbeatInterval ({}s): a healthy node would fence between two heartbeats; lower the interval (e.g. 30s) or raise fenceAfter",
                heartbeat.as_secs()
            ));
        }
        if self.device.as_os_str().is_empty() || self.device.as_os_str().len() > 256 {
            return Err(format!(
                "{place}.device: name the watchdog device, e.g. /dev/watchdog"
            ));
        }
        if !peers_enabled {
            return Err(format!(
                "{place}.enabled: fencing asks the peers whether this node is cut off from most of the fleet; enable detectors.peers"
            ));
        }
        Ok(())
    }
}

/// The fencing the NodeReport announces: what the agent wants announced, and what was last
/// written (the coordinator trusts only that).
#[derive(Clone, Debug)]
pub struct Claim {
    wanted: Arc<watch::Sender<Option<Fencing>>>,
    written: Arc<watch::Sender<Option<Fencing>>>,
}

impl Default for Claim {
    fn default() -> Self {
        Self {
            wanted: Arc::new(watch::channel(None).0),
            written: Arc::new(watch::channel(None).0),
        }
    }
}

impl Claim {
    pub fn want(&self, fencing: Option<Fencing>) {
        self.wanted.send_if_modified(|wanted| {
            let changed = *wanted != fencing;
            *wanted = fencing;
            changed
        });
    }

    pub fn wanted(&self) -> Option<Fencing> {
        self.wanted.borrow().clone()
    }

    /// Told of each change of what is wanted (the reporter writes it).
    pub fn changes(&self) -> watch::Receiver<Option<Fencing>> {
        self.wanted.subscribe()
    }

    /// The reporter wrote `fencing`.
    pub fn wrote(&self, fencing: Option<Fencing>) {
        self.written.send_replace(fencing);
    }

    pub fn written(&self) -> Option<Fencing> {
        self.written.borrow().clone()
    }

    fn written_changes(&self) -> watch::Receiver<Option<Fencing>> {
        self.written.subscribe()
    }
}

/// The Event of a watchdog that cannot be armed.
pub const NOT_ARMED: &str = "FencingNotArmed";
/// How long a stopping agent waits for the reporter to take the claim back.
const TAKE_BACK: Duration = Duration::from_secs(4);
/// The longest wait between two feedings, whatever the timeout.
const LONGEST_TICK: Duration = Duration::from_secs(5);
/// Fencing probes at once.
const PROBES_AT_ONCE: usize = 32;

/// The running fencing of one agent.
pub struct Fencer {
    config: FencingConfig,
    peers: PeerContext,
    port: u16,
    probe_timeout: Duration,
    contact: ApiContact,
    /// What the reporter announces for it.
    pub claim: Claim,
    metrics: Arc<Metrics>,
    events: nodeward_runtime::events::Events,
}

impl Fencer {
    /// The fencing `config` asks for, probing as `probes` says, in a running agent whose peer
    /// detector started.
    pub fn of(
        config: &FencingConfig,
        probes: &peers::PeersConfig,
        agent: &crate::detect::AgentContext,
        client: &kube::Client,
        metrics: &Arc<Metrics>,
        contact: ApiContact,
    ) -> Option<Self> {
        if !config.enabled {
            return None;
        }
        // Validation refuses fencing without the peer detector.
        let peers = agent.started::<PeerContext>()?;
        Some(Self {
            config: config.clone(),
            port: probes.port,
            probe_timeout: probes.probe_timeout,
            events: crate::events(client.clone(), &peers.node_name),
            peers: peers.as_ref().clone(),
            contact,
            claim: Claim::default(),
            metrics: metrics.clone(),
        })
    }

    /// Arms once the API server took a heartbeat, then feeds or fences until a stop is asked.
    pub async fn run(self, mut stopping: Stopping) {
        let mut first = self.contact.changes();
        tokio::select! {
            () = stop::asked(&mut stopping) => return,
            _ = first.wait_for(Option::is_some) => {}
        }
        let watchdog = match Watchdog::arm(&self.config.device, self.config.timeout) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "fencing is enabled but the watchdog cannot be armed: this node does not fence, and the coordinator never marks it out of service by itself");
                let note = format!(
                    "{e}: this node does not fence itself, so the coordinator never marks it out of service by itself"
                );
                let node = crate::node_reference(&self.peers.node_name);
                self.events
                    .publish(&node, EventType::Warning, "Fence", NOT_ARMED, note)
                    .await;
                return;
            }
        };
        tracing::info!(device = %self.config.device.display(), timeout_s = watchdog.timeout.as_secs(), fence_after_s = self.config.fence_after.as_secs(), "watchdog armed: this node fences itself when cut off");
        self.metrics.fencing.set(1);
        let tick = (watchdog.timeout / 3).min(LONGEST_TICK);
        let answers: Mutex<BTreeMap<String, Instant>> = Mutex::default();
        // Probing goes on beside the feeding: a round of probes that time out must never hold
        // back a feeding.
        let prober = self.keep_probing(&answers, tick);
        tokio::pin!(prober);
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop::asked(&mut stopping) => break,
                () = &mut prober => {}
                _ = ticks.tick() => {}
            }
            let directory = self.peers.directory.peers(&self.peers.node_name);
            self.claim
                .want(Some(self.announced(&watchdog, directory.len())));
            // Only what the coordinator was told counts: before it, it treats the node as
            // not fencing at all.
            let Some(agents) = self.claim.written().map(|f| f.agents) else {
                self.feed(&watchdog);
                continue;
            };
            let now = Instant::now();
            let at: Vec<Instant> = {
                let mut answers = answers.lock().unwrap_or_else(|p| p.into_inner());
                answers.retain(|node, _| directory.iter().any(|(n, _)| n == node));
                answers.values().copied().collect()
            };
            let contacts = Contacts {
                api: self.contact.last().unwrap_or(now),
                answers: &at,
                agents: u32::try_from(agents).unwrap_or(u32::MAX),
            };
            match verdict(&contacts, now, self.config.fence_after) {
                Verdict::Feed => self.feed(&watchdog),
                Verdict::Fence(why) => {
                    self.metrics.fencing.set(2);
                    tracing::error!(reason = %why, timeout_s = watchdog.timeout.as_secs(), "fencing this node: the watchdog is no longer fed and resets the machine");
                    // Never fed again, never stopped: the reset is what the coordinator counts on.
                    stop::asked(&mut stopping).await;
                    std::mem::drop(watchdog);
                    return;
                }
            }
        }
        self.take_back(watchdog).await;
    }

    fn announced(&self, watchdog: &Watchdog, peers: usize) -> Fencing {
        let seconds = |d: Duration| i32::try_from(d.as_secs()).unwrap_or(i32::MAX);
        Fencing {
            device: self.config.device.display().to_string(),
            fence_after_seconds: seconds(self.config.fence_after),
            timeout_seconds: seconds(watchdog.timeout),
            agents: i32::try_from(peers.saturating_add(1)).unwrap_or(i32::MAX),
        }
    }

    fn feed(&self, watchdog: &Watchdog) {
        if let Err(e) = watchdog.feed() {
            tracing::error!(error = %e, "feeding the watchdog failed; the machine resets if it goes on failing");
        }
    }

    /// Probes every peer over TCP with the fencing mark every `every` once half of
    /// `fenceAfter` passed without the API server, and records in `answers` when each
    /// answered. Never ends.
    async fn keep_probing(&self, answers: &Mutex<BTreeMap<String, Instant>>, every: Duration) {
        loop {
            let now = Instant::now();
            let api = self.contact.last().unwrap_or(now);
            if probing(api, now, self.config.fence_after) {
                let directory = self.peers.directory.peers(&self.peers.node_name);
                let (port, timeout) = (self.port, self.probe_timeout);
                // Each answer counts from when it came, not from the end of the round.
                let answered: Vec<(String, Instant)> = futures::stream::iter(directory)
                    .map(|(node, address)| async move {
                        let result = peers::probe_fencing(address, port, timeout).await;
                        result.is_ok().then(|| (node, Instant::now()))
                    })
                    .buffer_unordered(PROBES_AT_ONCE)
                    .filter_map(std::future::ready)
                    .collect()
                    .await;
                answers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(answered);
            }
            tokio::time::sleep(every).await;
        }
    }

    /// A stop on purpose: the claim taken back first, then the watchdog stopped; if the claim
    /// cannot be taken back, the watchdog stays running (the coordinator counts on the reset).
    async fn take_back(&self, watchdog: Watchdog) {
        self.claim.want(None);
        let mut written = self.claim.written_changes();
        let taken_back = tokio::time::timeout(TAKE_BACK, async {
            loop {
                self.feed(&watchdog);
                tokio::select! {
                    _ = written.wait_for(Option::is_none) => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        })
        .await
        .is_ok();
        if taken_back {
            match watchdog.disarm() {
                Ok(()) => tracing::info!("watchdog stopped; fencing announced no more"),
                Err(e) => {
                    tracing::error!(error = %e, "stopping the watchdog failed: the machine resets unless the agent is back in time")
                }
            }
        } else {
            tracing::error!(
                timeout_s = watchdog.timeout.as_secs(),
                "the NodeReport still announces fencing: the watchdog is left running, and the machine resets unless the agent is back in time"
            );
        }
    }
}
