//! Native sidecars (init containers with `restartPolicy: Always`) as ECI runs them: a regular
//! container of the group, ordered by ECI's documented start and exit priorities and declared
//! a sidecar, so that
//! - the sidecars start before the app containers, in the order the pod lists them (ECI
//!   starts higher `ECI_CONTAINER_LAUNCH_PRIORITY` first; an app container waits for a sidecar
//!   to be Ready when the sidecar has a readiness probe);
//! - they stop after the app containers, in reverse order (higher `ECI_CONTAINER_EXIT_PRIORITY`
//!   exits first; app containers keep ECI's default, 0);
//! - they do not hold a Job's completion (`ECI_CONTAINER_TYPE=sidecar`: ECI stops them once the
//!   app containers ended for good) and their exit code does not fail it
//!   (`ECI_CONTAINER_IGNORE_EXIT_CODE=true`).
//!
//! A regular init container listed after a sidecar is refused: the kubelet runs it while the
//! sidecar runs, ECI runs every init container before any container. What a pod sets itself
//! of these variables stays as it set it.

use eci_proto::v20180808::EnvironmentVar;
use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::{Rejection, reject};

/// ECI's start priority (-1000..1000, default 0): higher starts first.
pub const LAUNCH_PRIORITY: &str = "ECI_CONTAINER_LAUNCH_PRIORITY";
/// ECI's exit priority (-1000..1000, default 0): higher exits first.
pub const EXIT_PRIORITY: &str = "ECI_CONTAINER_EXIT_PRIORITY";
/// ECI's container type: `normal` (the default) or `sidecar`.
pub const CONTAINER_TYPE: &str = "ECI_CONTAINER_TYPE";
/// `true`: ECI reports the container as succeeded whatever its exit code.
pub const IGNORE_EXIT_CODE: &str = "ECI_CONTAINER_IGNORE_EXIT_CODE";

/// Whether an init container is a native sidecar.
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The pod's sidecars in order: their count, or a rejection when a regular init container
/// follows one.
pub(super) fn count(spec: &PodSpec) -> Result<usize, Rejection> {
    let mut sidecars = 0;
    for (index, init) in spec.init_containers.iter().flatten().enumerate() {
        if is_sidecar(init) {
            sidecars += 1;
        } else if sidecars > 0 {
            return Err(reject(
                &format!("spec.initContainers[{index}] ({})", init.name),
                "a regular init container after a sidecar (restartPolicy: Always) cannot run on ECI, which runs every init container before any sidecar or container; list the sidecars after the regular init containers",
            ));
        }
    }
    Ok(sidecars)
}

/// The variables that make the sidecar at `position` (from 0, in the pod's order) of `count`
/// one for ECI, less those the container's own environment `own` sets.
pub(super) fn variables(
    position: usize,
    count: usize,
    own: &[EnvironmentVar],
) -> Vec<EnvironmentVar> {
    // Both within ECI's -1000..1000, whatever the count: the API server takes any number of
    // init containers, ECI's ranges do not.
    let rank = i64::try_from(count.saturating_sub(position))
        .unwrap_or(i64::MAX)
        .min(1000);
    [
        (LAUNCH_PRIORITY, rank.to_string()),
        (EXIT_PRIORITY, (-rank).to_string()),
        (CONTAINER_TYPE, "sidecar".to_owned()),
        (IGNORE_EXIT_CODE, "true".to_owned()),
    ]
    .into_iter()
    .filter(|(key, _)| own.iter().all(|var| var.key != *key))
    .map(|(key, value)| EnvironmentVar {
        key: key.to_owned(),
        value,
        field_ref: None,
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn var(key: &str, value: &str) -> EnvironmentVar {
        EnvironmentVar {
            key: key.to_owned(),
            value: value.to_owned(),
            field_ref: None,
        }
    }

    #[test]
    fn sidecars_start_in_order_before_the_app_and_stop_in_reverse_after_it() {
        let of = |position, count| -> Vec<(String, String)> {
            variables(position, count, &[])
                .into_iter()
                .map(|v| (v.key, v.value))
                .collect()
        };
        let pairs = |items: [(&str, &str); 4]| -> Vec<(String, String)> {
            items
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        // Two sidecars: the first starts first and exits last; the app keeps 0 for both.
        assert_eq!(
            of(0, 2),
            pairs([
                (LAUNCH_PRIORITY, "2"),
                (EXIT_PRIORITY, "-2"),
                (CONTAINER_TYPE, "sidecar"),
                (IGNORE_EXIT_CODE, "true")
            ])
        );
        assert_eq!(
            of(1, 2),
            pairs([
                (LAUNCH_PRIORITY, "1"),
                (EXIT_PRIORITY, "-1"),
                (CONTAINER_TYPE, "sidecar"),
                (IGNORE_EXIT_CODE, "true")
            ])
        );
        // Within ECI's range however many there are.
        assert_eq!(of(0, 5000)[0].1, "1000");
        assert_eq!(of(0, 5000)[1].1, "-1000");
    }

    #[test]
    fn what_the_pod_sets_itself_stays() {
        let own = [var(LAUNCH_PRIORITY, "500"), var(IGNORE_EXIT_CODE, "false")];
        let keys: Vec<String> = variables(0, 1, &own).into_iter().map(|v| v.key).collect();
        assert_eq!(keys, [EXIT_PRIORITY, CONTAINER_TYPE]);
    }

    #[test]
    fn a_regular_init_container_after_a_sidecar_is_refused() {
        let spec = |inits: serde_json::Value| -> PodSpec {
            serde_json::from_value(
                json!({"containers": [{"name": "app"}], "initContainers": inits}),
            )
            .unwrap()
        };
        let ok = spec(
            json!([{"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"}, {"name": "logs", "restartPolicy": "Always"}]),
        );
        assert_eq!(count(&ok).unwrap(), 2);
        assert_eq!(count(&spec(json!([{"name": "setup"}]))).unwrap(), 0);
        let refused = count(&spec(
            json!([{"name": "proxy", "restartPolicy": "Always"}, {"name": "migrate"}]),
        ))
        .unwrap_err();
        assert_eq!(refused.field, "spec.initContainers[1] (migrate)");
        assert!(
            refused.reason.contains("after a sidecar"),
            "{}",
            refused.reason
        );
        assert!(!refused.retryable);
    }
}
