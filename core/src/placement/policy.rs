//! The `ResourcePolicy` custom resource (`scheduling.alibabacloud.com/v1alpha1`), with ACK's
//! schema so manifests written for ACK apply unchanged; what the schema and its CEL rules
//! cannot say is checked by [`validate`] (the webhook refuses, the controller reports). Owns
//! the spec and status types and the CRD generated from them (`deploy/base/` holds it;
//! `core/tests/crds.rs` keeps the file equal to the types).

// `KubeSchema` copies each struct, `pub` and all, into its schema function, where the lint
// cannot see it reached; the types themselves are public.
#![allow(unreachable_pub)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kube_core::CustomResourceExt;
use kube_derive::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::quantity::Quantity;

/// The label a unit's `podLabels` may carry to make pods wait in it for nodes to come (ACK's
/// autoscaling hint); never copied onto pods, never required when counting.
pub const WAIT_FOR_SCALING_LABEL: &str = "k8s.aliyun.com/resource-policy-wait-for-ecs-scaling";

/// How long `TimeoutOrExceedMax` waits in a unit when `timeout` is not given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Which pods the policy places, and where, in order.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "scheduling.alibabacloud.com",
    version = "v1alpha1",
    kind = "ResourcePolicy",
    plural = "resourcepolicies",
    shortname = "rp",
    namespaced,
    status = "ResourcePolicyStatus",
    printcolumn = r#"{"name":"Units","type":"integer","jsonPath":".status.unitCount"}"#,
    printcolumn = r#"{"name":"Pods","type":"integer","jsonPath":".status.placedPods"}"#,
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".spec.whenTryNextUnits.policy","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePolicySpec {
    /// Labels the pods must carry (same namespace); empty: every pod of the namespace.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Only `prefer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = kube_core::Rule::new("self == 'prefer'").message("strategy: only 'prefer' is supported"))]
    pub strategy: Option<String>,
    /// Where pods go, in order; scale-in removes them in reverse. (The bounds keep the CEL
    /// rules within the apiserver's cost budget.)
    #[schemars(length(max = 32))]
    #[x_kube(validation = kube_core::Rule::new("size(self) >= 1").message("units: at least one unit is needed"))]
    pub units: Vec<Unit>,
    /// `BeforeNextUnit` or `AfterAllUnits` (default): when preemption may be tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = kube_core::Rule::new("self in ['BeforeNextUnit', 'AfterAllUnits']").message("preemptPolicy: must be BeforeNextUnit or AfterAllUnits"))]
    pub preempt_policy: Option<String>,
    /// Leave pods created before the policy out of the counts (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_previous_pod: Option<bool>,
    /// Leave terminating pods out of the counts (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_terminating_pod: Option<bool>,
    /// Pod labels whose values split the pods into groups, each counted against `max` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 317)))]
    #[x_kube(validation = kube_core::Rule::new("self.all(k, size(k) > 0)").message("matchLabelKeys: a key is empty"))]
    pub match_label_keys: Vec<String>,
    /// When a pod may move on to the next unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_try_next_units: Option<WhenTryNextUnits>,
}

/// One placement unit.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct Unit {
    /// `ecs` (nodes chosen by `nodeSelector`) or `eci` (virtual nodes).
    #[schemars(length(max = 16))]
    #[x_kube(validation = kube_core::Rule::new("self in ['ecs', 'eci']").message("resource: only 'ecs' and 'eci' units are supported ('elastic' and 'acs' are not, yet)"))]
    pub resource: String,
    /// Labels the unit's nodes carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Most pods placed in the unit (per `matchLabelKeys` group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    #[x_kube(validation = kube_core::Rule::new("self >= 0").message("max: must not be negative"))]
    pub max: Option<i32>,
    /// Most resources the unit's pods may request together (per group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_resources: Option<BTreeMap<String, ApiQuantity>>,
    /// Labels set on pods placed in the unit (and required of pods counted in it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    /// Annotations set on pods placed in the unit (and required of pods counted in it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
}

/// When pods may try the next unit.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct WhenTryNextUnits {
    /// `ExceedMax`, `LackResourceAndNoTerminating`, `TimeoutOrExceedMax` or
    /// `LackResourceOrExceedMax` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = kube_core::Rule::new("self in ['ExceedMax', 'LackResourceAndNoTerminating', 'TimeoutOrExceedMax', 'LackResourceOrExceedMax']").message("whenTryNextUnits.policy: must be ExceedMax, LackResourceAndNoTerminating, TimeoutOrExceedMax or LackResourceOrExceedMax"))]
    pub policy: Option<String>,
    /// How long `TimeoutOrExceedMax` waits in a unit (a duration such as `1m`; default 15m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = kube_core::Rule::new("self.matches('^([0-9]+(\\\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$')").message("whenTryNextUnits.timeout: must be a duration such as 30s, 1m or 1h30m"))]
    pub timeout: Option<String>,
}

/// What the controller observed.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePolicyStatus {
    /// The generation these counts were taken for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How many units the policy has.
    #[serde(default)]
    #[schemars(extend("format" = "int32"))]
    pub unit_count: i32,
    /// Pods counted in any unit.
    #[serde(default)]
    #[schemars(extend("format" = "int32"))]
    pub placed_pods: i32,
    /// Per unit, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<UnitStatus>,
    /// Why the policy cannot be used as written, when it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// One unit's counts.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnitStatus {
    /// 1-based position.
    #[schemars(extend("format" = "int32"))]
    pub unit: i32,
    /// `ecs` or `eci`, and the node selector, in one line.
    pub description: String,
    /// Pods counted in the unit (all groups).
    #[schemars(extend("format" = "int32"))]
    pub pods: i32,
    /// Per `matchLabelKeys` group (`key=value,...`), when the policy groups.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, i32>,
}

/// `whenTryNextUnits.policy`, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NextUnits {
    /// Move on only when the unit is at its `max`/`maxResources` (or has none).
    ExceedMax,
    /// Move on when full or out of room, unless pods are terminating there.
    LackResourceAndNoTerminating,
    /// Wait up to a timeout for room below `max`; move on at once when full.
    TimeoutOrExceedMax,
    /// Move on when full or out of room.
    #[default]
    LackResourceOrExceedMax,
}

/// A unit's resource kind, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// Nodes chosen by `nodeSelector`.
    Ecs,
    /// Virtual nodes.
    Eci,
}

/// One thing wrong with a policy: the field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    /// The field's path (`spec.units[1].maxResources.cpu`).
    pub field: String,
    /// Why.
    pub why: String,
}

impl std::fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

impl ResourcePolicySpec {
    /// The policy for trying the next unit (unknown names were refused by the schema; they
    /// read as the default).
    pub fn next_units(&self) -> NextUnits {
        match self
            .when_try_next_units
            .as_ref()
            .and_then(|w| w.policy.as_deref())
        {
            Some("ExceedMax") => NextUnits::ExceedMax,
            Some("LackResourceAndNoTerminating") => NextUnits::LackResourceAndNoTerminating,
            Some("TimeoutOrExceedMax") => NextUnits::TimeoutOrExceedMax,
            _ => NextUnits::LackResourceOrExceedMax,
        }
    }

    /// `TimeoutOrExceedMax`'s wait.
    pub fn timeout(&self) -> Duration {
        self.when_try_next_units
            .as_ref()
            .and_then(|w| w.timeout.as_deref())
            .and_then(|t| parse_duration(t).ok())
            .unwrap_or(DEFAULT_TIMEOUT)
    }

    /// Whether terminating pods are left out of the counts.
    pub fn ignores_terminating(&self) -> bool {
        self.ignore_terminating_pod.unwrap_or(true)
    }

    /// Whether pods created before the policy are left out of the counts.
    pub fn ignores_previous(&self) -> bool {
        self.ignore_previous_pod.unwrap_or(false)
    }
}

impl Unit {
    /// The unit's kind (anything but `eci` reads as `ecs`; the schema refused the rest).
    pub fn resource(&self) -> Resource {
        if self.resource == "eci" {
            Resource::Eci
        } else {
            Resource::Ecs
        }
    }

    /// `maxResources`, parsed (unparseable entries were reported by [`validate`] and are
    /// left out).
    pub fn max_resources(&self) -> Option<BTreeMap<String, Quantity>> {
        self.max_resources.as_ref().map(|limits| {
            limits
                .iter()
                .filter_map(|(name, q)| Some((name.clone(), Quantity::parse(&q.0).ok()?)))
                .collect()
        })
    }

    /// The unit in one line: `ecs paidtype=subscription`, `eci`.
    pub fn describe(&self) -> String {
        let selector: Vec<String> = self
            .node_selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if selector.is_empty() {
            self.resource.clone()
        } else {
            format!("{} {}", self.resource, selector.join(","))
        }
    }

    /// Whether the unit asks pods to wait for nodes to come (ACK's autoscaling hint).
    pub fn waits_for_scaling(&self) -> bool {
        self.pod_labels
            .get(WAIT_FOR_SCALING_LABEL)
            .is_some_and(|v| v == "true")
    }

    /// The labels set on pods placed in the unit (the autoscaling hint is not one of them).
    pub fn labels_to_set(&self) -> impl Iterator<Item = (&String, &String)> {
        self.pod_labels
            .iter()
            .filter(|(k, _)| k.as_str() != WAIT_FOR_SCALING_LABEL)
    }
}

/// A Go-style duration (`1m`, `1h30m`, `500ms`, `1.5s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration such as 30s, 1m or 1h30m");
    if text.is_empty() {
        return Err(bad());
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, after) = rest.split_at(number_end);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * seconds;
        rest = after;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// What the schema cannot check: every problem, with its field.
pub fn validate(spec: &ResourcePolicySpec) -> Vec<FieldProblem> {
    let mut problems = Vec::new();
    let mut problem = |field: String, why: String| problems.push(FieldProblem { field, why });
    if spec.units.is_empty() {
        problem("spec.units".into(), "at least one unit is needed".into());
    }
    if let Some(strategy) = spec.strategy.as_deref()
        && strategy != "prefer"
    {
        problem(
            "spec.strategy".into(),
            format!("{strategy:?} is not supported; only \"prefer\" is"),
        );
    }
    if let Some(w) = &spec.when_try_next_units {
        if let Some(policy) = w.policy.as_deref()
            && ![
                "ExceedMax",
                "LackResourceAndNoTerminating",
                "TimeoutOrExceedMax",
                "LackResourceOrExceedMax",
            ]
            .contains(&policy)
        {
            problem(
                "spec.whenTryNextUnits.policy".into(),
                format!(
                    "{policy:?} is not one of ExceedMax, LackResourceAndNoTerminating, TimeoutOrExceedMax, LackResourceOrExceedMax"
                ),
            );
        }
        if let Some(timeout) = w.timeout.as_deref() {
            match parse_duration(timeout) {
                Ok(d) if d.is_zero() => problem(
                    "spec.whenTryNextUnits.timeout".into(),
                    "must be longer than zero".into(),
                ),
                Ok(_) => {}
                Err(why) => problem("spec.whenTryNextUnits.timeout".into(), why),
            }
        }
    }
    for (i, key) in spec.match_label_keys.iter().enumerate() {
        if key.is_empty() {
            problem(format!("spec.matchLabelKeys[{i}]"), "a key is empty".into());
        }
    }
    for (i, unit) in spec.units.iter().enumerate() {
        let at = format!("spec.units[{i}]");
        if !["ecs", "eci"].contains(&unit.resource.as_str()) {
            problem(
                format!("{at}.resource"),
                format!(
                    "{:?} is not supported; only \"ecs\" and \"eci\" units are (\"elastic\" and \"acs\" are not, yet)",
                    unit.resource
                ),
            );
        }
        if unit.max.is_some_and(|m| m < 0) {
            problem(format!("{at}.max"), "must not be negative".into());
        }
        for (name, quantity) in unit.max_resources.iter().flatten() {
            match Quantity::parse(&quantity.0) {
                Ok(q) if q.is_negative() => {
                    problem(
                        format!("{at}.maxResources.{name}"),
                        "must not be negative".into(),
                    );
                }
                Ok(_) => {}
                Err(error) => problem(format!("{at}.maxResources.{name}"), error.to_string()),
            }
        }
    }
    problems
}

/// The CRD as applied.
pub fn crd_json() -> serde_json::Value {
    serde_json::to_value(ResourcePolicy::crd()).unwrap_or_default()
}

/// The committed CRD file: generated from these types, checked by a test.
pub const CRD_FILE: &str = "deploy/base/resourcepolicy-crd.yaml";

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: serde_json::Value) -> ResourcePolicySpec {
        serde_json::from_value(value).unwrap()
    }

    /// The ACK example under deploy/examples (every field of ACK's schema), read at build
    /// time: the core's tests do no I/O either.
    const ACK_EXAMPLE: &str = include_str!("../../../deploy/examples/resourcepolicy-ack.yaml");

    #[test]
    fn the_seeds_manifest_reads_with_its_defaults() {
        let policy: ResourcePolicy = serde_saphyr::from_str(ACK_EXAMPLE).unwrap();
        let spec = policy.spec;
        assert!(validate(&spec).is_empty(), "{:?}", validate(&spec));
        assert_eq!(spec.next_units(), NextUnits::TimeoutOrExceedMax);
        assert_eq!(spec.timeout(), Duration::from_secs(60));
        assert_eq!(spec.units[2].resource(), Resource::Eci);
        assert_eq!(spec.units[0].describe(), "ecs unit=first");

        let bare = self::spec(serde_json::json!({"units": [{"resource": "eci"}]}));
        assert_eq!(bare.next_units(), NextUnits::LackResourceOrExceedMax);
        assert_eq!(bare.timeout(), DEFAULT_TIMEOUT);
        assert!(bare.ignores_terminating());
        assert!(!bare.ignores_previous());
    }

    #[test]
    fn each_problem_names_its_field() {
        let cases = [
            (
                serde_json::json!({"units": []}),
                vec!["spec.units: at least one unit is needed"],
            ),
            (
                serde_json::json!({"units": [{"resource": "acs"}]}),
                vec![
                    "spec.units[0].resource: \"acs\" is not supported; only \"ecs\" and \"eci\" units are (\"elastic\" and \"acs\" are not, yet)",
                ],
            ),
            (
                serde_json::json!({"units": [{"resource": "ecs", "max": -1, "maxResources": {"cpu": "lots"}}]}),
                vec![
                    "spec.units[0].max: must not be negative",
                    "spec.units[0].maxResources.cpu: \"lots\" is not a quantity",
                ],
            ),
            (
                serde_json::json!({"units": [{"resource": "eci"}], "whenTryNextUnits": {"policy": "Never", "timeout": "soon"}}),
                vec![
                    "spec.whenTryNextUnits.policy: \"Never\" is not one of ExceedMax, LackResourceAndNoTerminating, TimeoutOrExceedMax, LackResourceOrExceedMax",
                    "spec.whenTryNextUnits.timeout: \"soon\" is not a duration such as 30s, 1m or 1h30m",
                ],
            ),
            (
                serde_json::json!({"units": [{"resource": "eci"}], "strategy": "spread", "matchLabelKeys": [""]}),
                vec![
                    "spec.strategy: \"spread\" is not supported; only \"prefer\" is",
                    "spec.matchLabelKeys[0]: a key is empty",
                ],
            ),
        ];
        for (value, want) in cases {
            let got: Vec<String> = validate(&spec(value.clone()))
                .iter()
                .map(ToString::to_string)
                .collect();
            let got: Vec<&str> = got.iter().map(String::as_str).collect();
            // Quantity errors word themselves; compare their field and prefix only.
            assert_eq!(got.len(), want.len(), "{value}: {got:?}");
            for (g, w) in got.iter().zip(&want) {
                let field = w.split(": ").next().unwrap();
                assert!(g.starts_with(field), "{value}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn durations_read_as_go_writes_them() {
        for (text, want) in [
            ("1m", Some(60.0)),
            ("1h30m", Some(5400.0)),
            ("500ms", Some(0.5)),
            ("1.5s", Some(1.5)),
            ("15m", Some(900.0)),
            ("", None),
            ("5", None),
            ("m", None),
            ("1d", None),
        ] {
            let got = parse_duration(text).ok().map(|d| d.as_secs_f64());
            assert_eq!(got, want, "{text:?}");
        }
    }
}
