//! ECI error codes carried over gRPC.
//!
//! The HTTP API answers a failed call with a JSON body `{Code, Message, RequestId}`. Over gRPC
//! the same three facts travel as a [`tonic::Status`]: the message is the status message, the
//! code and the request id are metadata entries ([`ERROR_CODE_METADATA_KEY`],
//! [`REQUEST_ID_METADATA_KEY`]). [`EciError`] converts both ways.

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

/// Response metadata key holding the ECI error code of a failed call, e.g. `Throttling.User`.
pub const ERROR_CODE_METADATA_KEY: &str = "x-acs-error-code";
/// Response metadata key holding the request id of every call, failed or not.
pub const REQUEST_ID_METADATA_KEY: &str = "x-acs-request-id";

/// ECI error codes this contract uses. The service may return others; they are kept verbatim.
pub mod codes {
    /// The account's per-action call rate was exceeded.
    pub const THROTTLING_USER: &str = "Throttling.User";
    /// The service as a whole is shedding load.
    pub const THROTTLING: &str = "Throttling";
    /// Flow control of a degraded API; retry later.
    pub const DEGRADE_API: &str = "Degrade.Api";
    /// A required parameter is missing.
    pub const MISSING_PARAMETER: &str = "MissingParameter";
    /// A parameter has an invalid value (the generic form; most codes add a suffix).
    pub const INVALID_PARAMETER: &str = "InvalidParameter";
    /// The container group name breaks the naming rules.
    pub const INVALID_CONTAINER_GROUP_NAME: &str = "InvalidParameter.ContainerGroupName";
    /// The region in the request is not the one served.
    pub const INVALID_REGION_ID: &str = "InvalidRegionId.NotFound";
    /// No container group has the given id.
    pub const CONTAINER_GROUP_NOT_FOUND: &str = "InvalidContainerGroup.NotFound";
    /// The group is not in a status that allows the action.
    pub const INCORRECT_STATUS: &str = "IncorrectStatus";
    /// A ClientToken was reused with different parameters.
    pub const IDEMPOTENT_PARAMETER_MISMATCH: &str = "IdempotentParameterMismatch";
    /// A dry run found the request valid.
    pub const DRY_RUN_SUCCESS: &str = "DryRun.Success";
    /// The service is unavailable (outage, maintenance).
    pub const SERVICE_UNAVAILABLE: &str = "ServiceUnavailable";
    /// An unexpected failure inside the service.
    pub const INTERNAL_ERROR: &str = "InternalError";
    /// No zone of the listed vSwitches has stock for the instance. Error codes are not in the
    /// SDK; Alibaba's developer community answer on creating ECI instances names this one (the
    /// region's and zone's ECI sold out; use several zones and specifications).
    pub const NO_STOCK: &str = "OperationDenied.NoStock";
    /// The cloud disk of a `DiskVolume` is attached to another instance. ECI's own answer for
    /// it is not documented; this is the code ECS's AttachDisk documents for a disk that is
    /// not available, which mock-eci answers.
    pub const DISK_IN_USE: &str = "IncorrectDiskStatus";
    /// The account has an overdue payment.
    pub const ACCOUNT_ARREARAGE: &str = "Account.Arrearage";
    /// Client-side: the answer did not come from the service (no ECI error in it: a proxy's
    /// or load balancer's refusal page, a gRPC refusal without an ECI code).
    pub const FOREIGN_RESPONSE: &str = "SDK.ForeignResponse";
}

/// An error answered by ECI: its code, message and request id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ECI error {code}: {message} (RequestId: {request_id})")]
pub struct EciError {
    /// The ECI error code, e.g. `InvalidParameter.ContainerGroupName`.
    pub code: String,
    /// The service's human-readable explanation.
    pub message: String,
    /// The request id to quote to support; empty when the call never reached the service.
    pub request_id: String,
}

impl EciError {
    /// An error with the given code and message and no request id yet.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            request_id: String::new(),
        }
    }

    /// Sets the request id.
    #[must_use]
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = request_id.into();
        self
    }

    /// The gRPC code this ECI code travels as.
    pub fn grpc_code(&self) -> Code {
        grpc_code_for(&self.code)
    }

    /// Throttling or flow control: retry after a back-off.
    pub fn is_throttling(&self) -> bool {
        self.code.starts_with("Throttling") || self.code == codes::DEGRADE_API
    }

    /// Worth retrying with the same request: throttling, flow control, server-side failures.
    pub fn is_retryable(&self) -> bool {
        self.is_throttling()
            || matches!(
                self.code.as_str(),
                codes::SERVICE_UNAVAILABLE | codes::INTERNAL_ERROR
            )
            || self.code.starts_with("ServiceUnavailable")
            || self.code.starts_with("InternalError")
    }

    /// The addressed container group does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code == codes::CONTAINER_GROUP_NOT_FOUND
    }

    /// Encodes the error as a gRPC status with the code and request id in its metadata.
    pub fn into_status(self) -> Status {
        let mut status = Status::new(self.grpc_code(), self.message);
        let metadata = status.metadata_mut();
        if let Ok(value) = MetadataValue::try_from(self.code.as_str()) {
            metadata.insert(ERROR_CODE_METADATA_KEY, value);
        }
        if let Ok(value) = MetadataValue::try_from(self.request_id.as_str()) {
            metadata.insert(REQUEST_ID_METADATA_KEY, value);
        }
        status
    }

    /// Decodes a gRPC status. A status without an ECI code (a transport failure, a proxy)
    /// gets the code a client would treat the same way: `ServiceUnavailable` for
    /// unavailable/deadline/cancelled, `Throttling` for resource-exhausted, `InternalError`
    /// otherwise.
    pub fn from_status(status: &Status) -> Self {
        let metadata = status.metadata();
        let text = |key: &str| {
            metadata
                .get(key)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let code = text(ERROR_CODE_METADATA_KEY).unwrap_or_else(|| {
            match status.code() {
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                    codes::SERVICE_UNAVAILABLE
                }
                Code::ResourceExhausted => codes::THROTTLING,
                Code::NotFound => codes::CONTAINER_GROUP_NOT_FOUND,
                Code::InvalidArgument => codes::INVALID_PARAMETER,
                // Every refusal of the service carries its code: one without is from
                // something in front of it (an authenticating proxy, a wrong endpoint).
                Code::PermissionDenied | Code::Unauthenticated => codes::FOREIGN_RESPONSE,
                _ => codes::INTERNAL_ERROR,
            }
            .to_owned()
        });
        Self {
            code,
            message: status.message().to_owned(),
            request_id: text(REQUEST_ID_METADATA_KEY).unwrap_or_default(),
        }
    }
}

impl From<EciError> for Status {
    fn from(error: EciError) -> Self {
        error.into_status()
    }
}

impl From<&Status> for EciError {
    fn from(status: &Status) -> Self {
        Self::from_status(status)
    }
}

/// The gRPC code an ECI error code travels as (see the `.proto` header for the table).
pub fn grpc_code_for(code: &str) -> Code {
    let family = code.split('.').next().unwrap_or(code);
    if code == codes::DRY_RUN_SUCCESS {
        Code::Aborted
    } else if code.ends_with(".NotFound") || code.ends_with("NotFound") {
        Code::NotFound
    } else if family.starts_with("InvalidParameter")
        || family == "MissingParameter"
        || family.starts_with("Invalid")
        || code == codes::IDEMPOTENT_PARAMETER_MISMATCH
    {
        Code::InvalidArgument
    } else if family.starts_with("Throttling") || code == codes::DEGRADE_API {
        Code::ResourceExhausted
    } else if family == "IncorrectStatus"
        || family.starts_with("QuotaExceed")
        || family == "OperationDenied"
    {
        Code::FailedPrecondition
    } else if family.starts_with("Forbidden") || family == "Account" {
        Code::PermissionDenied
    } else if family == "SignatureDoesNotMatch" || family == "IncompleteSignature" {
        Code::Unauthenticated
    } else if family == "ServiceUnavailable" {
        Code::Unavailable
    } else {
        Code::Internal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_grpc_codes() {
        let cases = [
            ("Throttling.User", Code::ResourceExhausted),
            ("Throttling", Code::ResourceExhausted),
            ("Degrade.Api", Code::ResourceExhausted),
            ("InvalidParameter.ContainerGroupName", Code::InvalidArgument),
            ("MissingParameter", Code::InvalidArgument),
            ("InvalidContainerGroup.NotFound", Code::NotFound),
            ("InvalidRegionId.NotFound", Code::NotFound),
            ("IncorrectStatus", Code::FailedPrecondition),
            ("OperationDenied.NoStock", Code::FailedPrecondition),
            ("Forbidden.RAM", Code::PermissionDenied),
            ("Account.Arrearage", Code::PermissionDenied),
            ("SignatureDoesNotMatch", Code::Unauthenticated),
            ("InvalidAccessKeyId.NotFound", Code::NotFound),
            ("InvalidTimeStamp.Expired", Code::InvalidArgument),
            ("ServiceUnavailable", Code::Unavailable),
            ("DryRun.Success", Code::Aborted),
            ("InternalError", Code::Internal),
            ("SomethingNew", Code::Internal),
        ];
        for (code, expected) in cases {
            assert_eq!(grpc_code_for(code), expected, "{code}");
        }
    }

    #[test]
    fn status_round_trip_keeps_code_message_and_request_id() {
        let error = EciError::new(
            "Throttling.User",
            "Request was denied due to user flow control.",
        )
        .with_request_id("5B2A-REQ");
        let status = error.clone().into_status();
        assert_eq!(status.code(), Code::ResourceExhausted);
        let back = EciError::from_status(&status);
        assert_eq!(back, error);
        assert!(back.is_throttling());
        assert!(back.is_retryable());
    }

    #[test]
    fn status_without_metadata_gets_an_equivalent_code() {
        let back = EciError::from_status(&Status::unavailable("connection refused"));
        assert_eq!(back.code, codes::SERVICE_UNAVAILABLE);
        assert!(back.is_retryable());
        let back = EciError::from_status(&Status::invalid_argument("bad"));
        assert!(!back.is_retryable());
        let back = EciError::from_status(&Status::permission_denied("HTTP 403 from a proxy"));
        assert_eq!(back.code, codes::FOREIGN_RESPONSE);
    }

    #[test]
    fn client_errors_are_not_retryable() {
        for code in [
            "InvalidParameter",
            "MissingParameter",
            "Forbidden.RAM",
            "Account.Arrearage",
            "InvalidContainerGroup.NotFound",
        ] {
            assert!(!EciError::new(code, "x").is_retryable(), "{code}");
        }
    }
}
