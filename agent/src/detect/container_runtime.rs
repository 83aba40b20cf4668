//! The container runtime (node-problem-detector's containerd health checker and its
//! `FrequentContainerdRestart`): its systemd unit is active and does not restart again and
//! again, and its CRI socket answers with `RuntimeReady` where the agent can reach it (host
//! mode; the chart mounts it only when asked, since the socket controls every container).

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nodeward_api::conditions::node::{CONTAINER_RUNTIME_UNHEALTHY, FREQUENT_CONTAINERD_RESTART};

use super::{
    AgentContext, Detector, Finding, Section, Status, cri,
    kubelet::{RestartHistory, RestartLimit},
};
use crate::host::systemd::{self, UnitState};

super::section! {
    pub struct ContainerRuntimeConfig {
        /// The runtime's systemd unit, read over the system bus.
        pub unit: String,
        /// This many restarts of the unit within the window set `FrequentContainerdRestart`
        /// (node-problem-detector's name, whichever runtime the unit is).
        pub frequent_restarts: RestartLimit,
        /// The CRI socket asked for the runtime's status; empty, or not there, skips it.
        pub cri_socket: PathBuf,
    }
}

impl Default for ContainerRuntimeConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            hold: Duration::from_secs(60),
            unit: "containerd.service".to_owned(),
            // node-problem-detector's: 5 starts in 20 minutes.
            frequent_restarts: RestartLimit {
                count: 5,
                window: Duration::from_secs(20 * 60),
            },
            cri_socket: PathBuf::from("/run/containerd/containerd.sock"),
        }
    }
}

pub const DETECTOR: &str = "container-runtime";
pub const RESTARTS_DETECTOR: &str = "container-runtime-restarts";

impl Section for ContainerRuntimeConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        if self.unit.is_empty() {
            return Err(format!(
                "{place}.unit: name the runtime's systemd unit, e.g. containerd.service or crio.service"
            ));
        }
        if self.frequent_restarts.count == 0 {
            return Err(format!(
                "{place}.frequentRestarts.count: must be at least 1, e.g. 5"
            ));
        }
        if !self.cri_socket.as_os_str().is_empty() && !self.cri_socket.is_absolute() {
            return Err(format!(
                "{place}.criSocket: {} must be an absolute path, e.g. /run/containerd/containerd.sock (or empty to skip it)",
                self.cri_socket.display()
            ));
        }
        Ok(())
    }

    fn detectors(&self, _agent: Option<&AgentContext>) -> Vec<Detector> {
        if !self.enabled {
            return Vec::new();
        }
        let history: Arc<Mutex<RestartHistory>> = Arc::default();
        vec![
            Detector::new(
                DETECTOR,
                CONTAINER_RUNTIME_UNHEALTHY,
                self.schedule(),
                self.clone(),
                |c| async move { observe_health(&c).await },
            ),
            Detector::new(
                RESTARTS_DETECTOR,
                FREQUENT_CONTAINERD_RESTART,
                self.schedule(),
                (self.clone(), history),
                |(c, history)| async move { observe_restarts(&c, &history).await },
            ),
        ]
    }
}

/// What was seen of the runtime.
#[derive(Clone, Debug, PartialEq)]
pub struct Evidence {
    /// The unit as systemd reports it, or why it could not be read (no systemd here).
    pub unit: Result<UnitState, String>,
    /// The CRI socket's answers; `None` when no socket is configured or visible here.
    pub cri: Option<Result<cri::Answer, String>>,
}

async fn observe_health(config: &ContainerRuntimeConfig) -> Finding {
    let unit = systemd::unit_state(&config.unit).await;
    let visible = !config.cri_socket.as_os_str().is_empty()
        && tokio::fs::try_exists(&config.cri_socket)
            .await
            .unwrap_or(false);
    let cri = match visible {
        true => Some(cri::ask(&config.cri_socket).await),
        false => None,
    };
    evaluate(&Evidence { unit, cri }, config)
}

pub fn evaluate(evidence: &Evidence, config: &ContainerRuntimeConfig) -> Finding {
    let problem = |reason: &str, message: String| {
        Finding::problem(DETECTOR, CONTAINER_RUNTIME_UNHEALTHY, reason, message)
    };
    let unit = evidence
        .unit
        .as_ref()
        .ok()
        .filter(|u| u.load_state == "loaded");
    if let Some(u) = unit.filter(|u| u.active_state != "active") {
        return problem(
            "ContainerRuntimeUnitInactive",
            format!("{} is {} ({})", config.unit, u.active_state, u.sub_state),
        );
    }
    let socket = config.cri_socket.display();
    match (&evidence.cri, unit) {
        (Some(Err(e)), _) => problem("CRINotAnswering", e.clone()),
        (Some(Ok(answer)), _) => {
            let name = format!(
                "{} {}",
                answer.version.runtime_name, answer.version.runtime_version
            );
            match answer
                .conditions
                .iter()
                .find(|c| c.r#type == "RuntimeReady")
            {
                Some(ready) if !ready.status => problem(
                    "RuntimeNotReady",
                    format!(
                        "{name} at {socket} is not ready: {} {}",
                        ready.reason, ready.message
                    ),
                ),
                None => problem(
                    "RuntimeNotReady",
                    format!("{name} at {socket} reports no RuntimeReady condition"),
                ),
                Some(_) => Finding::ok(
                    DETECTOR,
                    CONTAINER_RUNTIME_UNHEALTHY,
                    "ContainerRuntimeIsHealthy",
                    format!("{name} answers at {socket}: RuntimeReady"),
                ),
            }
        }
        (None, Some(_)) => Finding::ok(
            DETECTOR,
            CONTAINER_RUNTIME_UNHEALTHY,
            "ContainerRuntimeIsHealthy",
            format!(
                "{} is active (the CRI socket is not visible here)",
                config.unit
            ),
        ),
        (None, None) => Finding::unknown(
            DETECTOR,
            CONTAINER_RUNTIME_UNHEALTHY,
            "NoContainerRuntime",
            format!(
                "neither {} nor a CRI socket at {socket} is visible: {}",
                config.unit,
                evidence
                    .unit
                    .as_ref()
                    .err()
                    .map_or("not loaded", String::as_str)
            ),
        ),
    }
}

async fn observe_restarts(
    config: &ContainerRuntimeConfig,
    history: &Arc<Mutex<RestartHistory>>,
) -> Finding {
    let restarts = systemd::unit_state(&config.unit)
        .await
        .and_then(|u| {
            u.restarts
                .ok_or_else(|| format!("{} is not a service systemd restarts", config.unit))
        })
        .map(|count| {
            history
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .record(Instant::now(), count, config.frequent_restarts.window)
        });
    evaluate_restarts(restarts, config)
}

/// `recent`: the restarts systemd made within the window, or why they are not known.
pub fn evaluate_restarts(recent: Result<u32, String>, config: &ContainerRuntimeConfig) -> Finding {
    let limit = &config.frequent_restarts;
    let window = humantime::format_duration(limit.window);
    let unit = &config.unit;
    let (status, reason, message) = match recent {
        Ok(n) if n >= limit.count => {
            let seen = format!("{unit} restarted {n} times in the last {window}");
            (Status::Problem, "FrequentContainerdRestart", seen)
        }
        Ok(n) => {
            let from = limit.count;
            let seen =
                format!("{unit} restarted {n} times in the last {window} (a problem from {from})");
            (Status::Ok, "NoFrequentContainerdRestart", seen)
        }
        Err(e) => (Status::Unknown, "RestartsUnknown", e),
    };
    Finding::new(
        RESTARTS_DETECTOR,
        FREQUENT_CONTAINERD_RESTART,
        status,
        reason,
        message,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{Status, cri::RuntimeCondition};

    fn unit(active_state: &str) -> Result<UnitState, String> {
        Ok(UnitState::loaded(active_state))
    }

    fn answer(ready: bool) -> Option<Result<cri::Answer, String>> {
        Some(Ok(cri::Answer {
            version: cri::VersionResponse {
                runtime_name: "containerd".into(),
                runtime_version: "1.6.20".into(),
            },
            conditions: vec![RuntimeCondition {
                r#type: "RuntimeReady".into(),
                status: ready,
                reason: if ready { "" } else { "ContainerdNotReady" }.into(),
                message: String::new(),
            }],
        }))
    }

    #[test]
    fn an_inactive_unit_or_a_silent_socket_is_a_problem() {
        let config = ContainerRuntimeConfig::default();
        let check = |unit, cri| evaluate(&Evidence { unit, cri }, &config);
        check(unit("failed"), None).assert_is(Status::Problem, "ContainerRuntimeUnitInactive");
        check(
            unit("active"),
            Some(Err(
                "connecting to /run/containerd/containerd.sock: refused".into(),
            )),
        )
        .assert_is(Status::Problem, "CRINotAnswering");
        let not_ready = check(unit("active"), answer(false));
        not_ready.assert_is(Status::Problem, "RuntimeNotReady");
        assert!(
            not_ready.message.contains("containerd 1.6.20"),
            "{}",
            not_ready.message
        );
    }

    #[test]
    fn a_ready_runtime_or_an_active_unit_is_healthy_and_nothing_seen_is_unknown() {
        let config = ContainerRuntimeConfig::default();
        let check = |unit, cri| evaluate(&Evidence { unit, cri }, &config);
        check(unit("active"), answer(true)).assert_is(Status::Ok, "ContainerRuntimeIsHealthy");
        // In a pod without the socket: the unit alone.
        check(unit("active"), None).assert_is(Status::Ok, "ContainerRuntimeIsHealthy");
        // No systemd, but the socket answers (a runtime not run by systemd).
        check(Err("no system bus".into()), answer(true))
            .assert_is(Status::Ok, "ContainerRuntimeIsHealthy");
        check(Err("no system bus".into()), None).assert_is(Status::Unknown, "NoContainerRuntime");
    }

    #[test]
    fn restarts_from_the_limit_on_are_frequent() {
        let config = ContainerRuntimeConfig::default();
        evaluate_restarts(Ok(5), &config).assert_is(Status::Problem, "FrequentContainerdRestart");
        let ok = evaluate_restarts(Ok(4), &config);
        ok.assert_is(Status::Ok, "NoFrequentContainerdRestart");
        assert_eq!(
            ok.message,
            "containerd.service restarted 4 times in the last 20m (a problem from 5)"
        );
        evaluate_restarts(Err("no system bus".into()), &config)
            .assert_is(Status::Unknown, "RestartsUnknown");
    }

    #[test]
    fn a_bad_section_names_the_field() {
        let mut config = ContainerRuntimeConfig {
            cri_socket: PathBuf::from("containerd.sock"),
            ..Default::default()
        };
        let e = config
            .validate("detectors.containerRuntime")
            .expect_err("relative");
        assert!(
            e.starts_with("detectors.containerRuntime.criSocket:"),
            "{e}"
        );
        config.cri_socket = PathBuf::new();
        config
            .validate("detectors.containerRuntime")
            .expect("empty skips the socket");
        config.unit = String::new();
        let e = config
            .validate("detectors.containerRuntime")
            .expect_err("no unit");
        assert!(e.starts_with("detectors.containerRuntime.unit:"), "{e}");
    }
}
