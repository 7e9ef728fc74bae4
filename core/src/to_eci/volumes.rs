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
use crate::refs::TokenSource;

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
pub fn downward_metadata(pod: &Pod) -> Option<u64> {
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
    if let Some(claim) = &volume.persistent_volume_claim {
        let pv = cx.claims.get(&claim.claim_name).ok_or_else(|| Rejection {
            field: at.clone(),
            reason: format!(
                "PersistentVolumeClaim {:?} is not bound to a PersistentVolume yet",
                claim.claim_name
            ),
            retryable: true,
            config_error_in: None,
        })?;
        return claims::volume(&volume.name, pv, claim.read_only == Some(true), &at);
    }
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
    } else if let Some(nfs) = &volume.nfs {
        eci.r#type = "NFSVolume".into();
        eci.nfs_volume = Some(NfsVolume {
            server: nfs.server.clone(),
            path: nfs.path.clone(),
            read_only: nfs.read_only.unwrap_or(false),
        });
    } else if let Some((files, default_mode)) = file_source(pod, volume, cx, &at)? {
        eci.r#type = "ConfigFileVolume".into();
        eci.config_file_volume = Some(encode(files, default_mode));
    } else {
        return Err(unsupported(volume, &at));
    }
    Ok(eci)
}

/// A file volume's files and its default mode.
type FileSource = (Vec<File>, Option<i32>);

/// The files of a configMap, secret, downwardAPI or projected volume, with its default mode
/// (`None` for the other kinds of volume).
fn file_source(
    pod: &Pod,
    volume: &k8s_openapi::api::core::v1::Volume,
    cx: &Context<'_>,
    at: &str,
) -> Result<Option<FileSource>, Rejection> {
    let files = if let Some(source) = &volume.config_map {
        let entries = config_map_entries(cx, &source.name);
        let files = keyed(
            ("ConfigMap", &source.name, entries),
            source.items.as_ref(),
            source.optional == Some(true),
            at,
        )?;
        (files, source.default_mode)
    } else if let Some(source) = &volume.secret {
        let name = source.secret_name.clone().unwrap_or_default();
        let entries = secret_entries(cx, &name);
        let files = keyed(
            ("Secret", &name, entries),
            source.items.as_ref(),
            source.optional == Some(true),
            at,
        )?;
        (files, source.default_mode)
    } else if let Some(source) = &volume.downward_api {
        let items = source.items.as_deref().unwrap_or_default();
        (downward_files(pod, items, cx, at)?, source.default_mode)
    } else if let Some(source) = &volume.projected {
        let mut files = Vec::new();
        for projection in source.sources.iter().flatten() {
            files.extend(projected_files(pod, projection, cx, at)?);
        }
        (files, source.default_mode)
    } else {
        return Ok(None);
    };
    Ok(Some(files))
}

/// The files of one source of a projected volume.
fn projected_files(
    pod: &Pod,
    projection: &k8s_openapi::api::core::v1::VolumeProjection,
    cx: &Context<'_>,
    at: &str,
) -> Result<Vec<File>, Rejection> {
    if let Some(map) = &projection.config_map {
        let entries = config_map_entries(cx, &map.name);
        keyed(
            ("ConfigMap", &map.name, entries),
            map.items.as_ref(),
            map.optional == Some(true),
            at,
        )
    } else if let Some(secret) = &projection.secret {
        let entries = secret_entries(cx, &secret.name);
        keyed(
            ("Secret", &secret.name, entries),
            secret.items.as_ref(),
            secret.optional == Some(true),
            at,
        )
    } else if let Some(downward) = &projection.downward_api {
        downward_files(pod, downward.items.as_deref().unwrap_or_default(), cx, at)
    } else if let Some(token) = &projection.service_account_token {
        let value = cx
            .service_account_tokens
            .get(&TokenSource::of(token))
            .ok_or_else(|| Rejection {
                field: at.to_owned(),
                reason: "a service account token was not issued yet".into(),
                retryable: true,
                config_error_in: None,
            })?;
        Ok(vec![File {
            path: token.path.clone(),
            content: value.expose().as_bytes().to_vec(),
            mode: None,
        }])
    } else {
        Err(reject(
            at,
            "projected volumes support configMap, secret, downwardAPI and serviceAccountToken sources",
        ))
    }
}

/// The files of a ConfigMap's or Secret's entries (`kind`, `name`, the entries when the object
/// exists): a missing object is no files when optional, a refusal naming it otherwise.
fn keyed(
    (kind, name, entries): (&str, &str, Option<BTreeMap<String, Vec<u8>>>),
    items: Option<&Vec<KeyToPath>>,
    optional: bool,
    at: &str,
) -> Result<Vec<File>, Rejection> {
    match entries {
        Some(entries) => keyed_files(&entries, items, optional, at, kind),
        None if optional => Ok(Vec::new()),
        None => Err(missing(at, kind, name)),
    }
}

/// A volume of a kind ECI cannot mount, named by its kind.
fn unsupported(volume: &k8s_openapi::api::core::v1::Volume, at: &str) -> Rejection {
    let kind = serde_json::to_value(volume)
        .ok()
        .and_then(|v| {
            v.as_object()
                .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        })
        .unwrap_or_else(|| "unknown".into());
    reject(
        at,
        format!(
            "{kind} volumes cannot run on ECI; supported: emptyDir, configMap, secret, downwardAPI, projected, nfs, persistentVolumeClaim"
        ),
    )
}
