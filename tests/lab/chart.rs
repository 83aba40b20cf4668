//! The chart as users install it, on real nodes: the agent DaemonSet pod Ready on every VM with
//! no false findings, its logind lock real, host commands run on the host through systemd (no
//! host mount), the eviction webhook reached through its Service, its log read as `kubectl logs`
//! reads it.

use std::time::Duration;

use anyhow::Context;

use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration,
    core::v1::{Node, Pod},
};
use kube::{
    Api, ResourceExt,
    api::{EvictParams, LogParams, PostParams},
};
use nodeward_api::report::AgentMode;
use nodeward_e2e::{Identity, controlplane::client_as, wait};
use serde_json::json;

use crate::{
    recorders,
    support::{self, Lab, RELEASE},
};

/// The conditions the chart's agent writes on a real node, each of which a healthy node must
/// have False (the filesystem and kernel-log detectors are off in a pod: host mode runs them).
const PROBLEM_TYPES: [&str; 4] = [
    "NetworkProblem",
    "KubeletProblem",
    "PeerConnectivityProblem",
    "RebootRequired",
];

#[tokio::test]
async fn the_chart_runs_the_agent_on_every_real_node_without_false_findings() -> anyhow::Result<()>
{
    let lab = Lab::get().await?;
    let nodes: Api<Node> = Api::all(lab.client.clone());
    for vm in lab.lab.vms() {
        // The NodeReport: DaemonSet mode, a fresh heartbeat, no problem among the findings.
        let report = wait::eventually(
            &format!("{}'s report with every detector's finding", vm.name),
            Duration::from_secs(180),
            || async {
                let report = lab.report(&vm.name).await?;
                let status = report.status.clone().unwrap_or_default();
                let settled = status.findings.len() >= 6
                    && status.findings.iter().all(|f| f.status != "Unknown");
                Ok(settled.then_some(report))
            },
        )
        .await?;
        let status = report.status.unwrap_or_default();
        assert_eq!(status.mode, Some(AgentMode::DaemonSet), "{}", vm.name);
        let problems = support::problems(&status.findings);
        assert!(problems.is_empty(), "{}: {problems:?}", vm.name);
        let node = nodes.get(&vm.name).await?;
        for type_ in PROBLEM_TYPES {
            let condition = wait::node_condition(Some(&node), type_);
            assert_eq!(
                condition.as_ref().map(|(status, _)| status.as_str()),
                Some("False"),
                "{} {type_}: {condition:?}",
                vm.name
            );
        }
        // The logind lock is real, and the drain has the budget it was given: the agent wrote
        // its drop-in (a stock node's InhibitDelayMaxSec is 5 s).
        support::wait_delay_lock(&lab.client, &vm).await?;
        let inhibitor = status.inhibitor.unwrap_or_default();
        assert!(inhibitor.delay_held, "{}", vm.name);
        assert_eq!(
            inhibitor
                .inhibit_delay_max
                .map(|d| d.as_str().to_owned())
                .as_deref(),
            Some("120s")
        );
        let delay = vm
            .run("busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec")
            .await?;
        assert_eq!(delay.trim(), "t 120000000", "{}", vm.name);
        agent_log_reads_through_the_kubelet(&lab, &vm.name).await?;
    }

    host_commands_run_on_the_host(&lab, &nodes).await?;

    // Evictions go through the coordinator's webhook, reached by the API server through the
    // chart's Service (the coordinator issued its certificate and wrote the caBundle).
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(lab.client.clone());
    let configuration = configurations
        .get(&format!("{RELEASE}-agent-evictions"))
        .await?;
    let webhook = &configuration.webhooks.unwrap_or_default()[0];
    assert!(
        webhook.client_config.service.is_some(),
        "by Service, not URL"
    );
    assert!(
        webhook.client_config.ca_bundle.is_some(),
        "the coordinator wrote the caBundle"
    );
    let namespace = lab.namespace("lab-chart").await?;
    let (one, two) = (&lab.lab.nodes[0], &lab.lab.nodes[1]);
    lab.apply(recorders::term_recorder(&namespace, "on-one", one, 1, None))
        .await?;
    lab.apply(recorders::term_recorder(&namespace, "on-two", two, 1, None))
        .await?;
    let on_one = lab.running(&namespace, "app=on-one", 1).await?.remove(0);
    let on_two = lab.running(&namespace, "app=on-two", 1).await?.remove(0);
    let agent_pod = support::agent_pod(&lab.client, one).await?;
    let token = support::agent_token(
        &lab.client,
        json!({"apiVersion": "v1", "kind": "Pod", "name": agent_pod.name_any(), "uid": agent_pod.uid()}),
        600,
    )
    .await?;
    let as_agent: Api<Pod> = Api::namespaced(client_as(Identity::Token(token)).await?, &namespace);
    let dry_run = EvictParams {
        post_options: PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        ..Default::default()
    };
    as_agent.evict(&on_one.name_any(), &dry_run).await?;
    match as_agent.evict(&on_two.name_any(), &dry_run).await {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains(&format!(
                "may evict only pods on its own node; {namespace}/{} runs on {two}",
                on_two.name_any()
            )),
            "{}",
            status.message
        ),
        other => anyhow::bail!("an eviction on another node was not refused: {other:?}"),
    }
    lab.delete_namespace(&namespace).await
}

/// Host commands run on the host, through systemd (the pod mounts nothing of /var/run and its
/// image has no systemctl): the custom check sees containerd active, the reboot sentinel is
/// found where Debian writes it, and neither leaves lines in the host's journal.
async fn host_commands_run_on_the_host(lab: &Lab, nodes: &Api<Node>) -> anyhow::Result<()> {
    // (A transient unit on a software-emulated machine can take seconds to start: the check
    // is waited for, not its first round.)
    let vm = &lab.lab.vms()[0];
    let last = std::sync::Mutex::new(None);
    let (lab_ref, last_ref) = (lab, &last);
    let active = wait::eventually(
        "the custom check to see containerd active",
        Duration::from_secs(120),
        || async move {
            let check = lab_ref.report(&vm.name).await?.status.unwrap_or_default();
            let found = check
                .findings
                .into_iter()
                .find(|f| f.detector == "containerd-active");
            let active = found
                .as_ref()
                .is_some_and(|f| (f.status.as_str(), f.message.as_str()) == ("False", "active"));
            *last_ref.lock().unwrap_or_else(|p| p.into_inner()) = found;
            Ok(active.then_some(()))
        },
    )
    .await;
    active.with_context(|| format!("the custom check's last finding: {last:?}"))?;
    vm.run("touch /var/run/reboot-required").await?;
    // The sentinel is looked for every 60 s (the lab's values), each look up to 15 s.
    let reboot = |status: &'static str| {
        wait::until(
            nodes,
            &vm.name,
            "RebootRequired",
            Duration::from_secs(150),
            move |n| wait::node_condition(n, "RebootRequired").is_some_and(|(s, _)| s == status),
        )
    };
    reboot("True").await?;
    vm.run("rm /var/run/reboot-required").await?;
    reboot("False").await?;
    Ok(())
}

/// `kubectl logs` reaches the real kubelet (the API server's kubelet client, the node's
/// InternalIP on the lab network): a user's first look at an agent. Read again within a
/// deadline: on a loaded host one TLS handshake of the API server's proxy to an emulated
/// node's kubelet timed out (a cold run's only failure), which `kubectl logs` run again gets
/// past as a user's would.
async fn agent_log_reads_through_the_kubelet(lab: &Lab, node: &str) -> anyhow::Result<()> {
    let pod = support::agent_pod(&lab.client, node).await?;
    let pods: Api<Pod> = Api::namespaced(lab.client.clone(), support::NAMESPACE);
    let logs = LogParams {
        container: Some("agent".to_owned()),
        ..LogParams::default()
    };
    let what = format!("kubectl logs {} (on {node})", pod.name_any());
    let log = wait::eventually(&what, Duration::from_secs(120), || async {
        let log = pods
            .logs(&pod.name_any(), &logs)
            .await
            .with_context(|| what.clone())?;
        Ok(Some(log))
    })
    .await?;
    assert!(
        log.contains("nodeward-agent running"),
        "{node}'s agent log: {log}"
    );
    Ok(())
}
