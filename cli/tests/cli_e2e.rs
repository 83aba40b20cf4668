//! `kubectl-nodeward` against the real control plane and the real coordinator: each verb
//! creates, reads or changes the objects it names, refuses what it cannot do with a reason
//! and a failing exit status, and `why` shows the coordinator's reason for a waiting node.

use std::{process::Output, time::Duration};

use anyhow::Context;
use kube::{Api, ResourceExt};
use nodeward_api::{DisruptionPolicy, MaintenanceAction, MaintenanceReason, NodeMaintenance};
use nodeward_e2e::{NodeSpec, TestEnv, controlplane, daemon, wait};

const CLI: &str = env!("CARGO_BIN_EXE_kubectl-nodeward");
const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the plugin with the test cluster's kubeconfig.
async fn cli(args: &[&str]) -> anyhow::Result<Output> {
    let kubeconfig = controlplane::shared().kubeconfig.display().to_string();
    let output = tokio::process::Command::new(CLI)
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
    let env = TestEnv::new("cli").await?;
    env.create_nodes(&[NodeSpec::worker("a"), NodeSpec::worker("a")])
        .await?;
    let (n0, n1) = (env.node_name(0), env.node_name(1));
    env.heartbeats(&[n0.clone(), n1.clone()]).await?;
    let policy = env
        .create_policy("pool", serde_json::json!({"maxConcurrent": 1}))
        .await?;
    let coordinator = daemon::coordinator(&env, &[])?;
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

    drop(coordinator);
    env.cleanup().await
}

#[tokio::test]
async fn completion_scripts_are_printed_for_each_shell() -> anyhow::Result<()> {
    for shell in ["bash", "zsh", "fish"] {
        let out = tokio::process::Command::new(CLI)
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
    let out = tokio::process::Command::new(CLI)
        .args(["completion", "tcsh"])
        .output()
        .await?;
    assert!(!out.status.success(), "an unknown shell is refused");
    Ok(())
}
