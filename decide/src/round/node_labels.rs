//! Node labels and annotations around a maintenance (`nodeLabels`, kured's
//! `--pre-reboot-node-labels`, `--post-reboot-node-labels` and `--annotate-nodes`). When a
//! maintenance is admitted its node gets the `beforeDrain` labels, with the values they had
//! recorded beside them (`nodeward.io/labels-before`); once it succeeded the node gets the
//! `afterSuccess` labels and the other recorded ones back; a maintenance that fails, is
//! cancelled, deleted or sent back to wait puts every recorded value back. The record is what
//! says the labels are nodeward's to undo: a node without it is left alone.

use std::collections::BTreeMap;

use kube_core::ResourceExt;
use nodeward_api::{
    MaintenancePhase, NodeMaintenance,
    labels::{IN_PROGRESS_ANNOTATION, LABELS_BEFORE_ANNOTATION, LAST_MAINTENANCE_ANNOTATION},
};

use super::{NodeEdit, Plan, view::Index};

/// What the record on a node holds: the maintenance whose labels these are, and the labels
/// it changed with their earlier values (`None`: absent).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Record {
    maintenance: String,
    labels: BTreeMap<String, Option<String>>,
}

pub(super) fn decide(index: &Index, plan: &mut Plan) {
    let mut by_node: BTreeMap<&str, Vec<&NodeMaintenance>> = BTreeMap::new();
    for m in index.maintenances.values() {
        by_node
            .entry(m.spec.node_name.as_str())
            .or_default()
            .push(m);
    }
    for (name, node) in &index.nodes {
        let maintenances = by_node.remove(name).unwrap_or_default();
        let recorded: Option<Record> = node
            .annotations()
            .get(LABELS_BEFORE_ANNOTATION)
            .map(|r| serde_json::from_str(r).unwrap_or_default());
        let active = maintenances.iter().find(|m| under_way(m));
        let edit = match (active, recorded) {
            (Some(m), None) => begin(&config_of(index, m), node.labels(), &m.name_any()),
            (Some(m), Some(record)) if record.maintenance == m.name_any() => None,
            // Its maintenance is over (or another one is under way): how it ended decides.
            (_, Some(record)) => {
                let ended = maintenances
                    .iter()
                    .find(|m| m.name_any() == record.maintenance);
                let config = ended.map(|m| config_of(index, m)).unwrap_or_default();
                Some(end(&config, &record, ended.map(|m| m.phase())))
            }
            (None, None) => None,
        };
        if let Some((labels, annotations)) = edit {
            plan.node_edits.push(NodeEdit {
                node: (*name).to_owned(),
                uid: node.uid().unwrap_or_default(),
                labels,
                annotations,
                marks: None,
            });
        }
    }
}

/// Whether `m` is under way on its node: admitted, not finished, not deleted. While it is, the
/// node carries its labels and the other actors' marks ([`super::marks`]).
pub(super) fn under_way(m: &NodeMaintenance) -> bool {
    m.metadata.deletion_timestamp.is_none()
        && m.phase() != MaintenancePhase::Pending
        && !m.phase().is_finished()
}

/// The `nodeLabels` of the policies that admitted `m`: their union, the first by name
/// winning a key both set.
fn config_of(index: &Index, m: &NodeMaintenance) -> Labels {
    let mut config = Labels::default();
    let mut names: Vec<&String> = m.admitted_policies().iter().collect();
    names.sort();
    for name in names {
        let Some(p) = index.policies.iter().find(|p| &p.name == name) else {
            continue;
        };
        let Some(own) = p.policy.spec.node_labels.as_ref() else {
            continue;
        };
        for (k, v) in own.before() {
            config.before_drain.entry(k).or_insert(v);
        }
        for (k, v) in own.after() {
            config.after_success.entry(k).or_insert(v);
        }
        config.annotate |= own.annotate;
    }
    config
}

/// The `nodeLabels` of a maintenance's policies, joined.
#[derive(Clone, Debug, Default, PartialEq)]
struct Labels {
    before_drain: BTreeMap<String, String>,
    after_success: BTreeMap<String, String>,
    annotate: bool,
}

/// Label and annotation changes (`None`: remove) for a node.
type Changes = (
    BTreeMap<String, Option<String>>,
    BTreeMap<String, Option<String>>,
);

/// What an admitted maintenance `name` puts on a node carrying `labels`: the `beforeDrain`
/// labels and the record of what they replace (also without any, so that `afterSuccess`
/// knows to apply at the end). Nothing when the policies ask for nothing.
fn begin(config: &Labels, labels: &BTreeMap<String, String>, name: &str) -> Option<Changes> {
    if config.before_drain.is_empty() && config.after_success.is_empty() && !config.annotate {
        return None;
    }
    let record = Record {
        maintenance: name.to_owned(),
        labels: config
            .before_drain
            .keys()
            .map(|k| (k.clone(), labels.get(k).cloned()))
            .collect(),
    };
    let new_labels = config
        .before_drain
        .iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    let mut annotations = BTreeMap::from([(
        LABELS_BEFORE_ANNOTATION.to_owned(),
        Some(serde_json::to_string(&record).unwrap_or_default()),
    )]);
    if config.annotate {
        annotations.insert(IN_PROGRESS_ANNOTATION.to_owned(), Some(name.to_owned()));
    }
    Some((new_labels, annotations))
}

/// What the end of the recorded maintenance (`ended`: its phase now; `None`: deleted) does:
/// `afterSuccess` when it succeeded, the recorded values back for the rest (also when it is
/// not finished: sent back to wait, or superseded on the node).
fn end(config: &Labels, record: &Record, ended: Option<MaintenancePhase>) -> Changes {
    let succeeded = ended == Some(MaintenancePhase::Succeeded);
    let mut labels: BTreeMap<String, Option<String>> = record.labels.clone();
    if succeeded {
        for (k, v) in &config.after_success {
            labels.insert(k.clone(), Some(v.clone()));
        }
    }
    let mut annotations = BTreeMap::from([
        (LABELS_BEFORE_ANNOTATION.to_owned(), None),
        (IN_PROGRESS_ANNOTATION.to_owned(), None),
    ]);
    if config.annotate
        && let Some(phase) = ended
    {
        annotations.insert(
            LAST_MAINTENANCE_ANNOTATION.to_owned(),
            Some(format!("{} {phase:?}", record.maintenance)),
        );
    }
    (labels, annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Labels {
        Labels {
            before_drain: BTreeMap::from([
                ("lb".to_owned(), "out".to_owned()),
                ("team".to_owned(), "busy".to_owned()),
            ]),
            after_success: BTreeMap::from([("lb".to_owned(), "in".to_owned())]),
            annotate: true,
        }
    }

    #[test]
    fn admission_sets_the_labels_before_the_drain_and_records_what_they_replace() {
        let labels = BTreeMap::from([("lb".to_owned(), "in".to_owned())]);
        let (set, annotations) = begin(&config(), &labels, "n1-reboot").expect("changes");
        assert_eq!(set["lb"], Some("out".to_owned()));
        assert_eq!(set["team"], Some("busy".to_owned()));
        let record: Record = serde_json::from_str(
            annotations[LABELS_BEFORE_ANNOTATION]
                .as_deref()
                .unwrap_or_default(),
        )
        .expect("record");
        assert_eq!(record.maintenance, "n1-reboot");
        assert_eq!(
            record.labels,
            BTreeMap::from([
                ("lb".to_owned(), Some("in".to_owned())),
                ("team".to_owned(), None)
            ])
        );
        assert_eq!(
            annotations[IN_PROGRESS_ANNOTATION].as_deref(),
            Some("n1-reboot")
        );
        assert_eq!(
            begin(&Labels::default(), &labels, "m"),
            None,
            "nothing asked"
        );
    }

    #[test]
    fn success_sets_the_labels_after_and_puts_the_others_back_failure_puts_all_back() {
        let before = Record {
            maintenance: "m".to_owned(),
            labels: BTreeMap::from([
                ("lb".to_owned(), Some("in".to_owned())),
                ("team".to_owned(), None),
            ]),
        };
        let (labels, annotations) = end(&config(), &before, Some(MaintenancePhase::Succeeded));
        assert_eq!(
            labels,
            BTreeMap::from([
                ("lb".to_owned(), Some("in".to_owned())),
                ("team".to_owned(), None)
            ])
        );
        assert_eq!(
            annotations[LABELS_BEFORE_ANNOTATION], None,
            "the record goes"
        );
        assert_eq!(
            annotations[LAST_MAINTENANCE_ANNOTATION].as_deref(),
            Some("m Succeeded")
        );

        let mut after = config();
        after.after_success = BTreeMap::from([("lb".to_owned(), "fresh".to_owned())]);
        for ended in [
            Some(MaintenancePhase::Cancelled),
            Some(MaintenancePhase::Failed),
            Some(MaintenancePhase::Pending),
            None,
        ] {
            let (labels, _) = end(&after, &before, ended);
            assert_eq!(
                labels, before.labels,
                "{ended:?}: every recorded value back"
            );
        }
    }
}
