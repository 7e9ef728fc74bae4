//! Non-loopback addresses on this machine for the playground's real-runtime mode.
//!
//! kube-apiserver refuses to proxy to a loopback address (`kubectl logs`/`exec` reach a node at
//! its InternalIP) and refuses loopback endpoints in EndpointSlices, so in real mode neither
//! the daemons (their pod IP is their node's InternalIP) nor mock-eci's groups may sit on
//! loopback. The groups get mock-eci's own bridge network (`--runtime-network`); the host-node
//! agent's pods and mock-eci get a private /16 that an interface of the playground's makes
//! local to this machine: `ip route add local 10.X.0.0/16 dev <link>` answers on every address
//! of the block, as Linux does on 127.0.0.0/8, so each pod binds its own address without one
//! `ip addr add` per pod. The interface is a bridge with no ports, which only holds the route
//! (a `dummy` interface would do the same, but its kernel module is missing on some machines,
//! this development machine's included; the bridge driver is there wherever mock-eci's real
//! runtime works). An interface of its own rather than an address on mock-eci's bridge: that
//! bridge belongs to mock-eci (created at its start, removed at its stop, swept by its prefix)
//! and the daemons' addresses must exist before it and outlive a restart of it.
//!
//! Deleting the interface removes its route, so [`LocalNetwork::remove`] leaves nothing. The
//! interface is named after the playground's process id (`vnepg<pid>`): a playground killed
//! with -9 leaves its interface, which the next one removes ([`stale_links`]).
//!
//! Choosing blocks and names is pure (table-tested); [`ip`] is the edge.

use std::net::Ipv4Addr;

use mock_eci::sandbox::net::{self, NetError};

/// Prefix of the interfaces' names (`vnepg<pid>`).
pub const LINK_PREFIX: &str = "vnepg";

/// Setting up or removing the network failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalNetError {
    /// `ip` could not be run or failed.
    #[error("network command failed")]
    Ip(#[source] NetError),
    /// Every candidate block overlaps a route of this machine.
    #[error(
        "no free 10.X.0.0/16 block among 10.{first}–10.{last}: each overlaps a route of this machine"
    )]
    NoFreeBlock {
        /// First candidate second octet.
        first: u8,
        /// Last one.
        last: u8,
    },
}

/// A private /16, `10.<second>.0.0/16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The second octet.
    pub second: u8,
}

impl Block {
    /// Its network address.
    pub fn network(self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.second, 0, 0)
    }

    /// Its first host address, `10.<second>.0.1`.
    pub fn first_host(self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.second, 0, 1)
    }

    /// `10.<second>.0.0/16`.
    pub fn cidr(self) -> String {
        format!("{}/16", self.network())
    }
}

/// The destinations of `ip -4 -o route show table all`'s lines (`default` left out: it
/// overlaps everything and takes nothing).
pub fn route_destinations(routes: &str) -> Vec<(Ipv4Addr, u8)> {
    const TYPES: [&str; 7] = [
        "unicast",
        "local",
        "broadcast",
        "multicast",
        "blackhole",
        "unreachable",
        "prohibit",
    ];
    routes
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let mut first = words.next()?;
            if TYPES.contains(&first) {
                first = words.next()?;
            }
            let (address, length) = first.split_once('/').unwrap_or((first, "32"));
            Some((
                address.parse().ok()?,
                length.parse().ok().filter(|l| *l <= 32)?,
            ))
        })
        .collect()
}

/// Whether `block` and the network `address/length` share an address.
fn overlaps(block: Block, (address, length): (Ipv4Addr, u8)) -> bool {
    let shorter = length.min(16);
    let mask = if shorter == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(shorter))
    };
    u32::from(block.network()) & mask == u32::from(address) & mask
}

/// `count` distinct blocks among 10.`first`–10.`last` that overlap none of `routes`, starting
/// the search at `start` (a random offset: two playgrounds rarely pick the same) and wrapping.
pub fn free_blocks(
    routes: &[(Ipv4Addr, u8)],
    first: u8,
    last: u8,
    start: u8,
    count: usize,
) -> Result<Vec<Block>, LocalNetError> {
    let span = u16::from(last) - u16::from(first) + 1;
    let found: Vec<Block> = (0..span)
        .map(|i| {
            let offset = (u16::from(start) + i) % span;
            Block {
                // `first + offset <= last`, a u8.
                second: u8::try_from(u16::from(first) + offset).unwrap_or(last),
            }
        })
        .filter(|block| !routes.iter().any(|route| overlaps(*block, *route)))
        .take(count)
        .collect();
    if found.len() == count {
        Ok(found)
    } else {
        Err(LocalNetError::NoFreeBlock { first, last })
    }
}

/// How a playground's slot records the blocks it holds: their second octets, space-separated.
pub fn blocks_record(blocks: &[Block]) -> String {
    blocks
        .iter()
        .map(|block| block.second.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The blocks of a record [`blocks_record`] wrote; what is not a second octet is left out.
pub fn parse_blocks_record(record: &str) -> Vec<Block> {
    record
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .map(|second| Block { second })
        .collect()
}

/// The interface of the playground whose process id is `pid`.
pub fn link_name(pid: u32) -> String {
    format!("{LINK_PREFIX}{pid}")
}

/// Of `links` (interface names), the playgrounds' interfaces whose process is gone.
pub fn stale_links<'a>(
    links: impl IntoIterator<Item = &'a str>,
    alive: impl Fn(u32) -> bool,
) -> Vec<String> {
    links
        .into_iter()
        .filter(|link| {
            link.strip_prefix(LINK_PREFIX)
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !alive(pid))
        })
        .map(str::to_owned)
        .collect()
}

/// The names of this machine's interfaces (`ip -o link show`: `N: name[@peer]: <...>`).
pub fn link_names(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| {
            let name = line.split(": ").nth(1)?;
            Some(name.split('@').next().unwrap_or(name).to_owned())
        })
        .collect()
}

/// Runs `ip args`, answering its stdout (mock-eci's runner: one place spawns `ip`).
pub async fn ip(args: &[&str]) -> Result<String, LocalNetError> {
    net::output(args).await.map_err(LocalNetError::Ip)
}

/// An interface (a bridge with no ports) whose local route makes a block this machine's own.
#[derive(Debug)]
pub struct LocalNetwork {
    link: String,
    block: Block,
}

impl LocalNetwork {
    /// Removes the interfaces of playgrounds that are gone, then creates `link` with `block`
    /// routed locally; on failure, removes what it made.
    pub async fn create(link: String, block: Block) -> Result<Self, LocalNetError> {
        let listing = ip(&["-o", "link", "show"]).await?;
        let names = link_names(&listing);
        for stale in stale_links(names.iter().map(String::as_str), |pid| {
            std::path::Path::new(&format!("/proc/{pid}")).exists()
        }) {
            tracing::warn!(link = %stale, "removing the interface of a playground that is gone");
            ip(&["link", "del", &stale]).await?;
        }
        ip(&["link", "add", &link, "type", "bridge"]).await?;
        let network = Self { link, block };
        let cidr = block.cidr();
        let made = async {
            ip(&["link", "set", &network.link, "up"]).await?;
            ip(&["route", "add", "local", &cidr, "dev", &network.link]).await
        };
        if let Err(error) = made.await {
            let _ = ip(&["link", "del", &network.link]).await;
            return Err(error);
        }
        Ok(network)
    }

    /// The interface's name.
    pub fn link(&self) -> &str {
        &self.link
    }

    /// The block.
    pub fn block(&self) -> Block {
        self.block
    }

    /// Deletes the interface (and with it its route).
    pub async fn remove(self) -> Result<(), LocalNetError> {
        ip(&["link", "del", &self.link]).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTES: &str = "\
default via 192.168.1.1 dev eth0 proto dhcp src 192.168.1.20 metric 100
10.200.0.0/16 dev br0 proto kernel scope link src 10.200.0.1
10.202.3.0/24 dev veth1 scope link
broadcast 10.200.255.255 dev br0 table local proto kernel scope link src 10.200.0.1
local 10.203.0.7 dev lo table local proto kernel scope host src 10.203.0.7
local 127.0.0.0/8 dev lo table local proto kernel scope host src 127.0.0.1
192.168.1.0/24 dev eth0 proto kernel scope link src 192.168.1.20
";

    #[test]
    fn routes_are_read_without_the_default() {
        let routes = route_destinations(ROUTES);
        assert_eq!(routes.len(), 6);
        assert_eq!(routes[0], ("10.200.0.0".parse().unwrap(), 16));
        assert_eq!(routes[2], ("10.200.255.255".parse().unwrap(), 32));
        assert_eq!(routes[4], ("127.0.0.0".parse().unwrap(), 8));
    }

    #[test]
    fn blocks_avoid_every_route() {
        let routes = route_destinations(ROUTES);
        let blocks = free_blocks(&routes, 200, 206, 0, 3).unwrap();
        assert_eq!(
            blocks.iter().map(|b| b.second).collect::<Vec<_>>(),
            [201, 204, 205]
        );
        // The search starts where told and wraps around.
        let blocks = free_blocks(&routes, 200, 206, 6, 2).unwrap();
        assert_eq!(
            blocks.iter().map(|b| b.second).collect::<Vec<_>>(),
            [206, 201]
        );
        // A route over all of 10/8 leaves nothing.
        let all = [("10.0.0.0".parse().unwrap(), 8)];
        assert!(matches!(
            free_blocks(&all, 200, 254, 0, 1),
            Err(LocalNetError::NoFreeBlock { .. })
        ));
        assert!(free_blocks(&routes, 200, 202, 0, 2).is_err());
    }

    #[test]
    fn a_slots_record_reads_back_as_its_blocks() {
        let blocks = [Block { second: 216 }, Block { second: 254 }];
        assert_eq!(blocks_record(&blocks), "216 254");
        assert_eq!(parse_blocks_record("216 254"), blocks);
        assert_eq!(parse_blocks_record(""), []);
        assert_eq!(
            parse_blocks_record("216 x 300 -1\n217"),
            [Block { second: 216 }, Block { second: 217 }]
        );
    }

    #[test]
    fn a_block_names_its_addresses() {
        let block = Block { second: 231 };
        assert_eq!(block.cidr(), "10.231.0.0/16");
        assert_eq!(block.first_host().to_string(), "10.231.0.1");
    }

    #[test]
    fn only_gone_playgrounds_interfaces_are_stale() {
        let listing = "\
1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT
5: vnepg4242: <BROADCAST,NOARP,UP,LOWER_UP> mtu 1500 qdisc noqueue state UNKNOWN
6: vnepg77: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN
7: vnepgx1: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN
8: pgab0h@if3: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500
";
        let names = link_names(listing);
        assert_eq!(names, ["lo", "vnepg4242", "vnepg77", "vnepgx1", "pgab0h"]);
        let stale = stale_links(names.iter().map(String::as_str), |pid| pid == 4242);
        assert_eq!(stale, ["vnepg77"]);
        assert_eq!(link_name(4242), "vnepg4242");
    }
}
