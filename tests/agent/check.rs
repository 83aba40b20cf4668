//! `nodeward-agent check` inside real network namespaces: the binary must report exactly what
//! the namespace lacks, and exit 1 for a problem, 0 when healthy, 2 for a bad configuration.
//! Needs root (to create namespaces), as `./tests/run` has.

use nodeward_e2e::daemon::agent_binary;
use std::process::{Command, Output};

use nodeward_e2e::scratch;

/// A network namespace deleted again when the test ends, however it ends.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Self {
        let name = format!("nw-{tag}-{}", std::process::id());
        let out = ip(&["netns", "add", &name]);
        assert!(
            out.status.success(),
            "creating network namespace {name} failed (this test needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(name)
    }

    /// Runs `ip -n NS ARGS...` and insists it succeeds.
    fn ip(&self, args: &[&str]) {
        let mut full = vec!["-n", self.0.as_str()];
        full.extend_from_slice(args);
        let out = ip(&full);
        assert!(
            out.status.success(),
            "ip {full:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `check` in the namespace with only the network detectors on, so that the machine's
    /// own state (a pending reboot, no kubelet) does not enter the verdict.
    fn check(&self, extra: &[&str]) -> (i32, String) {
        let config = std::env::temp_dir().join(format!("{}.yaml", self.0));
        std::fs::write(
            &config,
            "detectors:\n  rebootRequired: {enabled: false}\n  filesystem: {enabled: false}\n  kubelet: {enabled: false}\n  containerRuntime: {enabled: false}\n",
        )
        .expect("writing the test configuration");
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.0,
                agent_binary(),
                "check",
                "--config",
            ])
            .arg(&config)
            .args(extra)
            .output()
            .expect("running nodeward-agent check");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        (out.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
        let _ = std::fs::remove_file(std::env::temp_dir().join(format!("{}.yaml", self.0)));
    }
}

fn ip(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("running ip")
}

#[test]
fn check_reports_what_the_namespace_lacks_and_passes_once_it_is_fixed() {
    let ns = Netns::new("chk");
    // Nothing but a loopback that is down.
    let (code, out) = ns.check(&[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("NoAddress") && out.contains("NoDefaultRoute"),
        "{out}"
    );

    // An interface that is up, with no address yet.
    ns.ip(&["link", "set", "lo", "up"]);
    ns.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
    ]);
    ns.ip(&["link", "set", "peer0", "up"]);
    ns.ip(&["link", "set", "eth0", "up"]);
    let (code, out) = ns.check(&[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("up without a usable address: eth0"), "{out}");

    // An address but no default route.
    ns.ip(&["addr", "add", "198.51.100.2/24", "dev", "eth0"]);
    let (code, out) = ns.check(&["--output", "json"]);
    assert_eq!(code, 1, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON output");
    assert_eq!(report["problems"], 1, "{out}");
    let reasons: Vec<&str> = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["status"] != "Skipped")
        .filter_map(|f| f["reason"].as_str())
        .collect();
    assert_eq!(reasons, vec!["InterfacesUp", "NoDefaultRoute"], "{out}");
    assert!(
        out.contains("skipped: no cluster configured"),
        "the API server check says why it did not run: {out}"
    );

    // Healthy.
    ns.ip(&["route", "add", "default", "via", "198.51.100.1"]);
    let (code, out) = ns.check(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("IPv4 via 198.51.100.1 dev eth0"), "{out}");
    assert!(out.contains("0 problem(s)"), "{out}");
}

#[test]
fn check_exits_2_naming_the_bad_field_of_the_configuration() {
    let dir = scratch::dir(&format!("nodeward-check-config-{}", std::process::id())).expect("dir");
    let path = scratch::write(
        &dir,
        "agent.yaml",
        "detectors:\n  network:\n    defaultRoute:\n      ipv6: sometimes\n",
    )
    .expect("write config");
    let out = Command::new(agent_binary())
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .expect("running nodeward-agent check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("detectors.network.defaultRoute.ipv6"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Auto") && stderr.contains(&path.display().to_string()),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
