//! Label selectors written as text, the way `kubectl -l` takes them (`env=prod,team!=ops`,
//! `tier in (a,b)`, `trusted`, `!sandbox`), turned into kube's [`Selector`] to match with.
//! Flags and ConfigMap values hold selectors as text; kube parses none itself. A
//! `LabelSelector` object (matchLabels, matchExpressions) is [`crate::selector::labels`]'s.

use kube_core::{Expression, Selector};

/// Why a selector's text is not one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    /// A requirement that is none of the forms.
    #[error(
        "`{0}` is not a label requirement (key=value, key!=value, key, !key, key in (a,b), key notin (a,b))"
    )]
    Requirement(String),
    /// A `(` without its `)`, or the reverse.
    #[error("unbalanced parentheses in `{0}`")]
    Parentheses(String),
    /// A key or value with characters labels never have.
    #[error("`{0}` is not a valid label key or value")]
    Name(String),
}

/// Parses `text`; the empty text selects everything, as in Kubernetes.
pub fn parse(text: &str) -> Result<Selector, SelectorError> {
    let mut selector = Selector::default();
    for requirement in split_top_level(text)? {
        let requirement = requirement.trim();
        if requirement.is_empty() {
            if text.trim().is_empty() {
                continue;
            }
            return Err(SelectorError::Requirement(text.to_owned()));
        }
        selector.extend(std::iter::once(expression(requirement)?));
    }
    Ok(selector)
}

/// The requirements of `text`, split at the commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, SelectorError> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (at, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(SelectorError::Parentheses(text.to_owned()));
        }
    }
    if depth != 0 {
        return Err(SelectorError::Parentheses(text.to_owned()));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn expression(requirement: &str) -> Result<Expression, SelectorError> {
    let bad = || SelectorError::Requirement(requirement.to_owned());
    if let Some(key) = requirement.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(name(key.trim())?));
    }
    if let Some((key, value)) = requirement.split_once("!=") {
        return Ok(Expression::NotEqual(name(key.trim())?, value_of(value)?));
    }
    if let Some((key, value)) = requirement
        .split_once("==")
        .or_else(|| requirement.split_once('='))
    {
        return Ok(Expression::Equal(name(key.trim())?, value_of(value)?));
    }
    let words: Vec<&str> = requirement.splitn(2, char::is_whitespace).collect();
    match words.as_slice() {
        [key] => Ok(Expression::Exists(name(key)?)),
        [key, rest] => {
            let rest = rest.trim();
            let (negated, list) = if let Some(list) = rest.strip_prefix("notin") {
                (true, list)
            } else if let Some(list) = rest.strip_prefix("in") {
                (false, list)
            } else {
                return Err(bad());
            };
            let list = list
                .trim()
                .strip_prefix('(')
                .and_then(|l| l.strip_suffix(')'))
                .ok_or_else(bad)?;
            let values = list.split(',').map(value_of).collect::<Result<_, _>>()?;
            let key = name(key)?;
            Ok(if negated {
                Expression::NotIn(key, values)
            } else {
                Expression::In(key, values)
            })
        }
        _ => Err(bad()),
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn name(text: &str) -> Result<String, SelectorError> {
    let valid = !text.is_empty()
        && text.len() <= 317
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && text.matches('/').count() <= 1
        && !text.ends_with('/');
    valid
        .then(|| text.to_owned())
        .ok_or_else(|| SelectorError::Name(text.to_owned()))
}

/// A label value (may be empty).
fn value_of(text: &str) -> Result<String, SelectorError> {
    let text = text.trim();
    let valid = text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    valid
        .then(|| text.to_owned())
        .ok_or_else(|| SelectorError::Name(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_core::SelectorExt;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn selectors_match_as_kubectl_would() {
        let trusted = labels(&[("eci.example.com/trusted", "true"), ("env", "prod")]);
        let tenant = labels(&[("env", "dev")]);
        let none = labels(&[]);
        // (selector, matches trusted, matches tenant, matches an unlabelled namespace)
        let cases: &[(&str, bool, bool, bool)] = &[
            ("", true, true, true),
            ("eci.example.com/trusted=true", true, false, false),
            ("eci.example.com/trusted==true", true, false, false),
            ("eci.example.com/trusted", true, false, false),
            ("!eci.example.com/trusted", false, true, true),
            ("env!=prod", false, true, true),
            ("env in (prod, staging)", true, false, false),
            ("env notin (prod)", false, true, true),
            ("env=prod,eci.example.com/trusted=true", true, false, false),
            (
                "env in (dev,prod),!eci.example.com/trusted",
                false,
                true,
                false,
            ),
        ];
        for (text, t, d, n) in cases {
            let selector = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                [&trusted, &tenant, &none].map(|l| selector.matches(l)),
                [*t, *d, *n],
                "{text}"
            );
        }
    }

    #[test]
    fn malformed_selectors_are_errors() {
        for text in [
            "env in prod",
            "env in (prod",
            "env)",
            "a=b,,c=d",
            "env=pr od",
            "bad key=1",
            "a/b/c=1",
            "env ~ prod",
        ] {
            assert!(parse(text).is_err(), "{text} should not parse");
        }
    }
}
