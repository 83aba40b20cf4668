//! A user's first reboot: `kubectl nodeward reboot NODE` against the chart as installed, whose
//! DaemonSet agent asks logind over the host's system bus (the chart's default reboot method).
//! The VM is cordoned and drained through the API, really reboots, and is back in service.

use std::time::Instant;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use nodeward_api::NodeMaintenance;
use serde_json::json;

use crate::{
    patching, recorders, stories,
    support::{Lab, Pick, REBOOT, TEST_LABEL},
};

#[tokio::test]
async fn kubectl_nodeward_reboot_with_the_charts_defaults_drains_reboots_through_logind_and_uncordons()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::with_node(Pick::At(0)).await?;
    let namespace = lab.namespace("lab-first-reboot").await?;
    lab.apply(recorders::term_recorder(
        &namespace, "served", &node, 1, None,
    ))
    .await?;
    lab.running(&namespace, "app=served", 1).await?;
    let departures = recorders::watch_departures(&lab.client, &namespace);
    let before = vm.boot_id().await?;
    let asked = Instant::now();

    let cli = tokio::process::Command::new(nodeward_e2e::daemon::cli_binary())
        .arg("--kubeconfig")
        .arg(&nodeward_e2e::controlplane::shared().kubeconfig)
        .args(["reboot", &node])
        .output()
        .await?;
    let said = String::from_utf8_lossy(&cli.stdout).into_owned();
    anyhow::ensure!(
        cli.status.success(),
        "kubectl nodeward reboot {node}: {said}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let name = asked_for(&lab, &node).await?;
    let status = patching::succeeded(&lab, &name, REBOOT * 2)
        .await?
        .status
        .unwrap_or_default();
    println!(
        "{node}: `kubectl nodeward reboot` to Succeeded in {:.0} s",
        asked.elapsed().as_secs_f64()
    );

    // Really rebooted, and through logind: the agent said how in its Acting Event.
    assert_ne!(vm.boot_id().await?, before, "{} did not reboot", vm.name);
    let note = stories::acting_note(&lab.client, &name).await?;
    assert!(
        note.starts_with("Reboot through logind"),
        "{name}: how it rebooted: {note:?}"
    );

    // Drained through the API before the reboot: the pod was evicted, not only stopped with
    // the machine.
    let drained = status
        .conditions
        .iter()
        .find(|c| c.type_ == nodeward_api::conditions::maintenance::DRAINED)
        .with_context(|| format!("{name}: no Drained condition"))?;
    assert_eq!(drained.reason, "Drained", "{}", drained.message);
    let seen = departures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        seen.values()
            .any(|d| d.group == "served" && d.asked.is_some()),
        "the served pod was never asked to go: {seen:?}"
    );

    // Back in service: cordoned by nodeward, so uncordoned by it, and no taint of its left.
    assert_eq!(status.cordoned_by_nodeward, Some(true));
    let back = Api::<Node>::all(lab.client.clone()).get(&node).await?;
    let spec = back.spec.unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true), "{node} is still cordoned");
    let ours: Vec<String> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .filter(|k| k.starts_with("nodeward.io/"))
        .collect();
    assert!(ours.is_empty(), "{node} still carries {ours:?}");
    lab.delete_namespace(&namespace).await
}

/// The maintenance `kubectl nodeward reboot` created for `node`, labelled as this test's (the
/// next test's reset deletes it).
async fn asked_for(lab: &Lab, node: &str) -> anyhow::Result<String> {
    let maintenances: Api<NodeMaintenance> = Api::all(lab.client.clone());
    let ours = maintenances
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|m| m.spec.node_name == node && !m.phase().is_finished())
        .with_context(|| format!("no maintenance of {node} after `kubectl nodeward reboot`"))?;
    let name = ours.name_any();
    let label = json!({"metadata": {"labels": {TEST_LABEL: lab.test_label()}}});
    maintenances
        .patch(&name, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .with_context(|| format!("labelling {name} as the test's"))?;
    Ok(name)
}
