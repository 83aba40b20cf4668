//! With `agent.podReads: authorizationWebhook`, an agent reads the pods of its own node and no
//! others: the chart's ClusterRole grants it no pod read, and the coordinator's authorization
//! webhook, which the test control plane's API server calls after RBAC
//! (tests/controlplane/start.sh, as docs/security.md tells an operator to configure it), grants
//! each agent the list and watch of its node's pods by field selector.

use kube::api::WatchParams;
use nodeward_e2e::controlplane::env_value;

use super::metadata::identities_of;
use super::*;

/// The `--agent-*` arguments the chart gives its coordinator.
fn agent_args(documents: &[Value]) -> anyhow::Result<Vec<String>> {
    let deployment = documents
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .context("the coordinator's Deployment")?;
    Ok(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .context("the coordinator's args")?
            .iter()
            .filter_map(Value::as_str)
            .filter(|a| a.starts_with("--agent-user=") || a.starts_with("--agent-group="))
            .map(String::from)
            .collect(),
    )
}

/// The pods `pods` lists with the field selector `fields` (None: none), or the refusal.
async fn listed(pods: &Api<Pod>, fields: Option<&str>) -> Result<Vec<String>, String> {
    let params = fields.map_or_else(ListParams::default, |f| ListParams::default().fields(f));
    match pods.list(&params).await {
        Ok(list) => Ok(list.items.iter().map(ResourceExt::name_any).collect()),
        Err(e) => Err(refusal::<()>(Err(e))),
    }
}

#[tokio::test]
async fn with_the_authorization_webhook_an_agent_reads_only_its_own_nodes_pods()
-> anyhow::Result<()> {
    let (env, dir, documents) = own_chart_with(
        "pod-reads",
        &json!({"agent": {"podReads": "authorizationWebhook"}}),
    )
    .await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));
    let (on_a, on_b) = a_pod_on_each(&env, &node_a, &node_b).await?;
    let agent_args = agent_args(&documents)?;
    assert_eq!(agent_args.len(), 2, "{agent_args:?}");

    // The coordinator, as the chart's, on the address the API server calls.
    let address = env_value("NODEWARD_POD_READS_WEBHOOK_LISTEN")?;
    let cert_dir = format!(
        "--webhook-cert-dir={}",
        env_value("NODEWARD_POD_READS_WEBHOOK_CERT_DIR")?
    );
    let mut args = vec![cert_dir.as_str()];
    args.extend(agent_args.iter().map(String::as_str));
    let webhook = EvictionWebhook::listening(&env, &env.id, &dir, &address, &args).await?;

    let own = format!("spec.nodeName={node_a}");
    let others = format!("spec.nodeName={node_b}");
    for (how, agent) in identities_of(&env, &node_a).await? {
        let pods: Api<Pod> = Api::all(agent.clone());
        // Its own node's pods: listed (once the webhook answers) and watched.
        let mine = wait::eventually(
            "the webhook to grant the agent its node's pods",
            Duration::from_secs(30),
            || async { Ok(listed(&pods, Some(&own)).await.ok()) },
        )
        .await
        .with_context(|| format!("{how}: {}", webhook.coordinator.output()))?;
        assert!(mine.contains(&on_a.name_any()), "{how}: {mine:?}");
        assert!(!mine.contains(&on_b.name_any()), "{how}: {mine:?}");
        let watched: Vec<String> = pods
            .watch(&WatchParams::default().fields(&own).timeout(1), "0")
            .await
            .with_context(|| format!("{how}: watching its node's pods"))?
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .filter_map(|event| match event {
                kube::api::WatchEvent::Added(pod) => Some(pod.name_any()),
                _ => None,
            })
            .collect();
        assert!(watched.contains(&on_a.name_any()), "{how}: {watched:?}");
        assert!(!watched.contains(&on_b.name_any()), "{how}: {watched:?}");
        // Every other read of pods is refused, with what it may do instead.
        let granted = format!(
            "may list and watch only the pods of its own node, with the field selector {own}"
        );
        for (read, said) in [
            ("every pod", listed(&pods, None).await),
            ("node B's pods", listed(&pods, Some(&others)).await),
            (
                "pods not on node B",
                listed(&pods, Some(&format!("spec.nodeName!={node_b}"))).await,
            ),
        ] {
            let said = said.err().unwrap_or_else(|| format!("{read}: not refused"));
            assert!(said.starts_with("403"), "{how}, {read}: {said}");
            assert!(said.contains(&granted), "{how}, {read}: {said}");
        }
        let watched = pods
            .watch(&WatchParams::default().fields(&others).timeout(1), "0")
            .await
            .map(|_| ());
        assert!(
            refusal(watched).starts_with("403"),
            "{how}: watching node B's pods"
        );
        let named = Api::<Pod>::namespaced(agent.clone(), &env.namespace);
        assert!(
            refusal(named.get(&on_a.name_any()).await).starts_with("403"),
            "{how}: reading one of its node's pods by name is no list"
        );
    }

    // Any pod's token names its node: the webhook grants only the agents (the API server does
    // not even ask it about a tenant's reads).
    let tenant = client_as(Identity::Token(token(&env, "default", Some(&on_a)).await?)).await?;
    let said = listed(&Api::all(tenant), Some(&own)).await;
    let said = said.err().unwrap_or_else(|| "not refused".to_owned());
    assert!(
        said.starts_with("403"),
        "a tenant's pod-bound token: {said}"
    );
    env.cleanup().await
}
