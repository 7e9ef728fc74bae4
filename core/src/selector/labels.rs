//! LabelSelector semantics (matchLabels and matchExpressions, ANDed), as the API server has them.
//! Selectors written as text (`kubectl -l`) are [`crate::selector_text`]'s.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Why a LabelSelector cannot be used.
pub fn validate(selector: &LabelSelector) -> Result<(), String> {
    for expression in selector.match_expressions.iter().flatten() {
        let values = expression.values.as_deref().unwrap_or_default();
        match expression.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "matchExpressions: operator {} on key {:?} needs at least one value",
                    expression.operator, expression.key
                ));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(format!(
                    "matchExpressions: operator {} on key {:?} takes no values",
                    expression.operator, expression.key
                ));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(format!(
                    "matchExpressions: unknown operator {other:?} on key {:?} (use In, NotIn, Exists or DoesNotExist)",
                    expression.key
                ));
            }
        }
        if expression.key.is_empty() {
            return Err("matchExpressions: a key is empty".into());
        }
    }
    Ok(())
}

/// Whether `labels` satisfy `selector` (an empty selector matches everything). Call
/// [`validate`] first: an unknown operator matches nothing.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    by_label
        && selector.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let actual = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => actual.is_some_and(|v| values.contains(v)),
                "NotIn" => actual.is_none_or(|v| !values.contains(v)),
                "Exists" => actual.is_some(),
                "DoesNotExist" => actual.is_none(),
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn selector(value: serde_json::Value) -> LabelSelector {
        serde_json::from_value(value).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_operator() {
        let pod = labels(&[("app", "web"), ("tier", "front")]);
        let cases = [
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "missing", "operator": "In", "values": ["x"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "missing", "operator": "NotIn", "values": ["x"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "missing", "operator": "Exists"}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "missing", "operator": "DoesNotExist"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
                false,
            ),
            (
                json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}),
                false,
            ),
        ];
        for (raw, expected) in cases {
            let s = selector(raw.clone());
            assert!(validate(&s).is_ok(), "{raw}");
            assert_eq!(matches(&s, &pod), expected, "{raw}");
        }
    }

    #[test]
    fn malformed_expressions_are_explained() {
        for (raw, needle) in [
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "needs at least one value",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "takes no values",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
                "unknown operator",
            ),
            (
                json!({"matchExpressions": [{"key": "", "operator": "Exists"}]}),
                "empty",
            ),
        ] {
            let error = validate(&selector(raw)).unwrap_err();
            assert!(error.contains(needle), "{error}");
        }
    }
}
