//! Writing a files volume (`ConfigFileVolume`) and bringing a running group's copy up to date
//! when UpdateContainerGroup changes its files, without touching the containers.
//!
//! A reader in a container never sees half a file: each file is written whole to a temporary
//! name in its own directory, given its mode, then renamed over the old one (rename is atomic
//! within a directory, and the container's bind mount of the volume shows the new file at
//! once). Files the volume no longer lists are removed, with the directories that only held
//! them. Files are replaced one at a time rather than all at once (the kubelet's AtomicWriter
//! swaps a `..data` link), so that a `SubPath` mount of a directory of the volume, which the
//! sandbox opens with links refused, keeps working.
//!
//! Every path is opened beneath the volume's directory with symbolic links refused (`openat2`,
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), so nothing in the volume can lead a write out of it.
//!
//! [`plan`] decides (pure); [`apply`] does.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::volumes::{VolumeError, VolumeFile};

/// The name a file is written to before it is renamed into place. Kubernetes refuses keys and
/// paths that start with `..`, so no file of a volume has it.
const TEMPORARY: &str = "..mock-eci-new";

/// One step of bringing a files volume from the files it holds to those it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileStep {
    /// The file is gone from the volume's list: remove it.
    Remove(PathBuf),
    /// A directory that only held removed files: remove it if it is empty.
    RemoveDir(PathBuf),
    /// The file is new, or its content or mode changed: write it whole, then swap it in.
    Write {
        path: PathBuf,
        content: Vec<u8>,
        mode: u32,
    },
}

/// The steps from files `old` to files `new` of volume `volume`: removals first (files, then
/// the directories they leave empty, the deepest first), then the writes of what is new or
/// changed. A path listed twice counts once, as its last entry (which is what a fresh write
/// leaves). A path that is not relative or climbs out (`..`) is refused.
pub fn plan(
    volume: &str,
    old: &[VolumeFile],
    new: &[VolumeFile],
) -> Result<Vec<FileStep>, VolumeError> {
    let old = by_path(volume, old)?;
    let new = by_path(volume, new)?;
    let mut steps: Vec<FileStep> = old
        .keys()
        .filter(|path| !new.contains_key(*path))
        .map(|path| FileStep::Remove(path.clone()))
        .collect();
    let kept_dirs: BTreeSet<&Path> = new.keys().flat_map(|path| parents(path)).collect();
    let emptied: BTreeSet<&Path> = old
        .keys()
        .filter(|path| !new.contains_key(*path))
        .flat_map(|path| parents(path))
        .filter(|dir| !kept_dirs.contains(dir))
        .collect();
    // Deepest first: a directory is empty only once those beneath it are gone.
    let mut emptied: Vec<&Path> = emptied.into_iter().collect();
    emptied.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
    steps.extend(
        emptied
            .into_iter()
            .map(|dir| FileStep::RemoveDir(dir.to_owned())),
    );
    for (path, file) in &new {
        let unchanged = old
            .get(path)
            .is_some_and(|before| before.content == file.content && before.mode == file.mode);
        if !unchanged {
            steps.push(FileStep::Write {
                path: path.clone(),
                content: file.content.clone(),
                mode: file.mode & 0o7777,
            });
        }
    }
    Ok(steps)
}

/// The files by their normalised relative path (`./a//b` is `a/b`); the last entry of a path
/// wins.
fn by_path<'a>(
    volume: &str,
    files: &'a [VolumeFile],
) -> Result<BTreeMap<PathBuf, &'a VolumeFile>, VolumeError> {
    files
        .iter()
        .map(|file| {
            let path = normal_path(&file.path).ok_or_else(|| VolumeError::FilePath {
                volume: volume.to_owned(),
                path: file.path.clone(),
            })?;
            Ok((path, file))
        })
        .collect()
}

/// `path`'s normal components (`a/b`), or `None` when it is absolute, climbs (`..`) or names
/// nothing.
fn normal_path(path: &str) -> Option<PathBuf> {
    let mut normal = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(name) => normal.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (normal.components().next().is_some()).then_some(normal)
}

/// The directories `path` lies in, below the volume's own (`a/b/c` → `a/b`, `a`).
fn parents(path: &Path) -> impl Iterator<Item = &Path> {
    path.ancestors()
        .skip(1)
        .filter(|dir| dir.components().next().is_some())
}

/// Carries out `steps` in the volume at `dir` (volume `volume`, named in errors). A file or
/// directory already gone is no error, so a failed update can be tried again from the start.
pub fn apply(dir: &Path, volume: &str, steps: &[FileStep]) -> Result<(), VolumeError> {
    let fail = |action: &'static str, path: &Path| {
        let path = dir.join(path);
        let volume = volume.to_owned();
        move |errno: Errno| VolumeError::Io {
            volume,
            action,
            path,
            source: errno.into(),
        }
    };
    let root = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail("open", Path::new("")))?;
    for step in steps {
        match step {
            FileStep::Remove(path) | FileStep::RemoveDir(path) => {
                let flags = match step {
                    FileStep::RemoveDir(_) => AtFlags::REMOVEDIR,
                    _ => AtFlags::empty(),
                };
                let (parent, name) = split(path);
                let removed = match open_dir(&root, parent, false) {
                    Ok(parent) => rustix::fs::unlinkat(&parent, name, flags),
                    Err(errno) => Err(errno),
                };
                match removed {
                    Ok(()) | Err(Errno::NOENT | Errno::NOTEMPTY) => {}
                    Err(errno) => return Err(fail("remove", path)(errno)),
                }
            }
            FileStep::Write {
                path,
                content,
                mode,
            } => write_file(&root, path, content, *mode).map_err(fail("write", path))?,
        }
    }
    Ok(())
}

/// Writes `content` with `mode` to a temporary file in `path`'s directory (made if missing),
/// then renames it to `path`.
fn write_file(root: &OwnedFd, path: &Path, content: &[u8], mode: u32) -> Result<(), Errno> {
    let (parent, name) = split(path);
    let parent = open_dir(root, parent, true)?;
    match rustix::fs::unlinkat(&parent, TEMPORARY, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(errno) => return Err(errno),
    }
    let temporary = rustix::fs::openat(
        &parent,
        TEMPORARY,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    rustix::fs::fchmod(&temporary, Mode::from_raw_mode(mode))?;
    let mut file = std::fs::File::from(temporary);
    file.write_all(content)
        .map_err(|error| Errno::from_io_error(&error).unwrap_or(Errno::IO))?;
    drop(file);
    rustix::fs::renameat(&parent, TEMPORARY, &parent, name)
}

/// The directory part and the name of a normal relative path.
fn split(path: &Path) -> (&Path, &std::ffi::OsStr) {
    (
        path.parent().unwrap_or(Path::new("")),
        path.file_name().unwrap_or_default(),
    )
}

/// Opens directory `relative` beneath `root` one component at a time, links refused; with
/// `create`, a missing component is made (mode 0755: the volume's files are root's).
fn open_dir(root: &OwnedFd, relative: &Path, create: bool) -> Result<OwnedFd, Errno> {
    let beneath = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let mut dir = rustix::io::dup(root)?;
    for component in relative.components() {
        let name = component.as_os_str();
        if create {
            match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(errno) => return Err(errno),
            }
        }
        dir = rustix::fs::openat2(
            &dir,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            beneath,
        )?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, content: &str, mode: u32) -> VolumeFile {
        VolumeFile {
            path: path.into(),
            content: content.as_bytes().to_vec(),
            mode,
        }
    }

    fn write(path: &str, content: &str, mode: u32) -> FileStep {
        FileStep::Write {
            path: path.into(),
            content: content.as_bytes().to_vec(),
            mode,
        }
    }

    #[test]
    fn the_plan_writes_what_changed_and_removes_what_is_gone() {
        let remove = |path: &str| FileStep::Remove(path.into());
        let remove_dir = |path: &str| FileStep::RemoveDir(path.into());
        // What the case shows, the files before, the files after, the steps.
        type Case = (
            &'static str,
            Vec<VolumeFile>,
            Vec<VolumeFile>,
            Vec<FileStep>,
        );
        let cases: Vec<Case> = vec![
            (
                "a fresh volume writes every file",
                vec![],
                vec![file("a", "1", 0o644), file("d/b", "2", 0o400)],
                vec![write("a", "1", 0o644), write("d/b", "2", 0o400)],
            ),
            (
                "nothing changed: nothing to do",
                vec![file("a", "1", 0o644)],
                vec![file("a", "1", 0o644)],
                vec![],
            ),
            (
                "new content is written, keeping the mode it is given",
                vec![file("labels", "a=1", 0o400), file("name", "x", 0o644)],
                vec![file("labels", "a=2", 0o400), file("name", "x", 0o644)],
                vec![write("labels", "a=2", 0o400)],
            ),
            (
                "a new mode alone rewrites the file",
                vec![file("a", "1", 0o644)],
                vec![file("a", "1", 0o600)],
                vec![write("a", "1", 0o600)],
            ),
            (
                "a key gone is removed, a new one written",
                vec![file("data-1", "v1", 0o644)],
                vec![file("data-3", "v3", 0o644)],
                vec![remove("data-1"), write("data-3", "v3", 0o644)],
            ),
            (
                "directories left empty go, the deepest first; a shared one stays",
                vec![
                    file("x/y/z", "1", 0o644),
                    file("x/keep", "2", 0o644),
                    file("p/q", "3", 0o644),
                ],
                vec![file("x/keep", "2", 0o644)],
                vec![
                    remove("p/q"),
                    remove("x/y/z"),
                    remove_dir("x/y"),
                    remove_dir("p"),
                ],
            ),
            (
                "a directory that becomes a file is emptied before the write",
                vec![file("a/b", "1", 0o644)],
                vec![file("a", "2", 0o644)],
                vec![remove("a/b"), remove_dir("a"), write("a", "2", 0o644)],
            ),
            (
                "paths are compared normalised; the last of a repeated path wins",
                vec![file("./d//f", "1", 0o644)],
                vec![file("d/f", "1", 0o644), file("d/f", "2", 0o644)],
                vec![write("d/f", "2", 0o644)],
            ),
            (
                "only permission bits are written",
                vec![],
                vec![file("a", "1", 0o100_644)],
                vec![write("a", "1", 0o644)],
            ),
        ];
        for (what, old, new, expected) in cases {
            assert_eq!(plan("v", &old, &new).expect(what), expected, "{what}");
        }
    }

    #[test]
    fn applying_swaps_files_in_keeps_modes_and_follows_no_link_out() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (volume, outside) = (dir.path().join("volume"), dir.path().join("outside"));
        std::fs::create_dir_all(&outside).expect("mkdir");
        let first = [file("labels", "a=1", 0o400), file("d/old", "x", 0o644)];
        std::fs::create_dir_all(&volume).expect("mkdir");
        apply(&volume, "v", &plan("v", &[], &first).expect("plan")).expect("first write");
        let second = [file("labels", "a=2", 0o400), file("e/new", "y", 0o600)];
        apply(&volume, "v", &plan("v", &first, &second).expect("plan")).expect("update");
        let mode = |path: &str| {
            let meta = std::fs::metadata(volume.join(path)).expect(path);
            meta.permissions().mode() & 0o7777
        };
        assert_eq!(
            std::fs::read_to_string(volume.join("labels")).unwrap(),
            "a=2"
        );
        assert_eq!((mode("labels"), mode("e/new")), (0o400, 0o600));
        let mut left: Vec<_> = std::fs::read_dir(&volume)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["e", "labels"],
            "the removed file, its directory, no temporary"
        );

        // A link in the volume (a container could plant one in a writable copy) is no way out.
        std::os::unix::fs::symlink(&outside, volume.join("link")).expect("symlink");
        let through = plan("v", &[], &[file("link/secret", "z", 0o644)]).expect("plan");
        let refused = apply(&volume, "v", &through);
        assert!(
            matches!(refused, Err(VolumeError::Io { .. })),
            "{refused:?}"
        );
        assert!(
            !outside.join("secret").exists(),
            "nothing written out of the volume"
        );
    }

    #[test]
    fn the_plan_refuses_paths_out_of_the_volume() {
        for path in ["/etc/passwd", "../x", "a/../../x", "", "."] {
            let refused = plan("v", &[], &[file(path, "1", 0o644)]);
            assert!(
                matches!(refused, Err(VolumeError::FilePath { .. })),
                "{path:?}: {refused:?}"
            );
        }
    }
}
