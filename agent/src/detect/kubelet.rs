//! The kubelet: its health endpoint answers `ok`, and its process runs. A machine with no
//! kubelet at all (no process, no `/var/lib/kubelet`) is not a node: that is Unknown, not a
//! problem, so that `check` on a workstation stays useful.

use hyper::{Method, StatusCode};
use nodeward_api::conditions::node::KUBELET_PROBLEM;

use super::Finding;
use crate::{config::KubeletConfig, http};

pub const DETECTOR: &str = "kubelet";
const KUBELET_STATE_DIR: &str = "/var/lib/kubelet";

/// What was seen of the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// A process named `kubelet` is visible (needs the host PID namespace in a pod).
    pub process: bool,
    /// `/var/lib/kubelet` exists: this machine is (or was set up as) a node.
    pub installed: bool,
    /// The healthz answer: `Ok(())` for 200 `ok`, else what went wrong.
    pub healthz: Result<(), String>,
}

pub async fn observe(config: &KubeletConfig) -> Finding {
    let healthz = match http::request(Method::GET, &config.healthz_url, &[]).await {
        Ok(reply) if reply.status == StatusCode::OK && reply.body.trim_ascii() == b"ok" => Ok(()),
        Ok(reply) => Err(format!(
            "{} answered {}: {}",
            config.healthz_url,
            reply.status,
            super::command::cap(String::from_utf8_lossy(&reply.body).trim(), 80)
        )),
        Err(e) => Err(e.to_string()),
    };
    let evidence = Evidence {
        process: process_running("kubelet").await,
        installed: tokio::fs::try_exists(KUBELET_STATE_DIR)
            .await
            .unwrap_or(false),
        healthz,
    };
    evaluate(&evidence)
}

/// Whether a process with this command name is visible in `/proc`.
pub async fn process_running(name: &str) -> bool {
    let Ok(mut entries) = tokio::fs::read_dir("/proc").await else {
        return false;
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        if is_pid
            && let Ok(comm) = tokio::fs::read_to_string(entry.path().join("comm")).await
            && comm.trim_end() == name
        {
            return true;
        }
    }
    false
}

pub fn evaluate(evidence: &Evidence) -> Finding {
    match (&evidence.healthz, evidence.process, evidence.installed) {
        (Ok(()), _, _) => Finding::ok(
            DETECTOR,
            KUBELET_PROBLEM,
            "KubeletHealthy",
            "healthz answered ok".into(),
        ),
        (Err(e), false, false) => Finding::unknown(
            DETECTOR,
            KUBELET_PROBLEM,
            "NoKubelet",
            format!(
                "no kubelet on this machine (no process, no {KUBELET_STATE_DIR}); healthz: {e}"
            ),
        ),
        (Err(e), true, _) => Finding::problem(
            DETECTOR,
            KUBELET_PROBLEM,
            "KubeletUnhealthy",
            format!("the kubelet runs but is unhealthy: {e}"),
        ),
        (Err(e), false, true) => Finding::problem(
            DETECTOR,
            KUBELET_PROBLEM,
            "KubeletNotRunning",
            format!("no kubelet process and healthz failed: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Status;

    fn evidence(process: bool, installed: bool, healthz: Result<(), &str>) -> Evidence {
        Evidence {
            process,
            installed,
            healthz: healthz.map_err(str::to_owned),
        }
    }

    #[test]
    fn healthz_ok_is_healthy_even_without_seeing_the_process() {
        assert_eq!(evaluate(&evidence(false, true, Ok(()))).status, Status::Ok);
    }

    #[test]
    fn failures_say_whether_the_process_runs() {
        let dead = evaluate(&evidence(false, true, Err("connection refused")));
        assert_eq!(
            (dead.status, dead.reason.as_str()),
            (Status::Problem, "KubeletNotRunning")
        );
        let sick = evaluate(&evidence(true, true, Err("500")));
        assert_eq!(
            (sick.status, sick.reason.as_str()),
            (Status::Problem, "KubeletUnhealthy")
        );
        let none = evaluate(&evidence(false, false, Err("connection refused")));
        assert_eq!(
            (none.status, none.reason.as_str()),
            (Status::Unknown, "NoKubelet")
        );
    }

    #[tokio::test]
    async fn finds_a_running_process_by_name() {
        let me = std::fs::read_to_string("/proc/self/comm").expect("comm");
        assert!(process_running(me.trim_end()).await);
        assert!(!process_running("no-such-process-xyz").await);
    }
}
