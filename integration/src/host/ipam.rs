//! Pod IPs: one loopback address per pod (127.N.0.2, 127.N.0.3, …, lowest free first, N the
//! agent's pod network), so each pod binds its own ports. Linux answers on all of 127.0.0.0/8
//! without configuration.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// The pool ran dry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IpamError {
    /// Every address of the pod network is in use.
    #[error("no free loopback pod address left ({in_use} in use)")]
    Exhausted {
        /// Addresses in use.
        in_use: usize,
    },
}

/// First and last host part handed out (127.0.0.2 … 127.0.255.254, skipping .0 and .255 of each
/// /24 so no address looks like a network or broadcast one).
const FIRST: u32 = 2;
const LAST: u32 = 0xFF_FE;

/// The allocator.
#[derive(Debug, Default)]
pub(crate) struct IpPool {
    /// The second octet: addresses are 127.<network>.x.y.
    network: u8,
    in_use: BTreeSet<u32>,
}

impl IpPool {
    /// A pool of 127.<network>.0.2 – 127.<network>.255.254.
    pub(crate) fn new(network: u8) -> Self {
        Self {
            network,
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
        Ipv4Addr::from(0x7F00_0000 | (u32::from(self.network) << 16) | host)
    }

    fn host_part(&self, ip: Ipv4Addr) -> Option<u32> {
        let bits = u32::from(ip);
        let host = bits & 0x0000_FFFF;
        let network = (bits >> 16) & 0xFF;
        (bits >> 24 == 0x7F
            && network == u32::from(self.network)
            && (FIRST..=LAST).contains(&host)
            && usable(host))
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
        let mut pool = IpPool::new(42);
        assert_eq!(pool.allocate().unwrap().to_string(), "127.42.0.2");
        assert!(
            !pool.reserve("127.0.0.9".parse().unwrap()),
            "another network"
        );
        assert!(pool.reserve("127.42.0.9".parse().unwrap()));
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
