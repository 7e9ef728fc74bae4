//! The serving certificate: PEM read into rustls' form, a resolver whose certificate can be
//! replaced while connections are open, and a watcher that replaces it when its files change.

use parking_lot::RwLock;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A certificate or key that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate chain is not PEM.
    #[error("the certificate chain is not valid PEM")]
    CertificatePem(#[source] rustls::pki_types::pem::Error),
    /// The PEM holds no certificate.
    #[error("the certificate chain holds no certificate")]
    NoCertificate,
    /// The private key is not PEM.
    #[error("the private key is not valid PEM")]
    KeyPem(#[source] rustls::pki_types::pem::Error),
    /// The key is of a kind rustls cannot sign with, or is not the certificate's.
    #[error("the private key is unusable or does not match the certificate")]
    Key(#[source] rustls::Error),
}

/// The rustls form of a PEM certificate chain (leaf first) and its private key. A key that
/// does not match the leaf is refused here rather than failing every handshake later.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<CertifiedKey>, CertificateError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(CertificateError::CertificatePem)?;
    if chain.is_empty() {
        return Err(CertificateError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(CertificateError::KeyPem)?;
    let key = CertifiedKey::from_der(chain, key, &crate::crypto_provider())
        .map_err(CertificateError::Key)?;
    Ok(Arc::new(key))
}

/// The certificate a server presents, replaceable at any time: a handshake uses whichever
/// certificate is current when it starts; connections already open keep theirs.
#[derive(Debug)]
pub struct ReloadableCertificate {
    current: RwLock<Arc<CertifiedKey>>,
    /// Counts replacements, so others (a webhook's caBundle) can follow them.
    generation: watch::Sender<u64>,
}

impl ReloadableCertificate {
    /// Serves `key`.
    pub fn new(key: Arc<CertifiedKey>) -> Self {
        Self {
            current: RwLock::new(key),
            generation: watch::Sender::new(0),
        }
    }

    /// Serves a PEM chain and key.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, CertificateError> {
        certified_key(cert_pem, key_pem).map(Self::new)
    }

    /// Serves `key` to every handshake from now on.
    pub fn replace(&self, key: Arc<CertifiedKey>) {
        *self.current.write() = key;
        self.generation.send_modify(|generation| *generation += 1);
    }

    /// Serves a PEM chain and key from now on; an unusable one leaves the current in place.
    pub fn replace_pem(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), CertificateError> {
        self.replace(certified_key(cert_pem, key_pem)?);
        Ok(())
    }

    /// The certificate served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.current.read())
    }

    /// Changes whenever the certificate is replaced.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

impl ResolvesServerCert for ReloadableCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A certificate kept in files (`tls.crt` and `tls.key` of a mounted Secret, cert-manager's
/// or your own), with companions such as `ca.crt` whose change also counts as a renewal.
#[derive(Debug, Clone)]
pub struct CertificateFiles {
    /// The PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its PEM private key.
    pub key: PathBuf,
    /// Files watched with them (a missing one reads as empty).
    pub companions: Vec<PathBuf>,
}

fn read(path: &Path) -> Result<Vec<u8>, CertificateError> {
    std::fs::read(path).map_err(|source| CertificateError::Read {
        path: path.to_owned(),
        source,
    })
}

impl CertificateFiles {
    /// `tls.crt` and `tls.key` in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            companions: Vec::new(),
        }
    }

    /// Reads and checks the certificate.
    pub fn load(&self) -> Result<Arc<CertifiedKey>, CertificateError> {
        certified_key(&read(&self.cert)?, &read(&self.key)?)
    }

    /// Everything watched, as bytes (what a change is judged by).
    fn snapshot(&self) -> Vec<Vec<u8>> {
        let mut all = vec![
            std::fs::read(&self.cert).unwrap_or_default(),
            std::fs::read(&self.key).unwrap_or_default(),
        ];
        all.extend(
            self.companions
                .iter()
                .map(|path| std::fs::read(path).unwrap_or_default()),
        );
        all
    }

    /// Keeps `target` serving these files until `stop`: every `interval` the files are read
    /// and, when their content changed, loaded into `target`. Content, not mtime, decides: a
    /// mounted Secret is updated by swapping a symlink, which leaves the files' mtimes as they
    /// were. A change that cannot be loaded (a writer halfway through, a key that does not
    /// match) is logged once and the previous certificate kept; the next change is tried again.
    pub async fn watch(
        self,
        target: Arc<ReloadableCertificate>,
        interval: Duration,
        stop: CancellationToken,
    ) {
        let mut seen = self.snapshot();
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let now = self.snapshot();
            if now == seen {
                continue;
            }
            seen = now;
            match certified_key(&seen[0], &seen[1]) {
                Ok(key) => {
                    target.replace(key);
                    info!(cert = %self.cert.display(), "serving certificate reloaded");
                }
                Err(error) => warn!(
                    cert = %self.cert.display(),
                    error = %crate::Chain(&error),
                    "the certificate files changed but cannot be served; keeping the previous certificate"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::Pki;

    #[test]
    fn pem_is_checked_and_mismatched_keys_refused() {
        let pki = Pki::new("test CA");
        let leaf = pki.leaf(&["localhost"]);
        assert!(certified_key(leaf.cert.as_bytes(), leaf.key.as_bytes()).is_ok());
        let other = pki.leaf(&["localhost"]);
        assert!(matches!(
            certified_key(leaf.cert.as_bytes(), other.key.as_bytes()),
            Err(CertificateError::Key(_))
        ));
        assert!(matches!(
            certified_key(b"", leaf.key.as_bytes()),
            Err(CertificateError::NoCertificate)
        ));
        assert!(matches!(
            certified_key(leaf.cert.as_bytes(), b"garbage"),
            Err(CertificateError::KeyPem(_))
        ));
    }

    #[test]
    fn replacing_counts_and_a_bad_replacement_keeps_the_current() {
        let pki = Pki::new("test CA");
        let first = pki.leaf(&["localhost"]);
        let reloadable =
            ReloadableCertificate::from_pem(first.cert.as_bytes(), first.key.as_bytes()).unwrap();
        let generation = reloadable.subscribe();
        let before = reloadable.current();
        assert!(reloadable.replace_pem(b"", b"").is_err());
        assert!(Arc::ptr_eq(&before, &reloadable.current()));
        assert_eq!(*generation.borrow(), 0);
        let second = pki.leaf(&["localhost"]);
        reloadable
            .replace_pem(second.cert.as_bytes(), second.key.as_bytes())
            .unwrap();
        assert!(!Arc::ptr_eq(&before, &reloadable.current()));
        assert_eq!(*generation.borrow(), 1);
    }

    #[test]
    fn an_unreadable_file_names_its_path() {
        let files = CertificateFiles::in_dir(Path::new("/nonexistent/tls"));
        let error = files.load().unwrap_err();
        assert_eq!(error.to_string(), "cannot read /nonexistent/tls/tls.crt");
        assert!(
            crate::Chain(&error)
                .to_string()
                .starts_with("cannot read /nonexistent/tls/tls.crt: No such file"),
            "{}",
            crate::Chain(&error)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn changed_files_are_loaded_and_broken_ones_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new("test CA");
        let write = |leaf: &crate::tests::Leaf| {
            std::fs::write(dir.path().join("tls.crt"), &leaf.cert).unwrap();
            std::fs::write(dir.path().join("tls.key"), &leaf.key).unwrap();
        };
        let first = pki.leaf(&["localhost"]);
        write(&first);
        let files = CertificateFiles {
            companions: vec![dir.path().join("ca.crt")],
            ..CertificateFiles::in_dir(dir.path())
        };
        let target = Arc::new(ReloadableCertificate::new(files.load().unwrap()));
        let mut generation = target.subscribe();
        let stop = CancellationToken::new();
        let watcher =
            tokio::spawn(files.watch(Arc::clone(&target), Duration::from_secs(10), stop.clone()));
        let tick = || tokio::time::sleep(Duration::from_secs(11));

        tick().await;
        assert_eq!(*generation.borrow_and_update(), 0, "nothing changed");

        // A key that does not match the certificate (a writer halfway through) is skipped.
        let second = pki.leaf(&["localhost"]);
        std::fs::write(dir.path().join("tls.crt"), &second.cert).unwrap();
        tick().await;
        assert_eq!(*generation.borrow_and_update(), 0);

        std::fs::write(dir.path().join("tls.key"), &second.key).unwrap();
        tick().await;
        assert_eq!(*generation.borrow_and_update(), 1);
        assert_eq!(
            target.current().cert[0].as_ref(),
            CertificateDer::from_pem_slice(second.cert.as_bytes())
                .unwrap()
                .as_ref()
        );

        // A companion's change counts as a renewal.
        std::fs::write(dir.path().join("ca.crt"), &pki.ca_pem).unwrap();
        tick().await;
        assert_eq!(*generation.borrow_and_update(), 2);

        stop.cancel();
        watcher.await.unwrap();
    }
}
