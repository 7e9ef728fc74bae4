//! The groups' network: one host bridge holding the sandbox network's first address, and per
//! group a network namespace joined to the bridge by a veth pair, with the group's address and a
//! default route through the bridge. Groups reach each other over the bridge; the host reaches
//! them through the bridge's address.
//!
//! What to run is decided by pure functions returning `ip` argument lists (table-tested);
//! [`run`], [`output`] and the observations ([`netns_exists`], [`link_exists`]) are the edge.

use std::net::Ipv4Addr;
use std::path::Path;

use ipnet::Ipv4Net;
use tokio::process::Command;

/// Where `ip netns` keeps its namespaces.
const NETNS_DIR: &str = "/run/netns";
/// The interface name inside every group's namespace.
const GROUP_INTERFACE: &str = "eth0";

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(
        "sandbox network {0} must be a private IPv4 network (10/8, 172.16/12 or 192.168/16) with room for groups"
    )]
    Network(Ipv4Net),
    #[error("could not run `ip {args}` (is iproute2 installed?)")]
    Spawn {
        args: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`ip {args}` failed: {stderr}")]
    Failed { args: String, stderr: String },
}

/// What the sandbox needs to know about one group's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupNet {
    pub netns: String,
    pub host_veth: String,
    /// The group's address with the network's prefix length.
    pub address: Ipv4Net,
}

/// The sandbox network must be private, not loopback (the apiserver refuses loopback
/// endpoints), and leave room for groups beside the bridge's address.
pub fn check_network(network: Ipv4Net) -> Result<(), NetError> {
    if network.addr().is_private() && network.prefix_len() <= 30 {
        Ok(())
    } else {
        Err(NetError::Network(network))
    }
}

/// Steps that make the bridge exist, hold `gateway` and be up (idempotent past creation).
pub fn bridge_steps(bridge: &str, gateway: Ipv4Net, exists: bool) -> Vec<Vec<String>> {
    let mut steps = Vec::new();
    if !exists {
        steps.push(args(&["link", "add", bridge, "type", "bridge"]));
    }
    steps.push(args(&[
        "addr",
        "replace",
        &gateway.to_string(),
        "dev",
        bridge,
    ]));
    steps.push(args(&["link", "set", bridge, "up"]));
    steps
}

/// Steps that give a group its namespace, veth pair, address and default route.
pub fn group_steps(bridge: &str, gateway: Ipv4Addr, group: &GroupNet) -> Vec<Vec<String>> {
    let ns = group.netns.as_str();
    let veth = group.host_veth.as_str();
    vec![
        args(&["netns", "add", ns]),
        args(&[
            "link",
            "add",
            veth,
            "type",
            "veth",
            "peer",
            "name",
            GROUP_INTERFACE,
            "netns",
            ns,
        ]),
        args(&["link", "set", veth, "master", bridge, "up"]),
        args(&["-n", ns, "link", "set", "lo", "up"]),
        args(&[
            "-n",
            ns,
            "addr",
            "add",
            &group.address.to_string(),
            "dev",
            GROUP_INTERFACE,
        ]),
        args(&["-n", ns, "link", "set", GROUP_INTERFACE, "up"]),
        args(&[
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &gateway.to_string(),
        ]),
    ]
}

/// Steps that remove what is left of a group's network: the host end of the veth first
/// (deleting it deletes the pair at once, whereas the end inside a deleted namespace goes only
/// when the kernel gets to destroying the namespace), then the namespace.
pub fn group_removal_steps(
    group: &GroupNet,
    netns_exists: bool,
    veth_exists: bool,
) -> Vec<Vec<String>> {
    let mut steps = Vec::new();
    if veth_exists {
        steps.push(args(&["link", "del", &group.host_veth]));
    }
    if netns_exists {
        steps.push(args(&["netns", "del", &group.netns]));
    }
    steps
}

/// Steps that remove the bridge, if it is there.
pub fn bridge_removal_steps(bridge: &str, exists: bool) -> Vec<Vec<String>> {
    if exists {
        vec![args(&["link", "del", bridge])]
    } else {
        Vec::new()
    }
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|part| (*part).to_owned()).collect()
}

pub fn netns_exists(netns: &str) -> bool {
    Path::new(NETNS_DIR).join(netns).exists()
}

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// The path a runtime joins for the group's network namespace.
pub fn netns_path(netns: &str) -> std::path::PathBuf {
    Path::new(NETNS_DIR).join(netns)
}

/// Runs the steps in order, stopping at the first failure.
pub async fn run(steps: &[Vec<String>]) -> Result<(), NetError> {
    for step in steps {
        output(step).await?;
    }
    Ok(())
}

/// Runs `ip args`, answering its stdout.
pub async fn output(args: &[impl AsRef<std::ffi::OsStr>]) -> Result<String, NetError> {
    let joined = args
        .iter()
        .map(|arg| arg.as_ref().to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let output = Command::new("ip")
        .args(args)
        .output()
        .await
        .map_err(|source| NetError::Spawn {
            args: joined.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(NetError::Failed {
            args: joined,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    tracing::debug!(args = %joined, "ip");
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(steps: &[Vec<String>]) -> Vec<String> {
        steps.iter().map(|step| step.join(" ")).collect()
    }

    fn group() -> GroupNet {
        GroupNet {
            netns: "vt-eci-1".into(),
            host_veth: "vt0ad50002".into(),
            address: "10.213.0.2/24".parse().expect("address"),
        }
    }

    #[test]
    fn networks() {
        let cases = [
            ("10.213.0.1/24", true),
            ("172.20.0.1/16", true),
            ("192.168.7.1/24", true),
            ("127.204.0.1/16", false),
            ("8.8.8.1/24", false),
            ("10.0.0.1/31", false),
        ];
        for (network, ok) in cases {
            let network: Ipv4Net = network.parse().expect("network");
            assert_eq!(check_network(network).is_ok(), ok, "{network}");
        }
    }

    #[test]
    fn the_bridge_is_created_once_and_configured_always() {
        let gateway = "10.213.0.1/24".parse().expect("gateway");
        assert_eq!(
            joined(&bridge_steps("vt0", gateway, false)),
            [
                "link add vt0 type bridge",
                "addr replace 10.213.0.1/24 dev vt0",
                "link set vt0 up"
            ]
        );
        assert_eq!(
            joined(&bridge_steps("vt0", gateway, true)),
            ["addr replace 10.213.0.1/24 dev vt0", "link set vt0 up"]
        );
    }

    #[test]
    fn a_group_gets_a_namespace_a_veth_an_address_and_a_route() {
        let steps = group_steps("vt0", Ipv4Addr::new(10, 213, 0, 1), &group());
        assert_eq!(
            joined(&steps),
            [
                "netns add vt-eci-1",
                "link add vt0ad50002 type veth peer name eth0 netns vt-eci-1",
                "link set vt0ad50002 master vt0 up",
                "-n vt-eci-1 link set lo up",
                "-n vt-eci-1 addr add 10.213.0.2/24 dev eth0",
                "-n vt-eci-1 link set eth0 up",
                "-n vt-eci-1 route add default via 10.213.0.1",
            ]
        );
    }

    #[test]
    fn removal_follows_what_exists() {
        let cases: [(bool, bool, &[&str]); 4] = [
            (true, true, &["link del vt0ad50002", "netns del vt-eci-1"]),
            (true, false, &["netns del vt-eci-1"]),
            (false, true, &["link del vt0ad50002"]),
            (false, false, &[]),
        ];
        for (netns, veth, expected) in cases {
            assert_eq!(
                joined(&group_removal_steps(&group(), netns, veth)),
                expected,
                "netns {netns}, veth {veth}"
            );
        }
        assert_eq!(joined(&bridge_removal_steps("vt0", true)), ["link del vt0"]);
        assert!(bridge_removal_steps("vt0", false).is_empty());
    }
}
