//! Pods as this daemon reads them in bulk (its node's watch, its status applies' answers):
//! whole, except the managed fields. Of those the daemon reads only which annotations its own
//! writes own (after a restart), so only its own entries are kept, with only their metadata
//! field set; every other field set would be decoded into a tree of JSON values for nothing,
//! and that was most of the CPU a pod's decoding took (docs/performance.md).
//!
//! The decoding mirrors k8s-openapi's `ObjectMeta` field by field (its own deserializer has no
//! way to skip a field); the tests hold it to k8s-openapi's for every field but that one.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
};
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

use super::FIELD_MANAGER;

/// A pod whose managed fields hold only this daemon's entries.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadPod(pub Pod);

impl From<ReadPod> for Pod {
    fn from(read: ReadPod) -> Self {
        read.0
    }
}

impl kube::Resource for ReadPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl<'de> Deserialize<'de> for ReadPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Shape {
            #[serde(default)]
            metadata: Option<Meta>,
            #[serde(default)]
            spec: Option<PodSpec>,
            #[serde(default)]
            status: Option<PodStatus>,
        }
        let shape = Shape::deserialize(deserializer)?;
        Ok(Self(Pod {
            metadata: shape.metadata.map(ObjectMeta::from).unwrap_or_default(),
            spec: shape.spec,
            status: shape.status,
        }))
    }
}

/// `ObjectMeta` as the apiserver writes it, other managers' entries skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "own_entries")]
    managed_fields: Option<Vec<ManagedFieldsEntry>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    self_link: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

impl From<Meta> for ObjectMeta {
    fn from(meta: Meta) -> Self {
        Self {
            annotations: meta.annotations,
            creation_timestamp: meta.creation_timestamp,
            deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
            deletion_timestamp: meta.deletion_timestamp,
            finalizers: meta.finalizers,
            generate_name: meta.generate_name,
            generation: meta.generation,
            labels: meta.labels,
            managed_fields: meta.managed_fields,
            name: meta.name,
            namespace: meta.namespace,
            owner_references: meta.owner_references,
            resource_version: meta.resource_version,
            self_link: meta.self_link,
            uid: meta.uid,
        }
    }
}

fn own_entries<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<ManagedFieldsEntry>>, D::Error> {
    let entries: Option<Vec<OwnEntry>> = Option::deserialize(deserializer)?;
    Ok(entries.map(|entries| entries.into_iter().filter_map(|entry| entry.0).collect()))
}

/// One managed-fields entry, kept only if it is this daemon's.
struct OwnEntry(Option<ManagedFieldsEntry>);

fn ours(entry: &ManagedFieldsEntry) -> bool {
    entry.manager.as_deref() == Some(FIELD_MANAGER)
}

impl<'de> Deserialize<'de> for OwnEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(field_identifier, rename_all = "camelCase")]
        enum Field {
            Manager,
            Operation,
            ApiVersion,
            Time,
            FieldsType,
            FieldsV1,
            Subresource,
            #[serde(other)]
            Other,
        }

        struct EntryVisitor;

        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = OwnEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a managed fields entry")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OwnEntry, A::Error> {
                let mut entry = ManagedFieldsEntry::default();
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::Manager => entry.manager = map.next_value()?,
                        Field::Operation => entry.operation = map.next_value()?,
                        Field::ApiVersion => entry.api_version = map.next_value()?,
                        Field::Time => entry.time = map.next_value()?,
                        Field::FieldsType => entry.fields_type = map.next_value()?,
                        Field::Subresource => entry.subresource = map.next_value()?,
                        // The apiserver writes `manager` first; an entry that names it later
                        // is read and judged at its end.
                        Field::FieldsV1 if entry.manager.is_none() || ours(&entry) => {
                            let fields: Option<MetadataFields> = map.next_value()?;
                            entry.fields_v1 = fields.map(|fields| fields.0);
                        }
                        Field::FieldsV1 | Field::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(OwnEntry(ours(&entry).then_some(entry)))
            }
        }

        deserializer.deserialize_map(EntryVisitor)
    }
}

/// A field set with only its `f:metadata` part: which labels and annotations the entry owns,
/// all the daemon reads of its own entries (its status field set is the larger part).
struct MetadataFields(FieldsV1);

impl<'de> Deserialize<'de> for MetadataFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SetVisitor;

        impl<'de> Visitor<'de> for SetVisitor {
            type Value = MetadataFields;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field set")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MetadataFields, A::Error> {
                let mut kept = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == METADATA {
                        kept.insert(key, map.next_value()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(MetadataFields(FieldsV1(serde_json::Value::Object(kept))))
            }
        }

        deserializer.deserialize_map(SetVisitor)
    }
}

/// The metadata part of a field set.
const METADATA: &str = "f:metadata";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A pod as the apiserver returns it: two managers' entries, ours second.
    fn served() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-0", "namespace": "team-a", "uid": "u-1",
                "resourceVersion": "42", "generation": 2, "generateName": "web-",
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "deletionTimestamp": "2026-12-01T10:05:00Z",
                "deletionGracePeriodSeconds": 30,
                "labels": {"app": "web"},
                "annotations": {"k8s.aliyun.com/eci-instance-id": "eci-1", "note": "x"},
                "finalizers": ["example.com/keep"],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": "web", "uid": "s-1", "controller": true}],
                "selfLink": "/api/v1/namespaces/team-a/pods/web-0",
                "managedFields": [
                    {"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                     "time": "2026-12-01T10:00:00Z", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}}}}}},
                    {"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": "v1",
                     "time": "2026-12-01T10:01:00Z", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:annotations": {"f:k8s.aliyun.com/eci-instance-id": {}}},
                                  "f:status": {"f:phase": {}, "f:podIP": {}}},
                     "subresource": "status"}
                ]
            },
            "spec": {"nodeName": "virtual-node-eci-0",
                     "containers": [{"name": "c", "image": "nginx", "env": [{"name": "A", "value": "1"}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        })
    }

    /// k8s-openapi's own decoding, other managers' entries and the non-metadata part of ours
    /// removed afterwards.
    fn reference(value: serde_json::Value) -> Pod {
        let mut pod: Pod = serde_json::from_value(value).unwrap();
        if let Some(entries) = pod.metadata.managed_fields.as_mut() {
            entries.retain(ours);
            for fields in entries.iter_mut().filter_map(|e| e.fields_v1.as_mut()) {
                if let Some(set) = fields.0.as_object_mut() {
                    set.retain(|key, _| key == METADATA);
                }
            }
        }
        pod
    }

    fn read(value: &serde_json::Value) -> Pod {
        let text = serde_json::to_string(value).unwrap();
        serde_json::from_str::<ReadPod>(&text).unwrap().into()
    }

    #[test]
    fn a_read_pod_is_k8s_openapis_pod_without_other_managers_entries() {
        let pod = read(&served());
        assert_eq!(pod, reference(served()));
        let entries = pod.metadata.managed_fields.as_deref().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].subresource.as_deref(), Some("status"));
        let owned = &entries[0].fields_v1.as_ref().unwrap().0;
        assert!(
            owned
                .pointer("/f:metadata/f:annotations/f:k8s.aliyun.com~1eci-instance-id")
                .is_some()
        );
        assert_eq!(owned.pointer("/f:status"), None);
    }

    #[test]
    fn an_entry_naming_its_manager_after_its_fields_is_judged_at_its_end() {
        let mut value = served();
        value["metadata"]["managedFields"] = json!([
            {"fieldsV1": {"f:status": {}}, "manager": FIELD_MANAGER, "operation": "Apply"},
            {"fieldsV1": {"f:spec": {}}, "manager": "kubectl", "operation": "Update"},
            {"operation": "Update", "fieldsV1": {"f:spec": {}}}
        ]);
        let pod = read(&value);
        assert_eq!(pod, reference(value));
        assert_eq!(pod.metadata.managed_fields.map(|e| e.len()), Some(1));
    }

    #[test]
    fn missing_and_null_fields_read_as_k8s_openapi_reads_them() {
        for value in [
            json!({"metadata": {"name": "p"}}),
            json!({"metadata": {"name": "p", "labels": null, "managedFields": null}, "spec": null}),
            json!({"metadata": {"managedFields": []}, "status": {}}),
            json!({}),
        ] {
            assert_eq!(read(&value), reference(value.clone()), "{value}");
        }
    }

    #[test]
    fn a_pod_that_does_not_decode_is_an_error_not_a_guess() {
        for text in [
            r#"{"metadata": {"managedFields": [{"manager": 7}]}}"#,
            r#"{"metadata": {"generation": "two"}}"#,
            r#"{"metadata": "web-0"}"#,
            r#"{"spec": {"containers": 3}}"#,
        ] {
            assert!(serde_json::from_str::<ReadPod>(text).is_err(), "{text}");
        }
    }
}
