//! Which namespaces may run pods here, and which of them may use which ECI annotations.
//!
//! Two administrator settings, judged before anything of a pod is read or created:
//! - the namespace scope (`--namespace-selector`): pods of namespaces it does not select are
//!   refused;
//! - the annotation policy (a ConfigMap named by `--annotation-policy-configmap`): an
//!   allow-list. Per `k8s.aliyun.com/` annotation, the namespaces (by label selector) allowed
//!   to use it; an annotation it does not name is allowed nowhere (the daemon's written-back
//!   annotations excepted: a pod's own value is replaced, never read). Besides annotations it
//!   names custom tag keys only some namespaces may set (`tag.<key>`), the namespaces whose pods
//!   may ask `eci-use-specs` for a larger instance than their containers
//!   (`oversized-specs`, default: none) and those whose pods may name ECS instance types, whose
//!   size the daemon cannot compare (`unknown-size-instance-types`, default: all). Without a
//!   policy everything is allowed everywhere, as in ack-virtual-node.
//!
//! The judgement ([`judge`]) is pure: it is given the policy and the namespace's labels. The
//! daemon's pod controller keeps both current from watches and asks it before a pod's group
//! is created.

pub mod specs;

use std::collections::BTreeMap;
use std::fmt;

use kube_core::{Selector, SelectorExt};

use crate::selector_text::{self, SelectorError};

/// The prefix of the annotations a policy key names (ConfigMap keys cannot hold a `/`).
pub const ANNOTATION_PREFIX: &str = "k8s.aliyun.com/";
/// The policy value that allows an annotation in no namespace at all.
pub const NOBODY: &str = "none";
/// The policy value that allows an annotation in every namespace.
pub const EVERYBODY: &str = "all";
/// The annotation whose sizes are compared with the containers'.
pub const USE_SPECS: &str = "k8s.aliyun.com/eci-use-specs";
/// The annotation whose tag keys `tag.<key>` entries govern.
pub const CUSTOM_TAGS: &str = "k8s.aliyun.com/eci-custom-tags";
/// Policy key prefix: a custom tag key only some namespaces may set.
pub const TAG_KEY_PREFIX: &str = "tag.";
/// Policy key: the namespaces whose pods may ask for an instance larger than their containers.
pub const OVERSIZED_SPECS: &str = "oversized-specs";
/// Policy key: the namespaces whose pods may name ECS instance types (size unknown).
pub const UNKNOWN_SIZE_TYPES: &str = "unknown-size-instance-types";

/// Reason (pod and Event) of a pod refused by the namespace scope.
pub const NAMESPACE_NOT_SERVED: &str = "NamespaceNotServed";
/// Reason of a pod refused by the annotation policy.
pub const ANNOTATION_NOT_ALLOWED: &str = "AnnotationNotAllowed";
/// Reason of a pod whose `eci-use-specs` asks for more than its containers (and its quota).
pub const SPEC_LARGER_THAN_RESOURCES: &str = "SpecLargerThanResources";
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
        "key `{0}` has an empty selector: write `{NOBODY}` to allow it nowhere or `{EVERYBODY}` to allow it everywhere"
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
    /// Parses `text`; [`NOBODY`] selects no namespace, [`EVERYBODY`] every one.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let text = text.trim();
        let selector = match text {
            NOBODY => None,
            EVERYBODY => Some(Selector::default()),
            _ => Some(selector_text::parse(text)?),
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

/// What a policy ConfigMap says: per entry, the namespaces allowed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AnnotationPolicy {
    /// Per annotation (full name); an annotation not here is allowed nowhere.
    rules: BTreeMap<String, Written>,
    /// Per reserved custom tag key; a tag key not here goes wherever `eci-custom-tags` does.
    tags: BTreeMap<String, Written>,
    /// Who may over-size (`None`: nobody).
    oversized: Option<Written>,
    /// Who may name instance types of unknown size (`None`: everybody).
    unknown_types: Option<Written>,
}

impl AnnotationPolicy {
    /// The policy a ConfigMap's `data` writes: key = annotation name without the
    /// `k8s.aliyun.com/` prefix, `tag.<tag key>`, [`OVERSIZED_SPECS`] or
    /// [`UNKNOWN_SIZE_TYPES`]; value = a label selector of the namespaces allowed, [`NOBODY`] or
    /// [`EVERYBODY`].
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, PolicyError> {
        let mut policy = Self::default();
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
            if let Some(tag) = key.strip_prefix(TAG_KEY_PREFIX) {
                policy.tags.insert(tag.to_owned(), allowed);
            } else if key == OVERSIZED_SPECS {
                policy.oversized = Some(allowed);
            } else if key == UNKNOWN_SIZE_TYPES {
                policy.unknown_types = Some(allowed);
            } else {
                policy
                    .rules
                    .insert(format!("{ANNOTATION_PREFIX}{key}"), allowed);
            }
        }
        Ok(policy)
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
pub enum Clearance {
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

/// What a pod asks for, as bound: its annotations (whoever wrote them: the author, a Selector
/// or eci-profile) and its containers' size.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// The annotations, names and values.
    pub annotations: &'a BTreeMap<String, String>,
    /// The containers' size ([`specs::Size::of_pod`]).
    pub size: specs::Size,
}

/// One thing a policy must allow, and the entry that decides it.
struct Check<'a> {
    /// The reason a refusal gives.
    reason: &'static str,
    /// What is asked, in words.
    what: String,
    /// The entry that decides (`None`: the policy names nothing that allows it).
    rule: Option<&'a Written>,
    /// The policy key that would allow it (messages tell the administrator).
    key: String,
}

/// Whether an annotation is one the daemon writes back (never read from the pod).
fn written_back(name: &str) -> bool {
    use crate::to_eci::annotations::{Handling, entry};
    entry(name).is_some_and(|e| matches!(e.handling, Handling::WrittenBack(_)))
}

/// What the policy must allow for `asked`.
fn checks<'a>(asked: &Asked<'_>, policy: &'a AnnotationPolicy) -> Vec<Check<'a>> {
    let mut out = Vec::new();
    for name in asked.annotations.keys() {
        let Some(short) = name.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        if written_back(name) {
            continue;
        }
        out.push(Check {
            reason: ANNOTATION_NOT_ALLOWED,
            what: format!("annotation {name}"),
            rule: policy.rules.get(name),
            key: short.to_owned(),
        });
    }
    if let Some(tags) = asked.annotations.get(CUSTOM_TAGS) {
        for key in tags.split(',').filter_map(|pair| pair.split_once(':')) {
            let key = key.0.trim();
            if let Some(rule) = policy.tags.get(key) {
                out.push(Check {
                    reason: ANNOTATION_NOT_ALLOWED,
                    what: format!("custom tag key `{key}` (in {CUSTOM_TAGS})"),
                    rule: Some(rule),
                    key: format!("{TAG_KEY_PREFIX}{key}"),
                });
            }
        }
    }
    if let Some(value) = asked.annotations.get(USE_SPECS) {
        match specs::compare(value, asked.size) {
            specs::Sizing::Fits => {}
            specs::Sizing::Larger {
                pair,
                asked,
                allowed,
            } => out.push(Check {
                reason: SPEC_LARGER_THAN_RESOURCES,
                what: format!(
                    "{USE_SPECS} `{pair}`, larger than the pod's containers ask for ({} vCPU, {} GiB; up to {} vCPU, {} GiB counts as their size): ResourceQuota counts the containers and ECI bills the instance, so raise their requests or limits",
                    round(asked.cpu),
                    round(asked.memory),
                    allowed.cpu,
                    allowed.memory
                ),
                rule: Some(policy.oversized.as_ref().unwrap_or(&NOBODY_RULE)),
                key: OVERSIZED_SPECS.to_owned(),
            }),
            specs::Sizing::UnknownTypes(types) => {
                if let Some(rule) = &policy.unknown_types {
                    out.push(Check {
                        reason: SPEC_LARGER_THAN_RESOURCES,
                        what: format!(
                            "{USE_SPECS} naming instance types whose size is not known to compare with the containers' ({})",
                            types.join(", ")
                        ),
                        rule: Some(rule),
                        key: UNKNOWN_SIZE_TYPES.to_owned(),
                    });
                }
            }
        }
    }
    out
}

/// A size for messages: three decimals at most.
fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// [`Written::nobody`] as a constant.
static NOBODY_RULE: std::sync::LazyLock<Written> = std::sync::LazyLock::new(Written::nobody);

/// Judges a pod of `namespace` asking for `asked` under the namespace `scope` (`None`: every
/// namespace) and `policy`.
pub fn judge(
    asked: &Asked<'_>,
    namespace: &str,
    labels: Labels<'_>,
    scope: Option<&Written>,
    policy: &Policy,
) -> Clearance {
    let (source, checks) = match policy {
        Policy::Unrestricted => ("", Vec::new()),
        Policy::Loaded { source, policy } => (source.as_str(), checks(asked, policy)),
        Policy::Loading => return Clearance::Undecided("the annotation policy is not read yet"),
        Policy::Unavailable { source, why } => {
            return Clearance::Refused {
                reason: POLICY_UNAVAILABLE,
                message: format!(
                    "the annotation policy ConfigMap {source} cannot be used ({why}); pods wait until it can"
                ),
            };
        }
    };
    let checks: Vec<Check<'_>> = checks
        .into_iter()
        .filter(|c| !c.rule.is_some_and(Written::selects_all))
        .collect();
    let scope = scope.filter(|s| !s.selects_all());
    if scope.is_none() && checks.is_empty() {
        return Clearance::Allowed;
    }
    // What the policy does not name is refused whatever the labels say.
    let unnamed = checks.iter().find(|c| c.rule.is_none());
    if let (None, Some(check)) = (scope, unnamed) {
        return refusal(check, namespace, source);
    }
    let Labels::Known(labels) = labels else {
        return Clearance::Undecided("the namespace's labels are not known yet");
    };
    if let Some(scope) = scope
        && !scope.selects(labels)
    {
        return Clearance::Refused {
            reason: NAMESPACE_NOT_SERVED,
            message: format!(
                "namespace {namespace} is not served by this virtual node: its labels do not match the namespace selector `{scope}`"
            ),
        };
    }
    match checks
        .iter()
        .find(|c| !c.rule.is_some_and(|rule| rule.selects(labels)))
    {
        None => Clearance::Allowed,
        Some(check) => refusal(check, namespace, source),
    }
}

/// The refusal of `check` in `namespace` under the policy read from `source`.
fn refusal(check: &Check<'_>, namespace: &str, source: &str) -> Clearance {
    let why = match check.rule {
        None => format!(
            "the annotation policy {source} does not name it, and allows only what it names (an administrator adds the key `{}` to allow it)",
            check.key
        ),
        Some(rule) => format!(
            "the annotation policy {source} allows it {} (key `{}`)",
            rule.where_allowed(),
            check.key
        ),
    };
    Clearance::Refused {
        reason: check.reason,
        message: format!(
            "{} is not allowed in namespace {namespace}: {why}",
            check.what
        ),
    }
}

#[cfg(test)]
mod tests;
