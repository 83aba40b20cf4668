//! Reboot blockers (admission rule `blocker`): pods on the node that match a policy's
//! `rebootBlockers.podSelectors`, and Prometheus alerts that match its
//! `rebootBlockers.prometheus` filter. The coordinator looks them up right before a round
//! decides, and only for the nodes of pending maintenances ([`wanted`]), so an idle cluster
//! costs nothing; what an answer means is decided here.
//!
//! Remediation maintenances are not held back: a failing node that fires alerts must not
//! block its own repair (`maxUnhealthy` guards remediation). A lookup that fails blocks: a
//! disruption is never admitted on a check that could not be made.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use k8s_openapi::api::core::v1::Node;
use kube_core::ResourceExt;
use nodeward_api::{
    DisruptionPolicy, MaintenancePhase, MaintenanceReason, NodeMaintenance,
    policy::{PrometheusBlocker, RebootBlockers},
};
use serde::Deserialize;

/// The blockers of one policy that apply to one node.
#[derive(Clone, Debug, PartialEq)]
pub struct Lookup {
    pub node: String,
    pub policy: String,
    pub blockers: RebootBlockers,
}

/// What to look up: for every pending (not Remediation) maintenance among `maintenances`, the
/// blockers of every policy that `selects` its node (`None`: a node not known, skipped).
pub fn wanted(
    maintenances: &[Arc<NodeMaintenance>],
    policies: &[Arc<DisruptionPolicy>],
    selects: impl Fn(&DisruptionPolicy, &str) -> Option<bool>,
) -> Vec<Lookup> {
    let mut lookups = Vec::new();
    if policies.iter().all(|p| p.spec.reboot_blockers.is_none()) {
        return lookups;
    }
    for m in maintenances.iter().filter(|m| looked_up_for(m)) {
        for policy in policies {
            let Some(blockers) = &policy.spec.reboot_blockers else {
                continue;
            };
            let Some(selected) = selects(policy, &m.spec.node_name) else {
                break;
            };
            let lookup = Lookup {
                node: m.spec.node_name.clone(),
                policy: policy.name_any(),
                blockers: blockers.clone(),
            };
            if selected && !lookups.contains(&lookup) {
                lookups.push(lookup);
            }
        }
    }
    lookups
}

/// Whether the lookups before a round (blockers, [`crate::gates`]) are made for `m`: pending,
/// not being deleted, and not a Remediation (neither holds a repair back).
pub fn looked_up_for(m: &NodeMaintenance) -> bool {
    m.phase() == MaintenancePhase::Pending
        && m.metadata.deletion_timestamp.is_none()
        && m.spec.reason != MaintenanceReason::Remediation
}

/// [`wanted`]'s `selects` from the Nodes' labels (an invalid selector selects: the policy is
/// invalid and blocks its whole scope elsewhere).
pub fn by_labels(nodes: &[Arc<Node>]) -> impl Fn(&DisruptionPolicy, &str) -> Option<bool> + '_ {
    // Asked once per pending maintenance and policy: an index, not a scan of every node each,
    // built on the first question (most rounds have no blockers to look up).
    let by_name = std::cell::OnceCell::new();
    move |policy, name| {
        let node = by_name
            .get_or_init(|| {
                nodes
                    .iter()
                    .filter_map(|n| Some((n.metadata.name.as_deref()?, n.as_ref())))
                    .collect::<HashMap<&str, &Node>>()
            })
            .get(name)?;
        Some(policy.selects(node.labels()).unwrap_or(true))
    }
}

/// The namespaces whose pods may block: those `listed` (all when none are) that the namespace
/// selector `selected` (all when it is not set). `None`: every namespace.
pub fn in_scope(listed: &[String], selected: Option<BTreeSet<String>>) -> Option<BTreeSet<String>> {
    match (listed.is_empty(), selected) {
        (true, None) => None,
        (false, None) => Some(listed.iter().cloned().collect()),
        (true, Some(selected)) => Some(selected),
        (false, Some(selected)) => Some(
            listed
                .iter()
                .filter(|n| selected.contains(*n))
                .cloned()
                .collect(),
        ),
    }
}

/// One alert of Prometheus' `GET /api/v1/alerts`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Alert {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `firing` or `pending`.
    #[serde(default)]
    pub state: String,
}

#[derive(Deserialize)]
struct AlertsReply {
    status: String,
    #[serde(default)]
    data: Option<AlertsData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct AlertsData {
    #[serde(default)]
    alerts: Vec<Alert>,
}

/// Parses a `/api/v1/alerts` reply; the error says what was wrong with it.
pub fn parse_alerts(body: &[u8]) -> Result<Vec<Alert>, String> {
    let reply: AlertsReply = serde_json::from_slice(body)
        .map_err(|e| format!("the reply is not a Prometheus alerts response: {e}"))?;
    if reply.status != "success" {
        return Err(format!(
            "Prometheus answered status {:?}: {}",
            reply.status,
            reply.error.unwrap_or_default()
        ));
    }
    let data = reply
        .data
        .ok_or("the reply has status success but no data")?;
    Ok(data.alerts)
}

/// Which alerts block: names matching `only` (all when none) and not matching `ignore`, in
/// state firing unless `firing_only` is off.
#[derive(Clone, Debug, Default)]
pub struct AlertFilter {
    pub only: Option<regex::Regex>,
    pub ignore: Option<regex::Regex>,
    pub firing_only: bool,
}

impl AlertFilter {
    /// Compiles a policy's filters; the error names the field. Like kured's, the expressions
    /// are unanchored (`^...$` matches whole names).
    pub fn new(blocker: &PrometheusBlocker) -> Result<Self, String> {
        let compile = |field: &str, pattern: &Option<String>| {
            pattern
                .as_deref()
                .map(|p| {
                    regex::Regex::new(p).map_err(|e| {
                        format!("rebootBlockers.prometheus.{field} {p:?} is not a valid regular expression ({e}); fix the policy")
                    })
                })
                .transpose()
        };
        Ok(Self {
            only: compile("alertFilter", &blocker.alert_filter)?,
            ignore: compile("ignoreAlerts", &blocker.ignore_alerts)?,
            firing_only: blocker.firing_only,
        })
    }

    /// The names of the blocking alerts, sorted, without repeats.
    pub fn blocking(&self, alerts: &[Alert]) -> Vec<String> {
        let mut names: Vec<String> = alerts
            .iter()
            .filter(|a| !self.firing_only || a.state == "firing")
            .filter_map(|a| a.labels.get("alertname"))
            .filter(|name| self.only.as_ref().is_none_or(|f| f.is_match(name)))
            .filter(|name| self.ignore.as_ref().is_none_or(|f| !f.is_match(name)))
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    use super::*;
    use crate::round::Objects;

    #[test]
    fn pods_block_in_the_listed_namespaces_that_the_selector_also_takes() {
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        let listed = vec!["ops".to_owned(), "batch".to_owned()];
        assert_eq!(in_scope(&[], None), None, "unscoped: every namespace");
        assert_eq!(in_scope(&listed, None), Some(set(&["ops", "batch"])));
        assert_eq!(in_scope(&[], Some(set(&["ops"]))), Some(set(&["ops"])));
        assert_eq!(
            in_scope(&listed, Some(set(&["ops", "tenant-a"]))),
            Some(set(&["ops"])),
            "both must take it"
        );
        assert_eq!(
            in_scope(&[], Some(set(&[]))),
            Some(set(&[])),
            "a selector matching nothing"
        );
    }

    const REPLY: &str = r#"{"status":"success","data":{"alerts":[
        {"labels":{"alertname":"KubeNodeNotReady","severity":"warning"},"state":"firing","activeAt":"2026-11-21T10:00:00Z","value":"1e+00"},
        {"labels":{"alertname":"KubeNodeNotReady","instance":"b"},"state":"firing"},
        {"labels":{"alertname":"Watchdog"},"state":"firing"},
        {"labels":{"alertname":"DiskFilling"},"state":"pending"}
    ]}}"#;

    #[test]
    fn alerts_are_filtered_by_name_and_state() {
        let alerts = parse_alerts(REPLY.as_bytes()).expect("valid reply");
        assert_eq!(alerts.len(), 4);
        let filter = |only: Option<&str>, ignore: Option<&str>, firing_only| {
            AlertFilter::new(&PrometheusBlocker {
                url: "http://prometheus:9090".into(),
                alert_filter: only.map(String::from),
                ignore_alerts: ignore.map(String::from),
                firing_only,
            })
            .expect("valid filters")
        };
        assert_eq!(
            filter(None, None, true).blocking(&alerts),
            ["KubeNodeNotReady", "Watchdog"]
        );
        assert_eq!(
            filter(Some("^(Kube|Disk)"), None, true).blocking(&alerts),
            ["KubeNodeNotReady"]
        );
        assert_eq!(
            filter(Some("^(Kube|Disk)"), None, false).blocking(&alerts),
            ["DiskFilling", "KubeNodeNotReady"]
        );
        // kured's --alert-filter-regexp: everything but the ignored names.
        assert_eq!(
            filter(None, Some("^Watchdog$"), true).blocking(&alerts),
            ["KubeNodeNotReady"]
        );
        assert!(
            filter(Some("^Node$"), None, true)
                .blocking(&alerts)
                .is_empty()
        );
    }

    #[test]
    fn bad_replies_and_filters_say_what_is_wrong() {
        let error = parse_alerts(br#"{"status":"error","errorType":"bad_data","error":"boom"}"#)
            .expect_err("an error reply");
        assert!(error.contains("\"error\": boom"), "{error}");
        let error = parse_alerts(b"<html>").expect_err("not JSON");
        assert!(
            error.contains("not a Prometheus alerts response"),
            "{error}"
        );
        let error = AlertFilter::new(&PrometheusBlocker {
            url: "http://prometheus:9090".into(),
            alert_filter: None,
            ignore_alerts: Some("Kube(".into()),
            firing_only: true,
        })
        .expect_err("invalid");
        assert!(error.contains("ignoreAlerts \"Kube(\""), "{error}");
        assert!(error.contains("fix the policy"), "{error}");
    }

    fn node(name: &str, pool: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("pool".to_owned(), pool.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn maintenance(name: &str, node: &str, reason: &str, phase: &str) -> Arc<NodeMaintenance> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
                "metadata": {"name": name},
                "spec": {"nodeName": node, "reason": reason, "action": "Reboot"},
                "status": {"phase": phase},
            }))
            .expect("valid maintenance"),
        )
    }

    #[test]
    fn only_pending_non_remediation_maintenances_are_looked_up_under_their_policies() {
        let policy = |name: &str, pool: &str, blockers: bool| -> Arc<DisruptionPolicy> {
            let mut spec = json!({"nodeSelector": {"matchLabels": {"pool": pool}}});
            if blockers {
                spec["rebootBlockers"] = json!({"podSelectors": [{"matchLabels": {"app": "db"}}]});
            }
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                    "metadata": {"name": name}, "spec": spec,
                }))
                .expect("valid policy"),
            )
        };
        let objects = Objects {
            nodes: vec![node("a1", "a"), node("a2", "a"), node("b1", "b")],
            policies: vec![
                policy("pa", "a", true),
                policy("pb", "b", true),
                policy("all-a", "a", false),
            ],
            maintenances: vec![
                maintenance("m1", "a1", "Reboot", "Pending"),
                maintenance("m2", "a2", "Remediation", "Pending"),
                maintenance("m3", "b1", "Reboot", "Admitted"),
                maintenance("m4", "ghost", "Reboot", "Pending"),
            ],
            ..Objects::default()
        };
        let lookups = wanted(
            &objects.maintenances,
            &objects.policies,
            by_labels(&objects.nodes),
        );
        assert_eq!(lookups.len(), 1, "{lookups:?}");
        assert_eq!(
            (lookups[0].node.as_str(), lookups[0].policy.as_str()),
            ("a1", "pa")
        );
    }
}
