//! The folder map is the architecture, so it is checked: calls flow one way, app → areas →
//! edges and leaves, with no cycle between the top-level folders of `provider/src`.
//!
//! Read from the source (every `crate::<folder>` path), the way `cargo modules` would show it,
//! without needing that tool installed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What runs the areas: nothing may call it.
const APP: &str = "app";
/// Edges and leaves: the Kubernetes and ECI clients, metrics/events, configuration. They call
/// each other at most, never an area.
const LEAVES: &[&str] = &["config", "eci", "k8s", "ops"];
/// The areas, one job each.
const AREAS: &[&str] = &[
    "admission",
    "fleet",
    "imagecache",
    "kubelet",
    "node",
    "placement",
    "pods",
];

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

/// Every `crate::<name>` in `text`.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // `virtual_node_eci::…` in doc examples is not a crate path; only bare `crate::`.
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name.is_empty() && !preceded_by_ident {
            found.insert(name);
        }
        rest = after;
    }
    found
}

/// folder → the other top-level folders it names.
fn folder_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = source_dir();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("provider/src") {
        let path = entry.expect("dir entry").path();
        if !path.is_dir() {
            continue;
        }
        let folder = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 folder name")
            .to_owned();
        let mut files = Vec::new();
        rust_files(&path, &mut files);
        let mut uses = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable source");
            uses.extend(crate_paths(&text).into_iter().filter(|n| *n != folder));
        }
        graph.insert(folder, uses);
    }
    graph
}

/// A cycle through the graph, if there is one (depth-first, three colours).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            g.entry((*from).to_owned())
                .or_default()
                .insert((*to).to_owned());
            g.entry((*to).to_owned()).or_default();
        }
        g
    };
    assert_eq!(
        find_cycle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])),
        None
    );
    assert_eq!(
        find_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(
        crate_paths("use crate::pods::x; virtual_node_eci::node; (crate::k8s::rfc3339)"),
        BTreeSet::from(["pods".to_owned(), "k8s".to_owned()])
    );
}

#[test]
fn the_folders_are_the_documented_jobs() {
    let graph = folder_graph();
    let mut expected: BTreeSet<&str> = LEAVES.iter().chain(AREAS).copied().collect();
    expected.insert(APP);
    let found: BTreeSet<&str> = graph.keys().map(String::as_str).collect();
    assert_eq!(
        found, expected,
        "provider/src's folders changed: update this test and docs/architecture.md"
    );
    for folder in &found {
        let opening = std::fs::read_to_string(source_dir().join(folder).join("mod.rs"))
            .unwrap_or_else(|e| panic!("{folder}/mod.rs: {e}"));
        assert!(
            opening.starts_with("//! "),
            "{folder}/mod.rs must open with a few lines on what it owns and may call"
        );
    }
}

#[test]
fn calls_flow_one_way_with_no_cycle_between_folders() {
    let graph = folder_graph();
    for (folder, uses) in &graph {
        assert!(
            !uses.contains(APP),
            "{folder} calls app: app wires the areas, nothing calls it"
        );
        if LEAVES.contains(&folder.as_str()) {
            let areas: Vec<&String> = uses
                .iter()
                .filter(|u| AREAS.contains(&u.as_str()))
                .collect();
            assert!(
                areas.is_empty(),
                "{folder} is an edge/leaf but calls the areas {areas:?}"
            );
        }
    }
    assert_eq!(
        find_cycle(&graph),
        None,
        "import cycle between folders; the graph: {graph:#?}"
    );
}

#[test]
fn no_two_modules_share_a_name() {
    let mut files = Vec::new();
    rust_files(&source_dir(), &mut files);
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in files {
        let relative = file
            .strip_prefix(source_dir())
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        let module = relative.strip_suffix("/mod.rs").unwrap_or(&relative);
        let module = module.strip_suffix(".rs").unwrap_or(module);
        let name = module.rsplit('/').next().unwrap_or(module).to_owned();
        // Crate roots and test modules are not names a reader navigates by.
        if !matches!(name.as_str(), "lib" | "main" | "tests") {
            by_name.entry(name).or_default().push(relative);
        }
    }
    let shared: Vec<(&String, &Vec<String>)> = by_name
        .iter()
        .filter(|(_, files)| files.len() > 1)
        .collect();
    assert!(shared.is_empty(), "modules sharing a name: {shared:#?}");
}

/// Every file that opens a watch of the Kubernetes API, with the kinds and scopes it watches.
/// Pods are the largest and busiest kind: a replica watches each pod scope once, and the areas
/// that need the same scope read one [`SharedWatch`] (`k8s/shared_watch.rs`). A new watch site
/// must be listed here, which makes its scope a decision rather than an accident.
///
/// [`SharedWatch`]: virtual_node_eci::k8s::shared_watch::SharedWatch
const WATCH_SITES: &[(&str, &[(&str, &str)])] = &[
    // The shared watches: every pod, every node (admission and placement), and this node's
    // pods (the pod controller and the kubelet API's metrics), each run once by the app.
    (
        "k8s/shared_watch.rs",
        &[
            ("Pod", "cluster"),
            ("Node", "cluster"),
            ("Pod", "spec.nodeName=<this node>"),
        ],
    ),
    ("admission/spill.rs", &[("Pod", "spec.nodeName=")]),
    (
        "admission/cache.rs",
        &[
            ("Selector", "cluster"),
            ("Namespace(metadata)", "cluster"),
            ("ConfigMap", "metadata.name=<legacy config>"),
        ],
    ),
    (
        "fleet/replicas.rs",
        &[("Node", "virtual nodes of the region")],
    ),
    ("node/guard.rs", &[("Node", "metadata.name=<this node>")]),
    ("placement/mod.rs", &[("ResourcePolicy", "cluster")]),
    ("pods/services.rs", &[("Service", "cluster")]),
    (
        "pods/sources.rs",
        &[
            ("ConfigMap(metadata)", "cluster"),
            ("Secret(metadata)", "cluster"),
        ],
    ),
    (
        "pods/tenancy.rs",
        &[
            ("Namespace", "cluster"),
            ("ConfigMap", "metadata.name=<annotation policy>"),
        ],
    ),
];

#[test]
fn every_watch_is_listed_and_each_pod_scope_is_watched_once() {
    let mut files = Vec::new();
    rust_files(&source_dir(), &mut files);
    let watching: BTreeSet<String> = files
        .iter()
        .filter(|file| {
            std::fs::read_to_string(file)
                .expect("readable source")
                .contains("watcher(")
        })
        .map(|file| {
            file.strip_prefix(source_dir())
                .expect("under src")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let listed: BTreeSet<String> = WATCH_SITES.iter().map(|(f, _)| (*f).to_owned()).collect();
    assert_eq!(
        watching, listed,
        "the files that open watches are not the listed ones: list a new one with what it watches"
    );
    let mut pod_scopes = BTreeSet::new();
    for (file, watches) in WATCH_SITES {
        for (kind, scope) in *watches {
            if *kind == "Pod" {
                assert!(
                    pod_scopes.insert(*scope),
                    "{file} watches pods with scope {scope}, which another watch already covers: read the shared one"
                );
            }
        }
    }
}
