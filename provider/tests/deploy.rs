//! The manifests under `deploy/` are part of the product: every overlay renders with kubectl
//! (the one built from the fixture's Kubernetes release), every object parses into its typed
//! Kubernetes structure without unknown fields, the cross-references hold (selectors, ports,
//! paths, flags, names), the RBAC equals the accesses the code declares
//! (`virtual_node_eci::k8s::access`), the local overlay changes only where the pods run and where they
//! listen, and the mock overlay applies to a real API server (strict server-side validation,
//! the CRD's schema) and reads back as written.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

#[path = "common/kustomize.rs"]
mod kustomize;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use clap::CommandFactory;
use integration::harness::{ClusterKind, Harness};
use kustomize::deploy_dir;
use serde_json::{Value, json};
use virtual_node_eci::app::rbac;
use virtual_node_eci::config::Config;
use virtual_node_eci::k8s::access::Scope;

/// The label and taint of the fixture's host node, where the local overlay puts its pods.
const HOST_AGENT: &str = "virtual-node-eci.aliyun.com/host-agent";

/// The label the elected replica puts on its own pod (`placement::LEADER_LABEL`): the
/// extender's Service selects it on top of the pod template's labels.
const PLACEMENT_LEADER_LABEL: &str = "placement.virtual-node-eci.aliyun.com/leader";
/// The extender's Service.
const PLACEMENT_SERVICE: &str = "virtual-node-eci-placement";

/// Whether a kustomization only lists resources (no patches or transformers), so reading its
/// files is what kustomize produces.
fn is_plain(dir: &Path) -> bool {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let kustomization: Value = serde_saphyr::from_str(&text).unwrap();
    kustomization
        .as_object()
        .unwrap()
        .keys()
        .all(|k| ["apiVersion", "kind", "resources"].contains(&k.as_str()))
}

/// The objects of a plain kustomization ([`is_plain`]), read the simple way: its `resources`,
/// files or directories (what kustomize produces when there is nothing else).
fn read_kustomization(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let kustomization: Value = serde_saphyr::from_str(&text).unwrap();
    let keys: BTreeSet<&str> = kustomization
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert!(
        keys.is_subset(&BTreeSet::from(["apiVersion", "kind", "resources"])),
        "{}: only plain resources are used, found {keys:?}",
        dir.display()
    );
    let mut objects = Vec::new();
    for resource in kustomization["resources"].as_array().unwrap() {
        let path = dir.join(resource.as_str().unwrap());
        if path.is_dir() {
            objects.extend(read_kustomization(&path));
        } else {
            let text = std::fs::read_to_string(&path).unwrap();
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
            objects.extend(docs.into_iter().filter(|d| !d.is_null()));
        }
    }
    objects
}

fn key(object: &Value) -> String {
    format!(
        "{}/{}/{}",
        object["kind"].as_str().unwrap_or_default(),
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Renders an overlay with kubectl; a plain one is also checked against reading its files.
fn render(overlay: &str) -> Vec<Value> {
    let dir = deploy_dir().join("overlays").join(overlay);
    let docs = kustomize::kustomize(&dir);
    if is_plain(&dir) {
        let plain = read_kustomization(&dir);
        let by_key = |objects: &[Value]| -> BTreeMap<String, Value> {
            objects.iter().map(|o| (key(o), normalized(o))).collect()
        };
        let (rendered, read) = (by_key(&docs), by_key(&plain));
        assert_eq!(
            rendered.keys().collect::<Vec<_>>(),
            read.keys().collect::<Vec<_>>(),
            "kubectl kustomize and the plain read of {overlay} list different objects"
        );
        for (name, object) in &rendered {
            assert!(
                object == &read[name],
                "kubectl kustomize and the plain read of {overlay} differ in {name}"
            );
        }
    }
    docs
}

/// Numbers as YAML readers disagree about them (1 vs 1.0): integral values as integers.
fn normalized(value: &Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => value.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(normalized).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), normalized(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Fields of `original` that the typed round trip lost: unknown fields.
fn lost_fields(original: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => lost_fields(v, w, &format!("{path}.{k}"), out),
                    None if v.is_null() => {}
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                lost_fields(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn typed_round_trip(object: &Value) -> Result<Value, String> {
    use k8s_openapi::api::{apps, core, flowcontrol, policy, rbac};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    fn via<T: serde::de::DeserializeOwned + serde::Serialize>(
        object: &Value,
    ) -> Result<Value, String> {
        let typed: T = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
        Ok(serde_json::to_value(typed).unwrap())
    }
    match object["kind"].as_str().unwrap_or_default() {
        "CustomResourceDefinition" => via::<CustomResourceDefinition>(object),
        "ServiceAccount" => via::<core::v1::ServiceAccount>(object),
        "ConfigMap" => via::<core::v1::ConfigMap>(object),
        "Service" => via::<core::v1::Service>(object),
        "ClusterRole" => via::<rbac::v1::ClusterRole>(object),
        "ClusterRoleBinding" => via::<rbac::v1::ClusterRoleBinding>(object),
        "Role" => via::<rbac::v1::Role>(object),
        "RoleBinding" => via::<rbac::v1::RoleBinding>(object),
        "StatefulSet" => via::<apps::v1::StatefulSet>(object),
        "Deployment" => via::<apps::v1::Deployment>(object),
        "PodDisruptionBudget" => via::<policy::v1::PodDisruptionBudget>(object),
        "FlowSchema" => via::<flowcontrol::v1::FlowSchema>(object),
        "PriorityLevelConfiguration" => via::<flowcontrol::v1::PriorityLevelConfiguration>(object),
        other => Err(format!("unexpected kind {other:?}")),
    }
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn selector_matches(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

fn port_of(addr: &str) -> u64 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

fn container_port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
        .as_u64()
        .unwrap()
}

/// Expands `$(VAR)` references to variables in `defined` as the kubelet does (`$$` is a
/// literal `$`); answers the names referred to that are not defined.
fn expand(value: &str, defined: &BTreeMap<String, String>) -> (String, Vec<String>) {
    let (mut out, mut undefined) = (String::new(), Vec::new());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        match after.strip_prefix('(').and_then(|inner| {
            inner
                .find(')')
                .map(|end| (&inner[..end], &inner[end + 1..]))
        }) {
            Some((name, tail)) => {
                match defined.get(name) {
                    Some(value) => out.push_str(value),
                    None => {
                        out.push_str(&format!("$({name})"));
                        undefined.push(name.to_owned());
                    }
                }
                rest = tail;
            }
            None => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    (out, undefined)
}

/// A container's environment as the kubelet builds it: `envFrom` first, then `env` in order,
/// each value's `$(VAR)` references expanded from the variables before it (a reference to one
/// not defined before is a mistake: it would stay literal). Field references get the values of
/// replica `virtual-node-eci-0` at 10.0.0.7.
fn container_env(objects: &[Value], container: &Value) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for source in container["envFrom"].as_array().into_iter().flatten() {
        if let Some(name) = source["configMapRef"]["name"].as_str() {
            let map = find(objects, "ConfigMap", name);
            for (k, v) in map["data"].as_object().unwrap() {
                env.insert(k.clone(), v.as_str().unwrap().to_owned());
            }
        }
    }
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap().to_owned();
        let value = match var["value"].as_str() {
            Some(value) => {
                let (expanded, undefined) = expand(value, &env);
                assert!(
                    undefined.is_empty(),
                    "{name}={value} refers to {undefined:?}, not defined before it"
                );
                expanded
            }
            None if var["valueFrom"]["resourceFieldRef"].is_object() => {
                resource_field(container, &var["valueFrom"]["resourceFieldRef"])
            }
            None => match var["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap() {
                "metadata.name" => "virtual-node-eci-0".into(),
                "metadata.namespace" => "kube-system".into(),
                "status.podIP" => "10.0.0.7".into(),
                other => panic!("unexpected fieldRef {other}"),
            },
        };
        env.insert(name, value);
    }
    env
}

/// A `resourceFieldRef` of the daemon's own container, resolved as the kubelet resolves it.
fn resource_field(container: &Value, field: &Value) -> String {
    assert_eq!(field["containerName"], container["name"], "{field}");
    let typed: k8s_openapi::api::core::v1::Container =
        serde_json::from_value(container.clone()).unwrap();
    vne_core::downward::resource(
        &typed,
        field["resource"].as_str().unwrap(),
        field["divisor"].as_str(),
        |_, _| panic!("{field} reads a resource the container does not set"),
    )
    .unwrap()
}

fn env_value(objects: &[Value], container: &Value, name: &str) -> String {
    container_env(objects, container)
        .remove(name)
        .unwrap_or_else(|| panic!("no {name} in the environment"))
}

/// The daemon's configuration as the manifest gives it, parsed by the daemon's own parser.
fn daemon_config(objects: &[Value], container: &Value) -> Config {
    let env = container_env(objects, container);
    let command = Config::command();
    let mut args = vec!["virtual-node-eci".to_owned()];
    for (name, value) in &env {
        let arg = command
            .get_arguments()
            .find(|a| a.get_env().and_then(|e| e.to_str()) == Some(name.as_str()))
            .unwrap_or_else(|| panic!("the manifest sets {name}, which the daemon does not read"));
        let long = arg.get_long().unwrap();
        if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
            if value == "true" {
                args.push(format!("--{long}"));
            }
        } else {
            args.push(format!("--{long}={value}"));
        }
    }
    Config::try_parse_from_args(&args)
}

trait ParseArgs {
    fn try_parse_from_args(args: &[String]) -> Self;
}

impl ParseArgs for Config {
    fn try_parse_from_args(args: &[String]) -> Self {
        use clap::Parser;
        Config::try_parse_from(args)
            .unwrap_or_else(|e| panic!("the manifest's flags do not parse: {e}"))
    }
}

/// The (scope, group, resource, verb) grants of the manifests' RBAC for the daemon's account.
fn granted(objects: &[Value]) -> BTreeSet<(Scope, String, String, String)> {
    let mut out = BTreeSet::new();
    let bound = |binding: &Value| {
        binding["subjects"].as_array().unwrap().iter().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == "virtual-node-eci"
                && s["namespace"] == "kube-system"
        })
    };
    for binding in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
    {
        assert!(bound(binding), "{} binds someone else", key(binding));
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        let role = find(
            objects,
            role_kind,
            binding["roleRef"]["name"].as_str().unwrap(),
        );
        let role = if role_kind == "Role" {
            objects
                .iter()
                .find(|o| {
                    o["kind"] == "Role"
                        && o["metadata"]["name"] == binding["roleRef"]["name"]
                        && o["metadata"]["namespace"] == binding["metadata"]["namespace"]
                })
                .unwrap_or_else(|| {
                    panic!("{} names a Role that is not in its namespace", key(binding))
                })
        } else {
            role
        };
        let scope = match binding["metadata"]["namespace"].as_str() {
            None => Scope::Cluster,
            Some("kube-system") => Scope::OwnNamespace,
            Some("kube-node-lease") => Scope::NodeLeases,
            Some(other) => panic!("a RoleBinding in {other}"),
        };
        for rule in role["rules"].as_array().unwrap() {
            assert!(rule.get("resourceNames").is_none());
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        let verb = verb.as_str().unwrap();
                        assert_ne!(verb, "*", "no wildcards");
                        assert_ne!(resource, "*", "no wildcards");
                        out.insert((
                            scope,
                            group.as_str().unwrap().to_owned(),
                            resource.as_str().unwrap().to_owned(),
                            verb.to_owned(),
                        ));
                    }
                }
            }
        }
    }
    out
}

fn check_overlay(overlay: &str) -> Vec<Value> {
    let objects = render(overlay);
    // Typed, nothing unknown.
    for object in &objects {
        let typed = typed_round_trip(object).unwrap_or_else(|e| panic!("{}: {e}", key(object)));
        let mut lost = Vec::new();
        lost_fields(object, &typed, "", &mut lost);
        assert!(lost.is_empty(), "{}: unknown fields {lost:?}", key(object));
        let namespaced = !matches!(
            object["kind"].as_str().unwrap(),
            "CustomResourceDefinition"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "FlowSchema"
                | "PriorityLevelConfiguration"
        );
        if namespaced {
            assert!(
                object["metadata"]["namespace"].is_string(),
                "{} has no namespace",
                key(object)
            );
        }
    }
    let set = find(&objects, "StatefulSet", "virtual-node-eci");
    let template = &set["spec"]["template"];
    let labels = &template["metadata"]["labels"];
    let container = &template["spec"]["containers"][0];
    let config = daemon_config(&objects, container);
    assert_eq!(
        config.ops.worker_threads, 1,
        "{overlay}: the CPU request (100m) rounds up to one worker thread"
    );
    let settings = config
        .clone()
        .settings()
        .unwrap_or_else(|e| panic!("{overlay}: {e}"));

    // Selectors.
    assert!(selector_matches(
        &set["spec"]["selector"]["matchLabels"],
        labels
    ));
    assert_eq!(
        labels["app.kubernetes.io/name"], "virtual-node-eci",
        "keeps the daemon's pods from its own webhook"
    );
    for service in objects.iter().filter(|o| {
        o["kind"] == "Service"
            && o["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("virtual-node-eci")
    }) {
        let mut selector = service["spec"]["selector"].clone();
        let leader = selector
            .as_object_mut()
            .unwrap()
            .remove(PLACEMENT_LEADER_LABEL);
        assert_eq!(
            leader.is_some(),
            service["metadata"]["name"] == PLACEMENT_SERVICE,
            "{}: only the extender's Service selects the elected replica",
            key(service)
        );
        assert!(
            leader.is_none_or(|value| value == "true"),
            "{}",
            key(service)
        );
        assert!(selector_matches(&selector, labels), "{}", key(service));
        for port in service["spec"]["ports"].as_array().unwrap() {
            container_port(container, port["targetPort"].as_str().unwrap());
        }
    }
    let pdb = find(&objects, "PodDisruptionBudget", "virtual-node-eci");
    assert!(selector_matches(
        &pdb["spec"]["selector"]["matchLabels"],
        labels
    ));
    find(
        &objects,
        "Service",
        set["spec"]["serviceName"].as_str().unwrap(),
    );

    // Ports and paths against the flags.
    let webhook = find(&objects, "Service", &config.site.webhook_service);
    assert_eq!(
        webhook["spec"]["ports"][0]["port"].as_u64(),
        Some(u64::from(config.admission.webhook_service_port))
    );
    assert_eq!(webhook["spec"]["ports"][0]["targetPort"], "webhook");
    assert_eq!(
        container_port(container, "webhook"),
        u64::from(config.admission.webhook_addr.port())
    );
    // The probes have a port of their own; the read-only port is off unless opted in.
    assert_eq!(
        container_port(container, "health"),
        u64::from(config.ops.health_addr.expect("HEALTH_ADDR is set").port())
    );
    assert_eq!(config.ops.metrics_addr, None, "the read-only port is off");
    assert_eq!(
        container_port(container, "kubelet"),
        u64::from(config.site.kubelet_port)
    );
    assert!(config.admission.webhook_enabled);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "health");
    }
    let grace = template["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert!(
        Duration::from_secs(grace) >= config.fleet.drain_timeout + Duration::from_secs(30),
        "terminationGracePeriodSeconds {grace} leaves no room for DRAIN_TIMEOUT {:?}",
        config.fleet.drain_timeout
    );
    // Never on a virtual node.
    let terms = &template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert!(terms.as_array().unwrap().iter().all(|t| {
        t["matchExpressions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["key"] == "k8s.aliyun.com/vnode" && e["operator"] == "NotIn")
    }));
    // Hardened.
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(template["spec"]["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        template["spec"]["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );

    // The account, and its permissions: exactly what the code declares.
    find(
        &objects,
        "ServiceAccount",
        template["spec"]["serviceAccountName"].as_str().unwrap(),
    );
    let granted = granted(&objects);
    let required: BTreeSet<(Scope, String, String, String)> = rbac::required()
        .into_iter()
        .map(|(s, g, r, v)| (s, g.to_owned(), r.to_owned(), v.to_owned()))
        .collect();
    let missing: Vec<_> = required.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&required).collect();
    assert!(missing.is_empty(), "{overlay}: RBAC misses {missing:?}");
    assert!(
        extra.is_empty(),
        "{overlay}: RBAC grants more than the code uses: {extra:?}"
    );

    // The CRD is the generated one.
    let crd = find(
        &objects,
        "CustomResourceDefinition",
        "selectors.eci.aliyun.com",
    );
    assert_eq!(
        normalized(crd),
        normalized(&vne_core::selector::crd::crd_json())
    );
    let crd = find(
        &objects,
        "CustomResourceDefinition",
        "imagecaches.eci.alibabacloud.com",
    );
    assert_eq!(
        normalized(crd),
        normalized(&virtual_node_eci::imagecache::resource::crd_json())
    );
    eprintln!(
        "{overlay}: {} objects, node {}, backend {:?}",
        objects.len(),
        settings.site.node_name,
        settings.site.backend
    );
    objects
}

/// mock-eci's Deployment and Service agree with each other and with the daemon's backend.
fn check_mock_eci(objects: &[Value]) {
    let config = find(objects, "ConfigMap", "virtual-node-eci-config");
    let backend = config["data"]["ECI_BACKEND"].as_str().unwrap();
    let address = backend.strip_prefix("grpc://").unwrap();
    let (host, port) = address.rsplit_once(':').unwrap();
    let (service_name, namespace) = host
        .split_once('.')
        .map(|(s, rest)| (s, rest.split('.').next().unwrap()))
        .unwrap();
    let service = objects
        .iter()
        .find(|o| {
            o["kind"] == "Service"
                && o["metadata"]["name"] == service_name
                && o["metadata"]["namespace"] == namespace
        })
        .unwrap();
    let service_port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"].as_u64() == port.parse().ok())
        .unwrap();
    let deployment = find(objects, "Deployment", "mock-eci");
    let template = &deployment["spec"]["template"];
    assert!(selector_matches(
        &service["spec"]["selector"],
        &template["metadata"]["labels"]
    ));
    assert!(selector_matches(
        &deployment["spec"]["selector"]["matchLabels"],
        &template["metadata"]["labels"]
    ));
    let container = &template["spec"]["containers"][0];
    let grpc = container_port(container, service_port["targetPort"].as_str().unwrap());
    let listen = env_value(objects, container, "MOCK_ECI_LISTEN");
    assert_eq!(
        grpc,
        port_of(&listen),
        "mock-eci listens where the Service sends"
    );
    let admin = env_value(objects, container, "MOCK_ECI_ADMIN_LISTEN");
    assert_eq!(container_port(container, "admin"), port_of(&admin));
    let state = env_value(objects, container, "MOCK_ECI_STATE_FILE");
    let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
    assert!(
        state.starts_with(mount),
        "the state file is on a writable volume"
    );
}

#[test]
fn the_mock_overlay_is_consistent() {
    let objects = check_overlay("mock");
    check_mock_eci(&objects);
}

#[test]
fn the_local_overlay_is_consistent_and_only_moves_the_pods_to_the_host_node() {
    let local = check_overlay("local");
    check_mock_eci(&local);
    let mock = render("mock");
    let keys = |objects: &[Value]| objects.iter().map(key).collect::<BTreeSet<_>>();
    assert_eq!(keys(&local), keys(&mock), "the same objects as mock");
    for object in &local {
        let original = mock.iter().find(|o| key(o) == key(object)).unwrap();
        let object = match object["kind"].as_str().unwrap() {
            "StatefulSet" | "Deployment" => unpatched_workload(object, original),
            _ => object.clone(),
        };
        assert!(
            normalized(&object) == normalized(original),
            "{}: the local overlay changes more than where the pods run and listen",
            key(&object)
        );
    }
}

/// A local overlay workload with what the overlay is for undone, after checking it: the pods
/// go to the host node (its label, its taint tolerated) and listen on their pod IP, not
/// 0.0.0.0 (the host agent's pods share the host's network: two on 0.0.0.0:PORT collide).
fn unpatched_workload(object: &Value, original: &Value) -> Value {
    let name = key(object);
    let mut object = object.clone();
    let spec = object["spec"]["template"]["spec"].as_object_mut().unwrap();
    assert_eq!(
        spec.remove("nodeSelector"),
        Some(json!({HOST_AGENT: "true"})),
        "{name} runs on the host node"
    );
    assert_eq!(
        spec.remove("tolerations"),
        Some(
            json!([{"key": HOST_AGENT, "operator": "Equal", "value": "true", "effect": "NoSchedule"}])
        ),
        "{name} tolerates the host node's taint"
    );
    let original_containers = original["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    for (i, container) in spec["containers"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        let original_env = original_containers[i]["env"].as_array().unwrap();
        let env = container["env"].as_array_mut().unwrap();
        if !original_env.iter().any(|v| v["name"] == "POD_IP") {
            let added = env.iter().position(|v| v["name"] == "POD_IP");
            let added = added.unwrap_or_else(|| panic!("{name}: no POD_IP"));
            assert_eq!(
                env.remove(added)["valueFrom"],
                json!({"fieldRef": {"fieldPath": "status.podIP"}})
            );
        }
        assert_eq!(env.len(), original_env.len(), "{name}: the same variables");
        for (var, original_var) in env.iter_mut().zip(original_env) {
            let value = var["value"].as_str().unwrap_or_default().to_owned();
            assert!(
                !value.starts_with("0.0.0.0:"),
                "{name}: {var} listens on every address of the host"
            );
            if var != original_var {
                let port = original_var["value"]
                    .as_str()
                    .and_then(|v| v.strip_prefix("0.0.0.0:"))
                    .unwrap_or_else(|| panic!("{name}: {var} differs from {original_var}"));
                assert_eq!(value, format!("$(POD_IP):{port}"), "{name}");
                *var = original_var.clone();
            }
        }
    }
    object
}

#[test]
fn the_aliyun_overlay_is_consistent() {
    let objects = check_overlay("aliyun");
    assert!(
        objects.iter().all(|o| o["kind"] != "Deployment"),
        "no mock-eci"
    );
    let config = find(&objects, "ConfigMap", "virtual-node-eci-config");
    assert_eq!(config["data"]["ECI_BACKEND"], "openapi");
    // Alibaba Cloud is reached over TLS only.
    assert!(config["data"].get("ECI_ALLOW_INSECURE_ENDPOINT").is_none());
    // Credentials come from the mounted Secret the daemon re-reads on rotation.
    let set = find(&objects, "StatefulSet", "virtual-node-eci");
    let pod = &set["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == "virtual-node-eci-credentials")
        .expect("the credentials Secret is mounted");
    assert_eq!(volume["secret"]["optional"], true);
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("and mounted into the daemon");
    assert_eq!(mount["readOnly"], true);
    assert_eq!(config["data"]["ECI_CREDENTIALS_PATH"], mount["mountPath"]);
}

/// The daemon's Leases and node status ride a priority level of their own (issue 45): in every
/// overlay the FlowSchema names the daemon's ServiceAccount where it runs, comes before the
/// built-in schemas that would otherwise take it, covers the Leases and the Node writes, and
/// leads to a level whose seats are never lent to others.
#[test]
fn the_daemons_heartbeat_rides_a_priority_level_of_its_own() {
    for overlay in ["mock", "local", "aliyun"] {
        let objects = check_overlay(overlay);
        let set = find(&objects, "StatefulSet", "virtual-node-eci");
        let account = &set["spec"]["template"]["spec"]["serviceAccountName"];
        let schema = find(&objects, "FlowSchema", "virtual-node-eci-heartbeat");
        let level = find(
            &objects,
            "PriorityLevelConfiguration",
            schema["spec"]["priorityLevelConfiguration"]["name"]
                .as_str()
                .unwrap(),
        );
        assert_eq!(level["spec"]["type"], "Limited", "{overlay}");
        assert_eq!(level["spec"]["limited"]["lendablePercent"], 0, "{overlay}");
        // Before `workload-leader-election` (200), `kube-system-service-accounts` (900) and
        // `service-accounts` (9000); after `system-leader-election` (100).
        let precedence = schema["spec"]["matchingPrecedence"].as_u64().unwrap();
        assert!((101..200).contains(&precedence), "{overlay}: {precedence}");
        let rules = schema["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 1, "{overlay}");
        assert_eq!(
            rules[0]["subjects"],
            json!([{"kind": "ServiceAccount", "serviceAccount": {
                "name": account, "namespace": set["metadata"]["namespace"]}}]),
            "{overlay}: the daemon's own ServiceAccount, no one else"
        );
        let covered: BTreeSet<(String, String, bool)> = rules[0]["resourceRules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|rule| rule["verbs"] == json!(["*"]))
            .flat_map(|rule| {
                let everywhere = rule["clusterScope"] == true || rule["namespaces"] == json!(["*"]);
                let groups = rule["apiGroups"].as_array().unwrap().clone();
                let resources = rule["resources"].as_array().unwrap().clone();
                groups.into_iter().flat_map(move |group| {
                    resources.clone().into_iter().map(move |resource| {
                        (
                            group.as_str().unwrap().to_owned(),
                            resource.as_str().unwrap().to_owned(),
                            everywhere,
                        )
                    })
                })
            })
            .collect();
        for wanted in [
            ("coordination.k8s.io", "leases"),
            ("", "nodes"),
            ("", "nodes/status"),
        ] {
            assert!(
                covered.contains(&(wanted.0.to_owned(), wanted.1.to_owned(), true)),
                "{overlay}: {wanted:?} is not covered: {covered:?}"
            );
        }
    }
}

/// The kube-scheduler configuration a user adds for the extender.
const SCHEDULER_EXAMPLE: &str = "scheduler-extender.yaml";

#[test]
fn the_scheduler_example_calls_the_extender_service_with_the_daemons_ca() {
    let objects = render("mock");
    let set = find(&objects, "StatefulSet", "virtual-node-eci");
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    let config = daemon_config(&objects, container);
    let service = find(&objects, "Service", PLACEMENT_SERVICE);
    let port = &service["spec"]["ports"][0];
    assert_eq!(
        container_port(container, port["targetPort"].as_str().unwrap()),
        port_of(&env_value(&objects, container, "PLACEMENT_EXTENDER_ADDR"))
    );
    let text =
        std::fs::read_to_string(deploy_dir().join("examples").join(SCHEDULER_EXAMPLE)).unwrap();
    let example: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(
        example["apiVersion"], "kubescheduler.config.k8s.io/v1",
        "the upstream API"
    );
    assert_eq!(
        example["percentageOfNodesToScore"], 100,
        "the extender sees every node"
    );
    let extenders = example["extenders"].as_array().unwrap();
    assert_eq!(extenders.len(), 1);
    let extender = &extenders[0];
    assert_eq!(
        extender["urlPrefix"],
        format!(
            "https://{PLACEMENT_SERVICE}.{}.svc:{}/resourcepolicy",
            service["metadata"]["namespace"].as_str().unwrap(),
            port["port"]
        )
    );
    for (field, value) in [
        ("filterVerb", json!("filter")),
        ("prioritizeVerb", json!("prioritize")),
        ("bindVerb", json!("bind")),
        ("enableHTTPS", json!(true)),
        ("nodeCacheCapable", json!(true)),
        ("ignorable", json!(true)),
    ] {
        assert_eq!(extender[field], value, "{field}");
    }
    assert!(
        text.contains(&format!(
            "get secret {} -o jsonpath='{{.data.ca\\.crt}}'",
            config.site.webhook_secret
        )),
        "caData comes from the daemon's certificate Secret"
    );
}

/// `kubectl --kubeconfig … ARGS` against the harness's cluster.
async fn kubectl(h: &Harness, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(args)
        .output()
        .await
        .expect("kubectl runs")
}

fn write_yaml(h: &Harness, name: &str, objects: &[Value]) -> String {
    let file = h.dir().join(name);
    let text: String = objects
        .iter()
        .map(|o| serde_saphyr::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("---\n");
    std::fs::write(&file, text).unwrap();
    file.to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_overlay_applies_with_kubectl_and_reads_back_as_written() {
    let objects = render("mock");
    let h = Harness::start().await.unwrap();
    assert!(
        h.kind() == ClusterKind::Fixture,
        "applies to the fixture's cluster only; it would install into a real one"
    );
    let file = write_yaml(&h, "mock.yaml", &objects);
    // Strict: the API server refuses unknown or duplicate fields instead of dropping them.
    let output = kubectl(&h, &["apply", "--validate=strict", "-f", &file]).await;
    assert!(
        output.status.success(),
        "kubectl apply failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for object in &objects {
        let kind = object["kind"].as_str().unwrap();
        let name = object["metadata"]["name"].as_str().unwrap();
        let resource = match kind {
            "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding" => {
                format!("{}.rbac.authorization.k8s.io", kind.to_lowercase())
            }
            _ => kind.to_lowercase(),
        };
        let mut args = vec!["get", &resource, name, "-o", "json"];
        if let Some(namespace) = object["metadata"]["namespace"].as_str() {
            args.extend(["-n", namespace]);
        }
        let output = kubectl(&h, &args).await;
        assert!(
            output.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        let read: Value = serde_json::from_slice(&output.stdout).unwrap();
        let mut lost = Vec::new();
        lost_fields(object, &read, "", &mut lost);
        assert!(
            lost.is_empty(),
            "{} came back without {lost:?}",
            key(object)
        );
        assert_subset(object, &read, &key(object));
    }

    // The CRD's schema is enforced: the examples pass, mistakes are refused with the field.
    // (The scheduler configuration is a file for kube-scheduler, not an API object.)
    let mut args = vec!["apply", "--dry-run=server", "--validate=strict"];
    let examples: Vec<String> = std::fs::read_dir(deploy_dir().join("examples"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| !path.ends_with(SCHEDULER_EXAMPLE))
        .map(|path| path.to_str().unwrap().to_owned())
        .collect();
    for example in &examples {
        args.extend(["-f", example]);
    }
    let output = kubectl(&h, &args).await;
    assert!(
        output.status.success(),
        "the examples: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let selector = |spec: Value| {
        json!({"apiVersion": "eci.aliyun.com/v1", "kind": "Selector",
               "metadata": {"name": "mistake", "namespace": "default"}, "spec": spec})
    };
    for (mistake, spec, expected) in [
        (
            "an unknown field",
            json!({"objectLabels": {"matchLabels": {"app": "x"}}, "polcy": {"fair": {}}}),
            "polcy",
        ),
        (
            "a string priority",
            json!({"objectLabels": {"matchLabels": {"app": "x"}}, "priority": "high"}),
            "spec.priority",
        ),
    ] {
        let file = write_yaml(&h, "mistake.yaml", &[selector(spec)]);
        let output = kubectl(
            &h,
            &[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                &file,
            ],
        )
        .await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(expected),
            "a Selector with {mistake} is refused naming {expected}: {stderr}"
        );
    }
    h.shutdown(Duration::from_secs(5)).await;
}

/// Every value written is read back (the server may add, not change).
fn assert_subset(written: &Value, read: &Value, path: &str) {
    match (written, read) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                if let Some(w) = b.get(k) {
                    assert_subset(v, w, &format!("{path}.{k}"));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}");
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                assert_subset(v, w, &format!("{path}[{i}]"));
            }
        }
        (a, b) => assert_eq!(normalized(a), normalized(b), "{path}"),
    }
}
