//! A rolling reboot by NodeMaintenance across the lab's VMs at the chart's default
//! `maxConcurrent: 1`, one of them with its agent in host mode: each VM really reboots, never
//! two at once, the health gate waits for the real kubelet's Ready, and all of them succeed.
//! The DaemonSet agents reboot by running `systemctl reboot` on the host and the host-mode one
//! by sending SIGRTMIN+5 to the host's PID 1 (kured's `--reboot-method command|signal`).
//! Before the rollout the host-mode VM shows its agent's health and reboot gate (`host.rs`),
//! and after its reboot the gate is back. The rollout is also a patch rollout: a policy's apt
//! update runs on each VM after its drain and asks for the reboot (`patching.rs`), and each
//! maintenance records the package's version before and after, as the inventory read them.

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
    api::ListParams,
    runtime::{WatchStreamExt, watcher},
};
use nodeward_api::{MaintenancePhase, NodeMaintenance, report::AgentMode};
use nodeward_e2e::{fixtures::MaintenanceSpec, history, wait};

use crate::{
    host, patching,
    support::{HostCredential, Lab, REBOOT},
};

#[tokio::test]
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
    let ours = names.clone();
    let history = history::watch_where(&lab.client, move |m| ours.contains(&m.name_any()), "");
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    let became_ready = ready_transitions(&lab.client);
    patching::publish_v2_to_every_vm(&lab).await?;
    let mut before = Vec::new();
    for vm in lab.lab.vms() {
        before.push(vm.boot_id().await?);
    }
    let started = Instant::now();
    for (node, name) in lab.lab.nodes.iter().zip(&names) {
        let spec = MaintenanceSpec {
            node,
            reason: "Reboot",
            action: "Reboot",
        };
        lab.create_maintenance(name, spec).await?;
    }
    let per_node_limit = REBOOT * (names.len() as u32);
    let mut finished = Vec::new();
    for name in &names {
        let done = wait::until(
            &maintenances,
            name,
            "the maintenance to succeed",
            per_node_limit,
            |m| {
                m.and_then(|m| m.status.as_ref())
                    .is_some_and(|s| s.phase.is_finished())
            },
        )
        .await?
        .context("maintenance")?;
        let status = done.status.clone().unwrap_or_default();
        assert_eq!(
            status.phase,
            MaintenancePhase::Succeeded,
            "{name}: {:?}",
            status.message
        );
        finished.push(done);
    }
    let wall = started.elapsed();

    // Each VM really rebooted: a new boot id, and it has been up only since.
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let mut per_node = Vec::new();
    let vms = lab.lab.vms();
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

    // The host-mode agent closed its gate again on the new boot.
    host::assert_gate_refuses(&host_mode).await?;

    // Never two disrupted at once, in everything the API server showed.
    let seen = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        seen.max_active, 1,
        "more than one maintenance admitted at once"
    );
    per_node.sort_by(f64::total_cmp);
    let median = per_node[per_node.len() / 2];
    let ideal = median * per_node.len() as f64;
    println!(
        "rolling reboot of {} VMs: {:.0} s wall, per node (Admitted -> Succeeded) {per_node:.0?} s, ideal {ideal:.0} s, ratio {:.2}",
        per_node.len(),
        wall.as_secs_f64(),
        wall.as_secs_f64() / ideal
    );
    for name in &names {
        wait::deleted(&maintenances, name, REBOOT).await?;
    }
    patching::restore_apt(&lab).await
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

/// Each VM rebooted the way its agent was configured to: the chart's DaemonSet by command, the
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

    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(lab.client.clone(), "default");
    for (vm, name) in lab.lab.vms().iter().zip(names) {
        let acting = events
            .list(&ListParams::default().fields(&format!("regarding.name={name}")))
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Acting"))
            .with_context(|| format!("{name}: an Acting Event"))?;
        let note = acting.note.unwrap_or_default();
        let expected = if vm.name == host_mode {
            "Reboot by signal 39 to the host's PID 1"
        } else {
            "Reboot by running \"/bin/systemctl reboot\" on the host"
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
