//! Container group identity: a valid, unique `ContainerGroupName` and the tags that tie a
//! group to its cluster, node and pod.

use eci_proto::v20180808::Tag;

/// Tag: the cluster (`ECI_CLUSTER_NAME`).
pub const TAG_CLUSTER: &str = "k8s.aliyun.com/cluster";
/// Tag: the virtual node serving the pod.
pub const TAG_NODE: &str = "k8s.aliyun.com/node-name";
/// Tag: the pod's namespace.
pub const TAG_NAMESPACE: &str = "k8s.aliyun.com/namespace";
/// Tag: the pod's name.
pub const TAG_POD_NAME: &str = "k8s.aliyun.com/pod-name";
/// Tag: the pod's UID.
pub const TAG_POD_UID: &str = "k8s.aliyun.com/pod-uid";

const MAX_NAME: usize = 128;
const MAX_TAG_VALUE: usize = 128;

fn fnv(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// `<namespace>-<name>` in ECI's alphabet (lowercase letters, digits, `-`), at most 128
/// characters. When anything had to change (a `.` replaced, too long), an 8-hex-digit hash of
/// the original `namespace/name` is appended so two pods never share a name.
pub fn container_group_name(namespace: &str, name: &str) -> String {
    let raw = format!("{namespace}-{name}");
    let mut clean = String::with_capacity(raw.len());
    for ch in raw.chars() {
        let ch = ch.to_ascii_lowercase();
        let ch = if ch.is_ascii_lowercase() || ch.is_ascii_digit() {
            ch
        } else {
            '-'
        };
        if !(ch == '-' && clean.ends_with('-')) {
            clean.push(ch);
        }
    }
    let clean = clean.trim_matches('-').to_owned();
    if clean == raw && clean.len() <= MAX_NAME {
        return clean;
    }
    let suffix = format!("{:08x}", fnv(&format!("{namespace}/{name}")));
    let mut head: String = clean.chars().take(MAX_NAME - suffix.len() - 1).collect();
    while head.ends_with('-') {
        head.pop();
    }
    if head.is_empty() {
        format!("g-{suffix}")
    } else {
        format!("{head}-{suffix}")
    }
}

/// A tag value of at most 128 characters (long ones keep their start and a hash).
fn tag_value(value: &str) -> String {
    if value.chars().count() <= MAX_TAG_VALUE {
        return value.to_owned();
    }
    let suffix = format!("{:08x}", fnv(value));
    let head: String = value
        .chars()
        .take(MAX_TAG_VALUE - suffix.len() - 1)
        .collect();
    format!("{head}-{suffix}")
}

/// The tags of a pod's group.
pub fn tags(cluster: &str, node: &str, namespace: &str, name: &str, uid: &str) -> Vec<Tag> {
    [
        (TAG_CLUSTER, cluster),
        (TAG_NODE, node),
        (TAG_NAMESPACE, namespace),
        (TAG_POD_NAME, name),
        (TAG_POD_UID, uid),
    ]
    .into_iter()
    .map(|(key, value)| Tag {
        key: key.to_owned(),
        value: tag_value(value),
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_names_stay_readable() {
        assert_eq!(container_group_name("default", "web-0"), "default-web-0");
    }

    #[test]
    fn names_needing_changes_get_a_hash_and_stay_unique() {
        let dotted = container_group_name("team.a", "web.0");
        let dashed = container_group_name("team-a", "web-0");
        assert!(dotted.starts_with("team-a-web-0-"), "{dotted}");
        assert_ne!(dotted, dashed);
        let long = container_group_name("default", &"x".repeat(253));
        assert_eq!(long.len(), 128);
        assert_ne!(long, container_group_name("default", &"x".repeat(252)));
        for name in [dotted, dashed, long, container_group_name("Ns", "-Pod-")] {
            assert!(name.len() >= 2 && name.len() <= 128);
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{name}"
            );
            assert!(!name.starts_with('-') && !name.ends_with('-'), "{name}");
        }
    }

    #[test]
    fn tags_fit_ecis_limits() {
        let tags = tags("c1", "vn-0", "default", &"p".repeat(200), "uid-1");
        assert_eq!(tags.len(), 5);
        assert!(
            tags.iter()
                .all(|t| t.value.chars().count() <= 128 && t.key.len() <= 64)
        );
        assert_eq!(tags[4].value, "uid-1");
    }
}
