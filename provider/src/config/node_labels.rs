//! `NODE_LABELS`: extra labels an administrator puts on every virtual node (Helm's
//! `nodeLabels`), in the kubelet's `--node-labels` syntax (`key=value,key=value`).
//!
//! The kubelet's own rule decides which keys may be set this way (`ValidateKubeletLabels` in
//! `cmd/kubelet/app/options`): a key in the `kubernetes.io` or `k8s.io` namespaces is allowed
//! only under `kubelet.kubernetes.io/` or `node.kubernetes.io/`, or when it is one of the labels
//! the kubelet sets itself; here those are the labels the daemon already sets, so none of
//! them may be overridden either. Everything else must be a valid label (a qualified name and
//! a value of at most 63 characters).

use std::collections::BTreeMap;

/// Prefixes the kubelet allows in the reserved namespaces.
const ALLOWED_RESERVED_PREFIXES: [&str; 2] = ["kubelet.kubernetes.io/", "node.kubernetes.io/"];
/// The reserved label namespaces.
const RESERVED_NAMESPACES: [&str; 2] = ["kubernetes.io", "k8s.io"];
/// Longest name part of a key and longest value (a DNS label's length).
const NAME_MAX: usize = 63;
/// Longest prefix of a key (a DNS subdomain's length).
const PREFIX_MAX: usize = 253;

/// The labels outside the reserved namespaces (and under its allowed prefixes) that the daemon
/// sets on its nodes; `node::shape` holds its labels to this list in a test.
pub const SET_BY_DAEMON: [&str; 3] = [
    "k8s.aliyun.com/vnode",
    "type",
    "node.kubernetes.io/exclude-from-external-load-balancers",
];

/// Parses `text` (`k=v,k2=v2`; empty: no labels). `ours` are the labels the daemon sets, which
/// may not be overridden ([`SET_BY_DAEMON`] in the daemon). The error says which entry is
/// wrong and why.
pub(super) fn parse(text: &str, ours: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, value) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?} is not key=value"))?;
        let (key, value) = (key.trim(), value.trim());
        check_key(key)?;
        if !is_label_value(value) {
            return Err(format!(
                "the value of {key:?} is not a label value (at most {NAME_MAX} of letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
            ));
        }
        if ours.contains(&key) {
            return Err(format!("{key:?} is set by the daemon itself"));
        }
        if is_reserved(key) {
            return Err(format!(
                "{key:?} is in a reserved namespace (kubernetes.io, k8s.io): only kubelet.kubernetes.io/ and node.kubernetes.io/ keys may be set, as for the kubelet's --node-labels"
            ));
        }
        if labels.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("{key:?} is given twice"));
        }
    }
    Ok(labels)
}

fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = key
        .rsplit_once('/')
        .map_or((None, key), |(p, n)| (Some(p), n));
    if let Some(prefix) = prefix
        && !(prefix.len() <= PREFIX_MAX && super::site::is_dns_subdomain(prefix))
    {
        return Err(format!("the prefix of {key:?} is not a DNS subdomain"));
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(format!(
            "{key:?} is not a label key (a name of at most {NAME_MAX} letters, digits, '-', '_', '.', optionally after a DNS-subdomain prefix and '/')"
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 alphanumerics, '-', '_', '.', alphanumeric at both ends.
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    value.is_empty()
        || (bytes.len() <= NAME_MAX
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric))
}

/// Whether `key` is in the kubernetes.io or k8s.io namespaces and not under a prefix the
/// kubelet allows there.
pub fn is_reserved(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return false;
    };
    let in_namespace = RESERVED_NAMESPACES
        .iter()
        .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")));
    in_namespace
        && !ALLOWED_RESERVED_PREFIXES
            .iter()
            .any(|allowed| key.starts_with(allowed))
}

#[cfg(test)]
mod tests {
    use super::parse;

    const OURS: &[&str] = &["type", "kubernetes.io/hostname"];

    #[test]
    fn labels_in_the_kubelets_syntax() {
        let parsed = parse(" team=platform, example.com/tier=ecI-1 ,empty=", OURS).unwrap();
        let pairs: Vec<(&str, &str)> = parsed
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("empty", ""),
                ("example.com/tier", "ecI-1"),
                ("team", "platform")
            ]
        );
        assert!(parse("", OURS).unwrap().is_empty());
        assert_eq!(
            parse(
                "node.kubernetes.io/pool=eci,kubelet.kubernetes.io/x=1",
                OURS
            )
            .unwrap()
            .len(),
            2,
            "the kubelet's allowed prefixes"
        );
    }

    #[test]
    fn what_is_refused_and_why() {
        for (text, says) in [
            ("team", "not key=value"),
            ("=v", "not a label key"),
            ("a/b/c=v", "not a DNS subdomain"),
            ("Bad_Prefix.com/x=v", "not a DNS subdomain"),
            ("-x=v", "not a label key"),
            (&format!("{}=v", "k".repeat(64)), "not a label key"),
            ("k=-v", "not a label value"),
            (&format!("k={}", "v".repeat(64)), "not a label value"),
            ("k=a b", "not a label value"),
            ("type=other", "set by the daemon itself"),
            ("kubernetes.io/hostname=x", "set by the daemon itself"),
            ("kubernetes.io/role=master", "reserved namespace"),
            ("node-role.kubernetes.io/master=", "reserved namespace"),
            ("foo.k8s.io/x=1", "reserved namespace"),
            ("k=1,k=2", "given twice"),
        ] {
            let error = parse(text, OURS).expect_err(text);
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }
}
