//! Pod IPs: one address per pod from the agent's /16 pod network (A.B.0.2, A.B.0.3, …, lowest
//! free first), so each pod binds its own ports. By default the network is a block of loopback
//! (127.N.0.0/16: Linux answers on all of 127.0.0.0/8 without configuration); the playground's
//! real-runtime mode gives it a private block it routes locally (see `crate::local_net`), since
//! the apiserver refuses loopback addresses for the nodes it proxies to and in EndpointSlices.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// The pool ran dry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IpamError {
    /// Every address of the pod network is in use.
    #[error("no free pod address left ({in_use} in use)")]
    Exhausted {
        /// Addresses in use.
        in_use: usize,
    },
}

/// First and last host part handed out (A.B.0.2 … A.B.255.254, skipping .0 and .255 of each
/// /24 so no address looks like a network or broadcast one; A.B.0.1 is left to the network's
/// owner, e.g. the playground's mock-eci).
const FIRST: u32 = 2;
const LAST: u32 = 0xFF_FE;

/// The allocator.
#[derive(Debug)]
pub(crate) struct IpPool {
    /// The network's first two octets, as the top 16 bits: addresses are A.B.x.y.
    network: u32,
    in_use: BTreeSet<u32>,
}

impl Default for IpPool {
    /// 127.0.0.0/16.
    fn default() -> Self {
        Self::new(Ipv4Addr::new(127, 0, 0, 0))
    }
}

impl IpPool {
    /// A pool of A.B.0.2 – A.B.255.254, A.B the first two octets of `network`.
    pub(crate) fn new(network: Ipv4Addr) -> Self {
        Self {
            network: u32::from(network) & 0xFFFF_0000,
            in_use: BTreeSet::new(),
        }
    }

    /// The lowest free address.
    pub(crate) fn allocate(&mut self) -> Result<Ipv4Addr, IpamError> {
        let free = (FIRST..=LAST)
            .filter(|host| usable(*host))
            .find(|host| !self.in_use.contains(host))
            .ok_or(IpamError::Exhausted {
                in_use: self.in_use.len(),
            })?;
        self.in_use.insert(free);
        Ok(self.address(free))
    }

    /// Takes `ip` (a pod's address from before a restart of the agent) when it belongs to the
    /// pool and is free.
    pub(crate) fn reserve(&mut self, ip: Ipv4Addr) -> bool {
        let Some(host) = self.host_part(ip) else {
            return false;
        };
        self.in_use.insert(host)
    }

    /// Gives `ip` back.
    pub(crate) fn release(&mut self, ip: Ipv4Addr) {
        if let Some(host) = self.host_part(ip) {
            self.in_use.remove(&host);
        }
    }

    fn address(&self, host: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.network | host)
    }

    fn host_part(&self, ip: Ipv4Addr) -> Option<u32> {
        let bits = u32::from(ip);
        let host = bits & 0x0000_FFFF;
        (bits & 0xFFFF_0000 == self.network && (FIRST..=LAST).contains(&host) && usable(host))
            .then_some(host)
    }
}

fn usable(host: u32) -> bool {
    let last_octet = host & 0xFF;
    last_octet != 0 && last_octet != 0xFF
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_free_first_and_reuse() {
        let mut pool = IpPool::default();
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        let c = pool.allocate().unwrap();
        assert_eq!(
            [a, b, c].map(|ip| ip.to_string()),
            ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        );
        pool.release(b);
        assert_eq!(pool.allocate().unwrap(), b);
        assert_eq!(pool.allocate().unwrap().to_string(), "127.0.0.5");
    }

    #[test]
    fn skips_network_and_broadcast_looking_addresses() {
        let mut pool = IpPool::default();
        let all: Vec<Ipv4Addr> = (0..260).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(all[252].to_string(), "127.0.0.254");
        assert_eq!(all[253].to_string(), "127.0.1.1");
        assert!(
            all.iter()
                .all(|ip| ip.octets()[3] != 0 && ip.octets()[3] != 255)
        );
    }

    #[test]
    fn reserve_only_free_pool_addresses() {
        let cases = [
            ("127.0.0.9", true),
            ("127.0.0.9", false),
            ("127.0.0.1", false),
            ("127.0.1.0", false),
            ("127.100.0.1", false),
            ("10.0.0.2", false),
        ];
        let mut pool = IpPool::default();
        for (ip, want) in cases {
            assert_eq!(pool.reserve(ip.parse().unwrap()), want, "{ip}");
        }
        assert_eq!(pool.allocate().unwrap().to_string(), "127.0.0.2");
    }

    #[test]
    fn a_pod_network_of_its_own() {
        let mut pool = IpPool::new(Ipv4Addr::new(127, 42, 0, 0));
        assert_eq!(pool.allocate().unwrap().to_string(), "127.42.0.2");
        assert!(
            !pool.reserve("127.0.0.9".parse().unwrap()),
            "another network"
        );
        assert!(pool.reserve("127.42.0.9".parse().unwrap()));
    }

    #[test]
    fn a_private_pod_network() {
        // Only the first two octets count: what a caller passes below them is ignored.
        let mut pool = IpPool::new(Ipv4Addr::new(10, 231, 7, 9));
        assert_eq!(pool.allocate().unwrap().to_string(), "10.231.0.2");
        let cases = [
            ("10.231.0.9", true),
            ("10.231.0.1", false),
            ("10.232.0.9", false),
            ("127.231.0.9", false),
        ];
        for (ip, want) in cases {
            assert_eq!(pool.reserve(ip.parse().unwrap()), want, "{ip}");
        }
    }

    #[test]
    fn exhaustion_is_an_error() {
        let mut pool = IpPool::default();
        let capacity = (FIRST..=LAST).filter(|h| usable(*h)).count();
        for host in (FIRST..=LAST).filter(|h| usable(*h)) {
            assert!(pool.reserve(IpPool::default().address(host)));
        }
        assert_eq!(
            pool.allocate(),
            Err(IpamError::Exhausted { in_use: capacity })
        );
    }
}
