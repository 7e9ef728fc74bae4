//! The annotation table (`vne_core::to_eci::annotations::TABLE`) held to the service and the docs:
//! - every parameter a mapped annotation names is one the official SDK documents for
//!   CreateContainerGroup (`proto/sdk/names.tsv`), and the annotation's example value, on a
//!   pod, changes exactly those parameters of what the client sends — nothing else;
//! - docs/compatibility.md's annotation table is generated from the table; the test fails when
//!   they drift. Regenerate: `UPDATE_GENERATED=1 cargo test -p virtual-node-eci --test annotations`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use eci_proto::openapi::documented;
use eci_proto::openapi::form;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use vne_core::to_eci::annotations::{Handling, TABLE};
use vne_core::to_eci::{self, Context};

const ACTION: &str = "CreateContainerGroup";
const PAGE: &str = "docs/compatibility.md";
const BEGIN: &str = "<!-- BEGIN annotation table: generated from core/src/to_eci/annotations.rs — do not edit.\n     Regenerate: UPDATE_GENERATED=1 cargo test -p virtual-node-eci --test annotations -->\n";
const END: &str = "<!-- END annotation table -->";

fn pod(annotations: &BTreeMap<&str, &str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1", "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "nginx",
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]}
    }))
    .unwrap()
}

/// What the client sends for the pod: (parameter as names.tsv writes it, value), as a multiset.
fn sent(annotations: &BTreeMap<&str, &str>) -> BTreeSet<(String, String)> {
    let dns = vec!["10.96.0.10".to_owned()];
    let (none_cm, none_secret, none_tokens) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let cx = Context {
        region: "cn-hangzhou",
        vswitch: "vsw-default",
        security_group: "sg-default",
        cluster_name: "c1",
        node_name: "virtual-node-eci-0",
        cluster_dns: &dns,
        cluster_domain: "cluster.local",
        config_maps: &none_cm,
        secrets: &none_secret,
        claims: &BTreeMap::new(),
        service_account_tokens: &none_tokens,
        default_spec: (2.0, 4.0),
        apiserver: None,
        services: &[],
        kube_proxy: true,
    };
    let request = to_eci::translate(&pod(annotations), &cx)
        .unwrap_or_else(|e| panic!("{annotations:?} rejected: {e}"));
    form::encode(&request)
        .expect("the request encodes")
        .into_iter()
        .map(|(key, value)| (documented::normalise_parameter(&key), value))
        .collect()
}

/// What an annotation needs beside it to mean anything.
fn companions(key: &str) -> BTreeMap<&'static str, &'static str> {
    match key {
        "k8s.aliyun.com/acr-service-arns" | "k8s.aliyun.com/acr-user-arns" => {
            BTreeMap::from([("k8s.aliyun.com/acr-instance-ids", "cri-1")])
        }
        "k8s.aliyun.com/eci-spot-price-limit" | "k8s.aliyun.com/eci-spot-duration" => {
            BTreeMap::from([("k8s.aliyun.com/eci-spot-strategy", "SpotAsPriceGo")])
        }
        "k8s.aliyun.com/eci-spot-strategy" => {
            BTreeMap::from([("k8s.aliyun.com/eci-spot-price-limit", "0.5")])
        }
        _ => BTreeMap::new(),
    }
}

#[test]
fn mapped_annotations_send_exactly_their_documented_parameters() {
    let mut mapped = 0;
    for entry in TABLE {
        let Handling::Mapped { parameters, .. } = entry.handling else {
            continue;
        };
        mapped += 1;
        for parameter in parameters {
            assert!(
                documented::request_parameter(ACTION, parameter).is_some(),
                "{}: {parameter} is not a {ACTION} parameter in names.tsv",
                entry.key
            );
        }
        let without = companions(entry.key);
        let mut with = without.clone();
        with.insert(entry.key, entry.example);
        let (before, after) = (sent(&without), sent(&with));
        let changed: BTreeSet<&str> = before
            .symmetric_difference(&after)
            .map(|(key, _)| key.as_str())
            .collect();
        assert!(
            !changed.is_empty(),
            "{}={} changes nothing sent",
            entry.key,
            entry.example
        );
        let listed: BTreeSet<&str> = parameters.iter().copied().collect();
        assert!(
            changed.is_subset(&listed),
            "{}={} changes {changed:?}, the table says {listed:?}",
            entry.key,
            entry.example
        );
    }
    assert!(mapped >= 35, "only {mapped} mapped annotations");
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The generated part of the page.
fn render() -> String {
    let mut out = String::from(BEGIN);
    out.push_str("\n| annotation | what happens | accepted values |\n| --- | --- | --- |\n");
    for entry in TABLE {
        let what = match entry.handling {
            Handling::Mapped { parameters, .. } => {
                let names: Vec<String> = parameters.iter().map(|p| format!("`{p}`")).collect();
                format!("mapped to {}", names.join(", "))
            }
            Handling::NotDriven(what) => {
                format!(
                    "**not driven** (Warning Event `AnnotationNotHonoured`, the group is still created): {what}"
                )
            }
            Handling::ByDaemon { how, .. } => format!("honoured by the daemon: {how}"),
            Handling::WrittenBack(from) => format!("written back by the daemon: {from}"),
        };
        writeln!(
            out,
            "| `{}` | {} | {} |",
            entry.key,
            cell(&what),
            cell(entry.accepts)
        )
        .unwrap();
    }
    out.push('\n');
    out.push_str(END);
    out
}

#[test]
fn the_compatibility_page_lists_every_annotation_as_the_table_says() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PAGE);
    let page = std::fs::read_to_string(&path).unwrap();
    let start = page
        .find(BEGIN)
        .expect("the page has the generated table's start marker");
    let end = page[start..]
        .find(END)
        .map(|e| start + e + END.len())
        .expect("end marker");
    let wanted = render();
    if page[start..end] == wanted {
        return;
    }
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        let updated = format!("{}{wanted}{}", &page[..start], &page[end..]);
        std::fs::write(&path, updated).unwrap();
        return;
    }
    panic!(
        "{PAGE}'s annotation table is out of date: UPDATE_GENERATED=1 cargo test -p virtual-node-eci --test annotations"
    );
}
