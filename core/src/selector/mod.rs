//! eci-profile-compatible placement of pods at admission: the `Selector` resource's types
//! (`crd`), LabelSelector semantics (`labels`), and the pure engine that turns a pod, its
//! namespace's labels, the Selectors, the legacy ConfigMap's selectors and a capacity view
//! into the mutated pod (`engine`). The daemon's admission webhook calls it and owns the rest
//! (watches, caches, the seal on deferred effects).

pub mod crd;
pub mod engine;
pub mod labels;

#[cfg(test)]
mod tests;
