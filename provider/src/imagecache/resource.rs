//! The `ImageCache` custom resource (`eci.alibabacloud.com/v1`, cluster-scoped), with
//! ack-virtual-node's schema so manifests written for ACK apply unchanged: the images to cache,
//! pull secrets as `namespace:secretName`, the cache size and its retention; the status the
//! reconciler writes (phase, progress, the ECI cache id, times, the cache's events).

// `KubeSchema` copies each struct, `pub` and all, into its schema function, where the lint
// cannot see it reached; the types themselves are public.
#![allow(unreachable_pub)]

use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

/// What to cache.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "eci.alibabacloud.com",
    version = "v1",
    kind = "ImageCache",
    plural = "imagecaches",
    shortname = "ic",
    status = "ImageCacheStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Cache","type":"string","jsonPath":".status.imageCacheId"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ImageCacheSpec {
    /// The images to cache (at least one).
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 1024)))]
    pub images: Vec<String>,
    /// Secrets to pull them with, each `namespace:secretName` (a dockerconfigjson Secret).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 317)))]
    #[x_kube(validation = kube::core::Rule::new("self.all(s, s.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?:[a-z0-9]([-.a-z0-9]*[a-z0-9])?$'))").message("imagePullSecrets: each entry is namespace:secretName"))]
    pub image_pull_secrets: Vec<String>,
    /// GiB, 20 to 32768 (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 20, max = 32768), extend("format" = "int32"))]
    pub image_cache_size: Option<i32>,
    /// Days the cache is kept, 1 to 65536; unset: it never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536), extend("format" = "int32"))]
    pub retention_days: Option<i32>,
}

/// What the reconciler observed of the ECI image cache.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageCacheStatus {
    /// The cache's ECI status (`Creating`, `Ready`, `Failed`, `Updating`, `UpdateFailed`), or
    /// `Pending` before it is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// How far the build is (`100%` when Ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The ECI image cache id (`imc-…`), the `k8s.aliyun.com/eci-imc-id` pods may name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_cache_id: Option<String>,
    /// When the cache was created (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// When this status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated_time: Option<String>,
    /// When the cache expires: the end of its retention, or a day after a failed build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_date_time: Option<String>,
    /// The generation of the spec the cache was built from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The cache's events as ECI reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ImageCacheEvent>,
}

/// One event of the ECI image cache.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageCacheEvent {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short reason.
    pub reason: String,
    /// Details.
    pub message: String,
    /// How often it happened.
    #[serde(default)]
    #[schemars(extend("format" = "int32"))]
    pub count: i32,
    /// First occurrence (RFC 3339).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub first_timestamp: String,
    /// Last occurrence (RFC 3339).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_timestamp: String,
}

/// The CRD as applied.
pub fn crd_json() -> serde_json::Value {
    serde_json::to_value(ImageCache::crd()).unwrap_or_default()
}

/// The committed CRD file: generated from these types, checked by a test.
pub const CRD_FILE: &str = "deploy/base/imagecache-crd.yaml";

/// The chart's copy of it.
pub const CHART_CRD_FILE: &str =
    "charts/virtual-node-eci/crds/imagecaches.eci.alibabacloud.com.yaml";

#[cfg(test)]
mod tests {
    use super::*;

    fn generated() -> String {
        format!(
            "# Generated from provider/src/imagecache/resource.rs — do not edit.\n# Regenerate: UPDATE_GENERATED=1 cargo test -p virtual-node-eci --lib imagecache::resource\n{}",
            serde_saphyr::to_string(&crd_json()).unwrap()
        )
    }

    #[test]
    fn the_committed_crds_are_the_generated_one() {
        for file in [CRD_FILE, CHART_CRD_FILE] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(file);
            if std::env::var_os("UPDATE_GENERATED").is_some() {
                std::fs::write(&path, generated()).unwrap();
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == generated(),
                "{file} differs from the Rust types; regenerate it with UPDATE_GENERATED=1 cargo test -p virtual-node-eci --lib imagecache::resource"
            );
            let parsed: serde_json::Value = serde_saphyr::from_str(&committed).unwrap();
            assert_eq!(parsed, crd_json(), "the YAML reads back as the CRD");
        }
    }

    #[test]
    fn the_crd_is_ack_s_cluster_scoped_v1_with_status() {
        let crd = ImageCache::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("imagecaches.eci.alibabacloud.com")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["ic".to_owned()]));
        let version = &crd.spec.versions[0];
        assert_eq!(
            (version.name.as_str(), version.served, version.storage),
            ("v1", true, true)
        );
        assert!(version.subresources.as_ref().unwrap().status.is_some());
        let schema = serde_json::to_value(&version.schema).unwrap();
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["images"]));
        let size = &spec["properties"]["imageCacheSize"];
        assert_eq!(
            (size["minimum"].as_f64(), size["maximum"].as_f64()),
            (Some(20.0), Some(32768.0))
        );
        let retention = &spec["properties"]["retentionDays"];
        assert_eq!(
            (retention["minimum"].as_f64(), retention["maximum"].as_f64()),
            (Some(1.0), Some(65536.0))
        );
    }

    #[test]
    fn an_ack_manifest_reads() {
        let text = "apiVersion: eci.alibabacloud.com/v1\nkind: ImageCache\nmetadata:\n  name: nginx\nspec:\n  images:\n  - nginx:1.25\n  imagePullSecrets:\n  - default:pull\n  imageCacheSize: 25\n  retentionDays: 7\n";
        let cache: ImageCache = serde_saphyr::from_str(text).unwrap();
        assert_eq!(cache.spec.images, ["nginx:1.25"]);
        assert_eq!(cache.spec.image_pull_secrets, ["default:pull"]);
        assert_eq!(
            (cache.spec.image_cache_size, cache.spec.retention_days),
            (Some(25), Some(7))
        );
    }
}
