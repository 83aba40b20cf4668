//! Cordoning and tainting a node (the agent its own; the coordinator undoes what a lost
//! agent left), recording what nodeward did, so that undoing
//! it never uncordons a node an admin had cordoned. Read-modify-write with the Node's
//! resourceVersion, retried on conflict (the kubelet and controllers write Nodes too).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{Api, Client, api::PostParams};
use nodeward_api::labels::{
    CORDONED_BY_ANNOTATION, OUT_OF_SERVICE_ANNOTATION, OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE,
    PENDING_TAINT,
};

use crate::ApiError;

/// What `apply` did, so that `undo` reverts exactly that.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub cordoned: bool,
    pub tainted: bool,
}

/// The change to a Node, as a pure function: cordon unless already cordoned (recording `by`),
/// add the `taint` (NoSchedule) unless present.
pub fn cordon_and_taint(node: &mut Node, taint: &str, by: &str) -> Applied {
    // Our own cordon from an earlier try (a restart between cordoning and recording it, or a
    // step repeated on a stale view) is still ours to undo.
    let already_ours = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDONED_BY_ANNOTATION))
        .is_some_and(|recorded| recorded == by);
    let spec = node.spec.get_or_insert_with(Default::default);
    let mut applied = Applied::default();
    if spec.unschedulable == Some(true) && already_ours {
        applied.cordoned = true;
    } else if spec.unschedulable != Some(true) {
        spec.unschedulable = Some(true);
        node.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CORDONED_BY_ANNOTATION.to_owned(), by.to_owned());
        applied.cordoned = true;
    }
    let taints = spec.taints.get_or_insert_with(Vec::new);
    if !taints.iter().any(|t| t.key == taint) {
        taints.push(Taint {
            key: taint.to_owned(),
            effect: "NoSchedule".to_owned(),
            value: None,
            time_added: None,
        });
        applied.tainted = true;
    }
    applied
}

/// Reverts `applied`: uncordons only if nodeward's record is still there (an admin who
/// cordoned in the meantime keeps the cordon), removes only the taint it added.
pub fn revert(node: &mut Node, taint: &str, applied: &Applied) -> bool {
    let mut changed = false;
    let ours = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CORDONED_BY_ANNOTATION));
    if applied.cordoned && ours {
        if let Some(spec) = node.spec.as_mut() {
            spec.unschedulable = None;
        }
        if let Some(annotations) = node.metadata.annotations.as_mut() {
            annotations.remove(CORDONED_BY_ANNOTATION);
        }
        changed = true;
    }
    if applied.tainted
        && let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut())
    {
        let before = taints.len();
        taints.retain(|t| t.key != taint);
        changed |= taints.len() != before;
    }
    changed
}

/// What a step recorded as `by` may have left on `node` without recording it in its status:
/// the cordon if the node's record names `by`, and the `taint` if `taint_ours` (no one else
/// holds the node under it).
pub fn left_by(node: &Node, by: &str, taint_ours: bool) -> Applied {
    let recorded = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDONED_BY_ANNOTATION));
    Applied {
        cordoned: recorded.is_some_and(|r| r == by),
        tainted: taint_ours,
    }
}

/// Reads the Node, applies `change`, writes it back with its resourceVersion; retries on
/// conflict.
async fn update<T>(
    client: &Client,
    name: &str,
    action: &'static str,
    change: impl FnMut(&mut Node) -> (bool, T),
) -> Result<T, ApiError> {
    update_from(client, None, name, action, change).await
}

/// [`update`] by `change`, only on the Node with `uid` (not one created again under the name
/// since); returns whether it changed.
async fn update_same_node(
    client: &Client,
    name: &str,
    uid: &str,
    action: &'static str,
    mut change: impl FnMut(&mut Node) -> bool,
) -> Result<bool, ApiError> {
    update(client, name, action, |node| {
        let changed = node.metadata.uid.as_deref() == Some(uid) && change(node);
        (changed, changed)
    })
    .await
}

/// [`update`], starting from `known` (the whole Node as a watch last delivered it) instead of
/// a read: one round trip fewer when it is current. The write is conditional on its
/// resourceVersion, so a stale copy costs a conflict and a read; a copy that needs no write
/// proves nothing and is read again.
async fn update_from<T>(
    client: &Client,
    mut known: Option<Node>,
    name: &str,
    action: &'static str,
    mut change: impl FnMut(&mut Node) -> (bool, T),
) -> Result<T, ApiError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut attempts = 0;
    loop {
        let (mut node, from_copy) = match known.take() {
            Some(node) => (node, true),
            None => (
                nodes
                    .get(name)
                    .await
                    .map_err(|e| ApiError::new("reading", format!("node {name}"), e))?,
                false,
            ),
        };
        let (write, result) = change(&mut node);
        if !write && from_copy {
            continue;
        }
        if !write {
            return Ok(result);
        }
        match nodes.replace(name, &PostParams::default(), &node).await {
            Ok(_) => return Ok(result),
            Err(kube::Error::Api(status)) if status.code == 409 && attempts < 10 => attempts += 1,
            Err(e) => return Err(ApiError::new(action, format!("node {name}"), e)),
        }
    }
}

/// Cordons and taints `name`; returns what it did. `known`: the whole Node as a watch last
/// delivered it, to write without reading first (see [`update_from`]).
pub async fn apply(
    client: &Client,
    known: Option<Node>,
    name: &str,
    taint: &str,
    by: &str,
) -> Result<Applied, ApiError> {
    update_from(client, known, name, "cordoning", |node| {
        let applied = cordon_and_taint(node, taint, by);
        (applied != Applied::default(), applied)
    })
    .await
}

/// Undoes what `apply` did.
pub async fn undo(
    client: &Client,
    name: &str,
    taint: &str,
    applied: &Applied,
) -> Result<(), ApiError> {
    update(client, name, "uncordoning", |node| {
        (revert(node, taint, applied), ())
    })
    .await
}

/// Puts the out-of-service taint on `node` with nodeward's record of `why` (`on`), or takes
/// away the one nodeward put there (not one an admin put); returns whether it changed the node.
pub fn out_of_service(node: &mut Node, on: bool, why: &str) -> bool {
    let recorded = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(OUT_OF_SERVICE_ANNOTATION));
    let spec = node.spec.get_or_insert_with(Default::default);
    let taints = spec.taints.get_or_insert_with(Vec::new);
    let tainted = taints.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT);
    if on && !tainted {
        taints.push(Taint {
            key: OUT_OF_SERVICE_TAINT.to_owned(),
            value: Some(OUT_OF_SERVICE_VALUE.to_owned()),
            effect: "NoExecute".to_owned(),
            time_added: None,
        });
        node.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(OUT_OF_SERVICE_ANNOTATION.to_owned(), why.to_owned());
        return true;
    }
    if !on && recorded {
        taints.retain(|t| t.key != OUT_OF_SERVICE_TAINT);
        if let Some(annotations) = node.metadata.annotations.as_mut() {
            annotations.remove(OUT_OF_SERVICE_ANNOTATION);
        }
        return true;
    }
    false
}

/// Puts the out-of-service taint on `name` or takes nodeward's away (see [`out_of_service`]),
/// but only on the Node with `uid` (not one created again under the name since).
pub async fn set_out_of_service(
    client: &Client,
    name: &str,
    uid: &str,
    on: bool,
    why: &str,
) -> Result<bool, ApiError> {
    let action = match on {
        true => "tainting out of service",
        false => "taking the out-of-service taint from",
    };
    update_same_node(client, name, uid, action, |node| {
        out_of_service(node, on, why)
    })
    .await
}

/// Puts nodeward's pending taint (`PreferNoSchedule`) on `node` or takes it away; returns
/// whether the node changed.
pub fn pending(node: &mut Node, on: bool) -> bool {
    let spec = node.spec.get_or_insert_with(Default::default);
    let taints = spec.taints.get_or_insert_with(Vec::new);
    let tainted = taints.iter().any(|t| t.key == PENDING_TAINT);
    match (on, tainted) {
        (true, false) => {
            taints.push(Taint {
                key: PENDING_TAINT.to_owned(),
                value: None,
                effect: "PreferNoSchedule".to_owned(),
                time_added: None,
            });
            true
        }
        (false, true) => {
            taints.retain(|t| t.key != PENDING_TAINT);
            true
        }
        _ => false,
    }
}

/// [`pending`] on `name`, only on the Node with `uid`.
pub async fn set_pending(
    client: &Client,
    name: &str,
    uid: &str,
    on: bool,
) -> Result<bool, ApiError> {
    let action = match on {
        true => "tainting while its maintenance is pending",
        false => "taking the pending taint from",
    };
    update_same_node(client, name, uid, action, |node| pending(node, on)).await
}

/// Sets (`Some`) or removes (`None`) `labels` and `annotations` of `name`, only on the Node with
/// `uid`; returns whether it changed.
pub async fn relabel(
    client: &Client,
    name: &str,
    uid: &str,
    labels: &BTreeMap<String, Option<String>>,
    annotations: &BTreeMap<String, Option<String>>,
) -> Result<bool, ApiError> {
    update_same_node(client, name, uid, "labelling", |node| {
        let mut changed = false;
        for (map, edits) in [
            (&mut node.metadata.labels, labels),
            (&mut node.metadata.annotations, annotations),
        ] {
            let map = map.get_or_insert_with(BTreeMap::new);
            for (key, value) in edits {
                let before = match value {
                    Some(v) => map.insert(key.clone(), v.clone()),
                    None => map.remove(key),
                };
                changed |= before.as_ref() != value.as_ref();
            }
        }
        changed
    })
    .await
}

/// Undoes what `by` left on `name` (see [`left_by`]).
pub async fn undo_left_by(
    client: &Client,
    name: &str,
    taint: &str,
    by: &str,
    taint_ours: bool,
) -> Result<(), ApiError> {
    update(client, name, "uncordoning", |node| {
        let applied = left_by(node, by, taint_ours);
        (revert(node, taint, &applied), ())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admin_cordon_is_kept_and_only_our_taint_goes() {
        let mut node = Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                unschedulable: Some(true),
                taints: Some(vec![Taint {
                    key: "other".into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]),
                ..Default::default()
            }),
            ..Node::default()
        };
        let applied = cordon_and_taint(&mut node, "nodeward.io/shutdown", "shutdown");
        assert_eq!(
            applied,
            Applied {
                cordoned: false,
                tainted: true
            }
        );
        assert!(revert(&mut node, "nodeward.io/shutdown", &applied));
        let spec = node.spec.as_ref().expect("spec");
        assert_eq!(spec.unschedulable, Some(true), "the admin's cordon stays");
        assert_eq!(spec.taints.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn our_cordon_is_undone_unless_the_record_is_gone() {
        let mut node = Node::default();
        let applied = cordon_and_taint(&mut node, "t", "shutdown");
        assert_eq!(
            applied,
            Applied {
                cordoned: true,
                tainted: true
            }
        );
        // Applied again (a repeated step): still ours.
        let mut again = node.clone();
        assert!(cordon_and_taint(&mut again, "t", "shutdown").cordoned);
        assert!(!cordon_and_taint(&mut again, "t", "maintenance/x").cordoned);
        let mut taken_over = node.clone();
        assert!(revert(&mut node, "t", &applied));
        assert_eq!(node.spec.as_ref().and_then(|s| s.unschedulable), None);
        // An admin who removed our record (took the cordon over) keeps it.
        taken_over.metadata.annotations = None;
        revert(&mut taken_over, "t", &applied);
        assert_eq!(
            taken_over.spec.as_ref().and_then(|s| s.unschedulable),
            Some(true)
        );
    }

    #[test]
    fn only_the_cordon_recorded_for_a_step_is_left_by_it() {
        let mut node = Node::default();
        cordon_and_taint(&mut node, "t", "maintenance/a");
        assert_eq!(
            left_by(&node, "maintenance/a", true),
            Applied {
                cordoned: true,
                tainted: true
            }
        );
        assert_eq!(
            left_by(&node, "maintenance/b", false),
            Applied::default(),
            "another maintenance's cordon, and a taint someone else holds, stay"
        );
    }

    #[test]
    fn only_the_out_of_service_taint_nodeward_put_is_taken_away() {
        let mut node = Node::default();
        assert!(out_of_service(&mut node, true, "dead"));
        assert!(!out_of_service(&mut node, true, "dead"), "once");
        let taint = &node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()[0];
        assert_eq!(
            (
                taint.key.as_str(),
                taint.value.as_deref(),
                taint.effect.as_str()
            ),
            (
                OUT_OF_SERVICE_TAINT,
                Some(OUT_OF_SERVICE_VALUE),
                "NoExecute"
            )
        );
        assert!(out_of_service(&mut node, false, ""));
        assert_eq!(
            node.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .map(Vec::len),
            Some(0)
        );

        // An admin's (no record) stays.
        let mut admins = Node::default();
        out_of_service(&mut admins, true, "admin");
        admins.metadata.annotations = None;
        assert!(!out_of_service(&mut admins, false, ""));
        assert_eq!(admins.spec.and_then(|s| s.taints).map(|t| t.len()), Some(1));
    }
}
