//! Whether a pod's `k8s.aliyun.com/eci-use-specs` asks for a larger instance than its
//! containers: ResourceQuota and LimitRange count the containers' requests and limits, ECI
//! bills the instance. Without the annotation ECI sizes the group from the containers (their
//! limits, else requests) rounded up to a size it sells; the annotation may round up the same
//! way, not further. Pure.

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};

use crate::quantity::{self, Quantity};
use crate::requests;

/// The vCPU counts ECI sells, smallest first.
const VCPU_SIZES: &[f64] = &[
    0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 52.0, 64.0,
];
/// The smallest memory of an instance, GiB.
const MIN_MEMORY_GIB: f64 = 0.5;
/// Float comparisons of sizes read from text.
const EPSILON: f64 = 1e-9;

/// An amount of vCPU and memory (GiB).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Size {
    /// vCPU.
    pub cpu: f64,
    /// GiB.
    pub memory: f64,
}

impl Size {
    /// What the pod's containers ask for: per resource the larger of its effective requests
    /// (as the scheduler and ResourceQuota's `requests.*` count them) and its limits (as
    /// `limits.*` count them).
    pub fn of_pod(pod: &Pod) -> Self {
        let requests = requests::pod_requests(pod);
        let limits = limits(pod);
        let amount = |name: &str| {
            let get = |from: &requests::Requests| from.get(name).map_or(0.0, |q| q.as_f64());
            get(&requests).max(get(&limits))
        };
        Self {
            cpu: amount("cpu"),
            memory: quantity::gib(amount("memory")),
        }
    }

    /// The largest instance that counts as this size: each part rounded up to the next vCPU
    /// count ECI sells and to the next power of two GiB.
    pub fn rounded_up(self) -> Self {
        let cpu = VCPU_SIZES
            .iter()
            .copied()
            .find(|size| *size + EPSILON >= self.cpu)
            .unwrap_or(self.cpu);
        let mut memory = MIN_MEMORY_GIB;
        while memory + EPSILON < self.memory {
            memory *= 2.0;
        }
        Self { cpu, memory }
    }
}

/// The containers' limits summed, an init container's taken when larger (limits only: the
/// requests are [`requests::pod_requests`]).
fn limits(pod: &Pod) -> requests::Requests {
    let of = |resources: Option<&ResourceRequirements>| -> requests::Requests {
        resources
            .and_then(|r| r.limits.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|(name, q)| {
                let q = Quantity::parse(&q.0).ok().filter(|q| !q.is_negative())?;
                Some((name.clone(), q))
            })
            .collect()
    };
    let Some(spec) = &pod.spec else {
        return requests::Requests::new();
    };
    let mut sum = requests::Requests::new();
    for container in &spec.containers {
        requests::add(&mut sum, &of(container.resources.as_ref()));
    }
    for init in spec.init_containers.iter().flatten() {
        for (name, q) in of(init.resources.as_ref()) {
            let entry = sum.entry(name).or_default();
            *entry = (*entry).max(q);
        }
    }
    sum
}

/// How an `eci-use-specs` value compares with what the containers ask for.
#[derive(Debug, Clone, PartialEq)]
pub enum Sizing {
    /// Every `vCPU-memory` pair fits the containers' size (rounded up); no instance type.
    Fits,
    /// A pair larger than the containers' size rounded up (the pair as written).
    Larger {
        /// The pair.
        pair: String,
        /// The containers' size.
        asked: Size,
        /// The largest size allowed.
        allowed: Size,
    },
    /// Pairs that fit, and ECS instance types whose size the daemon does not know.
    UnknownTypes(Vec<String>),
}

/// Compares `specs` (the annotation's value) with `asked`. Entries that are neither a pair nor
/// an instance type are left to the translation, which refuses the pod naming them.
pub fn compare(specs: &str, asked: Size) -> Sizing {
    let allowed = asked.rounded_up();
    let mut types = Vec::new();
    for entry in specs.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if entry.starts_with("ecs.") {
            types.push(entry.to_owned());
            continue;
        }
        let Some(size) = pair(entry) else { continue };
        if size.cpu > allowed.cpu + EPSILON || size.memory > allowed.memory + EPSILON {
            return Sizing::Larger {
                pair: entry.to_owned(),
                asked,
                allowed,
            };
        }
    }
    if types.is_empty() {
        Sizing::Fits
    } else {
        Sizing::UnknownTypes(types)
    }
}

/// A `vCPU-memory` pair as the translation reads it (memory below 1024 is GiB, else bytes).
fn pair(entry: &str) -> Option<Size> {
    let (cpu, memory) = entry.split_once('-')?;
    let cpu: f64 = cpu.trim().parse().ok()?;
    let memory = quantity::parse(memory.trim()).ok()?;
    let memory = if memory < 1024.0 {
        memory
    } else {
        quantity::gib(memory)
    };
    (cpu.is_finite() && memory.is_finite()).then_some(Size { cpu, memory })
}
