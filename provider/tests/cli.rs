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
