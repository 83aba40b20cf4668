//! What ends an agent's credentials. A token bound to the agent's pod is answered 401 once
//! that pod is gone, for every request after, which is what a run that floods from one node
//! and then sees 401 to the end has met: its pod was replaced (or its token, issued for 600 s,
//! expired). A healthy agent is not locked out by it: its pod stays, the kubelet renews the
//! projected token before it expires, and the client reads the file again.

use super::*;

#[tokio::test]
async fn a_pod_bound_token_is_refused_once_its_pod_is_gone_and_the_new_pods_token_works()
-> anyhow::Result<()> {
    let (env, documents, node, agent) = chart_and_agent("tokens").await?;
    let reports: Api<NodeReport> = Api::all(agent);
    reports
        .get_opt(&node)
        .await
        .context("a read with the token of the agent's pod")?;

    // The DaemonSet's pod on the node goes; the DaemonSet makes another.
    let label = "app.kubernetes.io/component=agent";
    let on_node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node);
    let pods = env
        .pods()
        .list(&ListParams::default().labels(label))
        .await?;
    let old = pods
        .items
        .into_iter()
        .find(on_node)
        .context("the agent's pod on the node")?;
    wait::deleted(&env.pods(), &old.name_any(), Duration::from_secs(60)).await?;
    let said = wait::eventually(
        "the old pod's token refused",
        Duration::from_secs(30),
        || async {
            let said = refusal(reports.get_opt(&node).await);
            Ok(said.starts_with("401").then_some(said))
        },
    )
    .await?;
    assert!(said.contains("Unauthorized"), "{said}");
    // Refused for good: not a moment's limit.
    for _ in 0..5 {
        let again = refusal(reports.get_opt(&node).await);
        assert!(again.starts_with("401"), "{again}");
    }

    let renewed: Api<NodeReport> = Api::all(agent_on(&env, &node).await?);
    renewed
        .get_opt(&node)
        .await
        .context("a read with the token of the new pod")?;
    remove_chart(env, &documents).await
}
