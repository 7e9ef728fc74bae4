//! Suites written by others, judging our virtual nodes in every CI run (docs/conformance.md):
//! virtual-kubelet's provider e2e suite, all of it, and a fixed subset of Kubernetes'
//! conformance tests (integration/upstream/conformance-ci-subset.txt, from e2e-common.test),
//! each through its runner script (integration/upstream/run-vk-e2e.sh, run-conformance.sh)
//! against a playground of its own, the conformance one in real-runtime mode.
//!
//! What each test ran must be what docs/conformance/<suite>.tsv records: a test recorded as
//! passing passes, one recorded as refused by design does not (if it passes, the record is
//! stale), and no recorded test goes missing. The full runs are the scripts run by hand
//! (docs/conformance.md says how).
//!
//! Needs Go's build of the suites (`integration/upstream/build.sh`, which CI runs first) and,
//! for the conformance subset, what the real runtime needs: root, runc, iproute2 (as
//! playground_real.rs). Without them the test fails saying what is missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// `docs/conformance/<suite>.tsv`: each test's recorded result.
fn record(suite: &str) -> BTreeMap<String, String> {
    let path = repository().join(format!("docs/conformance/{suite}.tsv"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split('\t');
            Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
        })
        .collect()
}

/// A runner's `summary.tsv`: each test it reached, `passed`, `failed` or `skipped` (Go's
/// `pass` and `fail` read as these), by the name the record gives it (the virtual-kubelet
/// suite's without its parent test's).
fn summary(out: &Path) -> BTreeMap<String, String> {
    let path = out.join("summary.tsv");
    std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let name = fields.next()?;
            let name = name.strip_prefix("TestEndToEnd/").unwrap_or(name);
            let result = match fields.next()? {
                "pass" => "passed",
                "fail" => "failed",
                other => other,
            };
            Some((name.to_owned(), result.to_owned()))
        })
        .collect()
}

/// Runs `integration/upstream/<script> OUT -- ARGS` with the workspace's playground, daemon
/// and mock-eci, its output in OUT/runner.log; answers whether it exited 0.
fn run(script: &str, out: &Path, env: &[(&str, &str)], args: &[String]) -> bool {
    let playground = integration::process::binary("integration", "playground").unwrap();
    integration::process::binary("virtual-node-eci", "virtual-node-eci").unwrap();
    integration::process::binary("mock-eci", "mock-eci").unwrap();
    let log = std::fs::File::create(out.join("runner.log")).unwrap();
    let status = Command::new("bash")
        .arg(repository().join("integration/upstream").join(script))
        .arg(out)
        .arg("--")
        .args(args)
        .env("PLAYGROUND", &playground)
        .env("VNE_BIN_DIR", playground.parent().unwrap())
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    status.success()
}

/// Where a run's reports stay when its test fails (the directory is kept), and the runner's
/// log's last lines.
fn kept(out: tempfile::TempDir) -> String {
    let path = out.keep();
    let log = std::fs::read_to_string(path.join("runner.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!(
        "reports kept in {}; the runner's last lines:\n{}",
        path.display(),
        tail.join("\n")
    )
}

/// `text` as a Go regular expression matching it literally (ginkgo's focus is one).
fn literal(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[test]
fn virtual_kubelets_provider_suite_passes_what_the_record_says_passes() {
    let out = tempfile::Builder::new()
        .prefix("vne-vk-e2e-")
        .tempdir()
        .unwrap();
    let exited_zero = run("run-vk-e2e.sh", out.path(), &[], &[]);
    let ran = summary(out.path());
    let recorded = record("virtual-kubelet");
    let mut wrong = Vec::new();
    for (test, result) in &recorded {
        match (result.as_str(), ran.get(test).map(String::as_str)) {
            ("pass", Some("passed")) | ("refused-by-design", Some("failed")) => {}
            (expected, got) => wrong.push(format!("{test}: recorded {expected}, ran {got:?}")),
        }
    }
    for test in ran.keys().filter(|test| !recorded.contains_key(*test)) {
        wrong.push(format!("{test}: ran, not in the record"));
    }
    let refused = recorded.values().filter(|r| *r != "pass").count();
    if !wrong.is_empty() {
        panic!("{}\n{}", wrong.join("\n"), kept(out));
    }
    // The runner exits 0 only when every test passed; the refused ones fail.
    assert_eq!(exited_zero, refused == 0, "{}", kept(out));
}

#[test]
fn kubernetes_conformance_ci_subset_passes() {
    let list = repository().join("integration/upstream/conformance-ci-subset.txt");
    let subset: Vec<String> = std::fs::read_to_string(&list)
        .unwrap()
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let recorded = record("kubernetes");
    for test in &subset {
        assert_eq!(
            recorded.get(test).map(String::as_str),
            Some("pass"),
            "{test}: CI runs only tests recorded as passing"
        );
    }
    // Ginkgo matches a focus against the test's text, which has no `[It] `.
    let focus: Vec<String> = subset
        .iter()
        .map(|test| {
            format!(
                "--ginkgo.focus={}",
                literal(test.trim_start_matches("[It] "))
            )
        })
        .collect();
    let out = tempfile::Builder::new()
        .prefix("vne-conformance-")
        .tempdir()
        .unwrap();
    let exited_zero = run(
        "run-conformance.sh",
        out.path(),
        &[("E2E_SUITE", "common"), ("TIMEOUT", "20m")],
        &focus,
    );
    let ran = summary(out.path());
    let mut wrong: Vec<String> = subset
        .iter()
        .filter(|test| ran.get(*test).map(String::as_str) != Some("passed"))
        .map(|test| format!("{test}: {:?}", ran.get(test)))
        .collect();
    wrong.extend(
        ran.iter()
            .filter(|(test, result)| *result != "skipped" && !subset.contains(test))
            .map(|(test, result)| format!("{test}: {result}, not in the subset")),
    );
    if !wrong.is_empty() || !exited_zero {
        panic!("{}\n{}", wrong.join("\n"), kept(out));
    }
}
