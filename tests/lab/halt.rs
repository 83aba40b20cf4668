//! A halted rollout admits no one, on real nodes: the newcomer's rollout of 2026-12-07
//! (`../shared/reviews/2026-12-07-newcomer-lab.md` §2). A patch of the three VMs with apt under a
//! policy with a canary, an `afterBoot` self-test, an apt rollback and a failure budget of one:
//! the canary updates to a good version and succeeds; the next VM gets a bad one (no reboot
//! needed, its self-test fails), is rolled back by apt and rebooted, and ends `RolledBack`,
//! which halts the policy; the third VM, whose repository holds the bad version too, waits
//! `RolloutHalted`, never admitted, until `kubectl nodeward resume`. The coordinators' node runs
//! 3 s behind the failing VM's clock, which stamps the failure, as nodes whose time nobody keeps
//! do: the round that freed the failed VM's slot once gave it to the third VM. `why` and
//! `status` are printed at each step the failing VM's maintenance goes through.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use futures::StreamExt;
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use nodeward_api::{DisruptionPolicy, MaintenancePhase, NodeMaintenance, update};
use nodeward_e2e::{fixtures::MaintenanceSpec, history, wait};
use serde_json::json;

use crate::{
    patching::{self, Kind, PACKAGE, Published},
    support::{Lab, REBOOT, TEST_LABEL},
};

const POLICY: &str = "lab-halt";
/// The node's self-test after the update: version 3 is the bad one.
const SELFTEST: [&str; 4] = [
    "/usr/bin/grep",
    "-qvx",
    "3",
    "/usr/share/nodeward-lab-patch/version",
];
/// How far the coordinators' node's clock runs behind the others'.
const COORDINATORS_BEHIND: f64 = -3.0;

#[tokio::test]
#[ignore = "out of ./tests/run for its time: on an idle dev lab (2026-12-07) it ran past the halt (held: the third VM denied RolloutHalted, never admitted) and the resume, and was stopped at 25 min with the third VM Verifying, waiting for both coordinator replicas to be available again (its drain evicted one, the other was Pending); the whole lab that long is more than CI affords until issue 68 makes the lab cheaper; run with --ignored halt::"]
async fn a_rollout_whose_node_after_the_canary_fails_halts_and_the_next_node_waits_for_the_resume()
-> anyhow::Result<()> {
    let lab = Lab::get().await?;
    let vms = lab.lab.vms();
    let [canary, failing, third] = [0, 1, 2].map(|i| lab.lab.nodes[i].clone());
    let (v1, good) = set_up(&lab).await?;
    let off = vms[2].set_clock_off(COORDINATORS_BEHIND).await?;
    println!(
        "{third}: clock set {COORDINATORS_BEHIND} s off (it was {off:+.3} s off); the coordinators run there while {failing} is drained"
    );

    let names: Vec<String> = [&canary, &failing, &third]
        .iter()
        .map(|n| format!("halt-{n}"))
        .collect();
    let ours = names.clone();
    let seen = history::watch_where(&lab.client, move |m| ours.contains(&m.name_any()), "");
    let printed = print_each_step(&lab, &names[1], &failing);
    let failing_boot = vms[1].boot_id().await?;
    for (node, name) in [&canary, &failing, &third].iter().zip(&names) {
        lab.create_maintenance(name, patch(node)).await?;
    }

    // The canary: the good version, no reboot asked for, its self-test passes.
    let done = patching::succeeded(&lab, &names[0], REBOOT * 2).await?;
    assert_eq!(patching::installed(&vms[0]).await?, "2");
    let run = done.status.as_ref().and_then(|s| {
        s.host_runs
            .iter()
            .find(|r| r.step == update::HostStep::Update)
    });
    assert_eq!(run.and_then(|r| r.reboot), Some(false), "{run:?}");

    // The next VM: the bad version, the self-test fails, apt rolls it back, the VM reboots.
    let failed = patching::finished(&lab, &names[1], REBOOT * 2).await?;
    let status = failed.status.clone().unwrap_or_default();
    assert_eq!(
        (status.phase, status.reason.as_deref()),
        (MaintenancePhase::Failed, Some("RolledBack")),
        "{:?} ({})",
        status.message,
        patching::history_line(&status)
    );
    assert_eq!(patching::installed(&vms[1]).await?, "1");
    assert_ne!(
        vms[1].boot_id().await?,
        failing_boot,
        "the rollback rebooted"
    );

    waits_halted(&lab, &names[2], &third, &seen).await?;

    // Its repository fixed and the policy resumed, the third VM goes, and succeeds.
    patching::publish(&vms[2], &[&v1, &good]).await?;
    let resumed = resume().await?;
    assert!(resumed.contains("forgiven"), "{resumed}");
    patching::succeeded(&lab, &names[2], REBOOT * 2).await?;
    assert_eq!(patching::installed(&vms[2]).await?, "2");
    let h = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(h.max_active, 1, "never two admitted at once");
    assert!(
        h.admitted_after_halt.is_empty(),
        "{:?}",
        h.admitted_after_halt
    );
    printed.abort();

    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    for name in &names {
        wait::deleted(&maintenances, name, REBOOT).await?;
    }
    let policies: Api<DisruptionPolicy> = Api::all(lab.client.clone());
    wait::deleted(&policies, POLICY, REBOOT).await?;
    futures::future::try_join_all(
        vms.iter()
            .map(|vm| async move { vm.run(patching::APT_RESTORED).await }),
    )
    .await?;
    vms[2].sync_clock().await?;
    println!("{PACKAGE}: restored on every VM");
    Ok(())
}

/// Version 1 on every VM; the canary's repository has the good version 2, the others' the bad
/// version 3; the policy over the lab's VMs. Returns versions 1 and 2.
async fn set_up(lab: &Lab) -> anyhow::Result<(Published, Published)> {
    let vms = lab.lab.vms();
    let dir = nodeward_e2e::scratch::dir(&format!("lab-halt-{}", std::process::id()))?;
    let version = |v: &'static str| -> anyhow::Result<Published> {
        Ok(Published {
            version: v,
            deb: patching::build_deb(&dir, v, Kind::Plain)?,
        })
    };
    let (v1, good, bad) = (version("1")?, version("2")?, version("3")?);
    futures::future::try_join_all(vms.iter().enumerate().map(|(i, vm)| {
        let (v1, next) = (&v1, if i == 0 { &good } else { &bad });
        async move {
            patching::prepare(vm, v1).await?;
            patching::publish(vm, &[v1, next]).await
        }
    }))
    .await?;
    lab.apply(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": POLICY, "labels": {TEST_LABEL: "true"}},
        "spec": {
            "nodeSelector": {"matchExpressions": [
                {"key": "nodelab.nodeward.io/vm", "operator": "In", "values": lab.lab.nodes},
            ]},
            "maxConcurrent": 1,
            "update": {"preset": "Apt", "timeout": "10m", "reboot": "IfNeeded",
                       "rollback": {"preset": "Apt", "timeout": "10m"}},
            "hooks": {"afterBoot": {"command": SELFTEST, "timeout": "2m"}},
            "healthGate": {"for": "5s", "timeout": "10m"},
            "canary": {"nodes": 1},
            "failureBudget": {"maxFailures": 1},
        },
    }))
    .await?;
    Ok((v1, good))
}

/// The policy halted, and the third VM's maintenance `name` (of `node`) is told so, was never
/// admitted (`seen`), and its node is in service.
async fn waits_halted(
    lab: &Lab,
    name: &str,
    node: &str,
    seen: &Arc<Mutex<history::History>>,
) -> anyhow::Result<()> {
    let policies: Api<DisruptionPolicy> = Api::all(lab.client.clone());
    wait::until(&policies, POLICY, "Halted=True", REBOOT, |p| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Halted" && c.status == "True")
        })
    })
    .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    let denied = wait::until(
        &maintenances,
        name,
        "Admitted=False RolloutHalted",
        REBOOT,
        |m| {
            m.and_then(|m| m.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Admitted" && c.reason == "RolloutHalted")
            })
        },
    )
    .await?
    .context("the third maintenance")?;
    let admitted_before_the_resume = seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .admitted
        .contains_key(name);
    assert!(
        !admitted_before_the_resume,
        "{node} was admitted after the failure that spent the budget: {:?}",
        denied.status
    );
    assert_eq!(denied.phase(), MaintenancePhase::Pending);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(lab.client.clone());
    let spec = nodes.get(node).await?.spec;
    assert_ne!(
        spec.and_then(|s| s.unschedulable),
        Some(true),
        "{node} cordoned while halted"
    );
    Ok(())
}

/// A patch of `node` (reason Manual, action Reboot), as `kubectl nodeward patch` asks.
fn patch(node: &str) -> MaintenanceSpec<'_> {
    MaintenanceSpec {
        node,
        reason: "Manual",
        action: "Reboot",
    }
}

/// `kubectl nodeward resume` of the policy; what it said.
async fn resume() -> anyhow::Result<String> {
    cli(&["resume", POLICY]).await
}

/// `kubectl nodeward ARGS` against the lab's control plane; what it printed.
async fn cli(args: &[&str]) -> anyhow::Result<String> {
    let ran = tokio::process::Command::new(nodeward_e2e::daemon::cli_binary())
        .arg("--kubeconfig")
        .arg(&nodeward_e2e::controlplane::shared().kubeconfig)
        .args(args)
        .output()
        .await?;
    let said = String::from_utf8_lossy(&ran.stdout).into_owned();
    anyhow::ensure!(
        ran.status.success(),
        "kubectl nodeward {}: {said}{}",
        args.join(" "),
        String::from_utf8_lossy(&ran.stderr)
    );
    Ok(said)
}

/// Prints `kubectl nodeward why NODE` and `status` each time what the maintenance `name` of
/// `node` says it does changes (the step under way, or its phase's message).
fn print_each_step(lab: &Lab, name: &str, node: &str) -> tokio::task::JoinHandle<()> {
    let api: Api<NodeMaintenance> = Api::all(lab.client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let (name, node) = (name.to_owned(), node.to_owned());
    let last = Arc::new(Mutex::new(String::new()));
    tokio::spawn(async move {
        let mut stream = watcher(api, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(m)) = stream.next().await {
            let status = m.status.clone().unwrap_or_default();
            let said = update::under_way(&status.host_runs, status.history.last().map(|h| &h.time))
                .or(status.message.clone())
                .unwrap_or_default();
            let step = format!("{:?}: {said}", status.phase);
            {
                let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
                if *last == step {
                    continue;
                }
                *last = step.clone();
            }
            let why = cli(&["why", &node])
                .await
                .unwrap_or_else(|e| format!("{e:#}"));
            let table = cli(&["status"]).await.unwrap_or_else(|e| format!("{e:#}"));
            println!(
                "== {name} {step}\n$ kubectl nodeward why {node}\n{why}$ kubectl nodeward status\n{table}"
            );
        }
    })
}
