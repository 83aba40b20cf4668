//! Label selector matching, as the API server defines it: `matchLabels` and every
//! `matchExpressions` requirement must hold; an empty selector matches everything, an absent
//! one (`None`, where a field is optional) is the caller's to interpret.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// Why a selector cannot be evaluated (the API server refuses such selectors on its own
/// types, but a CRD field may carry one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("matchExpressions[{index}]: {message}")]
pub struct InvalidSelector {
    pub index: usize,
    pub message: String,
}

/// Whether `labels` satisfy `selector`.
pub fn matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, InvalidSelector> {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    if !labels_match {
        return Ok(false);
    }
    for (index, requirement) in selector.match_expressions.iter().flatten().enumerate() {
        if !requirement_holds(index, requirement, labels)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn requirement_holds(
    index: usize,
    r: &LabelSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Result<bool, InvalidSelector> {
    let values = r.values.as_deref().unwrap_or_default();
    let invalid = |message: String| InvalidSelector { index, message };
    let value = labels.get(&r.key);
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => {
            Err(invalid(format!("operator {} needs values", r.operator)))
        }
        "In" => Ok(value.is_some_and(|v| values.contains(v))),
        "NotIn" => Ok(value.is_none_or(|v| !values.contains(v))),
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            Err(invalid(format!("operator {} takes no values", r.operator)))
        }
        "Exists" => Ok(value.is_some()),
        "DoesNotExist" => Ok(value.is_none()),
        other => Err(invalid(format!(
            "unknown operator {other:?}; use In, NotIn, Exists or DoesNotExist"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selector(json: serde_json::Value) -> LabelSelector {
        serde_json::from_value(json).expect("selector")
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert_eq!(matches(&LabelSelector::default(), &labels(&[])), Ok(true));
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold() {
        let s = selector(serde_json::json!({
            "matchLabels": {"pool": "blue"},
            "matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]},
                {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"},
            ],
        }));
        assert_eq!(
            matches(
                &s,
                &labels(&[("pool", "blue"), ("topology.kubernetes.io/zone", "a")])
            ),
            Ok(true)
        );
        assert_eq!(
            matches(
                &s,
                &labels(&[("pool", "green"), ("topology.kubernetes.io/zone", "a")])
            ),
            Ok(false)
        );
        assert_eq!(
            matches(
                &s,
                &labels(&[("pool", "blue"), ("topology.kubernetes.io/zone", "c")])
            ),
            Ok(false)
        );
        assert_eq!(
            matches(
                &s,
                &labels(&[
                    ("pool", "blue"),
                    ("topology.kubernetes.io/zone", "a"),
                    ("node-role.kubernetes.io/control-plane", "")
                ])
            ),
            Ok(false)
        );
    }

    #[test]
    fn not_in_matches_a_missing_label() {
        let s = selector(
            serde_json::json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}),
        );
        assert_eq!(matches(&s, &labels(&[])), Ok(true));
        assert_eq!(matches(&s, &labels(&[("tier", "db")])), Ok(false));
    }

    #[test]
    fn malformed_requirements_are_errors_naming_them() {
        let s = selector(serde_json::json!({"matchExpressions": [
            {"key": "a", "operator": "Exists"},
            {"key": "b", "operator": "Equals", "values": ["x"]},
        ]}));
        let err = matches(&s, &labels(&[("a", "1")])).expect_err("bad operator");
        assert_eq!(err.index, 1);
        assert!(
            err.to_string().contains("unknown operator \"Equals\""),
            "{err}"
        );
        let s = selector(serde_json::json!({"matchExpressions": [{"key": "a", "operator": "In"}]}));
        assert!(matches(&s, &labels(&[])).is_err());
    }
}
