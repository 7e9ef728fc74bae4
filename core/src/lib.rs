//! The pure core of virtual-node-eci: what Kubernetes means by a pod's fields, written once
//! for every part of the workspace that has to honour it — the daemon translating pods for
//! ECI, and the integration harness's host agent running pods as a kubelet would — and the
//! daemon's pure logic: the translation of a pod into ECI's request and of ECI's answer back
//! into the pod's status, the pod's lifecycle on the node, and the placement decisions of the
//! admission webhook (eci-profile's Selectors) and of ResourcePolicy, which namespaces may run
//! pods on the virtual nodes and use which ECI annotations, and the kubelet's resource metrics
//! as computed from ECI's.
//!
//! Nothing here does I/O, keeps state or knows about the API server or a runtime: each
//! function takes Kubernetes objects (k8s-openapi's types, and the custom resources defined
//! here with kube's client-free `kube-core`), and ECI's wire types (`eci-proto`) where it speaks
//! ECI, and gives values. The only crate of the workspace it depends on is `eci-proto`, a leaf
//! with no I/O of its own; the others depend on it.
//!
//! - [`quantity`]: resource quantities, read and written back as the apiserver does;
//! - [`requests`]: a pod's resource requests as the scheduler counts them;
//! - [`expansion`]: `$(VAR)` references in env values, command and args;
//! - [`service_env`]: the Service variables a kubelet gives every container;
//! - [`downward`]: downward API values (pod fields, container resources);
//! - [`time`]: timestamps as the API writes them;
//! - [`refs`]: what a pod references that must be fetched before it can be translated;
//! - [`tokens`]: when service account tokens are issued again (the kubelet's refresh rule);
//! - [`to_eci`]: a pod as ECI's `CreateContainerGroupRequest`;
//! - [`from_eci`]: a container group's status as the pod's status;
//! - [`lifecycle`]: the life of one pod on a virtual node, a state machine of pure transitions;
//! - [`selector`]: eci-profile's `Selector` resource and the engine that places a pod by it
//!   (with `LabelSelector` objects' semantics, [`selector::labels`]);
//! - [`selector_text`]: label selectors written as text, as `kubectl -l` takes them;
//! - [`placement`]: the `ResourcePolicy` resource and the decisions that place pods in its units;
//! - [`tenancy`]: the namespace scope and the annotation policy, judged before a pod's group is
//!   created;
//! - [`kubelet_metrics`]: ECI's metric records as the kubelet's `/metrics/resource` and
//!   `/stats/summary` (what `kubectl top` and the HPA read through metrics-server).

pub mod downward;
pub mod expansion;
pub mod from_eci;
pub mod kubelet_metrics;
pub mod lifecycle;
pub mod placement;
pub mod quantity;
pub mod refs;
pub mod requests;
pub mod selector;
pub mod selector_text;
pub mod service_env;
pub mod tenancy;
pub mod time;
pub mod to_eci;
pub mod tokens;
