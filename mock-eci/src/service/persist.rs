//! The state file: groups and their agenda as JSON, written atomically.

use std::io;
use std::path::{Path, PathBuf};

use crate::engine::{SNAPSHOT_VERSION, Snapshot};

/// Reading or writing the state file failed.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The file could not be read or written.
    #[error("state file {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is not a mock-eci state file of this version.
    #[error("state file {path} is not a valid mock-eci state file (delete it to start empty)")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// Written by another format version.
    #[error(
        "state file {path} has format version {found}, this mock-eci reads version {SNAPSHOT_VERSION}; delete it to start empty"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
}

/// Loads the snapshot, or `None` when the file does not exist yet.
pub fn load(path: &Path) -> Result<Option<Snapshot>, PersistError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PersistError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let snapshot: Snapshot =
        serde_json::from_slice(&bytes).map_err(|source| PersistError::Corrupt {
            path: path.to_owned(),
            source,
        })?;
    if snapshot.version != SNAPSHOT_VERSION {
        return Err(PersistError::Version {
            path: path.to_owned(),
            found: snapshot.version,
        });
    }
    Ok(Some(snapshot))
}

/// Writes the snapshot atomically: a temporary file beside it, then a rename.
pub fn save(path: &Path, snapshot: &Snapshot) -> Result<(), PersistError> {
    let io_error = |source| PersistError::Io {
        path: path.to_owned(),
        source,
    };
    let bytes =
        serde_json::to_vec(snapshot).map_err(|source| io_error(io::Error::other(source)))?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    std::fs::write(&temporary, bytes).map_err(io_error)?;
    std::fs::rename(&temporary, path).map_err(io_error)
}
