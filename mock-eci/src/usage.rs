//! Plausible, deterministic resource usage for the metric calls.
//!
//! Usage of a group at a time is a function of its id, container name and the time bucket:
//! repeated calls agree, and different groups differ. CPU stays between 5% and 45% of the
//! container's share, memory between 20% and 60%.

use eci_proto::v20180808::{
    ContainerMetric, CpuMetric, FilesystemMetric, MemoryMetric, MetricRecord,
    NetworkInterfaceMetric, NetworkMetric,
};

use crate::clock::{Millis, rfc3339};
use crate::group::Group;
use crate::rng;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The record of `group` for the period starting at `at`.
pub fn record(group: &Group, at: Millis, period_ms: Millis, with_containers: bool) -> MetricRecord {
    let bucket = at / period_ms.max(1);
    let containers: Vec<ContainerMetric> = group
        .request
        .container
        .iter()
        .map(|spec| {
            let share_cpu = spec
                .cpu
                .unwrap_or(group.cpu / group.request.container.len().max(1) as f64);
            let share_memory = spec
                .memory
                .unwrap_or(group.memory / group.request.container.len().max(1) as f64);
            let draw = unit(&format!("{}/{}/{bucket}", group.id, spec.name));
            ContainerMetric {
                name: spec.name.clone(),
                cpu: Some(cpu(share_cpu, draw, at - group.created_at)),
                memory: Some(memory(share_memory, draw)),
            }
        })
        .collect();
    let sum = |f: fn(&ContainerMetric) -> i64| containers.iter().map(f).sum::<i64>();
    let total_cpu = CpuMetric {
        usage_nano_cores: sum(|c| c.cpu.as_ref().map_or(0, |cpu| cpu.usage_nano_cores)),
        usage_core_nano_seconds: sum(|c| {
            c.cpu.as_ref().map_or(0, |cpu| cpu.usage_core_nano_seconds)
        }),
        load: sum(|c| c.cpu.as_ref().map_or(0, |cpu| cpu.load)),
        limit: to_i64(group.cpu * 1000.0),
    };
    let total_memory = MemoryMetric {
        usage_bytes: sum(|c| c.memory.as_ref().map_or(0, |m| m.usage_bytes)),
        working_set: sum(|c| c.memory.as_ref().map_or(0, |m| m.working_set)),
        rss: sum(|c| c.memory.as_ref().map_or(0, |m| m.rss)),
        cache: sum(|c| c.memory.as_ref().map_or(0, |m| m.cache)),
        available_bytes: to_i64(group.memory * GIB)
            - sum(|c| c.memory.as_ref().map_or(0, |m| m.working_set)),
    };
    let elapsed_s = (at - group.created_at).max(0) / 1_000;
    let net_draw = unit(&format!("{}/net", group.id));
    MetricRecord {
        timestamp: rfc3339(at),
        cpu: Some(total_cpu),
        memory: Some(total_memory),
        network: Some(NetworkMetric {
            interfaces: vec![NetworkInterfaceMetric {
                name: "eth0".into(),
                rx_bytes: elapsed_s * to_i64(2_000.0 + 8_000.0 * net_draw),
                rx_packets: elapsed_s * 20,
                rx_errors: 0,
                tx_bytes: elapsed_s * to_i64(1_000.0 + 4_000.0 * net_draw),
                tx_packets: elapsed_s * 15,
                tx_errors: 0,
            }],
        }),
        filesystem: vec![FilesystemMetric {
            fs_name: "/".into(),
            usage_bytes: to_i64(0.5 * GIB + net_draw * GIB),
            capacity_bytes: to_i64(30.0 * GIB),
            available_bytes: to_i64(29.5 * GIB - net_draw * GIB),
        }],
        containers: if with_containers {
            containers
        } else {
            Vec::new()
        },
    }
}

fn cpu(share: f64, draw: f64, elapsed_ms: Millis) -> CpuMetric {
    let fraction = 0.05 + 0.4 * draw;
    let nano_cores = share * fraction * 1e9;
    CpuMetric {
        usage_nano_cores: to_i64(nano_cores),
        usage_core_nano_seconds: to_i64(nano_cores * (elapsed_ms.max(0) as f64 / 1000.0)),
        load: to_i64(fraction * 100.0),
        limit: to_i64(share * 1000.0),
    }
}

fn memory(share_gib: f64, draw: f64) -> MemoryMetric {
    let total = share_gib * GIB;
    let working_set = total * (0.2 + 0.4 * draw);
    MemoryMetric {
        usage_bytes: to_i64(working_set * 1.1),
        working_set: to_i64(working_set),
        rss: to_i64(working_set * 0.8),
        cache: to_i64(working_set * 0.3),
        available_bytes: to_i64(total - working_set),
    }
}

fn unit(key: &str) -> f64 {
    rng::SplitMix::new(rng::stable_hash(key.as_bytes())).next_f64()
}

#[allow(clippy::cast_possible_truncation)]
fn to_i64(value: f64) -> i64 {
    value.max(0.0).round() as i64
}
