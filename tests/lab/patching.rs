//! Patching on real nodes with their own apt and dpkg. A package built here with `dpkg-deb` is
//! installed at version 1 on every VM and version 2 (whose maintainer script asks for a reboot
//! the Debian way, `/var/run/reboot-required`) published in a file repository in each VM; the
//! rolling reboot (`rolling.rs`) runs under a policy with `update: {preset: Apt}`, so each VM
//! runs the real `apt-get update && apt-get dist-upgrade` on its host after its drain, reboots
//! because the update asked for it, and ends with version 2 and the run in its status (one
//! rollout of the three VMs proves both). Here: a VM with nothing new needs no reboot and gets
//! none; an update program the host does not have fails the maintenance with its name and
//! leaves the node in service; an agent restarted mid-update neither cuts it short nor runs it
//! twice.

use std::{path::Path, process::Command};

use anyhow::{Context, bail};
use kube::{Api, ResourceExt};
use nodeward_api::{
    MaintenancePhase, NodeMaintenance,
    update::{HostRunResult, HostStep},
};
use nodeward_e2e::{nodelab::Vm, wait};
use serde_json::json;

use crate::support::{Lab, REBOOT, TEST_LABEL};

const PACKAGE: &str = "nodeward-lab-patch";
/// The file repository in each VM (`deb [trusted=yes] file:REPO ./`).
pub const REPO: &str = "/srv/nodeward-lab-repo";
/// Where the VM's own apt sources wait while the test's repository is the only one.
pub const SAVED_SOURCES: &str = "/etc/apt/nodeward-lab-saved";

/// Puts a VM's apt back as the lab built it (a test that failed half-way leaves it changed).
pub const APT_RESTORED: &str = "if [ -d /etc/apt/nodeward-lab-saved ]; then
      rm -f /etc/apt/sources.list.d/nodeward-lab.list
      cp -a /etc/apt/nodeward-lab-saved/. /etc/apt/ && rm -rf /etc/apt/nodeward-lab-saved
    fi
    dpkg -s nodeward-lab-patch >/dev/null 2>&1 && dpkg --purge nodeward-lab-patch >/dev/null
    rm -rf /srv/nodeward-lab-repo";

/// Builds `PACKAGE` at `version` with `dpkg-deb`; with `ask_reboot` its postinst creates
/// `/var/run/reboot-required`, as Debian's kernel and libc packages do.
fn build_deb(dir: &Path, version: &str, ask_reboot: bool) -> anyhow::Result<Vec<u8>> {
    let root = dir.join(format!("{PACKAGE}-{version}"));
    let control = root.join("DEBIAN");
    std::fs::create_dir_all(&control)?;
    std::fs::create_dir_all(root.join("usr/share").join(PACKAGE))?;
    std::fs::write(
        root.join("usr/share").join(PACKAGE).join("version"),
        version,
    )?;
    std::fs::write(
        control.join("control"),
        format!(
            "Package: {PACKAGE}\nVersion: {version}\nArchitecture: all\nMaintainer: nodeward tests <tests@nodeward.invalid>\nDescription: a package the node lab patches\n"
        ),
    )?;
    if ask_reboot {
        let postinst = control.join("postinst");
        std::fs::write(
            &postinst,
            "#!/bin/sh\nset -e\necho \"*** System restart required ***\" >/var/run/reboot-required\n",
        )?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&postinst, std::fs::Permissions::from_mode(0o755))?;
    }
    let deb = dir.join(format!("{PACKAGE}_{version}_all.deb"));
    let built = Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zgzip", "--build"])
        .arg(&root)
        .arg(&deb)
        .output()
        .context("running dpkg-deb")?;
    if !built.status.success() {
        bail!("dpkg-deb: {}", String::from_utf8_lossy(&built.stderr));
    }
    Ok(std::fs::read(deb)?)
}

/// The repository's `Packages` index for one package file.
fn packages_index(deb: &[u8], version: &str) -> String {
    use sha2::Digest;
    let sha256 = format!("{:x}", sha2::Sha256::digest(deb));
    format!(
        "Package: {PACKAGE}\nVersion: {version}\nArchitecture: all\nMaintainer: nodeward tests <tests@nodeward.invalid>\nFilename: ./{PACKAGE}_{version}_all.deb\nSize: {}\nSHA256: {sha256}\nDescription: a package the node lab patches\n",
        deb.len()
    )
}

/// The version of `PACKAGE` dpkg has installed in `vm`.
async fn installed(vm: &Vm) -> anyhow::Result<String> {
    Ok(vm
        .run(&format!("dpkg-query -W -f='${{Version}}' {PACKAGE}"))
        .await?
        .trim()
        .to_owned())
}

/// `v1` installed in `vm`, `v2` published in its repository, the repository its only source.
async fn prepare(vm: &Vm, v1: &[u8], v2: &[u8], index: &str) -> anyhow::Result<()> {
    vm.run(&format!(
        "{APT_RESTORED}
        mkdir -p {SAVED_SOURCES} {REPO}
        cp -a /etc/apt/sources.list /etc/apt/sources.list.d {SAVED_SOURCES}/ 2>/dev/null || true
        rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*
        echo 'deb [trusted=yes] file:{REPO} ./' >/etc/apt/sources.list.d/nodeward-lab.list"
    ))
    .await?;
    vm.write_file("/tmp/nodeward-lab-v1.deb", v1).await?;
    vm.run("dpkg -i /tmp/nodeward-lab-v1.deb >/dev/null && rm -f /tmp/nodeward-lab-v1.deb /var/run/reboot-required")
        .await?;
    vm.write_file(&format!("{REPO}/{PACKAGE}_2_all.deb"), v2)
        .await?;
    vm.write_file(&format!("{REPO}/Packages"), index.as_bytes())
        .await?;
    Ok(())
}

/// Waits for `name` to finish; returns it.
async fn finished(lab: &Lab, name: &str) -> anyhow::Result<NodeMaintenance> {
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    wait::until(
        &maintenances,
        name,
        "the maintenance to finish",
        REBOOT * 3,
        |m| {
            m.and_then(|m| m.status.as_ref())
                .is_some_and(|s| s.phase.is_finished())
        },
    )
    .await?
    .context("the maintenance")
}

fn update_run(m: &NodeMaintenance) -> anyhow::Result<nodeward_api::update::HostRun> {
    m.status
        .as_ref()
        .and_then(|s| s.host_runs.iter().find(|r| r.step == HostStep::Update))
        .cloned()
        .with_context(|| format!("{}: no update run in its status", m.name_any()))
}

/// Every VM at version 1 with version 2 published, and a policy that patches with apt: the
/// rolling reboot (`rolling.rs`) is then also a patch rollout ([`restore_apt`] undoes both;
/// after a failure, the next test's reset does).
pub async fn publish_v2_to_every_vm(lab: &Lab) -> anyhow::Result<()> {
    let dir = nodeward_e2e::scratch::dir(&format!("lab-patching-{}", std::process::id()))?;
    let v1 = build_deb(&dir, "1", false)?;
    let v2 = build_deb(&dir, "2", true)?;
    let index = packages_index(&v2, "2");
    for vm in lab.lab.vms() {
        prepare(&vm, &v1, &v2, &index).await?;
        assert_eq!(installed(&vm).await?, "1", "{}", vm.name);
        // The lists know of v2, so the inventory counts one pending update before the rollout.
        vm.run("apt-get update -qq").await?;
    }
    lab.apply(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "lab-patch", "labels": {TEST_LABEL: "true"}},
        "spec": {"maxConcurrent": 1, "update": {"preset": "Apt", "timeout": "10m"}},
    }))
    .await
}

/// `done` patched `vm`: its update ran apt, succeeded, asked for the reboot (the package's
/// maintainer script did), and dpkg has version 2.
pub async fn assert_patched(vm: &Vm, done: &NodeMaintenance) -> anyhow::Result<()> {
    let run = update_run(done)?;
    assert_eq!(run.result, Some(HostRunResult::Succeeded), "{run:?}");
    assert_eq!(run.exit_code, Some(0));
    assert_eq!(run.reboot, Some(true), "the package asked for it: {run:?}");
    let output = run.output.clone().unwrap_or_default();
    assert!(
        output.contains(&format!("Setting up {PACKAGE} (2)")),
        "apt's own words in the status: {output}"
    );
    assert_eq!(installed(vm).await?, "2", "{}", vm.name);
    let took = run
        .finished_at
        .as_ref()
        .map(|end| end.0.duration_since(run.started_at.0));
    println!("{}: apt update in {took:?}", vm.name);
    Ok(())
}

/// `done` recorded what `vm` (node `node`) ran: version 1 with v2 pending before, version 2
/// after, read on the new boot (its kernel and OS as the guest's own tools print them), and
/// the node's NodeReport shows version 2.
pub async fn assert_versions_recorded(
    lab: &Lab,
    vm: &Vm,
    node: &str,
    done: &NodeMaintenance,
) -> anyhow::Result<()> {
    let status = done.status.clone().unwrap_or_default();
    let before = status.versions_before.context("no versions before")?;
    let after = status.versions_after.context("no versions after")?;
    assert_eq!(
        before.version_of(PACKAGE),
        Some("1"),
        "{}: {before:?}",
        vm.name
    );
    assert_eq!(
        before.updates_pending,
        Some(1),
        "{}: v2 was pending: {before:?}",
        vm.name
    );
    assert_eq!(
        after.version_of(PACKAGE),
        Some("2"),
        "{}: {after:?}",
        vm.name
    );
    assert_eq!(after.updates_pending, Some(0), "{}: {after:?}", vm.name);
    let boot = vm.boot_id().await?;
    assert_eq!(
        after.boot_id.as_deref(),
        Some(boot.as_str()),
        "read on the new boot"
    );
    assert_ne!(
        before.boot_id, after.boot_id,
        "{}: before is of the boot before",
        vm.name
    );
    let kernel = vm.run("uname -r").await?;
    assert_eq!(after.kernel.as_deref(), Some(kernel.trim()), "{}", vm.name);
    let os = vm
        .run(". /etc/os-release && printf %s \"$PRETTY_NAME\"")
        .await?;
    assert_eq!(after.os_image.as_deref(), Some(os.trim()), "{}", vm.name);
    assert_eq!(after.package_manager.as_deref(), Some("dpkg"));
    let reports: Api<nodeward_api::NodeReport> = Api::all(lab.client.clone());
    let report = reports.get(node).await?;
    let inventory = report
        .status
        .and_then(|s| s.inventory)
        .with_context(|| format!("{node}: no inventory in its NodeReport"))?;
    assert_eq!(
        inventory.version_of(PACKAGE),
        Some("2"),
        "{node}: {inventory:?}"
    );
    Ok(())
}

/// Every VM's apt as the lab built it, and the patching policy gone (it selects every node:
/// the tests after the lab's share the control plane).
pub async fn restore_apt(lab: &Lab) -> anyhow::Result<()> {
    for vm in lab.lab.vms() {
        vm.run(APT_RESTORED).await?;
    }
    let policies: Api<nodeward_api::DisruptionPolicy> = Api::all(lab.client.clone());
    wait::deleted(&policies, "lab-patch", REBOOT).await
}

#[tokio::test]
async fn an_update_with_nothing_new_needs_no_reboot_and_a_missing_updater_fails_cleanly()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::with_node(crate::support::Pick::At(0)).await?;
    let dir = nodeward_e2e::scratch::dir(&format!("lab-patching-{}", std::process::id()))?;
    let v2 = build_deb(&dir, "2", true)?;
    prepare(&vm, &v2, &v2, &packages_index(&v2, "2")).await?;
    assert_eq!(installed(&vm).await?, "2");
    let boot = vm.boot_id().await?;

    // Nothing is new: apt says so (no sentinel), and the VM is not rebooted.
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    for name in ["patch-again", "patch-missing"] {
        wait::deleted(&maintenances, name, REBOOT).await?;
    }
    lab.apply(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": "patch-again", "labels": {TEST_LABEL: "true"}},
        "spec": {"nodeName": node, "reason": "Manual", "action": "Reboot",
                 "update": {"preset": "Apt"}},
    }))
    .await?;
    let again = finished(&lab, "patch-again").await?;
    let status = again.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        MaintenancePhase::Succeeded,
        "{:?}",
        status.message
    );
    let run = update_run(&again)?;
    assert_eq!(
        (run.result, run.reboot),
        (Some(HostRunResult::Succeeded), Some(false))
    );
    assert!(
        status
            .history
            .iter()
            .any(|h| h.phase == MaintenancePhase::Verifying),
        "the health gate still judged it: {}",
        history_line(&status)
    );
    assert_eq!(vm.boot_id().await?, boot, "rebooted without need");

    // An update program the host lacks: Failed, saying so, the node back in service.
    lab.apply(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": "patch-missing", "labels": {TEST_LABEL: "true"}},
        "spec": {"nodeName": node, "reason": "Manual", "action": "Reboot",
                 "update": {"command": ["/usr/local/bin/no-such-updater", "--all"]}},
    }))
    .await?;
    let missing = finished(&lab, "patch-missing").await?;
    let status = missing.status.clone().unwrap_or_default();
    assert_eq!(status.phase, MaintenancePhase::Failed);
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains("the host has no executable /usr/local/bin/no-such-updater"),
        "{message}"
    );
    assert_eq!(
        update_run(&missing)?.result,
        Some(HostRunResult::NotStarted)
    );
    assert_eq!(vm.boot_id().await?, boot);
    lab.settled().await?;
    vm.run(APT_RESTORED).await?;
    Ok(())
}

/// An agent restarted while its update runs: the update is not cut short (its output goes to a
/// file on the host, not to the agent), is not run twice, and the new agent records how it
/// ended, under its first start time.
#[tokio::test]
async fn an_agent_restarted_during_an_update_waits_for_it_and_never_runs_it_twice()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::with_node(crate::support::Pick::At(0)).await?;
    let runs = "/var/lib/nodeward-lab-update-runs";
    vm.run(&format!("rm -f {runs} /var/run/reboot-required"))
        .await?;
    let boot = vm.boot_id().await?;
    lab.apply(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": "patch-restart", "labels": {TEST_LABEL: "true"}},
        "spec": {"nodeName": node, "reason": "Manual", "action": "Reboot",
                 "update": {"command": ["/bin/sh", "-c",
                     format!("echo run >>{runs}; for i in $(seq 1 40); do echo step $i; sleep 1; done; echo finished")],
                     "timeout": "5m"}},
    }))
    .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    let running = wait::until(
        &maintenances,
        "patch-restart",
        "the update to start",
        REBOOT,
        |m| {
            m.and_then(|m| m.status.as_ref())
                .is_some_and(|s| s.host_runs.iter().any(|r| r.step == HostStep::Update))
        },
    )
    .await?
    .context("the maintenance")?;
    let first = update_run(&running)?;
    assert_eq!(first.result, None, "still running: {first:?}");
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(lab.client.clone(), crate::support::NAMESPACE);
    let agent = crate::support::agent_pod(&lab.client, &node).await?;
    pods.delete(&agent.name_any(), &Default::default()).await?;
    let done = finished(&lab, "patch-restart").await?;
    let status = done.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        MaintenancePhase::Succeeded,
        "{:?}",
        status.message
    );
    let run = update_run(&done)?;
    assert_eq!(run.result, Some(HostRunResult::Succeeded), "{run:?}");
    assert_eq!(run.started_at, first.started_at, "its first start time");
    assert_eq!(run.reboot, Some(false), "no sentinel: no reboot");
    let output = run.output.clone().unwrap_or_default();
    assert!(
        output.ends_with("step 40\nfinished"),
        "the whole run's end: {output}"
    );
    assert_eq!(
        vm.run(&format!("cat {runs}")).await?.trim(),
        "run",
        "run exactly once"
    );
    assert_eq!(vm.boot_id().await?, boot);
    assert_ne!(
        crate::support::agent_pod(&lab.client, &node).await?.uid(),
        agent.uid(),
        "another agent pod finished it"
    );
    vm.run(&format!("rm -f {runs}")).await?;
    Ok(())
}

fn history_line(status: &nodeward_api::NodeMaintenanceStatus) -> String {
    status
        .history
        .iter()
        .map(|h| format!("{:?} {}", h.phase, h.time.0))
        .collect::<Vec<_>>()
        .join(", ")
}
