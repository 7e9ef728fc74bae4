//! `$(VAR)` references in env values, command and args, expanded as the kubelet does before a
//! container starts (ECI runs what it is given: nobody else would expand them).
//!
//! The grammar is Kubernetes' (`third_party/forked/golang/expansion`): `$(NAME)` becomes the
//! value of `NAME` when it is defined, and stays as written when it is not; `$$` is an escaped
//! `$`; any other `$` is kept. No maintained crate implements exactly this, hence the few lines.

/// `input` with every defined `$(NAME)` replaced through `lookup`.
pub fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            out.push('$');
            rest = escaped;
        } else if let Some(reference) = after.strip_prefix('(') {
            match reference.find(')') {
                Some(end) => {
                    let name = &reference[..end];
                    match lookup(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &reference[end + 1..];
                }
                // An unterminated reference is text.
                None => {
                    out.push_str("$(");
                    rest = reference;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn expands_like_the_kubelet() {
        let vars = HashMap::from([
            ("VAR_A", "A"),
            ("VAR_B", "B"),
            ("EMPTY", ""),
            ("NESTED", "$(VAR_A)"),
        ]);
        let lookup = |name: &str| vars.get(name).copied();
        for (input, expected) in [
            ("", ""),
            ("plain", "plain"),
            ("$(VAR_A)", "A"),
            ("x-$(VAR_A)-$(VAR_B)-y", "x-A-B-y"),
            ("$(VAR_A)$(VAR_B)", "AB"),
            ("$(EMPTY)", ""),
            // Undefined: kept as written.
            ("$(UNDEFINED)", "$(UNDEFINED)"),
            ("a$(UNDEFINED)b", "a$(UNDEFINED)b"),
            // Escapes.
            ("$$(VAR_A)", "$(VAR_A)"),
            ("$$$(VAR_A)", "$A"),
            ("$$", "$"),
            ("$$$$", "$$"),
            // A lone `$` and other characters after it stay.
            ("$", "$"),
            ("$VAR_A", "$VAR_A"),
            ("cost: 5$", "cost: 5$"),
            // Unterminated.
            ("$(VAR_A", "$(VAR_A"),
            ("x $(", "x $("),
            // Values are not expanded again.
            ("$(NESTED)", "$(VAR_A)"),
            ("$()", "$()"),
            ("ünïcode $(VAR_A) ✓", "ünïcode A ✓"),
        ] {
            assert_eq!(expand(input, lookup), expected, "{input:?}");
        }
    }

    #[test]
    fn edge_cases_stay_as_written() {
        let vars = HashMap::from([("A", "1"), ("B", "two"), ("EMPTY", "")]);
        let lookup = |name: &str| vars.get(name).copied();
        let cases = [
            ("plain", "plain"),
            ("$(A)", "1"),
            ("x$(A)y$(B)z", "x1ytwoz"),
            ("$(MISSING)", "$(MISSING)"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$1"),
            ("$$", "$"),
            ("$", "$"),
            ("a$", "a$"),
            ("$A", "$A"),
            ("$(A", "$(A"),
            ("$(A$(B)", "$(A$(B)"),
            ("$()", "$()"),
            ("$(EMPTY)x", "x"),
            ("é$(A)ü$é", "é1ü$é"),
            ("$(A)$(A)", "11"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, lookup), want, "input {input:?}");
        }
    }
}
