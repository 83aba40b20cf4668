//! The marks other actors honour, on a node while its maintenance is under way: medik8s'
//! NodeHealthCheck leaves a node labelled `remediation.medik8s.io/exclude-from-remediation`
//! alone, the cluster autoscaler does not scale down one annotated
//! `cluster-autoscaler.kubernetes.io/scale-down-disabled`, Karpenter does not disrupt one
//! annotated `karpenter.sh/do-not-disrupt`. From admission until the maintenance ends (or is
//! deleted) the node carries the marks the coordinator is configured with, and a record of the
//! ones nodeward put on (`nodeward.io/marks`); at the end only those go. A mark an admin had set
//! stays, and so does one whose value someone changed since.
//!
//! The round decides whether the marks go on or come off; which ones nodeward puts on is
//! decided against the Node as it is written ([`apply`]), so a mark set a moment before the
//! write is still the admin's.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_core::ResourceExt;
use nodeward_api::labels::{
    DO_NOT_DISRUPT_ANNOTATION, EXCLUDE_FROM_REMEDIATION_LABEL, MARKS_ANNOTATION,
    SCALE_DOWN_DISABLED_ANNOTATION,
};

use super::{NodeEdit, Plan, view::Index};

/// One actor's mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mark {
    /// medik8s (NodeHealthCheck, self-node-remediation and the other remediators it drives).
    Medik8s,
    ClusterAutoscaler,
    Karpenter,
}

/// The value every mark carries.
const ON: &str = "true";

impl Mark {
    pub const ALL: [Mark; 3] = [Mark::Medik8s, Mark::ClusterAutoscaler, Mark::Karpenter];

    /// The name the coordinator's `--mark-for-other-actors` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mark::Medik8s => "medik8s",
            Mark::ClusterAutoscaler => "cluster-autoscaler",
            Mark::Karpenter => "karpenter",
        }
    }

    pub fn from_name(name: &str) -> Option<Mark> {
        Mark::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The label or annotation key.
    pub fn key(self) -> &'static str {
        match self {
            Mark::Medik8s => EXCLUDE_FROM_REMEDIATION_LABEL,
            Mark::ClusterAutoscaler => SCALE_DOWN_DISABLED_ANNOTATION,
            Mark::Karpenter => DO_NOT_DISRUPT_ANNOTATION,
        }
    }

    fn is_label(self) -> bool {
        self == Mark::Medik8s
    }

    fn map(self, meta: &mut ObjectMeta) -> &mut BTreeMap<String, String> {
        let map = if self.is_label() {
            &mut meta.labels
        } else {
            &mut meta.annotations
        };
        map.get_or_insert_with(BTreeMap::new)
    }
}

/// The marks going on a node, or coming off it.
#[derive(Clone, Debug, PartialEq)]
pub enum MarksChange {
    /// Each of these not already on the node goes on, recorded.
    Put(Vec<Mark>),
    /// The recorded ones come off (if still as nodeward set them), and the record.
    Take,
}

/// Puts the marks on the nodes whose maintenance is under way and takes them off the others
/// that carry nodeward's record. `marks` empty: nothing goes on (a record left from before is
/// still undone).
pub(super) fn decide(index: &Index, marks: &[Mark], plan: &mut Plan) {
    let under_way: std::collections::BTreeSet<&str> = index
        .maintenances
        .values()
        .filter(|m| super::node_labels::under_way(m))
        .map(|m| m.spec.node_name.as_str())
        .collect();
    for (name, node) in &index.nodes {
        let recorded = node.annotations().contains_key(MARKS_ANNOTATION);
        let change = match (under_way.contains(name), recorded) {
            (true, false) if !marks.is_empty() => MarksChange::Put(marks.to_vec()),
            (false, true) => MarksChange::Take,
            _ => continue,
        };
        let uid = node.uid().unwrap_or_default();
        // One write per node: with the node labels' edit when there is one.
        match plan.node_edits.iter_mut().find(|e| e.node == **name) {
            Some(edit) => edit.marks = Some(change),
            None => plan.node_edits.push(NodeEdit {
                node: (*name).to_owned(),
                uid,
                marks: Some(change),
                ..NodeEdit::default()
            }),
        }
    }
}

/// Applies `change` to a Node's metadata as it is about to be written; whether it changed.
/// Idempotent: a node that already carries a record gets no second one.
pub fn apply(meta: &mut ObjectMeta, change: &MarksChange) -> bool {
    let record = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(MARKS_ANNOTATION))
        .cloned();
    match (change, record) {
        (MarksChange::Put(_), Some(_)) | (MarksChange::Take, None) => false,
        (MarksChange::Put(marks), None) => {
            let mut put = Vec::new();
            for &mark in marks {
                let map = mark.map(meta);
                if !map.contains_key(mark.key()) {
                    map.insert(mark.key().to_owned(), ON.to_owned());
                    put.push(mark.key());
                }
            }
            meta.annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(MARKS_ANNOTATION.to_owned(), put.join(","));
            true
        }
        (MarksChange::Take, Some(record)) => {
            for mark in Mark::ALL {
                if record.split(',').any(|k| k == mark.key()) {
                    let map = mark.map(meta);
                    if map.get(mark.key()).map(String::as_str) == Some(ON) {
                        map.remove(mark.key());
                    }
                }
            }
            if let Some(annotations) = meta.annotations.as_mut() {
                annotations.remove(MARKS_ANNOTATION);
            }
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use nodeward_api::MaintenancePhase;
    use serde_json::json;

    use super::*;

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )
        };
        ObjectMeta {
            labels: map(labels),
            annotations: map(annotations),
            ..ObjectMeta::default()
        }
    }

    fn get<'a>(map: &'a Option<BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
        map.as_ref()?.get(key).map(String::as_str)
    }

    #[test]
    fn every_mark_goes_on_recorded_and_comes_off_with_its_record() {
        let mut node = meta(&[("team", "a")], &[]);
        assert!(apply(&mut node, &MarksChange::Put(Mark::ALL.to_vec())));
        assert_eq!(
            get(&node.labels, EXCLUDE_FROM_REMEDIATION_LABEL),
            Some("true")
        );
        assert_eq!(
            get(&node.annotations, SCALE_DOWN_DISABLED_ANNOTATION),
            Some("true")
        );
        assert_eq!(
            get(&node.annotations, DO_NOT_DISRUPT_ANNOTATION),
            Some("true")
        );
        assert_eq!(
            get(&node.annotations, MARKS_ANNOTATION),
            Some(
                "remediation.medik8s.io/exclude-from-remediation,cluster-autoscaler.kubernetes.io/scale-down-disabled,karpenter.sh/do-not-disrupt"
            )
        );
        // Put again (a round that saw no record yet): nothing more.
        let before = node.clone();
        assert!(!apply(&mut node, &MarksChange::Put(Mark::ALL.to_vec())));
        assert_eq!(node, before);

        assert!(apply(&mut node, &MarksChange::Take));
        assert_eq!(node.labels, meta(&[("team", "a")], &[]).labels);
        assert_eq!(node.annotations, Some(BTreeMap::new()));
        assert!(
            !apply(&mut node, &MarksChange::Take),
            "nothing left to take"
        );
    }

    #[test]
    fn a_mark_an_admin_set_or_changed_stays() {
        // The admin's own do-not-disrupt, there before the maintenance.
        let mut node = meta(&[], &[(DO_NOT_DISRUPT_ANNOTATION, "true")]);
        apply(&mut node, &MarksChange::Put(Mark::ALL.to_vec()));
        let record = get(&node.annotations, MARKS_ANNOTATION).unwrap_or_default();
        assert!(!record.contains(DO_NOT_DISRUPT_ANNOTATION), "{record}");
        // And the autoscaler's value changed by someone while it was on.
        node.annotations
            .as_mut()
            .map(|a| a.insert(SCALE_DOWN_DISABLED_ANNOTATION.into(), "false".into()));
        apply(&mut node, &MarksChange::Take);
        assert_eq!(
            get(&node.annotations, DO_NOT_DISRUPT_ANNOTATION),
            Some("true")
        );
        assert_eq!(
            get(&node.annotations, SCALE_DOWN_DISABLED_ANNOTATION),
            Some("false")
        );
        assert_eq!(get(&node.labels, EXCLUDE_FROM_REMEDIATION_LABEL), None);
        assert_eq!(get(&node.annotations, MARKS_ANNOTATION), None);
    }

    #[test]
    fn a_round_marks_the_node_of_a_maintenance_under_way_in_its_labels_write_and_unmarks_it_after()
    {
        use super::super::{Memory, fixtures::*, plan};
        let mut objects = cluster(2);
        objects.marks = Mark::ALL.to_vec();
        objects.policies = vec![
            policy(json!({"maxConcurrent": 2, "nodeLabels": {"beforeDrain": [{"key": "team", "value": "x"}]}}))
                .build(),
        ];
        objects.maintenances = vec![
            maintenance("m0", "n0")
                .phase(MaintenancePhase::Draining)
                .admitted_by(&["pool"])
                .build(),
            maintenance("m1", "n1").build(),
        ];
        let round = plan(&objects, &mut Memory::default(), t(0));
        assert_eq!(round.node_edits.len(), 1, "{:?}", round.node_edits);
        let edit = &round.node_edits[0];
        assert_eq!(
            edit.node, "n0",
            "a pending maintenance's node is not marked"
        );
        assert_eq!(
            edit.labels.get("team"),
            Some(&Some("x".to_owned())),
            "one write"
        );
        assert_eq!(edit.marks, Some(MarksChange::Put(Mark::ALL.to_vec())));

        // Ended, the record on the node: the marks come off; with none configured, too.
        objects.marks.clear();
        objects.maintenances = vec![
            maintenance("m0", "n0")
                .phase(MaintenancePhase::Succeeded)
                .build(),
        ];
        let mut marked = (*node("n0").build()).clone();
        marked
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(MARKS_ANNOTATION.to_owned(), String::new());
        objects.nodes[0] = std::sync::Arc::new(marked);
        let round = plan(&objects, &mut Memory::default(), t(0));
        let edit = round
            .node_edits
            .iter()
            .find(|e| e.node == "n0")
            .expect("an edit of n0");
        assert_eq!(edit.marks, Some(MarksChange::Take));
    }

    #[test]
    fn only_the_configured_marks_go_on_and_names_parse() {
        let mut node = meta(&[], &[]);
        apply(&mut node, &MarksChange::Put(vec![Mark::Karpenter]));
        assert_eq!(
            get(&node.annotations, DO_NOT_DISRUPT_ANNOTATION),
            Some("true")
        );
        assert_eq!(get(&node.annotations, SCALE_DOWN_DISABLED_ANNOTATION), None);
        assert_eq!(get(&node.labels, EXCLUDE_FROM_REMEDIATION_LABEL), None);
        for mark in Mark::ALL {
            assert_eq!(Mark::from_name(mark.name()), Some(mark));
        }
        assert_eq!(Mark::from_name("kured"), None);
    }
}
