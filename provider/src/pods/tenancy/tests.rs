use super::*;

const RAM_ROLE: &str = "k8s.aliyun.com/eci-ram-role-name";
const SECURITY_GROUP: &str = "k8s.aliyun.com/eci-security-group";
const SPOT: &str = "k8s.aliyun.com/eci-spot-strategy";

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The recommended shared-cluster policy (deploy/examples/annotation-policy-shared-cluster.yaml
/// holds the same keys).
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
    ]);
    Policy::Loaded {
        source: "kube-system/eci-annotation-policy".into(),
        policy: AnnotationPolicy::from_data(&data).expect("valid"),
    }
}

fn refused(reason: &'static str, naming: &[&str]) -> impl Fn(&Verdict) -> bool {
    move |verdict| match verdict {
        Verdict::Refused {
            reason: got,
            message,
        } => *got == reason && naming.iter().all(|n| message.contains(n)),
        _ => false,
    }
}

/// What, annotations, namespace labels, scope, policy, the expected verdict.
type Case<'a> = (
    &'a str,
    Vec<&'a str>,
    Labels<'a>,
    Option<&'a Written>,
    &'a Policy,
    &'a dyn Fn(&Verdict) -> bool,
);

#[test]
fn the_verdict_follows_annotations_namespace_labels_scope_and_policy() {
    let trusted = map(&[("eci.aliyun.com/trusted", "true"), ("eci", "on")]);
    let tenant = map(&[("eci", "on")]);
    let outsider = map(&[]);
    let scope = Written::parse("eci=on").expect("valid");
    let allowed = |v: &Verdict| *v == Verdict::Allowed;
    let undecided = |v: &Verdict| matches!(v, Verdict::Undecided(_));
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
    // (what, annotations, labels, scope, policy, expected)
    let cases: Vec<Case<'_>> = vec![
        (
            "default: anything goes",
            vec![RAM_ROLE, SECURITY_GROUP],
            Labels::Known(&outsider),
            None,
            &Policy::Unrestricted,
            &allowed,
        ),
        (
            "default needs no labels",
            vec![RAM_ROLE],
            Labels::Unknown,
            None,
            &Policy::Unrestricted,
            &allowed,
        ),
        (
            "an unrestricted annotation needs no labels",
            vec![SPOT],
            Labels::Unknown,
            None,
            &loaded,
            &allowed,
        ),
        (
            "a restricted annotation in a trusted namespace",
            vec![RAM_ROLE, SECURITY_GROUP, SPOT],
            Labels::Known(&trusted),
            None,
            &loaded,
            &allowed,
        ),
        (
            "the RAM role in a tenant namespace",
            vec![SPOT, RAM_ROLE],
            Labels::Known(&tenant),
            None,
            &loaded,
            &not_allowed_role,
        ),
        (
            "the security group in a tenant namespace",
            vec![SECURITY_GROUP],
            Labels::Known(&tenant),
            None,
            &loaded,
            &not_allowed_group,
        ),
        (
            "an ACR role ARN in a tenant namespace",
            vec!["k8s.aliyun.com/acr-service-arns"],
            Labels::Known(&tenant),
            None,
            &loaded,
            &not_allowed_acr,
        ),
        (
            "`none` allows it nowhere, trusted or not",
            vec!["k8s.aliyun.com/eip-common-bandwidth-package-id"],
            Labels::Known(&trusted),
            None,
            &loaded,
            &not_allowed_bandwidth,
        ),
        (
            "a restricted annotation before the labels are known",
            vec![RAM_ROLE],
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
            vec![RAM_ROLE],
            Labels::Known(&outsider),
            Some(&scope),
            &loaded,
            &not_served,
        ),
        (
            "in scope, restricted annotation refused",
            vec![RAM_ROLE],
            Labels::Known(&tenant),
            Some(&scope),
            &loaded,
            &not_allowed_role,
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
        let verdict = judge(annotations, "team-x", labels, scope, policy);
        assert!(expected(&verdict), "{what}: got {verdict:?}");
    }
}

#[test]
fn an_empty_scope_selects_every_namespace() {
    let everyone = Written::parse("").expect("valid");
    let verdict = judge(
        [],
        "x",
        Labels::Unknown,
        Some(&everyone),
        &Policy::Unrestricted,
    );
    assert_eq!(verdict, Verdict::Allowed);
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
