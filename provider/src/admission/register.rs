//! The daemon's MutatingWebhookConfiguration: created or corrected at start and every minute,
//! so its caBundle follows the certificate in use.

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tracing::info;

/// Where the webhook is served and which pods it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The configuration's name.
    pub name: String,
    /// The Service in front of the daemons.
    pub service: String,
    /// Its namespace.
    pub namespace: String,
    /// Its port.
    pub port: u16,
    /// The path.
    pub path: String,
    /// `timeoutSeconds`.
    pub timeout_seconds: i32,
    /// Namespaces never sent to the webhook.
    pub skip_namespaces: Vec<String>,
    /// The virtual nodes' taint key: a pod update is sent only when it drops a toleration of it.
    pub taint_key: String,
}

/// The label that keeps the daemon's own pods away from its webhook.
pub const SELF_LABEL: (&str, &str) = ("app.kubernetes.io/name", "virtual-node-eci");

/// The webhooks list as desired (pure). `ca_pem` None keeps `existing_ca` (someone else, e.g.
/// cert-manager's CA injector, manages it).
pub fn desired(
    registration: &Registration,
    ca_pem: Option<&str>,
    existing_ca: Option<&str>,
) -> Value {
    let ca = ca_pem
        .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem))
        .or_else(|| existing_ca.map(str::to_owned));
    let mut client = json!({"service": {
        "name": registration.service,
        "namespace": registration.namespace,
        "path": registration.path,
        "port": registration.port,
    }});
    if let Some(ca) = ca {
        client["caBundle"] = Value::String(ca);
    }
    let mut webhook = json!({
        "name": "selectors.virtual-node-eci.aliyun.com",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "reinvocationPolicy": "Never",
        "timeoutSeconds": registration.timeout_seconds,
        "clientConfig": client,
        "rules": [
            // UPDATE: an update leaving out a virtual-node toleration gets it back.
            {"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"},
            // What the ResourcePolicy schema cannot check is refused here, with the field.
            {"operations": ["CREATE", "UPDATE"], "apiGroups": ["scheduling.alibabacloud.com"], "apiVersions": ["v1alpha1"], "resources": ["resourcepolicies"], "scope": "Namespaced"},
        ],
        "objectSelector": {"matchExpressions": [{"key": SELF_LABEL.0, "operator": "NotIn", "values": [SELF_LABEL.1]}]},
        "matchConditions": [{"name": "pod-updates-dropping-a-vnode-toleration", "expression": update_condition(&registration.taint_key)}],
    });
    if !registration.skip_namespaces.is_empty() {
        webhook["namespaceSelector"] = json!({"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": registration.skip_namespaces,
        }]});
    }
    json!([webhook])
}

/// The CEL condition that keeps ordinary pod updates (labels, annotations, the scheduler
/// extender's marks, image changes) away from the webhook: of the pod UPDATEs, only those that
/// leave out a toleration of `taint_key` the pod had are sent — the only ones the review changes
/// ([`super::review`]). Every other request the rules match is sent. A condition that fails to
/// evaluate falls to the failure policy (`Ignore`), as an unreachable webhook does.
fn update_condition(taint_key: &str) -> String {
    // A JSON string literal is a CEL string literal for a label key's characters.
    let key = Value::String(taint_key.to_owned());
    format!(
        "request.resource.resource != 'pods' || request.operation != 'UPDATE' || \
         (has(oldObject.spec.tolerations) && oldObject.spec.tolerations.exists(t, \
         has(t.key) && t.key == {key} && \
         !(has(object.spec.tolerations) && object.spec.tolerations.exists(u, u == t))))"
    )
}

/// Creates or corrects the configuration; true when it wrote.
pub async fn reconcile(
    client: kube::Client,
    registration: &Registration,
    ca_pem: Option<&str>,
) -> Result<bool, kube::Error> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let existing = api.get_opt(&registration.name).await?;
    let existing_value = existing
        .as_ref()
        .map(|e| serde_json::to_value(e).unwrap_or_default());
    let existing_ca = existing_value
        .as_ref()
        .and_then(|e| e.pointer("/webhooks/0/clientConfig/caBundle"))
        .and_then(Value::as_str);
    let webhooks = desired(registration, ca_pem, existing_ca);
    let mut object = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": registration.name, "labels": {"app.kubernetes.io/managed-by": "virtual-node-eci"}},
        "webhooks": webhooks,
    });
    let parse = |v: Value| {
        serde_json::from_value::<MutatingWebhookConfiguration>(v).map_err(kube::Error::SerdeError)
    };
    match existing_value {
        None => {
            api.create(&PostParams::default(), &parse(object)?).await?;
            info!(configuration = %registration.name, "registered the mutating webhook");
            Ok(true)
        }
        Some(current) => {
            // Compare in typed form: the API server fills defaults we did not send.
            let wanted = serde_json::to_value(parse(object.clone())?).unwrap_or_default();
            if current.get("webhooks") == wanted.get("webhooks") {
                return Ok(false);
            }
            object["metadata"]["resourceVersion"] = current
                .pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or_default();
            api.replace(&registration.name, &PostParams::default(), &parse(object)?)
                .await?;
            info!(configuration = %registration.name, "corrected the mutating webhook configuration");
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(skip: &[&str]) -> Registration {
        Registration {
            name: "virtual-node-eci".into(),
            service: "virtual-node-eci".into(),
            namespace: "kube-system".into(),
            port: 443,
            path: "/mutate-pods".into(),
            timeout_seconds: 5,
            skip_namespaces: skip.iter().map(|s| (*s).to_owned()).collect(),
            taint_key: "k8s.aliyun.com/vnode".into(),
        }
    }

    #[test]
    fn the_webhook_is_safe_by_construction() {
        let webhooks = desired(&registration(&["kube-system"]), Some("PEM"), None);
        let hook = &webhooks[0];
        assert_eq!(hook["failurePolicy"], "Ignore");
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["timeoutSeconds"], 5);
        assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
        assert_eq!(hook["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
        assert_eq!(hook["rules"][0]["resources"], json!(["pods"]));
        let condition = hook["matchConditions"][0]["expression"].as_str().unwrap();
        assert!(
            condition.contains(r#"t.key == "k8s.aliyun.com/vnode""#),
            "{condition}"
        );
        assert_eq!(
            hook["namespaceSelector"]["matchExpressions"][0]["values"],
            json!(["kube-system"])
        );
        assert_eq!(
            hook["objectSelector"]["matchExpressions"][0]["key"],
            "app.kubernetes.io/name"
        );
        assert_eq!(
            hook["clientConfig"]["caBundle"],
            base64::engine::general_purpose::STANDARD.encode("PEM")
        );
        let parsed: MutatingWebhookConfiguration =
            serde_json::from_value(json!({"metadata": {"name": "x"}, "webhooks": webhooks}))
                .unwrap();
        assert_eq!(parsed.webhooks.unwrap().len(), 1);
    }

    #[test]
    fn an_externally_managed_ca_is_kept_and_no_skip_list_means_no_namespace_selector() {
        let webhooks = desired(&registration(&[]), None, Some("ZXhpc3Rpbmc="));
        assert_eq!(webhooks[0]["clientConfig"]["caBundle"], "ZXhpc3Rpbmc=");
        assert!(webhooks[0].get("namespaceSelector").is_none());
    }
}
