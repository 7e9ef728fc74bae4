//! Mutating admission: pod CREATE goes through every matching MutatingWebhookConfiguration
//! over HTTPS, as kube-apiserver does it.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use serde::Serialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::selectors::LabelSelector;

/// What happened at one webhook (tests read these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdmissionRecord {
    /// `<configuration>/<webhook>`.
    pub webhook: String,
    /// `<namespace>/<name>` of the pod (generateName when unnamed).
    pub object: String,
    /// `patched`, `allowed`, `denied: …`, `ignored: …` or `failed: …`.
    pub outcome: String,
}

/// One webhook to call, resolved from its configuration.
#[derive(Debug, Clone)]
pub struct Webhook {
    /// `<configuration>/<webhook>`.
    pub name: String,
    /// The URL to post to.
    pub url: String,
    /// A host to pin to an address (service references on loopback).
    pub resolve: Option<(String, SocketAddr)>,
    /// PEM roots from `caBundle`.
    pub ca_bundle: Option<Vec<u8>>,
    /// `timeoutSeconds`.
    pub timeout: Duration,
    /// `failurePolicy: Ignore`.
    pub ignore_failures: bool,
}

/// Whether a webhook's rules, namespace selector and object selector select a pod CREATE.
pub fn selects(
    webhook: &Value,
    namespace_labels: Option<&Value>,
    pod: &Value,
) -> Result<bool, String> {
    let rule_matches = webhook
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|rule| {
            let has = |field: &str, value: &str| {
                rule.get(field)
                    .and_then(Value::as_array)
                    .is_some_and(|list| list.iter().any(|item| item == "*" || item == value))
            };
            let scope_ok = rule
                .get("scope")
                .and_then(Value::as_str)
                .is_none_or(|scope| scope == "*" || scope == "Namespaced");
            has("operations", "CREATE")
                && has("apiGroups", "")
                && has("apiVersions", "v1")
                && has("resources", "pods")
                && scope_ok
        });
    if !rule_matches {
        return Ok(false);
    }
    let selector = |field: &str| -> Result<LabelSelector, String> {
        webhook
            .get(field)
            .map_or(Ok(LabelSelector::default()), |s| {
                LabelSelector::from_object(s).map_err(|e| e.to_string())
            })
    };
    Ok(selector("namespaceSelector")?.matches(namespace_labels)
        && selector("objectSelector")?.matches(pod.pointer("/metadata/labels")))
}

/// Resolves how to reach a webhook: its URL, or its Service. A Service is reachable when the
/// stand-in can map it to loopback: its `spec.clusterIP` is a 127.x address, and the port the
/// webhook names maps to the service port's `targetPort` (or the port itself).
pub fn resolve(
    config_name: &str,
    webhook: &Value,
    services: &dyn Fn(&str, &str) -> Option<Value>,
) -> Result<Webhook, String> {
    let name = format!(
        "{config_name}/{}",
        webhook
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    );
    let client = webhook.get("clientConfig").cloned().unwrap_or_default();
    let ca_bundle = client
        .get("caBundle")
        .and_then(Value::as_str)
        .map(|b64| {
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("caBundle is not base64: {e}"))
        })
        .transpose()?;
    let timeout = Duration::from_secs(
        webhook
            .get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(10)
            .clamp(1, 30),
    );
    let ignore_failures = webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
    if let Some(url) = client.get("url").and_then(Value::as_str) {
        return Ok(Webhook {
            name,
            url: url.to_owned(),
            resolve: None,
            ca_bundle,
            timeout,
            ignore_failures,
        });
    }
    let service = client
        .get("service")
        .ok_or_else(|| "clientConfig has neither url nor service".to_owned())?;
    let namespace = service
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let service_name = service
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let port = service.get("port").and_then(Value::as_u64).unwrap_or(443);
    let path = service.get("path").and_then(Value::as_str).unwrap_or("/");
    let host = format!("{service_name}.{namespace}.svc");
    let resolved = services(namespace, service_name)
        .and_then(|svc| {
            let ip = svc.pointer("/spec/clusterIP").and_then(Value::as_str)?.parse::<std::net::IpAddr>().ok()?;
            if !ip.is_loopback() {
                return None;
            }
            let target = svc
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|p| p.get("port").and_then(Value::as_u64) == Some(port))
                .and_then(|p| p.get("targetPort").and_then(Value::as_u64))
                .unwrap_or(port);
            Some(SocketAddr::new(ip, u16::try_from(target).ok()?))
        })
        .ok_or_else(|| format!("service {namespace}/{service_name} is not reachable from the stand-in (give it a 127.0.0.1 clusterIP)"))?;
    Ok(Webhook {
        url: format!("https://{host}:{}{path}", resolved.port()),
        resolve: Some((host, resolved)),
        name,
        ca_bundle,
        timeout,
        ignore_failures,
    })
}

/// The AdmissionReview sent for a pod CREATE.
pub fn review(uid: &str, namespace: &str, pod: &Value, dry_run: bool) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default(),
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": super::auth::ADMIN_USER, "groups": ["system:masters", "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    })
}

/// Calls one webhook and returns the mutated pod.
pub async fn call(
    webhook: &Webhook,
    namespace: &str,
    pod: &Value,
    dry_run: bool,
) -> Result<Value, CallError> {
    let mut builder = reqwest::Client::builder()
        .timeout(webhook.timeout)
        .use_rustls_tls();
    if let Some(pem) = &webhook.ca_bundle {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| CallError::Failed(format!("caBundle: {e}")))?;
        builder = builder.tls_built_in_root_certs(false);
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let Some((host, addr)) = &webhook.resolve {
        builder = builder.resolve(host, *addr);
    }
    let client = builder
        .build()
        .map_err(|e| CallError::Failed(e.to_string()))?;
    let uid = uuid::Uuid::new_v4().to_string();
    let response = client
        .post(&webhook.url)
        .json(&review(&uid, namespace, pod, dry_run))
        .send()
        .await
        .map_err(|e| CallError::Failed(format!("Post \"{}\": {e}", webhook.url)))?;
    if !response.status().is_success() {
        return Err(CallError::Failed(format!(
            "the server responded with status {}",
            response.status()
        )));
    }
    let body: Value = response
        .json()
        .await
        .map_err(|e| CallError::Failed(format!("invalid AdmissionReview response: {e}")))?;
    let answer = body
        .get("response")
        .ok_or_else(|| CallError::Failed("the AdmissionReview response has no response".into()))?;
    if answer.get("uid").and_then(Value::as_str) != Some(uid.as_str()) {
        return Err(CallError::Failed(format!(
            "expected response.uid={uid}, got {}",
            answer.get("uid").unwrap_or(&Value::Null)
        )));
    }
    if answer.get("allowed").and_then(Value::as_bool) != Some(true) {
        let message = answer
            .pointer("/status/message")
            .and_then(Value::as_str)
            .unwrap_or("denied")
            .to_owned();
        let code = answer
            .pointer("/status/code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(400);
        return Err(CallError::Denied { code, message });
    }
    let mut patched = pod.clone();
    // `patch` is a []byte: a base64 string, or (Go's decoder accepts it too) an array of bytes.
    let bytes = match answer.get("patch") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| CallError::Failed(format!("patch is not base64: {e}")))?,
        ),
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| CallError::Failed("patch is not an array of bytes".into()))?,
        ),
        Some(_) => return Err(CallError::Failed("patch must be base64 or bytes".into())),
    };
    if let Some(bytes) = bytes {
        if answer.get("patchType").and_then(Value::as_str) != Some("JSONPatch") {
            return Err(CallError::Failed("patchType must be JSONPatch".into()));
        }
        let operations: json_patch::Patch = serde_json::from_slice(&bytes)
            .map_err(|e| CallError::Failed(format!("patch is not a JSON patch: {e}")))?;
        json_patch::patch(&mut patched, &operations)
            .map_err(|e| CallError::Failed(format!("the patch could not be applied: {e}")))?;
    }
    Ok(patched)
}

/// Why a webhook call did not produce a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The webhook answered `allowed: false`.
    Denied {
        /// Code to answer with.
        code: u16,
        /// Its message.
        message: String,
    },
    /// The call failed (network, timeout, malformed answer).
    Failed(String),
}

impl CallError {
    /// The API error a client sees.
    pub fn into_api_error(self, webhook: &str) -> ApiError {
        match self {
            CallError::Denied { code, message } => ApiError {
                code,
                reason: if code == 403 {
                    "Forbidden"
                } else {
                    "BadRequest"
                },
                message: format!("admission webhook \"{webhook}\" denied the request: {message}"),
                details: None,
            },
            CallError::Failed(message) => ApiError::internal(format!(
                "Internal error occurred: failed calling webhook \"{webhook}\": {message}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook() -> Value {
        json!({
            "name": "vnode.eci.aliyun.com",
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]},
            "objectSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["virtual-node-eci"]}]},
            "clientConfig": {"service": {"namespace": "kube-system", "name": "virtual-node-eci", "port": 443, "path": "/mutate"}},
            "failurePolicy": "Ignore",
            "timeoutSeconds": 5
        })
    }

    #[test]
    fn selection_by_rules_and_selectors() {
        let pod = json!({"metadata": {"labels": {"app": "web"}}});
        let ns = json!({"kubernetes.io/metadata.name": "default"});
        assert!(selects(&webhook(), Some(&ns), &pod).unwrap());
        let system = json!({"kubernetes.io/metadata.name": "kube-system"});
        assert!(!selects(&webhook(), Some(&system), &pod).unwrap());
        let own = json!({"metadata": {"labels": {"app": "virtual-node-eci"}}});
        assert!(!selects(&webhook(), Some(&ns), &own).unwrap());
        let mut updates_only = webhook();
        updates_only["rules"][0]["operations"] = json!(["UPDATE"]);
        assert!(!selects(&updates_only, Some(&ns), &pod).unwrap());
    }

    #[test]
    fn services_resolve_to_loopback_only() {
        let loopback = json!({"spec": {"clusterIP": "127.0.0.1", "ports": [{"port": 443, "targetPort": 9443}]}});
        let resolved = resolve("vnode", &webhook(), &|_, _| Some(loopback.clone())).unwrap();
        assert_eq!(
            resolved.url,
            "https://virtual-node-eci.kube-system.svc:9443/mutate"
        );
        assert_eq!(
            resolved.resolve.unwrap().1,
            "127.0.0.1:9443".parse().unwrap()
        );
        assert!(resolved.ignore_failures);
        assert_eq!(resolved.timeout, Duration::from_secs(5));
        let remote = json!({"spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 443}]}});
        assert!(
            resolve("vnode", &webhook(), &|_, _| Some(remote.clone()))
                .unwrap_err()
                .contains("not reachable")
        );
    }
}
