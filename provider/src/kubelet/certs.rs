//! The kubelet API's serving certificate: the files of `KUBELET_CERT_DIR` (reloaded when they
//! change), or else one the cluster issues — a CertificateSigningRequest for the signer
//! `kubernetes.io/kubelet-serving` (CN `system:node:<node>`, O `system:nodes`, the node's IP
//! and name), which kube-controller-manager signs once someone approves it (`kubectl
//! certificate approve`, or an approver such as kubelet-csr-approver: kube-controller-manager
//! approves only kubelet *client* certificates by itself). Until then, and if it is denied, a
//! self-signed certificate for the same names is served, so the API is up from the start: the
//! apiserver verifies kubelet serving certificates only with `--kubelet-certificate-authority`.
//! An issued certificate is renewed by a new request at 80 % of its lifetime.

use backon::BackoffBuilder as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt as _;
use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec, CertificateSigningRequestStatus,
};
use kube::api::{Api, PostParams};
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
use tls_serve::{CertificateFiles, ReloadableCertificate};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{KubeletArgs, WithSite};
use crate::k8s::access::{Access, Scope};
use crate::ops::chain::Chain;

/// The Kubernetes API accesses of the serving certificate.
pub const KUBE_API: &[Access] = &[Access {
    scope: Scope::Cluster,
    group: "certificates.k8s.io",
    resource: "certificatesigningrequests",
    verbs: &["create", "get"],
    why: "request the kubelet API's serving certificate (signer kubernetes.io/kubelet-serving) and read it once issued",
}];

/// The signer of kubelet serving certificates.
pub const SIGNER: &str = "kubernetes.io/kubelet-serving";
/// How often a pending request is read at first, and at most.
const CSR_POLL: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(30));
/// How long after a failed request the next is made.
const CSR_RETRY: Duration = Duration::from_secs(60);

/// How often the files of `KUBELET_CERT_DIR` are read for a change.
const FILE_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// No certificate can be served.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The files of `KUBELET_CERT_DIR` cannot be served.
    #[error("--kubelet-cert-dir (KUBELET_CERT_DIR): {dir} holds no usable tls.crt and tls.key")]
    Files {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: tls_serve::CertificateError,
    },
    /// A key or certificate could not be generated.
    #[error("cannot generate a kubelet serving certificate")]
    Generate(#[source] rcgen::Error),
    /// What was generated cannot be served (a bug, not a configuration problem).
    #[error("the generated kubelet serving certificate cannot be served")]
    Unusable(#[source] tls_serve::CertificateError),
    /// The CertificateSigningRequest could not be created or read.
    #[error("CertificateSigningRequest for the kubelet serving certificate")]
    Csr(#[source] kube::Error),
    /// The issued certificate cannot be served with the key it was requested for.
    #[error("the certificate issued for CertificateSigningRequest {name} cannot be served")]
    Issued {
        /// The request.
        name: String,
        /// Why.
        #[source]
        source: tls_serve::CertificateError,
    },
}

/// A key and a certificate for it, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyAndCert {
    /// The certificate (chain), leaf first.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl std::fmt::Debug for KeyAndCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("KeyAndCert").finish_non_exhaustive()
    }
}

/// The subject a kubelet serving certificate has (the `kubernetes.io/kubelet-serving`
/// signer insists on it): CN `system:node:<node>`, O `system:nodes`, the node's address and
/// name as subject alternative names.
pub fn serving_params(node: &str, ip: IpAddr) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(vec![ip.to_string(), node.to_owned()])?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// A self-signed serving certificate for `node` at `ip`.
pub fn self_signed(node: &str, ip: IpAddr) -> Result<KeyAndCert, CertError> {
    let key = KeyPair::generate().map_err(CertError::Generate)?;
    let cert = serving_params(node, ip)
        .and_then(|params| params.self_signed(&key))
        .map_err(CertError::Generate)?;
    Ok(KeyAndCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The certificate to serve, and what keeps it current until `stop` (run it alongside the
/// server): the cert dir's watcher, or the CertificateSigningRequests through `client`.
pub fn serving(
    config: &WithSite<KubeletArgs>,
    client: kube::Client,
    stop: CancellationToken,
) -> Result<(Arc<ReloadableCertificate>, BoxFuture<'static, ()>), CertError> {
    if let Some(dir) = &config.args.kubelet_cert_dir {
        let files = CertificateFiles::in_dir(dir);
        let key = files.load().map_err(|source| CertError::Files {
            dir: dir.clone(),
            source,
        })?;
        let certificate = Arc::new(ReloadableCertificate::new(key));
        info!(dir = %dir.display(), "serving the kubelet API with the certificate from KUBELET_CERT_DIR");
        let watch = files.watch(Arc::clone(&certificate), FILE_CHECK_INTERVAL, stop);
        return Ok((certificate, watch.boxed()));
    }
    let own = self_signed(&config.site.node_name, config.site.internal_ip)?;
    let certificate = Arc::new(
        ReloadableCertificate::from_pem(own.cert_pem.as_bytes(), own.key_pem.as_bytes())
            .map_err(CertError::Unusable)?,
    );
    let requests = Requests {
        csrs: Api::all(client),
        node: config.site.node_name.clone(),
        ip: config.site.internal_ip,
        target: Arc::clone(&certificate),
    };
    Ok((certificate, requests.run(stop).boxed()))
}

/// Where a CertificateSigningRequest stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrState {
    /// Not decided yet (or approved, not signed yet).
    Pending,
    /// Signed: the certificate chain, PEM.
    Issued(String),
    /// Denied or failed, with the condition's reason and message.
    Refused(String),
}

/// The state a request's status shows.
pub fn csr_state(status: Option<&CertificateSigningRequestStatus>) -> CsrState {
    let Some(status) = status else {
        return CsrState::Pending;
    };
    if let Some(refusal) = status.conditions.iter().flatten().find(|condition| {
        (condition.type_ == "Denied" || condition.type_ == "Failed") && condition.status == "True"
    }) {
        return CsrState::Refused(format!(
            "{}: {} {}",
            refusal.type_,
            refusal.reason.as_deref().unwrap_or_default(),
            refusal.message.as_deref().unwrap_or_default()
        ));
    }
    match &status.certificate {
        Some(certificate) if !certificate.0.is_empty() => {
            CsrState::Issued(String::from_utf8_lossy(&certificate.0).into_owned())
        }
        _ => CsrState::Pending,
    }
}

/// When a certificate valid from `not_before` to `not_after` is renewed: at 80 % of its life.
pub fn renew_at(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    let life = not_after.duration_since(not_before).unwrap_or_default();
    not_before + life.mul_f64(0.8)
}

/// The validity of the leaf of a PEM chain.
fn validity(cert_pem: &str) -> Option<(SystemTime, SystemTime)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let at = |time: x509_parser::time::ASN1Time| {
        let seconds = u64::try_from(time.timestamp()).ok()?;
        Some(UNIX_EPOCH + Duration::from_secs(seconds))
    };
    Some((
        at(cert.validity().not_before)?,
        at(cert.validity().not_after)?,
    ))
}

/// Sleeps `pause`, or less when stopped: true if stopped.
async fn stopped_during(stop: &CancellationToken, pause: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(pause) => false,
    }
}

/// The certificate requested from the cluster, kept current.
struct Requests {
    csrs: Api<CertificateSigningRequest>,
    node: String,
    ip: IpAddr,
    target: Arc<ReloadableCertificate>,
}

impl Requests {
    async fn run(self, stop: CancellationToken) {
        loop {
            let pause = match self.obtain(&stop).await {
                // Stopped, or refused: the self-signed (or last issued) certificate stays.
                Ok(None) => return,
                Ok(Some(renew)) => renew.duration_since(SystemTime::now()).unwrap_or_default(),
                Err(error) => {
                    warn!(
                        error = %Chain(&error),
                        retry = ?CSR_RETRY,
                        "cannot obtain a kubelet serving certificate from the cluster; serving the current one"
                    );
                    CSR_RETRY
                }
            };
            if stopped_during(&stop, pause).await {
                return;
            }
        }
    }

    /// Requests a certificate and waits for it: `Some(renewal time)` once served, `None` when
    /// refused or stopped.
    async fn obtain(&self, stop: &CancellationToken) -> Result<Option<SystemTime>, CertError> {
        let key = KeyPair::generate().map_err(CertError::Generate)?;
        let request = serving_params(&self.node, self.ip)
            .and_then(|params| params.serialize_request(&key))
            .and_then(|csr| csr.pem())
            .map_err(CertError::Generate)?;
        let csr = CertificateSigningRequest {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(format!("kubelet-serving-{}-", self.node)),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_owned(),
                        "virtual-node-eci".to_owned(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.into_bytes()),
                signer_name: SIGNER.to_owned(),
                usages: Some(vec!["digital signature".into(), "server auth".into()]),
                ..Default::default()
            },
            status: None,
        };
        let created = self
            .csrs
            .create(&PostParams::default(), &csr)
            .await
            .map_err(CertError::Csr)?;
        let name = created.metadata.name.unwrap_or_default();
        info!(
            csr = %name,
            signer = SIGNER,
            "requested a kubelet serving certificate; serving a self-signed one until the request is approved (kubectl certificate approve {name}); the apiserver verifies kubelet certificates only with --kubelet-certificate-authority"
        );
        let mut pauses = crate::ops::retry::doubling(CSR_POLL.0, CSR_POLL.1).build();
        loop {
            if stopped_during(stop, pauses.next().unwrap_or(CSR_POLL.1)).await {
                return Ok(None);
            }
            let Some(current) = self.csrs.get_opt(&name).await.map_err(CertError::Csr)? else {
                // Garbage-collected while pending (after a day): ask again.
                warn!(csr = %name, "the CertificateSigningRequest is gone before it was issued; requesting again");
                return Ok(Some(SystemTime::now()));
            };
            match csr_state(current.status.as_ref()) {
                CsrState::Pending => {}
                CsrState::Refused(why) => {
                    warn!(csr = %name, %why, "the kubelet serving certificate was refused; serving the self-signed one");
                    return Ok(None);
                }
                CsrState::Issued(chain) => {
                    self.target
                        .replace_pem(chain.as_bytes(), key.serialize_pem().as_bytes())
                        .map_err(|source| CertError::Issued {
                            name: name.clone(),
                            source,
                        })?;
                    let renew = validity(&chain).map_or(
                        SystemTime::now() + Duration::from_secs(3600),
                        |(from, to)| renew_at(from, to),
                    );
                    info!(csr = %name, renew_at = %humantime::format_rfc3339_seconds(renew), "serving the kubelet serving certificate the cluster issued");
                    return Ok(Some(renew));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_self_signed_certificate_is_a_kubelet_serving_certificate() {
        let own = self_signed("vn-0", "10.1.2.3".parse().unwrap()).unwrap();
        let served =
            tls_serve::certified_key(own.cert_pem.as_bytes(), own.key_pem.as_bytes()).unwrap();
        assert_eq!(served.cert.len(), 1);
        let (_, pem) = x509_parser::pem::parse_x509_pem(own.cert_pem.as_bytes()).unwrap();
        let cert = pem.parse_x509().unwrap();
        assert_eq!(
            cert.subject().to_string(),
            "CN=system:node:vn-0, O=system:nodes"
        );
        let names = format!(
            "{:?}",
            cert.subject_alternative_name().unwrap().unwrap().value
        );
        assert!(
            names.contains("vn-0") && names.contains("[10, 1, 2, 3]"),
            "{names}"
        );
        assert!(!format!("{own:?}").contains("PRIVATE"));
    }

    #[test]
    fn a_request_is_pending_until_signed_or_refused() {
        let status = |value: serde_json::Value| -> CertificateSigningRequestStatus {
            serde_json::from_value(value).unwrap()
        };
        assert_eq!(csr_state(None), CsrState::Pending);
        let approved = status(serde_json::json!({"conditions": [
            {"type": "Approved", "status": "True", "reason": "AdminApproved"}
        ]}));
        assert_eq!(
            csr_state(Some(&approved)),
            CsrState::Pending,
            "approved, not signed yet"
        );
        let issued = status(serde_json::json!({
            "conditions": [{"type": "Approved", "status": "True"}],
            "certificate": "LS0tLS1CRUdJTg==",
        }));
        assert_eq!(
            csr_state(Some(&issued)),
            CsrState::Issued("-----BEGIN".into())
        );
        let denied = status(serde_json::json!({"conditions": [
            {"type": "Denied", "status": "True", "reason": "NotOurs", "message": "ask elsewhere"}
        ]}));
        assert_eq!(
            csr_state(Some(&denied)),
            CsrState::Refused("Denied: NotOurs ask elsewhere".into())
        );
        let failed = status(serde_json::json!({"conditions": [
            {"type": "Failed", "status": "True", "reason": "SignerValidationFailure"}
        ]}));
        assert!(
            matches!(csr_state(Some(&failed)), CsrState::Refused(why) if why.starts_with("Failed: SignerValidationFailure"))
        );
    }

    #[test]
    fn renewal_comes_at_four_fifths_of_the_life() {
        let from = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(
            renew_at(from, from + Duration::from_secs(100)),
            from + Duration::from_secs(80)
        );
        assert_eq!(renew_at(from, from), from);
        let own = self_signed("vn-0", "10.1.2.3".parse().unwrap()).unwrap();
        let (not_before, not_after) = validity(&own.cert_pem).unwrap();
        assert!(not_before < not_after);
    }

    #[test]
    fn the_request_asks_for_what_the_kubelet_serving_signer_signs() {
        let key = KeyPair::generate().unwrap();
        let pem = serving_params("vn-0", "10.1.2.3".parse().unwrap())
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let (_, request) = <x509_parser::certification_request::X509CertificationRequest<'_> as x509_parser::prelude::FromDer<'_, _>>::from_der(&block.contents).unwrap();
        let info = &request.certification_request_info;
        assert_eq!(
            info.subject.to_string(),
            "CN=system:node:vn-0, O=system:nodes"
        );
        let names = format!(
            "{:?}",
            request
                .requested_extensions()
                .map(Iterator::collect::<Vec<_>>)
        );
        assert!(
            names.contains("vn-0") && names.contains("[10, 1, 2, 3]"),
            "{names}"
        );
    }
}
