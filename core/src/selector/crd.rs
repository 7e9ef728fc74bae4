//! The `Selector` custom resource (`eci.aliyun.com`), schema-compatible with eci-profile's:
//! served as `v1` (stored) and `v1beta1` (what eci-profile's examples are written in). Owns
//! the spec types the engine reads and the CRD generated from them (`deploy/base/` holds it;
//! `core/tests/crds.rs` keeps the file equal to the types).

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_core::CustomResourceExt;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which pods a Selector steers, how, and what it adds to them.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "eci.aliyun.com",
    version = "v1",
    kind = "Selector",
    plural = "selectors",
    namespaced,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Pods","type":"string","jsonPath":".spec.objectLabels","priority":1}"#,
    printcolumn = r#"{"name":"Namespaces","type":"string","jsonPath":".spec.namespaceLabels","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SelectorSpec {
    /// Labels the pod must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_labels: Option<LabelSelector>,
    /// Labels the pod's namespace must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_labels: Option<LabelSelector>,
    /// Labels and annotations added to matching pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// Where matching pods may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
    /// The highest priority among matching Selectors wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub priority: Option<i32>,
}

/// Labels and annotations to add.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Effect {
    /// Annotations to add.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Labels to add.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// An empty policy object (`fair: {}`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Empty {}

/// Exactly one of these should be set.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// The vnode toleration only: kube-scheduler chooses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair: Option<Empty>,
    /// Normal nodes first; virtual nodes when they run short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normal_node_prefer: Option<NormalNodePrefer>,
    /// Virtual nodes only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_node_only: Option<Empty>,
    /// Never virtual nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normal_node_only: Option<Empty>,
    /// Virtual nodes for one namespace, up to a budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_resource_limit: Option<NamespaceResourceLimit>,
}

/// When normal nodes count as short.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NormalNodePrefer {
    /// Percent of normal nodes' allocatable CPU requested at which pods may go to virtual nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ratio: Option<i64>,
    /// Percent of normal nodes' allocatable memory requested at which pods may go to virtual
    /// nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_ratio: Option<i64>,
}

/// A namespace's budget on virtual nodes.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct NamespaceResourceLimit {
    /// The namespace.
    pub namespace: String,
    /// Most requests (cpu, memory) its pods may hold on virtual nodes.
    pub limits: BTreeMap<String, Quantity>,
}

/// The CRD as applied: `v1` stored, `v1beta1` served with the same schema.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = Selector::crd();
    if let Some(v1) = crd.spec.versions.first().cloned() {
        let mut beta = v1;
        beta.name = "v1beta1".into();
        beta.storage = false;
        crd.spec.versions.push(beta);
    }
    crd
}

/// The CRD as YAML (committed under `deploy/`; a test keeps them equal).
pub fn crd_json() -> serde_json::Value {
    serde_json::to_value(crd()).unwrap_or_default()
}

/// The committed CRD file: generated from these types, checked by a test.
pub const CRD_FILE: &str = "deploy/base/selector-crd.yaml";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_serves_v1_stored_and_v1beta1_with_one_schema() {
        let crd = crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("selectors.eci.aliyun.com")
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        let versions: Vec<(&str, bool, bool)> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(versions, [("v1", true, true), ("v1beta1", true, false)]);
        assert_eq!(crd.spec.versions[0].schema, crd.spec.versions[1].schema);
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for field in [
            "objectLabels",
            "namespaceLabels",
            "effect",
            "policy",
            "priority",
        ] {
            assert!(spec.get(field).is_some(), "{field}");
        }
        for policy in [
            "fair",
            "normalNodePrefer",
            "virtualNodeOnly",
            "normalNodeOnly",
            "namespaceResourceLimit",
        ] {
            assert!(
                spec["policy"]["properties"].get(policy).is_some(),
                "{policy}"
            );
        }
        assert_eq!(spec["priority"]["format"], "int32");
    }
}
