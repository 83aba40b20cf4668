//! Gates on cluster state through the real API server, the coordinator under the chart's
//! identity: a gate on a Deployment holds the rollout (`GateClosed`, naming the gate) until
//! the Deployment is fully available; a gate on a kind the coordinator may not read, on a kind
//! nobody serves, or with an expression that does not compile makes its policy invalid, with
//! the field named in its status.

use k8s_openapi::api::apps::v1::Deployment;

use super::*;

/// True when every replica `web` asks for is available.
const AVAILABLE: &str = "object.spec.replicas == (has(object.status.availableReplicas) ? object.status.availableReplicas : 0)";

/// A gate named `name` on `object` with `expression`.
fn gate(name: &str, object: Value, expression: &str) -> Value {
    json!({"name": name, "object": object, "expression": expression})
}

#[tokio::test]
async fn a_gate_holds_the_rollout_until_its_deployment_is_fully_available() -> anyhow::Result<()> {
    let env = scenario("gates", &[NodeSpec::worker("a")]).await?;
    // A Deployment whose pod has nowhere to run: 0 of 1 available.
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    let web = serde_json::from_value(web_with_nowhere_to_run())?;
    deployments.create(&PostParams::default(), &web).await?;
    let object = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "namespace": env.namespace, "name": "web"});
    let policy = env
        .create_policy(
            "gated",
            json!({"maxConcurrent": 1, "gates": [gate("web-available", object, AVAILABLE)]}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = create_maintenance(&env, &env.node_name(0)).await?;
    let message = wait_denied(&env, &name, "GateClosed")
        .await
        .with_context(|| coordinator.output())?;
    assert_eq!(
        message,
        format!(
            "policy {policy}: gate web-available (gates[0]): {AVAILABLE} is false of Deployment {}/web",
            env.namespace
        )
    );

    // Its owner scales it to what can run: every replica asked for is available, the gate
    // opens and the maintenance is admitted.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await?;
    admitted_then_clean_up(env, &name, coordinator).await
}

#[tokio::test]
async fn a_gate_the_coordinator_cannot_read_or_compile_makes_its_policy_invalid()
-> anyhow::Result<()> {
    let env = scenario("gates-invalid", &[NodeSpec::worker("a")]).await?;
    // The chart's coordinator may not read ConfigMaps (nothing in coordinator.gateReads).
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "namespace": env.namespace, "name": "settings"});
    let policy = env
        .create_policy(
            "gated",
            json!({"maxConcurrent": 1, "gates": [gate("settings", config_map, "true")]}),
        )
        .await?;
    let coordinator = start(&env, "c1", &[]).await?;
    coordinator.wait_ready(TIMEOUT).await?;
    let name = create_maintenance(&env, &env.node_name(0)).await?;
    let message = wait_denied(&env, &name, "Blocked")
        .await
        .with_context(|| coordinator.output())?;
    assert!(
        message.contains(&format!("policy {policy} is invalid: gates[0].object: the coordinator may not get configmaps (grant it in the chart's coordinator.gateReads)")),
        "{message}"
    );

    // A kind nobody serves, then an expression that does not compile: each named in the
    // policy's Valid condition.
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let widget = json!({"apiVersion": "example.com/v1", "kind": "Widget", "name": "w"});
    for (spec, said) in [
        (
            json!([gate("widget", widget, "true")]),
            "gates[0].object: the API server serves no kind Widget in example.com/v1",
        ),
        (
            json!([gate(
                "broken",
                json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "namespace": env.namespace, "name": "web"}),
                "object.status.(("
            )]),
            "gates[0].expression: not a CEL expression",
        ),
    ] {
        env.merge_policy_spec(&policy, json!({"gates": spec}))
            .await?;
        wait::until(&policies, &policy, said, TIMEOUT, |p| {
            p.and_then(|p| policy_condition(p, "Valid"))
                .is_some_and(|(status, _, message)| status == "False" && message.contains(said))
        })
        .await
        .with_context(|| coordinator.output())?;
    }
    env.cleanup_after(coordinator).await
}
