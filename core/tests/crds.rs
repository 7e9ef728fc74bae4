//! The CRDs committed under `deploy/` are the ones the core's types generate: the daemon and
//! the manifests cannot disagree about a schema. These tests read and (on request) rewrite the
//! files, which the core's own source never does.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use vne_core::placement::policy;
use vne_core::selector::crd;

/// How to regenerate the files when the types change.
const REGENERATE: &str = "UPDATE_GENERATED=1 cargo test -p vne-core --test crds";

/// The YAML committed at `file` for `crd`, with a header saying where it comes from.
fn generated(source: &str, crd: &serde_json::Value) -> String {
    format!(
        "# Generated from {source} — do not edit.\n# Regenerate: {REGENERATE}\n{}",
        serde_saphyr::to_string(crd).unwrap()
    )
}

/// Compares the committed `file` with `generated`, after rewriting it when asked to.
fn check(file: &str, generated: &str, crd: &serde_json::Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{file} differs from the Rust types; regenerate it with {REGENERATE}"
    );
    let parsed: serde_json::Value = serde_saphyr::from_str(&committed).unwrap();
    assert_eq!(&parsed, crd, "the YAML reads back as the CRD");
}

#[test]
fn the_committed_selector_crd_is_the_generated_one() {
    let crd = crd::crd_json();
    check(
        crd::CRD_FILE,
        &generated("core/src/selector/crd.rs", &crd),
        &crd,
    );
}

#[test]
fn the_committed_resourcepolicy_crd_is_the_generated_one() {
    let crd = policy::crd_json();
    check(
        policy::CRD_FILE,
        &generated("core/src/placement/policy.rs", &crd),
        &crd,
    );
}
