//! Which namespaces may run pods here, and which of them may use which ECI annotations.
//!
//! Two administrator settings, judged before anything of a pod is read or created:
//! - the namespace scope (`--namespace-selector`): pods of namespaces it does not select are
//!   refused;
//! - the annotation policy (a ConfigMap named by `--annotation-policy-configmap`): per
//!   `k8s.aliyun.com/` annotation, the namespaces (by label selector) allowed to use it. An
//!   annotation the policy does not name stays allowed everywhere, as in ack-virtual-node.
//!
//! The judgement ([`judge`]) is pure; [`feed`] keeps the policy and the namespace labels it
//! needs current from watches. Owns no API call of its own besides those watches.

pub mod feed;

use std::collections::BTreeMap;
use std::fmt;

use kube::core::{Selector, SelectorExt};

use crate::k8s::label_selector::{self, SelectorError};

/// The prefix of the annotations a policy key names (ConfigMap keys cannot hold a `/`).
pub const ANNOTATION_PREFIX: &str = "k8s.aliyun.com/";
/// The policy value that allows an annotation in no namespace at all.
pub const NOBODY: &str = "none";

/// Reason (pod and Event) of a pod refused by the namespace scope.
pub const NAMESPACE_NOT_SERVED: &str = "NamespaceNotServed";
/// Reason of a pod refused by the annotation policy.
pub const ANNOTATION_NOT_ALLOWED: &str = "AnnotationNotAllowed";
/// Reason of a pod held because the configured policy cannot be read.
pub const POLICY_UNAVAILABLE: &str = "AnnotationPolicyUnavailable";

/// Why a policy ConfigMap is not a policy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// A key that is not the bare name of an annotation.
    #[error(
        "key `{0}` is not an annotation name under {ANNOTATION_PREFIX} (write `eci-ram-role-name`, not the full annotation)"
    )]
    Key(String),
    /// An empty value: ambiguous between "nobody" and "everybody", so neither.
    #[error(
        "key `{0}` has an empty selector: write `{NOBODY}` to allow it nowhere, or remove the key to allow it everywhere"
    )]
    Empty(String),
    /// A value that is not a label selector.
    #[error("key `{key}`: {source}")]
    Selector {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: SelectorError,
    },
}

/// A selector with the text it was written as (messages quote the administrator's words).
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    selector: Option<Selector>,
    text: String,
}

impl Written {
    /// Parses `text`; [`NOBODY`] selects no namespace.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let text = text.trim();
        let selector = if text == NOBODY {
            None
        } else {
            Some(label_selector::parse(text)?)
        };
        Ok(Self {
            selector,
            text: text.to_owned(),
        })
    }

    /// Selects no namespace (what a scope that cannot be read falls back to: closed).
    pub fn nobody() -> Self {
        Self {
            selector: None,
            text: NOBODY.to_owned(),
        }
    }

    fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.as_ref().is_some_and(|s| s.matches(labels))
    }

    /// Where this selector allows something, in words.
    fn where_allowed(&self) -> String {
        match &self.selector {
            None => "in no namespace".to_owned(),
            Some(_) => format!("only in namespaces matching `{}`", self.text),
        }
    }

    fn selects_all(&self) -> bool {
        self.selector.as_ref().is_some_and(Selector::selects_all)
    }
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Per restricted annotation (full name), the namespaces allowed to use it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AnnotationPolicy {
    rules: BTreeMap<String, Written>,
}

impl AnnotationPolicy {
    /// The policy a ConfigMap's `data` writes: key = annotation name without the
    /// `k8s.aliyun.com/` prefix, value = a label selector of the namespaces allowed to use it.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, PolicyError> {
        let mut rules = BTreeMap::new();
        for (key, value) in data {
            if key.is_empty() || key.contains('/') || key.starts_with('.') {
                return Err(PolicyError::Key(key.clone()));
            }
            if value.trim().is_empty() {
                return Err(PolicyError::Empty(key.clone()));
            }
            let allowed = Written::parse(value).map_err(|source| PolicyError::Selector {
                key: key.clone(),
                source,
            })?;
            rules.insert(format!("{ANNOTATION_PREFIX}{key}"), allowed);
        }
        Ok(Self { rules })
    }
}

/// The annotation policy as the daemon knows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Policy {
    /// None configured: every annotation allowed everywhere (ack-virtual-node's behaviour).
    Unrestricted,
    /// The configured ConfigMap (`namespace/name`) and what it says.
    Loaded {
        /// Where it was read.
        source: String,
        /// What it says.
        policy: AnnotationPolicy,
    },
    /// Configured but not read yet: nothing is judged until it is.
    Loading,
    /// Configured but missing or invalid: pods are held rather than run unchecked.
    Unavailable {
        /// Where it should be.
        source: String,
        /// Why it cannot be used.
        why: String,
    },
}

/// A pod's namespace, as far as the judgement needs it.
#[derive(Debug, Clone, Copy)]
pub enum Labels<'a> {
    /// Its labels.
    Known(&'a BTreeMap<String, String>),
    /// Not known yet (the namespace watch has not listed, or not seen it yet).
    Unknown,
}

/// The verdict on a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Allowed,
    /// Not now: the policy or the namespace's labels are not known yet (no status written;
    /// the pod is judged again when they are).
    Undecided(&'static str),
    /// Refused, with the reason and a message naming what refused it.
    Refused {
        /// The pod condition and Event reason.
        reason: &'static str,
        /// What the pod author reads.
        message: String,
    },
}

/// Judges a pod of `namespace` carrying `annotations` (as bound: whoever wrote them, the
/// author, a Selector or eci-profile) under the namespace `scope` (`None`: every namespace)
/// and `policy`.
pub fn judge<'a>(
    annotations: impl IntoIterator<Item = &'a str>,
    namespace: &str,
    labels: Labels<'_>,
    scope: Option<&Written>,
    policy: &Policy,
) -> Verdict {
    let rules = match policy {
        Policy::Unrestricted => None,
        Policy::Loaded { source, policy } => Some((source, policy)),
        Policy::Loading => return Verdict::Undecided("the annotation policy is not read yet"),
        Policy::Unavailable { source, why } => {
            return Verdict::Refused {
                reason: POLICY_UNAVAILABLE,
                message: format!(
                    "the annotation policy ConfigMap {source} cannot be used ({why}); pods wait until it can"
                ),
            };
        }
    };
    let governed: Vec<(&str, &Written)> = rules
        .map(|(_, policy)| {
            annotations
                .into_iter()
                .filter_map(|a| policy.rules.get(a).map(|rule| (a, rule)))
                .filter(|(_, rule)| !rule.selects_all())
                .collect()
        })
        .unwrap_or_default();
    let scope = scope.filter(|s| !s.selects_all());
    if scope.is_none() && governed.is_empty() {
        return Verdict::Allowed;
    }
    let Labels::Known(labels) = labels else {
        return Verdict::Undecided("the namespace's labels are not known yet");
    };
    if let Some(scope) = scope
        && !scope.selects(labels)
    {
        return Verdict::Refused {
            reason: NAMESPACE_NOT_SERVED,
            message: format!(
                "namespace {namespace} is not served by this virtual node: its labels do not match the namespace selector `{scope}`"
            ),
        };
    }
    let source = rules.map_or("", |(source, _)| source.as_str());
    match governed.iter().find(|(_, rule)| !rule.selects(labels)) {
        None => Verdict::Allowed,
        Some((annotation, rule)) => Verdict::Refused {
            reason: ANNOTATION_NOT_ALLOWED,
            message: format!(
                "annotation {annotation} is not allowed in namespace {namespace}: the annotation policy {source} allows it {}",
                rule.where_allowed()
            ),
        },
    }
}

#[cfg(test)]
mod tests;
