//! What a node carries while it waits and around its maintenance: the pending taint, the
//! policy's node labels and the marks other actors honour; a Node write the cluster refuses
//! is told on the Node.

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

#[tokio::test]
async fn a_node_under_maintenance_carries_the_other_actors_marks_and_keeps_an_admins_own()
-> anyhow::Result<()> {
    let env = scenario("marks", &[NodeSpec::worker("a")]).await?;
    let node = env.node_name(0);
    let (medik8s, autoscaler, karpenter, record) = (
        "remediation.medik8s.io/exclude-from-remediation",
        "cluster-autoscaler.kubernetes.io/scale-down-disabled",
        "karpenter.sh/do-not-disrupt",
        "nodeward.io/marks",
    );
    // The admin keeps Karpenter off this node anyway.
    env.merge_node(
        &node,
        json!({"metadata": {"annotations": {karpenter: "true"}}}),
    )
    .await?;
    // A label in a domain that merely ends in "k8s.io" is not a Kubernetes one: the CRD and
    // the chart's admission policy let nodeLabels set it.
    let team = "storage.medik8s.io/draining";
    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "nodeLabels": {"beforeDrain": [{"key": team, "value": "yes"}]}}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let nodes = env.nodes();

    let m = create_maintenance(&env, &node).await?;
    wait_admitted(&env, &m, TIMEOUT).await?;
    let marked = wait::until(&nodes, &node, "the marks on", TIMEOUT, |n| {
        n.is_some_and(|n| n.annotations().contains_key(record))
    })
    .await?
    .context("node")?;
    let (labels, annotations) = (marked.labels(), marked.annotations());
    assert_eq!(labels.get(medik8s).map(String::as_str), Some("true"));
    assert_eq!(labels.get(team).map(String::as_str), Some("yes"));
    assert_eq!(
        annotations.get(autoscaler).map(String::as_str),
        Some("true")
    );
    assert_eq!(annotations.get(karpenter).map(String::as_str), Some("true"));
    assert_eq!(
        annotations.get(record).map(String::as_str),
        Some(format!("{medik8s},{autoscaler}").as_str()),
        "the admin's own mark is not nodeward's"
    );

    finish(&env, &m).await?;
    let after = wait::until(&nodes, &node, "the marks off", TIMEOUT, |n| {
        n.is_some_and(|n| !n.annotations().contains_key(record))
    })
    .await?
    .context("node")?;
    assert!(
        !after.labels().contains_key(medik8s),
        "{:?}",
        after.labels()
    );
    assert!(!after.annotations().contains_key(autoscaler));
    assert_eq!(
        after.annotations().get(karpenter).map(String::as_str),
        Some("true"),
        "the admin's mark stays"
    );
    env.cleanup_after(coordinator).await
}

#[tokio::test]
async fn a_node_write_the_cluster_refuses_is_a_warning_event_on_the_node() -> anyhow::Result<()> {
    let env = scenario("refused", &[NodeSpec::worker("a")]).await?;
    let node = env.node_name(0);
    // The cluster's own rule, beside the chart's: no Node of this test gets this label.
    env.refusing_policy(
        "no-refused-label",
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}]),
        &format!("request.name.startsWith('{}-')", env.id),
        "!('example.com/refused' in object.metadata.?labels.orValue({}))",
        "this cluster does not allow example.com/refused on nodes",
    )
    .await?;
    // In force once it refuses the admin too (the API server loads policies a moment later).
    let nodes = env.nodes();
    let try_label = Patch::Merge(json!({"metadata": {"labels": {"example.com/refused": "yes"}}}));
    wait::eventually("the cluster's rule in force", TIMEOUT, || async {
        let dry = PatchParams {
            dry_run: true,
            ..PatchParams::default()
        };
        Ok(nodes
            .patch(&node, &dry, &try_label)
            .await
            .is_err()
            .then_some(()))
    })
    .await?;

    env.create_policy(
        "pool",
        json!({"maxConcurrent": 1, "nodeLabels": {"beforeDrain": [{"key": "example.com/refused", "value": "yes"}]}}),
    )
    .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let m = create_maintenance(&env, &node).await?;
    wait_admitted(&env, &m, TIMEOUT).await?;
    let event = env
        .wait_event(&node, "regarding.kind=Node", "NodeWriteRefused")
        .await?;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("this cluster does not allow example.com/refused on nodes"),
        "the cluster's words in the Event: {note}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // `kubectl nodeward why` says it too, though the maintenance goes on.
    let why = tokio::process::Command::new(nodeward_e2e::daemon::cli_binary())
        .arg("--kubeconfig")
        .arg(&controlplane::shared().kubeconfig)
        .args(["why", &node])
        .output()
        .await?;
    let said = String::from_utf8_lossy(&why.stdout);
    assert!(
        why.status.success()
            && said.contains("writes the cluster refused (")
            && said.contains("nodeward-coordinator ")
            && said.contains("this cluster does not allow example.com/refused on nodes"),
        "{said}{}",
        String::from_utf8_lossy(&why.stderr)
    );
    env.cleanup_after(coordinator).await
}
