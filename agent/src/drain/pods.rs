//! The drained node's pods, watched for the length of a drain (field selector
//! `spec.nodeName`, as the kubelet watches them): a pod's departure is seen when the API server
//! sends it rather than at the next poll, and a draining node costs the API server one watch
//! rather than a LIST four times a second. The watch starts when the drain first waits (not
//! beside its first reads and evictions, each of which wants a connection of its own); until it
//! has listed, and after it failed until it lists again, the drain lists the pods itself.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    runtime::{WatchStreamExt, reflector, reflector::Store, watcher},
};
use nodeward_api::{PodType, maintenance::WorkloadRef};
use nodeward_runtime::ApiError;
use tokio::{sync::Notify, task::JoinHandle, time::Instant};

use super::plan::{self, PodInfo, key};
use crate::Error;

/// How long past its grace period a terminating pod is still waited for: by then the kubelet
/// has killed it, and waiting for its report holds nothing back (kubectl drain's
/// `--skip-wait-for-delete-timeout`). A slow kubelet then no longer runs a drain stage out of
/// time for a pod that was already let go.
pub const PAST_GRACE: Duration = Duration::from_secs(10);

/// When the drain stops waiting for `pod`: [`PAST_GRACE`] after its grace period ends, if it
/// is terminating.
pub fn let_go_at(pod: &Pod) -> Option<jiff::Timestamp> {
    pod.metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|t| t.0.checked_add(PAST_GRACE).ok())
}

/// Whether the drain still waits for `pod` at `now`: it has not ended (Succeeded, Failed) and
/// has not been let go.
pub fn waited_for(pod: &Pod, now: jiff::Timestamp) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed")) && let_go_at(pod).is_none_or(|end| end >= now)
}

/// Kinds of pods, as the plan sees them.
fn pod_type(pod: &Pod) -> PodType {
    let mirror = pod
        .annotations()
        .contains_key("kubernetes.io/config.mirror");
    let controller = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    match controller.map(|o| o.kind.as_str()) {
        _ if mirror => PodType::Static,
        Some("Node") => PodType::Static,
        Some("DaemonSet") => PodType::DaemonSet,
        _ => PodType::Default,
    }
}

pub fn info(
    pod: &Pod,
    namespaces: &HashMap<String, BTreeMap<String, String>>,
    taint: &str,
) -> PodInfo {
    let namespace = pod.namespace().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let controlled = pod
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind != "Node");
    let returns = controlled
        && spec
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| plan::tolerates(t, taint)));
    PodInfo {
        returns,
        namespace_labels: namespaces.get(&namespace).cloned().unwrap_or_default(),
        namespace,
        name: pod.name_any(),
        pod_type: pod_type(pod),
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        labels: pod.labels().clone(),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        grace_period_seconds: spec.and_then(|s| s.termination_grace_period_seconds),
        controller: pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && WorkloadRef::KINDS.contains(&o.kind.as_str()))
            .map(|o| WorkloadRef {
                kind: o.kind.clone(),
                namespace: pod.namespace().unwrap_or_default(),
                name: o.name.clone(),
            }),
    }
}

/// The pods of one node, watched while a drain runs; the watch stops when this is dropped.
pub struct NodePods {
    client: Client,
    node: String,
    /// Whether the store follows the API server: it has listed and no watch error came since.
    following: Arc<AtomicBool>,
    changed: Arc<Notify>,
    /// Whether the pods are to be watched (else every read lists).
    watched: bool,
    /// The watch and the store it fills, once started.
    watch: Option<(Store<Pod>, JoinHandle<()>)>,
}

impl NodePods {
    /// The pods of `node`, watched from the drain's first wait on.
    pub fn watched(client: &Client, node: &str) -> Self {
        Self::new(client, node, true)
    }

    /// The pods of `node`, listed at each read (for a single read: no watch to start).
    pub fn listed(client: &Client, node: &str) -> Self {
        Self::new(client, node, false)
    }

    fn new(client: &Client, node: &str, watched: bool) -> Self {
        Self {
            client: client.clone(),
            node: node.to_owned(),
            following: Arc::new(AtomicBool::new(false)),
            changed: Arc::new(Notify::new()),
            watched,
            watch: None,
        }
    }

    /// Starts the watch, once.
    fn follow(&mut self) {
        if !self.watched || self.watch.is_some() {
            return;
        }
        let (store, writer) = reflector::store::<Pod>();
        let api: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        // Managed fields are most of a pod's bytes, and the drain reads none of them.
        let stream = watcher(api, config)
            .default_backoff()
            .modify(|pod| pod.managed_fields_mut().clear());
        let events = reflector(writer, stream);
        let (following, changed) = (self.following.clone(), self.changed.clone());
        let node = self.node.clone();
        let watch = tokio::spawn(events.for_each(move |event| {
            match event {
                Ok(watcher::Event::InitDone | watcher::Event::Apply(_))
                | Ok(watcher::Event::Delete(_)) => following.store(true, Ordering::Release),
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Err(e) => {
                    following.store(false, Ordering::Release);
                    tracing::debug!(error = %e, %node, "watching the drained node's pods failed; listing them until it lists again");
                }
            }
            changed.notify_one();
            futures::future::ready(())
        }));
        self.watch = Some((store, watch));
    }

    /// Whether the pods come from the watch (else each read is a LIST).
    fn followed(&self) -> bool {
        self.following.load(Ordering::Acquire)
    }

    /// The pods of the node the drain still waits for ([`waited_for`]), by `namespace/name`.
    pub async fn current(&self) -> Result<HashMap<String, Pod>, Error> {
        let now = jiff::Timestamp::now();
        let pods: Vec<Pod> =
            if let Some((store, _)) = self.watch.as_ref().filter(|_| self.followed()) {
                store.state().iter().map(|p| (**p).clone()).collect()
            } else {
                Api::<Pod>::all(self.client.clone())
                    .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.node)))
                    .await
                    .map_err(|e| {
                        ApiError::new("listing the pods of", format!("node {}", self.node), e)
                    })?
                    .items
            };
        Ok(pods
            .into_iter()
            .filter(|p| waited_for(p, now))
            .map(|p| (key(&p.namespace().unwrap_or_default(), &p.name_any()), p))
            .collect())
    }

    /// Waits until a pod of the node changes, `until`, or `poll` from now when the pods are
    /// not followed, whichever comes first.
    pub async fn change_or(&mut self, until: Instant, poll: Duration) {
        self.follow();
        let until = if self.followed() {
            until
        } else {
            until.min(Instant::now() + poll)
        };
        tokio::select! {
            () = self.changed.notified() => {}
            () = tokio::time::sleep_until(until) => {}
        }
    }
}

impl Drop for NodePods {
    fn drop(&mut self) {
        if let Some((_, watch)) = &self.watch {
            watch.abort();
        }
    }
}

/// The instant on the drain's clock at which `at` (wall time) comes, now if it has passed.
pub fn instant_of(at: jiff::Timestamp) -> Instant {
    let ahead = at.duration_since(jiff::Timestamp::now());
    Instant::now() + Duration::try_from(ahead).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn pod(phase: &str, deleted_at: Option<jiff::Timestamp>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.deletion_timestamp = deleted_at.map(Time);
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some(phase.to_owned()),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn a_pod_past_its_grace_period_is_no_longer_waited_for() {
        let now: jiff::Timestamp = "2026-11-25T12:00:00Z".parse().expect("a time");
        let ago = |s: i64| {
            now.checked_sub(jiff::SignedDuration::from_secs(s))
                .expect("a time")
        };
        assert!(waited_for(&pod("Running", None), now));
        // Its grace period ended 5 s ago: the kubelet may still be stopping it.
        assert!(waited_for(&pod("Running", Some(ago(5))), now));
        // 11 s ago: let go.
        assert!(!waited_for(&pod("Running", Some(ago(11))), now));
        assert_eq!(
            let_go_at(&pod("Running", Some(ago(11)))),
            Some(ago(1)),
            "let go 10 s after its grace period"
        );
        assert!(!waited_for(&pod("Succeeded", None), now));
        assert!(!waited_for(&pod("Failed", None), now));
    }
}
