//! What the image-cache reconciler does about one `ImageCache`, and the status it writes
//! (pure: the Kubernetes and ECI calls are the caller's).
//!
//! Level-triggered: every pass looks at the resource as it is (spec, generation, the cache id
//! its status recorded, whether it is being deleted) and at the ECI cache as DescribeImageCaches
//! shows it, and picks one [`Step`]. A cache is created once per resource — the `ClientToken`
//! is the resource's uid and generation, so a create retried after a lost answer returns the
//! same cache — rebuilt in place when the images, size or retention change, left alone while
//! ECI builds it, and deleted before the resource's finalizer is released.

use std::time::SystemTime;

use eci_proto::v20180808::ImageCache as EciImageCache;

use super::resource::{ImageCacheEvent, ImageCacheSpec, ImageCacheStatus};

/// ECI's phases of a cache still being built.
const BUILDING: [&str; 3] = ["Preparing", "Creating", "Updating"];
/// The phase reported before ECI has a cache for the resource.
pub const PENDING: &str = "Pending";
/// The phase reported once ECI removed the cache at the end of its retention.
pub const EXPIRED: &str = "Expired";

/// The resource, as the reconciler reads it.
#[derive(Debug, Clone, Copy)]
pub struct Resource<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `metadata.generation`.
    pub generation: i64,
    /// The spec.
    pub spec: &'a ImageCacheSpec,
    /// The status written last, if any.
    pub status: Option<&'a ImageCacheStatus>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

/// What ECI shows of the resource's cache.
#[derive(Debug, Clone, Copy)]
pub enum Observed<'a> {
    /// The status names no cache: none was created yet.
    NotCreated,
    /// The status names a cache ECI no longer has.
    Gone,
    /// The cache.
    Found(&'a EciImageCache),
}

/// What to build (CreateImageCache / UpdateImageCache parameters the spec decides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// `ImageCacheName`: the resource's name in ECI's alphabet.
    pub name: String,
    /// `Image.N`.
    pub images: Vec<String>,
    /// `ImageCacheSize` (GiB).
    pub size_gib: Option<i32>,
    /// `RetentionDays`.
    pub retention_days: Option<i32>,
    /// `ClientToken`: one per resource and generation.
    pub client_token: String,
}

/// One pass's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// CreateImageCache, then record its id (with `generation` observed).
    Create(Build),
    /// UpdateImageCache of cache `id` to the spec.
    Update {
        /// The cache.
        id: String,
        /// The spec's build.
        build: Build,
    },
    /// ECI is building it: look again soon.
    Wait,
    /// Nothing to change: the status follows what ECI shows.
    Settled,
    /// DeleteImageCache of `id`; the finalizer goes once it is gone.
    Delete {
        /// The cache.
        id: String,
    },
    /// Being deleted with no cache left: release the finalizer.
    Release,
}

/// `name` in ECI's alphabet for cache names: 2-128 of `[a-z0-9-]`, not starting or ending
/// with `-` (a Kubernetes name may hold dots and be as short as one character).
pub fn cache_name(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(128)
        .collect();
    let trimmed = mapped.trim_matches('-');
    if trimmed.len() < 2 {
        format!("ic-{trimmed}").trim_end_matches('-').to_owned()
    } else {
        trimmed.to_owned()
    }
}

fn build(resource: &Resource<'_>) -> Build {
    Build {
        name: cache_name(resource.name),
        images: resource.spec.images.clone(),
        size_gib: resource.spec.image_cache_size,
        retention_days: resource.spec.retention_days,
        client_token: format!("{}-{}", resource.uid, resource.generation),
    }
}

/// Whether `cache` already is what `spec` asks for: its images and size. (ECI's answer shows no
/// retention, only the expiry it led to: a change of `retentionDays` alone is not compared.)
fn matches_spec(cache: &EciImageCache, spec: &ImageCacheSpec) -> bool {
    let mut held = cache.images.clone();
    let mut wanted = spec.images.clone();
    held.sort();
    wanted.sort();
    held == wanted
        && spec
            .image_cache_size
            .is_none_or(|size| size == cache.image_cache_size)
}

/// The step for `resource` given what ECI shows at `now`.
pub fn plan(resource: &Resource<'_>, observed: Observed<'_>, now: SystemTime) -> Step {
    let recorded = resource
        .status
        .and_then(|status| status.image_cache_id.clone());
    if resource.deleting {
        return match (observed, recorded) {
            (Observed::Found(cache), _) => Step::Delete {
                id: cache.image_cache_id.clone(),
            },
            _ => Step::Release,
        };
    }
    match observed {
        // Removed at the end of its retention (or a day after failing): recreating it would
        // undo that, unless the spec changed since.
        Observed::Gone if expired(resource, now) => Step::Settled,
        // Never created, or deleted out of band.
        Observed::NotCreated | Observed::Gone => Step::Create(build(resource)),
        Observed::Found(cache) if BUILDING.contains(&cache.status.as_str()) => Step::Wait,
        Observed::Found(cache) => {
            let built_from = resource.status.and_then(|s| s.observed_generation);
            let spec_moved = built_from != Some(resource.generation);
            if spec_moved && !matches_spec(cache, resource.spec) {
                Step::Update {
                    id: cache.image_cache_id.clone(),
                    build: build(resource),
                }
            } else {
                Step::Settled
            }
        }
    }
}

/// Whether the cache the status records reached its expiry, for the spec it was built from.
fn expired(resource: &Resource<'_>, now: SystemTime) -> bool {
    resource.status.is_some_and(|status| {
        status.observed_generation == Some(resource.generation)
            && status
                .expire_date_time
                .as_deref()
                .and_then(|at| humantime::parse_rfc3339_weak(at).ok())
                .is_some_and(|at| at <= now)
    })
}

/// The status to write after `step`: what ECI shows, the cache id, and `now` as the last
/// update when anything else changed. `created` is the id a Create just returned.
pub fn status(
    resource: &Resource<'_>,
    observed: Observed<'_>,
    step: &Step,
    created: Option<&str>,
    now: &str,
) -> ImageCacheStatus {
    let before = resource.status.cloned().unwrap_or_default();
    let mut next = before.clone();
    match (step, observed) {
        (Step::Create(_), _) => {
            next = ImageCacheStatus {
                phase: Some(PENDING.to_owned()),
                image_cache_id: created.map(str::to_owned),
                observed_generation: Some(resource.generation),
                ..ImageCacheStatus::default()
            };
        }
        (_, Observed::Found(cache)) => {
            next.phase = Some(cache.status.clone());
            next.progress = Some(cache.progress.clone()).filter(|p| !p.is_empty());
            next.image_cache_id = Some(cache.image_cache_id.clone());
            next.start_time = Some(cache.creation_time.clone()).filter(|t| !t.is_empty());
            next.expire_date_time = Some(cache.expire_date_time.clone()).filter(|t| !t.is_empty());
            next.events = cache.events.iter().map(event).collect();
            // Settled means the cache is what this generation asks for (or it failed for it).
            if matches!(step, Step::Update { .. } | Step::Settled) {
                next.observed_generation = Some(resource.generation);
            }
        }
        (Step::Settled, Observed::Gone) => next.phase = Some(EXPIRED.to_owned()),
        _ => {}
    }
    next.last_updated_time = before.last_updated_time.clone();
    if next != before || next.last_updated_time.is_none() {
        next.last_updated_time = Some(now.to_owned());
    }
    next
}

fn event(event: &eci_proto::v20180808::Event) -> ImageCacheEvent {
    ImageCacheEvent {
        kind: event.r#type.clone(),
        reason: event.reason.clone(),
        message: event.message.clone(),
        count: event.count,
        first_timestamp: event.first_timestamp.clone(),
        last_timestamp: event.last_timestamp.clone(),
    }
}

#[cfg(test)]
mod tests;
