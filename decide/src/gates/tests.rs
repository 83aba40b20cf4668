use std::sync::Arc;

use serde_json::json;

use super::*;

fn deployment(available: i64) -> serde_json::Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"replicas": 3},
        "status": {"availableReplicas": available, "conditions": [
            {"type": "Available", "status": if available == 3 { "True" } else { "False" }}]}})
}

fn object() -> GateObject {
    GateObject {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        namespace: Some("shop".into()),
        name: "web".into(),
    }
}

fn gate(name: &str, expression: &str) -> Gate {
    Gate {
        name: name.into(),
        object: object(),
        expression: expression.into(),
    }
}

const AVAILABLE: &str = "object.status.availableReplicas == object.spec.replicas";

fn looked(l: Looked) -> BTreeMap<GateObject, Looked> {
    BTreeMap::from([(object(), l)])
}

#[test]
fn a_gate_is_open_only_while_its_expression_is_true_of_its_object() {
    let gates = [gate("web-available", AVAILABLE)];
    assert_eq!(
        judge(&gates, &looked(Looked::Found(deployment(3)))),
        Judged::default()
    );
    let judged = judge(&gates, &looked(Looked::Found(deployment(2))));
    assert!(judged.problems.is_empty());
    assert_eq!(
        judged.closed.as_deref(),
        Some(
            "gate web-available (gates[0]): object.status.availableReplicas == object.spec.replicas is false of Deployment shop/web"
        )
    );
}

#[test]
fn whole_numbers_are_ints_and_macros_and_matches_work() {
    let object = deployment(3);
    for expression in [
        "object.spec.replicas == 3",
        "object.spec.replicas - 1 == 2",
        "object.status.conditions.exists(c, c.type == 'Available' && c.status == 'True')",
        "object.metadata.name.matches('^w')",
        "has(object.status.availableReplicas) && !has(object.status.readyReplicas)",
    ] {
        let program = compile(expression).expect(expression);
        assert_eq!(holds(&program, &object), Ok(true), "{expression}");
    }
}

#[test]
fn a_missing_field_a_non_boolean_or_an_unread_object_holds_the_rollout() {
    let found = looked(Looked::Found(deployment(3)));
    for (expression, why) in [
        (
            "object.status.phase == 'Ready'",
            "failed on Deployment shop/web",
        ),
        (
            "object.spec.replicas",
            "the result is of type int, not bool",
        ),
    ] {
        let judged = judge(&[gate("g", expression)], &found);
        let closed = judged.closed.unwrap_or_default();
        assert!(closed.contains(why), "{expression}: {closed}");
        assert!(judged.problems.is_empty());
    }
    let gates = [gate("g", AVAILABLE)];
    for (l, why) in [
        (None, "Deployment shop/web not read yet"),
        (Some(Looked::Missing), "Deployment shop/web does not exist"),
        (
            Some(Looked::Failed("timed out".into())),
            "reading Deployment shop/web failed: timed out",
        ),
    ] {
        let reads = l.map(looked).unwrap_or_default();
        let judged = judge(&gates, &reads);
        assert_eq!(judged.closed, Some(format!("gate g (gates[0]): {why}")));
    }
}

#[test]
fn a_failure_names_no_value_of_the_object() {
    let secret = json!({"data": {"password": "hunter2"}, "list": ["hunter2"]});
    for expression in [
        "object.data",
        "object.data.password + 1 == 2",
        "object.data.password > 1",
        "object.list[3] == 'x'",
        "object.data.password.size() / 0 == 1",
        "object.list == object.data.password",
    ] {
        let program = compile(expression).expect(expression);
        let shown = format!("{:?}", holds(&program, &secret));
        assert!(!shown.contains("hunter2"), "{expression}: {shown}");
    }
}

#[test]
fn an_expression_that_does_not_compile_or_an_unreadable_kind_makes_the_policy_invalid() {
    let gates = [gate("fine", AVAILABLE), gate("broken", "object.status.((")];
    let judged = judge(&gates, &looked(Looked::Found(deployment(3))));
    assert_eq!(judged.problems.len(), 1, "{judged:?}");
    assert!(
        judged.problems[0].starts_with("gates[1].expression: not a CEL expression"),
        "{judged:?}"
    );
    let judged = judge(
        &[gate("g", AVAILABLE)],
        &looked(Looked::Unreadable("forbidden".into())),
    );
    assert_eq!(judged.problems, ["gates[0].object: forbidden"]);
}

#[test]
fn an_expression_nested_past_the_limit_is_refused_before_the_parser_overflows_its_stack() {
    for (open, close) in [("(", ")"), ("[", "]"), ("{1: ", "}")] {
        let deep = |n: usize| format!("{}true{} == true", open.repeat(n), close.repeat(n));
        let refused = compile(&deep(NESTING_LIMIT + 1)).err().unwrap_or_default();
        assert!(refused.starts_with("nested 9 brackets deep"), "{refused}");
        // 500 deep overflowed the test thread's stack in the parser.
        assert!(compile(&deep(500)).is_err());
    }
    // Brackets in a string literal do not count; the limit itself compiles.
    assert!(compile("object.metadata.name == '(((((((((((((((([[[[[['").is_ok());
    let eight = format!(
        "{}true{}",
        "(".repeat(NESTING_LIMIT),
        ")".repeat(NESTING_LIMIT)
    );
    assert!(compile(&eight).is_ok());
}

#[test]
fn only_the_gated_policies_of_pending_nodes_are_read() {
    let policy = |name: &str, gates: serde_json::Value| -> Arc<DisruptionPolicy> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                "metadata": {"name": name}, "spec": {"gates": gates}}))
            .expect("a policy"),
        )
    };
    let maintenance = |node: &str, reason: &str| -> Arc<NodeMaintenance> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
                "metadata": {"name": "m"},
                "spec": {"nodeName": node, "reason": reason, "action": "Reboot"}}))
            .expect("a maintenance"),
        )
    };
    let policies = [
        policy("gated", json!([gate("g", AVAILABLE)])),
        policy("plain", json!([])),
    ];
    let selects = |_: &DisruptionPolicy, node: &str| Some(node == "a");
    let reboot = [maintenance("a", "Reboot")];
    assert_eq!(
        wanted(&reboot, &policies, selects),
        BTreeSet::from([object()])
    );
    let elsewhere = [maintenance("b", "Reboot")];
    assert!(wanted(&elsewhere, &policies, selects).is_empty());
    let repair = [maintenance("a", "Remediation")];
    assert!(wanted(&repair, &policies, selects).is_empty());
}
