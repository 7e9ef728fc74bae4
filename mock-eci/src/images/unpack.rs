//! Applies one layer (a tar, gzip-compressed or not) onto a rootfs directory, as the OCI image
//! spec says: whiteouts (`.wh.<name>` removes `<name>` of the layers below, `.wh..wh..opq`
//! empties its directory of them) first, then the layer's own entries.
//!
//! A layer is untrusted input. An entry whose name has a `..` component is refused (the whole
//! layer fails); a leading `/` is read as the rootfs's root. Symbolic links met on the way to
//! an entry are followed as the container would see them: inside the rootfs, an absolute
//! target from its root, `..` stopping at its root, so no link (`evil -> /etc`,
//! `evil -> ../../..`) leads a write outside. Device nodes and FIFOs are skipped (a pod has no
//! use for the image's, and creating them needs privileges the store should not use).

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// The prefix that marks a whiteout entry.
const WHITEOUT: &str = ".wh.";
/// The entry that marks its directory opaque.
const OPAQUE: &str = ".wh..wh..opq";
/// How many symbolic links one path may pass through (Linux's own limit).
const MAX_LINK_HOPS: u32 = 40;

/// Applying a layer failed.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The layer could not be read or written.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An entry's name (or a hard link's target) has a `..` component.
    #[error("entry {0:?} escapes the rootfs")]
    Escape(String),
    /// Resolving a path passed through more than [`MAX_LINK_HOPS`] symbolic links.
    #[error("too many levels of symbolic links under {0:?}")]
    LinkLoop(String),
    /// The layer is compressed in a way the store does not read (zstd).
    #[error("unsupported layer compression (only gzip and plain tar are read)")]
    Compression,
    /// The image's files add up to more than the store unpacks for one image.
    #[error("the image unpacks to more than {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> UnpackError {
    let what = what.into();
    move |source| UnpackError::Io { what, source }
}

/// How many bytes of file content an image may still unpack (a compressed layer can expand
/// far beyond its size: a registry is untrusted).
#[derive(Debug)]
pub(super) struct Budget {
    limit: u64,
    left: u64,
}

impl Budget {
    pub(super) fn new(limit: u64) -> Self {
        Self { limit, left: limit }
    }

    fn spend(&mut self, bytes: u64) -> Result<(), UnpackError> {
        self.left = self
            .left
            .checked_sub(bytes)
            .ok_or(UnpackError::TooLarge { limit: self.limit })?;
        Ok(())
    }
}

/// Applies the layer in the file `blob` onto `root`, its files' sizes taken from `budget`.
pub(super) fn apply_layer(
    root: &Path,
    blob: &Path,
    budget: &mut Budget,
) -> Result<(), UnpackError> {
    apply_whiteouts(root, open_layer(blob)?)?;
    extract(root, open_layer(blob)?, budget)
}

/// The layer's tar stream, gunzipped when it starts with gzip's magic bytes.
fn open_layer(blob: &Path) -> Result<tar::Archive<Box<dyn Read>>, UnpackError> {
    let mut file =
        BufReader::new(std::fs::File::open(blob).map_err(io(format!("open {}", blob.display())))?);
    let magic =
        std::io::BufRead::fill_buf(&mut file).map_err(io(format!("read {}", blob.display())))?;
    let reader: Box<dyn Read> = match magic {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(file)),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => return Err(UnpackError::Compression),
        _ => Box::new(file),
    };
    Ok(tar::Archive::new(reader))
}

/// An entry's name as rootfs-relative components; refuses `..`.
fn components(name: &[u8]) -> Result<Vec<OsString>, UnpackError> {
    let path = Path::new(OsStr::from_bytes(name));
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part.to_owned()),
            Component::ParentDir => {
                return Err(UnpackError::Escape(path.display().to_string()));
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(parts)
}

/// First pass: the layer's whiteouts remove what the layers below put there.
fn apply_whiteouts(
    root: &Path,
    mut archive: tar::Archive<Box<dyn Read>>,
) -> Result<(), UnpackError> {
    for entry in archive.entries().map_err(io("read the layer"))? {
        let entry = entry.map_err(io("read a layer entry"))?;
        let mut parts = components(&entry.path_bytes())?;
        let Some(name) = parts.pop() else { continue };
        let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT.as_bytes()) else {
            continue;
        };
        let dir = resolve(root, &parts, false)?;
        if !dir.is_dir() {
            continue;
        }
        if name == OPAQUE {
            let children =
                std::fs::read_dir(&dir).map_err(io(format!("list {}", dir.display())))?;
            for child in children {
                let child = child.map_err(io(format!("list {}", dir.display())))?;
                remove(&child.path())?;
            }
        } else {
            // `.wh..` would name the directory's parent (the rootfs's, at its top): refused.
            let hidden = OsStr::from_bytes(hidden);
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(UnpackError::Escape(
                    Path::new(OsStr::from_bytes(&entry.path_bytes()))
                        .display()
                        .to_string(),
                ));
            }
            remove(&dir.join(hidden))?;
        }
    }
    Ok(())
}

/// Removes `path` (a directory with its contents), never following a link; absent is fine.
fn remove(path: &Path) -> Result<(), UnpackError> {
    let removed = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    };
    removed.map_err(io(format!("remove {}", path.display())))
}

/// Second pass: the layer's own entries (whiteouts skipped).
fn extract(
    root: &Path,
    mut archive: tar::Archive<Box<dyn Read>>,
    budget: &mut Budget,
) -> Result<(), UnpackError> {
    for entry in archive.entries().map_err(io("read the layer"))? {
        let mut entry = entry.map_err(io("read a layer entry"))?;
        let mut parts = components(&entry.path_bytes())?;
        let Some(name) = parts.pop() else { continue };
        if name.as_bytes().starts_with(WHITEOUT.as_bytes()) {
            continue;
        }
        let parent = resolve(root, &parts, true)?;
        let path = parent.join(&name);
        let header = entry.header();
        let kind = header.entry_type();
        budget.spend(header.size().unwrap_or(0))?;
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let owner = (header.uid().ok(), header.gid().ok());
        match kind {
            tar::EntryType::Directory => make_dir(&path, mode)?,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                replace(&path)?;
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(io(format!("create {}", path.display())))?;
                std::io::copy(&mut entry, &mut file)
                    .map_err(io(format!("write {}", path.display())))?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                    .map_err(io(format!("chmod {}", path.display())))?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|target| OsStr::from_bytes(&target).to_owned())
                    .unwrap_or_default();
                replace(&path)?;
                std::os::unix::fs::symlink(&target, &path)
                    .map_err(io(format!("link {}", path.display())))?;
            }
            tar::EntryType::Link => {
                let target = entry.link_name_bytes().unwrap_or_default();
                let mut target_parts = components(&target)?;
                let Some(target_name) = target_parts.pop() else {
                    continue;
                };
                let source = resolve(root, &target_parts, false)?.join(target_name);
                replace(&path)?;
                std::fs::hard_link(&source, &path).map_err(io(format!(
                    "hard-link {} to {}",
                    path.display(),
                    source.display()
                )))?;
            }
            _ => {
                tracing::debug!(path = %path.display(), ?kind, "layer entry skipped");
                continue;
            }
        }
        own(&path, owner);
    }
    Ok(())
}

/// Sets the entry's owner, best effort: an unprivileged mock-eci cannot, and runs as its own
/// user anyway.
fn own(path: &Path, (uid, gid): (Option<u64>, Option<u64>)) {
    let id = |n: Option<u64>| n.and_then(|n| u32::try_from(n).ok());
    if let Err(error) = std::os::unix::fs::lchown(path, id(uid), id(gid)) {
        tracing::trace!(path = %path.display(), %error, "layer entry keeps the store's owner");
    }
}

/// A directory at `path` with `mode` (an existing directory is kept, with its contents).
fn make_dir(path: &Path, mode: u32) -> Result<(), UnpackError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            remove(path)?;
            std::fs::create_dir(path).map_err(io(format!("create {}", path.display())))?;
        }
        Err(_) => std::fs::create_dir(path).map_err(io(format!("create {}", path.display())))?,
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("chmod {}", path.display())))
}

/// Clears `path` for a new non-directory entry (a lower layer's file, link or directory).
fn replace(path: &Path) -> Result<(), UnpackError> {
    remove(path)
}

/// The real path of the rootfs-relative `parts` inside `root`: each symbolic link followed as
/// the container would see it (absolute targets from `root`, `..` stopped at `root`). With
/// `create`, missing directories are made (0755), as tar tools do for an entry whose parents
/// the layer does not list.
fn resolve(root: &Path, parts: &[OsString], create: bool) -> Result<PathBuf, UnpackError> {
    let mut pending: VecDeque<OsString> = parts.iter().cloned().collect();
    let mut resolved: Vec<OsString> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        if part == "." || part.is_empty() {
            continue;
        }
        let here: PathBuf = std::iter::once(root.as_os_str())
            .chain(resolved.iter().map(OsString::as_os_str))
            .chain(std::iter::once(part.as_os_str()))
            .collect();
        match std::fs::symlink_metadata(&here) {
            Ok(meta) if meta.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Err(UnpackError::LinkLoop(here.display().to_string()));
                }
                let target = std::fs::read_link(&here)
                    .map_err(io(format!("read link {}", here.display())))?;
                if target.is_absolute() {
                    resolved.clear();
                }
                for component in target.components().rev() {
                    match component {
                        Component::Normal(p) => pending.push_front(p.to_owned()),
                        Component::ParentDir => pending.push_front("..".into()),
                        Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                    }
                }
            }
            Ok(_) => resolved.push(part),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && create => {
                std::fs::create_dir(&here).map_err(io(format!("create {}", here.display())))?;
                std::fs::set_permissions(&here, std::fs::Permissions::from_mode(0o755))
                    .map_err(io(format!("chmod {}", here.display())))?;
                resolved.push(part);
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => resolved.push(part),
            Err(error) => return Err(io(format!("inspect {}", here.display()))(error)),
        }
    }
    Ok(std::iter::once(root.as_os_str())
        .chain(resolved.iter().map(OsString::as_os_str))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_with_a_parent_component_are_refused() {
        for (name, ok) in [
            ("bin/busybox", true),
            ("/etc/passwd", true),
            ("./usr/bin/", true),
            ("../outside", false),
            ("usr/../../outside", false),
            ("a/b/..", false),
        ] {
            assert_eq!(components(name.as_bytes()).is_ok(), ok, "{name}");
        }
    }

    #[test]
    fn a_whiteout_of_the_parent_directory_is_refused() {
        let store = tempfile::tempdir().expect("tempdir");
        let root = store.path().join("rootfs");
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        std::fs::write(store.path().join("beside-the-rootfs"), "kept").expect("write");
        for name in ["etc/.wh...", ".wh...", ".wh.."] {
            let mut tar = tar::Builder::new(Vec::new());
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(0);
            header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            header.set_cksum();
            tar.append(&header, &[][..]).expect("append");
            let blob = store.path().join("layer.tar");
            std::fs::write(&blob, tar.into_inner().expect("tar")).expect("write");
            assert!(
                matches!(
                    apply_layer(&root, &blob, &mut Budget::new(1 << 20)),
                    Err(UnpackError::Escape(_))
                ),
                "{name}"
            );
            assert!(root.join("etc").is_dir(), "{name}");
            assert!(store.path().join("beside-the-rootfs").is_file(), "{name}");
        }
    }

    #[test]
    fn links_resolve_inside_the_root() {
        let root = tempfile::tempdir().expect("tempdir");
        let root = root.path();
        std::fs::create_dir(root.join("etc")).expect("mkdir");
        std::os::unix::fs::symlink("/etc", root.join("abs")).expect("link");
        std::os::unix::fs::symlink("../../../../etc", root.join("rel")).expect("link");
        std::os::unix::fs::symlink("loop", root.join("loop")).expect("link");
        for link in ["abs", "rel"] {
            let got = resolve(root, &[link.into(), "x".into()], false).expect("resolve");
            assert_eq!(got, root.join("etc/x"), "{link}");
        }
        assert!(matches!(
            resolve(root, &["loop".into(), "x".into()], false),
            Err(UnpackError::LinkLoop(_))
        ));
    }
}
