//! docs/configuration.md is generated from the daemon's own flag definitions
//! (`virtual_node_eci::config::Config`, the clap parser `virtual-node-eci --help` prints), so
//! it lists every flag and environment variable with its default and meaning. The test fails
//! when the checked-in page and the definitions drift; regenerate with
//! `UPDATE_GENERATED=1 cargo test -p virtual-node-eci --test docs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::path::Path;

use clap::CommandFactory;
use virtual_node_eci::config::Config;

const PAGE: &str = "docs/configuration.md";

const HEADER: &str = "\
# Configuration

<!-- Generated from provider/src/config (the daemon's flag definitions) — do not edit.
     Regenerate: UPDATE_GENERATED=1 cargo test -p virtual-node-eci --test docs -->

Every setting of the daemon is a command-line flag and an environment variable of the same
meaning (the flag wins); `virtual-node-eci --help` prints the same list. The manifests set them
in the `virtual-node-eci-config` ConfigMap and the StatefulSet's `env`; with the Helm chart, the
ECI settings go under `env.*` (ack-virtual-node's names: `ALIYUN_CLUSTERID`, `ECI_REGION`,
`ECI_VSWITCH`, `ECI_SECURITY_GROUP`, …) and anything else under `extraEnv` or `extraArgs`
([install.md](install.md)). A bad value stops the daemon at start with one line naming the
setting.

| environment variable | flag | default | meaning |
| --- | --- | --- | --- |
";

fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The page the definitions give.
fn render() -> String {
    let mut page = HEADER.to_owned();
    let command = Config::command();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let flag = arg
            .get_long()
            .map(|l| format!("`--{l}`"))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = if defaults.is_empty() {
            String::new()
        } else {
            format!("`{}`", defaults.join(","))
        };
        let mut meaning = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| cell(&h.to_string()))
            .unwrap_or_default();
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_owned())
            .collect();
        let boolean = values.iter().any(|v| v == "true");
        if boolean {
            if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
                meaning.push_str(" Off unless set (`true`).");
            }
        } else if !values.is_empty() {
            let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
            let _ = write!(meaning, " One of {}.", values.join(", "));
        }
        if arg.is_hide_set() {
            meaning.push_str(" (Accepted for compatibility; not in `--help`.)");
        }
        let _ = writeln!(page, "| {env} | {flag} | {default} | {meaning} |");
    }
    page
}

#[test]
fn the_configuration_page_is_generated_from_the_flag_definitions() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PAGE);
    let expected = render();
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        std::fs::write(&path, &expected).unwrap();
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{PAGE} is out of date with provider/src/config; regenerate it with \
         UPDATE_GENERATED=1 cargo test -p virtual-node-eci --test docs"
    );
}

#[test]
fn every_flag_has_an_environment_variable_and_a_meaning() {
    let page = render();
    let command = Config::command();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let env = arg
            .get_env()
            .unwrap_or_else(|| panic!("--{id} has an env var"));
        assert!(
            page.contains(&format!("| `{}` |", env.to_string_lossy())),
            "{id} is on the page"
        );
        assert!(
            arg.get_help().is_some() || arg.get_long_help().is_some(),
            "--{id} says what it does"
        );
    }
}
