//! Who is calling a listener of the daemon, asked of the Kubernetes API as the kubelet asks it:
//! a client certificate chaining to the cluster's client CA (user = CN, groups = O), else a
//! bearer token a TokenReview accepts; then SubjectAccessReviews on what the caller wants.
//! Answers are cached with the kubelet's TTLs in bounded caches. The kubelet API
//! (`kubelet::auth`) and the scheduler extender (`placement::extender::caller`) both use it.
//!
//! The TLS layer only asks for a certificate and checks that the client holds its key
//! ([`RequestClientCertificate`]); the chain is verified per request against the CA in force
//! then ([`ClientCa::user`]) — as the kubelet's `RequestClientCert` plus x509 authenticator
//! do — so a CA rotation needs no new listener and an unknown certificate is a 401, not a
//! failed handshake.

use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::k8s::access::{Access, Scope};

/// The Kubernetes API accesses authentication and authorization make.
pub const KUBE_API: &[Access] = &[
    Access {
        scope: Scope::Cluster,
        group: "authentication.k8s.io",
        resource: "tokenreviews",
        verbs: &["create"],
        why: "the kubelet API and the scheduler extender check bearer tokens with a TokenReview",
    },
    Access {
        scope: Scope::Cluster,
        group: "authorization.k8s.io",
        resource: "subjectaccessreviews",
        verbs: &["create"],
        why: "the kubelet API asks a SubjectAccessReview whether a caller may use nodes/<subresource> of this node; the scheduler extender whether it may create pods/binding",
    },
    Access {
        scope: Scope::Cluster,
        group: "",
        resource: "configmaps",
        verbs: &["get"],
        why: "the client CA of the kubelet API and the scheduler extender: client-ca-file of kube-system/extension-apiserver-authentication",
    },
];

/// Where the cluster publishes the CA of client certificates it issues.
const CLIENT_CA_CONFIGMAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");
/// The key in it.
const CLIENT_CA_KEY: &str = "client-ca-file";
/// How often the client CA is read again (a rotation is picked up within this).
const CLIENT_CA_REFRESH: Duration = Duration::from_secs(60);
/// How long a token's review is trusted: the kubelet's `authentication.webhook.cacheTTL`.
const TOKEN_TTL: Duration = Duration::from_secs(120);
/// How long a refused token stays refused without asking again.
const REFUSED_TOKEN_TTL: Duration = Duration::from_secs(10);
/// How long an allowed access is trusted: the kubelet's `authorization.webhook.cacheAuthorizedTTL`.
const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denied access stays denied: `cacheUnauthorizedTTL`.
const DENIED_TTL: Duration = Duration::from_secs(30);
/// Entries per cache; beyond it the entry closest to expiry goes.
const CACHE_CAPACITY: usize = 4096;

/// Deciding about a request failed (not: the request was refused).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The TokenReview could not be made.
    #[error("TokenReview failed")]
    TokenReview(#[source] kube::Error),
    /// The SubjectAccessReview could not be made.
    #[error("SubjectAccessReview failed")]
    AccessReview(#[source] kube::Error),
    /// The client CA could not be read from the cluster.
    #[error("cannot read {}/{}", CLIENT_CA_CONFIGMAP.0, CLIENT_CA_CONFIGMAP.1)]
    ClientCaConfigMap(#[source] kube::Error),
    /// The client CA ConfigMap has no `client-ca-file`.
    #[error("{}/{} has no {CLIENT_CA_KEY}", CLIENT_CA_CONFIGMAP.0, CLIENT_CA_CONFIGMAP.1)]
    NoClientCa,
    /// The client CA file could not be read.
    #[error("cannot read the client CA file {path}")]
    ClientCaFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The client CA is not a PEM bundle of CA certificates.
    #[error("the client CA is not a PEM bundle of certificates")]
    ClientCaPem(#[source] rustls::pki_types::pem::Error),
    /// A certificate of the client CA bundle is not usable as a trust anchor.
    #[error("the client CA holds a certificate that cannot be a trust anchor")]
    ClientCaAnchor(#[source] webpki::Error),
    /// The client CA bundle holds no certificate.
    #[error("the client CA holds no certificate")]
    EmptyClientCa,
}

/// An authenticated caller, as Kubernetes describes users.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UserInfo {
    /// The user name.
    pub name: String,
    /// Its uid, when the authenticator knows one.
    pub uid: Option<String>,
    /// Its groups.
    pub groups: Vec<String>,
    /// Extra attributes (a token's pod binding, …), passed on to the SubjectAccessReview.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a SubjectAccessReview asks about a resource (its `resourceAttributes`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceQuestion {
    /// The verb.
    pub verb: &'static str,
    /// The API group (`""`: core).
    pub group: &'static str,
    /// The resource.
    pub resource: &'static str,
    /// The subresource (`""`: none).
    pub subresource: &'static str,
    /// The namespace (`""`: every namespace, or a cluster-scoped resource).
    pub namespace: String,
    /// The object's name (`""`: any).
    pub name: String,
}

impl ResourceQuestion {
    /// The kubelet's question: `verb` on `nodes/<subresource>` of `node`.
    pub fn node(verb: &'static str, subresource: &'static str, node: &str) -> Self {
        Self {
            verb,
            group: "",
            resource: "nodes",
            subresource,
            namespace: String::new(),
            name: node.to_owned(),
        }
    }
}

/// The questions asked of the Kubernetes API (a trait, so the caches are tested without one).
#[async_trait::async_trait]
pub trait Reviewer: Send + Sync + 'static {
    /// Who `token` is; `None` when the API does not accept it.
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, AuthError>;
    /// Whether `user` may do what `question` asks.
    async fn review_access(
        &self,
        user: &UserInfo,
        question: &ResourceQuestion,
    ) -> Result<bool, AuthError>;
}

/// The reviews, made through the Kubernetes API.
#[derive(Clone)]
pub struct ApiReviewer {
    client: kube::Client,
}

impl std::fmt::Debug for ApiReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiReviewer").finish_non_exhaustive()
    }
}

impl ApiReviewer {
    /// Reviews through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

#[async_trait::async_trait]
impl Reviewer for ApiReviewer {
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, AuthError> {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                // No audiences: the apiserver's own, as the kubelet asks.
                audiences: None,
                token: Some(token.to_owned()),
            },
            ..TokenReview::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(AuthError::TokenReview)?;
        let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(None);
        };
        let user = status.user.unwrap_or_default();
        Ok(user
            .username
            .filter(|name| !name.is_empty())
            .map(|name| UserInfo {
                name,
                uid: user.uid.filter(|uid| !uid.is_empty()),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }))
    }

    async fn review_access(
        &self,
        user: &UserInfo,
        question: &ResourceQuestion,
    ) -> Result<bool, AuthError> {
        let reviews: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let some = |value: &str| (!value.is_empty()).then(|| value.to_owned());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(question.group.to_owned()),
                    resource: Some(question.resource.to_owned()),
                    subresource: some(question.subresource),
                    namespace: some(&question.namespace),
                    name: some(&question.name),
                    verb: Some(question.verb.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(AuthError::AccessReview)?;
        Ok(answer.status.is_some_and(|status| status.allowed))
    }
}

/// A map whose entries expire, holding at most `capacity` of them.
#[derive(Debug)]
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        let entries = self.entries.lock();
        entries
            .get(key)
            .filter(|(expires, _)| *expires > now)
            .map(|(_, value)| value.clone())
    }

    fn insert(&self, key: K, value: V, ttl: Duration, now: Instant) {
        let mut entries = self.entries.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= self.capacity {
                // Full of live entries (a flood of distinct tokens): the one closest to expiry goes.
                if let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, (expires, _))| *expires)
                    .map(|(key, _)| key.clone())
                {
                    entries.remove(&oldest);
                }
            }
        }
        entries.insert(key, (now + ttl, value));
    }

    fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

/// An access question, as cached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AccessKey {
    user: UserInfo,
    question: ResourceQuestion,
}

/// The CA client certificates must chain to, replaceable while serving.
#[derive(Debug, Default)]
pub struct ClientCa {
    anchors: RwLock<Arc<Vec<rustls::pki_types::TrustAnchor<'static>>>>,
    /// The PEM the anchors came from (a re-read that finds the same is not a change).
    pem: RwLock<Vec<u8>>,
}

impl ClientCa {
    /// Trusts the certificates of a PEM bundle from now on. Returns whether it changed.
    pub fn set_pem(&self, pem: &[u8]) -> Result<bool, AuthError> {
        if *self.pem.read() == pem {
            return Ok(false);
        }
        let ders = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(AuthError::ClientCaPem)?;
        if ders.is_empty() {
            return Err(AuthError::EmptyClientCa);
        }
        let anchors = ders
            .iter()
            .map(|der| {
                webpki::anchor_from_trusted_cert(der)
                    .map(|anchor| anchor.to_owned())
                    .map_err(AuthError::ClientCaAnchor)
            })
            .collect::<Result<Vec<_>, _>>()?;
        *self.anchors.write() = Arc::new(anchors);
        *self.pem.write() = pem.to_vec();
        Ok(true)
    }

    fn anchors(&self) -> Arc<Vec<rustls::pki_types::TrustAnchor<'static>>> {
        Arc::clone(&self.anchors.read())
    }

    /// The user a client certificate chain names (CN; groups = O), when it chains to this CA
    /// for client authentication and is valid at `now`.
    pub fn user(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> Option<UserInfo> {
        let (leaf, intermediates) = chain.split_first()?;
        let anchors = self.anchors();
        if anchors.is_empty() {
            return None;
        }
        let end_entity = webpki::EndEntityCert::try_from(leaf).ok()?;
        let algorithms = rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .all;
        if let Err(error) = end_entity.verify_for_usage(
            algorithms,
            &anchors,
            intermediates,
            now,
            webpki::KeyUsage::client_auth(),
            None,
            None,
        ) {
            debug!(%error, "a client certificate does not chain to the client CA");
            return None;
        }
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf).ok()?;
        let subject = parsed.subject();
        let name = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .filter(|cn| !cn.is_empty())?
            .to_owned();
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        Some(UserInfo {
            name,
            uid: None,
            groups,
            extra: BTreeMap::new(),
        })
    }
}

/// Where the client CA comes from.
#[derive(Clone)]
pub enum ClientCaSource {
    /// A PEM file (`KUBELET_CLIENT_CA_FILE`, `PLACEMENT_EXTENDER_CLIENT_CA_FILE`).
    File(PathBuf),
    /// The cluster's `kube-system/extension-apiserver-authentication`.
    Cluster(kube::Client),
}

impl std::fmt::Debug for ClientCaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl ClientCaSource {
    async fn read(&self) -> Result<Vec<u8>, AuthError> {
        match self {
            Self::File(path) => {
                tokio::fs::read(path)
                    .await
                    .map_err(|source| AuthError::ClientCaFile {
                        path: path.clone(),
                        source,
                    })
            }
            Self::Cluster(client) => {
                let maps: Api<ConfigMap> = Api::namespaced(client.clone(), CLIENT_CA_CONFIGMAP.0);
                let map = maps
                    .get(CLIENT_CA_CONFIGMAP.1)
                    .await
                    .map_err(AuthError::ClientCaConfigMap)?;
                map.data
                    .and_then(|mut data| data.remove(CLIENT_CA_KEY))
                    .map(String::into_bytes)
                    .ok_or(AuthError::NoClientCa)
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::Cluster(_) => format!(
                "{}/{} {CLIENT_CA_KEY}",
                CLIENT_CA_CONFIGMAP.0, CLIENT_CA_CONFIGMAP.1
            ),
        }
    }

    /// Reads the CA into `target` once; a failure is logged and leaves the CA as it was (no CA
    /// yet: client certificates are refused, bearer tokens still work).
    pub async fn load_into(&self, target: &ClientCa) {
        match self.read().await.and_then(|pem| target.set_pem(&pem)) {
            Ok(true) => info!(source = %self.describe(), "client CA loaded"),
            Ok(false) => {}
            Err(error) => warn!(
                source = %self.describe(),
                error = %tls_serve::Chain(&error),
                "cannot load the client CA; client certificates are refused until it loads"
            ),
        }
    }

    /// Keeps `target` current until `stop`.
    pub async fn keep_current(self, target: Arc<ClientCa>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(CLIENT_CA_REFRESH) => {}
            }
            self.load_into(&target).await;
        }
    }
}

/// Who is calling: a client certificate of the client CA, else a bearer token a TokenReview
/// accepts; token reviews are cached.
pub struct Authenticator {
    reviewer: Arc<dyn Reviewer>,
    client_ca: Arc<ClientCa>,
    tokens: TtlCache<[u8; 32], Option<UserInfo>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("cached_tokens", &self.tokens.len())
            .finish_non_exhaustive()
    }
}

/// The bearer token of an `Authorization` header.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Authenticator {
    /// Asking `reviewer` about tokens, trusting client certificates of `client_ca`.
    pub fn new(reviewer: Arc<dyn Reviewer>, client_ca: Arc<ClientCa>) -> Self {
        Self {
            reviewer,
            client_ca,
            tokens: TtlCache::new(CACHE_CAPACITY),
        }
    }

    /// Who is calling: the client certificate's user, else the bearer token's; `None` for
    /// neither (as the kubelet's union authenticator: a bad certificate with a good token
    /// passes as the token's user).
    pub async fn authenticate(
        &self,
        certificates: Option<&[CertificateDer<'static>]>,
        token: Option<&str>,
    ) -> Result<Option<UserInfo>, AuthError> {
        if let Some(user) =
            certificates.and_then(|chain| self.client_ca.user(chain, UnixTime::now()))
        {
            return Ok(Some(user));
        }
        let Some(token) = token else {
            return Ok(None);
        };
        // Keyed by a digest: the cache never holds a token.
        let digest: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .unwrap_or([0; 32]);
        if let Some(known) = self.tokens.get(&digest, Instant::now()) {
            return Ok(known);
        }
        let user = self.reviewer.review_token(token).await?;
        let ttl = if user.is_some() {
            TOKEN_TTL
        } else {
            REFUSED_TOKEN_TTL
        };
        self.tokens
            .insert(digest, user.clone(), ttl, Instant::now());
        Ok(user)
    }
}

/// Whether a user may do something: SubjectAccessReviews, cached (allowed and denied answers
/// with the kubelet's TTLs).
pub struct Authorizer {
    reviewer: Arc<dyn Reviewer>,
    decisions: TtlCache<AccessKey, bool>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer")
            .field("cached_decisions", &self.decisions.len())
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    /// Asking `reviewer`.
    pub fn new(reviewer: Arc<dyn Reviewer>) -> Self {
        Self {
            reviewer,
            decisions: TtlCache::new(CACHE_CAPACITY),
        }
    }

    /// Whether `user` may do what `question` asks.
    pub async fn allowed(
        &self,
        user: &UserInfo,
        question: &ResourceQuestion,
    ) -> Result<bool, AuthError> {
        let key = AccessKey {
            user: user.clone(),
            question: question.clone(),
        };
        if let Some(allowed) = self.decisions.get(&key, Instant::now()) {
            return Ok(allowed);
        }
        let allowed = self.reviewer.review_access(user, question).await?;
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        self.decisions.insert(key, allowed, ttl, Instant::now());
        Ok(allowed)
    }
}

/// The TLS side of client certificates: asks every client for one (optional, so bearer-token
/// clients connect), checks the client holds the certificate's key (the handshake signature),
/// and leaves the chain to [`ClientCa::user`] per request.
#[derive(Debug)]
pub struct RequestClientCertificate {
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl Default for RequestClientCertificate {
    fn default() -> Self {
        Self {
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for RequestClientCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: Go clients then present their certificate whatever CA issued it, and the
        // CA can rotate without a new TLS configuration.
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // The chain is judged per request by `ClientCa::user`, against the CA in force then
        // (the kubelet's RequestClientCert + x509 authenticator); the handshake signature,
        // checked below, proves the client holds the key.
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
pub mod fake_reviewer;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_expire_and_stay_bounded() {
        let cache: TtlCache<u32, &str> = TtlCache::new(3);
        let start = Instant::now();
        cache.insert(1, "one", Duration::from_secs(10), start);
        assert_eq!(cache.get(&1, start + Duration::from_secs(9)), Some("one"));
        assert_eq!(cache.get(&1, start + Duration::from_secs(10)), None);
        cache.insert(2, "two", Duration::from_secs(20), start);
        cache.insert(3, "three", Duration::from_secs(30), start);
        // Full: an expired entry makes room first…
        cache.insert(
            4,
            "four",
            Duration::from_secs(40),
            start + Duration::from_secs(11),
        );
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&2, start), Some("two"));
        // …else the one closest to expiry goes.
        cache.insert(
            5,
            "five",
            Duration::from_secs(50),
            start + Duration::from_secs(12),
        );
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&2, start), None);
        assert_eq!(cache.get(&5, start), Some("five"));
        // Overwriting a key never evicts another.
        cache.insert(5, "FIVE", Duration::from_secs(50), start);
        assert_eq!(cache.len(), 3);
    }
}
