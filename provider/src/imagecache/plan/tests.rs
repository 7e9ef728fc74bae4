use std::time::{Duration, SystemTime};

use eci_proto::v20180808::{Event, ImageCache as EciImageCache};

use super::*;

const UID: &str = "6f1c2b1e-0000-4000-8000-000000000001";

fn spec(images: &[&str]) -> ImageCacheSpec {
    ImageCacheSpec {
        images: images.iter().map(|i| (*i).to_owned()).collect(),
        ..ImageCacheSpec::default()
    }
}

fn resource<'a>(
    spec: &'a ImageCacheSpec,
    status: Option<&'a ImageCacheStatus>,
    generation: i64,
) -> Resource<'a> {
    Resource {
        name: "web.cache",
        uid: UID,
        generation,
        spec,
        status,
        deleting: false,
    }
}

fn cache(status: &str, images: &[&str]) -> EciImageCache {
    EciImageCache {
        image_cache_id: "imc-1".into(),
        status: status.into(),
        progress: if status == "Ready" { "100%" } else { "0%" }.into(),
        images: images.iter().map(|i| (*i).to_owned()).collect(),
        image_cache_size: 20,
        creation_time: "2026-11-29T04:00:00Z".into(),
        expire_date_time: "2026-12-06T04:00:00Z".into(),
        events: vec![Event {
            count: 1,
            r#type: "Normal".into(),
            reason: "Ready".into(),
            message: "ready".into(),
            first_timestamp: "2026-11-29T04:00:10Z".into(),
            last_timestamp: "2026-11-29T04:00:10Z".into(),
            ..Event::default()
        }],
        ..EciImageCache::default()
    }
}

fn recorded(generation: i64, expires: Option<&str>) -> ImageCacheStatus {
    ImageCacheStatus {
        phase: Some("Ready".into()),
        image_cache_id: Some("imc-1".into()),
        observed_generation: Some(generation),
        expire_date_time: expires.map(str::to_owned),
        ..ImageCacheStatus::default()
    }
}

fn at(text: &str) -> SystemTime {
    humantime::parse_rfc3339(text).unwrap()
}

fn create(generation: i64, images: &[&str]) -> Step {
    Step::Create(Build {
        name: "web-cache".into(),
        images: images.iter().map(|i| (*i).to_owned()).collect(),
        size_gib: None,
        retention_days: None,
        client_token: format!("{UID}-{generation}"),
    })
}

#[test]
fn each_situation_has_its_step() {
    let now = at("2026-11-30T00:00:00Z");
    let one = spec(&["nginx:1"]);
    let two = spec(&["nginx:1", "redis:7"]);
    let (ready, creating, failed) = (
        cache("Ready", &["nginx:1"]),
        cache("Creating", &["nginx:1"]),
        cache("Failed", &["nginx:1"]),
    );
    let (built_1, built_2) = (recorded(1, None), recorded(2, None));
    let expired_1 = recorded(1, Some("2026-11-29T12:00:00Z"));
    let update = |generation| Step::Update {
        id: "imc-1".into(),
        build: match create(generation, &["nginx:1", "redis:7"]) {
            Step::Create(build) => build,
            _ => unreachable!(),
        },
    };
    let cases: Vec<(&str, Resource<'_>, Observed<'_>, Step)> = vec![
        (
            "new resource",
            resource(&one, None, 1),
            Observed::NotCreated,
            create(1, &["nginx:1"]),
        ),
        (
            "ECI builds it",
            resource(&one, Some(&built_1), 1),
            Observed::Found(&creating),
            Step::Wait,
        ),
        (
            "ready, unchanged",
            resource(&one, Some(&built_1), 1),
            Observed::Found(&ready),
            Step::Settled,
        ),
        (
            "failed stays failed",
            resource(&one, Some(&built_1), 1),
            Observed::Found(&failed),
            Step::Settled,
        ),
        (
            "images added",
            resource(&two, Some(&built_1), 2),
            Observed::Found(&ready),
            update(2),
        ),
        (
            "failed, then images changed",
            resource(&two, Some(&built_1), 2),
            Observed::Found(&failed),
            update(2),
        ),
        (
            "generation moved, same images",
            resource(&one, Some(&built_1), 2),
            Observed::Found(&ready),
            Step::Settled,
        ),
        (
            "updated already",
            resource(&two, Some(&built_2), 2),
            Observed::Found(&ready),
            Step::Settled,
        ),
        (
            "building, spec moved",
            resource(&two, Some(&built_1), 2),
            Observed::Found(&creating),
            Step::Wait,
        ),
        (
            "deleted out of band",
            resource(&one, Some(&built_1), 1),
            Observed::Gone,
            create(1, &["nginx:1"]),
        ),
        (
            "expired",
            resource(&one, Some(&expired_1), 1),
            Observed::Gone,
            Step::Settled,
        ),
        (
            "expired, then spec changed",
            resource(&two, Some(&expired_1), 2),
            Observed::Gone,
            create(2, &["nginx:1", "redis:7"]),
        ),
    ];
    for (case, resource, observed, want) in cases {
        assert_eq!(plan(&resource, observed, now), want, "{case}");
    }
}

#[test]
fn deletion_deletes_the_cache_then_releases() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
    let one = spec(&["nginx:1"]);
    let built = recorded(1, None);
    let ready = cache("Ready", &["nginx:1"]);
    let mut deleting = resource(&one, Some(&built), 1);
    deleting.deleting = true;
    assert_eq!(
        plan(&deleting, Observed::Found(&ready), now),
        Step::Delete { id: "imc-1".into() }
    );
    assert_eq!(plan(&deleting, Observed::Gone, now), Step::Release);
    deleting.status = None;
    assert_eq!(plan(&deleting, Observed::NotCreated, now), Step::Release);
}

#[test]
fn names_fit_eci_s_alphabet() {
    for (name, want) in [
        ("web", "web"),
        ("web.cache.v2", "web-cache-v2"),
        ("a", "ic-a"),
        ("-x.", "ic-x"),
        (&"n".repeat(300), &"n".repeat(128)),
    ] {
        assert_eq!(cache_name(name), want, "{name}");
    }
}

#[test]
fn the_status_follows_eci_and_moves_its_time_only_on_change() {
    let one = spec(&["nginx:1"]);
    let res = resource(&one, None, 1);
    let created = status(
        &res,
        Observed::NotCreated,
        &create(1, &["nginx:1"]),
        Some("imc-1"),
        "t1",
    );
    assert_eq!(created.phase.as_deref(), Some(PENDING));
    assert_eq!(created.image_cache_id.as_deref(), Some("imc-1"));
    assert_eq!(created.observed_generation, Some(1));
    assert_eq!(created.last_updated_time.as_deref(), Some("t1"));

    let res = resource(&one, Some(&created), 1);
    let ready = cache("Ready", &["nginx:1"]);
    let shown = status(&res, Observed::Found(&ready), &Step::Settled, None, "t2");
    assert_eq!(shown.phase.as_deref(), Some("Ready"));
    assert_eq!(shown.progress.as_deref(), Some("100%"));
    assert_eq!(shown.start_time.as_deref(), Some("2026-11-29T04:00:00Z"));
    assert_eq!(
        shown.expire_date_time.as_deref(),
        Some("2026-12-06T04:00:00Z")
    );
    assert_eq!(shown.events[0].reason, "Ready");
    assert_eq!(shown.last_updated_time.as_deref(), Some("t2"));

    let res = resource(&one, Some(&shown), 1);
    let again = status(&res, Observed::Found(&ready), &Step::Settled, None, "t3");
    assert_eq!(
        again, shown,
        "nothing changed: the same status, the same time"
    );

    let gone = status(&res, Observed::Gone, &Step::Settled, None, "t4");
    assert_eq!(gone.phase.as_deref(), Some(EXPIRED));
    assert_eq!(gone.last_updated_time.as_deref(), Some("t4"));
}
