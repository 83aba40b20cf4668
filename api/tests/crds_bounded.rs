//! Every string, list and map in every CRD has a bound the API server enforces, so that no
//! object (one node's agent identity, a tenant, a mistaken script) can be made large enough to
//! cost the coordinator or etcd what a thousand normal ones cost.

use serde_json::Value;

/// The paths of the fields without a bound, under `path`.
fn unbounded(schema: &Value, path: &str, found: &mut Vec<String>) {
    let Some(object) = schema.as_object() else {
        return;
    };
    if object.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        // An int or a string like "10%": its pattern (or an anchored rule) bounds it.
        if !object.contains_key("pattern") && !has_length_rule(object) && !anchored(object) {
            found.push(format!("{path} (int-or-string without a pattern)"));
        }
        return;
    }
    match object.get("type").and_then(Value::as_str) {
        Some("string") => {
            let bounded = object.contains_key("maxLength")
                || object.contains_key("enum")
                || object.get("format").and_then(Value::as_str) == Some("date-time")
                || has_length_rule(object);
            if !bounded {
                found.push(path.to_owned());
            }
        }
        Some("array") => {
            if !object.contains_key("maxItems") {
                found.push(format!("{path}[]"));
            }
            if let Some(items) = object.get("items") {
                unbounded(items, &format!("{path}[]"), found);
            }
        }
        Some("object") => {
            if let Some(properties) = object.get("properties").and_then(Value::as_object) {
                for (name, property) in properties {
                    unbounded(property, &format!("{path}.{name}"), found);
                }
            }
            if let Some(values) = object.get("additionalProperties") {
                if !object.contains_key("maxProperties") {
                    found.push(format!("{path}{{}}"));
                }
                unbounded(values, &format!("{path}{{}}"), found);
            }
        }
        _ => {}
    }
}

/// The CEL rules of the schema `object`.
fn cel_rules(object: &serde_json::Map<String, Value>) -> impl Iterator<Item = &str> {
    object
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("rule").and_then(Value::as_str))
}

/// A CEL rule matching the whole string against a bounded pattern.
fn anchored(object: &serde_json::Map<String, Value>) -> bool {
    cel_rules(object).any(|rule| {
        rule.contains("matches('^")
            && rule.contains("$')")
            && !rule.contains('*')
            && !rule.contains('+')
    })
}

/// A CEL rule on the size of the value bounds it as well as maxLength does.
fn has_length_rule(object: &serde_json::Map<String, Value>) -> bool {
    cel_rules(object).any(|rule| rule.contains("size(self) <="))
}

#[test]
fn every_string_list_and_map_of_every_crd_is_bounded() {
    let mut found = Vec::new();
    for crd in nodeward_api::crds::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let schema = serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("a schema"),
        )
        .expect("json");
        for part in ["spec", "status"] {
            if let Some(s) = schema.pointer(&format!("/properties/{part}")) {
                unbounded(s, &format!("{name} {part}"), &mut found);
            }
        }
    }
    assert!(
        found.is_empty(),
        "{} unbounded fields:\n{}",
        found.len(),
        found.join("\n")
    );
}
