//! The Kubernetes edge shared by every area: the access declarations RBAC is generated from,
//! Lease holding (node Lease, elections), the resource-quantity grammar, a pod's requests and
//! the serving certificate shared through a Secret (webhook, scheduler extender).
//! A leaf: it calls no area.

pub mod access;
pub mod election;
pub mod quantity;
pub mod requests;
pub mod serving_cert;

use std::time::SystemTime;

/// RFC 3339 at second precision, as the API writes `Time` fields.
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}
