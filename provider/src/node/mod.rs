//! The virtual Node itself: registration (and re-registration when deleted), its Lease, its
//! status, conditions and capacity, and the ECI reachability that decides Ready. May call
//! `k8s`, `eci`, `ops`, `config`; knows nothing of pods beyond counting them.

pub mod eci_health;
pub mod guard;
pub mod lease;
pub mod registration;
pub mod shape;
pub mod status;
