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

/// docs/conformance.md's result tables are generated from the suites' records,
/// docs/conformance/<suite>.tsv (`test`, `result`, `seconds`, `reason`), which
/// `integration/upstream/conformance-merge.py` updates from a run's `summary.tsv`.
mod conformance {
    use std::fmt::Write as _;
    use std::path::{Path, PathBuf};

    const PAGE: &str = "docs/conformance.md";
    const SUITES: [&str; 2] = ["virtual-kubelet", "kubernetes"];
    const RESULTS: [&str; 3] = ["pass", "fail", "refused-by-design"];

    struct Row {
        test: String,
        result: String,
        seconds: String,
        reason: String,
    }

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn record(suite: &str) -> Vec<Row> {
        let path = root().join(format!("docs/conformance/{suite}.tsv"));
        let text = std::fs::read_to_string(&path).unwrap();
        text.lines()
            .skip(1)
            .filter(|line| !line.is_empty())
            .map(|line| {
                let cells: Vec<&str> = line.split('\t').collect();
                assert_eq!(cells.len(), 4, "{}: four cells in {line:?}", path.display());
                Row {
                    test: cells[0].to_owned(),
                    result: cells[1].to_owned(),
                    seconds: cells[2].to_owned(),
                    reason: cells[3].to_owned(),
                }
            })
            .collect()
    }

    fn begin(suite: &str) -> String {
        format!(
            "<!-- BEGIN {suite}: generated from docs/conformance/{suite}.tsv, do not edit; \
             UPDATE_GENERATED=1 cargo test -p virtual-node-eci --test docs -->"
        )
    }

    fn end(suite: &str) -> String {
        format!("<!-- END {suite} -->")
    }

    /// The counts line and the table of `rows`.
    fn table(suite: &str, rows: &[Row]) -> String {
        let counts: Vec<String> = RESULTS
            .iter()
            .map(|result| (result, rows.iter().filter(|r| r.result == *result).count()))
            .filter(|(_, count)| *count > 0)
            .map(|(result, count)| format!("{count} {result}"))
            .collect();
        let timed = rows.iter().any(|r| !r.seconds.is_empty());
        let mut text = format!(
            "{}\n\n**{} tests recorded: {}.**\n\n",
            begin(suite),
            rows.len(),
            counts.join(", ")
        );
        text.push_str(if timed {
            "| test | result | seconds | reason |\n| --- | --- | --- | --- |\n"
        } else {
            "| test | result | reason |\n| --- | --- | --- |\n"
        });
        for row in rows {
            let test = if row.test.contains(' ') {
                super::cell(&row.test)
            } else {
                format!("`{}`", row.test)
            };
            let seconds = if timed {
                format!(" {} |", row.seconds)
            } else {
                String::new()
            };
            let _ = writeln!(
                text,
                "| {test} | {} |{seconds} {} |",
                row.result,
                super::cell(&row.reason)
            );
        }
        text.push('\n');
        text.push_str(&end(suite));
        text
    }

    /// The page with each suite's block replaced by what its record gives.
    fn render(page: &str) -> String {
        let mut page = page.to_owned();
        for suite in SUITES {
            let (begin, end) = (begin(suite), end(suite));
            let start = page
                .find(&begin)
                .unwrap_or_else(|| panic!("{PAGE} has {begin}"));
            let stop = page[start..]
                .find(&end)
                .unwrap_or_else(|| panic!("{PAGE} has {end}"))
                + start
                + end.len();
            page.replace_range(start..stop, &table(suite, &record(suite)));
        }
        page
    }

    #[test]
    fn the_conformance_tables_are_generated_from_the_suites_records() {
        let path = root().join(PAGE);
        let actual = std::fs::read_to_string(&path).unwrap();
        let expected = render(&actual);
        if std::env::var_os("UPDATE_GENERATED").is_some() {
            std::fs::write(&path, &expected).unwrap();
        }
        assert!(
            actual == expected,
            "{PAGE} is out of date with docs/conformance/*.tsv; regenerate it with \
             UPDATE_GENERATED=1 cargo test -p virtual-node-eci --test docs"
        );
    }

    /// Every result is one of three, and every one that is not a pass says why.
    #[test]
    fn every_recorded_result_that_is_not_a_pass_has_a_reason() {
        for suite in SUITES {
            let rows = record(suite);
            let mut tests: Vec<&str> = rows.iter().map(|r| r.test.as_str()).collect();
            tests.sort_unstable();
            tests.dedup();
            assert_eq!(tests.len(), rows.len(), "{suite}: a test recorded twice");
            for row in &rows {
                assert!(
                    RESULTS.contains(&row.result.as_str()),
                    "{suite}: {:?} of {}",
                    row.result,
                    row.test
                );
                assert!(
                    row.result == "pass" || !row.reason.trim().is_empty(),
                    "{suite}: {} is {} without a reason",
                    row.test,
                    row.result
                );
            }
        }
    }
}
