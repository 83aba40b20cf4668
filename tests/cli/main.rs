//! `kubectl-nodeward` against the real control plane and the real coordinator: each verb
//! creates, reads or changes the objects it names, refuses what it cannot do with a reason
//! and a failing exit status, `why` shows the coordinator's reason for a waiting node, `status`
//! the budgets in use, and `migrate` turns kured's and node-problem-detector's DaemonSets into
//! a policy the API server accepts and values the chart renders.

use nodeward_e2e::daemon::cli_binary;
use std::{process::Output, time::Duration};

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use nodeward_api::{
    DisruptionPolicy, MaintenanceAction, MaintenancePhase, MaintenanceReason, NodeMaintenance,
};
use nodeward_e2e::{
    NodeSpec, TestEnv, controlplane, daemon,
    env::{KWOK_NODE_ANNOTATION, TEST_LABEL},
    wait,
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);
/// Runs the plugin with the test cluster's kubeconfig.
async fn cli(args: &[&str]) -> anyhow::Result<Output> {
    let kubeconfig = controlplane::shared().kubeconfig.display().to_string();
    let output = tokio::process::Command::new(cli_binary())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(args)
        .output()
        .await
        .with_context(|| format!("running kubectl-nodeward {args:?}"))?;
    Ok(output)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the plugin and expects it to succeed; its standard output.
async fn ok(args: &[&str]) -> anyhow::Result<String> {
    let out = cli(args).await?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl-nodeward {args:?} failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    Ok(text(&out.stdout))
}

/// Runs the plugin and expects it to fail; its standard error.
async fn refused(args: &[&str]) -> anyhow::Result<String> {
    let out = cli(args).await?;
    anyhow::ensure!(
        !out.status.success(),
        "kubectl-nodeward {args:?} succeeded: {}",
        text(&out.stdout)
    );
    Ok(text(&out.stderr))
}

/// The maintenances of `node`.
async fn of_node(env: &TestEnv, node: &str) -> anyhow::Result<Vec<NodeMaintenance>> {
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|m| m.spec.node_name == node)
        .collect())
}

#[tokio::test]
async fn every_verb_changes_what_it_names_and_why_tells_the_coordinators_reason()
-> anyhow::Result<()> {
    let env = TestEnv::alone("cli").await?;
    env.create_nodes(&[NodeSpec::worker("a"), NodeSpec::worker("a")])
        .await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    env.heartbeats(&[n0.clone(), n1.clone()]).await?;
    let policy = env
        .create_policy("pool", serde_json::json!({"maxConcurrent": 1}))
        .await?;
    let coordinator = daemon::coordinator(&env, &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());

    // reboot: one maintenance per node, Manual, by the caller's identity.
    let said = ok(&["reboot", &n0, &n1, "--message", "kernel 6.12"]).await?;
    assert_eq!(said.lines().count(), 2, "{said}");
    let mut requested = Vec::new();
    for node in [&n0, &n1] {
        let mine = of_node(&env, node).await?;
        assert_eq!(mine.len(), 1, "{node}: {mine:?}");
        let m = &mine[0];
        assert_eq!(m.spec.reason, MaintenanceReason::Manual);
        assert_eq!(m.spec.action, MaintenanceAction::Reboot);
        assert_eq!(m.spec.message.as_deref(), Some("kernel 6.12"));
        let by = m.spec.requested_by.clone().unwrap_or_default();
        assert!(
            !by.is_empty() && by != "kubectl-nodeward",
            "the caller's user: {by}"
        );
        assert!(said.contains(&m.name_any()), "{said}");
        requested.push(m.name_any());
    }

    // A second request for a node with one under way is refused, naming it; a missing node too.
    let again = refused(&["reboot", &n0]).await?;
    assert!(
        again.contains(&requested[0]) && again.contains("under way"),
        "{again}"
    );
    let ghost = refused(&["drain", "no-such-node-cli"]).await?;
    assert!(ghost.contains("no-such-node-cli: no such node"), "{ghost}");

    // maxConcurrent 1: one is admitted, the other waits; `why` gives the coordinator's reason.
    let waiting = wait::eventually("one admitted, one denied", TIMEOUT, || async {
        let mut denied = None;
        let mut admitted = 0;
        for name in &requested {
            let m = maintenances.get(name).await?;
            if m.admitted_policies().contains(&policy) {
                admitted += 1;
            } else if m.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Admitted" && c.status == "False" && c.reason == "BudgetExhausted"
                })
            }) {
                denied = Some(m.spec.node_name.clone());
            }
        }
        Ok(denied.filter(|_| admitted == 1))
    })
    .await?;
    let why = ok(&["why", &waiting]).await?;
    assert!(
        why.starts_with(&format!("node {waiting}: Ready, schedulable\n")),
        "{why}"
    );
    assert!(why.contains("agent: last heartbeat"), "{why}");
    assert!(
        why.contains(&format!("policy {policy}: 1 of 1 disrupted now")),
        "{why}"
    );
    assert!(why.contains("  waiting: BudgetExhausted: "), "{why}");
    let unknown = refused(&["why", "no-such-node-cli"]).await?;
    assert!(
        unknown.contains("node no-such-node-cli not found"),
        "{unknown}"
    );
    let status = ok(&["status"]).await?;
    assert!(
        status.contains(&policy) && status.contains(&requested[0]),
        "{status}"
    );

    // pause / resume: the policy's spec.paused; an unknown policy is refused.
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    ok(&["pause", &policy]).await?;
    assert!(policies.get(&policy).await?.spec.paused);
    ok(&["resume", &policy]).await?;
    assert!(!policies.get(&policy).await?.spec.paused);
    let nope = refused(&["pause", "no-such-policy-cli"]).await?;
    assert!(
        nope.contains("no-such-policy-cli: no such policy"),
        "{nope}"
    );

    // cancel: both maintenances are deleted (no agent holds a finalizer here).
    let cancelled = ok(&["cancel", &n0, &n1]).await?;
    assert_eq!(cancelled.matches("cancelled").count(), 2, "{cancelled}");
    for name in &requested {
        wait::until(&maintenances, name, "cancelled", TIMEOUT, |m| m.is_none()).await?;
    }
    // drain, then uncordon ends it.
    ok(&["drain", &n1]).await?;
    let drains = of_node(&env, &n1).await?;
    assert_eq!(drains.len(), 1);
    assert_eq!(drains[0].spec.action, MaintenanceAction::DrainOnly);
    let said = ok(&["uncordon", &n1]).await?;
    assert!(said.contains(&drains[0].name_any()), "{said}");
    wait::until(
        &maintenances,
        &drains[0].name_any(),
        "uncordoned",
        TIMEOUT,
        |m| m.is_none(),
    )
    .await?;
    assert!(
        ok(&["cancel", &n1])
            .await?
            .contains("no maintenance under way")
    );
    // patch --urgent: a Reboot maintenance named as a patch, marked an emergency.
    let said = ok(&["patch", &n0, "--urgent"]).await?;
    assert!(
        said.contains("urgently (no window or reboot blocker waited for)"),
        "{said}"
    );
    let patches = of_node(&env, &n0).await?;
    assert_eq!(patches.len(), 1, "{patches:?}");
    let patch = &patches[0];
    assert!(
        patch.name_any().starts_with(&format!("{n0}-patch-")),
        "{}",
        patch.name_any()
    );
    assert_eq!(patch.spec.action, MaintenanceAction::Reboot);
    assert!(patch.spec.urgent);

    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn out_of_service_marks_only_a_node_that_is_not_ready_and_the_coordinator_unmarks_it_when_ready()
-> anyhow::Result<()> {
    let env = TestEnv::alone("cli-out-of-service").await?;
    env.create_nodes(&[NodeSpec::worker("a"), NodeSpec::worker("a")])
        .await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    env.heartbeats(&[n0.clone(), n1.clone()]).await?;
    let coordinator = daemon::coordinator(&env, &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;

    // A Ready node is running: refused, and not marked.
    let said = refused(&["out-of-service", &n0]).await?;
    assert!(said.contains("Ready, so it is running"), "{said}");
    let nodes = env.nodes();
    assert!(wait::out_of_service_taint(Some(&nodes.get(&n0).await?)).is_none());

    // n1 is off: nothing keeps it Ready (kwok lets it go), and it is NotReady.
    env.merge_node(
        &n1,
        json!({"metadata": {"annotations": {KWOK_NODE_ANNOTATION: "dead"}}}),
    )
    .await?;
    let ready = |status: &str| {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": &n1},
            "status": {"conditions": [{"type": "Ready", "status": status, "reason": "E2e",
                "message": "set by the test", "lastTransitionTime": jiff::Timestamp::now().to_string(),
                "lastHeartbeatTime": jiff::Timestamp::now().to_string()}]}})
    };
    let apply = kube::api::PatchParams::apply("e2e-problem").force();
    nodes
        .patch_status(&n1, &apply, &kube::api::Patch::Apply(ready("False")))
        .await?;
    let said = ok(&["out-of-service", &n1, "--message", "powered off in the BMC"]).await?;
    assert!(
        said.contains(&format!("node/{n1} marked out of service")),
        "{said}"
    );
    let marked = nodes.get(&n1).await?;
    let taint = wait::out_of_service_taint(Some(&marked)).context("the taint")?;
    assert_eq!(
        (taint.value.as_deref(), taint.effect.as_str()),
        (Some("nodeshutdown"), "NoExecute")
    );
    let record = marked
        .annotations()
        .get("nodeward.io/out-of-service")
        .cloned()
        .unwrap_or_default();
    assert!(
        record.contains("kubectl nodeward out-of-service")
            && record.contains("powered off in the BMC"),
        "{record}"
    );
    assert!(
        ok(&["out-of-service", &n1])
            .await?
            .contains("already out of service")
    );

    // Back and Ready: the coordinator takes nodeward's taint away.
    nodes
        .patch_status(&n1, &apply, &kube::api::Patch::Apply(ready("True")))
        .await?;
    wait::until(&nodes, &n1, "the taint taken away", TIMEOUT, |n| {
        n.is_some() && wait::out_of_service_taint(n).is_none()
    })
    .await
    .with_context(|| coordinator.output())?;
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn completion_scripts_are_printed_for_each_shell() -> anyhow::Result<()> {
    for shell in ["bash", "zsh", "fish"] {
        let out = tokio::process::Command::new(cli_binary())
            .args(["completion", shell])
            .output()
            .await?;
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(
            script.contains("kubectl-nodeward") && script.contains("reboot"),
            "{shell}: {script}"
        );
    }
    let out = tokio::process::Command::new(cli_binary())
        .args(["completion", "tcsh"])
        .output()
        .await?;
    assert!(!out.status.success(), "an unknown shell is refused");
    Ok(())
}

/// `status` prints what one round of the coordinator sees: the budget in use (a node not yet
/// Ready counts), each maintenance's phase and the unhealthy nodes.
#[tokio::test]
async fn status_prints_budget_use_maintenances_and_unhealthy_nodes() -> anyhow::Result<()> {
    let env = TestEnv::alone("status").await?;
    env.create_nodes(&vec![NodeSpec::worker("a"); 2]).await?;
    env.heartbeats(&[env.node_name(0), env.node_name(1)])
        .await?;
    let policy = env
        .create_policy("pool", json!({"maxConcurrent": 1}))
        .await?;
    let coordinator = daemon::coordinator(&env, &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let first = format!("{}-m", env.node_name(0));
    env.create_maintenance(&first, &env.node_name(0), "Manual", "DrainOnly")
        .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    wait::until(&maintenances, &first, "Admitted", TIMEOUT, |m| {
        m.is_some_and(|m| m.phase() != MaintenancePhase::Pending)
    })
    .await?;
    let sick = env.node_name(5);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": sick, "labels": {TEST_LABEL: env.id}, "annotations": {KWOK_NODE_ANNOTATION: "none"}},
    }))?;
    env.nodes().create(&Default::default(), &node).await?;

    let text = ok(&["status"]).await?;
    let policy_line = text
        .lines()
        .find(|l| l.starts_with(&policy))
        .context(text.clone())?;
    // The not-yet-Ready third node counts against the budget too: 2 of 1.
    assert!(policy_line.contains("2/1"), "{policy_line}");
    // A drain is no patch: as far as patching goes, the three nodes are updated.
    let progress_line = text
        .lines()
        .skip_while(|l| !l.starts_with("PROGRESS"))
        .find(|l| l.starts_with(&policy))
        .context(text.clone())?;
    assert!(
        progress_line
            .ends_with("[####################]  3/3 updated, 0 in progress, 0 pending, 0 failed"),
        "{progress_line}"
    );
    let m_line = text
        .lines()
        .find(|l| l.starts_with(&first))
        .context(text.clone())?;
    assert!(
        m_line.contains("Admitted") && m_line.contains(&env.node_name(0)),
        "{m_line}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with(&sick) && l.contains("not Ready")),
        "{text}"
    );
    env.cleanup().await
}

/// The DaemonSet `manifest` created in this test's namespace (where no node runs it), what
/// `migrate --FROM-daemonset` prints for it, and the policy it printed as created (see
/// [`create_printed_policy`]).
async fn migrated(
    env: &TestEnv,
    from: &str,
    manifest: &str,
) -> anyhow::Result<(String, DisruptionPolicy)> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let mut daemonset: DaemonSet = serde_yaml::from_str(manifest)?;
    daemonset.metadata.namespace = Some(env.namespace.clone());
    if let Some(pod) = daemonset
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
    {
        pod.node_selector = Some([("e2e.nodeward.io/none".to_owned(), "none".to_owned())].into());
    }
    Api::<DaemonSet>::namespaced(env.client.clone(), &env.namespace)
        .create(&Default::default(), &daemonset)
        .await?;
    let name = format!("{}-{from}", env.id);
    let flag = format!("--{from}-daemonset");
    let daemonset = format!("{}/{}", env.namespace, daemonset.name_any());
    let printed = ok(&["migrate", &flag, &daemonset, "--policy-name", &name]).await?;
    let created = create_printed_policy(env, &printed).await?;
    Ok((printed, created))
}

/// Creates the DisruptionPolicy `migrate` printed first, labelled as this test's: the API
/// server's own validation (OpenAPI and CEL) must take it as printed.
async fn create_printed_policy(env: &TestEnv, printed: &str) -> anyhow::Result<DisruptionPolicy> {
    let document = serde_yaml::Deserializer::from_str(printed)
        .next()
        .context("a document")?;
    let mut policy: DisruptionPolicy = serde::Deserialize::deserialize(document)?;
    policy
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(nodeward_e2e::env::TEST_LABEL.to_owned(), env.id.clone());
    // Printed for every node; created here for this test's nodes only, so that it governs no
    // other test's nodes on the shared control plane (also if this test fails before its
    // cleanup).
    policy.spec.node_selector = Some(serde_json::from_value(
        serde_json::json!({"matchLabels": {nodeward_e2e::env::TEST_LABEL: env.id}}),
    )?);
    Api::<DisruptionPolicy>::all(env.client.clone())
        .create(&Default::default(), &policy)
        .await
        .with_context(|| format!("the migrated policy was refused:\n{printed}"))
}

#[tokio::test]
async fn kureds_daemonset_in_the_cluster_migrates_to_a_policy_the_api_server_accepts()
-> anyhow::Result<()> {
    let env = TestEnv::new("migrate").await?;
    // kured's own manifest (with its flags given), in this test's namespace; no node runs it.
    let kured = include_str!("../../cli/src/migrate/testdata/kured-ds.yaml");
    let (printed, created) = migrated(&env, "kured", kured).await?;
    assert_eq!(created.spec.windows.len(), 1);
    assert_eq!(
        created.spec.windows[0].time_zone.as_deref(),
        Some("Europe/Berlin")
    );
    assert!(created.spec.taint_while_pending && created.spec.auto_reboot);
    assert!(
        printed.contains("--lock-ttl=30m: not carried over"),
        "{printed}"
    );
    env.cleanup().await
}

#[tokio::test]
async fn node_problem_detectors_daemonset_in_the_cluster_migrates_to_values_the_chart_renders_and_a_policy_the_api_server_accepts()
-> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let env = TestEnv::new("migrate-npd").await?;
    // node-problem-detector's own DaemonSet and ConfigMap, in this test's namespace; no node
    // runs it.
    let mut config: ConfigMap = serde_yaml::from_str(include_str!(
        "../../cli/src/migrate/testdata/npd-config.yaml"
    ))?;
    config.metadata.namespace = Some(env.namespace.clone());
    Api::<ConfigMap>::namespaced(env.client.clone(), &env.namespace)
        .create(&Default::default(), &config)
        .await?;
    let npd = include_str!("../../cli/src/migrate/testdata/npd-ds.yaml");
    let (printed, created) = migrated(&env, "npd", npd).await?;
    let gate = created.spec.health_gate.context("a health gate")?;
    assert!(gate.problem_types.contains(&"KernelDeadlock".to_owned()));

    // The values (printed as a comment): the chart renders them, loading the monitors as
    // they are and letting the agent write their conditions.
    let values: String = printed
        .lines()
        .skip_while(|l| !l.starts_with("# Helm values"))
        .skip(1)
        .take_while(|l| *l != "#")
        .map(|l| {
            format!(
                "{}\n",
                l.strip_prefix("# ").unwrap_or(l.trim_start_matches('#'))
            )
        })
        .collect();
    let file = std::env::temp_dir().join(format!("nodeward-npd-values-{}.yaml", env.id));
    std::fs::write(&file, &values)?;
    let rendered = nodeward_e2e::helm::run(
        std::process::Command::new(nodeward_e2e::helm::binary()?)
            .args(["template", "nodeward", "--kube-version", "1.34.0", "-f"])
            .arg(&file)
            .arg(nodeward_e2e::helm::chart()),
    );
    let _ = std::fs::remove_file(&file);
    let rendered = rendered.with_context(|| format!("the values:\n{values}"))?;
    // The kmsg monitors and the journald one (NPD's Docker monitor, a program's journal
    // messages) load as they are; the kernel log is read from the host's journal, without a
    // privileged pod.
    for expected in [
        "npd.kernel-monitor.json: |",
        "npd.readonly-monitor.json: |",
        "npd.docker-monitor.json: |",
        "- /etc/nodeward/npd.kernel-monitor.json",
        "source: journal",
        "mountPath: /host/var/log, readOnly: true",
    ] {
        assert!(
            rendered.contains(expected),
            "{expected} in the rendered chart"
        );
    }
    assert!(!rendered.contains("privileged: true"), "{rendered}");
    env.cleanup().await
}
