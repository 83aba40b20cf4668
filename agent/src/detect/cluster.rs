//! Detectors that talk to the cluster: the API server is reachable, and this node is
//! registered (its Node object exists) within the registration timeout. Without a cluster
//! (`check` on a workstation) they report that they were skipped.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::{Api, runtime::reflector};
use nodeward_api::conditions::node::{KUBELET_UNREGISTERED, NETWORK_PROBLEM};

use super::{Finding, Status};

pub const APISERVER_DETECTOR: &str = "apiserver";
pub const REGISTRATION_DETECTOR: &str = "registration";
pub const SKIPPED: &str = "skipped: no cluster configured";

/// What the cluster detectors need.
#[derive(Clone)]
pub struct ClusterContext {
    pub client: kube::Client,
    pub node_name: String,
    /// When the agent started: the registration timeout counts from here.
    pub started: Instant,
    /// This node's Node as the agent's own watch of it holds it (see
    /// [`crate::policies::follow`]): the registration check reads it from there and asks the
    /// API server only while it is missing, so a registered node costs no periodic GET of
    /// its Node (a whole Node object, tens of KiB with its image list, every detector round).
    pub own_node: reflector::Store<Node>,
}

impl std::fmt::Debug for ClusterContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterContext")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

pub fn skipped(detector: &'static str, condition: &'static str) -> Finding {
    Finding::new(
        detector,
        condition,
        Status::Skipped,
        "NoCluster",
        SKIPPED.to_owned(),
    )
}

/// What asking the API server for its version gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Version(String),
    Failed(String),
    /// No answer within this long: a firewall that drops the packets, a hung API server.
    Silent(Duration),
}

/// Asks the API server for its version, waiting `within` at most: a silent API server is
/// unreachable, not a check that could not decide (which would read Unknown after a minute).
pub async fn observe_apiserver(cluster: Option<&ClusterContext>, within: Duration) -> Finding {
    let Some(cluster) = cluster else {
        return skipped(APISERVER_DETECTOR, NETWORK_PROBLEM);
    };
    let answer = match tokio::time::timeout(within, cluster.client.apiserver_version()).await {
        Ok(Ok(version)) => Answer::Version(version.git_version),
        Ok(Err(e)) => Answer::Failed(e.to_string()),
        Err(_) => Answer::Silent(within),
    };
    evaluate_apiserver(&answer)
}

pub fn evaluate_apiserver(answer: &Answer) -> Finding {
    let (status, reason, message) = match answer {
        Answer::Version(version) => (
            Status::Ok,
            "APIServerReachable",
            format!("API server {version} answers"),
        ),
        Answer::Failed(e) => (
            Status::Problem,
            "APIServerUnreachable",
            format!("the API server does not answer: {e}"),
        ),
        Answer::Silent(within) => (
            Status::Problem,
            "APIServerUnreachable",
            format!("the API server does not answer: nothing within {within:?}"),
        ),
    };
    Finding::new(APISERVER_DETECTOR, NETWORK_PROBLEM, status, reason, message)
}

/// What the registration check saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    Registered,
    Missing { waited: Duration, timeout: Duration },
    Failed(String),
}

pub async fn observe_registration(cluster: Option<&ClusterContext>, timeout: Duration) -> Finding {
    let Some(cluster) = cluster else {
        return skipped(REGISTRATION_DETECTOR, KUBELET_UNREGISTERED);
    };
    if cluster
        .own_node
        .get(&reflector::ObjectRef::new(&cluster.node_name))
        .is_some()
    {
        return evaluate_registration(&cluster.node_name, &Registration::Registered);
    }
    let seen = match Api::<Node>::all(cluster.client.clone())
        .get_opt(&cluster.node_name)
        .await
    {
        Ok(Some(_)) => Registration::Registered,
        Ok(None) => Registration::Missing {
            waited: cluster.started.elapsed(),
            timeout,
        },
        Err(e) => Registration::Failed(format!("reading node {}: {e}", cluster.node_name)),
    };
    evaluate_registration(&cluster.node_name, &seen)
}

pub fn evaluate_registration(node: &str, seen: &Registration) -> Finding {
    let finding = |status, reason: &str, message| {
        Finding::new(
            REGISTRATION_DETECTOR,
            KUBELET_UNREGISTERED,
            status,
            reason,
            message,
        )
    };
    match seen {
        Registration::Registered => finding(
            Status::Ok,
            "NodeRegistered",
            format!("node {node} is registered"),
        ),
        Registration::Missing { waited, timeout } if waited < timeout => finding(
            Status::Ok,
            "RegistrationPending",
            format!(
                "no Node {node} yet, {}s of the {}s registration timeout passed",
                waited.as_secs(),
                timeout.as_secs()
            ),
        ),
        Registration::Missing { timeout, .. } => finding(
            Status::Problem,
            "KubeletUnregistered",
            format!(
                "no Node object {node} after the {}s registration timeout: the kubelet has not registered",
                timeout.as_secs()
            ),
        ),
        Registration::Failed(e) => finding(Status::Unknown, "RegistrationUnknown", e.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unregistered_only_after_the_timeout() {
        let missing_for = |seconds| {
            let waited = Duration::from_secs(seconds);
            let timeout = Duration::from_secs(600);
            evaluate_registration("n1", &Registration::Missing { waited, timeout })
        };
        missing_for(120).assert_is(Status::Ok, "RegistrationPending");
        let late = missing_for(600);
        late.assert_is(Status::Problem, "KubeletUnregistered");
        late.assert_says("no Node object n1 after the 600s");
        assert_eq!(
            evaluate_registration("n1", &Registration::Registered).status,
            Status::Ok
        );
        assert_eq!(
            evaluate_registration("n1", &Registration::Failed("boom".into())).status,
            Status::Unknown
        );
    }

    #[test]
    fn an_api_server_that_fails_or_stays_silent_is_unreachable() {
        let answers = evaluate_apiserver(&Answer::Version("v1.34.4".into()));
        answers.assert_is(Status::Ok, "APIServerReachable");
        answers.assert_says("API server v1.34.4 answers");
        let refused = evaluate_apiserver(&Answer::Failed("connection refused".into()));
        refused.assert_is(Status::Problem, "APIServerUnreachable");
        refused.assert_says("connection refused");
        let silent = evaluate_apiserver(&Answer::Silent(Duration::from_millis(4500)));
        silent.assert_is(Status::Problem, "APIServerUnreachable");
        silent.assert_says("nothing within 4.5s");
    }

    /// An API server whose packets are dropped: the connection is taken (by the kernel's
    /// backlog) and never answered.
    #[tokio::test]
    async fn a_silent_api_server_is_unreachable_within_the_bound() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a listener");
        let url = format!("http://{}", silent.local_addr().expect("its address"));
        let config = kube::Config::new(url.parse().expect("a valid URL"));
        let client = kube::Client::try_from(config).expect("a client");
        let cluster = ClusterContext {
            client,
            node_name: "n1".into(),
            started: Instant::now(),
            own_node: reflector::store::<Node>().0,
        };
        let asked = Instant::now();
        let finding = observe_apiserver(Some(&cluster), Duration::from_millis(300)).await;
        finding.assert_is(Status::Problem, "APIServerUnreachable");
        finding.assert_says("nothing within 300ms");
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{:?}",
            asked.elapsed()
        );
    }

    #[tokio::test]
    async fn without_a_cluster_both_are_skipped() {
        let api = observe_apiserver(None, Duration::from_secs(1)).await;
        assert_eq!(
            (api.status, api.message.as_str()),
            (Status::Skipped, SKIPPED)
        );
        let registration = observe_registration(None, Duration::from_secs(1)).await;
        assert_eq!(registration.status, Status::Skipped);
    }

    /// A registered node is read from the agent's own watch of it: the check succeeds with
    /// an API server that answers nothing, and asks the API server only while the watch
    /// has not delivered the Node.
    #[tokio::test]
    async fn a_watched_node_needs_no_request() {
        // Nothing listens on port 1: any request fails at once.
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("a valid URL"));
        let client = kube::Client::try_from(config).expect("a client");
        let (own_node, mut writer) = reflector::store::<Node>();
        let cluster = ClusterContext {
            client,
            node_name: "n1".into(),
            started: Instant::now(),
            own_node,
        };
        let timeout = Duration::from_secs(600);
        let before = observe_registration(Some(&cluster), timeout).await;
        assert_eq!(
            before.status,
            Status::Unknown,
            "asked the API server: {before:?}"
        );
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(node));
        observe_registration(Some(&cluster), timeout)
            .await
            .assert_is(Status::Ok, "NodeRegistered");
    }
}
