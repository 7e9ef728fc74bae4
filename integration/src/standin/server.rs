//! HTTP(S) serving and routing of the stand-in.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, warn};

use super::admission::{self, AdmissionRecord, CallError};
use super::api::{Api, DeleteOptions, Deleted, ListOptions, Write};
use super::error::ApiError;
use super::faults::FaultRule;
use super::patch::PatchType;
use super::registry::ResourceType;
use super::selectors::{FieldSelector, LabelSelector};
use super::watch::{self as watching, WatchRequest};
use super::{State, table};

const MAX_BODY: usize = 16 * 1024 * 1024;

/// A resource request, parsed from the path.
#[derive(Debug, Clone)]
struct Target {
    resource: ResourceType,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn json_response(code: u16, value: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(value).unwrap_or_default()))
        .unwrap_or_default()
}

fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.code, &error.to_status())
}

fn query_map(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

fn param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

fn truthy(query: &[(String, String)], name: &str) -> bool {
    matches!(param(query, name), Some("true" | "1"))
}

fn dry_run(query: &[(String, String)]) -> bool {
    param(query, "dryRun").is_some_and(|value| !value.is_empty())
}

/// Serves every request.
pub(super) async fn handle(state: Arc<State>, request: Request<Body>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let query = query_map(parts.uri.query());
    let body = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            return error_response(&ApiError::bad_request(format!(
                "the request body could not be read: {error}"
            )));
        }
    };
    debug!(method = %parts.method, %path, "request");
    if let Some(control) = path.strip_prefix("/standin/") {
        return control_request(&state, &parts.method, control, &query, &body);
    }
    if let Some(injected) = state.faults.check(parts.method.as_str(), &path) {
        if !injected.latency.is_zero() {
            tokio::time::sleep(injected.latency).await;
        }
        if let Some(code) = injected.status {
            let error = ApiError {
                code,
                reason: match code {
                    409 => "Conflict",
                    429 => "TooManyRequests",
                    503 => "ServiceUnavailable",
                    504 => "Timeout",
                    _ => "InternalError",
                },
                message: format!("injected fault {code} for {path}"),
                details: None,
            };
            let mut response = error_response(&error);
            if code == 429 {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            }
            return response;
        }
    }
    match route(&state, &parts.method, &path, &query, &parts.headers, body).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    }
}

async fn route(
    state: &Arc<State>,
    method: &Method,
    path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    let segments: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let discovery = |value: Option<Value>| {
        value
            .map(|v| json_response(200, &v))
            .ok_or_else(|| ApiError::no_route(path))
    };
    match segments.as_slice() {
        ["version"] => Ok(json_response(200, &version())),
        ["healthz" | "livez" | "readyz", ..] => Ok(Response::new(Body::from("ok"))),
        ["api"] => discovery(Some(state.lock().registry.core_versions())),
        ["apis"] => discovery(Some(state.lock().registry.group_list())),
        ["api", version] => discovery(state.lock().registry.resource_list("", version)),
        ["apis", group] => discovery(state.lock().registry.group(group)),
        ["apis", group, version] => discovery(state.lock().registry.resource_list(group, version)),
        ["openapi", "v2"] => Ok(openapi_v2(headers)),
        ["openapi", "v3"] => Ok(json_response(200, &state.lock().registry.openapi_v3_root())),
        ["openapi", "v3", "api", version] => {
            discovery(state.lock().registry.openapi_v3("", version))
        }
        ["openapi", "v3", "apis", group, version] => {
            discovery(state.lock().registry.openapi_v3(group, version))
        }
        ["api", version, rest @ ..] => {
            resource_request(
                state,
                method,
                target("", version, rest, state, path)?,
                query,
                headers,
                body,
            )
            .await
        }
        ["apis", group, version, rest @ ..] => {
            resource_request(
                state,
                method,
                target(group, version, rest, state, path)?,
                query,
                headers,
                body,
            )
            .await
        }
        _ => Err(ApiError::no_route(path)),
    }
}

/// An OpenAPI v2 document without paths or definitions. Older kubectl (1.20) downloads it for
/// client-side validation and skips types it has no schema for; it asks for protobuf, which for
/// this document is two short fields (gnostic's `Document.swagger` = 1, `Document.info` = 2
/// with `Info.title` = 1 and `Info.version` = 2).
fn openapi_v2(headers: &HeaderMap) -> Response<Body> {
    let wants_protobuf = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("protobuf"));
    let (title, version) = ("Kubernetes (API stand-in)", "v1.33.0");
    if !wants_protobuf {
        return json_response(
            200,
            &json!({"swagger": "2.0", "info": {"title": title, "version": version}, "paths": {}, "definitions": {}}),
        );
    }
    let field = |tag: u8, bytes: &[u8]| {
        let mut out = vec![tag, u8::try_from(bytes.len()).unwrap_or(0)];
        out.extend_from_slice(bytes);
        out
    };
    let info = [
        field(0x0a, title.as_bytes()),
        field(0x12, version.as_bytes()),
    ]
    .concat();
    let document = [field(0x0a, b"2.0"), field(0x12, &info)].concat();
    Response::builder()
        .status(200)
        .header(
            header::CONTENT_TYPE,
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        )
        .body(Body::from(document))
        .unwrap_or_default()
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-standin", "gitCommit": "virtual-node-eci",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64",
    })
}

fn target(
    group: &str,
    version: &str,
    rest: &[&str],
    state: &State,
    path: &str,
) -> Result<Target, ApiError> {
    let api = state.lock();
    let lookup = |plural: &str| api.registry.lookup(group, version, plural).cloned();
    let make = |resource: ResourceType,
                namespace: Option<&str>,
                name: Option<&&str>,
                sub: Option<&&str>| Target {
        resource,
        version: version.to_owned(),
        namespace: namespace.map(str::to_owned),
        name: name.map(|n| (*n).to_owned()),
        subresource: sub.map(|s| (*s).to_owned()),
    };
    // `/namespaces/{ns}/{plural}/…` names a namespaced resource; `/namespaces/{name}[/status]`
    // names a namespace.
    if let ["namespaces", namespace, plural, tail @ ..] = rest {
        if let Some(resource) = lookup(plural).filter(|r| r.namespaced) {
            if tail.len() <= 2 {
                return Ok(make(resource, Some(namespace), tail.first(), tail.get(1)));
            }
        }
    }
    match rest {
        [plural, tail @ ..] if tail.len() <= 2 => {
            let resource = lookup(plural).ok_or_else(|| ApiError::no_route(path))?;
            if resource.namespaced && !tail.is_empty() {
                return Err(ApiError::no_route(path));
            }
            Ok(make(resource, None, tail.first(), tail.get(1)))
        }
        _ => Err(ApiError::no_route(path)),
    }
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(table::wanted)
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    if body.starts_with(b"k8s\0") {
        return Err(ApiError::unsupported_media_type(
            "the API stand-in speaks JSON only, not protobuf",
        ));
    }
    serde_json::from_slice(body).map_err(|error| {
        ApiError::bad_request(format!("the request body is not valid JSON: {error}"))
    })
}

fn list_options(query: &[(String, String)]) -> Result<ListOptions, ApiError> {
    let invalid = |error: super::selectors::SelectorError| ApiError::bad_request(error.to_string());
    Ok(ListOptions {
        labels: LabelSelector::parse(param(query, "labelSelector").unwrap_or_default())
            .map_err(invalid)?,
        fields: FieldSelector::parse(param(query, "fieldSelector").unwrap_or_default())
            .map_err(invalid)?,
        limit: param(query, "limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0),
        continue_token: param(query, "continue")
            .filter(|c| !c.is_empty())
            .map(str::to_owned),
    })
}

async fn resource_request(
    state: &Arc<State>,
    method: &Method,
    target: Target,
    query: &[(String, String)],
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    let t = target.resource.clone();
    let namespace = target.namespace.clone().unwrap_or_default();
    if t.namespaced
        && target.namespace.is_none()
        && (target.name.is_some() || *method != Method::GET && *method != Method::DELETE)
    {
        return Err(ApiError::no_route(
            "a namespaced resource needs /namespaces/{namespace}/ in its path",
        ));
    }
    let present = |object: Value| Api::present(&t, &target.version, object);
    let sub = target.subresource.as_deref();
    match (method.as_str(), target.name.as_deref(), sub) {
        ("GET", None, None) => {
            let options = list_options(query)?;
            if truthy(query, "watch") {
                let timeout = param(query, "timeoutSeconds")
                    .and_then(|s| s.parse::<u64>().ok())
                    .map_or(Duration::from_secs(1800), Duration::from_secs);
                let receiver = watching::start(
                    state,
                    WatchRequest {
                        resource: t.clone(),
                        version: target.version.clone(),
                        namespace: target.namespace.clone(),
                        options,
                        resource_version: param(query, "resourceVersion").map(str::to_owned),
                        bookmarks: truthy(query, "allowWatchBookmarks"),
                        timeout,
                    },
                )?;
                let stream = ReceiverStream::new(receiver).map(Ok::<_, Infallible>);
                return Ok(Response::builder()
                    .status(200)
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(header::TRANSFER_ENCODING, "chunked")
                    .body(Body::from_stream(stream))
                    .unwrap_or_default());
            }
            let list =
                state
                    .lock()
                    .list(&t, &target.version, target.namespace.as_deref(), &options)?;
            if wants_table(headers) {
                let items = list["items"].as_array().cloned().unwrap_or_default();
                let rv = list
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                return Ok(json_response(
                    200,
                    &table::table(&t.group, &t.plural, &items, rv),
                ));
            }
            Ok(json_response(200, &list))
        }
        ("GET", Some(name), None | Some("status")) => {
            let object = present(state.lock().get(&t, &namespace, name)?);
            if sub.is_none() && wants_table(headers) {
                let rv = object
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                return Ok(json_response(
                    200,
                    &table::table(&t.group, &t.plural, &[object], &rv),
                ));
            }
            Ok(json_response(200, &object))
        }
        ("GET", Some(name), Some("scale")) if t.subresources.scale.is_some() => Ok(json_response(
            200,
            &state.lock().scale(&t, &namespace, name)?,
        )),
        ("POST", None, None) if t.create_only => {
            let review = parse_body(&body)?;
            let rules = state
                .auth
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let answer = if t.plural == "tokenreviews" {
                rules.review_token(&review)
            } else {
                rules.review_access(&review)
            };
            Ok(json_response(201, &answer))
        }
        ("POST", None, None) => {
            let mut object = parse_body(&body)?;
            let dry_run = dry_run(query);
            if t.group.is_empty() && t.plural == "pods" {
                state.lock().admit_pod(&namespace, &mut object)?;
                object = admit_pod(state, &namespace, object, dry_run).await?;
            }
            let created = state.lock().create(&t, &namespace, object, dry_run)?;
            Ok(json_response(201, &present(created)))
        }
        ("POST", Some(name), Some("eviction")) if t.subresources.eviction => Ok(
            json_response_code(&state.lock().evict(&namespace, name, &parse_body(&body)?)?),
        ),
        ("POST", Some(name), Some("token")) if t.subresources.token => Ok(json_response(
            201,
            &state
                .lock()
                .request_token(&namespace, name, &parse_body(&body)?)?,
        )),
        ("POST", Some(name), Some("binding")) if t.subresources.binding => Ok(json_response_code(
            &state.lock().bind(&namespace, name, &parse_body(&body)?)?,
        )),
        ("PUT", Some(name), None | Some("status")) => {
            let status_only = sub == Some("status");
            if status_only && !t.subresources.status {
                return Err(ApiError::no_route("status"));
            }
            let updated = state.lock().update(
                &t,
                &namespace,
                name,
                parse_body(&body)?,
                Write {
                    status_only,
                    dry_run: dry_run(query),
                },
            )?;
            Ok(json_response(200, &present(updated)))
        }
        ("PUT", Some(name), Some("scale")) if t.subresources.scale.is_some() => Ok(json_response(
            200,
            &state
                .lock()
                .set_scale(&t, &namespace, name, &parse_body(&body)?)?,
        )),
        ("PATCH", Some(name), None | Some("status") | Some("scale")) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = PatchType::from_content_type(content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})")))?;
            let patch = parse_body(&body)?;
            let mut api = state.lock();
            if sub == Some("scale") {
                let mut scale = api.scale(&t, &namespace, name)?;
                super::patch::apply(kind, &mut scale, &patch)
                    .map_err(|e| ApiError::invalid(e.0))?;
                return Ok(json_response(
                    200,
                    &api.set_scale(&t, &namespace, name, &scale)?,
                ));
            }
            let status_only = sub == Some("status");
            if status_only && !t.subresources.status {
                return Err(ApiError::no_route("status"));
            }
            let patched = api.patch(
                &t,
                &namespace,
                name,
                kind,
                &patch,
                Write {
                    status_only,
                    dry_run: dry_run(query),
                },
            )?;
            Ok(json_response(200, &present(patched)))
        }
        ("DELETE", Some(name), None) => {
            let base = DeleteOptions {
                grace_period_seconds: param(query, "gracePeriodSeconds")
                    .and_then(|g| g.parse().ok()),
                orphan: param(query, "propagationPolicy") == Some("Orphan"),
                dry_run: dry_run(query),
                ..DeleteOptions::default()
            };
            let options = DeleteOptions::from_body(&parse_body(&body)?, base);
            match state.lock().delete(&t, &namespace, name, &options)? {
                Deleted::Gone(object) | Deleted::Terminating(object) => {
                    Ok(json_response(200, &present(object)))
                }
            }
        }
        ("DELETE", None, None) => {
            let options = list_options(query)?;
            let mut api = state.lock();
            let list = api.list(&t, &target.version, target.namespace.as_deref(), &options)?;
            for item in list["items"].as_array().into_iter().flatten() {
                let name = item
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let ns = item
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                api.delete(&t, ns, name, &DeleteOptions::default())?;
            }
            Ok(json_response(200, &list))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on this path"
        ))),
    }
}

fn json_response_code(status: &Value) -> Response<Body> {
    let code = status
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or(200);
    json_response(code, status)
}

/// Runs a pod CREATE through the mutating webhooks.
async fn admit_pod(
    state: &Arc<State>,
    namespace: &str,
    mut pod: Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let (webhooks, namespace_labels) = {
        let api = state.lock();
        let configs = api.type_of(
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
        );
        let services = api.type_of("", "services");
        let namespaces = api.type_of("", "namespaces");
        let mut namespace_labels = api
            .store
            .get(&namespaces.key(), "", namespace)
            .and_then(|ns| ns.pointer("/metadata/labels").cloned())
            .unwrap_or_else(|| json!({}));
        // kube-apiserver labels every namespace with its name.
        namespace_labels["kubernetes.io/metadata.name"] = Value::String(namespace.to_owned());
        let lookup = |ns: &str, name: &str| api.store.get(&services.key(), ns, name).cloned();
        let mut webhooks = Vec::new();
        for config in api
            .store
            .objects(&configs.key())
            .into_iter()
            .flat_map(|objects| objects.values())
        {
            let config_name = config
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            for webhook in config
                .get("webhooks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                webhooks.push((
                    config_name.to_owned(),
                    webhook.clone(),
                    admission::resolve(config_name, webhook, &lookup),
                ));
            }
        }
        (webhooks, namespace_labels)
    };
    let object_name = pod
        .pointer("/metadata/name")
        .or_else(|| pod.pointer("/metadata/generateName"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    for (config_name, webhook, resolved) in webhooks {
        let record = |webhook: &str, outcome: String| {
            state
                .admission_log
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(AdmissionRecord {
                    webhook: webhook.to_owned(),
                    object: format!("{namespace}/{object_name}"),
                    outcome,
                });
        };
        let full_name = format!(
            "{config_name}/{}",
            webhook
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
        );
        match admission::selects(&webhook, Some(&namespace_labels), &pod) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(error) => {
                record(&full_name, format!("failed: invalid selector: {error}"));
                continue;
            }
        }
        let ignore = webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
        let result = match resolved {
            Ok(target) => admission::call(&target, namespace, &pod, dry_run).await,
            Err(message) => Err(CallError::Failed(message)),
        };
        match result {
            Ok(patched) => {
                record(
                    &full_name,
                    if patched == pod {
                        "allowed".into()
                    } else {
                        "patched".into()
                    },
                );
                pod = patched;
            }
            Err(CallError::Failed(message)) if ignore => {
                warn!(webhook = %full_name, %message, "webhook failed; failurePolicy Ignore");
                record(&full_name, format!("ignored: {message}"));
            }
            Err(error) => {
                let api_error = error.into_api_error(&full_name);
                record(
                    &full_name,
                    if api_error.code == 500 {
                        format!("failed: {}", api_error.message)
                    } else {
                        format!("denied: {}", api_error.message)
                    },
                );
                return Err(api_error);
            }
        }
    }
    Ok(pod)
}

fn control_request(
    state: &Arc<State>,
    method: &Method,
    path: &str,
    query: &[(String, String)],
    body: &Bytes,
) -> Response<Body> {
    let ok = || json_response(200, &json!({"ok": true}));
    match (method.as_str(), path) {
        ("POST", "faults") => match serde_json::from_slice::<FaultRule>(body) {
            Ok(rule) => {
                state.faults.add(rule);
                ok()
            }
            Err(error) => error_response(&ApiError::bad_request(format!(
                "invalid fault rule: {error}"
            ))),
        },
        ("DELETE", "faults") => {
            state.faults.clear();
            ok()
        }
        ("POST", "watches/close") => {
            state.faults.close_watches();
            ok()
        }
        ("POST", "watches/expire") => {
            let count = param(query, "count")
                .and_then(|c| c.parse().ok())
                .unwrap_or(1);
            state.faults.expire_next_watches(count);
            ok()
        }
        ("POST", "compact") => {
            state.lock().store.compact();
            ok()
        }
        ("PUT", "auth") => match serde_json::from_slice(body) {
            Ok(rules) => {
                *state
                    .auth
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = rules;
                ok()
            }
            Err(error) => error_response(&ApiError::bad_request(format!(
                "invalid auth rules: {error}"
            ))),
        },
        ("GET", "admission") => json_response(
            200,
            &json!(
                *state
                    .admission_log
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            ),
        ),
        _ => error_response(&ApiError::no_route(path)),
    }
}

/// Accepts connections until `shutdown` flips, serving each over HTTP/1.1 or HTTP/2.
pub(super) async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let tls = tls.clone();
        let mut connection_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let state = Arc::clone(&state);
                    async move { Ok::<_, Infallible>(handle(state, request.map(Body::new)).await) }
                });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let result = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => {
                        let connection = builder.serve_connection_with_upgrades(
                            hyper_util::rt::TokioIo::new(stream),
                            service,
                        );
                        tokio::select! {
                            result = connection => result,
                            _ = connection_shutdown.wait_for(|stop| *stop) => Ok(()),
                        }
                    }
                    Err(error) => {
                        debug!(%error, "TLS handshake failed");
                        return;
                    }
                },
                None => {
                    let connection = builder.serve_connection_with_upgrades(
                        hyper_util::rt::TokioIo::new(stream),
                        service,
                    );
                    tokio::select! {
                        result = connection => result,
                        _ = connection_shutdown.wait_for(|stop| *stop) => Ok(()),
                    }
                }
            };
            if let Err(error) = result {
                debug!(%error, "connection ended with an error");
            }
        });
    }
}
