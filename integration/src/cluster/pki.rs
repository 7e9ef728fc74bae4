//! The control plane's PKI, generated fresh at every start: a cluster CA (serving and client
//! certificates), a front-proxy CA (aggregated APIs), and the service-account signing key.
//! Nothing here is kept between runs and no key material lives in the source.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// Generating or writing the PKI failed.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused the parameters or could not generate a key.
    #[error("generate {what}")]
    Generate {
        /// Which certificate or key.
        what: &'static str,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// A file could not be written.
    #[error("write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// Every file the components are started with.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The cluster CA: signs the apiserver's serving certificate and every client certificate.
    pub ca: CertFiles,
    /// The apiserver's serving certificate (127.0.0.1, localhost, the `kubernetes` Service names).
    pub apiserver: CertFiles,
    /// The apiserver's client certificate towards kubelets.
    pub apiserver_kubelet_client: CertFiles,
    /// The front-proxy CA (requestheader authentication of aggregated APIs).
    pub front_proxy_ca: CertFiles,
    /// The apiserver's client certificate towards aggregated APIs.
    pub front_proxy_client: CertFiles,
    /// The cluster administrator (`system:masters`).
    pub admin: CertFiles,
    /// kube-controller-manager's identity.
    pub controller_manager: CertFiles,
    /// kube-scheduler's identity.
    pub scheduler: CertFiles,
    /// The service-account token signing key (private) and its public half.
    pub service_account: CertFiles,
    /// metrics-server's identity, towards the apiserver and the kubelets.
    pub metrics_server: CertFiles,
    /// metrics-server's serving certificate (`metrics-server.kube-system.svc`, the name the
    /// aggregator checks).
    pub metrics_server_serving: CertFiles,
    /// The daemon's scheduler-extender serving certificate (127.0.0.1 and
    /// [`PLACEMENT_EXTENDER_DNS`]), handed to the daemons when the fixture runs the extender.
    pub placement_extender: CertFiles,
}

/// The CN (the user) of the apiserver's client certificate towards kubelets.
pub(super) const APISERVER_KUBELET_CLIENT: &str = "kube-apiserver-kubelet-client";

/// The CN (the user) of metrics-server's client certificate.
pub(super) const METRICS_SERVER_USER: &str = "metrics-server";

/// The DNS name of the daemon's scheduler-extender Service (`deploy/base/services.yaml`), put
/// into its serving certificate beside 127.0.0.1.
pub const PLACEMENT_EXTENDER_DNS: &str = "virtual-node-eci-placement.kube-system.svc";

/// The CN of the front-proxy client, the one name aggregated APIs accept request headers from.
pub(super) const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

fn generate(what: &'static str) -> impl Fn(rcgen::Error) -> PkiError {
    move |source| PkiError::Generate { what, source }
}

fn write(path: &Path, contents: &str) -> Result<(), PkiError> {
    std::fs::write(path, contents).map_err(|source| PkiError::Write {
        path: path.to_owned(),
        source,
    })
}

struct Authority {
    issuer: Issuer<'static, KeyPair>,
}

impl Authority {
    fn new(
        dir: &Path,
        name: &'static str,
        common_name: &str,
    ) -> Result<(Self, CertFiles), PkiError> {
        let key = KeyPair::generate().map_err(generate(name))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate(name))?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).map_err(generate(name))?;
        let files = save(dir, name, &cert.pem(), &key.serialize_pem())?;
        Ok((
            Self {
                issuer: Issuer::new(params, key),
            },
            files,
        ))
    }

    /// A leaf certificate: `names` become subject alternative names (IP addresses as such),
    /// `organizations` the O entries (Kubernetes groups of a client certificate).
    fn issue(
        &self,
        dir: &Path,
        name: &'static str,
        common_name: &str,
        organizations: &[&str],
        names: &[&str],
    ) -> Result<CertFiles, PkiError> {
        let key = KeyPair::generate().map_err(generate(name))?;
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).map_err(generate(name))?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for organization in organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *organization);
        }
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generate(name))?;
        save(dir, name, &cert.pem(), &key.serialize_pem())
    }
}

fn save(dir: &Path, name: &str, cert: &str, key: &str) -> Result<CertFiles, PkiError> {
    let files = CertFiles {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    write(&files.cert, cert)?;
    write(&files.key, key)?;
    Ok(files)
}

impl Pki {
    /// Generates everything into `dir` (which must exist). `service_ip` is the first address
    /// of the Service range (the `kubernetes` Service), put into the serving certificate.
    pub fn generate(dir: &Path, service_ip: &str) -> Result<Self, PkiError> {
        let (ca, ca_files) = Authority::new(dir, "ca", "virtual-node-eci e2e cluster CA")?;
        let apiserver = ca.issue(
            dir,
            "apiserver",
            "kube-apiserver",
            &[],
            &[
                "127.0.0.1",
                service_ip,
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )?;
        let apiserver_kubelet_client = ca.issue(
            dir,
            "apiserver-kubelet-client",
            APISERVER_KUBELET_CLIENT,
            &[],
            &[],
        )?;
        let admin = ca.issue(dir, "admin", "kubernetes-admin", &["system:masters"], &[])?;
        let controller_manager = ca.issue(
            dir,
            "controller-manager",
            "system:kube-controller-manager",
            &[],
            &[],
        )?;
        let scheduler = ca.issue(dir, "scheduler", "system:kube-scheduler", &[], &[])?;
        let (front_proxy, front_proxy_ca) =
            Authority::new(dir, "front-proxy-ca", "virtual-node-eci e2e front-proxy CA")?;
        let front_proxy_client =
            front_proxy.issue(dir, "front-proxy-client", FRONT_PROXY_CLIENT, &[], &[])?;
        let metrics_server = ca.issue(dir, "metrics-server", METRICS_SERVER_USER, &[], &[])?;
        let metrics_server_serving = ca.issue(
            dir,
            "metrics-server-serving",
            "metrics-server",
            &[],
            &[
                "metrics-server.kube-system.svc",
                "metrics-server.kube-system.svc.cluster.local",
            ],
        )?;
        let placement_extender = ca.issue(
            dir,
            "placement-extender",
            "virtual-node-eci-placement",
            &[],
            &["127.0.0.1", PLACEMENT_EXTENDER_DNS],
        )?;
        let signing = KeyPair::generate().map_err(generate("service-account key"))?;
        let service_account = CertFiles {
            cert: dir.join("service-account.pub"),
            key: dir.join("service-account.key"),
        };
        write(&service_account.cert, &signing.public_key_pem())?;
        write(&service_account.key, &signing.serialize_pem())?;
        Ok(Self {
            ca: ca_files,
            apiserver,
            apiserver_kubelet_client,
            front_proxy_ca,
            front_proxy_client,
            admin,
            controller_manager,
            scheduler,
            service_account,
            metrics_server,
            metrics_server_serving,
            placement_extender,
        })
    }
}
