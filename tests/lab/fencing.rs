//! Fencing on a real node. First the chart's agent as installed, which does not fence: its
//! node, cut off, is never marked out of service. Then the chart's fencing turned on, as a user
//! turns it on (the agent's pod privileged, the watchdog device mounted): the agent feeds the
//! VM's hardware watchdog (an emulated Intel 6300ESB); cut off from the API server and from its
//! peers, it stops, and the watchdog resets the machine. Only then does the coordinator mark
//! the node out of service, and a stateful pod that waits out an unreachable node starts on
//! another one. Turned off again, every agent stops its watchdog before its pod goes.

use std::panic::AssertUnwindSafe;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use nodeward_api::DisruptionPolicy;
use nodeward_e2e::{nodelab::Vm, wait};
use serde_json::json;

use futures::FutureExt;

use crate::{
    release,
    support::{BUSYBOX, FIREWALL_TABLE, Lab, Pick, REBOOT, TEST_LABEL},
};

/// The chart's fencing as a user turns it on (each agent's pod privileged, the node's watchdog
/// device mounted): the watchdog no longer fed 20 s cut off, resetting the machine 30 s later;
/// each agent's Lease renewed every 10 s (`fenceAfter` must be twice that at least).
const CHART_FENCING: [&str; 2] = [
    r#"agent.fencing={"enabled":true,"fenceAfter":"20s","timeout":"30s"}"#,
    r#"agent.config.reporting={"heartbeatInterval":"10s"}"#,
];

/// The `nodeward_fencing` gauge of the agent on `vm`.
async fn fencing_gauge(vm: &Vm) -> anyhow::Result<String> {
    crate::support::agent_gauge(vm, "nodeward_fencing").await
}

/// The unit that keeps a guest cut off across its reset (so that the coordinator's side sees a
/// node that stays down), removed again; what a test that failed half-way leaves is undone by
/// the next one's reset.
pub const CUT_OFF_RESTORED: &str = "if [ -e /etc/systemd/system/nodelab-cut-off.service ]; then
      systemctl disable --now nodelab-cut-off.service
      rm -f /etc/systemd/system/nodelab-cut-off.service /etc/nodelab-cut-off.nft
      systemctl daemon-reload
    fi";

/// The chart's default policy selects every node; while this test runs it leaves the fenced one
/// to the test's policy (whose deadlines are short: a node's deadlines are the longest of the
/// policies selecting it).
fn default_policy_selector(excluded: Option<&str>) -> serde_json::Value {
    match excluded {
        Some(node) => json!({"spec": {"nodeSelector": {"matchExpressions": [
            {"key": "nodelab.nodeward.io/vm", "operator": "NotIn", "values": [node]}]}}}),
        None => json!({"spec": {"nodeSelector": {"matchExpressions": null}}}),
    }
}

/// Gives the chart's default policy its selector back (a test that failed half-way leaves it).
pub async fn restore_default_policy(client: &kube::Client) -> anyhow::Result<()> {
    let policies: Api<DisruptionPolicy> = Api::all(client.clone());
    if policies.get_opt("default").await?.is_some() {
        policies
            .patch(
                "default",
                &PatchParams::default(),
                &Patch::Merge(default_policy_selector(None)),
            )
            .await?;
    }
    Ok(())
}

#[tokio::test]
#[ignore = "out of ./tests/run for its time: the lab alone for 500 to 1,080 s (two chart upgrades, a watchdog reset); tests/coordinator/remediation.rs and tests/agent/fencing.rs prove the rest in ./tests/run (BENCHMARKS.md, \"A cold ./tests/run\"); run with --ignored fencing::"]
async fn a_node_cut_off_resets_itself_and_only_then_its_stateful_pod_moves() -> anyhow::Result<()> {
    let (lab, node, vm) = Lab::with_node(Pick::At(0)).await?;
    // Remediation with the out-of-service taint for this node, with short deadlines.
    remediated_alone(&lab, &node).await?;

    // First with the chart's agent as installed, which does not fence: cut off, the node looks
    // dead, and the coordinator says why it does not mark it.
    never_marked_without_fencing(&lab, &vm, &node).await?;

    // Then the chart's fencing turned on, as a user turns it on; and off again whatever the
    // fenced leg's outcome: a watchdog armed on every node is not for the next test.
    let leg = AssertUnwindSafe(fenced_leg(&lab, &vm, &node))
        .catch_unwind()
        .await;
    if !matches!(leg, Ok(Ok(()))) {
        let restored = async {
            vm.run_when_up(
                &format!(
                    "{CUT_OFF_RESTORED}\n(nft delete table inet {FIREWALL_TABLE} 2>/dev/null; true)"
                ),
                REBOOT,
            )
            .await?;
            release::upgrade_chart(&lab.lab.nodes, &[]).await
        };
        if let Err(e) = restored.await {
            eprintln!("undoing the fenced leg that failed: {e:#}");
        }
    }
    match leg {
        Err(panic) => std::panic::resume_unwind(panic),
        Ok(result) => result?,
    }
    fencing_turned_off(&lab).await
}

/// With the chart's fencing on, `node` cut off from the API server and its peers resets
/// itself; only then is it marked out of service and its stateful pod started elsewhere; back
/// on the network, the taint goes and the fencing is announced for its new boot.
async fn fenced_leg(lab: &Lab, vm: &Vm, node: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let policies: Api<DisruptionPolicy> = Api::all(lab.client.clone());
    let before = fenced_by_its_agent(lab, vm).await?;

    // A stateful pod on the node that waits out an unreachable node (as StatefulSet pods do
    // for their volumes' sake): only the out-of-service taint moves it. Once it runs there, it
    // may only go elsewhere.
    let namespace = lab.namespace("lab-fencing").await?;
    lab.apply(stateful(&namespace, node, "In")).await?;
    let first = lab.running(&namespace, "app=stateful", 1).await?.remove(0);
    assert_eq!(
        first.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node)
    );
    lab.apply(stateful(&namespace, node, "NotIn")).await?;

    // Cut off from the API server and from every peer, and kept so across a reset.
    // Watched from before the cut: when the node is marked out of service.
    let tainted = {
        let (nodes, node) = (nodes.clone(), node.to_owned());
        tokio::spawn(async move {
            wait::until(&nodes, &node, "the out-of-service taint", REBOOT * 2, |n| {
                wait::out_of_service_taint(n).is_some()
            })
            .await
            .map(|_| jiff::Timestamp::now())
        })
    };
    cut_off(vm).await?;
    let cut_at = jiff::Timestamp::now();
    let power_before = vm.power_log();
    // The agent gives up feeding the watchdog (seen before the reset, on the guest itself).
    wait::eventually("the agent fencing its node", REBOOT, || async {
        Ok((fencing_gauge(vm).await? == "2").then_some(()))
    })
    .await?;
    let fencing_at = jiff::Timestamp::now();

    // The agent stops feeding the watchdog, which resets the machine: a new boot, with no
    // shutdown before it, and QEMU never powered off.
    let (after, reset_at) = reset_by_its_watchdog(vm, &before, &power_before).await?;
    println!(
        "{node}: cut off at {cut_at}, fencing by {fencing_at}, reset at about {reset_at} ({:.0} s after the cut), boot {after}",
        (reset_at - cut_at).total(jiff::Unit::Second)?
    );
    assert!(reset_at > cut_at, "reset after the cut");

    // Only now is the node known to be down: marked out of service, and the pod starts on
    // another node.
    let marked = tainted.await??;
    let pods: Api<Pod> = Api::namespaced(lab.client.clone(), &namespace);
    let moved = wait::eventually(
        "the stateful pod running on another node",
        REBOOT,
        || async {
            let list = pods
                .list(&ListParams::default().labels("app=stateful"))
                .await?;
            Ok(list.items.into_iter().find(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node)
                    && wait::condition_status(p, "Ready").as_deref() == Some("True")
            }))
        },
    )
    .await?;
    let created = moved
        .metadata
        .creation_timestamp
        .clone()
        .context("created")?
        .0;
    // The API server's times keep whole seconds.
    let slack = jiff::SignedDuration::from_secs(1);
    assert!(
        created + slack >= reset_at,
        "the pod started elsewhere at {created}, before the node was reset at {reset_at}"
    );
    assert!(
        marked >= reset_at,
        "marked out of service (seen at {marked}) before the reset at {reset_at}"
    );
    println!(
        "{node}: marked out of service {:.0} s after the reset, its pod started elsewhere {:.0} s after it",
        (marked - reset_at).total(jiff::Unit::Second)?,
        (created - reset_at).total(jiff::Unit::Second)?
    );
    assert_ne!(moved.uid(), first.uid());

    policies.delete("lab-fencing", &Default::default()).await?;
    restore_default_policy(&lab.client).await?;

    // Back on the network: Ready, nodeward's taint taken away, and the fencing announced for
    // the new boot.
    vm.run(&format!(
        "{CUT_OFF_RESTORED}
        nft delete table inet {FIREWALL_TABLE}"
    ))
    .await?;
    vm.wait_node_ready(&lab.client, REBOOT).await?;
    wait::until(
        &nodes,
        node,
        "the out-of-service taint taken away",
        REBOOT,
        |n| n.is_some() && wait::out_of_service_taint(n).is_none(),
    )
    .await?;
    wait::eventually("the fencing announced on the new boot", REBOOT, || async {
        let status = lab.report(node).await?.status.unwrap_or_default();
        Ok(
            (status.fencing.is_some() && status.boot_id.as_deref() == Some(after.as_str()))
                .then_some(()),
        )
    })
    .await?;

    lab.delete_namespace(&namespace).await
}

/// The chart's fencing turned off again: every agent, stopped for its new pod, took its
/// announcement back and stopped its watchdog first, and no node was reset by one left running.
async fn fencing_turned_off(lab: &Lab) -> anyhow::Result<()> {
    let vms = lab.lab.vms();
    let mut boots = Vec::new();
    for vm in &vms {
        boots.push(vm.boot_id().await?);
    }
    release::upgrade_chart(&lab.lab.nodes, &[]).await?;
    lab.settled().await?;
    for (vm, boot) in vms.iter().zip(boots) {
        let report = lab.report(&vm.name).await?.status.unwrap_or_default();
        assert!(
            report.fencing.is_none(),
            "{}: {:?}",
            vm.name,
            report.fencing
        );
        assert_eq!(
            vm.run("cat /sys/class/watchdog/watchdog0/state")
                .await?
                .trim(),
            "inactive",
            "{}'s watchdog",
            vm.name
        );
        assert_eq!(vm.boot_id().await?, boot, "{} was reset", vm.name);
    }
    Ok(())
}

/// A StatefulSet of one pod that waits out an unreachable node (as StatefulSet pods do for
/// their volumes' sake: only the out-of-service taint moves it), on `node` (`In`) or anywhere
/// else (`NotIn`); updated on delete, so a changed placement is taken only by a new pod.
fn stateful(namespace: &str, node: &str, operator: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "stateful", "namespace": namespace},
        "spec": {
            "serviceName": "stateful", "replicas": 1,
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": {"app": "stateful"}},
            "template": {"metadata": {"labels": {"app": "stateful"}}, "spec": {
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nodelab.nodeward.io/vm", "operator": operator, "values": [node]}]}]}}},
                "terminationGracePeriodSeconds": 1,
                "tolerations": [
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
                ],
                "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                    "command": ["/bin/busybox", "sh", "-c", "while :; do sleep 3600 & wait $!; done"],
                    "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}}}],
            }},
        },
    })
}

/// `node` left to the test's policy `lab-fencing` alone: remediation by the out-of-service
/// taint only, and a minute (the least) for an agent's heartbeat.
async fn remediated_alone(lab: &Lab, node: &str) -> anyhow::Result<()> {
    let policies: Api<DisruptionPolicy> = Api::all(lab.client.clone());
    policies
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(default_policy_selector(Some(node))),
        )
        .await?;
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "lab-fencing", "labels": {TEST_LABEL: lab.test_label()}},
        "spec": {
            "nodeSelector": {"matchLabels": {"nodelab.nodeward.io/vm": node}},
            "maxConcurrent": 1,
            "deadlines": {"agentHeartbeat": "1m"},
            // The out-of-service taint only: a NotReady node is otherwise unhealthy at once,
            // and a Reboot maintenance would reboot it again once it is back.
            "remediation": {"enabled": true, "outOfServiceTaint": true, "unhealthyConditions": [
                {"type": "Ready", "status": "Unknown", "for": "24h"},
                {"type": "Ready", "status": "False", "for": "24h"}]},
        },
    }))?;
    wait::deleted(&policies, "lab-fencing", REBOOT).await?;
    policies.create(&PostParams::default(), &policy).await?;
    Ok(())
}

/// The chart's agent does not fence `vm` (its report announces no fencing): cut off from the
/// API server and its peers, the node looks dead to the coordinator, which says in an Event
/// that it waits because the agent does not fence, and does not mark it out of service; then
/// back on the network and Ready.
async fn never_marked_without_fencing(lab: &Lab, vm: &Vm, node: &str) -> anyhow::Result<()> {
    let report = lab.report(node).await?.status.unwrap_or_default();
    assert!(report.fencing.is_none(), "{:?}", report.fencing);
    vm.write_file("/etc/nodelab-cut-off.nft", cut_off_rules(vm)?.as_bytes())
        .await?;
    vm.run("nft -f /etc/nodelab-cut-off.nft").await?;
    // (The coordinator's Events carry its guest's clock, set from this host's at boot.)
    let cut_at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(30);
    let waits = wait::eventually(
        "the coordinator saying it does not mark a node whose agent does not fence",
        REBOOT * 2,
        || async {
            let events = crate::stories::node_events(&lab.client, node).await?;
            Ok(events.into_iter().find(|e| {
                e.reason.as_deref() == Some("OutOfServiceWaits")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("does not fence"))
                    && crate::stories::last_seen(e).is_some_and(|t| t >= cut_at)
            }))
        },
    )
    .await?;
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let now = nodes.get(node).await?;
    assert!(
        wait::out_of_service_taint(Some(&now)).is_none(),
        "a node whose agent does not fence was marked out of service: {:?}",
        waits.note
    );
    println!(
        "{node}, not fenced and cut off: {}",
        waits.note.unwrap_or_default()
    );
    vm.run(&format!(
        "nft delete table inet {FIREWALL_TABLE} && rm -f /etc/nodelab-cut-off.nft"
    ))
    .await?;
    vm.wait_node_ready(&lab.client, REBOOT).await
}

/// The rules that cut `vm` off from the API server (through the uplink's forward) and from
/// every other address of the lab network, both ways.
fn cut_off_rules(vm: &Vm) -> anyhow::Result<String> {
    let own = vm.lab_ip()?;
    let network = own
        .rsplit_once('.')
        .map(|(net, _)| net)
        .context("the lab IP")?;
    Ok(format!(
        "table inet {FIREWALL_TABLE} {{
  chain out {{ type filter hook output priority -10; ip daddr 10.0.2.100 drop; ip daddr {network}.0/24 ip daddr != {own} drop; }}
  chain in {{ type filter hook input priority -10; ip saddr {network}.0/24 ip saddr != {own} drop; }}
}}
"
    ))
}

/// Cuts `vm` off ([`cut_off_rules`]) by a unit that applies the rules again at boot.
async fn cut_off(vm: &Vm) -> anyhow::Result<()> {
    vm.write_file("/etc/nodelab-cut-off.nft", cut_off_rules(vm)?.as_bytes())
        .await?;
    vm.write_file(
        "/etc/systemd/system/nodelab-cut-off.service",
        b"[Unit]
Description=nodelab test: cut off from the API server and the peers
DefaultDependencies=no
Before=network-pre.target kubelet.service
Wants=network-pre.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/nft -f /etc/nodelab-cut-off.nft
[Install]
WantedBy=sysinit.target
",
    )
    .await?;
    // Restarted, not started: a unit left active (it remains so after its run) would not run.
    vm.run("systemctl daemon-reload && systemctl enable nodelab-cut-off.service && systemctl restart nodelab-cut-off.service")
        .await?;
    Ok(())
}

/// Waits for `vm`'s next boot after `before`, and shows it came from a reset: no shutdown ended
/// the boot before, and QEMU was not powered off (`power_before`). Its boot id, and about when
/// the reset was (by this machine's clock).
async fn reset_by_its_watchdog(
    vm: &Vm,
    before: &str,
    power_before: &[(u64, String)],
) -> anyhow::Result<(String, jiff::Timestamp)> {
    let after = vm.wait_rebooted(before, REBOOT).await?;
    let uptime: f64 = vm
        .run("cut -d' ' -f1 /proc/uptime")
        .await?
        .trim()
        .parse()
        .context("the uptime")?;
    let reset_at = jiff::Timestamp::now() - jiff::SignedDuration::try_from_secs_f64(uptime)?;
    assert_eq!(&vm.power_log(), power_before, "reset, not powered off");
    let last_lines = vm.run("journalctl -b -1 -q --no-pager -n 3").await?;
    assert!(
        !last_lines.trim().is_empty(),
        "the boot before is in the journal"
    );
    let shutdown = vm
        .exec("journalctl -b -1 -q --no-pager _PID=1 -g 'Reached target .*(Reboot|Power-Off|Shutdown)'")
        .await?;
    assert!(
        shutdown.code == 1 && shutdown.stdout.trim().is_empty(),
        "the boot before ended in a shutdown, not a reset (journalctl exited {}): {}{}",
        shutdown.code,
        shutdown.stdout,
        shutdown.stderr
    );
    Ok((after, reset_at))
}

/// Turns on the chart's fencing ([`CHART_FENCING`]) and shows it fences `vm`: the watchdog is
/// the VM's hardware one, running with the timeout asked for, the agent's gauge says armed,
/// and the report announces it on this boot, counting the lab's agents. The boot id.
async fn fenced_by_its_agent(lab: &Lab, vm: &Vm) -> anyhow::Result<String> {
    release::upgrade_chart(&lab.lab.nodes, &CHART_FENCING).await?;
    lab.settled().await?;
    let announced = wait::eventually("the fencing announced", REBOOT, || async {
        let status = lab.report(&vm.name).await?.status.unwrap_or_default();
        Ok(status
            .fencing
            .filter(|f| f.agents == 3)
            .map(|f| (f, status.boot_id)))
    })
    .await?;
    let (fencing, boot_id) = announced;
    assert_eq!(
        (fencing.fence_after_seconds, fencing.timeout_seconds),
        (20, 30)
    );
    let watchdog = vm
        .run("cat /sys/class/watchdog/watchdog0/identity /sys/class/watchdog/watchdog0/state /sys/class/watchdog/watchdog0/timeout")
        .await?;
    assert_eq!(
        watchdog.split_whitespace().collect::<Vec<_>>(),
        ["i6300ESB", "timer", "active", "30"],
        "{watchdog}"
    );
    let before = vm.boot_id().await?;
    assert_eq!(boot_id.as_deref(), Some(before.as_str()));
    assert_eq!(fencing_gauge(vm).await?, "1", "armed and fed");
    Ok(before)
}
