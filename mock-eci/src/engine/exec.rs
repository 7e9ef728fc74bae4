//! Simulated `ExecContainerCommand`: the simulated runtime runs no process, so neither does
//! its exec — a tenant's command never runs on mock-eci's host. Both `Sync=true` and the
//! interactive sessions answer from this small interpreter (pure: command, context, stdin in;
//! output and exit code out).
//!
//! Supported commands (also as `sh -c '<script>'`, a script being commands separated by `;`,
//! each optionally ending in `>&2`): `echo <words>`, `printf <format> <args>` (`%s`, `%d`,
//! `%%`, `\n`, `\t`; the format repeats for the remaining arguments), `hostname`, `pwd`,
//! `env` / `printenv`, `printenv <NAME>`, `cat /etc/hostname`, `cat` (copies stdin), `whoami`,
//! `id`, `true`, `false`, `date` (the mock's clock), `exit <n>` and `sleep <n>` (no output).
//! Anything else is not found, as a shell says it (`sh: <cmd>: not found`, exit code 127).
//! Real processes, files and terminals need `--runtime real`.

use eci_proto::v20180808::Container;

use crate::clock::{Millis, rfc3339};

/// What the command sees of its container.
#[derive(Debug, Clone, Copy)]
pub struct ExecContext<'a> {
    /// The container spec.
    pub container: &'a Container,
    /// The hostname: the create's `HostName`, else the group's name.
    pub hostname: &'a str,
    /// The group's name (`metadata.name` as ECI's field references see it).
    pub group_name: &'a str,
    /// The group's intranet IP.
    pub pod_ip: &'a str,
    /// The current time.
    pub now: Millis,
}

/// The container as a simulated command sees it, kept with an interactive session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Simulation {
    /// The host name.
    pub hostname: String,
    /// The working directory (`/` when the spec names none).
    pub working_dir: String,
    /// The environment.
    pub env: Vec<(String, String)>,
    /// When the command runs.
    pub now: Millis,
}

impl Simulation {
    /// The context's view, owned.
    pub fn of(cx: ExecContext<'_>) -> Self {
        let dir = cx.container.working_dir.as_str();
        Self {
            hostname: cx.hostname.to_owned(),
            working_dir: if dir.is_empty() { "/" } else { dir }.to_owned(),
            env: env(cx),
            now: cx.now,
        }
    }
}

/// What a simulated command printed and how it ended. Bytes, not text: `cat` copies its stdin,
/// and a binary stdin (a tar stream, say) comes back as it went in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Simulated {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
}

/// Runs `command` (`Sync=true`): its output, stderr after stdout.
pub fn run(command: &[String], cx: ExecContext<'_>) -> String {
    let mut done = simulate(command, &Simulation::of(cx), b"");
    done.stdout.append(&mut done.stderr);
    String::from_utf8_lossy(&done.stdout).into_owned()
}

/// Whether `command` reads its stdin (a bare `cat`): a session waits for the input's end.
pub fn reads_stdin(command: &[String]) -> bool {
    let args: Vec<&str> = command.iter().map(String::as_str).collect();
    match args.as_slice() {
        [shell, "-c", script] if is_shell(shell) => script
            .split(';')
            .any(|part| part.split_whitespace().collect::<Vec<_>>() == ["cat"]),
        ["cat"] => true,
        _ => false,
    }
}

/// Runs `command` with `stdin` as its input.
pub fn simulate(command: &[String], sim: &Simulation, stdin: &[u8]) -> Simulated {
    let args: Vec<&str> = command.iter().map(String::as_str).collect();
    let mut out = Simulated::default();
    match args.as_slice() {
        [shell, "-c", script] if is_shell(shell) => {
            for part in script.split(';') {
                let mut words: Vec<&str> = part.split_whitespace().collect();
                let to_stderr = words.last() == Some(&">&2");
                if to_stderr {
                    words.pop();
                }
                if let Some(code) = one(&words, sim, stdin, &mut out, to_stderr) {
                    out.exit_code = code;
                    return out;
                }
            }
        }
        _ => {
            let code = one(&args, sim, stdin, &mut out, false);
            out.exit_code = code.unwrap_or(out.exit_code);
        }
    }
    out
}

/// One command: its output goes to `out`; `Some(code)` when it ends the script (`exit`).
fn one(
    args: &[&str],
    sim: &Simulation,
    stdin: &[u8],
    out: &mut Simulated,
    to_stderr: bool,
) -> Option<i32> {
    let (text, code): (String, i32) = match args {
        ["cat"] => {
            let sink = if to_stderr {
                &mut out.stderr
            } else {
                &mut out.stdout
            };
            sink.extend_from_slice(stdin);
            out.exit_code = 0;
            return None;
        }
        ["exit"] => return Some(out.exit_code),
        ["exit", code, ..] => return Some(code.parse().unwrap_or(2)),
        ["echo", rest @ ..] => (format!("{}\n", rest.join(" ")), 0),
        ["printf", format, rest @ ..] => (printf(format, rest), 0),
        ["hostname"] | ["cat", "/etc/hostname"] => (format!("{}\n", sim.hostname), 0),
        ["cat", file, ..] => {
            out.stderr.extend_from_slice(
                format!("cat: can't open '{file}': No such file or directory\n").as_bytes(),
            );
            (String::new(), 1)
        }
        ["pwd"] => (format!("{}\n", sim.working_dir), 0),
        ["env"] | ["printenv"] => (
            sim.env
                .iter()
                .map(|(key, value)| format!("{key}={value}\n"))
                .collect(),
            0,
        ),
        ["printenv", name] => match sim.env.iter().rev().find(|(key, _)| key == name) {
            Some((_, value)) => (format!("{value}\n"), 0),
            None => (String::new(), 1),
        },
        ["whoami"] => ("root\n".into(), 0),
        ["id"] => ("uid=0(root) gid=0(root) groups=0(root)\n".into(), 0),
        ["date"] => (format!("{}\n", rfc3339(sim.now)), 0),
        ["true"] | ["sleep", ..] | [] => (String::new(), 0),
        ["false"] => (String::new(), 1),
        [program, ..] => {
            out.stderr
                .extend_from_slice(format!("sh: {program}: not found\n").as_bytes());
            (String::new(), 127)
        }
    };
    if to_stderr {
        out.stderr.extend_from_slice(text.as_bytes());
    } else {
        out.stdout.extend_from_slice(text.as_bytes());
    }
    out.exit_code = code;
    None
}

/// printf's `%s`, `%d`, `%%` and `\n`/`\t`/`\\` escapes; the format is used again while
/// arguments remain (as printf(1) does).
fn printf(format: &str, args: &[&str]) -> String {
    let mut out = String::new();
    let mut rest = args.iter();
    loop {
        let mut used = false;
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            match (c, chars.clone().next()) {
                ('%', Some('s' | 'd')) => {
                    chars.next();
                    used = true;
                    out.push_str(rest.next().copied().unwrap_or_default());
                }
                ('%', Some('%')) => {
                    chars.next();
                    out.push('%');
                }
                ('\\', Some(escaped @ ('n' | 't' | '\\'))) => {
                    chars.next();
                    out.push(match escaped {
                        'n' => '\n',
                        't' => '\t',
                        _ => '\\',
                    });
                }
                (c, _) => out.push(c),
            }
        }
        if !used || rest.len() == 0 {
            return out;
        }
    }
}

fn is_shell(program: &str) -> bool {
    matches!(program, "sh" | "bash" | "/bin/sh" | "/bin/bash")
}

/// The container's environment as its processes see it.
pub fn env(cx: ExecContext<'_>) -> Vec<(String, String)> {
    let mut vars = vec![("HOSTNAME".to_owned(), cx.hostname.to_owned())];
    for var in &cx.container.environment_var {
        let value = match var
            .field_ref
            .as_ref()
            .map(|field| field.field_path.as_str())
        {
            Some("status.podIP") => cx.pod_ip.to_owned(),
            Some("metadata.name") => cx.group_name.to_owned(),
            _ => var.value.clone(),
        };
        vars.push((var.key.clone(), value));
    }
    vars
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::{EnvironmentVar, FieldRef};

    use super::*;

    fn cx(container: &Container) -> ExecContext<'_> {
        ExecContext {
            container,
            hostname: "default-web-0",
            group_name: "default-web-0",
            pod_ip: "192.168.0.2",
            now: 1_456_231_584_000,
        }
    }

    fn cmd(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| (*word).to_owned()).collect()
    }

    #[test]
    fn simple_commands() {
        let container = Container {
            working_dir: "/app".into(),
            environment_var: vec![
                EnvironmentVar {
                    key: "MODE".into(),
                    value: "prod".into(),
                    field_ref: None,
                },
                EnvironmentVar {
                    key: "POD_IP".into(),
                    value: String::new(),
                    field_ref: Some(FieldRef {
                        field_path: "status.podIP".into(),
                    }),
                },
            ],
            ..Container::default()
        };
        let cx = cx(&container);
        assert_eq!(run(&cmd(&["echo", "hello", "world"]), cx), "hello world\n");
        assert_eq!(run(&cmd(&["hostname"]), cx), "default-web-0\n");
        assert_eq!(run(&cmd(&["pwd"]), cx), "/app\n");
        assert_eq!(run(&cmd(&["printenv", "MODE"]), cx), "prod\n");
        assert_eq!(run(&cmd(&["printenv", "POD_IP"]), cx), "192.168.0.2\n");
        assert!(run(&cmd(&["env"]), cx).contains("HOSTNAME=default-web-0\n"));
        assert_eq!(run(&cmd(&["sh", "-c", "echo hi there"]), cx), "hi there\n");
        assert_eq!(run(&cmd(&["date"]), cx), "2016-02-23T12:46:24Z\n");
        assert_eq!(run(&cmd(&["true"]), cx), "");
        assert_eq!(
            run(&cmd(&["frobnicate", "-x"]), cx),
            "sh: frobnicate: not found\n"
        );
    }

    #[test]
    fn sessions_get_exit_codes_streams_and_stdin_without_a_process() {
        let container = Container::default();
        let sim = Simulation::of(cx(&container));
        // command, stdin, (stdout, stderr, exit code)
        type Case<'a> = (&'a [&'a str], &'a [u8], (&'a str, &'a str, i32));
        let table: [Case<'_>; 9] = [
            (&["sh", "-c", "exit 3"], b"", ("", "", 3)),
            (
                &["sh", "-c", "echo out; echo err >&2; exit 4"],
                b"",
                ("out\n", "err\n", 4),
            ),
            (&["cat"], b"typed\n", ("typed\n", "", 0)),
            (
                &["cat", "/etc/passwd"],
                b"",
                (
                    "",
                    "cat: can't open '/etc/passwd': No such file or directory\n",
                    1,
                ),
            ),
            (
                &["printf", "[%s]", "a b", "", "$X"],
                b"",
                ("[a b][][$X]", "", 0),
            ),
            (
                &["no-such-program"],
                b"",
                ("", "sh: no-such-program: not found\n", 127),
            ),
            (
                &["sh", "-c", "nope; echo after"],
                b"",
                ("after\n", "sh: nope: not found\n", 0),
            ),
            (&["false"], b"", ("", "", 1)),
            (
                &["id"],
                b"",
                ("uid=0(root) gid=0(root) groups=0(root)\n", "", 0),
            ),
        ];
        for (command, stdin, (stdout, stderr, code)) in table {
            let done = simulate(&cmd(command), &sim, stdin);
            assert_eq!(
                (
                    done.stdout.as_slice(),
                    done.stderr.as_slice(),
                    done.exit_code
                ),
                (stdout.as_bytes(), stderr.as_bytes(), code),
                "{command:?}"
            );
        }
        // Bytes that are not UTF-8 (a tar stream's) come back through cat as they went in.
        let binary: Vec<u8> = (0..=255u8).rev().chain([0xc3, 0x28, 0, b'\n']).collect();
        let done = simulate(&cmd(&["cat"]), &sim, &binary);
        assert_eq!((done.stdout, done.exit_code), (binary, 0));
        assert!(reads_stdin(&cmd(&["cat"])));
        assert!(reads_stdin(&cmd(&["sh", "-c", "cat; echo done"])));
        assert!(!reads_stdin(&cmd(&["cat", "/etc/hostname"])));
    }
}
