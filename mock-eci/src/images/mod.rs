//! The image store of mock-eci's real runtime: pulls images over the OCI distribution API,
//! keeps their blobs content-addressed, and unpacks each image once into a read-only rootfs
//! that the container groups running it share.
//!
//! Owns everything under its root directory: `blobs/sha256/<hex>` (manifests' configs and
//! layers, written only once verified against their digest) and `images/<manifest hex>/rootfs`
//! (an image's layers applied in order). It may call the registries a pull names (through
//! `oci-client`) and the filesystem under its root; it never calls the engine or the fronts.
//! The engine decides when to pull and turns a [`PullError`] into what ECI reports
//! ([`PullError::failure`]).
//!
//! Credentials are ECI's `ImageRegistryCredential` (`Server`, `UserName`, `Password`): the one
//! whose `Server` is the image's registry is used, else the pull is anonymous. Registries in
//! `PlainHttpRegistry` are reached over HTTP, those in `InsecureRegistry` over HTTPS without
//! certificate checks, as ECI does.

mod unpack;

use std::path::{Path, PathBuf};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

pub use unpack::UnpackError;

/// Why a pull failed. Its `Display` is the cause shown after ECI's `Failed to pull image`.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The image name does not parse as a reference.
    #[error("invalid image reference")]
    Reference(#[source] oci_client::ParseError),
    /// The registry has no such repository or tag (or digest).
    #[error("{reference}: not found")]
    NotFound {
        /// The reference, fully qualified.
        reference: String,
    },
    /// The registry refused the credentials given (or their absence).
    #[error("{reference}: pull access denied, the registry requires authorization")]
    Denied {
        /// The reference, fully qualified.
        reference: String,
    },
    /// Any other failure talking to the registry (unreachable, a server error, a digest
    /// that does not match its content).
    #[error("{reference}: the registry request failed")]
    Registry {
        /// The reference, fully qualified.
        reference: String,
        /// The cause.
        #[source]
        source: OciDistributionError,
    },
    /// The image's config blob is not an OCI/Docker image config.
    #[error("the image config is not valid")]
    Config(#[source] serde_json::Error),
    /// A layer could not be applied (or was refused: a path escaping the rootfs, say).
    #[error("unpack layer {digest}")]
    Unpack {
        /// The layer's digest.
        digest: String,
        /// The cause.
        #[source]
        source: UnpackError,
    },
    /// The store's own files could not be written or read.
    #[error("image store: {what}")]
    Store {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// What ECI reports for a failed pull: the container waits with `reason` and `message`, and
/// the group gets a Warning event `event_reason` with `event_message` (then, on the back-off
/// timer, `ImagePullBackOff`, as the simulated engine does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullFailure {
    /// The container's waiting reason: `ErrImagePull`.
    pub reason: &'static str,
    /// The container's waiting message.
    pub message: String,
    /// The event's reason: `Failed`.
    pub event_reason: &'static str,
    /// The event's message.
    pub event_message: String,
}

impl PullError {
    /// The container state and event ECI shows for this failure of pulling `image`.
    pub fn failure(&self, image: &str) -> PullFailure {
        let mut cause = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(inner) = source {
            cause.push_str(": ");
            cause.push_str(&inner.to_string());
            source = inner.source();
        }
        PullFailure {
            reason: "ErrImagePull",
            message: format!("failed to pull image {image:?}: {cause}"),
            event_reason: "Failed",
            event_message: format!("Failed to pull image {image:?}: {cause}"),
        }
    }
}

/// One of ECI's `ImageRegistryCredential.N`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct RegistryCredential {
    /// `Server`: the registry's host (and port).
    pub server: String,
    /// `UserName`.
    pub user_name: String,
    /// `Password`.
    pub password: String,
}

impl std::fmt::Debug for RegistryCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredential")
            .field("server", &self.server)
            .field("user_name", &self.user_name)
            .finish_non_exhaustive()
    }
}

/// What a pull needs besides the image name: the group's credentials and registry settings.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// `ImageRegistryCredential`.
    pub credentials: Vec<RegistryCredential>,
    /// `PlainHttpRegistry` (split at commas): reached over HTTP.
    pub plain_http_registries: Vec<String>,
    /// `InsecureRegistry` (split at commas): HTTPS without certificate checks.
    pub insecure_registries: Vec<String>,
}

impl PullOptions {
    /// The options a CreateContainerGroup request gives: its `ImageRegistryCredential.N`, and
    /// its `PlainHttpRegistry` and `InsecureRegistry` (comma-separated hosts, blanks ignored).
    pub fn from_request(
        credentials: &[eci_proto::v20180808::ImageRegistryCredential],
        plain_http_registry: &str,
        insecure_registry: &str,
    ) -> Self {
        let hosts = |list: &str| {
            list.split(',')
                .map(str::trim)
                .filter(|host| !host.is_empty())
                .map(str::to_owned)
                .collect()
        };
        Self {
            credentials: credentials
                .iter()
                .map(|credential| RegistryCredential {
                    server: credential.server.clone(),
                    user_name: credential.user_name.clone(),
                    password: credential.password.clone(),
                })
                .collect(),
            plain_http_registries: hosts(plain_http_registry),
            insecure_registries: hosts(insecure_registry),
        }
    }
}

/// The runtime part of an image's config: what a container runs unless its spec says
/// otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ImageRunConfig {
    /// `Entrypoint`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub cmd: Vec<String>,
    /// `Env` (`NAME=value` each).
    #[serde(default, deserialize_with = "null_as_default")]
    pub env: Vec<String>,
    /// `WorkingDir` (empty: `/`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub working_dir: String,
    /// `User` (empty: root).
    #[serde(default, deserialize_with = "null_as_default")]
    pub user: String,
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + serde::Deserialize<'de>,
{
    use serde::Deserialize as _;
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Debug, serde::Deserialize)]
struct ImageConfigFile {
    #[serde(default)]
    config: Option<ImageRunConfig>,
}

/// A pulled image, ready to run.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The reference pulled, fully qualified (`registry/repository:tag`).
    pub reference: String,
    /// The manifest's digest (`sha256:…`).
    pub digest: String,
    /// The unpacked root filesystem, shared by every group running the image: mount it
    /// read-only (or under an overlay), never write to it.
    pub rootfs: PathBuf,
    /// Entrypoint, Cmd, Env, WorkingDir and User from the image's config.
    pub config: ImageRunConfig,
    /// How many blobs (config and layers) this pull fetched; 0 when all were in the store.
    pub fetched_blobs: usize,
}

/// How many bytes of files one image may unpack to, unless [`ImageStore::with_unpack_limit`]
/// says otherwise: more than any image a test or a playground user runs, far less than a
/// layer built to fill the disk.
pub const DEFAULT_UNPACK_LIMIT: u64 = 8 << 30;

/// Where images named on Docker Hub (`busybox`, `library/busybox`, `docker.io/…`) are pulled
/// from instead, as a container runtime's registry mirror: the same repository and tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryMirror {
    /// `host[:port]`.
    pub host: String,
    /// Reached over HTTP (an `http://` mirror), else HTTPS.
    pub plain_http: bool,
}

impl std::str::FromStr for RegistryMirror {
    type Err = String;

    /// `http://host[:port]` or `https://host[:port]`: the scheme says how it is reached.
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let (plain_http, host) = if let Some(host) = url.strip_prefix("http://") {
            (true, host)
        } else if let Some(host) = url.strip_prefix("https://") {
            (false, host)
        } else {
            return Err(format!(
                "{url:?}: a mirror is http://HOST[:PORT] or https://HOST[:PORT]"
            ));
        };
        let host = host.trim_end_matches('/');
        let valid = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b));
        if valid {
            Ok(Self {
                host: host.to_owned(),
                plain_http,
            })
        } else {
            Err(format!("{url:?}: {host:?} is not a host[:port]"))
        }
    }
}

/// Docker Hub as image references name it once parsed.
const DOCKER_HUB: &str = "docker.io";

/// The content-addressed image store (see the module's doc).
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
    unpack_limit: u64,
    docker_hub_mirror: Option<RegistryMirror>,
}

impl ImageStore {
    /// A store rooted at `root` (created if missing).
    pub fn open(root: &Path) -> Result<Self, PullError> {
        for dir in ["blobs/sha256", "images", "tmp"] {
            let path = root.join(dir);
            std::fs::create_dir_all(&path).map_err(|source| PullError::Store {
                what: format!("create {}", path.display()),
                source,
            })?;
        }
        Ok(Self {
            root: root.to_owned(),
            unpack_limit: DEFAULT_UNPACK_LIMIT,
            docker_hub_mirror: None,
        })
    }

    /// The same store, pulling Docker Hub's images from `mirror`.
    #[must_use]
    pub fn with_docker_hub_mirror(mut self, mirror: Option<RegistryMirror>) -> Self {
        self.docker_hub_mirror = mirror;
        self
    }

    /// The same store, unpacking at most `bytes` of files per image.
    #[must_use]
    pub fn with_unpack_limit(mut self, bytes: u64) -> Self {
        self.unpack_limit = bytes;
        self
    }

    /// Pulls `image` (a name as a container spec gives it: `busybox`, `host:port/repo:tag`,
    /// `repo@sha256:…`): the manifest always, each blob only when the store lacks it, and
    /// unpacks the rootfs once per manifest digest.
    #[tracing::instrument(skip(self, options), fields(store = %self.root.display()))]
    pub async fn pull(&self, image: &str, options: &PullOptions) -> Result<PulledImage, PullError> {
        let mut reference: Reference = image.parse().map_err(PullError::Reference)?;
        let mut options = std::borrow::Cow::Borrowed(options);
        if let Some(mirror) = &self.docker_hub_mirror
            && reference.registry() == DOCKER_HUB
        {
            reference.set_mirror_registry(mirror.host.clone());
            if mirror.plain_http {
                options
                    .to_mut()
                    .plain_http_registries
                    .push(mirror.host.clone());
            }
        }
        let registry = reference.resolve_registry().to_owned();
        let client = client_for(&registry, &options);
        let auth = auth_for(&registry, &options.credentials);
        let full = reference.whole();
        let (manifest, digest) = client
            .pull_image_manifest(&reference, &auth)
            .await
            .map_err(|source| classify(&full, source))?;
        let mut fetched_blobs = 0;
        for descriptor in std::iter::once(&manifest.config).chain(&manifest.layers) {
            if self
                .fetch_blob(&client, &reference, descriptor, &full)
                .await?
            {
                fetched_blobs += 1;
            }
        }
        let config = self.read_config(&manifest.config)?;
        let rootfs = self.unpacked(&manifest, &digest).await?;
        tracing::info!(reference = %full, %digest, fetched_blobs, "image pulled");
        Ok(PulledImage {
            reference: full,
            digest,
            rootfs,
            config,
            fetched_blobs,
        })
    }

    /// The path of a blob in the store (which may not exist yet). `None` for a digest that is
    /// not `sha256:<64 hex>`: a registry's manifest is untrusted input, and a digest names a
    /// file.
    fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        let hex = digest.strip_prefix("sha256:")?;
        let valid = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid.then(|| self.root.join("blobs/sha256").join(hex))
    }

    fn checked_blob_path(&self, digest: &str) -> Result<PathBuf, PullError> {
        self.blob_path(digest).ok_or_else(|| PullError::Store {
            what: format!("refuse digest {digest:?}"),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not a sha256 digest of 64 lowercase hex digits",
            ),
        })
    }

    /// Fetches one blob unless the store has it; true when it fetched. The download goes to a
    /// temporary file renamed into place once oci-client has checked its digest.
    async fn fetch_blob(
        &self,
        client: &Client,
        reference: &Reference,
        descriptor: &OciDescriptor,
        full: &str,
    ) -> Result<bool, PullError> {
        let path = self.checked_blob_path(&descriptor.digest)?;
        if tokio::fs::try_exists(&path).await.unwrap_or(false) {
            return Ok(false);
        }
        let store = |what: String| move |source| PullError::Store { what, source };
        let tmp = self
            .root
            .join("tmp")
            .join(format!("blob-{}", uuid::Uuid::new_v4()));
        let file = tokio::fs::File::create(&tmp)
            .await
            .map_err(store(format!("create {}", tmp.display())))?;
        let pulled = client.pull_blob(reference, descriptor, file).await;
        if let Err(source) = pulled {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(classify(full, source));
        }
        tokio::fs::rename(&tmp, &path)
            .await
            .map_err(store(format!("store blob {}", descriptor.digest)))?;
        Ok(true)
    }

    fn read_config(&self, descriptor: &OciDescriptor) -> Result<ImageRunConfig, PullError> {
        let path = self.checked_blob_path(&descriptor.digest)?;
        let bytes = std::fs::read(&path).map_err(|source| PullError::Store {
            what: format!("read {}", path.display()),
            source,
        })?;
        let file: ImageConfigFile = serde_json::from_slice(&bytes).map_err(PullError::Config)?;
        Ok(file.config.unwrap_or_default())
    }

    /// The image's rootfs, unpacked now unless an earlier pull did. Layers are applied into a
    /// temporary directory renamed into place when complete, so a failed or concurrent unpack
    /// never leaves a half rootfs where a group would run it.
    async fn unpacked(
        &self,
        manifest: &OciImageManifest,
        digest: &str,
    ) -> Result<PathBuf, PullError> {
        let image_dir = self.checked_blob_path(digest).map(|blob| {
            let hex = blob.file_name().map(ToOwned::to_owned).unwrap_or_default();
            self.root.join("images").join(hex)
        })?;
        let rootfs = image_dir.join("rootfs");
        if tokio::fs::try_exists(&rootfs).await.unwrap_or(false) {
            return Ok(rootfs);
        }
        let layers = manifest
            .layers
            .iter()
            .map(|layer| Ok((layer.digest.clone(), self.checked_blob_path(&layer.digest)?)))
            .collect::<Result<Vec<_>, PullError>>()?;
        let tmp = self
            .root
            .join("tmp")
            .join(format!("rootfs-{}", uuid::Uuid::new_v4()));
        let target = rootfs.clone();
        let limit = self.unpack_limit;
        let applied = tokio::task::spawn_blocking(move || apply_all(&tmp, &layers, &target, limit))
            .await
            .map_err(|join| PullError::Store {
                what: "unpack the layers".into(),
                source: std::io::Error::other(join.to_string()),
            })?;
        applied.map(|()| rootfs)
    }
}

/// Applies `layers` in order into a fresh `tmp`, then moves it to `target` (keeping an
/// identical rootfs another pull put there first).
fn apply_all(
    tmp: &Path,
    layers: &[(String, PathBuf)],
    target: &Path,
    limit: u64,
) -> Result<(), PullError> {
    let mut budget = unpack::Budget::new(limit);
    let store = |what: String| move |source| PullError::Store { what, source };
    std::fs::create_dir_all(tmp).map_err(store(format!("create {}", tmp.display())))?;
    for (digest, blob) in layers {
        if let Err(source) = unpack::apply_layer(tmp, blob, &mut budget) {
            let _ = std::fs::remove_dir_all(tmp);
            return Err(PullError::Unpack {
                digest: digest.clone(),
                source,
            });
        }
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(store(format!("create {}", parent.display())))?;
    }
    if let Err(source) = std::fs::rename(tmp, target) {
        let _ = std::fs::remove_dir_all(tmp);
        if !target.is_dir() {
            return Err(store(format!("move the rootfs to {}", target.display()))(
                source,
            ));
        }
    }
    Ok(())
}

/// A client speaking to `registry` as `options` say (HTTP, HTTPS without checks, or HTTPS).
fn client_for(registry: &str, options: &PullOptions) -> Client {
    // reqwest (through oci-client) is built without a crypto provider of its own: it takes the
    // process default, the ring provider the rest of the workspace's rustls uses.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listed = |list: &[String]| list.iter().any(|host| host.trim() == registry);
    let protocol = if listed(&options.plain_http_registries) {
        ClientProtocol::Http
    } else {
        ClientProtocol::Https
    };
    Client::new(ClientConfig {
        protocol,
        accept_invalid_certificates: listed(&options.insecure_registries),
        ..ClientConfig::default()
    })
}

/// Basic auth with the credential whose `Server` names `registry` (a scheme or a trailing
/// slash in it ignored), else anonymous.
fn auth_for(registry: &str, credentials: &[RegistryCredential]) -> RegistryAuth {
    let host = |server: &str| {
        let server = server.trim();
        let server = server
            .strip_prefix("https://")
            .or_else(|| server.strip_prefix("http://"))
            .unwrap_or(server);
        server.trim_end_matches('/').to_owned()
    };
    credentials
        .iter()
        .find(|credential| host(&credential.server) == registry)
        .map_or(RegistryAuth::Anonymous, |credential| {
            RegistryAuth::Basic(credential.user_name.clone(), credential.password.clone())
        })
}

/// Sorts a registry failure into not found, denied, or anything else.
fn classify(reference: &str, error: OciDistributionError) -> PullError {
    let reference = reference.to_owned();
    let has_code = |wanted: &[OciErrorCode]| match &error {
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            wanted
                .iter()
                .any(|w| std::mem::discriminant(w) == std::mem::discriminant(&e.code))
        }),
        _ => false,
    };
    let not_found = matches!(error, OciDistributionError::ImageManifestNotFoundError(_))
        || has_code(&[
            OciErrorCode::ManifestUnknown,
            OciErrorCode::NameUnknown,
            OciErrorCode::NotFound,
        ]);
    let denied = matches!(
        error,
        OciDistributionError::AuthenticationFailure(_)
            | OciDistributionError::UnauthorizedError { .. }
    ) || has_code(&[OciErrorCode::Unauthorized, OciErrorCode::Denied]);
    if not_found {
        PullError::NotFound { reference }
    } else if denied {
        PullError::Denied { reference }
    } else {
        PullError::Registry {
            reference,
            source: error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_is_a_scheme_and_a_host() {
        let cases = [
            ("http://10.200.0.1:5000", Some(("10.200.0.1:5000", true))),
            ("https://mirror.example/", Some(("mirror.example", false))),
            ("10.200.0.1:5000", None),
            ("http://", None),
            ("http://host/path", None),
            ("ftp://host", None),
        ];
        for (url, expected) in cases {
            let parsed = url.parse::<RegistryMirror>().ok();
            let parsed = parsed.as_ref().map(|m| (m.host.as_str(), m.plain_http));
            assert_eq!(parsed, expected, "{url}");
        }
    }

    fn credential(server: &str) -> RegistryCredential {
        RegistryCredential {
            server: server.into(),
            user_name: "u".into(),
            password: "p".into(),
        }
    }

    #[test]
    fn the_credential_for_the_images_registry_is_used_and_no_other() {
        let table = [
            ("127.0.0.1:5000", vec![credential("127.0.0.1:5000")], true),
            (
                "127.0.0.1:5000",
                vec![credential("https://127.0.0.1:5000/")],
                true,
            ),
            ("127.0.0.1:5000", vec![credential("127.0.0.1:5001")], false),
            ("registry.example", vec![credential("other.example")], false),
            ("registry.example", vec![], false),
        ];
        for (registry, credentials, basic) in table {
            let auth = auth_for(registry, &credentials);
            assert_eq!(
                matches!(auth, RegistryAuth::Basic(..)),
                basic,
                "{registry} with {credentials:?}"
            );
        }
    }

    #[test]
    fn a_requests_registry_settings_become_pull_options() {
        let credentials = [eci_proto::v20180808::ImageRegistryCredential {
            server: "registry.example:5000".into(),
            user_name: "u".into(),
            password: "p".into(),
        }];
        let options =
            PullOptions::from_request(&credentials, "127.0.0.1:5000, harbor.example ,", "");
        assert_eq!(options.credentials, [credential("registry.example:5000")]);
        assert_eq!(
            options.plain_http_registries,
            ["127.0.0.1:5000", "harbor.example"]
        );
        assert!(options.insecure_registries.is_empty());
        let table = [
            ("127.0.0.1:5000", (true, false)),
            ("harbor.example", (true, false)),
            ("registry.example:5000", (false, false)),
        ];
        for (registry, (http, insecure)) in table {
            let listed = |list: &[String]| list.iter().any(|h| h == registry);
            assert_eq!(
                (
                    listed(&options.plain_http_registries),
                    listed(&options.insecure_registries)
                ),
                (http, insecure),
                "{registry}"
            );
        }
    }

    #[test]
    fn a_failure_reads_as_eci_reports_it() {
        let failure = PullError::NotFound {
            reference: "127.0.0.1:5000/busybox:nope".into(),
        }
        .failure("127.0.0.1:5000/busybox:nope");
        assert_eq!(failure.reason, "ErrImagePull");
        assert_eq!(failure.event_reason, "Failed");
        assert_eq!(
            failure.event_message,
            "Failed to pull image \"127.0.0.1:5000/busybox:nope\": 127.0.0.1:5000/busybox:nope: not found"
        );
        assert!(
            failure
                .message
                .starts_with("failed to pull image \"127.0.0.1:5000/busybox:nope\"")
        );
    }

    #[test]
    fn only_sha256_digests_name_blobs() {
        let store = ImageStore {
            root: PathBuf::from("/store"),
            unpack_limit: DEFAULT_UNPACK_LIMIT,
            docker_hub_mirror: None,
        };
        let hex = "a".repeat(64);
        assert!(store.blob_path(&format!("sha256:{hex}")).is_some());
        for bad in [
            format!("sha512:{hex}"),
            "sha256:../../etc/passwd".to_owned(),
            format!("sha256:{}", "A".repeat(64)),
            "sha256:abc".to_owned(),
        ] {
            assert!(store.blob_path(&bad).is_none(), "{bad}");
        }
    }
}
