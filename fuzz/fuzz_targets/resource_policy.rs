//! ResourcePolicy placement on arbitrary policies and unit views: a spec as a user may write it
//! (decoded as the webhook decodes it, then `policy::validate`), and the choice of a unit for a
//! pod (`decide::choose`) given a view per unit, the pod's requests and how long it waited,
//! explained as Events say it (`explain`), with the scale-in costs and the node terms the
//! placement writes. No input panics; the choice names a unit of the policy, after every unit
//! it passed over.
//!
//! ```json
//! {"spec": {"units": [{"resource": "ecs", "max": 2}, {"resource": "eci"}]},
//!  "views": [{"pods": 2, "used": {"cpu": "2"}, "terminating": 0, "hasRoom": true}],
//!  "requests": {"cpu": "500m"}, "waitedSeconds": 30, "labels": {"app": "web"}}
//! ```

#![no_main]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::NodeSelectorTerm;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vne_core::placement::decide::{self, Destination, PodFacts, UnitView, VirtualNodes};
use vne_core::placement::policy::{self, ResourcePolicySpec};
use vne_core::quantity::Quantity;
use vne_core::requests::Requests;

fn requests(value: &Value) -> Requests {
    value
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, q)| Some((name.clone(), Quantity::parse(q.as_str()?).ok()?)))
        .collect()
}

fn view(value: &Value) -> UnitView {
    let count = |key: &str| {
        value[key]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
    };
    UnitView {
        pods: count("pods"),
        used: requests(&value["used"]),
        terminating: count("terminating"),
        has_room: value["hasRoom"].as_bool().unwrap_or(false),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    // The webhook reads `spec` out of the object; a bare spec is accepted too.
    let spec_value = input.get("spec").cloned().unwrap_or_else(|| input.clone());
    let Ok(spec) = serde_json::from_value::<ResourcePolicySpec>(spec_value) else {
        return;
    };
    for problem in policy::validate(&spec) {
        assert!(problem.field.starts_with("spec."), "{problem}");
    }
    let _ = spec.timeout();
    let views: Vec<UnitView> = input["views"]
        .as_array()
        .into_iter()
        .flatten()
        .map(view)
        .chain(std::iter::repeat_with(UnitView::default))
        .take(spec.units.len())
        .collect();
    let asked = requests(&input["requests"]);
    let waited = input["waitedSeconds"]
        .as_f64()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or_default();
    let choice = decide::choose(&spec, &views, &asked, waited);
    let chosen = match &choice.destination {
        Destination::Place(unit) | Destination::Wait { unit, .. } => Some(*unit),
        Destination::Nowhere => None,
    };
    if let Some(unit) = chosen {
        assert!(unit < spec.units.len(), "{choice:?}");
    }
    let passed: Vec<usize> = choice.passed.iter().map(|(i, _)| *i).collect();
    let expected: Vec<usize> = (0..chosen.unwrap_or(spec.units.len())).collect();
    assert_eq!(passed, expected, "units are tried in order, none skipped");
    let _ = decide::explain(&spec, &choice);

    let labels: BTreeMap<String, String> =
        serde_json::from_value(input["labels"].clone()).unwrap_or_default();
    let vnodes = VirtualNodes::default();
    let _ = decide::selects(&spec, &labels);
    let _ = decide::group_of(&spec, &labels);
    let _ = decide::unit_of_node(&spec, &labels, &vnodes);
    let _ = decide::counts(
        &spec,
        &PodFacts {
            terminating: true,
            finished: false,
            predates_policy: true,
        },
    );
    let costs: Vec<i32> = (0..spec.units.len())
        .map(|i| decide::deletion_cost(i, spec.units.len()))
        .collect();
    assert!(
        costs.windows(2).all(|w| w[0] >= w[1]),
        "earlier units cost more to scale in: {costs:?}"
    );
    for (unit, view) in spec.units.iter().zip(&views) {
        let _ = decide::at_limit(unit, view, &asked);
        let _ = decide::carries_unit_marks(unit, &labels, &BTreeMap::new());
    }
    let units: Vec<_> = spec.units.iter().collect();
    let existing: Vec<NodeSelectorTerm> =
        serde_json::from_value(input["existingTerms"].clone()).unwrap_or_default();
    let terms = decide::pin_terms(&units, &vnodes, &existing);
    if !units.is_empty() {
        assert!(!terms.is_empty(), "pinning to units leaves a term");
    }
});
