//! An AdmissionReview body as the webhook receives it, reviewed with the default caches (the
//! built-in selectors): `Admission::review`. Malformed bodies are errors, never panics; every
//! answer is an allowed-or-denied AdmissionReview for the request's uid, and a patch, when
//! there is one, applies to the object as the API server holds it.

#![no_main]

use std::sync::{Arc, LazyLock};

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use virtual_node_eci::admission::cache::Caches;
use virtual_node_eci::admission::review::Admission;
use vne_core::selector::engine::{Scope, Vnode};

static ADMISSION: LazyLock<Admission> = LazyLock::new(|| Admission {
    caches: Arc::new(Caches::new(true)),
    vnode: Vnode::default(),
    scope: Scope::Namespaced {
        home: "kube-system".into(),
    },
    placement: None,
});

fuzz_target!(|body: &[u8]| {
    let Ok((answer, outcome)) = ADMISSION.review(body) else {
        return;
    };
    // serde skips members it ignores without checking their UTF-8: a body kube reads may still
    // not be JSON text (the API server never sends such a body).
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let request = &request["request"];
    let response = &answer["response"];
    assert_eq!(
        response["uid"], request["uid"],
        "the answer names the request"
    );
    assert!(response["allowed"].is_boolean(), "{answer}");
    let Some(patch) = response.get("patch").filter(|p| !p.is_null()) else {
        assert!(!outcome.patched);
        return;
    };
    assert!(outcome.patched);
    assert_eq!(response["patchType"], "JSONPatch");
    use base64::Engine as _;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().expect("the patch is base64 text"))
        .expect("the patch is base64");
    let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("the patch is JSON Patch");
    // The API server applies the patch to the object it holds, namespace set.
    let mut object = request["object"].clone();
    if let Some(namespace) = request.get("namespace").filter(|n| n.is_string()) {
        object["metadata"]["namespace"] = namespace.clone();
    }
    json_patch::patch(&mut object, &patch)
        .unwrap_or_else(|error| panic!("the patch does not apply to the object: {error}"));
});
