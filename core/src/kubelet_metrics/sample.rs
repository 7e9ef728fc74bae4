//! From ECI's metric records to the kubelet's figures: the batches the groups are asked in,
//! one record → one pod's sample, and the node's figures as sums over its pods — with counters
//! that never go backwards although pods come, restart and go.
//!
//! The figures carry the kubelet's `statsapi` field names: `/stats/summary` writes them as they
//! are, each beside its time (`render`).

use std::collections::{HashMap, HashSet};

use eci_proto::v20180808::{ContainerMetric, CpuMetric, MemoryMetric, MetricRecord};
use jiff::Timestamp;
use serde::Serialize;

use super::pods::PodEntry;

/// Groups per `DescribeMultiContainerGroupMetric` call: the API's maximum.
pub const BATCH: usize = 20;

/// The calls to make, `BATCH` groups a call: every group once, in a stable order (so the same
/// pods land in the same calls from one scrape to the next).
pub fn batches<'a>(groups: impl IntoIterator<Item = &'a str>) -> Vec<Vec<String>> {
    let mut ids: Vec<&str> = groups.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    ids.chunks(BATCH)
        .map(|call| call.iter().map(|&id| id.to_owned()).collect())
        .collect()
}

/// CPU figures of a pod or container (`statsapi.CPUStats` but its time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Cpu {
    /// Current usage in nanocores.
    #[serde(rename = "usageNanoCores")]
    pub nano_cores: u64,
    /// Cumulative usage in core-nanoseconds (a counter).
    #[serde(rename = "usageCoreNanoSeconds")]
    pub core_nanos: u64,
}

/// Memory figures of a pod or container (`statsapi.MemoryStats` but its time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// Available until the limit, when ECI says.
    #[serde(rename = "availableBytes", skip_serializing_if = "Option::is_none")]
    pub available: Option<u64>,
    /// Usage (working set plus inactive file pages).
    #[serde(rename = "usageBytes")]
    pub usage: u64,
    /// Working set: what metrics-server and the HPA read.
    #[serde(rename = "workingSetBytes")]
    pub working_set: u64,
    /// RSS.
    #[serde(rename = "rssBytes")]
    pub rss: u64,
}

/// One network interface's counters (`statsapi.InterfaceStats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// e.g. `eth0`.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Send errors.
    pub tx_errors: u64,
}

/// A filesystem's figures (`statsapi.FsStats` but its time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Fs {
    /// Bytes available.
    #[serde(rename = "availableBytes")]
    pub available: u64,
    /// Capacity.
    #[serde(rename = "capacityBytes")]
    pub capacity: u64,
    /// Bytes used.
    #[serde(rename = "usedBytes")]
    pub used: u64,
}

/// One container's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSample {
    /// Its name.
    pub name: String,
    /// When it started (from the pod's status), if known.
    pub start_time: Option<Timestamp>,
    /// CPU.
    pub cpu: Option<Cpu>,
    /// Memory.
    pub memory: Option<Memory>,
}

/// One pod's figures from one ECI record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSample {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `status.startTime`.
    pub start_time: Option<Timestamp>,
    /// When ECI measured it: the record's own time, the sample's timestamp.
    pub at: Timestamp,
    /// The group's CPU.
    pub cpu: Option<Cpu>,
    /// The group's memory.
    pub memory: Option<Memory>,
    /// The group's interfaces.
    pub interfaces: Vec<Interface>,
    /// The group's ephemeral storage (its filesystems summed).
    pub fs: Option<Fs>,
    /// Its containers, by name.
    pub containers: Vec<ContainerSample>,
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn cpu(metric: Option<&CpuMetric>) -> Option<Cpu> {
    metric.map(|cpu| Cpu {
        nano_cores: unsigned(cpu.usage_nano_cores),
        core_nanos: unsigned(cpu.usage_core_nano_seconds),
    })
}

fn memory(metric: Option<&MemoryMetric>) -> Option<Memory> {
    metric.map(|memory| Memory {
        working_set: unsigned(memory.working_set),
        usage: unsigned(memory.usage_bytes),
        rss: unsigned(memory.rss),
        // ECI leaves it 0 when it has no limit to count from.
        available: (memory.available_bytes > 0).then(|| unsigned(memory.available_bytes)),
    })
}

fn container(pod: &PodEntry, metric: &ContainerMetric) -> ContainerSample {
    ContainerSample {
        name: metric.name.clone(),
        start_time: pod.container_start(&metric.name),
        cpu: cpu(metric.cpu.as_ref()),
        memory: memory(metric.memory.as_ref()),
    }
}

/// The newest of `records` with a readable time.
fn newest(records: &[MetricRecord]) -> Option<(Timestamp, &MetricRecord)> {
    records
        .iter()
        .filter_map(|record| Some((record.timestamp.parse::<Timestamp>().ok()?, record)))
        .max_by_key(|(at, _)| *at)
}

/// `pod`'s sample from the records ECI returned for its group: the newest record, stamped
/// with its own time. `None` when there is no record with a readable time (a group not
/// running yet has none).
pub fn pod_sample(pod: &PodEntry, records: &[MetricRecord]) -> Option<PodSample> {
    let (at, record) = newest(records)?;
    let mut containers: Vec<ContainerSample> = record
        .containers
        .iter()
        .map(|metric| container(pod, metric))
        .collect();
    containers.sort_by(|a, b| a.name.cmp(&b.name));
    let interfaces = record
        .network
        .iter()
        .flat_map(|network| &network.interfaces)
        .map(|interface| Interface {
            name: interface.name.clone(),
            rx_bytes: unsigned(interface.rx_bytes),
            rx_errors: unsigned(interface.rx_errors),
            tx_bytes: unsigned(interface.tx_bytes),
            tx_errors: unsigned(interface.tx_errors),
        })
        .collect();
    let fs = (!record.filesystem.is_empty()).then(|| {
        record.filesystem.iter().fold(Fs::default(), |sum, fs| Fs {
            used: sum.used.saturating_add(unsigned(fs.usage)),
            capacity: sum.capacity.saturating_add(unsigned(fs.capacity)),
            available: sum.available.saturating_add(unsigned(fs.available)),
        })
    });
    // A record without group totals is summed from its containers.
    let group_cpu = cpu(record.cpu.as_ref()).or_else(|| {
        containers.iter().filter_map(|c| c.cpu).reduce(|a, b| Cpu {
            nano_cores: a.nano_cores.saturating_add(b.nano_cores),
            core_nanos: a.core_nanos.saturating_add(b.core_nanos),
        })
    });
    let group_memory = memory(record.memory.as_ref()).or_else(|| {
        containers
            .iter()
            .filter_map(|c| c.memory)
            .reduce(|a, b| Memory {
                working_set: a.working_set.saturating_add(b.working_set),
                usage: a.usage.saturating_add(b.usage),
                rss: a.rss.saturating_add(b.rss),
                available: None,
            })
    });
    Some(PodSample {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        start_time: pod.start_time,
        at,
        cpu: group_cpu,
        memory: group_memory,
        interfaces,
        fs,
        containers,
    })
}

/// A sum of counters that never goes backwards: each series (a container's CPU, a pod's bytes
/// received) contributes the last value seen of its current run; when a run ends — the
/// container restarted (its start time changed, or its counter fell, as Prometheus detects
/// counter resets), or the pod left the node — its last value is carried into a total that
/// only grows. A series whose pod is still on the node but missing from a scrape (an ECI call
/// failed, the group is between states) keeps contributing its last value, so a hiccup is not
/// a drop followed by a double count.
#[derive(Debug, Default, Clone)]
pub struct CounterSum {
    carried: u128,
    live: HashMap<(String, String), Run>,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    /// What tells runs apart (a container's start time), when known.
    instance: Option<i64>,
    last: u64,
}

impl CounterSum {
    /// Records `value` of series `series` of the pod `uid`, whose current run is `instance`.
    pub fn observe(&mut self, uid: &str, series: &str, instance: Option<i64>, value: u64) {
        let key = (uid.to_owned(), series.to_owned());
        match self.live.get_mut(&key) {
            None => {
                self.live.insert(
                    key,
                    Run {
                        instance,
                        last: value,
                    },
                );
            }
            Some(run) => {
                // A start time that only became known now is the same run, not a new one.
                let new_run =
                    matches!((run.instance, instance), (Some(was), Some(is)) if was != is);
                if new_run || value < run.last {
                    self.carried += u128::from(run.last);
                    run.instance = instance;
                } else if run.instance.is_none() {
                    run.instance = instance;
                }
                run.last = value;
            }
        }
    }

    /// Ends the series of pods no longer on the node (their last values are carried).
    pub fn retain_pods(&mut self, on_node: impl Fn(&str) -> bool) {
        let carried = &mut self.carried;
        self.live.retain(|(uid, _), run| {
            let keep = on_node(uid);
            if !keep {
                *carried += u128::from(run.last);
            }
            keep
        });
    }

    /// The sum.
    pub fn total(&self) -> u128 {
        self.carried
            + self
                .live
                .values()
                .map(|run| u128::from(run.last))
                .sum::<u128>()
    }
}

/// The node's counters across scrapes.
#[derive(Debug, Default, Clone)]
pub struct NodeCounters {
    cpu: CounterSum,
    rx_bytes: CounterSum,
    rx_errors: CounterSum,
    tx_bytes: CounterSum,
    tx_errors: CounterSum,
    /// The newest sample time so far: the node's timestamp never goes back either.
    at: Option<Timestamp>,
}

/// The node's figures: sums over its pods (the default: nothing measured yet).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSample {
    /// The newest sample time among the pods (never earlier than the previous node sample);
    /// `None` before any pod was measured.
    pub at: Option<Timestamp>,
    /// Current CPU usage in nanocores (sum of the pods').
    pub nano_cores: u64,
    /// Cumulative CPU in core-nanoseconds (monotonic, see [`CounterSum`]).
    pub core_nanos: u128,
    /// Sum of the pods' working sets.
    pub working_set: u64,
    /// Sum of the pods' memory usage.
    pub usage: u64,
    /// Sum of the pods' RSS.
    pub rss: u64,
    /// Bytes received (monotonic).
    pub rx_bytes: u128,
    /// Receive errors (monotonic).
    pub rx_errors: u128,
    /// Bytes sent (monotonic).
    pub tx_bytes: u128,
    /// Send errors (monotonic).
    pub tx_errors: u128,
    /// The pods' ephemeral storage summed.
    pub fs: Option<Fs>,
}

impl NodeCounters {
    /// Folds in this scrape's `samples`; `on_node` tells which pods are still on the node
    /// (series of the others end). Returns the node's figures.
    pub fn update(&mut self, samples: &[PodSample], on_node: impl Fn(&str) -> bool) -> NodeSample {
        for sample in samples {
            for container in &sample.containers {
                if let Some(cpu) = container.cpu {
                    let instance = container.start_time.map(|at| at.as_millisecond());
                    self.cpu
                        .observe(&sample.uid, &container.name, instance, cpu.core_nanos);
                }
            }
            for interface in &sample.interfaces {
                let name = interface.name.as_str();
                self.rx_bytes
                    .observe(&sample.uid, name, None, interface.rx_bytes);
                self.rx_errors
                    .observe(&sample.uid, name, None, interface.rx_errors);
                self.tx_bytes
                    .observe(&sample.uid, name, None, interface.tx_bytes);
                self.tx_errors
                    .observe(&sample.uid, name, None, interface.tx_errors);
            }
        }
        for sum in [
            &mut self.cpu,
            &mut self.rx_bytes,
            &mut self.rx_errors,
            &mut self.tx_bytes,
            &mut self.tx_errors,
        ] {
            sum.retain_pods(&on_node);
        }
        let newest = samples.iter().map(|s| s.at).max();
        self.at = match (self.at, newest) {
            (Some(was), Some(is)) => Some(was.max(is)),
            (was, is) => was.or(is),
        };
        let sum = |f: fn(&PodSample) -> Option<u64>| {
            samples
                .iter()
                .filter_map(f)
                .fold(0_u64, u64::saturating_add)
        };
        let fs = samples.iter().filter_map(|s| s.fs).reduce(|a, b| Fs {
            used: a.used.saturating_add(b.used),
            capacity: a.capacity.saturating_add(b.capacity),
            available: a.available.saturating_add(b.available),
        });
        NodeSample {
            at: self.at,
            nano_cores: sum(|s| s.cpu.map(|c| c.nano_cores)),
            core_nanos: self.cpu.total(),
            working_set: sum(|s| s.memory.map(|m| m.working_set)),
            usage: sum(|s| s.memory.map(|m| m.usage)),
            rss: sum(|s| s.memory.map(|m| m.rss)),
            rx_bytes: self.rx_bytes.total(),
            rx_errors: self.rx_errors.total(),
            tx_bytes: self.tx_bytes.total(),
            tx_errors: self.tx_errors.total(),
            fs,
        }
    }
}

/// This scrape's samples: fresh ones, and for the pods whose call failed (`failed`, by UID),
/// the previous sample while `keep` allows (its old timestamp tells readers it is not new).
/// Other pods without a fresh sample — gone from the node, or stopped — are dropped. Sorted by
/// namespace and name.
pub fn merge(
    fresh: Vec<PodSample>,
    failed: &HashSet<&str>,
    previous: &[PodSample],
    keep: impl Fn(&PodSample) -> bool,
) -> Vec<PodSample> {
    let have: HashSet<&str> = fresh.iter().map(|s| s.uid.as_str()).collect();
    let stand_ins: Vec<PodSample> = previous
        .iter()
        .filter(|old| !have.contains(old.uid.as_str()) && failed.contains(old.uid.as_str()))
        .filter(|old| keep(old))
        .cloned()
        .collect();
    let mut out = fresh;
    out.extend(stand_ins);
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}
