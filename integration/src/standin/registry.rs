//! The resource types the stand-in serves, built in or from CustomResourceDefinitions, and the
//! discovery documents built from them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Subresources of a type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subresources {
    /// `/status`.
    pub status: bool,
    /// `/scale`, with the paths of the replica fields (`.spec.replicas`, `.status.replicas`).
    pub scale: Option<ScalePaths>,
    /// `pods/eviction`.
    pub eviction: bool,
    /// `pods/binding`.
    pub binding: bool,
    /// `serviceaccounts/token` (TokenRequest).
    pub token: bool,
}

/// Where a scalable type keeps its replica counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    /// JSON path of the desired replicas, e.g. `.spec.replicas`.
    pub spec_replicas: String,
    /// JSON path of the observed replicas.
    pub status_replicas: String,
    /// JSON path of a label selector string, if any.
    pub label_selector: Option<String>,
}

/// One resource type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// API group (`""` for core).
    pub group: String,
    /// Served versions; the first is the preferred one.
    pub versions: Vec<String>,
    /// The version objects are stored in.
    pub storage_version: String,
    /// Plural name used in paths.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Kind.
    pub kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: Vec<String>,
    /// Subresources.
    pub subresources: Subresources,
    /// Only `create` is allowed (reviews).
    pub create_only: bool,
}

impl ResourceType {
    /// `group/version` or `version` for core.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_owned()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// The storage key of the type.
    pub fn key(&self) -> TypeKey {
        TypeKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    fn verbs(&self) -> Vec<&'static str> {
        if self.create_only {
            vec!["create"]
        } else {
            vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }
}

/// Identifies a type regardless of version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TypeKey {
    /// API group.
    pub group: String,
    /// Plural.
    pub plural: String,
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    singular: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    subresources: Subresources,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        versions: vec![version.into()],
        storage_version: version.into(),
        plural: plural.into(),
        singular: singular.into(),
        kind: kind.into(),
        namespaced,
        short_names: short.iter().map(|s| (*s).to_owned()).collect(),
        subresources,
        create_only: false,
    }
}

fn status() -> Subresources {
    Subresources {
        status: true,
        ..Subresources::default()
    }
}

/// The built-in types.
pub fn builtin_types() -> Vec<ResourceType> {
    let none = Subresources::default;
    let review = |group: &str, plural: &str, singular: &str, kind: &str| {
        let mut t = builtin(group, "v1", plural, singular, kind, false, &[], none());
        t.create_only = true;
        t
    };
    let token_review = review(
        "authentication.k8s.io",
        "tokenreviews",
        "tokenreview",
        "TokenReview",
    );
    let access_review = review(
        "authorization.k8s.io",
        "subjectaccessreviews",
        "subjectaccessreview",
        "SubjectAccessReview",
    );
    vec![
        builtin(
            "",
            "v1",
            "namespaces",
            "namespace",
            "Namespace",
            false,
            &["ns"],
            status(),
        ),
        builtin("", "v1", "nodes", "node", "Node", false, &["no"], status()),
        builtin(
            "",
            "v1",
            "pods",
            "pod",
            "Pod",
            true,
            &["po"],
            Subresources {
                status: true,
                eviction: true,
                binding: true,
                ..Subresources::default()
            },
        ),
        builtin("", "v1", "events", "event", "Event", true, &["ev"], none()),
        builtin(
            "",
            "v1",
            "configmaps",
            "configmap",
            "ConfigMap",
            true,
            &["cm"],
            none(),
        ),
        builtin("", "v1", "secrets", "secret", "Secret", true, &[], none()),
        builtin(
            "",
            "v1",
            "services",
            "service",
            "Service",
            true,
            &["svc"],
            status(),
        ),
        builtin(
            "",
            "v1",
            "serviceaccounts",
            "serviceaccount",
            "ServiceAccount",
            true,
            &["sa"],
            Subresources {
                token: true,
                ..Subresources::default()
            },
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "lease",
            "Lease",
            true,
            &[],
            none(),
        ),
        builtin(
            "events.k8s.io",
            "v1",
            "events",
            "event",
            "Event",
            true,
            &["ev"],
            none(),
        ),
        builtin(
            "apps",
            "v1",
            "statefulsets",
            "statefulset",
            "StatefulSet",
            true,
            &["sts"],
            Subresources {
                status: true,
                scale: Some(ScalePaths {
                    spec_replicas: ".spec.replicas".into(),
                    status_replicas: ".status.replicas".into(),
                    label_selector: None,
                }),
                ..Subresources::default()
            },
        ),
        builtin(
            "apps",
            "v1",
            "deployments",
            "deployment",
            "Deployment",
            true,
            &["deploy"],
            Subresources {
                status: true,
                scale: Some(ScalePaths {
                    spec_replicas: ".spec.replicas".into(),
                    status_replicas: ".status.replicas".into(),
                    label_selector: None,
                }),
                ..Subresources::default()
            },
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "clusterrole",
            "ClusterRole",
            false,
            &[],
            none(),
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "clusterrolebinding",
            "ClusterRoleBinding",
            false,
            &[],
            none(),
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "role",
            "Role",
            true,
            &[],
            none(),
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "rolebinding",
            "RoleBinding",
            true,
            &[],
            none(),
        ),
        builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "poddisruptionbudget",
            "PodDisruptionBudget",
            true,
            &["pdb"],
            status(),
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "mutatingwebhookconfiguration",
            "MutatingWebhookConfiguration",
            false,
            &[],
            none(),
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "customresourcedefinition",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            status(),
        ),
        token_review,
        access_review,
    ]
}

/// A CRD that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CustomResourceDefinition: {0}")]
pub struct CrdError(pub String);

/// The type a CustomResourceDefinition (apiextensions.k8s.io/v1) defines.
pub fn type_from_crd(crd: &Value) -> Result<ResourceType, CrdError> {
    let spec = crd
        .get("spec")
        .ok_or_else(|| CrdError("spec is required".into()))?;
    let text = |value: Option<&Value>, what: &str| {
        value
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| CrdError(format!("{what} is required")))
    };
    let group = text(spec.get("group"), "spec.group")?;
    let names = spec
        .get("names")
        .ok_or_else(|| CrdError("spec.names is required".into()))?;
    let plural = text(names.get("plural"), "spec.names.plural")?;
    let kind = text(names.get("kind"), "spec.names.kind")?;
    let singular = names
        .get("singular")
        .and_then(Value::as_str)
        .map_or_else(|| kind.to_lowercase(), str::to_owned);
    let expected_name = format!("{plural}.{group}");
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name != expected_name {
        return Err(CrdError(format!(
            "metadata.name must be {expected_name:?}, not {name:?}"
        )));
    }
    let namespaced = match spec.get("scope").and_then(Value::as_str) {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        other => {
            return Err(CrdError(format!(
                "spec.scope must be Namespaced or Cluster, not {other:?}"
            )));
        }
    };
    let mut versions = Vec::new();
    let mut storage = Vec::new();
    let mut subresources = Subresources::default();
    for version in spec
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = text(version.get("name"), "spec.versions[].name")?;
        if version
            .get("served")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            versions.push(name.clone());
        }
        if version
            .get("storage")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            storage.push(name.clone());
        }
        if let Some(sub) = version.get("subresources") {
            subresources.status |= sub.get("status").is_some();
            if let Some(scale) = sub.get("scale") {
                subresources.scale = Some(ScalePaths {
                    spec_replicas: scale
                        .get("specReplicasPath")
                        .and_then(Value::as_str)
                        .unwrap_or(".spec.replicas")
                        .to_owned(),
                    status_replicas: scale
                        .get("statusReplicasPath")
                        .and_then(Value::as_str)
                        .unwrap_or(".status.replicas")
                        .to_owned(),
                    label_selector: scale
                        .get("labelSelectorPath")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                });
            }
        }
    }
    if storage.len() != 1 {
        return Err(CrdError(format!(
            "exactly one version must be the storage version, found {}",
            storage.len()
        )));
    }
    if versions.is_empty() {
        return Err(CrdError("at least one version must be served".into()));
    }
    // kube-apiserver prefers the highest-priority version: GA over beta over alpha.
    versions.sort_by_key(|version| std::cmp::Reverse(version_priority(version)));
    Ok(ResourceType {
        group,
        versions,
        storage_version: storage.remove(0),
        plural,
        singular,
        kind,
        namespaced,
        short_names: names
            .get("shortNames")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        subresources,
        create_only: false,
    })
}

/// Kubernetes' version ordering: v2 > v1 > v1beta2 > v1beta1 > v1alpha1 > anything else.
fn version_priority(version: &str) -> (u8, u32, u32) {
    let Some(rest) = version.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let Ok(major) = digits.parse::<u32>() else {
        return (0, 0, 0);
    };
    let tail = &rest[digits.len()..];
    let minor = |prefix: &str| {
        tail.strip_prefix(prefix)
            .and_then(|n| n.parse::<u32>().ok())
    };
    if tail.is_empty() {
        (3, major, 0)
    } else if let Some(n) = minor("beta") {
        (2, major, n)
    } else if let Some(n) = minor("alpha") {
        (1, major, n)
    } else {
        (0, 0, 0)
    }
}

/// The served types, indexed for routing and discovery.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    types: BTreeMap<TypeKey, ResourceType>,
}

impl Registry {
    /// The built-in types.
    pub fn new() -> Self {
        let mut registry = Self::default();
        for t in builtin_types() {
            registry.types.insert(t.key(), t);
        }
        registry
    }

    /// Adds or replaces a type.
    pub fn insert(&mut self, resource: ResourceType) {
        self.types.insert(resource.key(), resource);
    }

    /// Removes a type.
    pub fn remove(&mut self, key: &TypeKey) {
        self.types.remove(key);
    }

    /// The type served at `group/version` under `plural`.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .get(&TypeKey {
                group: group.into(),
                plural: plural.into(),
            })
            .filter(|t| t.versions.iter().any(|v| v == version))
    }

    /// The type with this key.
    pub fn get(&self, key: &TypeKey) -> Option<&ResourceType> {
        self.types.get(key)
    }

    /// The type of a kind in a group.
    pub fn by_kind(&self, group: &str, kind: &str) -> Option<&ResourceType> {
        self.types
            .values()
            .find(|t| t.group == group && t.kind == kind)
    }

    /// `/api`.
    pub fn core_versions(&self) -> Value {
        json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})
    }

    fn groups(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for t in self.types.values().filter(|t| !t.group.is_empty()) {
            let versions = groups.entry(t.group.as_str()).or_default();
            for version in &t.versions {
                if !versions.contains(&version.as_str()) {
                    versions.push(version);
                }
            }
        }
        for versions in groups.values_mut() {
            versions.sort_by_key(|version| std::cmp::Reverse(version_priority(version)));
        }
        groups
    }

    /// `/apis`.
    pub fn group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .into_iter()
            .map(|(group, versions)| {
                let versions: Vec<Value> = versions
                    .iter()
                    .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
                    .collect();
                json!({"name": group, "versions": versions, "preferredVersion": versions[0]})
            })
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `/apis/{group}`.
    pub fn group(&self, group: &str) -> Option<Value> {
        let versions = self.groups().remove(group)?;
        let versions: Vec<Value> = versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
            .collect();
        Some(
            json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions, "preferredVersion": versions[0]}),
        )
    }

    /// `/openapi/v3`: one entry per group-version.
    pub fn openapi_v3_root(&self) -> Value {
        let mut paths = serde_json::Map::new();
        let mut add = |group: &str, version: &str| {
            let path = if group.is_empty() {
                format!("api/{version}")
            } else {
                format!("apis/{group}/{version}")
            };
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash=standin")}),
            );
        };
        add("", "v1");
        for (group, versions) in self.groups() {
            for version in versions {
                add(group, version);
            }
        }
        json!({"paths": paths})
    }

    /// `/openapi/v3/...` of one group-version: the operations without schemas — enough for
    /// kubectl to see that every PATCH takes `fieldValidation`, so it validates on the server
    /// (which accepts every field) instead of needing schemas.
    pub fn openapi_v3(&self, group: &str, version: &str) -> Option<Value> {
        let mut paths = serde_json::Map::new();
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let parameter = json!([{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}}]);
        for t in self.types.values().filter(|t| {
            t.group == group && t.versions.iter().any(|v| v == version) && !t.create_only
        }) {
            let path = if t.namespaced {
                format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
            } else {
                format!("{prefix}/{}/{{name}}", t.plural)
            };
            let gvk = json!({"group": group, "version": version, "kind": t.kind});
            paths.insert(
                path,
                json!({"patch": {"x-kubernetes-group-version-kind": gvk, "parameters": parameter, "responses": {"200": {"description": "OK"}}}}),
            );
        }
        if paths.is_empty() {
            return None;
        }
        Some(
            json!({"openapi": "3.0.0", "info": {"title": "Kubernetes (API stand-in)", "version": "v1.33.0"}, "paths": paths, "components": {"schemas": {}}}),
        )
    }

    /// `/api/v1` or `/apis/{group}/{version}`.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let mut resources = Vec::new();
        for t in self
            .types
            .values()
            .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
        {
            resources.push(json!({
                "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
                "kind": t.kind, "verbs": t.verbs(), "shortNames": t.short_names,
            }));
            if t.subresources.status {
                resources.push(json!({"name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced, "kind": t.kind, "verbs": ["get", "patch", "update"]}));
            }
            if t.subresources.scale.is_some() {
                resources.push(json!({"name": format!("{}/scale", t.plural), "singularName": "", "namespaced": t.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
            }
            if t.subresources.eviction {
                resources.push(json!({"name": format!("{}/eviction", t.plural), "singularName": "", "namespaced": true, "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
            }
            if t.subresources.binding {
                resources.push(json!({"name": format!("{}/binding", t.plural), "singularName": "", "namespaced": true, "kind": "Binding", "verbs": ["create"]}));
            }
            if t.subresources.token {
                resources.push(json!({"name": format!("{}/token", t.plural), "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
            }
        }
        if resources.is_empty() {
            return None;
        }
        let group_version = if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        };
        Some(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector_crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "selectors.eci.aliyun.com"},
            "spec": {
                "group": "eci.aliyun.com", "scope": "Namespaced",
                "names": {"plural": "selectors", "singular": "selector", "kind": "Selector", "shortNames": ["sel"]},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false},
                    {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}}}
                ]
            }
        })
    }

    #[test]
    fn crd_becomes_a_served_type_with_the_preferred_version_first() {
        let t = type_from_crd(&selector_crd()).unwrap();
        assert_eq!(t.versions, vec!["v1", "v1beta1"]);
        assert_eq!(t.storage_version, "v1");
        assert!(t.namespaced && t.subresources.status);
        let mut registry = Registry::new();
        registry.insert(t);
        assert!(
            registry
                .lookup("eci.aliyun.com", "v1beta1", "selectors")
                .is_some()
        );
        assert!(
            registry
                .lookup("eci.aliyun.com", "v2", "selectors")
                .is_none()
        );
        let group = registry.group("eci.aliyun.com").unwrap();
        assert_eq!(group["preferredVersion"]["version"], "v1");
    }

    #[test]
    fn invalid_crds_are_rejected() {
        let mut crd = selector_crd();
        crd["metadata"]["name"] = json!("wrong");
        assert!(
            type_from_crd(&crd)
                .unwrap_err()
                .to_string()
                .contains("selectors.eci.aliyun.com")
        );
        let mut crd = selector_crd();
        crd["spec"]["versions"][0]["storage"] = json!(true);
        assert!(type_from_crd(&crd).is_err());
    }

    #[test]
    fn discovery_lists_subresources_with_their_groups() {
        let registry = Registry::new();
        let core = registry.resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"pods/eviction") && names.contains(&"nodes/status"));
        let eviction = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .unwrap();
        assert_eq!(eviction["group"], "policy");
        let groups = registry.group_list();
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "coordination.k8s.io")
        );
    }

    #[test]
    fn version_order() {
        let mut versions = vec!["v1alpha1", "v1beta1", "v1", "v2beta1", "v1beta2", "v2"];
        versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(
            versions,
            vec!["v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1"]
        );
    }
}
