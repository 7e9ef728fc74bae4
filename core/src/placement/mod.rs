//! ResourcePolicy placement's pure half: the `ResourcePolicy` resource's types and what the
//! schema cannot check (`policy`), and the decisions — which unit a node or pod belongs to,
//! which pods count, where a pod goes and why, the node affinity that pins it (`decide`). The
//! daemon's placement area feeds them its watched state and carries the answers out.

pub mod decide;
pub mod policy;
