//! A maintenance's host commands on a real node, run by the chart's agent as transient systemd
//! units of the VM's own systemd: the hooks around the update in their order, a hook that
//! fails, an update program the host lacks, an update that floods its output and exits
//! non-zero, one that hangs past its timeout, and a rollback that fails. Each failure ends the
//! maintenance Failed with a bounded message and output naming what failed, leaves nothing
//! running on the host and puts the node back in service. Nothing here asks for a reboot (no
//! sentinel), so the VM keeps its boot.

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use nodeward_api::{
    MaintenancePhase, NodeMaintenance,
    bounds::MESSAGE_LIMIT,
    update::{HostRun, HostRunResult, HostStep, OUTPUT_LIMIT},
};
use nodeward_e2e::{nodelab::Vm, wait};
use serde_json::{Value, json};

use crate::{
    patching::finished,
    support::{Lab, Pick, REBOOT, TEST_LABEL},
};

/// Where the hooks and the update write their names as they run, on the VM.
const STEPS: &str = "/var/lib/nodeward-lab-steps";

/// A command that appends `word` to [`STEPS`], then runs `then` (shell).
fn noting(word: &str, then: &str) -> Value {
    json!(["/bin/sh", "-c", format!("echo {word} >>{STEPS}; {then}")])
}

/// Applies the maintenance `name` of `node` with `spec`'s host commands (update, hooks) and
/// waits for its end.
async fn run_maintenance(
    lab: &Lab,
    name: &str,
    node: &str,
    spec: Value,
) -> anyhow::Result<NodeMaintenance> {
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    wait::deleted(&maintenances, name, REBOOT).await?;
    let mut body = json!({"nodeName": node, "reason": "Manual", "action": "Reboot"});
    if let (Some(body), Some(spec)) = (body.as_object_mut(), spec.as_object()) {
        body.extend(spec.clone());
    }
    lab.apply(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name, "labels": {TEST_LABEL: "true"}},
        "spec": body,
    }))
    .await?;
    finished(lab, name, REBOOT).await
}

fn run_of(m: &NodeMaintenance, step: HostStep) -> Option<HostRun> {
    m.status
        .as_ref()?
        .host_runs
        .iter()
        .find(|r| r.step == step)
        .cloned()
}

/// `m` ended Failed, `reason`, its message naming `says`; returns the message.
fn failed_saying(m: &NodeMaintenance, reason: &str, says: &str) -> String {
    let status = m.status.clone().unwrap_or_default();
    let message = status.message.unwrap_or_default();
    assert_eq!(
        (status.phase, status.reason.as_deref()),
        (MaintenancePhase::Failed, Some(reason)),
        "{}: {message}",
        m.name_any()
    );
    assert!(
        message.contains(says),
        "{}: {message:?} does not say {says:?}",
        m.name_any()
    );
    assert!(message.len() <= MESSAGE_LIMIT, "{} bytes", message.len());
    message
}

/// `node` back in service (nothing of nodeward's on it), `vm` on the boot it had (`boot`), and
/// no unit or output file of `m`'s host commands left on the host.
async fn restored(
    lab: &Lab,
    node: &str,
    vm: &Vm,
    boot: &str,
    m: &NodeMaintenance,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(lab.client.clone());
    wait::until(&nodes, node, "the node back in service", REBOOT, |n| {
        n.is_some_and(nodeward_e2e::node_restored)
    })
    .await?;
    assert_eq!(vm.boot_id().await?, boot, "{}: rebooted", m.name_any());
    let uid = m.uid().context("a uid")?;
    let left = vm
        .run(&format!(
            "systemctl list-units --all --no-legend --plain 'nodeward-*-{uid}.service'; ls /run/nodeward-*-{uid}.log 2>/dev/null || true"
        ))
        .await?;
    assert_eq!(left.trim(), "", "{}: left on the host", m.name_any());
    Ok(())
}

/// Each hook runs once, in its phase (`beforeDrain` while Draining, `afterDrain` then the update
/// while Acting, `afterBoot` while Verifying), each recorded with an Event; a hook that fails
/// (here `afterDrain`) fails the maintenance before the update runs, and the node is restored.
#[tokio::test]
async fn hooks_run_in_their_order_around_the_update_and_a_failed_one_stops_the_maintenance()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::with_node(Pick::At(0)).await?;
    let boot = vm.boot_id().await?;
    vm.run(&format!("rm -f {STEPS} /var/run/reboot-required"))
        .await?;

    let hooked = run_maintenance(
        &lab,
        "steps-hooks",
        &node,
        json!({
            "update": {"command": noting("update", "true")},
            "hooks": {
                "beforeDrain": {"command": noting("before-drain", "true")},
                "afterDrain": {"command": noting("after-drain", "true")},
                "afterBoot": {"command": noting("after-boot", "echo checked")},
            },
        }),
    )
    .await?;
    anyhow::ensure!(
        hooked.phase() == MaintenancePhase::Succeeded,
        "steps-hooks: {:?}",
        hooked.status.as_ref().map(|s| &s.message)
    );
    assert_eq!(
        vm.run(&format!("cat {STEPS}")).await?.trim(),
        "before-drain\nafter-drain\nupdate\nafter-boot",
        "each once, in this order"
    );
    for step in [
        HostStep::BeforeDrain,
        HostStep::AfterDrain,
        HostStep::Update,
        HostStep::AfterBoot,
    ] {
        let run = run_of(&hooked, step).with_context(|| format!("{step:?}'s run"))?;
        assert_eq!(run.result, Some(HostRunResult::Succeeded), "{run:?}");
        let ran_on = run.boot_id.as_deref().map(|b| b.replace('-', ""));
        assert_eq!(ran_on, Some(boot.replace('-', "")), "{run:?}");
    }
    let after_boot = run_of(&hooked, HostStep::AfterBoot).context("afterBoot")?;
    assert_eq!(after_boot.output.as_deref(), Some("checked"));
    let reasons: Vec<String> = event_reasons(&lab, "steps-hooks").await?;
    for reason in ["HookStarted", "HookSucceeded", "UpdateStarted", "Updated"] {
        assert!(reasons.iter().any(|r| r == reason), "{reason}: {reasons:?}");
    }
    restored(&lab, &node, &vm, &boot, &hooked).await?;

    vm.run(&format!("rm -f {STEPS}")).await?;
    let stopped = run_maintenance(
        &lab,
        "steps-hook-fails",
        &node,
        json!({
            "update": {"command": noting("update", "true")},
            "hooks": {"afterDrain": {"command": noting("after-drain", "echo cannot quiesce the database; exit 7")}},
        }),
    )
    .await?;
    failed_saying(&stopped, "HookFailed", "the AfterDrain hook exited with 7");
    let hook = run_of(&stopped, HostStep::AfterDrain).context("afterDrain")?;
    assert_eq!(
        (hook.result, hook.exit_code, hook.output.as_deref()),
        (
            Some(HostRunResult::Failed),
            Some(7),
            Some("cannot quiesce the database")
        )
    );
    assert!(
        run_of(&stopped, HostStep::Update).is_none(),
        "the update ran"
    );
    assert_eq!(vm.run(&format!("cat {STEPS}")).await?.trim(), "after-drain");
    restored(&lab, &node, &vm, &boot, &stopped).await?;
    vm.run(&format!("rm -f {STEPS}")).await?;
    Ok(())
}

/// The reasons of the Events about the maintenance `name`.
async fn event_reasons(lab: &Lab, name: &str) -> anyhow::Result<Vec<String>> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(lab.client.clone(), "default");
    let list = events
        .list(&kube::api::ListParams::default().fields(&format!("regarding.name={name}")))
        .await?;
    Ok(list.items.into_iter().filter_map(|e| e.reason).collect())
}

/// An update whose program the host lacks, one that writes megabytes and exits non-zero, and
/// one that hangs past its timeout: each fails the maintenance with a message that says how it ended, within the status's
/// bounds (the output's last 2 KiB, ending with what it said last), systemd stops what hung,
/// and the node is back in service.
#[tokio::test]
async fn an_update_missing_flooding_and_failing_or_hanging_past_its_timeout_fails_boundedly_and_restores_the_node()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::with_node(Pick::At(0)).await?;
    let boot = vm.boot_id().await?;
    vm.run("rm -f /var/run/reboot-required").await?;

    // A program the host does not have: it never starts, and the status says which.
    let missing = run_maintenance(
        &lab,
        "steps-update-missing",
        &node,
        json!({"update": {"command": ["/usr/local/bin/no-such-updater", "--all"]}}),
    )
    .await?;
    failed_saying(
        &missing,
        "UpdateFailed",
        "the host has no executable /usr/local/bin/no-such-updater",
    );
    let run = run_of(&missing, HostStep::Update).context("the update's run")?;
    assert_eq!(run.result, Some(HostRunResult::NotStarted), "{run:?}");
    restored(&lab, &node, &vm, &boot, &missing).await?;

    // About 4 MiB of output, then the line that matters, then exit 3.
    let loud = run_maintenance(
        &lab,
        "steps-update-floods",
        &node,
        json!({"update": {"command": ["/bin/sh", "-c",
            "head -c 3000000 /dev/urandom | base64; echo E: the mirror is out of disk space; exit 3"]}}),
    )
    .await?;
    failed_saying(&loud, "UpdateFailed", "the update exited with 3");
    let run = run_of(&loud, HostStep::Update).context("the update's run")?;
    let output = run.output.clone().unwrap_or_default();
    assert_eq!(
        (run.result, run.exit_code),
        (Some(HostRunResult::Failed), Some(3))
    );
    assert!(
        output.len() <= OUTPUT_LIMIT && output.len() > OUTPUT_LIMIT / 2,
        "{} bytes of output kept",
        output.len()
    );
    assert!(
        output.ends_with("E: the mirror is out of disk space"),
        "the output's end: {:?}",
        &output[output.len().saturating_sub(80)..]
    );
    restored(&lab, &node, &vm, &boot, &loud).await?;

    let hung = run_maintenance(
        &lab,
        "steps-update-hangs",
        &node,
        json!({"update": {"command": ["/bin/sh", "-c", "echo waiting for the lock; exec sleep 3599"], "timeout": "20s"}}),
    )
    .await?;
    failed_saying(
        &hung,
        "UpdateFailed",
        "the update ran past its timeout (20s) and was stopped",
    );
    let run = run_of(&hung, HostStep::Update).context("the update's run")?;
    assert_eq!(
        (run.result, run.exit_code, run.output.as_deref()),
        (
            Some(HostRunResult::TimedOut),
            None,
            Some("waiting for the lock")
        )
    );
    assert_eq!(
        vm.run("pgrep -f 'sleep 3[5]99' || echo none").await?.trim(),
        "none",
        "the hung update still runs"
    );
    restored(&lab, &node, &vm, &boot, &hung).await
}

/// An update that succeeded and needs no reboot, then an `afterBoot` hook that fails: the
/// rollback runs, and fails too. The maintenance ends `RollbackFailed`, saying both, and the
/// node is back in service (an operator looks at it; nodeward does not retry).
#[tokio::test]
async fn a_rollback_that_fails_after_a_failed_after_boot_hook_ends_the_maintenance_rollback_failed()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::with_node(Pick::At(0)).await?;
    let boot = vm.boot_id().await?;
    vm.run(&format!("rm -f {STEPS} /var/run/reboot-required"))
        .await?;
    let failed = run_maintenance(
        &lab,
        "steps-rollback-fails",
        &node,
        json!({
            "update": {
                "command": noting("update", "true"),
                "rollback": {"command": noting("rollback", "echo the old packages are gone; exit 5")},
            },
            "hooks": {"afterBoot": {"command": noting("after-boot", "echo the service did not come back; exit 1")}},
        }),
    )
    .await?;
    let message = failed_saying(&failed, "RollbackFailed", "the rollback exited with 5");
    assert!(message.contains("AfterBoot"), "the cause: {message}");
    let rollback = run_of(&failed, HostStep::Rollback).context("the rollback's run")?;
    assert_eq!(
        (
            rollback.result,
            rollback.exit_code,
            rollback.output.as_deref()
        ),
        (
            Some(HostRunResult::Failed),
            Some(5),
            Some("the old packages are gone")
        )
    );
    assert_eq!(
        vm.run(&format!("cat {STEPS}")).await?.trim(),
        "update\nafter-boot\nrollback",
        "no reboot between: the rollback failed"
    );
    restored(&lab, &node, &vm, &boot, &failed).await?;
    vm.run(&format!("rm -f {STEPS}")).await?;
    Ok(())
}
