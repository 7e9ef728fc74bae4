//! Pod → ECI: a pod as a user may write it (and the ConfigMaps, Secrets and Services it may
//! reference), collected and translated as the pod controller does (`refs::references`,
//! `to_eci::translate`, `to_eci::token_volumes`), then written as the OpenAPI form. No pod
//! panics the translation; an accepted pod's group carries the pod's uid as its ClientToken.
//!
//! The input is a pod, or a JSON document with the pod and its surroundings:
//!
//! ```json
//! {"pod": {...}, "configMaps": [{...}], "secrets": [{...}], "services": [{...}],
//!  "apiserver": {...}, "kubernetesServiceHost": "10.0.0.1", "kubernetesServicePort": 6443,
//!  "kubeProxy": true}
//! ```

#![no_main]

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde_json::Value;
use vne_core::refs::{Token, references};
use vne_core::service_env;
use vne_core::to_eci::{self, Context};

fn objects<T: DeserializeOwned>(value: &Value) -> Vec<T> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|object| serde_json::from_value(object.clone()).ok())
        .collect()
}

fn by_name<
    T: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
>(
    objects: Vec<T>,
) -> BTreeMap<String, T> {
    objects
        .into_iter()
        .map(|object| (object.metadata().name.clone().unwrap_or_default(), object))
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(document) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let pod_value = match document.get("pod") {
        Some(pod) => pod.clone(),
        None => document.clone(),
    };
    let Ok(pod) = serde_json::from_value::<Pod>(pod_value) else {
        return;
    };
    let refs = references(&pod);
    // What the controller fetched: those of the named objects that exist.
    let config_maps: BTreeMap<String, ConfigMap> = by_name(objects(&document["configMaps"]))
        .into_iter()
        .filter(|(name, _)| refs.config_maps.contains(name))
        .collect();
    let secrets: BTreeMap<String, Secret> = by_name(objects(&document["secrets"]))
        .into_iter()
        .filter(|(name, _)| refs.secrets.contains(name))
        .collect();
    let tokens = refs
        .tokens
        .iter()
        .enumerate()
        .map(|(i, source)| (source.clone(), Token::new(format!("token-{i}"))))
        .collect();
    let cached: Option<Service> = serde_json::from_value(document["apiserver"].clone()).ok();
    let apiserver = service_env::apiserver_service(
        cached.as_ref(),
        document["kubernetesServiceHost"].as_str(),
        document["kubernetesServicePort"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok()),
    );
    let services: Vec<Arc<Service>> = objects::<Service>(&document["services"])
        .into_iter()
        .map(Arc::new)
        .collect();
    let dns = vec!["10.96.0.10".to_owned()];
    let cx = Context {
        region: "cn-hangzhou",
        vswitch: "vsw-default",
        security_group: "sg-default",
        cluster_name: "c1",
        node_name: "virtual-node-eci-0",
        cluster_dns: &dns,
        cluster_domain: "cluster.local",
        config_maps: &config_maps,
        secrets: &secrets,
        claims: &BTreeMap::new(),
        service_account_tokens: &tokens,
        default_spec: (2.0, 4.0),
        apiserver: apiserver.as_ref(),
        services: &services,
        kube_proxy: document["kubeProxy"].as_bool().unwrap_or(true),
    };
    let _ = to_eci::token_volumes(&pod, &cx);
    let Ok(request) = to_eci::translate(&pod, &cx) else {
        return;
    };
    assert_eq!(
        Some(&request.client_token),
        pod.metadata.uid.as_ref(),
        "the group's ClientToken is the pod's uid"
    );
    let _ = eci_proto::openapi::form::encode(&request);
});
