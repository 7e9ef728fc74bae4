//! An error with its causes on one line, for log lines. Errors in this workspace say their
//! own part once and chain the cause (`#[source]`); a log field holding only `Display` would
//! drop the cause, and JSON logs print nothing more, so log sites write
//! `error = %Chain(&error)`. It lives in this crate because it is the lowest one every part of
//! the workspace that logs errors depends on.

use std::fmt;

/// `error: cause: cause's cause`.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}
