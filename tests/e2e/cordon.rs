//! The cordon written from a copy of the Node a watch delivered (the shutdown guard's, to save
//! a read while the shutdown budget runs): a stale copy neither overwrites what others wrote
//! since nor makes the agent claim a cordon that is not its own, and a copy from which there
//! is nothing to write is not believed.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use nodeward_api::labels::{SHUTDOWN_CORDON_BY, SHUTDOWN_TAINT};
use nodeward_e2e::{NodeSpec, TestEnv};
use nodeward_runtime::cordon::{self, Applied};
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

#[tokio::test]
async fn a_cordon_from_a_stale_copy_keeps_what_others_wrote_and_claims_only_its_own()
-> anyhow::Result<()> {
    let env = TestEnv::new("cordon-stale").await?;
    let name = env.node_name(0);
    env.create_nodes(&[NodeSpec::worker("zone-a")]).await?;
    let nodes = env.nodes();
    let copy = nodes.get(&name).await?;

    // An admin cordons the node and labels it after the copy was taken.
    let admin = json!({"metadata": {"labels": {"example.com/rack": "r7"}},
                       "spec": {"unschedulable": true}});
    nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&admin))
        .await?;

    let applied = cordon::apply(
        &env.client,
        Some(copy),
        &name,
        SHUTDOWN_TAINT,
        SHUTDOWN_CORDON_BY,
    )
    .await?;
    assert_eq!(
        applied,
        Applied {
            cordoned: false,
            tainted: true
        },
        "the admin's cordon is not the agent's to undo later"
    );
    let node = nodes.get(&name).await?;
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
    let env = TestEnv::new("cordon-done").await?;
    let name = env.node_name(0);
    env.create_nodes(&[NodeSpec::worker("zone-a")]).await?;
    let nodes = env.nodes();
    let params = PatchParams::default();

    // A copy taken while an admin held the node cordoned and under the taint: from it, there
    // is nothing to write. The admin has taken both away since.
    let held = json!({"spec": {"unschedulable": true,
                               "taints": [{"key": SHUTDOWN_TAINT, "effect": "NoSchedule"}]}});
    let copy = nodes.patch(&name, &params, &Patch::Merge(&held)).await?;
    let released = json!({"spec": {"unschedulable": null, "taints": null}});
    nodes
        .patch(&name, &params, &Patch::Merge(&released))
        .await?;

    let applied = cordon::apply(
        &env.client,
        Some(copy),
        &name,
        SHUTDOWN_TAINT,
        SHUTDOWN_CORDON_BY,
    )
    .await?;
    assert_eq!(
        applied,
        Applied {
            cordoned: true,
            tainted: true
        }
    );
    let node = nodes.get(&name).await?;
    assert!(
        cordoned(&node) && tainted(&node),
        "the copy was believed: the node is left schedulable"
    );
    env.cleanup().await
}
