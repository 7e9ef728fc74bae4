//! Names and addresses of what the sandbox creates, derived (purely) from a prefix, a group id,
//! a container name and the group's address, so that the same inputs always name the same
//! namespace, interface, runtime container and cgroup — what deletion and a later clean-up after
//! a crash rely on.
//!
//! Every part that reaches a path, an interface name or a command line is checked here first:
//! group ids, container names and host names come from the API caller.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// Linux interface names hold 15 bytes; a host-side veth is `<prefix><8 hex digits>`.
const MAX_PREFIX: usize = 6;
/// A DNS label (RFC 1123), which group ids and container names must be.
const MAX_LABEL: usize = 63;
/// Linux's HOST_NAME_MAX.
const MAX_HOSTNAME: usize = 64;
/// A search domain's bound in resolv.conf (a DNS name's).
const MAX_DNS_WORD: usize = 253;

/// A name or address the sandbox refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("prefix {0:?} must be 1 to {MAX_PREFIX} lowercase letters or digits")]
    Prefix(String),
    #[error(
        "{what} {value:?} must be a DNS label: 1 to {MAX_LABEL} of a-z, 0-9 and '-', not starting or ending with '-'"
    )]
    Label { what: &'static str, value: String },
    #[error("host name {0:?} must be dot-separated DNS labels, at most {MAX_HOSTNAME} characters")]
    Hostname(String),
    #[error("DNS setting {0:?} must be 1 to {MAX_DNS_WORD} printable characters without spaces")]
    DnsWord(String),
    #[error("group address {ip} is not a host address of the sandbox network {network}")]
    Address { ip: Ipv4Addr, network: Ipv4Net },
}

/// The sandbox's naming scheme: a short prefix owned by one sandbox (so that two sandboxes on
/// one machine, e.g. parallel tests, never touch each other's objects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix(String);

impl Prefix {
    pub fn new(prefix: &str) -> Result<Self, NameError> {
        let valid = !prefix.is_empty()
            && prefix.len() <= MAX_PREFIX
            && prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if valid {
            Ok(Self(prefix.to_owned()))
        } else {
            Err(NameError::Prefix(prefix.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The host bridge all groups' veths join.
    pub fn bridge(&self) -> String {
        format!("{}0", self.0)
    }

    /// The group's network namespace (as `ip netns` names it, under /run/netns).
    pub fn netns(&self, group: &Label) -> String {
        format!("{}-{}", self.0, group.0)
    }

    /// The host side of the group's veth pair: named from its address, which is unique on the
    /// bridge, so it fits the 15-byte limit whatever the group id's length.
    pub fn host_veth(&self, ip: Ipv4Addr) -> String {
        format!("{}{:08x}", self.0, u32::from(ip))
    }

    /// Whether interface `name` is one this prefix names: its bridge or a host veth. Matched
    /// by shape, not by leading characters: prefix `vt1` must not claim `vt12`'s bridge
    /// `vt120`, which another sandbox on the machine owns.
    pub fn owns_link(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix(self.0.as_str()) else {
            return false;
        };
        rest == "0"
            || (rest.len() == 8
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    }

    /// The OCI runtime's container id, also the (flat) cgroup name the runtime creates and
    /// removes itself.
    pub fn runtime_id(&self, group: &Label, container: &Label) -> String {
        format!("{}-{}-{}", self.0, group.0, container.0)
    }
}

/// A DNS label: a group id or a container name, safe in paths and command lines.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label(String);

impl Label {
    pub fn new(what: &'static str, value: &str) -> Result<Self, NameError> {
        if is_label(value) {
            Ok(Self(value.to_owned()))
        } else {
            Err(NameError::Label {
                what,
                value: value.to_owned(),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn is_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_LABEL
        && !value.starts_with('-')
        && !value.ends_with('-')
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The group's host name (its own UTS namespace's), checked.
pub fn hostname(value: &str) -> Result<String, NameError> {
    let valid = !value.is_empty() && value.len() <= MAX_HOSTNAME && value.split('.').all(is_label);
    if valid {
        Ok(value.to_owned())
    } else {
        Err(NameError::Hostname(value.to_owned()))
    }
}

/// A search domain or resolver option as one word of /etc/resolv.conf: a caller's value must
/// not be able to add lines or words of its own.
pub fn dns_word(value: &str) -> Result<(), NameError> {
    let valid = !value.is_empty()
        && value.len() <= MAX_DNS_WORD
        && value.chars().all(|c| c.is_ascii_graphic());
    if valid {
        Ok(())
    } else {
        Err(NameError::DnsWord(value.to_owned()))
    }
}

/// The group's address with the network's prefix length, if it is a host address of the
/// network other than the bridge's own.
pub fn group_address(network: Ipv4Net, ip: Ipv4Addr) -> Result<Ipv4Net, NameError> {
    let usable = network.contains(&ip)
        && ip != network.addr()
        && ip != network.network()
        && ip != network.broadcast();
    if usable {
        Ipv4Net::new(ip, network.prefix_len()).map_err(|_| NameError::Address { ip, network })
    } else {
        Err(NameError::Address { ip, network })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("test network")
    }

    #[test]
    fn prefixes() {
        let cases = [
            ("vneci", true),
            ("vt01", true),
            ("", false),
            ("toolong", false),
            ("Vne", false),
            ("v-e", false),
        ];
        for (prefix, ok) in cases {
            assert_eq!(Prefix::new(prefix).is_ok(), ok, "{prefix:?}");
        }
    }

    #[test]
    fn a_prefix_owns_its_bridge_and_veths_only() {
        let vt1 = Prefix::new("vt1").expect("prefix");
        let bridge = vt1.bridge();
        let host_veth = vt1.host_veth(Ipv4Addr::new(10, 213, 1, 2));
        // vt12 and vt10 are other sandboxes' prefixes.
        let cases = [
            (bridge.as_str(), true),
            (host_veth.as_str(), true),
            ("vt120", false),
            ("vt12", false),
            ("vt100", false),
            ("vt120ad50c02", false),
            ("vt1ad5010g", false),
            ("vt1-g", false),
            ("eth0", false),
        ];
        for (name, owned) in cases {
            assert_eq!(vt1.owns_link(name), owned, "{name:?}");
        }
    }

    #[test]
    fn labels() {
        let cases = [
            ("eci-2ze0abc", true),
            ("nginx", true),
            ("a", true),
            ("", false),
            ("-a", false),
            ("a-", false),
            ("A", false),
            ("a/b", false),
            ("..", false),
            ("a b", false),
            (&"x".repeat(64), false),
            (&"x".repeat(63), true),
        ];
        for (value, ok) in cases {
            assert_eq!(Label::new("group id", value).is_ok(), ok, "{value:?}");
        }
    }

    #[test]
    fn hostnames() {
        let cases = [
            ("web-0", true),
            ("web-0.svc.local", true),
            ("", false),
            ("a..b", false),
            ("a;reboot", false),
            (&format!("{}.{}", "a".repeat(40), "b".repeat(30)), false),
        ];
        for (value, ok) in cases {
            assert_eq!(hostname(value).is_ok(), ok, "{value:?}");
        }
    }

    #[test]
    fn dns_words() {
        let cases = [
            ("svc.cluster.local", true),
            ("ndots:5", true),
            ("", false),
            ("a b", false),
            ("a\nnameserver 1.2.3.4", false),
            ("é", false),
        ];
        for (value, ok) in cases {
            assert_eq!(dns_word(value).is_ok(), ok, "{value:?}");
        }
    }

    #[test]
    fn names_fit_linux_limits() {
        let prefix = Prefix::new("vneci").expect("prefix");
        let group = Label::new("group id", &"g".repeat(63)).expect("group");
        let container = Label::new("container", "app").expect("container");
        assert_eq!(prefix.bridge(), "vneci0");
        assert_eq!(prefix.netns(&group), format!("vneci-{}", "g".repeat(63)));
        let veth = prefix.host_veth(Ipv4Addr::new(10, 213, 0, 2));
        assert_eq!(veth, "vneci0ad50002");
        assert!(veth.len() <= 15);
        let longest = Prefix::new("abcdef").expect("prefix");
        assert_eq!(longest.host_veth(Ipv4Addr::BROADCAST).len(), 14);
        assert_eq!(
            prefix.runtime_id(&group, &container),
            format!("vneci-{}-app", "g".repeat(63))
        );
    }

    #[test]
    fn group_addresses() {
        let network = net("10.213.0.1/24");
        let cases = [
            (Ipv4Addr::new(10, 213, 0, 2), Some("10.213.0.2/24")),
            (Ipv4Addr::new(10, 213, 0, 254), Some("10.213.0.254/24")),
            (Ipv4Addr::new(10, 213, 0, 1), None),
            (Ipv4Addr::new(10, 213, 0, 0), None),
            (Ipv4Addr::new(10, 213, 0, 255), None),
            (Ipv4Addr::new(10, 213, 1, 2), None),
            (Ipv4Addr::new(127, 0, 0, 2), None),
        ];
        for (ip, expected) in cases {
            let got = group_address(network, ip).ok().map(|n| n.to_string());
            assert_eq!(got.as_deref(), expected, "{ip}");
        }
    }
}
