//! The container runtime for real: the node's containerd answers on its CRI socket
//! (`nodeward-agent check` on the host, as host mode runs), and the chart's agent, which reads
//! the unit over the system bus without the socket, reports it stopped and crashing again and
//! again (the lab's chart counts 2 restarts in 3 minutes as frequent), and clears both.

use nodeward_e2e::wait;
use serde_json::Value;

use crate::support::{self, Lab, Pick, REBOOT, install_agent_binary};

/// The `container-runtime` finding of `nodeward-agent check` run on the VM's host.
async fn checked_on_host(vm: &nodeward_e2e::nodelab::Vm) -> anyhow::Result<Value> {
    let out = vm
        .exec("/usr/local/bin/nodeward-agent check --output json")
        .await?;
    let report: Value = serde_json::from_str(&out.stdout)
        .map_err(|e| anyhow::anyhow!("check's JSON: {e}: {}{}", out.stdout, out.stderr))?;
    report["findings"]
        .as_array()
        .and_then(|all| all.iter().find(|f| f["detector"] == "container-runtime"))
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no container-runtime finding: {report}"))
}

#[tokio::test]
async fn a_stopped_or_crashing_container_runtime_is_reported_and_its_cri_socket_answers_ready()
-> anyhow::Result<()> {
    // The second VM, on the coordinators' lane: one test at a time there, and both coordinators
    // Ready when it starts, so while this node's runtime is stopped the other one answers the
    // eviction webhook (a stopped containerd leaves running containers be). Its agent is always
    // the chart's (a test may turn the last one to host mode). The first VM's lane has the
    // reboots, and was the longer with this test in it.
    let (lab, node, vm) = Lab::beside(Pick::At(1)).await?;

    // The real containerd answers the CRI Version and Status calls, RuntimeReady.
    install_agent_binary(&vm).await?;
    let healthy = checked_on_host(&vm).await?;
    assert_eq!(healthy["reason"], "ContainerRuntimeIsHealthy", "{healthy}");
    let message = healthy["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("containerd ")
            && message.ends_with("answers at /run/containerd/containerd.sock: RuntimeReady"),
        "{message}"
    );
    let pod_view = lab.cleared(&node, "container-runtime", "healthy").await?;
    assert_eq!(
        pod_view.message, "containerd.service is active (the CRI socket is not visible here)",
        "the chart mounts no CRI socket by default"
    );

    // Stopped: the unit is inactive, on the host and on the Node.
    // Neither waits for the job: stopping or starting containerd (restoring every sandbox's
    // state) can take longer than a guest command may on an emulated VM. The findings below
    // wait for the outcome instead.
    vm.run("systemctl stop --no-block containerd").await?;
    let inactive = wait::eventually("containerd stopped", REBOOT, || async {
        let state = vm.exec("systemctl is-active containerd").await?;
        Ok((state.stdout.trim() == "inactive").then_some(()))
    })
    .await;
    let stopped = match inactive {
        Ok(()) => checked_on_host(&vm).await,
        Err(e) => Err(e),
    };
    let reported = lab
        .finding(&node, "container-runtime", "a problem", |f| {
            f.status == "True"
        })
        .await;
    vm.run("systemctl start --no-block containerd").await?;
    let stopped = stopped?;
    assert_eq!(
        stopped["reason"], "ContainerRuntimeUnitInactive",
        "{stopped}"
    );
    let reported = reported?;
    assert_eq!(reported.type_, "ContainerRuntimeUnhealthy");
    assert_eq!(reported.reason, "ContainerRuntimeUnitInactive");
    assert!(
        reported
            .message
            .starts_with("containerd.service is inactive"),
        "{}",
        reported.message
    );
    lab.cleared(&node, "container-runtime", "healthy again")
        .await?;

    // Two crashes (SIGKILL of its main process): systemd restarts containerd each time and
    // counts it.
    let before: u32 = vm
        .run("systemctl show containerd --property=NRestarts --value")
        .await?
        .trim()
        .parse()?;
    // The main process only: `systemctl kill` would kill the shims, and with them every
    // container on the node. Both crashes in one guest command, the second as soon as systemd
    // has restarted containerd: polled from here, a guest-agent round trip each time on a
    // loaded host, the two were once never within the chart's window (then 90 s).
    let restarted_once = before + 1;
    vm.run_within(
        &format!(
            "crash() {{ kill -KILL \"$(systemctl show containerd --property=MainPID --value)\"; }}
            crash
            until [ \"$(systemctl show containerd --property=NRestarts --value)\" -ge {restarted_once} ] &&
              systemctl is-active --quiet containerd; do sleep 0.2; done
            crash"
        ),
        REBOOT,
    )
    .await?;
    support::restarted_by_systemd(&vm, "containerd", before + 2).await?;
    lab.condition(
        &node,
        "FrequentContainerdRestart",
        "True",
        "FrequentContainerdRestart",
    )
    .await?;
    // The restarts leave the window: cleared, so the next test finds a healthy node.
    let calm = lab
        .cleared(&node, "container-runtime-restarts", "cleared")
        .await?;
    assert_eq!(
        calm.reason, "NoFrequentContainerdRestart",
        "{}",
        calm.message
    );
    Ok(())
}
