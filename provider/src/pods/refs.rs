//! What a pod references that must be fetched before it can be translated.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;

/// Names of the ConfigMaps and Secrets a pod references, and whether it wants a token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// ConfigMaps.
    pub config_maps: BTreeSet<String>,
    /// Secrets (env, volumes, image pull secrets).
    pub secrets: BTreeSet<String>,
    /// A projected serviceAccountToken wants this many seconds of validity.
    pub token_seconds: Option<i64>,
}

/// Collects a pod's references.
pub fn references(pod: &Pod) -> References {
    let mut refs = References::default();
    let Some(spec) = &pod.spec else { return refs };
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        for source in container.env_from.iter().flatten() {
            if let Some(r) = &source.config_map_ref {
                refs.config_maps.insert(r.name.clone());
            }
            if let Some(r) = &source.secret_ref {
                refs.secrets.insert(r.name.clone());
            }
        }
        for var in container.env.iter().flatten() {
            if let Some(from) = &var.value_from {
                if let Some(r) = &from.config_map_key_ref {
                    refs.config_maps.insert(r.name.clone());
                }
                if let Some(r) = &from.secret_key_ref {
                    refs.secrets.insert(r.name.clone());
                }
            }
        }
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(source) = &volume.config_map {
            refs.config_maps.insert(source.name.clone());
        }
        if let Some(name) = volume.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            refs.secrets.insert(name);
        }
        for projection in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            if let Some(source) = &projection.config_map {
                refs.config_maps.insert(source.name.clone());
            }
            if let Some(source) = &projection.secret {
                refs.secrets.insert(source.name.clone());
            }
            if let Some(token) = &projection.service_account_token {
                let seconds = token.expiration_seconds.unwrap_or(3600);
                refs.token_seconds = Some(refs.token_seconds.map_or(seconds, |s| s.min(seconds)));
            }
        }
    }
    for pull in spec.image_pull_secrets.iter().flatten() {
        refs.secrets.insert(pull.name.clone());
    }
    refs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn collects_every_reference() {
        let pod: Pod = serde_json::from_value(json!({"spec": {
            "containers": [{"name": "a", "image": "a",
                "envFrom": [{"configMapRef": {"name": "cm-env"}}, {"secretRef": {"name": "s-env"}}],
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s-key", "key": "k"}}}]}],
            "volumes": [{"name": "v", "configMap": {"name": "cm-vol"}}, {"name": "w", "secret": {"secretName": "s-vol"}},
                {"name": "p", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}, {"configMap": {"name": "kube-root-ca.crt"}}]}}],
            "imagePullSecrets": [{"name": "pull"}]
        }}))
        .unwrap();
        let refs = references(&pod);
        assert_eq!(
            refs.config_maps,
            ["cm-env", "cm-vol", "kube-root-ca.crt"]
                .map(String::from)
                .into()
        );
        assert_eq!(
            refs.secrets,
            ["pull", "s-env", "s-key", "s-vol"].map(String::from).into()
        );
        assert_eq!(refs.token_seconds, Some(3607));
    }
}
