//! Test images the project builds offline, without pulling anything from a public registry:
//! busybox from Debian's `busybox-static` (its `/bin/busybox` and one symlink per applet), or from
//! another static busybox binary, as an OCI image (a gzip layer, a config, a manifest) that
//! [`push`] sends to a registry such as [`crate::registry::TestRegistry`]. The image tests use
//! it; the playground builds its images, Kubernetes' end-to-end ones included, from these parts.

use std::path::Path;

use flate2::{Compression, write::GzEncoder};
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

/// Where Debian's `busybox-static` installs its binary.
pub const DEBIAN_BUSYBOX: &str = "/bin/busybox";
/// The modification time of every entry, so the same inputs give the same digests.
const MTIME: u64 = 1_700_000_000;

/// Building or pushing a test image failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file the image is built from could not be read, or the archive not written.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `busybox --list-full` failed (the binary is not Debian's busybox-static?).
    #[error("`{DEBIAN_BUSYBOX} --list-full` failed: {0}")]
    Applets(String),
    /// The image reference does not parse.
    #[error("image reference {0:?}")]
    Reference(String, #[source] oci_client::ParseError),
    /// The registry refused the push.
    #[error("push {reference}")]
    Push {
        /// The reference pushed.
        reference: String,
        /// The cause.
        #[source]
        source: oci_client::errors::OciDistributionError,
    },
}

/// The runtime part of an image's config (the OCI image spec's `config` object).
#[derive(Debug, Clone, Default)]
pub struct RunConfig {
    /// `Entrypoint`.
    pub entrypoint: Option<Vec<String>>,
    /// `Cmd`.
    pub cmd: Option<Vec<String>>,
    /// `Env`, `NAME=value` each.
    pub env: Vec<String>,
    /// `WorkingDir`.
    pub working_dir: Option<String>,
    /// `User`.
    pub user: Option<String>,
}

/// An image ready to push: its layers (gzip-compressed tars) and its config JSON.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// The layers, lowest first, each a gzip-compressed tar.
    pub layers: Vec<Vec<u8>>,
    /// The OCI image config (JSON).
    pub config: Vec<u8>,
}

impl BuiltImage {
    /// An image of `layers` (uncompressed tars, lowest first) with `run` as its config.
    pub fn from_tars(tars: &[Vec<u8>], run: &RunConfig) -> Result<Self, ImageError> {
        let diff_ids: Vec<String> = tars.iter().map(|tar| sha256(tar)).collect();
        let layers = tars.iter().map(|tar| gzip(tar)).collect::<Result<_, _>>()?;
        let mut config = serde_json::Map::new();
        let mut put = |key: &str, value: serde_json::Value| {
            config.insert(key.to_owned(), value);
        };
        if let Some(entrypoint) = &run.entrypoint {
            put("Entrypoint", entrypoint.clone().into());
        }
        if let Some(cmd) = &run.cmd {
            put("Cmd", cmd.clone().into());
        }
        put("Env", run.env.clone().into());
        if let Some(dir) = &run.working_dir {
            put("WorkingDir", dir.clone().into());
        }
        if let Some(user) = &run.user {
            put("User", user.clone().into());
        }
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
        });
        Ok(Self {
            layers,
            config: serde_json::to_vec(&config).unwrap_or_default(),
        })
    }
}

/// busybox: Debian's static `/bin/busybox`, a symlink to it for each applet it lists, `/tmp`,
/// and an `/etc/passwd` and `/etc/group` naming root and nobody; `Cmd` `sh`, `PATH` set.
pub fn busybox() -> Result<BuiltImage, ImageError> {
    let run = RunConfig {
        cmd: Some(vec!["sh".to_owned()]),
        env: vec![DEFAULT_PATH.to_owned()],
        ..RunConfig::default()
    };
    BuiltImage::from_tars(
        &[busybox_layer(Path::new(DEBIAN_BUSYBOX), Applets::Listed)?],
        &run,
    )
}

/// busybox as the Docker library's image lays it out, from the static busybox binary at
/// `binary`: every applet a link in /bin (Debian's puts some in /sbin and /usr/bin).
pub fn busybox_from(binary: &Path) -> Result<BuiltImage, ImageError> {
    let run = RunConfig {
        cmd: Some(vec!["sh".to_owned()]),
        env: vec![DEFAULT_PATH.to_owned()],
        ..RunConfig::default()
    };
    BuiltImage::from_tars(&[busybox_layer(binary, Applets::AllInBin)?], &run)
}

/// Where a busybox layer puts its applets' links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applets {
    /// Where the binary's `--list-full` says (Debian's layout).
    Listed,
    /// All in /bin (the Docker library image's layout).
    AllInBin,
}

/// The `PATH` busybox's images set.
pub const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A busybox image's one layer (an uncompressed tar), for images built on it.
pub fn busybox_layer(binary: &Path, applets: Applets) -> Result<Vec<u8>, ImageError> {
    let shown = binary.display();
    let content = std::fs::read(binary).map_err(|source| ImageError::Io {
        what: if binary == Path::new(DEBIAN_BUSYBOX) {
            format!("read {shown} (Debian's busybox-static; apt-get install busybox-static)")
        } else {
            format!("read the busybox binary at {shown}")
        },
        source,
    })?;
    let listed = std::process::Command::new(binary)
        .arg("--list-full")
        .output()
        .map_err(|source| ImageError::Io {
            what: format!("run {shown} --list-full"),
            source,
        })?;
    if !listed.status.success() {
        return Err(ImageError::Applets(
            String::from_utf8_lossy(&listed.stderr).into_owned(),
        ));
    }
    let listed_applets = String::from_utf8_lossy(&listed.stdout).into_owned();
    let mut layer = LayerBuilder::default();
    for dir in ["bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root"] {
        layer.dir(dir, 0o755)?;
    }
    layer.dir("tmp", 0o1777)?;
    layer.file("bin/busybox", 0o755, &content)?;
    layer.file("etc/passwd", 0o644, PASSWD.as_bytes())?;
    layer.file("etc/group", 0o644, GROUP.as_bytes())?;
    let links: std::collections::BTreeSet<String> = listed_applets
        .lines()
        .map(str::trim)
        .filter(|applet| !applet.is_empty())
        .map(|applet| match applets {
            Applets::Listed => applet.to_owned(),
            Applets::AllInBin => format!("bin/{}", applet.rsplit('/').next().unwrap_or(applet)),
        })
        .collect();
    for link in links.iter().filter(|link| *link != "bin/busybox") {
        layer.symlink(link, "/bin/busybox")?;
    }
    layer.finish()
}

const PASSWD: &str =
    "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

/// A layer tar written entry by entry, with fixed owners and times.
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl std::fmt::Debug for LayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerBuilder").finish_non_exhaustive()
    }
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self {
            tar: tar::Builder::new(Vec::new()),
        }
    }
}

impl LayerBuilder {
    /// A directory.
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<(), ImageError> {
        let header = header(tar::EntryType::Directory, mode, 0);
        self.append(header, path, &[][..])
    }

    /// A regular file.
    pub fn file(&mut self, path: &str, mode: u32, content: &[u8]) -> Result<(), ImageError> {
        let header = header(tar::EntryType::Regular, mode, content.len() as u64);
        self.append(header, path, content)
    }

    /// A symbolic link to `target` (written as given, absolute or relative).
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<(), ImageError> {
        let mut header = header(tar::EntryType::Symlink, 0o777, 0);
        self.tar
            .append_link(&mut header, path, target)
            .map_err(|source| ImageError::Io {
                what: format!("add the symlink {path} to the layer"),
                source,
            })
    }

    /// An entry whose name is written byte for byte, unchecked: what a hostile layer holds
    /// (`../x`, `/etc/x`), which the tar crate's checked setters refuse to write.
    pub fn raw(
        &mut self,
        kind: tar::EntryType,
        name: &str,
        link: Option<&str>,
        content: &[u8],
    ) -> Result<(), ImageError> {
        let mut header = header(kind, 0o644, content.len() as u64);
        let old = header.as_old_mut();
        copy_name(&mut old.name, name);
        if let Some(link) = link {
            copy_name(&mut old.linkname, link);
        }
        header.set_cksum();
        self.tar
            .append(&header, content)
            .map_err(|source| ImageError::Io {
                what: format!("add the raw entry {name:?} to the layer"),
                source,
            })
    }

    /// The finished (uncompressed) tar.
    pub fn finish(self) -> Result<Vec<u8>, ImageError> {
        self.tar.into_inner().map_err(|source| ImageError::Io {
            what: "finish the layer tar".into(),
            source,
        })
    }

    fn append(
        &mut self,
        mut header: tar::Header,
        path: &str,
        content: &[u8],
    ) -> Result<(), ImageError> {
        self.tar
            .append_data(&mut header, Path::new(path), content)
            .map_err(|source| ImageError::Io {
                what: format!("add {path} to the layer"),
                source,
            })
    }
}

/// A GNU header of `kind`, root-owned, with `mode`, `size` and the fixed time.
fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(MTIME);
    header
}

/// Copies `name` into a fixed tar name field (cut at its length).
fn copy_name(field: &mut [u8], name: &str) {
    field.fill(0);
    let bytes = name.as_bytes();
    let len = bytes.len().min(field.len());
    field[..len].copy_from_slice(&bytes[..len]);
}

fn sha256(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{hex}")
}

fn gzip(data: &[u8]) -> Result<Vec<u8>, ImageError> {
    use std::io::Write as _;
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder
        .write_all(data)
        .and_then(|()| encoder.finish())
        .map_err(|source| ImageError::Io {
            what: "gzip a layer".into(),
            source,
        })
}

/// Pushes `image` as `reference` (`host:port/repo:tag`) over plain HTTP (a loopback test
/// registry), with `auth` (`None`: anonymous).
pub async fn push(
    image: &BuiltImage,
    reference: &str,
    auth: Option<(&str, &str)>,
) -> Result<(), ImageError> {
    // reqwest (through oci-client) is built without a crypto provider of its own: it takes the
    // process default, the ring one the workspace's rustls uses.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let parsed: Reference = reference
        .parse()
        .map_err(|source| ImageError::Reference(reference.to_owned(), source))?;
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    });
    let layers: Vec<ImageLayer> = image
        .layers
        .iter()
        .map(|layer| ImageLayer::oci_v1_gzip(layer.clone(), None))
        .collect();
    let config = Config::oci_v1(image.config.clone(), None);
    let auth = auth.map_or(RegistryAuth::Anonymous, |(user, password)| {
        RegistryAuth::Basic(user.to_owned(), password.to_owned())
    });
    client
        .push(&parsed, &layers, config, &auth, None)
        .await
        .map(|_| ())
        .map_err(|source| ImageError::Push {
            reference: reference.to_owned(),
            source,
        })
}
