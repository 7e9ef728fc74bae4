//! What a pod references that must be fetched before it can be translated.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
    ServiceAccountTokenProjection, Volume,
};

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

    /// The TokenRequest a kubelet makes for this source: bound to `pod` (the token dies with
    /// it), for the source's audience (none: the apiserver's own, which is what an empty list
    /// means to TokenRequest) and validity.
    pub fn request_for(&self, pod: &Pod) -> TokenRequest {
        TokenRequest {
            spec: TokenRequestSpec {
                audiences: if self.audience.is_empty() {
                    Vec::new()
                } else {
                    vec![self.audience.clone()]
                },
                expiration_seconds: Some(self.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..TokenRequest::default()
        }
    }
}

/// The service account a pod runs as, whose tokens it is given: `spec.serviceAccountName`,
/// `default` when unset (what the apiserver's ServiceAccount admission fills in).
pub fn service_account(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.service_account_name.clone())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "default".into())
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
    /// PersistentVolumeClaims (`persistentVolumeClaim` volumes).
    pub claims: BTreeSet<String>,
}

/// The kind of object a reference names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
    /// A PersistentVolumeClaim (and the PersistentVolume it is bound to).
    PersistentVolumeClaim,
}

/// What a reference is for: it decides which keys count and what an absence costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Use {
    /// Environment variables (`env`, `envFrom`): only a ConfigMap's `data` keys are usable.
    Env,
    /// Volume files (`configMap`, `secret`, `projected`): `binaryData` keys count too.
    Volume,
    /// An image pull secret: the kubelet pulls without it when it is missing.
    ImagePull,
}

/// One ConfigMap or Secret reference of a pod, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference<'a> {
    /// What it names.
    pub kind: Kind,
    /// The object's name.
    pub name: &'a str,
    /// The key it needs, for a key reference (`configMapKeyRef`, a volume's `items`).
    pub key: Option<&'a str>,
    /// Marked `optional: true` (an image pull secret always is).
    pub optional: bool,
    /// What it is for.
    pub use_: Use,
}

/// Visits every ConfigMap and Secret reference of a pod (containers and init containers,
/// volumes, image pull secrets), and every projected service account token source.
fn visit<'a>(
    pod: &'a Pod,
    mut reference: impl FnMut(Reference<'a>),
    mut token: impl FnMut(&'a ServiceAccountTokenProjection),
) {
    let Some(spec) = &pod.spec else { return };
    let optional = |flag: Option<bool>| flag == Some(true);
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        for source in container.env_from.iter().flatten() {
            let named = [
                source
                    .config_map_ref
                    .as_ref()
                    .map(|r| (Kind::ConfigMap, r.name.as_str(), r.optional)),
                source
                    .secret_ref
                    .as_ref()
                    .map(|r| (Kind::Secret, r.name.as_str(), r.optional)),
            ];
            for (kind, name, flag) in named.into_iter().flatten() {
                reference(Reference {
                    kind,
                    name,
                    key: None,
                    optional: optional(flag),
                    use_: Use::Env,
                });
            }
        }
        for from in container
            .env
            .iter()
            .flatten()
            .filter_map(|var| var.value_from.as_ref())
        {
            let keyed = [
                from.config_map_key_ref
                    .as_ref()
                    .map(|r| (Kind::ConfigMap, r.name.as_str(), r.key.as_str(), r.optional)),
                from.secret_key_ref
                    .as_ref()
                    .map(|r| (Kind::Secret, r.name.as_str(), r.key.as_str(), r.optional)),
            ];
            for (kind, name, key, flag) in keyed.into_iter().flatten() {
                reference(Reference {
                    kind,
                    name,
                    key: Some(key),
                    optional: optional(flag),
                    use_: Use::Env,
                });
            }
        }
    }
    for volume in spec.volumes.iter().flatten() {
        visit_volume(volume, &mut reference, &mut token);
    }
    for pull in spec.image_pull_secrets.iter().flatten() {
        reference(Reference {
            kind: Kind::Secret,
            name: &pull.name,
            key: None,
            optional: true,
            use_: Use::ImagePull,
        });
    }
}

fn visit_volume<'a>(
    volume: &'a Volume,
    reference: &mut impl FnMut(Reference<'a>),
    token: &mut impl FnMut(&'a ServiceAccountTokenProjection),
) {
    if let Some(claim) = &volume.persistent_volume_claim {
        reference(Reference {
            kind: Kind::PersistentVolumeClaim,
            name: &claim.claim_name,
            key: None,
            optional: false,
            use_: Use::Volume,
        });
    }
    let mut files = |kind, name: &'a str, items: Option<&'a Vec<KeyToPath>>, flag: Option<bool>| {
        let optional = flag == Some(true);
        reference(Reference {
            kind,
            name,
            key: None,
            optional,
            use_: Use::Volume,
        });
        for item in items.into_iter().flatten() {
            reference(Reference {
                kind,
                name,
                key: Some(&item.key),
                optional,
                use_: Use::Volume,
            });
        }
    };
    if let Some(source) = &volume.config_map {
        files(
            Kind::ConfigMap,
            &source.name,
            source.items.as_ref(),
            source.optional,
        );
    }
    if let Some(source) = &volume.secret
        && let Some(name) = &source.secret_name
    {
        files(Kind::Secret, name, source.items.as_ref(), source.optional);
    }
    for projection in volume
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
    {
        if let Some(source) = &projection.config_map {
            files(
                Kind::ConfigMap,
                &source.name,
                source.items.as_ref(),
                source.optional,
            );
        }
        if let Some(source) = &projection.secret {
            files(
                Kind::Secret,
                &source.name,
                source.items.as_ref(),
                source.optional,
            );
        }
        if let Some(source) = &projection.service_account_token {
            token(source);
        }
    }
}

impl References {
    fn add(&mut self, reference: Reference<'_>) {
        match reference.kind {
            Kind::ConfigMap => self.config_maps.insert(reference.name.to_owned()),
            Kind::Secret => self.secrets.insert(reference.name.to_owned()),
            Kind::PersistentVolumeClaim => self.claims.insert(reference.name.to_owned()),
        };
    }
}

/// Collects a pod's references.
pub fn references(pod: &Pod) -> References {
    let mut refs = References::default();
    let mut tokens = BTreeSet::new();
    visit(
        pod,
        |r| refs.add(r),
        |t| {
            tokens.insert(TokenSource::of(t));
        },
    );
    refs.tokens = tokens;
    refs
}

/// What the volumes carrying service account tokens reference: all a token refresh rebuilds.
pub fn token_volume_references(pod: &Pod) -> References {
    volume_references(pod, crate::to_eci::has_token)
}

/// What the pod's file volumes (`configMap`, `secret`, `projected`) reference: what a push of
/// changed contents rebuilds, and the objects whose changes concern the running group.
pub fn file_volume_references(pod: &Pod) -> References {
    volume_references(pod, |_| true)
}

fn volume_references(pod: &Pod, which: impl Fn(&Volume) -> bool) -> References {
    let mut refs = References::default();
    let mut tokens = BTreeSet::new();
    for volume in pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| which(v))
    {
        visit_volume(volume, &mut |r| refs.add(r), &mut |t| {
            tokens.insert(TokenSource::of(t));
        });
    }
    refs.tokens = tokens;
    refs
}

/// A reference whose object, or key in it, does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Absent {
    /// What it names.
    pub kind: Kind,
    /// The object's name.
    pub name: String,
    /// The missing key, when the object exists but lacks it.
    pub key: Option<String>,
    /// Marked optional: the pod runs without it.
    pub optional: bool,
    /// What it was for.
    pub use_: Use,
    /// For a claim: what keeps it from being mounted.
    pub claim: Option<ClaimGap>,
}

/// Why a PersistentVolumeClaim cannot be mounted (yet).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClaimGap {
    /// The claim does not exist.
    Missing,
    /// The claim is not bound to a PersistentVolume.
    Unbound,
    /// The claim is bound to this PersistentVolume, which does not exist.
    VolumeMissing(String),
    /// The claim names this PersistentVolume, which is not bound back to it (its `claimRef`
    /// names another claim, or none): a claim's author cannot take a volume by naming it.
    NotBoundBack(String),
    /// The claim is bound to a cloud disk in another zone than the daemon's vSwitches: ECI
    /// attaches a disk only to a group in the disk's zone.
    OutOfZone {
        /// The PersistentVolume.
        volume: String,
        /// The zones the disk can be in (empty: its node affinity and `zoneId` disagree).
        disk: Vec<String>,
        /// The zone groups are created in.
        served: String,
    },
}

impl Absent {
    /// The Event reason: virtual-kubelet's names (`MandatorySecretNotFound`, …), which
    /// ack-virtual-node, a virtual kubelet, reports; for an image pull secret the kubelet's.
    pub fn reason(&self) -> &'static str {
        use Kind::{ConfigMap, PersistentVolumeClaim, Secret};
        match (self.use_, self.optional, self.kind, self.key.is_some()) {
            // The kubelet's reason for a volume it cannot mount.
            (.., PersistentVolumeClaim, _) => "FailedMount",
            (Use::ImagePull, ..) => "FailedToRetrieveImagePullSecret",
            (_, true, ConfigMap, false) => "OptionalConfigMapNotFound",
            (_, true, ConfigMap, true) => "OptionalConfigMapKeyNotFound",
            (_, true, Secret, false) => "OptionalSecretNotFound",
            (_, true, Secret, true) => "OptionalSecretKeyNotFound",
            (_, false, ConfigMap, false) => "MandatoryConfigMapNotFound",
            (_, false, ConfigMap, true) => "MandatoryConfigMapKeyNotFound",
            (_, false, Secret, false) => "MandatorySecretNotFound",
            (_, false, Secret, true) => "MandatorySecretKeyNotFound",
        }
    }

    /// The pod's reason while it waits: the kubelet's for a container it cannot configure,
    /// or for one whose volumes are not mounted yet.
    pub fn pod_reason(&self) -> &'static str {
        match self.kind {
            Kind::PersistentVolumeClaim => "ContainerCreating",
            Kind::ConfigMap | Kind::Secret => "CreateContainerConfigError",
        }
    }
}

impl std::fmt::Display for Absent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
            Kind::PersistentVolumeClaim => {
                let name = &self.name;
                return match &self.claim {
                    Some(ClaimGap::Unbound) => {
                        write!(f, "persistentvolumeclaim {name:?} is not bound")
                    }
                    Some(ClaimGap::VolumeMissing(pv)) => write!(
                        f,
                        "persistentvolumeclaim {name:?} is bound to persistentvolume {pv:?}, which does not exist"
                    ),
                    Some(ClaimGap::NotBoundBack(pv)) => write!(
                        f,
                        "persistentvolumeclaim {name:?} names persistentvolume {pv:?}, which is not bound to it"
                    ),
                    Some(ClaimGap::OutOfZone {
                        volume,
                        disk,
                        served,
                    }) => write!(
                        f,
                        "persistentvolumeclaim {name:?} is bound to persistentvolume {volume:?}, a cloud disk in zone {}; this virtual node creates instances in zone {served:?} (its vSwitches' zone), and a disk is attached only in its own zone",
                        zone_list(disk)
                    ),
                    Some(ClaimGap::Missing) | None => {
                        write!(f, "persistentvolumeclaim {name:?} not found")
                    }
                };
            }
        };
        match &self.key {
            Some(key) => write!(f, "key {key:?} does not exist in {kind} {:?}", self.name)?,
            None => write!(f, "{kind} {:?} not found", self.name)?,
        }
        match (self.use_, self.optional) {
            (Use::ImagePull, _) => f.write_str(" (image pull secret); pulling without it"),
            (_, true) => f.write_str(" (optional); left out"),
            (_, false) => Ok(()),
        }
    }
}

/// The pod's references that the objects read for it (`config_maps`, `secrets`: those that
/// exist, by name) cannot satisfy, each once, in the pod's order.
pub fn absent(
    pod: &Pod,
    config_maps: &BTreeMap<String, ConfigMap>,
    secrets: &BTreeMap<String, Secret>,
) -> Vec<Absent> {
    let mut found: Vec<Absent> = Vec::new();
    visit(
        pod,
        |r| {
            let exists = match r.kind {
                Kind::ConfigMap => config_maps.get(r.name).map(|map| {
                    r.key.is_none_or(|key| {
                        map.data.as_ref().is_some_and(|d| d.contains_key(key))
                            || (r.use_ == Use::Volume
                                && map
                                    .binary_data
                                    .as_ref()
                                    .is_some_and(|d| d.contains_key(key)))
                    })
                }),
                Kind::Secret => secrets.get(r.name).map(|secret| {
                    r.key
                        .is_none_or(|key| secret.data.as_ref().is_some_and(|d| d.contains_key(key)))
                }),
                // Judged with the volumes they are bound to: [`bound_volumes`].
                Kind::PersistentVolumeClaim => return,
            };
            let absent = match exists {
                Some(true) => return,
                // The object exists without the key.
                Some(false) => Absent {
                    kind: r.kind,
                    name: r.name.to_owned(),
                    key: r.key.map(str::to_owned),
                    optional: r.optional,
                    use_: r.use_,
                    claim: None,
                },
                None => Absent {
                    kind: r.kind,
                    name: r.name.to_owned(),
                    key: None,
                    optional: r.optional,
                    use_: r.use_,
                    claim: None,
                },
            };
            if !found.contains(&absent) {
                found.push(absent);
            }
        },
        |_| {},
    );
    found
}

/// The PersistentVolumes the read `claims` are bound to, by name: those to read next.
pub fn volume_names(claims: &BTreeMap<String, PersistentVolumeClaim>) -> BTreeSet<String> {
    claims
        .values()
        .filter_map(|c| c.spec.as_ref()?.volume_name.clone())
        .filter(|name| !name.is_empty())
        .collect()
}

/// The PersistentVolume each of the pod's claims is bound to, by claim name, and the claims
/// that cannot be mounted (yet), from the claims of its namespace read (`claims`, by name) and
/// the volumes read (`volumes`, by name). A binding counts only when the claim is `Bound` and
/// the volume's `claimRef` names the claim back: the volume is the administrator's side of
/// the binding, the claim its author's.
pub fn bound_volumes(
    pod: &Pod,
    claims: &BTreeMap<String, PersistentVolumeClaim>,
    volumes: &BTreeMap<String, PersistentVolume>,
) -> (BTreeMap<String, PersistentVolume>, Vec<Absent>) {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut bound = BTreeMap::new();
    let mut gaps = Vec::new();
    for name in references(pod).claims {
        match bound_volume(namespace, claims.get(&name), volumes) {
            Ok(pv) => {
                bound.insert(name, pv.clone());
            }
            Err(gap) => gaps.push(Absent {
                kind: Kind::PersistentVolumeClaim,
                name,
                key: None,
                optional: false,
                use_: Use::Volume,
                claim: Some(gap),
            }),
        }
    }
    (bound, gaps)
}

/// The pod's claims (`bound`: the volume each is bound to, by claim name) whose cloud disk a
/// group in `zone` cannot attach, by claim name. `zone`: the zone of the daemon's vSwitches
/// (`ECI_ZONE`), `None` when they span several or it is not configured — nothing to check then.
/// A pod naming its own vSwitches (`k8s.aliyun.com/eci-vswitch`) is not checked either: their
/// zone is not known here, and ECI answers for it.
pub fn out_of_zone(
    pod: &Pod,
    bound: &BTreeMap<String, PersistentVolume>,
    zone: Option<&str>,
) -> Vec<Absent> {
    let Some(zone) = zone.map(str::trim).filter(|z| !z.is_empty()) else {
        return Vec::new();
    };
    let own_vswitch = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_VSWITCH))
        .is_some_and(|v| !v.trim().is_empty());
    if own_vswitch {
        return Vec::new();
    }
    references(pod)
        .claims
        .into_iter()
        .filter_map(|name| {
            let pv = bound.get(&name)?;
            let disk = crate::to_eci::claims::zone_conflict(pv, zone)?;
            Some(Absent {
                kind: Kind::PersistentVolumeClaim,
                name,
                key: None,
                optional: false,
                use_: Use::Volume,
                claim: Some(ClaimGap::OutOfZone {
                    volume: pv.metadata.name.clone().unwrap_or_default(),
                    disk: disk.into_iter().collect(),
                    served: zone.to_owned(),
                }),
            })
        })
        .collect()
}

/// The pod annotation naming its own vSwitches.
const POD_VSWITCH: &str = "k8s.aliyun.com/eci-vswitch";

fn zone_list(zones: &[String]) -> String {
    if zones.is_empty() {
        return "no zone (its node affinity and volumeAttributes.zoneId disagree)".into();
    }
    zones
        .iter()
        .map(|z| format!("{z:?}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

fn bound_volume<'a>(
    namespace: &str,
    claim: Option<&PersistentVolumeClaim>,
    volumes: &'a BTreeMap<String, PersistentVolume>,
) -> Result<&'a PersistentVolume, ClaimGap> {
    let claim = claim.ok_or(ClaimGap::Missing)?;
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty());
    let (Some("Bound"), Some(volume_name)) = (phase, volume_name) else {
        return Err(ClaimGap::Unbound);
    };
    let pv = volumes
        .get(volume_name)
        .ok_or_else(|| ClaimGap::VolumeMissing(volume_name.to_owned()))?;
    let back = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let names_claim = back.is_some_and(|r| {
        r.namespace.as_deref() == Some(namespace)
            && r.name == claim.metadata.name
            && (r.uid.is_none() || r.uid == claim.metadata.uid)
    });
    if !names_claim {
        return Err(ClaimGap::NotBoundBack(volume_name.to_owned()));
    }
    Ok(pv)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

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

    #[test]
    fn a_token_is_requested_for_the_pods_account_bound_to_the_pod() {
        let pod = |spec: Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "web-0", "uid": "u-1"},
                "spec": spec,
            }))
            .unwrap()
        };
        let named = pod(json!({"serviceAccountName": "builder", "containers": []}));
        assert_eq!(service_account(&named), "builder");
        for unnamed in [
            json!({"containers": []}),
            json!({"serviceAccountName": "", "containers": []}),
        ] {
            assert_eq!(service_account(&pod(unnamed)), "default");
        }
        // (audience, what TokenRequest is asked for)
        for (audience, audiences) in [("", json!([])), ("vault", json!(["vault"]))] {
            let source = TokenSource {
                audience: audience.into(),
                expiration_seconds: 3607,
            };
            let request = serde_json::to_value(source.request_for(&named)).unwrap();
            assert_eq!(
                request["spec"],
                json!({
                    "audiences": audiences,
                    "expirationSeconds": 3607,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": "u-1"},
                }),
                "{audience:?}"
            );
        }
    }

    #[test]
    fn absent_references_are_named_with_virtual_kubelets_reasons() {
        let pod: Pod = serde_json::from_value(json!({"spec": {
            "containers": [{"name": "a", "image": "a",
                "envFrom": [{"configMapRef": {"name": "gone-cm", "optional": true}}, {"secretRef": {"name": "here-s"}}],
                "env": [
                    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "gone-s", "key": "k"}}},
                    {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "here-cm", "key": "nokey", "optional": true}}},
                    {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "here-cm", "key": "bin"}}},
                    {"name": "D", "valueFrom": {"configMapKeyRef": {"name": "here-cm", "key": "text"}}},
                    {"name": "E", "valueFrom": {"secretKeyRef": {"name": "gone-s", "key": "other"}}}]}],
            "volumes": [
                {"name": "v", "configMap": {"name": "here-cm", "items": [{"key": "bin", "path": "b"}, {"key": "lost", "path": "l"}]}},
                {"name": "w", "projected": {"sources": [{"secret": {"name": "gone-vol", "optional": true}}]}}],
            "imagePullSecrets": [{"name": "gone-pull"}]
        }}))
        .unwrap();
        let config_maps = BTreeMap::from([(
            "here-cm".to_owned(),
            serde_json::from_value::<ConfigMap>(
                json!({"data": {"text": "t"}, "binaryData": {"bin": "AA=="}}),
            )
            .unwrap(),
        )]);
        let secrets = BTreeMap::from([("here-s".to_owned(), Secret::default())]);
        let found: Vec<(&str, String)> = absent(&pod, &config_maps, &secrets)
            .iter()
            .map(|a| (a.reason(), a.to_string()))
            .collect();
        let expected = [
            (
                "OptionalConfigMapNotFound",
                r#"configmap "gone-cm" not found (optional); left out"#,
            ),
            // Two keys of one missing Secret: the Secret is named once.
            ("MandatorySecretNotFound", r#"secret "gone-s" not found"#),
            (
                "OptionalConfigMapKeyNotFound",
                r#"key "nokey" does not exist in configmap "here-cm" (optional); left out"#,
            ),
            // A binaryData key cannot be a variable, only a file.
            (
                "MandatoryConfigMapKeyNotFound",
                r#"key "bin" does not exist in configmap "here-cm""#,
            ),
            (
                "MandatoryConfigMapKeyNotFound",
                r#"key "lost" does not exist in configmap "here-cm""#,
            ),
            (
                "OptionalSecretNotFound",
                r#"secret "gone-vol" not found (optional); left out"#,
            ),
            (
                "FailedToRetrieveImagePullSecret",
                r#"secret "gone-pull" not found (image pull secret); pulling without it"#,
            ),
        ];
        let expected: Vec<(&str, String)> = expected
            .iter()
            .map(|(r, m)| (*r, (*m).to_owned()))
            .collect();
        assert_eq!(found, expected);
        // Everything there: nothing absent.
        let whole = BTreeMap::from([(
            "here-cm".to_owned(),
            serde_json::from_value::<ConfigMap>(
                json!({"data": {"text": "t", "bin": "b", "nokey": "n", "lost": "l"}}),
            )
            .unwrap(),
        )]);
        let secrets: BTreeMap<String, Secret> = ["here-s", "gone-vol", "gone-pull"]
            .into_iter()
            .map(|name| (name.to_owned(), Secret::default()))
            .chain([(
                "gone-s".to_owned(),
                serde_json::from_value(json!({"data": {"k": "AA==", "other": "AA=="}})).unwrap(),
            )])
            .chain([("gone-cm".to_owned(), Secret::default())])
            .collect();
        let mut config_maps = whole;
        config_maps.insert("gone-cm".to_owned(), ConfigMap::default());
        assert_eq!(absent(&pod, &config_maps, &secrets), Vec::new());
    }

    #[test]
    fn a_claim_counts_only_when_bound_both_ways() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"namespace": "team-a"}, "spec": {
            "containers": [{"name": "a", "image": "a"}],
            "volumes": [
                {"name": "ok", "persistentVolumeClaim": {"claimName": "ok"}},
                {"name": "again", "persistentVolumeClaim": {"claimName": "ok", "readOnly": true}},
                {"name": "gone", "persistentVolumeClaim": {"claimName": "gone"}},
                {"name": "pending", "persistentVolumeClaim": {"claimName": "pending"}},
                {"name": "orphan", "persistentVolumeClaim": {"claimName": "orphan"}},
                {"name": "stolen", "persistentVolumeClaim": {"claimName": "stolen"}},
                {"name": "replaced", "persistentVolumeClaim": {"claimName": "replaced"}}]
        }}))
        .unwrap();
        assert_eq!(
            references(&pod).claims,
            ["gone", "ok", "orphan", "pending", "replaced", "stolen"]
                .map(String::from)
                .into()
        );
        let claim = |name: &str, uid: &str, volume: Option<&str>, phase: &str| {
            let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "team-a", "uid": uid},
                "spec": {"volumeName": volume}, "status": {"phase": phase}
            }))
            .unwrap();
            (name.to_owned(), claim)
        };
        let claims = BTreeMap::from([
            claim("ok", "u-ok", Some("pv-ok"), "Bound"),
            claim("pending", "u-p", None, "Pending"),
            // Bound, but its volume was deleted.
            claim("orphan", "u-o", Some("pv-deleted"), "Bound"),
            // Its author named another team's volume (a pre-binding the volume never took).
            claim("stolen", "u-s", Some("pv-team-b"), "Bound"),
            // The volume is bound to an earlier claim of the same name.
            claim("replaced", "u-new", Some("pv-replaced"), "Bound"),
        ]);
        assert_eq!(
            volume_names(&claims),
            ["pv-deleted", "pv-ok", "pv-replaced", "pv-team-b"]
                .map(String::from)
                .into()
        );
        let volume = |name: &str, claim_namespace: &str, claim: &str, uid: &str| {
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"claimRef": {"namespace": claim_namespace, "name": claim, "uid": uid}}
            }))
            .unwrap();
            (name.to_owned(), pv)
        };
        let volumes = BTreeMap::from([
            volume("pv-ok", "team-a", "ok", "u-ok"),
            volume("pv-team-b", "team-b", "stolen", "u-b"),
            volume("pv-replaced", "team-a", "replaced", "u-old"),
        ]);
        let (bound, gaps) = bound_volumes(&pod, &claims, &volumes);
        assert_eq!(bound.keys().collect::<Vec<_>>(), ["ok"]);
        assert_eq!(bound["ok"].metadata.name.as_deref(), Some("pv-ok"));
        let said: Vec<(&str, &str, String)> = gaps
            .iter()
            .map(|a| (a.reason(), a.pod_reason(), a.to_string()))
            .collect();
        let expected = [
            r#"persistentvolumeclaim "gone" not found"#,
            r#"persistentvolumeclaim "orphan" is bound to persistentvolume "pv-deleted", which does not exist"#,
            r#"persistentvolumeclaim "pending" is not bound"#,
            r#"persistentvolumeclaim "replaced" names persistentvolume "pv-replaced", which is not bound to it"#,
            r#"persistentvolumeclaim "stolen" names persistentvolume "pv-team-b", which is not bound to it"#,
        ]
        .map(|m| ("FailedMount", "ContainerCreating", m.to_owned()));
        assert_eq!(said, expected);
        assert!(gaps.iter().all(|a| !a.optional));
        // A claim is never one of the ConfigMap and Secret gaps.
        assert_eq!(absent(&pod, &BTreeMap::new(), &BTreeMap::new()), Vec::new());
    }

    #[test]
    fn a_disk_outside_the_daemons_zone_keeps_its_pod_waiting_named() {
        let pod = |annotations: Value| -> Pod {
            serde_json::from_value(
                json!({"metadata": {"namespace": "team-a", "annotations": annotations}, "spec": {
                    "containers": [{"name": "a", "image": "a"}],
                    "volumes": [
                        {"name": "far", "persistentVolumeClaim": {"claimName": "far"}},
                        {"name": "near", "persistentVolumeClaim": {"claimName": "near"}},
                        {"name": "nas", "persistentVolumeClaim": {"claimName": "nas"}}]
                }}),
            )
            .unwrap()
        };
        let volume = |name: &str, driver: &str, zone: &str| {
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"csi": {"driver": driver, "volumeHandle": "h", "volumeAttributes": {"server": "s"}},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "topology.diskplugin.csi.alibabacloud.com/zone", "operator": "In", "values": [zone]}]}]}}}
            }))
            .unwrap();
            pv
        };
        let disk = crate::to_eci::claims::DISK_DRIVER;
        let bound = BTreeMap::from([
            ("far".to_owned(), volume("pv-far", disk, "cn-hangzhou-b")),
            ("near".to_owned(), volume("pv-near", disk, "cn-hangzhou-a")),
            (
                "nas".to_owned(),
                volume("pv-nas", crate::to_eci::claims::NAS_DRIVER, "cn-hangzhou-b"),
            ),
        ]);
        let plain = pod(json!({}));
        let gaps = out_of_zone(&plain, &bound, Some("cn-hangzhou-a"));
        let said: Vec<(&str, &str, String)> = gaps
            .iter()
            .map(|a| (a.reason(), a.pod_reason(), a.to_string()))
            .collect();
        assert_eq!(
            said,
            [(
                "FailedMount",
                "ContainerCreating",
                r#"persistentvolumeclaim "far" is bound to persistentvolume "pv-far", a cloud disk in zone "cn-hangzhou-b"; this virtual node creates instances in zone "cn-hangzhou-a" (its vSwitches' zone), and a disk is attached only in its own zone"#
                    .to_owned()
            )]
        );
        assert!(gaps.iter().all(|a| !a.optional));
        for (case, pod, zone) in [
            ("the disk's own zone", &plain, Some("cn-hangzhou-b ")),
            (
                "the daemon's zone unknown (several vSwitches)",
                &plain,
                None,
            ),
            ("an empty zone", &plain, Some(" ")),
            (
                "the pod names its own vSwitches",
                &pod(json!({"k8s.aliyun.com/eci-vswitch": "vsw-b"})),
                Some("cn-hangzhou-a"),
            ),
        ] {
            let far_only: BTreeMap<_, _> = bound
                .iter()
                .filter(|(k, _)| *k == "far")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(out_of_zone(pod, &far_only, zone), Vec::new(), "{case}");
        }
    }
}
