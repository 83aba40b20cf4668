//! `check` reads the kubelet's unit from systemd over the system bus (here a private bus with
//! a systemd stand-in speaking the real protocol): a failed unit is a problem named with its
//! state; without systemd the check falls back to healthz and the process.

use nodeward_e2e::daemon::agent_binary;
use std::process::Command;

use nodeward_e2e::{
    scratch,
    systemd::{PrivateBus, Systemd, Unit},
};

fn kubelet_finding(bus: Option<&str>) -> serde_json::Value {
    let dir = scratch::dir(&format!("nodeward-kubelet-{}", std::process::id())).expect("dir");
    // Nothing listens on port 1: healthz fails, so the unit decides.
    let config = scratch::agent_config_file(
        &dir,
        &["kubelet: {healthzURL: \"http://127.0.0.1:1/healthz\"}"],
        "",
    )
    .expect("config");
    let mut command = Command::new(agent_binary());
    command
        .args(["check", "-o", "json", "--config"])
        .arg(&config);
    match bus {
        Some(address) => command.env("DBUS_SYSTEM_BUS_ADDRESS", address),
        None => command.env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/bus"),
    };
    let out = command.output().expect("running check");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    report["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["detector"] == "kubelet").cloned())
        .expect("a kubelet finding")
}

// Multi-threaded: the stand-in answers on the runtime while `check` runs as a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_unit_is_a_problem_and_no_systemd_falls_back() {
    let bus = PrivateBus::start("kubelet").expect("a private bus");
    let systemd = Systemd::default();
    systemd.set(
        "kubelet.service",
        Unit {
            active_state: "failed".into(),
            sub_state: "failed".into(),
            restarts: 5,
        },
    );
    let _serving = systemd
        .serve(&bus.address)
        .await
        .expect("the systemd stand-in");

    let failed = kubelet_finding(Some(&bus.address));
    assert_eq!(failed["status"], "Problem", "{failed}");
    assert_eq!(failed["reason"], "KubeletUnitInactive", "{failed}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("kubelet.service is failed (failed)"),
        "{failed}"
    );

    let no_systemd = kubelet_finding(None);
    assert_ne!(no_systemd["reason"], "KubeletUnitInactive", "{no_systemd}");
}
