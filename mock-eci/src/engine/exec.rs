//! Simulated `ExecContainerCommand` with `Sync=true`.
//!
//! Supported commands (also wrapped as `sh -c '<command>'` or `/bin/sh -c …`):
//! `echo <words>`, `hostname`, `pwd`, `env` / `printenv`, `printenv <NAME>`, `cat /etc/hostname`,
//! `whoami`, `true`, `date` (the mock's clock), `exit <n>` and `sleep <n>` (no output). Anything
//! else answers as a shell would: `sh: <cmd>: not found`.

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

/// Runs `command` and returns its output.
pub fn run(command: &[String], cx: ExecContext<'_>) -> String {
    let args: Vec<&str> = command.iter().map(String::as_str).collect();
    match args.as_slice() {
        [shell, "-c", script] if is_shell(shell) => {
            let words: Vec<String> = script.split_whitespace().map(str::to_owned).collect();
            run(&words, cx)
        }
        ["echo", rest @ ..] => format!("{}\n", rest.join(" ")),
        ["hostname"] | ["cat", "/etc/hostname"] => format!("{}\n", cx.hostname),
        ["pwd"] => {
            let dir = cx.container.working_dir.as_str();
            format!("{}\n", if dir.is_empty() { "/" } else { dir })
        }
        ["env"] | ["printenv"] => env(cx)
            .iter()
            .map(|(key, value)| format!("{key}={value}\n"))
            .collect(),
        ["printenv", name] => env(cx)
            .into_iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| format!("{value}\n"))
            .unwrap_or_default(),
        ["whoami"] => "root\n".into(),
        ["date"] => format!("{}\n", rfc3339(cx.now)),
        ["true"] | ["exit", ..] | ["sleep", ..] | [] => String::new(),
        [program, ..] => format!("sh: {program}: not found\n"),
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
}
