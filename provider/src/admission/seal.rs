//! The seal on a deferred Selector effect: the webhook writes the effect on the pod
//! ([`PENDING_EFFECT_ANNOTATION`]) for the daemon to apply at binding, and a pod author can
//! write any annotation — so the webhook signs it (HMAC-SHA256) and the daemon applies only
//! what verifies.
//!
//! - The key is shared by every replica through a Secret in the daemon's namespace (created by
//!   the first replica that needs it; tenants cannot read it).
//! - The signed text binds the pod's namespace and its `generateName` (or its name, when it has
//!   none: at admission a generated name is not chosen yet) to the effect, so a sealed effect
//!   copied onto a pod of another namespace or another workload does not verify.
//! - An effect without a seal (written by a tenant, or by a version before the seal) is refused
//!   like a forged one.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::sync::OnceCell;
use vne_core::selector::engine::{PENDING_EFFECT_ANNOTATION, PendingEffect};

/// The Secret (in the daemon's namespace) holding the key.
pub const SECRET: &str = "virtual-node-eci-selector-seal";
/// Its data key.
const KEY_FIELD: &str = "key";
/// Key length in bytes (HMAC-SHA256's block-size-independent recommendation: the digest's).
const KEY_LEN: usize = 32;

/// The key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The Secret could not be read or created.
    #[error("Selector seal Secret {name}")]
    Secret {
        /// `<namespace>/<name>`.
        name: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The Secret holds no key of the right length.
    #[error("Selector seal Secret {0} holds no {KEY_LEN}-byte `{KEY_FIELD}`")]
    Unusable(String),
    /// No random bytes for a new key.
    #[error("no random bytes for a Selector seal key")]
    Random,
}

/// The HMAC key (never printed).
pub struct SealKey(hmac::Key);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// What a pod's deferred effect turned out to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Checked {
    /// The pod has none.
    Absent,
    /// Sealed by the webhook: the metadata merge patch that applies it.
    Sealed(serde_json::Value),
    /// Not the webhook's: ignored; why, for the Event.
    Refused(String),
}

impl SealKey {
    /// A key from its bytes.
    pub fn new(bytes: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// What is signed: the pod's namespace and workload identity, and the effect (without its
    /// seal; BTreeMaps serialise in one order).
    fn message(pod: &Pod, effect: &PendingEffect) -> Vec<u8> {
        let mut unsealed = effect.clone();
        unsealed.seal.clear();
        let text = serde_json::to_string(&unsealed).unwrap_or_default();
        let identity = match pod.metadata.generate_name.as_deref() {
            Some(prefix) if !prefix.is_empty() => format!("generateName:{prefix}"),
            _ => format!("name:{}", pod.metadata.name.as_deref().unwrap_or_default()),
        };
        format!(
            "virtual-node-eci pending-effect v1\0{}\0{identity}\0{text}",
            pod.namespace().unwrap_or_default()
        )
        .into_bytes()
    }

    /// Seals the deferred effect the engine wrote on `pod` (if any) in place.
    pub fn seal(&self, pod: &mut Pod) {
        let Some(text) = pod.annotations().get(PENDING_EFFECT_ANNOTATION) else {
            return;
        };
        let Ok(mut effect) = serde_json::from_str::<PendingEffect>(text) else {
            return;
        };
        let tag = hmac::sign(&self.0, &Self::message(pod, &effect));
        effect.seal = base64::engine::general_purpose::STANDARD.encode(tag.as_ref());
        let sealed = serde_json::to_string(&effect).unwrap_or_default();
        pod.annotations_mut()
            .insert(PENDING_EFFECT_ANNOTATION.to_owned(), sealed);
    }

    /// Checks `pod`'s deferred effect.
    pub fn check(&self, pod: &Pod) -> Checked {
        let Some(text) = pod.annotations().get(PENDING_EFFECT_ANNOTATION) else {
            return Checked::Absent;
        };
        let Ok(effect) = serde_json::from_str::<PendingEffect>(text) else {
            return Checked::Refused(format!("{PENDING_EFFECT_ANNOTATION} is not an effect"));
        };
        if effect.seal.is_empty() {
            return Checked::Refused(format!(
                "{PENDING_EFFECT_ANNOTATION} carries no seal: not written by the Selector webhook"
            ));
        }
        let Ok(tag) = base64::engine::general_purpose::STANDARD.decode(&effect.seal) else {
            return Checked::Refused(format!("{PENDING_EFFECT_ANNOTATION}'s seal is not base64"));
        };
        if hmac::verify(&self.0, &Self::message(pod, &effect), &tag).is_err() {
            return Checked::Refused(format!(
                "{PENDING_EFFECT_ANNOTATION}'s seal does not verify: altered, copied from another pod, or not written by the Selector webhook"
            ));
        }
        Checked::Sealed(vne_core::selector::engine::effect_patch(&effect))
    }
}

static SHARED: OnceCell<Arc<SealKey>> = OnceCell::const_new();

/// The key every replica shares (read once per process from `<namespace>/`[`SECRET`], which
/// the first replica to need it creates).
pub async fn shared_key(client: &kube::Client, namespace: &str) -> Result<Arc<SealKey>, SealError> {
    SHARED
        .get_or_try_init(|| async { load(client, namespace).await.map(Arc::new) })
        .await
        .cloned()
}

/// The key as loaded already, if it is.
pub fn loaded() -> Option<Arc<SealKey>> {
    SHARED.get().cloned()
}

fn key_of(secret: &Secret, name: &str) -> Result<SealKey, SealError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEY_FIELD))
        .filter(|bytes| bytes.0.len() == KEY_LEN)
        .map(|bytes| SealKey::new(&bytes.0))
        .ok_or_else(|| SealError::Unusable(name.to_owned()))
}

async fn load(client: &kube::Client, namespace: &str) -> Result<SealKey, SealError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = format!("{namespace}/{SECRET}");
    let error = |source| SealError::Secret {
        name: name.clone(),
        source,
    };
    if let Some(existing) = secrets.get_opt(SECRET).await.map_err(error)? {
        return key_of(&existing, &name);
    }
    let mut bytes = [0_u8; KEY_LEN];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| SealError::Random)?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(SECRET.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "virtual-node-eci".to_owned(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            KEY_FIELD.to_owned(),
            ByteString(bytes.to_vec()),
        )])),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(secret = %name, "generated the shared Selector seal key");
            Ok(SealKey::new(&bytes))
        }
        // Another replica was first: use theirs.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            key_of(&secrets.get(SECRET).await.map_err(error)?, &name)
        }
        Err(e) => Err(error(e)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[allow(clippy::needless_pass_by_value)] // json! borrows
    fn pod(metadata: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": metadata})).unwrap()
    }

    fn effect(labels: &[(&str, &str)]) -> String {
        serde_json::to_string(&PendingEffect {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            annotations: BTreeMap::from([(
                "k8s.aliyun.com/eci-use-specs".to_owned(),
                "2-4Gi".to_owned(),
            )]),
            seal: String::new(),
        })
        .unwrap()
    }

    /// The pod as the webhook sees it at admission (a generated name not chosen yet), sealed.
    fn admitted(key: &SealKey) -> Pod {
        let mut pod = pod(json!({
            "namespace": "team-a", "generateName": "web-7d9-",
            "annotations": {PENDING_EFFECT_ANNOTATION: effect(&[("eci", "true")])},
        }));
        key.seal(&mut pod);
        pod
    }

    fn with(pod: &Pod, change: impl FnOnce(&mut Pod)) -> Pod {
        let mut pod = pod.clone();
        change(&mut pod);
        pod
    }

    fn annotation(pod: &mut Pod) -> &mut String {
        pod.annotations_mut()
            .get_mut(PENDING_EFFECT_ANNOTATION)
            .unwrap()
    }

    #[test]
    fn only_the_webhooks_seal_on_this_pods_effect_verifies() {
        let key = SealKey::new(&[7; KEY_LEN]);
        let sealed = admitted(&key);
        // Bound later: the apiserver chose the name, the daemon checks.
        let bound = with(&sealed, |p| p.metadata.name = Some("web-7d9-x2k4p".into()));
        let sealed_text = sealed.annotations()[PENDING_EFFECT_ANNOTATION].clone();
        let table: Vec<(&str, Pod, bool)> = vec![
            ("as sealed, named since", bound.clone(), true),
            (
                "written by the pod's author, no seal",
                with(&bound, |p| *annotation(p) = effect(&[("eci", "true")])),
                false,
            ),
            (
                "the effect altered after sealing",
                with(&bound, |p| {
                    *annotation(p) = sealed_text.replace("2-4Gi", "64-256Gi");
                }),
                false,
            ),
            (
                "copied onto a pod of another namespace",
                with(&bound, |p| p.metadata.namespace = Some("team-b".into())),
                false,
            ),
            (
                "copied onto another workload's pod",
                with(&bound, |p| {
                    p.metadata.generate_name = Some("db-5c8-".into());
                }),
                false,
            ),
            (
                "copied onto a pod with a name of its own",
                with(&bound, |p| p.metadata.generate_name = None),
                false,
            ),
            (
                "a seal that is not base64",
                with(&bound, |p| {
                    let mut value: serde_json::Value = serde_json::from_str(&sealed_text).unwrap();
                    value["seal"] = json!("%%%");
                    *annotation(p) = value.to_string();
                }),
                false,
            ),
            (
                "not an effect at all",
                with(&bound, |p| *annotation(p) = "[1, 2]".into()),
                false,
            ),
        ];
        for (case, pod, verifies) in table {
            let checked = key.check(&pod);
            assert_eq!(
                matches!(checked, Checked::Sealed(_)),
                verifies,
                "{case}: {checked:?}"
            );
            if !verifies {
                assert!(matches!(checked, Checked::Refused(_)), "{case}");
            }
        }
        let other_key = SealKey::new(&[8; KEY_LEN]);
        assert!(
            matches!(other_key.check(&bound), Checked::Refused(_)),
            "another cluster's key"
        );
        assert_eq!(key.check(&pod(json!({"namespace": "a"}))), Checked::Absent);
    }

    #[test]
    fn a_verified_effect_applies_what_was_sealed_and_removes_the_annotation() {
        let key = SealKey::new(&[7; KEY_LEN]);
        let pod = with(&admitted(&key), |p| p.metadata.name = Some("web-1".into()));
        let Checked::Sealed(patch) = key.check(&pod) else {
            panic!("{:?}", key.check(&pod));
        };
        assert_eq!(
            patch,
            json!({"metadata": {
                "labels": {"eci": "true"},
                "annotations": {"k8s.aliyun.com/eci-use-specs": "2-4Gi", PENDING_EFFECT_ANNOTATION: null},
            }})
        );
    }

    #[test]
    fn a_named_pod_is_sealed_by_its_name() {
        let key = SealKey::new(&[7; KEY_LEN]);
        let mut named = pod(json!({
            "namespace": "team-a", "name": "web",
            "annotations": {PENDING_EFFECT_ANNOTATION: effect(&[])},
        }));
        key.seal(&mut named);
        assert!(matches!(key.check(&named), Checked::Sealed(_)));
        let renamed = with(&named, |p| p.metadata.name = Some("other".into()));
        assert!(matches!(key.check(&renamed), Checked::Refused(_)));
    }

    #[test]
    fn the_key_is_never_printed() {
        assert_eq!(format!("{:?}", SealKey::new(&[7; KEY_LEN])), "SealKey(..)");
    }
}
