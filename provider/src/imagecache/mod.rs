//! ack-virtual-node's `ImageCache` resource: cluster-scoped requests for ECI image caches
//! (see [`crd`]), which pods then name (`k8s.aliyun.com/eci-imc-id`) or match automatically
//! (`k8s.aliyun.com/eci-auto-imc`).

pub mod crd;
pub mod plan;
