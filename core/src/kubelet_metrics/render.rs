//! The two shapes the figures are served in: `/metrics/resource` in the Prometheus text
//! format as the kubelet writes it (metrics-server parses it with Prometheus' text parser), and
//! `/stats/summary` as the kubelet's `statsapi.Summary` JSON.

use std::fmt::Write as _;

use jiff::Timestamp;
use serde::Serialize;

use super::sample::{ContainerSample, Cpu, Fs, Interface, Memory, NodeSample, PodSample};

/// The content type the kubelet answers `/metrics/resource` with.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A label value escaped as the text format requires.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[allow(clippy::cast_precision_loss)] // counters far beyond 2^53 ns lose sub-µs digits only
fn seconds(nanos: u128) -> f64 {
    nanos as f64 / 1e9
}

#[allow(clippy::cast_precision_loss)]
fn float(value: u64) -> f64 {
    value as f64
}

/// One metric family: its header and samples, written only when it has samples (as the
/// kubelet's registry omits empty families).
struct Family<'a> {
    name: &'a str,
    help: &'a str,
    kind: &'a str,
    lines: String,
}

impl<'a> Family<'a> {
    fn new(name: &'a str, kind: &'a str, help: &'a str) -> Self {
        Self {
            name,
            help,
            kind,
            lines: String::new(),
        }
    }

    /// A sample: `labels` as (name, value) in alphabetical order, the value, and the sample's
    /// own time in milliseconds when it has one.
    fn sample(&mut self, labels: &[(&str, &str)], value: f64, at: Option<Timestamp>) {
        self.lines.push_str(self.name);
        if !labels.is_empty() {
            self.lines.push('{');
            for (i, (label, text)) in labels.iter().enumerate() {
                if i > 0 {
                    self.lines.push(',');
                }
                let _ = write!(self.lines, "{label}=\"{}\"", escape(text));
            }
            self.lines.push('}');
        }
        let _ = write!(self.lines, " {value}");
        if let Some(at) = at {
            let _ = write!(self.lines, " {}", at.as_millisecond());
        }
        self.lines.push('\n');
    }

    fn write_to(&self, out: &mut String) {
        if self.lines.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        out.push_str(&self.lines);
    }
}

/// `/metrics/resource`: the kubelet's resource metrics for `node` and `pods`, each CPU and
/// memory sample stamped with the time ECI measured it. Families in name order, as the
/// kubelet's registry writes them. `container_start_time_seconds` carries no timestamp, as
/// on the kubelet (metrics-server reads only its value). `resource_scrape_error` is the
/// kubelet's current name; `scrape_error` (deprecated since Kubernetes 1.29) is written too,
/// for readers of the old name.
pub fn resource_metrics(node: &NodeSample, pods: &[PodSample], scrape_error: bool) -> String {
    let mut families = ResourceFamilies::new();
    if let Some(at) = node.at {
        families
            .node_cpu
            .sample(&[], seconds(node.core_nanos), Some(at));
        families
            .node_memory
            .sample(&[], float(node.working_set), Some(at));
    }
    for pod in pods {
        families.add_pod(pod);
    }
    let error = if scrape_error { 1.0 } else { 0.0 };
    families.resource_error.sample(&[], error, None);
    families.old_error.sample(&[], error, None);
    families.render()
}

/// The families `/metrics/resource` writes.
struct ResourceFamilies {
    container_cpu: Family<'static>,
    container_memory: Family<'static>,
    container_start: Family<'static>,
    node_cpu: Family<'static>,
    node_memory: Family<'static>,
    pod_cpu: Family<'static>,
    pod_memory: Family<'static>,
    resource_error: Family<'static>,
    old_error: Family<'static>,
}

impl ResourceFamilies {
    /// Every family, empty, with the kubelet's names, kinds and help texts.
    fn new() -> Self {
        Self {
            container_cpu: Family::new(
                "container_cpu_usage_seconds_total",
                "counter",
                "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
            ),
            container_memory: Family::new(
                "container_memory_working_set_bytes",
                "gauge",
                "[STABLE] Current working set of the container in bytes",
            ),
            container_start: Family::new(
                "container_start_time_seconds",
                "gauge",
                "[STABLE] Start time of the container since unix epoch in seconds",
            ),
            node_cpu: Family::new(
                "node_cpu_usage_seconds_total",
                "counter",
                "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
            ),
            node_memory: Family::new(
                "node_memory_working_set_bytes",
                "gauge",
                "[STABLE] Current working set of the node in bytes",
            ),
            pod_cpu: Family::new(
                "pod_cpu_usage_seconds_total",
                "counter",
                "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
            ),
            pod_memory: Family::new(
                "pod_memory_working_set_bytes",
                "gauge",
                "[STABLE] Current working set of the pod in bytes",
            ),
            resource_error: Family::new(
                "resource_scrape_error",
                "gauge",
                "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
            ),
            old_error: Family::new(
                "scrape_error",
                "gauge",
                "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise",
            ),
        }
    }

    /// The samples of one pod and of its containers.
    fn add_pod(&mut self, pod: &PodSample) {
        let (namespace, name) = (pod.namespace.as_str(), pod.name.as_str());
        for container in &pod.containers {
            let labels = [
                ("container", container.name.as_str()),
                ("namespace", namespace),
                ("pod", name),
            ];
            if let Some(cpu) = container.cpu {
                self.container_cpu.sample(
                    &labels,
                    seconds(u128::from(cpu.core_nanos)),
                    Some(pod.at),
                );
            }
            if let Some(memory) = container.memory {
                self.container_memory
                    .sample(&labels, float(memory.working_set), Some(pod.at));
            }
            if let Some(started) = container.start_time {
                #[allow(clippy::cast_precision_loss)]
                let value = started.as_nanosecond() as f64 / 1e9;
                self.container_start.sample(&labels, value, None);
            }
        }
        let labels = [("namespace", namespace), ("pod", name)];
        if let Some(cpu) = pod.cpu {
            self.pod_cpu
                .sample(&labels, seconds(u128::from(cpu.core_nanos)), Some(pod.at));
        }
        if let Some(memory) = pod.memory {
            self.pod_memory
                .sample(&labels, float(memory.working_set), Some(pod.at));
        }
    }

    /// The text exposition, families in name order.
    fn render(&self) -> String {
        let mut out = String::with_capacity(
            [
                &self.container_cpu,
                &self.container_memory,
                &self.container_start,
                &self.pod_cpu,
                &self.pod_memory,
            ]
            .iter()
            .map(|f| f.lines.len())
            .sum::<usize>()
                + 2048,
        );
        for family in [
            &self.container_cpu,
            &self.container_memory,
            &self.container_start,
            &self.node_cpu,
            &self.node_memory,
            &self.pod_cpu,
            &self.pod_memory,
            &self.resource_error,
            &self.old_error,
        ] {
            family.write_to(&mut out);
        }
        out
    }
}

/// `metav1.Time` as JSON: RFC 3339 in seconds.
fn time(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn clamp(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// `statsapi.Summary`.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// Its pods.
    pub pods: Vec<PodStats>,
}

/// `statsapi.NodeStats`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    node_name: String,
    start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<Stamped<Cpu>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<Stamped<Memory>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<NetworkStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fs: Option<Stamped<Fs>>,
}

/// `statsapi.PodStats`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pod_ref: PodReference,
    /// `metav1.Time` is not omitempty: an unknown time is `null`.
    start_time: Option<String>,
    containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<Stamped<Cpu>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<Stamped<Memory>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<NetworkStats>,
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    ephemeral_storage: Option<Stamped<Fs>>,
}

#[derive(Debug, Serialize)]
struct PodReference {
    name: String,
    namespace: String,
    uid: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStats {
    name: String,
    start_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<Stamped<Cpu>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<Stamped<Memory>>,
}

/// Figures beside the time they were measured at, as each `statsapi` struct carries its `time`
/// inline.
#[derive(Debug, Serialize)]
struct Stamped<T> {
    time: String,
    #[serde(flatten)]
    figures: T,
}

fn stamped<T>(figures: T, at: Timestamp) -> Stamped<T> {
    Stamped {
        time: time(at),
        figures,
    }
}

/// The default interface inline (Go's embedded `InterfaceStats`), then all of them.
#[derive(Debug, Serialize)]
struct NetworkStats {
    time: String,
    #[serde(flatten)]
    default: Interface,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    interfaces: Vec<Interface>,
}

/// The interface ECI gives every group, which the kubelet would call the default one.
const DEFAULT_INTERFACE: &str = "eth0";

/// A container's stats: CPU and memory in both shapes (`only_cpu_and_memory` trims the pod
/// and the node only).
fn container_stats(container: &ContainerSample, at: Timestamp) -> ContainerStats {
    ContainerStats {
        name: container.name.clone(),
        start_time: container.start_time.map(time),
        cpu: container.cpu.map(|cpu| stamped(cpu, at)),
        memory: container.memory.map(|memory| stamped(memory, at)),
    }
}

fn pod_stats(pod: &PodSample, only_cpu_and_memory: bool) -> PodStats {
    let network = pod
        .interfaces
        .iter()
        .find(|i| i.name == DEFAULT_INTERFACE)
        .or(pod.interfaces.first())
        .filter(|_| !only_cpu_and_memory)
        .map(|default| NetworkStats {
            time: time(pod.at),
            default: default.clone(),
            interfaces: pod.interfaces.clone(),
        });
    PodStats {
        pod_ref: PodReference {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            uid: pod.uid.clone(),
        },
        start_time: pod.start_time.map(time),
        containers: pod
            .containers
            .iter()
            .map(|c| container_stats(c, pod.at))
            .collect(),
        cpu: pod.cpu.map(|cpu| stamped(cpu, pod.at)),
        memory: pod.memory.map(|memory| stamped(memory, pod.at)),
        network,
        ephemeral_storage: pod
            .fs
            .filter(|_| !only_cpu_and_memory)
            .map(|fs| stamped(fs, pod.at)),
    }
}

/// `/stats/summary` (with `only_cpu_and_memory`, as `?only_cpu_and_memory=true` asks: CPU and
/// memory of the node, pods and containers, nothing else). The node's figures are the sums over
/// its pods; its `startTime` is `started` (when this daemon began serving the node).
pub fn summary(
    node_name: &str,
    started: Timestamp,
    node: &NodeSample,
    pods: &[PodSample],
    only_cpu_and_memory: bool,
) -> Summary {
    let at = node.at;
    let cpu = Cpu {
        nano_cores: node.nano_cores,
        core_nanos: clamp(node.core_nanos),
    };
    let memory = Memory {
        available: None,
        usage: node.usage,
        working_set: node.working_set,
        rss: node.rss,
    };
    let network = Interface {
        name: DEFAULT_INTERFACE.to_owned(),
        rx_bytes: clamp(node.rx_bytes),
        rx_errors: clamp(node.rx_errors),
        tx_bytes: clamp(node.tx_bytes),
        tx_errors: clamp(node.tx_errors),
    };
    let node = NodeStats {
        node_name: node_name.to_owned(),
        start_time: time(started),
        cpu: at.map(|at| stamped(cpu, at)),
        memory: at.map(|at| stamped(memory, at)),
        network: at.filter(|_| !only_cpu_and_memory).map(|at| NetworkStats {
            time: time(at),
            default: network,
            interfaces: Vec::new(),
        }),
        fs: at
            .filter(|_| !only_cpu_and_memory)
            .and_then(|at| node.fs.map(|fs| stamped(fs, at))),
    };
    Summary {
        node,
        pods: pods
            .iter()
            .map(|pod| pod_stats(pod, only_cpu_and_memory))
            .collect(),
    }
}
