use super::*;

const RAM_ROLE: &str = "k8s.aliyun.com/eci-ram-role-name";
const SECURITY_GROUP: &str = "k8s.aliyun.com/eci-security-group";
const SPOT: &str = "k8s.aliyun.com/eci-spot-strategy";

const BIG: specs::Size = specs::Size {
    cpu: 2.0,
    memory: 4.0,
};

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A shared-cluster policy (the shipped one, deploy/base/annotation-policy.yaml, is tested
/// below).
fn shared_cluster() -> Policy {
    let trusted = "eci.aliyun.com/trusted=true";
    let data = map(&[
        ("eci-ram-role-name", trusted),
        ("eci-security-group", trusted),
        ("eci-vswitch", trusted),
        ("eci-with-eip", trusted),
        ("eci-eip-instanceid", trusted),
        ("eci-resource-group-id", trusted),
        ("eip-common-bandwidth-package-id", "none"),
        ("acr-service-arns", trusted),
        ("eci-spot-strategy", "all"),
        ("eci-use-specs", "all"),
        ("eci-custom-tags", "all"),
        ("tag.cost-centre", trusted),
        ("unknown-size-instance-types", trusted),
    ]);
    Policy::Loaded {
        source: "kube-system/eci-annotation-policy".into(),
        policy: AnnotationPolicy::from_data(&data).expect("valid"),
    }
}

fn refused(reason: &'static str, naming: &[&str]) -> impl Fn(&Clearance) -> bool {
    move |verdict| match verdict {
        Clearance::Refused {
            reason: got,
            message,
        } => *got == reason && naming.iter().all(|n| message.contains(n)),
        _ => false,
    }
}

/// What, annotations, namespace labels, scope, policy, the expected verdict.
type Case<'a> = (
    &'a str,
    Vec<(&'a str, &'a str)>,
    Labels<'a>,
    Option<&'a Written>,
    &'a Policy,
    &'a dyn Fn(&Clearance) -> bool,
);

#[test]
fn the_verdict_follows_annotations_namespace_labels_scope_and_policy() {
    let trusted = map(&[("eci.aliyun.com/trusted", "true"), ("eci", "on")]);
    let tenant = map(&[("eci", "on")]);
    let outsider = map(&[]);
    let scope = Written::parse("eci=on").expect("valid");
    let allowed = |v: &Clearance| *v == Clearance::Allowed;
    let undecided = |v: &Clearance| matches!(v, Clearance::Undecided(_));
    let not_allowed_role = refused(
        ANNOTATION_NOT_ALLOWED,
        &[
            RAM_ROLE,
            "kube-system/eci-annotation-policy",
            "eci.aliyun.com/trusted=true",
        ],
    );
    let not_allowed_group = refused(ANNOTATION_NOT_ALLOWED, &[SECURITY_GROUP]);
    let not_allowed_acr = refused(ANNOTATION_NOT_ALLOWED, &["acr-service-arns"]);
    let not_allowed_bandwidth = refused(ANNOTATION_NOT_ALLOWED, &["in no namespace"]);
    let not_served = refused(NAMESPACE_NOT_SERVED, &["team-x", "eci=on"]);
    let unavailable = refused(POLICY_UNAVAILABLE, &["kube-system/p", "missing"]);
    let missing = Policy::Unavailable {
        source: "kube-system/p".into(),
        why: "missing".into(),
    };
    let loaded = shared_cluster();
    let generous = Policy::Loaded {
        source: "kube-system/generous".into(),
        policy: AnnotationPolicy::from_data(&map(&[
            ("eci-use-specs", "all"),
            ("oversized-specs", "eci.aliyun.com/trusted=true"),
        ]))
        .expect("valid"),
    };
    let unnamed = refused(
        ANNOTATION_NOT_ALLOWED,
        &[
            "k8s.aliyun.com/eci-imc-id",
            "does not name it",
            "key `eci-imc-id`",
        ],
    );
    let reserved_tag = refused(
        ANNOTATION_NOT_ALLOWED,
        &["custom tag key `cost-centre`", "key `tag.cost-centre`"],
    );
    let oversized = refused(
        SPEC_LARGER_THAN_RESOURCES,
        &[
            "`64-256Gi`",
            "2 vCPU, 4 GiB",
            "ResourceQuota",
            "in no namespace",
        ],
    );
    let unknown_types = refused(
        SPEC_LARGER_THAN_RESOURCES,
        &["ecs.g7.16xlarge", "unknown-size-instance-types"],
    );
    // (what, annotations, labels, scope, policy, expected)
    let cases: Vec<Case<'_>> = vec![
        (
            "default: anything goes",
            vec![(RAM_ROLE, "v"), (SECURITY_GROUP, "v")],
            Labels::Known(&outsider),
            None,
            &Policy::Unrestricted,
            &allowed,
        ),
        (
            "default needs no labels",
            vec![(RAM_ROLE, "v")],
            Labels::Unknown,
            None,
            &Policy::Unrestricted,
            &allowed,
        ),
        (
            "an unrestricted annotation needs no labels",
            vec![(SPOT, "v")],
            Labels::Unknown,
            None,
            &loaded,
            &allowed,
        ),
        (
            "a restricted annotation in a trusted namespace",
            vec![(RAM_ROLE, "v"), (SECURITY_GROUP, "v"), (SPOT, "v")],
            Labels::Known(&trusted),
            None,
            &loaded,
            &allowed,
        ),
        (
            "the RAM role in a tenant namespace",
            vec![(SPOT, "v"), (RAM_ROLE, "v")],
            Labels::Known(&tenant),
            None,
            &loaded,
            &not_allowed_role,
        ),
        (
            "the security group in a tenant namespace",
            vec![(SECURITY_GROUP, "v")],
            Labels::Known(&tenant),
            None,
            &loaded,
            &not_allowed_group,
        ),
        (
            "an ACR role ARN in a tenant namespace",
            vec![("k8s.aliyun.com/acr-service-arns", "v")],
            Labels::Known(&tenant),
            None,
            &loaded,
            &not_allowed_acr,
        ),
        (
            "`none` allows it nowhere, trusted or not",
            vec![("k8s.aliyun.com/eip-common-bandwidth-package-id", "v")],
            Labels::Known(&trusted),
            None,
            &loaded,
            &not_allowed_bandwidth,
        ),
        (
            "a restricted annotation before the labels are known",
            vec![(RAM_ROLE, "v")],
            Labels::Unknown,
            None,
            &loaded,
            &undecided,
        ),
        (
            "the policy not read yet",
            vec![],
            Labels::Known(&trusted),
            None,
            &Policy::Loading,
            &undecided,
        ),
        (
            "the policy missing holds even plain pods",
            vec![],
            Labels::Known(&trusted),
            None,
            &missing,
            &unavailable,
        ),
        (
            "in scope, no annotations",
            vec![],
            Labels::Known(&tenant),
            Some(&scope),
            &Policy::Unrestricted,
            &allowed,
        ),
        (
            "out of scope, no annotations",
            vec![],
            Labels::Known(&outsider),
            Some(&scope),
            &Policy::Unrestricted,
            &not_served,
        ),
        (
            "out of scope is judged before annotations",
            vec![(RAM_ROLE, "v")],
            Labels::Known(&outsider),
            Some(&scope),
            &loaded,
            &not_served,
        ),
        (
            "in scope, restricted annotation refused",
            vec![(RAM_ROLE, "v")],
            Labels::Known(&tenant),
            Some(&scope),
            &loaded,
            &not_allowed_role,
        ),
        (
            "an allow-list: what the policy does not name is refused, labels or not",
            vec![(SPOT, "v"), ("k8s.aliyun.com/eci-imc-id", "imc-other-team")],
            Labels::Unknown,
            None,
            &loaded,
            &unnamed,
        ),
        (
            "written-back annotations are not judged (never read from the pod)",
            vec![
                ("k8s.aliyun.com/eci-instance-id", "eci-x"),
                ("k8s.aliyun.com/allocated-eipAddress", "1.2.3.4"),
            ],
            Labels::Known(&tenant),
            None,
            &loaded,
            &allowed,
        ),
        (
            "other prefixes are not the policy's",
            vec![("kubernetes.io/egress-bandwidth", "10M")],
            Labels::Known(&tenant),
            None,
            &loaded,
            &allowed,
        ),
        (
            "a reserved tag key in a tenant namespace",
            vec![(CUSTOM_TAGS, "app:web, cost-centre : platform")],
            Labels::Known(&tenant),
            None,
            &loaded,
            &reserved_tag,
        ),
        (
            "a reserved tag key in a trusted namespace",
            vec![(CUSTOM_TAGS, "cost-centre:platform")],
            Labels::Known(&trusted),
            None,
            &loaded,
            &allowed,
        ),
        (
            "tag keys nobody reserved go where custom tags go",
            vec![(CUSTOM_TAGS, "app:web,owner:me")],
            Labels::Unknown,
            None,
            &loaded,
            &allowed,
        ),
        (
            "a spec larger than the containers in a tenant namespace",
            vec![(USE_SPECS, "64-256Gi")],
            Labels::Known(&tenant),
            None,
            &loaded,
            &oversized,
        ),
        (
            "nobody over-sizes unless the policy says so, trusted or not",
            vec![(USE_SPECS, "2-4Gi,64-256Gi")],
            Labels::Known(&trusted),
            None,
            &loaded,
            &oversized,
        ),
        (
            "over-sizing where the policy allows it",
            vec![(USE_SPECS, "64-256Gi")],
            Labels::Known(&trusted),
            None,
            &generous,
            &allowed,
        ),
        (
            "a spec the containers fill",
            vec![(USE_SPECS, "2-4Gi")],
            Labels::Unknown,
            None,
            &loaded,
            &allowed,
        ),
        (
            "instance types of unknown size where the policy restricts them",
            vec![(USE_SPECS, "ecs.g7.16xlarge")],
            Labels::Known(&tenant),
            None,
            &loaded,
            &unknown_types,
        ),
        (
            "instance types of unknown size in a trusted namespace",
            vec![(USE_SPECS, "ecs.g7.16xlarge")],
            Labels::Known(&trusted),
            None,
            &loaded,
            &allowed,
        ),
        (
            "instance types where the policy says nothing of them",
            vec![(USE_SPECS, "ecs.g7.16xlarge")],
            Labels::Known(&tenant),
            None,
            &generous,
            &allowed,
        ),
        (
            "without a policy even an oversized spec goes (ack-virtual-node)",
            vec![(USE_SPECS, "64-256Gi"), ("k8s.aliyun.com/whatever", "x")],
            Labels::Unknown,
            None,
            &Policy::Unrestricted,
            &allowed,
        ),
        (
            "a scope needs the labels",
            vec![],
            Labels::Unknown,
            Some(&scope),
            &Policy::Unrestricted,
            &undecided,
        ),
    ];
    for (what, annotations, labels, scope, policy, expected) in cases {
        let annotations = map(&annotations);
        let asked = Asked {
            annotations: &annotations,
            size: BIG,
        };
        let verdict = judge(&asked, "team-x", labels, scope, policy);
        assert!(expected(&verdict), "{what}: got {verdict:?}");
    }
}

#[test]
fn an_empty_scope_selects_every_namespace() {
    let everyone = Written::parse("").expect("valid");
    let none = BTreeMap::new();
    let asked = Asked {
        annotations: &none,
        size: BIG,
    };
    let verdict = judge(
        &asked,
        "x",
        Labels::Unknown,
        Some(&everyone),
        &Policy::Unrestricted,
    );
    assert_eq!(verdict, Clearance::Allowed);
}

#[test]
fn policy_configmaps_are_validated() {
    type Data<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(Data<'_>, Result<usize, &str>)] = &[
        (&[], Ok(0)),
        (
            &[("eci-ram-role-name", "trusted"), ("eci-vswitch", "none")],
            Ok(2),
        ),
        (
            &[("k8s.aliyun.com/eci-ram-role-name", "trusted")],
            Err("not an annotation name"),
        ),
        (&[("eci-ram-role-name", " ")], Err("empty selector")),
        (
            &[
                ("eci-spot-strategy", "all"),
                ("tag.cost-centre", "trusted"),
                ("oversized-specs", "none"),
            ],
            Ok(1),
        ),
        (
            &[("eci-ram-role-name", "env in (a")],
            Err("key `eci-ram-role-name`"),
        ),
    ];
    for (data, expected) in cases {
        let parsed = AnnotationPolicy::from_data(&map(data));
        match (parsed, expected) {
            (Ok(policy), Ok(rules)) => assert_eq!(policy.rules.len(), *rules, "{data:?}"),
            (Err(error), Err(words)) => {
                assert!(error.to_string().contains(words), "{data:?}: {error}");
            }
            (got, _) => panic!("{data:?}: got {got:?}"),
        }
    }
}

#[test]
fn specs_are_compared_with_the_containers_rounded_up_to_a_size_eci_sells() {
    use specs::{Size, Sizing, compare};
    let size = |cpu, memory| Size { cpu, memory };
    let larger = |v: &Sizing| matches!(v, Sizing::Larger { .. });
    let fits = |v: &Sizing| *v == Sizing::Fits;
    let types = |v: &Sizing| matches!(v, Sizing::UnknownTypes(t) if t == &["ecs.c6.large"]);
    type Expected<'a> = &'a dyn Fn(&Sizing) -> bool;
    // (specs, containers' size, expected)
    let cases: &[(&str, Size, Expected<'_>)] = &[
        ("64-256Gi", size(0.1, 0.0), &larger),
        ("0.25-0.5Gi", size(0.1, 0.0), &fits),
        ("0.5-0.5Gi", size(0.1, 0.0), &larger),
        ("2-4Gi", size(2.0, 4.0), &fits),
        ("2-4Gi", size(1.5, 3.0), &fits),
        ("2-4Gi", size(1.5, 2.0), &larger),
        ("2-8Gi", size(2.0, 4.0), &larger),
        ("4-4Gi", size(2.0, 4.0), &larger),
        ("12-24Gi", size(9.0, 24.0), &fits),
        ("16-24Gi", size(9.0, 24.0), &larger),
        ("2-4", size(2.0, 4.0), &fits),
        ("2-4294967296", size(2.0, 4.0), &fits),
        ("2-8589934592", size(2.0, 4.0), &larger),
        ("2-4Gi,ecs.c6.large", size(2.0, 4.0), &types),
        ("ecs.c6.large,64-256Gi", size(2.0, 4.0), &larger),
        ("not-a-spec,garbage", size(0.1, 0.1), &fits),
        ("", size(0.0, 0.0), &fits),
    ];
    for (specs, asked, expected) in cases {
        let got = compare(specs, *asked);
        assert!(expected(&got), "{specs} for {asked:?}: got {got:?}");
    }
}

#[test]
fn a_pods_size_is_the_larger_of_its_requests_and_limits() {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "spec": {
            "initContainers": [{"name": "i", "resources": {"limits": {"cpu": "3"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "400m"}}},
            ],
        }
    }))
    .expect("a pod");
    let size = specs::Size::of_pod(&pod);
    assert!((size.cpu - 3.0).abs() < 1e-9, "{size:?}");
    assert!((size.memory - 2.0).abs() < 1e-9, "{size:?}");
    let plain: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}}]}
    }))
    .expect("a pod");
    assert_eq!(
        specs::Size::of_pod(&plain).rounded_up(),
        specs::Size {
            cpu: 0.25,
            memory: 1.0
        }
    );
}

/// The `key: value` lines of a flat YAML map (comments skipped), after `start` when given.
fn flat_yaml(text: &str, start: Option<&str>) -> BTreeMap<String, String> {
    let body = match start {
        Some(start) => text.split(start).nth(1).expect("the start line is there"),
        None => text,
    };
    body.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (key, value) = line.split_once(": ").expect("a key: value line");
            (key.to_owned(), value.trim().to_owned())
        })
        .collect()
}

#[test]
fn the_shipped_policy_names_every_annotation_and_restricts_identity_network_and_others_resources() {
    use crate::to_eci::annotations::{Handling, TABLE};
    let kustomize = flat_yaml(
        include_str!("../../../deploy/base/annotation-policy.yaml"),
        Some("\ndata:\n"),
    );
    let chart = flat_yaml(
        include_str!("../../../charts/virtual-node-eci/files/annotation-policy.yaml"),
        None,
    );
    assert_eq!(kustomize, chart, "the chart ships the kustomize policy");
    let policy = AnnotationPolicy::from_data(&kustomize).expect("the shipped policy is valid");
    for entry in TABLE {
        let Some(short) = entry.key.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        if matches!(entry.handling, Handling::WrittenBack(_)) {
            continue;
        }
        assert!(
            kustomize.contains_key(short),
            "the shipped policy names {short} (else every pod using it is refused)"
        );
    }
    let trusted = "eci.aliyun.com/trusted=true";
    for restricted in [
        "eci-ram-role-name",
        "eci-security-group",
        "eci-vswitch",
        "eci-with-eip",
        "eci-eip-instanceid",
        "eip-common-bandwidth-package-id",
        "eci-private-ip-address",
        "eci-fixed-ip",
        "eci-resource-group-id",
        "acr-instance-ids",
        "acr-service-arns",
        "acr-user-arns",
        "eci-imc-id",
        "eci-privatepool-id",
        OVERSIZED_SPECS,
        UNKNOWN_SIZE_TYPES,
    ] {
        assert_eq!(
            kustomize.get(restricted).map(String::as_str),
            Some(trusted),
            "{restricted}"
        );
    }
    // A tenant's attack pod, judged under the shipped policy in an unmarked namespace.
    let shipped = Policy::Loaded {
        source: "kube-system/eci-annotation-policy".into(),
        policy,
    };
    let tenant = map(&[("kubernetes.io/metadata.name", "team-x")]);
    let attack = map(&[
        ("k8s.aliyun.com/eci-ram-role-name", "PlatformAdminRole"),
        ("k8s.aliyun.com/eci-spot-strategy", "SpotAsPriceGo"),
    ]);
    let asked = Asked {
        annotations: &attack,
        size: BIG,
    };
    let verdict = judge(&asked, "team-x", Labels::Known(&tenant), None, &shipped);
    assert!(
        refused(ANNOTATION_NOT_ALLOWED, &["eci-ram-role-name", trusted])(&verdict),
        "{verdict:?}"
    );
}

/// The annotation table is vne-core's; the prefix a policy can name is the annotation policy's.
#[test]
fn the_table_names_each_annotation_once_and_each_can_be_governed() {
    use crate::to_eci::annotations::TABLE;
    let mut keys: Vec<&str> = TABLE.iter().map(|e| e.key).collect();
    keys.sort_unstable();
    let count = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), count, "an annotation listed twice");
    for entry in TABLE {
        // The annotation policy governs annotations under its prefix; only the two
        // Kubernetes bandwidth annotations (limits, not identity, network or billing) are not.
        assert!(
            entry.key.starts_with(ANNOTATION_PREFIX) || entry.key.ends_with("-bandwidth"),
            "{} cannot be named by the annotation policy",
            entry.key
        );
    }
}
