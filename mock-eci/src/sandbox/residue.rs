//! What of a sandbox exists on the machine, found by its prefix and state directory: network
//! namespaces, interfaces, mounts, cgroups and processes. The leak test compares it before and
//! after; a clean-up after a crash can start from it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::names::Prefix;

/// Everything found, each set sorted so two listings compare.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Residue {
    pub netns: BTreeSet<String>,
    pub links: BTreeSet<String>,
    pub mounts: BTreeSet<PathBuf>,
    pub cgroups: BTreeSet<PathBuf>,
    /// Processes in one of the sandbox's cgroups or network namespaces.
    pub processes: BTreeSet<u32>,
}

impl Residue {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Lists what the machine holds for `prefix` and `state_dir` now.
    pub fn list(prefix: &Prefix, state_dir: &Path) -> Self {
        let netns = names_in(Path::new("/run/netns"), &format!("{}-", prefix.as_str()));
        let net_inodes: BTreeSet<String> = netns
            .iter()
            .filter_map(|name| namespace_inode(&Path::new("/run/netns").join(name)))
            .collect();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Self {
            links: names_in(Path::new("/sys/class/net"), prefix.as_str())
                .into_iter()
                .filter(|name| prefix.owns_link(name))
                .collect(),
            mounts: mounts_under(&mountinfo, state_dir),
            cgroups: cgroups(prefix),
            processes: processes(prefix, &net_inodes),
            netns,
        }
    }
}

fn names_in(dir: &Path, starting: &str) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(starting))
        .collect()
}

/// The namespace identity (`net:[4026532…]`) behind an nsfs bind mount or a /proc link.
fn namespace_inode(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|meta| format!("net:[{}]", meta.ino()))
}

/// Mount points (field 5 of /proc/self/mountinfo) at or under `dir`.
pub(super) fn mounts_under(mountinfo: &str, dir: &Path) -> BTreeSet<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|point| point.starts_with(dir))
        .collect()
}

/// The sandbox's cgroups (named `<prefix>-…` at the top of a hierarchy), in the unified
/// hierarchy and in every v1 one.
fn cgroups(prefix: &Prefix) -> BTreeSet<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let starting = format!("{}-", prefix.as_str());
    let mut found: BTreeSet<PathBuf> = names_in(root, &starting)
        .into_iter()
        .map(|name| root.join(name))
        .collect();
    let Ok(hierarchies) = std::fs::read_dir(root) else {
        return found;
    };
    for hierarchy in hierarchies.filter_map(Result::ok) {
        let path = hierarchy.path();
        if !path.is_dir() {
            continue;
        }
        found.extend(
            names_in(&path, &starting)
                .into_iter()
                .map(|name| path.join(name)),
        );
    }
    found
}

/// Whether a /proc/PID/cgroup text places the process in one of the sandbox's cgroups.
fn in_sandbox_cgroup(cgroup: &str, prefix: &Prefix) -> bool {
    let marker = format!(":/{}-", prefix.as_str());
    cgroup.lines().any(|line| line.contains(&marker))
}

fn processes(prefix: &Prefix, net_inodes: &BTreeSet<String>) -> BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let dir = PathBuf::from(format!("/proc/{pid}"));
            let cgroup = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
            let net = std::fs::read_link(dir.join("ns/net"))
                .map(|link| link.to_string_lossy().into_owned())
                .unwrap_or_default();
            in_sandbox_cgroup(&cgroup, prefix) || net_inodes.contains(&net)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_are_read_from_mountinfo() {
        let mountinfo = "22 27 0:21 / /proc rw - proc proc rw\n\
            44 27 0:39 / /state/groups/g/containers/a/rootfs rw - overlay overlay rw\n\
            46 27 0:4 ipc:[4026532177] /state/groups/g/ipc rw - nsfs nsfs rw\n\
            47 27 0:4 / /stateful rw - tmpfs tmpfs rw\n";
        let found = mounts_under(mountinfo, Path::new("/state"));
        let expected: BTreeSet<PathBuf> =
            ["/state/groups/g/containers/a/rootfs", "/state/groups/g/ipc"]
                .into_iter()
                .map(PathBuf::from)
                .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn cgroup_membership_is_by_prefix() {
        let prefix = Prefix::new("vt1").expect("prefix");
        let cases = [
            ("4:memory:/vt1-g-app\n0::/vt1-g-app\n", true),
            ("0::/\n", false),
            ("4:memory:/vt10-g-app\n", false),
            ("4:memory:/process_api/vt1-x\n", false),
        ];
        for (text, expected) in cases {
            assert_eq!(in_sandbox_cgroup(text, &prefix), expected, "{text:?}");
        }
    }
}
