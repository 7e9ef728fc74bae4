//! The real Alibaba Cloud ECI OpenAPI: RPC-style signed POSTs over HTTPS (reqwest + rustls),
//! behind the same [`EciBackend`] trait as the gRPC client.

pub mod credentials;
pub mod response;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eci_proto::EciError;
use eci_proto::openapi::API_VERSION;
use eci_proto::openapi::form::{self, Request};
use eci_proto::openapi::signature::{
    SIGNATURE_METHOD, SIGNATURE_VERSION, canonicalized_query, percent_encode, sign, string_to_sign,
};
use eci_proto::v20180808::{
    ContainerGroup, CreateContainerGroupRequest, CreateContainerGroupResponse,
    DeleteContainerGroupRequest, DeleteContainerGroupResponse, DescribeContainerGroupMetricRequest,
    DescribeContainerGroupMetricResponse, DescribeContainerGroupStatusRequest,
    DescribeContainerGroupStatusResponse, DescribeContainerGroupsRequest,
    DescribeContainerGroupsResponse, DescribeContainerLogRequest, DescribeContainerLogResponse,
    DescribeMultiContainerGroupMetricRequest, DescribeMultiContainerGroupMetricResponse,
    ExecContainerCommandRequest, ExecContainerCommandResponse, RestartContainerGroupRequest,
    RestartContainerGroupResponse, UpdateContainerGroupRequest, UpdateContainerGroupResponse,
};
use eci_proto::v20180808::{
    CreateImageCacheRequest, CreateImageCacheResponse, DeleteImageCacheRequest,
    DeleteImageCacheResponse, DescribeImageCachesRequest, DescribeImageCachesResponse,
    UpdateImageCacheRequest, UpdateImageCacheResponse,
};
use futures::{StreamExt as _, TryStreamExt as _};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::debug;

use self::credentials::CredentialSource;
use self::response::{StatusPage, group_status};
use super::{EciBackend, Pacer, paging};

/// Most ids one describe call takes.
const IDS_PER_CALL: usize = 20;

/// Setting the client up failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenApiError {
    /// The extra CA file could not be read.
    #[error("--eci-ca-file (ECI_CA_FILE): cannot read {path}")]
    CaFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The extra CA file holds no usable certificate.
    #[error("--eci-ca-file (ECI_CA_FILE) {path}: not a PEM certificate")]
    CaCertificate {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTPS client")]
    Client(#[source] reqwest::Error),
}

/// How to reach the API.
#[derive(Debug, Clone)]
pub struct OpenApiOptions {
    /// `https://eci.<region>.aliyuncs.com` or an override.
    pub endpoint: String,
    /// Per-request deadline.
    pub timeout: Duration,
    /// An extra trusted CA (PEM file), for a proxy or a test endpoint.
    pub ca_file: Option<std::path::PathBuf>,
}

/// The OpenAPI client.
#[derive(Debug)]
pub struct OpenApiBackend {
    http: reqwest::Client,
    endpoint: String,
    credentials: CredentialSource,
    /// Paces the DescribeContainerGroups pages a status call fetches (None: pacing off).
    pacer: Option<Arc<Pacer>>,
}

/// Client-side codes (the service's own codes never start with `SDK.`).
pub mod client_codes {
    /// The credentials could not be obtained; retried, as a rotation or the metadata service
    /// usually recovers.
    pub const CREDENTIALS_UNAVAILABLE: &str = "ServiceUnavailable.Credentials";
    /// The endpoint could not be reached or did not answer in time.
    pub const UNREACHABLE: &str = "ServiceUnavailable.Unreachable";
    /// A request this client cannot put in the service's terms.
    pub const UNSUPPORTED: &str = "SDK.Unsupported";
}

impl OpenApiBackend {
    /// A client for `options.endpoint`, signing with `credentials`.
    pub fn new(
        options: &OpenApiOptions,
        credentials: CredentialSource,
    ) -> Result<Self, OpenApiError> {
        Ok(Self {
            http: http_client(options)?,
            endpoint: options.endpoint.trim_end_matches('/').to_owned(),
            credentials,
            pacer: None,
        })
    }

    /// Paces the pages fetched inside one call (a status poll's DescribeContainerGroups
    /// pages) from their own action's budget.
    #[must_use]
    pub fn with_pacer(mut self, pacer: Option<Arc<Pacer>>) -> Self {
        self.pacer = pacer;
        self
    }

    /// One DescribeContainerGroups page: paced from that action's budget, retried when
    /// throttled.
    async fn groups_page(
        &self,
        request: DescribeContainerGroupsRequest,
    ) -> Result<DescribeContainerGroupsResponse, EciError> {
        paging::page(self.pacer.as_deref(), "DescribeContainerGroups", || {
            self.describe_container_groups(request.clone())
        })
        .await
    }

    /// Where requests go.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// `request`'s action, its answer read as the contract's `T`.
    async fn invoke<R: Request + Sync, T: DeserializeOwned>(
        &self,
        request: &R,
    ) -> Result<T, EciError> {
        let body = self.call(request).await?;
        response::parse(R::ACTION, body)
    }

    /// One signed call of `request`'s action; the body of a successful answer.
    async fn call<R: Request + Sync>(&self, request: &R) -> Result<Value, EciError> {
        let action = R::ACTION;
        let params = form::encode(request).map_err(|error| {
            EciError::new(client_codes::UNSUPPORTED, format!("{action}: {error}"))
        })?;
        let credentials = self.credentials.current().await.map_err(|error| {
            EciError::new(
                client_codes::CREDENTIALS_UNAVAILABLE,
                crate::ops::chain::Chain(&error).to_string(),
            )
        })?;
        let now = SystemTime::now();
        let timestamp = humantime::format_rfc3339_seconds(now).to_string();
        let nonce = uuid::Uuid::new_v4().to_string();
        let body = signed_body(action, params, &credentials, &timestamp, &nonce);
        let response = self
            .http
            .post(format!("{}/", self.endpoint))
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|error| unreachable(&self.endpoint, action, &error))?;
        let status = response.status();
        let server_date = response
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = response
            .bytes()
            .await
            .map_err(|error| unreachable(&self.endpoint, action, &error))?;
        let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
        match parsed {
            Some(body @ Value::Object(_)) if status.is_success() => {
                debug!(action, request_id = %response::request_id(&body), "ECI call succeeded");
                Ok(body)
            }
            parsed => {
                let error = service_error(
                    action,
                    status.as_u16(),
                    parsed.as_ref(),
                    &bytes,
                    &timestamp,
                    server_date.as_deref(),
                );
                if super::misconfig::classify(&error)
                    == super::misconfig::ErrorClass::Configuration(
                        super::misconfig::Problem::Credentials,
                    )
                {
                    self.credentials.refused();
                }
                Err(error)
            }
        }
    }

    async fn groups_by_id(
        &self,
        region_id: &str,
        ids: &[String],
    ) -> Result<Vec<ContainerGroup>, EciError> {
        // The futures are made first and then run a few at a time: a stream combinator's
        // closure borrowing `self` would make this future not `Send` for the async trait.
        let calls: Vec<_> = ids
            .chunks(IDS_PER_CALL)
            .map(|chunk| {
                self.groups_page(DescribeContainerGroupsRequest {
                    region_id: region_id.to_owned(),
                    container_group_ids: chunk.to_vec(),
                    limit: i32::try_from(IDS_PER_CALL).ok(),
                    with_event: true,
                    ..DescribeContainerGroupsRequest::default()
                })
            })
            .collect();
        let pages: Vec<DescribeContainerGroupsResponse> = futures::stream::iter(calls)
            .buffered(paging::PAGE_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(pages.into_iter().flat_map(|p| p.container_groups).collect())
    }
}

fn http_client(options: &OpenApiOptions) -> Result<reqwest::Client, OpenApiError> {
    let mut builder = reqwest::Client::builder()
        .timeout(options.timeout)
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!("virtual-node-eci/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = &options.ca_file {
        let shown = path.display().to_string();
        let pem = std::fs::read(path).map_err(|source| OpenApiError::CaFile {
            path: shown.clone(),
            source,
        })?;
        let certificate =
            reqwest::Certificate::from_pem(&pem).map_err(|source| OpenApiError::CaCertificate {
                path: shown,
                source,
            })?;
        builder = builder.add_root_certificate(certificate);
    }
    builder.build().map_err(OpenApiError::Client)
}

fn unreachable(endpoint: &str, action: &str, error: &reqwest::Error) -> EciError {
    let what = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    // reqwest's Display names the URL, never the body: no secret can leak through it.
    EciError::new(
        client_codes::UNREACHABLE,
        format!("{action} to {endpoint} {what}: {error}"),
    )
}

/// The service's message without the string to sign it echoes on `SignatureDoesNotMatch`:
/// that is the whole request — the AccessKey id, the STS token, every parameter (a pod's
/// environment included) — and the message is logged and shown on pods.
fn without_string_to_sign(message: &str) -> String {
    // ASCII lowercasing keeps byte offsets.
    let Some(at) = message.to_ascii_lowercase().find("string to sign") else {
        return message.to_owned();
    };
    let kept = message[..at].trim_end_matches([' ', ':', '.']);
    let kept = kept
        .strip_suffix("server")
        .unwrap_or(kept)
        .trim_end_matches([' ', '.']);
    format!(
        "{kept}. (The service's string to sign is left out: it repeats the request and its credentials.)"
    )
}

/// The error an unsuccessful answer stands for, with a hint where the fix is on this side.
fn service_error(
    action: &str,
    http_status: u16,
    body: Option<&Value>,
    raw: &[u8],
    sent_timestamp: &str,
    server_date: Option<&str>,
) -> EciError {
    let text = |key: &str| {
        body.and_then(|b| b.get(key))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut code = text("Code");
    let mut message = without_string_to_sign(&text("Message"));
    if code.is_empty() {
        // Not the service's JSON: a proxy or load balancer answered.
        code = match http_status {
            429 => "Throttling",
            500..=599 => "ServiceUnavailable",
            // A refusal without the service's error body: whatever refused is not ECI (an
            // authenticating proxy, a wrong endpoint) — a configuration problem.
            400..=499 => eci_proto::error::codes::FOREIGN_RESPONSE,
            _ => response::INVALID_RESPONSE,
        }
        .to_owned();
        let snippet: String = String::from_utf8_lossy(raw).chars().take(200).collect();
        message = format!("{action}: HTTP {http_status} without an API error body: {snippet}");
    }
    let hint = if code.starts_with("InvalidTimeStamp") || code.starts_with("IllegalTimestamp") {
        format!(
            " — this host's clock said {sent_timestamp} when signing{}; requests more than 15 minutes off are refused: fix the node's time synchronisation (NTP)",
            server_date
                .map(|d| format!(", the service's said {d}"))
                .unwrap_or_default()
        )
    } else if code == "SignatureDoesNotMatch" {
        " — the AccessKey secret does not belong to the AccessKey id: check ECI_SECRET_KEY (or the credentials file)".to_owned()
    } else if code.starts_with("InvalidAccessKeyId") {
        " — check ECI_ACCESS_KEY (or the credentials file / RAM role)".to_owned()
    } else if code.starts_with("InvalidSecurityToken") {
        " — the STS token is invalid or expired: renew ECI_SECURITY_TOKEN or use a RAM role"
            .to_owned()
    } else if code.starts_with("Forbidden") {
        " — grant the RAM user/role the eci:* actions this daemon calls".to_owned()
    } else {
        String::new()
    };
    EciError::new(code, format!("{message}{hint}")).with_request_id(text("RequestId"))
}

macro_rules! actions {
    ($($method:ident($request:ty) -> $response:ty;)+) => {
        impl OpenApiBackend {
            $(async fn $method(&self, request: $request) -> Result<$response, EciError> {
                self.invoke(&request).await
            })+
        }

        #[async_trait::async_trait]
        impl EciBackend for OpenApiBackend {
            $(async fn $method(&self, request: $request) -> Result<$response, EciError> {
                OpenApiBackend::$method(self, request).await
            })+

            async fn describe_container_group_status(
                &self,
                request: DescribeContainerGroupStatusRequest,
            ) -> Result<DescribeContainerGroupStatusResponse, EciError> {
                self.status_page(request).await
            }

            async fn update_container_group(
                &self,
                request: UpdateContainerGroupRequest,
            ) -> Result<UpdateContainerGroupResponse, EciError> {
                if !request.container.is_empty() || !request.init_container.is_empty() {
                    // The daemon updates volumes and tags only; containers would need the
                    // service's own spellings for this action, which the form encoder leaves out.
                    return Err(EciError::new(
                        client_codes::UNSUPPORTED,
                        "UpdateContainerGroup: this client does not update containers",
                    ));
                }
                self.invoke(&request).await
            }
        }
    };
}

actions! {
    create_container_group(CreateContainerGroupRequest) -> CreateContainerGroupResponse;
    describe_container_groups(DescribeContainerGroupsRequest) -> DescribeContainerGroupsResponse;
    delete_container_group(DeleteContainerGroupRequest) -> DeleteContainerGroupResponse;
    restart_container_group(RestartContainerGroupRequest) -> RestartContainerGroupResponse;
    describe_container_log(DescribeContainerLogRequest) -> DescribeContainerLogResponse;
    exec_container_command(ExecContainerCommandRequest) -> ExecContainerCommandResponse;
    describe_container_group_metric(DescribeContainerGroupMetricRequest) -> DescribeContainerGroupMetricResponse;
    describe_multi_container_group_metric(DescribeMultiContainerGroupMetricRequest) -> DescribeMultiContainerGroupMetricResponse;
}

macro_rules! image_cache_actions {
    ($($method:ident($request:ty) -> $response:ty;)+) => {
        #[async_trait::async_trait]
        impl crate::eci::ImageCacheBackend for OpenApiBackend {
            $(async fn $method(&self, request: $request) -> Result<$response, EciError> {
                self.invoke(&request).await
            })+
        }
    };
}

image_cache_actions! {
    create_image_cache(CreateImageCacheRequest) -> CreateImageCacheResponse;
    describe_image_caches(DescribeImageCachesRequest) -> DescribeImageCachesResponse;
    update_image_cache(UpdateImageCacheRequest) -> UpdateImageCacheResponse;
    delete_image_cache(DeleteImageCacheRequest) -> DeleteImageCacheResponse;
}

impl OpenApiBackend {
    /// The service's status call answers with Kubernetes-style statuses and no tags or
    /// events, which the daemon needs. So: full listings page through DescribeContainerGroups
    /// by tag (20 a page, events included); incremental polls (`since_second`) ask
    /// DescribeContainerGroupStatus which groups changed, then describe just those (20 ids a
    /// call) — one call per interval plus one per 20 changed groups.
    async fn status_page(
        &self,
        request: DescribeContainerGroupStatusRequest,
    ) -> Result<DescribeContainerGroupStatusResponse, EciError> {
        let page_size = i32::try_from(IDS_PER_CALL).unwrap_or(20);
        if request.since_second.is_none() || !request.container_group_ids.is_empty() {
            let page = self
                .groups_page(DescribeContainerGroupsRequest {
                    region_id: request.region_id,
                    zone_id: request.zone_id,
                    container_group_ids: request.container_group_ids,
                    limit: Some(request.limit.unwrap_or(page_size).clamp(1, page_size)),
                    next_token: request.next_token,
                    tag: request.tag,
                    resource_group_id: request.resource_group_id,
                    with_event: true,
                    ..DescribeContainerGroupsRequest::default()
                })
                .await?;
            return Ok(DescribeContainerGroupStatusResponse {
                request_id: page.request_id,
                data: page
                    .container_groups
                    .into_iter()
                    .map(group_status)
                    .collect(),
                next_token: page.next_token,
                total_count: page.total_count,
            });
        }
        let body = self.call(&request).await?;
        let page = StatusPage::parse(body)?;
        let ids: Vec<String> = page
            .data
            .iter()
            .map(|entry| entry.container_group_id.clone())
            .collect();
        let mut full: std::collections::HashMap<String, ContainerGroup> = self
            .groups_by_id(&request.region_id, &ids)
            .await?
            .into_iter()
            .map(|group| (group.container_group_id.clone(), group))
            .collect();
        let data = page
            .data
            .into_iter()
            .map(|entry| {
                // A group deleted between the two calls keeps what the status call said.
                match full.remove(&entry.container_group_id) {
                    Some(group) => group_status(group),
                    None => entry.into_status(),
                }
            })
            .collect();
        Ok(DescribeContainerGroupStatusResponse {
            request_id: page.request_id,
            data,
            next_token: page.next_token,
            total_count: page.total_count,
        })
    }
}

/// The form body of one call: the action's parameters, the common ones and the signature
/// over all of them.
fn signed_body(
    action: &str,
    mut params: Vec<(String, String)>,
    credentials: &credentials::Credentials,
    timestamp: &str,
    nonce: &str,
) -> String {
    for (name, value) in [
        ("Action", action),
        ("Version", API_VERSION),
        ("Format", "JSON"),
        ("AccessKeyId", credentials.access_key_id.as_str()),
        ("SignatureMethod", SIGNATURE_METHOD),
        ("SignatureVersion", SIGNATURE_VERSION),
        ("SignatureNonce", nonce),
        ("Timestamp", timestamp),
    ] {
        params.push((name.to_owned(), value.to_owned()));
    }
    if let Some(token) = &credentials.security_token {
        params.push(("SecurityToken".to_owned(), token.expose().to_owned()));
    }
    let pairs = || params.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let signature = sign(
        credentials.access_key_secret.expose(),
        &string_to_sign("POST", pairs()),
    );
    format!(
        "{}&Signature={}",
        canonicalized_query(pairs()),
        percent_encode(&signature)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_echoed_string_to_sign_never_reaches_a_message() {
        let echoed = "Specified signature is not matched with our calculation. server string to sign is:POST&%2F&AccessKeyId%3Dkey-id%26SecurityToken%3Dsts";
        let kept = super::without_string_to_sign(echoed);
        assert_eq!(
            kept,
            "Specified signature is not matched with our calculation. (The service's string to sign is left out: it repeats the request and its credentials.)"
        );
        assert_eq!(
            super::without_string_to_sign("Specified access key is not found."),
            "Specified access key is not found."
        );
    }

    use super::*;

    #[test]
    fn clock_skew_is_explained() {
        let body = serde_json::json!({"RequestId": "R", "Code": "InvalidTimeStamp.Expired", "Message": "Specified time stamp or date value is expired."});
        let error = service_error(
            "CreateContainerGroup",
            400,
            Some(&body),
            b"",
            "2026-11-21T08:00:00Z",
            Some("Sat, 21 Nov 2026 08:40:00 GMT"),
        );
        assert_eq!(error.code, "InvalidTimeStamp.Expired");
        assert_eq!(error.request_id, "R");
        assert!(error.message.contains("2026-11-21T08:00:00Z"), "{error}");
        assert!(error.message.contains("08:40:00 GMT"), "{error}");
        assert!(error.message.contains("NTP"), "{error}");
        assert!(!error.is_retryable());
    }

    #[test]
    fn a_proxy_page_gets_a_code_by_http_status() {
        let error = service_error("X", 502, None, b"<html>bad gateway</html>", "t", None);
        assert_eq!(error.code, "ServiceUnavailable");
        assert!(error.is_retryable());
        assert!(error.message.contains("bad gateway"));
        let error = service_error("X", 429, None, b"", "t", None);
        assert!(error.is_throttling());
        let error = service_error("X", 404, None, b"", "t", None);
        assert!(!error.is_retryable());
        let error = service_error("X", 403, None, b"<html>Access denied</html>", "t", None);
        assert_eq!(
            error.code, "SDK.ForeignResponse",
            "not the service's refusal"
        );
        assert!(error.message.contains("HTTP 403"), "{error}");
        // A 2xx the client cannot read is not a refusal at all.
        let error = service_error("X", 200, None, b"<html>portal</html>", "t", None);
        assert_eq!(error.code, response::INVALID_RESPONSE);
    }

    #[test]
    fn setup_errors_say_their_part_once() {
        let error = OpenApiError::CaFile {
            path: "/etc/ca.pem".into(),
            source: std::io::Error::other("gone"),
        };
        assert!(crate::ops::chain::says_each_part_once(&error));
        assert_eq!(
            crate::ops::chain::Chain(&error).to_string(),
            "--eci-ca-file (ECI_CA_FILE): cannot read /etc/ca.pem: gone"
        );
    }
}
