//! What a container runs, from its API spec and its image's config, by Kubernetes' rules (ECI
//! follows them): `Command` replaces the image's Entrypoint and drops its Cmd; `Arg` alone
//! replaces Cmd; the image's Env first, then `EnvironmentVar` (a later name wins); the spec's
//! `WorkingDir`, else the image's. Pure.

use std::net::Ipv4Addr;

use base64::Engine as _;
use eci_proto::v20180808::{Container, Volume};

use crate::images::ImageRunConfig;
use crate::sandbox::volumes::quantity_bytes;
use crate::sandbox::{ContainerSpec, MountSpec, VolumeFile, VolumeSource, VolumeSpec};

/// A file's mode when neither it nor its volume says one (Kubernetes' default).
const DEFAULT_FILE_MODE: u32 = 0o644;

/// A group volume as the sandbox makes it: `EmptyDirVolume` (the `Memory` medium a tmpfs of
/// its `SizeLimit`; on disk the limit is not enforced) and `ConfigFileVolume` (each file's
/// base64 `Content` decoded, its `Mode`, else the volume's `DefaultMode`, else 0644); other
/// types cannot be made on this machine and fail the containers that mount them. A
/// `SizeLimit` that does not parse is no limit; content that is not base64 is taken as is.
pub fn volume(volume: &Volume) -> VolumeSpec {
    let source = match volume.r#type.as_str() {
        "EmptyDirVolume" => {
            let empty = volume.empty_dir_volume.clone().unwrap_or_default();
            VolumeSource::EmptyDir {
                memory: empty.medium == "Memory",
                size_limit: quantity_bytes(&empty.size_limit),
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
        other => VolumeSource::Unsupported(other.to_owned()),
    };
    VolumeSpec {
        name: volume.name.clone(),
        source,
    }
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
/// `FieldRef` of `status.podIP` is the group's address; other field references are not
/// resolved here and are left out.
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
            Some(field) if field.field_path == "status.podIP" => set(&var.key, ip.to_string()),
            Some(_) => {}
            None => set(&var.key, var.value.clone()),
        }
    }
    env
}

/// Everything the sandbox needs to run the container; `Err` says why it cannot run.
pub fn container_spec(
    spec: &Container,
    image: &ImageRunConfig,
    ip: Ipv4Addr,
) -> Result<ContainerSpec, String> {
    let argv = argv(spec, image);
    if argv.is_empty() {
        return Err(format!(
            "container {:?} has no command: neither its Command nor its image's Entrypoint or Cmd says one",
            spec.name
        ));
    }
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

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|word| (*word).to_owned()).collect()
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
                ("IP", "10.213.0.2")
            ])
        );
    }

    #[test]
    fn limits_and_working_dir_come_through_and_no_command_is_refused() {
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
        let resolved = container_spec(&spec, &image, Ipv4Addr::LOCALHOST).unwrap();
        assert_eq!(resolved.cpu_millis, Some(500));
        assert_eq!(resolved.memory_bytes, Some(256 << 20));
        assert_eq!(resolved.working_dir.as_deref(), Some("/srv"));
        let error =
            container_spec(&spec, &ImageRunConfig::default(), Ipv4Addr::LOCALHOST).unwrap_err();
        assert!(error.contains("no command"), "{error}");
    }
}
