//! Non-graceful node shutdown for dead nodes ([`crate::dead`]): where a policy with
//! `remediation.outOfServiceTaint` selects a dead node, the coordinator taints it
//! `node.kubernetes.io/out-of-service` (its pods are deleted and their volumes detached, so
//! stateful pods start elsewhere), decided like any remediation; and it takes its own taint
//! away once the node is Ready again. A node that looks dead but is not known to be down (its
//! agent does not fence it, or its fencing is not over) waits, and the round says why.

use std::collections::BTreeMap;

use kube_core::ResourceExt;
use nodeward_api::{
    labels::{OUT_OF_SERVICE_ANNOTATION, OUT_OF_SERVICE_TAINT},
    node::is_ready,
};

use super::{
    OutOfService, Plan,
    remediate::{Deciding, admit_without_agent},
    view::Index,
};
use crate::admission::decide::Cluster;

/// `not_known_down`: the nodes that look dead but whose agents do not fence them (or not yet
/// long enough), each with why: where a policy asks for the taint they wait, and say why.
pub(super) fn decide(
    index: &Index,
    cluster: &Cluster,
    not_known_down: &BTreeMap<&str, String>,
    plan: &mut Plan,
) {
    let mut deciding: Option<Deciding> = None;
    for (name, node) in &index.nodes {
        let ours = node.annotations().contains_key(OUT_OF_SERVICE_ANNOTATION);
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT));
        let uid = node.uid().unwrap_or_default();
        if ours && is_ready(node) {
            plan.out_of_service.push(OutOfService {
                node: (*name).to_owned(),
                uid,
                on: false,
                message: "Ready again: the out-of-service taint is taken away".to_owned(),
            });
            continue;
        }
        let dead = cluster.nodes.get(*name).and_then(|n| n.dead.as_ref());
        let Some(why) = dead.or_else(|| not_known_down.get(*name)) else {
            continue;
        };
        let wanted_by = index.policies.iter().find(|p| {
            p.matched.contains(*name)
                && p.policy
                    .spec
                    .remediation
                    .as_ref()
                    .is_some_and(|r| r.enabled && r.out_of_service_taint)
        });
        let Some(policy) = wanted_by.filter(|_| !tainted) else {
            continue;
        };
        if dead.is_none() {
            plan.out_of_service_waits
                .push(((*name).to_owned(), why.clone()));
            continue;
        }
        match admit_without_agent(cluster, &mut deciding, name) {
            Ok(()) => plan.out_of_service.push(OutOfService {
                node: (*name).to_owned(),
                uid,
                on: true,
                message: format!("dead under policy {}: {why}", policy.name),
            }),
            Err(wait) => plan.out_of_service_waits.push(((*name).to_owned(), wait)),
        }
    }
}
