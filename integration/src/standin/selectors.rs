//! Label and field selectors, in the full syntax of the Kubernetes API.

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value`, `key==value`.
    Equals(String, String),
    /// `key!=value` (also true when the label is absent).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the label is absent).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

/// A selector that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub struct SelectorError(pub String);

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),!h`.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(Self(requirements))
    }

    /// Whether `labels` (a JSON object or null) satisfy the selector.
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let get = |key: &str| {
            labels
                .and_then(|labels| labels.get(key))
                .and_then(Value::as_str)
        };
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(key, value) => get(key) == Some(value.as_str()),
            Requirement::NotEquals(key, value) => get(key) != Some(value.as_str()),
            Requirement::In(key, values) => get(key).is_some_and(|v| values.iter().any(|x| x == v)),
            Requirement::NotIn(key, values) => {
                get(key).is_none_or(|v| values.iter().all(|x| x != v))
            }
            Requirement::Exists(key) => get(key).is_some(),
            Requirement::DoesNotExist(key) => get(key).is_none(),
        })
    }

    /// A selector from a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
    pub fn from_object(selector: &Value) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
            for (key, value) in labels {
                let value = value
                    .as_str()
                    .ok_or_else(|| SelectorError(format!("matchLabels[{key}] is not a string")))?;
                requirements.push(Requirement::Equals(key.clone(), value.to_owned()));
            }
        }
        for expression in selector
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = expression
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let values: Vec<String> = expression
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            let operator = expression
                .get("operator")
                .and_then(Value::as_str)
                .unwrap_or_default();
            requirements.push(match operator {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(SelectorError(format!(
                        "{other:?} is not a valid label selector operator"
                    )));
                }
            });
        }
        Ok(Self(requirements))
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, ch) in text.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_requirement(part: &str) -> Result<Requirement, SelectorError> {
    let fail = || SelectorError(part.to_owned());
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        return if valid_key(key) {
            Ok(Requirement::DoesNotExist(key.to_owned()))
        } else {
            Err(fail())
        };
    }
    for (operator, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((key, rest)) = part.split_once(operator) {
            let key = key.trim();
            let rest = rest.trim();
            let inner = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(fail)?;
            let values: Vec<String> = inner
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect();
            if !valid_key(key) || values.is_empty() {
                return Err(fail());
            }
            return Ok(if negated {
                Requirement::NotIn(key.to_owned(), values)
            } else {
                Requirement::In(key.to_owned(), values)
            });
        }
    }
    for (operator, negated) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = part.split_once(operator) {
            let (key, value) = (key.trim(), value.trim());
            if !valid_key(key) || value.contains([' ', '(', ')', '=', '!']) {
                return Err(fail());
            }
            return Ok(if negated {
                Requirement::NotEquals(key.to_owned(), value.to_owned())
            } else {
                Requirement::Equals(key.to_owned(), value.to_owned())
            });
        }
    }
    if valid_key(part) {
        Ok(Requirement::Exists(part.to_owned()))
    } else {
        Err(fail())
    }
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, comma-joined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

/// The fields a field selector may name.
pub const SUPPORTED_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.schedulerName",
    "status.phase",
    "spec.unschedulable",
    "involvedObject.kind",
    "involvedObject.name",
    "involvedObject.namespace",
    "involvedObject.uid",
    "reason",
    "type",
];

impl FieldSelector {
    /// Parses a field selector, rejecting fields the API does not index.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, negated, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, false, v)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if !SUPPORTED_FIELDS.contains(&field) {
                return Err(SelectorError(format!("field label not supported: {field}")));
            }
            terms.push((field.to_owned(), negated, value.trim().to_owned()));
        }
        Ok(Self(terms))
    }

    /// Whether the object satisfies every term.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, negated, value)| {
            let actual = field_value(object, field);
            (actual == *value) != *negated
        })
    }
}

/// The value of a dotted field as a string: `""` when absent, `true`/`false` for booleans
/// (`spec.unschedulable` is `false` when unset).
pub fn field_value(object: &Value, field: &str) -> String {
    let mut current = object;
    for part in field.split('.') {
        match current.get(part) {
            Some(next) => current = next,
            None => {
                return if field == "spec.unschedulable" {
                    "false".into()
                } else {
                    String::new()
                };
            }
        }
    }
    match current {
        Value::String(text) => text.clone(),
        Value::Bool(flag) => flag.to_string(),
        Value::Number(number) => number.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn label_selector_full_syntax() {
        let labels = json!({"app": "web", "tier": "front", "env": "prod"});
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app in (db)", false),
            ("app notin (db, cache)", true),
            ("missing notin (db)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web,tier in (front),!missing,env", true),
            ("app=web,tier=back", false),
            ("", true),
        ];
        for (text, expected) in cases {
            let selector = LabelSelector::parse(text).unwrap();
            assert_eq!(selector.matches(Some(&labels)), expected, "{text}");
        }
        assert!(LabelSelector::parse("!app").unwrap().matches(None));
        for bad in ["app in web", "a b", "app=(x)", "in (a)"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_selector_objects() {
        let selector = LabelSelector::from_object(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]
        }))
        .unwrap();
        assert!(selector.matches(Some(&json!({"app": "web", "env": "prod"}))));
        assert!(!selector.matches(Some(&json!({"app": "web", "env": "dev"}))));
        assert!(
            LabelSelector::from_object(
                &json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]})
            )
            .is_err()
        );
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        assert!(
            FieldSelector::parse("spec.nodeName=n1")
                .unwrap()
                .matches(&pod)
        );
        assert!(
            FieldSelector::parse("spec.nodeName==n1,status.phase!=Failed")
                .unwrap()
                .matches(&pod)
        );
        assert!(
            !FieldSelector::parse("metadata.namespace=other")
                .unwrap()
                .matches(&pod)
        );
        let unbound = json!({"metadata": {"name": "q"}, "spec": {}});
        assert!(
            FieldSelector::parse("spec.nodeName=")
                .unwrap()
                .matches(&unbound)
        );
        let node = json!({"spec": {}});
        assert!(
            FieldSelector::parse("spec.unschedulable=false")
                .unwrap()
                .matches(&node)
        );
        assert!(
            FieldSelector::parse("spec.unschedulable=true")
                .unwrap()
                .matches(&json!({"spec": {"unschedulable": true}}))
        );
        let error = FieldSelector::parse("spec.containers=x").unwrap_err();
        assert_eq!(
            error.to_string(),
            "unable to parse requirement: field label not supported: spec.containers"
        );
    }
}
