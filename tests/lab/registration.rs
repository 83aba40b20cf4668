//! A kubelet that cannot register, on a real node: its host-mode agent, authenticated by a
//! client certificate (it needs no Node), reports `KubeletUnregistered`; once the kubelet
//! registers a Node that never becomes Ready, the coordinator's startup timeout reports it, until
//! the node is Ready after all.

use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams},
};
use nodeward_api::DisruptionPolicy;
use nodeward_e2e::wait;
use serde_json::json;

use crate::{
    stories,
    support::{
        HOST_MODE_LABEL, HostCredential, Lab, Pick, REBOOT, REGISTRATION_RESTORED, TEST_LABEL,
    },
};

/// The kubelet's unit with a drop-in (undone by [`REGISTRATION_RESTORED`]) (in /run: a reboot forgets it) that keeps the host-mode
/// label from its first registration on (so the chart's agent never comes to the node) and reads
/// `kubeconfig` from /etc/kubernetes.
fn kubelet_dropin(kubeconfig: &str) -> String {
    format!(
        "set -e
        mkdir -p /run/systemd/system/kubelet.service.d
        {{ echo '[Service]'; echo 'ExecStart='
          sed -n '/^ExecStart=/,/[^\\\\]$/p' /etc/systemd/system/kubelet.service |
            sed -e 's#--node-labels=nodelab.nodeward.io/vm=${{NODE_NAME}}#&,{HOST_MODE_LABEL}=true#' \
                -e 's#/etc/kubernetes/kubelet.kubeconfig#/etc/kubernetes/{kubeconfig}#'
        }} > /run/systemd/system/kubelet.service.d/50-nodelab-registration.conf
        systemctl daemon-reload"
    )
}

#[tokio::test]
async fn a_kubelet_that_cannot_register_is_unregistered_then_a_node_never_ready_times_out()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::beside(Pick::Last).await?;
    lab.host_mode(&vm, HostCredential::Certificate).await?;

    // The kubelet runs but cannot reach the API server (its kubeconfig names a port nobody
    // serves), and its Node is gone: it cannot register.
    vm.run(&format!(
        "set -e
        systemctl stop kubelet
        sed 's#^\\( *server: https://[^:/]*\\):[0-9]*#\\1:1#' /etc/kubernetes/kubelet.kubeconfig \
          > /etc/kubernetes/unreachable.kubeconfig
        {}",
        kubelet_dropin("unreachable.kubeconfig")
    ))
    .await?;
    let nodes: Api<Node> = Api::all(lab.client.clone());
    wait::deleted(&nodes, &node, REBOOT).await?;
    vm.run("systemctl start kubelet").await?;
    let unregistered = lab
        .finding(&node, "registration", "KubeletUnregistered", |f| {
            f.status == "True" && f.type_ == "KubeletUnregistered"
        })
        .await?;
    assert!(
        unregistered
            .message
            .contains(&format!("no Node object {node} after the 30s")),
        "{}",
        unregistered.message
    );
    assert_eq!(
        vm.run("systemctl is-active kubelet").await?.trim(),
        "active",
        "the kubelet runs all along"
    );

    // A policy over the node with a startup timeout; the kubelet registers, but with no pod
    // network configured the node never becomes Ready.
    let policies: Api<DisruptionPolicy> = Api::all(lab.client.clone());
    let policy_name = "lab-startup-timeout";
    wait::deleted(&policies, policy_name, REBOOT).await?;
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": policy_name, "labels": {TEST_LABEL: lab.test_label()}},
        "spec": {
            "nodeSelector": {"matchLabels": {"nodelab.nodeward.io/vm": node}},
            "remediation": {"enabled": false, "nodeStartupTimeout": "30s", "startupAction": "None"},
        },
    }))?;
    policies.create(&PostParams::default(), &policy).await?;
    vm.run(&format!(
        "set -e
        mv /etc/cni/net.d/10-lab.conflist /etc/kubernetes/10-lab.conflist.aside
        {}
        systemctl restart kubelet",
        kubelet_dropin("kubelet.kubeconfig")
    ))
    .await?;
    let registered = wait::until(&nodes, &node, "the Node registered", REBOOT, |n| {
        n.is_some()
    })
    .await?
    .context("the Node")?;
    let seen = Instant::now();
    assert_eq!(
        registered.labels().get(HOST_MODE_LABEL).map(String::as_str),
        Some("true"),
        "registered as a host-mode node"
    );
    lab.finding(&node, "registration", "registered", |f| {
        f.status == "False" && f.reason == "NodeRegistered"
    })
    .await?;
    let timed_out = wait::until(&nodes, &node, "StartupTimedOut=True", REBOOT, |n| {
        wait::node_condition(n, "StartupTimedOut").is_some_and(|(status, _)| status == "True")
    })
    .await?
    .context("the Node")?;
    let ready = wait::node_condition(Some(&timed_out), "Ready");
    assert!(
        ready.as_ref().is_none_or(|(status, _)| status != "True"),
        "timed out while not Ready: {ready:?}"
    );
    // creationTimestamp keeps whole seconds: the 30 s may end up to 1 s before our clock says.
    assert!(
        seen.elapsed() >= Duration::from_secs(25),
        "not before the timeout: {:?} after the Node was seen",
        seen.elapsed()
    );
    let uid = timed_out.uid();
    wait::eventually("the NodeStartupTimeout Event", REBOOT, || async {
        let events = stories::node_events(&lab.client, &node).await?;
        Ok(events.into_iter().find(|e| {
            e.reason.as_deref() == Some("NodeStartupTimeout")
                && e.regarding.as_ref().and_then(|r| r.uid.clone()) == uid
        }))
    })
    .await?;

    // The pod network back: Ready, the condition cleared, and nothing left behind.
    vm.run(REGISTRATION_RESTORED).await?;
    vm.wait_node_ready(&lab.client, REBOOT).await?;
    wait::until(&nodes, &node, "StartupTimedOut=False", REBOOT, |n| {
        wait::node_condition(n, "StartupTimedOut")
            .is_some_and(|(status, reason)| status == "False" && reason == "BecameReady")
    })
    .await?;
    policies
        .delete(policy_name, &DeleteParams::default())
        .await?;
    Ok(())
}
