//! The daemon's ResourcePolicy scheduler extender in the fixture: kube-scheduler is configured
//! to call `https://127.0.0.1:PORT/resourcepolicy/{filter,prioritize,bind}` (see
//! [`scheduler_config`]), and whichever daemon replica is elected serves it there with a
//! serving certificate from the fixture's CA. kube-scheduler authenticates to it with its own
//! client certificate (`system:kube-scheduler`, copied here as `scheduler.crt`/`.key`), which
//! the daemon checks against the cluster's client CA. The fixture only picks the port and
//! writes the certificates: nothing listens until a daemon started with [`PlacementExtender::env`] does,
//! and the extender is `ignorable`, so scheduling goes on without it.
//!
//! [`super::ControlPlane`] writes everything into [`DIR`] of its directory (the certificate
//! files and [`ADDR_FILE`]), so a test process that did not start the control plane (the
//! playground did) reads the same facts with [`PlacementExtender::read`].

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{ClusterError, Pki, display, write};
use crate::process::free_port;

/// The extender's Service name in the serving certificate (`deploy/base/services.yaml`).
pub use super::pki::PLACEMENT_EXTENDER_DNS;

/// The directory (in the control plane's) holding `tls.crt`, `tls.key`, `ca.crt` and
/// kube-scheduler's client certificate `scheduler.crt`, `scheduler.key`.
pub const DIR: &str = "placement-extender";
/// The file in [`DIR`] holding the extender's socket address.
pub const ADDR_FILE: &str = "addr";
/// The path under which the daemon serves the extender's verbs.
pub const PATH: &str = "/resourcepolicy";
/// The daemon's variable for the extender's socket address.
pub const ADDR_ENV: &str = "PLACEMENT_EXTENDER_ADDR";
/// The daemon's variable for the directory with `tls.crt`, `tls.key` and `ca.crt`.
pub const CERT_DIR_ENV: &str = "PLACEMENT_EXTENDER_CERT_DIR";

/// Where the fixture's kube-scheduler expects the extender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementExtender {
    /// The socket address the elected daemon replica serves it on (127.0.0.1).
    pub addr: SocketAddr,
    /// `tls.crt` and `tls.key` (127.0.0.1 and `virtual-node-eci-placement.kube-system.svc`,
    /// issued by the fixture's CA) and `ca.crt` (that CA, which kube-scheduler trusts).
    pub cert_dir: PathBuf,
}

impl PlacementExtender {
    /// `PLACEMENT_EXTENDER_ADDR` and `PLACEMENT_EXTENDER_CERT_DIR` for a daemon.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (ADDR_ENV.to_owned(), self.addr.to_string()),
            (CERT_DIR_ENV.to_owned(), display(&self.cert_dir)),
        ]
    }

    /// `https://127.0.0.1:PORT/resourcepolicy`, the scheduler's `urlPrefix`.
    pub fn url_prefix(&self) -> String {
        format!("https://{}{PATH}", self.addr)
    }

    /// The CA kube-scheduler trusts for the extender.
    pub fn ca_file(&self) -> PathBuf {
        self.cert_dir.join("ca.crt")
    }

    /// kube-scheduler's client certificate towards the extender (its own identity).
    pub fn client_cert_file(&self) -> PathBuf {
        self.cert_dir.join("scheduler.crt")
    }

    /// Its key.
    pub fn client_key_file(&self) -> PathBuf {
        self.cert_dir.join("scheduler.key")
    }

    /// What the control plane in `dir` wrote, or `None` when it runs without the extender.
    pub fn read(dir: &Path) -> Result<Option<Self>, ClusterError> {
        let cert_dir = dir.join(DIR);
        let path = cert_dir.join(ADDR_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ClusterError::Read { path, source }),
        };
        let addr = text.trim().parse().map_err(|error| ClusterError::Read {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, error),
        })?;
        Ok(Some(Self { addr, cert_dir }))
    }

    /// Picks a free port on 127.0.0.1 and writes the serving certificate (from `pki`), the CA
    /// and the address into `dir`'s [`DIR`].
    pub(super) fn prepare(dir: &Path, pki: &Pki) -> Result<Self, ClusterError> {
        let cert_dir = dir.join(DIR);
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| ClusterError::Write { path, source }
        };
        std::fs::create_dir_all(&cert_dir).map_err(io(&cert_dir))?;
        for (from, to) in [
            (&pki.placement_extender.cert, "tls.crt"),
            (&pki.placement_extender.key, "tls.key"),
            (&pki.ca.cert, "ca.crt"),
            (&pki.scheduler.cert, "scheduler.crt"),
            (&pki.scheduler.key, "scheduler.key"),
        ] {
            let to = cert_dir.join(to);
            std::fs::copy(from, &to).map_err(io(&to))?;
        }
        let extender = Self {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?)),
            cert_dir,
        };
        write(
            &extender.cert_dir.join(ADDR_FILE),
            &extender.addr.to_string(),
        )?;
        Ok(extender)
    }

    /// Removes what [`Self::prepare`] wrote into `dir` before (a reused playground directory).
    pub(super) fn forget(dir: &Path) -> Result<(), ClusterError> {
        let path = dir.join(DIR);
        match std::fs::remove_dir_all(&path) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                Err(ClusterError::Write { path, source })
            }
            _ => Ok(()),
        }
    }

    /// The scheduler's `extenders` entry (kubescheduler.config.k8s.io/v1 `Extender`): every
    /// pod goes through filter, prioritize and bind over HTTPS trusting only the fixture's CA,
    /// presenting kube-scheduler's client certificate; `ignorable`, so an extender that is
    /// down or failing (or refuses to bind a pod no policy places) never stops scheduling.
    fn extender_config(&self) -> Value {
        json!({
            "urlPrefix": self.url_prefix(),
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "bindVerb": "bind",
            "weight": 1,
            "enableHTTPS": true,
            "tlsConfig": {
                "caFile": display(&self.ca_file()),
                "certFile": display(&self.client_cert_file()),
                "keyFile": display(&self.client_key_file()),
            },
            "httpTimeout": "5s",
            "nodeCacheCapable": true,
            "ignorable": true,
        })
    }
}

/// kube-scheduler's configuration (kubescheduler.config.k8s.io/v1): its kubeconfig, no leader
/// election, and with `extender` the daemon's extender, seeing every feasible node
/// (`percentageOfNodesToScore: 100`: a ResourcePolicy's units are judged over all their nodes).
pub(super) fn scheduler_config(kubeconfig: &Path, extender: Option<&PlacementExtender>) -> Value {
    let mut config = json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": display(kubeconfig)},
        "leaderElection": {"leaderElect": false},
    });
    if let Some(extender) = extender {
        config["percentageOfNodesToScore"] = json!(100);
        config["extenders"] = json!([extender.extender_config()]);
    }
    config
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    use super::*;

    #[test]
    fn the_scheduler_config_without_the_extender_is_the_plain_one() {
        assert_eq!(
            scheduler_config(Path::new("/c/scheduler.kubeconfig"), None),
            json!({
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": "/c/scheduler.kubeconfig"},
                "leaderElection": {"leaderElect": false},
            })
        );
    }

    #[test]
    fn the_scheduler_config_calls_the_extender_over_https_trusting_the_fixture_ca() {
        let extender = PlacementExtender {
            addr: "127.0.0.1:41234".parse().unwrap(),
            cert_dir: "/c/placement-extender".into(),
        };
        assert_eq!(
            scheduler_config(Path::new("/c/scheduler.kubeconfig"), Some(&extender)),
            json!({
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": "/c/scheduler.kubeconfig"},
                "leaderElection": {"leaderElect": false},
                "percentageOfNodesToScore": 100,
                "extenders": [{
                    "urlPrefix": "https://127.0.0.1:41234/resourcepolicy",
                    "filterVerb": "filter",
                    "prioritizeVerb": "prioritize",
                    "bindVerb": "bind",
                    "weight": 1,
                    "enableHTTPS": true,
                    "tlsConfig": {
                        "caFile": "/c/placement-extender/ca.crt",
                        "certFile": "/c/placement-extender/scheduler.crt",
                        "keyFile": "/c/placement-extender/scheduler.key",
                    },
                    "httpTimeout": "5s",
                    "nodeCacheCapable": true,
                    "ignorable": true,
                }],
            })
        );
        assert_eq!(
            extender.env(),
            [
                (
                    "PLACEMENT_EXTENDER_ADDR".to_owned(),
                    "127.0.0.1:41234".to_owned()
                ),
                (
                    "PLACEMENT_EXTENDER_CERT_DIR".to_owned(),
                    "/c/placement-extender".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn what_prepare_writes_reads_back_and_forget_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(PlacementExtender::read(dir.path()).unwrap(), None);
        let pki_dir = dir.path().join("pki");
        std::fs::create_dir(&pki_dir).unwrap();
        let pki = Pki::generate(&pki_dir, "127.100.0.1").unwrap();
        let prepared = PlacementExtender::prepare(dir.path(), &pki).unwrap();
        assert_eq!(prepared.addr.ip(), Ipv4Addr::LOCALHOST);
        for file in [
            "tls.crt",
            "tls.key",
            "ca.crt",
            "scheduler.crt",
            "scheduler.key",
        ] {
            assert!(prepared.cert_dir.join(file).is_file(), "{file}");
        }
        assert_eq!(
            std::fs::read(prepared.ca_file()).unwrap(),
            std::fs::read(&pki.ca.cert).unwrap()
        );
        // The serving certificate chains to ca.crt for both names it is reached by.
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(prepared.ca_file()).unwrap())
            .unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let cert = CertificateDer::from_pem_file(prepared.cert_dir.join("tls.crt")).unwrap();
        let verify = |name: &'static str| {
            verifier.verify_server_cert(
                &cert,
                &[],
                &ServerName::try_from(name).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        verify("127.0.0.1").unwrap();
        verify(PLACEMENT_EXTENDER_DNS).unwrap();
        assert!(verify("kubernetes.default.svc").is_err());
        assert_eq!(PlacementExtender::read(dir.path()).unwrap(), Some(prepared));
        PlacementExtender::forget(dir.path()).unwrap();
        PlacementExtender::forget(dir.path()).unwrap();
        assert_eq!(PlacementExtender::read(dir.path()).unwrap(), None);
    }
}
