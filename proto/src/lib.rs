//! The ECI OpenAPI 2018-08-08 as a gRPC contract.
//!
//! [`v20180808`] holds the generated messages, the `Eci` client and server. [`error`] maps
//! between a gRPC [`tonic::Status`] and the ECI error code the HTTP API would have returned, so
//! every client branches on the same `Code` strings whatever the transport.

pub mod error;
pub mod events;
pub mod openapi;
pub mod quota;
pub mod status;

/// Generated from `proto/eci/v20180808/eci.proto`.
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations
)]
pub mod v20180808 {
    tonic::include_proto!("eci.v20180808");
}

pub use error::{ERROR_CODE_METADATA_KEY, EciError, REQUEST_ID_METADATA_KEY};
