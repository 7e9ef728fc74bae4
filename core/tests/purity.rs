//! The core stays pure and at the bottom of the workspace (the crate's doc says why): it
//! depends on no crate of the workspace, and its source names no I/O, runtime or clock.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

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

#[test]
fn no_workspace_crate_below_the_core() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let workspace = std::fs::read_to_string(root.join("../Cargo.toml")).unwrap();
    let members: Vec<&str> = workspace
        .lines()
        .filter_map(|line| line.split_once(" = { path = "))
        .map(|(name, _)| name.trim())
        .filter(|name| *name != "vne-core")
        .collect();
    assert!(
        members.contains(&"eci-proto"),
        "read the workspace's crates: {members:?}"
    );
    for member in members {
        assert!(
            !manifest
                .lines()
                .any(|line| line.starts_with(&format!("{member}."))
                    || line.starts_with(&format!("{member} "))),
            "vne-core depends on {member}"
        );
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
