//! The kubelet: its health endpoint answers `ok`, its systemd unit is active (when systemd is
//! there) and does not restart again and again, and its process runs. A machine with no
//! kubelet at all (no process, unit or `/var/lib/kubelet`) is not a node: that is Unknown, not
//! a problem, so that `check` on a workstation stays useful.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use hyper::{Method, StatusCode};
use nodeward_api::conditions::node::{KUBELET_PROBLEM, KUBELET_UNREGISTERED};
use serde::Deserialize;

use super::{AgentContext, Detector, Finding, Section, cluster};
use crate::flags::{self, Flag};
use crate::{
    host::systemd::{self, UnitState},
    http,
};

super::section! {
    pub struct KubeletConfig {
        /// The kubelet's health endpoint.
        #[serde(rename = "healthzURL")]
        pub healthz_url: String,
        /// A node whose Node object does not exist this long after the agent started is
        /// reported as `KubeletUnregistered`.
        #[serde(deserialize_with = "crate::values::duration")]
        pub registration_timeout: Duration,
        /// The kubelet's systemd unit, read over the system bus when systemd is there.
        pub unit: String,
        /// This many restarts of the unit within the window are a problem (`FrequentRestarts`).
        pub frequent_restarts: RestartLimit,
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RestartLimit {
    pub count: u32,
    #[serde(deserialize_with = "crate::values::duration")]
    pub window: Duration,
}

impl Default for RestartLimit {
    fn default() -> Self {
        Self {
            count: 3,
            window: Duration::from_secs(600),
        }
    }
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            hold: Duration::from_secs(60),
            healthz_url: "http://127.0.0.1:10248/healthz".to_owned(),
            registration_timeout: Duration::from_secs(600),
            unit: "kubelet.service".to_owned(),
            frequent_restarts: RestartLimit::default(),
        }
    }
}

impl Section for KubeletConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        crate::values::http_url(&format!("{place}.healthzURL"), &self.healthz_url)?;
        if self.frequent_restarts.count == 0 {
            return Err(format!(
                "{place}.frequentRestarts.count: must be at least 1, e.g. 3"
            ));
        }
        Ok(())
    }

    fn detectors(&self, agent: Option<&AgentContext>) -> Vec<Detector> {
        if !self.enabled {
            return Vec::new();
        }
        let schedule = self.schedule();
        let history: Arc<Mutex<RestartHistory>> = Arc::default();
        let registration = (agent.map(|a| a.cluster.clone()), self.registration_timeout);
        vec![
            Detector::new(
                DETECTOR,
                KUBELET_PROBLEM,
                schedule,
                (self.clone(), history),
                |(c, history)| async move { observe(&c, &history).await },
            ),
            Detector::new(
                cluster::REGISTRATION_DETECTOR,
                KUBELET_UNREGISTERED,
                schedule,
                registration,
                |(cluster, timeout)| async move {
                    cluster::observe_registration(cluster.as_ref(), timeout).await
                },
            ),
        ]
    }

    fn flags(&self) -> Vec<Flag> {
        flags::declare! {
            "registration-timeout" ("NODEWARD_REGISTRATION_TIMEOUT") => "registrationTimeout": Text, "How long a Node may be missing before KubeletUnregistered, e.g. 10m";
            "kubelet-healthz-url" ("NODEWARD_KUBELET_HEALTHZ_URL") => "healthzURL": Text, "The kubelet's health endpoint";
        }
    }
}

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
    /// The unit as systemd reports it, or why it could not be read (no systemd here).
    pub unit: Result<UnitState, String>,
    /// Restarts systemd made within the configured window, when known.
    pub recent_restarts: Option<u32>,
}

/// The unit's restart counter over time, to tell restarts within a window.
#[derive(Debug, Default)]
pub struct RestartHistory(VecDeque<(Instant, u32)>);

impl RestartHistory {
    /// Records the counter at `now` and returns the restarts seen between the samples taken
    /// within `window` before it.
    pub fn record(&mut self, now: Instant, restarts: u32, window: Duration) -> u32 {
        // A counter that went down means systemd (or the unit) was reset: start over.
        if self.0.back().is_some_and(|(_, last)| *last > restarts) {
            self.0.clear();
        }
        self.0.push_back((now, restarts));
        while self
            .0
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > window)
        {
            self.0.pop_front();
        }
        self.0.front().map_or(0, |(_, first)| restarts - first)
    }
}

pub async fn observe(config: &KubeletConfig, history: &Arc<Mutex<RestartHistory>>) -> Finding {
    let healthz = match http::request(Method::GET, &config.healthz_url, &[]).await {
        Ok(reply) if reply.status == StatusCode::OK && reply.body.trim_ascii() == b"ok" => Ok(()),
        Ok(reply) => Err(format!(
            "{} answered {}: {}",
            config.healthz_url,
            reply.status,
            nodeward_api::bounds::excerpt(&reply.body, 80)
        )),
        Err(e) => Err(e.to_string()),
    };
    let unit = systemd::unit_state(&config.unit).await;
    let recent_restarts = unit.as_ref().ok().and_then(|u| u.restarts).map(|count| {
        let mut history = history
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        history.record(Instant::now(), count, config.frequent_restarts.window)
    });
    // A kubelet whose healthz answers ok runs and is installed: the walk of /proc (a read of
    // every process's name, each check) is only for telling why healthz did not answer.
    let (process, installed) = match &healthz {
        Ok(()) => (true, true),
        Err(_) => (
            process_running("kubelet").await,
            tokio::fs::try_exists(KUBELET_STATE_DIR)
                .await
                .unwrap_or(false),
        ),
    };
    let evidence = Evidence {
        process,
        installed,
        healthz,
        unit,
        recent_restarts,
    };
    evaluate(&evidence, config)
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

pub fn evaluate(evidence: &Evidence, config: &KubeletConfig) -> Finding {
    let unit = evidence
        .unit
        .as_ref()
        .ok()
        .filter(|u| u.load_state == "loaded");
    let problem = |reason: &str, message: String| {
        Finding::problem(DETECTOR, KUBELET_PROBLEM, reason, message)
    };
    let limit = &config.frequent_restarts;
    if let Some(restarts) = evidence.recent_restarts.filter(|r| *r >= limit.count) {
        return problem(
            "FrequentRestarts",
            format!(
                "{} restarted {restarts} times in the last {}s",
                config.unit,
                limit.window.as_secs()
            ),
        );
    }
    match (&evidence.healthz, unit) {
        (Ok(()), _) => Finding::ok(
            DETECTOR,
            KUBELET_PROBLEM,
            "KubeletHealthy",
            "healthz answered ok".into(),
        ),
        (Err(e), Some(u)) if u.active_state != "active" => problem(
            "KubeletUnitInactive",
            format!(
                "{} is {} ({}); healthz: {e}",
                config.unit, u.active_state, u.sub_state
            ),
        ),
        (Err(e), _) if evidence.process => problem(
            "KubeletUnhealthy",
            format!("the kubelet runs but is unhealthy: {e}"),
        ),
        (Err(e), Some(_)) => problem(
            "KubeletNotRunning",
            format!(
                "{} is active but no kubelet process answers: {e}",
                config.unit
            ),
        ),
        (Err(e), None) if evidence.installed => problem(
            "KubeletNotRunning",
            format!("no kubelet process and healthz failed: {e}"),
        ),
        (Err(e), None) => Finding::unknown(
            DETECTOR,
            KUBELET_PROBLEM,
            "NoKubelet",
            format!(
                "no kubelet on this machine (no process, unit or {KUBELET_STATE_DIR}); healthz: {e}"
            ),
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
            unit: Err("no system bus".into()),
            recent_restarts: None,
        }
    }

    fn unit(active_state: &str) -> Result<UnitState, String> {
        Ok(UnitState::loaded(active_state))
    }

    #[test]
    fn healthz_ok_is_healthy_even_without_seeing_the_process() {
        assert_eq!(
            evaluate(&evidence(false, true, Ok(())), &KubeletConfig::default()).status,
            Status::Ok
        );
    }

    #[test]
    fn failures_say_whether_the_process_runs() {
        let config = KubeletConfig::default();
        let dead = evaluate(&evidence(false, true, Err("connection refused")), &config);
        dead.assert_is(Status::Problem, "KubeletNotRunning");
        let sick = evaluate(&evidence(true, true, Err("500")), &config);
        sick.assert_is(Status::Problem, "KubeletUnhealthy");
        let none = evaluate(&evidence(false, false, Err("connection refused")), &config);
        none.assert_is(Status::Unknown, "NoKubelet");
    }

    #[test]
    fn a_failed_unit_is_named_with_its_state() {
        let mut e = evidence(false, false, Err("connection refused"));
        e.unit = unit("failed");
        let found = evaluate(&e, &KubeletConfig::default());
        found.assert_is(Status::Problem, "KubeletUnitInactive");
        assert!(
            found
                .message
                .starts_with("kubelet.service is failed (failed)"),
            "{}",
            found.message
        );
    }

    #[test]
    fn frequent_restarts_are_a_problem_even_when_healthy_now() {
        let config = KubeletConfig::default();
        let mut e = evidence(true, true, Ok(()));
        e.unit = unit("active");
        e.recent_restarts = Some(config.frequent_restarts.count);
        let found = evaluate(&e, &config);
        found.assert_is(Status::Problem, "FrequentRestarts");
        e.recent_restarts = Some(config.frequent_restarts.count - 1);
        assert_eq!(evaluate(&e, &config).status, Status::Ok);
    }

    #[test]
    fn restart_history_counts_within_the_window_and_survives_a_reset() {
        let t0 = Instant::now();
        let window = Duration::from_secs(600);
        let mut history = RestartHistory::default();
        assert_eq!(history.record(t0, 5, window), 0);
        assert_eq!(history.record(t0 + Duration::from_secs(60), 7, window), 2);
        assert_eq!(history.record(t0 + Duration::from_secs(300), 8, window), 3);
        // The first two samples fall out of the window; only restarts seen between samples
        // inside it count (conservative: never a restart from before the window).
        assert_eq!(history.record(t0 + Duration::from_secs(700), 8, window), 0);
        assert_eq!(history.record(t0 + Duration::from_secs(720), 10, window), 2);
        // systemd restarted: the counter starts again at 0.
        assert_eq!(history.record(t0 + Duration::from_secs(760), 0, window), 0);
        assert_eq!(history.record(t0 + Duration::from_secs(790), 3, window), 3);
    }

    #[tokio::test]
    async fn finds_a_running_process_by_name() {
        let me = std::fs::read_to_string("/proc/self/comm").expect("comm");
        assert!(process_running(me.trim_end()).await);
        assert!(!process_running("no-such-process-xyz").await);
    }
}
