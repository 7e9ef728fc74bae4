//! How a container behaves in mock-eci, chosen by reserved environment variables and images.
//!
//! Tests steer containers deterministically through the container spec itself, so the same pod
//! spec drives both the provider and the mock:
//!
//! | variable | effect |
//! | --- | --- |
//! | `MOCK_ECI_EXIT_CODE=<n>` | the container exits with code `n` (default 0 when only `MOCK_ECI_EXIT_AFTER` is set) |
//! | `MOCK_ECI_EXIT_AFTER=<duration>` | ... this long after it started (default `0s` when only the code is set) |
//! | `MOCK_ECI_EXIT_RUNS=<n>` | only the first `n` runs exit; later restarts keep running |
//! | `MOCK_ECI_EXIT_REASON=<text>` | the terminated reason (default `Completed` for 0, `OOMKilled` for 137, `Error` otherwise) |
//! | `MOCK_ECI_PULL_FAIL=true` | the image pull fails: `ErrImagePull`, then `ImagePullBackOff` |
//! | `MOCK_ECI_READINESS=fail` | the container runs but never becomes ready |
//! | `MOCK_ECI_READY_AFTER=<duration>` | ready this long after start (default: the readiness probe's `initial_delay_seconds`, or at once without a probe) |
//! | `MOCK_ECI_STOP_AFTER=<duration>` | on deletion the container exits this long after SIGTERM (default: `--stop-after-sigterm`, else it uses the whole grace period) |
//! | `MOCK_ECI_LOG_INTERVAL=<duration>` | one synthetic log line per interval (default `1s`) |
//!
//! An image whose registry host is `pull-fail.mock-eci.invalid` (for example
//! `pull-fail.mock-eci.invalid/app:1`) fails its pull too, without any variable.
//! Durations use humantime syntax (`500ms`, `5s`, `2m`). A malformed value is rejected at
//! creation with `InvalidParameter.EnvironmentVar`, so a typo never silently changes a test.

use eci_proto::v20180808::{Container, Probe};
use serde::{Deserialize, Serialize};

use crate::clock::{Millis, millis};

/// Reserved variable: exit code.
pub const EXIT_CODE: &str = "MOCK_ECI_EXIT_CODE";
/// Reserved variable: time from start to exit.
pub const EXIT_AFTER: &str = "MOCK_ECI_EXIT_AFTER";
/// Reserved variable: how many runs exit.
pub const EXIT_RUNS: &str = "MOCK_ECI_EXIT_RUNS";
/// Reserved variable: terminated reason.
pub const EXIT_REASON: &str = "MOCK_ECI_EXIT_REASON";
/// Reserved variable: image pull fails.
pub const PULL_FAIL: &str = "MOCK_ECI_PULL_FAIL";
/// Reserved variable: readiness never succeeds (`fail`).
pub const READINESS: &str = "MOCK_ECI_READINESS";
/// Reserved variable: time from start to ready.
pub const READY_AFTER: &str = "MOCK_ECI_READY_AFTER";
/// Reserved variable: time from SIGTERM to exit.
pub const STOP_AFTER: &str = "MOCK_ECI_STOP_AFTER";
/// Reserved variable: time between synthetic log lines.
pub const LOG_INTERVAL: &str = "MOCK_ECI_LOG_INTERVAL";
/// Registry host whose images always fail to pull.
pub const PULL_FAIL_REGISTRY: &str = "pull-fail.mock-eci.invalid";

const DEFAULT_LOG_INTERVAL_MS: Millis = 1_000;

/// When a container exits on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedExit {
    /// The exit code.
    pub code: i32,
    /// Time from start to exit.
    pub after_ms: Millis,
    /// How many runs exit (`None`: all of them).
    pub runs: Option<u32>,
    /// The terminated reason.
    pub reason: String,
}

/// When a running container turns ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Readiness {
    /// This long after start.
    After(Millis),
    /// Never.
    Never,
}

/// Everything mock-eci simulates about one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Behaviour {
    /// A planned exit, if any.
    pub exit: Option<PlannedExit>,
    /// The image pull fails.
    pub pull_fails: bool,
    /// When it turns ready.
    pub readiness: Readiness,
    /// Time from SIGTERM to exit (`None`: the whole grace period).
    pub stop_after_ms: Option<Millis>,
    /// Time between log lines.
    pub log_interval_ms: Millis,
}

impl Behaviour {
    /// Whether run number `run` (0 for the first) exits, and how.
    pub fn exit_for_run(&self, run: u32) -> Option<&PlannedExit> {
        self.exit
            .as_ref()
            .filter(|exit| exit.runs.is_none_or(|runs| run < runs))
    }
}

/// A reserved variable with a value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {key}={value:?} of container {container:?} is not valid: {expected}")]
pub struct BehaviourError {
    /// The container.
    pub container: String,
    /// The variable.
    pub key: &'static str,
    /// Its value.
    pub value: String,
    /// What was expected instead.
    pub expected: &'static str,
}

/// Reads the behaviour of `container`. `default_exit_after` applies to init containers, which
/// finish by themselves unless told otherwise.
pub fn parse(
    container: &Container,
    default_exit_after: Option<Millis>,
) -> Result<Behaviour, BehaviourError> {
    let env = Env { container };
    let exit = planned_exit(env, default_exit_after)?;
    let pull_fails = env
        .parsed::<bool>(PULL_FAIL, "true or false")?
        .unwrap_or(false)
        || registry_host(&container.image) == PULL_FAIL_REGISTRY;
    let readiness = readiness(env)?;
    Ok(Behaviour {
        exit,
        pull_fails,
        readiness,
        stop_after_ms: env.duration(STOP_AFTER)?,
        log_interval_ms: env
            .duration(LOG_INTERVAL)?
            .filter(|interval| *interval > 0)
            .unwrap_or(DEFAULT_LOG_INTERVAL_MS),
    })
}

/// The reserved variables of one container.
#[derive(Debug, Clone, Copy)]
struct Env<'a> {
    container: &'a Container,
}

impl<'a> Env<'a> {
    /// The value of `key`; when it is given twice, the last one counts.
    fn get(self, key: &str) -> Option<&'a str> {
        self.container
            .environment_var
            .iter()
            .rev()
            .find(|var| var.key == key)
            .map(|var| var.value.as_str())
    }

    /// The error for `key` set to `value` where `expected` was wanted.
    fn fail(self, key: &'static str, value: &str, expected: &'static str) -> BehaviourError {
        BehaviourError {
            container: self.container.name.clone(),
            key,
            value: value.to_owned(),
            expected,
        }
    }

    /// The value of `key` parsed as a `T`, if set.
    fn parsed<T: std::str::FromStr>(
        self,
        key: &'static str,
        expected: &'static str,
    ) -> Result<Option<T>, BehaviourError> {
        self.get(key)
            .map(|value| {
                value
                    .trim()
                    .parse::<T>()
                    .map_err(|_| self.fail(key, value, expected))
            })
            .transpose()
    }

    /// The value of `key` as a humantime duration, if set.
    fn duration(self, key: &'static str) -> Result<Option<Millis>, BehaviourError> {
        self.get(key)
            .map(|value| {
                humantime::parse_duration(value.trim())
                    .map(millis)
                    .map_err(|_| self.fail(key, value, "a duration such as 500ms, 5s or 2m"))
            })
            .transpose()
    }
}

/// The exit the variables plan, if any; with `default_exit_after`, a container given none
/// still exits (with code 0).
fn planned_exit(
    env: Env<'_>,
    default_exit_after: Option<Millis>,
) -> Result<Option<PlannedExit>, BehaviourError> {
    let code = env.parsed::<i32>(EXIT_CODE, "an integer exit code")?;
    let after = env.duration(EXIT_AFTER)?;
    let runs = env.parsed::<u32>(EXIT_RUNS, "a non-negative number of runs")?;
    Ok(match (code, after.or(default_exit_after)) {
        (None, None) => None,
        (code, after) => {
            let code = code.unwrap_or(0);
            Some(PlannedExit {
                code,
                after_ms: after.unwrap_or(0),
                runs,
                reason: env
                    .get(EXIT_REASON)
                    .map_or_else(|| default_reason(code).to_owned(), str::to_owned),
            })
        }
    })
}

/// When the container turns ready: never with `fail`, else after `MOCK_ECI_READY_AFTER` or
/// the readiness probe's initial delay.
fn readiness(env: Env<'_>) -> Result<Readiness, BehaviourError> {
    Ok(match env.get(READINESS).map(str::trim) {
        Some("fail") => Readiness::Never,
        Some(other) if !other.is_empty() => return Err(env.fail(READINESS, other, "fail")),
        _ => Readiness::After(
            env.duration(READY_AFTER)?
                .unwrap_or_else(|| probe_delay(env.container.readiness_probe.as_ref())),
        ),
    })
}

/// The reason a terminated container shows for an exit code.
pub fn default_reason(code: i32) -> &'static str {
    match code {
        0 => "Completed",
        137 => "OOMKilled",
        _ => "Error",
    }
}

fn probe_delay(probe: Option<&Probe>) -> Millis {
    probe.map_or(0, |probe| {
        Millis::from(probe.initial_delay_seconds.max(0)) * 1_000
    })
}

/// The registry host of an image reference (`docker.io` when none is given).
fn registry_host(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first
        }
        _ => "docker.io",
    }
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::EnvironmentVar;

    use super::*;

    fn mk_container(image: &str, env: &[(&str, &str)]) -> Container {
        Container {
            name: "app".into(),
            image: image.into(),
            environment_var: env
                .iter()
                .map(|(key, value)| EnvironmentVar {
                    key: (*key).into(),
                    value: (*value).into(),
                    field_ref: None,
                })
                .collect(),
            ..Container::default()
        }
    }

    #[test]
    fn plain_container_runs_forever_and_is_ready_at_once() {
        let behaviour = parse(&mk_container("nginx", &[]), None).unwrap();
        assert_eq!(behaviour.exit, None);
        assert!(!behaviour.pull_fails);
        assert_eq!(behaviour.readiness, Readiness::After(0));
        assert_eq!(behaviour.log_interval_ms, 1_000);
    }

    #[test]
    fn exit_code_and_delay() {
        let behaviour = parse(
            &mk_container(
                "busybox",
                &[(EXIT_CODE, "3"), (EXIT_AFTER, "5s"), (EXIT_RUNS, "2")],
            ),
            None,
        )
        .unwrap();
        let exit = behaviour.exit.clone().unwrap();
        assert_eq!(
            (exit.code, exit.after_ms, exit.reason.as_str()),
            (3, 5_000, "Error")
        );
        assert!(behaviour.exit_for_run(1).is_some());
        assert!(behaviour.exit_for_run(2).is_none());
    }

    #[test]
    fn init_containers_finish_by_default() {
        let behaviour = parse(&mk_container("busybox", &[]), Some(1_000)).unwrap();
        let exit = behaviour.exit.unwrap();
        assert_eq!(
            (exit.code, exit.after_ms, exit.reason.as_str()),
            (0, 1_000, "Completed")
        );
    }

    #[test]
    fn pull_failure_by_variable_or_registry() {
        assert!(
            parse(&mk_container("nginx", &[(PULL_FAIL, "true")]), None)
                .unwrap()
                .pull_fails
        );
        assert!(
            parse(&mk_container("pull-fail.mock-eci.invalid/app:1", &[]), None)
                .unwrap()
                .pull_fails
        );
        assert!(
            !parse(&mk_container("registry.example.com/app:1", &[]), None)
                .unwrap()
                .pull_fails
        );
    }

    #[test]
    fn readiness_from_probe_or_variable() {
        let mut container = mk_container("nginx", &[]);
        container.readiness_probe = Some(Probe {
            initial_delay_seconds: 4,
            ..Probe::default()
        });
        assert_eq!(
            parse(&container, None).unwrap().readiness,
            Readiness::After(4_000)
        );
        let never = parse(&mk_container("nginx", &[(READINESS, "fail")]), None).unwrap();
        assert_eq!(never.readiness, Readiness::Never);
        let later = parse(&mk_container("nginx", &[(READY_AFTER, "2s")]), None).unwrap();
        assert_eq!(later.readiness, Readiness::After(2_000));
    }

    #[test]
    fn malformed_values_are_rejected_with_the_variable_named() {
        let error = parse(&mk_container("nginx", &[(EXIT_AFTER, "soon")]), None).unwrap_err();
        assert_eq!(error.key, EXIT_AFTER);
        assert!(
            error.to_string().contains("MOCK_ECI_EXIT_AFTER=\"soon\""),
            "{error}"
        );
        assert!(parse(&mk_container("nginx", &[(EXIT_CODE, "x")]), None).is_err());
        assert!(parse(&mk_container("nginx", &[(READINESS, "maybe")]), None).is_err());
    }
}
