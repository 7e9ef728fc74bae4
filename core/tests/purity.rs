//! The core stays pure and at the bottom of the workspace (the crate's doc says why): it
//! depends on no crate of the workspace but `eci-proto`, and its source names no I/O, runtime
//! or clock.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// The workspace crates the core may depend on, and why. `eci-proto` holds ECI's wire types,
/// which the translation to and from ECI speaks; it is a leaf (it depends on no crate of the
/// workspace) and does no I/O of its own (its generated clients are the daemon's to call).
const BELOW_THE_CORE: &[&str] = &["eci-proto"];

/// The workspace crates the core's own tests may use, and why. `mock-eci`'s request
/// validation is ECI's rules as the fake enforces them: the translation's tests check that ECI
/// would accept every request they build. Nothing of it reaches the core's library.
const IN_THE_CORE_TESTS: &[&str] = &["mock-eci"];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of each `[section]` of a manifest, by section name (`""` before the first).
fn sections(manifest: &str) -> Vec<(&str, Vec<&str>)> {
    let mut out = vec![("", Vec::new())];
    for line in manifest.lines() {
        if let Some(name) = line
            .trim()
            .strip_prefix('[')
            .and_then(|l| l.strip_suffix(']'))
        {
            out.push((name, Vec::new()));
        } else if let Some((_, lines)) = out.last_mut() {
            lines.push(line);
        }
    }
    out
}

/// Whether manifest lines name the crate `member` (`member.workspace = true`, `member = …`).
fn names(lines: &[&str], member: &str) -> bool {
    lines.iter().any(|line| {
        line.starts_with(&format!("{member}.")) || line.starts_with(&format!("{member} "))
    })
}

#[test]
fn no_workspace_crate_below_the_core() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let workspace = std::fs::read_to_string(root.join("../Cargo.toml")).unwrap();
    // Every member of the workspace (its `members` list), by package name, with its manifest.
    let list = workspace
        .lines()
        .find_map(|line| line.strip_prefix("members = "))
        .unwrap();
    let crates: Vec<(String, String)> = list
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|path| {
            let manifest =
                std::fs::read_to_string(root.join("..").join(path).join("Cargo.toml")).unwrap();
            let name = manifest
                .lines()
                .find_map(|line| line.strip_prefix("name = "))
                .unwrap()
                .trim_matches('"')
                .to_owned();
            (name, manifest)
        })
        .filter(|(name, _)| name != "vne-core")
        .collect();
    let members: Vec<&str> = crates.iter().map(|(name, _)| name.as_str()).collect();
    assert!(
        members.contains(&"eci-proto") && members.contains(&"integration"),
        "read the workspace's crates: {members:?}"
    );
    let sections = sections(&manifest);
    assert!(
        sections
            .iter()
            .any(|(name, lines)| *name == "dependencies" && names(lines, "k8s-openapi")),
        "read the core's manifest: {sections:?}"
    );
    for (section, lines) in &sections {
        let allowed = match *section {
            "dependencies" => BELOW_THE_CORE,
            "dev-dependencies" => IN_THE_CORE_TESTS,
            _ => &[],
        };
        for member in members.iter().filter(|m| !allowed.contains(m)) {
            assert!(
                !names(lines, member),
                "vne-core names {member} in [{section}]"
            );
        }
    }
    // What is allowed below stays a leaf: it brings no other crate of the workspace along.
    for (allowed, below) in crates
        .iter()
        .filter(|(name, _)| BELOW_THE_CORE.contains(&name.as_str()))
    {
        let lines: Vec<&str> = below.lines().collect();
        for member in members.iter().chain([&"vne-core"]) {
            assert!(!names(&lines, member), "{allowed} depends on {member}");
        }
    }
}

#[test]
fn the_source_does_no_io() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 3, "found the sources: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for word in [
            "std::fs",
            "std::net",
            "std::process",
            "std::env",
            "tokio",
            "SystemTime::now",
            "Instant::now",
        ] {
            assert!(!text.contains(word), "{} names {word}", file.display());
        }
    }
}
