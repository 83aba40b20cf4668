//! The coordinator against the real control plane with kwok nodes: admission under a budget
//! with the history watched, two coordinators both acting as leader, leader failover, quorum,
//! `maxUnhealthy`, the node startup timeout, slots freed on node deletion, pause with
//! acknowledgement, reboot blockers (pods, Prometheus alerts), and the `status` command.
//!
//! A coordinator watches the whole cluster, so these tests run one at a time (they share one
//! control plane with the rest of the run); each one's policy selects only its own nodes.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use anyhow::Context;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use nix::sys::signal::Signal;
use nodeward_api::{DisruptionPolicy, MaintenancePhase, NodeMaintenance, NodeReport};
use nodeward_e2e::{
    NodeSpec, TestEnv, controlplane,
    daemon::{self, Daemon},
    env::{KWOK_NODE_ANNOTATION, TEST_LABEL},
    node_restored, wait,
};
use serde_json::{Value, json};

const COORDINATOR: &str = env!("CARGO_BIN_EXE_nodeward-coordinator");
const TIMEOUT: Duration = Duration::from_secs(60);
/// The lease duration the tests run coordinators with.
const LEASE: Duration = Duration::from_secs(4);

/// Coordinators watch every object in the cluster: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn start(env: &TestEnv, identity: &str, extra: &[&str]) -> anyhow::Result<Daemon> {
    let mut args: Vec<String> = [
        "run",
        "--lease-namespace",
        &env.namespace,
        "--lease-name",
        "coordinator",
        "--identity",
        identity,
        "--lease-duration",
        "4s",
        "--renew-deadline",
        "3s",
        "--retry-period",
        "500ms",
        "--resync",
        "1s",
        "--kubeconfig",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push(controlplane::shared().kubeconfig.display().to_string());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Daemon::start(COORDINATOR, &format!("{}-{identity}", env.id), &args)
}

/// Kwok nodes per `specs` whose NodeReports say their agents are alive (a heartbeat written
/// now): no agent runs in these tests, and the coordinator admits nothing to a node without.
async fn reporting_nodes(env: &TestEnv, specs: &[NodeSpec]) -> anyhow::Result<()> {
    env.create_nodes(specs).await?;
    let names: Vec<String> = (0..specs.len()).map(|i| env.node_name(i)).collect();
    env.heartbeats(&names).await
}

/// A DrainOnly maintenance `<node>-m` of `node`; returns its name.
async fn create_maintenance(env: &TestEnv, node: &str) -> anyhow::Result<String> {
    let name = format!("{node}-m");
    env.create_maintenance(&name, node, "Manual", "DrainOnly")
        .await?;
    Ok(name)
}

fn admitted_condition(m: &NodeMaintenance) -> Option<(String, String, String)> {
    m.status.as_ref()?.conditions.iter().find_map(|c| {
        (c.type_ == "Admitted").then(|| (c.status.clone(), c.reason.clone(), c.message.clone()))
    })
}

async fn wait_admitted(
    env: &TestEnv,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<NodeMaintenance> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    wait::until(&api, name, "Admitted", timeout, |m| {
        m.is_some_and(|m| m.phase() != MaintenancePhase::Pending)
    })
    .await?
    .context("the maintenance disappeared")
}

async fn wait_denied(env: &TestEnv, name: &str, reason: &str) -> anyhow::Result<String> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::until(
        &api,
        name,
        &format!("Admitted=False {reason}"),
        TIMEOUT,
        |m| {
            m.and_then(admitted_condition)
                .is_some_and(|(status, r, _)| status == "False" && r == reason)
        },
    )
    .await?
    .context("the maintenance disappeared")?;
    Ok(admitted_condition(&m).map(|c| c.2).unwrap_or_default())
}

/// Plays the agents' part: marks a maintenance finished, as an agent does when done.
async fn finish(env: &TestEnv, name: &str) -> anyhow::Result<()> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded", "finishedAt": jiff::Timestamp::now().to_string()}})),
    )
    .await
    .with_context(|| format!("finishing {name}"))?;
    Ok(())
}

/// Finishes every admitted maintenance after `hold`, as the agents would, until all of
/// `names` are finished.
async fn finish_admitted(
    env: &TestEnv,
    names: &[String],
    hold: Duration,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let deadline = Instant::now() + timeout;
    let mut admitted_at: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        let listed = api
            .list(&kube::api::ListParams::default().labels(&format!("{TEST_LABEL}={}", env.id)))
            .await?;
        let mut unfinished = 0;
        for m in &listed.items {
            let name = m.name_any();
            if !names.contains(&name) || m.phase().is_finished() {
                continue;
            }
            unfinished += 1;
            if m.phase() == MaintenancePhase::Admitted {
                let since = *admitted_at.entry(name.clone()).or_insert_with(Instant::now);
                if since.elapsed() >= hold {
                    finish(env, &name).await?;
                }
            }
        }
        if unfinished == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{unfinished} maintenances still unfinished after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn fifty_maintenances_are_admitted_never_more_than_three_at_once() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("admit-fifty").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 50]).await?;
    let history = nodeward_e2e::history::watch(&env);
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 3}))
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;

    let mut names = Vec::new();
    for i in 0..50 {
        names.push(create_maintenance(&env, &env.node_name(i)).await?);
    }
    // Some are denied while the budget is used.
    let denied = wait_denied(&env, &names[49], "BudgetExhausted").await?;
    assert!(denied.contains("allows 3"), "the denial says why: {denied}");
    finish_admitted(
        &env,
        &names,
        Duration::from_millis(200),
        Duration::from_secs(120),
    )
    .await?;

    let h = history.lock().expect("history").clone();
    assert_eq!(h.admitted.len(), 50, "every maintenance was admitted once");
    assert!(
        h.max_active <= 3,
        "at most 3 admitted at once, saw {}",
        h.max_active
    );
    assert_eq!(h.max_active, 3, "the budget was used in full");
    assert!(
        h.max_slots <= 3,
        "policy {policy} held {} slots",
        h.max_slots
    );
    let admissions = coordinator
        .metric("nodeward_coordinator_admissions_total")
        .await?;
    assert!(admissions >= 50.0, "admissions metric {admissions}");
    // The burst was decided by admission-only rounds (the budget above held with them).
    let admission_rounds = coordinator
        .metric("nodeward_coordinator_decision_duration_seconds_count{round=\"admission\"}")
        .await?;
    assert!(
        admission_rounds >= 1.0,
        "admission rounds {admission_rounds}"
    );
    // The first was admitted as soon as it arrived: its own share is measured. (The next two
    // may arrive while a round is under way, on a busy machine, and then share the next one.)
    let measured = coordinator
        .metric("nodeward_coordinator_admission_coordinator_seconds_count")
        .await?;
    assert!(measured >= 1.0, "admissions measured {measured}");
    let p = Api::<DisruptionPolicy>::all(env.client.clone())
        .get(&policy)
        .await?;
    wait::eventually("the slots to be freed", TIMEOUT, || async {
        let p = Api::<DisruptionPolicy>::all(env.client.clone())
            .get(&policy)
            .await?;
        Ok(p.status.is_some_and(|s| s.slots.is_empty()).then_some(()))
    })
    .await?;
    assert_eq!(p.status.map(|s| s.matched), Some(50));
    env.cleanup().await
}

#[tokio::test]
async fn two_coordinators_both_acting_as_leader_keep_the_budget() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("two-leaders").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 20]).await?;
    let history = nodeward_e2e::history::watch(&env);
    env.create_policy("pool", json!({"maxConcurrent": 2}))
        .await?;
    let a = start(&env, "a", &["--leader-elect=false"])?;
    let b = start(&env, "b", &["--leader-elect=false"])?;
    a.wait_ready(TIMEOUT).await?;
    b.wait_ready(TIMEOUT).await?;

    let mut names = Vec::new();
    for i in 0..20 {
        names.push(create_maintenance(&env, &env.node_name(i)).await?);
    }
    finish_admitted(
        &env,
        &names,
        Duration::from_millis(100),
        Duration::from_secs(120),
    )
    .await?;
    let h = history.lock().expect("history").clone();
    assert_eq!(h.admitted.len(), 20);
    assert!(
        h.max_active <= 2,
        "at most 2 admitted at once, saw {}",
        h.max_active
    );
    assert!(h.max_slots <= 2, "at most 2 slots, saw {}", h.max_slots);
    let by: BTreeSet<String> = h.admitted.values().cloned().collect();
    let conflicts = a
        .metric("nodeward_coordinator_slot_conflicts_total")
        .await?
        + b.metric("nodeward_coordinator_slot_conflicts_total")
            .await?;
    eprintln!("two leaders: admissions by {by:?}, {conflicts} conditional writes refused");
    assert!(a.metric("nodeward_coordinator_leader").await? == 1.0);
    env.cleanup().await
}

async fn lease_holder(env: &TestEnv) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    Ok(leases
        .get_opt("coordinator")
        .await?
        .and_then(|l| l.spec?.holder_identity))
}

#[tokio::test]
async fn a_killed_leader_is_replaced_within_the_lease_duration() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("failover").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 3]).await?;
    let history = nodeward_e2e::history::watch(&env);
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let mut coordinators: BTreeMap<String, Daemon> = BTreeMap::new();
    for identity in ["a", "b"] {
        coordinators.insert(identity.to_owned(), start(&env, identity, &[])?);
    }
    let leader = wait::eventually("a leader", TIMEOUT, || lease_holder(&env)).await?;
    let follower = if leader == "a" { "b" } else { "a" };
    let metric = coordinators[follower]
        .metric("nodeward_coordinator_leader")
        .await?;
    assert_eq!(metric, 0.0, "the follower does not lead");

    let first = create_maintenance(&env, &env.node_name(0)).await?;
    let m = wait_admitted(&env, &first, TIMEOUT).await?;
    let by = m.status.and_then(|s| s.admission).map(|a| a.admitted_by);
    assert_eq!(by.as_deref(), Some(leader.as_str()));
    let second = create_maintenance(&env, &env.node_name(1)).await?;
    wait_denied(&env, &second, "BudgetExhausted").await?;

    // Kill the leader without letting it release the Lease; free the slot it gave.
    let killed = coordinators.get(&leader).context("leader process")?;
    killed.signal(Signal::SIGKILL)?;
    let started = Instant::now();
    finish(&env, &first).await?;
    let m = wait_admitted(&env, &second, LEASE + Duration::from_secs(10)).await?;
    let took = started.elapsed();
    let by = m.status.and_then(|s| s.admission).map(|a| a.admitted_by);
    assert_eq!(by.as_deref(), Some(follower), "the follower took over");
    assert!(
        took <= LEASE + Duration::from_secs(5),
        "took over after {took:?}, lease {LEASE:?}"
    );
    eprintln!("failover: next admission {took:?} after the leader was killed (lease {LEASE:?})");
    let h = history.lock().expect("history").clone();
    assert!(
        h.max_active <= 1,
        "no double admission: saw {}",
        h.max_active
    );

    // A leader stopped with SIGTERM releases the Lease: the other takes over at once.
    let mut new_leader = coordinators.remove(follower).context("follower process")?;
    let restarted = start(&env, &leader, &[])?;
    restarted.wait_ready(TIMEOUT).await?;
    new_leader.signal(Signal::SIGTERM)?;
    let status = new_leader.wait_exit(Duration::from_secs(10)).await?;
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    // The controller and the election ended between writes, not aborted.
    let output = new_leader.output();
    assert!(daemon::stopped_between_writes(&output), "{output}");
    let released = Instant::now();
    wait::eventually("the restarted coordinator to lead", TIMEOUT, || async {
        Ok((lease_holder(&env).await?.as_deref() == Some(leader.as_str())).then_some(()))
    })
    .await?;
    assert!(
        released.elapsed() < LEASE,
        "a released Lease is taken at once, took {:?}",
        released.elapsed()
    );
    env.cleanup().await
}

#[tokio::test]
async fn a_control_plane_node_is_not_disrupted_while_another_is_not_ready() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("quorum").await?;
    reporting_nodes(
        &env,
        &[
            NodeSpec::control_plane("a"),
            NodeSpec::control_plane("b"),
            NodeSpec::worker("a"),
            NodeSpec::worker("b"),
        ],
    )
    .await?;
    // A third control-plane node that never becomes Ready (no kwok to run it).
    let not_ready = env.node_name(9);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": not_ready, "labels": {
            TEST_LABEL: env.id, "node-role.kubernetes.io/control-plane": "",
        }},
    }))?;
    env.nodes().create(&PostParams::default(), &node).await?;
    env.create_policy("all", json!({"maxConcurrent": 3}))
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;

    let cp = create_maintenance(&env, &env.node_name(0)).await?;
    let worker = create_maintenance(&env, &env.node_name(2)).await?;
    let message = wait_denied(&env, &cp, "QuorumProtected").await?;
    // Names a NotReady control-plane node (this test's, or one a failed earlier run left).
    assert!(message.contains("is NotReady"), "{message}");
    let _ = &not_ready;
    wait_admitted(&env, &worker, TIMEOUT).await?;
    let m = Api::<NodeMaintenance>::all(env.client.clone())
        .get(&cp)
        .await?;
    assert_eq!(m.phase(), MaintenancePhase::Pending);
    // An Event tells why.
    env.wait_event(&cp, "", "QuorumProtected").await?;
    env.cleanup().await
}

/// Sets a condition on a node as having changed at `since`.
async fn set_condition(
    env: &TestEnv,
    node: &str,
    type_: &str,
    status: &str,
    since: jiff::Timestamp,
) -> anyhow::Result<()> {
    let patch = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "status": {"conditions": [{"type": type_, "status": status, "reason": "E2e",
            "message": "set by the test", "lastTransitionTime": since.to_string(),
            "lastHeartbeatTime": jiff::Timestamp::now().to_string()}]},
    });
    env.nodes()
        .patch_status(
            node,
            &PatchParams::apply("e2e-problem").force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

fn policy_condition(p: &DisruptionPolicy, type_: &str) -> Option<(String, String, String)> {
    p.status.as_ref()?.conditions.iter().find_map(|c| {
        (c.type_ == type_).then(|| (c.status.clone(), c.reason.clone(), c.message.clone()))
    })
}

async fn remediations(env: &TestEnv) -> anyhow::Result<Vec<NodeMaintenance>> {
    let prefix = format!("{}-", env.id);
    Ok(Api::<NodeMaintenance>::all(env.client.clone())
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|m| m.spec.node_name.starts_with(&prefix))
        .filter(|m| m.spec.reason == nodeward_api::MaintenanceReason::Remediation)
        .collect())
}

#[tokio::test]
async fn max_unhealthy_short_circuits_remediation() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("max-unhealthy").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 4]).await?;
    let policy = env
        .create_policy(
            "pool",
            json!({"maxConcurrent": 1, "maxUnhealthy": 1, "remediation": {
                "enabled": true, "action": "Reboot",
                "unhealthyConditions": [{"type": "E2eProblem", "status": "True", "for": "3s"}],
            }}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    wait::until(
        &policies,
        &policy,
        "RemediationAllowed=True",
        TIMEOUT,
        |p| {
            p.and_then(|p| policy_condition(p, "RemediationAllowed"))
                .is_some_and(|c| c.0 == "True")
        },
    )
    .await?;

    // Two nodes go bad at the same instant, so that no round can see one past the 3s the
    // condition must hold and the other not yet: over the limit.
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    let storm = jiff::Timestamp::now();
    set_condition(&env, &n0, "E2eProblem", "True", storm).await?;
    set_condition(&env, &n1, "E2eProblem", "True", storm).await?;
    let p = wait::until(
        &policies,
        &policy,
        "RemediationAllowed=False",
        TIMEOUT,
        |p| {
            p.and_then(|p| policy_condition(p, "RemediationAllowed"))
                .is_some_and(|c| c.0 == "False")
        },
    )
    .await?
    .context("policy")?;
    let (_, reason, message) = policy_condition(&p, "RemediationAllowed").context("condition")?;
    assert_eq!(reason, "TooManyUnhealthy");
    assert!(message.contains("maxUnhealthy 1"), "{message}");
    assert_eq!(p.status.as_ref().map(|s| s.unhealthy), Some(2));
    assert!(
        remediations(&env).await?.is_empty(),
        "no remediation during a storm"
    );

    // One recovers: back within the limit, the other one is remediated.
    set_condition(&env, &n0, "E2eProblem", "False", jiff::Timestamp::now()).await?;
    let created = wait::eventually("a remediation maintenance", TIMEOUT, || async {
        Ok(Some(remediations(&env).await?).filter(|r| !r.is_empty()))
    })
    .await?;
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(created[0].spec.node_name, n1);
    assert_eq!(
        created[0].spec.action,
        nodeward_api::MaintenanceAction::Reboot
    );
    let m = wait_admitted(&env, &created[0].name_any(), TIMEOUT).await?;
    assert_eq!(m.spec.requested_by.as_deref(), Some("nodeward-coordinator"));
    env.cleanup().await
}

#[tokio::test]
async fn a_node_that_never_becomes_ready_times_out_and_is_deleted() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("startup-timeout").await?;
    env.create_policy("pool",
        json!({"remediation": {"enabled": false, "nodeStartupTimeout": "3s", "startupAction": "DeleteNode"}}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = env.node_name(0);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
    }))?;
    let created = Instant::now();
    env.nodes().create(&PostParams::default(), &node).await?;
    wait::until(&env.nodes(), &name, "StartupTimedOut=True", TIMEOUT, |n| {
        wait::node_condition(n, "StartupTimedOut").is_some_and(|(status, _)| status == "True")
    })
    .await?;
    // creationTimestamp has whole seconds: the 3s can end up to 1s before our own clock says.
    assert!(
        created.elapsed() >= Duration::from_secs(2),
        "not before the timeout: {:?}",
        created.elapsed()
    );
    wait::until(&env.nodes(), &name, "the node deleted", TIMEOUT, |n| {
        n.is_none()
    })
    .await?;
    env.wait_event(&name, "regarding.kind=Node", "NodeStartupTimeout")
        .await?;
    drop(coordinator);
    env.cleanup().await
}

#[tokio::test]
async fn deleting_the_node_frees_its_slot() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("node-deleted").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 2]).await?;
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let first = create_maintenance(&env, &env.node_name(0)).await?;
    wait_admitted(&env, &first, TIMEOUT).await?;
    let second = create_maintenance(&env, &env.node_name(1)).await?;
    wait_denied(&env, &second, "BudgetExhausted").await?;

    env.nodes()
        .delete(&env.node_name(0), &DeleteParams::default())
        .await?;
    wait_admitted(&env, &second, TIMEOUT).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::phase(&maintenances, &first, MaintenancePhase::Cancelled, TIMEOUT).await?;
    let message = m.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("was deleted"), "{message}");
    let p = Api::<DisruptionPolicy>::all(env.client.clone())
        .get(&policy)
        .await?;
    let slots: Vec<String> = p
        .status
        .map(|s| s.slots.into_iter().map(|s| s.maintenance).collect())
        .unwrap_or_default();
    assert_eq!(slots, vec![second]);
    drop(coordinator);
    env.cleanup().await
}

async fn report_ack(
    env: &TestEnv,
    node: &str,
    policy: &str,
    generation: Option<i64>,
) -> anyhow::Result<()> {
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    if reports.get_opt(node).await?.is_none() {
        let report: NodeReport = serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
            "metadata": {"name": node}, "spec": {"nodeName": node},
        }))?;
        reports.create(&PostParams::default(), &report).await?;
    }
    let acks: Vec<Value> = generation
        .into_iter()
        .map(|g| json!({"policy": policy, "observedGeneration": g}))
        .collect();
    reports
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"pauseAcknowledgements": acks}})),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn paused_appears_only_after_every_agent_in_scope_acknowledged() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("pause").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 2, "paused": true}))
        .await?;
    report_ack(&env, &n0, &policy, None).await?;
    report_ack(&env, &n1, &policy, None).await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let generation = policies
        .get(&policy)
        .await?
        .metadata
        .generation
        .context("generation")?;

    let pending = create_maintenance(&env, &n0).await?;
    wait_denied(&env, &pending, "Paused").await?;
    let paused = |status: &'static str, mentions: Option<String>| {
        let policies = policies.clone();
        let policy = policy.clone();
        async move {
            wait::until(
                &policies,
                &policy,
                &format!("Paused={status}"),
                TIMEOUT,
                |p| {
                    p.and_then(|p| policy_condition(p, "Paused"))
                        .is_some_and(|c| {
                            c.0 == status
                                && mentions.as_ref().is_none_or(|m| c.2.contains(m.as_str()))
                        })
                },
            )
            .await
        }
    };
    paused("False", Some(n0.clone())).await?;

    // Once n0 acknowledged, only n1 is waited for (the wait fails if n0 stays named).
    report_ack(&env, &n0, &policy, Some(generation)).await?;
    wait::until(
        &policies,
        &policy,
        "Paused=False waiting for n1 only",
        TIMEOUT,
        |p| {
            p.and_then(|p| policy_condition(p, "Paused"))
                .is_some_and(|c| c.0 == "False" && c.2.contains(&n1) && !c.2.contains(&n0))
        },
    )
    .await?;

    report_ack(&env, &n1, &policy, Some(generation)).await?;
    paused("True", None).await?;

    // Unpausing clears it and admission resumes.
    policies
        .patch(
            &policy,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await?;
    paused("False", None).await?;
    wait_admitted(&env, &pending, TIMEOUT).await?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    for node in [&n0, &n1] {
        reports.delete(node, &DeleteParams::default()).await?;
    }
    env.cleanup().await
}

fn alerts(list: &[(&str, &str)]) -> String {
    let alerts: Vec<Value> = list
        .iter()
        .map(|(name, state)| json!({"labels": {"alertname": name, "severity": "warning"}, "state": state, "activeAt": "2026-11-21T10:00:00Z", "value": "1e+00"}))
        .collect();
    json!({"status": "success", "data": {"alerts": alerts}}).to_string()
}

/// Reboot blockers, against a stand-in for the Prometheus HTTP API (`GET /api/v1/alerts`,
/// Prometheus itself does not run here): a firing alert blocks the policy's scope, an
/// ignored or pending one does not, an unreachable Prometheus blocks; a pod matching a
/// blocking selector holds its node back until it is gone.
/// A tenant who may create pods cannot hold reboots by labelling one like a blocker: blockers
/// scoped to trusted namespaces ignore pods elsewhere.
#[tokio::test]
async fn a_tenants_pod_outside_the_blockers_namespaces_holds_no_reboot() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("tenant").await?;
    reporting_nodes(&env, &[NodeSpec::worker("a"), NodeSpec::worker("b")]).await?;
    let trusted = format!("{}-trusted", env.id);
    let policy = env
        .create_policy(
            "tenant",
            json!({"maxConcurrent": 2, "rebootBlockers": {
                "podSelectors": [{"matchLabels": {"e2e-blocks-reboot": "true"}}],
                "namespaceSelector": {"matchLabels": {"e2e.nodeward.io/trusted": trusted}},
            }}),
        )
        .await?;
    let labels = BTreeMap::from([("e2e-blocks-reboot".to_owned(), "true".to_owned())]);
    let options = nodeward_e2e::PodOptions {
        labels,
        ..Default::default()
    };
    // The tenant's pod (the test namespace is not trusted) on the first node.
    env.replicaset("tenant", &env.node_name(0), 1, &options)
        .await?;
    env.running_pods("tenant", 1).await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let first = create_maintenance(&env, &env.node_name(0)).await?;
    wait_admitted(&env, &first, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;

    // The same pod in a trusted namespace blocks the second node, and is named.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    namespaces
        .patch(
            &env.namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e.nodeward.io/trusted": trusted}}})),
        )
        .await?;
    env.replicaset("batch", &env.node_name(1), 1, &options)
        .await?;
    let pod = env.running_pods("batch", 1).await?.remove(0);
    let second = create_maintenance(&env, &env.node_name(1)).await?;
    let message = wait_denied(&env, &second, "Blocked").await?;
    assert!(
        message.contains(&format!(
            "pod {}/{} matches rebootBlockers.podSelectors[0] of policy {policy}",
            env.namespace,
            pod.name_any()
        )),
        "{message}"
    );
    env.cleanup().await
}

#[tokio::test]
async fn reboot_blockers_hold_nodes_back_and_say_why() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("blockers").await?;
    reporting_nodes(&env, &[NodeSpec::worker("a"), NodeSpec::worker("b")]).await?;
    let prometheus = nodeward_e2e::http::Endpoint::start().await?;
    prometheus.reply(
        "/api/v1/alerts",
        200,
        &alerts(&[
            ("KernelUpgradeInProgress", "firing"),
            ("Watchdog", "firing"),
        ]),
    );
    let policy = env
        .create_policy(
            "blockers",
            json!({"maxConcurrent": 2, "rebootBlockers": {
                "podSelectors": [{"matchLabels": {"e2e-blocks-reboot": "true"}}],
                "prometheus": {"url": prometheus.url, "ignoreAlerts": "^Watchdog$"},
            }}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;

    let first = create_maintenance(&env, &env.node_name(0)).await?;
    let message = wait_denied(&env, &first, "Blocked").await?;
    assert!(
        message
            .contains("firing alerts KernelUpgradeInProgress (rebootBlockers.prometheus of policy")
            && message.contains(&policy)
            && !message.contains("Watchdog"),
        "{message}"
    );
    assert!(
        prometheus
            .received()
            .iter()
            .any(|r| r.method == "GET" && r.path == "/api/v1/alerts"),
        "the coordinator asked Prometheus"
    );

    // A pod matching the selector on the second node: named, before any alert.
    let labels = BTreeMap::from([("e2e-blocks-reboot".to_owned(), "true".to_owned())]);
    env.replicaset(
        "batch",
        &env.node_name(1),
        1,
        &nodeward_e2e::PodOptions {
            labels,
            ..Default::default()
        },
    )
    .await?;
    let pod = env.running_pods("batch", 1).await?.remove(0);
    let second = create_maintenance(&env, &env.node_name(1)).await?;
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let wanted = format!(
        "pod {}/{} matches rebootBlockers.podSelectors[0] of policy {policy}",
        env.namespace,
        pod.name_any()
    );
    wait::until(&api, &second, "blocked by the pod", TIMEOUT, |m| {
        m.and_then(admitted_condition)
            .is_some_and(|(_, reason, message)| reason == "Blocked" && message.contains(&wanted))
    })
    .await
    .with_context(|| coordinator.output())?;

    // Prometheus failing blocks too, and says so.
    prometheus.reply("/api/v1/alerts", 503, "service unavailable");
    wait::until(&api, &first, "blocked by the failed check", TIMEOUT, |m| {
        m.and_then(admitted_condition)
            .is_some_and(|(_, reason, message)| {
                reason == "Blocked"
                    && message.contains("cannot check rebootBlockers.prometheus")
                    && message.contains("503")
            })
    })
    .await
    .with_context(|| coordinator.output())?;

    // Only ignored and pending alerts left: the first goes; the second waits for its pod.
    prometheus.reply(
        "/api/v1/alerts",
        200,
        &alerts(&[
            ("Watchdog", "firing"),
            ("KernelUpgradeInProgress", "pending"),
        ]),
    );
    wait_admitted(&env, &first, TIMEOUT).await?;
    assert_eq!(api.get(&second).await?.phase(), MaintenancePhase::Pending);
    Api::<k8s_openapi::api::apps::v1::ReplicaSet>::namespaced(env.client.clone(), &env.namespace)
        .delete("batch", &DeleteParams::foreground())
        .await?;
    wait_admitted(&env, &second, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    // An Event tells why.
    env.wait_event(&second, "", "Blocked").await?;
    env.cleanup().await
}

#[tokio::test]
async fn a_delete_node_maintenance_acting_without_an_admission_deletes_no_node()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("forged-delete").await?;
    reporting_nodes(&env, &[NodeSpec::worker("a")]).await?;
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let node = env.node_name(0);
    let name = format!("{node}-forged");
    env.create_maintenance(&name, &node, "Manual", "DeleteNode")
        .await?;
    // Whoever may write the status moves it to Acting, the phase in which the coordinator
    // deletes a drained DeleteNode maintenance's node, without any admission.
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    maintenances
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Acting"}})),
        )
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let m = wait::until(&maintenances, &name, "Failed", TIMEOUT, |m| {
        m.map(NodeMaintenance::phase) == Some(MaintenancePhase::Failed)
    })
    .await
    .with_context(|| coordinator.output())?
    .context("maintenance")?;
    let message = m.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("is not deleted"), "{message}");
    assert!(
        env.nodes().get_opt(&node).await?.is_some(),
        "the node is still there"
    );
    drop(coordinator);
    env.cleanup().await
}

#[tokio::test]
async fn a_pause_is_not_reported_while_a_maintenance_admitted_before_it_will_still_drain()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("pause-admitted").await?;
    reporting_nodes(&env, &[NodeSpec::worker("a")]).await?;
    let n0 = env.node_name(0);
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    report_ack(&env, &n0, &policy, None).await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let admitted = create_maintenance(&env, &n0).await?;
    wait_admitted(&env, &admitted, TIMEOUT).await?;

    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let generation = policies
        .patch(
            &policy,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await?
        .metadata
        .generation
        .context("generation")?;
    report_ack(&env, &n0, &policy, Some(generation)).await?;
    // Every agent acknowledged, but the admitted maintenance's agent starts it regardless.
    wait::until(
        &policies,
        &policy,
        "Paused=False for the admitted maintenance",
        TIMEOUT,
        |p| {
            p.and_then(|p| policy_condition(p, "Paused"))
                .is_some_and(|c| {
                    c.0 == "False"
                        && c.2.contains("waiting for 0 agent(s)")
                        && c.2
                            .contains("1 maintenance(s) admitted, draining or acting")
                })
        },
    )
    .await
    .with_context(|| coordinator.output())?;
    // It ends (as its agent would end it): now nothing in scope is disrupted.
    Api::<NodeMaintenance>::all(env.client.clone())
        .patch_status(
            &admitted,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await?;
    wait::until(&policies, &policy, "Paused=True", TIMEOUT, |p| {
        p.and_then(|p| policy_condition(p, "Paused"))
            .is_some_and(|c| c.0 == "True")
    })
    .await
    .with_context(|| coordinator.output())?;
    drop(coordinator);
    env.cleanup().await
}

#[tokio::test]
async fn a_startup_deletion_waits_while_its_policy_is_paused() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("startup-paused").await?;
    let policy = env
        .create_policy(
            "pool",
            json!({"paused": true, "remediation": {"nodeStartupTimeout": "3s", "startupAction": "DeleteNode"}}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = env.node_name(0);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
    }))?;
    env.nodes().create(&PostParams::default(), &node).await?;
    let event = env
        .wait_event(&name, "regarding.kind=Node", "NodeStartupTimeout")
        .await?;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&format!("not deleted now: policy {policy} is paused")),
        "{note}"
    );
    assert!(
        env.nodes().get_opt(&name).await?.is_some(),
        "kept while paused"
    );
    Api::<DisruptionPolicy>::all(env.client.clone())
        .patch(
            &policy,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await?;
    wait::until(&env.nodes(), &name, "the node deleted", TIMEOUT, |n| {
        n.is_none()
    })
    .await
    .with_context(|| coordinator.output())?;
    drop(coordinator);
    env.cleanup().await
}

#[tokio::test]
async fn a_delete_node_maintenance_deletes_no_node_created_again_under_the_name()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("recreated").await?;
    reporting_nodes(&env, &[NodeSpec::worker("a")]).await?;
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let node = env.node_name(0);
    let old_uid = env.nodes().get(&node).await?.uid().context("uid")?;
    let name = format!("{node}-delete");
    env.create_maintenance(&name, &node, "Manual", "DeleteNode")
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let m = wait_admitted(&env, &name, TIMEOUT).await?;
    let recorded = m.status.and_then(|s| s.admission?.node_uid);
    assert_eq!(recorded.as_deref(), Some(old_uid.as_str()));
    drop(coordinator);

    // While no coordinator runs, the machine is replaced under the same name, and the
    // maintenance reaches Acting (drained, as its agent would report it).
    env.nodes().delete(&node, &DeleteParams::default()).await?;
    wait::until(&env.nodes(), &node, "the old node gone", TIMEOUT, |n| {
        n.is_none()
    })
    .await?;
    reporting_nodes(&env, &[NodeSpec::worker("a")]).await?;
    let new_uid = env.nodes().get(&node).await?.uid().context("uid")?;
    assert_ne!(new_uid, old_uid);
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    maintenances
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Acting"}})),
        )
        .await?;

    let coordinator = start(&env, "c2", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let m = wait::until(&maintenances, &name, "ended", TIMEOUT, |m| {
        m.is_some_and(|m| m.phase().is_finished())
    })
    .await
    .with_context(|| coordinator.output())?
    .context("maintenance")?;
    let message = m.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("created again"), "{message}");
    let now = env
        .nodes()
        .get_opt(&node)
        .await?
        .context("the new node stays")?;
    assert_eq!(now.uid().as_deref(), Some(new_uid.as_str()));
    drop(coordinator);
    env.cleanup().await
}

/// Writes `node`'s agent heartbeat as `age` old: its agent went silent that long ago.
async fn silence_agent(env: &TestEnv, node: &str, age: Duration) -> anyhow::Result<()> {
    let then = jiff::Timestamp::now() - jiff::SignedDuration::try_from(age)?;
    env.heartbeats_at(&[node.to_owned()], then).await
}

#[tokio::test]
async fn a_node_whose_agent_is_silent_is_admitted_only_once_it_reports() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("agentless").await?;
    // n0 without a NodeReport: as if no agent ever ran there (a Windows node, a virtual
    // kubelet); n1's agent last renewed its Lease 15 minutes ago (crash-looping since).
    env.create_nodes(&vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    silence_agent(&env, &n1, Duration::from_secs(900)).await?;
    env.create_policy("pool", json!({"maxConcurrent": 2}))
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let m0 = create_maintenance(&env, &n0).await?;
    let message = wait_denied(&env, &m0, "AgentUnavailable")
        .await
        .with_context(|| coordinator.output())?;
    assert!(
        message.contains(&n0) && message.contains("no NodeReport"),
        "{message}"
    );

    // An agent whose Lease was renewed longer ago than deadlines.agentHeartbeat (default 12m)
    // is none.
    let m1 = create_maintenance(&env, &n1).await?;
    let message = wait_denied(&env, &m1, "AgentUnavailable").await?;
    assert!(
        message.contains("last wrote its heartbeat")
            && message.contains("deadlines.agentHeartbeat 720s"),
        "{message}"
    );

    // The agents report: both are admitted.
    env.heartbeats(&[n0, n1]).await?;
    for m in [&m0, &m1] {
        wait_admitted(&env, m, TIMEOUT)
            .await
            .with_context(|| coordinator.output())?;
    }
    drop(coordinator);
    env.cleanup().await
}

#[tokio::test]
async fn an_admitted_maintenance_no_agent_starts_goes_back_to_pending_and_frees_its_slot()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("not-started").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    let history = nodeward_e2e::history::watch(&env);
    let policy = env
        .create_policy(
            "pool",
            json!({"maxConcurrent": 1, "deadlines": {"start": "30s"}}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let stuck = create_maintenance(&env, &n0).await?;
    let admitted = wait_admitted(&env, &stuck, TIMEOUT).await?;
    let status = admitted.status.clone().unwrap_or_default();
    let deadline = status
        .deadline
        .context("the start deadline is in the status")?;
    let admitted_at = status.admission.context("admission")?.admitted_at.0;
    assert_eq!(deadline.phase, MaintenancePhase::Admitted);
    assert_eq!(deadline.then, "back to Pending (NotStarted)");
    assert_eq!(
        deadline.time.0.as_second() - admitted_at.as_second(),
        30,
        "deadlines.start after the admission"
    );
    let waiting = create_maintenance(&env, &n1).await?;
    wait_denied(&env, &waiting, "BudgetExhausted").await?;
    // The stuck node's agent dies before starting: nothing moves the maintenance on.
    silence_agent(&env, &n0, Duration::from_secs(900)).await?;

    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let sent_back = wait::until(
        &maintenances,
        &stuck,
        "back to Pending (NotStarted)",
        Duration::from_secs(90),
        |m| {
            m.and_then(admitted_condition)
                .is_some_and(|(status, reason, _)| status == "False" && reason == "NotStarted")
        },
    )
    .await
    .with_context(|| coordinator.output())?
    .context("the maintenance disappeared")?;
    let status = sent_back.status.clone().unwrap_or_default();
    assert_eq!(status.phase, MaintenancePhase::Pending);
    assert!(status.admission.is_none(), "its admission is undone");
    let phases: Vec<MaintenancePhase> = status.history.iter().map(|h| h.phase).collect();
    assert_eq!(
        phases,
        [
            MaintenancePhase::Pending,
            MaintenancePhase::Admitted,
            MaintenancePhase::Pending
        ]
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "NodeRestored" && c.status == "False" && c.reason == "NotStarted"),
        "the agent is asked to undo what it may have left: {:?}",
        status.conditions
    );
    // Its slot goes to the next in line, and it waits for its agent.
    wait_admitted(&env, &waiting, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    wait_denied(&env, &stuck, "AgentUnavailable").await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let slots: Vec<String> = policies
        .get(&policy)
        .await?
        .status
        .map(|s| s.slots.into_iter().map(|s| s.maintenance).collect())
        .unwrap_or_default();
    assert_eq!(slots, vec![waiting.clone()]);
    env.wait_event(&stuck, "", "NotStarted").await?;
    let h = history.lock().expect("history").clone();
    assert_eq!(h.max_active, 1, "never more than maxConcurrent at once");
    assert_eq!(h.max_slots, 1);
    drop(coordinator);
    env.cleanup().await
}

/// A leader writes a maintenance's slot, then its admission write is delayed (a partition, a
/// slow connection) and another coordinator takes over, denies the maintenance and frees the
/// slot. The late write must not land, or the maintenance would run without a slot while
/// another one takes it.
#[tokio::test]
async fn a_half_done_admission_given_back_cannot_be_admitted_by_a_late_write() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("fence").await?;
    reporting_nodes(&env, &[NodeSpec::worker("a")]).await?;
    let n0 = env.node_name(0);
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 1, "paused": true}))
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = create_maintenance(&env, &n0).await?;
    wait_denied(&env, &name, "Paused").await?;
    drop(coordinator);

    // The other leader's half-done admission: its slot stood, and it holds the admission
    // write over the version it decided on.
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let decided_on = maintenances.get(&name).await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    policies
        .patch_status(
            &policy,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"slots": [{
                "maintenance": name,
                "uid": decided_on.uid(),
                "nodeName": n0,
                "admittedAt": jiff::Timestamp::now().to_string(),
            }]}})),
        )
        .await?;

    // This coordinator finds the slot of a maintenance that is still Pending under a paused
    // policy, and gives it back.
    let coordinator = start(&env, "c2", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    wait::until(&policies, &policy, "the slot given back", TIMEOUT, |p| {
        p.is_some_and(|p| p.status.as_ref().is_some_and(|s| s.slots.is_empty()))
    })
    .await
    .with_context(|| coordinator.output())?;

    let mut late = decided_on.clone();
    let status = late.status.get_or_insert_with(Default::default);
    status.phase = MaintenancePhase::Admitted;
    let written = maintenances
        .replace_status(&name, &PostParams::default(), &late)
        .await;
    assert!(
        matches!(&written, Err(kube::Error::Api(e)) if e.code == 409),
        "the late admission write is refused once the slot is given back: {:?}\n{}",
        written.map(|m| m.phase()),
        coordinator.output()
    );
    let now = maintenances.get(&name).await?;
    assert_eq!(now.phase(), MaintenancePhase::Pending);
    assert_eq!(
        now.status.and_then(|s| s.admissions_withdrawn),
        Some(1),
        "the withdrawal is counted"
    );
    drop(coordinator);
    env.cleanup().await
}

#[tokio::test]
async fn a_lost_agents_maintenances_are_finished_and_its_node_restored_by_the_coordinator()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("agent-lost").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    let policy = env
        .create_policy(
            "pool",
            json!({"maxConcurrent": 2, "deadlines": {"agentLost": "1m"}}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    // Each node's agent (played here) takes its maintenance: finalizer, taint, recorded cordon;
    // n0's shutdown guard had begun too (its taint) when the agent died.
    let draining = create_maintenance(&env, &n0).await?;
    let drained = create_maintenance(&env, &n1).await?;
    for (name, node, phase) in [(&draining, &n0, "Draining"), (&drained, &n1, "Acting")] {
        let mut taints = vec![json!({"key": "nodeward.io/maintenance", "effect": "NoSchedule"})];
        if node == &n0 {
            taints.push(json!({"key": "nodeward.io/shutdown", "effect": "NoSchedule"}));
        }
        wait_admitted(&env, name, TIMEOUT).await?;
        maintenances
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": ["nodeward.io/maintenance"]}})),
            )
            .await?;
        env.merge_node(node, json!({
                    "metadata": {"annotations": {"nodeward.io/cordoned-by": format!("maintenance/{name}")}},
                    "spec": {"unschedulable": true, "taints": taints},
                })).await?;
        maintenances
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase, "cordonedByNodeward": true}})),
            )
            .await?;
    }
    // Both agents die. The draining maintenance is finished for its agent at once (its last
    // heartbeat is long past deadlines.agentLost); the drained DrainOnly one holds on purpose.
    silence_agent(&env, &n0, Duration::from_secs(900)).await?;
    silence_agent(&env, &n1, Duration::from_secs(900)).await?;
    let failed = wait::until(
        &maintenances,
        &draining,
        "Failed, finalizer removed",
        TIMEOUT,
        |m| m.is_some_and(|m| m.phase() == MaintenancePhase::Failed && m.finalizers().is_empty()),
    )
    .await
    .with_context(|| coordinator.output())?
    .context("the maintenance disappeared")?;
    let status = failed.status.clone().unwrap_or_default();
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("deadlines.agentLost"),
        "{status:?}"
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "NodeRestored" && c.status == "True"),
        "{:?}",
        status.conditions
    );
    assert!(
        node_restored(&env.nodes().get(&n0).await?),
        "n0 uncordoned and untainted, the shutdown guard's taint gone too"
    );
    assert!(
        !node_restored(&env.nodes().get(&n1).await?),
        "the DrainOnly node stays drained until its maintenance is deleted"
    );
    env.wait_event(&draining, "", "AgentLost").await?;

    // Deleting the DrainOnly maintenance is not stuck on the lost agent's finalizer.
    maintenances
        .delete(&drained, &DeleteParams::default())
        .await?;
    wait::until(&maintenances, &drained, "gone", TIMEOUT, |m| m.is_none())
        .await
        .with_context(|| coordinator.output())?;
    wait::until(&env.nodes(), &n1, "n1 restored", TIMEOUT, |n| {
        n.is_some_and(node_restored)
    })
    .await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    wait::until(&policies, &policy, "every slot freed", TIMEOUT, |p| {
        p.is_some_and(|p| p.status.as_ref().is_some_and(|s| s.slots.is_empty()))
    })
    .await?;
    drop(coordinator);
    env.cleanup().await
}

#[tokio::test]
async fn delete_node_maintenances_remove_one_node_per_replacement_wait() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("replacement").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "deadlines": {"replacement": "20s"}}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let first = format!("{n0}-delete");
    env.create_maintenance(&first, &n0, "Manual", "DeleteNode")
        .await?;
    wait_admitted(&env, &first, TIMEOUT).await?;
    let second = format!("{n1}-delete");
    env.create_maintenance(&second, &n1, "Manual", "DeleteNode")
        .await?;
    wait_denied(&env, &second, "BudgetExhausted").await?;
    // The first node drained (as its agent would report it): the coordinator deletes it.
    maintenances
        .patch_status(
            &first,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Acting"}})),
        )
        .await?;
    let deleted = wait::phase(&maintenances, &first, MaintenancePhase::Succeeded, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    let deleted_at = deleted
        .status
        .and_then(|s| s.finished_at)
        .context("finishedAt")?
        .0;
    assert!(env.nodes().get_opt(&n0).await?.is_none(), "n0 deleted");
    // Its share of the budget is held for its replacement: the second waits that long.
    let admitted = wait_admitted(&env, &second, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    let admitted_at = admitted
        .status
        .and_then(|s| s.admission)
        .context("admission")?
        .admitted_at
        .0;
    let held = admitted_at.duration_since(deleted_at).as_secs_f64();
    assert!(
        held >= 19.0,
        "admitted {held:.1}s after the first node's deletion, within the 20s replacement wait"
    );
    drop(coordinator);
    env.cleanup().await
}

/// Writes what `peer`'s agent reports of its peers, as of now: `seen` (node, answers), and
/// that its peer detector runs; and renews its Lease.
async fn report_sightings(env: &TestEnv, peer: &str, seen: &[(&str, bool)]) -> anyhow::Result<()> {
    env.heartbeats(&[peer.to_owned()]).await?;
    let now = jiff::Timestamp::now().to_string();
    let sightings: Vec<Value> = seen
        .iter()
        .map(|(node, reachable)| json!({"node": node, "reachable": reachable, "time": now}))
        .collect();
    let probing = json!([{"type": "PeerConnectivityProblem", "status": "False", "reason": "PeersReachable",
        "message": "answered", "detector": "peers", "since": now}]);
    Api::<NodeReport>::all(env.client.clone())
        .patch_status(
            peer,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"peerSightings": sightings, "findings": probing}})),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_dead_node_is_tainted_out_of_service_its_pods_go_and_the_taint_goes_when_it_returns()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("dead-node").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 3]).await?;
    let (n0, n1, n2) = (env.node_name(0), env.node_name(1), env.node_name(2));
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "deadlines": {"agentHeartbeat": "1m"},
               "remediation": {"enabled": true, "outOfServiceTaint": true}}),
    )
    .await?;
    // Like a stateful pod: it waits out its node being unreachable for as long as it takes, so
    // only the out-of-service taint moves it.
    let stays = nodeward_e2e::PodOptions {
        tolerations: json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        ]),
        ..Default::default()
    };
    env.replicaset("stateful", &n0, 1, &stays).await?;
    let pod = env
        .running_pods("stateful", 1)
        .await?
        .pop()
        .context("the pod on n0")?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;

    // n0 dies: its peers' probes of it go unanswered (reported first: a coordinator that
    // saw n0 dead before any agent probed peers would rightly act without asking them),
    // nothing runs it any more (kwok lets it go), it has been NotReady for ten minutes, and
    // its agent silent as long.
    report_sightings(&env, &n1, &[(&n0, false), (&n2, true)]).await?;
    env.merge_node(
        &n0,
        json!({"metadata": {"annotations": {KWOK_NODE_ANNOTATION: "dead"}}}),
    )
    .await?;
    let ten_minutes_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(10);
    set_condition(&env, &n0, "Ready", "False", ten_minutes_ago).await?;
    silence_agent(&env, &n0, Duration::from_secs(900)).await?;

    let tainted = wait::until(
        &env.nodes(),
        &n0,
        "the out-of-service taint",
        TIMEOUT,
        |n| {
            n.and_then(|n| n.spec.as_ref()?.taints.as_ref())
                .is_some_and(|t| {
                    t.iter().any(|t| {
                        t.key == "node.kubernetes.io/out-of-service"
                            && t.value.as_deref() == Some("nodeshutdown")
                            && t.effect == "NoExecute"
                    })
                })
        },
    )
    .await
    .with_context(|| coordinator.output())?
    .context("n0")?;
    let record = tainted
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("nodeward.io/out-of-service")
        .context("nodeward's record")?;
    assert!(
        record.contains(&format!("unreachable from 1 peer(s): {n1}")),
        "{record}"
    );
    env.wait_event(&n0, "", "OutOfService").await?;
    // Kubernetes does the rest: the pod is evicted and, its kubelet gone, deleted for good.
    let pods = env.pods();
    let pod_name = pod.name_any();
    wait::until(
        &pods,
        &pod_name,
        "the dead node's pod deleted",
        Duration::from_secs(90),
        |p| p.is_none(),
    )
    .await?;

    // n0 comes back: nodeward's taint goes.
    set_condition(&env, &n0, "Ready", "True", jiff::Timestamp::now()).await?;
    wait::until(&env.nodes(), &n0, "the taint taken away", TIMEOUT, |n| {
        n.is_some_and(|n| {
            !n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| {
                    t.iter()
                        .any(|t| t.key == "node.kubernetes.io/out-of-service")
                })
                && !n.annotations().contains_key("nodeward.io/out-of-service")
        })
    })
    .await
    .with_context(|| coordinator.output())?;
    drop(coordinator);
    env.cleanup().await
}

#[tokio::test]
async fn a_delete_node_remediation_of_a_dead_node_completes_without_its_agent() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("dead-delete").await?;
    reporting_nodes(&env, &vec![NodeSpec::worker("a"); 2]).await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    env.create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    env.merge_node(
        &n0,
        json!({"metadata": {"annotations": {KWOK_NODE_ANNOTATION: "dead"}}}),
    )
    .await?;
    // NotReady for longer than deadlines.agentHeartbeat (default 12m), its agent as long.
    let fifteen_minutes_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(15);
    set_condition(&env, &n0, "Ready", "False", fifteen_minutes_ago).await?;
    silence_agent(&env, &n0, Duration::from_secs(900)).await?;
    report_sightings(&env, &n1, &[(&n0, false)]).await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = format!("{n0}-delete");
    env.create_maintenance(&name, &n0, "Remediation", "DeleteNode")
        .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let done = wait::phase(&maintenances, &name, MaintenancePhase::Succeeded, TIMEOUT)
        .await
        .with_context(|| coordinator.output())?;
    assert!(
        env.nodes().get_opt(&n0).await?.is_none(),
        "the dead node is deleted"
    );
    let phases: Vec<MaintenancePhase> = done
        .status
        .map(|s| s.history.into_iter().map(|h| h.phase).collect())
        .unwrap_or_default();
    assert_eq!(
        phases,
        [
            MaintenancePhase::Pending,
            MaintenancePhase::Admitted,
            MaintenancePhase::Acting,
            MaintenancePhase::Succeeded
        ],
        "no drain: nothing runs there"
    );
    env.wait_event(&name, "", "NodeDead").await?;
    drop(coordinator);
    env.cleanup().await
}

/// Whether `node` carries nodeward's pending taint (PreferNoSchedule).
fn pending_tainted(node: Option<&Node>) -> bool {
    node.and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.key == nodeward_api::labels::PENDING_TAINT && t.effect == "PreferNoSchedule"
            })
        })
}

#[tokio::test]
async fn a_node_waiting_for_its_turn_is_tainted_prefer_no_schedule_until_admitted()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("pending-taint").await?;
    reporting_nodes(&env, &[NodeSpec::worker("a"), NodeSpec::worker("a")]).await?;
    let (first, second) = (env.node_name(0), env.node_name(1));
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "taintWhilePending": true}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let going = create_maintenance(&env, &first).await?;
    wait_admitted(&env, &going, TIMEOUT).await?;
    let waiting = create_maintenance(&env, &second).await?;
    wait_denied(&env, &waiting, "BudgetExhausted").await?;

    // The next node in line avoids new pods; the one going now carries no such taint.
    let nodes = env.nodes();
    wait::until(
        &nodes,
        &second,
        "the waiting node tainted",
        TIMEOUT,
        pending_tainted,
    )
    .await?;
    assert!(!pending_tainted(nodes.get_opt(&first).await?.as_ref()));

    // Its turn: admitted, and the taint goes.
    finish(&env, &going).await?;
    wait_admitted(&env, &waiting, TIMEOUT).await?;
    wait::until(
        &nodes,
        &second,
        "the taint gone once admitted",
        TIMEOUT,
        |n| !pending_tainted(n),
    )
    .await?;
    finish(&env, &waiting).await?;
    drop(coordinator);
    env.cleanup().await
}

/// The node's label `key`, and whether it carries annotation `annotation`.
async fn label_of(env: &TestEnv, node: &str, key: &str) -> anyhow::Result<Option<String>> {
    Ok(env.nodes().get(node).await?.labels().get(key).cloned())
}

#[tokio::test]
async fn node_labels_go_on_before_the_drain_change_after_success_and_come_back_on_cancel()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let env = TestEnv::new("node-labels").await?;
    reporting_nodes(&env, &[NodeSpec::worker("a")]).await?;
    let node = env.node_name(0);
    let lb = "node.kubernetes.io/exclude-from-external-load-balancers";
    env.merge_node(&node, json!({"metadata": {"labels": {lb: "false"}}}))
        .await?;
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "nodeLabels": {
            "beforeDrain": [{"key": lb, "value": "true"}, {"key": "example.com/state", "value": "draining"}],
            "afterSuccess": [{"key": "example.com/state", "value": "ready"}],
            "annotate": true,
        }}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[])?;
    coordinator.wait_ready(TIMEOUT).await?;
    let nodes = env.nodes();

    // Admitted: out of the load balancers before the drain, and said so.
    let first = create_maintenance(&env, &node).await?;
    wait_admitted(&env, &first, TIMEOUT).await?;
    let out = wait::until(&nodes, &node, "the labels before the drain", TIMEOUT, |n| {
        n.is_some_and(|n| n.labels().get(lb).map(String::as_str) == Some("true"))
    })
    .await?
    .context("node")?;
    assert_eq!(
        out.labels().get("example.com/state").map(String::as_str),
        Some("draining")
    );
    assert_eq!(
        out.annotations().get("nodeward.io/maintenance-in-progress"),
        Some(&first)
    );

    // Succeeded: the label after success, and the others as they were.
    finish(&env, &first).await?;
    let back = wait::until(&nodes, &node, "the labels after success", TIMEOUT, |n| {
        n.is_some_and(|n| !n.annotations().contains_key("nodeward.io/labels-before"))
    })
    .await?
    .context("node")?;
    assert_eq!(
        back.labels().get(lb).map(String::as_str),
        Some("false"),
        "the value it had"
    );
    assert_eq!(
        back.labels().get("example.com/state").map(String::as_str),
        Some("ready")
    );
    assert!(
        !back
            .annotations()
            .contains_key("nodeward.io/maintenance-in-progress")
    );
    assert_eq!(
        back.annotations()
            .get("nodeward.io/last-maintenance")
            .map(String::as_str),
        Some(format!("{first} Succeeded").as_str())
    );

    // Deleted after admission: every label back as it was before it.
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    api.delete(&first, &Default::default()).await?;
    let second = format!("{node}-again");
    env.create_maintenance(&second, &node, "Manual", "DrainOnly")
        .await?;
    wait_admitted(&env, &second, TIMEOUT).await?;
    wait::until(
        &nodes,
        &node,
        "the labels before the second drain",
        TIMEOUT,
        |n| n.is_some_and(|n| n.labels().get(lb).map(String::as_str) == Some("true")),
    )
    .await?;
    api.delete(&second, &Default::default()).await?;
    wait::until(&nodes, &node, "the labels put back", TIMEOUT, |n| {
        n.is_some_and(|n| !n.annotations().contains_key("nodeward.io/labels-before"))
    })
    .await?;
    assert_eq!(label_of(&env, &node, lb).await?.as_deref(), Some("false"));
    assert_eq!(
        label_of(&env, &node, "example.com/state").await?.as_deref(),
        Some("ready"),
        "as it was before the second maintenance"
    );
    drop(coordinator);
    env.cleanup().await
}
