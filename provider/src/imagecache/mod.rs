//! ack-virtual-node's `ImageCache` resource: cluster-scoped requests for ECI image caches
//! (see [`resource`]), which pods then name (`k8s.aliyun.com/eci-imc-id`) or match automatically
//! (`k8s.aliyun.com/eci-auto-imc`). The elected replica's [`reconciler`] builds them in ECI by
//! the pure [`plan`]. May call `k8s`, `eci`, `ops`, `config`; pull secrets are read
//! as the translation reads them (`vne_core::to_eci::registry_credentials`).

pub mod plan;
pub mod reconciler;
pub mod resource;
