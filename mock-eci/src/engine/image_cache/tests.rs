#![allow(clippy::unwrap_used)]

use eci_proto::status::GroupStatus;
use eci_proto::v20180808::{Container, CreateContainerGroupRequest};

use super::*;
use crate::engine::Engine;

const T0: Millis = 1_700_000_000_000;

fn settings() -> Settings {
    Settings {
        image_cache_creation: "10s".parse().unwrap(),
        ..Settings::default()
    }
}

fn create_request(name: &str, images: &[&str]) -> CreateImageCacheRequest {
    CreateImageCacheRequest {
        region_id: "cn-hangzhou".into(),
        image_cache_name: name.into(),
        image: images.iter().map(|i| (*i).to_owned()).collect(),
        ..CreateImageCacheRequest::default()
    }
}

fn describe_request() -> DescribeImageCachesRequest {
    DescribeImageCachesRequest {
        region_id: "cn-hangzhou".into(),
        ..DescribeImageCachesRequest::default()
    }
}

fn status(caches: &mut ImageCaches, id: &str, now: Millis) -> Option<&'static str> {
    caches.advance(now);
    caches.get(id).map(|cache| cache.state.as_str())
}

fn ids(answer: &DescribeImageCachesResponse) -> Vec<String> {
    answer
        .image_caches
        .iter()
        .map(|cache| cache.image_cache_name.clone())
        .collect()
}

#[test]
fn a_cache_is_created_over_time_then_ready() {
    let settings = settings();
    let mut caches = ImageCaches::default();
    let id = caches
        .create(&create_request("web", &["nginx:1.25"]), &settings, T0)
        .unwrap();
    assert!(id.starts_with("imc-"), "{id}");
    assert_eq!(status(&mut caches, &id, T0 + 9_999), Some("Creating"));
    assert_eq!(status(&mut caches, &id, T0 + 10_000), Some("Ready"));
    let cache = caches.get(&id).unwrap();
    let reasons: Vec<&str> = cache.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Creating", "Pulled", "Ready"]);
    assert_eq!(cache.events[2].first, T0 + 10_000);
    assert_eq!(cache.expires_at(), None);
}

#[test]
fn an_image_that_cannot_be_pulled_fails_the_cache_which_is_gone_a_day_later() {
    let settings = settings();
    let mut caches = ImageCaches::default();
    let bad = format!("{PULL_FAIL_REGISTRY}/app:1");
    let id = caches
        .create(&create_request("bad", &["nginx", &bad]), &settings, T0)
        .unwrap();
    assert_eq!(status(&mut caches, &id, T0 + 10_000), Some("Failed"));
    let last = caches.get(&id).unwrap().events.last().unwrap().clone();
    assert_eq!(
        (last.kind.as_str(), last.reason.as_str()),
        ("Warning", "Failed")
    );
    assert!(last.message.contains(&bad), "{}", last.message);
    let source = caches.source_for(&id, false, &["nginx"]).unwrap_err();
    assert_eq!(source.code, codes::INCORRECT_STATUS);
    assert!(source.message.contains("Failed"), "{}", source.message);
    assert_eq!(
        status(&mut caches, &id, T0 + 10_000 + DAY_MS - 1),
        Some("Failed")
    );
    assert_eq!(status(&mut caches, &id, T0 + 10_000 + DAY_MS), None);
}

#[test]
fn retention_days_delete_the_cache_when_they_pass() {
    let settings = settings();
    let mut caches = ImageCaches::default();
    let mut request = create_request("kept", &["nginx"]);
    request.retention_days = Some(2);
    let id = caches.create(&request, &settings, T0).unwrap();
    assert_eq!(status(&mut caches, &id, T0 + 2 * DAY_MS - 1), Some("Ready"));
    assert_eq!(status(&mut caches, &id, T0 + 2 * DAY_MS), None);
}

#[test]
fn creates_are_validated_and_client_tokens_make_them_idempotent() {
    let settings = settings();
    let mut caches = ImageCaches::default();
    type Change = fn(&mut CreateImageCacheRequest);
    let cases: &[(&str, Change, &str)] = &[
        ("no image", |r| r.image.clear(), "MissingParameter"),
        (
            "empty image",
            |r| r.image = vec![" ".into()],
            "InvalidParameter.Image.1",
        ),
        (
            "no name",
            |r| r.image_cache_name.clear(),
            "MissingParameter",
        ),
        (
            "bad name",
            |r| r.image_cache_name = "Web_1".into(),
            "InvalidParameter.ImageCacheName",
        ),
        (
            "small",
            |r| r.image_cache_size = Some(19),
            "InvalidParameter.ImageCacheSize",
        ),
        (
            "retention",
            |r| r.retention_days = Some(0),
            "InvalidParameter.RetentionDays",
        ),
        (
            "strategy",
            |r| r.elimination_strategy = "FIFO".into(),
            "InvalidParameter.EliminationStrategy",
        ),
        (
            "region",
            |r| r.region_id = "cn-beijing".into(),
            codes::INVALID_REGION_ID,
        ),
    ];
    for (case, change, code) in cases {
        let mut request = create_request("web", &["nginx"]);
        change(&mut request);
        let error = caches.create(&request, &settings, T0).unwrap_err();
        assert_eq!(error.code, *code, "{case}: {}", error.message);
    }
    assert!(caches.is_empty());
    let mut request = create_request("web", &["nginx"]);
    request.client_token = "token-1".into();
    let first = caches.create(&request, &settings, T0).unwrap();
    assert_eq!(caches.create(&request, &settings, T0 + 1).unwrap(), first);
    request.image.push("redis".into());
    let error = caches.create(&request, &settings, T0 + 2).unwrap_err();
    assert_eq!(error.code, codes::IDEMPOTENT_PARAMETER_MISMATCH);
    assert_eq!(caches.len(), 1);
}

#[test]
fn updates_rename_at_once_and_rebuild_for_new_images() {
    let settings = settings();
    let mut caches = ImageCaches::default();
    let id = caches
        .create(&create_request("web", &["nginx"]), &settings, T0)
        .unwrap();
    let mut update = UpdateImageCacheRequest {
        region_id: "cn-hangzhou".into(),
        image_cache_id: id.clone(),
        image_cache_name: "web-2".into(),
        ..UpdateImageCacheRequest::default()
    };
    let busy = caches.update(&update, &settings, T0 + 1).unwrap_err();
    assert_eq!(busy.code, codes::INCORRECT_STATUS, "{}", busy.message);
    caches.update(&update, &settings, T0 + 10_000).unwrap();
    assert_eq!(caches.get(&id).unwrap().name, "web-2");
    assert_eq!(caches.get(&id).unwrap().state, CacheState::Ready);
    update.image = vec!["nginx".into(), "redis:7".into()];
    caches.update(&update, &settings, T0 + 20_000).unwrap();
    assert_eq!(status(&mut caches, &id, T0 + 29_999), Some("Updating"));
    assert_eq!(status(&mut caches, &id, T0 + 30_000), Some("Ready"));
    assert!(caches.get(&id).unwrap().holds("docker.io/library/redis:7"));
    update.image = vec![format!("{PULL_FAIL_REGISTRY}/x:1")];
    caches.update(&update, &settings, T0 + 40_000).unwrap();
    assert_eq!(status(&mut caches, &id, T0 + 50_000), Some("UpdateFailed"));
    update.image_cache_id = "imc-none".into();
    let missing = caches.update(&update, &settings, T0 + 50_000).unwrap_err();
    assert_eq!(missing.code, IMAGE_CACHE_NOT_FOUND);
}

#[test]
fn delete_removes_and_then_names_the_missing_cache() {
    let settings = settings();
    let mut caches = ImageCaches::default();
    let id = caches
        .create(&create_request("web", &["nginx"]), &settings, T0)
        .unwrap();
    let delete = DeleteImageCacheRequest {
        region_id: "cn-hangzhou".into(),
        image_cache_id: id.clone(),
        client_token: String::new(),
    };
    caches.delete(&delete, &settings, T0 + 1).unwrap();
    assert!(caches.get(&id).is_none());
    let again = caches.delete(&delete, &settings, T0 + 2).unwrap_err();
    assert_eq!(again.code, IMAGE_CACHE_NOT_FOUND);
    assert!(again.message.contains(&id), "{}", again.message);
    // The deleted build's settle time passes without trouble.
    caches.advance(T0 + 60_000);
    assert!(caches.is_empty());
}

/// Three Ready caches: `a` (nginx), `b` (nginx, redis), `c` (busybox, tagged), and a
/// Creating one, `d` (nginx).
fn four_caches() -> (ImageCaches, Vec<String>) {
    let settings = settings();
    let mut caches = ImageCaches::default();
    let mut ids = Vec::new();
    for (at, name, images) in [
        (T0, "a", &["nginx:latest"][..]),
        (T0 + 1, "b", &["docker.io/library/nginx", "redis:7"]),
        (T0 + 2, "c", &["busybox"]),
        (T0 + 20_000, "d", &["nginx"]),
    ] {
        let mut request = create_request(&format!("cache-{name}"), images);
        if name == "c" {
            request.tag = vec![Tag {
                key: "team".into(),
                value: "x".into(),
            }];
        }
        ids.push(caches.create(&request, &settings, at).unwrap());
    }
    (caches, ids)
}

#[test]
fn describe_filters_by_id_name_snapshot_image_and_tag() {
    let settings = settings();
    let (mut caches, created) = four_caches();
    let now = T0 + 20_001;
    let answer = |caches: &mut ImageCaches, change: &dyn Fn(&mut DescribeImageCachesRequest)| {
        let mut request = describe_request();
        change(&mut request);
        let mut names = ids(&caches.describe(&request, &settings, now).unwrap());
        names.sort();
        names
    };
    assert_eq!(answer(&mut caches, &|_| {}).len(), 4);
    let two = format!("{},{}", created[0], created[2]);
    assert_eq!(
        answer(&mut caches, &|r| r.image_cache_id = two.clone()),
        ["cache-a", "cache-c"]
    );
    assert_eq!(
        answer(&mut caches, &|r| r.image_cache_name = "cache-b".into()),
        ["cache-b"]
    );
    let snapshot = caches.get(&created[1]).unwrap().snapshot_id.clone();
    assert_eq!(
        answer(&mut caches, &|r| r.snapshot_id = snapshot.clone()),
        ["cache-b"]
    );
    assert_eq!(
        answer(&mut caches, &|r| r.image = "nginx".into()),
        ["cache-a", "cache-b", "cache-d"]
    );
    assert_eq!(
        answer(&mut caches, &|r| r.tag = vec![Tag {
            key: "team".into(),
            value: "x".into()
        }]),
        ["cache-c"]
    );
    let view = caches
        .describe(&describe_request(), &settings, now)
        .unwrap();
    let d = view
        .image_caches
        .iter()
        .find(|c| c.image_cache_name == "cache-d")
        .unwrap();
    assert_eq!((d.status.as_str(), d.progress.as_str()), ("Creating", "0%"));
    assert_eq!(d.events[0].name, "imagecache.cache-d");
}

#[test]
fn match_image_ranks_ready_caches_by_images_held() {
    let settings = settings();
    let (mut caches, _) = four_caches();
    let now = T0 + 20_001;
    let mut request = describe_request();
    request.match_image = vec!["nginx".into(), "redis:7".into()];
    let answer = caches.describe(&request, &settings, now).unwrap();
    // `d` holds nginx but is not Ready; `b` holds both, `a` one.
    assert_eq!(ids(&answer), ["cache-b", "cache-a"]);
    assert_eq!(answer.total_count, 2);
    request.image_match_count_request = Some(1);
    assert_eq!(
        ids(&caches.describe(&request, &settings, now).unwrap()),
        ["cache-b"]
    );
    request.image_match_count_request = None;
    request.image_full_match = true;
    assert_eq!(
        ids(&caches.describe(&request, &settings, now).unwrap()),
        ["cache-b"]
    );
    request.image_match_count_request = Some(0);
    let error = caches.describe(&request, &settings, now).unwrap_err();
    assert_eq!(error.code, "InvalidParameter.ImageMatchCountRequest");
}

#[test]
fn describe_pages_in_id_order_with_next_token() {
    let settings = settings();
    let (mut caches, mut created) = four_caches();
    created.sort();
    let mut request = describe_request();
    request.limit = Some(3);
    let first = caches.describe(&request, &settings, T0).unwrap();
    let first_ids: Vec<&str> = first
        .image_caches
        .iter()
        .map(|c| c.image_cache_id.as_str())
        .collect();
    assert_eq!(first_ids, created[..3]);
    assert_eq!(first.total_count, 4);
    assert_eq!(first.next_token, created[2]);
    request.next_token = first.next_token;
    let second = caches.describe(&request, &settings, T0).unwrap();
    assert_eq!(second.image_caches[0].image_cache_id, created[3]);
    assert!(second.next_token.is_empty());
    request.next_token = "eci-x".into();
    let error = caches.describe(&request, &settings, T0).unwrap_err();
    assert_eq!(error.code, "InvalidParameter.NextToken");
    request.next_token.clear();
    request.limit = Some(101);
    assert_eq!(
        caches.describe(&request, &settings, T0).unwrap_err().code,
        "InvalidParameter.Limit"
    );
}

#[test]
fn a_group_finds_its_cache_by_id_or_by_matching() {
    let (mut caches, created) = four_caches();
    caches.advance(T0 + 20_001);
    let unknown = caches
        .source_for("imc-none", false, &["nginx"])
        .unwrap_err();
    assert_eq!(unknown.code, IMAGE_CACHE_NOT_FOUND);
    assert!(
        unknown.message.contains("ImageSnapshotId"),
        "{}",
        unknown.message
    );
    let creating = caches
        .source_for(&created[3], false, &["nginx"])
        .unwrap_err();
    assert_eq!(creating.code, codes::INCORRECT_STATUS);
    assert_eq!(
        caches.source_for(&created[0], false, &["nginx"]).unwrap(),
        ImageSource::Cache {
            id: created[0].clone()
        }
    );
    assert_eq!(
        caches
            .source_for(&created[0], false, &["nginx", "redis:7"])
            .unwrap(),
        ImageSource::PartialCache {
            id: created[0].clone(),
            pulled: vec!["redis:7".into()]
        }
    );
    assert_eq!(
        caches.source_for("", true, &["redis:7", "nginx"]).unwrap(),
        ImageSource::Cache {
            id: created[1].clone()
        }
    );
    assert_eq!(
        caches.source_for("", true, &["nginx", "busybox"]).unwrap(),
        ImageSource::Missed
    );
    assert_eq!(
        caches.source_for("", false, &["nginx"]).unwrap(),
        ImageSource::Pull
    );
}

#[test]
fn image_references_compare_in_canonical_form() {
    let cases = [
        ("nginx", "docker.io/library/nginx:latest"),
        ("nginx:1.25", "docker.io/library/nginx:1.25"),
        ("library/nginx", "docker.io/library/nginx:latest"),
        (
            "registry.example.com/app",
            "registry.example.com/app:latest",
        ),
        ("localhost:5000/app:2", "localhost:5000/app:2"),
        ("repo/app@sha256:ab", "docker.io/repo/app@sha256:ab"),
    ];
    for (image, canonical) in cases {
        assert_eq!(canonical_image(image), canonical, "{image}");
    }
}

fn group_request(name: &str, image: &str) -> CreateContainerGroupRequest {
    CreateContainerGroupRequest {
        region_id: "cn-hangzhou".into(),
        security_group_id: "sg-1".into(),
        v_switch_id: "vsw-1".into(),
        container_group_name: name.into(),
        container: vec![Container {
            name: "app".into(),
            image: image.into(),
            ..Container::default()
        }],
        ..CreateContainerGroupRequest::default()
    }
}

/// How long after `from` each of `ids` reaches Running, probing every 100 ms.
fn time_to_running(engine: &mut Engine, ids: &[&str], from: Millis) -> Vec<Millis> {
    let mut reached = vec![None; ids.len()];
    for at in (0..200).map(|step| from + step * 100) {
        let groups = engine.all_groups(at);
        for (index, id) in ids.iter().enumerate() {
            let running = groups
                .iter()
                .any(|g| g.container_group_id == *id && g.status == GroupStatus::Running.as_str());
            if running && reached[index].is_none() {
                reached[index] = Some(at - from);
            }
        }
    }
    reached.into_iter().map(Option::unwrap).collect()
}

#[test]
fn a_group_from_a_ready_cache_starts_without_the_pull_and_says_so() {
    let mut engine = Engine::new(Settings {
        provisioning: "3s".parse().unwrap(),
        ..settings()
    });
    let cache = engine
        .create_image_cache(&create_request("web", &["nginx:1.25"]), T0)
        .unwrap();
    let mut early = group_request("early", "nginx:1.25");
    early.image_snapshot_id = cache.clone();
    let refused = engine.create(early, T0 + 1).unwrap_err();
    assert_eq!(refused.code, codes::INCORRECT_STATUS);
    assert!(engine.is_empty());

    let start = T0 + 10_000;
    let plain = engine
        .create(group_request("plain", "nginx:1.25"), start)
        .unwrap();
    let mut cached = group_request("cached", "nginx:1.25");
    cached.auto_match_image_cache = true;
    let cached = engine.create(cached, start).unwrap();
    let mut missed = group_request("missed", "redis:7");
    missed.auto_match_image_cache = true;
    let missed = engine.create(missed, start).unwrap();
    assert_eq!(
        time_to_running(&mut engine, &[&plain, &cached], start),
        [3_000, 1_000]
    );
    let groups = engine.all_groups(start + 5_000);
    let events_of = |id: &str| {
        groups
            .iter()
            .find(|g| g.container_group_id == id)
            .unwrap()
            .events
            .iter()
            .map(|e| (e.reason.clone(), e.r#type.clone(), e.message.clone()))
            .collect::<Vec<_>>()
    };
    let used = events_of(&cached);
    assert!(
        used.iter()
            .any(|(reason, kind, message)| reason == events::HIT_IMAGE_CACHE
                && kind == "Normal"
                && events::hit_image_cache_id(message) == Some(cache.as_str())),
        "{used:?}"
    );
    // Without AutoMatchImageCache nothing is said; with it and no cache, ECI's warning.
    assert!(
        events_of(&plain)
            .iter()
            .all(|(reason, ..)| !reason.contains("ImageCache"))
    );
    let missed = events_of(&missed);
    assert!(
        missed
            .iter()
            .any(|(reason, kind, _)| reason == events::IMAGE_CACHE_MISSED && kind == "Warning"),
        "{missed:?}"
    );
    let view = engine
        .describe_image_caches(&describe_request(), start + 5_000)
        .unwrap();
    assert!(!view.image_caches[0].last_matched_time.is_empty());
}

#[test]
fn caches_survive_a_snapshot_with_their_agenda() {
    let mut engine = Engine::new(settings());
    let id = engine
        .create_image_cache(&create_request("web", &["nginx"]), T0)
        .unwrap();
    let snapshot = engine.snapshot(T0 + 1);
    let json = serde_json::to_string(&snapshot).unwrap();
    let mut restored = Engine::restore(settings(), serde_json::from_str(&json).unwrap());
    let view = restored
        .describe_image_caches(&describe_request(), T0 + 10_000)
        .unwrap();
    assert_eq!(view.image_caches[0].image_cache_id, id);
    assert_eq!(view.image_caches[0].status, "Ready");
    let second = restored
        .create_image_cache(&create_request("other", &["nginx"]), T0 + 10_000)
        .unwrap();
    assert_ne!(second, id);
}
