//! The API's semantics over the store: create, get, list, update, patch, delete, and the
//! subresources (status, scale, eviction, binding) — all synchronous, under the state lock.

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

use super::error::{ApiError, success_status};
use super::patch::{self, PatchType};
use super::registry::{Registry, ResourceType, TypeKey, type_from_crd};
use super::selectors::{FieldSelector, LabelSelector};
use super::store::Store;

/// Namespaces that exist from the start.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// The current time as the API writes it.
pub fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn time_after(seconds: i64) -> String {
    let at = SystemTime::now() + Duration::from_secs(u64::try_from(seconds.max(0)).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Parsed list options.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// `limit`.
    pub limit: Option<usize>,
    /// `continue`.
    pub continue_token: Option<String>,
}

impl ListOptions {
    /// Whether an object passes the selectors.
    pub fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object.pointer("/metadata/labels")) && self.fields.matches(object)
    }
}

/// Parsed delete options.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `gracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `propagationPolicy` is `Orphan`.
    pub orphan: bool,
    /// `dryRun=All`.
    pub dry_run: bool,
}

impl DeleteOptions {
    /// Reads a DeleteOptions body (may be empty) merged over query parameters.
    pub fn from_body(body: &Value, mut base: DeleteOptions) -> Self {
        if let Some(grace) = body.get("gracePeriodSeconds").and_then(Value::as_i64) {
            base.grace_period_seconds = Some(grace);
        }
        if let Some(uid) = body.pointer("/preconditions/uid").and_then(Value::as_str) {
            base.uid = Some(uid.to_owned());
        }
        if let Some(rv) = body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
        {
            base.resource_version = Some(rv.to_owned());
        }
        if body.get("propagationPolicy").and_then(Value::as_str) == Some("Orphan") {
            base.orphan = true;
        }
        if body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| !d.is_empty())
        {
            base.dry_run = true;
        }
        base
    }
}

/// Which part of an object a write changes, and whether it is a dry run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Write {
    /// Only `status` (the `/status` subresource); otherwise everything but `status`.
    pub status_only: bool,
    /// `dryRun=All`: validate and answer, store nothing.
    pub dry_run: bool,
}

/// Registry and store: what the lock guards.
#[derive(Debug)]
pub struct Api {
    /// Served types.
    pub registry: Registry,
    /// Objects.
    pub store: Store,
    next_cluster_ip: u32,
    /// PEM published in every namespace's `kube-root-ca.crt` ConfigMap.
    root_ca: String,
}

/// The outcome of a delete: the object as it now is, or as it was when it went.
#[derive(Debug, Clone)]
pub enum Deleted {
    /// Gone.
    Gone(Value),
    /// Still there, terminating (graceful deletion or finalizers).
    Terminating(Value),
}

impl Api {
    /// A fresh API with the system namespaces.
    pub fn new(log_capacity: usize, root_ca: String) -> Self {
        let mut api = Self {
            registry: Registry::new(),
            store: Store::new(log_capacity),
            next_cluster_ip: 1,
            root_ca,
        };
        let namespaces = api.type_of("", "namespaces");
        for namespace in SYSTEM_NAMESPACES {
            let body =
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
            api.create(&namespaces, "", body, false)
                .expect("system namespaces are valid");
        }
        api
    }

    /// A built-in type (panics on a typo: programmer error).
    pub fn type_of(&self, group: &str, plural: &str) -> ResourceType {
        self.registry
            .get(&TypeKey {
                group: group.into(),
                plural: plural.into(),
            })
            .cloned()
            .unwrap_or_else(|| panic!("built-in type {plural}.{group} is registered"))
    }

    /// An object as served in `version`.
    pub fn present(t: &ResourceType, version: &str, mut object: Value) -> Value {
        object["apiVersion"] = Value::String(t.api_version(version));
        object["kind"] = Value::String(t.kind.clone());
        object
    }

    fn check_body_type(t: &ResourceType, body: &Value) -> Result<(), ApiError> {
        if let Some(api_version) = body.get("apiVersion").and_then(Value::as_str) {
            let served = t.versions.iter().any(|v| t.api_version(v) == api_version);
            if !served {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({api_version}) does not match the expected API version ({})",
                    t.api_version(&t.versions[0])
                )));
            }
        }
        if let Some(kind) = body.get("kind").and_then(Value::as_str) {
            if kind != t.kind {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({kind}) does not match the expected kind ({})",
                    t.kind
                )));
            }
        }
        if !body.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        Ok(())
    }

    fn require_namespace(&self, t: &ResourceType, namespace: &str) -> Result<(), ApiError> {
        if !t.namespaced {
            return Ok(());
        }
        let namespaces = TypeKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        match self.store.get(&namespaces, "", namespace) {
            None => Err(ApiError::not_found("", "namespaces", namespace)),
            Some(ns) if !meta_str(ns, "deletionTimestamp").is_empty() => {
                Err(ApiError::new_forbidden(format!(
                    "unable to create new content in namespace {namespace} because it is being terminated"
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// Creates an object (after admission).
    pub fn create(
        &mut self,
        t: &ResourceType,
        namespace: &str,
        mut body: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        Self::check_body_type(t, &body)?;
        if t.create_only {
            return Err(ApiError::internal(
                "reviews are answered by the review handler",
            ));
        }
        if !body.get("metadata").is_some_and(Value::is_object) {
            body["metadata"] = json!({});
        }
        let body_namespace = meta_str(&body, "namespace").to_owned();
        if t.namespaced && !body_namespace.is_empty() && body_namespace != namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        self.require_namespace(t, namespace)?;
        let mut name = meta_str(&body, "name").to_owned();
        if name.is_empty() {
            let prefix = meta_str(&body, "generateName").to_owned();
            if prefix.is_empty() {
                return Err(ApiError::invalid(format!(
                    "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                    t.kind
                )));
            }
            name = loop {
                let candidate = format!("{prefix}{}", random_suffix());
                if self.store.get(&t.key(), namespace, &candidate).is_none() {
                    break candidate;
                }
            };
        }
        validate_name(t, &name)?;
        if self.store.get(&t.key(), namespace, &name).is_some() {
            return Err(ApiError::already_exists(&t.group, &t.plural, &name));
        }
        let metadata = body["metadata"]
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
        metadata.insert("name".into(), Value::String(name.clone()));
        if t.namespaced {
            metadata.insert("namespace".into(), Value::String(namespace.to_owned()));
        } else {
            metadata.remove("namespace");
        }
        metadata.insert(
            "uid".into(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        metadata.insert("creationTimestamp".into(), Value::String(now()));
        metadata.insert("generation".into(), json!(1));
        for field in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "selfLink",
        ] {
            metadata.remove(field);
        }
        body["apiVersion"] = Value::String(t.api_version(&t.storage_version));
        body["kind"] = Value::String(t.kind.clone());
        self.defaults_on_create(t, &mut body)?;
        if dry_run {
            return Ok(body);
        }
        let created = self.store.insert(&t.key(), namespace, &name, body);
        if t.key() == crd_key() {
            self.register_crd(&created)?;
        }
        if t.group.is_empty() && t.plural == "namespaces" {
            self.populate_namespace(&name)?;
        }
        Ok(created)
    }

    /// What kube-controller-manager puts in every new namespace: the `default`
    /// ServiceAccount and the `kube-root-ca.crt` ConfigMap.
    fn populate_namespace(&mut self, namespace: &str) -> Result<(), ApiError> {
        let accounts = self.type_of("", "serviceaccounts");
        let account =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
        self.create(&accounts, namespace, account, false)?;
        let maps = self.type_of("", "configmaps");
        let ca = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": self.root_ca}});
        self.create(&maps, namespace, ca, false)?;
        Ok(())
    }

    /// What built-in admission does to a new pod before the webhooks see it: defaults, and the
    /// ServiceAccount plugin (the account must exist; its token, the cluster CA and the
    /// namespace are mounted at /var/run/secrets/kubernetes.io/serviceaccount unless
    /// automounting is off).
    pub fn admit_pod(&self, namespace: &str, pod: &mut Value) -> Result<(), ApiError> {
        if !pod.get("spec").is_some_and(Value::is_object) {
            return Err(ApiError::invalid("Pod spec: Required value"));
        }
        default_pod(pod);
        let account_name = pod
            .pointer("/spec/serviceAccountName")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_owned();
        let accounts = self.type_of("", "serviceaccounts");
        let account = self.store.get(&accounts.key(), namespace, &account_name).ok_or_else(|| {
            ApiError::new_forbidden(format!("pods is forbidden: error looking up service account {namespace}/{account_name}: serviceaccount \"{account_name}\" not found"))
        })?;
        let automount = pod
            .pointer("/spec/automountServiceAccountToken")
            .and_then(Value::as_bool)
            .or_else(|| {
                account
                    .get("automountServiceAccountToken")
                    .and_then(Value::as_bool)
            })
            .unwrap_or(true);
        const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
        let all_containers = |pod: &Value| {
            ["containers", "initContainers"]
                .into_iter()
                .flat_map(|list| {
                    pod.pointer(&format!("/spec/{list}"))
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                })
                .collect::<Vec<_>>()
        };
        let mounted = all_containers(pod).iter().any(|c| {
            c.get("volumeMounts")
                .and_then(Value::as_array)
                .is_some_and(|m| m.iter().any(|m| m["mountPath"] == MOUNT_PATH))
        });
        if !automount || mounted {
            return Ok(());
        }
        let volume_name = format!("kube-api-access-{}", random_suffix());
        let volume = json!({"name": volume_name, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]}});
        let spec = &mut pod["spec"];
        match spec.get_mut("volumes").and_then(Value::as_array_mut) {
            Some(volumes) => volumes.push(volume),
            None => spec["volumes"] = json!([volume]),
        }
        for list in ["containers", "initContainers"] {
            for container in spec
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let mount = json!({"name": volume_name, "mountPath": MOUNT_PATH, "readOnly": true});
                match container
                    .get_mut("volumeMounts")
                    .and_then(Value::as_array_mut)
                {
                    Some(mounts) => mounts.push(mount),
                    None => container["volumeMounts"] = json!([mount]),
                }
            }
        }
        Ok(())
    }

    /// `serviceaccounts/{name}/token`: a TokenRequest answered with a stand-in token that
    /// TokenReview recognises.
    pub fn request_token(
        &self,
        namespace: &str,
        name: &str,
        request: &Value,
    ) -> Result<Value, ApiError> {
        let accounts = self.type_of("", "serviceaccounts");
        self.get(&accounts, namespace, name)?;
        let seconds = request
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(3600)
            .max(600);
        let mut answer = request.clone();
        answer["apiVersion"] = json!("authentication.k8s.io/v1");
        answer["kind"] = json!("TokenRequest");
        answer["status"] = json!({
            "token": format!("{}{namespace}.{name}.{}", super::auth::SERVICE_ACCOUNT_TOKEN_PREFIX, uuid::Uuid::new_v4().simple()),
            "expirationTimestamp": time_after(seconds),
        });
        Ok(answer)
    }

    fn defaults_on_create(&mut self, t: &ResourceType, body: &mut Value) -> Result<(), ApiError> {
        match (t.group.as_str(), t.plural.as_str()) {
            ("", "pods") => default_pod(body),
            ("", "namespaces") => {
                body["status"] = json!({"phase": "Active"});
                // kube-apiserver labels every namespace with its own name.
                let name = meta_str(body, "name").to_owned();
                body["metadata"]["labels"]["kubernetes.io/metadata.name"] = Value::String(name);
            }
            ("", "secrets") => fold_string_data(body),
            ("", "services") => {
                let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
                if spec
                    .get("clusterIP")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .is_empty()
                    && spec.get("type").and_then(Value::as_str) != Some("ExternalName")
                {
                    let ip = format!(
                        "10.96.{}.{}",
                        self.next_cluster_ip / 250,
                        self.next_cluster_ip % 250 + 1
                    );
                    self.next_cluster_ip += 1;
                    body["spec"]["clusterIP"] = Value::String(ip.clone());
                    body["spec"]["clusterIPs"] = json!([ip]);
                }
                if body.pointer("/spec/type").is_none() {
                    body["spec"]["type"] = json!("ClusterIP");
                }
            }
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                let defined =
                    type_from_crd(body).map_err(|error| ApiError::invalid(error.to_string()))?;
                if self
                    .registry
                    .get(&defined.key())
                    .is_some_and(|existing| !is_crd_type(existing, body))
                {
                    return Err(ApiError::invalid(format!(
                        "{}.{} is already served",
                        defined.plural, defined.group
                    )));
                }
                body["status"] = crd_status(body);
            }
            _ => {}
        }
        Ok(())
    }

    fn register_crd(&mut self, crd: &Value) -> Result<(), ApiError> {
        let defined = type_from_crd(crd).map_err(|error| ApiError::invalid(error.to_string()))?;
        self.registry.insert(defined);
        Ok(())
    }

    /// One object.
    pub fn get(&self, t: &ResourceType, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.store
            .get(&t.key(), namespace, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&t.group, &t.plural, name))
    }

    /// A page of objects (all namespaces when `namespace` is `None`).
    pub fn list(
        &self,
        t: &ResourceType,
        version: &str,
        namespace: Option<&str>,
        options: &ListOptions,
    ) -> Result<Value, ApiError> {
        let start = match &options.continue_token {
            Some(token) => Some(decode_continue(token)?),
            None => None,
        };
        let mut items = Vec::new();
        let mut next = None;
        let mut remaining = 0usize;
        if let Some(objects) = self.store.objects(&t.key()) {
            let range = objects
                .iter()
                .filter(|((ns, _), _)| namespace.is_none_or(|wanted| ns == wanted));
            for (key, object) in range {
                if start.as_ref().is_some_and(|start| key <= start) || !options.matches(object) {
                    continue;
                }
                if options.limit.is_some_and(|limit| items.len() >= limit) {
                    if next.is_none() {
                        next = items.last().map(|last: &(String, String, Value)| {
                            encode_continue(&(last.0.clone(), last.1.clone()))
                        });
                    }
                    remaining += 1;
                    continue;
                }
                items.push((key.0.clone(), key.1.clone(), object.clone()));
            }
        }
        let mut metadata = json!({"resourceVersion": self.store.rv().to_string()});
        if let Some(token) = next {
            metadata["continue"] = Value::String(token);
            metadata["remainingItemCount"] = json!(remaining);
        }
        Ok(json!({
            "kind": format!("{}List", t.kind),
            "apiVersion": t.api_version(version),
            "metadata": metadata,
            "items": items.into_iter().map(|(_, _, object)| Self::present(t, version, object)).collect::<Vec<_>>(),
        }))
    }

    /// PUT of the main resource (`status` ignored when the type has a status subresource) or of
    /// `/status` (everything but `status` ignored).
    pub fn update(
        &mut self,
        t: &ResourceType,
        namespace: &str,
        name: &str,
        body: Value,
        write: Write,
    ) -> Result<Value, ApiError> {
        let Write {
            status_only,
            dry_run,
        } = write;
        Self::check_body_type(t, &body)?;
        let current = self.get(t, namespace, name)?;
        let body_name = meta_str(&body, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let wanted_rv = meta_str(&body, "resourceVersion");
        if !wanted_rv.is_empty() && wanted_rv != meta_str(&current, "resourceVersion") {
            return Err(ApiError::conflict(
                &t.group,
                &t.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let mut next = if status_only {
            let mut next = current.clone();
            next["status"] = body.get("status").cloned().unwrap_or(Value::Null);
            next
        } else {
            let mut next = body;
            if t.subresources.status {
                match current.get("status") {
                    Some(status) => next["status"] = status.clone(),
                    None => {
                        if let Some(object) = next.as_object_mut() {
                            object.remove("status");
                        }
                    }
                }
            }
            // System-owned metadata cannot be changed by a client.
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
            ] {
                match current["metadata"].get(field) {
                    Some(value) => next["metadata"][field] = value.clone(),
                    None => {
                        if let Some(metadata) = next["metadata"].as_object_mut() {
                            metadata.remove(field);
                        }
                    }
                }
            }
            next
        };
        next["apiVersion"] = Value::String(t.api_version(&t.storage_version));
        next["kind"] = Value::String(t.kind.clone());
        if t.plural == "secrets" && t.group.is_empty() {
            fold_string_data(&mut next);
        }
        if !status_only && spec_changed(&current, &next) {
            let generation = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            next["metadata"]["generation"] = json!(generation + 1);
        }
        if t.key() == crd_key() && !status_only {
            type_from_crd(&next).map_err(|error| ApiError::invalid(error.to_string()))?;
            next["status"] = crd_status(&next);
        }
        next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        if next == current || dry_run {
            return Ok(next);
        }
        // Removing the last finalizer of a deleted object completes its deletion.
        let deleting = !meta_str(&next, "deletionTimestamp").is_empty();
        let finalizers_left = next
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let graceful_pod = t.plural == "pods"
            && t.group.is_empty()
            && next
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                > 0;
        if deleting && !finalizers_left && !graceful_pod {
            self.store.replace(&t.key(), namespace, name, next);
            return self.finish_delete(t, namespace, name, false);
        }
        let stored = self.store.replace(&t.key(), namespace, name, next);
        if t.key() == crd_key() {
            self.register_crd(&stored)?;
        }
        Ok(stored)
    }

    /// PATCH of the main resource or `/status`.
    pub fn patch(
        &mut self,
        t: &ResourceType,
        namespace: &str,
        name: &str,
        kind: PatchType,
        patch_body: &Value,
        write: Write,
    ) -> Result<Value, ApiError> {
        let current = self.get(t, namespace, name)?;
        let mut patched = current.clone();
        patch::apply(kind, &mut patched, patch_body).map_err(|error| match kind {
            PatchType::Apply => ApiError::unsupported_media_type(error.0),
            _ => ApiError::invalid(error.0),
        })?;
        let wanted_rv = meta_str(&patched, "resourceVersion").to_owned();
        if !wanted_rv.is_empty() && wanted_rv != meta_str(&current, "resourceVersion") {
            return Err(ApiError::conflict(
                &t.group,
                &t.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        self.update(t, namespace, name, patched, write)
    }

    /// DELETE, with preconditions, finalizers and pod graceful deletion.
    pub fn delete(
        &mut self,
        t: &ResourceType,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let current = self.get(t, namespace, name)?;
        if let Some(uid) = &options.uid {
            if uid != meta_str(&current, "uid") {
                return Err(ApiError::conflict(
                    &t.group,
                    &t.plural,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        meta_str(&current, "uid")
                    ),
                ));
            }
        }
        if let Some(rv) = &options.resource_version {
            if rv != meta_str(&current, "resourceVersion") {
                return Err(ApiError::conflict(
                    &t.group,
                    &t.plural,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        meta_str(&current, "resourceVersion")
                    ),
                ));
            }
        }
        if options.dry_run {
            return Ok(Deleted::Gone(current));
        }
        let is_pod = t.group.is_empty() && t.plural == "pods";
        let grace = if is_pod {
            pod_grace(&current, options.grace_period_seconds)
        } else {
            0
        };
        let has_finalizers = current
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if grace == 0 && !has_finalizers {
            let gone = self.finish_delete(t, namespace, name, options.orphan)?;
            return Ok(Deleted::Gone(gone));
        }
        let mut next = current.clone();
        let existing_grace = current
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        let shorter = existing_grace.is_none_or(|existing| grace < existing);
        if meta_str(&current, "deletionTimestamp").is_empty() || shorter {
            next["metadata"]["deletionTimestamp"] = Value::String(time_after(grace));
            next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        }
        if grace == 0 && is_pod && !has_finalizers {
            let gone = self.finish_delete(t, namespace, name, options.orphan)?;
            return Ok(Deleted::Gone(gone));
        }
        if next == current {
            return Ok(Deleted::Terminating(current));
        }
        Ok(Deleted::Terminating(self.store.replace(
            &t.key(),
            namespace,
            name,
            next,
        )))
    }

    /// Removes the object and what depends on it.
    fn finish_delete(
        &mut self,
        t: &ResourceType,
        namespace: &str,
        name: &str,
        orphan: bool,
    ) -> Result<Value, ApiError> {
        let gone = self
            .store
            .remove(&t.key(), namespace, name)
            .ok_or_else(|| ApiError::not_found(&t.group, &t.plural, name))?;
        if t.key() == crd_key() {
            if let Ok(defined) = type_from_crd(&gone) {
                let key = defined.key();
                let instances: Vec<(String, String)> = self
                    .store
                    .objects(&key)
                    .map(|objects| objects.keys().cloned().collect())
                    .unwrap_or_default();
                for (ns, instance) in instances {
                    self.store.remove(&key, &ns, &instance);
                }
                self.registry.remove(&key);
            }
        }
        if t.group.is_empty() && t.plural == "namespaces" {
            let contained = self
                .store
                .find(|object| meta_str(object, "namespace") == name);
            for (key, ns, object_name) in contained {
                self.store.remove(&key, &ns, &object_name);
            }
        }
        if !orphan {
            self.collect_garbage(meta_str(&gone, "uid"));
        }
        Ok(gone)
    }

    /// Deletes dependents whose owners are all gone (background propagation).
    fn collect_garbage(&mut self, owner_uid: &str) {
        if owner_uid.is_empty() {
            return;
        }
        for (key, namespace, name) in self.store.dependents(owner_uid) {
            let Some(object) = self.store.get(&key, &namespace, &name) else {
                continue;
            };
            let owners_alive = object
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
                .any(|uid| uid != owner_uid && self.store.uid_exists(uid));
            if owners_alive {
                continue;
            }
            if let Some(t) = self.registry.get(&key).cloned() {
                let _ = self.delete(&t, &namespace, &name, &DeleteOptions::default());
            }
        }
    }

    /// `pods/{name}/binding`.
    pub fn bind(
        &mut self,
        namespace: &str,
        name: &str,
        binding: &Value,
    ) -> Result<Value, ApiError> {
        let pods = self.type_of("", "pods");
        let mut pod = self.get(&pods, namespace, name)?;
        let node = binding
            .pointer("/target/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if node.is_empty() {
            return Err(ApiError::invalid("Binding target.name: Required value"));
        }
        let bound = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !bound.is_empty() {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!("pod {name} is already assigned to node \"{bound}\""),
            ));
        }
        if !meta_str(&pod, "deletionTimestamp").is_empty() {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        pod["spec"]["nodeName"] = Value::String(node.to_owned());
        set_condition(&mut pod, "PodScheduled", "True", "");
        self.store.replace(&pods.key(), namespace, name, pod);
        Ok(success_status(201, None))
    }

    /// `pods/{name}/eviction`, honouring PodDisruptionBudgets.
    pub fn evict(
        &mut self,
        namespace: &str,
        name: &str,
        eviction: &Value,
    ) -> Result<Value, ApiError> {
        let pods = self.type_of("", "pods");
        let pod = self.get(&pods, namespace, name)?;
        if !meta_str(&pod, "deletionTimestamp").is_empty() {
            return Ok(success_status(200, None));
        }
        let pdbs = self.type_of("policy", "poddisruptionbudgets");
        let budgets: Vec<Value> = self
            .store
            .objects(&pdbs.key())
            .map(|objects| {
                objects
                    .iter()
                    .filter(|((ns, _), _)| ns == namespace)
                    .map(|(_, pdb)| pdb.clone())
                    .collect()
            })
            .unwrap_or_default();
        let labels = pod.pointer("/metadata/labels").cloned();
        for budget in budgets {
            let selector = budget
                .pointer("/spec/selector")
                .cloned()
                .unwrap_or_else(|| json!({}));
            let selector = LabelSelector::from_object(&selector)
                .map_err(|error| ApiError::invalid(error.to_string()))?;
            if !selector.matches(labels.as_ref()) {
                continue;
            }
            let covered: Vec<&Value> = self
                .store
                .objects(&pods.key())
                .into_iter()
                .flat_map(|objects| objects.iter())
                .filter(|((ns, _), p)| {
                    ns == namespace && selector.matches(p.pointer("/metadata/labels"))
                })
                .map(|(_, p)| p)
                .filter(|p| meta_str(p, "deletionTimestamp").is_empty() && !is_terminal(p))
                .collect();
            let expected = covered.len();
            let healthy = covered.iter().filter(|p| is_ready(p)).count();
            let desired = desired_healthy(&budget, expected);
            let pdb_name = meta_str(&budget, "name").to_owned();
            let allowed = !is_ready(&pod) && healthy >= desired || healthy > desired;
            if !allowed {
                return Err(ApiError::too_many_requests("Cannot evict pod as it would violate the pod's disruption budget.").with_details(json!({
                    "causes": [{"reason": "DisruptionBudget", "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently")}]
                })));
            }
        }
        let options = DeleteOptions::from_body(
            eviction.get("deleteOptions").unwrap_or(&Value::Null),
            DeleteOptions::default(),
        );
        self.delete(&pods, namespace, name, &options)?;
        Ok(success_status(201, None))
    }

    /// `{type}/{name}/scale` as an autoscaling/v1 Scale.
    pub fn scale(&self, t: &ResourceType, namespace: &str, name: &str) -> Result<Value, ApiError> {
        let object = self.get(t, namespace, name)?;
        let paths = t
            .subresources
            .scale
            .as_ref()
            .ok_or_else(|| ApiError::no_route("scale"))?;
        let read = |path: &str| {
            object
                .pointer(&json_pointer(path))
                .and_then(Value::as_i64)
                .unwrap_or(0)
        };
        let mut status = json!({"replicas": read(&paths.status_replicas)});
        if let Some(selector) = &paths.label_selector {
            if let Some(text) = object.pointer(&json_pointer(selector)) {
                status["selector"] = text.clone();
            }
        }
        Ok(json!({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": name, "namespace": namespace, "uid": meta_str(&object, "uid"),
                "resourceVersion": meta_str(&object, "resourceVersion"), "creationTimestamp": meta_str(&object, "creationTimestamp"),
            },
            "spec": {"replicas": read(&paths.spec_replicas)},
            "status": status,
        }))
    }

    /// Writes a Scale (after a PUT or a patch of it) back to the object.
    pub fn set_scale(
        &mut self,
        t: &ResourceType,
        namespace: &str,
        name: &str,
        scale: &Value,
    ) -> Result<Value, ApiError> {
        let current_scale = self.scale(t, namespace, name)?;
        let wanted_rv = meta_str(scale, "resourceVersion");
        if !wanted_rv.is_empty() && wanted_rv != meta_str(&current_scale, "resourceVersion") {
            return Err(ApiError::conflict(
                &t.group,
                &t.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let replicas = scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .ok_or_else(|| ApiError::invalid("Scale spec.replicas: Required value"))?;
        if replicas < 0 {
            return Err(ApiError::invalid(
                "Scale spec.replicas: must be greater than or equal to 0",
            ));
        }
        let paths = t
            .subresources
            .scale
            .clone()
            .ok_or_else(|| ApiError::no_route("scale"))?;
        let mut object = self.get(t, namespace, name)?;
        set_pointer(
            &mut object,
            &json_pointer(&paths.spec_replicas),
            json!(replicas),
        );
        self.update(t, namespace, name, object, Write::default())?;
        self.scale(t, namespace, name)
    }
}

impl ApiError {
    /// 403 Forbidden.
    pub fn new_forbidden(message: String) -> Self {
        ApiError {
            code: 403,
            reason: "Forbidden",
            message,
            details: None,
        }
    }
}

fn crd_key() -> TypeKey {
    TypeKey {
        group: "apiextensions.k8s.io".into(),
        plural: "customresourcedefinitions".into(),
    }
}

fn is_crd_type(existing: &ResourceType, crd: &Value) -> bool {
    type_from_crd(crd).is_ok_and(|defined| defined.kind == existing.kind)
        && !super::registry::builtin_types()
            .iter()
            .any(|b| b.key() == existing.key())
}

fn crd_status(crd: &Value) -> Value {
    let names = crd
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let time = now();
    json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": time},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": time},
        ],
    })
}

fn validate_name(t: &ResourceType, name: &str) -> Result<(), ApiError> {
    let dns_subdomain = name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    // Names of nodes, events and CRDs may contain dots; a few types (services, namespaces)
    // need a DNS label, which this check approximates for what the tests use.
    let label_only = matches!(t.plural.as_str(), "namespaces" | "services") && name.contains('.');
    if dns_subdomain && !label_only {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "{} \"{name}\" is invalid: metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            t.kind
        )))
    }
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes
        .iter()
        .take(5)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

fn encode_continue(key: &(String, String)) -> String {
    format!("{}\u{0}{}", key.0, key.1)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let invalid = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    if token.len() % 2 != 0 {
        return Err(invalid());
    }
    let bytes: Result<Vec<u8>, _> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
        .collect();
    let text = String::from_utf8(bytes.map_err(|_| invalid())?).map_err(|_| invalid())?;
    let (namespace, name) = text.split_once('\u{0}').ok_or_else(invalid)?;
    Ok((namespace.to_owned(), name.to_owned()))
}

fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |object: &Value| {
        let mut object = object.as_object().cloned().unwrap_or_default();
        for field in ["metadata", "status", "apiVersion", "kind"] {
            object.remove(field);
        }
        object
    };
    strip(old) != strip(new)
}

fn fold_string_data(secret: &mut Value) {
    use base64::Engine as _;
    let Some(string_data) = secret
        .as_object_mut()
        .and_then(|object| object.remove("stringData"))
    else {
        return;
    };
    if let Some(entries) = string_data.as_object() {
        for (key, value) in entries {
            let encoded = base64::engine::general_purpose::STANDARD
                .encode(value.as_str().unwrap_or_default());
            secret["data"][key] = Value::String(encoded);
        }
    }
}

fn default_pod(pod: &mut Value) {
    let spec = pod["spec"]
        .as_object_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    let mut spec: Map<String, Value> = spec;
    for (field, value) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("serviceAccountName", json!("default")),
        ("enableServiceLinks", json!(true)),
        ("priority", json!(0)),
    ] {
        spec.entry(field).or_insert(value);
    }
    // The DefaultTolerationSeconds admission plugin.
    let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
    if let Some(list) = tolerations.as_array_mut() {
        for key in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            if !list
                .iter()
                .any(|t| t.get("key").and_then(Value::as_str) == Some(key))
            {
                list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
    for list in ["containers", "initContainers"] {
        if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for container in containers {
                let image = container
                    .get("image")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let latest = !image.contains(':') || image.ends_with(":latest");
                if let Some(container) = container.as_object_mut() {
                    container
                        .entry("terminationMessagePath")
                        .or_insert(json!("/dev/termination-log"));
                    container
                        .entry("terminationMessagePolicy")
                        .or_insert(json!("File"));
                    container
                        .entry("imagePullPolicy")
                        .or_insert(json!(if latest { "Always" } else { "IfNotPresent" }));
                }
            }
        }
    }
    let bound = spec
        .get("nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    pod["spec"] = Value::Object(spec);
    let mut status = pod
        .get("status")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    status.entry("phase").or_insert(json!("Pending"));
    status.entry("qosClass").or_insert(json!("BestEffort"));
    pod["status"] = Value::Object(status);
    if bound {
        set_condition(pod, "PodScheduled", "True", "");
    }
}

/// Sets a pod condition (adding it when absent).
pub fn set_condition(pod: &mut Value, kind: &str, status: &str, reason: &str) {
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    let conditions = pod["status"]
        .as_object_mut()
        .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    if let Some(Value::Array(list)) = conditions {
        let entry = json!({"type": kind, "status": status, "reason": reason, "lastTransitionTime": now(), "lastProbeTime": null});
        match list
            .iter_mut()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
        {
            Some(existing) => *existing = entry,
            None => list.push(entry),
        }
    }
}

fn pod_grace(pod: &Value, requested: Option<i64>) -> i64 {
    let bound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    if !bound || is_terminal(pod) {
        return 0;
    }
    requested
        .or_else(|| {
            pod.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30)
        .max(0)
}

fn is_terminal(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn desired_healthy(budget: &Value, expected: usize) -> usize {
    let amount = |value: &Value, round_up: bool| -> usize {
        match value {
            Value::Number(n) => usize::try_from(n.as_u64().unwrap_or(0)).unwrap_or(0),
            Value::String(text) => {
                let percent: usize = text.trim_end_matches('%').parse().unwrap_or(0);
                let scaled = expected * percent;
                if round_up {
                    scaled.div_ceil(100)
                } else {
                    scaled / 100
                }
            }
            _ => 0,
        }
    };
    if let Some(min) = budget.pointer("/spec/minAvailable") {
        amount(min, true)
    } else if let Some(max) = budget.pointer("/spec/maxUnavailable") {
        expected.saturating_sub(amount(max, true))
    } else {
        expected
    }
}

fn json_pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |mut pointer, part| {
            pointer.push('/');
            pointer.push_str(part);
            pointer
        })
}

fn set_pointer(object: &mut Value, pointer: &str, value: Value) {
    let mut current = object;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (index, part) in parts.iter().enumerate() {
        if index == parts.len() - 1 {
            current[*part] = value;
            return;
        }
        if !current[*part].is_object() {
            current[*part] = json!({});
        }
        current = &mut current[*part];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdb_arithmetic() {
        assert_eq!(desired_healthy(&json!({"spec": {"minAvailable": 2}}), 3), 2);
        assert_eq!(
            desired_healthy(&json!({"spec": {"minAvailable": "50%"}}), 3),
            2
        );
        assert_eq!(
            desired_healthy(&json!({"spec": {"maxUnavailable": 1}}), 3),
            2
        );
        assert_eq!(
            desired_healthy(&json!({"spec": {"maxUnavailable": "34%"}}), 3),
            1
        );
    }

    #[test]
    fn continue_tokens_round_trip() {
        let key = ("ns".to_owned(), "pod-1".to_owned());
        assert_eq!(decode_continue(&encode_continue(&key)).unwrap(), key);
        assert!(decode_continue("zz").is_err());
    }
}
