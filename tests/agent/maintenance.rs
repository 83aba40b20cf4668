//! Maintenances end to end: the real coordinator admits, the real agent drains and acts, on a
//! kwok node of the real control plane. DrainOnly keeps the node drained until the object is
//! deleted; an admin's cordon survives; a maintenance deleted mid-drain restores the node.

use nodeward_e2e::daemon::agent_binary;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use nodeward_api::{DisruptionPolicy, MaintenancePhase, NodeMaintenance};
use nodeward_e2e::{NodeSpec, PodOptions, TestEnv, controlplane, daemon::Daemon, scratch, wait};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

struct Cluster {
    _coordinator: Daemon,
    agent: Daemon,
}

/// The coordinator and one agent for `node`; `extra_config` is appended to the agent's
/// configuration file.
async fn start(env: &TestEnv, node: &str, extra_config: &str) -> anyhow::Result<Cluster> {
    let coordinator = nodeward_e2e::daemon::coordinator(env, &[]).await?;
    let agent = agent(env, node, extra_config, "agent")?;
    coordinator.wait_ready(TIMEOUT).await?;
    agent.wait_ready(TIMEOUT).await?;
    Ok(Cluster {
        _coordinator: coordinator,
        agent,
    })
}

/// The agent of `node` (its log named for `label`), with no detectors and no shutdown guard;
/// `extra_config` as in [`start`].
fn agent(env: &TestEnv, node: &str, extra_config: &str, label: &str) -> anyhow::Result<Daemon> {
    let dir = scratch::dir(&format!("nodeward-maintenance-{}", env.id))?;
    let config = scratch::agent_config_file(
        &dir,
        &[],
        &format!("shutdownGuard: {{enabled: false}}\n{extra_config}"),
    )?;
    // No system bus here (logind has its own tests): a reboot or power-off cannot be asked for.
    let no_bus = nodeward_e2e::daemon::NO_SYSTEM_BUS;
    nodeward_e2e::daemon::agent(agent_binary(), env, node, &config, no_bus, label)
}

/// A policy's `workloadGate` for tests whose drain is to meet a PodDisruptionBudget that
/// allows nothing (admission would otherwise wait for it).
fn no_look_ahead() -> serde_json::Value {
    json!({"checkDisruptionBudgets": false})
}

/// A policy over this test's nodes, `maxConcurrent: 1`, with the `extra` spec fields.
async fn policy(env: &TestEnv, extra: serde_json::Value) -> anyhow::Result<String> {
    let mut spec = json!({"maxConcurrent": 1});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    env.create_policy("pool", spec).await
}

/// Waits until `policy` holds no slot.
async fn slot_freed(env: &TestEnv, policy: &str) -> anyhow::Result<()> {
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    wait::until(&policies, policy, "the slot freed", TIMEOUT, |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.slots.is_empty())
    })
    .await?;
    Ok(())
}

async fn drain_only(env: &TestEnv, node: &str) -> anyhow::Result<String> {
    named_drain_only(env, node, &format!("{node}-drain")).await
}

async fn named_drain_only(env: &TestEnv, node: &str, name: &str) -> anyhow::Result<String> {
    env.create_maintenance(name, node, "Manual", "DrainOnly")
        .await?;
    Ok(name.to_owned())
}

fn node_state(node: &Node) -> (bool, bool) {
    let spec = node.spec.clone().unwrap_or_default();
    (
        spec.unschedulable == Some(true),
        spec.taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "nodeward.io/maintenance"),
    )
}

#[tokio::test]
async fn a_drain_only_maintenance_drains_holds_and_restores_on_deletion() -> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("maint-drain", "a").await?;
    env.replicaset("app", &node, 2, &PodOptions::default())
        .await?;
    let pods = env.running_pods("app", 2).await?;
    let policy = policy(&env, json!({})).await?;
    // The notification receiver fails at first: the maintenance goes on regardless.
    let receiver = nodeward_e2e::http::Endpoint::start().await?;
    receiver.reply("/hook", 503, "unavailable");
    let cluster = start(
        &env,
        &node,
        &format!(
            "notifications:\n  url: {}/hook\n  templates: {{DrainStarted: \"draining {{node}} ({{maintenance}})\"}}\n",
            receiver.url
        ),
    )
    .await?;

    let name = drain_only(&env, &node).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::phase(&maintenances, &name, MaintenancePhase::Acting, TIMEOUT)
        .await
        .with_context(|| cluster.agent.output())?;
    let status = m.status.clone().context("status")?;
    let phases: Vec<MaintenancePhase> = status.history.iter().map(|h| h.phase).collect();
    assert_eq!(
        phases,
        [
            MaintenancePhase::Pending,
            MaintenancePhase::Admitted,
            MaintenancePhase::Draining,
            MaintenancePhase::Acting
        ]
    );
    assert_eq!(status.cordoned_by_nodeward, Some(true));
    assert_eq!(status.pods_remaining, Some(0));
    let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert!(
        types.contains(&"Admitted") && types.contains(&"Drained"),
        "the agent's Drained condition sits beside the coordinator's Admitted: {types:?}"
    );
    assert!(
        m.finalizers()
            .iter()
            .any(|f| f == "nodeward.io/maintenance")
    );
    for pod in &pods {
        assert!(
            env.pod_evicted(&pod.name_any()).await?,
            "{} evicted",
            pod.name_any()
        );
    }
    assert_eq!(node_state(&env.nodes().get(&node).await?), (true, true));
    // The Drained Event follows the phase Acting.
    let events = env
        .wait_events(&name, "", &["Admitted", "DrainStarted", "Drained"])
        .await?;
    let correlated = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Drained"))
        .all(|e| {
            e.note
                .as_deref()
                .unwrap_or_default()
                .contains(&m.uid().unwrap_or_default())
        });
    assert!(correlated, "Events carry the correlation id");
    let notices = |event: &str| {
        receiver
            .received()
            .into_iter()
            .filter(|r| r.body.contains(&format!("\"event\":\"{event}\"")))
            .collect::<Vec<_>>()
    };
    wait::eventually("DrainStarted tried again", TIMEOUT, || async {
        Ok((notices("DrainStarted").len() >= 2).then_some(()))
    })
    .await?;
    let first: serde_json::Value = serde_json::from_str(&notices("DrainStarted")[0].body)?;
    assert_eq!(first["text"], format!("draining {node} ({name})"));
    assert_eq!(first["correlation"], m.uid().unwrap_or_default());
    assert_eq!(
        notices("DrainStarted")[0].content_type.as_deref(),
        Some("application/json")
    );
    receiver.reply("/hook", 200, "ok");

    // Deleting it restores the node and frees the slot.
    wait::deleted(&maintenances, &name, TIMEOUT)
        .await
        .with_context(|| cluster.agent.output())?;
    assert_eq!(node_state(&env.nodes().get(&node).await?), (false, false));
    wait::eventually("the Restored notification", TIMEOUT, || async {
        Ok((!notices("Restored").is_empty()).then_some(()))
    })
    .await
    .with_context(|| cluster.agent.output())?;
    slot_freed(&env, &policy).await?;
    env.cleanup_after(cluster).await
}

#[tokio::test]
async fn an_admin_cordon_survives_the_maintenance() -> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("maint-admin", "a").await?;
    env.merge_node(&node, json!({"spec": {"unschedulable": true}}))
        .await?;
    policy(&env, json!({})).await?;
    let cluster = start(&env, &node, "").await?;
    let name = drain_only(&env, &node).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::phase(&maintenances, &name, MaintenancePhase::Acting, TIMEOUT)
        .await
        .with_context(|| cluster.agent.output())?;
    assert_eq!(m.status.and_then(|s| s.cordoned_by_nodeward), Some(false));
    wait::deleted(&maintenances, &name, TIMEOUT).await?;
    assert_eq!(
        node_state(&env.nodes().get(&node).await?),
        (true, false),
        "still cordoned (the admin's), no longer tainted (ours)"
    );
    env.cleanup_after(cluster).await
}

#[tokio::test]
async fn a_step_the_cluster_refuses_is_a_warning_event_on_the_maintenance() -> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("maint-refused", "a").await?;
    policy(&env, json!({})).await?;
    let name = format!("{node}-drain");
    // The cluster's own rule: the agent (here with the admin's identity) may not change this
    // maintenance; the coordinator admits it under its own.
    env.refusing_policy(
        "no-agent-step",
        json!([{"apiGroups": ["nodeward.io"], "apiVersions": ["*"], "operations": ["UPDATE"],
            "resources": ["nodemaintenances", "nodemaintenances/status"]}]),
        &format!("request.name == '{name}' && request.userInfo.username == 'nodeward-test-admin'"),
        "false",
        "this cluster lets nobody but the coordinator change this maintenance",
    )
    .await?;
    let cluster = start(&env, &node, "").await?;
    named_drain_only(&env, &node, &name).await?;
    let event = env
        .wait_event(&name, "regarding.kind=NodeMaintenance", "WriteRefused")
        .await
        .with_context(|| cluster.agent.output())?;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("the API server refused nodeward-agent's write")
            && note
                .contains("this cluster lets nobody but the coordinator change this maintenance"),
        "the cluster's words in the Event: {note}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    env.cleanup_after(cluster).await
}

#[tokio::test]
async fn a_maintenance_deleted_mid_drain_restores_the_node() -> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("maint-cancel", "a").await?;
    env.guarded_pod("guarded", &node).await?;
    // The drain is to meet the PDB: admission does not look ahead at it.
    policy(&env, json!({"workloadGate": no_look_ahead()})).await?;
    let cluster = start(&env, &node, "").await?;
    let name = drain_only(&env, &node).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::until(
        &maintenances,
        &name,
        "blocked while Draining",
        TIMEOUT,
        |m| {
            m.map(NodeMaintenance::phase) == Some(MaintenancePhase::Draining)
                && m.and_then(|m| m.status.as_ref())
                    .is_some_and(|s| !s.blocking_pods.is_empty())
        },
    )
    .await
    .with_context(|| cluster.agent.output())?
    .context("maintenance")?;
    assert_eq!(
        m.status
            .as_ref()
            .map(|s| s.blocking_pods[0].reason.as_str()),
        Some("DisruptionBudget")
    );
    assert_eq!(node_state(&env.nodes().get(&node).await?), (true, true));

    wait::deleted(&maintenances, &name, TIMEOUT)
        .await
        .with_context(|| cluster.agent.output())?;
    assert_eq!(node_state(&env.nodes().get(&node).await?), (false, false));
    env.wait_event(&name, "", "Cancelled").await?;
    env.cleanup_after(cluster).await
}

#[tokio::test]
async fn a_node_whose_disruption_budget_allows_nothing_is_denied_and_never_cordoned_until_it_does()
-> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("maint-workload", "a").await?;
    let guarded = env.guarded_pod("guarded", &node).await?;
    let policy = policy(&env, json!({})).await?;
    let cluster = start(&env, &node, "").await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());

    let name = drain_only(&env, &node).await?;
    let m = wait::until(
        &maintenances,
        &name,
        "Admitted=False WorkloadNotReady",
        TIMEOUT,
        |m| {
            m.and_then(|m| m.status.as_ref()).is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Admitted" && c.status == "False" && c.reason == "WorkloadNotReady"
                })
            })
        },
    )
    .await
    .with_context(|| cluster.agent.output())?
    .context("maintenance")?;
    let status = m.status.clone().context("status")?;
    let denied = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Admitted")
        .context("Admitted")?;
    assert!(
        denied.message.contains(&format!(
            "PodDisruptionBudget {}/guarded of ReplicaSet {}/guarded allows no disruption now",
            env.namespace, env.namespace
        )) && denied.message.contains(&guarded.name_any()),
        "names the budget, its workload and the pod: {}",
        denied.message
    );
    // Denied round after round (the coordinator decides every second): for 5 s it stays
    // Pending, the node is never cordoned or tainted and no slot is taken.
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let watched = std::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(5) {
        assert_eq!(
            maintenances.get(&name).await?.phase(),
            MaintenancePhase::Pending
        );
        assert_eq!(node_state(&env.nodes().get(&node).await?), (false, false));
        let slots = policies.get(&policy).await?.status.map(|s| s.slots.len());
        assert!(slots.unwrap_or(0) == 0, "no slot taken");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The budget allows a disruption again: admitted, and the drain evicts the pod.
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        env.client.clone(),
        &env.namespace,
    )
    .patch(
        "guarded",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 0}})),
    )
    .await?;
    let m = wait::phase(&maintenances, &name, MaintenancePhase::Acting, TIMEOUT)
        .await
        .with_context(|| cluster.agent.output())?;
    assert!(
        m.status.as_ref().is_some_and(|s| s
            .history
            .iter()
            .any(|h| h.phase == MaintenancePhase::Admitted)),
        "admitted once the budget allowed it"
    );
    assert!(
        env.pod_evicted(&guarded.name_any()).await?,
        "the pod was evicted"
    );
    wait::deleted(&maintenances, &name, TIMEOUT).await?;
    env.cleanup_after(cluster).await
}

#[tokio::test]
async fn a_drain_past_its_timeout_fails_and_restores_the_node_unless_every_policy_forces()
-> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("maint-timeout", "a").await?;
    let guarded = env.guarded_pod("guarded", &node).await?;
    let policy = policy(
        &env,
        json!({"drainTimeout": "3s", "workloadGate": no_look_ahead()}),
    )
    .await?;
    let cluster = start(&env, &node, "").await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());

    let name = drain_only(&env, &node).await?;
    let m = wait::phase(&maintenances, &name, MaintenancePhase::Failed, TIMEOUT)
        .await
        .with_context(|| cluster.agent.output())?;
    let message = m.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains("the policy's drainTimeout (3s)")
            && message.contains("taint and cordon are undone"),
        "{message}"
    );
    assert_eq!(node_state(&env.nodes().get(&node).await?), (false, false));
    slot_freed(&env, &policy).await?;
    env.wait_event(&name, "", "DrainFailed").await?;
    assert!(
        !env.pod_evicted(&guarded.name_any()).await?,
        "the PDB-guarded pod stayed"
    );

    // Force set, but a second policy over the node forbids it: failed again, the pod stays.
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    env.merge_policy_spec(&policy, json!({"onDrainTimeout": "Force"}))
        .await?;
    let careful = env
        .create_policy(
            "careful",
            json!({"maxConcurrent": 1, "drainTimeout": "3s", "onDrainTimeout": "Fail",
                   "workloadGate": no_look_ahead()}),
        )
        .await?;
    let vetoed = named_drain_only(&env, &node, &format!("{node}-vetoed")).await?;
    let m = wait::phase(&maintenances, &vetoed, MaintenancePhase::Failed, TIMEOUT)
        .await
        .with_context(|| cluster.agent.output())?;
    let mut admitted = m.admitted_policies().to_vec();
    admitted.sort();
    assert_eq!(
        admitted,
        [careful.clone(), policy.clone()],
        "admitted under both policies"
    );
    assert!(
        !env.pod_evicted(&guarded.name_any()).await?,
        "the PDB-guarded pod stayed: one policy forbids forcing"
    );
    wait::deleted(&policies, &careful, TIMEOUT).await?;

    // Forced: every policy says Force, the same drain goes through, the pod deleted
    // despite its PDB.
    let forced = named_drain_only(&env, &node, &format!("{node}-forced")).await?;
    let m = wait::phase(&maintenances, &forced, MaintenancePhase::Acting, TIMEOUT)
        .await
        .with_context(|| cluster.agent.output())?;
    let drained = m
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Drained"))
        .context("Drained condition")?;
    assert_eq!(drained.reason, "Forced");
    assert!(
        drained
            .message
            .contains(&format!("{}/{}", env.namespace, guarded.name_any())),
        "{}",
        drained.message
    );
    assert!(
        env.pod_evicted(&guarded.name_any()).await?,
        "the guarded pod deleted"
    );
    assert_eq!(node_state(&env.nodes().get(&node).await?), (true, true));
    env.wait_event(&forced, "", "DrainForced").await?;
    maintenances
        .delete(&forced, &DeleteParams::default())
        .await?;
    wait::until(
        &maintenances,
        &forced,
        "the maintenance gone",
        TIMEOUT,
        |m| m.is_none(),
    )
    .await?;
    assert_eq!(node_state(&env.nodes().get(&node).await?), (false, false));
    env.cleanup_after(cluster).await
}

#[tokio::test]
async fn a_reboot_logind_cannot_be_asked_for_fails_and_restores_the_node() -> anyhow::Result<()> {
    let (env, node) = TestEnv::alone_with_worker("maint-actfail", "a").await?;
    let policy = policy(&env, json!({})).await?;
    let cluster = start(&env, &node, "").await?;
    let name = format!("{node}-reboot");
    env.create_maintenance(&name, &node, "Manual", "Reboot")
        .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::phase(&maintenances, &name, MaintenancePhase::Failed, TIMEOUT)
        .await
        .with_context(|| cluster.agent.output())?;
    let message = m.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains("connecting to the system bus")
            && message.contains("taint and cordon are undone"),
        "{message}"
    );
    assert_eq!(
        node_state(&env.nodes().get(&node).await?),
        (false, false),
        "the machine stays up: not left cordoned"
    );
    env.wait_event(&name, "", "ActionFailed").await?;
    slot_freed(&env, &policy).await?;
    env.cleanup_after(cluster).await
}

/// The arguments of an agent of `node` whose node reports RebootRequired (a sentinel file),
/// with `extra` configuration.
fn reboot_required_agent(env: &TestEnv, node: &str, extra: &str) -> anyhow::Result<Vec<String>> {
    let dir = scratch::dir(&format!("nodeward-maintenance-{}", env.id))?;
    let sentinel = scratch::write(&dir, "reboot-required", "")?;
    let config = scratch::agent_config_file(
        &dir,
        &[&format!(
            "rebootRequired: {{interval: 500ms, timeout: 500ms, sentinelFile: {}}}",
            sentinel.display()
        )],
        &format!("shutdownGuard: {{enabled: false}}\n{extra}"),
    )?;
    Ok(nodeward_e2e::daemon::agent_args(
        node,
        &env.namespace,
        &controlplane::shared().kubeconfig,
        &config,
    ))
}

/// A node of its own whose policy asks for automatic reboots, and a coordinator that publishes
/// it for the agent (paused: it admits nothing).
async fn auto_reboot_scope(test: &str) -> anyhow::Result<(TestEnv, String, Daemon)> {
    let (env, node) = TestEnv::alone_with_worker(test, "a").await?;
    env.create_policy("auto", json!({"autoReboot": true, "paused": true}))
        .await?;
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &["--leader-elect=false"]).await?;
    Ok((env, node, coordinator))
}

#[tokio::test]
async fn a_required_reboot_asks_for_one_reboot_maintenance_per_boot() -> anyhow::Result<()> {
    let (env, node, _coordinator) = auto_reboot_scope("maint-autoreboot").await?;
    let args = reboot_required_agent(&env, &node, "")?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let mine = || async {
        anyhow::Ok(
            maintenances
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .filter(|m| m.spec.node_name == node)
                .collect::<Vec<_>>(),
        )
    };
    for restart in 0..2 {
        let agent = Daemon::start(
            agent_binary(),
            &format!("{}-agent-{restart}", env.id),
            &args,
        )?;
        wait::eventually("a Reboot maintenance", TIMEOUT, || async {
            Ok(Some(mine().await?).filter(|m| !m.is_empty()))
        })
        .await
        .with_context(|| agent.output())?;
        agent.wait_ready(TIMEOUT).await?;
        let said = if restart == 0 {
            "asked the coordinator for a reboot"
        } else {
            "already asked for in this boot"
        };
        wait::eventually("the agent's request", TIMEOUT, || async {
            Ok(agent.output().contains(said).then_some(()))
        })
        .await
        .with_context(|| agent.output())?;
        let asked = mine().await?;
        assert_eq!(
            asked.len(),
            1,
            "one per boot, also after a restart: {asked:?}"
        );
        let m = &asked[0];
        assert_eq!(m.spec.reason, nodeward_api::MaintenanceReason::Reboot);
        assert_eq!(m.spec.action, nodeward_api::MaintenanceAction::Reboot);
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
        assert!(
            m.name_any()
                .starts_with(&format!("{node}-reboot-{}", &boot.trim()[..8])),
            "{}",
            m.name_any()
        );
        drop(agent);
    }
    env.cleanup().await
}

/// A request the cluster refuses (here an admission policy of the test's) is shown on the
/// node as a Warning Event with the API server's reason, and asked again once it is allowed.
#[tokio::test]
async fn a_refused_reboot_request_is_shown_on_the_node_and_asked_again() -> anyhow::Result<()> {
    let (env, node, _coordinator) = auto_reboot_scope("maint-refused").await?;
    // Labelled as the test's release: its cleanup removes them.
    let name = format!("{}-refuse", env.id);
    let metadata = json!({"name": name, "labels": {"app.kubernetes.io/instance": env.id}});
    let refusing = [
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": metadata, "spec": {"failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["nodeward.io"], "apiVersions": ["*"],
                "operations": ["CREATE"], "resources": ["nodemaintenances"]}]},
            "validations": [{"expression": format!("object.spec.nodeName != '{node}'"),
                "message": format!("e2e refuses the requests of {node}")}]}}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": metadata, "spec": {"policyName": name, "validationActions": ["Deny"]}}),
    ];
    nodeward_e2e::helm::apply(&env.client, &refusing).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let probe: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": format!("{}-probe", env.id)},
        "spec": {"nodeName": node, "reason": "Reboot", "action": "Reboot"},
    }))?;
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait::eventually("the test's policy in force", TIMEOUT, || async {
        Ok(maintenances
            .create(&dry_run, &probe)
            .await
            .is_err()
            .then_some(()))
    })
    .await?;

    let args = reboot_required_agent(&env, &node, "")?;
    let agent = Daemon::start(agent_binary(), &format!("{}-agent", env.id), &args)?;
    let shown = env
        .wait_event(&node, "", "RebootRequestRefused")
        .await
        .with_context(|| agent.output())?;
    let note = shown.note.unwrap_or_default();
    assert!(
        note.contains(&format!("e2e refuses the requests of {node}"))
            && note.contains("asking again with backoff"),
        "{note}"
    );
    assert_eq!(shown.type_.as_deref(), Some("Warning"));

    // Allowed again: asked again, without a restart.
    for kind in [
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicies",
    ] {
        let api: Api<kube::api::DynamicObject> = Api::all_with(
            env.client.clone(),
            &kube::api::ApiResource {
                group: "admissionregistration.k8s.io".into(),
                version: "v1".into(),
                api_version: "admissionregistration.k8s.io/v1".into(),
                kind: String::new(),
                plural: kind.into(),
            },
        );
        api.delete(&name, &Default::default()).await?;
    }
    wait::eventually("the request asked again", 2 * TIMEOUT, || async {
        let asked = maintenances.list(&Default::default()).await?;
        Ok(asked.items.into_iter().find(|m| m.spec.node_name == node))
    })
    .await
    .with_context(|| agent.output())?;
    drop(agent);
    env.cleanup().await
}

/// A request that ended Failed while the node still requires a reboot is asked for again in
/// the same boot, after `requestRetryAfter`, then after twice that, and no more than
/// `requestRetries` times; the node's Events say so.
#[tokio::test]
async fn a_failed_reboot_request_is_asked_again_after_a_doubling_wait_up_to_its_limit()
-> anyhow::Result<()> {
    let (env, node, _coordinator) = auto_reboot_scope("maint-retry").await?;
    let args = reboot_required_agent(
        &env,
        &node,
        "reboot: {requestRetries: 2, requestRetryAfter: 2s}\n",
    )?;
    let agent = Daemon::start(agent_binary(), &format!("{}-agent", env.id), &args)?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let boot: String = boot.chars().filter(char::is_ascii_alphanumeric).collect();
    let names = [
        format!("{node}-reboot-{}", &boot[..8]),
        format!("{node}-reboot-{}r1", &boot[..6]),
        format!("{node}-reboot-{}r2", &boot[..6]),
    ];
    let mut failed_at: Option<jiff::Timestamp> = None;
    for (attempt, name) in names.iter().enumerate() {
        let asked = wait::until(&maintenances, name, "the request", TIMEOUT, |m| m.is_some())
            .await
            .with_context(|| agent.output())?
            .context("the request")?;
        if let Some(failed) = failed_at {
            // Created to the second: at least the wait (2 s, then 4 s) less that rounding.
            let wait = jiff::SignedDuration::from_secs(2 << (attempt - 1));
            let created = asked.metadata.creation_timestamp.context("created")?.0;
            assert!(
                created >= failed + wait - jiff::SignedDuration::from_secs(1),
                "{name} created at {created}, {failed} + {wait} after the last failure"
            );
            let note = env.wait_event(&node, "", "RebootRequestedAgain").await?;
            assert!(
                note.note.unwrap_or_default().contains("retry"),
                "an Event says so"
            );
        }
        let now = jiff::Timestamp::now();
        env.merge_maintenance_status(
            name,
            json!({"phase": "Failed", "finishedAt": now.to_string(), "message": "the health gate never passed"}),
        )
        .await?;
        failed_at = Some(now);
    }
    // Two retries, both failed: the agent gives up and says so, and asked no more.
    let exhausted = env
        .wait_event(&node, "", "RebootRequestsExhausted")
        .await
        .with_context(|| agent.output())?;
    assert!(
        exhausted
            .note
            .unwrap_or_default()
            .contains("its 3 requests in this boot failed"),
        "the Event counts them"
    );
    let mine: Vec<String> = maintenances
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|m| m.spec.node_name == node)
        .map(|m| m.name_any())
        .collect();
    assert_eq!(mine.len(), 3, "{mine:?}");
    drop(agent);
    env.cleanup().await
}

/// The surge of Deployment `name` in `m`'s status.
fn surge_of<'a>(
    m: &'a NodeMaintenance,
    name: &str,
) -> Option<&'a nodeward_api::maintenance::Surge> {
    m.status
        .as_ref()?
        .surges
        .iter()
        .find(|s| s.deployment == name)
}

#[tokio::test]
async fn a_single_replica_deployment_that_asks_surges_before_its_pod_goes_and_is_restored_though_both_daemons_were_killed()
-> anyhow::Result<()> {
    use nix::sys::signal::Signal;
    use nodeward_api::{labels::SURGE_FINALIZER, maintenance::SurgeState};

    let env = TestEnv::alone("maint-surge").await?;
    let (node, spare) = (env.node_name(0), env.node_name(1));
    env.create_nodes(&[NodeSpec::worker("a"), NodeSpec::worker("a")])
        .await?;
    // Both single-replica Deployments run on `node`; only cart asked to surge.
    let (deployments, cart, solo) = cart_and_solo_on(&env, &spare).await?;
    // Before the rollout (paused, the maintenance pending): the policy lists the
    // single-replica Deployment that did not ask to surge as a risk, with an Event.
    let policy = policy(&env, json!({"paused": true})).await?;
    let cluster = start(&env, &node, "").await?;
    let name = drain_only(&env, &node).await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    solo_listed_as_a_risk(&env, &policies, &policy, &node).await?;

    // The rollout: the surge is planned at admission, raised once the node is cordoned.
    env.merge_policy_spec(&policy, json!({"paused": false}))
        .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let m = wait::until(&maintenances, &name, "cart surging", TIMEOUT, |m| {
        m.and_then(|m| surge_of(m, "cart"))
            .is_some_and(|s| s.state == SurgeState::Surging)
    })
    .await
    .with_context(|| cluster.agent.output())?
    .context("maintenance")?;
    assert_eq!(
        surge_of(&m, "cart").and_then(|s| s.replicas),
        Some(1),
        "the count to restore is recorded"
    );
    assert!(
        m.finalizers().iter().any(|f| f == SURGE_FINALIZER),
        "the record is kept by a finalizer"
    );

    // Both daemons die in the middle of the surge, with the Deployment raised (the record is
    // written first, so the raise follows it).
    wait::eventually("cart raised to 2", TIMEOUT, || async {
        let replicas = deployments.get("cart").await?.spec.and_then(|s| s.replicas);
        Ok((replicas == Some(2)).then_some(()))
    })
    .await?;
    let Cluster {
        _coordinator: mut killed_coordinator,
        agent: mut killed_agent,
    } = cluster;
    killed_coordinator.signal(Signal::SIGKILL)?;
    killed_agent.signal(Signal::SIGKILL)?;
    killed_coordinator.wait_exit(TIMEOUT).await?;
    killed_agent.wait_exit(TIMEOUT).await?;
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &[]).await?;
    let agent = agent(&env, &node, "", "agent-restarted")?;

    // Drained (DrainOnly holds the node in Acting): the old pod went only once the surge was
    // available, and the recorded count is back.
    let m = wait::until(
        &maintenances,
        &name,
        "drained and the surge restored",
        Duration::from_secs(120),
        |m| {
            m.is_some_and(|m| {
                m.phase() == MaintenancePhase::Acting
                    && surge_of(m, "cart").is_some_and(|s| s.state == SurgeState::Restored)
            })
        },
    )
    .await
    .with_context(|| format!("{}\n{}", agent.output(), coordinator.output()))?
    .context("maintenance")?;
    assert_eq!(
        deployments.get("cart").await?.spec.and_then(|s| s.replicas),
        Some(1)
    );
    let history = surge_of(&m, "cart")
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(history.contains("restored"), "{history}");
    wait::until(
        &maintenances,
        &name,
        "the surge finalizer off",
        TIMEOUT,
        |m| m.is_some_and(|m| !m.finalizers().iter().any(|f| f == SURGE_FINALIZER)),
    )
    .await?;
    let seen = cart.readiness();
    assert_eq!(
        seen.fewest,
        Some(1),
        "cart never had no Ready replica: {:?}",
        seen.timeline
    );
    assert!(
        seen.timeline.iter().any(|(_, n)| *n == 2),
        "two Ready while surged: {:?}",
        seen.timeline
    );
    no_cart_pod_on(&env, &node).await?;

    wait::deleted(&maintenances, &name, TIMEOUT).await?;
    env.cleanup_after((agent, coordinator, cart, solo)).await
}

/// Two single-replica Deployments whose pods run on the node that is not `spare` (cordoned
/// until they do): `cart`, which asks to surge before its pod is evicted, and `solo`, which does not;
/// with a watch of each one's Ready replicas (cart's armed).
async fn cart_and_solo_on(
    env: &TestEnv,
    spare: &str,
) -> anyhow::Result<(
    Api<k8s_openapi::api::apps::v1::Deployment>,
    nodeward_e2e::workload::ReadyWatch,
    nodeward_e2e::workload::ReadyWatch,
)> {
    use k8s_openapi::api::apps::v1::Deployment;
    use nodeward_e2e::workload;
    let cordon = |on: bool| Patch::Merge(json!({"spec": {"unschedulable": on}}));
    env.nodes()
        .patch(spare, &PatchParams::default(), &cordon(true))
        .await?;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    workload::spread_deployment(env, "cart", 1, "4s").await?;
    deployments
        .patch(
            "cart",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"nodeward.io/surge-before-evict": "true"}}}),
            ),
        )
        .await?;
    workload::spread_deployment(env, "solo", 1, "1s").await?;
    let cart = workload::ReadyWatch::start(env, "cart");
    let solo = workload::ReadyWatch::start(env, "solo");
    wait::eventually("both single replicas Ready", TIMEOUT, || async {
        Ok((cart.readiness().ready.len() == 1 && solo.readiness().ready.len() == 1).then_some(()))
    })
    .await?;
    env.nodes()
        .patch(spare, &PatchParams::default(), &cordon(false))
        .await?;
    cart.arm();

    Ok((deployments, cart, solo))
}

/// Before the rollout, the paused policy lists `solo` on `node` as a rollout risk (cart asked
/// to surge), with a RolloutRisk Event.
async fn solo_listed_as_a_risk(
    env: &TestEnv,
    policies: &Api<DisruptionPolicy>,
    policy: &str,
    node: &str,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Event;
    let listed = wait::until(policies, policy, "a rollout risk listed", TIMEOUT, |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| !s.rollout_risks.is_empty())
    })
    .await?
    .and_then(|p| p.status)
    .context("policy status")?;
    let risks: Vec<(String, String)> = listed
        .rollout_risks
        .iter()
        .map(|r| (r.deployment.clone(), r.node_name.clone()))
        .collect();
    assert_eq!(
        risks,
        vec![("solo".to_owned(), node.to_owned())],
        "cart asked to surge: no risk"
    );
    let events: Api<Event> = Api::all(env.client.clone());
    wait::eventually("a RolloutRisk Event on the policy", TIMEOUT, || async {
        let list = events
            .list(
                &kube::api::ListParams::default()
                    .fields(&format!("involvedObject.name={policy},reason=RolloutRisk")),
            )
            .await?;
        Ok(list
            .items
            .iter()
            .any(|e| e.message.as_deref().is_some_and(|m| m.contains("solo")))
            .then_some(()))
    })
    .await?;

    Ok(())
}

/// No cart pod (not being deleted) is left on the drained `node`.
async fn no_cart_pod_on(env: &TestEnv, node: &str) -> anyhow::Result<()> {
    let pods = env
        .pods()
        .list(&kube::api::ListParams::default().labels(&format!("app=cart-{}", env.id)))
        .await?;
    assert!(
        pods.items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node)),
        "no cart pod left on the drained node"
    );

    Ok(())
}
