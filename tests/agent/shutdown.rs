//! The shutdown guard against the real systemd-logind (private bus, private mount namespace,
//! systemd stand-in) and the real control plane with a kwok node: the delay lock, the drain in
//! plan order before `PowerOff` goes on, a PDB-blocked pod handled at its stage deadline, the
//! lock taken again after logind or the bus restart, a cancelled shutdown undone, and the
//! `logind.conf.d` drop-in.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, ResourceExt, runtime::watcher};
use nodeward_agent::host::logind::ManagerProxy;
use nodeward_api::{NodeReport, report::ShutdownPhase};
use nodeward_e2e::daemon::agent_binary;
use nodeward_e2e::{
    NodeSpec, PodOptions, TestEnv, controlplane, daemon::Daemon, logind::Logind, scratch, wait,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Starts an agent for `node` whose only job here is the shutdown guard.
fn agent(env: &TestEnv, node: &str, logind: &Logind, guard: &str) -> anyhow::Result<Daemon> {
    let dir = scratch::dir(&format!("nodeward-guard-{}", env.id))?;
    let config = scratch::agent_config_file(
        &dir,
        &[&format!(
            "rebootRequired: {{sentinelFile: {}}}",
            dir.join("reboot-required").display()
        )],
        &format!("shutdownGuard:\n{guard}"),
    )?;
    // The private bus is the agent's system bus.
    nodeward_e2e::daemon::agent(
        agent_binary(),
        env,
        node,
        &config,
        &logind.bus.address,
        "agent",
    )
}

async fn nodeward_locks(logind: &Logind) -> anyhow::Result<Vec<(String, String)>> {
    let connection = logind.connect().await?;
    let manager = ManagerProxy::new(&connection).await?;
    Ok(manager
        .list_inhibitors()
        .await?
        .into_iter()
        .filter(|(_, who, _, _, _, _)| who == "nodeward")
        .map(|(what, _, _, mode, _, _)| (what, mode))
        .collect())
}

/// Waits until the agent holds its lock again, just after `what` happened to logind.
async fn locked_again(logind: &Logind, agent: &Daemon, what: &str) -> anyhow::Result<()> {
    let restarted = Instant::now();
    wait_locked(logind, Duration::from_secs(15))
        .await
        .with_context(|| agent.output())?;
    eprintln!("lock again {:?} after {what}", restarted.elapsed());
    Ok(())
}

async fn wait_locked(logind: &Logind, within: Duration) -> anyhow::Result<()> {
    wait::eventually(
        "the agent's delay lock in ListInhibitors",
        within,
        || async {
            let locks = nodeward_locks(logind).await.unwrap_or_default();
            Ok(locks
                .iter()
                .any(|(what, mode)| what.split(':').any(|w| w == "shutdown") && mode == "delay")
                .then_some(()))
        },
    )
    .await
}

async fn report(env: &TestEnv, node: &str) -> anyhow::Result<Option<NodeReport>> {
    Ok(Api::<NodeReport>::all(env.client.clone())
        .get_opt(node)
        .await?)
}

/// Records when each pod of the namespace is deleted (gone from the API).
fn watch_gone(env: &TestEnv) -> Arc<Mutex<BTreeMap<String, Instant>>> {
    let gone: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let seen = gone.clone();
    tokio::spawn(
        watcher(env.pods(), watcher::Config::default()).for_each(move |event| {
            if let Ok(watcher::Event::Delete(pod)) = event {
                seen.lock()
                    .expect("gone")
                    .insert(pod.name_any(), Instant::now());
            }
            futures::future::ready(())
        }),
    );
    gone
}

/// The pods the agent evicted, in the order the API server received the evictions.
fn evictions(namespace: &str) -> anyhow::Result<Vec<String>> {
    Ok(controlplane::audited_writes()?
        .iter()
        .filter(|e| {
            e.pointer("/objectRef/subresource").and_then(|v| v.as_str()) == Some("eviction")
        })
        .filter(|e| e.pointer("/objectRef/namespace").and_then(|v| v.as_str()) == Some(namespace))
        .filter(|e| {
            e.pointer("/userAgent")
                .and_then(|v| v.as_str())
                .is_some_and(|u| u.starts_with("nodeward-agent/"))
        })
        .filter(|e| e.pointer("/stage").and_then(|v| v.as_str()) == Some("ResponseComplete"))
        .filter_map(|e| {
            e.pointer("/objectRef/name")
                .and_then(|v| v.as_str())
                .map(String::from)
        })
        .collect())
}

fn app_of(pods: &[Pod], name: &str) -> String {
    pods.iter()
        .find(|p| p.name_any() == name)
        .and_then(|p| p.labels().get("app").cloned())
        .unwrap_or_else(|| format!("unknown pod {name}"))
}

/// When logind, the lock released, had the first unit started (the systemd stand-in's record).
async fn unit_started(logind: &Logind) -> anyhow::Result<Instant> {
    wait::eventually("StartUnit(poweroff.target)", TIMEOUT, || async {
        Ok(logind
            .systemd
            .started_at
            .lock()
            .expect("started")
            .first()
            .copied())
    })
    .await
}

async fn power_off(logind: &Logind) -> anyhow::Result<()> {
    let connection = logind.connect().await?;
    ManagerProxy::new(&connection)
        .await?
        .power_off(false)
        .await?;
    Ok(())
}

#[tokio::test]
async fn power_off_waits_for_the_drain_in_plan_order() -> anyhow::Result<()> {
    let env = TestEnv::new("guard-poweroff").await?;
    let node = env.node_name(0);
    env.create_nodes(&[NodeSpec::worker("a").label("guard", "yes")])
        .await?;
    let grace = |priority: Option<i32>| PodOptions {
        priority,
        grace_period_seconds: 1,
        ..PodOptions::default()
    };
    env.replicaset("low", &node, 2, &grace(Some(100))).await?;
    env.replicaset("high", &node, 1, &grace(Some(1000))).await?;
    env.replicaset(
        "crit",
        &node,
        1,
        &PodOptions {
            priority_class_name: Some("system-cluster-critical".into()),
            ..grace(None)
        },
    )
    .await?;
    env.daemonset("ds", ("guard", "yes"), &grace(None)).await?;
    let mut pods = Vec::new();
    for (app, count) in [("low", 2), ("high", 1), ("crit", 1), ("ds", 1)] {
        pods.extend(env.running_pods(app, count).await?);
    }

    let logind = Logind::start(&env.id, 30).await?;
    let agent = agent(&env, &node, &logind, "  budget: 25s\n  safetyMargin: 2s\n")?;
    wait_locked(&logind, TIMEOUT)
        .await
        .with_context(|| agent.output())?;
    let gone = watch_gone(&env);

    let asked = Instant::now();
    power_off(&logind).await?;
    let started = unit_started(&logind)
        .await
        .with_context(|| agent.output())?;
    let units = logind.started_units();
    assert_eq!(units[0].0, "poweroff.target", "{units:?}");
    assert!(
        started.duration_since(asked) < Duration::from_secs(28),
        "logind went on because the lock was released, not because its 30s ran out: {:?}",
        started.duration_since(asked)
    );
    // Every pod the plan takes was gone before logind went on.
    let gone = gone.lock().expect("gone").clone();
    for pod in &pods {
        let at = gone.get(&pod.name_any()).with_context(|| {
            format!(
                "pod {} was not deleted; agent log:\n{}",
                pod.name_any(),
                agent.output()
            )
        })?;
        assert!(
            *at <= started,
            "pod {} went after StartUnit",
            pod.name_any()
        );
    }
    let order: Vec<String> = evictions(&env.namespace)?
        .iter()
        .map(|name| app_of(&pods, name))
        .collect();
    assert_eq!(
        order,
        ["low", "low", "high", "crit", "ds"],
        "eviction order"
    );

    let report = report(&env, &node).await?.context("NodeReport")?;
    let shutdown = report
        .status
        .as_ref()
        .and_then(|s| s.shutdown.clone())
        .context("shutdown record")?;
    assert_eq!(shutdown.phase, ShutdownPhase::Released);
    assert!(shutdown.cordoned_by_agent && shutdown.tainted_by_agent);
    assert_eq!((shutdown.pods_total, shutdown.pods_remaining), (5, 0));
    let node_now: Node = env.nodes().get(&node).await?;
    let spec = node_now.spec.context("node spec")?;
    assert_eq!(spec.unschedulable, Some(true));
    assert!(
        spec.taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "nodeward.io/shutdown")
    );
    // Events tell the story; the test's pods tolerate every taint, so they may come back.
    let events = env
        .wait_events(
            &node,
            "regarding.kind=Node",
            &[
                "ShutdownDrainStarted",
                "PodsWillReturn",
                "ShutdownDrainFinished",
            ],
        )
        .await?;
    let started = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("ShutdownDrainStarted"));
    assert!(
        started.is_some_and(|e| e.type_.as_deref() == Some("Warning")
            && e.note
                .as_deref()
                .unwrap_or_default()
                .contains("no maintenance asked for")),
        "a shutdown nobody asked nodeward for is a warning: {started:?}"
    );
    let returning = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("PodsWillReturn"))
        .and_then(|e| e.note.clone())
        .unwrap_or_default();
    assert!(returning.starts_with("5 pods tolerate"), "{returning}");
    env.cleanup_after(agent).await
}

/// A shutdown held by a pod no eviction may take: a node with one PDB-guarded pod, logind
/// with `delay` seconds, the agent with `guard`, PowerOff asked once it holds its lock, and
/// the drain's refusal recorded in the NodeReport.
struct HeldShutdown {
    env: TestEnv,
    node: String,
    guarded: Pod,
    logind: Logind,
    agent: Daemon,
    /// When PowerOff was asked.
    asked: Instant,
    /// The shutdown record that shows the refusal.
    blocked: nodeward_api::report::ShutdownProgress,
}

async fn held_shutdown(test: &str, delay: u64, guard: &str) -> anyhow::Result<HeldShutdown> {
    let env = TestEnv::new(test).await?;
    let node = env.node_name(0);
    env.create_nodes(&[NodeSpec::worker("a")]).await?;
    let guarded = env.guarded_pod("guarded", &node).await?;
    let logind = Logind::start(&env.id, delay).await?;
    let agent = agent(&env, &node, &logind, guard)?;
    wait_locked(&logind, TIMEOUT)
        .await
        .with_context(|| agent.output())?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let asked = Instant::now();
    power_off(&logind).await?;
    let blocked = wait::until(
        &reports,
        &node,
        "a blocking pod in the NodeReport",
        TIMEOUT,
        |r| {
            r.and_then(|r| r.status.as_ref()?.shutdown.as_ref())
                .is_some_and(|s| !s.blocking_pods.is_empty())
        },
    )
    .await?
    .and_then(|r| r.status?.shutdown)
    .context("shutdown record")?;
    Ok(HeldShutdown {
        env,
        node,
        guarded,
        logind,
        agent,
        asked,
        blocked,
    })
}

#[tokio::test]
async fn a_pdb_blocked_pod_is_retried_until_its_stage_deadline_then_deleted() -> anyhow::Result<()>
{
    let plan = "  budget: 15s\n  safetyMargin: 2s\n  drainPlan:\n    stages:\n    - {name: all, timeout: 4s, onTimeout: Delete}\n";
    let HeldShutdown {
        env,
        node,
        guarded: pod,
        logind,
        agent,
        asked,
        blocked,
    } = held_shutdown("guard-pdb", 20, plan).await?;
    // The refusal is recorded, naming the budget.
    assert_eq!(blocked.blocking_pods[0].reason, "DisruptionBudget");
    assert_eq!(blocked.blocking_pods[0].name, pod.name_any());
    let started = unit_started(&logind)
        .await
        .with_context(|| agent.output())?;
    let took = started.duration_since(asked);
    assert!(
        took >= Duration::from_secs(4),
        "not before the stage deadline: {took:?}"
    );
    assert!(
        took < Duration::from_secs(18),
        "released before InhibitDelayMaxSec (20s): {took:?}"
    );
    let evicted = evictions(&env.namespace)?;
    assert!(evicted.len() >= 2, "retried with backoff: {evicted:?}");
    let blocked_events: Vec<String> = env
        .wait_events(&node, "regarding.kind=Node", &["EvictionBlocked"])
        .await?
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("EvictionBlocked"))
        .filter_map(|e| e.note)
        .collect();
    assert_eq!(
        blocked_events.len(),
        1,
        "one Event per blocked pod, not per retry: {blocked_events:?}"
    );
    assert!(
        blocked_events[0].contains("DisruptionBudget"),
        "{blocked_events:?}"
    );
    assert!(
        env.pod_evicted(&pod.name_any()).await?,
        "deleted at the stage deadline"
    );
    env.cleanup_after(agent).await
}

#[tokio::test]
async fn a_pod_that_comes_to_the_node_during_the_drain_is_drained_too() -> anyhow::Result<()> {
    // A pod no eviction may take holds the drain in its stage while another comes.
    let plan = "  budget: 25s\n  safetyMargin: 2s\n  drainPlan:\n    stages:\n    - {name: all, timeout: 8s, onTimeout: Continue}\n";
    let HeldShutdown {
        env,
        node,
        logind,
        agent,
        asked,
        ..
    } = held_shutdown("guard-late", 30, plan).await?;
    // Bound to the node after the drain read its pods, as by a scheduler that had not seen
    // the cordon yet; it tolerates no taint of the drain (a pod that does would be put back).
    let tolerations = serde_json::json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    ]);
    let options = PodOptions {
        tolerations,
        ..PodOptions::default()
    };
    env.replicaset("late", &node, 1, &options).await?;
    let late = env.running_pods("late", 1).await?;
    let started = unit_started(&logind)
        .await
        .with_context(|| agent.output())?;
    let evicted = evictions(&env.namespace)?;
    assert!(
        evicted.contains(&late[0].name_any()),
        "the late pod was not drained: {evicted:?}"
    );
    // Its replacement, from the same ReplicaSet, is not chased: the drain ends after the
    // stage and the late pod, not at its deadline.
    let late_evicted = evicted.iter().filter(|n| n.starts_with("late-")).count();
    assert_eq!(late_evicted, 1, "{evicted:?}");
    let took = started.duration_since(asked);
    assert!(
        took < Duration::from_secs(21),
        "released at the deadline (23 s), not when drained: {took:?}"
    );
    env.cleanup_after(agent).await
}

#[tokio::test]
async fn a_drain_that_leaves_many_pods_still_reports_its_end_in_an_event() -> anyhow::Result<()> {
    // Twelve pods no budget lets go: the note naming each (and why it stays) is over the
    // 1024 bytes the API server takes, which once lost the Event on a real node.
    let (env, node) = TestEnv::with_worker("guard-many-left", "a").await?;
    env.replicaset("guarded", &node, 12, &PodOptions::default())
        .await?;
    env.pdb("guarded", "guarded", 12).await?;
    env.running_pods("guarded", 12).await?;

    let logind = Logind::start(&env.id, 20).await?;
    let plan = "  budget: 15s\n  safetyMargin: 2s\n  drainPlan:\n    stages:\n    - {name: all, timeout: 3s, onTimeout: Continue}\n";
    let agent = agent(&env, &node, &logind, plan)?;
    wait_locked(&logind, TIMEOUT)
        .await
        .with_context(|| agent.output())?;
    power_off(&logind).await?;
    let finished = wait::eventually("the ShutdownDrainFinished Event", TIMEOUT, || async {
        Ok(env
            .events_about(&node, "regarding.kind=Node")
            .await?
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ShutdownDrainFinished")))
    })
    .await
    .with_context(|| agent.output())?;
    let note = finished.note.unwrap_or_default();
    assert!(note.len() <= 1024, "{} bytes: {note}", note.len());
    assert!(note.starts_with("stages ran out of time; left: "), "{note}");
    assert!(note.ends_with("cut at the API's limit)"), "{note}");
    env.cleanup_after(agent).await
}

#[tokio::test]
async fn the_lock_is_taken_again_after_logind_or_the_bus_restarts() -> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("guard-restart", "a").await?;
    let mut logind = Logind::start(&env.id, 10).await?;
    let agent = agent(&env, &node, &logind, "  budget: 8s\n  safetyMargin: 1s\n")?;
    wait_locked(&logind, TIMEOUT)
        .await
        .with_context(|| agent.output())?;

    logind.kill_logind();
    logind.start_logind().await?;
    locked_again(&logind, &agent, "logind restarted").await?;
    logind.restart_bus().await?;
    locked_again(&logind, &agent, "the bus restarted").await?;
    env.cleanup_after(agent).await
}

/// logind restarted during a held shutdown forgets it (a delayed shutdown is not kept across a
/// restart) and never says `PrepareForShutdown(false)`: once its drain is over, the agent finds
/// logind preparing nothing, takes the lock again and restores the node it cordoned, instead
/// of leaving it cordoned until a reboot that is not coming.
#[tokio::test]
async fn a_shutdown_logind_forgot_by_restarting_mid_drain_restores_the_node() -> anyhow::Result<()>
{
    let plan = "  budget: 15s\n  safetyMargin: 2s\n  drainPlan:\n    stages:\n    - {name: all, timeout: 6s, onTimeout: Delete}\n";
    let HeldShutdown {
        env,
        node,
        mut logind,
        agent,
        blocked,
        ..
    } = held_shutdown("guard-forgot", 20, plan).await?;
    assert_eq!(blocked.phase, ShutdownPhase::Draining);
    logind.kill_logind();
    logind.start_logind().await?;
    undone_and_locked(
        &env,
        &node,
        &logind,
        &agent,
        "the forgotten shutdown undone",
    )
    .await?;
    let note = env
        .wait_event(&node, "regarding.kind=Node", "ShutdownCancelled")
        .await?
        .note
        .unwrap_or_default();
    assert!(
        note.contains("logind was restarted during the shutdown"),
        "{note}"
    );
    assert!(
        logind.started_units().is_empty(),
        "nothing went down: {:?}",
        logind.started_units()
    );
    env.cleanup_after(agent).await
}

#[tokio::test]
async fn a_cancelled_shutdown_retakes_the_lock_and_restores_the_node() -> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("guard-cancel", "a").await?;
    let logind = Logind::start(&env.id, 10).await?;
    // systemd refuses the poweroff job: logind cancels with PrepareForShutdown(false).
    logind
        .systemd
        .fail_start
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let agent = agent(&env, &node, &logind, "  budget: 8s\n  safetyMargin: 1s\n")?;
    wait_locked(&logind, TIMEOUT)
        .await
        .with_context(|| agent.output())?;
    let _ = power_off(&logind).await;
    undone_and_locked(&env, &node, &logind, &agent, "the shutdown cancelled").await?;
    env.cleanup_after(agent).await
}

/// Waits until the agent has undone a shutdown that is not going ahead (`what`): its record
/// `Cancelled`, its lock held again, the node uncordoned and untainted.
async fn undone_and_locked(
    env: &TestEnv,
    node: &str,
    logind: &Logind,
    agent: &Daemon,
    what: &str,
) -> anyhow::Result<()> {
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    wait::until(&reports, node, what, TIMEOUT, |r| {
        r.and_then(|r| r.status.as_ref()?.shutdown.as_ref())
            .is_some_and(|s| s.phase == ShutdownPhase::Cancelled)
    })
    .await
    .with_context(|| agent.output())?;
    wait_locked(logind, Duration::from_secs(10))
        .await
        .with_context(|| agent.output())?;
    let spec = env.nodes().get(node).await?.spec.unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true), "{what}: still cordoned");
    assert!(
        !spec
            .taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "nodeward.io/shutdown"),
        "{what}: still tainted"
    );
    Ok(())
}

#[tokio::test]
async fn a_short_inhibit_delay_is_raised_with_a_drop_in_and_overrides_are_reported()
-> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("guard-dropin", "a").await?;
    let logind = Logind::start(&env.id, 5).await?;
    let guard = format!(
        "  budget: 40s\n  safetyMargin: 2s\n  writeDropIn: true\n  dropInDir: {}\n",
        logind.conf_dir.display()
    );
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let delay_of = |r: Option<&NodeReport>| -> Option<String> {
        r?.status
            .as_ref()?
            .inhibitor
            .as_ref()?
            .inhibit_delay_max
            .as_ref()
            .map(|d| d.as_str().to_owned())
    };
    // The kubelet's drop-in (graceful node shutdown) asks for less: ours sorts after it.
    std::fs::write(
        logind.conf_dir.join("99-kubelet.conf"),
        "[Login]\nInhibitDelayMaxSec=10\n",
    )?;
    logind.reload()?;
    {
        let agent = agent(&env, &node, &logind, &guard)?;
        wait::until(
            &reports,
            &node,
            "InhibitDelayMaxUSec raised to 40s",
            TIMEOUT,
            |r| delay_of(r).as_deref() == Some("40s"),
        )
        .await
        .with_context(|| agent.output())?;
        let written = std::fs::read_to_string(
            logind
                .conf_dir
                .join(nodeward_agent::shutdown::dropin::FILE_NAME),
        )?;
        assert!(written.contains("InhibitDelayMaxSec=40"), "{written}");
        let reloaded = logind.systemd.reloaded.lock().expect("reloaded").clone();
        assert_eq!(reloaded, ["systemd-logind.service"]);
    }
    // An admin's drop-in sorting after ours wins: the agent plans with it and says so.
    std::fs::write(
        logind.conf_dir.join("zzz-admin.conf"),
        "[Login]\nInhibitDelayMaxSec=12\n",
    )?;
    logind.reload()?;
    // Scan the test's drop-in directory (the agent scans its drop-in directory too).
    let agent = agent(&env, &node, &logind, &guard)?;
    let inhibitor = wait::until_some(&reports, &node, "the override reported", TIMEOUT, |r| {
        let inhibitor = r.status.as_ref()?.inhibitor.clone();
        inhibitor.filter(|i| !i.overriding_drop_ins.is_empty())
    })
    .await
    .with_context(|| agent.output())?;
    assert_eq!(
        inhibitor
            .inhibit_delay_max
            .map(|d| d.as_str().to_owned())
            .as_deref(),
        Some("12s")
    );
    assert_eq!(
        inhibitor.overriding_drop_ins,
        ["zzz-admin.conf (InhibitDelayMaxSec=12)"]
    );
    assert!(
        inhibitor
            .message
            .unwrap_or_default()
            .contains("below the 40s budget")
    );
    env.cleanup_after(agent).await
}

#[tokio::test]
async fn the_reboot_gate_refuses_uncoordinated_shutdowns_until_one_is_admitted()
-> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams, PostParams};
    use nodeward_api::NodeMaintenance;

    let (env, node) = TestEnv::with_worker("guard-gate", "a").await?;
    let mut logind = Logind::start(&env.id, 10).await?;
    // The real polkitd decides for non-root callers: "nobody" may power off, but not past
    // a block lock (logind exempts root, and a user's own locks, from block locks).
    logind
        .start_polkit(
            r#"polkit.addRule(function(action, subject) {
    if (subject.user == "nobody" && (action.id == "org.freedesktop.login1.power-off" ||
            action.id == "org.freedesktop.login1.power-off-multiple-sessions")) {
        return polkit.Result.YES;
    }
});
"#,
        )
        .await?;
    let agent = agent(
        &env,
        &node,
        &logind,
        "  budget: 8s\n  safetyMargin: 1s\n  rebootGate: true\n",
    )?;
    let blocked = || async {
        anyhow::Ok(
            nodeward_locks(&logind)
                .await
                .unwrap_or_default()
                .iter()
                .any(|(what, mode)| what.split(':').any(|w| w == "shutdown") && mode == "block"),
        )
    };
    wait::eventually("the block lock", TIMEOUT, || async {
        Ok(blocked().await?.then_some(()))
    })
    .await
    .with_context(|| agent.output())?;
    wait_locked(&logind, TIMEOUT).await?;
    let refused = logind.power_off_as(65534).await?;
    let error = refused.expect_err("logind refuses a shutdown while the gate is closed");
    assert!(
        error.contains("Interactive authentication required"),
        "{error}"
    );
    assert!(logind.started_units().is_empty());

    let reports: Api<NodeReport> = Api::all(env.client.clone());
    wait::until(&reports, &node, "blockHeld true", TIMEOUT, |r| {
        r.and_then(|r| r.status.as_ref()?.inhibitor.as_ref())
            .is_some_and(|i| i.block_held && i.delay_held)
    })
    .await?;
    // The coordinator admits a maintenance of this node: the gate opens.
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m: NodeMaintenance = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": format!("{node}-reboot")},
        // DrainOnly: the agent carries it out without asking logind for anything itself.
        "spec": {"nodeName": node, "reason": "Manual", "action": "DrainOnly"},
    }))?;
    maintenances.create(&PostParams::default(), &m).await?;
    maintenances
        .patch_status(
            &format!("{node}-reboot"),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Admitted"}})),
        )
        .await?;
    wait::eventually("the block lock released", TIMEOUT, || async {
        Ok((!blocked().await?).then_some(()))
    })
    .await
    .with_context(|| agent.output())?;
    wait::until(&reports, &node, "blockHeld false", TIMEOUT, |r| {
        r.and_then(|r| r.status.as_ref()?.inhibitor.as_ref())
            .is_some_and(|i| !i.block_held && i.delay_held)
    })
    .await?;
    // Admitted: the same caller's shutdown now goes through, after the agent's drain.
    logind
        .power_off_as(65534)
        .await?
        .map_err(|e| anyhow::anyhow!("PowerOff refused with the gate open: {e}"))?;
    wait::eventually("StartUnit(poweroff.target)", TIMEOUT, || async {
        Ok(logind.started("poweroff.target").then_some(()))
    })
    .await
    .with_context(|| agent.output())?;
    env.cleanup_after(agent).await
}

#[tokio::test]
async fn an_agent_killed_mid_drain_resumes_after_restart() -> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("guard-resume", "a").await?;
    let pod = env.guarded_pod("guarded", &node).await?;
    let logind = Logind::start(&env.id, 30).await?;
    let plan = "  budget: 25s\n  safetyMargin: 2s\n  drainPlan:\n    stages:\n    - {name: all, timeout: 8s, onTimeout: Delete}\n";
    let mut first = agent(&env, &node, &logind, plan)?;
    wait_locked(&logind, TIMEOUT)
        .await
        .with_context(|| first.output())?;
    // A second holder keeps logind preparing while the agent is away.
    let holder = logind.connect().await?;
    let _keep = ManagerProxy::new(&holder)
        .await?
        .inhibit("shutdown", "e2e", "keeps the shutdown pending", "delay")
        .await?;
    power_off(&logind).await?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    wait::until(&reports, &node, "the drain blocked", TIMEOUT, |r| {
        r.and_then(|r| r.status.as_ref()?.shutdown.as_ref())
            .is_some_and(|s| !s.blocking_pods.is_empty())
    })
    .await
    .with_context(|| first.output())?;
    first.signal(nix::sys::signal::Signal::SIGKILL)?;
    first.wait_exit(Duration::from_secs(10)).await?;

    let second = agent(&env, &node, &logind, plan)?;
    let done = wait::until(
        &reports,
        &node,
        "the resumed drain released the lock",
        TIMEOUT,
        |r| {
            r.and_then(|r| r.status.as_ref()?.shutdown.as_ref())
                .is_some_and(|s| s.phase == ShutdownPhase::Released)
        },
    )
    .await
    .with_context(|| second.output())?
    .and_then(|r| r.status?.shutdown)
    .context("record")?;
    assert!(
        second.output().contains("resumed=true"),
        "{}",
        second.output()
    );
    assert_eq!(done.pods_remaining, 0);
    assert!(
        done.cordoned_by_agent,
        "the first run's cordon is still recorded"
    );
    assert!(env.pod_evicted(&pod.name_any()).await?);
    env.cleanup_after(second).await
}

/// Waits until `node` is uncordoned and without the guard's taint, and its record of the cordon
/// (`nodeward.io/cordoned-by`) is gone.
async fn wait_restored(env: &TestEnv, node: &str, agent: &Daemon) -> anyhow::Result<()> {
    let restored = wait::until(&env.nodes(), node, "the node restored", TIMEOUT, |n| {
        n.and_then(|n| n.spec.as_ref()).is_some_and(|s| {
            s.unschedulable != Some(true)
                && !s
                    .taints
                    .iter()
                    .flatten()
                    .any(|t| t.key == "nodeward.io/shutdown")
        })
    })
    .await
    .with_context(|| agent.output())?
    .context("node")?;
    assert!(
        !restored
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("nodeward.io/cordoned-by"),
        "the record on the Node is gone"
    );
    Ok(())
}

#[tokio::test]
async fn after_the_reboot_the_node_is_untainted_and_uncordoned_once_ready() -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams, PostParams};

    let (env, node) = TestEnv::with_worker("guard-boot", "a").await?;
    // What the agent left before the reboot: its cordon, its taint, and the record of them
    // under the previous boot id.
    env.merge_node(&node, serde_json::json!({
                "metadata": {"annotations": {"nodeward.io/cordoned-by": "shutdown"}},
                "spec": {"unschedulable": true, "taints": [{"key": "nodeward.io/shutdown", "effect": "NoSchedule"}]},
            })).await?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let report: NodeReport = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
        "metadata": {"name": node}, "spec": {"nodeName": node},
    }))?;
    reports.create(&PostParams::default(), &report).await?;
    let now = jiff::Timestamp::now().to_string();
    reports
        .patch_status(
            &node,
            &PatchParams::apply("nodeward-agent-shutdown").force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport", "metadata": {"name": node},
                "status": {"shutdown": {"phase": "Released", "bootId": "the-previous-boot", "startedAt": now,
                    "deadline": now, "cordonedByAgent": true, "taintedByAgent": true}},
            })),
        )
        .await?;

    let logind = Logind::start(&env.id, 10).await?;
    let agent = agent(&env, &node, &logind, "  budget: 8s\n  safetyMargin: 1s\n")?;
    wait_restored(&env, &node, &agent).await?;
    wait::until(
        &reports,
        &node,
        "the shutdown record cleared",
        TIMEOUT,
        |r| r.is_some_and(|r| r.status.as_ref().is_none_or(|s| s.shutdown.is_none())),
    )
    .await?;
    env.wait_event(&node, "regarding.kind=Node", "NodeRestored")
        .await?;
    env.cleanup_after(agent).await
}

/// The guard's cordon and taint on a node with no record of the shutdown they were for (its
/// NodeReport deleted while the node went down, as a test sharing the cluster once did): the
/// agent finds them when it reaches logind, which prepares no shutdown, and takes them away.
#[tokio::test]
async fn a_shutdown_taint_left_without_its_record_is_taken_away() -> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("guard-unrecorded", "a").await?;
    env.merge_node(&node, serde_json::json!({
                "metadata": {"annotations": {"nodeward.io/cordoned-by": "shutdown"}},
                "spec": {"unschedulable": true, "taints": [{"key": "nodeward.io/shutdown", "effect": "NoSchedule"}]},
            })).await?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    assert!(reports.get_opt(&node).await?.is_none(), "no NodeReport");

    let logind = Logind::start(&env.id, 10).await?;
    let agent = agent(&env, &node, &logind, "  budget: 8s\n  safetyMargin: 1s\n")?;
    wait_restored(&env, &node, &agent).await?;
    let event = env
        .wait_event(&node, "regarding.kind=Node", "NodeRestored")
        .await?;
    let note = event.note.unwrap_or_default();
    assert!(note.contains("no record of its shutdown"), "{note}");
    env.cleanup_after(agent).await
}
