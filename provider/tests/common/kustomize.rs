//! The kubectl built from the same Kubernetes release as the fixture
//! (`integration/upstream/build.sh`), and `kubectl kustomize` of the manifests under `deploy/`.

#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

/// `deploy/` of the source tree.
pub(crate) fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The built kubectl (the build script runs once per test binary: a fraction of a second when
/// its cache is warm, a build of the upstream binaries when it is cold).
pub(crate) fn kubectl() -> PathBuf {
    static KUBECTL: OnceLock<PathBuf> = OnceLock::new();
    KUBECTL
        .get_or_init(|| {
            integration::cluster::upstream::locate_binary_blocking("kubernetes", "kubectl")
                .unwrap_or_else(|e| {
                    panic!("kubectl (integration/upstream/build.sh kubernetes): {e}")
                })
        })
        .clone()
}

/// The objects `kubectl kustomize DIR` renders.
pub(crate) fn kustomize(dir: &Path) -> Vec<Value> {
    let output = std::process::Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kubectl prints UTF-8");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("kubectl prints YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// `kubectl kustomize deploy/overlays/OVERLAY`.
pub(crate) fn overlay(name: &str) -> Vec<Value> {
    kustomize(&deploy_dir().join("overlays").join(name))
}
