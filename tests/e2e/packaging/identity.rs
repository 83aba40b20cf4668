//! The chart applied, each identity kept to what it needs: the agent's service account (pod-bound
//! and Node-bound tokens, host-mode certificates) held to its own node by the admission policy,
//! the coordinator changing only what a lost agent's maintenance left.

use super::*;

#[tokio::test]
async fn the_applied_chart_keeps_each_identity_to_what_it_needs() -> anyhow::Result<()> {
    let (env, dir, documents) = own_chart("chart").await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));

    let coordinator_account = format!("{}-nodeward-coordinator", env.id);
    let agent = agent_on(&env, &node_a).await?;
    let label = |value: &str| Patch::Merge(json!({"metadata": {"labels": {"e2e-touched": value}}}));
    held_to_its_own_node(&agent, &node_a, &node_b).await?;

    // Pods: deleting one on its node is allowed, on another node refused.
    let (on_a, on_b) = a_pod_on_each(&env, &node_a, &node_b).await?;
    let pods: Api<Pod> = Api::namespaced(agent.clone(), &env.namespace);
    pods.delete(&on_a.name_any(), &DeleteParams::default())
        .await?;
    let said = refusal(
        pods.delete(&on_b.name_any(), &DeleteParams::default())
            .await,
    );
    assert!(
        said.contains("may delete only pods on its own node"),
        "{said}"
    );

    lease_only_its_own(&agent, &env, &node_a, &node_b).await?;
    reads_only_what_it_needs(&agent, &env).await?;

    maintenances_of_its_own_node(&agent, &env, &node_a, &node_b).await?;

    // Evictions: the chart's webhook, served by the chart's coordinator with the certificate it
    // keeps itself.
    let webhook = EvictionWebhook::serving(&env, &dir, &documents, &[]).await?;
    env.replicaset("evict-a", &node_a, 1, &PodOptions::default())
        .await?;
    let evict_a = env.running_pods("evict-a", 1).await?.remove(0);
    let said = webhook
        .refusal_of(&pods, &on_b, &Default::default())
        .await?;
    assert!(
        said.contains(&format!(
            "nodeward-agent on node {node_a} may evict only pods on its own node; {}/{} runs on {node_b}",
            env.namespace,
            on_b.name_any()
        )),
        "{said}"
    );
    pods.evict(&evict_a.name_any(), &Default::default())
        .await
        .with_context(|| webhook.coordinator.output())?;
    drop(webhook);

    // The coordinator's identity: reads nodes, may not delete pods nor relabel nodes.
    let coordinator = client_as(Identity::Token(
        token(&env, &coordinator_account, None).await?,
    ))
    .await?;
    Api::<Node>::all(coordinator.clone()).get(&node_a).await?;
    let said = refusal(
        Api::<Pod>::namespaced(coordinator.clone(), &env.namespace)
            .delete(&on_b.name_any(), &DeleteParams::default())
            .await,
    );
    assert!(said.starts_with("403"), "{said}");
    let said = refusal(
        Api::<Node>::all(coordinator)
            .patch(&node_b, &PatchParams::default(), &label("c"))
            .await,
    );
    assert!(said.starts_with("403"), "{said}");

    remove_chart(env, &documents).await
}

/// A host-mode agent's client certificate (user `nodeward:agent:<node>` in `nodeward:agents`,
/// issued through the CSR API as an operator would) is held to the node its name carries, as a
/// token's claim holds the DaemonSet's agent; and it needs no Node, so an agent on a node whose
/// kubelet never registered writes its report and its Lease.
#[tokio::test]
async fn a_host_mode_certificate_keeps_its_agent_to_the_node_its_name_carries() -> anyhow::Result<()>
{
    let (env, dir, documents) = own_chart("hostcert").await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));
    let unregistered = env.node_name(7);
    let agent = host_mode_agent(&env, &node_a).await?;

    held_to_its_own_node(&agent, &node_a, &node_b).await?;

    // A node that never registered: its agent reports and keeps its Lease, under its name only.
    let lonely = host_mode_agent(&env, &unregistered).await?;
    let reports: Api<NodeReport> = Api::all(lonely.clone());
    let report = |node: &str| -> anyhow::Result<NodeReport> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
            "metadata": {"name": node}, "spec": {"nodeName": node},
        }))?)
    };
    reports
        .create(&PostParams::default(), &report(&unregistered)?)
        .await
        .context("the unregistered node's agent writing its report")?;
    let said = refusal(
        reports
            .create(&PostParams::default(), &report(&node_b)?)
            .await,
    );
    assert!(said.starts_with("403"), "another node's report: {said}");
    let leases: Api<Lease> = Api::namespaced(lonely.clone(), &env.namespace);
    let lease = |name: String| -> anyhow::Result<Lease> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"holderIdentity": unregistered, "renewTime": "2026-11-25T00:00:00.000000Z"},
        }))?)
    };
    leases
        .create(
            &PostParams::default(),
            &lease(format!("nodeward-agent-{unregistered}"))?,
        )
        .await
        .context("the unregistered node's agent writing its Lease")?;
    let said = refusal(
        leases
            .create(
                &PostParams::default(),
                &lease(format!("nodeward-agent-{node_b}"))?,
            )
            .await,
    );
    assert!(said.contains("may write only the Lease"), "{said}");

    // Evictions through the chart's webhook: its own node's pods, not another's.
    let webhook = EvictionWebhook::serving(&env, &dir, &documents, &[]).await?;
    let (on_a, on_b) = a_pod_on_each(&env, &node_a, &node_b).await?;
    let pods: Api<Pod> = Api::namespaced(agent.clone(), &env.namespace);
    let dry_run = dry_run_eviction();
    let said = webhook.refusal_of(&pods, &on_b, &dry_run).await?;
    assert!(
        said.contains(&format!("nodeward-agent on node {node_a} may evict")),
        "{said}"
    );
    pods.evict(&on_a.name_any(), &dry_run)
        .await
        .with_context(|| webhook.coordinator.output())?;
    drop(webhook);

    // The same user outside the group has none of the agent's rights.
    let outsider = nodeward_e2e::certificates::issue(
        &env.client,
        &format!("{}-outsider", env.id),
        &format!("{AGENT_USER_PREFIX}{node_a}"),
        &[],
    )
    .await?;
    let outsider = client_as(Identity::Certificate(outsider)).await?;
    let said = refusal(
        Api::<Node>::all(outsider)
            .patch(
                &node_a,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {AGENT_LABEL: "false"}}})),
            )
            .await,
    );
    assert!(
        said.starts_with("403") && said.contains("forbidden"),
        "{said}"
    );

    Api::<NodeReport>::all(env.client.clone())
        .delete(&unregistered, &DeleteParams::default())
        .await?;
    remove_chart(env, &documents).await
}

#[tokio::test]
async fn the_coordinator_changes_only_what_a_lost_agents_maintenance_left_on_a_node()
-> anyhow::Result<()> {
    let (env, _, documents) = own_chart("coord-node").await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));
    let account = format!("{}-nodeward-coordinator", env.id);
    let coordinator: Api<Node> =
        Api::all(client_as(Identity::Token(token(&env, &account, None).await?)).await?);
    // The policy in force (the API server loads it within seconds). A probe that gets through
    // changes a label on node_a, each try another value, so that it is refused once in force.
    let tries = std::sync::atomic::AtomicU32::new(0);
    wait::eventually(
        "the policy to refuse the coordinator a label",
        Duration::from_secs(30),
        || async {
            let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let said = refusal(
                update_node(&coordinator, &node_a, |node| {
                    node.metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert("probe.e2e.kubernetes.io/n".into(), n.to_string());
                })
                .await,
            );
            Ok(said.starts_with("403").then_some(()))
        },
    )
    .await?;
    // node_b as a maintenance left it, beside an admin's dedicated taint.
    env.merge_node(
        &node_b,
        json!({
            "metadata": {"annotations": {CORDONED_BY_ANNOTATION: "maintenance/lost"}},
            "spec": {"unschedulable": true, "taints": [
                {"key": "nodeward.io/maintenance", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "db", "effect": "NoSchedule"},
            ]},
        }),
    )
    .await?;
    for (attack, which, change, expected) in attacks_on_nodes() {
        let node = if which == "a" { &node_a } else { &node_b };
        let said = refusal(update_node(&coordinator, node, change).await);
        assert!(
            said.starts_with("403") && said.contains(expected),
            "{attack}: {said}"
        );
    }
    // What it is there for: the maintenance's taint and its recorded cordon go.
    let restored = update_node(&coordinator, &node_b, |n| {
        nodeward_api::node::revert(
            n,
            "nodeward.io/maintenance",
            &nodeward_api::node::left_by(n, "maintenance/lost", true),
        );
    })
    .await?;
    let spec = restored.spec.unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true));
    // (node.kubernetes.io/unschedulable is the node controller's, following the cordon.)
    let keys: Vec<String> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .filter(|k| !k.starts_with("node.kubernetes.io/"))
        .collect();
    assert_eq!(keys, ["dedicated"], "the admin's taint stays");
    out_of_service_only_with_its_record(&env, &coordinator, &node_a).await?;
    super::marks::only_with_its_record(&env, &coordinator, &node_a).await?;
    // An admin's cordon (no record) is not the coordinator's to lift.
    env.merge_node(&node_a, json!({"spec": {"unschedulable": true}}))
        .await?;
    let said = refusal(
        update_node(&coordinator, &node_a, |n| {
            n.spec.get_or_insert_with(Default::default).unschedulable = Some(false);
        })
        .await,
    );
    assert!(said.contains("may uncordon it only where"), "{said}");
    remove_chart(env, &documents).await
}

/// Attacks by one node's agent identity (a token read from the agent's pod on that node) on its
/// own Node, and the writes the agent itself makes, through the chart's admission policy.
#[tokio::test]
async fn an_agent_changes_only_nodewards_part_of_its_own_node() -> anyhow::Result<()> {
    let (env, documents, node, agent) = chart_and_agent("ownnode").await?;
    let as_agent: Api<Node> = Api::all(agent.clone());
    let as_admin: Api<Node> = Api::all(env.client.clone());
    let merge = |patch: Value| Patch::Merge(patch);
    let params = PatchParams::default();

    // The policy in force (the API server loads it within seconds): another node is refused.
    let other = env.node_name(1);
    wait::eventually(
        "the policy to refuse another node",
        Duration::from_secs(30),
        || async {
            let said = refusal(
                as_agent
                    .patch(
                        &other,
                        &params,
                        &merge(json!({"metadata": {"labels": {AGENT_LABEL: "true"}}})),
                    )
                    .await,
            );
            Ok(said.contains("may change only its own Node").then_some(()))
        },
    )
    .await?;

    // Escalations: a control-plane or node-restriction label (workloads pinned there would come
    // to this node), dropping a label an admin set, another annotation, a cordon or its record
    // alone.
    let said = refusal(
        as_agent
            .patch(
                &node,
                &params,
                &merge(
                    json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
                ),
            )
            .await,
    );
    assert!(
        said.starts_with("403")
            && said.contains(&format!(
                "nodeward-agent on node {node} may change only the nodeward.io/agent label of its Node"
            )),
        "{said}"
    );
    for (attack, patch, expected) in [
        (
            "a node-restriction label",
            json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": "gpu"}}}),
            "only the nodeward.io/agent label",
        ),
        (
            "an admin's label removed",
            json!({"metadata": {"labels": {TEST_LABEL: null}}}),
            "only the nodeward.io/agent label",
        ),
        (
            "another annotation",
            json!({"metadata": {"annotations": {"example.com/owner": "me"}}}),
            "only the nodeward.io/cordoned-by annotation",
        ),
        (
            "a cordon without its record",
            json!({"spec": {"unschedulable": true}}),
            "may cordon its Node only recording it",
        ),
        (
            "a record without the cordon",
            json!({"metadata": {"annotations": {CORDONED_BY_ANNOTATION: "maintenance/x"}}}),
            "may cordon its Node only recording it",
        ),
    ] {
        let said = refusal(as_agent.patch(&node, &params, &merge(patch)).await);
        assert!(
            said.starts_with("403") && said.contains(expected),
            "{attack}: {said}"
        );
    }

    cordons_and_undoes_its_own(&as_agent, &node).await?;

    // An admin's cordon and dedicated taint are not the agent's to lift, in one step or two.
    as_admin
        .patch(
            &node,
            &params,
            &merge(json!({"spec": {"unschedulable": true,
                "taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}})),
        )
        .await?;
    for (attack, patch, expected) in [
        (
            "lifting the admin's cordon",
            json!({"spec": {"unschedulable": null}}),
            "uncordon it only where that record says it cordoned it",
        ),
        (
            "claiming the admin's cordon",
            json!({"metadata": {"annotations": {CORDONED_BY_ANNOTATION: "maintenance/x"}}}),
            "may cordon its Node only recording it",
        ),
        (
            "dropping the dedicated taint",
            json!({"spec": {"taints": [{"key": "nodeward.io/shutdown", "effect": "NoSchedule"}]}}),
            "may change only nodeward.io/ taints",
        ),
    ] {
        let said = refusal(as_agent.patch(&node, &params, &merge(patch)).await);
        assert!(
            said.starts_with("403") && said.contains(expected),
            "{attack}: {said}"
        );
    }
    let kept = as_admin.get(&node).await?;
    let spec = kept.spec.unwrap_or_default();
    assert_eq!(spec.unschedulable, Some(true), "the admin's cordon stays");
    assert!(
        spec.taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "dedicated"),
        "the dedicated taint stays"
    );

    writes_only_its_own_conditions(&as_agent, &node).await?;
    as_admin
        .patch(
            &node,
            &params,
            &merge(json!({"spec": {"unschedulable": null, "taints": null}})),
        )
        .await?;
    remove_chart(env, &documents).await
}

/// What an agent may create: a plain reboot of its own node under the pinned name.
#[tokio::test]
async fn an_agent_asks_only_for_a_plain_reboot_under_its_pinned_name() -> anyhow::Result<()> {
    let (env, documents, node, agent) = chart_and_agent("asks").await?;
    let maintenances: Api<NodeMaintenance> = Api::all(agent);
    let maintenance = |name: &str, extra: Value| -> anyhow::Result<NodeMaintenance> {
        let mut spec = json!({"nodeName": node, "reason": "Reboot", "action": "Reboot",
                              "requestedBy": "nodeward-agent"});
        if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
            spec.extend(extra);
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": name, "labels": {"nodeward.io/node": node}},
            "spec": spec,
        }))?)
    };
    let said = wait::eventually(
        "the policy to refuse a free name",
        Duration::from_secs(30),
        || async {
            let said = refusal(
                maintenances
                    .create(&PostParams::default(), &maintenance("anything", json!({}))?)
                    .await,
            );
            Ok(said.contains("may create only").then_some(said))
        },
    )
    .await?;
    assert!(
        said.starts_with("403") && said.contains(&format!("may create only {node}-reboot-BOOTID")),
        "{said}"
    );
    let pinned = format!("{node}-reboot-0a1b2c3d");
    let cloud = format!("{node}-cloud-0a1b2c3d");
    for (attack, name, extra, expected) in [
        (
            "a drain plan of its own",
            pinned.as_str(),
            json!({"drainPlan": {"stages": [{"name": "all", "timeout": "1s"}]}}),
            "without a drainPlan",
        ),
        (
            "a remediation, which skips the blockers",
            pinned.as_str(),
            json!({"reason": "Remediation"}),
            "may ask only for Reboot maintenances",
        ),
        (
            "a reboot with a disruption deadline, which skips windows and budgets",
            pinned.as_str(),
            json!({"disruptionDeadline": "2026-11-29T08:22:00Z"}),
            "may ask only for Reboot maintenances",
        ),
        (
            "a drain without a cloud's notice, which would hold the node",
            cloud.as_str(),
            json!({"action": "DrainOnly", "reason": "Shutdown"}),
            "may ask only for Reboot maintenances",
        ),
        (
            "a drain ahead of the cloud under a free name",
            "anything",
            json!({"action": "DrainOnly", "reason": "Shutdown", "disruptionDeadline": "2026-11-29T08:22:00Z"}),
            "-cloud-KEY with a disruptionDeadline",
        ),
        (
            "an urgent reboot, which skips windows and blockers",
            pinned.as_str(),
            json!({"urgent": true}),
            "may not ask for an urgent maintenance",
        ),
    ] {
        let said = refusal(
            maintenances
                .create(&PostParams::default(), &maintenance(name, extra)?)
                .await,
        );
        assert!(
            said.starts_with("403") && said.contains(expected),
            "{attack}: {said}"
        );
    }
    maintenances
        .create(&PostParams::default(), &maintenance(&pinned, json!({}))?)
        .await
        .context("the pinned name")?;
    // A retry after a failed request, named as the agent names it, fits the pin too.
    let retry = nodeward_agent::maintenance::reboot_request::retry_name(&node, "0a1b2c3d", 9);
    let created = maintenances
        .create(&PostParams::default(), &maintenance(&retry, json!({}))?)
        .await;
    created.with_context(|| format!("the retry's name {retry}"))?;
    let ahead = json!({"action": "DrainOnly", "reason": "Shutdown", "disruptionDeadline": "2026-11-29T08:22:00Z"});
    let ahead = maintenance(&format!("{node}-cloud-8b749b32"), ahead)?;
    let created = maintenances.create(&PostParams::default(), &ahead).await;
    created.context("a drain ahead of a cloud's notice, as the agent asks for one")?;
    // Pending is the coordinator's to leave: not to Draining, Acting or Succeeded.
    for phase in ["Admitted", "Draining", "Acting", "Succeeded"] {
        let said = refusal(
            maintenances
                .patch_status(
                    &pinned,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": phase}})),
                )
                .await,
        );
        assert!(
            said.starts_with("403") && said.contains(&format!("from Pending to {phase}")),
            "{phase}: {said}"
        );
    }
    remove_chart(env, &documents).await
}

/// The agent's liveness: its own Lease, held by its node; not another node's, not another
/// Lease, and never handed to another holder.
async fn lease_only_its_own(
    agent: &Client,
    env: &TestEnv,
    node_a: &str,
    node_b: &str,
) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(agent.clone(), &env.namespace);
    let lease = |name: &str, holder: &str| -> anyhow::Result<Lease> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"nodeward.io/agent-lease": "true"}},
            "spec": {"holderIdentity": holder, "renewTime": "2026-11-25T00:00:00.000000Z"},
        }))?)
    };
    let own_lease = format!("nodeward-agent-{node_a}");
    leases
        .create(&PostParams::default(), &lease(&own_lease, node_a)?)
        .await?;
    for (name, holder) in [
        (format!("nodeward-agent-{node_b}"), node_b),
        (format!("nodeward-agent-{node_a}-x"), node_a),
        ("nodeward-coordinator".to_owned(), node_a),
    ] {
        let said = refusal(
            leases
                .create(&PostParams::default(), &lease(&name, holder)?)
                .await,
        );
        assert!(
            said.contains(&format!(
                "may write only the Lease nodeward-agent-{node_a}, held by its node; not {name}"
            )),
            "{name}: {said}"
        );
    }
    // Renewed as the agent renews it (server-side apply), never handed to another holder.
    let apply = PatchParams::apply("nodeward-agent").force();
    leases
        .patch(
            &own_lease,
            &apply,
            &Patch::Apply(lease(&own_lease, node_a)?),
        )
        .await
        .context("renewing its own Lease")?;
    let said = refusal(
        leases
            .patch(
                &own_lease,
                &apply,
                &Patch::Apply(lease(&own_lease, node_b)?),
            )
            .await,
    );
    assert!(said.contains("held by its node"), "{said}");
    // It reads no Lease: not its own, not the coordinator's.
    for name in [own_lease, format!("{}-nodeward-coordinator", env.id)] {
        let said = refusal(leases.get(&name).await);
        assert!(said.starts_with("403"), "reading Lease {name}: {said}");
    }
    Ok(())
}

/// What the agent reads: the peer directory and the policies the coordinator publishes, not
/// the DisruptionPolicies (their status changes with every admission) nor other ConfigMaps.
async fn reads_only_what_it_needs(agent: &Client, env: &TestEnv) -> anyhow::Result<()> {
    Api::<EndpointSlice>::namespaced(agent.clone(), &env.namespace)
        .list(&ListParams::default())
        .await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(agent.clone(), &env.namespace);
    assert!(
        refusal(configmaps.get("nodeward-agent-policies").await).starts_with("404"),
        "the published policies may be read (there are none here)"
    );
    assert!(refusal(configmaps.get("kube-root-ca.crt").await).starts_with("403"));
    assert!(
        refusal(
            Api::<DisruptionPolicy>::all(agent.clone())
                .list(&ListParams::default())
                .await
        )
        .starts_with("403")
    );

    Ok(())
}

/// Maintenances: the agent asks only for Reboot ones of its own node, moves them on along the
/// lifecycle, and writes none of what the coordinator decides.
async fn maintenances_of_its_own_node(
    agent: &Client,
    env: &TestEnv,
    node_a: &str,
    node_b: &str,
) -> anyhow::Result<()> {
    let maintenances: Api<NodeMaintenance> = Api::all(agent.clone());
    let maintenance = |name: &str, node: &str, action: &str| -> anyhow::Result<NodeMaintenance> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": name, "labels": {"nodeward.io/node": node}},
            "spec": {"nodeName": node, "reason": "Reboot", "action": action, "requestedBy": "nodeward-agent"},
        }))?)
    };
    let own = format!("{node_a}-reboot-e2e00001");
    // Its reboot request runs nothing on the host of its own choosing.
    let mut patching = maintenance(&own, node_a, "Reboot")?;
    patching.spec.update = Some(serde_json::from_value(json!({"preset": "Apt"}))?);
    let said = refusal(maintenances.create(&PostParams::default(), &patching).await);
    assert!(
        said.contains("without a drainPlan, update or hooks"),
        "{said}"
    );
    maintenances
        .create(
            &PostParams::default(),
            &maintenance(&own, node_a, "Reboot")?,
        )
        .await?;
    for (node, action) in [(node_b, "Reboot"), (node_a, "DeleteNode")] {
        let said = refusal(
            maintenances
                .create(
                    &PostParams::default(),
                    &maintenance(&format!("{node}-{}", action.to_lowercase()), node, action)?,
                )
                .await,
        );
        assert!(
            said.contains("may ask only for Reboot maintenances of its own node"),
            "{action} on {node}: {said}"
        );
    }

    // Admitted by "the coordinator" (the admin here); the agent may move it on, not rewrite
    // the admission or take it back to Admitted.
    Api::<NodeMaintenance>::all(env.client.clone())
        .patch_status(
            &own,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Admitted",
                "admission": {"policies": [format!("{}-default", env.id)], "admittedAt": "2026-11-21T10:00:00Z", "admittedBy": "coordinator-0"},
                "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted", "message": "fits", "lastTransitionTime": "2026-11-21T10:00:00Z"}],
            }})),
        )
        .await?;
    for status in [json!({"phase": "Draining"}), json!({"podsTotal": 1})] {
        maintenances
            .patch_status(
                &own,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
    }
    for (status, expected) in [
        (
            json!({"admission": {"admittedBy": "agent"}}),
            "written by the nodeward coordinator only",
        ),
        (
            json!({"conditions": []}),
            "written by the nodeward coordinator only",
        ),
        (
            json!({"admissionsWithdrawn": 7}),
            "written by the nodeward coordinator only",
        ),
        (
            json!({"deadline": {"phase": "Draining", "time": "2030-01-01T00:00:00Z", "then": "never"}}),
            "written by the nodeward coordinator only",
        ),
        // Forging the workload gate's verdict, keeping the admission as it is.
        (
            json!({"conditions": [
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "fits", "lastTransitionTime": "2026-11-21T10:00:00Z"},
                {"type": "WorkloadsAvailable", "status": "True", "reason": "Available", "message": "forged", "lastTransitionTime": "2026-11-21T10:00:00Z"},
            ]}),
            "written by the nodeward coordinator only",
        ),
        // A surge record the coordinator would "restore": another namespace's Deployment to 0.
        (
            json!({"surges": [{"namespace": "kube-system", "deployment": "coredns", "pods": [], "state": "Surging", "replicas": 0}]}),
            "written by the nodeward coordinator only",
        ),
        (
            json!({"phase": "Admitted"}),
            "from Draining to Admitted: only the coordinator admits",
        ),
        (json!({"phase": "Succeeded"}), "from Draining to Succeeded"),
    ] {
        let said = refusal(
            maintenances
                .patch_status(
                    &own,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await,
        );
        assert!(said.contains(expected), "{status}: {said}");
    }

    // Then on along the lifecycle, and no way back out of a finished phase.
    for phase in ["Acting", "Verifying", "Succeeded"] {
        maintenances
            .patch_status(
                &own,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
            .with_context(|| format!("moving {own} to {phase}"))?;
    }
    let said = refusal(
        maintenances
            .patch_status(
                &own,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Failed"}})),
            )
            .await,
    );
    assert!(said.contains("from Succeeded to Failed"), "{said}");
    Ok(())
}

/// An attack by the coordinator's identity on a Node: what, on which node (a or b), the
/// change, what the refusal says.
type Attack = (&'static str, &'static str, fn(&mut Node), &'static str);

/// Puts the taint `key`(=`value`):`effect` on `node`.
fn add_taint(node: &mut Node, key: &str, value: Option<&str>, effect: &str) {
    let taints = node
        .spec
        .get_or_insert_with(Default::default)
        .taints
        .get_or_insert_with(Vec::new);
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: key.into(),
        value: value.map(Into::into),
        effect: effect.into(),
        ..Default::default()
    });
}

/// What the coordinator may not do to a Node, whatever a maintenance left on it.
fn attacks_on_nodes() -> [Attack; 10] {
    [
        (
            "relabel",
            "b",
            |n| {
                n.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert(
                        "node-role.kubernetes.io/control-plane".into(),
                        String::new(),
                    );
            },
            "only the labels a policy nodeLabels may name",
        ),
        (
            "annotate",
            "a",
            |n| {
                n.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert("example.com/owner".into(), "nodeward".into());
            },
            "may only remove the nodeward.io/cordoned-by annotation, write its own records",
        ),
        (
            "a pending taint that evicts",
            "a",
            |n| add_taint(n, "nodeward.io/maintenance-pending", None, "NoSchedule"),
            "put on nodeward.io/maintenance-pending:PreferNoSchedule",
        ),
        (
            "drop the admin's taint",
            "b",
            |n| {
                if let Some(taints) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                    taints.retain(|t| t.key != "dedicated");
                }
            },
            "may only remove nodeward.io/ taints",
        ),
        (
            "uncordon keeping the record",
            "b",
            |n| n.spec.get_or_insert_with(Default::default).unschedulable = Some(false),
            "may uncordon it only where nodeward.io/cordoned-by says",
        ),
        (
            "cordon",
            "a",
            |n| n.spec.get_or_insert_with(Default::default).unschedulable = Some(true),
            "may not cordon",
        ),
        (
            "add a taint",
            "a",
            |n| add_taint(n, "nodeward.io/maintenance", None, "NoExecute"),
            "may only remove nodeward.io/ taints",
        ),
        (
            "taint out of service without the record",
            "a",
            |n| {
                add_taint(
                    n,
                    "node.kubernetes.io/out-of-service",
                    Some("nodeshutdown"),
                    "NoExecute",
                )
            },
            "only with its record nodeward.io/out-of-service",
        ),
        // The garbage collector deletes a Node whose owner is gone.
        (
            "an owner that does not exist",
            "b",
            |n| {
                n.metadata.owner_references = Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        name: "gone".into(),
                        uid: "6c1f4a9e-0041-4000-8000-000000000041".into(),
                        ..Default::default()
                    },
                ]);
            },
            "may not change the owner references or finalizers",
        ),
        (
            "a finalizer that keeps the Node",
            "b",
            |n| {
                n.metadata.finalizers = Some(vec!["example.com/keep".into()]);
            },
            "may not change the owner references or finalizers",
        ),
    ]
}

/// The coordinator puts the out-of-service taint on with its record and takes only that one
/// away again; an admin's stays.
async fn out_of_service_only_with_its_record(
    env: &TestEnv,
    coordinator: &Api<Node>,
    node_a: &str,
) -> anyhow::Result<()> {
    let tainted = update_node(coordinator, node_a, |n| {
        nodeward_api::node::out_of_service(n, true, "dead (e2e)");
    })
    .await?;
    assert!(wait::out_of_service_taint(Some(&tainted)).is_some());
    update_node(coordinator, node_a, |n| {
        nodeward_api::node::out_of_service(n, false, "");
    })
    .await?;
    env.merge_node(node_a, json!({"spec": {"taints": [
                {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"},
            ]}})).await?;
    let said = refusal(
        update_node(coordinator, node_a, |n| {
            if let Some(taints) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                taints.retain(|t| t.key != "node.kubernetes.io/out-of-service");
            }
        })
        .await,
    );
    assert!(
        said.contains("take away only the one it recorded"),
        "an admin's out-of-service taint stays: {said}"
    );
    env.merge_node(node_a, json!({"spec": {"taints": null}}))
        .await?;
    Ok(())
}

/// What the agent does to its own Node: cordon with its record and a nodeward taint, then
/// undo both as it does (read, change, replace at that resourceVersion): its own taint only;
/// the node controller's node.kubernetes.io/unschedulable is not the agent's.
async fn cordons_and_undoes_its_own(as_agent: &Api<Node>, node: &str) -> anyhow::Result<()> {
    let merge = |patch: Value| Patch::Merge(patch);
    let params = PatchParams::default();
    as_agent
        .patch(
            node,
            &params,
            &merge(json!({
                "metadata": {"annotations": {CORDONED_BY_ANNOTATION: "maintenance/x"}},
                "spec": {"unschedulable": true,
                         "taints": [{"key": "nodeward.io/maintenance", "effect": "NoSchedule"}]},
            })),
        )
        .await
        .context("cordoning with the record")?;
    let mut attempts = 0;
    loop {
        let mut current = as_agent.get(node).await?;
        if let Some(annotations) = current.metadata.annotations.as_mut() {
            annotations.remove(CORDONED_BY_ANNOTATION);
        }
        let spec = current.spec.get_or_insert_with(Default::default);
        spec.unschedulable = None;
        if let Some(taints) = spec.taints.as_mut() {
            taints.retain(|t| t.key != "nodeward.io/maintenance");
        }
        match as_agent
            .replace(node, &PostParams::default(), &current)
            .await
        {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 && attempts < 10 => attempts += 1,
            Err(e) => return Err(anyhow::Error::from(e).context("undoing its cordon")),
        }
    }

    Ok(())
}

/// Status: the agent writes its own condition types (the detectors' and the configured custom
/// check's), never the kubelet's Ready nor anything else there.
async fn writes_only_its_own_conditions(as_agent: &Api<Node>, node: &str) -> anyhow::Result<()> {
    let condition = |type_: &str, status: &str| {
        json!({"type": type_, "status": status, "reason": "E2E", "message": "e2e",
               "lastHeartbeatTime": "2026-11-23T10:00:00Z", "lastTransitionTime": "2026-11-23T10:00:00Z"})
    };
    let apply = PatchParams::apply("nodeward-agent").force();
    for type_ in ["KubeletProblem", "NTPProblem"] {
        as_agent
            .patch_status(
                node,
                &apply,
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                    "status": {"conditions": [condition(type_, "False")]}})),
            )
            .await
            .with_context(|| format!("writing its own condition {type_}"))?;
    }
    for (attack, status) in [
        (
            "the kubelet's Ready",
            json!({"conditions": [condition("Ready", "False")]}),
        ),
        (
            "another component's condition",
            json!({"conditions": [condition("CorruptDockerOverlay2", "True")]}),
        ),
        ("its capacity", json!({"capacity": {"pods": "1000"}})),
    ] {
        let said = refusal(
            as_agent
                .patch_status(
                    node,
                    &apply,
                    &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "status": status})),
                )
                .await,
        );
        assert!(
            said.starts_with("403")
                && said.contains("may change only the conditions it writes (NetworkProblem,")
                && said.contains("NTPProblem)"),
            "{attack}: {said}"
        );
    }
    Ok(())
}
