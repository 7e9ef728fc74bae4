//! The Helm chart (`charts/virtual-node-eci`) is the kustomize install in Helm's form: with its
//! defaults (and the required cluster id, vSwitch and security group set to the aliyun
//! overlay's placeholders) `helm template` renders exactly the objects of
//! `kubectl kustomize deploy/overlays/aliyun`, Helm's own labels aside; `helm lint --strict` is
//! clean for the default and the mock values; values the daemon cannot honour are refused by
//! name; and on the real control plane the chart installs, `helm upgrade --set replicaCount=3`
//! gives three Ready virtual nodes, and `helm uninstall` leaves no virtual node, no Lease and
//! no ECI group. helm is built from its Go module like kubectl (integration/upstream/build.sh).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

#[path = "common/kustomize.rs"]
mod kustomize;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use integration::harness::deploy::{VIRTUAL_NODE_SELECTOR, is_ready};
use integration::harness::{ClusterKind, Harness, HarnessError};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

/// The labels Helm charts add (and kustomize manifests do not carry).
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
];

/// The annotations Helm reads (kustomize manifests do not carry them).
const HELM_ANNOTATIONS: [&str; 1] = ["helm.sh/resource-policy"];

/// The values without a default (the aliyun overlay's placeholders for them).
const REQUIRED: [&str; 3] = [
    "env.ALIYUN_CLUSTERID=REPLACE-WITH-YOUR-CLUSTER-ID",
    "env.ECI_VSWITCH=vsw-REPLACE-ME",
    "env.ECI_SECURITY_GROUP=sg-REPLACE-ME",
];

const WAIT: Duration = Duration::from_secs(300);

/// The fixture's Kubernetes, for `helm template` and `helm lint` (which otherwise assume the
/// version their client-go module speaks).
const KUBE_VERSION: &str = "v1.37.2";

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/virtual-node-eci")
}

/// The built helm (the build script runs once per test binary).
fn helm() -> PathBuf {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        integration::cluster::upstream::locate_binary_blocking("helm", "helm")
            .unwrap_or_else(|e| panic!("helm (integration/upstream/build.sh helm): {e}"))
    })
    .clone()
}

/// `helm ARGS` in a scratch home (no user configuration or repositories involved).
fn run_helm(args: &[&str]) -> std::process::Output {
    let home = tempfile::tempdir().unwrap();
    std::process::Command::new(helm())
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("helm runs")
}

/// `helm template` of the chart as release `virtual-node-eci` in kube-system, CRDs included.
fn template(sets: &[&str]) -> Result<Vec<Value>, String> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        "virtual-node-eci",
        chart.to_str().unwrap(),
        "--namespace",
        "kube-system",
        "--include-crds",
        "--kube-version",
        KUBE_VERSION,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    let output = run_helm(&args);
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let text = String::from_utf8(output.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("helm prints YAML");
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn key(object: &Value) -> String {
    format!(
        "{}/{}/{}",
        object["kind"].as_str().unwrap_or_default(),
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// `object` without Helm's labels (in its metadata and its pod template's) and with numbers
/// as YAML readers disagree about them (1 vs 1.0) made integers.
fn comparable(value: &Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => value.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(comparable).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("labels", Value::Object(labels)) => without(labels, &HELM_LABELS),
                        ("annotations", Value::Object(notes)) => without(notes, &HELM_ANNOTATIONS),
                        _ => comparable(v),
                    };
                    (k.clone(), v)
                })
                .filter(|(k, v)| !(k == "annotations" && v == &json!({})))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn without(map: &serde_json::Map<String, Value>, keys: &[&str]) -> Value {
    Value::Object(
        map.iter()
            .filter(|(k, _)| !keys.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

fn by_key(objects: &[Value]) -> BTreeMap<String, Value> {
    objects.iter().map(|o| (key(o), comparable(o))).collect()
}

#[test]
fn the_default_chart_renders_the_aliyun_overlay() {
    let chart = by_key(&template(&REQUIRED).unwrap());
    let overlay = by_key(&kustomize::overlay("aliyun"));
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        overlay.keys().collect::<Vec<_>>(),
        "helm template and kubectl kustomize deploy/overlays/aliyun list different objects"
    );
    for (name, object) in &chart {
        assert!(
            object == &overlay[name],
            "{name} differs:\nchart:   {}\noverlay: {}",
            serde_json::to_string(object).unwrap(),
            serde_json::to_string(&overlay[name]).unwrap()
        );
    }
    // Helm's labels are there (they are what the comparison leaves out).
    let set = template(&REQUIRED)
        .unwrap()
        .into_iter()
        .find(|o| o["kind"] == "StatefulSet")
        .unwrap();
    assert_eq!(
        set["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "Helm"
    );
}

#[test]
fn helm_lint_is_clean_for_the_default_and_the_mock_values() {
    let chart = chart_dir();
    let mut default = vec![
        "lint",
        "--strict",
        "--kube-version",
        KUBE_VERSION,
        chart.to_str().unwrap(),
    ];
    for set in REQUIRED {
        default.extend(["--set", set]);
    }
    let mock_values = chart.join("values-mock.yaml");
    let mock = vec![
        "lint",
        "--strict",
        "--kube-version",
        KUBE_VERSION,
        chart.to_str().unwrap(),
        "-f",
        mock_values.to_str().unwrap(),
    ];
    for args in [default, mock] {
        let output = run_helm(&args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("0 chart(s) failed"),
            "helm {}: {stdout}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            !stdout.contains("[WARNING]") && !stdout.contains("[ERROR]"),
            "helm {}: {stdout}",
            args.join(" ")
        );
    }
}

#[test]
fn values_the_daemon_cannot_honour_are_refused_by_name() {
    let with = |extra: &[&str]| {
        let mut sets: Vec<&str> = REQUIRED.to_vec();
        sets.extend(extra);
        template(&sets)
    };
    for (what, sets, expected) in [
        ("no cluster id", vec![], "env.ALIYUN_CLUSTERID is required"),
        (
            "no vSwitch",
            vec!["env.ALIYUN_CLUSTERID=c1", "env.ECI_SECURITY_GROUP=sg-1"],
            "env.ECI_VSWITCH is required",
        ),
    ] {
        let error = template(&sets).expect_err(what);
        assert!(error.contains(expected), "{what}: {error}");
    }
    for (what, extra, expected) in [
        (
            "a VPC",
            &["env.ECI_VPC=vpc-1"][..],
            "env.ECI_VPC is not used",
        ),
        (
            "a resource group",
            &["env.ALIYUN_RESOURCEGROUP_ID=rg-1"],
            "env.ALIYUN_RESOURCEGROUP_ID is not supported",
        ),
        (
            "half an AccessKey",
            &["env.ECI_ACCESS_KEY=LTAI"],
            "without env.ECI_SECRET_KEY",
        ),
        (
            "an unknown certificate source",
            &["webhook.certificate=vault"],
            "webhook.certificate is one of",
        ),
        (
            "cert-manager without an issuer",
            &["webhook.certificate=certManager"],
            "certManager.issuerRef.name",
        ),
    ] {
        let error = with(extra).expect_err(what);
        assert!(error.contains(expected), "{what}: {error}");
    }
    // The mock values need no real ECI settings, only the cluster id.
    assert!(template(&["mockEci.enabled=true"]).is_err());
    let mock = template(&["mockEci.enabled=true", "env.ALIYUN_CLUSTERID=c1"]).unwrap();
    let config = mock
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "virtual-node-eci-config")
        .unwrap();
    assert_eq!(
        config["data"]["ECI_BACKEND"],
        "grpc://mock-eci.kube-system.svc:50051"
    );
    assert_eq!(config["data"]["ECI_CLUSTER_NAME"], "c1");
    // mock-eci is plaintext; only the mock values allow it.
    assert_eq!(config["data"]["ECI_ALLOW_INSECURE_ENDPOINT"], "true");
    assert!(
        mock.iter()
            .any(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "mock-eci")
    );
}

#[test]
fn the_ack_virtual_node_spellings_and_the_options_render() {
    let mut sets: Vec<&str> = REQUIRED.to_vec();
    sets.extend([
        "virtualNode.image.repository=registry.example/vne",
        "virtualNode.image.tag=1.2.3",
        "env.ECI_ACCESS_KEY=LTAIexample",
        "env.ECI_SECRET_KEY=secret",
        "replicaCount=3",
        "metrics.readOnlyPort=true",
        "metrics.podMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        "webhook.certificate=certManager",
        "certManager.issuerRef.name=ca",
        "drainTimeout=10m",
        "nodeLabels.team=platform",
        "nodeLabels.node\\.kubernetes\\.io/pool=eci",
        "webhook.callers={kube-apiserver-kubelet-client,webhook-caller}",
    ]);
    let objects = template(&sets).unwrap();
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name} rendered"))
    };
    let set = find("StatefulSet", "virtual-node-eci");
    assert_eq!(set["spec"]["replicas"], 3);
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], "registry.example/vne:1.2.3");
    let env = pod["containers"][0]["env"].as_array().unwrap();
    assert!(
        env.iter().any(|e| e["name"] == "NODE_LABELS"
            && e["value"] == "node.kubernetes.io/pool=eci,team=platform"),
        "nodeLabels become NODE_LABELS, sorted"
    );
    assert!(
        env.iter().any(|e| e["name"] == "WEBHOOK_CALLERS"
            && e["value"] == "kube-apiserver-kubelet-client,webhook-caller"),
        "webhook.callers become WEBHOOK_CALLERS"
    );
    assert_eq!(pod["terminationGracePeriodSeconds"], 660);
    let secret = find("Secret", "virtual-node-eci-credentials");
    assert_eq!(secret["stringData"]["ECI_ACCESS_KEY"], "LTAIexample");
    find("PodMonitor", "virtual-node-eci");
    find("PrometheusRule", "virtual-node-eci");
    let certificate = find("Certificate", "virtual-node-eci-webhook");
    let secret_name = certificate["spec"]["secretName"].as_str().unwrap();
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == secret_name),
        "the cert-manager Secret is mounted"
    );
}

#[test]
fn the_annotation_policy_is_restricted_by_default_and_open_by_choice() {
    let render = |extra: &[&str]| {
        let mut sets: Vec<&str> = REQUIRED.to_vec();
        sets.extend(extra);
        template(&sets)
    };
    let find = |objects: &[Value], kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .cloned()
    };
    let default = render(&[]).unwrap();
    let policy = find(&default, "ConfigMap", "eci-annotation-policy").expect("a policy by default");
    let trusted = "eci.aliyun.com/trusted=true";
    for restricted in [
        "eci-ram-role-name",
        "eci-security-group",
        "acr-service-arns",
        "oversized-specs",
    ] {
        assert_eq!(policy["data"][restricted], trusted, "{restricted}");
    }
    assert_eq!(policy["data"]["eci-spot-strategy"], "all");
    let config = find(&default, "ConfigMap", "virtual-node-eci-config").unwrap();
    assert_eq!(
        config["data"]["ANNOTATION_POLICY_CONFIGMAP"],
        "eci-annotation-policy"
    );

    let open = render(&["annotationPolicy=open"]).unwrap();
    assert!(
        find(&open, "ConfigMap", "eci-annotation-policy").is_none(),
        "open: no policy"
    );
    let config = find(&open, "ConfigMap", "virtual-node-eci-config").unwrap();
    assert!(
        config["data"].get("ANNOTATION_POLICY_CONFIGMAP").is_none(),
        "open: none named"
    );

    let more = render(&[
        "annotationPolicyRules.tag\\.cost-centre=team=platform",
        "annotationPolicyRules.eci-vswitch=all",
    ])
    .unwrap();
    let policy = find(&more, "ConfigMap", "eci-annotation-policy").unwrap();
    assert_eq!(policy["data"]["tag.cost-centre"], "team=platform");
    assert_eq!(policy["data"]["eci-vswitch"], "all");
    assert_eq!(
        policy["data"]["eci-ram-role-name"], trusted,
        "the rest stays"
    );

    for (what, extra, expected) in [
        (
            "an unknown policy",
            &["annotationPolicy=closed"][..],
            "annotationPolicy is one of",
        ),
        (
            "rules without a policy",
            &[
                "annotationPolicy=open",
                "annotationPolicyRules.eci-vswitch=all",
            ],
            "annotationPolicyRules needs annotationPolicy=restricted",
        ),
    ] {
        let error = render(extra).expect_err(what);
        assert!(error.contains(expected), "{what}: {error}");
    }
}

/// `helm ARGS --kubeconfig …` against the harness's cluster.
async fn helm_on(h: &Harness, args: &[&str]) -> Result<String, HarnessError> {
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    args.extend(["--kubeconfig".into(), h.kubeconfig().display().to_string()]);
    let helm = helm();
    let home = h.dir().join("helm-home");
    let output = tokio::process::Command::new(helm)
        .args(&args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .await
        .map_err(|source| HarnessError::Io {
            what: "run helm".into(),
            source,
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(HarnessError::Setup(format!(
            "helm {} failed: {text}",
            args.join(" ")
        )))
    }
}

async fn virtual_nodes(h: &Harness) -> Vec<Node> {
    Api::<Node>::all(h.client())
        .list(&ListParams::default().labels(VIRTUAL_NODE_SELECTOR))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

async fn node_leases(h: &Harness) -> Vec<String> {
    Api::<Lease>::namespaced(h.client(), "kube-node-lease")
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .filter(|name| name.starts_with("virtual-node-eci-"))
        .collect()
}

/// mock-eci's groups that are not deleted.
async fn live_groups(admin: &str) -> Option<usize> {
    let value: Value = reqwest::get(format!("{admin}/admin/groups"))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let groups = value
        .as_array()
        .cloned()
        .or_else(|| value["groups"].as_array().cloned())?;
    Some(
        groups
            .iter()
            .filter(|g| {
                !matches!(
                    g["status"].as_str(),
                    Some("Deleted" | "Deleting" | "Expired")
                )
            })
            .count(),
    )
}

async fn wait_ready_nodes(h: &Harness, count: usize) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("{count} Ready virtual nodes"),
        WAIT,
        |h| async move {
            let nodes = virtual_nodes(h).await;
            nodes.len() == count && nodes.iter().all(is_ready)
        },
    )
    .await
}

/// The chart's values for the fixture: the mock values, pods on the fixture's host node with
/// listeners on their own loopback address, and ECI = the harness's mock-eci (which outlives
/// the release, so the test can see that uninstalling deletes every group).
fn fixture_values(h: &Harness, grpc: &str) -> Value {
    let host = "virtual-node-eci.aliyun.com/host-agent";
    let mut extra_env = vec![
        json!({"name": "ECI_BACKEND", "value": format!("grpc://{}", grpc.trim_start_matches("http://"))}),
        // The harness's mock-eci speaks plain gRPC on loopback.
        json!({"name": "ECI_ALLOW_INSECURE_ENDPOINT", "value": "true"}),
        json!({"name": "RUST_LOG", "value": "info"}),
        // The test's pod has no controller: evict it on the drain instead of waiting for it.
        json!({"name": "DRAIN_EVICT_UNMANAGED_PODS", "value": "true"}),
    ];
    extra_env.extend(
        h.placement_env()
            .into_iter()
            .map(|(name, value)| json!({"name": name, "value": value})),
    );
    json!({
        "mockEci": {"enabled": false},
        "env": {"ALIYUN_CLUSTERID": "helm-e2e", "ECI_VSWITCH": "vsw-e2e", "ECI_SECURITY_GROUP": "sg-e2e"},
        "listenAddress": "$(POD_IP)",
        "nodeSelector": {host: "true"},
        "tolerations": [{"key": host, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        "drainTimeout": "1m",
        "extraEnv": extra_env,
    })
}

/// `kubectl ARGS` against the harness's cluster.
async fn kubectl(h: &Harness, args: &[&str]) -> Result<String, HarnessError> {
    let output = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(args)
        .output()
        .await
        .map_err(|source| HarnessError::Io {
            what: "run kubectl".into(),
            source,
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(HarnessError::Setup(format!(
            "kubectl {} failed: {text}",
            args.join(" ")
        )))
    }
}

/// The fixture applied deploy/base's ServiceAccount and RBAC (as a kustomize install has
/// them): hand them to the release the way docs/install.md tells kustomize users moving to
/// the chart, or Helm refuses to take over objects it did not create.
async fn adopt_kustomize_rbac(h: &Harness) -> Result<(), HarnessError> {
    for (namespace, objects) in [
        (
            Some("kube-system"),
            &[
                "serviceaccount/virtual-node-eci",
                "role.rbac.authorization.k8s.io/virtual-node-eci",
                "rolebinding.rbac.authorization.k8s.io/virtual-node-eci",
            ][..],
        ),
        (
            Some("kube-node-lease"),
            &[
                "role.rbac.authorization.k8s.io/virtual-node-eci",
                "rolebinding.rbac.authorization.k8s.io/virtual-node-eci",
            ],
        ),
        (
            None,
            &[
                "clusterrole.rbac.authorization.k8s.io/virtual-node-eci",
                "clusterrolebinding.rbac.authorization.k8s.io/virtual-node-eci",
            ],
        ),
    ] {
        let namespace: Vec<&str> = namespace.map(|n| vec!["-n", n]).unwrap_or_default();
        let mut annotate = vec!["annotate", "--overwrite"];
        annotate.extend(objects);
        annotate.extend([
            "meta.helm.sh/release-name=virtual-node-eci",
            "meta.helm.sh/release-namespace=kube-system",
        ]);
        annotate.extend(&namespace);
        kubectl(h, &annotate).await?;
        let mut label = vec!["label", "--overwrite"];
        label.extend(objects);
        label.push("app.kubernetes.io/managed-by=Helm");
        label.extend(&namespace);
        kubectl(h, &label).await?;
    }
    Ok(())
}

async fn install_scale_uninstall(h: &mut Harness) -> Result<(), HarnessError> {
    let mock = h.start_mock_eci(&[]).await?;
    adopt_kustomize_rbac(h).await?;
    let values = h.dir().join("fixture-values.yaml");
    // JSON is YAML.
    std::fs::write(&values, fixture_values(h, &mock.grpc).to_string()).unwrap();
    let chart = chart_dir();
    let (chart, values) = (chart.to_str().unwrap(), values.to_str().unwrap());
    let mock_values = chart_dir().join("values-mock.yaml");
    let release = [
        "virtual-node-eci",
        chart,
        "--namespace",
        "kube-system",
        "-f",
        mock_values.to_str().unwrap(),
        "-f",
        values,
    ];

    let mut install = vec!["install"];
    install.extend(release);
    helm_on(h, &install).await?;
    wait_ready_nodes(h, 1).await?;

    let mut upgrade = vec!["upgrade"];
    upgrade.extend(release);
    upgrade.extend([
        "--set",
        "replicaCount=3",
        "--set",
        "nodeLabels.team=platform",
    ]);
    helm_on(h, &upgrade).await?;
    wait_ready_nodes(h, 3).await?;
    h.wait_for(
        "every virtual node carries nodeLabels",
        WAIT,
        |h| async move {
            let nodes = virtual_nodes(h).await;
            nodes.len() == 3
                && nodes.iter().all(|n| {
                    n.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("team"))
                        .map(String::as_str)
                        == Some("platform")
                })
        },
    )
    .await?;
    let names: Vec<String> = virtual_nodes(h)
        .await
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(
        names,
        [
            "virtual-node-eci-0",
            "virtual-node-eci-1",
            "virtual-node-eci-2"
        ]
    );
    assert_eq!(node_leases(h).await.len(), 3, "a Lease per node");
    // The nodes report a kubelet of the control plane's version (the fixture runs v1.37.2).
    for node in virtual_nodes(h).await {
        let version = node
            .status
            .and_then(|s| s.node_info)
            .map(|i| i.kubelet_version);
        assert!(
            version
                .as_deref()
                .is_some_and(|v| v.starts_with("v1.37.2-virtual-node-eci-")),
            "kubeletVersion {version:?}"
        );
    }

    // A pod on a virtual node, so uninstalling has an ECI group to clean up.
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "helm-e2e", "namespace": "default"},
        "spec": {
            "nodeName": "virtual-node-eci-1",
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Exists"}],
            "containers": [{"name": "app", "image": "nginx"}],
        },
    });
    let pod_file = h.dir().join("pod.yaml");
    std::fs::write(&pod_file, pod.to_string()).unwrap();
    kubectl(h, &["apply", "-f", pod_file.to_str().unwrap()]).await?;
    let admin = mock.admin.clone();
    h.wait_for("the pod's ECI group", WAIT, |_| {
        let admin = admin.clone();
        async move { live_groups(&admin).await == Some(1) }
    })
    .await?;

    helm_on(
        h,
        &[
            "uninstall",
            "virtual-node-eci",
            "--namespace",
            "kube-system",
            "--wait",
            "--timeout",
            "5m",
        ],
    )
    .await?;
    h.wait_for("no virtual node, Lease or ECI group", WAIT, |h| {
        let admin = admin.clone();
        async move {
            virtual_nodes(h).await.is_empty()
                && node_leases(h).await.is_empty()
                && live_groups(&admin).await == Some(0)
        }
    })
    .await?;
    // The release is gone; what it keeps on purpose (the CRDs, as Helm does, and the identity
    // the replicas drained with) is still there.
    let left = helm_on(h, &["list", "--all", "--namespace", "kube-system"]).await?;
    assert!(!left.contains("virtual-node-eci"), "{left}");
    kubectl(
        h,
        &[
            "-n",
            "kube-system",
            "get",
            "serviceaccount",
            "virtual-node-eci",
        ],
    )
    .await?;
    let gone = kubectl(
        h,
        &[
            "-n",
            "kube-system",
            "get",
            "statefulset,service,configmap",
            "-l",
            "app.kubernetes.io/name=virtual-node-eci",
            "-o",
            "name",
        ],
    )
    .await?;
    assert!(
        gone.trim().is_empty() || gone.contains("No resources"),
        "left behind: {gone}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_scales_and_uninstalls_on_the_real_control_plane() {
    let mut h = Harness::start().await.unwrap();
    assert!(
        h.kind() == ClusterKind::Fixture,
        "installs into the fixture's cluster only; it would install into a real one"
    );
    let result = install_scale_uninstall(&mut h).await;
    h.finish(result).await;
}
