//! Resource usage for the metric calls: a load per container that tests set at run time, and
//! counters consistent with it.
//!
//! A container's CPU use is piecewise constant: by default a fixed share of its CPU (5–45 %,
//! drawn from its group id and name, so repeated calls agree and groups differ), and from the
//! moment a test sets a load ([`LoadRule`], through `PUT /admin/usage`) whatever the newest
//! matching rule says. `UsageCoreNanoSeconds` is the integral of `UsageNanoCores` over the
//! container's current run, so it only grows while the run lasts and restarts from zero with
//! the next run, as a cgroup's `cpuacct.usage` does. Memory follows the load the same way
//! (default 20–60 % of the container's share).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use eci_proto::v20180808::{
    ContainerMetric, CpuMetric, FilesystemMetric, MemoryMetric, MetricRecord,
    NetworkInterfaceMetric, NetworkMetric,
};
use serde::{Deserialize, Serialize};

use crate::clock::{Millis, rfc3339};
use crate::engine::group::{Group, RunState};
use crate::rng;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Rule sets kept: the oldest goes first (its successor then reaches back in its place).
const MAX_EPOCHS: usize = 256;

/// The load of the containers a rule selects. Every selector given must match; none given
/// selects every container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LoadRule {
    /// Only the group with this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    /// Only groups whose name starts with this (the provider names groups
    /// `<namespace>-<pod>`, so `ns-web-` selects a Deployment's pods, later ones included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_name_prefix: Option<String>,
    /// Only the container with this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// CPU in use, in cores (`0.25` is 250m); absent: the default share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// Working set in bytes; absent: the default share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

impl LoadRule {
    fn selects(&self, group: &Group, container: &str) -> bool {
        self.group_id.as_ref().is_none_or(|id| *id == group.id)
            && self.group_name_prefix.as_ref().is_none_or(|prefix| {
                group
                    .request
                    .container_group_name
                    .starts_with(prefix.as_str())
            })
            && self.container.as_ref().is_none_or(|name| name == container)
    }
}

/// What `GET`/`PUT /admin/usage` carry: the rules in force, the last matching one winning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LoadRules {
    /// The rules.
    pub rules: Vec<LoadRule>,
}

impl LoadRules {
    /// Whether every figure is usable.
    pub fn validate(&self) -> Result<(), String> {
        for (i, rule) in self.rules.iter().enumerate() {
            if let Some(cpu) = rule.cpu {
                if !cpu.is_finite() || cpu < 0.0 {
                    return Err(format!(
                        "rule {i}: cpu must be a number of cores ≥ 0, not {cpu}"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct Epoch {
    from: Millis,
    rules: Arc<Vec<LoadRule>>,
}

/// The load rules over time: every change starts an epoch, so counters integrate each
/// container's use across changes.
#[derive(Debug, Clone)]
pub struct Loads {
    epochs: VecDeque<Epoch>,
}

impl Default for Loads {
    fn default() -> Self {
        Self {
            epochs: VecDeque::from([Epoch {
                from: Millis::MIN,
                rules: Arc::new(Vec::new()),
            }]),
        }
    }
}

impl Loads {
    /// The rules in force.
    pub fn current(&self) -> LoadRules {
        LoadRules {
            rules: self
                .epochs
                .back()
                .map(|epoch| epoch.rules.as_ref().clone())
                .unwrap_or_default(),
        }
    }

    /// Puts `rules` in force from `now` on.
    pub fn set(&mut self, rules: LoadRules, now: Millis) -> Result<(), String> {
        rules.validate()?;
        // Two changes at one instant: the later wins.
        while self.epochs.len() > 1 && self.epochs.back().is_some_and(|e| e.from >= now) {
            self.epochs.pop_back();
        }
        self.epochs.push_back(Epoch {
            from: now,
            rules: Arc::new(rules.rules),
        });
        while self.epochs.len() > MAX_EPOCHS {
            self.epochs.pop_front();
            if let Some(first) = self.epochs.front_mut() {
                first.from = Millis::MIN;
            }
        }
        Ok(())
    }

    /// The rule (if any) deciding `container` of `group` in `epoch`.
    fn rule<'a>(
        epoch: &'a Epoch,
        group: &Group,
        container: &str,
    ) -> impl Iterator<Item = &'a LoadRule> {
        epoch
            .rules
            .iter()
            .rev()
            .filter(move |rule| rule.selects(group, container))
    }

    /// CPU in cores of `container` (`share` cores allotted) during `epoch`.
    fn cores(epoch: &Epoch, group: &Group, container: &str, share: f64) -> f64 {
        Self::rule(epoch, group, container)
            .find_map(|rule| rule.cpu)
            .unwrap_or_else(|| share * default_fraction(group, container, "cpu", 0.05, 0.4))
    }

    fn epoch_at(&self, at: Millis) -> &Epoch {
        self.epochs
            .iter()
            .rev()
            .find(|epoch| epoch.from <= at)
            .or_else(|| self.epochs.front())
            .expect("the first epoch reaches back to the beginning")
    }

    /// Core-nanoseconds used by `container` from `from` to `to`: the integral of its CPU.
    fn used(&self, group: &Group, container: &str, share: f64, from: Millis, to: Millis) -> f64 {
        let mut total = 0.0;
        let epochs: Vec<&Epoch> = self.epochs.iter().collect();
        for (i, epoch) in epochs.iter().enumerate() {
            let start = epoch.from.max(from);
            let end = epochs.get(i + 1).map_or(to, |next| next.from.min(to));
            if end > start {
                #[allow(clippy::cast_precision_loss)]
                let seconds = (end - start) as f64 / 1_000.0;
                total += Self::cores(epoch, group, container, share) * seconds * 1e9;
            }
        }
        total
    }
}

/// A stable fraction in `[low, low + span)` for one container and figure.
fn default_fraction(group: &Group, container: &str, figure: &str, low: f64, span: f64) -> f64 {
    let draw = rng::SplitMix::new(rng::stable_hash(
        format!("{}/{container}/{figure}", group.id).as_bytes(),
    ))
    .next_f64();
    low + span * draw
}

/// The CPU (cores) and memory (GiB) share of each regular container: its own, else an even
/// part of the group's.
fn shares(group: &Group) -> Vec<(f64, f64)> {
    #[allow(clippy::cast_precision_loss)]
    let count = group.request.container.len().max(1) as f64;
    group
        .request
        .container
        .iter()
        .map(|spec| {
            (
                spec.cpu.unwrap_or(group.cpu / count),
                spec.memory.unwrap_or(group.memory / count),
            )
        })
        .collect()
}

/// What the real runtime measured of one running container (its cgroup).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Measured {
    /// CPU in use, from the change of `core_nanos` since the runtime's previous reading
    /// (0 at the first).
    pub nano_cores: u64,
    /// CPU time used since the container started.
    pub core_nanos: u64,
    pub memory_bytes: u64,
    pub working_set: u64,
    pub rss: u64,
    pub cache: u64,
}

/// Measurements by group id, then container name.
pub type GroupMeasures = BTreeMap<String, BTreeMap<String, Measured>>;

/// A container's CPU and memory figures from what was measured of it; all zero when nothing
/// was (it has no cgroup: it is not running).
fn measured_figures(
    measured: Option<&Measured>,
    share_cpu: f64,
    share_memory: f64,
) -> (CpuMetric, MemoryMetric) {
    let m = measured.copied().unwrap_or_default();
    let signed = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    #[allow(clippy::cast_precision_loss)]
    let cores = m.nano_cores as f64 / 1e9;
    #[allow(clippy::cast_precision_loss)]
    let working_set = m.working_set as f64;
    let cpu = CpuMetric {
        usage_nano_cores: signed(m.nano_cores),
        usage_core_nano_seconds: signed(m.core_nanos),
        load: to_i64(if share_cpu > 0.0 {
            cores / share_cpu * 100.0
        } else {
            0.0
        }),
        limit: to_i64(share_cpu * 1000.0),
    };
    let memory = MemoryMetric {
        usage_bytes: signed(m.memory_bytes),
        working_set: signed(m.working_set),
        rss: signed(m.rss),
        cache: signed(m.cache),
        available_bytes: to_i64(share_memory * GIB - working_set),
    };
    (cpu, memory)
}

/// The span of the current run that lies before `at`, if the run had started by then.
fn run_span(state: &RunState, at: Millis) -> Option<(Millis, Millis)> {
    match state {
        RunState::Running { started_at } if *started_at <= at => Some((*started_at, at)),
        RunState::Terminated {
            started_at,
            finished_at,
            ..
        } if *started_at <= at => Some((*started_at, at.min(*finished_at))),
        _ => None,
    }
}

/// The record of `group` at `at` under `loads`: per container (those whose current run had
/// started by `at`) and summed for the group. With `measured` (real mode: what the runtime
/// read from the containers' cgroups now) the CPU and memory figures are those instead.
pub fn record(
    group: &Group,
    loads: &Loads,
    at: Millis,
    with_containers: bool,
    measured: Option<&BTreeMap<String, Measured>>,
) -> MetricRecord {
    let containers = container_metrics(group, loads, at, measured);
    let net_draw =
        rng::SplitMix::new(rng::stable_hash(format!("{}/net", group.id).as_bytes())).next_f64();
    MetricRecord {
        timestamp: rfc3339(at),
        cpu: Some(group_cpu(group, &containers)),
        memory: Some(group_memory(group, &containers)),
        network: Some(network(group, at, net_draw)),
        filesystem: vec![filesystem(net_draw)],
        containers: if with_containers {
            containers
        } else {
            Vec::new()
        },
    }
}

/// The figures of each container whose current run had started by `at`: the measured ones
/// when given, else those modelled from `loads`.
fn container_metrics(
    group: &Group,
    loads: &Loads,
    at: Millis,
    measured: Option<&BTreeMap<String, Measured>>,
) -> Vec<ContainerMetric> {
    let epoch = loads.epoch_at(at);
    group
        .request
        .container
        .iter()
        .zip(&group.containers)
        .zip(shares(group))
        .filter_map(|((spec, run), share)| {
            let span = run_span(&run.state, at)?;
            Some(match measured {
                Some(measured) => {
                    let (cpu, memory) =
                        measured_figures(measured.get(&spec.name), share.0, share.1);
                    ContainerMetric {
                        name: spec.name.clone(),
                        cpu: Some(cpu),
                        memory: Some(memory),
                    }
                }
                None => {
                    let running = run.state.is_running();
                    modelled_metric(group, loads, epoch, &spec.name, running, share, span)
                }
            })
        })
        .collect()
}

/// A container's figures under the rules of `epoch`, its CPU counter integrated over `span`
/// of its run.
fn modelled_metric(
    group: &Group,
    loads: &Loads,
    epoch: &Epoch,
    name: &str,
    running: bool,
    (share_cpu, share_memory): (f64, f64),
    (from, to): (Millis, Millis),
) -> ContainerMetric {
    let cores = if running {
        Loads::cores(epoch, group, name, share_cpu)
    } else {
        0.0
    };
    let working_set = Loads::rule(epoch, group, name)
        .find_map(|rule| rule.memory_bytes)
        .map_or_else(
            || share_memory * GIB * default_fraction(group, name, "memory", 0.2, 0.4),
            |bytes| {
                #[allow(clippy::cast_precision_loss)]
                let bytes = bytes as f64;
                bytes
            },
        );
    ContainerMetric {
        name: name.to_owned(),
        cpu: Some(CpuMetric {
            usage_nano_cores: to_i64(cores * 1e9),
            usage_core_nano_seconds: to_i64(loads.used(group, name, share_cpu, from, to)),
            load: to_i64(if share_cpu > 0.0 {
                cores / share_cpu * 100.0
            } else {
                0.0
            }),
            limit: to_i64(share_cpu * 1000.0),
        }),
        memory: Some(memory(share_memory * GIB, working_set)),
    }
}

/// The group's CPU: its containers' use summed, its load against the group's vCPUs.
fn group_cpu(group: &Group, containers: &[ContainerMetric]) -> CpuMetric {
    let sum = |f: fn(&CpuMetric) -> i64| {
        containers
            .iter()
            .map(|c| c.cpu.as_ref().map_or(0, f))
            .sum::<i64>()
    };
    CpuMetric {
        usage_nano_cores: sum(|cpu| cpu.usage_nano_cores),
        usage_core_nano_seconds: sum(|cpu| cpu.usage_core_nano_seconds),
        load: to_i64(if group.cpu > 0.0 {
            #[allow(clippy::cast_precision_loss)]
            let nano_cores = sum(|cpu| cpu.usage_nano_cores) as f64;
            nano_cores / 1e9 / group.cpu * 100.0
        } else {
            0.0
        }),
        limit: to_i64(group.cpu * 1000.0),
    }
}

/// The group's memory: its containers' figures summed, available against the group's GiB.
fn group_memory(group: &Group, containers: &[ContainerMetric]) -> MemoryMetric {
    let sum = |f: fn(&MemoryMetric) -> i64| {
        containers
            .iter()
            .map(|c| c.memory.as_ref().map_or(0, f))
            .sum::<i64>()
    };
    MemoryMetric {
        usage_bytes: sum(|m| m.usage_bytes),
        working_set: sum(|m| m.working_set),
        rss: sum(|m| m.rss),
        cache: sum(|m| m.cache),
        available_bytes: (to_i64(group.memory * GIB) - sum(|m| m.working_set)).max(0),
    }
}

/// Traffic on `eth0`, growing steadily since the group was provisioned; `draw` sets its rate.
fn network(group: &Group, at: Millis, draw: f64) -> NetworkMetric {
    let elapsed_s = (at - group.provisioned_at.unwrap_or(group.created_at)).max(0) / 1_000;
    NetworkMetric {
        interfaces: vec![NetworkInterfaceMetric {
            name: "eth0".into(),
            rx_bytes: elapsed_s * to_i64(2_000.0 + 8_000.0 * draw),
            rx_packets: elapsed_s * 20,
            rx_errors: 0,
            tx_bytes: elapsed_s * to_i64(1_000.0 + 4_000.0 * draw),
            tx_packets: elapsed_s * 15,
            tx_errors: 0,
            ..NetworkInterfaceMetric::default()
        }],
    }
}

/// The root filesystem, a little used; `draw` sets how much.
fn filesystem(draw: f64) -> FilesystemMetric {
    FilesystemMetric {
        fs_name: "/".into(),
        usage: to_i64(0.5 * GIB + draw * GIB),
        capacity: to_i64(30.0 * GIB),
        available: to_i64(29.5 * GIB - draw * GIB),
        category: "system".into(),
    }
}

fn memory(limit: f64, working_set: f64) -> MemoryMetric {
    MemoryMetric {
        usage_bytes: to_i64(working_set * 1.1),
        working_set: to_i64(working_set),
        rss: to_i64(working_set * 0.8),
        cache: to_i64(working_set * 0.3),
        available_bytes: to_i64(limit - working_set),
    }
}

#[allow(clippy::cast_possible_truncation)]
fn to_i64(value: f64) -> i64 {
    value.max(0.0).round() as i64
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::{
        Container, CreateContainerGroupRequest, DescribeContainerGroupMetricRequest,
        DescribeMultiContainerGroupMetricRequest, RestartContainerGroupRequest,
    };

    use super::*;
    use crate::engine::Engine;
    use crate::settings::Settings;

    /// Running by then with the default settings (scheduling and provisioning take seconds).
    const RUNNING_BY: Millis = 60_000;

    fn engine_with(groups: &[&str]) -> (Engine, Vec<String>) {
        let mut engine = Engine::new(Settings::default());
        let container = |name: &str, cpu: f64| Container {
            name: name.into(),
            image: "nginx".into(),
            cpu: Some(cpu),
            memory: Some(1.0),
            ..Container::default()
        };
        let ids = groups
            .iter()
            .map(|name| {
                let region = engine.settings().region.clone();
                engine
                    .create(
                        CreateContainerGroupRequest {
                            region_id: region,
                            security_group_id: "sg".into(),
                            v_switch_id: "vsw".into(),
                            container_group_name: (*name).into(),
                            container: vec![container("app", 1.0), container("side", 0.5)],
                            ..CreateContainerGroupRequest::default()
                        },
                        0,
                    )
                    .expect("created")
            })
            .collect();
        engine.advance(RUNNING_BY);
        (engine, ids)
    }

    fn read(engine: &mut Engine, id: &str, at: Millis) -> MetricRecord {
        let region = engine.settings().region.clone();
        let mut answer = engine
            .multi_metric(
                &DescribeMultiContainerGroupMetricRequest {
                    region_id: region,
                    container_group_ids: vec![id.to_owned()],
                    metric_type: "all".into(),
                    resource_group_id: String::new(),
                },
                at,
            )
            .expect("an answer");
        answer.monitor_datas.remove(0).records.remove(0)
    }

    fn cpu_of(record: &MetricRecord, container: &str) -> (i64, i64) {
        let cpu = record
            .containers
            .iter()
            .find(|c| c.name == container)
            .and_then(|c| c.cpu)
            .expect("the container's CPU");
        (cpu.usage_nano_cores, cpu.usage_core_nano_seconds)
    }

    fn rules(json: &str) -> LoadRules {
        serde_json::from_str(json).expect("rules")
    }

    #[test]
    fn measured_figures_replace_the_simulated_ones() {
        let (mut engine, ids) = engine_with(&["web"]);
        let app = Measured {
            nano_cores: 750_000_000,
            core_nanos: 42_000_000_000,
            memory_bytes: 150 << 20,
            working_set: 130 << 20,
            rss: 120 << 20,
            cache: 30 << 20,
        };
        let measures: GroupMeasures =
            BTreeMap::from([(ids[0].clone(), BTreeMap::from([("app".to_owned(), app)]))]);
        let region = engine.settings().region.clone();
        let mut answer = engine
            .multi_metric_with(
                &DescribeMultiContainerGroupMetricRequest {
                    region_id: region,
                    container_group_ids: ids,
                    metric_type: "all".into(),
                    resource_group_id: String::new(),
                },
                RUNNING_BY,
                Some(&measures),
            )
            .expect("an answer");
        let record = answer.monitor_datas.remove(0).records.remove(0);
        assert_eq!(cpu_of(&record, "app"), (750_000_000, 42_000_000_000));
        // Nothing measured of `side` (no cgroup): nothing used, not a made-up share.
        assert_eq!(cpu_of(&record, "side"), (0, 0));
        let memory = |name: &str| {
            record
                .containers
                .iter()
                .find(|c| c.name == name)
                .and_then(|c| c.memory)
                .expect("memory")
        };
        assert_eq!(memory("app").working_set, 130 << 20);
        assert_eq!(memory("app").rss, 120 << 20);
        assert_eq!(memory("side").working_set, 0);
        let total = record.memory.expect("the group's memory");
        assert_eq!(
            (total.working_set, total.usage_bytes),
            (130 << 20, 150 << 20)
        );
        assert_eq!(
            record.cpu.expect("the group's CPU").usage_nano_cores,
            750_000_000
        );
    }

    #[test]
    fn a_measured_series_is_one_record_taken_now() {
        let (mut engine, ids) = engine_with(&["web"]);
        let app = Measured {
            nano_cores: 5_000_000,
            core_nanos: 9_000_000_000,
            memory_bytes: 3 << 20,
            working_set: 2 << 20,
            rss: 1 << 20,
            cache: 1 << 20,
        };
        let measures: GroupMeasures =
            BTreeMap::from([(ids[0].clone(), BTreeMap::from([("app".to_owned(), app)]))]);
        let request = |end_time: &str| DescribeContainerGroupMetricRequest {
            region_id: engine.settings().region.clone(),
            container_group_id: ids[0].clone(),
            period: Some(15),
            end_time: end_time.into(),
            ..DescribeContainerGroupMetricRequest::default()
        };
        let (now_request, past_request) = (request(""), request(&rfc3339(RUNNING_BY)));
        let now = RUNNING_BY + 120_400;
        // Simulated: a record every 15 s of the window.
        let simulated = engine.metric(&now_request, now).expect("an answer");
        assert!(simulated.records.len() > 1, "{simulated:?}");
        // Measured: one record, to the second, with the cgroup's figures.
        let answer = engine
            .metric_with(&now_request, now, Some(&measures))
            .expect("an answer");
        assert_eq!(answer.records.len(), 1, "{answer:?}");
        let record = &answer.records[0];
        assert_eq!(record.timestamp, rfc3339(RUNNING_BY + 120_000));
        assert_eq!(cpu_of(record, "app"), (5_000_000, 9_000_000_000));
        assert_eq!(record.memory.expect("memory").working_set, 2 << 20);
        // A window ending in the past holds nothing that could have been measured.
        let past = engine
            .metric_with(&past_request, now, Some(&measures))
            .expect("an answer");
        assert!(past.records.is_empty(), "{past:?}");
    }

    #[test]
    fn counters_integrate_the_load_across_changes() {
        let (mut engine, ids) = engine_with(&["ns-web-0", "ns-db-0"]);
        let (web, db) = (&ids[0], &ids[1]);
        // Default: a fixed share of the container's CPU, integrated over its run.
        let first = read(&mut engine, web, 70_000);
        assert_eq!(first.timestamp, rfc3339(70_000));
        let (cores, used_70) = cpu_of(&first, "app");
        assert!((50_000_000..=450_000_000).contains(&cores), "{cores}");
        let (_, used_80) = cpu_of(&read(&mut engine, web, 80_000), "app");
        // 10 s at the default rate (the rate is rounded to whole nanocores on the wire).
        assert!(
            (used_80 - used_70 - cores * 10).abs() <= 10,
            "{used_70} → {used_80} at {cores}"
        );
        // 2 cores from t=80 s, then 0.1 core for `app` from t=90 s.
        engine
            .set_loads(
                rules(r#"{"rules": [{"group_name_prefix": "ns-web-", "cpu": 2.0}]}"#),
                80_000,
            )
            .unwrap();
        engine
            .set_loads(
                rules(r#"{"rules": [{"group_name_prefix": "ns-web-", "container": "app", "cpu": 0.1}]}"#),
                90_000,
            )
            .unwrap();
        // A PUT replaces the rules: `side` had 2 cores, and is back to its default share.
        assert_eq!(
            cpu_of(&read(&mut engine, web, 85_000), "side").0,
            2_000_000_000
        );
        assert!(cpu_of(&read(&mut engine, web, 95_000), "side").0 < 500_000_000);
        let table: &[(Millis, i64, i64)] = &[
            (85_000, 2_000_000_000, 10_000_000_000),
            (90_000, 100_000_000, 20_000_000_000),
            (100_000, 100_000_000, 21_000_000_000),
            // Times are to the second, as ECI writes them.
            (100_999, 100_000_000, 21_000_000_000),
        ];
        let mut last = used_80;
        for (at, want_cores, want_since_80) in table {
            let record = read(&mut engine, web, *at);
            let (got_cores, got_used) = cpu_of(&record, "app");
            assert_eq!(
                (got_cores, got_used - used_80),
                (*want_cores, *want_since_80),
                "at {at}"
            );
            assert!(got_used >= last, "monotonic");
            last = got_used;
            // The group sums its containers.
            let (side_cores, _) = cpu_of(&record, "side");
            assert_eq!(
                record.cpu.as_ref().map(|c| c.usage_nano_cores),
                Some(*want_cores + side_cores)
            );
        }
        // Not selected: the other group keeps its default share.
        let (db_cores, _) = cpu_of(&read(&mut engine, db, 100_000), "app");
        assert!(db_cores < 1_000_000_000, "{db_cores}");
        assert_eq!(engine.loads().rules.len(), 1);
    }

    #[test]
    fn a_restart_starts_the_counter_again_and_memory_follows_the_load() {
        let (mut engine, ids) = engine_with(&["ns-app-0"]);
        let id = &ids[0];
        engine
            .set_loads(
                rules(&format!(
                    r#"{{"rules": [{{"group_id": "{id}", "cpu": 1.0, "memory_bytes": 1048576}}]}}"#
                )),
                RUNNING_BY,
            )
            .unwrap();
        let before = cpu_of(&read(&mut engine, id, 120_000), "app").1;
        assert!(before >= 60_000_000_000, "{before}");
        let record = read(&mut engine, id, 120_000);
        let memory = record.containers[0].memory.expect("memory");
        assert_eq!(memory.working_set, 1_048_576);
        let region = engine.settings().region.clone();
        engine
            .restart(
                &RestartContainerGroupRequest {
                    region_id: region,
                    container_group_id: id.clone(),
                    ..RestartContainerGroupRequest::default()
                },
                120_000,
            )
            .unwrap();
        let after = cpu_of(&read(&mut engine, id, 180_000), "app").1;
        assert!(
            after < before,
            "a new run counts from zero: {after} vs {before}"
        );
        assert!(after > 0);
    }

    #[test]
    fn bad_rules_change_nothing() {
        let mut loads = Loads::default();
        assert!(
            loads
                .set(rules(r#"{"rules": [{"cpu": -1.0}]}"#), 5)
                .is_err()
        );
        assert!(serde_json::from_str::<LoadRules>(r#"{"rules": [{"cpus": 1}]}"#).is_err());
        assert_eq!(loads.current(), LoadRules::default());
        loads.set(rules(r#"{"rules": [{"cpu": 1.5}]}"#), 5).unwrap();
        loads.set(rules(r#"{"rules": [{"cpu": 0.5}]}"#), 5).unwrap();
        assert_eq!(
            loads.current().rules[0].cpu,
            Some(0.5),
            "the later of two at one instant"
        );
        for at in 6..(6 + MAX_EPOCHS as Millis + 10) {
            loads.set(LoadRules::default(), at).unwrap();
        }
        assert_eq!(loads.epochs.len(), MAX_EPOCHS);
    }
}
