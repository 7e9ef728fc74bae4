//! PersistentVolumeClaims: the PersistentVolume a claim is bound to becomes the ECI volume ACK
//! documents for its CSI driver — a cloud disk a `DiskVolume`, NAS an `NFSVolume`, OSS a
//! `FlexVolume` of the OSS driver — and an `nfs` PersistentVolume an `NFSVolume`. Any other
//! kind of PersistentVolume is rejected with its driver's name.

use std::collections::{BTreeMap, BTreeSet};

use eci_proto::v20180808::{DiskVolume, FlexVolume, NfsVolume, Volume};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume};

use super::{Rejection, reject};
use crate::quantity;

/// Alibaba Cloud's CSI driver for cloud disks (ReadWriteOnce: one group at a time).
pub const DISK_DRIVER: &str = "diskplugin.csi.alibabacloud.com";
/// Alibaba Cloud's CSI driver for NAS (NFS, shared).
pub const NAS_DRIVER: &str = "nasplugin.csi.alibabacloud.com";
/// Alibaba Cloud's CSI driver for OSS buckets (a FUSE mount).
pub const OSS_DRIVER: &str = "ossplugin.csi.alibabacloud.com";
/// The FlexVolume driver ECI mounts OSS buckets with.
pub const OSS_FLEX_DRIVER: &str = "alicloud/oss";
/// The file system a disk gets when its PersistentVolume names none (the disk driver's).
const DEFAULT_FS_TYPE: &str = "ext4";
/// Node-affinity keys a disk PersistentVolume names its zone with: the disk driver's own
/// topology key, the well-known one and that one's deprecated beta form.
const ZONE_KEYS: [&str; 3] = [
    "topology.diskplugin.csi.alibabacloud.com/zone",
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/zone",
];
/// The `volumeAttributes` key naming a disk's zone (the disk StorageClass's parameter).
const ZONE_ATTRIBUTE: &str = "zoneId";

/// The zones the cloud disk of `pv` can be in, as its required node affinity (`In` on a zone
/// key) and its `volumeAttributes.zoneId` say; `None` when `pv` is no cloud disk or names no
/// zone. A term of the node affinity without a zone expression allows any zone, so does the
/// whole affinity then: only what is sure to be out of reach is refused.
pub fn disk_zones(pv: &PersistentVolume) -> Option<BTreeSet<String>> {
    let spec = pv.spec.as_ref()?;
    let csi = spec.csi.as_ref().filter(|c| c.driver == DISK_DRIVER)?;
    let from_attribute = csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get(ZONE_ATTRIBUTE))
        .map(|z| z.trim())
        .filter(|z| !z.is_empty());
    let terms = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    let from_affinity = if terms.is_empty() {
        None
    } else {
        terms
            .iter()
            .map(term_zones)
            .try_fold(BTreeSet::new(), |mut all, zones| {
                all.extend(zones?);
                Some(all)
            })
    };
    match (from_affinity, from_attribute) {
        (None, None) => None,
        (Some(zones), None) => Some(zones),
        (None, Some(zone)) => Some(BTreeSet::from([zone.to_owned()])),
        (Some(zones), Some(zone)) => Some(zones.into_iter().filter(|z| z == zone).collect()),
    }
}

/// The zones one node-selector term allows (its zone `In` expressions, all of them), `None`
/// for any.
fn term_zones(term: &k8s_openapi::api::core::v1::NodeSelectorTerm) -> Option<BTreeSet<String>> {
    term.match_expressions
        .iter()
        .flatten()
        .filter(|e| ZONE_KEYS.contains(&e.key.as_str()) && e.operator == "In")
        .map(|e| {
            e.values
                .iter()
                .flatten()
                .map(|v| v.trim().to_owned())
                .collect::<BTreeSet<_>>()
        })
        .reduce(|kept, next| kept.intersection(&next).cloned().collect())
}

/// The zones the cloud disk of `pv` is in when a group in `zone` (the zone of the daemon's
/// vSwitches) cannot attach it; `None` when it can, or nothing says otherwise.
pub fn zone_conflict(pv: &PersistentVolume, zone: &str) -> Option<BTreeSet<String>> {
    disk_zones(pv).filter(|zones| !zones.contains(zone.trim()))
}

/// The ECI volume `name` for the PersistentVolume `pv` a claim is bound to; `read_only`: the
/// pod's volume asks for it. `at` names the pod's volume in a rejection.
pub(super) fn volume(
    name: &str,
    pv: &PersistentVolume,
    read_only: bool,
    at: &str,
) -> Result<Volume, Rejection> {
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let spec = pv.spec.as_ref();
    let mut eci = Volume {
        name: name.to_owned(),
        ..Volume::default()
    };
    if spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
        return Err(reject(
            at,
            format!(
                "PersistentVolume {pv_name:?} is a raw block device (volumeMode Block); ECI mounts only file systems"
            ),
        ));
    }
    if let Some(nfs) = spec.and_then(|s| s.nfs.as_ref()) {
        eci.r#type = "NFSVolume".into();
        eci.nfs_volume = Some(NfsVolume {
            server: nfs.server.clone(),
            path: nfs.path.clone(),
            read_only: read_only || nfs.read_only == Some(true),
        });
        return Ok(eci);
    }
    let Some(csi) = spec.and_then(|s| s.csi.as_ref()) else {
        return Err(reject(
            at,
            format!(
                "PersistentVolume {pv_name:?} is neither a CSI nor an nfs volume; ECI mounts only {DISK_DRIVER}, {NAS_DRIVER}, {OSS_DRIVER} and nfs PersistentVolumes"
            ),
        ));
    };
    let read_only = read_only || csi.read_only == Some(true);
    let attributes = csi.volume_attributes.clone().unwrap_or_default();
    match csi.driver.as_str() {
        DISK_DRIVER => {
            eci.r#type = "DiskVolume".into();
            eci.disk_volume = Some(disk(pv, csi, at)?);
        }
        NAS_DRIVER => {
            let server = attributes
                .get("server")
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    reject(
                        at,
                        format!("NAS PersistentVolume {pv_name:?} has no volumeAttributes.server"),
                    )
                })?;
            eci.r#type = "NFSVolume".into();
            eci.nfs_volume = Some(NfsVolume {
                server: server.clone(),
                path: attributes
                    .get("path")
                    .filter(|p| !p.is_empty())
                    .cloned()
                    .unwrap_or_else(|| "/".into()),
                read_only,
            });
        }
        OSS_DRIVER => {
            eci.r#type = "FlexVolume".into();
            eci.flex_volume = Some(oss(pv_name, csi, &attributes, at)?);
        }
        other => {
            return Err(reject(
                at,
                format!(
                    "PersistentVolume {pv_name:?} uses the CSI driver {other:?}, which ECI cannot mount; supported: {DISK_DRIVER}, {NAS_DRIVER}, {OSS_DRIVER} and nfs PersistentVolumes"
                ),
            ));
        }
    }
    Ok(eci)
}

/// A cloud disk: its id is the CSI volume handle; the size is the PersistentVolume's capacity
/// in whole GiB when it gives one.
fn disk(
    pv: &PersistentVolume,
    csi: &CSIPersistentVolumeSource,
    at: &str,
) -> Result<DiskVolume, Rejection> {
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    if csi.volume_handle.is_empty() {
        return Err(reject(
            at,
            format!("disk PersistentVolume {pv_name:?} has no csi.volumeHandle (the disk id)"),
        ));
    }
    let capacity = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"));
    let disk_size = match capacity {
        None => 0,
        Some(q) => {
            let bytes = quantity::parse(&q.0)
                .map_err(|e| reject(at, format!("PersistentVolume {pv_name:?} capacity: {e}")))?;
            // Whole GiB, rounded up: a disk is never smaller than its PersistentVolume says.
            let gib = quantity::gib(bytes).ceil();
            if gib > f64::from(i32::MAX) {
                return Err(reject(
                    at,
                    format!("PersistentVolume {pv_name:?} capacity {} is too large", q.0),
                ));
            }
            #[allow(clippy::cast_possible_truncation)] // bounded just above
            let gib = gib as i32;
            gib
        }
    };
    Ok(DiskVolume {
        disk_id: csi.volume_handle.clone(),
        fs_type: csi
            .fs_type
            .clone()
            .filter(|f| !f.is_empty())
            .unwrap_or_else(|| DEFAULT_FS_TYPE.into()),
        disk_size,
    })
}

/// An OSS bucket: ECI's OSS FlexVolume, its options the PersistentVolume's `volumeAttributes`
/// (`bucket`, `url`, `path`, `otherOpts`, …) as one JSON object.
fn oss(
    pv_name: &str,
    csi: &CSIPersistentVolumeSource,
    attributes: &BTreeMap<String, String>,
    at: &str,
) -> Result<FlexVolume, Rejection> {
    if csi.node_publish_secret_ref.is_some() {
        // The AccessKey would come from a Secret the daemon does not read; mounting without
        // it would fail inside the group, long after the pod was accepted.
        return Err(reject(
            at,
            format!(
                "OSS PersistentVolume {pv_name:?} takes its AccessKey from nodePublishSecretRef, which is not passed to ECI; give the group a RAM role (volumeAttributes ramRole and the pod's k8s.aliyun.com/eci-ram-role-name) instead"
            ),
        ));
    }
    if attributes.get("bucket").is_none_or(String::is_empty) {
        return Err(reject(
            at,
            format!("OSS PersistentVolume {pv_name:?} has no volumeAttributes.bucket"),
        ));
    }
    let options = serde_json::to_string(attributes).map_err(|e| reject(at, e.to_string()))?;
    Ok(FlexVolume {
        driver: OSS_FLEX_DRIVER.into(),
        fs_type: String::new(),
        options,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn disk(attributes: Value, affinity: Value) -> PersistentVolume {
        let mut spec = json!({"csi": {"driver": DISK_DRIVER, "volumeHandle": "d-1"}});
        spec["csi"]["volumeAttributes"] = attributes;
        if !affinity.is_null() {
            spec["nodeAffinity"]["required"]["nodeSelectorTerms"] = affinity;
        }
        serde_json::from_value(json!({"metadata": {"name": "pv"}, "spec": spec})).unwrap()
    }

    fn zone_in(key: &str, zones: &[&str]) -> Value {
        json!({"key": key, "operator": "In", "values": zones})
    }

    #[test]
    fn a_disk_is_refused_only_where_it_surely_cannot_be_attached() {
        const DRIVER_KEY: &str = "topology.diskplugin.csi.alibabacloud.com/zone";
        const WELL_KNOWN: &str = "topology.kubernetes.io/zone";
        let nas: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "nas"},
            "spec": {"csi": {"driver": NAS_DRIVER, "volumeHandle": "n", "volumeAttributes": {"server": "s", "zoneId": "b"}}}}))
        .unwrap();
        let cases: Vec<(&str, PersistentVolume, Option<&[&str]>)> = vec![
            (
                "no zone named: nothing to check",
                disk(json!({}), Value::Null),
                None,
            ),
            ("NAS is reached over the network from any zone", nas, None),
            (
                "the driver's topology key",
                disk(
                    json!({}),
                    json!([{"matchExpressions": [zone_in(DRIVER_KEY, &["b"])]}]),
                ),
                Some(&["b"]),
            ),
            (
                "the well-known key, several values",
                disk(
                    json!({}),
                    json!([{"matchExpressions": [zone_in(WELL_KNOWN, &["b", "c"])]}]),
                ),
                Some(&["b", "c"]),
            ),
            (
                "the beta key",
                disk(
                    json!({}),
                    json!([{"matchExpressions": [zone_in("failure-domain.beta.kubernetes.io/zone", &["b"])]}]),
                ),
                Some(&["b"]),
            ),
            (
                "terms are alternatives: their zones add up",
                disk(
                    json!({}),
                    json!([
                        {"matchExpressions": [zone_in(DRIVER_KEY, &["b"])]},
                        {"matchExpressions": [zone_in(WELL_KNOWN, &["c"])]},
                    ]),
                ),
                Some(&["b", "c"]),
            ),
            (
                "expressions of one term all hold: their zones intersect",
                disk(
                    json!({}),
                    json!([{"matchExpressions": [zone_in(DRIVER_KEY, &["b", "c"]), zone_in(WELL_KNOWN, &["c", "d"])]}]),
                ),
                Some(&["c"]),
            ),
            (
                "a term without a zone allows any",
                disk(
                    json!({}),
                    json!([
                        {"matchExpressions": [zone_in(DRIVER_KEY, &["b"])]},
                        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]},
                    ]),
                ),
                None,
            ),
            (
                "NotIn is not read as a zone",
                disk(
                    json!({}),
                    json!([{"matchExpressions": [{"key": WELL_KNOWN, "operator": "NotIn", "values": ["a"]}]}]),
                ),
                None,
            ),
            (
                "volumeAttributes.zoneId",
                disk(json!({"zoneId": " b "}), Value::Null),
                Some(&["b"]),
            ),
            (
                "zoneId narrows the affinity",
                disk(
                    json!({"zoneId": "c"}),
                    json!([{"matchExpressions": [zone_in(DRIVER_KEY, &["b", "c"])]}]),
                ),
                Some(&["c"]),
            ),
            (
                "zoneId outside the affinity: in no zone",
                disk(
                    json!({"zoneId": "d"}),
                    json!([{"matchExpressions": [zone_in(DRIVER_KEY, &["b"])]}]),
                ),
                Some(&[]),
            ),
        ];
        for (case, pv, want) in cases {
            let want: Option<BTreeSet<String>> =
                want.map(|zones| zones.iter().map(|z| (*z).to_owned()).collect());
            assert_eq!(disk_zones(&pv), want, "{case}");
            let served_elsewhere = want.clone().filter(|zones| !zones.contains("a"));
            assert_eq!(
                zone_conflict(&pv, "a"),
                served_elsewhere,
                "{case}, served from a"
            );
            if want.as_ref().is_some_and(|zones| zones.contains("b")) {
                assert_eq!(zone_conflict(&pv, "b"), None, "{case}, served from b");
            }
        }
    }
}
