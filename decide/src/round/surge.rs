//! Surge before evict, for single-replica Deployments (`nodeward.io/surge-before-evict`).
//!
//! Before a node is admitted, its pods are looked at ([`crate::workloads::Lookups::scan`]):
//! a Deployment of one replica with its pod there is a rollout risk (its drain takes the
//! service down), unless it asks to surge. Those that ask are planned into the admission
//! (`status.surges`, `Planned`), and the agent's drain holds their pods. Once the node is
//! cordoned the coordinator records the replica count and raises it by one (`Surging`); when
//! the new replica is available the drain may evict (`Ready`); once the old pod is going, or
//! the drain is over whatever happened, the recorded count is restored (`Restored`). The
//! record is written before each raise and a finalizer keeps it on a deleted maintenance, so
//! a coordinator restarted at any point restores what it raised.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube_core::ResourceExt;

use crate::admission::decide::NodeState;
use nodeward_api::{
    MaintenancePhase, NodeMaintenance,
    labels::{SURGE_ANNOTATION, SURGE_FINALIZER},
    maintenance::{SURGE_PODS_LIMIT, SURGES_LIMIT, Surge, SurgeState},
    policy::{ROLLOUT_RISKS_LIMIT, RolloutRisk},
};

/// A Deployment of one replica with pods on a node about to be drained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SingleReplica {
    pub namespace: String,
    pub deployment: String,
    /// Its pods on the node.
    pub pods: Vec<String>,
    /// Whether it asks to surge before its pods are evicted.
    pub surge: bool,
}

/// What a scan of a node's pods found: its single-replica Deployments, or why it failed.
pub type Scan = Result<Vec<SingleReplica>, String>;

/// The single-replica Deployments among `pods` (those on one node): a pod counts when a drain
/// would evict it (running or pending, not terminating) and its ReplicaSet belongs to one of
/// `deployments` (found by the ReplicaSet's name less its `pod-template-hash`, and selecting
/// the pod) whose spec asks for exactly one replica.
pub fn single_replicas(pods: &[Pod], deployments: &[Deployment]) -> Vec<SingleReplica> {
    let mut found: BTreeMap<(String, String), SingleReplica> = BTreeMap::new();
    for pod in pods {
        let finished = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        if finished || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let Some(name) = deployment_of(pod) else {
            continue;
        };
        let Some(deployment) = deployments
            .iter()
            .find(|d| d.namespace().as_deref() == Some(&namespace) && d.name_any() == name)
        else {
            continue;
        };
        let spec = deployment.spec.as_ref();
        if spec.and_then(|s| s.replicas).unwrap_or(1) != 1 || !selects(deployment, pod) {
            continue;
        }
        let entry = found
            .entry((namespace.clone(), name.clone()))
            .or_insert_with(|| SingleReplica {
                namespace,
                deployment: name,
                pods: Vec::new(),
                surge: deployment
                    .annotations()
                    .get(SURGE_ANNOTATION)
                    .is_some_and(|v| v == "true"),
            });
        if entry.pods.len() < SURGE_PODS_LIMIT {
            entry.pods.push(pod.name_any());
        }
    }
    found.into_values().collect()
}

/// The Deployment a pod's ReplicaSet belongs to, by name: the ReplicaSet's name less its
/// `-<pod-template-hash>`.
pub fn deployment_of(pod: &Pod) -> Option<String> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "ReplicaSet")?;
    let hash = pod.labels().get("pod-template-hash")?;
    owner
        .name
        .strip_suffix(&format!("-{hash}"))
        .map(str::to_owned)
}

/// Whether `deployment`'s `matchLabels` select `pod` (a Deployment found by name must really
/// own the pod; `matchExpressions` are not needed for that and are not read).
fn selects(deployment: &Deployment, pod: &Pod) -> bool {
    let Some(wanted) = deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
    else {
        return false;
    };
    let labels = pod.labels();
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The surges an admission plans for its node: each single-replica Deployment that asks.
pub fn planned(found: &[SingleReplica]) -> Vec<Surge> {
    found
        .iter()
        .filter(|s| s.surge)
        .take(SURGES_LIMIT)
        .map(|s| Surge {
            namespace: s.namespace.clone(),
            deployment: s.deployment.clone(),
            pods: s.pods.clone(),
            state: SurgeState::Planned,
            replicas: None,
            message: Some("raised by one once the node is cordoned".to_owned()),
        })
        .collect()
}

/// Puts what a scan of the node found into its admission state: the surges an admission
/// plans, or why its pods are not known (a node not scanned plans none).
pub fn apply_scan(state: &mut NodeState, scan: Option<&Scan>) {
    state.surges.clear();
    state.unscanned = None;
    match scan {
        Some(Ok(found)) => state.surges = planned(found),
        Some(Err(e)) => state.unscanned = Some(format!("its pods are not known: {e}")),
        None => {}
    }
}

/// The rollout risks on `nodes` (a policy's nodes with a pending maintenance): the
/// single-replica Deployments that do not ask to surge, sorted, the first
/// [`ROLLOUT_RISKS_LIMIT`].
pub fn risks<'a>(
    nodes: impl IntoIterator<Item = &'a str>,
    scans: &BTreeMap<String, Scan>,
) -> Vec<RolloutRisk> {
    let mut risks: BTreeSet<RolloutRisk> = BTreeSet::new();
    for node in nodes {
        let found = scans.get(node).and_then(|s| s.as_ref().ok());
        for s in found.into_iter().flatten().filter(|s| !s.surge) {
            risks.insert(RolloutRisk {
                namespace: s.namespace.clone(),
                deployment: s.deployment.clone(),
                node_name: node.to_owned(),
            });
        }
    }
    risks.into_iter().take(ROLLOUT_RISKS_LIMIT).collect()
}

/// A surged Deployment as read now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// `spec.replicas`.
    pub replicas: i32,
    /// `status.availableReplicas`, counted once the controller saw the current spec.
    pub available: i32,
    /// Whether the status is of the current spec (`observedGeneration`).
    pub current: bool,
    pub annotated: bool,
    /// Its pods on the maintenance's node that are not terminating.
    pub on_node: Vec<String>,
}

/// A Deployment's lookup: `Ok(None)` when it is gone.
pub type Looked = Result<Option<Observed>, String>;

/// What to look up for surges: (namespace, deployment, node) of every surge not yet over.
pub fn wanted(
    maintenances: &[std::sync::Arc<NodeMaintenance>],
) -> BTreeSet<(String, String, String)> {
    maintenances
        .iter()
        .flat_map(|m| {
            let node = m.spec.node_name.clone();
            m.status
                .iter()
                .flat_map(|s| s.surges.iter())
                .filter(|s| s.state.holds() || s.state.raised())
                .map(move |s| (s.namespace.clone(), s.deployment.clone(), node.clone()))
        })
        .collect()
}

/// Whether the finalizer is to be added or removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finalizer {
    Keep,
    Add,
    Remove,
}

/// What to do for one maintenance's surges, in order: the finalizer when `Add`, the status
/// with `surges` (each raise recorded before it is made), the raises and the restores, then
/// each restored surge marked `Restored`, then the finalizer when `Remove` (and nothing is
/// raised any more).
#[derive(Clone, Debug, PartialEq)]
pub struct Work {
    pub maintenance: String,
    pub node: String,
    pub surges: Vec<Surge>,
    /// Surges (by index) to raise to their recorded count plus one.
    pub raise: Vec<usize>,
    /// Surges (by index) to bring back to their recorded count.
    pub restore: Vec<usize>,
    pub finalizer: Finalizer,
}

/// The surge work for `m`, if there is any. `looked` holds the lookups of [`wanted`].
pub fn work(
    m: &NodeMaintenance,
    cordoned: bool,
    looked: &BTreeMap<(String, String, String), Looked>,
) -> Option<Work> {
    let status = m.status.as_ref()?;
    let has_finalizer = m.finalizers().iter().any(|f| f == SURGE_FINALIZER);
    if status.surges.is_empty() && !has_finalizer {
        return None;
    }
    let deleting = m.metadata.deletion_timestamp.is_some();
    let phase = status.phase;
    // The drain has not started yet, and may still: nothing to do.
    let waiting = !deleting
        && (phase == MaintenancePhase::Admitted
            || (phase == MaintenancePhase::Draining && !cordoned));
    let draining = !deleting && phase == MaintenancePhase::Draining && cordoned;
    let node = m.spec.node_name.clone();
    let mut surges = status.surges.clone();
    let (mut raise, mut restore) = (Vec::new(), Vec::new());
    for (index, surge) in surges.iter_mut().enumerate() {
        let key = (
            surge.namespace.clone(),
            surge.deployment.clone(),
            node.clone(),
        );
        match advance(surge, looked.get(&key), waiting, draining) {
            Some(Act::Raise) => raise.push(index),
            Some(Act::Restore) => restore.push(index),
            None => {}
        }
    }
    let raised_after = surges
        .iter()
        .enumerate()
        .any(|(i, s)| s.state.raised() && !restore.contains(&i));
    let finalizer = match (has_finalizer, raised_after || !raise.is_empty()) {
        (false, true) => Finalizer::Add,
        (true, false) => Finalizer::Remove,
        _ => Finalizer::Keep,
    };
    let changed = surges != status.surges
        || !raise.is_empty()
        || !restore.is_empty()
        || finalizer != Finalizer::Keep;
    changed.then(|| Work {
        maintenance: m.name_any(),
        node,
        surges,
        raise,
        restore,
        finalizer,
    })
}

/// What a surge needs done beyond its own state change.
enum Act {
    Raise,
    Restore,
}

/// Moves one surge on by what was `seen` of its Deployment; `waiting`: the drain has not
/// started yet, `draining`: it runs on the cordoned node.
fn advance(surge: &mut Surge, seen: Option<&Looked>, waiting: bool, draining: bool) -> Option<Act> {
    match surge.state {
        SurgeState::Restored | SurgeState::Skipped => None,
        SurgeState::Planned if waiting => None,
        SurgeState::Planned if !draining => {
            skip(surge, "the drain was over before the surge");
            None
        }
        SurgeState::Planned => match seen {
            None | Some(Err(_)) => None,
            Some(Ok(None)) => {
                skip(surge, "the Deployment is gone");
                None
            }
            Some(Ok(Some(o))) => {
                let why = if !o.annotated {
                    Some(format!("{SURGE_ANNOTATION} was taken off the Deployment"))
                } else if o.replicas != 1 {
                    Some(format!(
                        "the Deployment has {} replicas now, not 1",
                        o.replicas
                    ))
                } else if !surge.pods.iter().any(|p| o.on_node.contains(p)) {
                    Some("its pod is no longer on the node".to_owned())
                } else {
                    None
                };
                if let Some(why) = why {
                    skip(surge, &why);
                    return None;
                }
                surge.state = SurgeState::Surging;
                surge.replicas = Some(o.replicas);
                surge.message = Some(format!(
                    "raised from {} to {}; waiting for the new replica to be available",
                    o.replicas,
                    o.replicas + 1
                ));
                Some(Act::Raise)
            }
        },
        SurgeState::Surging | SurgeState::Ready => {
            let from = surge.replicas.unwrap_or(1);
            let pods_gone = |o: &Observed| !surge.pods.iter().any(|p| o.on_node.contains(p));
            match seen {
                _ if !draining => Some(Act::Restore),
                Some(Ok(None)) => Some(Act::Restore),
                None | Some(Err(_)) => None,
                Some(Ok(Some(o))) if surge.state == SurgeState::Ready => {
                    pods_gone(o).then_some(Act::Restore)
                }
                // The record was written but the raise was not (a restart in between).
                Some(Ok(Some(o))) if o.replicas == from => Some(Act::Raise),
                Some(Ok(Some(o))) if o.current && o.available > from => {
                    surge.state = SurgeState::Ready;
                    surge.message = Some(format!(
                        "{} of {} replicas available: the drain may evict",
                        o.available, o.replicas
                    ));
                    None
                }
                Some(Ok(Some(o))) => {
                    surge.message = Some(format!(
                        "{} of {} replicas available; waiting for the new one",
                        o.available, o.replicas
                    ));
                    None
                }
            }
        }
    }
}

fn skip(surge: &mut Surge, why: &str) {
    surge.state = SurgeState::Skipped;
    surge.message = Some(format!(
        "not surged: {why}; its pods are drained as any other"
    ));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, rs: &str, hash: &str, app: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"pod-template-hash": hash, "app": app},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                              "uid": "u", "controller": true}]},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running"}
        }))
        .expect("pod")
    }

    fn deployment(name: &str, replicas: i32, app: &str, surge: bool) -> Deployment {
        let annotations = if surge {
            json!({SURGE_ANNOTATION: "true"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
                     "template": {"metadata": {"labels": {"app": app}}}}
        }))
        .expect("deployment")
    }

    #[test]
    fn only_single_replica_deployments_that_own_the_pod_are_found_and_the_annotation_marks_a_surge()
    {
        let pods = [
            pod("cart-5d8f-a", "cart-5d8f", "5d8f", "cart"),
            pod("web-77aa-b", "web-77aa", "77aa", "web"),
            pod("fake-99-c", "fake-99", "99", "other"),
            pod("api-11-d", "api-11", "11", "api"),
        ];
        let deployments = [
            deployment("cart", 1, "cart", true),
            deployment("web", 3, "web", false),
            // Named like the ReplicaSet's owner but selecting other pods: not its owner.
            deployment("fake", 1, "fake", false),
            deployment("api", 1, "api", false),
        ];
        let found = single_replicas(&pods, &deployments);
        assert_eq!(
            found,
            vec![
                SingleReplica {
                    namespace: "shop".into(),
                    deployment: "api".into(),
                    pods: vec!["api-11-d".into()],
                    surge: false,
                },
                SingleReplica {
                    namespace: "shop".into(),
                    deployment: "cart".into(),
                    pods: vec!["cart-5d8f-a".into()],
                    surge: true,
                },
            ]
        );
        let plan = planned(&found);
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].deployment, "cart");
        assert_eq!(plan[0].state, SurgeState::Planned);
        let scans = BTreeMap::from([("n1".to_owned(), Ok(found))]);
        let risks = risks(["n1"], &scans);
        assert_eq!(
            risks,
            vec![RolloutRisk {
                namespace: "shop".into(),
                deployment: "api".into(),
                node_name: "n1".into()
            }]
        );
    }

    fn maintenance(
        phase: MaintenancePhase,
        surges: Vec<Surge>,
        finalizer: bool,
    ) -> NodeMaintenance {
        let finalizers = if finalizer {
            vec![SURGE_FINALIZER]
        } else {
            vec![]
        };
        serde_json::from_value(json!({
            "metadata": {"name": "m", "finalizers": finalizers},
            "spec": {"nodeName": "n1", "reason": "Reboot", "action": "Reboot"},
            "status": {"phase": phase, "surges": surges}
        }))
        .expect("maintenance")
    }

    /// A Draining maintenance with one surge of `cart` (and the surge finalizer if `finalizer`).
    fn draining(state: SurgeState, replicas: Option<i32>, finalizer: bool) -> NodeMaintenance {
        maintenance(
            MaintenancePhase::Draining,
            vec![surge(state, replicas)],
            finalizer,
        )
    }

    fn surge(state: SurgeState, replicas: Option<i32>) -> Surge {
        Surge {
            namespace: "shop".into(),
            deployment: "cart".into(),
            pods: vec!["cart-a".into()],
            state,
            replicas,
            message: None,
        }
    }

    fn seen(
        replicas: i32,
        available: i32,
        on_node: &[&str],
    ) -> BTreeMap<(String, String, String), Looked> {
        BTreeMap::from([(
            ("shop".into(), "cart".into(), "n1".into()),
            Ok(Some(Observed {
                replicas,
                available,
                current: true,
                annotated: true,
                on_node: on_node.iter().map(|s| (*s).to_owned()).collect(),
            })),
        )])
    }

    #[test]
    fn a_planned_surge_waits_for_the_cordon_then_is_recorded_and_raised_under_the_finalizer() {
        let m = maintenance(
            MaintenancePhase::Admitted,
            vec![surge(SurgeState::Planned, None)],
            false,
        );
        assert_eq!(work(&m, true, &seen(1, 1, &["cart-a"])), None);
        let m = draining(SurgeState::Planned, None, false);
        assert_eq!(
            work(&m, false, &seen(1, 1, &["cart-a"])),
            None,
            "not cordoned yet"
        );
        let w = work(&m, true, &seen(1, 1, &["cart-a"])).expect("work");
        assert_eq!(w.raise, vec![0]);
        assert_eq!(w.finalizer, Finalizer::Add);
        assert_eq!(w.surges[0].state, SurgeState::Surging);
        assert_eq!(
            w.surges[0].replicas,
            Some(1),
            "the count to restore is recorded"
        );
    }

    #[test]
    fn a_surge_is_ready_once_the_new_replica_is_available_and_restored_once_the_old_pod_goes() {
        let m = draining(SurgeState::Surging, Some(1), true);
        let w = work(&m, true, &seen(2, 1, &["cart-a"])).expect("progress message");
        assert_eq!(
            w.surges[0].state,
            SurgeState::Surging,
            "1 of 2 available still holds"
        );
        assert!(w.raise.is_empty() && w.restore.is_empty());
        let w = work(&m, true, &seen(2, 2, &["cart-a"])).expect("ready");
        assert_eq!(w.surges[0].state, SurgeState::Ready);
        assert_eq!(w.finalizer, Finalizer::Keep);

        let m = draining(SurgeState::Ready, Some(1), true);
        assert_eq!(
            work(&m, true, &seen(2, 2, &["cart-a"])),
            None,
            "its pod is still there"
        );
        let w = work(&m, true, &seen(2, 2, &[])).expect("restore");
        assert_eq!(w.restore, vec![0]);
        assert_eq!(w.finalizer, Finalizer::Remove);
    }

    #[test]
    fn a_recorded_surge_whose_raise_was_lost_is_raised_again() {
        let m = draining(SurgeState::Surging, Some(1), true);
        let w = work(&m, true, &seen(1, 1, &["cart-a"])).expect("raise again");
        assert_eq!(w.raise, vec![0]);
        assert_eq!(w.finalizer, Finalizer::Keep);
    }

    #[test]
    fn whatever_ends_the_drain_restores_a_raised_surge_and_skips_a_planned_one() {
        for (phase, deleting) in [
            (MaintenancePhase::Acting, false),
            (MaintenancePhase::Failed, false),
            (MaintenancePhase::Cancelled, false),
            (MaintenancePhase::Draining, true),
        ] {
            let mut m = maintenance(
                phase,
                vec![
                    surge(SurgeState::Surging, Some(1)),
                    surge(SurgeState::Planned, None),
                ],
                true,
            );
            if deleting {
                m.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            // Even without a lookup: the restore reads the Deployment itself.
            let w = work(&m, true, &BTreeMap::new()).expect("work");
            assert_eq!(w.restore, vec![0], "{phase:?}");
            assert_eq!(w.surges[1].state, SurgeState::Skipped, "{phase:?}");
            assert_eq!(w.finalizer, Finalizer::Remove, "{phase:?}");
        }
    }

    #[test]
    fn a_deployment_changed_since_admission_is_not_surged() {
        let m = draining(SurgeState::Planned, None, false);
        let w = work(&m, true, &seen(3, 3, &["cart-a"])).expect("skip");
        assert_eq!(w.surges[0].state, SurgeState::Skipped);
        assert!(w.raise.is_empty());
        assert_eq!(w.finalizer, Finalizer::Keep);
        let mut looked = seen(1, 1, &["cart-a"]);
        if let Some(Ok(Some(o))) = looked.values_mut().next() {
            o.annotated = false;
        }
        assert_eq!(
            work(&m, true, &looked).expect("skip").surges[0].state,
            SurgeState::Skipped
        );
    }
}
