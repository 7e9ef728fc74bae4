//! Volumes: emptyDir, configMap, secret, downwardAPI and projected become ECI volumes (the last
//! four as `ConfigFileVolume`s with their files inlined), nfs stays nfs, a PersistentVolumeClaim
//! becomes its PersistentVolume's ECI volume ([`claims`]); anything else is rejected with its
//! name.

use std::collections::BTreeMap;

use base64::Engine as _;
use eci_proto::v20180808::{ConfigFileToPath, ConfigFileVolume, EmptyDirVolume, NfsVolume, Volume};
use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod};

use super::claims;
use super::downward::{self, FieldValue};
use super::{Context, Rejection, missing, reject};
use crate::pods::refs::TokenSource;

struct File {
    path: String,
    content: Vec<u8>,
    mode: Option<i32>,
}

fn encode(files: Vec<File>, default_mode: Option<i32>) -> ConfigFileVolume {
    ConfigFileVolume {
        config_file_to_path: files
            .into_iter()
            .map(|f| ConfigFileToPath {
                path: f.path,
                content: base64::engine::general_purpose::STANDARD.encode(f.content),
                mode: f.mode,
            })
            .collect(),
        default_mode,
    }
}

/// Files of a ConfigMap or Secret's `entries`, selected by `items` when given.
fn keyed_files(
    entries: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    optional: bool,
    at: &str,
    what: &str,
) -> Result<Vec<File>, Rejection> {
    match items {
        None => Ok(entries
            .iter()
            .map(|(k, v)| File {
                path: k.clone(),
                content: v.clone(),
                mode: None,
            })
            .collect()),
        Some(items) => {
            let mut files = Vec::new();
            for item in items {
                match entries.get(&item.key) {
                    Some(content) => files.push(File {
                        path: item.path.clone(),
                        content: content.clone(),
                        mode: item.mode,
                    }),
                    None if optional => {}
                    None => return Err(missing(at, &format!("key in {what}"), &item.key)),
                }
            }
            Ok(files)
        }
    }
}

fn config_map_entries(cx: &Context<'_>, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    cx.config_maps.get(name).map(|map| {
        let mut entries: BTreeMap<String, Vec<u8>> = map
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        entries.extend(
            map.binary_data
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0)),
        );
        entries
    })
}

fn secret_entries(cx: &Context<'_>, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    cx.secrets.get(name).map(|secret| {
        secret
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect()
    })
}

fn downward_files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    cx: &Context<'_>,
    at: &str,
) -> Result<Vec<File>, Rejection> {
    let mut files = Vec::new();
    for item in items {
        let content = if let Some(selector) = &item.field_ref {
            match downward::field(pod, selector, cx.node_name, at, true)? {
                FieldValue::Literal(value) => value,
                FieldValue::Eci(path) => {
                    return Err(reject(
                        at,
                        format!(
                            "{path} is only available as an environment variable on ECI, not as a downwardAPI file"
                        ),
                    ));
                }
            }
        } else if let Some(selector) = &item.resource_field_ref {
            let name = selector.container_name.as_deref().unwrap_or_default();
            let container = pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .find(|c| c.name == name)
                .ok_or_else(|| {
                    reject(
                        at,
                        format!(
                            "resourceFieldRef names container {name:?}, which the pod does not have"
                        ),
                    )
                })?;
            downward::resource(container, selector, cx.default_spec, at)?
        } else {
            return Err(reject(
                at,
                "a downwardAPI item needs fieldRef or resourceFieldRef",
            ));
        };
        files.push(File {
            path: item.path.clone(),
            content: content.into_bytes(),
            mode: item.mode,
        });
    }
    Ok(files)
}

/// The pod's volumes as ECI volumes.
pub(super) fn volumes(pod: &Pod, cx: &Context<'_>) -> Result<Vec<Volume>, Rejection> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .enumerate()
        .map(|(index, volume)| translate(pod, index, volume, cx))
        .collect()
}

/// A `persistentVolumeClaim` volume marked `readOnly` is mounted read-only everywhere, as the
/// kubelet does: ECI's disk and OSS volumes have no read-only switch of their own.
pub(super) fn mount_read_only_claims(
    pod: &Pod,
    request: &mut eci_proto::v20180808::CreateContainerGroupRequest,
) {
    let read_only: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| v.persistent_volume_claim.as_ref().and_then(|c| c.read_only) == Some(true))
        .map(|v| v.name.as_str())
        .collect();
    if read_only.is_empty() {
        return;
    }
    for mount in request
        .container
        .iter_mut()
        .chain(request.init_container.iter_mut())
        .flat_map(|c| c.volume_mount.iter_mut())
    {
        if read_only.contains(&mount.name.as_str()) {
            mount.read_only = true;
        }
    }
}

/// Whether a pod volume carries a service account token (a projected one with a
/// `serviceAccountToken` source).
pub(crate) fn has_token(volume: &k8s_openapi::api::core::v1::Volume) -> bool {
    volume
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
        .any(|source| source.service_account_token.is_some())
}

/// Only the volumes that carry service account tokens, as ECI volumes: what a token refresh
/// sends to the running group.
pub(super) fn token_volumes(pod: &Pod, cx: &Context<'_>) -> Result<Vec<Volume>, Rejection> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .enumerate()
        .filter(|(_, volume)| has_token(volume))
        .map(|(index, volume)| translate(pod, index, volume, cx))
        .collect()
}

/// Whether a pod volume is files the running group is given from API objects (`configMap`,
/// `secret`, `projected`, `downwardAPI`): what the kubelet keeps current while the pod runs.
fn has_files(volume: &k8s_openapi::api::core::v1::Volume) -> bool {
    volume.config_map.is_some()
        || volume.secret.is_some()
        || volume.projected.is_some()
        || volume.downward_api.is_some()
}

/// A fingerprint of the labels and annotations the pod's `downwardAPI` files show (plain or
/// projected); `None` when no file shows them. A pod whose fingerprint moved while it runs gets
/// its file volumes pushed again, as the kubelet rewrites such files.
pub(crate) fn downward_metadata(pod: &Pod) -> Option<u64> {
    use std::hash::{Hash as _, Hasher as _};
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    let plain = volumes
        .clone()
        .filter_map(|v| v.downward_api.as_ref())
        .flat_map(|d| d.items.iter().flatten());
    let projected = volumes
        .flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()))
        .filter_map(|source| source.downward_api.as_ref())
        .flat_map(|d| d.items.iter().flatten());
    let shows_maps = plain
        .chain(projected)
        .filter_map(|item| item.field_ref.as_ref())
        .any(|field| {
            field.field_path.starts_with("metadata.labels")
                || field.field_path.starts_with("metadata.annotations")
        });
    if !shows_maps {
        return None;
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    pod.metadata.labels.hash(&mut hasher);
    pod.metadata.annotations.hash(&mut hasher);
    Some(hasher.finish())
}

/// The file volumes as ECI volumes, as they should be now: what a push of changed contents
/// sends to the running group.
pub(super) fn file_volumes(pod: &Pod, cx: &Context<'_>) -> Result<Vec<Volume>, Rejection> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .enumerate()
        .filter(|(_, volume)| has_files(volume))
        .map(|(index, volume)| translate(pod, index, volume, cx))
        .collect()
}

/// One pod volume as an ECI volume.
fn translate(
    pod: &Pod,
    index: usize,
    volume: &k8s_openapi::api::core::v1::Volume,
    cx: &Context<'_>,
) -> Result<Volume, Rejection> {
    let at = format!("spec.volumes[{index}] ({})", volume.name);
    let mut eci = Volume {
        name: volume.name.clone(),
        ..Volume::default()
    };
    if let Some(empty) = &volume.empty_dir {
        eci.r#type = "EmptyDirVolume".into();
        eci.empty_dir_volume = Some(EmptyDirVolume {
            medium: empty.medium.clone().unwrap_or_default(),
            size_limit: empty
                .size_limit
                .as_ref()
                .map(|q| q.0.clone())
                .unwrap_or_default(),
        });
    } else if let Some(source) = &volume.config_map {
        let optional = source.optional == Some(true);
        let files = match config_map_entries(cx, &source.name) {
            Some(entries) => {
                keyed_files(&entries, source.items.as_ref(), optional, &at, "ConfigMap")?
            }
            None if optional => Vec::new(),
            None => return Err(missing(&at, "ConfigMap", &source.name)),
        };
        eci.r#type = "ConfigFileVolume".into();
        eci.config_file_volume = Some(encode(files, source.default_mode));
    } else if let Some(source) = &volume.secret {
        let name = source.secret_name.clone().unwrap_or_default();
        let optional = source.optional == Some(true);
        let files = match secret_entries(cx, &name) {
            Some(entries) => keyed_files(&entries, source.items.as_ref(), optional, &at, "Secret")?,
            None if optional => Vec::new(),
            None => return Err(missing(&at, "Secret", &name)),
        };
        eci.r#type = "ConfigFileVolume".into();
        eci.config_file_volume = Some(encode(files, source.default_mode));
    } else if let Some(source) = &volume.downward_api {
        eci.r#type = "ConfigFileVolume".into();
        eci.config_file_volume = Some(encode(
            downward_files(pod, source.items.as_deref().unwrap_or_default(), cx, &at)?,
            source.default_mode,
        ));
    } else if let Some(source) = &volume.projected {
        let mut files = Vec::new();
        for projection in source.sources.iter().flatten() {
            if let Some(map) = &projection.config_map {
                let optional = map.optional == Some(true);
                match config_map_entries(cx, &map.name) {
                    Some(entries) => files.extend(keyed_files(
                        &entries,
                        map.items.as_ref(),
                        optional,
                        &at,
                        "ConfigMap",
                    )?),
                    None if optional => {}
                    None => return Err(missing(&at, "ConfigMap", &map.name)),
                }
            } else if let Some(secret) = &projection.secret {
                let optional = secret.optional == Some(true);
                match secret_entries(cx, &secret.name) {
                    Some(entries) => files.extend(keyed_files(
                        &entries,
                        secret.items.as_ref(),
                        optional,
                        &at,
                        "Secret",
                    )?),
                    None if optional => {}
                    None => return Err(missing(&at, "Secret", &secret.name)),
                }
            } else if let Some(downward) = &projection.downward_api {
                files.extend(downward_files(
                    pod,
                    downward.items.as_deref().unwrap_or_default(),
                    cx,
                    &at,
                )?);
            } else if let Some(token) = &projection.service_account_token {
                let value = cx
                    .service_account_tokens
                    .get(&TokenSource::of(token))
                    .ok_or_else(|| Rejection {
                        field: at.clone(),
                        reason: "a service account token was not issued yet".into(),
                        retryable: true,
                    })?;
                files.push(File {
                    path: token.path.clone(),
                    content: value.expose().as_bytes().to_vec(),
                    mode: None,
                });
            } else {
                return Err(reject(
                    &at,
                    "projected volumes support configMap, secret, downwardAPI and serviceAccountToken sources",
                ));
            }
        }
        eci.r#type = "ConfigFileVolume".into();
        eci.config_file_volume = Some(encode(files, source.default_mode));
    } else if let Some(claim) = &volume.persistent_volume_claim {
        let pv = cx.claims.get(&claim.claim_name).ok_or_else(|| Rejection {
            field: at.clone(),
            reason: format!(
                "PersistentVolumeClaim {:?} is not bound to a PersistentVolume yet",
                claim.claim_name
            ),
            retryable: true,
        })?;
        return claims::volume(&volume.name, pv, claim.read_only == Some(true), &at);
    } else if let Some(nfs) = &volume.nfs {
        eci.r#type = "NFSVolume".into();
        eci.nfs_volume = Some(NfsVolume {
            server: nfs.server.clone(),
            path: nfs.path.clone(),
            read_only: nfs.read_only.unwrap_or(false),
        });
    } else {
        let kind = serde_json::to_value(volume)
            .ok()
            .and_then(|v| {
                v.as_object()
                    .and_then(|o| o.keys().find(|k| *k != "name").cloned())
            })
            .unwrap_or_else(|| "unknown".into());
        return Err(reject(
            &at,
            format!(
                "{kind} volumes cannot run on ECI; supported: emptyDir, configMap, secret, downwardAPI, projected, nfs, persistentVolumeClaim"
            ),
        ));
    }
    Ok(eci)
}
