//! An error with its causes, for log lines. Errors here say their own part once and chain the
//! cause (`#[source]`); a log field holding only `Display` would drop the cause, and JSON logs
//! print nothing more, so log sites write `error = %Chain(&error)`.

/// `error: cause: cause's cause` (one implementation for the workspace, in tls-serve).
pub use tls_serve::Chain;

/// Whether `error`'s `Display` says only its own part, not its cause's again (for unit tests
/// of this crate's error types; causes from other crates are theirs).
pub fn says_each_part_once(error: &(dyn std::error::Error + 'static)) -> bool {
    error.source().is_none_or(|cause| {
        let said = cause.to_string();
        said.is_empty() || !error.to_string().contains(&said)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the thing")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the thing: {0}")]
    struct Twice(#[source] std::io::Error);

    #[test]
    fn a_cause_said_twice_is_caught() {
        assert!(!says_each_part_once(&Twice(std::io::Error::other(
            "disk on fire"
        ))));
        assert!(says_each_part_once(&Outer(std::io::Error::other(
            "disk on fire"
        ))));
    }

    #[test]
    fn each_part_once_outermost_first() {
        let error = Outer(std::io::Error::other("disk on fire"));
        assert_eq!(
            Chain(&error).to_string(),
            "cannot read the thing: disk on fire"
        );
    }
}
