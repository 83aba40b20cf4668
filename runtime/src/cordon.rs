//! Writing nodeward's changes to a Node (the agent its own; the coordinator undoes what a lost
//! agent left): the changes themselves are pure and live in [`nodeward_api::node`], which
//! records what nodeward did so that undoing it never uncordons a node an admin had cordoned.
//! Read-modify-write with the Node's resourceVersion, retried on conflict (the kubelet and
//! controllers write Nodes too).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::PostParams};
use nodeward_api::node::{Applied, cordon_and_taint, left_by, out_of_service, pending, revert};

use crate::ApiError;

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
/// `uid`, and makes the change `also` makes on the Node as read; returns whether it changed.
pub async fn relabel(
    client: &Client,
    name: &str,
    uid: &str,
    labels: &BTreeMap<String, Option<String>>,
    annotations: &BTreeMap<String, Option<String>>,
    mut also: impl FnMut(&mut Node) -> bool,
) -> Result<bool, ApiError> {
    update_same_node(client, name, uid, "labelling", |node| {
        let mut changed = also(node);
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
