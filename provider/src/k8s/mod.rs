//! The Kubernetes edge shared by every area: the access declarations RBAC is generated from and
//! the resource-quantity grammar. A leaf: it calls no area.

pub mod access;
pub mod quantity;
