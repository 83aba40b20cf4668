//! The kubelet for real, as the chart's agent sees it through the host's systemd (over the
//! system bus) and the kubelet's healthz: stopped, crashing again and again, and back.

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodeward_e2e::wait;

use crate::support::{self, Lab, Pick, REBOOT};

#[tokio::test]
async fn a_stopped_or_crashing_kubelet_is_a_kubelet_problem_until_it_runs_again()
-> anyhow::Result<()> {
    let (lab, node, vm) = Lab::beside(Pick::Last).await?;

    // Stopped: the unit is inactive and healthz does not answer.
    vm.run("systemctl stop kubelet").await?;
    let stopped = lab
        .finding(&node, "kubelet", "a problem", |f| f.status == "True")
        .await?;
    assert_eq!(stopped.type_, "KubeletProblem");
    assert_eq!(stopped.reason, "KubeletUnitInactive", "{}", stopped.message);
    assert!(
        stopped.message.contains("kubelet.service is inactive"),
        "{}",
        stopped.message
    );
    // On the Node too, written by the agent while the kubelet is gone.
    let nodes: Api<Node> = Api::all(lab.client.clone());
    wait::until(
        &nodes,
        &node,
        "KubeletProblem True on the Node",
        REBOOT,
        |n| {
            wait::node_condition(n, "KubeletProblem")
                .is_some_and(|(status, reason)| status == "True" && reason == "KubeletUnitInactive")
        },
    )
    .await?;

    vm.run("systemctl start kubelet").await?;
    let healthy = lab.cleared(&node, "kubelet", "healthy again").await?;
    assert_eq!(healthy.reason, "KubeletHealthy");

    // Three crashes (SIGKILL): systemd restarts the unit each time and counts it (NRestarts).
    for crash in 1..=3 {
        vm.run("systemctl kill --signal=KILL kubelet").await?;
        support::restarted_by_systemd(&vm, "kubelet", crash).await?;
    }
    let crashing = lab
        .with_reason(&node, "kubelet", "FrequentRestarts")
        .await?;
    assert_eq!(crashing.status, "True");
    assert!(
        crashing.message.contains("restarted 3 times"),
        "{}",
        crashing.message
    );

    // An operator's restart resets systemd's counter, and with it the finding.
    vm.run("systemctl restart kubelet").await?;
    let restarted = lab
        .cleared(&node, "kubelet", "healthy after the restart")
        .await?;
    assert_eq!(restarted.reason, "KubeletHealthy");
    vm.wait_node_ready(&lab.client, REBOOT).await
}
