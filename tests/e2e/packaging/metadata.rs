//! What one node's agent identity could still reach past the first round's rules, through what
//! they did not look at: owner references (the garbage collector deletes what the agent may
//! not), finalizers (a deletion that never completes), labels and annotations of any size on
//! everything it writes, its Node conditions in any number and size, and Events about anything.
//! Each attack is made with every identity the chart gives an agent (a token bound to its pod, a
//! token bound to its Node, a host-mode certificate) through the chart's policies.

use k8s_openapi::api::events::v1::Event;

use super::*;

/// The identities the chart gives the agent of `node`, each named.
pub(super) async fn identities_of(
    env: &TestEnv,
    node: &str,
) -> anyhow::Result<Vec<(&'static str, Client)>> {
    let account = format!("{}-nodeward-agent", env.id);
    let pod_bound = agent_on(env, node).await?;
    let uid = env
        .nodes()
        .get(node)
        .await?
        .uid()
        .context("the Node's uid")?;
    let node_bound = json!({"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid});
    let node_bound = client_as(Identity::Token(
        token_bound(env, &account, Some(node_bound)).await?,
    ))
    .await?;
    let certificate = host_mode_agent(env, node).await?;
    Ok(vec![
        ("a token bound to its pod", pod_bound),
        ("a token bound to its Node", node_bound),
        ("a host-mode certificate", certificate),
    ])
}

/// Every refusal names the attack, and says what the policy allows instead.
fn refused(how: &str, attack: &str, said: &str, expected: &str) {
    assert!(
        said.starts_with("403") && said.contains(expected),
        "{how}, {attack}: {said}"
    );
}

/// An owner that does not exist: the garbage collector deletes what it owns within a minute.
fn a_missing_owner() -> Value {
    json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone",
            "uid": "6c1f4a9e-0041-4000-8000-000000000041"}])
}

fn merge(patch: Value) -> Patch<Value> {
    Patch::Merge(patch)
}

/// An admin's maintenance of `node`, which its agent carries out.
async fn admins_maintenance(env: &TestEnv, node: &str) -> anyhow::Result<String> {
    let name = format!("{}-admins", env.id);
    let maintenance: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
        "spec": {"nodeName": node, "reason": "Reboot", "action": "Reboot", "requestedBy": "admin"},
    }))?;
    Api::<NodeMaintenance>::all(env.client.clone())
        .create(&PostParams::default(), &maintenance)
        .await?;
    Ok(name)
}

/// A NodeReport of `node` with `metadata`.
fn report(node: &str, metadata: Value) -> anyhow::Result<NodeReport> {
    let mut metadata = metadata;
    metadata["name"] = json!(node);
    Ok(serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
        "metadata": metadata, "spec": {"nodeName": node},
    }))?)
}

/// The agent's Lease with `metadata`.
fn lease(node: &str, metadata: Value) -> anyhow::Result<Lease> {
    let mut metadata = metadata;
    metadata["name"] = json!(format!("nodeward-agent-{node}"));
    Ok(serde_json::from_value(json!({
        "metadata": metadata,
        "spec": {"holderIdentity": node, "renewTime": "2026-11-28T00:00:00.000000Z"},
    }))?)
}

#[tokio::test]
async fn an_agent_cannot_have_the_garbage_collector_delete_nor_a_finalizer_keep_what_is_not_its_own()
-> anyhow::Result<()> {
    let (env, _dir, documents) = own_chart("owners").await?;
    let node = env.node_name(0);
    let identities = identities_of(&env, &node).await?;
    held_to_its_own_node(&identities[0].1, &node, &env.node_name(1)).await?;
    let admins = admins_maintenance(&env, &node).await?;
    let params = PatchParams::default();
    let owners = "may not add or change owner references";
    let finalizers = "may add or remove only its own finalizer";

    for (how, agent) in &identities {
        let nodes: Api<Node> = Api::all(agent.clone());
        let maintenances: Api<NodeMaintenance> = Api::all(agent.clone());
        let reports: Api<NodeReport> = Api::all(agent.clone());
        let leases: Api<Lease> = Api::namespaced(agent.clone(), &env.namespace);
        let with_owner = json!({"ownerReferences": a_missing_owner()});
        for (attack, said, expected) in [
            (
                "its Node owned by something gone",
                refusal(
                    nodes
                        .patch(&node, &params, &merge(json!({"metadata": with_owner})))
                        .await,
                ),
                owners,
            ),
            (
                "an admin's maintenance of its node owned by something gone",
                refusal(
                    maintenances
                        .patch(&admins, &params, &merge(json!({"metadata": with_owner})))
                        .await,
                ),
                owners,
            ),
            (
                "its NodeReport owned by something gone",
                refusal(
                    reports
                        .create(&PostParams::default(), &report(&node, with_owner.clone())?)
                        .await,
                ),
                owners,
            ),
            (
                "its Lease owned by something gone",
                refusal(
                    leases
                        .create(&PostParams::default(), &lease(&node, with_owner.clone())?)
                        .await,
                ),
                owners,
            ),
            (
                "a foreign finalizer on its Node",
                refusal(
                    nodes
                        .patch(
                            &node,
                            &params,
                            &merge(json!({"metadata": {"finalizers": ["example.com/keep"]}})),
                        )
                        .await,
                ),
                finalizers,
            ),
            (
                "a foreign finalizer on the admin's maintenance",
                refusal(
                    maintenances
                        .patch(
                            &admins,
                            &params,
                            &merge(json!({"metadata": {"finalizers": ["example.com/keep"]}})),
                        )
                        .await,
                ),
                finalizers,
            ),
            (
                "the coordinator's surge finalizer",
                refusal(
                    maintenances
                        .patch(
                            &admins,
                            &params,
                            &merge(json!({"metadata": {"finalizers": ["nodeward.io/surge"]}})),
                        )
                        .await,
                ),
                finalizers,
            ),
        ] {
            refused(how, attack, &said, expected);
        }
        // What it does itself: its finalizer on a maintenance it carries out, put on and taken
        // away.
        for finalizers in [json!(["nodeward.io/maintenance"]), Value::Null] {
            maintenances
                .patch(
                    &admins,
                    &params,
                    &merge(json!({"metadata": {"finalizers": finalizers}})),
                )
                .await
                .with_context(|| format!("{how}: its own finalizer {finalizers}"))?;
        }
    }

    // Its NodeReport owned by its Node, as the agent writes it; the Node and the admin's
    // maintenance are still there.
    let uid = env
        .nodes()
        .get(&node)
        .await?
        .uid()
        .context("the Node's uid")?;
    let by_its_node = json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
                             "labels": {"nodeward.io/node": node}});
    Api::<NodeReport>::all(identities[0].1.clone())
        .create(&PostParams::default(), &report(&node, by_its_node)?)
        .await
        .context("its NodeReport owned by its Node")?;
    env.nodes().get(&node).await?;
    let maintenances = Api::<NodeMaintenance>::all(env.client.clone());
    maintenances.get(&admins).await?;

    remove_chart(env, &documents).await
}

/// An agent condition (`KubeletProblem`) with `message`.
fn condition(message: &str) -> Value {
    json!({"type": "KubeletProblem", "status": "False", "reason": "E2E", "message": message,
           "lastHeartbeatTime": "2026-11-28T10:00:00Z", "lastTransitionTime": "2026-11-28T10:00:00Z"})
}

/// A request of `node` under its pinned name, with `metadata`.
fn request(node: &str, metadata: Value) -> anyhow::Result<NodeMaintenance> {
    let mut metadata = metadata;
    metadata["name"] = json!(format!("{node}-reboot-00000041"));
    Ok(serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance", "metadata": metadata,
        "spec": {"nodeName": node, "reason": "Reboot", "action": "Reboot", "requestedBy": "nodeward-agent"},
    }))?)
}

/// 250 KB.
fn quarter_mb() -> String {
    "x".repeat(250 * 1024)
}

/// What the agent may not put on its Node however it writes it: each attack, what the API
/// server said, what the refusal must say.
async fn oversized_on_its_node(
    agent: &Client,
    node: &str,
) -> anyhow::Result<Vec<(&'static str, String, &'static str)>> {
    let nodes: Api<Node> = Api::all(agent.clone());
    let params = PatchParams::default();
    let apply = PatchParams::apply("nodeward-agent").force();
    let conditions = "may write each of its conditions once in its Node status";
    let duplicate = json!([
        {"op": "add", "path": "/status/conditions/-", "value": condition("once")},
        {"op": "add", "path": "/status/conditions/-", "value": condition("twice")},
    ]);
    Ok(vec![
        (
            "a cordon recorded in 250 KB",
            refusal(
                nodes
                    .patch(
                        node,
                        &params,
                        &merge(json!({"spec": {"unschedulable": true},
                            "metadata": {"annotations": {CORDONED_BY_ANNOTATION: quarter_mb()}}})),
                    )
                    .await,
            ),
            "to at most 253 characters",
        ),
        (
            "a taint of its own making",
            refusal(
                nodes
                    .patch(
                        node,
                        &params,
                        &merge(json!({"spec": {"taints": [{"key": "nodeward.io/flood-1", "effect": "NoSchedule"}]}})),
                    )
                    .await,
            ),
            "only the taints nodeward.io/shutdown and nodeward.io/maintenance",
        ),
        (
            "a condition message of 1 MiB",
            refusal(
                nodes
                    .patch_status(
                        node,
                        &apply,
                        &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                            "status": {"conditions": [condition(&"m".repeat(1 << 20))]}})),
                    )
                    .await,
            ),
            conditions,
        ),
        (
            "its condition twice",
            refusal(
                nodes
                    .patch_status(
                        node,
                        &params,
                        &Patch::<()>::Json(serde_json::from_value(duplicate)?),
                    )
                    .await,
            ),
            conditions,
        ),
    ])
}

/// What the agent may not put on the objects it creates: each attack, what the API server
/// said, what the refusal must say.
async fn oversized_on_its_objects(
    agent: &Client,
    env: &TestEnv,
    node: &str,
) -> anyhow::Result<Vec<(&'static str, String, String)>> {
    let reports: Api<NodeReport> = Api::all(agent.clone());
    let leases: Api<Lease> = Api::namespaced(agent.clone(), &env.namespace);
    let events: Api<Event> = Api::namespaced(agent.clone(), "default");
    let post = PostParams::default();
    let labels: serde_json::Map<String, Value> = (0..200)
        .map(|i| (format!("example.com/l{i}"), json!("v")))
        .collect();
    let annotated = json!({"labels": {"nodeward.io/node": node},
                           "annotations": {"example.com/blob": quarter_mb()}});
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": format!("{}.flood", env.id), "annotations": {"example.com/blob": quarter_mb()}},
        "eventTime": "2026-11-28T10:00:00.000000Z",
        "reportingController": "nodeward-agent", "reportingInstance": node,
        "action": "Detect", "reason": "E2E", "type": "Normal", "note": "e2e",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
    }))?;
    let of = |resource: &str| format!("may change no labels or annotations of {resource}");
    Ok(vec![
        (
            "a NodeReport with 200 labels",
            refusal(
                reports
                    .create(&post, &report(node, json!({"labels": labels}))?)
                    .await,
            ),
            format!(
                "{} {node} but set nodeward.io/node={node}",
                of("nodereports")
            ),
        ),
        (
            "a NodeReport with a 250 KB annotation",
            refusal(
                reports
                    .create(&post, &report(node, annotated.clone())?)
                    .await,
            ),
            of("nodereports"),
        ),
        (
            "a reboot request with a 250 KB annotation",
            refusal(
                Api::<NodeMaintenance>::all(agent.clone())
                    .create(&post, &request(node, annotated)?)
                    .await,
            ),
            of("nodemaintenances"),
        ),
        (
            "its Lease with an annotation",
            refusal(
                leases
                    .create(
                        &post,
                        &lease(node, json!({"annotations": {"example.com/blob": "x"}}))?,
                    )
                    .await,
            ),
            of("leases"),
        ),
        (
            "an Event with a 250 KB annotation",
            refusal(events.create(&post, &event).await),
            of("events"),
        ),
    ])
}

#[tokio::test]
async fn everything_an_agent_writes_is_bounded_in_count_and_size() -> anyhow::Result<()> {
    let (env, _dir, documents) = own_chart("sizes").await?;
    let node = env.node_name(0);
    let identities = identities_of(&env, &node).await?;
    held_to_its_own_node(&identities[0].1, &node, &env.node_name(1)).await?;
    for (how, agent) in &identities {
        for (attack, said, expected) in oversized_on_its_node(agent, &node).await? {
            refused(how, attack, &said, expected);
        }
        for (attack, said, expected) in oversized_on_its_objects(agent, &env, &node).await? {
            refused(how, attack, &said, &expected);
        }
    }

    // What the agent writes itself is within the bounds: its condition with the longest message
    // it writes, a reboot request with its label.
    let (how, agent) = &identities[0];
    Api::<Node>::all(agent.clone())
        .patch_status(
            &node,
            &PatchParams::apply("nodeward-agent").force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                "status": {"conditions": [condition(&"m".repeat(nodeward_api::bounds::MESSAGE_LIMIT))]}})),
        )
        .await
        .with_context(|| format!("{how}: its condition with a message of the longest it writes"))?;
    Api::<NodeMaintenance>::all(agent.clone())
        .create(
            &PostParams::default(),
            &request(&node, json!({"labels": {"nodeward.io/node": node}}))?,
        )
        .await
        .with_context(|| format!("{how}: its reboot request"))?;
    inventory_bounded(agent, &node).await?;
    remove_chart(env, &documents).await
}

/// The inventory an agent writes into its NodeReport is bounded by the CRD: 33 packages, a
/// kernel of 129 characters or an error of 1,025 are refused, naming the field; the largest
/// the bounds allow is written.
async fn inventory_bounded(agent: &Client, node: &str) -> anyhow::Result<()> {
    let reports: Api<NodeReport> = Api::all(agent.clone());
    if reports.get_opt(node).await?.is_none() {
        reports
            .create(
                &PostParams::default(),
                &report(node, json!({"labels": {"nodeward.io/node": node}}))?,
            )
            .await
            .context("its NodeReport")?;
    }
    let packages = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"name": format!("p{i}"), "version": "1"}))
            .collect()
    };
    let write = |inventory: Value| {
        let reports = reports.clone();
        async move {
            reports
                .patch_status(
                    node,
                    &PatchParams::apply("nodeward-agent/inventory").force(),
                    &Patch::Apply(
                        json!({"apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
                        "status": {"inventory": inventory}}),
                    ),
                )
                .await
        }
    };
    for (attack, inventory, field) in [
        (
            "33 packages",
            json!({"packages": packages(33)}),
            "status.inventory.packages",
        ),
        (
            "a kernel of 129 characters",
            json!({"kernel": "k".repeat(129)}),
            "status.inventory.kernel",
        ),
        (
            "an error of 1,025 characters",
            json!({"error": "e".repeat(1025)}),
            "status.inventory.error",
        ),
    ] {
        let said = refusal(write(inventory).await);
        assert!(
            said.starts_with("422") && said.contains(field),
            "{attack}: {said}"
        );
    }
    write(json!({"packages": packages(32), "kernel": "k".repeat(128), "error": "e".repeat(1024)}))
        .await
        .context("the largest inventory the bounds allow")?;
    Ok(())
}

#[tokio::test]
async fn an_agent_publishes_events_only_about_its_own_things_and_files_requests_as_itself()
-> anyhow::Result<()> {
    let (env, _dir, documents) = own_chart("events").await?;
    let (node, other) = (env.node_name(0), env.node_name(1));
    let identities = identities_of(&env, &node).await?;
    held_to_its_own_node(&identities[0].1, &node, &other).await?;
    let admins = admins_maintenance(&env, &node).await?;
    let event = |n: usize,
                 instance: &str,
                 regarding: Value,
                 related: Value|
     -> anyhow::Result<Event> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": format!("{}.{n}", env.id)}, "eventTime": "2026-11-28T10:00:00.000000Z",
            "reportingController": "nodeward-agent", "reportingInstance": instance,
            "action": "Maintenance", "reason": "E2E", "type": "Normal", "note": "e2e",
            "regarding": regarding, "related": related,
        }))?)
    };
    let node_ref = |name: &str| json!({"apiVersion": "v1", "kind": "Node", "name": name});
    let maintenance_ref =
        json!({"apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance", "name": admins});
    let pod_ref =
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "anything"});
    let only_its_own = "may publish Events only as nodeward-agent";
    let mut published = Vec::new();

    for (how, agent) in &identities {
        let events: Api<Event> = Api::namespaced(agent.clone(), "default");
        let create = |e: Event| {
            let events = events.clone();
            async move { events.create(&PostParams::default(), &e).await }
        };
        for (attack, said) in [
            (
                "about another node",
                refusal(create(event(1, &node, node_ref(&other), Value::Null)?).await),
            ),
            (
                "as another node's agent",
                refusal(create(event(2, &other, node_ref(&node), Value::Null)?).await),
            ),
            (
                "about a maintenance, related to nothing",
                refusal(create(event(3, &node, maintenance_ref.clone(), Value::Null)?).await),
            ),
            (
                "about a maintenance, related to another node",
                refusal(create(event(4, &node, maintenance_ref.clone(), node_ref(&other))?).await),
            ),
            (
                "about a pod",
                refusal(create(event(5, &node, pod_ref.clone(), node_ref(&node))?).await),
            ),
        ] {
            refused(how, attack, &said, only_its_own);
        }
        // What it publishes: about its Node, and about a maintenance of its node, related to its
        // Node.
        for (n, regarding) in [(6, node_ref(&node)), (7, maintenance_ref.clone())] {
            let written = create(event(n, &node, regarding, node_ref(&node))?)
                .await
                .with_context(|| format!("{how}: its own Event {n}"))?;
            published.push(written.name_any());
            Api::<Event>::namespaced(env.client.clone(), "default")
                .delete(&written.name_any(), &DeleteParams::default())
                .await?;
        }

        // A request filed in an admin's name.
        let maintenances: Api<NodeMaintenance> = Api::all(agent.clone());
        let request: NodeMaintenance = serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": format!("{node}-reboot-00000042"), "labels": {"nodeward.io/node": node}},
            "spec": {"nodeName": node, "reason": "Reboot", "action": "Reboot", "requestedBy": "kubernetes-admin"},
        }))?;
        let said = refusal(maintenances.create(&PostParams::default(), &request).await);
        refused(
            how,
            "a request in an admin's name",
            &said,
            "files its requests as requestedBy nodeward-agent, not kubernetes-admin",
        );
    }
    assert_eq!(published.len(), 2 * identities.len());

    remove_chart(env, &documents).await
}

/// A condition of `type_` as another writer puts it on a Node.
fn foreign_condition(type_: &str) -> Value {
    json!({"type": type_, "status": "True", "reason": "E2E", "message": "set by an admin",
           "lastHeartbeatTime": "2026-11-28T10:00:00Z", "lastTransitionTime": "2026-11-28T10:00:00Z"})
}

/// A check removed from the configuration (its condition type in `retiredConditionTypes`): with
/// each identity the agent may remove that condition from its Node, never set or change it, and
/// may not remove a condition that is not its own.
#[tokio::test]
async fn an_agent_may_remove_a_removed_checks_condition_and_no_other_it_does_not_write()
-> anyhow::Result<()> {
    let (env, _dir, documents) = own_chart("retired").await?;
    let node = env.node_name(0);
    let identities = identities_of(&env, &node).await?;
    held_to_its_own_node(&identities[0].1, &node, &env.node_name(1)).await?;
    let admin: Api<Node> = env.nodes();
    let params = PatchParams::default();
    let has = |n: &Node, type_: &str| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == type_))
    };
    let only_its_own = "may change only the conditions it writes";
    for (how, agent) in &identities {
        admin
            .patch_status(
                &node,
                &params,
                &Patch::Strategic(json!({"status": {"conditions": [
                    foreign_condition("OldCheckProblem"), foreign_condition("OtherToolProblem")]}})),
            )
            .await?;
        let nodes: Api<Node> = Api::all(agent.clone());
        let mut changed = foreign_condition("OldCheckProblem");
        changed["status"] = json!("False");
        let said = refusal(
            nodes
                .patch_status(
                    &node,
                    &params,
                    &Patch::Strategic(json!({"status": {"conditions": [changed]}})),
                )
                .await,
        );
        refused(
            how,
            "changing a removed check's condition",
            &said,
            only_its_own,
        );
        let said = refusal(
            nodes
                .patch_status(
                    &node,
                    &params,
                    &Patch::Strategic(json!({"status": {"conditions": [
                        {"type": "OtherToolProblem", "$patch": "delete"}]}})),
                )
                .await,
        );
        refused(
            how,
            "removing another's condition",
            &said,
            "and remove those of removed checks (OldCheckProblem)",
        );
        let removed = nodes
            .patch_status(
                &node,
                &params,
                &Patch::Strategic(json!({"status": {"conditions": [
                    {"type": "OldCheckProblem", "$patch": "delete"}]}})),
            )
            .await
            .with_context(|| format!("{how}: removing a removed check's condition"))?;
        assert!(
            !has(&removed, "OldCheckProblem") && has(&removed, "OtherToolProblem"),
            "{how}: only the removed check's condition went"
        );
    }
    remove_chart(env, &documents).await
}
