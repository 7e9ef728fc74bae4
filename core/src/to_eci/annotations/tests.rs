//! The annotation table: each mapped annotation's effect on the request, each malformed value
//! refused naming its annotation, and each unmapped one reported.

use super::*;
use eci_proto::v20180808::Container;

fn base() -> CreateContainerGroupRequest {
    CreateContainerGroupRequest {
        v_switch_id: "vsw-default".into(),
        security_group_id: "sg-default".into(),
        container: vec![Container {
            cpu: Some(1.0),
            memory: Some(2.0),
            ..Container::default()
        }],
        tag: vec![Tag {
            key: KUBE_PROXY.into(),
            value: "true".into(),
        }],
        ..CreateContainerGroupRequest::default()
    }
}

fn with(pairs: &[(&str, &str)]) -> Result<CreateContainerGroupRequest, Rejection> {
    let annotations = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut request = base();
    apply(&annotations, &mut request).map(|()| request)
}

type Check = fn(&CreateContainerGroupRequest) -> bool;

#[test]
fn every_mapped_annotation_sets_its_parameters() {
    let cases: &[(&str, &str, Check)] = &[
        (USE_SPECS, "2-4Gi", |r| {
            r.cpu == Some(2.0) && r.memory == Some(4.0)
        }),
        (USE_SPECS, "ecs.c6.large, ecs.g6.large", |r| {
            r.instance_type == "ecs.c6.large,ecs.g6.large" && r.cpu.is_none()
        }),
        ("k8s.aliyun.com/eci-vswitch", "vsw-a, vsw-b", |r| {
            r.v_switch_id == "vsw-a,vsw-b"
        }),
        (
            "k8s.aliyun.com/eci-schedule-strategy",
            "VSwitchRandom",
            |r| r.schedule_strategy == "VSwitchRandom",
        ),
        ("k8s.aliyun.com/eci-security-group", "sg-2", |r| {
            r.security_group_id == "sg-2"
        }),
        (
            "k8s.aliyun.com/eci-compute-category",
            "economy,general",
            |r| r.compute_category == ["economy", "general"],
        ),
        (
            "k8s.aliyun.com/eci-gpu-driver-version",
            "tesla=525.85.12",
            |r| r.gpu_driver_version == "tesla=525.85.12",
        ),
        ("k8s.aliyun.com/eci-spot-strategy", "SpotAsPriceGo", |r| {
            r.spot_strategy == "SpotAsPriceGo"
        }),
        ("k8s.aliyun.com/eci-spot-price-limit", "0.25", |r| {
            r.spot_price_limit == Some(0.25)
        }),
        ("k8s.aliyun.com/eci-spot-duration", "0", |r| {
            r.spot_duration == Some(0)
        }),
        ("k8s.aliyun.com/eci-spot-fallback", "true", |r| {
            r.strict_spot == Some(false)
        }),
        ("k8s.aliyun.com/eci-spot-fallback", "false", |r| {
            r.strict_spot == Some(true)
        }),
        (
            "k8s.aliyun.com/eci-custom-hosts",
            r#"[{"ip":"10.0.0.7","hostnames":["db","db.local"]}]"#,
            |r| {
                r.host_aliase
                    == [HostAliase {
                        ip: "10.0.0.7".into(),
                        hostname: vec!["db".into(), "db.local".into()],
                    }]
            },
        ),
        ("k8s.aliyun.com/eci-custom-tags", "team:shop, env:", |r| {
            r.tag.iter().any(|t| t.key == "team" && t.value == "shop")
                && r.tag.iter().any(|t| t.key == "env" && t.value.is_empty())
        }),
        ("k8s.aliyun.com/eci-ram-role-name", "reader", |r| {
            r.ram_role_name == "reader"
        }),
        ("k8s.aliyun.com/eci-resource-group-id", "rg-1", |r| {
            r.resource_group_id == "rg-1"
        }),
        ("k8s.aliyun.com/eci-auto-imc", "true", |r| {
            r.auto_match_image_cache
        }),
        ("k8s.aliyun.com/eci-image-cache", "true", |r| {
            r.auto_match_image_cache
        }),
        ("k8s.aliyun.com/eci-auto-imc", "false", |r| {
            !r.auto_match_image_cache
        }),
        ("k8s.aliyun.com/eci-imc-id", "imc-1", |r| {
            r.image_snapshot_id == "imc-1"
        }),
        (
            "k8s.aliyun.com/acr-instance-ids",
            "cri-1,cn-beijing:cri-2",
            |r| {
                r.acr_registry_info.len() == 2
                    && r.acr_registry_info[0].instance_id == "cri-1"
                    && r.acr_registry_info[1].region_id == "cn-beijing"
                    && r.acr_registry_info[1].instance_id == "cri-2"
            },
        ),
        (
            "k8s.aliyun.com/plain-http-registry",
            "registry.local:5000, other",
            |r| r.plain_http_registry == "registry.local:5000,other",
        ),
        ("k8s.aliyun.com/insecure-registry", "harbor.local", |r| {
            r.insecure_registry == "harbor.local"
        }),
        ("k8s.aliyun.com/eci-with-eip", "true", |r| r.auto_create_eip),
        ("k8s.aliyun.com/eci-eip-instanceid", "eip-1", |r| {
            r.eip_instance_id == "eip-1"
        }),
        ("k8s.aliyun.com/eip-bandwidth", "5", |r| {
            r.eip_bandwidth == Some(5)
        }),
        (
            "k8s.aliyun.com/eip-common-bandwidth-package-id",
            "cbwp-1",
            |r| r.eip_common_bandwidth_package == "cbwp-1",
        ),
        ("k8s.aliyun.com/eip-isp", "BGP_PRO", |r| {
            r.eip_isp == "BGP_PRO"
        }),
        ("k8s.aliyun.com/eci-enable-ipv6", "true", |r| {
            r.ipv6_address_count == Some(1)
        }),
        ("k8s.aliyun.com/eci-enable-ipv6", "false", |r| {
            r.ipv6_address_count.is_none()
        }),
        (
            "k8s.aliyun.com/eci-private-ip-address",
            "192.168.0.20",
            |r| r.private_ip_address == "192.168.0.20",
        ),
        ("k8s.aliyun.com/eci-fixed-ip", "true", |r| {
            r.fixed_ip == "true"
        }),
        (
            "k8s.aliyun.com/eci-custom-dnsconfig",
            r#"{"nameservers":["10.0.0.53"],"searches":["corp"],"options":[{"name":"ndots","value":"2"}]}"#,
            |r| {
                r.dns_config
                    == Some(DnsConfig {
                        name_server: vec!["10.0.0.53".into()],
                        search: vec!["corp".into()],
                        option: vec![DnsOption {
                            name: "ndots".into(),
                            value: "2".into(),
                        }],
                    })
            },
        ),
        ("k8s.aliyun.com/eci-extra-ephemeral-storage", "50Gi", |r| {
            r.ephemeral_storage == Some(50)
        }),
        (
            "k8s.aliyun.com/eci-ntp-server",
            "100.100.3.1, 100.100.3.2",
            |r| r.ntp_server == ["100.100.3.1", "100.100.3.2"],
        ),
        ("k8s.aliyun.com/eci-core-pattern", "/pod/data/dump", |r| {
            r.core_pattern == "/pod/data/dump"
        }),
        (KUBE_PROXY, "false", |r| {
            r.tag
                .iter()
                .filter(|t| t.key == KUBE_PROXY)
                .map(|t| t.value.as_str())
                .eq(["false"])
        }),
        ("kubernetes.io/ingress-bandwidth", "10M", |r| {
            r.ingress_bandwidth == Some(10_000_000)
        }),
        ("kubernetes.io/egress-bandwidth", "1500k", |r| {
            r.egress_bandwidth == Some(1_500_000)
        }),
    ];
    for (key, value, check) in cases {
        let request = with(&[(key, value)]).unwrap_or_else(|e| panic!("{key}={value}: {e}"));
        assert!(check(&request), "{key}={value}: {request:?}");
    }
    // Every mapped entry of the table has a case here.
    for entry in TABLE {
        if matches!(entry.handling, Handling::Mapped { .. }) && !entry.key.contains("arns") {
            assert!(
                cases.iter().any(|c| c.0 == entry.key),
                "no case for {}",
                entry.key
            );
        }
    }
}

#[test]
fn acr_arns_go_with_the_instances() {
    let ids = ("k8s.aliyun.com/acr-instance-ids", "cri-1,cri-2");
    let one = with(&[
        ids,
        ("k8s.aliyun.com/acr-service-arns", "acs:ram::1:role/a"),
    ])
    .unwrap();
    assert!(
        one.acr_registry_info
            .iter()
            .all(|a| a.arn_service == "acs:ram::1:role/a")
    );
    let each = with(&[
        ids,
        (
            "k8s.aliyun.com/acr-user-arns",
            "acs:ram::1:role/a,acs:ram::2:role/b",
        ),
    ])
    .unwrap();
    let users: Vec<&str> = each
        .acr_registry_info
        .iter()
        .map(|a| a.arn_user.as_str())
        .collect();
    assert_eq!(users, ["acs:ram::1:role/a", "acs:ram::2:role/b"]);
    for bad in [
        vec![("k8s.aliyun.com/acr-service-arns", "acs:ram::1:role/a")],
        vec![ids, ("k8s.aliyun.com/acr-user-arns", "a,b,c")],
    ] {
        let error = with(&bad).expect_err("refused");
        assert!(error.field.contains("arns"), "{error}");
    }
}

#[test]
fn malformed_values_are_refused_naming_the_annotation() {
    let cases = [
        (USE_SPECS, "big"),
        (USE_SPECS, "0.5-1Gi"),
        (USE_SPECS, "NaN-4Gi"),
        (USE_SPECS, "inf-4Gi"),
        (USE_SPECS, "0-0"),
        (
            "k8s.aliyun.com/eci-vswitch",
            "vsw-1,vsw-2,vsw-3,vsw-4,vsw-5,vsw-6,vsw-7,vsw-8,vsw-9,vsw-10,vsw-11",
        ),
        ("k8s.aliyun.com/eci-vswitch", "vsw a"),
        ("k8s.aliyun.com/eci-schedule-strategy", "Random"),
        ("k8s.aliyun.com/eci-security-group", "sg 1;rm"),
        ("k8s.aliyun.com/eci-compute-category", "economy,cheap"),
        ("k8s.aliyun.com/eci-spot-strategy", "Spot"),
        ("k8s.aliyun.com/eci-spot-price-limit", "cheap"),
        ("k8s.aliyun.com/eci-spot-price-limit", "-1"),
        ("k8s.aliyun.com/eci-spot-duration", "3"),
        ("k8s.aliyun.com/eci-spot-fallback", "yes"),
        ("k8s.aliyun.com/eci-fail-strategy", "fail-sometimes"),
        ("k8s.aliyun.com/eci-max-pending-minute", "0"),
        ("k8s.aliyun.com/eci-max-pending-minute", "forever"),
        ("k8s.aliyun.com/eci-custom-hosts", "db=10.0.0.1"),
        (
            "k8s.aliyun.com/eci-custom-hosts",
            r#"[{"ip":"db","hostnames":["x"]}]"#,
        ),
        ("k8s.aliyun.com/eci-custom-hosts", r#"[{"ip":"10.0.0.1"}]"#),
        ("k8s.aliyun.com/eci-custom-tags", "no-colon"),
        (
            "k8s.aliyun.com/eci-custom-tags",
            "k8s.aliyun.com/pod-uid:forged",
        ),
        ("k8s.aliyun.com/eci-custom-tags", "aliyun-owner:x"),
        ("k8s.aliyun.com/eci-auto-imc", "TRUE!"),
        ("k8s.aliyun.com/acr-instance-ids", "cri 1"),
        ("k8s.aliyun.com/plain-http-registry", "http://x/"),
        ("k8s.aliyun.com/eci-with-eip", "1"),
        ("k8s.aliyun.com/eip-bandwidth", "0"),
        ("k8s.aliyun.com/eip-bandwidth", "fast"),
        ("k8s.aliyun.com/eip-isp", "CMCC"),
        ("k8s.aliyun.com/eci-enable-ipv6", "on"),
        ("k8s.aliyun.com/eci-private-ip-address", "10.0.0"),
        ("k8s.aliyun.com/eci-private-ip-address", "fd00::1"),
        ("k8s.aliyun.com/eci-fixed-ip", "sure"),
        ("k8s.aliyun.com/eci-custom-dnsconfig", "8.8.8.8"),
        (
            "k8s.aliyun.com/eci-custom-dnsconfig",
            r#"{"nameservers":["dns.local"]}"#,
        ),
        ("k8s.aliyun.com/eci-extra-ephemeral-storage", "1.5Gi"),
        ("k8s.aliyun.com/eci-extra-ephemeral-storage", "lots"),
        ("k8s.aliyun.com/eci-ntp-server", "ntp.local"),
        ("k8s.aliyun.com/eci-core-pattern", "core"),
        ("k8s.aliyun.com/eci-core-pattern", "/a/../../etc"),
        (KUBE_PROXY, "maybe"),
        ("kubernetes.io/ingress-bandwidth", "fast"),
        ("kubernetes.io/egress-bandwidth", "0"),
    ];
    for (key, value) in cases {
        let error = with(&[(key, value)]).expect_err(&format!("{key}={value} must be refused"));
        assert_eq!(rejected_annotation(&error), Some(key), "{error}");
        assert!(!error.retryable, "{error}");
        assert!(
            error.reason.contains("accepted:"),
            "says what works: {error}"
        );
    }
    let error = with(&[("k8s.aliyun.com/eci-spot-strategy", "SpotWithPriceLimit")]).unwrap_err();
    assert_eq!(
        rejected_annotation(&error),
        Some("k8s.aliyun.com/eci-spot-price-limit")
    );
}

#[test]
fn unmapped_annotations_are_reported_and_mapped_ones_are_not() {
    for entry in TABLE {
        let annotations = BTreeMap::from([(entry.key.to_owned(), entry.example.to_owned())]);
        let notices = notices(&annotations);
        match entry.handling {
            Handling::NotDriven(_) => {
                assert_eq!(notices.len(), 1, "{}", entry.key);
                assert!(notices[0].starts_with(entry.key), "{notices:?}");
                let mut request = base();
                apply(&annotations, &mut request).unwrap_or_else(|e| panic!("{}: {e}", entry.key));
                assert_eq!(request, base(), "{} changes nothing", entry.key);
            }
            Handling::Mapped { .. } | Handling::ByDaemon { .. } | Handling::WrittenBack(_) => {
                assert!(notices.is_empty(), "{}: {notices:?}", entry.key);
            }
        }
    }
}

#[test]
fn the_no_stock_annotations_say_how_long_to_wait_and_whether_to() {
    use std::time::Duration;
    let minutes = |m: u64| Duration::from_secs(m * 60);
    // (the pod's annotations, its strategy, how long it may wait)
    type Case<'a> = (&'a [(&'a str, &'a str)], FailStrategy, Duration);
    let cases: [Case<'_>; 7] = [
        (&[], FailStrategy::Retry, minutes(240)),
        (
            &[(FAIL_STRATEGY, "fail-back")],
            FailStrategy::Retry,
            minutes(240),
        ),
        (
            &[(FAIL_STRATEGY, "fail-over")],
            FailStrategy::Retry,
            minutes(240),
        ),
        (
            &[(FAIL_STRATEGY, "fail-fast")],
            FailStrategy::FailFast,
            minutes(240),
        ),
        (
            &[(MAX_PENDING_MINUTE, "30")],
            FailStrategy::Retry,
            minutes(30),
        ),
        // Out of ACK's range (refused at translation): the default, never zero.
        (
            &[(MAX_PENDING_MINUTE, "0")],
            FailStrategy::Retry,
            minutes(240),
        ),
        (
            &[(FAIL_STRATEGY, "fail-fast"), (MAX_PENDING_MINUTE, "1440")],
            FailStrategy::FailFast,
            minutes(1440),
        ),
    ];
    for (given, strategy, wait) in cases {
        let annotations = given
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(on_no_stock(&annotations), (strategy, wait), "{given:?}");
    }
    for (value, accepted) in [("10", true), ("1440", true), ("9", false), ("1441", false)] {
        let annotations = BTreeMap::from([(MAX_PENDING_MINUTE.to_owned(), value.to_owned())]);
        assert_eq!(
            apply(&annotations, &mut base()).is_ok(),
            accepted,
            "{value}"
        );
    }
}

#[test]
fn the_creation_answer_is_written_back() {
    let back = written_back("eci-1", "req-1");
    assert_eq!(back[INSTANCE_ID], "eci-1");
    assert_eq!(back[REQUEST_ID], "req-1");
    assert!(!written_back("eci-1", "").contains_key(REQUEST_ID));
    for key in back.keys() {
        assert!(matches!(
            entry(key).map(|e| e.handling),
            Some(Handling::WrittenBack(_))
        ));
    }
}

#[test]
fn the_groups_description_is_written_back_as_the_service_gave_it() {
    let described_group = |instance_type: &str, cpu: f64, memory: f64, eip: &str| ContainerGroup {
        container_group_id: "eci-1".into(),
        instance_type: instance_type.into(),
        cpu,
        memory,
        eni_instance_id: "eni-1".into(),
        vpc_id: "vpc-1".into(),
        internet_ip: eip.into(),
        zone_id: "zone-b".into(),
        ..ContainerGroup::default()
    };
    // (instance type, cpu, memory, internet ip, zone wanted) → (spec, eip, zone)
    let cases = [
        (
            ("ecs.c6.large", 2.0, 4.0, "", false),
            (Some("ecs.c6.large"), None, None),
        ),
        (("", 2.0, 4.0, "", false), (Some("2-4Gi"), None, None)),
        (
            ("", 0.5, 1.0, "47.1.2.3", true),
            (Some("0.5-1Gi"), Some("47.1.2.3"), Some("zone-b")),
        ),
        (("", 0.0, 0.0, "", true), (None, None, Some("zone-b"))),
    ];
    for ((instance_type, cpu, memory, eip, zone), (spec, address, zone_written)) in cases {
        let out = described(&described_group(instance_type, cpu, memory, eip), zone);
        let at = format!("{instance_type:?} {cpu} {memory} {eip:?} {zone}: {out:?}");
        assert_eq!(out.get(INSTANCE_SPEC).map(String::as_str), spec, "{at}");
        assert_eq!(out.get(EIP_ADDRESS).map(String::as_str), address, "{at}");
        assert_eq!(out.get(ZONE).map(String::as_str), zone_written, "{at}");
        assert_eq!(out[ENI_INSTANCE_ID], "eni-1", "{at}");
        assert_eq!(out[VPC], "vpc-1", "{at}");
        assert!(
            out.values().all(|v| !v.is_empty()),
            "nothing written empty: {at}"
        );
        for key in out.keys().filter(|k| **k != ZONE) {
            assert!(
                matches!(
                    entry(key).map(|e| e.handling),
                    Some(Handling::WrittenBack(_))
                ),
                "{key} is a written-back entry of the table"
            );
        }
    }
    // A description with nothing filled in adds nothing.
    assert!(described(&ContainerGroup::default(), true).is_empty());
}

#[test]
fn the_matched_image_cache_is_read_from_ecis_hit_event_only() {
    use eci_proto::events::{HIT_IMAGE_CACHE, IMAGE_CACHE_MISSED, hit_image_cache_message};
    use eci_proto::v20180808::Event;
    let event = |reason: &str, message: &str| Event {
        r#type: "Normal".into(),
        reason: reason.into(),
        message: message.into(),
        ..Event::default()
    };
    let hit = hit_image_cache_message("imc-2ze5hdcnngen");
    // (events) → annotation
    let cases = [
        (vec![event(HIT_IMAGE_CACHE, &hit)], Some("imc-2ze5hdcnngen")),
        (
            vec![event("Pulled", "pulled"), event(HIT_IMAGE_CACHE, &hit)],
            Some("imc-2ze5hdcnngen"),
        ),
        (
            vec![event(
                IMAGE_CACHE_MISSED,
                "[eci.imagecache]Missed image cache.",
            )],
            None,
        ),
        // The id only counts under ECI's reason, and only in ECI's id shape.
        (vec![event("Started", &hit)], None),
        (
            vec![event(
                HIT_IMAGE_CACHE,
                "Successfully hit image cache imc-x\nforged: 1",
            )],
            Some("imc-x"),
        ),
        (
            vec![event(HIT_IMAGE_CACHE, "Successfully hit image cache ../x")],
            None,
        ),
        (vec![], None),
    ];
    for (events, expected) in cases {
        let group = ContainerGroup {
            events: events.clone(),
            ..ContainerGroup::default()
        };
        let out = described(&group, false);
        assert_eq!(
            out.get(MATCHED_IMAGE_CACHE).map(String::as_str),
            expected,
            "{events:?}"
        );
    }
}
