//! The chaos soak: a rolling reboot of simulated machines (kwok nodes, each with the real agent
//! and its own real systemd-logind, see [`crate::machine`]) under two leader-electing
//! coordinators, each reaching the API server through its own [`Proxy`], while faults are
//! injected at random: the leader killed, agents killed (and started again 5 to 90 s later),
//! the API server and etcd killed and restarted, machines that go down for their reboot and
//! never come back, and the leader cut off from the API server. A machine that rebooted asks
//! again a little later, so the rollout goes on for the whole soak. Then the faults stop, every
//! agent runs again, and the soak waits until every maintenance is finished.
//!
//! The policy has a failure budget of one: every failure (a machine that never came back)
//! halts the rollout, and the soak resumes it 5 s after the halt, as an operator would.
//!
//! Checked from a watch started before anything: never more maintenances admitted, nor slots
//! held, than the budget; no slot taken while the policy's status recorded a halt, until the
//! resume; at the end no slot held, no node left cordoned or tainted by nodeward, every
//! maintenance finished, every one that did not succeed with its reason. For each fault, the
//! time to recovery.
//!
//! Used by the short soak in the e2e tests and by `bench/src/bin/chaos_soak.rs`.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use nodeward_api::{DisruptionPolicy, MaintenancePhase, NodeMaintenance};
use rand::{Rng, SeedableRng, rngs::StdRng, seq::SliceRandom};
use serde_json::json;

mod report;

pub use report::Report;
use report::{Injected, recovery};

use crate::{
    TestEnv,
    daemon::Daemon,
    env::{KWOK_NODE_ANNOTATION, TEST_LABEL},
    history::{self, History},
    machine::Machine,
    proxy::{self, Proxy},
};

/// What one soak does.
#[derive(Clone, Debug)]
pub struct Settings {
    pub nodes: usize,
    pub max_concurrent: usize,
    /// How long faults are injected.
    pub duration: Duration,
    /// The mean time between two faults (exponentially distributed).
    pub mean_fault_interval: Duration,
    /// At most this many machines never come back (each keeps counting against the budget).
    pub max_dead_nodes: usize,
    /// How long the end may take: every maintenance finished, after the faults stopped.
    pub settle: Duration,
    pub seed: u64,
    pub agent: String,
    pub coordinator: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// The leading coordinator is SIGKILLed and started again 0.5 to 5 s later.
    LeaderKilled,
    /// A machine's agent is SIGKILLed and started again 5 to 90 s later.
    AgentKilled,
    /// The API server and etcd are SIGKILLed and started again.
    ApiServerRestarted,
    /// The next machine to go down for its reboot never comes back.
    NodeNeverReturned,
    /// The leader's connections to the API server are cut for 5 to 20 s.
    LeaderCutOff,
}

impl Fault {
    pub const ALL: [Fault; 5] = [
        Fault::LeaderKilled,
        Fault::AgentKilled,
        Fault::ApiServerRestarted,
        Fault::NodeNeverReturned,
        Fault::LeaderCutOff,
    ];

    /// What recovery means for this fault, for the report.
    pub fn recovery(self) -> &'static str {
        match self {
            Fault::LeaderKilled | Fault::ApiServerRestarted | Fault::LeaderCutOff => {
                "the next admission"
            }
            Fault::AgentKilled => "the next phase of the maintenance its node had open",
            Fault::NodeNeverReturned => "its maintenance finished (the slot freed)",
        }
    }
}

/// A coordinator replica behind its own proxy.
struct Replica {
    identity: String,
    proxy: Proxy,
    kubeconfig: PathBuf,
    daemon: Option<Daemon>,
}

impl Replica {
    async fn new(dir: &std::path::Path, identity: &str) -> anyhow::Result<Self> {
        let proxy = Proxy::start(
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            proxy::api_server_address()?,
        )
        .await?;
        let kubeconfig = dir.join(format!("{identity}.kubeconfig"));
        std::fs::write(&kubeconfig, proxy::admin_kubeconfig_via(proxy.address))?;
        Ok(Self {
            identity: identity.to_owned(),
            proxy,
            kubeconfig,
            daemon: None,
        })
    }

    fn start(&mut self, env: &TestEnv, binary: &str) -> anyhow::Result<()> {
        let args: Vec<String> = [
            "run",
            "--lease-namespace",
            &env.namespace,
            "--identity",
            &self.identity,
            "--kubeconfig",
            &self.kubeconfig.display().to_string(),
            "--lease-duration",
            "4s",
            "--renew-deadline",
            "3s",
            "--retry-period",
            "1s",
        ]
        .map(String::from)
        .to_vec();
        self.daemon = Some(Daemon::start(
            binary,
            &format!("{}-{}", env.id, self.identity),
            &args,
        )?);
        Ok(())
    }
}

/// How long the soak leaves its policy halted before it resumes it.
const HALTED_FOR: Duration = Duration::from_secs(5);

/// Something to undo later: a process to start again, a connection to restore.
enum Undo {
    Replica(usize),
    Agent(usize),
    Reconnect(usize),
    /// A machine that rebooted asks for its next reboot.
    RequireReboot(usize),
}

struct Soak<'a> {
    settings: &'a Settings,
    env: &'a TestEnv,
    rng: StdRng,
    machines: Vec<Machine>,
    /// Machines that went down and stay down.
    dead: Vec<bool>,
    replicas: Vec<Replica>,
    undo: Vec<(Instant, Undo)>,
    /// Faults to inject before random ones: every kind once, in a random order.
    first: Vec<Fault>,
    injected: Vec<Injected>,
    doom_next_reboot: Option<Instant>,
    history: Arc<Mutex<History>>,
    /// The soak's policy, and how often the soak resumed it after a halt.
    policy: String,
    resumes: usize,
    maintenances: Api<NodeMaintenance>,
    started: Instant,
    /// Everything finished once the faults stopped, within the settle time.
    settled: bool,
}

/// Runs a soak in `env` (whose nodes it creates) and reports what it saw.
pub async fn run(env: &TestEnv, settings: &Settings) -> anyhow::Result<Report> {
    let started = Instant::now();
    env.create_many_nodes(settings.nodes, Duration::from_secs(300))
        .await?;
    let history = history::watch(env);
    let policy = env.create_policy(
        "soak",
        json!({
            "nodeSelector": {"matchLabels": {TEST_LABEL: env.id}},
            "maxConcurrent": settings.max_concurrent,
            // Every failure halts the rollout; the soak resumes it a little later, as an
            // operator would, and no slot may be taken in between.
            "failureBudget": {"maxFailures": 1},
            "maxUnhealthy": "50%",
            "autoReboot": true,
            "healthGate": {"for": "1s"},
            "deadlines": {"agentHeartbeat": "1m", "start": "30s", "reboot": "30s", "agentLost": "1m"},
        }),
    )
    .await?;
    let dir = crate::scratch::dir(&format!("nodeward-soak-{}", env.id))?;
    let mut replicas = Vec::new();
    for identity in ["replica-a", "replica-b"] {
        let mut replica = Replica::new(&dir, identity).await?;
        replica.start(env, &settings.coordinator)?;
        replicas.push(replica);
    }
    let mut machines = Vec::new();
    for i in 0..settings.nodes {
        machines.push(
            Machine::start(
                env,
                &settings.agent,
                i,
                "reporting: {heartbeatInterval: 10s}\n",
                true,
            )
            .await?,
        );
    }
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut first = Fault::ALL.to_vec();
    first.shuffle(&mut rng);
    let mut soak = Soak {
        settings,
        env,
        rng,
        first,
        dead: vec![false; machines.len()],
        machines,
        replicas,
        undo: Vec::new(),
        injected: Vec::new(),
        doom_next_reboot: None,
        history: history.clone(),
        policy,
        resumes: 0,
        maintenances: Api::all(env.client.clone()),
        started,
        settled: false,
    };
    let result = soak.go().await;
    let report = match result {
        Ok(()) => soak.report(started).await,
        Err(e) => Err(e),
    };
    let report = report.with_context(|| soak.logs())?;
    Ok(report)
}

impl Soak<'_> {
    async fn go(&mut self) -> anyhow::Result<()> {
        let end = Instant::now() + self.settings.duration;
        // Every kind is injected whatever the random gaps: a soak whose faults all fell late in
        // a short duration goes on with the kinds not yet injected, for one more duration at
        // most (a run drew four faults in 120 s and never killed the leader).
        let last_chance = end + self.settings.duration;
        let mut next_fault = Instant::now() + self.fault_interval();
        loop {
            let now = Instant::now();
            let faulting = now < end || (now < last_chance && self.a_kind_not_yet_injected());
            if !faulting && self.undo.is_empty() {
                break;
            }
            self.carry_out_reboots(faulting).await?;
            self.undo_due().await?;
            self.resume_when_halted().await?;
            if Instant::now() >= next_fault && faulting {
                let fault = match self.first.pop() {
                    Some(fault) => fault,
                    None => Fault::ALL[self.rng.random_range(0..Fault::ALL.len())],
                };
                if !self.inject(fault).await? {
                    self.say(&format!("{fault:?} cannot be injected now"));
                    if !self.was_injected(fault) {
                        self.first.insert(0, fault); // every kind once: later
                    }
                }
                next_fault = Instant::now() + self.fault_interval();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The faults are over: every maintenance finishes.
        let settle_by = Instant::now() + self.settings.settle;
        loop {
            self.carry_out_reboots(false).await?;
            self.resume_when_halted().await?;
            if self.settled().await? {
                self.settled = true;
                return Ok(());
            }
            if Instant::now() > settle_by {
                return Ok(()); // the report says what is stuck
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Resumes the soak's policy once it has been halted for [`HALTED_FOR`], as an operator
    /// would (`kubectl nodeward resume`: `failureBudget.countSince` now).
    async fn resume_when_halted(&mut self) -> anyhow::Result<()> {
        let halted_since = {
            let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
            h.halted.get(&self.policy).map(|(_, _, at)| *at)
        };
        if halted_since.is_none_or(|at| at.elapsed() < HALTED_FOR) {
            return Ok(());
        }
        let policies: Api<DisruptionPolicy> = Api::all(self.env.client.clone());
        let now = jiff::Timestamp::now().to_string();
        let resumed = policies
            .patch(
                &self.policy,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"failureBudget": {"countSince": now}}})),
            )
            .await;
        // The API server may be down (a fault): the next turn tries again.
        if resumed.is_ok() {
            self.resumes += 1;
            self.say(&format!("{} resumed after its halt", self.policy));
            let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
            h.halted.remove(&self.policy);
        }
        Ok(())
    }

    /// Whether a fault of this kind has been injected.
    fn was_injected(&self, kind: Fault) -> bool {
        self.injected.iter().any(|f| f.fault == kind)
    }

    /// Whether a kind of fault has not been injected yet.
    fn a_kind_not_yet_injected(&self) -> bool {
        Fault::ALL.iter().any(|kind| !self.was_injected(*kind))
    }

    fn fault_interval(&mut self) -> Duration {
        // Exponential with the configured mean (at least a second apart).
        let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
        self.settings
            .mean_fault_interval
            .mul_f64(-u.ln())
            .max(Duration::from_secs(1))
    }

    /// Schedules `undo` at a random time `millis` (from, to) after `at`; returns how long after.
    fn undo_later(&mut self, at: Instant, millis: (u64, u64), undo: Undo) -> Duration {
        let (from, to) = (
            Duration::from_millis(millis.0),
            Duration::from_millis(millis.1),
        );
        let back = self.random_between(from, to);
        self.undo.push((at + back, undo));
        back
    }

    fn random_between(&mut self, from: Duration, to: Duration) -> Duration {
        from + (to - from).mul_f64(self.rng.random_range(0.0..1.0))
    }

    /// Machines whose logind asked for the reboot go down and come back (or, doomed, stay
    /// down); one that came back asks again a little later while `go_on`.
    async fn carry_out_reboots(&mut self, go_on: bool) -> anyhow::Result<()> {
        for i in 0..self.machines.len() {
            if self.dead[i] || !self.machines[i].reboot_requested() {
                continue;
            }
            if let Some(at) = self.doom_next_reboot.take() {
                self.machines[i].go_down().await?;
                self.machines[i].kill_agent();
                self.dead[i] = true;
                self.env
                    .nodes()
                    .patch(
                        &self.machines[i].name,
                        &PatchParams::default(),
                        &Patch::Merge(
                            json!({"metadata": {"annotations": {KWOK_NODE_ANNOTATION: "dead"}}}),
                        ),
                    )
                    .await?;
                let maintenance = self.open_maintenance(i).await?;
                self.say(&format!(
                    "{} went down for its reboot and stays down ({maintenance:?})",
                    self.machines[i].name
                ));
                self.injected.push(Injected {
                    fault: Fault::NodeNeverReturned,
                    at,
                    maintenance,
                });
                continue;
            }
            self.machines[i].reboot().await?;
            if go_on {
                let later = self.random_between(Duration::from_secs(5), Duration::from_secs(30));
                self.undo
                    .push((Instant::now() + later, Undo::RequireReboot(i)));
            }
        }
        Ok(())
    }

    async fn undo_due(&mut self) -> anyhow::Result<()> {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = self.undo.drain(..).partition(|(at, _)| *at <= now);
        self.undo = later;
        for (_, undo) in due {
            match undo {
                Undo::Replica(r) => {
                    let binary = self.settings.coordinator.clone();
                    self.replicas[r].start(self.env, &binary)?;
                }
                Undo::Agent(i) => {
                    if !self.dead[i] && !self.machines[i].agent_running() {
                        self.machines[i].start_agent()?;
                    }
                }
                Undo::Reconnect(r) => self.replicas[r].proxy.restore(),
                Undo::RequireReboot(i) => {
                    if !self.dead[i] {
                        self.machines[i].require_reboot()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Injects `fault`; false if it cannot be now (no leader, no agent running, enough dead).
    async fn inject(&mut self, fault: Fault) -> anyhow::Result<bool> {
        let at = Instant::now();
        let mut maintenance = None;
        match fault {
            Fault::LeaderKilled | Fault::LeaderCutOff => {
                let Some(leader) = self.leader().await? else {
                    return Ok(false);
                };
                if fault == Fault::LeaderKilled {
                    self.replicas[leader].daemon = None; // SIGKILL
                    let back = self.undo_later(at, (500, 5_000), Undo::Replica(leader));
                    let identity = &self.replicas[leader].identity;
                    self.say(&format!("leader {identity} killed, back in {back:?}"));
                } else {
                    self.replicas[leader].proxy.cut();
                    let back = self.undo_later(at, (5_000, 20_000), Undo::Reconnect(leader));
                    let identity = &self.replicas[leader].identity;
                    self.say(&format!("leader {identity} cut off for {back:?}"));
                }
            }
            Fault::AgentKilled => {
                // Preferably one in the middle of a maintenance.
                let mut alive = Vec::new();
                for i in 0..self.machines.len() {
                    if !self.dead[i] && self.machines[i].agent_running() {
                        alive.push((i, self.open_maintenance(i).await?));
                    }
                }
                let busy: Vec<_> = alive.iter().filter(|(_, m)| m.is_some()).cloned().collect();
                let candidates = if busy.is_empty() { alive } else { busy };
                if candidates.is_empty() {
                    return Ok(false);
                }
                let (i, open) = candidates[self.rng.random_range(0..candidates.len())].clone();
                self.machines[i].kill_agent();
                maintenance = open;
                let back = self.undo_later(at, (5_000, 90_000), Undo::Agent(i));
                let name = &self.machines[i].name;
                self.say(&format!(
                    "agent of {name} killed ({maintenance:?}), back in {back:?}"
                ));
            }
            Fault::ApiServerRestarted => {
                let state = &crate::controlplane::shared().state_dir;
                let restarts = || {
                    std::fs::read_to_string(state.join("restarts")).map_or(0, |s| s.lines().count())
                };
                let before = restarts();
                self.say("API server and etcd killed");
                std::fs::write(state.join("restart"), "")?;
                crate::wait::eventually("the API server back", Duration::from_secs(120), || {
                    let now = restarts();
                    async move { Ok((now > before).then_some(())) }
                })
                .await?;
            }
            Fault::NodeNeverReturned => {
                let dead = self.dead.iter().filter(|d| **d).count();
                if dead >= self.settings.max_dead_nodes || self.doom_next_reboot.is_some() {
                    return Ok(false);
                }
                // Recorded when the doomed machine goes down.
                self.doom_next_reboot = Some(at);
                self.say("the next machine to reboot will not come back");
                return Ok(true);
            }
        }
        self.injected.push(Injected {
            fault,
            at,
            maintenance,
        });
        Ok(true)
    }

    fn say(&self, what: &str) {
        eprintln!(
            "[soak +{:.1} s] {what}",
            self.started.elapsed().as_secs_f64()
        );
    }

    /// The replica holding the coordinator's lease, if one of ours does.
    async fn leader(&self) -> anyhow::Result<Option<usize>> {
        let leases: Api<Lease> = Api::namespaced(self.env.client.clone(), &self.env.namespace);
        let holder = leases
            .get_opt("nodeward-coordinator")
            .await?
            .and_then(|l| l.spec?.holder_identity);
        Ok(holder.and_then(|h| {
            self.replicas
                .iter()
                .position(|r| r.identity == h && r.daemon.is_some())
        }))
    }

    /// The unfinished maintenance of machine `i`'s node, if it has one.
    async fn open_maintenance(&self, i: usize) -> anyhow::Result<Option<String>> {
        let node = &self.machines[i].name;
        let open = self
            .ours()
            .await?
            .into_iter()
            .find(|m| &m.spec.node_name == node && !m.phase().is_finished());
        Ok(open.map(|m| m.name_any()))
    }

    /// Every maintenance finished and every running machine done asking: its reboot request
    /// (if it still needs one) answered by a maintenance of its current boot.
    async fn settled(&self) -> anyhow::Result<bool> {
        let all = self.ours().await?;
        if all.iter().any(|m| !m.phase().is_finished()) {
            return Ok(false);
        }
        // The coordinator frees a finished maintenance's slot in the round after it sees it
        // finish: the end is once it has.
        if self.slots_held().await? > 0 {
            return Ok(false);
        }
        // A node that stays down is restored by the coordinator once its agent is lost.
        for machine in &self.machines {
            if !crate::node_restored(&self.env.nodes().get(&machine.name).await?) {
                return Ok(false);
            }
        }
        Ok(self.machines.iter().zip(&self.dead).all(|(machine, dead)| {
            *dead
                || !machine.reboot_pending()
                || all.iter().any(|m| {
                    m.spec.node_name == machine.name
                        && m.metadata
                            .creation_timestamp
                            .as_ref()
                            .is_some_and(|t| t.0 >= machine.booted_at())
                })
        }))
    }

    /// The budget slots this run's policies hold.
    async fn slots_held(&self) -> anyhow::Result<usize> {
        let policies: Api<DisruptionPolicy> = Api::all(self.env.client.clone());
        Ok(policies
            .list(
                &kube::api::ListParams::default().labels(&format!("{TEST_LABEL}={}", self.env.id)),
            )
            .await?
            .items
            .into_iter()
            .map(|p| p.status.map_or(0, |s| s.slots.len()))
            .sum())
    }

    /// The maintenances of this run's nodes.
    async fn ours(&self) -> anyhow::Result<Vec<NodeMaintenance>> {
        let prefix = format!("{}-", self.env.id);
        Ok(self
            .maintenances
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|m| m.spec.node_name.starts_with(&prefix))
            .collect())
    }

    async fn report(&self, started: Instant) -> anyhow::Result<Report> {
        let h = self
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let all = self.ours().await?;
        let mut report = Report {
            settings_summary: format!(
                "{} nodes at maxConcurrent {}, a fault every {:?} on average for {:?} (seed {})",
                self.settings.nodes,
                self.settings.max_concurrent,
                self.settings.mean_fault_interval,
                self.settings.duration,
                self.settings.seed
            ),
            ran_for: started.elapsed(),
            settled: self.settled,
            maintenances: all.len(),
            max_admitted: h.max_active,
            max_admitted_were: h.max_active_were.iter().cloned().collect(),
            max_slots: h.max_slots,
            budget: self.settings.max_concurrent,
            halts: h.halts,
            resumes: self.resumes,
            admitted_after_halt: h.admitted_after_halt.clone(),
            ..Report::default()
        };
        for m in &all {
            match m.phase() {
                MaintenancePhase::Succeeded => report.succeeded += 1,
                p if !p.is_finished() => report.not_finished.push(m.name_any()),
                _ => match m.status.as_ref().and_then(|s| s.message.clone()) {
                    Some(message) if !message.is_empty() => {
                        *report.not_succeeded.entry(message).or_default() += 1;
                    }
                    _ => report.unexplained.push(m.name_any()),
                },
            }
        }
        report.leaked_slots = self.slots_held().await?;
        for machine in &self.machines {
            let node = self.env.nodes().get(&machine.name).await?;
            if !crate::node_restored(&node) {
                report.left_cordoned.push(machine.name.clone());
            }
        }
        for f in &self.injected {
            let entry = report.faults.entry(f.fault).or_default();
            entry.0 += 1;
            if let Some(d) = recovery(f, &h) {
                entry.1.push(d);
            }
        }
        Ok(report)
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for r in &self.replicas {
            if let Some(d) = &r.daemon {
                s.push_str(&format!("== coordinator {}\n{}\n", r.identity, d.output()));
            }
        }
        s
    }
}
