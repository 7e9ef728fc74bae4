//! mock-eci's image store against a real OCI registry on loopback (the CNCF distribution
//! registry built from upstream), with the busybox image the project builds offline from
//! Debian's busybox-static: pulls, blob reuse, the registry's htpasswd auth with ECI's
//! ImageRegistryCredential, ECI-shaped failures, and hostile layers.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use integration::images::{self, BuiltImage, LayerBuilder, RunConfig};
use integration::registry::{BasicAuth, TestRegistry};
use mock_eci::images::{ImageStore, PullError, PullOptions, RegistryCredential};

/// Options for a pull from `registry`: plain HTTP (a loopback registry), `credentials`.
fn options(registry: &TestRegistry, credentials: Vec<RegistryCredential>) -> PullOptions {
    PullOptions {
        credentials,
        plain_http_registries: vec![registry.host().to_owned()],
        insecure_registries: Vec::new(),
    }
}

fn store() -> (tempfile::TempDir, ImageStore) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = ImageStore::open(&dir.path().join("store")).expect("the store opens");
    (dir, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busybox_pulls_into_a_runnable_rootfs_and_a_second_pull_reuses_its_blobs() {
    let registry = TestRegistry::start(None)
        .await
        .expect("the registry starts");
    let image = format!("{}/library/busybox:1.35", registry.host());
    images::push(&images::busybox().expect("busybox builds"), &image, None)
        .await
        .expect("busybox is pushed");
    let (_dir, store) = store();

    let pulled = store
        .pull(&image, &options(&registry, Vec::new()))
        .await
        .expect("busybox is pulled");
    assert_eq!(pulled.fetched_blobs, 2, "a config and one layer fetched");
    let busybox = pulled.rootfs.join("bin/busybox");
    let mode = std::fs::metadata(&busybox)
        .expect("/bin/busybox exists")
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "/bin/busybox is executable: {mode:o}");
    assert_eq!(
        std::fs::read(&busybox).expect("read"),
        std::fs::read(images::DEBIAN_BUSYBOX).expect("read Debian's"),
    );
    let sh = std::fs::read_link(pulled.rootfs.join("bin/sh")).expect("/bin/sh is a link");
    assert_eq!(sh, Path::new("/bin/busybox"));
    let tmp = std::fs::metadata(pulled.rootfs.join("tmp"))
        .expect("/tmp")
        .permissions()
        .mode();
    assert_eq!(tmp & 0o7777, 0o1777);
    assert_eq!(pulled.config.cmd, ["sh"]);
    assert!(pulled.config.entrypoint.is_empty());
    assert!(
        pulled
            .config
            .env
            .iter()
            .any(|e| e.starts_with("PATH=") && e.contains("/bin"))
    );
    // The rootfs really runs: busybox's own shell, from the unpacked tree.
    let echoed = std::process::Command::new(&busybox)
        .args(["sh", "-c", "echo pulled"])
        .output()
        .expect("the unpacked busybox runs");
    assert_eq!(String::from_utf8_lossy(&echoed.stdout).trim(), "pulled");

    let again = store
        .pull(&image, &options(&registry, Vec::new()))
        .await
        .expect("the second pull");
    assert_eq!(again.fetched_blobs, 0, "only the manifest is fetched again");
    assert_eq!(again.digest, pulled.digest);
    assert_eq!(again.rootfs, pulled.rootfs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_with_basic_auth_refuses_a_pull_without_credentials_and_serves_one_with_them() {
    let auth = BasicAuth {
        user: "tenant".into(),
        password: "s3cret-pass".into(),
    };
    let registry = TestRegistry::start(Some(auth.clone()))
        .await
        .expect("the registry starts");
    let image = format!("{}/private/busybox:latest", registry.host());
    let busybox = images::busybox().expect("busybox builds");
    images::push(&busybox, &image, Some((&auth.user, &auth.password)))
        .await
        .expect("busybox is pushed with the credentials");
    let (_dir, store) = store();
    let credential = |server: &str, password: &str| RegistryCredential {
        server: server.to_owned(),
        user_name: auth.user.clone(),
        password: password.to_owned(),
    };

    let cases = [
        ("no credential", vec![]),
        (
            "a wrong password",
            vec![credential(registry.host(), "wrong")],
        ),
        (
            "another registry's credential",
            vec![credential("127.0.0.1:1", &auth.password)],
        ),
    ];
    for (case, credentials) in cases {
        let refused = store.pull(&image, &options(&registry, credentials)).await;
        let error = refused.expect_err(case);
        assert!(
            matches!(error, PullError::Denied { .. }),
            "{case}: {error:?}"
        );
        let failure = error.failure(&image);
        assert_eq!(failure.reason, "ErrImagePull", "{case}");
        assert!(
            failure
                .event_message
                .starts_with(&format!("Failed to pull image {image:?}: ")),
            "{case}: {}",
            failure.event_message
        );
    }

    let pulled = store
        .pull(
            &image,
            &options(&registry, vec![credential(registry.host(), &auth.password)]),
        )
        .await
        .expect("the pull with the credential");
    assert!(pulled.rootfs.join("bin/busybox").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_or_tag_fails_as_eci_reports_it() {
    let registry = TestRegistry::start(None)
        .await
        .expect("the registry starts");
    let present = format!("{}/library/busybox:1.35", registry.host());
    images::push(&images::busybox().expect("busybox builds"), &present, None)
        .await
        .expect("busybox is pushed");
    let (_dir, store) = store();
    for missing in [
        format!("{}/library/busybox:no-such-tag", registry.host()),
        format!("{}/library/no-such-image:latest", registry.host()),
    ] {
        let error = store
            .pull(&missing, &options(&registry, Vec::new()))
            .await
            .expect_err(&missing);
        assert!(
            matches!(error, PullError::NotFound { .. }),
            "{missing}: {error:?}"
        );
        let failure = error.failure(&missing);
        assert_eq!(failure.reason, "ErrImagePull");
        assert_eq!(failure.event_reason, "Failed");
        assert!(
            failure
                .message
                .starts_with(&format!("failed to pull image {missing:?}: "))
                && failure.message.ends_with("not found"),
            "{}",
            failure.message
        );
    }
}

/// Pushes a one-layer image of `layer` (an uncompressed tar) and pulls it into a fresh store.
async fn pull_layer(
    registry: &TestRegistry,
    name: &str,
    layers: &[Vec<u8>],
) -> (
    tempfile::TempDir,
    Result<mock_eci::images::PulledImage, PullError>,
) {
    let image = format!("{}/hostile/{name}:latest", registry.host());
    let built = BuiltImage::from_tars(layers, &RunConfig::default()).expect("the image builds");
    images::push(&built, &image, None)
        .await
        .expect("the image is pushed");
    let (dir, store) = store();
    let pulled = store.pull(&image, &options(registry, Vec::new())).await;
    (dir, pulled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_layer_writes_nothing_outside_the_rootfs() {
    let registry = TestRegistry::start(None)
        .await
        .expect("the registry starts");
    let outside = tempfile::tempdir().expect("a directory outside every store");
    let target = outside.path().display().to_string();

    // `../` in an entry's name: the layer is refused, the pull fails as ECI reports it.
    let mut dotdot = LayerBuilder::default();
    dotdot
        .raw(
            tar::EntryType::Regular,
            "../../../../../../../../../../../../../../tmp/escaped-by-dotdot",
            None,
            b"x",
        )
        .expect("entry");
    let relative_escape = format!("../../../../../../../../../..{target}/by-dotdot");
    dotdot
        .raw(tar::EntryType::Regular, &relative_escape, None, b"x")
        .expect("entry");
    let (_dir, pulled) = pull_layer(&registry, "dotdot", &[dotdot.finish().expect("tar")]).await;
    let error = pulled.expect_err("a layer with `..` is refused");
    assert!(matches!(error, PullError::Unpack { .. }), "{error:?}");
    assert!(
        error.failure("x").message.contains("escapes the rootfs"),
        "{error}"
    );

    // An absolute symlink to the outside directory, then entries written through it (in the
    // same layer and in the next): they land inside the rootfs, where the container sees them.
    let mut link = LayerBuilder::default();
    link.symlink("evil", &target).expect("entry");
    link.raw(tar::EntryType::Regular, "evil/through-link", None, b"x")
        .expect("entry");
    link.symlink("up", "../../../../../../../../../..")
        .expect("entry");
    let mut next = LayerBuilder::default();
    next.file("evil/next-layer", 0o644, b"x").expect("entry");
    let through_up = format!("up{target}/through-up");
    next.raw(tar::EntryType::Regular, &through_up, None, b"x")
        .expect("entry");
    next.raw(
        tar::EntryType::Link,
        "hardlinked",
        Some(&format!("up{target}/probe")),
        b"",
    )
    .expect("entry");
    std::fs::write(outside.path().join("probe"), "host file").expect("probe");
    let layers = [link.finish().expect("tar"), next.finish().expect("tar")];
    let (_dir, pulled) = pull_layer(&registry, "symlink", &layers).await;
    // The hard link names a file the rootfs does not have (its `probe` is outside): refused.
    let error = pulled.expect_err("a hard link to a host file is not made");
    assert!(matches!(error, PullError::Unpack { .. }), "{error:?}");

    let mut only_writes = LayerBuilder::default();
    only_writes.symlink("evil", &target).expect("entry");
    only_writes
        .raw(tar::EntryType::Regular, "evil/through-link", None, b"x")
        .expect("entry");
    only_writes
        .symlink("up", "../../../../../../../../../..")
        .expect("entry");
    only_writes
        .raw(tar::EntryType::Regular, &through_up, None, b"x")
        .expect("entry");
    let (_dir, pulled) =
        pull_layer(&registry, "writes", &[only_writes.finish().expect("tar")]).await;
    let pulled = pulled.expect("writes through links stay inside and succeed");
    let inside = pulled.rootfs.join(target.trim_start_matches('/'));
    assert!(
        inside.join("through-link").is_file(),
        "written inside the rootfs"
    );
    assert!(
        inside.join("through-up").is_file(),
        "written inside the rootfs"
    );

    let mut escaped: Vec<String> = std::fs::read_dir(outside.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    escaped.sort();
    assert_eq!(escaped, ["probe"], "nothing but the probe outside");
    assert!(!Path::new("/tmp/escaped-by-dotdot").exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("probe")).expect("probe"),
        "host file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whiteouts_remove_what_lower_layers_put_there() {
    let registry = TestRegistry::start(None)
        .await
        .expect("the registry starts");
    let mut lower = LayerBuilder::default();
    for dir in ["etc", "opaque", "opaque/sub"] {
        lower.dir(dir, 0o755).expect("entry");
    }
    lower.file("etc/removed", 0o644, b"lower").expect("entry");
    lower.file("etc/kept", 0o644, b"lower").expect("entry");
    lower.file("opaque/old", 0o644, b"lower").expect("entry");
    lower
        .file("opaque/sub/older", 0o644, b"lower")
        .expect("entry");
    let mut upper = LayerBuilder::default();
    upper.dir("opaque", 0o755).expect("entry");
    upper.file("opaque/new", 0o600, b"upper").expect("entry");
    upper
        .file("opaque/.wh..wh..opq", 0o644, b"")
        .expect("entry");
    upper.file("etc/.wh.removed", 0o644, b"").expect("entry");
    let layers = [lower.finish().expect("tar"), upper.finish().expect("tar")];
    let (_dir, pulled) = pull_layer(&registry, "whiteouts", &layers).await;
    let rootfs = pulled.expect("the image is pulled").rootfs;
    assert!(!rootfs.join("etc/removed").exists());
    assert!(rootfs.join("etc/kept").is_file());
    assert!(!rootfs.join("opaque/old").exists());
    assert!(!rootfs.join("opaque/sub").exists());
    assert_eq!(
        std::fs::read(rootfs.join("opaque/new")).expect("new"),
        b"upper"
    );
    let mode = std::fs::metadata(rootfs.join("opaque/new"))
        .expect("new")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!rootfs.join("opaque/.wh..wh..opq").exists());
    assert!(!rootfs.join("etc/.wh.removed").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_larger_than_the_unpack_limit_fails_and_leaves_no_rootfs() {
    let registry = TestRegistry::start(None)
        .await
        .expect("the registry starts");
    let image = format!("{}/library/busybox:1.35", registry.host());
    images::push(&images::busybox().expect("busybox builds"), &image, None)
        .await
        .expect("busybox is pushed");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path().join("store");
    let store = ImageStore::open(&root)
        .expect("the store opens")
        .with_unpack_limit(1 << 20);
    let error = store
        .pull(&image, &options(&registry, Vec::new()))
        .await
        .expect_err("busybox's 2 MB binary is over a 1 MiB limit");
    let message = error.failure(&image).message;
    assert!(
        message.contains("unpacks to more than 1048576 bytes"),
        "{message}"
    );
    let left: Vec<_> = std::fs::read_dir(root.join("images"))
        .expect("list")
        .chain(std::fs::read_dir(root.join("tmp")).expect("list"))
        .collect();
    assert!(
        left.is_empty(),
        "no rootfs, whole or half, is left: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_pulling_one_image_at_once_share_one_rootfs() {
    let registry = TestRegistry::start(None)
        .await
        .expect("the registry starts");
    let image = format!("{}/library/busybox:1.35", registry.host());
    images::push(&images::busybox().expect("busybox builds"), &image, None)
        .await
        .expect("busybox is pushed");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path().join("store");
    let store = ImageStore::open(&root).expect("the store opens");
    let pull_options = options(&registry, Vec::new());
    let pulls = (0..4).map(|_| store.pull(&image, &pull_options));
    let pulled: Vec<_> = futures::future::join_all(pulls)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("every concurrent pull succeeds");
    let rootfs = &pulled[0].rootfs;
    assert!(pulled.iter().all(|p| &p.rootfs == rootfs), "one rootfs");
    assert!(rootfs.join("bin/busybox").is_file());
    let images_dirs = std::fs::read_dir(root.join("images"))
        .expect("list")
        .count();
    assert_eq!(images_dirs, 1, "one unpacked image");
    let left: Vec<_> = std::fs::read_dir(root.join("tmp")).expect("list").collect();
    assert!(
        left.is_empty(),
        "no temporary blob or rootfs left: {left:?}"
    );
}

#[test]
fn the_library_layout_links_every_applet_in_bin_and_debians_follows_its_list() {
    let links = |applets| {
        let layer = images::busybox_layer(Path::new(images::DEBIAN_BUSYBOX), applets)
            .expect("the layer builds");
        let mut archive = tar::Archive::new(layer.as_slice());
        archive
            .entries()
            .expect("entries")
            .map(|entry| entry.expect("an entry"))
            .filter(|entry| entry.header().entry_type() == tar::EntryType::Symlink)
            .map(|entry| entry.path().expect("a path").display().to_string())
            .collect::<Vec<_>>()
    };
    let in_bin = links(images::Applets::AllInBin);
    assert!(in_bin.contains(&"bin/sysctl".to_owned()), "{in_bin:?}");
    assert!(
        in_bin.iter().all(|link| link.starts_with("bin/")),
        "{in_bin:?}"
    );
    let listed = links(images::Applets::Listed);
    assert!(listed.contains(&"sbin/sysctl".to_owned()), "{listed:?}");
    assert_eq!(in_bin.len(), listed.len(), "one link per applet either way");
}
