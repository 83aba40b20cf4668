//! The DisruptionPolicies as this node's agent sees them, from one live store filled with what
//! the coordinator publishes for agents (name, generation, spec; see `nodeward_api::fleet`):
//! - the pauses it obeys: every policy with `paused: true` whose selector matches this node's
//!   labels. The agent acknowledges each with the policy generation it saw (in its
//!   NodeReport), and the coordinator reports the policy `Paused=True` only once every agent
//!   in scope has;
//! - whether auto-reboot is on for it;
//! - for a maintenance, which drain plan, drain timeout and health gate apply
//!   ([`effective()`]).

mod effective;

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, reflector, watcher},
};
use nodeward_api::{
    DisruptionPolicy, NodeMaintenance,
    fleet::{POLICIES_CONFIGMAP, POLICIES_KEY, PublishedPolicies},
    report::PauseAcknowledgement,
};
use tokio::sync::{Notify, watch};

pub use effective::{Effective, HealthGate, HostSteps};

/// How long an agent waits to receive a policy that admitted a maintenance. The coordinator
/// publishes a new policy for the agents a moment after it exists, and may admit under it
/// before an agent has it.
const PUBLICATION_WAIT: Duration = Duration::from_secs(15);

/// What applies to `m` under the policies in `store`; waits for the store's first list, so
/// that an agent just started does not mistake "not seen yet" for "no policy". A policy that
/// admitted `m` and is not in the store (deleted since, not yet published, or too large to
/// publish) may have forbidden forcing the drain, so the drain is not forced.
pub async fn effective(
    m: &NodeMaintenance,
    store: &reflector::Store<DisruptionPolicy>,
) -> Effective {
    // The writer lives as long as the agent's watch task; once it is gone, the store is what
    // it last was.
    let _ = store.wait_until_ready().await;
    let (policies, missing) = admitting(m, store);
    let policies: Vec<&DisruptionPolicy> = policies.iter().map(|p| p.as_ref()).collect();
    let mut effective = Effective::of(m, &policies);
    effective.force_on_timeout &= missing.is_empty();
    effective
}

/// Waits up to [`PUBLICATION_WAIT`] for every policy that admitted `m` to reach the agent:
/// before a drain, whose forcing needs the say of each of them.
pub async fn wait_for_admitting(m: &NodeMaintenance, store: &reflector::Store<DisruptionPolicy>) {
    wait_for_admitting_within(m, store, PUBLICATION_WAIT).await;
}

async fn wait_for_admitting_within(
    m: &NodeMaintenance,
    store: &reflector::Store<DisruptionPolicy>,
    wait: Duration,
) {
    let _ = store.wait_until_ready().await;
    let give_up = tokio::time::Instant::now() + wait;
    loop {
        let (_, missing) = admitting(m, store);
        if missing.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= give_up {
            tracing::warn!(maintenance = %m.name_any(), policies = ?missing, "policies that admitted this maintenance are not published to the agents (deleted since, or not yet): deciding without them and never forcing the drain");
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The policies that admitted `m` that the store holds, and the names of those it does not.
fn admitting(
    m: &NodeMaintenance,
    store: &reflector::Store<DisruptionPolicy>,
) -> (Vec<Arc<DisruptionPolicy>>, Vec<String>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for name in m.admitted_policies() {
        match store.get(&reflector::ObjectRef::new(name)) {
            Some(policy) => found.push(policy),
            None => missing.push(name.clone()),
        }
    }
    (found, missing)
}

/// The acknowledgements for `policies` as seen from a node with `labels`, sorted by policy.
/// A policy whose selector cannot be evaluated is obeyed: pausing too much is the safe side.
pub fn acknowledgements(
    policies: &[Arc<DisruptionPolicy>],
    labels: &std::collections::BTreeMap<String, String>,
) -> Vec<PauseAcknowledgement> {
    let mut acks: Vec<PauseAcknowledgement> = policies
        .iter()
        .filter(|p| p.spec.paused)
        // An unreadable selector pauses: stopping too much is the safe side.
        .filter(|p| p.selects(labels).unwrap_or(true))
        .map(|p| PauseAcknowledgement {
            policy: p.name_any(),
            observed_generation: p.metadata.generation.unwrap_or(0),
        })
        .collect();
    acks.sort_by(|a, b| a.policy.cmp(&b.policy));
    // The report holds at most 128; a node under more paused policies than that stays paused.
    acks.truncate(128);
    acks
}

/// Whether a policy selecting this node sets `autoReboot` (an unreadable selector does not:
/// rebooting too much is the unsafe side).
pub fn auto_reboot(
    policies: &[Arc<DisruptionPolicy>],
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    policies
        .iter()
        .filter(|p| p.spec.auto_reboot)
        .any(|p| p.selects(labels).unwrap_or(false))
}

/// What [`follow`] reads and where it publishes.
pub struct Follow {
    pub client: Client,
    pub namespace: String,
    pub node_name: String,
    /// The store the published policies go into (its readers answer [`effective()`]).
    pub policies: reflector::store::Writer<DisruptionPolicy>,
    /// The store this node's Node goes into (the registration check reads it too).
    pub node: reflector::store::Writer<Node>,
    /// Told of every event of this node's Node: the maintenance executor judges a health gate
    /// again at once (a node back Ready, a problem condition gone) instead of on its resync.
    pub node_changed: Arc<Notify>,
    pub pauses: watch::Sender<Vec<PauseAcknowledgement>>,
    pub auto_reboots: watch::Sender<bool>,
    /// The agent's `--auto-reboot` flag: auto-reboot on whatever the policies say.
    pub forced_auto_reboot: bool,
}

/// Follows the policies as the coordinator publishes them for agents and this node's labels,
/// publishing the pauses that apply and whether auto-reboot is on whenever they change. The
/// agent never watches the DisruptionPolicies themselves: their status changes with every
/// admission anywhere in the cluster. Runs until the task is dropped.
pub async fn follow(follow: Follow) {
    let Follow {
        client,
        namespace,
        node_name,
        policies: mut writer,
        node: node_writer,
        node_changed,
        pauses,
        auto_reboots,
        forced_auto_reboot,
    } = follow;
    let changed = Arc::new(Notify::new());
    let policies = writer.as_reader();
    let published = watcher(
        Api::<ConfigMap>::namespaced(client.clone(), &namespace),
        nodeward_runtime::watch::of_few(
            watcher::Config::default().fields(&format!("metadata.name={POLICIES_CONFIGMAP}")),
        ),
    )
    .default_backoff();
    let nodes = node_writer.as_reader();
    let node_events = reflector(
        node_writer,
        watcher(
            Api::all(client),
            watcher::Config::default().fields(&format!("metadata.name={node_name}")),
        )
        .default_backoff(),
    );
    let notify = changed.clone();
    let mut listed: Option<ConfigMap> = None;
    let following_policies = published.for_each(move |event| {
        let current = match event {
            Ok(watcher::Event::Apply(c)) => Some(Some(c)),
            Ok(watcher::Event::Delete(_)) => Some(None),
            Ok(watcher::Event::Init) => {
                listed = None;
                None
            }
            Ok(watcher::Event::InitApply(c)) => {
                listed = Some(c);
                None
            }
            Ok(watcher::Event::InitDone) => Some(listed.take()),
            Err(e) if nodeward_runtime::watch::expired(&e) => {
                tracing::debug!(error = %e, "the watch of the published policies lists afresh");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching the published policies failed; retrying");
                None
            }
        };
        if let Some(current) = current
            && replace(&mut writer, current.as_ref())
        {
            notify.notify_one();
        }
        futures::future::ready(())
    });
    let mut notify_publishing = nodeward_runtime::watch::notifier(changed.clone(), "Node".into());
    let watching = futures::future::join(
        following_policies,
        node_events.for_each(move |event| {
            node_changed.notify_one();
            notify_publishing(event)
        }),
    );
    let publishing = async {
        loop {
            changed.notified().await;
            let labels = nodes
                .state()
                .first()
                .map(|n| n.labels().clone())
                .unwrap_or_default();
            let state = policies.state();
            let auto = forced_auto_reboot || auto_reboot(&state, &labels);
            auto_reboots.send_if_modified(|current| std::mem::replace(current, auto) != auto);
            let acks = acknowledgements(&state, &labels);
            pauses.send_if_modified(|current| {
                if *current == acks {
                    return false;
                }
                tracing::info!(pauses = ?acks.iter().map(|a| &a.policy).collect::<Vec<_>>(), "pauses in effect for this node");
                *current = acks;
                true
            });
        }
    };
    futures::future::join(watching, publishing).await;
}

/// Fills the store with the policies `published` holds (none when it is missing: the
/// coordinator has published nothing yet). Returns false, keeping the store as it was, when
/// the ConfigMap cannot be read, which is logged with the fix.
fn replace(
    writer: &mut reflector::store::Writer<DisruptionPolicy>,
    published: Option<&ConfigMap>,
) -> bool {
    let policies = match published.map(read) {
        None => Vec::new(),
        Some(Ok(policies)) => policies,
        Some(Err(e)) => {
            tracing::error!(error = %e, "the policies published for the agents cannot be read; keeping the last ones read (the coordinator rewrites them when a policy changes)");
            return false;
        }
    };
    writer.apply_watcher_event(&watcher::Event::Init);
    for policy in policies {
        writer.apply_watcher_event(&watcher::Event::InitApply(policy));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    true
}

/// The policies in the coordinator's ConfigMap.
fn read(published: &ConfigMap) -> Result<Vec<DisruptionPolicy>, String> {
    let text = published
        .data
        .as_ref()
        .and_then(|d| d.get(POLICIES_KEY))
        .ok_or_else(|| format!("ConfigMap {POLICIES_CONFIGMAP} has no key {POLICIES_KEY}"))?;
    let read: PublishedPolicies = serde_json::from_str(text)
        .map_err(|e| format!("ConfigMap {POLICIES_CONFIGMAP}, key {POLICIES_KEY}: {e}"))?;
    Ok(read.to_policies())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(name: &str, paused: bool, selector: serde_json::Value) -> Arc<DisruptionPolicy> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                "metadata": {"name": name, "generation": 4},
                "spec": {"paused": paused, "nodeSelector": selector},
            }))
            .expect("policy"),
        )
    }

    #[test]
    fn only_paused_policies_matching_the_node_are_acknowledged() {
        let labels = [("pool".to_owned(), "a".to_owned())].into_iter().collect();
        let policies = vec![
            policy("b-other-pool", true, json!({"matchLabels": {"pool": "b"}})),
            policy("a-pool", true, json!({"matchLabels": {"pool": "a"}})),
            policy("not-paused", false, json!({})),
            policy("everything", true, json!({})),
            policy(
                "broken",
                true,
                json!({"matchExpressions": [{"key": "pool", "operator": "Sideways"}]}),
            ),
        ];
        let acks = acknowledgements(&policies, &labels);
        let names: Vec<&str> = acks.iter().map(|a| a.policy.as_str()).collect();
        assert_eq!(names, ["a-pool", "broken", "everything"]);
        assert!(acks.iter().all(|a| a.observed_generation == 4));
    }

    #[test]
    fn auto_reboot_comes_from_a_policy_selecting_the_node() {
        let labels = [("pool".to_owned(), "a".to_owned())].into_iter().collect();
        let with = |selector: serde_json::Value| -> Arc<DisruptionPolicy> {
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                    "metadata": {"name": "p"}, "spec": {"autoReboot": true, "nodeSelector": selector},
                }))
                .expect("policy"),
            )
        };
        assert!(auto_reboot(
            &[with(json!({"matchLabels": {"pool": "a"}}))],
            &labels
        ));
        assert!(!auto_reboot(
            &[with(json!({"matchLabels": {"pool": "b"}}))],
            &labels
        ));
        assert!(!auto_reboot(
            &[with(
                json!({"matchExpressions": [{"key": "pool", "operator": "Sideways"}]})
            )],
            &labels
        ));
        assert!(!auto_reboot(&[policy("off", false, json!({}))], &labels));
    }

    fn forcing(name: &str) -> DisruptionPolicy {
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": name},
            "spec": {"onDrainTimeout": "Force", "drainTimeout": "1m"},
        }))
        .expect("policy")
    }

    fn admitted_by(policies: &[&str]) -> NodeMaintenance {
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": "m"},
            "spec": {"nodeName": "n1", "reason": "Reboot", "action": "Reboot"},
            "status": {"phase": "Admitted", "admission": {"policies": policies,
                "admittedAt": "2026-01-01T00:00:00Z", "admittedBy": "c1"}},
        }))
        .expect("maintenance")
    }

    fn store_of(
        policies: Vec<DisruptionPolicy>,
    ) -> (
        reflector::Store<DisruptionPolicy>,
        reflector::store::Writer<DisruptionPolicy>,
    ) {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for p in policies {
            writer.apply_watcher_event(&watcher::Event::InitApply(p));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        (store, writer)
    }

    /// A policy that admitted the maintenance but has not reached the agent yet may forbid
    /// forcing: the agent waits for it, and without it never forces.
    #[tokio::test]
    async fn a_policy_not_yet_published_is_waited_for_and_never_lets_a_drain_be_forced() {
        let m = admitted_by(&["a-forces", "b-later"]);
        let (store, _writer) = store_of(vec![forcing("a-forces")]);
        wait_for_admitting_within(&m, &store, Duration::from_millis(300)).await;
        let without = effective(&m, &store).await;
        assert!(!without.force_on_timeout, "forced without b-later's say");

        let (store, mut writer) = store_of(vec![forcing("a-forces")]);
        let arriving = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Vetoes forcing, and its longer timeout shows it was waited for.
            let vetoing: DisruptionPolicy = serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                "metadata": {"name": "b-later"},
                "spec": {"onDrainTimeout": "Fail", "drainTimeout": "2m"},
            }))
            .expect("policy");
            writer.apply_watcher_event(&watcher::Event::Apply(vetoing));
            writer
        });
        wait_for_admitting_within(&m, &store, Duration::from_secs(10)).await;
        let with = effective(&m, &store).await;
        assert!(!with.force_on_timeout, "b-later's veto waited for");
        assert_eq!(with.drain_timeout, Some(Duration::from_secs(120)));
        drop(arriving.await);

        let (store, _writer) = store_of(vec![forcing("a-forces"), forcing("b-later")]);
        let both = effective(&m, &store).await;
        assert!(both.force_on_timeout, "every policy forces");
    }
}
