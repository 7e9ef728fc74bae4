//! Pod volumes, materialised under `<pod dir>/volumes/<name>` and bind-mounted by
//! [`super::process`]: `emptyDir` (a directory; `medium: Memory` too), `hostPath`, `secret`,
//! `configMap`, `downwardAPI` and `projected` (service account tokens from the TokenRequest
//! API bound to the pod, refreshed at 80 % of their lifetime; ConfigMaps, Secrets, downward API).
//! Files are replaced atomically (write, then rename), so a directory mount sees new contents;
//! a `subPath` mount keeps the file it started with, as with the kubelet. Ownership and
//! `fsGroup`/`runAsUser` are ignored (everything runs as root); other volume types are refused.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Secret, ServiceAccount, Volume, VolumeProjection,
};
use kube::api::{Api, PostParams};

use super::env::{self, EnvError, FieldContext};
use vne_core::refs::{DEFAULT_TOKEN_SECONDS, TokenSource};

/// A volume could not be materialised; the pod waits in `ContainerCreating` and it is retried.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// Reading a ConfigMap or Secret failed.
    #[error("volume {volume}: read {kind} {name}: {source}")]
    Api {
        /// The volume.
        volume: String,
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A ConfigMap or Secret does not exist and the volume is not optional.
    #[error("volume {volume}: {kind} \"{name}\" not found")]
    NotFound {
        /// The volume.
        volume: String,
        /// `configmap` or `secret`.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// An item names a missing key and the volume is not optional.
    #[error("volume {volume}: {kind} {name} has no key {key}")]
    KeyNotFound {
        /// The volume.
        volume: String,
        /// `configmap` or `secret`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The key.
        key: String,
    },
    /// The volume type is not supported by the host agent.
    #[error(
        "volume {volume}: unsupported volume type (the host agent has emptyDir, hostPath, secret, configMap, downwardAPI, projected)"
    )]
    Unsupported {
        /// The volume.
        volume: String,
    },
    /// An item path is absolute or leaves the volume.
    #[error("volume {volume}: invalid path {path:?}")]
    InvalidPath {
        /// The volume.
        volume: String,
        /// The path.
        path: String,
    },
    /// A downward API item failed.
    #[error("volume {volume}: {source}")]
    Field {
        /// The volume.
        volume: String,
        /// The error.
        #[source]
        source: EnvError,
    },
    /// The TokenRequest failed.
    #[error("volume {volume}: request a token for service account {service_account}: {source}")]
    Token {
        /// The volume.
        volume: String,
        /// The service account.
        service_account: String,
        /// The error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Writing the files failed.
    #[error("write {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Default file mode (0644) of secret, configMap, downwardAPI and projected volumes.
const DEFAULT_MODE: i32 = 0o644;

/// Where a volume is on the host, and whether the kubelet mounts it read-only anyway.
pub(crate) fn source(pod_volumes_dir: &Path, volume: &Volume) -> (PathBuf, bool) {
    if let Some(host) = &volume.host_path {
        return (PathBuf::from(&host.path), false);
    }
    let read_only = volume.secret.is_some()
        || volume.config_map.is_some()
        || volume.downward_api.is_some()
        || volume.projected.is_some();
    (pod_volumes_dir.join(&volume.name), read_only)
}

#[derive(Debug, Clone)]
struct CachedToken {
    token: String,
    refresh_at: Instant,
}

/// A pod's volumes: what was written (to remove what disappears) and the tokens in use.
#[derive(Debug)]
pub(crate) struct Volumes {
    dir: PathBuf,
    written: HashMap<String, BTreeSet<PathBuf>>,
    tokens: HashMap<(String, String), CachedToken>,
}

/// One file of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
struct VolumeFile {
    path: String,
    data: Vec<u8>,
    mode: i32,
}

impl Volumes {
    /// Volumes under `dir` (`<pod dir>/volumes`).
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            written: HashMap::new(),
            tokens: HashMap::new(),
        }
    }

    /// The volumes' directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes every volume (again); returns when the next token refresh is due.
    pub(crate) async fn sync(
        &mut self,
        client: &kube::Client,
        ctx: FieldContext<'_>,
    ) -> Result<Option<Instant>, VolumeError> {
        let pod = ctx.pod;
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let mut objects = Objects::new(client, &namespace);
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let name = volume.name.clone();
            let files = if let Some(host) = &volume.host_path {
                if matches!(host.type_.as_deref(), Some("DirectoryOrCreate")) {
                    std::fs::create_dir_all(&host.path).map_err(|source| VolumeError::Io {
                        path: PathBuf::from(&host.path),
                        source,
                    })?;
                }
                continue;
            } else if volume.empty_dir.is_some() {
                let dir = self.dir.join(&name);
                std::fs::create_dir_all(&dir)
                    .map_err(|source| VolumeError::Io { path: dir, source })?;
                continue;
            } else if let Some(secret) = &volume.secret {
                let secret_name = secret.secret_name.clone().unwrap_or_default();
                let object = objects.secret(&name, &secret_name).await?;
                key_files(
                    &name,
                    "secret",
                    &secret_name,
                    object.map(secret_data).as_ref(),
                    secret.items.as_deref(),
                    secret.optional == Some(true),
                    secret.default_mode.unwrap_or(DEFAULT_MODE),
                )?
            } else if let Some(cm) = &volume.config_map {
                let object = objects.config_map(&name, &cm.name).await?;
                key_files(
                    &name,
                    "configmap",
                    &cm.name,
                    object.map(config_map_data).as_ref(),
                    cm.items.as_deref(),
                    cm.optional == Some(true),
                    cm.default_mode.unwrap_or(DEFAULT_MODE),
                )?
            } else if let Some(downward) = &volume.downward_api {
                downward_files(
                    &name,
                    ctx,
                    downward.items.as_deref().unwrap_or_default(),
                    downward.default_mode.unwrap_or(DEFAULT_MODE),
                )?
            } else if let Some(projected) = &volume.projected {
                let mode = projected.default_mode.unwrap_or(DEFAULT_MODE);
                let mut files = Vec::new();
                for projection in projected.sources.iter().flatten() {
                    files.extend(
                        self.projection_files(&name, projection, mode, ctx, &mut objects)
                            .await?,
                    );
                }
                files
            } else {
                return Err(VolumeError::Unsupported { volume: name });
            };
            self.write(&name, &files)?;
        }
        Ok(self.tokens.values().map(|t| t.refresh_at).min())
    }

    async fn projection_files(
        &mut self,
        volume: &str,
        projection: &VolumeProjection,
        mode: i32,
        ctx: FieldContext<'_>,
        objects: &mut Objects<'_>,
    ) -> Result<Vec<VolumeFile>, VolumeError> {
        if let Some(token) = &projection.service_account_token {
            let data = self
                .token(
                    volume,
                    &token.path,
                    token.audience.as_deref(),
                    token.expiration_seconds,
                    ctx,
                    objects.client,
                )
                .await?;
            return Ok(vec![VolumeFile {
                path: token.path.clone(),
                data: data.into_bytes(),
                mode,
            }]);
        }
        if let Some(cm) = &projection.config_map {
            let object = objects.config_map(volume, &cm.name).await?;
            return key_files(
                volume,
                "configmap",
                &cm.name,
                object.map(config_map_data).as_ref(),
                cm.items.as_deref(),
                cm.optional == Some(true),
                mode,
            );
        }
        if let Some(secret) = &projection.secret {
            let object = objects.secret(volume, &secret.name).await?;
            return key_files(
                volume,
                "secret",
                &secret.name,
                object.map(secret_data).as_ref(),
                secret.items.as_deref(),
                secret.optional == Some(true),
                mode,
            );
        }
        if let Some(downward) = &projection.downward_api {
            return downward_files(
                volume,
                ctx,
                downward.items.as_deref().unwrap_or_default(),
                mode,
            );
        }
        // clusterTrustBundle and podCertificate projections are not supported.
        Err(VolumeError::Unsupported {
            volume: volume.to_owned(),
        })
    }

    async fn token(
        &mut self,
        volume: &str,
        path: &str,
        audience: Option<&str>,
        expiration_seconds: Option<i64>,
        ctx: FieldContext<'_>,
        client: &kube::Client,
    ) -> Result<String, VolumeError> {
        let key = (volume.to_owned(), path.to_owned());
        if let Some(cached) = self
            .tokens
            .get(&key)
            .filter(|t| t.refresh_at > Instant::now())
        {
            return Ok(cached.token.clone());
        }
        let pod = ctx.pod;
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let service_account = vne_core::refs::service_account(pod);
        let seconds = expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS);
        let request = TokenSource {
            audience: audience.unwrap_or_default().to_owned(),
            expiration_seconds: seconds,
        }
        .request_for(pod);
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
        let issued = Instant::now();
        let answer = api
            .create_token_request(&service_account, &PostParams::default(), &request)
            .await
            .map_err(|source| VolumeError::Token {
                volume: volume.to_owned(),
                service_account: service_account.clone(),
                source: Box::new(source),
            })?;
        let token = answer.status.map(|s| s.token).unwrap_or_default();
        // The kubelet's rule, as the daemon applies it (no jitter: one agent, few tokens).
        let refresh_at =
            issued + vne_core::tokens::refresh_delay(Duration::ZERO, seconds, Duration::ZERO);
        self.tokens.insert(
            key,
            CachedToken {
                token: token.clone(),
                refresh_at,
            },
        );
        Ok(token)
    }

    /// Writes a volume's files (changed ones only) and removes the ones no longer there.
    fn write(&mut self, volume: &str, files: &[VolumeFile]) -> Result<(), VolumeError> {
        let root = self.dir.join(volume);
        std::fs::create_dir_all(&root).map_err(|source| VolumeError::Io {
            path: root.clone(),
            source,
        })?;
        let mut now_written = BTreeSet::new();
        for file in files {
            let relative = safe_relative(&file.path).ok_or_else(|| VolumeError::InvalidPath {
                volume: volume.to_owned(),
                path: file.path.clone(),
            })?;
            let path = root.join(relative);
            write_atomically(&path, &file.data, file.mode)?;
            now_written.insert(path);
        }
        if let Some(before) = self.written.get(volume) {
            for stale in before.difference(&now_written) {
                let _ = std::fs::remove_file(stale);
            }
        }
        self.written.insert(volume.to_owned(), now_written);
        Ok(())
    }
}

fn safe_relative(path: &str) -> Option<&Path> {
    let p = Path::new(path);
    let ok = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    ok.then_some(p)
}

fn write_atomically(path: &Path, data: &[u8], mode: i32) -> Result<(), VolumeError> {
    let io = |source| VolumeError::Io {
        path: path.to_owned(),
        source,
    };
    let mode = u32::try_from(mode).unwrap_or(0o644) & 0o7777;
    if let Ok(existing) = std::fs::read(path) {
        let same_mode =
            std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o7777 == mode);
        if existing == data && same_mode {
            return Ok(());
        }
    }
    let parent = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent).map_err(io)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = parent.join(format!(".{name}.tmp"));
    std::fs::write(&temporary, data).map_err(io)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode)).map_err(io)?;
    std::fs::rename(&temporary, path).map_err(io)
}

fn secret_data(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

/// The files of a secret or configMap source: every key, or the `items`.
fn key_files(
    volume: &str,
    kind: &'static str,
    name: &str,
    data: Option<&BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    optional: bool,
    mode: i32,
) -> Result<Vec<VolumeFile>, VolumeError> {
    let Some(data) = data else {
        return if optional {
            Ok(Vec::new())
        } else {
            Err(VolumeError::NotFound {
                volume: volume.to_owned(),
                kind,
                name: name.to_owned(),
            })
        };
    };
    match items.filter(|items| !items.is_empty()) {
        None => Ok(data
            .iter()
            .map(|(key, value)| VolumeFile {
                path: key.clone(),
                data: value.clone(),
                mode,
            })
            .collect()),
        Some(items) => {
            let mut files = Vec::new();
            for item in items {
                match data.get(&item.key) {
                    Some(value) => files.push(VolumeFile {
                        path: item.path.clone(),
                        data: value.clone(),
                        mode: item.mode.unwrap_or(mode),
                    }),
                    None if optional => {}
                    None => {
                        return Err(VolumeError::KeyNotFound {
                            volume: volume.to_owned(),
                            kind,
                            name: name.to_owned(),
                            key: item.key.clone(),
                        });
                    }
                }
            }
            Ok(files)
        }
    }
}

fn downward_files(
    volume: &str,
    ctx: FieldContext<'_>,
    items: &[DownwardAPIVolumeFile],
    mode: i32,
) -> Result<Vec<VolumeFile>, VolumeError> {
    let field_error = |source| VolumeError::Field {
        volume: volume.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for item in items {
        let value = if let Some(field) = &item.field_ref {
            env::field_value(ctx, &field.field_path, true).map_err(field_error)?
        } else if let Some(resource) = &item.resource_field_ref {
            let container_name = resource.container_name.clone().unwrap_or_default();
            let container = ctx
                .pod
                .spec
                .iter()
                .flat_map(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                })
                .find(|c| c.name == container_name)
                .ok_or(EnvError::ContainerNotFound {
                    name: container_name,
                })
                .map_err(field_error)?;
            env::resource_value(
                container,
                &resource.resource,
                resource.divisor.as_ref().map(|d| d.0.as_str()),
            )
            .map_err(field_error)?
        } else {
            String::new()
        };
        files.push(VolumeFile {
            path: item.path.clone(),
            data: value.into_bytes(),
            mode: item.mode.unwrap_or(mode),
        });
    }
    Ok(files)
}

/// ConfigMaps and Secrets read once per sync.
struct Objects<'c> {
    client: &'c kube::Client,
    config_maps: Api<ConfigMap>,
    secrets: Api<Secret>,
    cache_cm: HashMap<String, Option<ConfigMap>>,
    cache_secret: HashMap<String, Option<Secret>>,
}

impl<'c> Objects<'c> {
    fn new(client: &'c kube::Client, namespace: &str) -> Self {
        Self {
            client,
            config_maps: Api::namespaced(client.clone(), namespace),
            secrets: Api::namespaced(client.clone(), namespace),
            cache_cm: HashMap::new(),
            cache_secret: HashMap::new(),
        }
    }

    async fn config_map(
        &mut self,
        volume: &str,
        name: &str,
    ) -> Result<Option<&ConfigMap>, VolumeError> {
        if !self.cache_cm.contains_key(name) {
            let got = self
                .config_maps
                .get_opt(name)
                .await
                .map_err(|source| VolumeError::Api {
                    volume: volume.to_owned(),
                    kind: "ConfigMap",
                    name: name.to_owned(),
                    source: Box::new(source),
                })?;
            self.cache_cm.insert(name.to_owned(), got);
        }
        Ok(self.cache_cm.get(name).and_then(Option::as_ref))
    }

    async fn secret(&mut self, volume: &str, name: &str) -> Result<Option<&Secret>, VolumeError> {
        if !self.cache_secret.contains_key(name) {
            let got = self
                .secrets
                .get_opt(name)
                .await
                .map_err(|source| VolumeError::Api {
                    volume: volume.to_owned(),
                    kind: "Secret",
                    name: name.to_owned(),
                    source: Box::new(source),
                })?;
            self.cache_secret.insert(name.to_owned(), got);
        }
        Ok(self.cache_secret.get(name).and_then(Option::as_ref))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ObjectFieldSelector, Pod, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
        }
    }

    #[test]
    fn key_files_cases() {
        let d = data(&[("a", "1"), ("b", "2")]);
        let all = key_files("v", "secret", "s", Some(&d), None, false, 0o440).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].path.as_str(), all[0].mode), ("a", 0o440));

        let items = [item("b", "dir/b.txt", Some(0o600))];
        let some = key_files("v", "configmap", "c", Some(&d), Some(&items), false, 0o644).unwrap();
        assert_eq!(
            some,
            [VolumeFile {
                path: "dir/b.txt".into(),
                data: b"2".to_vec(),
                mode: 0o600
            }]
        );

        let missing_item = [item("z", "z", None)];
        assert!(matches!(
            key_files(
                "v",
                "configmap",
                "c",
                Some(&d),
                Some(&missing_item),
                false,
                0o644
            ),
            Err(VolumeError::KeyNotFound { .. })
        ));
        assert!(
            key_files(
                "v",
                "configmap",
                "c",
                Some(&d),
                Some(&missing_item),
                true,
                0o644
            )
            .unwrap()
            .is_empty()
        );
        assert!(matches!(
            key_files("v", "secret", "s", None, None, false, 0o644),
            Err(VolumeError::NotFound { .. })
        ));
        assert!(
            key_files("v", "secret", "s", None, None, true, 0o644)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn writes_atomically_and_removes_stale_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut volumes = Volumes::new(dir.path().to_owned());
        let file = |path: &str, data: &str| VolumeFile {
            path: path.into(),
            data: data.as_bytes().to_vec(),
            mode: 0o640,
        };
        volumes
            .write("v", &[file("a", "1"), file("sub/b", "2")])
            .unwrap();
        let a = dir.path().join("v/a");
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "1");
        assert_eq!(
            std::fs::metadata(&a).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("v/sub/b")).unwrap(),
            "2"
        );
        volumes.write("v", &[file("a", "changed")]).unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "changed");
        assert!(!dir.path().join("v/sub/b").exists());
        assert!(matches!(
            volumes.write("v", &[file("../escape", "x")]),
            Err(VolumeError::InvalidPath { .. })
        ));
        assert!(matches!(
            volumes.write("v", &[file("/abs", "x")]),
            Err(VolumeError::InvalidPath { .. })
        ));
    }

    #[test]
    fn downward_api_files() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                labels: Some(BTreeMap::from([("a".into(), "b".into())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec::default()),
            status: None,
        };
        let ctx = FieldContext {
            pod: &pod,
            pod_ips: &[],
            host_ip: "127.0.0.1",
        };
        let field = |path: &str, field: &str| DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: field.into(),
            }),
            ..DownwardAPIVolumeFile::default()
        };
        let files = downward_files(
            "v",
            ctx,
            &[
                field("namespace", "metadata.namespace"),
                field("labels", "metadata.labels"),
            ],
            0o644,
        )
        .unwrap();
        assert_eq!(files[0].data, b"ns");
        assert_eq!(files[1].data, b"a=\"b\"");
    }
}
