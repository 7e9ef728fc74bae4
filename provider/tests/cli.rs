//! The daemon binary refuses a bad configuration at start: exit code 2 and one log line naming
//! the flag — before it touches Kubernetes or ECI.

use std::process::{Command, Output};

/// Runs the daemon with only `env` set (no KUBECONFIG, no inherited ECI_* variables).
fn run_daemon(env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_virtual-node-eci"));
    command.env_clear().env("PATH", "/usr/bin:/bin");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("the daemon binary runs")
}

/// The non-empty lines the daemon printed, stdout then stderr.
fn lines(output: &Output) -> Vec<String> {
    [&output.stdout, &output.stderr]
        .iter()
        .flat_map(|bytes| {
            String::from_utf8_lossy(bytes)
                .into_owned()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|line| !line.trim().is_empty())
        .collect()
}

#[test]
fn the_openapi_backend_without_a_vswitch_exits_with_one_line_naming_the_flag() {
    let output = run_daemon(&[
        ("NODE_NAME", "virtual-node-eci-0"),
        ("ECI_BACKEND", "openapi"),
        ("ECI_ACCESS_KEY", "id"),
        ("ECI_SECRET_KEY", "not-a-real-secret"),
        ("ECI_SECURITY_GROUP", "sg-1"),
    ]);
    assert_eq!(output.status.code(), Some(2), "{:?}", lines(&output));
    let printed = lines(&output);
    assert_eq!(printed.len(), 1, "one line, got {printed:#?}");
    assert!(
        printed[0].contains("--vswitch (ECI_VSWITCH): not set"),
        "{}",
        printed[0]
    );
    assert!(
        !printed[0].contains("not-a-real-secret"),
        "the secret leaked: {}",
        printed[0]
    );
}

#[test]
fn no_backend_named_means_alibaba_cloud_and_its_credentials_are_asked_for() {
    let output = run_daemon(&[
        ("NODE_NAME", "virtual-node-eci-0"),
        ("ECI_VSWITCH", "vsw-1"),
        ("ECI_SECURITY_GROUP", "sg-1"),
    ]);
    assert_eq!(output.status.code(), Some(2), "{:?}", lines(&output));
    let printed = lines(&output);
    assert_eq!(printed.len(), 1, "one line, got {printed:#?}");
    assert!(
        printed[0].contains("--eci openapi (ECI_BACKEND): no credentials"),
        "{}",
        printed[0]
    );
}

#[test]
fn without_a_cluster_name_the_daemon_exits_with_one_line_naming_the_flag() {
    let output = run_daemon(&[
        ("NODE_NAME", "virtual-node-eci-0"),
        ("ECI_BACKEND", "embedded"),
        ("ECI_VSWITCH", "vsw-1"),
        ("ECI_SECURITY_GROUP", "sg-1"),
    ]);
    assert_eq!(output.status.code(), Some(2), "{:?}", lines(&output));
    let printed = lines(&output);
    assert_eq!(printed.len(), 1, "one line, got {printed:#?}");
    assert!(
        printed[0].contains("--cluster-name (ECI_CLUSTER_NAME, or ALIYUN_CLUSTERID): not set"),
        "{}",
        printed[0]
    );
}

/// The network and cluster name every backend needs, plus an AccessKey.
const NETWORK: &[(&str, &str)] = &[
    ("NODE_NAME", "virtual-node-eci-0"),
    ("ECI_VSWITCH", "vsw-1"),
    ("ECI_SECURITY_GROUP", "sg-1"),
    ("ECI_CLUSTER_NAME", "c"),
    ("ECI_ACCESS_KEY", "id"),
    ("ECI_SECRET_KEY", "not-a-real-secret"),
    ("METRICS_ADDR", "127.0.0.1:0"),
];

fn run_with_network(env: &[(&str, &str)]) -> Output {
    let mut all = NETWORK.to_vec();
    all.extend_from_slice(env);
    run_daemon(&all)
}

#[test]
fn plaintext_eci_endpoints_are_refused_without_the_insecure_flag() {
    for (env, flag) in [
        (
            &[
                ("ECI_BACKEND", "openapi"),
                ("ECI_ENDPOINT", "http://127.0.0.1:9"),
            ][..],
            "--eci-endpoint (ECI_ENDPOINT)",
        ),
        (
            &[
                ("ECI_BACKEND", "openapi"),
                ("ECI_ENDPOINT", "http://127.0.0.1:9"),
                ("ECI_ALLOW_INSECURE_ENDPOINT", "false"),
            ][..],
            "--eci-endpoint (ECI_ENDPOINT)",
        ),
        (
            &[("ECI_BACKEND", "grpc://127.0.0.1:9")][..],
            "--eci (ECI_BACKEND)",
        ),
    ] {
        let output = run_with_network(env);
        let printed = lines(&output);
        assert_eq!(output.status.code(), Some(2), "{env:?}: {printed:?}");
        assert_eq!(printed.len(), 1, "{env:?}: one line, got {printed:#?}");
        assert!(printed[0].contains(flag), "{env:?}: {}", printed[0]);
        assert!(
            printed[0].contains("--eci-allow-insecure-endpoint (ECI_ALLOW_INSECURE_ENDPOINT)"),
            "the fix is named: {}",
            printed[0]
        );
        assert!(
            !printed[0].contains("not-a-real-secret"),
            "the secret leaked: {}",
            printed[0]
        );
    }
}

#[test]
fn with_the_insecure_flag_a_plaintext_endpoint_starts_with_a_warning() {
    for backend in [
        &[
            ("ECI_BACKEND", "openapi"),
            ("ECI_ENDPOINT", "http://127.0.0.1:9"),
        ][..],
        &[("ECI_BACKEND", "grpc://127.0.0.1:9")][..],
    ] {
        let mut env = backend.to_vec();
        env.push(("ECI_ALLOW_INSECURE_ENDPOINT", "true"));
        // Past the configuration check the daemon looks for Kubernetes, which this run has
        // none of: exit code 1, after the warning.
        let output = run_with_network(&env);
        let printed = lines(&output);
        assert_eq!(output.status.code(), Some(1), "{env:?}: {printed:#?}");
        assert!(
            printed.iter().any(|line| line.contains("WARN")
                && line.contains("ECI_ALLOW_INSECURE_ENDPOINT")
                && line.contains("unencrypted")),
            "{env:?}: no warning in {printed:#?}"
        );
        assert!(
            !printed
                .iter()
                .any(|line| line.contains("invalid configuration")),
            "{env:?}: {printed:#?}"
        );
    }
}
