//! Patching on real nodes with their own apt and dpkg. A package built here with `dpkg-deb` is
//! installed at version 1 on every VM and version 2 (whose maintainer script asks for a reboot
//! the Debian way, `/var/run/reboot-required`) published in a file repository in each VM; the
//! rolling reboot (`rolling.rs`) runs under a policy with `update: {preset: Apt}`, so each VM
//! runs the real `apt-get update && apt-get dist-upgrade` on its host after its drain, reboots
//! because the update asked for it, and ends with version 2 and the run in its status (one
//! rollout of the three VMs proves both). Here: a VM with nothing new needs no reboot and gets
//! none; an agent restarted mid-update neither cuts it short nor runs it twice. Updates that
//! fail (a program the host lacks among them) are in `host_steps.rs`.

use std::{path::Path, process::Command};

use anyhow::{Context, bail};
use kube::{Api, ResourceExt};
use nodeward_api::{
    DisruptionPolicy, MaintenancePhase, NodeMaintenance,
    conditions::policy as policy_conditions,
    policy::Progress,
    update::{HostRunResult, HostStep},
};
use nodeward_e2e::{nodelab::Vm, wait};
use serde_json::json;

use crate::support::{Lab, REBOOT, TEST_LABEL};

pub(crate) const PACKAGE: &str = "nodeward-lab-patch";
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

/// What a version of `PACKAGE` does once installed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Plain,
    /// Its postinst creates `/var/run/reboot-required`, as Debian's kernel and libc packages do.
    AsksReboot,
    /// It asks for the reboot and breaks the node on the next boot: a unit it ships (and
    /// enables) logs the kernel's words for a hung containerd, which the agent's default rules
    /// turn into `KernelDeadlock`, which the health gate refuses. Its version before, installed
    /// again, removes the unit.
    Broken,
}

/// The unit a broken version ships.
const BROKEN_UNIT: &str = "nodeward-lab-broken.service";

/// Builds `PACKAGE` at `version` with `dpkg-deb`.
pub(crate) fn build_deb(dir: &Path, version: &str, kind: Kind) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::PermissionsExt;
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
    if kind != Kind::Plain {
        let postinst = control.join("postinst");
        std::fs::write(
            &postinst,
            "#!/bin/sh\nset -e\necho \"*** System restart required ***\" >/var/run/reboot-required\n",
        )?;
        std::fs::set_permissions(&postinst, std::fs::Permissions::from_mode(0o755))?;
    }
    if kind == Kind::Broken {
        let units = root.join("usr/lib/systemd/system");
        std::fs::create_dir_all(&units)?;
        std::fs::write(
            units.join(BROKEN_UNIT),
            "[Unit]\nDescription=nodeward lab: a broken update\n[Service]\nType=oneshot\n\
             ExecStart=/bin/sh -c 'echo \"<3>INFO: task containerd:1 blocked for more than 120 seconds.\" >/dev/kmsg'\n",
        )?;
        let wants = root.join("etc/systemd/system/multi-user.target.wants");
        std::fs::create_dir_all(&wants)?;
        std::os::unix::fs::symlink(
            format!("/usr/lib/systemd/system/{BROKEN_UNIT}"),
            wants.join(BROKEN_UNIT),
        )?;
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

/// One version of `PACKAGE` in a repository.
pub(crate) struct Published {
    pub version: &'static str,
    pub deb: Vec<u8>,
}

/// The repository's `Packages` index for `debs`.
fn packages_index(debs: &[&Published]) -> String {
    use sha2::Digest;
    let entries: Vec<String> = debs
        .iter()
        .map(|p| {
            let sha256 = format!("{:x}", sha2::Sha256::digest(&p.deb));
            format!(
                "Package: {PACKAGE}\nVersion: {}\nArchitecture: all\nMaintainer: nodeward tests <tests@nodeward.invalid>\nFilename: ./{PACKAGE}_{}_all.deb\nSize: {}\nSHA256: {sha256}\nDescription: a package the node lab patches\n",
                p.version,
                p.version,
                p.deb.len()
            )
        })
        .collect();
    entries.join("\n")
}

/// The version of `PACKAGE` dpkg has installed in `vm`.
pub(crate) async fn installed(vm: &Vm) -> anyhow::Result<String> {
    Ok(vm
        .run(&format!("dpkg-query -W -f='${{Version}}' {PACKAGE}"))
        .await?
        .trim()
        .to_owned())
}

/// `installed` installed in `vm`, the repository (its only source) empty.
pub(crate) async fn prepare(vm: &Vm, installed: &Published) -> anyhow::Result<()> {
    vm.run(&format!(
        "{APT_RESTORED}
        mkdir -p {SAVED_SOURCES} {REPO}
        cp -a /etc/apt/sources.list /etc/apt/sources.list.d {SAVED_SOURCES}/ 2>/dev/null || true
        rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*
        echo 'deb [trusted=yes] file:{REPO} ./' >/etc/apt/sources.list.d/nodeward-lab.list"
    ))
    .await?;
    vm.write_file("/tmp/nodeward-lab.deb", &installed.deb)
        .await?;
    vm.run("dpkg -i /tmp/nodeward-lab.deb >/dev/null && rm -f /tmp/nodeward-lab.deb /var/run/reboot-required")
        .await?;
    Ok(())
}

/// `vm`'s repository holds `debs` and nothing else, and its apt lists know them (so the
/// inventory counts the pending update before the rollout).
pub(crate) async fn publish(vm: &Vm, debs: &[&Published]) -> anyhow::Result<()> {
    vm.run(&format!("rm -f {REPO}/*")).await?;
    for p in debs {
        vm.write_file(&format!("{REPO}/{PACKAGE}_{}_all.deb", p.version), &p.deb)
            .await?;
    }
    vm.write_file(&format!("{REPO}/Packages"), packages_index(debs).as_bytes())
        .await?;
    vm.run("apt-get update -qq").await?;
    Ok(())
}

/// Waits for `name` to finish, within `limit`; returns it.
pub async fn finished(
    lab: &Lab,
    name: &str,
    limit: std::time::Duration,
) -> anyhow::Result<NodeMaintenance> {
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    wait::until(
        &maintenances,
        name,
        "the maintenance to finish",
        limit,
        |m| {
            m.and_then(|m| m.status.as_ref())
                .is_some_and(|s| s.phase.is_finished())
        },
    )
    .await?
    .context("the maintenance")
}

/// Waits for `name` to finish, within `limit`, and fails unless it Succeeded; returns it.
pub async fn succeeded(
    lab: &Lab,
    name: &str,
    limit: std::time::Duration,
) -> anyhow::Result<NodeMaintenance> {
    let done = finished(lab, name, limit).await?;
    let status = done.status.clone().unwrap_or_default();
    anyhow::ensure!(
        status.phase == MaintenancePhase::Succeeded,
        "{name} ended {:?}: {:?} ({})",
        status.phase,
        status.message,
        history_line(&status)
    );
    Ok(done)
}

fn update_run(m: &NodeMaintenance) -> anyhow::Result<nodeward_api::update::HostRun> {
    m.status
        .as_ref()
        .and_then(|s| s.host_runs.iter().find(|r| r.step == HostStep::Update))
        .cloned()
        .with_context(|| format!("{}: no update run in its status", m.name_any()))
}

/// The versions of a rollout: 1 installed on every VM, a broken 2 (which the canary fails
/// and rolls back), a good 3.
pub struct Versions {
    v1: Published,
    v3: Published,
}

/// The policy the rollout runs under.
pub const POLICY: &str = "lab-patch";

/// Every VM at version 1 with a broken version 2 published (beside 1, which an Apt rollback
/// installs again), and a policy that patches with apt: one canary first, a rollback, a failure
/// budget of one, and a health gate that holds long enough for the agent to read the broken
/// boot's kernel log. The rolling reboot (`rolling.rs`) is then a patch rollout whose canary
/// fails; [`publish_good_v3_and_resume`] goes on. [`restore_apt`] undoes both; after a
/// failure, the next test's reset does.
pub async fn publish_broken_v2_to_every_vm(lab: &Lab) -> anyhow::Result<Versions> {
    let dir = nodeward_e2e::scratch::dir(&format!("lab-patching-{}", std::process::id()))?;
    let v1 = Published {
        version: "1",
        deb: build_deb(&dir, "1", Kind::Plain)?,
    };
    let v2 = Published {
        version: "2",
        deb: build_deb(&dir, "2", Kind::Broken)?,
    };
    let v3 = Published {
        version: "3",
        deb: build_deb(&dir, "3", Kind::AsksReboot)?,
    };
    // The VMs side by side: each one's apt and dpkg take tens of seconds under emulation.
    futures::future::try_join_all(lab.lab.vms().into_iter().map(|vm| {
        let (v1, v2) = (&v1, &v2);
        async move {
            prepare(&vm, v1).await?;
            publish(&vm, &[v1, v2]).await?;
            anyhow::ensure!(
                installed(&vm).await? == "1",
                "{}: not at version 1",
                vm.name
            );
            anyhow::Ok(())
        }
    }))
    .await?;
    lab.apply(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": POLICY, "labels": {TEST_LABEL: "true"}},
        "spec": {
            // The lab's VMs only: a control plane the lab shares (a run by hand) has other
            // nodes, which the policy's progress would count.
            "nodeSelector": {"matchExpressions": [
                {"key": "nodelab.nodeward.io/vm", "operator": "In", "values": lab.lab.nodes},
            ]},
            "maxConcurrent": 1,
            "update": {"preset": "Apt", "timeout": "10m", "rollback": {"preset": "Apt"}},
            "canary": {"nodes": 1},
            "failureBudget": {"maxFailures": 1},
            "healthGate": {"for": "30s", "timeout": "100s"},
        },
    }))
    .await?;
    Ok(Versions { v1, v3 })
}

/// The good version 3 published in place of 2, the policy's gate back to the default, and the
/// halted policy resumed with the operator's tool (`kubectl nodeward resume`).
pub async fn publish_good_v3_and_resume(lab: &Lab, versions: &Versions) -> anyhow::Result<()> {
    futures::future::try_join_all(
        lab.lab
            .vms()
            .into_iter()
            .map(|vm| async move { publish(&vm, &[&versions.v1, &versions.v3]).await }),
    )
    .await?;
    let policies: Api<nodeward_api::DisruptionPolicy> = Api::all(lab.client.clone());
    let patch = kube::api::Patch::Merge(json!({"spec": {"healthGate": null}}));
    policies.patch(POLICY, &Default::default(), &patch).await?;
    let cli = tokio::process::Command::new(nodeward_e2e::daemon::cli_binary())
        .arg("--kubeconfig")
        .arg(&nodeward_e2e::controlplane::shared().kubeconfig)
        .args(["resume", POLICY])
        .output()
        .await?;
    let said = String::from_utf8_lossy(&cli.stdout).into_owned();
    anyhow::ensure!(
        cli.status.success()
            && said.contains("failures its failureBudget counted until now are forgiven"),
        "kubectl nodeward resume {POLICY}: {said}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    Ok(())
}

/// Waits until the policy's progress is `expected` and its `Updated` condition says
/// `all_updated`; the condition's message. The counts are over the lab's VMs (the policy
/// selects them) and read from the maintenances and what each node's agent reports (a
/// reboot required, updates pending in its inventory).
pub async fn progress_shows(
    lab: &Lab,
    expected: Progress,
    all_updated: bool,
) -> anyhow::Result<String> {
    let policies: Api<DisruptionPolicy> = Api::all(lab.client.clone());
    let status = if all_updated { "True" } else { "False" };
    let updated = |p: &DisruptionPolicy| {
        let s = p.status.as_ref()?;
        let condition = s
            .conditions
            .iter()
            .find(|c| c.type_ == policy_conditions::UPDATED && c.status == status)?;
        (s.progress.as_ref() == Some(&expected)).then(|| condition.message.clone())
    };
    let what = format!("progress {expected:?} and Updated={status}");
    match wait::until_some(&policies, POLICY, &what, REBOOT, updated).await {
        Ok(message) => Ok(message),
        Err(e) => {
            let last = policies.get(POLICY).await?.status.unwrap_or_default();
            bail!(
                "{e}: progress {:?}, conditions {:?}",
                last.progress,
                last.conditions
            )
        }
    }
}

/// `failed` is the canary's maintenance on `vm`, which booted `before` the rollout: the broken
/// version failed the health gate (the kernel's hung containerd, `KernelDeadlock`), apt
/// installed version 1 again, the VM rebooted into it and passed the gate, and the maintenance
/// ended Failed, `RolledBack`: two reboots, the broken unit gone.
pub async fn assert_rolled_back(
    vm: &Vm,
    failed: &NodeMaintenance,
    before: &str,
) -> anyhow::Result<()> {
    let status = failed.status.clone().unwrap_or_default();
    let message = status.message.clone().unwrap_or_default();
    assert_eq!(
        (status.phase, status.reason.as_deref()),
        (MaintenancePhase::Failed, Some("RolledBack")),
        "{message}"
    );
    assert!(
        message.contains("KernelDeadlock") && message.contains("passed its health gate"),
        "{message}"
    );
    let run = |step| {
        status
            .host_runs
            .iter()
            .find(|r| r.step == step)
            .cloned()
            .with_context(|| format!("no {step:?} run: {:?}", status.host_runs))
    };
    let update = run(HostStep::Update)?;
    assert_eq!(
        (update.result, update.reboot),
        (Some(HostRunResult::Succeeded), Some(true)),
        "{update:?}"
    );
    let rollback = run(HostStep::Rollback)?;
    assert_eq!(
        rollback.result,
        Some(HostRunResult::Succeeded),
        "{rollback:?}"
    );
    assert!(
        rollback.command.contains("--allow-downgrades")
            && rollback.command.ends_with(&format!("install {PACKAGE}=1")),
        "{}",
        rollback.command
    );
    let now = vm.boot_id().await?;
    let rolled_back_in = rollback.boot_id.clone().unwrap_or_default();
    assert!(
        rolled_back_in != before && rolled_back_in != now,
        "{}: rolled back on the updated boot ({rolled_back_in}), between {before} and {now}",
        vm.name
    );
    let verifying = status
        .history
        .iter()
        .filter(|h| h.phase == MaintenancePhase::Verifying)
        .count();
    assert_eq!(
        verifying,
        2,
        "judged on both boots: {}",
        history_line(&status)
    );
    let after = status.versions_after.clone().context("no versions after")?;
    assert_eq!(after.version_of(PACKAGE), Some("1"), "{after:?}");
    assert_eq!(
        after.boot_id.as_deref(),
        Some(now.as_str()),
        "read on the last boot"
    );
    assert_eq!(installed(vm).await?, "1", "{}", vm.name);
    let unit = format!("/etc/systemd/system/multi-user.target.wants/{BROKEN_UNIT}");
    assert_eq!(
        vm.run(&format!("test -e {unit} && echo present || echo gone"))
            .await?
            .trim(),
        "gone"
    );
    Ok(())
}

/// `done` patched `vm`: its update ran apt, succeeded, asked for the reboot (the package's
/// maintainer script did), and dpkg has version 3.
pub async fn assert_patched(vm: &Vm, done: &NodeMaintenance) -> anyhow::Result<()> {
    let run = update_run(done)?;
    assert_eq!(run.result, Some(HostRunResult::Succeeded), "{run:?}");
    assert_eq!(run.exit_code, Some(0));
    assert_eq!(run.reboot, Some(true), "the package asked for it: {run:?}");
    let output = run.output.clone().unwrap_or_default();
    assert!(
        output.contains(&format!("Setting up {PACKAGE} (3)")),
        "apt's own words in the status: {output}"
    );
    assert_eq!(installed(vm).await?, "3", "{}", vm.name);
    let took = run
        .finished_at
        .as_ref()
        .map(|end| end.0.duration_since(run.started_at.0));
    println!("{}: apt update in {took:?}", vm.name);
    Ok(())
}

/// `done` recorded what `vm` (node `node`) ran: version 1 with v3 pending before, version 3
/// after, read on the new boot (its kernel and OS as the guest's own tools print them), and
/// the node's NodeReport shows version 3.
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
        "{}: v3 was pending: {before:?}",
        vm.name
    );
    assert_eq!(
        after.version_of(PACKAGE),
        Some("3"),
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
        Some("3"),
        "{node}: {inventory:?}"
    );
    Ok(())
}

/// Every VM's apt as the lab built it, and the patching policy gone (the lab's later tests
/// must not meet its update and canary).
pub async fn restore_apt(lab: &Lab) -> anyhow::Result<()> {
    futures::future::try_join_all(
        lab.lab
            .vms()
            .into_iter()
            .map(|vm| async move { vm.run(APT_RESTORED).await }),
    )
    .await?;
    let policies: Api<nodeward_api::DisruptionPolicy> = Api::all(lab.client.clone());
    wait::deleted(&policies, POLICY, REBOOT).await
}

#[tokio::test]
#[ignore = "out of ./tests/run for its time: the node-lab tests ran past CI's limit (BENCHMARKS.md, \"A cold ./tests/run\"); run with --ignored patching::an_update_with_nothing_new"]
async fn an_update_with_nothing_new_needs_no_reboot() -> anyhow::Result<()> {
    let (lab, node, vm) = Lab::with_node(crate::support::Pick::At(0)).await?;
    let dir = nodeward_e2e::scratch::dir(&format!("lab-patching-{}", std::process::id()))?;
    let v2 = Published {
        version: "2",
        deb: build_deb(&dir, "2", Kind::AsksReboot)?,
    };
    prepare(&vm, &v2).await?;
    publish(&vm, &[&v2]).await?;
    assert_eq!(installed(&vm).await?, "2");
    let boot = vm.boot_id().await?;

    // Nothing is new: apt says so (no sentinel), and the VM is not rebooted.
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    wait::deleted(&maintenances, "patch-again", REBOOT).await?;
    lab.apply(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": "patch-again", "labels": {TEST_LABEL: "true"}},
        "spec": {"nodeName": node, "reason": "Manual", "action": "Reboot",
                 "update": {"preset": "Apt"}},
    }))
    .await?;
    let again = finished(&lab, "patch-again", REBOOT * 3).await?;
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

    lab.settled().await?;
    vm.run(APT_RESTORED).await?;
    Ok(())
}

/// An agent restarted while its update runs: the update is not cut short (its output goes to a
/// file on the host, not to the agent), is not run twice, and the new agent records how it
/// ended, under its first start time. The node was cordoned by an admin before: nodeward
/// records the cordon as not its own, across the restart, and leaves it in place.
#[tokio::test]
async fn an_agent_restarted_during_an_update_waits_for_it_never_runs_it_twice_and_keeps_an_admins_cordon()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::with_node(crate::support::Pick::At(0)).await?;
    let runs = "/var/lib/nodeward-lab-update-runs";
    vm.run(&format!("rm -f {runs} /var/run/reboot-required"))
        .await?;
    let boot = vm.boot_id().await?;
    lab.admin_cordon(&node, true).await?;
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
    let done = finished(&lab, "patch-restart", REBOOT * 3).await?;
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
    // The admin's cordon: not nodeward's, so still there; nodeward's own taint is gone.
    assert_eq!(status.cordoned_by_nodeward, Some(false));
    let spec = Api::<k8s_openapi::api::core::v1::Node>::all(lab.client.clone())
        .get(&node)
        .await?
        .spec
        .unwrap_or_default();
    assert_eq!(spec.unschedulable, Some(true), "the admin's cordon is gone");
    let taints: Vec<String> = spec.taints.into_iter().flatten().map(|t| t.key).collect();
    assert!(
        !taints.iter().any(|k| k.starts_with("nodeward.io/")),
        "nodeward's taint is left: {taints:?}"
    );
    lab.admin_cordon(&node, false).await?;
    vm.run(&format!("rm -f {runs}")).await?;
    Ok(())
}

pub(crate) fn history_line(status: &nodeward_api::NodeMaintenanceStatus) -> String {
    status
        .history
        .iter()
        .map(|h| format!("{:?} {}", h.phase, h.time.0))
        .collect::<Vec<_>>()
        .join(", ")
}
