//! A rolling reboot by NodeMaintenance across the lab's VMs at the chart's default
//! `maxConcurrent: 1`, one of them with its agent in host mode: each VM really reboots, never
//! two at once, the health gate waits for the real kubelet's Ready, and all of them succeed.
//! The DaemonSet agents reboot through logind (the chart's default) and the host-mode one by
//! sending SIGRTMIN+5 to the host's PID 1 (kured's `--reboot-method signal`).
//! Before the rollout the host-mode VM shows its agent's health and reboot gate (`host.rs`),
//! and after its reboot the gate is back. The rollout is also a patch rollout: a policy's apt
//! update runs on each VM after its drain and asks for the reboot (`patching.rs`), and each
//! maintenance records the package's version before and after, as the inventory read them.
//! Its first version is broken: the canary VM takes it, fails its health gate, is rolled back
//! (apt installs the version before again, the VM reboots into it and passes the gate) and
//! halts the policy while the other VMs wait undrained; a good version and `kubectl nodeward
//! resume` then let the rollout complete, canary first again.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Instant,
};

use anyhow::Context;
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use nodeward_api::{
    MaintenancePhase, NodeMaintenance, conditions::policy as policy_conditions, policy::Progress,
    report::AgentMode,
};
use nodeward_e2e::{fixtures::MaintenanceSpec, history, wait};

use crate::{
    host, patching,
    support::{HostCredential, Lab, REBOOT},
};

#[tokio::test]
#[ignore = "out of ./tests/run for its time: 2,228 s in the last dev check, which would take the run past CI's limit (BENCHMARKS.md, \"A cold ./tests/run\"); run with --ignored rolling::"]
async fn a_rolling_reboot_reboots_every_vm_one_at_a_time_and_a_host_mode_gate_only_when_admitted()
-> anyhow::Result<()> {
    let lab = Lab::get().await?;
    // A mixed fleet: the last VM's agent runs in host mode (with its reboot gate), the others'
    // as the chart's DaemonSet pods.
    let host_mode = lab.lab.vms().pop().context("a VM")?;
    host::let_an_operator_reboot(&host_mode).await?;
    let report = lab.host_mode(&host_mode, HostCredential::NodeToken).await?;
    host::assert_no_false_findings(&host_mode, &report).await?;
    host::assert_gate_refuses(&host_mode).await?;
    host::assert_gate_opens_while_admitted(&lab, &host_mode).await?;

    let names: Vec<String> = lab.lab.nodes.iter().map(|n| format!("roll-{n}")).collect();
    let canary = lab.lab.nodes.first().context("a node")?.clone();
    let broken = format!("roll-{canary}-broken");
    let mut ours = names.clone();
    ours.push(broken.clone());
    let history = history::watch_where(&lab.client, move |m| ours.contains(&m.name_any()), "");
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    let became_ready = ready_transitions(&lab.client);
    let versions = patching::publish_broken_v2_to_every_vm(&lab).await?;
    let vms = lab.lab.vms();
    let mut before = Vec::new();
    for vm in &vms {
        before.push(vm.boot_id().await?);
    }
    let started = Instant::now();
    canary_fails_and_halts_the_rollout(&lab, &broken, &names, &before[0]).await?;
    before[0] = vms[0].boot_id().await?;

    // A good version, the policy resumed: the rollout completes, canary first again.
    patching::publish_good_v3_and_resume(&lab, &versions).await?;
    let resumed = Instant::now();
    lab.create_maintenance(&names[0], planned(&canary)).await?;
    let per_node_limit = REBOOT * (names.len() as u32);
    let mut finished_ones = Vec::new();
    for name in &names {
        finished_ones.push(patching::succeeded(&lab, name, per_node_limit).await?);
    }
    let finished = finished_ones;
    let rollout = resumed.elapsed();
    let wall = started.elapsed();

    // Each VM really rebooted: a new boot id, and it has been up only since.
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let mut per_node = Vec::new();
    for (((vm, boot), done), node) in vms.iter().zip(&before).zip(&finished).zip(&lab.lab.nodes) {
        let now = vm.boot_id().await?;
        assert_ne!(&now, boot, "{} did not reboot", vm.name);
        patching::assert_patched(vm, done).await?;
        patching::assert_versions_recorded(&lab, vm, node, done).await?;
        let uptime: f64 = vm.run("cut -d' ' -f1 /proc/uptime").await?.trim().parse()?;
        assert!(
            uptime < wall.as_secs_f64(),
            "{} up {uptime} s, longer than the rollout",
            vm.name
        );
        let status = done.status.clone().unwrap_or_default();
        assert_rebooted_from_the_boot_before(vm, boot, &status).await?;
        // The health gate waited for the real kubelet: Succeeded after the node became Ready
        // again on its new boot.
        let node = nodes.get(&vm.name).await?;
        let ready_since = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.last_transition_time)
            .context("Ready's transition time")?;
        let at = |phase: MaintenancePhase| {
            status
                .history
                .iter()
                .find(|h| h.phase == phase)
                .map(|h| h.time.0)
        };
        let admitted = at(MaintenancePhase::Admitted).context("admitted")?;
        let succeeded = at(MaintenancePhase::Succeeded).context("succeeded")?;
        // Ready again before Succeeded: the Ready now is older, or (when the kubelet's Ready
        // went and came back after the maintenance ended) one seen during it was.
        let seen = became_ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&vm.name)
            .cloned()
            .unwrap_or_default();
        assert!(
            ready_since.0 <= succeeded || seen.iter().any(|t| (admitted..=succeeded).contains(t)),
            "{}: Succeeded at {succeeded} before the node was Ready again (Ready since \
             {ready_since:?}; Ready seen to begin at {seen:?})",
            vm.name
        );
        assert!(
            at(MaintenancePhase::Verifying).is_some(),
            "{}: verified after the boot",
            vm.name
        );
        per_node.push(succeeded.duration_since(admitted).as_secs_f64());
        println!("{}: {}", vm.name, phase_times(&status));
    }

    rebooted_by_its_own_method(&lab, &names, &host_mode.name).await?;

    // All at the new version, in the policy's progress and its condition.
    let all = Progress {
        updated: i32::try_from(names.len())?,
        ..Progress::default()
    };
    let said = patching::progress_shows(&lab, all, true).await?;
    assert_eq!(
        said,
        format!("all {} matched nodes are updated", names.len())
    );

    // The host-mode agent closed its gate again on the new boot.
    host::assert_gate_refuses(&host_mode).await?;

    // Never two disrupted at once, in everything the API server showed.
    let seen = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        seen.max_active, 1,
        "more than one maintenance admitted at once"
    );
    per_node.sort_by(f64::total_cmp);
    // The ideal: the nodes' own times one after another, nothing between them.
    let ideal: f64 = per_node.iter().sum();
    println!(
        "rolling reboot of {} VMs after the resume: {:.0} s wall, per node (Admitted -> Succeeded) {per_node:.0?} s, ideal {ideal:.0} s, ratio {:.2}",
        per_node.len(),
        rollout.as_secs_f64(),
        rollout.as_secs_f64() / ideal
    );
    for name in names.iter().chain([&broken]) {
        wait::deleted(&maintenances, name, REBOOT).await?;
    }
    patching::restore_apt(&lab).await
}

/// A planned reboot of `node`.
fn planned(node: &str) -> MaintenanceSpec<'_> {
    MaintenanceSpec {
        node,
        reason: "Reboot",
        action: "Reboot",
    }
}

/// The canary (`broken`, the first planned reboot admitted) takes the broken version, fails its
/// gate, is rolled back and halts the rollout; the others (`names` but the first, created once
/// the canary is admitted) wait, never drained. `before` is the canary's boot before.
async fn canary_fails_and_halts_the_rollout(
    lab: &Lab,
    broken: &str,
    names: &[String],
    before: &str,
) -> anyhow::Result<()> {
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    let canary = lab.lab.nodes.first().context("a node")?;
    lab.create_maintenance(broken, planned(canary)).await?;
    wait::until(
        &maintenances,
        broken,
        "the canary's admission",
        REBOOT,
        |m| {
            m.and_then(|m| m.status.as_ref())
                .is_some_and(|s| s.phase != MaintenancePhase::Pending)
        },
    )
    .await?;
    for (node, name) in lab.lab.nodes.iter().zip(names).skip(1) {
        lab.create_maintenance(name, planned(node)).await?;
    }
    let failed = patching::finished(lab, broken, REBOOT * 2).await?;
    let status = failed.status.clone().unwrap_or_default();
    println!("{broken}: {}", phase_times(&status));
    let vm = lab.lab.vms().into_iter().next().context("a VM")?;
    patching::assert_rolled_back(&vm, &failed, before).await?;
    assert_halted_with_the_rest_waiting(lab, &failed, &names[1..]).await
}

/// The canary's failure (`failed`) halted the policy, its condition naming the node and why;
/// the maintenances of the rest (`waiting`) are still Pending and their nodes in service.
/// Prints how long the halt took after the failure.
async fn assert_halted_with_the_rest_waiting(
    lab: &Lab,
    failed: &NodeMaintenance,
    waiting: &[String],
) -> anyhow::Result<()> {
    let policies: Api<nodeward_api::DisruptionPolicy> = Api::all(lab.client.clone());
    let halted = |p: Option<&nodeward_api::DisruptionPolicy>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == policy_conditions::HALTED && c.status == "True")
            })
            .cloned()
    };
    let policy = wait::until(
        &policies,
        patching::POLICY,
        "the policy's halt",
        REBOOT,
        |p| halted(p).is_some(),
    )
    .await?;
    let condition = halted(policy.as_ref()).context("the Halted condition")?;
    let node = &failed.spec.node_name;
    assert!(
        condition.message.contains(node.as_str()) && condition.message.contains("RolledBack"),
        "{}",
        condition.message
    );
    let failed_at = failed
        .status
        .as_ref()
        .and_then(|s| s.finished_at.clone())
        .context("finishedAt")?;
    println!(
        "canary failure to the policy's Halted condition: {:.1} s (condition times are whole seconds)",
        condition
            .last_transition_time
            .0
            .duration_since(failed_at.0)
            .as_secs_f64()
    );
    // The progress: the canary failed, the rest wait.
    let progress = Progress {
        pending: i32::try_from(waiting.len())?,
        failed: 1,
        failed_nodes: vec![node.clone()],
        ..Progress::default()
    };
    let said = patching::progress_shows(lab, progress, false).await?;
    assert!(said.contains(&format!("({node})")), "{said}");
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    let nodes: Api<Node> = Api::all(lab.client.clone());
    for name in waiting {
        let m = maintenances.get(name).await?;
        assert_eq!(m.phase(), MaintenancePhase::Pending, "{name}");
        let node = nodes.get(&m.spec.node_name).await?;
        assert_ne!(
            node.spec.and_then(|s| s.unschedulable),
            Some(true),
            "{}: cordoned while the rollout is halted",
            m.spec.node_name
        );
    }
    Ok(())
}

/// The maintenance recorded the boot it rebooted from: the one before this one, in the VM's
/// journal. That is the boot seen before the rollout (`seen_before`) unless the guest's kernel
/// crashed and restarted in between, as emulated ones rarely do: said, not failed, as it is not
/// nodeward's doing.
async fn assert_rebooted_from_the_boot_before(
    vm: &nodeward_e2e::nodelab::Vm,
    seen_before: &str,
    status: &nodeward_api::maintenance::NodeMaintenanceStatus,
) -> anyhow::Result<()> {
    let previous = previous_boot(vm).await?;
    assert_eq!(
        status.boot_id.as_deref().map(without_dashes),
        Some(previous.clone()),
        "{}: the boot it rebooted from",
        vm.name
    );
    if previous != without_dashes(seen_before) {
        println!(
            "{}: booted more than once during the rollout (before it: {seen_before}; see its console log)",
            vm.name
        );
    }
    Ok(())
}

/// The id of the boot before the current one of `vm`, from its (persistent) journal, without
/// dashes as the journal writes it.
async fn previous_boot(vm: &nodeward_e2e::nodelab::Vm) -> anyhow::Result<String> {
    let boots = vm.run("journalctl --list-boots --no-pager --quiet").await?;
    boots
        .lines()
        .find_map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                ["-1", id, ..] => Some(without_dashes(id)),
                _ => None,
            },
        )
        .with_context(|| format!("{}: no boot before this one in {boots:?}", vm.name))
}

fn without_dashes(id: &str) -> String {
    id.replace('-', "")
}

/// When each node's Ready condition became True, for every such change a watch of the nodes
/// sees from now on.
fn ready_transitions(client: &kube::Client) -> Arc<Mutex<BTreeMap<String, BTreeSet<Timestamp>>>> {
    let seen: Arc<Mutex<BTreeMap<String, BTreeSet<Timestamp>>>> = Arc::default();
    let recorded = seen.clone();
    tokio::spawn(
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .for_each(move |node| {
                let ready = node.ok().and_then(|node| {
                    let since = node
                        .status
                        .as_ref()?
                        .conditions
                        .as_ref()?
                        .iter()
                        .find(|c| c.type_ == "Ready" && c.status == "True")?
                        .last_transition_time
                        .clone()?;
                    Some((node.name_any(), since.0))
                });
                if let Some((name, since)) = ready {
                    let mut seen = recorded.lock().unwrap_or_else(|p| p.into_inner());
                    seen.entry(name).or_default().insert(since);
                }
                futures::future::ready(())
            }),
    );
    seen
}

/// Each VM rebooted the way its agent was configured to: the chart's DaemonSet through logind, the
/// host-mode agent (on `host_mode`, its report says so) by signal.
async fn rebooted_by_its_own_method(
    lab: &Lab,
    names: &[String],
    host_mode: &str,
) -> anyhow::Result<()> {
    let report = lab.report(host_mode).await?.status.unwrap_or_default();
    assert_eq!(
        report.mode,
        Some(AgentMode::Host),
        "{host_mode} was rebooted by its host-mode agent"
    );

    for (vm, name) in lab.lab.vms().iter().zip(names) {
        let note = crate::stories::acting_note(&lab.client, name).await?;
        let expected = if vm.name == host_mode {
            "Reboot by signal 39 to the host's PID 1"
        } else {
            "Reboot through logind"
        };
        assert!(
            note.starts_with(expected),
            "{name}: how it rebooted: {note:?}, expected {expected:?}"
        );
    }

    Ok(())
}

/// Where a maintenance's time went, phase by phase (the pace of the VMs, not an assertion).
fn phase_times(status: &nodeward_api::maintenance::NodeMaintenanceStatus) -> String {
    let phases: Vec<String> = status
        .history
        .windows(2)
        .map(|w| {
            let took = w[1].time.0.duration_since(w[0].time.0).as_secs_f64();
            format!("{:?} {took:.0} s", w[0].phase)
        })
        .collect();
    phases.join(", ")
}
