//! `reliability`: the reliability report (issue 20, part 6) in one command.
//!
//! ```sh
//! cargo run -p integration --bin reliability --release -- --runs 3
//! ```
//!
//! Runs, one after the other (each on its own control plane, as the test binaries do):
//!
//! 1. the fault suite `--runs` times — `cargo test -p integration --test faults` with
//!    `RELIABILITY_OUT` naming a file where each case appends one JSON object (case,
//!    description, converge_seconds, pods_lost, groups_leaked, duplicates, stuck_terminating,
//!    passed, notes);
//! 2. the security checks — `cargo test -p integration --test security` with `SECURITY_OUT`
//!    (one object per check: check, status, summary, details);
//! 3. the hostile-tenant suite — `cargo test -p integration --test tenancy` with `TENANCY_OUT`
//!    (one object per attack: attack, status, summary, details);
//! 4. the load held — `cargo run -p integration --bin churn --release` for `--churn-duration`;
//!
//! then writes `docs/reliability.md` (`--out`) with the versions (Kubernetes, etcd, kwok from
//! `integration/upstream`, rustc), the machine, every case of every run, the security checks,
//! the attacks tried and their outcome, the churn's slopes and samples, and what all this does not show. The raw outputs (JSON lines,
//! each command's output) stay in `--work-dir`. A step that fails is reported as failed and the
//! next one still runs; the exit code is non-zero if anything failed.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line tool's output

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use integration::daemon_figures::{CELL_FIGURES, Layout, daemon_figures};
use serde_json::Value;

/// Run the fault suite, the security checks and the churn load; write docs/reliability.md.
#[derive(Debug, Parser)]
#[command(name = "reliability")]
struct Args {
    /// Runs of the fault suite.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// How long the churn load runs.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    churn_duration: Duration,
    /// Leave out the fault suite.
    #[arg(long)]
    skip_faults: bool,
    /// Leave out the security checks.
    #[arg(long)]
    skip_security: bool,
    /// Leave out the hostile-tenant suite.
    #[arg(long)]
    skip_tenancy: bool,
    /// Leave out the churn load.
    #[arg(long)]
    skip_churn: bool,
    /// The report (relative to the workspace root).
    #[arg(long, default_value = "docs/reliability.md")]
    out: PathBuf,
    /// Where the raw outputs go (default: `<target>/reliability`).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

/// `--churn-duration`'s default (the header names the flag only when it differs).
const DEFAULT_CHURN: Duration = Duration::from_secs(600);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn say(line: &str) {
    eprintln!("[reliability] {line}");
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            say("something failed; see the report");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("reliability: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// One command's outcome.
#[derive(Debug)]
struct Step {
    ok: bool,
    status: String,
    seconds: f64,
    log: PathBuf,
}

impl Step {
    /// How the report names its end: `passed`, or `FAILED: <status>`.
    fn outcome(&self) -> String {
        if self.ok {
            "passed".to_owned()
        } else {
            format!("FAILED: {}", self.status)
        }
    }
}

/// Runs `cargo args…` in the workspace with `envs`, its output into `log` (and a line per
/// minute on stderr so a long run shows it is alive).
fn cargo(args: &[&str], envs: &[(&str, &Path)], log: &Path) -> anyhow::Result<Step> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let file = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    let started = Instant::now();
    say(&format!(
        "cargo {} (output in {})",
        args.join(" "),
        log.display()
    ));
    let mut child = std::process::Command::new(cargo)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_os_str())))
        // A failure's message, not a backtrace, is what the report quotes.
        .env("RUST_BACKTRACE", "0")
        .current_dir(workspace())
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .context("start cargo")?;
    let mut last_note = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if last_note.elapsed() >= Duration::from_secs(60) {
            say(&format!("  … {:.0} s", started.elapsed().as_secs_f64()));
            last_note = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let seconds = started.elapsed().as_secs_f64();
    say(&format!("  {status} after {seconds:.0} s"));
    Ok(Step {
        ok: status.success(),
        status: status.to_string(),
        seconds,
        log: log.to_owned(),
    })
}

fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// What a failed test run said: each panic's message (up to the next blank line or note), else
/// the last lines.
fn failure(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.contains("panicked at") {
            out.push(line.to_owned());
            for next in lines.by_ref() {
                if next.trim().is_empty() || next.starts_with("note:") || out.len() > 60 {
                    break;
                }
                out.push(next.chars().take(400).collect());
            }
        }
    }
    if out.is_empty() {
        tail(path, 40)
    } else {
        out.join("\n")
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn run(args: &Args) -> anyhow::Result<bool> {
    let root = workspace();
    let work = args.work_dir.clone().unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root.join("target"), PathBuf::from)
            .join("reliability")
    });
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    let started = Instant::now();
    let mut all_ok = true;

    let mut fault_runs: Vec<(Step, Vec<Value>)> = Vec::new();
    let faults_exist = root.join("integration/tests/faults.rs").exists();
    if !args.skip_faults && faults_exist {
        for run in 1..=args.runs {
            let (step, records) = fault_run(run, args.runs, &work)?;
            all_ok &= step.ok && records.iter().all(|r| r["passed"] == true);
            fault_runs.push((step, records));
        }
    }

    let mut security: Option<(Step, Vec<Value>)> = None;
    if !args.skip_security {
        let (step, records) = run_checks(&SECURITY, &work)?;
        all_ok &= step.ok && records.iter().all(|r| r["status"] != "fail");
        security = Some((step, records));
    }

    let mut tenancy: Option<(Step, Vec<Value>)> = None;
    if !args.skip_tenancy {
        let (step, records) = run_checks(&TENANCY, &work)?;
        all_ok &= step.ok && records.iter().all(|r| r["status"] != "fail");
        tenancy = Some((step, records));
    }

    let mut churn: Option<(Step, Option<Value>)> = None;
    if !args.skip_churn {
        let (step, summary) = churn_load(args.churn_duration, &work)?;
        all_ok &= step.ok;
        churn = Some((step, summary));
    }

    let report = Report {
        args,
        faults_exist,
        fault_runs: &fault_runs,
        security: security.as_ref(),
        tenancy: tenancy.as_ref(),
        churn: churn.as_ref(),
        elapsed: started.elapsed(),
    }
    .render();
    let out = root.join(&args.out);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, report).with_context(|| format!("write {}", out.display()))?;
    say(&format!(
        "report written to {} after {:.0} min",
        out.display(),
        started.elapsed().as_secs_f64() / 60.0
    ));
    Ok(all_ok)
}

/// Run `run` of `runs` of the fault suite: its step and the cases it recorded.
fn fault_run(run: u32, runs: u32, work: &Path) -> anyhow::Result<(Step, Vec<Value>)> {
    let out = work.join(format!("faults-run-{run}.jsonl"));
    let _ = std::fs::remove_file(&out);
    say(&format!("fault suite, run {run} of {runs}"));
    let step = cargo(
        &["test", "-p", "integration", "--test", "faults"],
        &[("RELIABILITY_OUT", &out)],
        &work.join(format!("faults-run-{run}.log")),
    )?;
    let records = json_lines(&out);
    Ok((step, records))
}

/// A test binary that records one JSON object per check in the file its variable names.
struct Checks {
    /// The test binary, which also names its files in the work directory.
    test: &'static str,
    /// The variable naming its records' file.
    out_var: &'static str,
    /// What the progress line calls it.
    title: &'static str,
}

/// The security checks.
const SECURITY: Checks = Checks {
    test: "security",
    out_var: "SECURITY_OUT",
    title: "security checks",
};

/// The hostile-tenant suite.
const TENANCY: Checks = Checks {
    test: "tenancy",
    out_var: "TENANCY_OUT",
    title: "hostile-tenant suite",
};

/// Runs `checks`: its step and the checks it recorded.
fn run_checks(checks: &Checks, work: &Path) -> anyhow::Result<(Step, Vec<Value>)> {
    let out = work.join(format!("{}.jsonl", checks.test));
    let _ = std::fs::remove_file(&out);
    say(checks.title);
    let step = cargo(
        &["test", "-p", "integration", "--test", checks.test],
        &[(checks.out_var, &out)],
        &work.join(format!("{}.log", checks.test)),
    )?;
    let records = json_lines(&out);
    Ok((step, records))
}

/// Runs the churn load for `duration`: its step and the summary it wrote, if any.
fn churn_load(duration: Duration, work: &Path) -> anyhow::Result<(Step, Option<Value>)> {
    let out = work.join("churn.json");
    let _ = std::fs::remove_file(&out);
    say(&format!("churn load for {duration:?}"));
    let duration = humantime::format_duration(duration).to_string();
    let out_arg = out.display().to_string();
    let step = cargo(
        &[
            "run",
            "-p",
            "integration",
            "--bin",
            "churn",
            "--release",
            "--",
            "--duration",
            &duration,
            "--out",
            &out_arg,
        ],
        &[],
        &work.join("churn.log"),
    )?;
    let summary = std::fs::read_to_string(&out)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    Ok((step, summary))
}

// ---- facts about this build and machine ----

/// The version a go.mod in `integration/upstream/<dir>` pins for `module`.
fn upstream_version(dir: &str, module: &str) -> String {
    let path = workspace()
        .join("integration/upstream")
        .join(dir)
        .join("go.mod");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            loop {
                match words.next() {
                    Some(word) if word == module => return words.next().map(str::to_owned),
                    Some(_) => {}
                    None => return None,
                }
            }
        })
        .unwrap_or_else(|| "unknown".into())
}

fn output_of(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .current_dir(workspace())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

fn machine() -> Vec<(String, String)> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or_else(
            || "unknown".into(),
            |kib| format!("{:.1} GiB", kib / 1024.0 / 1024.0),
        );
    vec![
        ("CPU".into(), model),
        ("cores available".into(), cores.to_string()),
        ("memory".into(), memory),
        ("kernel".into(), output_of("uname", &["-sr"])),
    ]
}

// ---- the report ----

struct Report<'a> {
    args: &'a Args,
    faults_exist: bool,
    fault_runs: &'a [(Step, Vec<Value>)],
    security: Option<&'a (Step, Vec<Value>)>,
    tenancy: Option<&'a (Step, Vec<Value>)>,
    churn: Option<&'a (Step, Option<Value>)>,
    elapsed: Duration,
}

fn cell(value: &Value) -> String {
    match value {
        Value::Null => "—".into(),
        Value::String(s) => s.replace('|', "\\|").replace('\n', " "),
        Value::Number(n) => n
            .as_f64()
            .filter(|f| f.fract() != 0.0)
            .map_or_else(|| n.to_string(), |f| format!("{f:.1}")),
        other => other.to_string().replace('|', "\\|"),
    }
}

fn number(value: &Value, digits: usize) -> String {
    value
        .as_f64()
        .map_or_else(|| "—".into(), |f| format!("{f:.digits$}"))
}

impl Report<'_> {
    fn render(&self) -> String {
        let mut md = String::new();
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        let commit = output_of("git", &["rev-parse", "--short", "HEAD"]);
        let dirty = !output_of("git", &["status", "--porcelain", "--untracked-files=no"])
            .trim()
            .is_empty();
        let _ = writeln!(md, "# Reliability report\n");
        let _ = writeln!(
            md,
            "Written by `cargo run -p integration --bin reliability --release -- --runs {}{}` on {now} (commit {commit}{}), in {:.0} minutes. \
             Every figure below comes from real processes: kube-apiserver, kube-controller-manager, kube-scheduler and etcd built from upstream, \
             the daemons as their ServiceAccount under deploy/'s RBAC, mock-eci as ECI. The raw records are in the work directory the command names.\n",
            self.args.runs,
            if self.args.churn_duration == DEFAULT_CHURN {
                String::new()
            } else {
                format!(
                    " --churn-duration {}",
                    humantime::format_duration(self.args.churn_duration)
                )
            },
            if dirty {
                ", with uncommitted changes"
            } else {
                ""
            },
            self.elapsed.as_secs_f64() / 60.0
        );
        self.versions(&mut md);
        self.faults(&mut md);
        self.security(&mut md);
        self.tenancy(&mut md);
        self.churn(&mut md);
        self.limits(&mut md);
        md
    }

    fn versions(&self, md: &mut String) {
        let _ = writeln!(md, "## Versions and machine\n");
        let _ = writeln!(md, "| | |\n| --- | --- |");
        let rows = [
            (
                "Kubernetes (apiserver, controller manager, scheduler, kubectl)",
                upstream_version("kubernetes", "k8s.io/kubernetes"),
            ),
            (
                "etcd",
                upstream_version("etcd", "go.etcd.io/etcd/server/v3"),
            ),
            ("kwok", upstream_version("kwok", "sigs.k8s.io/kwok")),
            ("rustc", output_of("rustc", &["--version"])),
        ];
        for (name, value) in rows {
            let _ = writeln!(md, "| {name} | {value} |");
        }
        for (name, value) in machine() {
            let _ = writeln!(md, "| {name} | {value} |");
        }
        let _ = writeln!(md);
    }

    fn faults(&self, md: &mut String) {
        let _ = writeln!(md, "## Faults\n");
        if self.args.skip_faults {
            let _ = writeln!(md, "NOT RUN: `--skip-faults`.\n");
            return;
        }
        if !self.faults_exist {
            let _ = writeln!(
                md,
                "NOT RUN: the fault suite (`integration/tests/faults.rs`) is not in this tree.\n"
            );
            return;
        }
        let runs = self.fault_runs;
        let records: Vec<(usize, &Value)> = runs
            .iter()
            .enumerate()
            .flat_map(|(i, (_, r))| r.iter().map(move |v| (i + 1, v)))
            .collect();
        let mut cases: Vec<String> = Vec::new();
        for (_, record) in &records {
            let case = record["case"].as_str().unwrap_or("?").to_owned();
            if !cases.contains(&case) {
                cases.push(case);
            }
        }
        fault_totals(md, runs, &records);
        fault_cases(md, &cases, &records);
        fault_matrix(md, &cases, &records, runs.len());
        for (i, (step, _)) in runs.iter().enumerate() {
            if !step.ok {
                let _ = writeln!(
                    md,
                    "\n<details><summary>run {} ended {}: what failed</summary>\n\n```\n{}\n```\n</details>",
                    i + 1,
                    step.status,
                    failure(&step.log)
                );
            }
        }
        let _ = writeln!(md);
    }

    fn tenancy(&self, md: &mut String) {
        let _ = writeln!(md, "## A hostile tenant\n");
        let Some((step, records)) = self.tenancy else {
            let _ = writeln!(md, "NOT RUN: `--skip-tenancy`.\n");
            return;
        };
        let _ = writeln!(
            md,
            "`cargo test -p integration --test tenancy` ({}, {:.0} s): a user bound only to the `admin` ClusterRole in their own namespace, acting with their own token, tries each attack through kubectl and the daemon's listeners.\n",
            step.outcome(),
            step.seconds
        );
        if records.is_empty() {
            let _ = writeln!(md, "**No attack recorded**: see tenancy.log.\n");
            return;
        }
        let _ = writeln!(
            md,
            "| attack | refused | what happened |\n| --- | --- | --- |"
        );
        for record in records {
            let refused = match record["status"].as_str() {
                Some("pass") => "yes".to_owned(),
                other => format!("**NO** ({})", other.unwrap_or("?")),
            };
            let _ = writeln!(
                md,
                "| {} | {refused} | {} |",
                cell(&record["attack"]),
                cell(&record["summary"])
            );
        }
        let _ = writeln!(md);
    }

    fn security(&self, md: &mut String) {
        let _ = writeln!(md, "## Security checks\n");
        let Some((step, records)) = self.security else {
            let _ = writeln!(md, "NOT RUN: `--skip-security`.\n");
            return;
        };
        let _ = writeln!(
            md,
            "`cargo test -p integration --test security` ({}, {:.0} s): the daemons run as `system:serviceaccount:kube-system:virtual-node-eci` with deploy/base's RBAC under the real authorizer.\n",
            step.outcome(),
            step.seconds
        );
        security_table(md, records);
        for record in records {
            let details = &record["details"];
            match record["check"].as_str() {
                Some("audit") if details.is_object() => audit_details(md, details),
                Some("can-i") => can_i_details(md, details),
                Some("credentials") if details.is_object() => credentials_details(md, details),
                Some("tls") => tls_details(md, details),
                _ => {}
            }
        }
        if !step.ok {
            let _ = writeln!(
                md,
                "\n<details><summary>what failed in the security run</summary>\n\n```\n{}\n```\n</details>",
                failure(&step.log)
            );
        }
        let _ = writeln!(md);
    }

    fn churn(&self, md: &mut String) {
        let _ = writeln!(md, "## Load held\n");
        let Some((step, summary)) = self.churn else {
            let _ = writeln!(md, "NOT RUN: `--skip-churn`.\n");
            return;
        };
        let Some(summary) = summary else {
            let _ = writeln!(
                md,
                "FAILED before a summary ({}):\n\n```\n{}\n```\n",
                step.status,
                failure(&step.log)
            );
            return;
        };
        churn_totals(md, summary);
        churn_verdict(md, summary);
        churn_slopes(md, summary);
        let _ = writeln!(
            md,
            "\nLimits (from `integration/src/bin/churn.rs`): RSS 16 MiB/h — at 5 pods/s each daemon sees 9,000 pods an hour, so ~2 KiB kept per forgotten pod crosses it, while the allocator's drift over 10 minutes stays below; descriptors and established connections 60/h — one per 300 churned pods of a daemon; ECI call rate and CPU 20 % of their mean per hour (CPU at least 2 points of a core) — a steady churn should give steady rates, and one growing a fifth an hour means work growing with history, not load. A slope is a leak when it is above its limit by more than two standard errors, flat when below by as much, inconclusive in between.\n"
        );
        churn_samples(md, summary);
    }

    fn limits(&self, md: &mut String) {
        let churn = humantime::format_duration(self.args.churn_duration);
        let _ = writeln!(
            md,
            "## What this does not show\n\n\
- **ECI is mock-eci.** Its lifecycle, errors, throttling and idempotency follow the documented API, but not the real service's latencies, error mix, eventual consistency or quotas per account; a duplicate or leak that only the real service's behaviour would provoke cannot show here.\n\
- **One 2-core machine, loopback only.** The control plane, the daemons, mock-eci and the load share two cores; there is no real network (no packet loss, no partitions but the ones made by stopping processes), and the ECS nodes are kwok's.\n\
- **Few runs.** Three runs of each fault case catch what goes wrong often, not a race that strikes once in a hundred runs.\n\
- **{churn} of churn.** The slopes bound leaks to the limits above over that window; slower ones — per token refresh (every ~48 minutes), per orphan-collector round (10 minutes by default), per day — need longer runs. The churn creates and deletes bare pods only (no logs, exec, webhook or ResourcePolicy traffic).\n\
- **The audit check covers the paths the workload took.** A request that only an untested path makes (the accesses listed as not exercised) is covered by `kubectl auth can-i` and `provider/tests/deploy.rs` (the RBAC equals the declared list) but was not seen answered.\n\
- **The credential scan looks for the exact values** (and their base64 and URL encodings) in what it reads: logs at info and debug level, Events, Pods, Nodes, `/metrics`, the kubelet API's `/pods` and mock-eci's answers — not in core dumps, the process environment (`/proc/<pid>/environ` holds `ECI_SECRET_KEY` as the manifests pass it), or logs at `trace`.\n\
- **The TLS check covers protocol versions**, not cipher suites, certificate validation by clients, or the plain-HTTP ports: the probes' `/healthz` and `/readyz` (10248) and the read-only `/metrics` port (10255, off unless opted in), plain like a kubelet's.\n\
- **`E2E_KUBECONFIG` runs** have no audit log (that check says NOT RUN) and their figures depend on that cluster.\n"
        );
    }
}

/// The fault suite's sums over every run and case, and a line per run.
fn fault_totals(md: &mut String, runs: &[(Step, Vec<Value>)], records: &[(usize, &Value)]) {
    let passed = records.iter().filter(|(_, r)| r["passed"] == true).count();
    let sum = |field: &str| -> u64 {
        records
            .iter()
            .map(|(_, r)| r[field].as_u64().unwrap_or(0))
            .sum()
    };
    let _ = writeln!(
        md,
        "`cargo test -p integration --test faults`, {} runs: {} case records, {passed} passed; in all, **{} pods lost, {} groups leaked, {} duplicates, {} pods stuck Terminating**.\n",
        runs.len(),
        records.len(),
        sum("pods_lost"),
        sum("groups_leaked"),
        sum("duplicates"),
        sum("stuck_terminating"),
    );
    let _ = writeln!(md, "| run | test binary | time |\n| --- | --- | --- |");
    for (i, (step, records)) in runs.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} ({} records) | {:.0} s |",
            i + 1,
            step.outcome(),
            records.len(),
            step.seconds
        );
    }
}

/// What each fault case does, from its first record's description.
fn fault_cases(md: &mut String, cases: &[String], records: &[(usize, &Value)]) {
    let _ = writeln!(md, "\n### What each case does\n");
    for case in cases {
        let description = records
            .iter()
            .find(|(_, r)| r["case"] == case.as_str())
            .and_then(|(_, r)| r["description"].as_str())
            .unwrap_or_default();
        let _ = writeln!(md, "- **{case}**: {description}");
    }
}

/// The table of every fault case in each of `runs` runs (a missing record says so).
fn fault_matrix(md: &mut String, cases: &[String], records: &[(usize, &Value)], runs: usize) {
    let _ = writeln!(
        md,
        "\n### Per case and run\n\n| case | run | converged in (s) | pods lost | groups leaked | duplicates | stuck Terminating | result | notes |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for case in cases {
        for run in 1..=runs {
            match records
                .iter()
                .find(|(r, v)| *r == run && v["case"] == case.as_str())
            {
                Some((_, v)) => {
                    let _ = writeln!(
                        md,
                        "| {case} | {run} | {} | {} | {} | {} | {} | {} | {} |",
                        number(&v["converge_seconds"], 1),
                        cell(&v["pods_lost"]),
                        cell(&v["groups_leaked"]),
                        cell(&v["duplicates"]),
                        cell(&v["stuck_terminating"]),
                        if v["passed"] == true {
                            "pass"
                        } else {
                            "**FAIL**"
                        },
                        cell(&v["notes"]),
                    );
                }
                None => {
                    let _ = writeln!(
                        md,
                        "| {case} | {run} | — | — | — | — | — | **no record** | the case ended before recording; see faults-run-{run}.log |"
                    );
                }
            }
        }
    }
}

/// What a security check verifies, for the report's table.
fn check_name(check: &str) -> &str {
    match check {
        "audit" => "no request of the daemon denied (apiserver audit log)",
        "can-i" => "`kubectl auth can-i --list` = the documented RBAC",
        "credentials" => "fake credentials in no log, Event, status or metric",
        "tls" => "no plain HTTP, no TLS below 1.2",
        other => other,
    }
}

/// The security checks' table: each record's result, then every check that left none.
fn security_table(md: &mut String, records: &[Value]) {
    let _ = writeln!(
        md,
        "| check | result | what it found |\n| --- | --- | --- |"
    );
    for record in records {
        let check = record["check"].as_str().unwrap_or("?");
        let status = record["status"].as_str().unwrap_or("?");
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            check_name(check),
            match status {
                "pass" => "pass".to_owned(),
                "not run" => "NOT RUN".to_owned(),
                other => format!("**{}**", other.to_uppercase()),
            },
            cell(&record["summary"])
        );
    }
    for check in ["audit", "can-i", "credentials", "tls"] {
        if !records.iter().any(|r| r["check"] == check) {
            let _ = writeln!(
                md,
                "| {} | **no record** | the test ended before recording; see security.log |",
                check_name(check)
            );
        }
    }
}

/// The audit check's findings.
fn audit_details(md: &mut String, details: &Value) {
    let _ = writeln!(
        md,
        "\n**Audit.** {} requests of the daemon's user in the audit log; answers by code: {}. Denied: {}. Documented accesses the workload exercised ({} of {}): {}. Not exercised: {}. Made but not documented: {}.",
        details["requests"],
        cell(&details["by_code"]),
        list(&details["denied"]),
        details["exercised_documented"]
            .as_array()
            .map_or(0, Vec::len),
        details["documented_accesses"],
        list(&details["exercised_documented"]),
        list(&details["not_exercised_documented"]),
        list(&details["exercised_undocumented"]),
    );
}

/// The can-i check's findings, per scope.
fn can_i_details(md: &mut String, details: &Value) {
    for scope in details.as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "\n**can-i, {}.** {} granted beyond every service account's defaults, {} documented; extra: {}; missing: {}; defaults subtracted: {}.",
            cell(&scope["scope"]),
            scope["granted"],
            scope["documented"],
            list(&scope["extra"]),
            list(&scope["missing"]),
            list(&scope["defaults_subtracted"]),
        );
    }
}

/// The credential scan's findings.
fn credentials_details(md: &mut String, details: &Value) {
    let _ = writeln!(
        md,
        "\n**Credentials.** Sources scanned: {}. The secret, the STS token or a wrong one found: {}. The AccessKey id outside a daemon's credential-description line: {}; on such lines: {}.",
        details["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| format!("{} ({} bytes)", cell(&s["source"]), s["bytes"]))
            .collect::<Vec<_>>()
            .join("; "),
        list(&details["leaks"]),
        list(&details["access_key_id_elsewhere"]),
        details["access_key_id_lines"]
            .as_array()
            .map_or(0, Vec::len),
    );
}

/// The TLS check's table, per endpoint.
fn tls_details(md: &mut String, details: &Value) {
    let _ = writeln!(
        md,
        "\n**TLS.**\n\n| endpoint | plain HTTP | TLS 1.2 | TLS 1.1 | TLS 1.0 |\n| --- | --- | --- | --- | --- |"
    );
    for endpoint in details.as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            cell(&endpoint["endpoint"]),
            cell(&endpoint["plain_http"]),
            cell(&endpoint["tls1_2"]),
            cell(&endpoint["tls1_1"]),
            cell(&endpoint["tls1_0"]),
        );
    }
}

/// What the churn load ran and its totals.
fn churn_totals(md: &mut String, summary: &Value) {
    let config = &summary["config"];
    let totals = &summary["totals"];
    let end = &summary["end"];
    let _ = writeln!(
        md,
        "`cargo run -p integration --bin churn --release -- --duration {}`: {} replicas (release builds), bare pods created at {}/s alternately on each virtual node and deleted {} s after their creation (~{} alive), for {} s; {} created ({} errors), {} deleted ({} errors); mock-eci answered {} calls. Afterwards the last pods were deleted: everything was gone after {} s ({} pods and {} groups left). Sampled every {} s; slopes are least-squares fits over the samples from t = {} s (after the ramp), per hour, ± their standard error.\n",
        humantime::format_duration(Duration::from_secs_f64(
            config["duration_seconds"].as_f64().unwrap_or(0.0)
        )),
        config["replicas"],
        config["rate_per_second"],
        number(&config["pod_lifetime_seconds"], 0),
        config["live"],
        number(&totals["churn_seconds"], 0),
        totals["created"],
        totals["create_errors"],
        totals["deleted"],
        totals["delete_errors"],
        number(&totals["mock_eci_calls"], 0),
        number(&end["converge_seconds"], 1),
        end["pods_left"],
        end["groups_left"],
        number(&config["sample_every_seconds"], 0),
        number(&config["fit_from_seconds"], 0),
    );
}

/// Whether any slope flagged a leak, and which were inconclusive.
fn churn_verdict(md: &mut String, summary: &Value) {
    let leaks = summary["leaks"].as_array().map_or(0, Vec::len);
    let inconclusive = summary["inconclusive"].as_array().map_or(0, Vec::len);
    let _ = writeln!(
        md,
        "{}{}\n",
        if leaks == 0 {
            "**No leak: no slope is above its limit by more than two standard errors.**".to_owned()
        } else {
            format!("**{leaks} leak(s) flagged**: {}.", list(&summary["leaks"]))
        },
        if inconclusive == 0 {
            " Every other slope is below its limit by more than two standard errors (flat)."
                .to_owned()
        } else {
            format!(
                " Inconclusive (the limit within two standard errors of the slope): {}.",
                list(&summary["inconclusive"])
            )
        }
    );
}

/// The table of every daemon's metrics: spread, slope, limit and verdict.
fn churn_slopes(md: &mut String, summary: &Value) {
    let _ = writeln!(
        md,
        "| daemon | metric | mean | min | max | first → last | slope per hour | limit per hour | verdict |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (daemon, metrics) in summary["slopes"].as_object().into_iter().flatten() {
        for (metric, fit) in metrics.as_object().into_iter().flatten() {
            let unit = fit["unit"].as_str().unwrap_or_default();
            let _ = writeln!(
                md,
                "| {daemon} | {metric} ({unit}) | {} | {} | {} | {} → {} | {} ± {} | {} | {} |",
                number(&fit["mean"], 2),
                number(&fit["min"], 2),
                number(&fit["max"], 2),
                number(&fit["first"], 2),
                number(&fit["last"], 2),
                number(&fit["slope_per_hour"], 2),
                number(&fit["slope_stderr_per_hour"], 2),
                number(&fit["limit_per_hour"], 2),
                match fit["verdict"].as_str() {
                    Some("leak") => "**leak**",
                    Some(other) => other,
                    None => "—",
                },
            );
        }
    }
}

/// Every sample of the churn load, folded away.
fn churn_samples(md: &mut String, summary: &Value) {
    let config = &summary["config"];
    let _ = writeln!(
        md,
        "<details><summary>every sample</summary>\n\n| t (s) | pods | groups | {} |\n| --- | --- | --- | {} |",
        (0..config["replicas"].as_u64().unwrap_or(0))
            .map(|i| format!("daemon {i}: {CELL_FIGURES}"))
            .collect::<Vec<_>>()
            .join(" | "),
        (0..config["replicas"].as_u64().unwrap_or(0))
            .map(|_| "---")
            .collect::<Vec<_>>()
            .join(" | ")
    );
    for sample in summary["samples"].as_array().into_iter().flatten() {
        let pods: u64 = sample["pods"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(_, n)| n.as_u64())
            .sum();
        let daemons = daemon_figures(sample, Layout::Cell);
        let _ = writeln!(
            md,
            "| {} | {pods} | {} | {} |",
            number(&sample["t"], 0),
            cell(&sample["groups"]),
            daemons.join(" | ")
        );
    }
    let _ = writeln!(md, "\n</details>\n");
}

fn list(value: &Value) -> String {
    match value.as_array() {
        Some(items) if items.is_empty() => "none".into(),
        Some(items) => items
            .iter()
            .map(|i| {
                format!(
                    "`{}`",
                    i.as_str().map_or_else(|| i.to_string(), str::to_owned)
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
        None => "—".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_ends_passed_or_failed_with_its_status() {
        let step = |ok: bool| Step {
            ok,
            status: "exit status: 101".into(),
            seconds: 1.0,
            log: PathBuf::new(),
        };
        assert_eq!(step(true).outcome(), "passed");
        assert_eq!(step(false).outcome(), "FAILED: exit status: 101");
    }
}
