//! ack-virtual-node's `ImageCache` resource: cluster-scoped requests for ECI image caches
//! (see [`resource`]), which pods then name (`k8s.aliyun.com/eci-imc-id`) or match automatically
//! (`k8s.aliyun.com/eci-auto-imc`).

pub mod plan;
pub mod resource;
