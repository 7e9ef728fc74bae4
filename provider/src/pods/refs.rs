//! What a pod references that must be fetched before it can be translated.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, ServiceAccountTokenProjection, Volume};

/// The validity a `serviceAccountToken` source gets when it names none (the API's default).
pub const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// A projected `serviceAccountToken` source as TokenRequest asks for it. Like the kubelet, the
/// daemon requests one token per distinct source of a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenSource {
    /// The audience; empty for the apiserver's own (a TokenRequest without audiences).
    pub audience: String,
    /// The validity asked for, in seconds (the API's minimum is 600).
    pub expiration_seconds: i64,
}

impl TokenSource {
    /// The source of a projection.
    pub fn of(projection: &ServiceAccountTokenProjection) -> Self {
        Self {
            audience: projection.audience.clone().unwrap_or_default(),
            expiration_seconds: projection
                .expiration_seconds
                .unwrap_or(DEFAULT_TOKEN_SECONDS),
        }
    }
}

/// A token issued for a [`TokenSource`]. Tokens are secrets: `Debug` never shows one.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps an issued token.
    pub fn new(token: String) -> Self {
        Self(token)
    }

    /// The token itself, for the volume file it goes into.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Names of the ConfigMaps and Secrets a pod references, and the tokens it wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// ConfigMaps.
    pub config_maps: BTreeSet<String>,
    /// Secrets (env, volumes, image pull secrets).
    pub secrets: BTreeSet<String>,
    /// The distinct projected `serviceAccountToken` sources.
    pub tokens: BTreeSet<TokenSource>,
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
        volume_references(volume, &mut refs);
    }
    for pull in spec.image_pull_secrets.iter().flatten() {
        refs.secrets.insert(pull.name.clone());
    }
    refs
}

/// What the volumes carrying service account tokens reference: all a token refresh rebuilds.
pub fn token_volume_references(pod: &Pod) -> References {
    let mut refs = References::default();
    for volume in pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| crate::pods::to_eci::has_token(v))
    {
        volume_references(volume, &mut refs);
    }
    refs
}

fn volume_references(volume: &Volume, refs: &mut References) {
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
            refs.tokens.insert(TokenSource::of(token));
        }
    }
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
                {"name": "p", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}, {"configMap": {"name": "kube-root-ca.crt"}}]}},
                {"name": "q", "projected": {"sources": [{"serviceAccountToken": {"path": "vault", "audience": "vault"}}, {"serviceAccountToken": {"path": "again", "expirationSeconds": 3607}}]}}],
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
        let token = |audience: &str, expiration_seconds| TokenSource {
            audience: audience.to_owned(),
            expiration_seconds,
        };
        // One token per distinct source: the two identical ones share it.
        assert_eq!(
            refs.tokens,
            [token("", 3607), token("vault", DEFAULT_TOKEN_SECONDS)].into()
        );
        // A refresh rebuilds only the token volumes: the root CA, not the app's config.
        let refresh = token_volume_references(&pod);
        assert_eq!(refresh.config_maps, ["kube-root-ca.crt".to_owned()].into());
        assert!(refresh.secrets.is_empty());
        assert_eq!(refresh.tokens, refs.tokens);
    }
}
