//! One AdmissionReview in, one out: pod CREATEs get the engine's mutation as a JSON patch;
//! pod UPDATEs get back a virtual-node toleration they leave out; everything else is allowed
//! untouched. Answers come from the caches only.

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Toleration};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use vne_core::selector::engine::{
    Decision, Input, PENDING_EFFECT_ANNOTATION, Scope, Vnode, decide,
};

use super::cache::Caches;
use kube::ResourceExt;

/// A request that is not a usable AdmissionReview (answered with 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The body is not an AdmissionReview.
    #[error("malformed AdmissionReview")]
    Malformed(#[source] serde_json::Error),
    /// It has no request.
    #[error("the AdmissionReview carries no request")]
    NoRequest,
}

/// Seals the effect the engine deferred to binding, so the daemon can tell it from one a pod
/// author wrote; without the key (not loaded yet) the effect is dropped rather than left
/// unsealed, which the daemon would refuse anyway.
fn seal_deferred_effect(caches: &Caches, pod: &mut Pod) {
    if !pod.annotations().contains_key(PENDING_EFFECT_ANNOTATION) {
        return;
    }
    match caches.seal() {
        Some(key) => key.seal(pod),
        None => {
            tracing::warn!(
                pod = ?pod.metadata.generate_name.as_ref().or(pod.metadata.name.as_ref()),
                "the Selector seal key is not loaded yet; the Selector's deferred effect is dropped"
            );
            pod.annotations_mut().remove(PENDING_EFFECT_ANNOTATION);
        }
    }
}

/// What the handler does besides answering.
#[derive(Debug, Default, PartialEq)]
pub struct SideEffects {
    /// A warning to publish as an Event on the pod (never for dry runs).
    pub event: Option<(ObjectReference, String)>,
    /// Whether a patch was returned.
    pub patched: bool,
}

/// The admission logic, configured.
#[derive(Debug)]
pub struct Admission {
    /// The caches.
    pub caches: std::sync::Arc<Caches>,
    /// How virtual nodes are marked.
    pub vnode: Vnode,
    /// Which namespaces' pods a Selector reaches.
    pub scope: Scope,
    /// ResourcePolicy placement, when on.
    pub placement: Option<std::sync::Arc<crate::placement::Shared>>,
}

impl Admission {
    /// Reviews a request body; the answer is the AdmissionReview to send back.
    pub fn review(&self, body: &[u8]) -> Result<(serde_json::Value, SideEffects), ReviewError> {
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_slice(body).map_err(ReviewError::Malformed)?;
        let request: AdmissionRequest<DynamicObject> =
            review.try_into().map_err(|_| ReviewError::NoRequest)?;
        let (response, effects) = self.respond(&request);
        Ok((wire(&response.into_review()), effects))
    }

    fn respond(
        &self,
        request: &AdmissionRequest<DynamicObject>,
    ) -> (AdmissionResponse, SideEffects) {
        let allow = AdmissionResponse::from(request);
        if request.kind.group == "scheduling.alibabacloud.com"
            && request.kind.kind == "ResourcePolicy"
            && matches!(request.operation, Operation::Create | Operation::Update)
        {
            return (review_policy(request, allow), SideEffects::default());
        }
        let is_pod = request.kind.group.is_empty()
            && request.kind.kind == "Pod"
            && request.sub_resource.is_none();
        if is_pod && request.operation == Operation::Update {
            let (response, patched) = self.review_pod_update(request, allow);
            let effects = SideEffects {
                patched,
                ..SideEffects::default()
            };
            return (response, effects);
        }
        if !is_pod || request.operation != Operation::Create {
            return (allow, SideEffects::default());
        }
        let Some((pod, namespace)) = submitted_pod(request) else {
            return (allow, SideEffects::default());
        };
        self.review_pod(request, allow, &pod, namespace)
    }

    /// A pod create: the Selector engine's decision, then ResourcePolicy placement, answered
    /// as a patch with its warning.
    fn review_pod(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        allow: AdmissionResponse,
        pod: &Pod,
        namespace: String,
    ) -> (AdmissionResponse, SideEffects) {
        let snapshot = self.caches.snapshot();
        let namespace_labels = self.caches.namespace_labels(&namespace);
        let mut decision = decide(Input {
            pod,
            namespace_labels: &namespace_labels,
            selectors: &snapshot.selectors,
            profile: &snapshot.profile,
            capacity: &snapshot.capacity,
            vnode: &self.vnode,
            scope: &self.scope,
        });
        let placed = self.place_by_policy(&mut decision.pod, request.dry_run);
        seal_deferred_effect(&self.caches, &mut decision.pod);
        let mut effects = SideEffects::default();
        let mut response = allow;
        if let Some(warning) = &decision.warning {
            response.warnings = Some(vec![warning.clone()]);
            if !request.dry_run {
                effects.event = warning_event(pod, namespace, warning);
            }
        }
        let (response, patched) = with_mutation(response, pod, decision, placed);
        effects.patched = patched;
        (response, effects)
    }

    /// A pod update that leaves out a virtual-node toleration the pod has (a client that
    /// replaces the list, as `kubectl apply` and `replace` do): the toleration is put back, as
    /// the DefaultTolerationSeconds admission plugin puts back its own. The API server refuses
    /// an update that removes a toleration, so without this such an update could never pass;
    /// nothing is added that the pod did not have.
    fn review_pod_update(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        allow: AdmissionResponse,
    ) -> (AdmissionResponse, bool) {
        let (Some((pod, _)), Some(old)) = (submitted_pod(request), old_pod(request)) else {
            return (allow, false);
        };
        let missing = dropped_tolerations(&old, &pod, &self.vnode.taint_key);
        if missing.is_empty() {
            return (allow, false);
        }
        let mut restored = pod.clone();
        if let Some(spec) = restored.spec.as_mut() {
            spec.tolerations
                .get_or_insert_with(Vec::new)
                .extend(missing);
        }
        let (Ok(typed), Ok(mutated)) =
            (serde_json::to_value(&pod), serde_json::to_value(&restored))
        else {
            return (allow, false);
        };
        let patch = json_patch::diff(&typed, &mutated);
        match allow.clone().with_patch(patch) {
            Ok(patched) => (patched, true),
            Err(_) => (allow, false),
        }
    }

    /// ResourcePolicy placement, when on and synced: may move the pod into a unit; the note
    /// for the audit annotation when it did.
    fn place_by_policy(&self, pod: &mut Pod, dry_run: bool) -> Option<String> {
        let placement = self.placement.as_ref().filter(|p| p.is_synced())?;
        let enforcement = placement.enforcement.borrow().clone();
        let admitted = crate::placement::admit::admit(
            &placement.index,
            pod.clone(),
            &enforcement,
            dry_run,
            std::time::SystemTime::now(),
        )?;
        *pod = admitted.pod;
        Some(format!(
            "ResourcePolicy {}: {}",
            admitted.policy, admitted.note
        ))
    }
}

/// The pod being created, with the request's namespace; `None` when the body is no pod.
fn submitted_pod(request: &AdmissionRequest<DynamicObject>) -> Option<(Pod, String)> {
    let object = request.object.as_ref()?;
    let mut original = serde_json::to_value(object).ok()?;
    let namespace = request.namespace.clone().unwrap_or_default();
    // The pod's namespace may be unset in the body; the request names it.
    original["metadata"]["namespace"] = namespace.clone().into();
    // Not a pod the API server would accept either (it says why): `None`.
    let pod = serde_json::from_value::<Pod>(original).ok()?;
    Some((pod, namespace))
}

/// The pod as it was before an update; `None` when the request carries none.
fn old_pod(request: &AdmissionRequest<DynamicObject>) -> Option<Pod> {
    let object = request.old_object.as_ref()?;
    serde_json::from_value(serde_json::to_value(object).ok()?).ok()
}

/// The tolerations of `taint_key` that `old` has and `new` leaves out (pure).
fn dropped_tolerations(old: &Pod, new: &Pod, taint_key: &str) -> Vec<Toleration> {
    let tolerations = |pod: &Pod| {
        pod.spec
            .as_ref()
            .and_then(|spec| spec.tolerations.clone())
            .unwrap_or_default()
    };
    let kept = tolerations(new);
    tolerations(old)
        .into_iter()
        .filter(|t| t.key.as_deref() == Some(taint_key) && !kept.contains(t))
        .collect()
}

/// The Event a decision's warning becomes on the pod; none while the pod has no name yet
/// (generateName: nothing to point the Event at).
fn warning_event(pod: &Pod, namespace: String, warning: &str) -> Option<(ObjectReference, String)> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    (!name.is_empty()).then(|| {
        (
            ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(namespace),
                name: Some(name),
                ..ObjectReference::default()
            },
            warning.to_owned(),
        )
    })
}

/// `response` with the JSON patch from `pod` to the decided pod and why in its audit
/// annotations; true when it carries a patch (false: nothing to change).
fn with_mutation(
    mut response: AdmissionResponse,
    pod: &Pod,
    decision: Decision,
    placed: Option<String>,
) -> (AdmissionResponse, bool) {
    if decision.pod == *pod {
        return (response, false);
    }
    let Ok(mutated) = serde_json::to_value(&decision.pod) else {
        return (response, false);
    };
    // Diff against the pod as typed, so fields the typed form drops are not touched.
    let Ok(typed) = serde_json::to_value(pod) else {
        return (response, false);
    };
    let patch = json_patch::diff(&typed, &mutated);
    if patch.0.is_empty() {
        return (response, false);
    }
    response.audit_annotations.insert(
        "virtual-node-eci.aliyun.com/selector".into(),
        decision.reason,
    );
    if let Some(placed) = placed {
        response
            .audit_annotations
            .insert("virtual-node-eci.aliyun.com/placement".into(), placed);
    }
    match response.clone().with_patch(patch) {
        Ok(patched) => (patched, true),
        Err(_) => (response, false),
    }
}

/// A ResourcePolicy create or update: refused, naming each field and why, when the schema let
/// through what cannot work.
fn review_policy(
    request: &AdmissionRequest<DynamicObject>,
    allow: AdmissionResponse,
) -> AdmissionResponse {
    let Some(object) = &request.object else {
        return allow;
    };
    let spec = serde_json::to_value(object)
        .ok()
        .and_then(|v| v.get("spec").cloned())
        .unwrap_or_default();
    let problems =
        match serde_json::from_value::<vne_core::placement::policy::ResourcePolicySpec>(spec) {
            Ok(spec) => vne_core::placement::policy::validate(&spec),
            // The schema refuses malformed specs with its own words.
            Err(_) => return allow,
        };
    if problems.is_empty() {
        return allow;
    }
    let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
    allow.deny(format!(
        "ResourcePolicy {}: {}",
        request.name,
        problems.join("; ")
    ))
}

/// The review as sent: the patch as the base64 string webhooks conventionally send (kube
/// serializes the bytes as a JSON array of numbers, which API servers also accept).
fn wire(review: &AdmissionReview<DynamicObject>) -> serde_json::Value {
    use base64::Engine as _;
    let mut value = serde_json::to_value(review).unwrap_or_default();
    if let Some(patch) = value.pointer_mut("/response/patch") {
        if let Some(bytes) = patch.as_array() {
            let raw: Vec<u8> = bytes
                .iter()
                .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect();
            *patch = base64::engine::general_purpose::STANDARD.encode(raw).into();
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use base64::Engine as _;
    use serde_json::{Value, json};

    use super::*;
    use vne_core::selector::engine::default_rules;

    fn admission() -> Admission {
        Admission {
            caches: Arc::new(Caches::new(true)),
            vnode: Vnode::default(),
            scope: Scope::Namespaced {
                home: "kube-system".into(),
            },
            placement: None,
        }
    }

    #[allow(clippy::needless_pass_by_value)] // json! borrows
    fn review(kind: &str, operation: &str, object: Value, dry_run: bool) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "req-1",
                "kind": {"group": "", "version": "v1", "kind": kind},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": kind},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "name": "web",
                "namespace": "default",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": object,
                "dryRun": dry_run,
            }
        }))
        .unwrap()
    }

    #[allow(clippy::needless_pass_by_value)] // json! borrows
    fn pod(labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": labels}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
    }

    fn response(review: &Value) -> Value {
        review["response"].clone()
    }

    #[test]
    fn a_pod_update_leaving_out_its_virtual_node_toleration_gets_it_back() {
        let ours = json!({"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"});
        let theirs =
            json!({"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule"});
        let with = |tolerations: Value| {
            let mut pod = pod(json!({}));
            pod["spec"]["tolerations"] = tolerations;
            pod
        };
        // The pod's tolerations after the update, as the API server stores them.
        let updated = |old: Value, new: Value| {
            let mut body: Value =
                serde_json::from_slice(&review("Pod", "UPDATE", new.clone(), false)).unwrap();
            body["request"]["oldObject"] = old;
            let (out, effects) = admission()
                .review(&serde_json::to_vec(&body).unwrap())
                .unwrap();
            let answer = response(&out);
            assert_eq!(answer["allowed"], true);
            assert_eq!(effects.patched, !answer["patch"].is_null(), "{answer}");
            let mut stored = new;
            if let Some(patch) = answer["patch"].as_str() {
                let patch: json_patch::Patch = serde_json::from_slice(
                    &base64::engine::general_purpose::STANDARD
                        .decode(patch)
                        .unwrap(),
                )
                .unwrap();
                json_patch::patch(&mut stored, &patch).unwrap();
            }
            stored["spec"]["tolerations"].clone()
        };
        // (before, as sent) → as stored
        let table = [
            // A client replaced the list (kubectl apply, replace): ours comes back after theirs.
            (json!([ours]), json!([theirs]), json!([theirs, ours])),
            (json!([ours]), Value::Null, json!([ours])),
            // Kept: nothing to do.
            (
                json!([ours, theirs]),
                json!([ours, theirs]),
                json!([ours, theirs]),
            ),
            // Never added to a pod that did not have it.
            (json!([theirs]), json!([]), json!([])),
            (Value::Null, json!([theirs]), json!([theirs])),
        ];
        for (before, sent, stored) in table {
            let (old, new) = (with(before.clone()), with(sent.clone()));
            assert_eq!(updated(old, new), stored, "{before} then {sent}");
        }
    }

    #[test]
    fn a_matching_pod_gets_a_patch_with_toleration_and_node_selector() {
        let (out, effects) = admission()
            .review(&review(
                "Pod",
                "CREATE",
                pod(json!({"alibabacloud.com/eci": "true"})),
                false,
            ))
            .unwrap();
        let answer = response(&out);
        assert_eq!(answer["uid"], "req-1");
        assert_eq!(answer["allowed"], true);
        assert_eq!(answer["patchType"], "JSONPatch");
        let patch: Value = serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(answer["patch"].as_str().unwrap())
                .unwrap(),
        )
        .unwrap();
        let text = patch.to_string();
        assert!(text.contains("/spec/tolerations"), "{text}");
        assert!(
            text.contains(r#"/spec/nodeSelector","value":{"k8s.aliyun.com/vnode":"true"}"#),
            "{text}"
        );
        assert!(
            !text.contains("/metadata/namespace"),
            "the namespace is not patched: {text}"
        );
        assert!(effects.patched);
    }

    #[test]
    fn nothing_to_do_means_no_patch() {
        let (out, effects) = admission()
            .review(&review("Pod", "CREATE", pod(json!({"app": "web"})), false))
            .unwrap();
        let answer = response(&out);
        assert_eq!(answer["allowed"], true);
        assert!(answer.get("patch").is_none_or(Value::is_null));
        assert!(!effects.patched);
    }

    #[test]
    fn other_kinds_operations_and_subresources_pass_untouched() {
        let a = admission();
        for body in [
            review(
                "Pod",
                "UPDATE",
                pod(json!({"alibabacloud.com/eci": "true"})),
                false,
            ),
            review(
                "ConfigMap",
                "CREATE",
                json!({"metadata": {"name": "x", "labels": {"alibabacloud.com/eci": "true"}}}),
                false,
            ),
        ] {
            let (out, effects) = a.review(&body).unwrap();
            assert!(response(&out).get("patch").is_none_or(Value::is_null));
            assert!(!effects.patched);
        }
    }

    #[test]
    fn malformed_requests_are_refused_with_a_reason() {
        let a = admission();
        assert!(matches!(
            a.review(b"not json"),
            Err(ReviewError::Malformed(_))
        ));
        let no_request = serde_json::to_vec(
            &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
        )
        .unwrap();
        assert!(a.review(&no_request).is_err());
    }

    #[test]
    fn a_budget_warning_becomes_an_event_except_in_dry_runs() {
        let a = admission();
        let selector: vne_core::selector::crd::Selector = serde_json::from_value(json!({
            "apiVersion": "eci.aliyun.com/v1", "kind": "Selector",
            "metadata": {"name": "cap", "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"objectLabels": {}, "policy": {"namespaceResourceLimit": {"namespace": "default", "limits": {"cpu": "0"}}}},
        }))
        .unwrap();
        let mut rules = vec![vne_core::selector::engine::rule_from_selector(&selector).unwrap()];
        rules.extend(default_rules().into_iter().take(0));
        a.caches.set_selectors(rules);
        let mut with_request = pod(json!({}));
        with_request["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}});
        let (out, effects) = a
            .review(&review("Pod", "CREATE", with_request.clone(), false))
            .unwrap();
        assert!(
            response(&out)["warnings"][0]
                .as_str()
                .unwrap()
                .contains("stays on normal nodes")
        );
        assert!(effects.event.is_some());
        let (_, dry) = a
            .review(&review("Pod", "CREATE", with_request, true))
            .unwrap();
        assert!(dry.event.is_none(), "dry runs have no side effects");
    }

    fn patched_pod(out: &Value, object: &Value) -> Pod {
        let patch: json_patch::Patch = serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(response(out)["patch"].as_str().unwrap())
                .unwrap(),
        )
        .unwrap();
        let mut object = object.clone();
        object["metadata"]["namespace"] = json!("default");
        json_patch::patch(&mut object, &patch).unwrap();
        serde_json::from_value(object).unwrap()
    }

    #[test]
    fn a_deferred_effect_leaves_admission_sealed_and_without_a_key_not_at_all() {
        use crate::admission::seal::{Checked, SealKey};
        let a = admission();
        let selector: vne_core::selector::crd::Selector = serde_json::from_value(json!({
            "apiVersion": "eci.aliyun.com/v1", "kind": "Selector",
            "metadata": {"name": "fair", "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"objectLabels": {}, "policy": {"fair": {}}, "effect": {"labels": {"eci": "true"}}},
        }))
        .unwrap();
        a.caches.set_selectors(vec![
            vne_core::selector::engine::rule_from_selector(&selector).unwrap(),
        ]);
        let object = pod(json!({}));
        let (out, _) = a
            .review(&review("Pod", "CREATE", object.clone(), false))
            .unwrap();
        let unsealed = patched_pod(&out, &object);
        assert!(
            !unsealed
                .annotations()
                .contains_key(PENDING_EFFECT_ANNOTATION),
            "no key loaded: no effect deferred"
        );
        let key = Arc::new(SealKey::new(&[3; 32]));
        a.caches.set_seal(Arc::clone(&key));
        let (out, _) = a
            .review(&review("Pod", "CREATE", object.clone(), false))
            .unwrap();
        let sealed = patched_pod(&out, &object);
        assert!(
            matches!(key.check(&sealed), Checked::Sealed(_)),
            "{:?}",
            key.check(&sealed)
        );
    }

    #[test]
    fn a_malformed_review_says_where_once() {
        let error =
            ReviewError::Malformed(serde_json::from_slice::<serde_json::Value>(b"{").unwrap_err());
        assert!(crate::ops::chain::says_each_part_once(&error));
        assert!(
            crate::ops::chain::Chain(&error)
                .to_string()
                .starts_with("malformed AdmissionReview: EOF")
        );
    }

    #[allow(clippy::needless_pass_by_value)] // json! borrows
    fn policy_review(operation: &str, spec: Value) -> Vec<u8> {
        let kind = json!({"group": "scheduling.alibabacloud.com", "version": "v1alpha1", "kind": "ResourcePolicy"});
        let resource = json!({"group": "scheduling.alibabacloud.com", "version": "v1alpha1", "resource": "resourcepolicies"});
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "req-2", "kind": kind, "resource": resource,
                "requestKind": kind, "requestResource": resource,
                "name": "nginx", "namespace": "default", "operation": operation,
                "userInfo": {"username": "alice"},
                "object": {"apiVersion": "scheduling.alibabacloud.com/v1alpha1", "kind": "ResourcePolicy",
                           "metadata": {"name": "nginx", "namespace": "default"}, "spec": spec},
            }
        }))
        .unwrap()
    }

    #[test]
    fn resource_policies_the_schema_let_through_are_refused_naming_the_field() {
        let (out, _) = admission()
            .review(&policy_review(
                "CREATE",
                json!({"units": [{"resource": "ecs", "maxResources": {"cpu": "lots"}}, {"resource": "eci"}]}),
            ))
            .unwrap();
        let answer = response(&out);
        assert_eq!(answer["allowed"], false);
        let message = answer["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("ResourcePolicy nginx: spec.units[0].maxResources.cpu: "),
            "{message}"
        );
        let (out, _) = admission()
            .review(&policy_review(
                "UPDATE",
                json!({"units": [{"resource": "ecs", "maxResources": {"cpu": "4"}}, {"resource": "eci"}]}),
            ))
            .unwrap();
        assert_eq!(response(&out)["allowed"], true);
    }
}
