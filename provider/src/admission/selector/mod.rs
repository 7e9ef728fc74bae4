//! eci-profile-compatible placement of pods: the `Selector` resource and the legacy ConfigMap,
//! evaluated by a pure engine the admission webhook calls.

pub mod crd;
pub mod engine;
pub mod labels;
pub mod seal;

#[cfg(test)]
mod tests;
