//! The HTTP side of the ECI OpenAPI (RPC style): how requests are signed and how the API's
//! `PascalCase` parameter and field names relate to this contract's `snake_case` ones. Shared by
//! the daemon's OpenAPI client and mock-eci's OpenAPI front, which must agree byte for byte.
//! [`documented`] is the judge of both: the service's names, extracted from the official SDK.
//! [`form`] (requests → flat parameters) is the client's alone: the front decodes with its own
//! code, so a name the encoder gets wrong shows up there as unknown.

pub mod documented;
pub mod form;
pub mod naming;
pub mod signature;

/// The API version every ECI call names.
pub const API_VERSION: &str = "2018-08-08";
