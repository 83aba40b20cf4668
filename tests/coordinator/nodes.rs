//! What a node carries while it waits and around its maintenance: the pending taint and the
//! policy's node labels.

use super::*;

#[tokio::test]
async fn a_node_waiting_for_its_turn_is_tainted_prefer_no_schedule_until_admitted()
-> anyhow::Result<()> {
    let env = scenario(
        "pending-taint",
        &[NodeSpec::worker("a"), NodeSpec::worker("a")],
    )
    .await?;
    let (first, second) = (env.node_name(0), env.node_name(1));
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "taintWhilePending": true}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let going = create_maintenance(&env, &first).await?;
    wait_admitted(&env, &going, TIMEOUT).await?;
    let waiting = create_maintenance(&env, &second).await?;
    wait_denied(&env, &waiting, "BudgetExhausted").await?;

    // The next node in line avoids new pods; the one going now carries no such taint.
    let nodes = env.nodes();
    wait::until(
        &nodes,
        &second,
        "the waiting node tainted",
        TIMEOUT,
        pending_tainted,
    )
    .await?;
    assert!(!pending_tainted(nodes.get_opt(&first).await?.as_ref()));

    // Its turn: admitted, and the taint goes.
    finish(&env, &going).await?;
    wait_admitted(&env, &waiting, TIMEOUT).await?;
    wait::until(
        &nodes,
        &second,
        "the taint gone once admitted",
        TIMEOUT,
        |n| !pending_tainted(n),
    )
    .await?;
    finish(&env, &waiting).await?;
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn node_labels_go_on_before_the_drain_change_after_success_and_come_back_on_cancel()
-> anyhow::Result<()> {
    let env = scenario("node-labels", &[NodeSpec::worker("a")]).await?;
    let node = env.node_name(0);
    let lb = "node.kubernetes.io/exclude-from-external-load-balancers";
    env.merge_node(&node, json!({"metadata": {"labels": {lb: "false"}}}))
        .await?;
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "nodeLabels": {
            "beforeDrain": [{"key": lb, "value": "true"}, {"key": "example.com/state", "value": "draining"}],
            "afterSuccess": [{"key": "example.com/state", "value": "ready"}],
            "annotate": true,
        }}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let nodes = env.nodes();

    // Admitted: out of the load balancers before the drain, and said so.
    let first = create_maintenance(&env, &node).await?;
    wait_admitted(&env, &first, TIMEOUT).await?;
    let out = wait::until(&nodes, &node, "the labels before the drain", TIMEOUT, |n| {
        n.is_some_and(|n| n.labels().get(lb).map(String::as_str) == Some("true"))
    })
    .await?
    .context("node")?;
    assert_eq!(
        out.labels().get("example.com/state").map(String::as_str),
        Some("draining")
    );
    assert_eq!(
        out.annotations().get("nodeward.io/maintenance-in-progress"),
        Some(&first)
    );

    // Succeeded: the label after success, and the others as they were.
    finish(&env, &first).await?;
    let back = wait::until(&nodes, &node, "the labels after success", TIMEOUT, |n| {
        n.is_some_and(|n| !n.annotations().contains_key("nodeward.io/labels-before"))
    })
    .await?
    .context("node")?;
    assert_eq!(
        back.labels().get(lb).map(String::as_str),
        Some("false"),
        "the value it had"
    );
    assert_eq!(
        back.labels().get("example.com/state").map(String::as_str),
        Some("ready")
    );
    assert!(
        !back
            .annotations()
            .contains_key("nodeward.io/maintenance-in-progress")
    );
    assert_eq!(
        back.annotations()
            .get("nodeward.io/last-maintenance")
            .map(String::as_str),
        Some(format!("{first} Succeeded").as_str())
    );

    // Deleted after admission: every label back as it was before it.
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    api.delete(&first, &Default::default()).await?;
    let second = format!("{node}-again");
    env.create_maintenance(&second, &node, "Manual", "DrainOnly")
        .await?;
    wait_admitted(&env, &second, TIMEOUT).await?;
    wait::until(
        &nodes,
        &node,
        "the labels before the second drain",
        TIMEOUT,
        |n| n.is_some_and(|n| n.labels().get(lb).map(String::as_str) == Some("true")),
    )
    .await?;
    api.delete(&second, &Default::default()).await?;
    wait::until(&nodes, &node, "the labels put back", TIMEOUT, |n| {
        n.is_some_and(|n| !n.annotations().contains_key("nodeward.io/labels-before"))
    })
    .await?;
    assert_eq!(label_of(&env, &node, lb).await?.as_deref(), Some("false"));
    assert_eq!(
        label_of(&env, &node, "example.com/state").await?.as_deref(),
        Some("ready"),
        "as it was before the second maintenance"
    );
    env.cleanup_after(coordinator).await
}
