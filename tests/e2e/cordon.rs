//! The cordon written from a copy of the Node a watch delivered (the shutdown guard's, to save
//! a read while the shutdown budget runs): a stale copy neither overwrites what others wrote
//! since nor makes the agent claim a cordon that is not its own, and a copy from which there
//! is nothing to write is not believed.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use nodeward_api::labels::{SHUTDOWN_CORDON_BY, SHUTDOWN_TAINT};
use nodeward_api::node::Applied;
use nodeward_e2e::{NodeSpec, TestEnv};
use nodeward_runtime::cordon;
use serde_json::json;

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == SHUTDOWN_TAINT))
}

fn cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// A test's node after `prepare` (given the node, it returns the copy to cordon from): the
/// shutdown's cordon from that copy, what it says it did, and the node after it.
async fn cordon_from(
    test: &str,
    prepare: impl AsyncFnOnce(&kube::Api<Node>, &str) -> anyhow::Result<Node>,
) -> anyhow::Result<(TestEnv, Applied, Node)> {
    let env = TestEnv::new(test).await?;
    let name = env.node_name(0);
    env.create_nodes(&[NodeSpec::worker("zone-a")]).await?;
    let nodes = env.nodes();
    let copy = prepare(&nodes, &name).await?;
    let applied = cordon::apply(
        &env.client,
        Some(copy),
        &name,
        SHUTDOWN_TAINT,
        SHUTDOWN_CORDON_BY,
    )
    .await?;
    let node = nodes.get(&name).await?;
    Ok((env, applied, node))
}

#[tokio::test]
async fn a_cordon_from_a_stale_copy_keeps_what_others_wrote_and_claims_only_its_own()
-> anyhow::Result<()> {
    let (env, applied, node) = cordon_from("cordon-stale", async |nodes, name| {
        let copy = nodes.get(name).await?;
        // An admin cordons the node and labels it after the copy was taken.
        let admin = json!({"metadata": {"labels": {"example.com/rack": "r7"}},
                           "spec": {"unschedulable": true}});
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&admin))
            .await?;
        Ok(copy)
    })
    .await?;
    assert_eq!(
        applied,
        Applied {
            cordoned: false,
            tainted: true
        },
        "the admin's cordon is not the agent's to undo later"
    );
    assert!(cordoned(&node) && tainted(&node));
    assert_eq!(
        node.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("example.com/rack"))
            .map(String::as_str),
        Some("r7"),
        "the label written since the copy is kept"
    );
    env.cleanup().await
}

#[tokio::test]
async fn a_copy_that_leaves_nothing_to_write_is_read_again() -> anyhow::Result<()> {
    let (env, applied, node) = cordon_from("cordon-done", async |nodes, name| {
        // A copy taken while an admin held the node cordoned and under the taint: from it,
        // there is nothing to write. The admin has taken both away since.
        let params = PatchParams::default();
        let held = json!({"spec": {"unschedulable": true,
                                   "taints": [{"key": SHUTDOWN_TAINT, "effect": "NoSchedule"}]}});
        let copy = nodes.patch(name, &params, &Patch::Merge(&held)).await?;
        let released = json!({"spec": {"unschedulable": null, "taints": null}});
        nodes.patch(name, &params, &Patch::Merge(&released)).await?;
        Ok(copy)
    })
    .await?;
    assert_eq!(
        applied,
        Applied {
            cordoned: true,
            tainted: true
        }
    );
    assert!(
        cordoned(&node) && tainted(&node),
        "the copy was believed: the node is left schedulable"
    );
    env.cleanup().await
}
