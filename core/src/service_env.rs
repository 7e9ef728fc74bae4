//! The Service environment a kubelet gives every container: `KUBERNETES_SERVICE_HOST` and its
//! family for the apiserver, and — with `enableServiceLinks` (the default) — the Docker-link
//! style variables of every Service in the pod's namespace. Pure: the caller hands in the
//! Services from its cache.
//!
//! This follows the kubelet's `getServiceEnvVarMap` and `envvars.FromServices`: Services
//! without a cluster IP (headless, `ExternalName`) give nothing; the `kubernetes` Service of
//! `default` is always included, and a Service of the pod's namespace with the same name takes
//! its place when service links are on; a variable the container defines itself wins.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

/// The namespace of the apiserver's Service.
pub const APISERVER_NAMESPACE: &str = "default";
/// The name of the apiserver's Service (the kubelet's only "master service").
pub const APISERVER_SERVICE: &str = "kubernetes";

/// Whether the kubelet gives a Service variables: it has a cluster IP (not `None`, not empty).
fn has_cluster_ip(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// `my-svc` → `MY_SVC` (the kubelet's `makeEnvVariableName`).
fn variable_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// `host:port`, bracketing IPv6 addresses (Go's `net.JoinHostPort`).
fn join_host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The variables of these Services, in the kubelet's order per Service (`envvars.FromServices`):
/// `_SERVICE_HOST`, `_SERVICE_PORT` (first port), `_SERVICE_PORT_<NAME>` per named port, then
/// the Docker-link ones: `_PORT` (first port) and per port `_PORT_<port>_<PROTO>` with `_PROTO`,
/// `_PORT` and `_ADDR`.
pub fn from_services<'a>(services: impl IntoIterator<Item = &'a Service>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for service in services {
        if !has_cluster_ip(service) {
            continue;
        }
        let Some(spec) = service.spec.as_ref() else {
            continue;
        };
        let ports = spec.ports.as_deref().unwrap_or_default();
        let Some(first) = ports.first() else {
            // Validation requires a port for a Service with a cluster IP; nothing to link to.
            continue;
        };
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let prefix = variable_name(service.metadata.name.as_deref().unwrap_or_default());
        out.push((format!("{prefix}_SERVICE_HOST"), ip.clone()));
        let port_name = format!("{prefix}_SERVICE_PORT");
        out.push((port_name.clone(), first.port.to_string()));
        for port in ports {
            if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((
                    format!("{port_name}_{}", variable_name(name)),
                    port.port.to_string(),
                ));
            }
        }
        for (index, port) in ports.iter().enumerate() {
            let protocol = port.protocol.as_deref().filter(|p| !p.is_empty());
            let protocol = protocol.unwrap_or("TCP");
            let url = format!(
                "{}://{}",
                protocol.to_lowercase(),
                join_host_port(&ip, port.port)
            );
            if index == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let at = format!("{prefix}_PORT_{}_{}", port.port, protocol.to_uppercase());
            out.extend([
                (at.clone(), url),
                (format!("{at}_PROTO"), protocol.to_lowercase()),
                (format!("{at}_PORT"), port.port.to_string()),
                (format!("{at}_ADDR"), ip.clone()),
            ]);
        }
    }
    out
}

/// The apiserver's Service as pods should see it: the cached `default/kubernetes` with the
/// configured host and port in place of its cluster IP and first port. Without the Service, a
/// configured host makes one (port 443 unless configured; the port named `https`, as the
/// apiserver names it); without either there is none, as with a kubelet.
pub fn apiserver_service(
    cached: Option<&Service>,
    host: Option<&str>,
    port: Option<u16>,
) -> Option<Service> {
    let mut service = match (cached, host) {
        (Some(cached), _) => cached.clone(),
        (None, Some(_)) => Service {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(APISERVER_SERVICE.to_owned()),
                namespace: Some(APISERVER_NAMESPACE.to_owned()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort {
                    name: Some("https".to_owned()),
                    port: 443,
                    protocol: Some("TCP".to_owned()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
        (None, None) => return None,
    };
    let spec = service.spec.get_or_insert_with(Default::default);
    if let Some(host) = host {
        spec.cluster_ip = Some(host.to_owned());
    }
    if let Some(port) = port {
        match spec.ports.as_mut().and_then(|ports| ports.first_mut()) {
            Some(first) => first.port = i32::from(port),
            None => {
                spec.ports = Some(vec![ServicePort {
                    name: Some("https".to_owned()),
                    port: i32::from(port),
                    protocol: Some("TCP".to_owned()),
                    ..Default::default()
                }]);
            }
        }
    }
    Some(service)
}

/// The Service variables of a container of a pod in `namespace`: the apiserver's always, the
/// namespace's Services' when `service_links` is on (a namespace Service named `kubernetes`
/// then replaces the apiserver's, as in the kubelet). Services are taken by name in order (the
/// kubelet's order is a Go map's, i.e. none); the container's own variables are added by the
/// caller, before these, and win.
pub fn variables<'a>(
    namespace: &str,
    service_links: bool,
    apiserver: Option<&'a Service>,
    namespace_services: impl IntoIterator<Item = &'a Service>,
) -> Vec<(String, String)> {
    let mut by_name: BTreeMap<&str, &Service> = BTreeMap::new();
    if let Some(apiserver) = apiserver.filter(|s| has_cluster_ip(s)) {
        by_name.insert(APISERVER_SERVICE, apiserver);
    }
    if service_links {
        for service in namespace_services {
            let in_namespace = service.metadata.namespace.as_deref() == Some(namespace);
            // `default/kubernetes` itself is the apiserver's entry, already as configured.
            let is_apiserver = namespace == APISERVER_NAMESPACE
                && service.metadata.name.as_deref() == Some(APISERVER_SERVICE);
            if in_namespace && !is_apiserver && has_cluster_ip(service) {
                by_name.insert(
                    service.metadata.name.as_deref().unwrap_or_default(),
                    service,
                );
            }
        }
    }
    from_services(by_name.into_values())
}

#[cfg(test)]
#[allow(clippy::needless_pass_by_value)] // the builders take `json!(..)` literals
mod tests {
    use serde_json::json;

    use super::*;

    fn service(namespace: &str, name: &str, cluster_ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"clusterIP": cluster_ip, "ports": ports},
        }))
        .unwrap()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn from_services_matches_the_kubelet_table() {
        // Services shaped like those of the kubelet's `TestFromServices` (several ports, named
        // and unnamed, UDP, SCTP, IPv6, no cluster IP), with the variables its algorithm gives.
        let services = [
            service(
                "default",
                "foo-bar",
                "1.2.3.4",
                json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "udp", "port": 8081, "protocol": "UDP"}]),
            ),
            service(
                "default",
                "abc-123",
                "5.6.7.8",
                json!([{"name": "u-d-p", "port": 8081, "protocol": "UDP"}, {"name": "t-c-p", "port": 8080, "protocol": "TCP"}]),
            ),
            service(
                "default",
                "q-u-u-x",
                "9.8.7.6",
                json!([{"port": 8081, "protocol": "TCP"}, {"name": "8080", "port": 8080, "protocol": "TCP"}]),
            ),
            service(
                "default",
                "svrc-clusterip-none",
                "None",
                json!([{"port": 8082, "protocol": "TCP"}]),
            ),
            service(
                "default",
                "svrc-clusterip-empty",
                "",
                json!([{"port": 8082, "protocol": "TCP"}]),
            ),
            service(
                "default",
                "super-ipv6",
                "2001:DB8::",
                json!([{"name": "u-d-p", "port": 8084, "protocol": "UDP"}, {"name": "t-c-p", "port": 8083, "protocol": "TCP"}]),
            ),
            service(
                "default",
                "sctp-1",
                "1.2.3.4",
                json!([{"name": "s-c-t-p", "port": 7777, "protocol": "SCTP"}]),
            ),
        ];
        let expected = pairs(&[
            ("FOO_BAR_SERVICE_HOST", "1.2.3.4"),
            ("FOO_BAR_SERVICE_PORT", "8080"),
            ("FOO_BAR_SERVICE_PORT_HTTP", "8080"),
            ("FOO_BAR_SERVICE_PORT_UDP", "8081"),
            ("FOO_BAR_PORT", "tcp://1.2.3.4:8080"),
            ("FOO_BAR_PORT_8080_TCP", "tcp://1.2.3.4:8080"),
            ("FOO_BAR_PORT_8080_TCP_PROTO", "tcp"),
            ("FOO_BAR_PORT_8080_TCP_PORT", "8080"),
            ("FOO_BAR_PORT_8080_TCP_ADDR", "1.2.3.4"),
            ("FOO_BAR_PORT_8081_UDP", "udp://1.2.3.4:8081"),
            ("FOO_BAR_PORT_8081_UDP_PROTO", "udp"),
            ("FOO_BAR_PORT_8081_UDP_PORT", "8081"),
            ("FOO_BAR_PORT_8081_UDP_ADDR", "1.2.3.4"),
            ("ABC_123_SERVICE_HOST", "5.6.7.8"),
            ("ABC_123_SERVICE_PORT", "8081"),
            ("ABC_123_SERVICE_PORT_U_D_P", "8081"),
            ("ABC_123_SERVICE_PORT_T_C_P", "8080"),
            ("ABC_123_PORT", "udp://5.6.7.8:8081"),
            ("ABC_123_PORT_8081_UDP", "udp://5.6.7.8:8081"),
            ("ABC_123_PORT_8081_UDP_PROTO", "udp"),
            ("ABC_123_PORT_8081_UDP_PORT", "8081"),
            ("ABC_123_PORT_8081_UDP_ADDR", "5.6.7.8"),
            ("ABC_123_PORT_8080_TCP", "tcp://5.6.7.8:8080"),
            ("ABC_123_PORT_8080_TCP_PROTO", "tcp"),
            ("ABC_123_PORT_8080_TCP_PORT", "8080"),
            ("ABC_123_PORT_8080_TCP_ADDR", "5.6.7.8"),
            ("Q_U_U_X_SERVICE_HOST", "9.8.7.6"),
            ("Q_U_U_X_SERVICE_PORT", "8081"),
            ("Q_U_U_X_SERVICE_PORT_8080", "8080"),
            ("Q_U_U_X_PORT", "tcp://9.8.7.6:8081"),
            ("Q_U_U_X_PORT_8081_TCP", "tcp://9.8.7.6:8081"),
            ("Q_U_U_X_PORT_8081_TCP_PROTO", "tcp"),
            ("Q_U_U_X_PORT_8081_TCP_PORT", "8081"),
            ("Q_U_U_X_PORT_8081_TCP_ADDR", "9.8.7.6"),
            ("Q_U_U_X_PORT_8080_TCP", "tcp://9.8.7.6:8080"),
            ("Q_U_U_X_PORT_8080_TCP_PROTO", "tcp"),
            ("Q_U_U_X_PORT_8080_TCP_PORT", "8080"),
            ("Q_U_U_X_PORT_8080_TCP_ADDR", "9.8.7.6"),
            ("SUPER_IPV6_SERVICE_HOST", "2001:DB8::"),
            ("SUPER_IPV6_SERVICE_PORT", "8084"),
            ("SUPER_IPV6_SERVICE_PORT_U_D_P", "8084"),
            ("SUPER_IPV6_SERVICE_PORT_T_C_P", "8083"),
            ("SUPER_IPV6_PORT", "udp://[2001:DB8::]:8084"),
            ("SUPER_IPV6_PORT_8084_UDP", "udp://[2001:DB8::]:8084"),
            ("SUPER_IPV6_PORT_8084_UDP_PROTO", "udp"),
            ("SUPER_IPV6_PORT_8084_UDP_PORT", "8084"),
            ("SUPER_IPV6_PORT_8084_UDP_ADDR", "2001:DB8::"),
            ("SUPER_IPV6_PORT_8083_TCP", "tcp://[2001:DB8::]:8083"),
            ("SUPER_IPV6_PORT_8083_TCP_PROTO", "tcp"),
            ("SUPER_IPV6_PORT_8083_TCP_PORT", "8083"),
            ("SUPER_IPV6_PORT_8083_TCP_ADDR", "2001:DB8::"),
            ("SCTP_1_SERVICE_HOST", "1.2.3.4"),
            ("SCTP_1_SERVICE_PORT", "7777"),
            ("SCTP_1_SERVICE_PORT_S_C_T_P", "7777"),
            ("SCTP_1_PORT", "sctp://1.2.3.4:7777"),
            ("SCTP_1_PORT_7777_SCTP", "sctp://1.2.3.4:7777"),
            ("SCTP_1_PORT_7777_SCTP_PROTO", "sctp"),
            ("SCTP_1_PORT_7777_SCTP_PORT", "7777"),
            ("SCTP_1_PORT_7777_SCTP_ADDR", "1.2.3.4"),
        ]);
        assert_eq!(from_services(&services), expected);
    }

    #[test]
    fn a_missing_protocol_is_tcp() {
        let plain = service("ns", "web", "10.0.0.5", json!([{"port": 80}]));
        assert_eq!(
            from_services([&plain]),
            pairs(&[
                ("WEB_SERVICE_HOST", "10.0.0.5"),
                ("WEB_SERVICE_PORT", "80"),
                ("WEB_PORT", "tcp://10.0.0.5:80"),
                ("WEB_PORT_80_TCP", "tcp://10.0.0.5:80"),
                ("WEB_PORT_80_TCP_PROTO", "tcp"),
                ("WEB_PORT_80_TCP_PORT", "80"),
                ("WEB_PORT_80_TCP_ADDR", "10.0.0.5"),
            ])
        );
    }

    fn apiserver() -> Service {
        service(
            "default",
            "kubernetes",
            "10.96.0.1",
            json!([{"name": "https", "port": 443, "protocol": "TCP"}]),
        )
    }

    fn keys(vars: &[(String, String)]) -> Vec<&str> {
        vars.iter().map(|(k, _)| k.as_str()).collect()
    }

    fn value<'a>(vars: &'a [(String, String)], key: &str) -> Option<&'a str> {
        vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn which_services_a_pod_sees() {
        let cached = apiserver();
        let web = service(
            "shop",
            "web",
            "10.0.0.5",
            json!([{"name": "http", "port": 80}]),
        );
        let headless = service("shop", "db", "None", json!([{"port": 5432}]));
        let external: Service = serde_json::from_value(json!({"metadata": {"namespace": "shop", "name": "mail"}, "spec": {"type": "ExternalName", "externalName": "mail.example.com"}})).unwrap();
        let elsewhere = service("other", "api", "10.0.0.9", json!([{"port": 8080}]));
        let own_kubernetes = service(
            "shop",
            "kubernetes",
            "10.0.0.7",
            json!([{"name": "https", "port": 8443}]),
        );
        let default_web = service("default", "web", "10.0.0.8", json!([{"port": 81}]));
        let all = [&web, &headless, &external, &elsewhere, &default_web];

        // (namespace, links, with the namespace's own `kubernetes`) → expected host, web host
        struct Case {
            namespace: &'static str,
            links: bool,
            own_kubernetes: bool,
            kubernetes_host: &'static str,
            web_host: Option<&'static str>,
        }
        let cases = [
            Case {
                namespace: "shop",
                links: true,
                own_kubernetes: false,
                kubernetes_host: "10.96.0.1",
                web_host: Some("10.0.0.5"),
            },
            Case {
                namespace: "shop",
                links: false,
                own_kubernetes: false,
                kubernetes_host: "10.96.0.1",
                web_host: None,
            },
            // The kubelet's quirk: a namespace's own `kubernetes` Service takes the name over…
            Case {
                namespace: "shop",
                links: true,
                own_kubernetes: true,
                kubernetes_host: "10.0.0.7",
                web_host: Some("10.0.0.5"),
            },
            // … but not without service links.
            Case {
                namespace: "shop",
                links: false,
                own_kubernetes: true,
                kubernetes_host: "10.96.0.1",
                web_host: None,
            },
            Case {
                namespace: "default",
                links: true,
                own_kubernetes: false,
                kubernetes_host: "10.96.0.1",
                web_host: Some("10.0.0.8"),
            },
            Case {
                namespace: "empty",
                links: true,
                own_kubernetes: false,
                kubernetes_host: "10.96.0.1",
                web_host: None,
            },
        ];
        for case in cases {
            let mut services: Vec<&Service> = all.to_vec();
            if case.own_kubernetes {
                services.push(&own_kubernetes);
            }
            let vars = variables(case.namespace, case.links, Some(&cached), services);
            let at = format!("{}/{}/{}", case.namespace, case.links, case.own_kubernetes);
            assert_eq!(
                value(&vars, "KUBERNETES_SERVICE_HOST"),
                Some(case.kubernetes_host),
                "{at}"
            );
            assert_eq!(value(&vars, "WEB_SERVICE_HOST"), case.web_host, "{at}");
            for key in keys(&vars) {
                assert!(
                    !key.starts_with("DB_")
                        && !key.starts_with("MAIL_")
                        && !key.starts_with("API_"),
                    "{at}: {key}"
                );
            }
        }
        // Services come by name: `kubernetes` sorts before `web`.
        let vars = variables("shop", true, Some(&cached), all);
        assert_eq!(keys(&vars)[0], "KUBERNETES_SERVICE_HOST");
        assert_eq!(keys(&vars)[8], "WEB_SERVICE_HOST");
        assert_eq!(vars.len(), 8 + 8, "{vars:?}");
    }

    #[test]
    fn the_apiserver_address_can_be_configured() {
        let cached = apiserver();
        let configured = |host: Option<&str>, port: Option<u16>, cached: Option<&Service>| {
            let service = apiserver_service(cached, host, port);
            variables("shop", false, service.as_ref(), [])
        };
        // Default: the Service as the kubelet sees it.
        assert_eq!(
            configured(None, None, Some(&cached)),
            pairs(&[
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
                ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
                ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
                ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
                ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
                ("KUBERNETES_PORT_443_TCP_PORT", "443"),
                ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ])
        );
        // Host and port configured: the whole family follows.
        let both = configured(Some("apiserver.internal"), Some(6443), Some(&cached));
        assert_eq!(
            value(&both, "KUBERNETES_SERVICE_HOST"),
            Some("apiserver.internal")
        );
        assert_eq!(value(&both, "KUBERNETES_SERVICE_PORT"), Some("6443"));
        assert_eq!(value(&both, "KUBERNETES_SERVICE_PORT_HTTPS"), Some("6443"));
        assert_eq!(
            value(&both, "KUBERNETES_PORT"),
            Some("tcp://apiserver.internal:6443")
        );
        assert_eq!(
            value(&both, "KUBERNETES_PORT_6443_TCP_ADDR"),
            Some("apiserver.internal")
        );
        assert_eq!(value(&both, "KUBERNETES_PORT_443_TCP"), None);
        // Only the host: the Service's port stays.
        let host = configured(Some("172.16.0.10"), None, Some(&cached));
        assert_eq!(
            value(&host, "KUBERNETES_PORT"),
            Some("tcp://172.16.0.10:443")
        );
        // Only the port: the Service's cluster IP stays.
        let port = configured(None, Some(6443), Some(&cached));
        assert_eq!(
            value(&port, "KUBERNETES_PORT"),
            Some("tcp://10.96.0.1:6443")
        );
        // No Service known: a configured host is enough, a port alone is not.
        let made = configured(Some("172.16.0.10"), None, None);
        assert_eq!(
            value(&made, "KUBERNETES_PORT_443_TCP"),
            Some("tcp://172.16.0.10:443")
        );
        assert_eq!(value(&made, "KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert!(configured(None, Some(6443), None).is_empty());
        assert!(configured(None, None, None).is_empty());
    }
}
