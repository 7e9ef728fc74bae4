//! Image caches: CreateImageCache, DescribeImageCaches, UpdateImageCache, DeleteImageCache, and
//! the choice of a cache for a new container group (`ImageSnapshotId`, `AutoMatchImageCache`).
//!
//! A cache is built over time like a group is provisioned: `Creating` for
//! [`Settings::image_cache_creation`], then `Ready`, or `Failed` when one of its images cannot
//! be pulled (an image of [`PULL_FAIL_REGISTRY`], or no image reference at all). An update with
//! new images rebuilds it (`Updating`, then `Ready` or `UpdateFailed`). A cache with
//! `RetentionDays` is deleted when they have passed; a failed one after a day, as the service
//! documents. The service's intermediate instance that builds a cache is not modelled: the
//! answer's `ContainerGroupId` stays empty.
//!
//! Event reasons and messages on caches and on groups created from one are this fake's own
//! wording (the service's is not in the references the project keeps).
//!
//! Pure: every function takes the time; transitions due by then are applied in order.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use eci_proto::EciError;
use eci_proto::error::codes;
use eci_proto::events;
use eci_proto::v20180808::{
    CreateImageCacheRequest, DeleteImageCacheRequest, DescribeImageCachesRequest,
    DescribeImageCachesResponse, Event, ImageCache as ImageCacheView, Tag, UpdateImageCacheRequest,
};
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::clock::{Millis, rfc3339};
use crate::engine::behaviour::PULL_FAIL_REGISTRY;
use crate::engine::group::GroupEvent;
use crate::engine::{render, validate};
use crate::rng;
use crate::settings::Settings;

/// ECI code of an image cache id that names no cache (this fake's spelling, after
/// `InvalidContainerGroup.NotFound`).
pub const IMAGE_CACHE_NOT_FOUND: &str = "InvalidImageCache.NotFound";

/// `ImageCacheSize` when the request gives none, and its bounds (GiB).
const DEFAULT_SIZE_GIB: i32 = 20;
const SIZE_GIB: std::ops::RangeInclusive<i32> = 20..=32_768;
/// `RetentionDays` bounds.
const RETENTION_DAYS: std::ops::RangeInclusive<i32> = 1..=65_536;
/// How long a cache that failed to build is kept.
const FAILED_RETENTION_MS: Millis = 24 * 3_600_000;
const DAY_MS: Millis = 24 * 3_600_000;
/// Page size of DescribeImageCaches: default and maximum.
const DESCRIBE_MAX_LIMIT: i32 = 100;
/// Most `MatchImage.N` one call may give.
const MAX_MATCH_IMAGES: usize = 100;
const MAX_EVENTS: usize = 50;

/// Where a cache is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CacheState {
    /// Being built; settles at `until`.
    Creating {
        /// When it becomes Ready or Failed.
        until: Millis,
    },
    /// Usable by new groups.
    Ready,
    /// Could not be built.
    Failed,
    /// Being rebuilt with new images; settles at `until`.
    Updating {
        /// When it becomes Ready or UpdateFailed.
        until: Millis,
    },
    /// A rebuild failed.
    UpdateFailed,
}

impl CacheState {
    /// The `Status` the service reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating { .. } => "Creating",
            Self::Ready => "Ready",
            Self::Failed => "Failed",
            Self::Updating { .. } => "Updating",
            Self::UpdateFailed => "UpdateFailed",
        }
    }

    fn settles_at(self) -> Option<Millis> {
        match self {
            Self::Creating { until } | Self::Updating { until } => Some(until),
            _ => None,
        }
    }
}

/// One image cache.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageCache {
    /// `imc-…`.
    pub id: String,
    /// `ImageCacheName`.
    pub name: String,
    /// The images, as the request gave them.
    pub images: Vec<String>,
    /// GiB.
    pub size_gib: i32,
    /// Days it is kept from creation; `None`: never expires.
    pub retention_days: Option<i32>,
    /// Empty or `LRU`.
    pub elimination_strategy: String,
    /// Tags.
    pub tags: Vec<Tag>,
    /// Resource group.
    pub resource_group_id: String,
    /// Creation time.
    pub created_at: Millis,
    /// Life-cycle state.
    pub state: CacheState,
    /// When it last settled Failed (the start of its one-day retention).
    pub failed_at: Option<Millis>,
    /// Events, oldest first.
    pub events: Vec<GroupEvent>,
    /// When a group last used it.
    pub last_matched: Option<Millis>,
    /// The snapshot holding it (`s-…`).
    pub snapshot_id: String,
    /// The creation's `ClientToken`.
    pub client_token: String,
    /// Hash of the creation request, to detect a reused ClientToken.
    pub fingerprint: u64,
}

impl ImageCache {
    /// When the cache disappears, if it does.
    pub fn expires_at(&self) -> Option<Millis> {
        let retained = self
            .retention_days
            .map(|days| self.created_at + i64::from(days) * DAY_MS);
        let failed = self.failed_at.map(|at| at + FAILED_RETENTION_MS);
        match (retained, failed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether it holds `image` (references compared in their canonical form).
    pub fn holds(&self, image: &str) -> bool {
        let wanted = canonical_image(image);
        self.images
            .iter()
            .any(|held| canonical_image(held) == wanted)
    }

    fn event(&mut self, at: Millis, kind: &str, reason: &str, message: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.remove(0);
        }
        self.events.push(GroupEvent {
            count: 1,
            kind: kind.to_owned(),
            reason: reason.to_owned(),
            message,
            first: at,
            last: at,
        });
    }

    /// The build due at `at` ends: Ready, or Failed naming the image that cannot be pulled.
    fn settle(&mut self, at: Millis) {
        let updating = matches!(self.state, CacheState::Updating { .. });
        match self.images.iter().find(|image| !resolvable(image)) {
            Some(bad) => {
                let message = format!(
                    "Failed to pull image {bad:?}: the image does not exist or the registry denied access"
                );
                self.event(at, "Warning", "Failed", message);
                self.state = if updating {
                    CacheState::UpdateFailed
                } else {
                    CacheState::Failed
                };
                self.failed_at = Some(at);
            }
            None => {
                for image in self.images.clone() {
                    self.event(at, "Normal", "Pulled", format!("Pulled image {image:?}"));
                }
                let message = format!(
                    "Image cache {} holds {} image(s)",
                    self.id,
                    self.images.len()
                );
                self.event(at, "Normal", "Ready", message);
                self.state = CacheState::Ready;
                self.failed_at = None;
            }
        }
    }
}

/// `nginx` → `docker.io/library/nginx:latest`: the form two references to one image share.
pub fn canonical_image(image: &str) -> String {
    let image = image.trim();
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let last_segment = name.rsplit('/').next().unwrap_or(name);
    let (name, tag) = match last_segment.rsplit_once(':') {
        Some((_, tag)) => (&name[..name.len() - tag.len() - 1], Some(tag)),
        None => (name, None),
    };
    let first = name.split('/').next().unwrap_or(name);
    let has_host =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let name = match (has_host, name.contains('/')) {
        (true, _) => name.to_owned(),
        (false, true) => format!("docker.io/{name}"),
        (false, false) => format!("docker.io/library/{name}"),
    };
    match (digest, tag) {
        (Some(digest), _) => format!("{name}@{digest}"),
        (None, Some(tag)) => format!("{name}:{tag}"),
        (None, None) => format!("{name}:latest"),
    }
}

/// Whether the fake can pull `image` into a cache.
fn resolvable(image: &str) -> bool {
    let host = image.split('/').next().unwrap_or_default();
    let unpullable = image.contains('/') && host == PULL_FAIL_REGISTRY;
    !image.trim().is_empty() && !image.chars().any(char::is_whitespace) && !unpullable
}

/// How a new container group gets its images.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageSource {
    /// Pulled from their registries (no cache).
    #[default]
    Pull,
    /// All of them from a Ready cache: no pull.
    Cache {
        /// The cache.
        id: String,
    },
    /// `AutoMatchImageCache` found no Ready cache holding them all: pulled.
    Missed,
    /// A cache named by `ImageSnapshotId` that lacks some of them: those are pulled.
    PartialCache {
        /// The cache.
        id: String,
        /// The images pulled.
        pulled: Vec<String>,
    },
}

impl ImageSource {
    /// Whether the group starts without pulling.
    pub fn skips_pull(&self) -> bool {
        matches!(self, Self::Cache { .. })
    }

    /// The group's event about it, as ECI raises it (`eci_proto::events`): (type, reason,
    /// message), `None` when no cache was asked for.
    pub fn event(&self) -> Option<(&'static str, &'static str, String)> {
        match self {
            Self::Pull => None,
            Self::Missed => Some((
                "Warning",
                events::IMAGE_CACHE_MISSED,
                events::image_cache_missed_message(),
            )),
            Self::Cache { id } | Self::PartialCache { id, .. } => Some((
                "Normal",
                events::HIT_IMAGE_CACHE,
                events::hit_image_cache_message(id),
            )),
        }
    }
}

/// Every image cache of the account, with the agenda of their transitions.
#[derive(Debug, Default)]
pub struct ImageCaches {
    caches: BTreeMap<String, ImageCache>,
    /// Caches created so far (for unique ids).
    counter: u64,
    /// (when, id): a build settles or a cache expires; stale entries are skipped.
    agenda: BTreeSet<(Millis, String)>,
    /// `ClientToken` → id.
    tokens: HashMap<String, String>,
}

impl ImageCaches {
    /// The caches of a snapshot, with their agenda and token index rebuilt.
    pub fn restored(caches: Vec<ImageCache>, counter: u64) -> Self {
        let mut restored = Self {
            counter,
            ..Self::default()
        };
        for cache in caches {
            restored.insert(cache);
        }
        restored
    }

    /// What a snapshot keeps: the caches and the id counter (the rest is rebuilt).
    pub fn to_snapshot(&self) -> (Vec<ImageCache>, u64) {
        (self.caches.values().cloned().collect(), self.counter)
    }

    fn insert(&mut self, cache: ImageCache) {
        self.schedule(&cache);
        if !cache.client_token.is_empty() {
            self.tokens
                .insert(cache.client_token.clone(), cache.id.clone());
        }
        self.caches.insert(cache.id.clone(), cache);
    }

    fn schedule(&mut self, cache: &ImageCache) {
        for at in [cache.state.settles_at(), cache.expires_at()]
            .into_iter()
            .flatten()
        {
            self.agenda.insert((at, cache.id.clone()));
        }
    }

    fn remove(&mut self, id: &str) -> Option<ImageCache> {
        let cache = self.caches.remove(id)?;
        self.tokens.remove(&cache.client_token);
        Some(cache)
    }

    /// Number of caches.
    pub fn len(&self) -> usize {
        self.caches.len()
    }

    /// No caches.
    pub fn is_empty(&self) -> bool {
        self.caches.is_empty()
    }

    /// The cache `id`, if any.
    pub fn get(&self, id: &str) -> Option<&ImageCache> {
        self.caches.get(id)
    }

    /// Applies every transition due by `now`, each at its own time.
    pub fn advance(&mut self, now: Millis) {
        while let Some((at, id)) = self.agenda.first().cloned() {
            if at > now {
                break;
            }
            self.agenda.pop_first();
            let Some(cache) = self.caches.get_mut(&id) else {
                continue;
            };
            if cache.expires_at().is_some_and(|expiry| expiry <= at) {
                self.remove(&id);
                continue;
            }
            if cache.state.settles_at() == Some(at) {
                cache.settle(at);
                let cache = cache.clone();
                self.schedule(&cache);
            }
        }
    }

    /// CreateImageCache: the new cache's id (or the earlier one for a repeated `ClientToken`).
    pub fn create(
        &mut self,
        request: &CreateImageCacheRequest,
        settings: &Settings,
        now: Millis,
    ) -> Result<String, EciError> {
        self.advance(now);
        validate::region(&request.region_id, &settings.region)?;
        cache_name(&request.image_cache_name)?;
        images(&request.image, true)?;
        validate::client_token(&request.client_token)?;
        validate::tags(&request.tag, "Tag")?;
        let size_gib = size(request.image_cache_size)?;
        let retention_days = retention(request.retention_days)?;
        elimination(&request.elimination_strategy)?;
        let fingerprint = rng::stable_hash(&request.encode_to_vec());
        if let Some(existing) = self
            .tokens
            .get(&request.client_token)
            .filter(|_| !request.client_token.is_empty())
            .and_then(|id| self.caches.get(id))
        {
            if existing.fingerprint != fingerprint {
                return Err(EciError::new(
                    codes::IDEMPOTENT_PARAMETER_MISMATCH,
                    format!(
                        "ClientToken {:?} was already used by a request with different parameters (image cache {}).",
                        request.client_token, existing.id
                    ),
                ));
            }
            return Ok(existing.id.clone());
        }
        self.counter += 1;
        let draw = rng::mix(self.counter ^ rng::mix(settings.seed ^ 0x1ac));
        let region: String = settings
            .region
            .chars()
            .filter(char::is_ascii_alphabetic)
            .take(2)
            .collect();
        let id = format!("imc-{region}{}", rng::base36(draw, 16));
        let until = now + settings.image_cache_creation.pick(&id, settings.seed);
        let mut cache = ImageCache {
            snapshot_id: format!("s-{region}{}", rng::base36(rng::mix(draw), 16)),
            id: id.clone(),
            name: request.image_cache_name.clone(),
            images: request.image.clone(),
            size_gib,
            retention_days,
            elimination_strategy: request.elimination_strategy.clone(),
            tags: request.tag.clone(),
            resource_group_id: request.resource_group_id.clone(),
            created_at: now,
            state: CacheState::Creating { until },
            failed_at: None,
            events: Vec::new(),
            last_matched: None,
            client_token: request.client_token.clone(),
            fingerprint,
        };
        let message = format!("Pulling {} image(s) into the cache", cache.images.len());
        cache.event(now, "Normal", "Creating", message);
        self.insert(cache);
        Ok(id)
    }

    /// DescribeImageCaches.
    pub fn describe(
        &mut self,
        request: &DescribeImageCachesRequest,
        settings: &Settings,
        now: Millis,
    ) -> Result<DescribeImageCachesResponse, EciError> {
        self.advance(now);
        validate::region(&request.region_id, &settings.region)?;
        validate::tags(&request.tag, "Tag")?;
        if request.match_image.len() > MAX_MATCH_IMAGES {
            return Err(validate::invalid(
                "MatchImage",
                format!(
                    "{} images given, at most {MAX_MATCH_IMAGES} are allowed",
                    request.match_image.len()
                ),
            ));
        }
        images(&request.match_image, false)?;
        let limit = validate::limit(request.limit, DESCRIBE_MAX_LIMIT)?;
        let after = cache_token(&request.next_token)?;
        let filter = Filter::of(request);
        let (page, next_token, total) = if request.match_image.is_empty() {
            let matching: Vec<&ImageCache> =
                self.caches.values().filter(|c| filter.keeps(c)).collect();
            page_after(matching, after, limit)
        } else {
            let count = match request.image_match_count_request {
                None => limit,
                Some(count) if count >= 1 => usize::try_from(count).unwrap_or(limit).min(limit),
                Some(count) => {
                    return Err(validate::invalid(
                        "ImageMatchCountRequest",
                        format!("{count} must be at least 1"),
                    ));
                }
            };
            let ranked = ranked_matches(
                self.caches.values().filter(|c| filter.keeps(c)),
                &request.match_image,
                request.image_full_match,
            );
            let total = ranked.len();
            (
                ranked.into_iter().take(count).collect(),
                String::new(),
                total,
            )
        };
        Ok(DescribeImageCachesResponse {
            request_id: String::new(),
            image_caches: page.into_iter().map(|c| view(c, settings)).collect(),
            next_token,
            total_count: i32::try_from(total).unwrap_or(i32::MAX),
        })
    }

    /// UpdateImageCache.
    pub fn update(
        &mut self,
        request: &UpdateImageCacheRequest,
        settings: &Settings,
        now: Millis,
    ) -> Result<(), EciError> {
        self.advance(now);
        validate::region(&request.region_id, &settings.region)?;
        validate::client_token(&request.client_token)?;
        let cache = self.existing(&request.image_cache_id, "ImageCacheId")?;
        if cache.state.settles_at().is_some() {
            return Err(EciError::new(
                codes::INCORRECT_STATUS,
                format!(
                    "The image cache {} is {} and cannot be updated until that ends.",
                    cache.id,
                    cache.state.as_str()
                ),
            ));
        }
        if !request.image_cache_name.is_empty() {
            cache_name(&request.image_cache_name)?;
        }
        images(&request.image, false)?;
        validate::tags(&request.tag, "Tag")?;
        let size_gib = request
            .image_cache_size
            .map(|s| size(Some(s)))
            .transpose()?;
        let retention_days = retention(request.retention_days)?;
        elimination(&request.elimination_strategy)?;
        let mut cache = cache.clone();
        if !request.image_cache_name.is_empty() {
            cache.name.clone_from(&request.image_cache_name);
        }
        if !request.tag.is_empty() {
            cache.tags.clone_from(&request.tag);
        }
        if !request.resource_group_id.is_empty() {
            cache
                .resource_group_id
                .clone_from(&request.resource_group_id);
        }
        if !request.elimination_strategy.is_empty() {
            cache
                .elimination_strategy
                .clone_from(&request.elimination_strategy);
        }
        cache.size_gib = size_gib.unwrap_or(cache.size_gib);
        cache.retention_days = retention_days.or(cache.retention_days);
        if !request.image.is_empty() && request.image != cache.images {
            let build = format!("{}@{now}", cache.id);
            let until = now + settings.image_cache_creation.pick(&build, settings.seed);
            cache.images.clone_from(&request.image);
            cache.state = CacheState::Updating { until };
            let message = format!("Pulling {} image(s) into the cache", cache.images.len());
            cache.event(now, "Normal", "Updating", message);
        }
        self.insert(cache);
        Ok(())
    }

    /// DeleteImageCache.
    pub fn delete(
        &mut self,
        request: &DeleteImageCacheRequest,
        settings: &Settings,
        now: Millis,
    ) -> Result<(), EciError> {
        self.advance(now);
        validate::region(&request.region_id, &settings.region)?;
        validate::client_token(&request.client_token)?;
        let id = self
            .existing(&request.image_cache_id, "ImageCacheId")?
            .id
            .clone();
        self.remove(&id);
        Ok(())
    }

    fn existing(&self, id: &str, param: &str) -> Result<&ImageCache, EciError> {
        if id.is_empty() {
            return Err(validate::missing(param));
        }
        self.caches.get(id).ok_or_else(|| {
            EciError::new(
                IMAGE_CACHE_NOT_FOUND,
                format!("The image cache {id:?} given as {param} does not exist."),
            )
        })
    }

    /// How a group created with `snapshot_id` (`ImageSnapshotId`) or `auto_match` gets
    /// `images`; a named cache that does not exist or is not Ready refuses the create.
    pub fn source_for(
        &self,
        snapshot_id: &str,
        auto_match: bool,
        images: &[&str],
    ) -> Result<ImageSource, EciError> {
        if !snapshot_id.is_empty() {
            let cache = self.existing(snapshot_id, "ImageSnapshotId")?;
            if cache.state != CacheState::Ready {
                return Err(EciError::new(
                    codes::INCORRECT_STATUS,
                    format!(
                        "The image cache {} given as ImageSnapshotId is {}; only a Ready cache can be used.",
                        cache.id,
                        cache.state.as_str()
                    ),
                ));
            }
            let pulled: Vec<String> = images
                .iter()
                .filter(|image| !cache.holds(image))
                .map(|image| (*image).to_owned())
                .collect();
            let id = cache.id.clone();
            return Ok(if pulled.is_empty() {
                ImageSource::Cache { id }
            } else {
                ImageSource::PartialCache { id, pulled }
            });
        }
        if !auto_match {
            return Ok(ImageSource::Pull);
        }
        let wanted: Vec<String> = images.iter().map(|image| (*image).to_owned()).collect();
        let ready = self
            .caches
            .values()
            .filter(|c| c.state == CacheState::Ready);
        Ok(ranked_matches(ready, &wanted, true)
            .first()
            .map_or(ImageSource::Missed, |cache| ImageSource::Cache {
                id: cache.id.clone(),
            }))
    }

    /// A group was created from cache `id` at `now`.
    pub fn matched(&mut self, id: &str, now: Millis) {
        if let Some(cache) = self.caches.get_mut(id) {
            cache.last_matched = Some(now);
        }
    }
}

/// The plain filters of DescribeImageCaches.
struct Filter<'a> {
    ids: BTreeSet<&'a str>,
    request: &'a DescribeImageCachesRequest,
}

impl<'a> Filter<'a> {
    fn of(request: &'a DescribeImageCachesRequest) -> Self {
        Self {
            ids: request
                .image_cache_id
                .split(',')
                .map(str::trim)
                .filter(|id| !id.is_empty())
                .collect(),
            request,
        }
    }

    fn keeps(&self, cache: &ImageCache) -> bool {
        let request = self.request;
        (self.ids.is_empty() || self.ids.contains(cache.id.as_str()))
            && (request.image_cache_name.is_empty() || cache.name == request.image_cache_name)
            && (request.snapshot_id.is_empty() || cache.snapshot_id == request.snapshot_id)
            && (request.image.is_empty() || cache.holds(&request.image))
            && (request.resource_group_id.is_empty()
                || cache.resource_group_id == request.resource_group_id)
            && render::has_tags(&cache.tags, &request.tag)
    }
}

/// The Ready caches among `caches` holding any of `images` (every one of them with
/// `full_match`), the most images held first, then the newest.
fn ranked_matches<'a>(
    caches: impl Iterator<Item = &'a ImageCache>,
    images: &[String],
    full_match: bool,
) -> Vec<&'a ImageCache> {
    let mut scored: Vec<(usize, &ImageCache)> = caches
        .filter(|cache| cache.state == CacheState::Ready)
        .map(|cache| (images.iter().filter(|i| cache.holds(i)).count(), cache))
        .filter(|(held, _)| *held > 0 && (!full_match || *held == images.len()))
        .collect();
    scored.sort_by(|(a, x), (b, y)| {
        b.cmp(a)
            .then(y.created_at.cmp(&x.created_at))
            .then(x.id.cmp(&y.id))
    });
    scored.into_iter().map(|(_, cache)| cache).collect()
}

/// One page of `sorted` (in id order) after `after`, the next token, and the count.
fn page_after<'a>(
    sorted: Vec<&'a ImageCache>,
    after: Option<&str>,
    limit: usize,
) -> (Vec<&'a ImageCache>, String, usize) {
    let total = sorted.len();
    let start = after.map_or(0, |after| {
        sorted.partition_point(|c| c.id.as_str() <= after)
    });
    let mut page: Vec<&ImageCache> = sorted.into_iter().skip(start).take(limit + 1).collect();
    let next_token = if page.len() > limit {
        page.truncate(limit);
        page.last().map(|c| c.id.clone()).unwrap_or_default()
    } else {
        String::new()
    };
    (page, next_token, total)
}

fn view(cache: &ImageCache, settings: &Settings) -> ImageCacheView {
    let name = format!("imagecache.{}", cache.name);
    let time = |at: Option<Millis>| at.map(rfc3339).unwrap_or_default();
    ImageCacheView {
        image_cache_id: cache.id.clone(),
        image_cache_name: cache.name.clone(),
        snapshot_id: cache.snapshot_id.clone(),
        status: cache.state.as_str().to_owned(),
        progress: if cache.state == CacheState::Ready {
            "100%".to_owned()
        } else {
            "0%".to_owned()
        },
        images: cache.images.clone(),
        image_cache_size: cache.size_gib,
        container_group_id: String::new(),
        creation_time: rfc3339(cache.created_at),
        expire_date_time: time(cache.expires_at()),
        last_matched_time: time(cache.last_matched),
        elimination_strategy: cache.elimination_strategy.clone(),
        flash_snapshot_id: String::new(),
        region_id: settings.region.clone(),
        resource_group_id: cache.resource_group_id.clone(),
        tags: cache.tags.clone(),
        events: cache
            .events
            .iter()
            .map(|event| Event {
                count: event.count,
                r#type: event.kind.clone(),
                name: name.clone(),
                reason: event.reason.clone(),
                message: event.message.clone(),
                first_timestamp: rfc3339(event.first),
                last_timestamp: rfc3339(event.last),
            })
            .collect(),
    }
}

/// `ImageCacheName`: 2–128 characters of `[a-z0-9-]`, not starting or ending with `-`.
fn cache_name(name: &str) -> Result<(), EciError> {
    if name.is_empty() {
        return Err(validate::missing("ImageCacheName"));
    }
    let valid = (2..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(validate::invalid(
            "ImageCacheName",
            format!(
                "{name:?} must be 2-128 characters of lowercase letters, digits and '-', not starting or ending with '-'"
            ),
        ))
    }
}

/// `Image.N` / `MatchImage.N`: no empty entry; at least one when `required`.
fn images(images: &[String], required: bool) -> Result<(), EciError> {
    if required && images.is_empty() {
        return Err(validate::missing("Image.1"));
    }
    match images.iter().position(|image| image.trim().is_empty()) {
        Some(index) => Err(validate::invalid(
            &format!("Image.{}", index + 1),
            "an image reference cannot be empty",
        )),
        None => Ok(()),
    }
}

fn size(size: Option<i32>) -> Result<i32, EciError> {
    match size {
        None => Ok(DEFAULT_SIZE_GIB),
        Some(gib) if SIZE_GIB.contains(&gib) => Ok(gib),
        Some(gib) => Err(validate::invalid(
            "ImageCacheSize",
            format!(
                "{gib} GiB is out of range; use {} to {}",
                SIZE_GIB.start(),
                SIZE_GIB.end()
            ),
        )),
    }
}

fn retention(days: Option<i32>) -> Result<Option<i32>, EciError> {
    match days {
        None => Ok(None),
        Some(days) if RETENTION_DAYS.contains(&days) => Ok(Some(days)),
        Some(days) => Err(validate::invalid(
            "RetentionDays",
            format!(
                "{days} is out of range; use {} to {}",
                RETENTION_DAYS.start(),
                RETENTION_DAYS.end()
            ),
        )),
    }
}

fn elimination(strategy: &str) -> Result<(), EciError> {
    if strategy.is_empty() || strategy == "LRU" {
        Ok(())
    } else {
        Err(validate::invalid(
            "EliminationStrategy",
            format!("{strategy:?}; leave it empty or use LRU"),
        ))
    }
}

/// `NextToken` must be a cache id this service handed out.
fn cache_token(token: &str) -> Result<Option<&str>, EciError> {
    if token.is_empty() {
        Ok(None)
    } else if token.starts_with("imc-") && token.len() <= 64 {
        Ok(Some(token))
    } else {
        Err(validate::invalid(
            "NextToken",
            format!("{token:?} was not returned by a previous call"),
        ))
    }
}

#[cfg(test)]
mod tests;
