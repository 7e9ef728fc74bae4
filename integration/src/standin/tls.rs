//! A throw-away CA and a serving certificate for 127.0.0.1 / localhost.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The acceptor and the CA a client must trust.
pub(super) struct Serving {
    pub(super) acceptor: tokio_rustls::TlsAcceptor,
    pub(super) ca_pem: String,
}

pub(super) fn serving_certificate() -> Result<Serving, String> {
    let text = |error: rcgen::Error| error.to_string();
    let ca_key = KeyPair::generate().map_err(text)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(text)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "virtual-node-eci API stand-in CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).map_err(text)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().map_err(text)?;
    let mut params = CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        "::1".to_owned(),
    ])
    .map_err(text)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-standin");
    let cert = params.signed_by(&key, &issuer).map_err(text)?;

    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(chain, private)
    .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Serving {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        ca_pem: ca_cert.pem(),
    })
}
