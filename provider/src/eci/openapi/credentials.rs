//! Where the AccessKey that signs requests comes from, in order of precedence:
//!
//! 1. a static pair from the environment (`ECI_ACCESS_KEY`, `ECI_SECRET_KEY`, optionally the
//!    STS `ECI_SECURITY_TOKEN`);
//! 2. a mounted file or Secret directory (`ECI_CREDENTIALS_PATH`) holding the same three names,
//!    read again whenever it changes (Secret rotation needs no restart);
//! 3. a RAM role of the instance, from the metadata service, refreshed well before it expires.
//!
//! Secrets are wrapped in [`Secret`], whose `Debug` and `Display` never show the value.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tracing::{info, warn};

pub use crate::config::Secret;

/// Name of the AccessKey id, as an environment variable and as a file in the credentials path.
pub const ACCESS_KEY_NAME: &str = "ECI_ACCESS_KEY";
/// Name of the AccessKey secret.
pub const SECRET_KEY_NAME: &str = "ECI_SECRET_KEY";
/// Name of the STS security token.
pub const SECURITY_TOKEN_NAME: &str = "ECI_SECURITY_TOKEN";

/// Role credentials are renewed when less than this is left of them.
const ROLE_REFRESH_MARGIN: Duration = Duration::from_secs(15 * 60);

/// What signs one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The AccessKey id (not secret: it appears in every request).
    pub access_key_id: String,
    /// The AccessKey secret.
    pub access_key_secret: Secret,
    /// The STS token, when the key is temporary.
    pub security_token: Option<Secret>,
}

/// Credentials could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The credentials path could not be read.
    #[error("cannot read credentials from {path} (ECI_CREDENTIALS_PATH)")]
    Read {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The credentials path lacks a required entry.
    #[error(
        "{path} (ECI_CREDENTIALS_PATH) has no {name}; it needs {ACCESS_KEY_NAME} and {SECRET_KEY_NAME} (and {SECURITY_TOKEN_NAME} for an STS key)"
    )]
    Missing {
        /// The path.
        path: PathBuf,
        /// The missing name.
        name: &'static str,
    },
    /// The metadata service did not answer usefully.
    #[error(
        "the instance metadata service at {endpoint} gave no credentials for RAM role {role:?}: {reason}"
    )]
    Metadata {
        /// The metadata endpoint.
        endpoint: String,
        /// The role.
        role: String,
        /// What went wrong (never a secret).
        reason: String,
    },
}

/// Where credentials come from.
#[derive(Debug)]
pub enum CredentialSource {
    /// A fixed pair (and token).
    Static(Credentials),
    /// A file or Secret directory, re-read when it changes.
    File(FileSource),
    /// A RAM role from the instance metadata service.
    RamRole(RoleSource),
}

impl CredentialSource {
    /// A file or directory source.
    pub fn file(path: PathBuf) -> Self {
        Self::File(FileSource {
            path,
            cached: Mutex::new(None),
        })
    }

    /// A RAM role source.
    pub fn ram_role(http: reqwest::Client, endpoint: &str, role: String) -> Self {
        Self::RamRole(RoleSource {
            http,
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            role,
            cached: Mutex::new(None),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    /// Which kind of source this is, for logs.
    pub fn describe(&self) -> String {
        match self {
            Self::Static(c) if c.security_token.is_some() => {
                format!("STS token for AccessKey {}", c.access_key_id)
            }
            Self::Static(c) => format!("AccessKey {} from the environment", c.access_key_id),
            Self::File(f) => format!("credentials file {}", f.path.display()),
            Self::RamRole(r) => format!("RAM role {} via {}", r.role, r.endpoint),
        }
    }

    /// Forgets cached file credentials, so the next request reads them again: the service
    /// refused them, and a rewrite the fingerprint cannot see (same size, same second on a
    /// coarse clock) must not keep the node refused until a restart.
    pub fn refused(&self) {
        if let Self::File(source) = self
            && let Some((seen, _)) = source.cached.lock().as_mut()
        {
            // No real fingerprint is empty: the next use reads the files again.
            seen.clear();
        }
    }

    /// The credentials to sign the next request with.
    pub async fn current(&self) -> Result<Credentials, CredentialsError> {
        match self {
            Self::Static(credentials) => Ok(credentials.clone()),
            Self::File(source) => source.current().await,
            Self::RamRole(source) => source.current().await,
        }
    }
}

/// Identity of the files' content: any rewrite changes a modification time, a length or (when
/// kubelet swaps a mounted Secret's `..data` link to new files) an inode.
type Fingerprint = Vec<(Option<SystemTime>, u64, u64)>;

/// Credentials from a file of `NAME=value` lines or a directory of one file per name (how a
/// Kubernetes Secret is mounted).
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    cached: Mutex<Option<(Fingerprint, Credentials)>>,
}

impl FileSource {
    /// Whether the path is a Secret-style directory (asked once per use, without blocking).
    async fn is_dir(&self) -> bool {
        tokio::fs::metadata(&self.path)
            .await
            .is_ok_and(|m| m.is_dir())
    }

    fn members(&self, is_dir: bool) -> Vec<PathBuf> {
        if is_dir {
            [ACCESS_KEY_NAME, SECRET_KEY_NAME, SECURITY_TOKEN_NAME]
                .iter()
                .map(|name| self.path.join(name))
                .collect()
        } else {
            vec![self.path.clone()]
        }
    }

    async fn fingerprint(&self, is_dir: bool) -> Fingerprint {
        let mut fingerprint = Vec::new();
        for member in self.members(is_dir) {
            let entry = tokio::fs::metadata(&member)
                .await
                .map_or((None, 0, 0), |m| {
                    (
                        m.modified().ok(),
                        m.len(),
                        std::os::unix::fs::MetadataExt::ino(&m),
                    )
                });
            fingerprint.push(entry);
        }
        fingerprint
    }

    async fn current(&self) -> Result<Credentials, CredentialsError> {
        let is_dir = self.is_dir().await;
        let fingerprint = self.fingerprint(is_dir).await;
        if let Some((seen, credentials)) = self.cached.lock().as_ref() {
            if *seen == fingerprint {
                return Ok(credentials.clone());
            }
        }
        let credentials = self.read(is_dir).await?;
        let before = self
            .cached
            .lock()
            .replace((fingerprint, credentials.clone()));
        if before.is_none_or(|(_, old)| old != credentials) {
            info!(path = %self.path.display(), access_key_id = %credentials.access_key_id, "credentials (re)loaded");
        }
        Ok(credentials)
    }

    async fn read(&self, is_dir: bool) -> Result<Credentials, CredentialsError> {
        let read_error = |source| CredentialsError::Read {
            path: self.path.clone(),
            source,
        };
        let entries: Vec<(String, String)> = if is_dir {
            let mut entries = Vec::new();
            for name in [ACCESS_KEY_NAME, SECRET_KEY_NAME, SECURITY_TOKEN_NAME] {
                match tokio::fs::read_to_string(self.path.join(name)).await {
                    Ok(value) => entries.push((name.to_owned(), value.trim().to_owned())),
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                    Err(error) => return Err(read_error(error)),
                }
            }
            entries
        } else {
            let text = tokio::fs::read_to_string(&self.path)
                .await
                .map_err(read_error)?;
            parse_env_lines(&text)
        };
        credentials_from(&self.path, &entries)
    }
}

/// `NAME=value` lines; blank lines and `#` comments are skipped, `export ` and quotes allowed.
fn parse_env_lines(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (name, value) = line.split_once('=')?;
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(value);
            Some((name.trim().to_owned(), value.to_owned()))
        })
        .collect()
}

fn credentials_from(
    path: &Path,
    entries: &[(String, String)],
) -> Result<Credentials, CredentialsError> {
    let get = |name: &'static str| {
        entries
            .iter()
            .rev()
            .find(|(n, v)| n == name && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let missing = |name| CredentialsError::Missing {
        path: path.to_owned(),
        name,
    };
    Ok(Credentials {
        access_key_id: get(ACCESS_KEY_NAME).ok_or_else(|| missing(ACCESS_KEY_NAME))?,
        access_key_secret: Secret::new(
            get(SECRET_KEY_NAME).ok_or_else(|| missing(SECRET_KEY_NAME))?,
        ),
        security_token: get(SECURITY_TOKEN_NAME).map(Secret::new),
    })
}

/// Credentials of a RAM role attached to the instance.
#[derive(Debug)]
pub struct RoleSource {
    http: reqwest::Client,
    endpoint: String,
    role: String,
    /// The latest credentials and when they expire; locked only to read or replace them.
    cached: Mutex<Option<(Credentials, SystemTime)>>,
    /// Held by the one caller fetching from the metadata service.
    refreshing: tokio::sync::Mutex<()>,
}

/// What the cached role credentials allow at an instant.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Freshness {
    /// Valid beyond the refresh margin: sign with them.
    Fresh(Credentials),
    /// Still valid but inside the margin: sign with them, and one caller renews them.
    Renewable(Credentials),
    /// None yet, or expired: every caller needs new ones.
    Missing,
}

impl Freshness {
    fn of(cached: Option<&(Credentials, SystemTime)>, now: SystemTime) -> Self {
        match cached {
            Some((credentials, expires)) if now + ROLE_REFRESH_MARGIN < *expires => {
                Self::Fresh(credentials.clone())
            }
            Some((credentials, expires)) if now < *expires => Self::Renewable(credentials.clone()),
            _ => Self::Missing,
        }
    }
}

/// The metadata service's answer.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RoleAnswer {
    #[serde(default)]
    code: String,
    access_key_id: String,
    access_key_secret: String,
    security_token: String,
    expiration: String,
}

impl RoleSource {
    /// Only a caller without valid credentials waits for the metadata service: while one
    /// caller renews credentials that are still valid, every other request signs with them.
    async fn current(&self) -> Result<Credentials, CredentialsError> {
        match self.freshness() {
            Freshness::Fresh(credentials) => Ok(credentials),
            Freshness::Renewable(credentials) => {
                let Ok(_renewing) = self.refreshing.try_lock() else {
                    return Ok(credentials);
                };
                match self.fetch_and_keep().await {
                    Ok(renewed) => Ok(renewed),
                    Err(error) => {
                        warn!(error = %crate::ops::chain::Chain(&error), "refreshing RAM role credentials failed; using the current ones until they expire");
                        Ok(credentials)
                    }
                }
            }
            Freshness::Missing => {
                let _fetching = self.refreshing.lock().await;
                // Whoever held the lock before may just have fetched them.
                match self.freshness() {
                    Freshness::Fresh(credentials) | Freshness::Renewable(credentials) => {
                        Ok(credentials)
                    }
                    Freshness::Missing => self.fetch_and_keep().await,
                }
            }
        }
    }

    fn freshness(&self) -> Freshness {
        let cached = self.cached.lock();
        Freshness::of(cached.as_ref(), SystemTime::now())
    }

    async fn fetch_and_keep(&self) -> Result<Credentials, CredentialsError> {
        let (credentials, expires) = self.fetch().await?;
        info!(role = %self.role, access_key_id = %credentials.access_key_id, expires = %humantime::format_rfc3339_seconds(expires), "RAM role credentials refreshed");
        *self.cached.lock() = Some((credentials.clone(), expires));
        Ok(credentials)
    }

    fn error(&self, reason: impl Into<String>) -> CredentialsError {
        CredentialsError::Metadata {
            endpoint: self.endpoint.clone(),
            role: self.role.clone(),
            reason: reason.into(),
        }
    }

    /// The hardened mode's session token; `None` where only the plain mode is offered.
    async fn session_token(&self) -> Option<String> {
        let response = self
            .http
            .put(format!("{}/latest/api/token", self.endpoint))
            .header("X-aliyun-ecs-metadata-token-ttl-seconds", "21600")
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.text().await.ok().filter(|t| !t.is_empty())
    }

    async fn fetch(&self) -> Result<(Credentials, SystemTime), CredentialsError> {
        let mut request = self.http.get(format!(
            "{}/latest/meta-data/ram/security-credentials/{}",
            self.endpoint, self.role
        ));
        if let Some(token) = self.session_token().await {
            request = request.header("X-aliyun-ecs-metadata-token", token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| self.error(format!("request failed: {e}")))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.error(format!(
                "HTTP {status} (is the role attached to this instance?)"
            )));
        }
        let answer: RoleAnswer = response
            .json()
            .await
            .map_err(|e| self.error(format!("unreadable answer: {e}")))?;
        if !answer.code.is_empty() && answer.code != "Success" {
            return Err(self.error(format!("the service answered Code={}", answer.code)));
        }
        let expires = humantime::parse_rfc3339_weak(&answer.expiration)
            .map_err(|e| self.error(format!("bad Expiration {:?}: {e}", answer.expiration)))?;
        Ok((
            Credentials {
                access_key_id: answer.access_key_id,
                access_key_secret: Secret::new(answer.access_key_secret),
                security_token: Some(Secret::new(answer.security_token)),
            },
            expires,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn secrets_never_print() {
        let credentials = Credentials {
            access_key_id: "LTAI-id".into(),
            access_key_secret: Secret::new("very-secret"),
            security_token: Some(Secret::new("sts-secret")),
        };
        let shown = format!("{credentials:?} {}", credentials.access_key_secret);
        assert!(!shown.contains("very-secret"), "{shown}");
        assert!(!shown.contains("sts-secret"), "{shown}");
        assert!(shown.contains("LTAI-id"));
    }

    #[test]
    fn env_lines_parse_with_comments_quotes_and_export() {
        let entries = parse_env_lines(
            "# credentials\nexport ECI_ACCESS_KEY=id\n\nECI_SECRET_KEY=\"s=cret\"\nECI_SECURITY_TOKEN='tok'\n",
        );
        let credentials = credentials_from(Path::new("f"), &entries).unwrap();
        assert_eq!(credentials.access_key_id, "id");
        assert_eq!(credentials.access_key_secret.expose(), "s=cret");
        assert_eq!(credentials.security_token.unwrap().expose(), "tok");
        let error = credentials_from(Path::new("f"), &entries[..1]).unwrap_err();
        assert!(error.to_string().contains(SECRET_KEY_NAME), "{error}");
    }

    #[tokio::test]
    async fn a_secret_directory_is_read_again_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(ACCESS_KEY_NAME), "id-1\n").unwrap();
        std::fs::write(dir.path().join(SECRET_KEY_NAME), "secret-1\n").unwrap();
        let source = CredentialSource::file(dir.path().to_owned());
        let first = source.current().await.unwrap();
        assert_eq!(first.access_key_id, "id-1");
        assert_eq!(first.access_key_secret.expose(), "secret-1");
        assert_eq!(first.security_token, None);
        // Rotation: a different length is a different fingerprint whatever the clock does.
        std::fs::write(dir.path().join(ACCESS_KEY_NAME), "id-two\n").unwrap();
        std::fs::write(dir.path().join(SECURITY_TOKEN_NAME), "token\n").unwrap();
        let second = source.current().await.unwrap();
        assert_eq!(second.access_key_id, "id-two");
        assert_eq!(second.security_token.unwrap().expose(), "token");
        std::fs::remove_file(dir.path().join(SECRET_KEY_NAME)).unwrap();
        let error = source.current().await.unwrap_err();
        assert!(
            matches!(
                error,
                CredentialsError::Missing {
                    name: SECRET_KEY_NAME,
                    ..
                }
            ),
            "{error}"
        );
    }

    /// How kubelet updates a mounted Secret: the files live in a timestamped directory and
    /// the `..data` link is swapped to a new one; the names are links through `..data`.
    fn mount_secret_version(dir: &Path, version: &str, id: &str, secret: &str) {
        let data = dir.join(format!("..{version}"));
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join(ACCESS_KEY_NAME), id).unwrap();
        std::fs::write(data.join(SECRET_KEY_NAME), secret).unwrap();
        let staged = dir.join("..data_tmp");
        std::os::unix::fs::symlink(format!("..{version}"), &staged).unwrap();
        std::fs::rename(&staged, dir.join("..data")).unwrap();
        for name in [ACCESS_KEY_NAME, SECRET_KEY_NAME] {
            let link = dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
            }
        }
    }

    #[tokio::test]
    async fn a_mounted_secret_swapped_to_equal_sized_files_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        mount_secret_version(dir.path(), "v1", "id-1", "wrong-1");
        let source = CredentialSource::file(dir.path().to_owned());
        assert_eq!(source.current().await.unwrap().access_key_id, "id-1");
        // Same lengths, possibly the same modification second: the new inode tells.
        mount_secret_version(dir.path(), "v2", "id-2", "right-2");
        let rotated = source.current().await.unwrap();
        assert_eq!(rotated.access_key_id, "id-2");
        assert_eq!(rotated.access_key_secret.expose(), "right-2");
    }

    #[tokio::test]
    async fn refused_file_credentials_are_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(&file, "ECI_ACCESS_KEY=id-1\nECI_SECRET_KEY=secret-1\n").unwrap();
        let source = CredentialSource::file(file.clone());
        assert_eq!(source.current().await.unwrap().access_key_id, "id-1");
        // Rewritten in place to the same size, the old modification time put back: the
        // fingerprint cannot see it, but a refusal makes the next call look.
        let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::fs::write(&file, "ECI_ACCESS_KEY=id-2\nECI_SECRET_KEY=secret-2\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        assert_eq!(source.current().await.unwrap().access_key_id, "id-1");
        source.refused();
        assert_eq!(source.current().await.unwrap().access_key_id, "id-2");
    }

    async fn metadata_server(expiration: SystemTime, hardened: bool) -> (String, Arc<AtomicUsize>) {
        use axum::http::{HeaderMap, StatusCode};
        use axum::routing::{get, put};
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let app = axum::Router::new()
            .route(
                "/latest/api/token",
                put(move || async move {
                    if hardened {
                        (StatusCode::OK, "session-token".to_owned())
                    } else {
                        (StatusCode::FORBIDDEN, String::new())
                    }
                }),
            )
            .route(
                "/latest/meta-data/ram/security-credentials/{role}",
                get(move |axum::extract::Path(role): axum::extract::Path<String>, headers: HeaderMap| {
                    let counter = counter.clone();
                    async move {
                        if hardened && headers.get("X-aliyun-ecs-metadata-token").is_none() {
                            return (StatusCode::UNAUTHORIZED, String::new());
                        }
                        if role != "EciRole" {
                            return (StatusCode::NOT_FOUND, String::new());
                        }
                        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                        (
                            StatusCode::OK,
                            serde_json::json!({
                                "AccessKeyId": format!("STS.id-{n}"),
                                "AccessKeySecret": "role-secret",
                                "SecurityToken": "role-token",
                                "Expiration": humantime::format_rfc3339_seconds(expiration).to_string(),
                                "LastUpdated": "2026-11-21T00:00:00Z",
                                "Code": "Success"
                            })
                            .to_string(),
                        )
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{address}"), calls)
    }

    #[tokio::test]
    async fn role_credentials_are_cached_until_close_to_expiry() {
        let (endpoint, calls) =
            metadata_server(SystemTime::now() + Duration::from_secs(3600), true).await;
        let source =
            CredentialSource::ram_role(reqwest::Client::new(), &endpoint, "EciRole".into());
        let first = source.current().await.unwrap();
        assert_eq!(first.access_key_id, "STS.id-1");
        assert_eq!(
            first.security_token.as_ref().unwrap().expose(),
            "role-token"
        );
        let again = source.current().await.unwrap();
        assert_eq!(again, first);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn role_credentials_near_expiry_are_refreshed_and_plain_mode_works() {
        // Ten minutes left is inside the refresh margin: every use fetches anew.
        let (endpoint, calls) =
            metadata_server(SystemTime::now() + Duration::from_secs(600), false).await;
        let source =
            CredentialSource::ram_role(reqwest::Client::new(), &endpoint, "EciRole".into());
        assert_eq!(source.current().await.unwrap().access_key_id, "STS.id-1");
        assert_eq!(source.current().await.unwrap().access_key_id, "STS.id-2");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn role_credentials_are_fresh_renewable_or_missing() {
        let now = SystemTime::now();
        let key = Credentials {
            access_key_id: "STS.id".into(),
            access_key_secret: Secret::new("s".to_owned()),
            security_token: None,
        };
        let minutes = |m: u64| Duration::from_secs(m * 60);
        let cases = [
            (None, Freshness::Missing),
            (Some(now + minutes(60)), Freshness::Fresh(key.clone())),
            (Some(now + minutes(16)), Freshness::Fresh(key.clone())),
            (Some(now + minutes(14)), Freshness::Renewable(key.clone())),
            (
                Some(now + Duration::from_secs(1)),
                Freshness::Renewable(key.clone()),
            ),
            (Some(now), Freshness::Missing),
            (Some(now - minutes(1)), Freshness::Missing),
        ];
        for (expires, want) in cases {
            let cached = expires.map(|at| (key.clone(), at));
            assert_eq!(Freshness::of(cached.as_ref(), now), want, "{expires:?}");
        }
    }

    /// A metadata service answering with credentials inside the refresh margin, at once except
    /// for the second request: `arrived` is notified when it comes in, and it is answered once
    /// `release` is notified.
    async fn slow_metadata_server(
        arrived: Arc<tokio::sync::Notify>,
        release: Arc<tokio::sync::Notify>,
    ) -> String {
        use axum::routing::get;
        let calls = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new().route(
            "/latest/meta-data/ram/security-credentials/{role}",
            get(move || {
                let (calls, arrived, release) = (calls.clone(), arrived.clone(), release.clone());
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    if n == 2 {
                        arrived.notify_one();
                        release.notified().await;
                    }
                    let expires = SystemTime::now() + Duration::from_secs(600);
                    serde_json::json!({
                        "AccessKeyId": format!("STS.id-{n}"),
                        "AccessKeySecret": "role-secret",
                        "SecurityToken": "role-token",
                        "Expiration": humantime::format_rfc3339_seconds(expires).to_string(),
                        "Code": "Success"
                    })
                    .to_string()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{address}")
    }

    #[tokio::test]
    async fn a_slow_renewal_does_not_hold_up_requests_while_the_credentials_are_valid() {
        let (arrived, release) = (Arc::default(), Arc::new(tokio::sync::Notify::new()));
        let endpoint = slow_metadata_server(Arc::clone(&arrived), release.clone()).await;
        let source = Arc::new(CredentialSource::ram_role(
            reqwest::Client::new(),
            &endpoint,
            "EciRole".into(),
        ));
        assert_eq!(source.current().await.unwrap().access_key_id, "STS.id-1");
        // Ten minutes left: the next caller starts a renewal, which the service holds up.
        let renewing = tokio::spawn({
            let source = source.clone();
            async move { source.current().await.unwrap().access_key_id }
        });
        arrived.notified().await;
        // Another request meanwhile signs with the valid credentials instead of waiting (a
        // generous bound: without the renewal in its way it answers at once).
        for _ in 0..3 {
            let answer = tokio::time::timeout(Duration::from_secs(10), source.current()).await;
            let id = answer.expect("a request waited for the renewal").unwrap();
            assert_eq!(id.access_key_id, "STS.id-1");
        }
        release.notify_one();
        assert_eq!(renewing.await.unwrap(), "STS.id-2");
    }

    #[tokio::test]
    async fn an_unknown_role_is_a_clear_error() {
        let (endpoint, _) =
            metadata_server(SystemTime::now() + Duration::from_secs(3600), false).await;
        let source = CredentialSource::ram_role(reqwest::Client::new(), &endpoint, "Nope".into());
        let error = source.current().await.unwrap_err().to_string();
        assert!(
            error.contains("\"Nope\"") && error.contains("404"),
            "{error}"
        );
    }

    #[test]
    fn a_read_error_says_its_part_once() {
        let error = CredentialsError::Read {
            path: "/creds".into(),
            source: std::io::Error::other("denied"),
        };
        assert!(crate::ops::chain::says_each_part_once(&error));
    }
}
