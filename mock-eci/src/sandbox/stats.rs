//! What a container uses, read from the cgroup the OCI runtime made for it: cumulative CPU
//! time and memory, as cAdvisor reads them for the kubelet. The parsers are pure; [`read`] is
//! the edge.
//!
//! cgroup v1 (also the v1 controllers of a hybrid machine): `cpuacct/<id>/cpuacct.usage`
//! (nanoseconds), `memory/<id>/memory.usage_in_bytes` and `memory.stat` (`total_rss`,
//! `total_cache`, `total_inactive_file`). cgroup v2: `<id>/cpu.stat` (`usage_usec`),
//! `memory.current` and `memory.stat` (`anon`, `file`, `inactive_file`). The working set is
//! the usage less the inactive file cache, the kubelet's figure for eviction and `kubectl top`.

use std::path::Path;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// One container's figures at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// CPU time used since the container started, in nanoseconds.
    pub cpu_nanos: u64,
    pub memory_bytes: u64,
    pub working_set_bytes: u64,
    pub rss_bytes: u64,
    pub cache_bytes: u64,
}

/// The value of `key` in a flat-keyed cgroup file (`memory.stat`, `cpu.stat`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok())?
    })
}

/// The memory figures from the usage and the `memory.stat` keys of the version at hand.
fn memory(usage: u64, stat: &str, (rss, cache, inactive): (&str, &str, &str)) -> Usage {
    let inactive = keyed(stat, inactive).unwrap_or(0);
    Usage {
        memory_bytes: usage,
        working_set_bytes: usage.saturating_sub(inactive),
        rss_bytes: keyed(stat, rss).unwrap_or(0),
        cache_bytes: keyed(stat, cache).unwrap_or(0),
        ..Usage::default()
    }
}

/// The figures of a cgroup v1 container: `cpuacct.usage`, `memory.usage_in_bytes`,
/// `memory.stat`.
pub fn parse_v1(cpuacct_usage: &str, memory_usage: &str, memory_stat: &str) -> Option<Usage> {
    Some(Usage {
        cpu_nanos: cpuacct_usage.trim().parse().ok()?,
        ..memory(
            memory_usage.trim().parse().ok()?,
            memory_stat,
            ("total_rss", "total_cache", "total_inactive_file"),
        )
    })
}

/// The figures of a cgroup v2 container: `cpu.stat`, `memory.current`, `memory.stat`.
pub fn parse_v2(cpu_stat: &str, memory_current: &str, memory_stat: &str) -> Option<Usage> {
    Some(Usage {
        cpu_nanos: keyed(cpu_stat, "usage_usec")?.saturating_mul(1_000),
        ..memory(
            memory_current.trim().parse().ok()?,
            memory_stat,
            ("anon", "file", "inactive_file"),
        )
    })
}

/// The figures of the container whose cgroup is `/<id>`; `None` when it has none (not
/// running) or this machine lacks the controllers.
pub fn read(id: &str) -> Option<Usage> {
    let root = Path::new(CGROUP_ROOT);
    let file = |path: std::path::PathBuf| std::fs::read_to_string(path).ok();
    if root.join("cgroup.controllers").exists() {
        let dir = root.join(id);
        parse_v2(
            &file(dir.join("cpu.stat"))?,
            &file(dir.join("memory.current"))?,
            &file(dir.join("memory.stat"))?,
        )
    } else {
        let memory = root.join("memory").join(id);
        parse_v1(
            &file(root.join("cpuacct").join(id).join("cpuacct.usage"))?,
            &file(memory.join("memory.usage_in_bytes"))?,
            &file(memory.join("memory.stat"))?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_figures() {
        let stat = "cache 4096\nrss 8192\ntotal_cache 12288\ntotal_rss 1048576\n\
                    total_inactive_file 8192\ntotal_active_file 4096\n";
        assert_eq!(
            parse_v1("2500000000\n", "1069056\n", stat),
            Some(Usage {
                cpu_nanos: 2_500_000_000,
                memory_bytes: 1_069_056,
                working_set_bytes: 1_060_864,
                rss_bytes: 1_048_576,
                cache_bytes: 12_288,
            })
        );
        assert_eq!(parse_v1("", "1", stat), None);
        // More inactive cache than usage (they are read apart): no working set, not a wrap.
        assert_eq!(
            parse_v1("1", "4096", stat).map(|u| u.working_set_bytes),
            Some(0)
        );
    }

    #[test]
    fn v2_figures() {
        let cpu = "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n";
        let stat = "anon 2097152\nfile 65536\nkernel 4096\ninactive_file 16384\n";
        assert_eq!(
            parse_v2(cpu, "2166784\n", stat),
            Some(Usage {
                cpu_nanos: 1_500_000_000,
                memory_bytes: 2_166_784,
                working_set_bytes: 2_150_400,
                rss_bytes: 2_097_152,
                cache_bytes: 65_536,
            })
        );
        assert_eq!(parse_v2("user_usec 1\n", "1", stat), None);
    }
}
