//! A group's volumes and their mounts into its containers.
//!
//! Each volume is a directory of the group's (`volumes/<index>`): an `EmptyDir` an empty one
//! (world-writable, as Kubernetes makes it), on the disk or, with the `Memory` medium, a tmpfs
//! of its `SizeLimit`; a `ConfigFileVolume` its files, with their modes, owned by root,
//! written (and rewritten on an update) by [`super::rewrite`]. A
//! container's mount is a bind mount of the volume (or of a `SubPath` in it) at its
//! `MountPath`, read-only when asked.
//!
//! A `SubPath` is the tenant's path into a volume the tenant's containers write: a symbolic
//! link planted there must not lead the mount out of the volume. It is opened beneath the
//! volume with symbolic links refused (`openat2`, `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`)
//! and the opened directory itself bind-mounted to a staging point in the container's own
//! directory, which is what the runtime mounts: nothing the container changes afterwards
//! moves it.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::mount::MountFlags;

/// Where a volume's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// An empty directory; `memory`: a tmpfs of at most `size_limit` bytes.
    EmptyDir {
        memory: bool,
        size_limit: Option<u64>,
    },
    /// Files at paths relative to the volume.
    Files(Vec<VolumeFile>),
    /// Storage that outlives the group, as a cloud disk, a NAS path or an OSS bucket does: a
    /// directory of the machine's store named by a digest of `key` (see [`store_dir`]), made
    /// on first use and kept after the group goes, so the next group naming the same key finds
    /// what the last one wrote. `read_only` mounts it read-only in every container.
    Stored { key: String, read_only: bool },
    /// A type this machine cannot provide (named in the error a mount of it gets).
    Unsupported(String),
}

/// One file of a [`VolumeSource::Files`] volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFile {
    pub path: String,
    pub content: Vec<u8>,
    pub mode: u32,
}

/// A group's volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    pub name: String,
    pub source: VolumeSource,
}

/// A container's mount of a group volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub volume: String,
    pub path: String,
    pub sub_path: String,
    pub read_only: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {volume:?}: file path {path:?} must be relative, without '..'")]
    FilePath { volume: String, path: String },
    #[error("mount of volume {volume:?}: sub path {path:?} must be relative, without '..'")]
    SubPath { volume: String, path: String },
    #[error("mount path {0:?} must be an absolute path")]
    MountPath(String),
    #[error("no volume of the group is named {0:?}")]
    NoVolume(String),
    #[error("volume {volume:?} of type {kind} cannot be mounted by mock-eci's real runtime")]
    Unsupported { volume: String, kind: String },
    #[error("volume {volume:?}: could not {action} {path}")]
    Io {
        volume: String,
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Makes volume `spec` at `dir` (which does not exist yet).
pub fn create(dir: &Path, spec: &VolumeSpec) -> Result<(), VolumeError> {
    let io = |action, path: &Path| {
        let volume = spec.name.clone();
        let path = path.to_owned();
        move |source| VolumeError::Io {
            volume,
            action,
            path,
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    match &spec.source {
        VolumeSource::EmptyDir { memory, size_limit } => {
            if *memory {
                let mut options = "mode=0777".to_owned();
                if let Some(bytes) = size_limit {
                    options.push_str(&format!(",size={bytes}"));
                }
                let data = std::ffi::CString::new(options).unwrap_or_default();
                rustix::mount::mount(
                    "tmpfs",
                    dir,
                    "tmpfs",
                    MountFlags::NOSUID | MountFlags::NODEV,
                    &*data,
                )
                .map_err(|errno| io("mount a tmpfs on", dir)(errno.into()))?;
            }
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
                .map_err(io("set the mode of", dir))?;
        }
        VolumeSource::Files(files) => {
            let steps = super::rewrite::plan(&spec.name, &[], files)?;
            super::rewrite::apply(dir, &spec.name, &steps)?;
        }
        VolumeSource::Stored { .. } => {
            // Every user may write, as on an EmptyDir: ECI applies no fsGroup to a volume.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
                .map_err(io("set the mode of", dir))?;
        }
        VolumeSource::Unsupported(_) => {}
    }
    Ok(())
}

/// Where the volume of `key` lives in the store at `stores`: a digest names it, so no key
/// (the caller's DiskId, NFS server and path, OSS options) can lead out of the store.
pub fn store_dir(stores: &Path, key: &str) -> PathBuf {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let name: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    stores.join(name)
}

/// `path` as a relative path of normal components only (`a/b`, not `/a`, `../a` or ``).
pub fn relative_path(path: &str) -> Option<PathBuf> {
    let relative = Path::new(path);
    let normal = relative
        .components()
        .all(|component| matches!(component, Component::Normal(_) | Component::CurDir));
    (normal && relative.components().next().is_some()).then(|| relative.to_owned())
}

/// What the runtime bind-mounts for `mount`: the volume's directory, or its `SubPath` (made
/// if missing, as Kubernetes does) staged at `staging` (see the module's doc).
pub fn mount_source(
    volumes: &[(VolumeSpec, PathBuf)],
    mount: &MountSpec,
    staging: &Path,
) -> Result<PathBuf, VolumeError> {
    if !mount.path.starts_with('/') {
        return Err(VolumeError::MountPath(mount.path.clone()));
    }
    let (spec, dir) = volumes
        .iter()
        .find(|(spec, _)| spec.name == mount.volume)
        .ok_or_else(|| VolumeError::NoVolume(mount.volume.clone()))?;
    if let VolumeSource::Unsupported(kind) = &spec.source {
        return Err(VolumeError::Unsupported {
            volume: spec.name.clone(),
            kind: kind.clone(),
        });
    }
    if mount.sub_path.is_empty() {
        return Ok(dir.clone());
    }
    let sub_path = relative_path(&mount.sub_path).ok_or_else(|| VolumeError::SubPath {
        volume: mount.volume.clone(),
        path: mount.sub_path.clone(),
    })?;
    let (target, walked) = open_beneath(dir, &sub_path, &mount.volume)?;
    stage(&target, &walked, staging, &mount.volume)?;
    Ok(staging.to_owned())
}

fn io_error(
    volume: &str,
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> VolumeError {
    let volume = volume.to_owned();
    let path = path.to_owned();
    move |source| VolumeError::Io {
        volume,
        action,
        path,
        source,
    }
}

/// Opens `sub_path` beneath `dir` one component at a time: each made if missing (a single
/// name: mkdirat follows no link), then opened beneath the last with links refused.
fn open_beneath(
    dir: &Path,
    sub_path: &Path,
    volume: &str,
) -> Result<(std::os::fd::OwnedFd, PathBuf), VolumeError> {
    let beneath = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let mut target = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| io_error(volume, "open", dir)(errno.into()))?;
    let mut walked = dir.to_owned();
    for component in sub_path.components() {
        walked.push(component);
        match rustix::fs::mkdirat(&target, component.as_os_str(), Mode::from_raw_mode(0o777)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(errno) => return Err(io_error(volume, "create", &walked)(errno.into())),
        }
        target = rustix::fs::openat2(
            &target,
            component.as_os_str(),
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            beneath,
        )
        .map_err(|errno| io_error(volume, "open (no links)", &walked)(errno.into()))?;
    }
    Ok((target, walked))
}

/// Bind-mounts the opened `target` (a directory or a file) at `staging`.
fn stage(
    target: &std::os::fd::OwnedFd,
    walked: &Path,
    staging: &Path,
    volume: &str,
) -> Result<(), VolumeError> {
    let is_dir = rustix::fs::fstat(target)
        .map(|stat| {
            rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory
        })
        .map_err(|errno| io_error(volume, "inspect", walked)(errno.into()))?;
    if is_dir {
        std::fs::create_dir_all(staging).map_err(io_error(volume, "create", staging))?;
    } else {
        if let Some(parent) = staging.parent() {
            std::fs::create_dir_all(parent).map_err(io_error(volume, "create", parent))?;
        }
        std::fs::write(staging, b"").map_err(io_error(volume, "create", staging))?;
    }
    let opened = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(target)
    ));
    rustix::mount::mount_bind(&opened, staging)
        .map_err(|errno| io_error(volume, "bind-mount the sub path at", staging)(errno.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_stay_inside_the_volume() {
        for (path, ok) in [
            ("a", true),
            ("a/b/c.txt", true),
            ("./a", true),
            ("", false),
            ("/etc/passwd", false),
            ("../x", false),
            ("a/../../x", false),
        ] {
            assert_eq!(relative_path(path).is_some(), ok, "{path:?}");
        }
    }
}
