//! The coordinator's control loop: watches Nodes, DisruptionPolicies, NodeMaintenances and
//! NodeReports into reflector stores, and while it leads, runs a round ([`nodeward_decide::round`]) on
//! every change (and every `resync`, for windows and durations that pass with time) and
//! carries the plan out: budget slots first, as conditional writes of each policy's status,
//! then the maintenances they admit, denials, endings and remediation.
//!
//! When the only change is new pending maintenances, an admission-only round decides them
//! against what the last full round left ([`round::admit_new`]): a burst of creations in a
//! large cluster then costs a decision each, not a pass over every node each.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, ResourceExt, runtime::reflector};
use nodeward_api::{
    DisruptionPolicy, MaintenancePhase, NodeMaintenance, labels::COORDINATOR_FIELD_MANAGER,
};
use nodeward_runtime::events::Events;
use tokio::sync::watch::Receiver;

mod api_waits;
mod denials;
mod effects;
mod nodes;
mod slots;
mod surges;
mod verdicts;
mod watch;
mod write;

use watch::Fresh;
pub use watch::{Changes, Stores};
use write::Writer;

use nodeward_decide::{
    blockers,
    round::{self, Gone, Memory, Objects, Plan, Standing},
};

use crate::{
    blockers::Lookups,
    metrics::{Applied, Metrics, RoundLabels},
    workloads,
};

/// The readiness gate the synced watches open: nothing is decided before.
pub const SYNCED: &str = "the watches have not synced yet";

pub struct Controller {
    /// Carries plans out; holds the client, identity, metrics and Events.
    writer: Writer,
    /// Admission writes of earlier rounds still under way (a full round waits for them).
    writes: tokio::task::JoinSet<bool>,
    memory: Memory,
    fresh_policies: Fresh<DisruptionPolicy>,
    denied_at: HashMap<String, Instant>,
    remediated_at: HashMap<String, Instant>,
    blockers: Lookups,
    gates: crate::gates::Reads,
    workloads: workloads::Lookups,
    /// What the last full round left, while everything it decided was written.
    standing: Option<Standing>,
    /// When each maintenance first seen pending arrived, until it is admitted or denied.
    arrived: HashMap<String, Instant>,
    /// When the loop waited on the API server, to tell admissions' own share.
    api_waits: api_waits::ApiWaits,
    /// Why each dead-looking node waits for its out-of-service taint, as last told in an Event
    /// (its subject: the why with its numbers masked).
    out_of_service_said: BTreeMap<String, String>,
    settings: Settings,
}

/// What the coordinator's flags give every round.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `--finished-maintenance-ttl` (`None`: finished maintenances are kept).
    pub finished_ttl: Option<std::time::Duration>,
    /// `--mark-for-other-actors`.
    pub marks: Vec<nodeward_decide::round::marks::Mark>,
}

impl Controller {
    pub fn new(
        client: Client,
        identity: String,
        metrics: Arc<Metrics>,
        changed: Arc<Changes>,
        settings: Settings,
    ) -> Self {
        let events = Events::new(client.clone(), COORDINATOR_FIELD_MANAGER, identity.clone());
        Self {
            blockers: Lookups::new(client.clone()),
            gates: crate::gates::Reads::new(client.clone()),
            workloads: workloads::Lookups::new(client.clone(), {
                let changed = changed.clone();
                Arc::new(move || changed.anything())
            }),
            writer: Writer {
                client,
                identity,
                metrics,
                events,
                changed,
                fresh_maintenances: Arc::new(std::sync::Mutex::new(Fresh::new())),
            },
            writes: tokio::task::JoinSet::new(),
            memory: Memory::default(),
            fresh_policies: Fresh::new(),
            denied_at: HashMap::new(),
            remediated_at: HashMap::new(),
            standing: None,
            arrived: HashMap::new(),
            api_waits: api_waits::ApiWaits::default(),
            out_of_service_said: BTreeMap::new(),
            settings,
        }
    }

    /// Runs rounds while leading, until `stop` fires. Nothing is decided before every watch
    /// has synced: the coordinator never admits on a partial view.
    pub async fn run(
        mut self,
        stores: Stores,
        mut leader: Receiver<bool>,
        resync: Duration,
        readiness: Arc<nodeward_runtime::server::Readiness>,
        mut stop: Receiver<bool>,
    ) {
        let changed = self.writer.changed.clone();
        // The only waiter on the stores' readiness: kube-runtime wakes just one.
        tokio::select! {
            synced = stores.synced() => if !synced { return },
            _ = stop.changed() => return,
        }
        readiness.pass(SYNCED);
        tracing::info!("watches synced");
        let mut last_full: Option<Instant> = None;
        loop {
            let resync_at = last_full.map_or_else(Instant::now, |at| at + resync);
            let leadership_changed = tokio::select! {
                _ = changed.notify.notified() => false,
                _ = tokio::time::sleep_until(resync_at.into()) => false,
                _ = leader.changed() => true,
                _ = stop.changed() => break,
            };
            if !*leader.borrow() {
                self.standing = None;
                last_full = Some(Instant::now());
                continue;
            }
            let changes = changed.take();
            let mut names = Vec::new();
            for (name, at) in changes.new_pending {
                self.arrived.entry(name.clone()).or_insert(at);
                names.push(name);
            }
            let due = leadership_changed || last_full.is_none_or(|at| at.elapsed() >= resync);
            self.reap_writes();
            if !due && !changes.anything {
                // A wake whose change an earlier round already took.
                if names.is_empty() {
                    continue;
                }
                if self.admission_round(&stores, &names, &leader).await {
                    continue;
                }
            }
            let confirm = self.round(&stores, &leader).await;
            last_full = Some(Instant::now());
            let confirming = Instant::now();
            let gone = self.confirm_gone(confirm).await;
            self.api_waits.since(confirming);
            if gone {
                changed.anything();
            }
        }
        // Admissions whose slots were written are finished before stopping; one cut short
        // would be completed by the next leader, which sees the slot.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.settle_writes()).await;
    }

    /// One round: decide, then write. Returns the missing objects to confirm gone.
    async fn round(&mut self, stores: &Stores, leader: &Receiver<bool>) -> BTreeSet<Gone> {
        self.standing = None;
        let settling = Instant::now();
        self.settle_writes().await;
        self.api_waits.since(settling);
        let mut objects = stores.objects();
        objects.finished_ttl = self.settings.finished_ttl;
        objects.marks.clone_from(&self.settings.marks);
        self.fresh_policies.apply(&mut objects.policies, true);
        self.writer
            .fresh_maintenances()
            .apply(&mut objects.maintenances, true);
        if !self.arrived.is_empty() {
            let pending: BTreeSet<String> = objects
                .maintenances
                .iter()
                .filter(|m| m.phase() == MaintenancePhase::Pending)
                .map(|m| m.name_any())
                .collect();
            self.arrived.retain(|name, _| pending.contains(name));
        }
        let looking = Instant::now();
        self.look_up(&mut objects).await;
        self.api_waits.since(looking);
        let started = Instant::now();
        let mut plan = round::plan(&objects, &mut self.memory, Timestamp::now());
        if !self.decided("full", started, &plan, leader) {
            return BTreeSet::new();
        }
        let standing = std::mem::take(&mut plan.standing);
        self.report_risks(&objects, &plan);
        self.say_out_of_service_waits(&objects, &plan.out_of_service_waits);
        if plan.superseded.len() == round::SUPERSEDED_PER_ROUND {
            // More may wait: the next round ends the next ones.
            self.writer.changed.anything();
        }
        // From here on the round writes what it decided.
        self.carry_out(&objects, &plan, standing).await;
        plan.confirm_gone
    }

    /// What a full round needs beyond the watched objects: the reboot blockers and the
    /// PodDisruptionBudgets holding pending nodes, and the workloads Verifying reboots wait
    /// for.
    async fn look_up(&mut self, objects: &mut Objects) {
        let lookups = blockers::wanted(
            &objects.maintenances,
            &objects.policies,
            blockers::by_labels(&objects.nodes),
        );
        if !lookups.is_empty() {
            objects.blockers = self.blockers.blocked(&lookups).await;
        }
        let gated = nodeward_decide::gates::wanted(
            &objects.maintenances,
            &objects.policies,
            blockers::by_labels(&objects.nodes),
        );
        if !gated.is_empty() {
            objects.gates = self.gates.read(&gated).await;
        }
        (objects.workloads, objects.scans) = self.look_ahead(&objects.maintenances).await;
        let surged = round::surge::wanted(&objects.maintenances);
        if !surged.is_empty() {
            objects.surged = self.workloads.surged(&surged).await;
        }
        let evicted = round::workload_gate::wanted(objects);
        if !evicted.is_empty() {
            objects.availability = self.workloads.availability(&evicted).await;
        }
    }

    /// Events on a policy for what its new status says anew: a Warning for each rollout risk
    /// (a few per round; the status lists them all), and one when it halts or is resumed.
    fn report_risks(&self, objects: &Objects, plan: &Plan) {
        const EVENTS_PER_POLICY: usize = 5;
        for (name, status) in &plan.policy_status {
            let Some(policy) = objects.policies.iter().find(|p| p.name_any() == *name) else {
                continue;
            };
            self.report_rollout_turns(policy, status);
            let before = policy
                .status
                .as_ref()
                .map(|s| s.rollout_risks.as_slice())
                .unwrap_or_default();
            for risk in status
                .rollout_risks
                .iter()
                .filter(|r| !before.contains(r))
                .take(EVENTS_PER_POLICY)
            {
                self.writer.event(
                    policy.as_ref(),
                    kube::runtime::events::EventType::Warning,
                    "RolloutRisk",
                    format!(
                        "Deployment {}/{} has one replica, on node {}, which waits for maintenance: its drain takes it out of service (annotate it {}=true to surge first, or give it more replicas)",
                        risk.namespace,
                        risk.deployment,
                        risk.node_name,
                        nodeward_api::labels::SURGE_ANNOTATION
                    ),
                );
            }
        }
    }

    /// Events for the rollout's turns: a Warning when `policy`'s `Halted` turns True in
    /// `status`, a Normal one when it turns False again, and a Normal one when `CanaryPassed`
    /// turns True (the rest of the scope may go).
    fn report_rollout_turns(
        &self,
        policy: &DisruptionPolicy,
        status: &nodeward_api::DisruptionPolicyStatus,
    ) {
        use kube::runtime::events::EventType::{Normal, Warning};
        use nodeward_api::conditions::policy::{CANARY_PASSED, HALTED};
        let turned = |type_: &str| {
            let condition = |s: Option<&nodeward_api::DisruptionPolicyStatus>| {
                s.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
                    .map(|c| (c.status == "True", c.message.clone()))
            };
            let was = condition(policy.status.as_ref()).is_some_and(|(on, _)| on);
            condition(Some(status)).filter(|(on, _)| *on != was)
        };
        match turned(HALTED) {
            Some((true, message)) => self.writer.event(policy, Warning, "RolloutHalted", message),
            Some((false, message)) => self.writer.event(policy, Normal, "RolloutResumed", message),
            None => {}
        }
        if let Some((true, message)) = turned(CANARY_PASSED) {
            self.writer.event(policy, Normal, "CanaryPassed", message);
        }
    }

    /// Decides maintenances that appeared pending since the last full round against what it
    /// left, and writes the outcome. Returns false when the standing cannot decide them (then
    /// a full round must).
    async fn admission_round(
        &mut self,
        stores: &Stores,
        names: &[String],
        leader: &Receiver<bool>,
    ) -> bool {
        let Some(mut standing) = self.standing.take() else {
            return false;
        };
        let mut objects = Objects {
            policies: stores.policies.state(),
            maintenances: names
                .iter()
                .filter_map(|name| stores.maintenances.get(&reflector::ObjectRef::new(name)))
                .collect(),
            ..Objects::default()
        };
        self.fresh_policies.apply(&mut objects.policies, true);
        self.writer
            .fresh_maintenances()
            .apply(&mut objects.maintenances, false);
        let lookups = blockers::wanted(&objects.maintenances, &objects.policies, |policy, node| {
            standing.cluster.nodes.contains_key(node).then(|| {
                let name = policy.name_any();
                standing
                    .cluster
                    .policies
                    .iter()
                    .any(|p| p.name == name && p.matched.contains(node))
            })
        });
        let looking = Instant::now();
        let blocked = if lookups.is_empty() {
            BTreeMap::new()
        } else {
            self.blockers.blocked(&lookups).await
        };
        let (held, scans) = self.look_ahead(&objects.maintenances).await;
        self.api_waits.since(looking);
        let started = Instant::now();
        let Some(plan) = round::admit_new(
            &mut standing,
            &objects.policies,
            &objects.maintenances,
            &blocked,
            &held,
            &scans,
            Timestamp::now(),
        ) else {
            return false;
        };
        if !self.decided("admission", started, &plan, leader) {
            return true;
        }
        self.carry_out(&objects, &plan, standing).await;
        true
    }

    /// What admission looks ahead at on the nodes of pending `maintenances`: those a
    /// PodDisruptionBudget holds back now and why (all of them when the budgets cannot be
    /// checked: nothing is admitted on a check that could not be made), and the single-replica
    /// Deployments on each (see [`round::surge`]). No lookup while nothing is pending.
    async fn look_ahead(
        &mut self,
        maintenances: &[Arc<NodeMaintenance>],
    ) -> (
        BTreeMap<String, String>,
        BTreeMap<String, round::surge::Scan>,
    ) {
        let mut pending: Vec<&NodeMaintenance> = maintenances
            .iter()
            .map(AsRef::as_ref)
            .filter(|m| {
                m.phase() == MaintenancePhase::Pending && m.metadata.deletion_timestamp.is_none()
            })
            .collect();
        if pending.is_empty() {
            return (BTreeMap::new(), BTreeMap::new());
        }
        // The oldest are admitted first, so they are looked at first.
        pending.sort_by_key(|m| m.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let mut nodes: Vec<String> = Vec::new();
        for m in &pending {
            if !nodes.contains(&m.spec.node_name) {
                nodes.push(m.spec.node_name.clone());
            }
        }
        let held = self.held_by_budgets(&nodes).await;
        let scans = self.workloads.scans(&nodes).await;
        (held, scans)
    }

    /// Which of `nodes` a PodDisruptionBudget holds back now, and why.
    async fn held_by_budgets(&mut self, nodes: &[String]) -> BTreeMap<String, String> {
        let pending: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
        match self.workloads.held().await {
            Ok(mut held) => {
                held.retain(|node, _| pending.contains(node.as_str()));
                held
            }
            Err(e) => pending
                .into_iter()
                .map(|node| {
                    (
                        node.to_owned(),
                        format!("cannot check the PodDisruptionBudgets of its pods: {e}"),
                    )
                })
                .collect(),
        }
    }

    /// Writes the plan's budget slots, then starts writing the admissions they hold (the
    /// loop goes on meanwhile; a failed admission write wakes a full round). Returns whether
    /// every slot stood and every admission is being written: what the plan left standing is
    /// then what the cluster holds, or more (a failed admission write keeps its slot until
    /// a full round looks), never less. Returns too what became of the slots' writes.
    async fn admit_all(
        &mut self,
        objects: &Objects,
        slots: &BTreeMap<String, nodeward_api::DisruptionPolicyStatus>,
        admit: &[round::Admission],
        deny: &[round::Denial],
    ) -> (Applied, bool) {
        let started = Instant::now();
        let (failed, applied) = self.write_policies(&objects.policies, slots).await;
        self.api_waits.since(started);
        // The coordinator's own share of each admission: from its watch event to its write,
        // less the loop's waits on the API server meanwhile (these budget writes, the
        // lookups, an earlier round's writes).
        let now = Instant::now();
        for admission in admit {
            if let Some(arrived) = self.arrived.remove(&admission.maintenance) {
                let own = self.api_waits.own_share(arrived, now);
                self.writer
                    .metrics
                    .admission_coordinator_seconds
                    .observe(own.as_secs_f64());
            }
        }
        for denial in deny {
            self.arrived.remove(&denial.maintenance);
        }
        let admissions: Vec<(Arc<NodeMaintenance>, round::Admission)> = admit
            .iter()
            .filter(|a| !a.new_slots_in.iter().any(|p| failed.contains(p)))
            .filter_map(|a| {
                Some((
                    Self::maintenance(objects, &a.maintenance)?.clone(),
                    a.clone(),
                ))
            })
            .collect();
        let complete = failed.is_empty() && admissions.len() == admit.len();
        if !admissions.is_empty() {
            // Each admission is its own object: written side by side once the slots stand.
            let writer = self.writer.clone();
            let changed = self.writer.changed.clone();
            self.writes.spawn(async move {
                let written = futures::future::join_all(
                    admissions
                        .iter()
                        .map(|(current, a)| writer.admit(current, a)),
                )
                .await;
                let all = written.iter().all(|ok| *ok);
                if !all {
                    changed.anything();
                }
                all
            });
        }
        (applied, complete)
    }

    /// Collects admission writes that finished; a failed one ends the standing.
    fn reap_writes(&mut self) {
        while let Some(done) = self.writes.try_join_next() {
            if !matches!(done, Ok(true)) {
                self.standing = None;
            }
        }
    }

    /// Waits for every admission write under way, so that a full round decides on them.
    async fn settle_writes(&mut self) {
        while self.writes.join_next().await.is_some() {}
    }

    /// Records a round's decision time and exports its plan; returns whether this coordinator
    /// still leads (only then is the plan written).
    fn decided(
        &self,
        round: &'static str,
        started: Instant,
        plan: &Plan,
        leader: &Receiver<bool>,
    ) -> bool {
        self.writer
            .metrics
            .decision_seconds
            .get_or_create(&RoundLabels { round })
            .observe(started.elapsed().as_secs_f64());
        self.export(plan);
        *leader.borrow()
    }

    /// Confirms with a direct read that objects missing from the watch are gone; returns
    /// whether any was (a new round can then free their slots).
    async fn confirm_gone(&mut self, missing: BTreeSet<Gone>) -> bool {
        let mut any = false;
        for gone in missing {
            let absent = match &gone {
                Gone::Maintenance { name, uid } => {
                    let api: Api<NodeMaintenance> = Api::all(self.writer.client.clone());
                    match api.get_opt(name).await {
                        Ok(found) => found.is_none_or(|m| m.uid().as_deref() != Some(uid)),
                        Err(_) => false,
                    }
                }
                Gone::Node(name) => {
                    let api: Api<Node> = Api::all(self.writer.client.clone());
                    matches!(api.get_opt(name).await, Ok(None))
                }
            };
            if absent {
                self.memory.confirmed_gone.insert(gone);
                any = true;
            }
        }
        any
    }
}
