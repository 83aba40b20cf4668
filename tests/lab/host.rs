//! The agent in host mode on a real node (installed by [`Lab::host_mode`]): the shipped unit
//! with its hardening reports no false findings with the filesystem and kernel-log detectors
//! on, and its reboot gate refuses a reboot by a user polkit allows to reboot until the
//! coordinator admits a maintenance of the node. The rolling-reboot test runs these steps on
//! its host-mode VM before the rollout and checks the gate again after the VM's reboot: one
//! install of host mode serves both (each costs minutes on an emulated VM).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodeward_api::{MaintenancePhase, NodeMaintenance, report::NodeReportStatus};
use nodeward_e2e::{fixtures::MaintenanceSpec, nodelab::Vm, wait};

use crate::support::{self, Lab, REBOOT};

/// A user polkit lets reboot the machine (with others logged in), but not past an inhibitor.
const OPERATOR_RULE: &str = r#"polkit.addRule(function(action, subject) {
    if (subject.user != "ops") {
        return polkit.Result.NOT_HANDLED;
    }
    if (action.id == "org.freedesktop.login1.reboot"
            || action.id == "org.freedesktop.login1.reboot-multiple-sessions") {
        return polkit.Result.YES;
    }
    if (action.id == "org.freedesktop.login1.reboot-ignore-inhibit") {
        return polkit.Result.NO;
    }
    return polkit.Result.NOT_HANDLED;
});
"#;

/// What logind tells user ops about a reboot now: `yes`, `no`, `challenge`.
const OPS_CAN_REBOOT: &str = "runuser -u ops -- busctl call org.freedesktop.login1 \
    /org/freedesktop/login1 org.freedesktop.login1.Manager CanReboot";

/// Waits until logind's answer to ops is `answer` (`yes` or `no`). Minutes: right after a
/// reboot the emulated VM is still starting its units, the agent among them.
async fn ops_can_reboot(vm: &Vm, what: &str, answer: &str) -> anyhow::Result<()> {
    let want = format!("s \"{answer}\"");
    wait::eventually(what, Duration::from_secs(180), || async {
        let can = vm.run(OPS_CAN_REBOOT).await?;
        Ok((can.trim() == want).then_some(()))
    })
    .await
}

/// Gives user ops a reboot through polkit and waits until logind says yes to it. Run while
/// the chart's agent (no gate) serves `vm`: the yes shows that the rule took, so that a later
/// no is the gate's.
pub async fn let_an_operator_reboot(vm: &Vm) -> anyhow::Result<()> {
    vm.run(
        "mkdir -p /etc/polkit-1/rules.d && (id ops >/dev/null 2>&1 || useradd --create-home ops)",
    )
    .await?;
    vm.write_file(
        "/etc/polkit-1/rules.d/50-ops-reboot.rules",
        OPERATOR_RULE.as_bytes(),
    )
    .await?;
    ops_can_reboot(vm, "polkit to load the rule (ops may reboot)", "yes").await
}

/// The host-mode agent's first full report has no problem findings, a healthy finding of each
/// detector that a hardened unit could fool, and the unit runs with its hardening.
pub async fn assert_no_false_findings(vm: &Vm, report: &NodeReportStatus) -> anyhow::Result<()> {
    let node = &vm.name;
    let problems = support::problems(&report.findings);
    assert!(problems.is_empty(), "{node}: {problems:?}");
    for detector in [
        "filesystem",
        "kernel-log/ReadonlyFilesystem",
        "kubelet",
        "peers",
    ] {
        assert!(
            report
                .findings
                .iter()
                .any(|f| f.detector == detector && f.status == "False"),
            "{node}: no healthy {detector} finding in {:?}",
            report.findings
        );
    }
    let unit = vm
        .run("systemctl show nodeward-agent -p ActiveState -p ProtectSystem -p User")
        .await?;
    assert!(
        unit.contains("ActiveState=active") && unit.contains("ProtectSystem=strict"),
        "{unit}"
    );
    Ok(())
}

/// The gate while nothing of `vm`'s node is admitted: a block lock, logind's no to ops, and
/// ops' `systemctl reboot` refused with the machine still on the same boot.
pub async fn assert_gate_refuses(vm: &Vm) -> anyhow::Result<()> {
    ops_can_reboot(vm, "the gate to leave ops no reboot", "no").await?;
    let locks = support::nodeward_locks(vm).await?;
    assert!(locks.iter().any(|l| l.contains("block")), "{locks:?}");
    let boot = vm.boot_id().await?;
    let refused = vm.exec("runuser -u ops -- systemctl reboot").await?;
    assert!(
        refused.code != 0 && !refused.stderr.is_empty(),
        "the operator's reboot was not refused: {refused:?}"
    );
    assert_eq!(vm.boot_id().await?, boot, "no reboot happened");
    Ok(())
}

/// A maintenance of the node admitted (a drain that holds until deleted) opens the gate to
/// ops; deleted, the gate closes again and the node is back in service.
pub async fn assert_gate_opens_while_admitted(lab: &Lab, vm: &Vm) -> anyhow::Result<()> {
    let node = &vm.name;
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    let name = format!("{node}-host-mode-drain");
    let spec = MaintenanceSpec {
        node,
        reason: "Manual",
        action: "DrainOnly",
    };
    lab.create_maintenance(&name, spec).await?;
    wait::until(&maintenances, &name, "drained (Acting)", REBOOT, |m| {
        m.and_then(|m| m.status.as_ref())
            .is_some_and(|s| s.phase == MaintenancePhase::Acting)
    })
    .await?;
    ops_can_reboot(vm, "the gate to open", "yes").await?;
    wait::deleted(&maintenances, &name, REBOOT).await?;
    ops_can_reboot(vm, "the gate to close", "no").await?;
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let spec = nodes.get(node).await?.spec.unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true), "uncordoned");
    Ok(())
}
