//! Looking reboot blockers up for a round (admission rule 5): the pods on a node that match a
//! policy's `rebootBlockers.podSelectors`, and the alerts Prometheus fires that match its filter.
//! What to look up and what blocks are decided in [`nodeward_decide::blockers`]; this asks the
//! API server and Prometheus, with short-lived caches and a deadline per lookup. A lookup that
//! fails blocks: a disruption is never admitted on a check that could not be made.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{Api, Client, ResourceExt, api::ListParams, core::Selector};
use nodeward_api::policy::RebootBlockers;
use nodeward_decide::blockers::{Alert, AlertFilter, Lookup, in_scope, parse_alerts};

/// How long one Prometheus reply is reused: every pending node of every round asks the same.
const PROMETHEUS_TTL: Duration = Duration::from_secs(10);
/// How long a pod lookup of one node is reused (rounds can follow each other closely).
const PODS_TTL: Duration = Duration::from_secs(2);
/// The longest one lookup may take before it counts as failed (and so as blocking).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// A lookup's answer and when it was made.
type Cached<T> = (Instant, Result<T, String>);

/// Looks blockers up, with short-lived caches.
pub struct Lookups {
    client: Client,
    /// By Prometheus URL.
    prometheus: HashMap<String, Cached<Vec<Alert>>>,
    /// By node and selector field: the first blocking pod.
    pods: HashMap<(String, String), Cached<Option<String>>>,
}

impl Lookups {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            prometheus: HashMap::new(),
            pods: HashMap::new(),
        }
    }

    /// Why each node is blocked now (nodes that are not blocked are absent).
    pub async fn blocked(&mut self, lookups: &[Lookup]) -> BTreeMap<String, String> {
        let now = Instant::now();
        self.prometheus
            .retain(|_, (at, _)| now.duration_since(*at) < PROMETHEUS_TTL);
        self.pods
            .retain(|_, (at, _)| now.duration_since(*at) < PODS_TTL);
        self.fetch_alerts(lookups).await;
        let mut blocked = BTreeMap::new();
        for lookup in lookups {
            if blocked.contains_key(&lookup.node) {
                continue;
            }
            if let Some(why) = self.why_blocked(lookup).await {
                blocked.insert(lookup.node.clone(), why);
            }
        }
        blocked
    }

    /// Asks every Prometheus the lookups name and the cache does not hold, all at once: a slow
    /// or unreachable one costs the round at most one `LOOKUP_TIMEOUT`, however many there are.
    async fn fetch_alerts(&mut self, lookups: &[Lookup]) {
        let urls: BTreeSet<&str> = lookups
            .iter()
            .filter_map(|l| l.blockers.prometheus.as_ref())
            .map(|p| p.url.as_str())
            .filter(|url| !self.prometheus.contains_key(*url))
            .collect();
        let answers = futures::future::join_all(
            urls.iter()
                .map(|url| async move { (url.to_string(), fetch_alerts(url).await) }),
        )
        .await;
        let now = Instant::now();
        for (url, alerts) in answers {
            self.prometheus.insert(url, (now, alerts));
        }
    }

    async fn why_blocked(&mut self, lookup: &Lookup) -> Option<String> {
        let mut scope = None;
        for (index, selector) in lookup.blockers.pod_selectors.iter().enumerate() {
            let field = format!(
                "rebootBlockers.podSelectors[{index}] of policy {}",
                lookup.policy
            );
            let key = (lookup.node.clone(), field.clone());
            let found = match self.pods.get(&key) {
                Some((_, found)) => found.clone(),
                None => {
                    // Looked up with the pods (never reused across lookups: a namespace that
                    // just became trusted must count at once), and only when they are.
                    if scope.is_none() {
                        scope = Some(self.namespace_scope(&lookup.blockers).await);
                    }
                    let namespaces = match &scope {
                        Some(Ok(namespaces)) => namespaces.as_ref(),
                        None => None,
                        Some(Err(e)) => {
                            return Some(format!(
                                "cannot check rebootBlockers.namespaceSelector of policy {}: {e}",
                                lookup.policy
                            ));
                        }
                    };
                    let found = self.blocking_pod(&lookup.node, selector, namespaces).await;
                    self.pods.insert(key, (Instant::now(), found.clone()));
                    found
                }
            };
            match found {
                Ok(Some(pod)) => return Some(format!("pod {pod} matches {field}")),
                Ok(None) => {}
                Err(e) => return Some(format!("cannot check {field}: {e}")),
            }
        }
        let prometheus = lookup.blockers.prometheus.as_ref()?;
        let field = format!("rebootBlockers.prometheus of policy {}", lookup.policy);
        let filter = match AlertFilter::new(prometheus) {
            Err(e) => return Some(format!("policy {}: {e}", lookup.policy)),
            Ok(f) => f,
        };
        let alerts = match self.prometheus.get(&prometheus.url) {
            Some((_, alerts)) => alerts.clone(),
            None => {
                let alerts = fetch_alerts(&prometheus.url).await;
                self.prometheus
                    .insert(prometheus.url.clone(), (Instant::now(), alerts.clone()));
                alerts
            }
        };
        match alerts {
            Err(e) => Some(format!("cannot check {field}: {e}")),
            Ok(alerts) => {
                let names = filter.blocking(&alerts);
                (!names.is_empty()).then(|| {
                    let state = if prometheus.firing_only {
                        "firing"
                    } else {
                        "active"
                    };
                    format!("{state} alerts {} ({field})", names.join(", "))
                })
            }
        }
    }

    /// The namespaces whose pods may block under `blockers` (`None`: every namespace).
    async fn namespace_scope(
        &self,
        blockers: &RebootBlockers,
    ) -> Result<Option<BTreeSet<String>>, String> {
        let Some(selector) = &blockers.namespace_selector else {
            return Ok(in_scope(&blockers.namespaces, None));
        };
        let selector = Selector::try_from(selector.clone()).map_err(|e| e.to_string())?;
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let params = ListParams::default().labels_from(&selector);
        let selected =
            match tokio::time::timeout(LOOKUP_TIMEOUT, namespaces.list_metadata(&params)).await {
                Err(_) => {
                    return Err(format!(
                        "listing namespaces timed out after {LOOKUP_TIMEOUT:?}"
                    ));
                }
                Ok(Err(e)) => return Err(format!("listing namespaces: {e}")),
                Ok(Ok(list)) => list.items.iter().map(|n| n.name_any()).collect(),
            };
        Ok(in_scope(&blockers.namespaces, Some(selected)))
    }

    /// The first running pod on `node` that matches `selector` in a namespace of `scope`, as
    /// namespace/name.
    async fn blocking_pod(
        &self,
        node: &str,
        selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
        scope: Option<&BTreeSet<String>>,
    ) -> Result<Option<String>, String> {
        let selector = Selector::try_from(selector.clone()).map_err(|e| e.to_string())?;
        // Every match on the node (a handful), since some may be out of scope.
        let params = ListParams::default()
            .fields(&format!(
                "spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed"
            ))
            .labels_from(&selector);
        let pods: Api<Pod> = Api::all(self.client.clone());
        match tokio::time::timeout(LOOKUP_TIMEOUT, pods.list_metadata(&params)).await {
            Err(_) => Err(format!("listing pods timed out after {LOOKUP_TIMEOUT:?}")),
            Ok(Err(e)) => Err(format!("listing pods: {e}")),
            Ok(Ok(list)) => Ok(list
                .items
                .iter()
                .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
                .find(|(namespace, _)| scope.is_none_or(|s| s.contains(namespace)))
                .map(|(namespace, name)| format!("{namespace}/{name}"))),
        }
    }
}

async fn fetch_alerts(base: &str) -> Result<Vec<Alert>, String> {
    let url = format!("{}/api/v1/alerts", base.trim_end_matches('/'));
    let request = nodeward_runtime::http::request(
        hyper::Method::GET,
        &url,
        &[("accept", "application/json")],
    );
    let reply = match tokio::time::timeout(LOOKUP_TIMEOUT, request).await {
        Err(_) => return Err(format!("GET {url} timed out after {LOOKUP_TIMEOUT:?}")),
        Ok(Err(e)) => return Err(e.to_string()),
        Ok(Ok(reply)) => reply,
    };
    if !reply.status.is_success() {
        return Err(format!(
            "GET {url} answered {}: {}",
            reply.status,
            nodeward_api::bounds::excerpt(&reply.body, 200)
        ));
    }
    parse_alerts(&reply.body).map_err(|e| format!("GET {url}: {e}"))
}

#[cfg(test)]
mod tests {
    use nodeward_api::policy::PrometheusBlocker;

    use super::*;

    /// Two policies' Prometheus servers that accept and never answer: both are asked at once
    /// (the second connection arrives while the first is still held open), so a round waits
    /// for one lookup deadline, not one per server; both answers are errors naming the URL.
    #[tokio::test]
    async fn every_prometheus_is_asked_at_once() {
        let stalled = || async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let url = format!("http://{}", listener.local_addr().expect("address"));
            (listener, url)
        };
        let (first, first_url) = stalled().await;
        let (second, second_url) = stalled().await;
        let lookup = |node: &str, url: &str| Lookup {
            node: node.into(),
            policy: format!("policy-{node}"),
            blockers: RebootBlockers {
                prometheus: Some(PrometheusBlocker {
                    url: url.into(),
                    alert_filter: None,
                    ignore_alerts: None,
                    firing_only: true,
                }),
                ..RebootBlockers::default()
            },
        };
        let client = Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("url"),
        ))
        .expect("client");
        let mut lookups = Lookups::new(client);
        let asked = [lookup("a", &first_url), lookup("b", &second_url)];
        let round = tokio::spawn(async move { lookups.blocked(&asked).await });
        let (held, _) = first.accept().await.expect("the first is asked");
        let (_, _) = second.accept().await.expect("the second is asked");
        // What the first connection holds: its request, then nothing yet (open), or its end.
        let mut request = [0u8; 4096];
        loop {
            match held.try_read(&mut request) {
                Ok(0) => panic!("the first lookup was given up before the second began"),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("reading the first lookup's request: {e}"),
            }
        }
        let blocked = round.await.expect("the round");
        assert!(blocked["a"].contains(&first_url), "{blocked:?}");
        assert!(blocked["b"].contains(&second_url), "{blocked:?}");
        assert!(blocked["a"].contains("timed out"), "{blocked:?}");
    }
}
