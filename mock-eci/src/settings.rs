//! Engine settings: timing, capacity and region, resolved from the command line.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::{Millis, millis};
use crate::rng;

/// A provisioning delay: fixed (`3s`) or a range (`2s..8s`) from which each group gets its own
/// value, derived from its id and the seed so a rerun gives the same delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelayRange {
    /// Shortest delay.
    pub min_ms: Millis,
    /// Longest delay.
    pub max_ms: Millis,
}

impl DelayRange {
    /// The same delay for every group.
    pub fn fixed(delay: Duration) -> Self {
        Self {
            min_ms: millis(delay),
            max_ms: millis(delay),
        }
    }

    /// The delay of the group `id`.
    pub fn pick(&self, id: &str, seed: u64) -> Millis {
        let span = u64::try_from(self.max_ms - self.min_ms).unwrap_or(0);
        if span == 0 {
            return self.min_ms;
        }
        let draw = rng::stable_hash(id.as_bytes()) ^ rng::mix(seed);
        self.min_ms + Millis::try_from(draw % (span + 1)).unwrap_or(0)
    }
}

impl FromStr for DelayRange {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parse = |part: &str| {
            humantime::parse_duration(part.trim())
                .map(millis)
                .map_err(|error| {
                    format!("{part:?} is not a duration ({error}); write e.g. 3s or 2s..8s")
                })
        };
        let (min_ms, max_ms) = match text.split_once("..") {
            Some((low, high)) => (parse(low)?, parse(high)?),
            None => {
                let value = parse(text)?;
                (value, value)
            }
        };
        if min_ms > max_ms {
            return Err(format!(
                "{text:?}: the range's lower end is above its upper end"
            ));
        }
        Ok(Self { min_ms, max_ms })
    }
}

impl fmt::Display for DelayRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min_ms == self.max_ms {
            write!(f, "{}ms", self.min_ms)
        } else {
            write!(f, "{}ms..{}ms", self.min_ms, self.max_ms)
        }
    }
}

/// An IPv4 block in CIDR notation, e.g. `192.168.0.0/16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cidr {
    /// Network address.
    pub network: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// Usable host addresses: all but the network address, the gateway (`.1`) and broadcast.
    pub fn host_count(&self) -> u32 {
        let size = 1u64 << (32 - u32::from(self.prefix));
        u32::try_from(size.saturating_sub(3)).unwrap_or(u32::MAX)
    }

    /// The `offset`-th usable address.
    pub fn host(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network).wrapping_add(2).wrapping_add(offset))
    }

    /// The offset of `ip`, when it is a usable address of this block.
    pub fn offset_of(&self, ip: Ipv4Addr) -> Option<u32> {
        let offset = u32::from(ip)
            .checked_sub(u32::from(self.network))?
            .checked_sub(2)?;
        (offset < self.host_count()).then_some(offset)
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (address, prefix) = text.split_once('/').ok_or_else(|| {
            format!("{text:?} is not in CIDR notation; write e.g. 192.168.0.0/16")
        })?;
        let address: Ipv4Addr = address
            .parse()
            .map_err(|_| format!("{address:?} is not an IPv4 address"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|prefix| (8..=29).contains(prefix))
            .ok_or_else(|| format!("prefix /{prefix} must be between /8 and /29"))?;
        let mask = u32::MAX << (32 - u32::from(prefix));
        Ok(Self {
            network: Ipv4Addr::from(u32::from(address) & mask),
            prefix,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// Everything the engine needs to know about how to simulate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// The region served (`RegionId` must match).
    pub region: String,
    /// The zone groups land in unless they name one.
    pub zone: String,
    /// Creation → Running.
    pub provisioning: DelayRange,
    /// Creation → Running for a group created from a Ready image cache (no pull); the shorter
    /// of this and [`Settings::provisioning`] applies.
    #[serde(default = "default_cached_provisioning")]
    pub cached_provisioning: DelayRange,
    /// CreateImageCache (or an update with new images) → Ready or Failed.
    #[serde(default = "default_image_cache_creation")]
    pub image_cache_creation: DelayRange,
    /// Creation → Scheduling.
    pub scheduling_delay_ms: Millis,
    /// How long an init container runs when its spec says nothing.
    pub init_duration_ms: Millis,
    /// First restart back-off; doubles per restart.
    pub restart_backoff_ms: Millis,
    /// Longest restart back-off.
    pub max_restart_backoff_ms: Millis,
    /// Longest termination grace period honoured.
    pub max_grace_ms: Millis,
    /// How long a container without `MOCK_ECI_STOP_AFTER` takes to exit after SIGTERM; `None`:
    /// the whole grace period.
    pub stop_after_ms: Option<Millis>,
    /// How long finished groups stay visible.
    pub retention_ms: Millis,
    /// Where intranet IPs come from.
    pub ip_cidr: Cidr,
    /// Most groups holding capacity at once (`None`: no cap).
    pub max_groups: Option<usize>,
    /// Every new group fails to schedule for lack of stock.
    pub no_stock: bool,
    /// The zone of each vSwitch a create may list; one not listed is in the request's `ZoneId`
    /// or, without one, in [`Settings::zone`].
    #[serde(default)]
    pub vswitch_zones: BTreeMap<String, String>,
    /// Zones without stock: a create lands in another listed zone, or is refused.
    #[serde(default)]
    pub no_stock_zones: BTreeSet<String>,
    /// Seed for ids and delays.
    pub seed: u64,
    /// Containers run for real (`--runtime real`): the engine asks for runs and learns what
    /// happened from the runtime driver's observations instead of its own timers.
    #[serde(default)]
    pub real_runtime: bool,
}

impl Settings {
    /// The same settings with addresses from `network` when it is given.
    #[must_use]
    pub fn with_real_network(mut self, network: Option<Cidr>) -> Self {
        if let Some(network) = network {
            self.ip_cidr = network;
        }
        self
    }

    /// The back-off before restart number `restarts + 1`.
    pub fn restart_backoff(&self, restarts: u32) -> Millis {
        let factor = 1i64 << restarts.min(20);
        self.restart_backoff_ms
            .saturating_mul(factor)
            .min(self.max_restart_backoff_ms)
    }
}

fn default_cached_provisioning() -> DelayRange {
    DelayRange {
        min_ms: 1_000,
        max_ms: 1_000,
    }
}

fn default_image_cache_creation() -> DelayRange {
    DelayRange {
        min_ms: 10_000,
        max_ms: 20_000,
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            region: "cn-hangzhou".into(),
            zone: "cn-hangzhou-k".into(),
            provisioning: DelayRange {
                min_ms: 2_000,
                max_ms: 4_000,
            },
            cached_provisioning: default_cached_provisioning(),
            image_cache_creation: default_image_cache_creation(),
            scheduling_delay_ms: 200,
            init_duration_ms: 1_000,
            restart_backoff_ms: 10_000,
            max_restart_backoff_ms: 300_000,
            max_grace_ms: 300_000,
            stop_after_ms: None,
            retention_ms: 3_600_000,
            ip_cidr: Cidr {
                network: Ipv4Addr::new(192, 168, 0, 0),
                prefix: 16,
            },
            max_groups: None,
            no_stock: false,
            vswitch_zones: BTreeMap::new(),
            no_stock_zones: BTreeSet::new(),
            seed: 0,
            real_runtime: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_ranges_parse_and_pick_within_bounds() {
        let fixed: DelayRange = "3s".parse().unwrap();
        assert_eq!(fixed.pick("eci-a", 1), 3_000);
        let range: DelayRange = "2s..8s".parse().unwrap();
        for id in ["eci-a", "eci-b", "eci-c", "eci-d"] {
            let delay = range.pick(id, 7);
            assert!((2_000..=8_000).contains(&delay), "{delay}");
            assert_eq!(delay, range.pick(id, 7));
        }
        assert!("8s..2s".parse::<DelayRange>().is_err());
        assert!("soon".parse::<DelayRange>().is_err());
    }

    #[test]
    fn cidr_hosts() {
        let cidr: Cidr = "10.0.0.7/29".parse().unwrap();
        assert_eq!(cidr.to_string(), "10.0.0.0/29");
        assert_eq!(cidr.host_count(), 5);
        assert_eq!(cidr.host(0), Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(cidr.offset_of(Ipv4Addr::new(10, 0, 0, 6)), Some(4));
        assert_eq!(cidr.offset_of(Ipv4Addr::new(10, 0, 0, 7)), None);
        assert!("10.0.0.0".parse::<Cidr>().is_err());
        assert!("10.0.0.0/31".parse::<Cidr>().is_err());
    }

    #[test]
    fn restart_backoff_doubles_and_caps() {
        let settings = Settings::default();
        assert_eq!(settings.restart_backoff(0), 10_000);
        assert_eq!(settings.restart_backoff(1), 20_000);
        assert_eq!(settings.restart_backoff(10), 300_000);
    }
}
