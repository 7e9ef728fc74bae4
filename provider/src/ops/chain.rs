//! An error with its causes, for log lines. Errors here say their own part once and chain the
//! cause (`#[source]`); a log field holding only `Display` would drop the cause, and JSON logs
//! print nothing more, so log sites write `error = %Chain(&error)`.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the thing")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn each_part_once_outermost_first() {
        let error = Outer(std::io::Error::other("disk on fire"));
        assert_eq!(
            Chain(&error).to_string(),
            "cannot read the thing: disk on fire"
        );
    }
}
