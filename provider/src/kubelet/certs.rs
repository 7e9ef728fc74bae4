//! The kubelet API's serving certificate: the files of `KUBELET_CERT_DIR` (reloaded when they
//! change), or else a self-signed certificate for the node's InternalIP and name, served at
//! once so the API is up from the start.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
use tls_serve::{CertificateFiles, ReloadableCertificate};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::KubeletConfig;

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
/// server).
pub fn serving(
    config: &KubeletConfig,
    stop: CancellationToken,
) -> Result<(Arc<ReloadableCertificate>, BoxFuture<'static, ()>), CertError> {
    if let Some(dir) = &config.cert_dir {
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
    let own = self_signed(&config.node_name, config.internal_ip)?;
    let certificate = Arc::new(
        ReloadableCertificate::from_pem(own.cert_pem.as_bytes(), own.key_pem.as_bytes())
            .map_err(CertError::Unusable)?,
    );
    info!(
        address = %config.internal_ip,
        "serving the kubelet API with a self-signed certificate (the apiserver verifies kubelet certificates only with --kubelet-certificate-authority)"
    );
    Ok((certificate, futures::future::ready(()).boxed()))
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
}
