//! End-to-end test infrastructure for virtual-node-eci: a Kubernetes API stand-in
//! ([`standin`]) and a harness that runs the real binaries against it or a real cluster.

pub mod harness;
pub mod standin;
