//! Where a new group lands: which of the vSwitches a create lists (up to 10, comma-separated
//! in `VSwitchId`), in which zone, given the zones that have stock. Pure: the engine passes the
//! zone map and stock in force.
//!
//! The service documents that it spreads creates over the listed vSwitches at random
//! (`ScheduleStrategy=VSwitchRandom`, the default) or tries them in the order given
//! (`VSwitchOrdered`), and moves on to the next zone when one has no stock. When none has,
//! the create is refused with `OperationDenied.NoStock` (see [`NO_STOCK`]).

use std::collections::{BTreeMap, BTreeSet};

use eci_proto::EciError;
use eci_proto::error::codes;
use serde::{Deserialize, Serialize};

use crate::engine::validate;
use crate::rng;

/// The code a create is refused with when no listed zone has stock (where the name comes
/// from: [`codes::NO_STOCK`]). The asynchronous counterpart, a group ending `ScheduleFailed`
/// with a `NoStock` event, is the global `no_stock` switch.
pub const NO_STOCK: &str = codes::NO_STOCK;

/// How the listed vSwitches are tried (`ScheduleStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `VSwitchOrdered`: in the order listed.
    Ordered,
    /// `VSwitchRandom` (or unset): in an order drawn per request.
    Random,
}

impl Strategy {
    /// From the `ScheduleStrategy` parameter.
    pub fn parse(value: &str) -> Result<Self, EciError> {
        match value {
            "VSwitchOrdered" => Ok(Self::Ordered),
            "" | "VSwitchRandom" => Ok(Self::Random),
            other => Err(validate::invalid(
                "ScheduleStrategy",
                format!("{other:?}; use VSwitchOrdered or VSwitchRandom"),
            )),
        }
    }
}

/// Where a group landed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The vSwitch chosen among those listed.
    pub vswitch: String,
    /// Its zone.
    pub zone: String,
}

/// The zone map and stock a placement is decided against.
#[derive(Debug, Clone, Copy)]
pub struct Zones<'a> {
    /// vSwitch id → zone; a vSwitch not in it is in `fallback`.
    pub of_vswitch: &'a BTreeMap<String, String>,
    /// Zone of unmapped vSwitches (the request's `ZoneId`, else the service's default zone).
    pub fallback: &'a str,
    /// Zones without stock.
    pub no_stock: &'a BTreeSet<String>,
}

impl Zones<'_> {
    fn zone_of(&self, vswitch: &str) -> String {
        self.of_vswitch
            .get(vswitch)
            .cloned()
            .unwrap_or_else(|| self.fallback.to_owned())
    }
}

/// The vSwitch a create lands on: the first, in the strategy's order, whose zone has stock.
/// `draw` orders a `Random` placement (the engine derives it from the seed and the request).
pub fn place(
    vswitches: &str,
    strategy: Strategy,
    draw: u64,
    zones: Zones<'_>,
) -> Result<Placement, EciError> {
    let mut listed: Vec<&str> = vswitches.split(',').map(str::trim).collect();
    if strategy == Strategy::Random {
        let mut stream = rng::SplitMix::new(draw);
        // Fisher–Yates with the request's own stream: any order, the same on a rerun.
        for last in (1..listed.len()).rev() {
            let pick = usize::try_from(stream.next_u64() % (last as u64 + 1)).unwrap_or(0);
            listed.swap(last, pick);
        }
    }
    let mut tried = Vec::new();
    for vswitch in listed {
        let zone = zones.zone_of(vswitch);
        if !zones.no_stock.contains(&zone) {
            return Ok(Placement {
                vswitch: vswitch.to_owned(),
                zone,
            });
        }
        if !tried.contains(&zone) {
            tried.push(zone);
        }
    }
    Err(EciError::new(
        NO_STOCK,
        format!(
            "Create ECI failed because the specified instance is out of stock in every zone of the given vSwitches ({}); add vSwitches in other zones or other instance specifications.",
            tried.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> BTreeMap<String, String> {
        [
            ("vsw-a", "zone-a"),
            ("vsw-b", "zone-b"),
            ("vsw-c", "zone-c"),
        ]
        .into_iter()
        .map(|(v, z)| (v.to_owned(), z.to_owned()))
        .collect()
    }

    fn out(zones: &[&str]) -> BTreeSet<String> {
        zones.iter().map(|z| (*z).to_owned()).collect()
    }

    #[test]
    fn ordered_placement_takes_the_first_listed_zone_with_stock() {
        let map = map();
        // (listed, zones without stock, landed on: vSwitch and zone; `None`: refused)
        type Case<'a> = (&'a str, &'a [&'a str], Option<(&'a str, &'a str)>);
        let cases: [Case<'_>; 7] = [
            ("vsw-a,vsw-b,vsw-c", &[], Some(("vsw-a", "zone-a"))),
            ("vsw-a,vsw-b,vsw-c", &["zone-a"], Some(("vsw-b", "zone-b"))),
            (
                "vsw-a,vsw-b,vsw-c",
                &["zone-a", "zone-b"],
                Some(("vsw-c", "zone-c")),
            ),
            ("vsw-c,vsw-b,vsw-a", &["zone-a"], Some(("vsw-c", "zone-c"))),
            ("vsw-a,vsw-b,vsw-c", &["zone-a", "zone-b", "zone-c"], None),
            // Unmapped vSwitches are in the fallback zone.
            ("vsw-x", &[], Some(("vsw-x", "zone-k"))),
            ("vsw-x,vsw-c", &["zone-k"], Some(("vsw-c", "zone-c"))),
        ];
        for (listed, no_stock, expected) in cases {
            let no_stock = out(no_stock);
            let zones = Zones {
                of_vswitch: &map,
                fallback: "zone-k",
                no_stock: &no_stock,
            };
            let got = place(listed, Strategy::Ordered, 7, zones);
            match expected {
                Some((vswitch, zone)) => {
                    let placed = got.unwrap_or_else(|e| panic!("{listed} {no_stock:?}: {e}"));
                    assert_eq!(
                        (placed.vswitch.as_str(), placed.zone.as_str()),
                        (vswitch, zone),
                        "{listed} {no_stock:?}"
                    );
                }
                None => {
                    let error = got.expect_err(listed);
                    assert_eq!(error.code, NO_STOCK);
                    for zone in ["zone-a", "zone-b", "zone-c"] {
                        assert!(error.message.contains(zone), "{}", error.message);
                    }
                }
            }
        }
    }

    #[test]
    fn random_placement_spreads_over_the_zones_with_stock_only() {
        let map = map();
        let no_stock = out(&["zone-b"]);
        let zones = Zones {
            of_vswitch: &map,
            fallback: "zone-k",
            no_stock: &no_stock,
        };
        let landed: BTreeSet<String> = (0..64)
            .map(|draw| {
                place("vsw-a,vsw-b,vsw-c", Strategy::Random, draw, zones)
                    .expect("stock in a and c")
                    .zone
            })
            .collect();
        assert_eq!(landed, out(&["zone-a", "zone-c"]), "both, never b");
        // The same draw, the same answer.
        assert_eq!(
            place("vsw-a,vsw-b,vsw-c", Strategy::Random, 5, zones).ok(),
            place("vsw-a,vsw-b,vsw-c", Strategy::Random, 5, zones).ok()
        );
    }

    #[test]
    fn strategies_parse_as_the_service_names_them() {
        assert_eq!(
            Strategy::parse("VSwitchOrdered").ok(),
            Some(Strategy::Ordered)
        );
        assert_eq!(
            Strategy::parse("VSwitchRandom").ok(),
            Some(Strategy::Random)
        );
        assert_eq!(Strategy::parse("").ok(), Some(Strategy::Random));
        let error = Strategy::parse("vswitchordered").expect_err("case matters");
        assert!(
            error.message.contains("VSwitchOrdered"),
            "{}",
            error.message
        );
    }
}
