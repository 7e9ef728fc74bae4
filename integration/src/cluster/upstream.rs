//! The upstream binaries (kube-apiserver, …, etcd, kwok, metrics-server, helm): built or found
//! in the version-keyed cache by `integration/upstream/build.sh`, whose stdout names each one.
//! Each caller names the components it runs, so a cold cache builds only those.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Building or locating the upstream binaries failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The build script could not be run at all.
    #[error("run {script}")]
    Run {
        /// The script.
        script: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The build script failed; its progress lines (on stderr, shown as they came) say why.
    #[error("{script} failed ({status}); the lines above say why")]
    Failed {
        /// The script.
        script: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// The script did not name a binary the fixture needs.
    #[error("{script} named no `{name}`")]
    Missing {
        /// The script.
        script: PathBuf,
        /// The binary.
        name: String,
    },
}

/// Where each upstream binary is.
#[derive(Debug, Clone)]
pub struct Upstream {
    paths: BTreeMap<String, PathBuf>,
    script: PathBuf,
}

/// The build script, in the source tree of this crate.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("upstream/build.sh")
}

/// The components of the control plane (the build script's names for them).
pub const CONTROL_PLANE: &[&str] = &["kubernetes", "etcd", "kwok", "metrics-server"];

impl Upstream {
    /// The control plane's binaries: [`Upstream::locate_components`] of [`CONTROL_PLANE`].
    pub async fn locate() -> Result<Self, UpstreamError> {
        Self::locate_components(CONTROL_PLANE).await
    }

    /// Runs the build script for `components` (a few hundred milliseconds when they are
    /// cached; a cold build prints its progress to stderr as it goes) and reads where it put
    /// their binaries.
    pub async fn locate_components(components: &[&str]) -> Result<Self, UpstreamError> {
        let script = build_script();
        let run = |source| UpstreamError::Run {
            script: script.clone(),
            source,
        };
        // spawn + wait_with_output, not `output()`: tokio's `output()` pipes stderr whatever
        // was asked, which would hide a cold build's progress (and a failed build's reasons)
        // until the end. Only stdout, the `name=path` lines, is captured.
        let child = tokio::process::Command::new("bash")
            .arg(&script)
            .args(components)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(run)?;
        let output = child.wait_with_output().await.map_err(run)?;
        if !output.status.success() {
            return Err(UpstreamError::Failed {
                script,
                status: output.status,
            });
        }
        let paths = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(name, path)| (name.trim().to_owned(), PathBuf::from(path.trim())))
            .collect();
        Ok(Self { paths, script })
    }

    /// The path of `name` (`kube-apiserver`, `kubectl`, `etcd`, `kwok`, `kwok-stages`, …).
    pub fn path(&self, name: &str) -> Result<&Path, UpstreamError> {
        self.paths
            .get(name)
            .map(PathBuf::as_path)
            .ok_or_else(|| UpstreamError::Missing {
                script: self.script.clone(),
                name: name.to_owned(),
            })
    }
}

/// The path of one `binary` of `component`, located from synchronous code (a test's
/// `OnceLock`, say) on a thread and runtime of its own, so sync and async callers alike can use
/// it. Builds the component first when the cache lacks it.
pub fn locate_binary_blocking(component: &str, binary: &str) -> Result<PathBuf, UpstreamError> {
    let component = component.to_owned();
    let located = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| UpstreamError::Run {
                script: build_script(),
                source,
            })?
            .block_on(Upstream::locate_components(&[component.as_str()]))
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
    located.path(binary).map(Path::to_owned)
}
