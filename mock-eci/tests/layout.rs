//! The folder map of `mock-eci/src` is its flow, so it is checked: fronts → service → engine,
//! with the shared leaves under all three, and nothing calling back up. The image store (for the
//! real runtime) does I/O, so the pure engine may not name it; the service and fronts may.
//!
//! Read from the source (every `crate::<module>` path, including `crate::{a, b}` groups), the
//! way provider/tests/architecture.rs reads the provider.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What listens: it may use everything below it.
const FRONTS: &str = "fronts";
/// The shared `MockEci` handle: locking, controls, telemetry, the state file.
const SERVICE: &str = "service";
/// The pure state machine.
const ENGINE: &str = "engine";
/// The image store: pulls and unpacks images (network and disk), below the service, beside the
/// engine; it uses the leaves at most.
const IMAGES: &str = "images";
/// The real runtime's edge (namespaces, bridge, OCI runtime): leaves only; the service and the
/// fronts may drive it.
const SANDBOX: &str = "sandbox";
/// Shared leaves: they use each other at most.
const LEAVES: &[&str] = &["actions", "clock", "rng", "settings"];

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("readable dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn leading_ident(text: &str) -> String {
    text.trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Every top-level module named as `crate::<name>` or inside `crate::{…}` in `text`.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        // `mock_eci::…` and the like are not crate paths; only a bare `crate::`.
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !preceded_by_ident {
            if let Some(group) = after.strip_prefix('{') {
                let inner = &group[..group.find('}').unwrap_or(group.len())];
                found.extend(inner.split(',').map(leading_ident));
            } else {
                found.insert(leading_ident(after));
            }
        }
        rest = after;
    }
    found.remove("");
    found
}

/// Top-level module (`engine`, `service`, `clock`, …) → the other top-level modules it names.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = source_dir();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("mock-eci/src") {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .expect("utf-8 file name")
            .to_owned();
        if name == "lib" || name == "main" {
            continue;
        }
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        } else {
            continue;
        }
        let mut uses = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable source");
            uses.extend(crate_paths(&text).into_iter().filter(|n| *n != name));
        }
        graph.insert(name, uses);
    }
    graph
}

/// What each top-level module may name.
fn allowed(module: &str) -> BTreeSet<&'static str> {
    let mut allowed: BTreeSet<&str> = LEAVES.iter().copied().collect();
    match module {
        FRONTS => {
            allowed.insert(SERVICE);
            allowed.insert(ENGINE);
            allowed.insert(IMAGES);
            allowed.insert(SANDBOX);
        }
        SERVICE => {
            allowed.insert(ENGINE);
            allowed.insert(IMAGES);
            allowed.insert(SANDBOX);
        }
        _ => {}
    }
    allowed
}

#[test]
fn every_module_is_placed() {
    let graph = module_graph();
    let known: BTreeSet<&str> = [FRONTS, SERVICE, ENGINE, IMAGES, SANDBOX]
        .into_iter()
        .chain(LEAVES.iter().copied())
        .collect();
    let found: BTreeSet<&str> = graph.keys().map(String::as_str).collect();
    assert_eq!(
        found, known,
        "every top-level module of mock-eci/src is a front, the service, the engine, the image store or a leaf"
    );
}

#[test]
fn calls_flow_from_fronts_through_service_to_engine() {
    let graph = module_graph();
    let mut wrong = Vec::new();
    for (module, uses) in &graph {
        let allowed = allowed(module);
        for used in uses {
            if !allowed.contains(used.as_str()) {
                wrong.push(format!("{module} → {used}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "calls must flow fronts → service → engine → leaves; these go against it: {wrong:?}"
    );
}

#[test]
fn the_reader_sees_crate_paths_in_every_spelling() {
    let found = crate_paths(
        "use crate::service::MockEci;\nuse crate::{clock, engine::group};\n\
         let x = mock_eci::fronts::MockServer; // not ours\n[`crate::rng`]",
    );
    let expected: BTreeSet<String> = ["service", "clock", "engine", "rng"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, expected);
}

#[test]
fn the_graph_is_read_from_the_real_source() {
    let graph = module_graph();
    // The fronts serve the service's handle and the service drives the engine: if these were
    // missing, the reader would be seeing nothing and the direction check could not fail.
    assert!(graph[FRONTS].contains(SERVICE), "{graph:?}");
    assert!(graph[SERVICE].contains(ENGINE), "{graph:?}");
    assert!(graph[ENGINE].contains("clock"), "{graph:?}");
}
