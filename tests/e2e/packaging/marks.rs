//! The marks other actors honour (cluster-autoscaler's scale-down-disabled, Karpenter's
//! do-not-disrupt annotations; medik8s' exclusion label is one nodeLabels may set anyway): the
//! chart's admission policy lets the coordinator put them on and take them off only with its
//! record of them, and never take an admin's.

use nodeward_api::labels::{
    DO_NOT_DISRUPT_ANNOTATION as KARPENTER, EXCLUDE_FROM_REMEDIATION_LABEL as MEDIK8S,
    MARKS_ANNOTATION as RECORD, SCALE_DOWN_DISABLED_ANNOTATION as AUTOSCALER,
};

use super::*;

fn annotate(node: &mut Node, key: &str, value: Option<&str>) {
    let annotations = node
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    match value {
        Some(v) => annotations.insert(key.to_owned(), v.to_owned()),
        None => annotations.remove(key),
    };
}

/// As the chart's coordinator (`coordinator`), on `node`: what it does with the marks passes,
/// each way around its record is refused.
pub(super) async fn only_with_its_record(
    env: &TestEnv,
    coordinator: &Api<Node>,
    node: &str,
) -> anyhow::Result<()> {
    let refused = |said: String, why: &str| {
        assert!(
            said.starts_with("403") && said.contains(why),
            "{why}: {said}"
        );
    };
    // A mark without its record, and a record of a mark put on in no write of its own.
    let said =
        refusal(update_node(coordinator, node, |n| annotate(n, KARPENTER, Some("true"))).await);
    refused(said, "only together with its record of them");
    env.merge_node(
        node,
        json!({"metadata": {"annotations": {KARPENTER: "true"}}}),
    )
    .await?;
    let said =
        refusal(update_node(coordinator, node, |n| annotate(n, RECORD, Some(KARPENTER))).await);
    refused(said, "only the marks it puts on in the same write");

    // What it does: both marks and the record at once (the admin's Karpenter mark is not its
    // own, so not recorded) ...
    let record = format!("{MEDIK8S},{AUTOSCALER}");
    let marked = update_node(coordinator, node, |n| {
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(MEDIK8S.to_owned(), "true".to_owned());
        annotate(n, AUTOSCALER, Some("true"));
        annotate(n, RECORD, Some(&record));
    })
    .await?;
    assert_eq!(
        marked.annotations().get(AUTOSCALER).map(String::as_str),
        Some("true")
    );
    // ... the admin's mark is not its to take with them ...
    let said = refusal(
        update_node(coordinator, node, |n| {
            annotate(n, AUTOSCALER, None);
            annotate(n, KARPENTER, None);
            annotate(n, RECORD, None);
        })
        .await,
    );
    refused(said, "only together with its record of them");
    // ... its own are.
    let unmarked = update_node(coordinator, node, |n| {
        if let Some(labels) = n.metadata.labels.as_mut() {
            labels.remove(MEDIK8S);
        }
        annotate(n, AUTOSCALER, None);
        annotate(n, RECORD, None);
    })
    .await?;
    assert_eq!(
        unmarked.annotations().get(KARPENTER).map(String::as_str),
        Some("true"),
        "the admin's mark stays"
    );
    env.merge_node(
        node,
        json!({"metadata": {"annotations": {KARPENTER: null}}}),
    )
    .await?;
    Ok(())
}
