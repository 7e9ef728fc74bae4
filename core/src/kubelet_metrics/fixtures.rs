//! Fixtures of ECI's metric records and the pods they are about, for the tests of the kubelet
//! metrics here and of the daemon's scraper (feature `test-fixtures`).

#![allow(clippy::expect_used)]

use eci_proto::v20180808::{
    ContainerMetric, CpuMetric, FilesystemMetric, MemoryMetric, MetricRecord,
    NetworkInterfaceMetric, NetworkMetric,
};
use jiff::Timestamp;

use super::PodEntry;

/// `seconds` after a fixed instant (2023-11-14T22:13:20Z).
pub fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + seconds).expect("a valid time")
}

/// A pod entry with one container `app`, started at `at(0)` and its container at `at(1)`.
pub fn entry(namespace: &str, name: &str, running: bool) -> PodEntry {
    PodEntry {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        running,
        start_time: Some(at(0)),
        containers: vec![("app".into(), at(1))],
    }
}

/// ECI's CPU figures of a container.
pub fn cpu_metric(nano_cores: i64, core_nanos: i64) -> CpuMetric {
    CpuMetric {
        usage_nano_cores: nano_cores,
        usage_core_nano_seconds: core_nanos,
        load: 0,
        limit: 0,
    }
}

/// ECI's memory figures of a container with this working set.
pub fn memory_metric(working_set: i64) -> MemoryMetric {
    MemoryMetric {
        usage_bytes: working_set + 100,
        working_set,
        rss: working_set / 2,
        cache: 0,
        available_bytes: 1_000_000,
    }
}

/// One ECI metric record at `time`: one interface, one file system, and each container's
/// (name, nano-cores, core nanoseconds, working set).
pub fn record(time: &str, containers: &[(&str, i64, i64, i64)]) -> MetricRecord {
    MetricRecord {
        timestamp: time.into(),
        cpu: None,
        memory: None,
        network: Some(NetworkMetric {
            interfaces: vec![NetworkInterfaceMetric {
                name: "eth0".into(),
                rx_bytes: 1_000,
                rx_packets: 10,
                rx_errors: 1,
                tx_bytes: 500,
                tx_packets: 5,
                tx_errors: 0,
                ..NetworkInterfaceMetric::default()
            }],
        }),
        filesystem: vec![FilesystemMetric {
            fs_name: "/".into(),
            usage: 10,
            capacity: 100,
            available: 90,
            category: "system".into(),
        }],
        containers: containers
            .iter()
            .map(
                |(name, nano_cores, core_nanos, working_set)| ContainerMetric {
                    name: (*name).into(),
                    cpu: Some(cpu_metric(*nano_cores, *core_nanos)),
                    memory: Some(memory_metric(*working_set)),
                },
            )
            .collect(),
    }
}
