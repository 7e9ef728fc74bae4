//! When service account tokens are issued again, as the kubelet decides it: the refresh rule
//! (80 % of the lifetime or 24 h, up to 10 s early), the claims of a token found in a running
//! container group, which of a pod's tokens a refresh issues and which it keeps, and the tokens
//! held for pods whose group is not created yet.
//!
//! Nothing here reads a clock or draws a random number: the caller passes the time (`now`,
//! seconds since the epoch for JWT claims) and the jitter.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Sub;
use std::time::Duration;

use base64::Engine as _;
use eci_proto::v20180808::ContainerGroup;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::refs::{Token, TokenSource};

/// A token older than this is refreshed whatever its lifetime (the kubelet's `maxTTL`).
pub const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 60 * 60);
/// Refreshes start up to this much early, so tokens issued together are not all refreshed in
/// the same second (the kubelet's `maxJitter`).
pub const MAX_JITTER_SECONDS: u64 = 10;

/// How long until a token should be refreshed: it is `age` old and valid for
/// `lifetime_seconds`; due once 20 % of the lifetime is left (the kubelet's integer
/// arithmetic) or once it is 24 h old, whichever comes first, `jitter` early; zero when past.
pub fn refresh_delay(age: Duration, lifetime_seconds: i64, jitter: Duration) -> Duration {
    let lifetime = u64::try_from(lifetime_seconds).unwrap_or(0);
    let due = Duration::from_secs(lifetime - lifetime * 20 / 100).min(MAX_TOKEN_AGE);
    due.saturating_sub(jitter).saturating_sub(age)
}

/// The jitter drawn from `random`: whole seconds below `limit_seconds` (the kubelet's jitter is
/// whole seconds); zero when the limit is.
pub fn whole_seconds_below(random: u128, limit_seconds: u64) -> Duration {
    let seconds = random.checked_rem(u128::from(limit_seconds)).unwrap_or(0);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// The claims of a JWT, when `text` is one (its payload decoded; nothing verified — the
/// apiserver issued it and only its times are read).
pub fn jwt_claims(text: &str) -> Option<Value> {
    let mut parts = text.trim().split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&payload).ok()
}

/// How long until a token found in an adopted group should be refreshed, from its claims:
/// issued at `iat`, valid until `kubernetes.io.warnafter` when the apiserver extended it (a
/// 3607 s `kube-api-access` token is issued for a year but is meant to be refreshed as 3607 s),
/// else until `exp`. `None` when the claims are not of a token bound to the pod `pod_uid`.
pub fn claims_refresh_delay(
    claims: &Value,
    pod_uid: &str,
    now_unix: i64,
    jitter: Duration,
) -> Option<Duration> {
    let kubernetes = claims.get("kubernetes.io")?;
    if kubernetes.pointer("/pod/uid").and_then(Value::as_str) != Some(pod_uid) {
        return None;
    }
    let issued = claims.get("iat").and_then(Value::as_i64)?;
    let valid_until = kubernetes
        .get("warnafter")
        .and_then(Value::as_i64)
        .or_else(|| claims.get("exp").and_then(Value::as_i64))?;
    let age = Duration::from_secs(u64::try_from(now_unix - issued).unwrap_or(0));
    Some(refresh_delay(age, valid_until - issued, jitter))
}

/// The text of a group's file (ECI keeps file contents base64-encoded), when it is UTF-8.
fn file_text(content: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(content)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// How long until `text`, a file of a group, is due for a refresh: `None` unless it is a JWT
/// bound to the pod `pod_uid`.
fn file_refresh_delay(
    text: &str,
    pod_uid: &str,
    now_unix: i64,
    jitter: Duration,
) -> Option<Duration> {
    claims_refresh_delay(&jwt_claims(text)?, pod_uid, now_unix, jitter)
}

/// The earliest refresh of the tokens in an adopted group's volumes (`None`: none found).
pub fn group_refresh_delay(
    group: &ContainerGroup,
    pod_uid: &str,
    now_unix: i64,
    jitter: Duration,
) -> Option<Duration> {
    group
        .volumes
        .iter()
        .filter_map(|v| v.config_file_volume.as_ref())
        .flat_map(|v| &v.config_file_to_path)
        .filter_map(|file| file_text(&file.content))
        .filter_map(|text| file_refresh_delay(&text, pod_uid, now_unix, jitter))
        .min()
}

/// The tokens a group holds for the pod's sources, and how long until each is due (no
/// jitter): every `serviceAccountToken` file of the pod's projected volumes, read back from
/// the group's volume of the same name, when it is a JWT bound to the pod. A source whose file
/// cannot be read is missing (and is issued again).
pub fn held_tokens(
    pod: &Pod,
    group: &ContainerGroup,
    now_unix: i64,
) -> BTreeMap<TokenSource, (Token, Duration)> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut held = BTreeMap::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let Some(files) = group
            .volumes
            .iter()
            .find(|v| v.name == volume.name)
            .and_then(|v| v.config_file_volume.as_ref())
        else {
            continue;
        };
        for projection in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
            .filter_map(|source| source.service_account_token.as_ref())
        {
            let Some(token) = files
                .config_file_to_path
                .iter()
                .find(|file| file.path == projection.path)
                .and_then(|file| file_text(&file.content))
            else {
                continue;
            };
            if let Some(due) = file_refresh_delay(&token, uid, now_unix, Duration::ZERO) {
                held.entry(TokenSource::of(projection))
                    .or_insert((Token::new(token), due));
            }
        }
    }
    held
}

/// What a refresh does: the sources to issue now (not held, or due within the jitter window)
/// and, of the tokens kept, how long until the first is due.
pub fn plan(
    sources: &BTreeSet<TokenSource>,
    held: &BTreeMap<TokenSource, (Token, Duration)>,
) -> (BTreeSet<TokenSource>, Option<Duration>) {
    let window = Duration::from_secs(MAX_JITTER_SECONDS);
    let (kept, issue): (Vec<_>, Vec<_>) = sources
        .iter()
        .partition(|source| matches!(held.get(*source), Some((_, due)) if *due > window));
    let kept = kept
        .iter()
        .filter_map(|source| held.get(*source))
        .map(|(_, due)| *due)
        .min();
    (issue.into_iter().cloned().collect(), kept)
}

/// Tokens issued for pods whose group is not created yet, by pod UID: a create that fails and
/// is retried (a Secret still missing) reuses them instead of asking the apiserver for new ones
/// at every attempt. A token is reused for the same pod UID and the same source (audience and
/// validity) until its refresh point (an `At`, the caller's clock); the entry goes once the
/// group exists (the refresher keeps the tokens from then on) or the pod is gone.
#[derive(Debug)]
pub struct Unplaced<At> {
    by_pod: HashMap<String, BTreeMap<TokenSource, (Token, At)>>,
}

impl<At> Default for Unplaced<At> {
    fn default() -> Self {
        Self {
            by_pod: HashMap::new(),
        }
    }
}

/// Tokens reused, each with its time left, and the sources that need a new token.
pub type Reusable = (
    BTreeMap<TokenSource, (Token, Duration)>,
    BTreeSet<TokenSource>,
);

impl<At: Copy + Ord + Sub<Output = Duration>> Unplaced<At> {
    /// Of `sources`, the tokens held for `uid` that are not due at `now` (each with its time
    /// left) and the sources that need a new token.
    pub fn reusable(&self, uid: &str, sources: &BTreeSet<TokenSource>, now: At) -> Reusable {
        let held = self.by_pod.get(uid);
        let mut reused = BTreeMap::new();
        let mut missing = BTreeSet::new();
        for source in sources {
            match held.and_then(|held| held.get(source)) {
                Some((token, due)) if *due > now => {
                    reused.insert(source.clone(), (token.clone(), *due - now));
                }
                _ => {
                    missing.insert(source.clone());
                }
            }
        }
        (reused, missing)
    }

    /// Keeps `token`, issued for `uid` and due at `due`.
    pub fn keep(&mut self, uid: &str, source: TokenSource, token: Token, due: At) {
        self.by_pod
            .entry(uid.to_owned())
            .or_default()
            .insert(source, (token, due));
    }

    /// Drops the tokens due at `now` (a pod that never started does not keep them).
    pub fn prune(&mut self, now: At) {
        self.by_pod.retain(|_, held| {
            held.retain(|_, (_, due)| *due > now);
            !held.is_empty()
        });
    }
}

impl<At> Unplaced<At> {
    /// Drops `uid`'s tokens: its group exists, or it is gone.
    pub fn forget(&mut self, uid: &str) {
        self.by_pod.remove(uid);
    }

    /// Pods holding tokens.
    pub fn len(&self) -> usize {
        self.by_pod.len()
    }

    /// Whether no pod holds tokens.
    pub fn is_empty(&self) -> bool {
        self.by_pod.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use serde_json::json;

    use super::*;
    use crate::refs;

    #[test]
    fn the_kubelets_refresh_rule() {
        let s = Duration::from_secs;
        // (age, lifetime, jitter) → due in
        for (age, lifetime, jitter, due) in [
            (0, 600, 0, 480),        // 80 % of the API's minimum
            (0, 3600, 0, 2880),      // the default
            (0, 3607, 0, 2886),      // kube-api-access: 3607 − 721 (integer 20 %)
            (0, 600, 7, 473),        // jitter: earlier, never later
            (100, 600, 0, 380),      // an older token is due sooner
            (479, 600, 0, 1),        //
            (500, 600, 0, 0),        // overdue: now
            (0, 172_800, 0, 86_400), // 48 h token: the 24 h age limit comes first
            (0, 108_000, 0, 86_400), // 30 h: 80 % is 24 h exactly
            (0, 0, 0, 0),            // nonsense lifetimes refresh at once
            (0, -5, 0, 0),
        ] {
            assert_eq!(
                refresh_delay(s(age), lifetime, s(jitter)),
                s(due),
                "age {age}, lifetime {lifetime}, jitter {jitter}"
            );
        }
    }

    fn jwt(claims: &Value) -> String {
        let encode = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.{}",
            encode(br#"{"alg":"RS256"}"#),
            encode(claims.to_string().as_bytes()),
            encode(b"signature")
        )
    }

    #[test]
    fn adopted_tokens_are_scheduled_from_their_claims() {
        let pod = |uid: &str| json!({"namespace": "shop", "pod": {"name": "web", "uid": uid}});
        let now = 1_000_000;
        let s = Duration::from_secs;
        // (claims, pod uid asked about) → due in
        let cases = [
            // A 600 s token issued 100 s ago: 380 s left until 80 %.
            (
                json!({"iat": now - 100, "exp": now + 500, "kubernetes.io": pod("u1")}),
                "u1",
                Some(s(380)),
            ),
            // kube-api-access: issued for a year, meant as 3607 s (warnafter).
            (
                json!({"iat": now - 2000, "exp": now + 31_536_000, "kubernetes.io": {"warnafter": now + 1607, "pod": {"uid": "u1"}}}),
                "u1",
                Some(s(886)),
            ),
            // Past due.
            (
                json!({"iat": now - 590, "exp": now + 10, "kubernetes.io": pod("u1")}),
                "u1",
                Some(s(0)),
            ),
            // Another pod's token, or no pod binding: not ours to schedule.
            (
                json!({"iat": now, "exp": now + 600, "kubernetes.io": pod("u2")}),
                "u1",
                None,
            ),
            (
                json!({"iat": now, "exp": now + 600, "sub": "system:serviceaccount:shop:default"}),
                "u1",
                None,
            ),
            (
                json!({"exp": now + 600, "kubernetes.io": pod("u1")}),
                "u1",
                None,
            ),
        ];
        for (claims, uid, due) in cases {
            let read = jwt_claims(&jwt(&claims)).unwrap();
            assert_eq!(
                claims_refresh_delay(&read, uid, now, Duration::ZERO),
                due,
                "{claims}"
            );
        }
        assert_eq!(jwt_claims("not a token"), None);
        assert_eq!(jwt_claims("a.b.c.d"), None);

        // In a group: the earliest token bound to the pod; other files are skipped.
        let file = |content: &str| json!({"path": "f", "content": base64::engine::general_purpose::STANDARD.encode(content)});
        let group: eci_proto::v20180808::ContainerGroup = serde_json::from_value(json!({
            "container_group_id": "eci-1",
            "volumes": [
                {"name": "config", "type": "ConfigFileVolume", "config_file_volume": {"config_file_to_path": [file("debug: true")]}},
                {"name": "api", "type": "ConfigFileVolume", "config_file_volume": {"config_file_to_path": [
                    file(&jwt(&json!({"iat": now, "exp": now + 3600, "kubernetes.io": pod("u1")}))),
                    file(&jwt(&json!({"iat": now, "exp": now + 600, "aud": ["vault"], "kubernetes.io": pod("u1")}))),
                    file("ca.crt contents"),
                ]}},
            ],
        }))
        .unwrap();
        assert_eq!(
            group_refresh_delay(&group, "u1", now, Duration::ZERO),
            Some(s(480))
        );
        assert_eq!(group_refresh_delay(&group, "u2", now, Duration::ZERO), None);
    }

    #[test]
    fn only_due_tokens_are_issued_again() {
        let now = 1_000_000;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": "web", "uid": "u1"},
            "spec": {"containers": [{"name": "app", "image": "app"}], "volumes": [
                {"name": "api", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
                {"name": "vault", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "audience": "vault", "expirationSeconds": 600}}]}},
                {"name": "lost", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "audience": "lost"}}]}},
            ]},
        }))
        .unwrap();
        let bound = json!({"namespace": "shop", "pod": {"name": "web", "uid": "u1"}, "warnafter": now - 100 + 3607});
        let api = jwt(&json!({"iat": now - 100, "exp": now + 31_536_000, "kubernetes.io": bound}));
        let vault = jwt(
            &json!({"iat": now - 475, "exp": now + 125, "aud": ["vault"], "kubernetes.io": {"pod": {"uid": "u1"}}}),
        );
        let file = |path: &str, content: &str| json!({"path": path, "content": base64::engine::general_purpose::STANDARD.encode(content)});
        let group: eci_proto::v20180808::ContainerGroup = serde_json::from_value(json!({
            "container_group_id": "eci-1",
            "volumes": [
                {"name": "api", "type": "ConfigFileVolume", "config_file_volume": {"config_file_to_path": [file("token", &api), file("ca.crt", "CA")]}},
                {"name": "vault", "type": "ConfigFileVolume", "config_file_volume": {"config_file_to_path": [file("token", &vault)]}},
                {"name": "lost", "type": "ConfigFileVolume", "config_file_volume": {"config_file_to_path": [file("token", "not a JWT")]}},
            ],
        }))
        .unwrap();
        let source = |audience: &str, expiration_seconds| TokenSource {
            audience: audience.into(),
            expiration_seconds,
        };
        let held = held_tokens(&pod, &group, now);
        assert_eq!(held.len(), 2, "the unreadable one is not held");
        let (token, due) = &held[&source("", 3607)];
        assert_eq!(
            (token.expose(), *due),
            (api.as_str(), Duration::from_secs(2786))
        );
        assert_eq!(held[&source("vault", 600)].1, Duration::from_secs(5));
        let sources = refs::token_volume_references(&pod).tokens;
        let (issue, kept) = plan(&sources, &held);
        assert_eq!(
            issue,
            [source("lost", 3600), source("vault", 600)].into(),
            "due within the jitter window, or not readable"
        );
        assert_eq!(kept, Some(Duration::from_secs(2786)));
        // Nothing held (a group whose files cannot be read): everything is issued.
        let (issue, kept) = plan(&sources, &BTreeMap::new());
        assert_eq!((issue, kept), (sources, None));
    }

    #[test]
    fn jitter_is_whole_seconds_below_the_limit() {
        for (random, limit, seconds) in [
            (0, 10, 0),
            (9, 10, 9),
            (10, 10, 0),
            (u128::MAX, 10, 5),
            (7, 0, 0),
        ] {
            assert_eq!(
                whole_seconds_below(random, limit),
                Duration::from_secs(seconds),
                "{random} below {limit}"
            );
        }
    }

    #[test]
    fn unplaced_tokens_are_reused_until_their_refresh_point() {
        let source = |audience: &str| TokenSource {
            audience: audience.into(),
            expiration_seconds: 600,
        };
        let s = Duration::from_secs;
        // The clock is a Duration since some origin.
        let mut unplaced = Unplaced::<Duration>::default();
        unplaced.keep("u1", source(""), Token::new("t1".into()), s(480));
        unplaced.keep("u2", source(""), Token::new("t2".into()), s(100));
        let both = BTreeSet::from([source(""), source("vault")]);
        let (reused, missing) = unplaced.reusable("u1", &both, s(30));
        assert_eq!(reused[&source("")], (Token::new("t1".into()), s(450)));
        assert_eq!(missing, BTreeSet::from([source("vault")]));
        let (reused, missing) = unplaced.reusable("u1", &both, s(480));
        assert!(reused.is_empty(), "due at its refresh point");
        assert_eq!(missing, both);
        unplaced.prune(s(200));
        assert_eq!(unplaced.len(), 1, "u2's token was due");
        unplaced.forget("u1");
        assert!(unplaced.is_empty());
    }
}
