//! The official ECI SDK for Python (PyPI `alibabacloud-eci20180808`, pinned in
//! `proto/sdk/requirements.txt`) drives mock-eci's OpenAPI front through every action the
//! product uses: `tests/sdk/conformance.py` creates a rich group, reads it back and compares
//! value for value, pages, polls status, updates, restarts, reads logs, execs, reads metrics,
//! deletes, builds image caches (create, describe with its filters, update, delete, and groups
//! created from one), and makes the bad calls the service refuses. Every answer's raw JSON is also held
//! to `proto/sdk/names.tsv`. `.ci/run` installs the SDK; without it this test fails and says
//! how to install it. Integration's `real_runtime` tests (they need root, runc and a registry)
//! run this same driver against a real-runtime mock-eci, and `tests/sdk/real.py` beside it.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use clap::Parser;
use mock_eci::{MockConfig, MockServer};

const ACCESS_KEY_ID: &str = "sdk-conformance-id";
const ACCESS_KEY_SECRET: &str = "sdk-conformance-secret";

fn python_has_the_sdk() -> bool {
    Command::new("python3")
        .args([
            "-c",
            "import alibabacloud_eci20180808.client, alibabacloud_tea_openapi",
        ])
        .status()
        .is_ok_and(|status| status.success())
}

#[tokio::test]
async fn the_official_sdk_drives_every_action_the_product_uses() {
    assert!(
        python_has_the_sdk(),
        "python3 with the official ECI SDK is needed for this test: \
         `python3 -m pip install -r proto/sdk/requirements.txt` (the CI script .ci/run installs it)"
    );
    let server = MockServer::start(MockConfig::parse_from([
        "mock-eci",
        "--listen",
        "127.0.0.1:0",
        "--openapi-listen",
        "127.0.0.1:0",
        "--openapi-access-key-id",
        ACCESS_KEY_ID,
        "--openapi-access-key-secret",
        ACCESS_KEY_SECRET,
        "--provisioning-delay",
        "300ms",
        "--image-cache-creation-delay",
        "500ms",
        "--no-rate-limits",
    ]))
    .await
    .unwrap();
    let front = server.openapi().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, front.ca_pem()).unwrap();
    let endpoint = front.addr().to_string();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let driver = root.join("tests/sdk/conformance.py");
    let names = root.join("../proto/sdk/names.tsv");
    let run = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(driver)
            .args(["--endpoint", &endpoint])
            .arg("--ca")
            .arg(&ca)
            .args(["--access-key-id", ACCESS_KEY_ID])
            .args(["--access-key-secret", ACCESS_KEY_SECRET])
            .arg("--names")
            .arg(names)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    server.stop().await.unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}");
    assert!(
        run.status.success(),
        "the official SDK does not get through mock-eci's OpenAPI front as it would through the \
         service; the FAIL rows say where:\n{stdout}\n{stderr}"
    );
}
