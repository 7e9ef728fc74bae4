//! End-to-end test infrastructure for virtual-node-eci: a real Kubernetes control plane built
//! from upstream ([`cluster`]), a host-node agent that runs the project's own pods as local
//! processes ([`host`]), and the harness the end-to-end tests drive ([`harness`]).

pub mod cluster;
pub mod daemon_figures;
pub mod harness;
pub mod host;
pub mod http_check;
pub mod images;
pub mod local_net;
pub mod measure;
pub mod proc_stat;
pub mod process;
pub mod real_mode;
pub mod registry;
