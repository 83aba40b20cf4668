//! What `reboot`, `patch` and `drain` ask for: one NodeMaintenance per node with reason `Manual`, named
//! for the node, the verb and the time, and refused for a node that already has one under way
//! (the coordinator admits one maintenance per node at a time; a second would only wait).

use jiff::Timestamp;
use kube::ResourceExt;
use nodeward_api::{MaintenanceAction, MaintenanceReason, NodeMaintenance};

/// The longest name an object may have.
const NAME_LIMIT: usize = 253;
/// The CRD's bounds of `requestedBy` and `message`.
const REQUESTED_BY_LIMIT: usize = 253;
const MESSAGE_LIMIT: usize = 1024;

/// A maintenance an operator asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// Drain, reboot, and uncordon once the health gate passes.
    Reboot,
    /// Drain, run the policy's update, reboot if it asks (or always, as the policy says), and
    /// uncordon once the health gate passes: a reboot by another name, for the record.
    Patch,
    /// Drain and hold the node drained until the maintenance is cancelled.
    Drain,
}

impl Verb {
    fn action(self) -> MaintenanceAction {
        match self {
            Self::Reboot | Self::Patch => MaintenanceAction::Reboot,
            Self::Drain => MaintenanceAction::DrainOnly,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Self::Reboot => "reboot",
            Self::Patch => "patch",
            Self::Drain => "drain",
        }
    }
}

/// The update a patch of a node runs: the first policy by name selecting the node that has
/// one (as the agent chooses among the policies that admit it), and when it reboots.
#[derive(Clone, Debug, PartialEq)]
pub struct UpdateOf {
    pub policy: String,
    pub reboot: nodeward_api::update::RebootWhen,
}

/// The update of the first of `policies` (by name) selecting a node with `labels` that has one.
pub fn update_of(
    policies: &[nodeward_api::DisruptionPolicy],
    labels: &std::collections::BTreeMap<String, String>,
) -> Option<UpdateOf> {
    let mut selecting: Vec<&nodeward_api::DisruptionPolicy> = policies
        .iter()
        .filter(|p| p.selects(labels).unwrap_or(false))
        .collect();
    selecting.sort_by_key(|p| p.metadata.name.clone());
    selecting.into_iter().find_map(|p| {
        Some(UpdateOf {
            policy: p.metadata.name.clone().unwrap_or_default(),
            reboot: p.spec.update.as_ref()?.reboot,
        })
    })
}

/// What becomes of a node `verb` asked for, as `reboot`/`patch`/`drain` print it; `update`:
/// the update a patch runs, if a policy selecting the node has one.
pub fn outcome(verb: Verb, urgent: bool, update: Option<&UpdateOf>) -> String {
    use nodeward_api::update::RebootWhen;
    let what = match (verb, update) {
        (Verb::Reboot, _) => "drained and rebooted".to_owned(),
        (Verb::Patch, Some(u)) if u.reboot == RebootWhen::IfNeeded => format!(
            "drained, updated by policy {}'s update, and rebooted only if the update asks for it (reboot: IfNeeded)",
            u.policy
        ),
        (Verb::Patch, Some(u)) => format!(
            "drained, updated by policy {}'s update and rebooted (reboot: Always)",
            u.policy
        ),
        (Verb::Patch, None) => "drained and rebooted; no policy selecting it has an update (spec.update), so nothing is updated".to_owned(),
        (Verb::Drain, _) => "drained until `kubectl nodeward cancel` ends it".to_owned(),
    };
    if urgent {
        format!("{what}, urgently (no window or reboot blocker waited for)")
    } else {
        what
    }
}

/// The maintenance of `node` that `verb` creates at `now` for `requested_by` (`urgent`: an
/// emergency, admitted outside windows and past reboot blockers).
pub fn maintenance(
    node: &str,
    verb: Verb,
    requested_by: &str,
    message: Option<&str>,
    urgent: bool,
    now: Timestamp,
) -> NodeMaintenance {
    let message = message.map_or_else(
        || format!("kubectl nodeward {} {node}", verb.word()),
        |m| cut(m, MESSAGE_LIMIT),
    );
    let mut m = NodeMaintenance::request(
        &name(node, verb, now),
        node,
        MaintenanceReason::Manual,
        verb.action(),
        &cut(requested_by, REQUESTED_BY_LIMIT),
        message,
    );
    m.spec.urgent = urgent;
    m
}

/// `<node>-<verb>-<UTC time>`, the node's part shortened where the whole would be too long.
pub fn name(node: &str, verb: Verb, now: Timestamp) -> String {
    let suffix = format!("-{}-{}", verb.word(), now.strftime("%Y%m%d-%H%M%S"));
    let room = NAME_LIMIT.saturating_sub(suffix.len());
    // Node names are DNS subdomains (ASCII); a cut must still end in a letter or digit.
    let prefix = node
        .get(..room.min(node.len()))
        .unwrap_or(node)
        .trim_end_matches(['-', '.']);
    format!("{prefix}{suffix}")
}

/// The maintenances of `node` that are not finished and not being deleted.
pub fn under_way<'a>(maintenances: &'a [NodeMaintenance], node: &str) -> Vec<&'a NodeMaintenance> {
    maintenances
        .iter()
        .filter(|m| {
            m.spec.node_name == node
                && !m.phase().is_finished()
                && m.metadata.deletion_timestamp.is_none()
        })
        .collect()
}

/// Why `verb` is not asked for on `node` now, if it is not.
pub fn refusal(maintenances: &[NodeMaintenance], node: &str) -> Option<String> {
    let open = under_way(maintenances, node);
    let first = open.first()?;
    Some(format!(
        "{node}: maintenance {} ({:?}, {:?}) is under way; `kubectl nodeward cancel {node}` first",
        first.name_any(),
        first.spec.action,
        first.phase()
    ))
}

fn cut(text: &str, limit: usize) -> String {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use nodeward_api::{MaintenancePhase, maintenance::NodeMaintenanceStatus};

    use super::*;

    fn at() -> Timestamp {
        "2026-11-25T12:05:01Z".parse().expect("a time")
    }

    #[test]
    fn a_patch_says_whose_update_runs_and_whether_it_reboots() {
        let policy = |name: &str, spec: serde_json::Value| -> nodeward_api::DisruptionPolicy {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                "metadata": {"name": name}, "spec": spec}))
            .expect("a policy")
        };
        let labels: std::collections::BTreeMap<String, String> =
            [("pool".to_owned(), "a".to_owned())].into();
        let policies = [
            policy("default", serde_json::json!({"nodeSelector": {}})),
            policy(
                "z-always",
                serde_json::json!({"nodeSelector": {}, "update": {"preset": "Apt", "reboot": "Always"}}),
            ),
            policy(
                "patch-lab",
                serde_json::json!({"nodeSelector": {}, "update": {"preset": "Apt"}}),
            ),
            policy(
                "elsewhere",
                serde_json::json!({"nodeSelector": {"matchLabels": {"pool": "b"}}, "update": {"preset": "Apt"}}),
            ),
        ];
        let update = update_of(&policies, &labels);
        assert_eq!(
            outcome(Verb::Patch, false, update.as_ref()),
            "drained, updated by policy patch-lab's update, and rebooted only if the update asks for it (reboot: IfNeeded)"
        );
        let always = update_of(&policies[..2], &labels);
        assert_eq!(
            outcome(Verb::Patch, false, always.as_ref()),
            "drained, updated by policy z-always's update and rebooted (reboot: Always)"
        );
        assert!(
            outcome(
                Verb::Patch,
                false,
                update_of(&policies[..1], &labels).as_ref()
            )
            .contains("no policy selecting it has an update")
        );
        assert_eq!(outcome(Verb::Reboot, false, None), "drained and rebooted");
    }

    #[test]
    fn a_reboot_is_a_manual_maintenance_named_for_node_verb_and_time() {
        let m = maintenance("w1", Verb::Reboot, "alice", None, false, at());
        assert_eq!(m.name_any(), "w1-reboot-20261125-120501");
        assert_eq!(m.spec.node_name, "w1");
        assert_eq!(m.spec.reason, MaintenanceReason::Manual);
        assert_eq!(m.spec.action, MaintenanceAction::Reboot);
        assert_eq!(m.spec.requested_by.as_deref(), Some("alice"));
        assert_eq!(
            m.spec.message.as_deref(),
            Some("kubectl nodeward reboot w1")
        );
        let drain = maintenance("w1", Verb::Drain, "alice", Some("disk swap"), false, at());
        assert_eq!(drain.spec.action, MaintenanceAction::DrainOnly);
        assert_eq!(drain.spec.message.as_deref(), Some("disk swap"));
        assert!(!m.spec.urgent && !drain.spec.urgent);
        let patch = maintenance("w1", Verb::Patch, "alice", None, true, at());
        assert_eq!(patch.name_any(), "w1-patch-20261125-120501");
        assert_eq!(patch.spec.action, MaintenanceAction::Reboot);
        assert!(patch.spec.urgent, "an emergency");
    }

    #[test]
    fn a_long_node_name_is_shortened_to_a_valid_name_and_long_texts_are_cut() {
        let node = format!("{}-x", "a".repeat(240));
        let m = maintenance(
            &node,
            Verb::Drain,
            &"u".repeat(400),
            Some(&"é".repeat(900)),
            false,
            at(),
        );
        let name = m.name_any();
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("-drain-20261125-120501"), "{name}");
        assert!(!name.contains("--"), "{name}");
        assert_eq!(m.spec.requested_by.map(|r| r.len()), Some(253));
        assert!(m.spec.message.is_some_and(|t| t.len() <= 1024));
    }

    #[test]
    fn a_node_with_a_maintenance_under_way_is_refused_a_second() {
        let mut open = maintenance("w1", Verb::Drain, "alice", None, false, at());
        let mut done = maintenance("w2", Verb::Reboot, "alice", None, false, at());
        done.status = Some(NodeMaintenanceStatus {
            phase: MaintenancePhase::Succeeded,
            ..NodeMaintenanceStatus::default()
        });
        open.status = Some(NodeMaintenanceStatus {
            phase: MaintenancePhase::Draining,
            ..NodeMaintenanceStatus::default()
        });
        let all = [open, done];
        let refused = refusal(&all, "w1").expect("refused");
        assert!(
            refused.contains("w1-drain-20261125-120501 (DrainOnly, Draining) is under way"),
            "{refused}"
        );
        assert_eq!(refusal(&all, "w2"), None, "finished ones do not count");
        assert_eq!(refusal(&all, "w3"), None);
    }
}
