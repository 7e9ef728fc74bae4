use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::json;

use super::*;

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": "web-0", "namespace": "shop", "uid": "u-1",
            "labels": {"app": "web", "tier": "front"},
            "annotations": {"note": "say \"hi\"\n\ttab\u{1}"},
        },
        "spec": {"nodeName": "virtual-node-eci-0", "serviceAccountName": "web", "containers": []},
    }))
    .unwrap()
}

#[test]
fn fields_resolve_as_the_kubelet_resolves_them() {
    let known = |s: &str| Ok(FieldValue::Known(s.to_owned()));
    let unsupported = |p: &str| Err(DownwardError::UnsupportedField { path: p.to_owned() });
    let cases: &[(&str, bool, Result<FieldValue, DownwardError>)] = &[
        ("metadata.name", false, known("web-0")),
        ("metadata.namespace", false, known("shop")),
        ("metadata.uid", false, known("u-1")),
        ("metadata.labels['app']", false, known("web")),
        ("metadata.labels['missing']", false, known("")),
        (
            "metadata.annotations['note']",
            false,
            known("say \"hi\"\n\ttab\u{1}"),
        ),
        (
            "metadata.labels",
            true,
            known("app=\"web\"\ntier=\"front\""),
        ),
        ("metadata.labels", false, unsupported("metadata.labels")),
        (
            "metadata.annotations",
            false,
            unsupported("metadata.annotations"),
        ),
        // The API accepts only the single-quoted subscript.
        (
            "metadata.labels[\"app\"]",
            false,
            unsupported("metadata.labels[\"app\"]"),
        ),
        ("spec.nodeName", false, Ok(FieldValue::NodeName)),
        ("spec.serviceAccountName", false, known("web")),
        ("status.podIP", false, Ok(FieldValue::PodIp)),
        ("status.podIPs", false, Ok(FieldValue::PodIps)),
        ("status.hostIP", false, Ok(FieldValue::HostIp)),
        ("status.hostIPs", false, Ok(FieldValue::HostIp)),
        ("spec.containers", false, unsupported("spec.containers")),
    ];
    for (path, whole_maps, want) in cases {
        assert_eq!(&field(&pod(), path, *whole_maps), want, "{path}");
    }
}

#[test]
fn map_files_quote_values_as_go_does() {
    let map = BTreeMap::from([
        ("b".to_owned(), "say \"hi\"\\".to_owned()),
        (
            "a".to_owned(),
            "\u{7}\u{8}\u{c}\n\r\t\u{b}\u{1}\u{7f}\u{85}ü".to_owned(),
        ),
    ]);
    assert_eq!(
        map_file(Some(&map)),
        "a=\"\\a\\b\\f\\n\\r\\t\\v\\x01\\x7f\\u0085ü\"\nb=\"say \\\"hi\\\"\\\\\""
    );
    assert_eq!(map_file(None), "");
}

#[allow(clippy::needless_pass_by_value)] // called with `json!(..)` literals
fn container(resources: serde_json::Value) -> Container {
    serde_json::from_value(json!({"name": "c", "resources": resources})).unwrap()
}

#[test]
fn resources_round_up_to_whole_divisors() {
    let sized = container(json!({
        "limits": {"cpu": "1500m", "memory": "129Mi", "hugepages-2Mi": "4Mi"},
        "requests": {"cpu": "250m", "memory": "64Mi"},
    }));
    // Unset: the kubelet's rule, a node of 4 cores and 8Gi for limits, zero for requests.
    let unset = |side: Side, name: &str| match (side, name) {
        (Side::Limits, "cpu") => Quantity::parse("4").unwrap(),
        (Side::Limits, "memory") => Quantity::parse("8Gi").unwrap(),
        _ => Quantity::parse("0").unwrap(),
    };
    let cases: &[(&Container, &str, Option<&str>, &str)] = &[
        (&sized, "limits.cpu", None, "2"),
        (&sized, "limits.cpu", Some("1m"), "1500"),
        (&sized, "limits.cpu", Some(""), "2"),
        (&sized, "requests.cpu", Some("100m"), "3"),
        (&sized, "limits.memory", Some("1Mi"), "129"),
        (&sized, "limits.memory", Some("1Gi"), "1"),
        (&sized, "requests.memory", None, "67108864"),
        (&sized, "limits.hugepages-2Mi", Some("1Mi"), "4"),
        (&sized, "limits.ephemeral-storage", None, "0"),
        (&container(json!({})), "limits.cpu", None, "4"),
        (&container(json!({})), "limits.memory", Some("1Mi"), "8192"),
        (&container(json!({})), "requests.cpu", None, "0"),
    ];
    for (container, reference, divisor, want) in cases {
        assert_eq!(
            resource(container, reference, *divisor, unset).as_deref(),
            Ok(*want),
            "{reference} / {divisor:?}"
        );
    }
}

#[test]
fn resource_references_the_kubelet_refuses_are_refused() {
    let c = container(json!({"limits": {"cpu": "x"}}));
    let zero = |_: Side, _: &str| Quantity::parse("0").unwrap();
    for bad in ["limits.gpu", "cpu", "usage.cpu", "limits."] {
        assert_eq!(
            resource(&c, bad, None, zero),
            Err(DownwardError::UnsupportedResource {
                resource: bad.to_owned()
            })
        );
    }
    assert!(matches!(
        resource(&c, "limits.cpu", None, zero),
        Err(DownwardError::Quantity(_))
    ));
    let one_gib = container(json!({"requests": {"memory": "1Gi"}}));
    assert_eq!(
        resource(&one_gib, "requests.memory", Some("0"), zero).as_deref(),
        Ok("1073741824"),
        "an unset divisor arrives as \"0\": the kubelet divides by 1"
    );
    assert!(matches!(
        resource(&c, "requests.memory", Some("-1"), zero),
        Err(DownwardError::Divisor { .. })
    ));
}
