//! PersistentVolumeClaims: the PersistentVolume a claim is bound to becomes the ECI volume ACK
//! documents for its CSI driver — a cloud disk a `DiskVolume`, NAS an `NFSVolume`, OSS a
//! `FlexVolume` of the OSS driver — and an `nfs` PersistentVolume an `NFSVolume`. Any other
//! kind of PersistentVolume is rejected with its driver's name.

use std::collections::BTreeMap;

use eci_proto::v20180808::{DiskVolume, FlexVolume, NfsVolume, Volume};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume};

use super::{Rejection, reject};
use crate::k8s::quantity;

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
