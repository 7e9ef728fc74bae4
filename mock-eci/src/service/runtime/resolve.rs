//! What a container runs, from its API spec and its image's config, by Kubernetes' rules (ECI
//! follows them): `Command` replaces the image's Entrypoint and drops its Cmd; `Arg` alone
//! replaces Cmd; the image's Env first, then `EnvironmentVar` (a later name wins); the spec's
//! `WorkingDir`, else the image's. Pure.

use std::net::Ipv4Addr;

use base64::Engine as _;
use eci_proto::v20180808::{Container, Volume};

use crate::images::ImageRunConfig;
use crate::sandbox::{ContainerSpec, MountSpec, VolumeFile, VolumeSource, VolumeSpec};

/// An emptyDir's `SizeLimit` in bytes, read as the apiserver reads quantities (a negative or
/// unreadable one is none).
fn size_limit(text: &str) -> Option<u64> {
    let quantity = vne_core::quantity::Quantity::parse(text).ok()?;
    u64::try_from(quantity.value_ceil()).ok()
}

/// A file's mode when neither it nor its volume says one (Kubernetes' default).
const DEFAULT_FILE_MODE: u32 = 0o644;

/// A group volume as the sandbox makes it: `EmptyDirVolume` (the `Memory` medium a tmpfs of
/// its `SizeLimit`; on disk the limit is not enforced) and `ConfigFileVolume` (each file's
/// base64 `Content` decoded, its `Mode`, else the volume's `DefaultMode`, else 0644); a cloud
/// disk, a NAS path and an OSS bucket path are stored volumes (see [`stored`]); other types
/// cannot be made on this machine and fail the containers that mount them. A `SizeLimit` that
/// does not parse is no limit; content that is not base64 is taken as is.
pub fn volume(volume: &Volume) -> VolumeSpec {
    let source = match volume.r#type.as_str() {
        "EmptyDirVolume" => {
            let empty = volume.empty_dir_volume.clone().unwrap_or_default();
            VolumeSource::EmptyDir {
                memory: empty.medium == "Memory",
                size_limit: size_limit(&empty.size_limit),
            }
        }
        "ConfigFileVolume" => {
            let config = volume.config_file_volume.clone().unwrap_or_default();
            let default_mode = config
                .default_mode
                .and_then(|mode| u32::try_from(mode).ok())
                .unwrap_or(DEFAULT_FILE_MODE);
            VolumeSource::Files(
                config
                    .config_file_to_path
                    .iter()
                    .map(|file| VolumeFile {
                        path: file.path.clone(),
                        content: base64::engine::general_purpose::STANDARD
                            .decode(&file.content)
                            .unwrap_or_else(|_| file.content.clone().into_bytes()),
                        mode: file
                            .mode
                            .and_then(|mode| u32::try_from(mode).ok())
                            .unwrap_or(default_mode),
                    })
                    .collect(),
            )
        }
        other => stored(volume).unwrap_or_else(|| VolumeSource::Unsupported(other.to_owned())),
    };
    VolumeSpec {
        name: volume.name.clone(),
        source,
    }
}

/// A volume whose content outlives the group, keyed by what names the storage in the cloud:
/// a `DiskVolume` by its `DiskId`, an `NFSVolume` by server and path (its `ReadOnly` kept), an
/// OSS `FlexVolume` (driver `alicloud/oss`) by the bucket and path of its `Options`. Groups
/// naming the same key share the content, as they would share the disk, NAS or bucket; none of
/// it is a network mount (no NAS or OSS is reached from this machine). `None` for other types,
/// and for one missing its key (the engine refuses those before a group exists).
fn stored(volume: &Volume) -> Option<VolumeSource> {
    let (key, read_only) = match volume.r#type.as_str() {
        "DiskVolume" => {
            let disk = volume.disk_volume.as_ref()?;
            (format!("disk:{}", disk.disk_id), false)
        }
        "NFSVolume" => {
            let nfs = volume.nfs_volume.as_ref()?;
            (format!("nfs:{}:{}", nfs.server, nfs.path), nfs.read_only)
        }
        "FlexVolume" => {
            let flex = volume.flex_volume.as_ref()?;
            if flex.driver != "alicloud/oss" {
                return None;
            }
            let options: serde_json::Value = serde_json::from_str(&flex.options).ok()?;
            let text = |name: &str| options.get(name).and_then(serde_json::Value::as_str);
            (
                format!("oss:{}:{}", text("bucket")?, text("path").unwrap_or("/")),
                false,
            )
        }
        _ => return None,
    };
    let empty = key.split(':').nth(1).is_none_or(str::is_empty);
    (!empty).then_some(VolumeSource::Stored { key, read_only })
}

/// The command line: Kubernetes' four cases.
pub fn argv(spec: &Container, image: &ImageRunConfig) -> Vec<String> {
    match (spec.command.is_empty(), spec.arg.is_empty()) {
        (false, _) => spec.command.iter().chain(&spec.arg).cloned().collect(),
        (true, false) => image.entrypoint.iter().chain(&spec.arg).cloned().collect(),
        (true, true) => image.entrypoint.iter().chain(&image.cmd).cloned().collect(),
    }
}

/// The environment: the image's, then the spec's (replacing a name already set). A
/// `FieldRef` of `status.podIP` or `status.hostIP` is the group's address (the instance is the
/// pod's host, as the daemon reports it); other field references are not resolved here and
/// are left out.
pub fn env(spec: &Container, image: &ImageRunConfig, ip: Ipv4Addr) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: String| {
        env.retain(|(existing, _)| existing != name);
        env.push((name.to_owned(), value));
    };
    for entry in &image.env {
        let (name, value) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
        set(name, value.to_owned());
    }
    for var in &spec.environment_var {
        match &var.field_ref {
            Some(field)
                if matches!(field.field_path.as_str(), "status.podIP" | "status.hostIP") =>
            {
                set(&var.key, ip.to_string());
            }
            Some(_) => {}
            None => set(&var.key, var.value.clone()),
        }
    }
    env
}

/// The image's /etc/passwd and /etc/group (empty when it has none), which name its users.
#[derive(Debug, Clone, Default)]
pub struct Accounts {
    pub passwd: String,
    pub group: String,
}

impl Accounts {
    /// The uid and primary gid of user `name` (a name or a number).
    fn user(&self, name: &str) -> Option<(u32, u32)> {
        self.passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            let (uid, gid) = (fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?);
            (fields[0] == name || name.parse::<u32>() == Ok(uid)).then_some((uid, gid))
        })
    }

    /// The gid of group `name`.
    fn group(&self, name: &str) -> Option<u32> {
        self.group.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields[0] == name).then(|| fields.get(2)?.parse().ok())?
        })
    }
}

/// The uid and gid the container runs as, as the kubelet's runtimes decide: `RunAsUser`
/// (its primary group from the image's /etc/passwd, else 0), else the image's `User`
/// (`name`, `uid`, `name:group`, `uid:gid`; names from its /etc/passwd and /etc/group; the
/// user's primary group when no group is given), else root; `RunAsGroup` replaces the gid.
pub fn user(spec: &Container, image_user: &str, accounts: &Accounts) -> Result<(u32, u32), String> {
    let id = |value: i64, what: &str| {
        u32::try_from(value).map_err(|_| format!("{what} {value} is not a valid id"))
    };
    let (uid, gid) = match spec
        .security_context
        .as_ref()
        .and_then(|context| context.run_as_user)
    {
        Some(uid) => {
            let uid = id(uid, "RunAsUser")?;
            (
                uid,
                accounts.user(&uid.to_string()).map_or(0, |(_, gid)| gid),
            )
        }
        None if image_user.is_empty() => (0, 0),
        None => {
            let (name, group) = match image_user.split_once(':') {
                Some((name, group)) => (name, Some(group)),
                None => (image_user, None),
            };
            let (uid, primary) = match (accounts.user(name), name.parse::<u32>()) {
                (Some(found), _) => found,
                (None, Ok(uid)) => (uid, 0),
                (None, Err(_)) => {
                    return Err(format!(
                        "unable to find user {name}: no matching entries in the image's /etc/passwd"
                    ));
                }
            };
            let gid = match group {
                None => primary,
                Some(group) => match (accounts.group(group), group.parse::<u32>()) {
                    (Some(gid), _) | (None, Ok(gid)) => gid,
                    (None, Err(_)) => {
                        return Err(format!(
                            "unable to find group {group}: no matching entries in the image's /etc/group"
                        ));
                    }
                },
            };
            (uid, gid)
        }
    };
    match spec.security_context_run_as_group {
        Some(gid) => Ok((uid, id(gid, "RunAsGroup")?)),
        None => Ok((uid, gid)),
    }
}

/// Where a container's termination message is written when its TerminationMessagePath is not
/// given (Kubernetes' default).
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// Everything the sandbox needs to run the container; `Err` says why it cannot run.
pub fn container_spec(
    spec: &Container,
    image: &ImageRunConfig,
    accounts: &Accounts,
    ip: Ipv4Addr,
) -> Result<ContainerSpec, String> {
    let argv = argv(spec, image);
    if argv.is_empty() {
        return Err(format!(
            "container {:?} has no command: neither its Command nor its image's Entrypoint or Cmd says one",
            spec.name
        ));
    }
    let user = user(spec, &image.user, accounts)?;
    let termination_message_path = match spec.termination_message_path.as_str() {
        "" => DEFAULT_TERMINATION_MESSAGE_PATH.to_owned(),
        path if path.starts_with('/') => path.to_owned(),
        path => {
            return Err(format!(
                "container {:?}: TerminationMessagePath {path:?} is not an absolute path",
                spec.name
            ));
        }
    };
    let working_dir = [&spec.working_dir, &image.working_dir]
        .into_iter()
        .find(|dir| !dir.is_empty())
        .cloned();
    Ok(ContainerSpec {
        name: spec.name.clone(),
        argv,
        env: env(spec, image, ip),
        working_dir,
        memory_bytes: spec
            .memory
            .filter(|gib| *gib > 0.0)
            .map(|gib| (gib * f64::from(1u32 << 30)).round() as u64),
        cpu_millis: spec
            .cpu
            .filter(|cpu| *cpu > 0.0)
            .map(|cpu| (cpu * 1000.0).round() as u64),
        user,
        read_only_root: spec
            .security_context
            .as_ref()
            .is_some_and(|context| context.read_only_root_filesystem),
        termination_message_path,
        mounts: spec
            .volume_mount
            .iter()
            .map(|mount| MountSpec {
                volume: mount.name.clone(),
                path: mount.mount_path.clone(),
                sub_path: mount.sub_path.clone(),
                read_only: mount.read_only,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::{EnvironmentVar, FieldRef};

    use super::*;

    #[test]
    fn an_empty_dirs_size_limit_is_read_as_the_apiserver_reads_quantities() {
        for (text, bytes) in [
            ("512Mi", Some(512 << 20)),
            ("1G", Some(1_000_000_000)),
            ("1048576", Some(1 << 20)),
            ("1.5Gi", Some(3 << 29)),
            ("", None),
            ("Gi", None),
            ("-1Gi", None),
        ] {
            assert_eq!(size_limit(text), bytes, "{text:?}");
        }
    }

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|word| (*word).to_owned()).collect()
    }

    #[test]
    fn disks_nas_and_oss_paths_are_stored_by_what_names_them_in_the_cloud() {
        use eci_proto::v20180808::{DiskVolume, FlexVolume, NfsVolume};
        let disk = |id: &str| Volume {
            r#type: "DiskVolume".into(),
            disk_volume: Some(DiskVolume {
                disk_id: id.into(),
                ..DiskVolume::default()
            }),
            ..Volume::default()
        };
        let nfs = |server: &str, read_only| Volume {
            r#type: "NFSVolume".into(),
            nfs_volume: Some(NfsVolume {
                server: server.into(),
                path: "/share".into(),
                read_only,
            }),
            ..Volume::default()
        };
        let flex = |driver: &str, options: &str| Volume {
            r#type: "FlexVolume".into(),
            flex_volume: Some(FlexVolume {
                driver: driver.into(),
                options: options.into(),
                ..FlexVolume::default()
            }),
            ..Volume::default()
        };
        let stored = |key: &str, read_only| VolumeSource::Stored {
            key: key.into(),
            read_only,
        };
        let unsupported = |kind: &str| VolumeSource::Unsupported(kind.into());
        let cases = [
            (disk("d-1"), stored("disk:d-1", false)),
            (disk(""), unsupported("DiskVolume")),
            (
                nfs("nas.example.com", true),
                stored("nfs:nas.example.com:/share", true),
            ),
            (nfs("", false), unsupported("NFSVolume")),
            (
                flex(
                    "alicloud/oss",
                    r#"{"bucket":"b","path":"/logs","url":"oss.example"}"#,
                ),
                stored("oss:b:/logs", false),
            ),
            (
                flex("alicloud/oss", r#"{"bucket":"b"}"#),
                stored("oss:b:/", false),
            ),
            (flex("alicloud/oss", "not json"), unsupported("FlexVolume")),
            (
                flex("alicloud/disk", r#"{"volumeId":"d-1"}"#),
                unsupported("FlexVolume"),
            ),
            (
                Volume {
                    r#type: "HostPathVolume".into(),
                    ..Volume::default()
                },
                unsupported("HostPathVolume"),
            ),
        ];
        for (spec, expected) in cases {
            assert_eq!(volume(&spec).source, expected, "{spec:?}");
        }
    }

    #[test]
    fn command_and_args_follow_the_kubernetes_rules() {
        let image = ImageRunConfig {
            entrypoint: words(&["/entry"]),
            cmd: words(&["default"]),
            ..ImageRunConfig::default()
        };
        // (Command, Arg, expected)
        let cases: [(&[&str], &[&str], &[&str]); 4] = [
            (&[], &[], &["/entry", "default"]),
            (&[], &["x"], &["/entry", "x"]),
            (&["sh"], &[], &["sh"]),
            (&["sh", "-c"], &["echo"], &["sh", "-c", "echo"]),
        ];
        for (command, arg, expected) in cases {
            let spec = Container {
                command: words(command),
                arg: words(arg),
                ..Container::default()
            };
            assert_eq!(argv(&spec, &image), words(expected), "{command:?} {arg:?}");
        }
    }

    #[test]
    fn the_spec_s_env_follows_and_overrides_the_image_s() {
        let image = ImageRunConfig {
            env: words(&["PATH=/bin", "FOO=image", "EMPTY"]),
            ..ImageRunConfig::default()
        };
        let spec = Container {
            environment_var: vec![
                EnvironmentVar {
                    key: "FOO".into(),
                    value: "bar".into(),
                    field_ref: None,
                },
                EnvironmentVar {
                    key: "IP".into(),
                    value: String::new(),
                    field_ref: Some(FieldRef {
                        field_path: "status.podIP".into(),
                    }),
                },
                EnvironmentVar {
                    key: "HOST_IP".into(),
                    value: String::new(),
                    field_ref: Some(FieldRef {
                        field_path: "status.hostIP".into(),
                    }),
                },
            ],
            ..Container::default()
        };
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            env(&spec, &image, Ipv4Addr::new(10, 213, 0, 2)),
            pairs(&[
                ("PATH", "/bin"),
                ("EMPTY", ""),
                ("FOO", "bar"),
                ("IP", "10.213.0.2"),
                ("HOST_IP", "10.213.0.2")
            ])
        );
    }

    #[test]
    fn limits_working_dir_and_message_path_come_through_and_no_command_is_refused() {
        let image = ImageRunConfig {
            cmd: words(&["sh"]),
            working_dir: "/srv".into(),
            ..ImageRunConfig::default()
        };
        let spec = Container {
            name: "app".into(),
            cpu: Some(0.5),
            memory: Some(0.25),
            ..Container::default()
        };
        let resolved =
            container_spec(&spec, &image, &Accounts::default(), Ipv4Addr::LOCALHOST).unwrap();
        assert_eq!(resolved.cpu_millis, Some(500));
        assert_eq!(resolved.memory_bytes, Some(256 << 20));
        assert_eq!(resolved.working_dir.as_deref(), Some("/srv"));
        assert_eq!(resolved.termination_message_path, "/dev/termination-log");
        let at = |path: &str| {
            let spec = Container {
                termination_message_path: path.into(),
                ..spec.clone()
            };
            container_spec(&spec, &image, &Accounts::default(), Ipv4Addr::LOCALHOST)
                .map(|resolved| resolved.termination_message_path)
        };
        assert_eq!(at("/dev/custom").as_deref(), Ok("/dev/custom"));
        assert!(
            at("relative/log")
                .unwrap_err()
                .contains("not an absolute path")
        );
        let error = container_spec(
            &spec,
            &ImageRunConfig::default(),
            &Accounts::default(),
            Ipv4Addr::LOCALHOST,
        )
        .unwrap_err();
        assert!(error.contains("no command"), "{error}");
    }

    #[test]
    fn the_user_follows_run_as_user_then_the_image_then_root() {
        use eci_proto::v20180808::ContainerSecurityContext;
        let accounts = Accounts {
            passwd: "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n".into(),
            group: "root:x:0:\nstaff:x:50:\n".into(),
        };
        let spec = |run_as_user: Option<i64>, run_as_group: Option<i64>| Container {
            security_context: Some(ContainerSecurityContext {
                run_as_user,
                ..ContainerSecurityContext::default()
            }),
            security_context_run_as_group: run_as_group,
            ..Container::default()
        };
        // RunAsUser, RunAsGroup, the image's User, what it runs as.
        type Case = (
            Option<i64>,
            Option<i64>,
            &'static str,
            Result<(u32, u32), &'static str>,
        );
        let cases: [Case; 11] = [
            (None, None, "", Ok((0, 0))),
            (None, None, "app", Ok((1000, 1001))),
            (None, None, "1000", Ok((1000, 1001))),
            (None, None, "4242", Ok((4242, 0))),
            (None, None, "app:staff", Ok((1000, 50))),
            (None, None, "app:77", Ok((1000, 77))),
            (None, Some(9), "app", Ok((1000, 9))),
            (Some(1000), None, "", Ok((1000, 1001))),
            (Some(1234), Some(5678), "app", Ok((1234, 5678))),
            (None, None, "ghost", Err("unable to find user ghost")),
            (Some(-1), None, "", Err("RunAsUser -1 is not a valid id")),
        ];
        for (run_as_user, run_as_group, image_user, want) in cases {
            let got = user(&spec(run_as_user, run_as_group), image_user, &accounts);
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{image_user:?} {run_as_user:?}"),
                (Err(got), Err(want)) => assert!(got.starts_with(want), "{got}"),
                (got, want) => panic!("{image_user:?} {run_as_user:?}: {got:?}, want {want:?}"),
            }
        }
    }
}
