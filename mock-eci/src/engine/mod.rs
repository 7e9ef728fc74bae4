//! The engine: the simulated ECI service as a pure state machine — every action a function of
//! the state, the request and the time. The layer above (`service`) adds request ids,
//! throttling, faults, locking and persistence around it.
//!
//! Owns the groups and their containers ([`group`], [`behaviour`]), the agenda ([`timers`]),
//! request checks ([`validate`]), answers ([`render`]), metrics ([`usage`]), logs ([`logs`]),
//! `ExecContainerCommand` ([`exec`], and the pending interactive sessions in [`exec_session`]).
//!
//! May call: its own parts and the shared leaves (`clock`, `rng`, `settings`, `actions`). Never
//! `service` or `fronts` (`tests/layout.rs` checks it).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Bound;

use eci_proto::EciError;
use eci_proto::error::codes;
use eci_proto::status::{GroupStatus, RestartPolicy};
use eci_proto::v20180808::{
    Container, ContainerGroup, CreateContainerGroupRequest, CreateImageCacheRequest,
    DeleteContainerGroupRequest, DeleteImageCacheRequest, DescribeContainerGroupMetricRequest,
    DescribeContainerGroupMetricResponse, DescribeContainerGroupStatusRequest,
    DescribeContainerGroupStatusResponse, DescribeContainerGroupsRequest,
    DescribeContainerGroupsResponse, DescribeContainerLogRequest, DescribeContainerLogResponse,
    DescribeImageCachesRequest, DescribeImageCachesResponse,
    DescribeMultiContainerGroupMetricRequest, DescribeMultiContainerGroupMetricResponse,
    ExecContainerCommandRequest, ExecContainerCommandResponse, MonitorData,
    RestartContainerGroupRequest, UpdateContainerGroupRequest, UpdateImageCacheRequest, Volume,
};
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::clock::{Millis, parse_rfc3339};
use crate::engine::group::{ContainerRun, Cx, Group, RunState, Which};
use crate::engine::logs::LogQuery;
use crate::engine::timers::{Timer, TimerKind, Timers};
use crate::rng;
use crate::settings::Settings;

pub mod behaviour;
pub mod exec;
pub mod exec_session;
pub mod group;
pub mod image_cache;
pub mod logs;
pub mod placement;
pub mod probe;
pub mod real;
pub mod render;
pub mod timers;
pub mod usage;
pub mod validate;

/// Version of the state file format.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Everything needed to rebuild an engine: what `--state-file` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// Format version.
    pub version: u32,
    /// When it was taken.
    pub taken_at: Millis,
    /// Groups created so far (for unique ids).
    pub id_counter: u64,
    /// The groups.
    pub groups: Vec<Group>,
    /// The agenda.
    pub timers: Vec<Timer>,
    /// The image caches (none in state files written before caches).
    #[serde(default)]
    pub image_caches: Vec<image_cache::ImageCache>,
    /// Image caches created so far (for unique ids).
    #[serde(default)]
    pub image_cache_counter: u64,
}

/// Hands out intranet IPs from a CIDR block, lowest free first.
#[derive(Debug)]
struct IpPool {
    cidr: crate::settings::Cidr,
    next_unused: u32,
    released: BTreeSet<u32>,
    in_use: usize,
}

impl IpPool {
    fn new(cidr: crate::settings::Cidr) -> Self {
        Self {
            cidr,
            next_unused: 0,
            released: BTreeSet::new(),
            in_use: 0,
        }
    }

    fn allocate(&mut self) -> Option<Ipv4Addr> {
        let offset = if let Some(offset) = self.released.pop_first() {
            offset
        } else if self.next_unused < self.cidr.host_count() {
            self.next_unused += 1;
            self.next_unused - 1
        } else {
            return None;
        };
        self.in_use += 1;
        Some(self.cidr.host(offset))
    }

    fn release(&mut self, ip: Ipv4Addr) {
        if let Some(offset) = self.cidr.offset_of(ip) {
            if offset < self.next_unused && self.released.insert(offset) {
                self.in_use = self.in_use.saturating_sub(1);
            }
        }
    }

    /// Rebuilds the pool from the addresses restored groups hold.
    fn restore(cidr: crate::settings::Cidr, held: impl Iterator<Item = Ipv4Addr>) -> Self {
        let offsets: BTreeSet<u32> = held.filter_map(|ip| cidr.offset_of(ip)).collect();
        let next_unused = offsets.last().map_or(0, |last| last + 1);
        Self {
            cidr,
            next_unused,
            released: (0..next_unused)
                .filter(|offset| !offsets.contains(offset))
                .collect(),
            in_use: offsets.len(),
        }
    }
}

/// The state of the simulated service.
#[derive(Debug)]
pub struct Engine {
    settings: Settings,
    groups: BTreeMap<String, Group>,
    tokens: HashMap<String, String>,
    /// (last change, id): the index behind `SinceSecond`.
    changes: BTreeSet<(Millis, String)>,
    timers: Timers,
    ips: IpPool,
    id_counter: u64,
    /// Bumped whenever a group appears, disappears or changes tags: the validity of
    /// `count_cache`.
    generation: u64,
    /// The last `TotalCount` computed for a filter, reused while paging through it.
    count_cache: Option<(u64, String, usize)>,
    /// Interactive exec sessions waiting for their WebSocket.
    exec_sessions: crate::engine::exec_session::Sessions,
    /// The load rules the metric calls follow (a test control; not persisted).
    usage: usage::Loads,
    /// The image caches.
    caches: image_cache::ImageCaches,
}

impl Engine {
    /// An empty service.
    pub fn new(settings: Settings) -> Self {
        Self {
            ips: IpPool::new(settings.ip_cidr),
            settings,
            groups: BTreeMap::new(),
            tokens: HashMap::new(),
            changes: BTreeSet::new(),
            timers: Timers::default(),
            id_counter: 0,
            generation: 0,
            count_cache: None,
            exec_sessions: crate::engine::exec_session::Sessions::default(),
            usage: usage::Loads::default(),
            caches: image_cache::ImageCaches::default(),
        }
    }

    /// A service continuing from a snapshot.
    pub fn restore(settings: Settings, snapshot: Snapshot) -> Self {
        let ips = IpPool::restore(
            settings.ip_cidr,
            snapshot
                .groups
                .iter()
                .filter(|g| g.holds_capacity)
                .filter_map(|g| g.ip),
        );
        let mut engine = Self {
            ips,
            settings,
            groups: BTreeMap::new(),
            tokens: HashMap::new(),
            changes: BTreeSet::new(),
            timers: Timers::from_vec(snapshot.timers),
            id_counter: snapshot.id_counter,
            generation: 0,
            count_cache: None,
            exec_sessions: crate::engine::exec_session::Sessions::default(),
            usage: usage::Loads::default(),
            caches: image_cache::ImageCaches::restored(
                snapshot.image_caches,
                snapshot.image_cache_counter,
            ),
        };
        for group in snapshot.groups {
            engine.index(&group);
            engine.groups.insert(group.id.clone(), group);
        }
        engine
    }

    /// The current state as a snapshot.
    pub fn snapshot(&self, now: Millis) -> Snapshot {
        Snapshot {
            version: SNAPSHOT_VERSION,
            taken_at: now,
            id_counter: self.id_counter,
            groups: self.groups.values().cloned().collect(),
            timers: self.timers.to_vec(),
            image_caches: self.caches.to_snapshot().0,
            image_cache_counter: self.caches.to_snapshot().1,
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Switches "no stock" on or off for groups scheduled from now on.
    pub fn set_no_stock(&mut self, no_stock: bool) {
        self.settings.no_stock = no_stock;
    }

    /// Sets the zones without stock, for creates from now on.
    pub fn set_no_stock_zones(&mut self, zones: BTreeSet<String>) {
        self.settings.no_stock_zones = zones;
    }

    /// Adds or changes vSwitch → zone entries, for creates from now on.
    pub fn map_vswitch_zones(&mut self, zones: BTreeMap<String, String>) {
        self.settings.vswitch_zones.extend(zones);
    }

    /// Sets the cap on groups holding capacity, for groups scheduled from now on.
    pub fn set_max_groups(&mut self, max_groups: Option<usize>) {
        self.settings.max_groups = max_groups;
    }

    /// Number of groups per status.
    pub fn count_by_status(&self) -> BTreeMap<GroupStatus, usize> {
        let mut counts = BTreeMap::new();
        for group in self.groups.values() {
            *counts.entry(group.status).or_insert(0) += 1;
        }
        counts
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// No groups.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The TCP ports the running groups' containers declare, at the groups' IPs (the port
    /// echo's listeners, asked twice a second). Read from the groups as kept: rendering every
    /// group in full to read its ports would cost twice a second what all groups' answers do.
    pub fn running_tcp_ports(&mut self, now: Millis) -> HashSet<SocketAddr> {
        self.advance(now);
        self.groups
            .values()
            .filter(|group| group.status == GroupStatus::Running)
            .filter_map(|group| Some((group.ip?, group)))
            .flat_map(|(ip, group)| {
                group
                    .request
                    .container
                    .iter()
                    .flat_map(|container| &container.port)
                    .filter(|port| {
                        port.protocol.is_empty() || port.protocol.eq_ignore_ascii_case("TCP")
                    })
                    .filter_map(move |port| {
                        Some(SocketAddr::new(ip.into(), u16::try_from(port.port).ok()?))
                    })
            })
            .collect()
    }

    /// Every group in full (admin view, tests).
    pub fn all_groups(&mut self, now: Millis) -> Vec<ContainerGroup> {
        self.advance(now);
        self.groups
            .values()
            .map(|group| render::container_group(group, &self.settings, true))
            .collect()
    }

    fn index(&mut self, group: &Group) {
        self.changes.insert((group.changed_at, group.id.clone()));
        if !group.request.client_token.is_empty() {
            self.tokens
                .insert(group.request.client_token.clone(), group.id.clone());
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(group) = self.groups.remove(id) {
            self.generation += 1;
            self.changes.remove(&(group.changed_at, group.id.clone()));
            if !group.request.client_token.is_empty() {
                self.tokens.remove(&group.request.client_token);
            }
            if group.holds_capacity {
                if let Some(ip) = group.ip {
                    self.ips.release(ip);
                }
            }
        }
    }

    /// Runs `change` on group `id` and keeps the indexes in step with what it did.
    fn with_group<T>(
        &mut self,
        id: &str,
        now: Millis,
        change: impl FnOnce(&mut Group, &mut Cx<'_>) -> T,
    ) -> Option<T> {
        let group = self.groups.get_mut(id)?;
        let changed_before = group.changed_at;
        let mut cx = Cx {
            settings: &self.settings,
            timers: &mut self.timers,
            now,
        };
        let out = change(group, &mut cx);
        if group.changed_at != changed_before {
            self.changes.remove(&(changed_before, group.id.clone()));
            self.changes.insert((group.changed_at, group.id.clone()));
        }
        if group.status.is_final() && group.holds_capacity {
            group.holds_capacity = false;
            if let Some(ip) = group.ip {
                self.ips.release(ip);
            }
        }
        Some(out)
    }

    /// Applies every transition due by `now`, each at its own time.
    pub fn advance(&mut self, now: Millis) {
        while let Some(timer) = self.timers.pop_due(now) {
            self.fire(&timer);
        }
        self.caches.advance(now);
    }

    fn fire(&mut self, timer: &Timer) {
        let Some(group) = self.groups.get(&timer.group) else {
            return;
        };
        if group.epoch != timer.epoch {
            return;
        }
        let at = timer.at;
        let which = |init: bool| if init { Which::Init } else { Which::Regular };
        match timer.kind {
            TimerKind::BeginScheduling => {
                let outcome = self.claim_capacity(&timer.group);
                self.with_group(&timer.group, at, |group, cx| {
                    group.begin_scheduling(outcome, cx);
                });
            }
            TimerKind::Provisioned => {
                self.with_group(&timer.group, at, |group, cx| group.provisioned(cx));
            }
            TimerKind::Exit { init, index, run } => {
                self.with_group(&timer.group, at, |group, cx| {
                    group.exit(which(init), index, run, cx);
                });
            }
            TimerKind::Restart { init, index, run } => {
                self.with_group(&timer.group, at, |group, cx| {
                    group.restart(which(init), index, run, cx);
                });
            }
            TimerKind::Ready { index, run } => {
                self.with_group(&timer.group, at, |group, _| group.ready(index, run, at));
            }
            TimerKind::PullBackOff { init, index } => {
                self.with_group(&timer.group, at, |group, _| {
                    group.pull_backoff(which(init), index, at);
                });
            }
            TimerKind::Deadline => {
                self.with_group(&timer.group, at, |group, cx| group.deadline(cx));
            }
            TimerKind::RestartDone => {
                self.with_group(&timer.group, at, |group, cx| group.restart_done(None, cx));
            }
            TimerKind::UpdateDone => {
                let init_duration = self.settings.init_duration_ms;
                self.with_group(&timer.group, at, |group, cx| {
                    // The spec was validated when the update was accepted.
                    let behaviours =
                        validate::create(&group.request, &cx.settings.region, init_duration)
                            .map(|valid| valid.behaviours)
                            .ok();
                    group.restart_done(behaviours, cx);
                });
            }
            TimerKind::FilesRewritten => {
                self.with_group(&timer.group, at, |group, cx| group.files_rewritten(cx));
            }
            TimerKind::TerminationDone | TimerKind::Retire => self.remove(&timer.group),
        }
    }

    /// Capacity for a group entering scheduling: an IP, or why there is none.
    fn claim_capacity(&mut self, id: &str) -> Result<Ipv4Addr, (&'static str, String)> {
        let zone = self
            .groups
            .get(id)
            .map(|group| group.zone(&self.settings).to_owned())
            .unwrap_or_default();
        if self.settings.no_stock {
            return Err((
                "NoStock",
                format!(
                    "The resource is out of stock in zone {zone}; try another zone or instance specification."
                ),
            ));
        }
        if let Some(max) = self.settings.max_groups {
            if self.ips.in_use >= max {
                return Err((
                    "QuotaExceeded",
                    format!(
                        "{max} container groups already hold capacity, the most this service allows (--max-groups)."
                    ),
                ));
            }
        }
        let vswitch = self
            .groups
            .get(id)
            .map(|group| group.vswitch().to_owned())
            .unwrap_or_default();
        self.ips.allocate().ok_or_else(|| {
            (
                "VSwitchIpNotEnough",
                format!(
                    "The vSwitch {vswitch} has no free IP address: all {} addresses of {} are in use.",
                    self.settings.ip_cidr.host_count(),
                    self.settings.ip_cidr
                ),
            )
        })
    }

    fn group(&self, id: &str) -> Result<&Group, EciError> {
        if id.is_empty() {
            return Err(validate::missing("ContainerGroupId"));
        }
        self.groups.get(id).ok_or_else(|| not_found(id))
    }

    /// A cloud disk `request` mounts that a group still holds (until it is deleted), with
    /// that group's id.
    fn disk_holder(&self, request: &CreateContainerGroupRequest) -> Option<(String, String)> {
        let disks = |r: &CreateContainerGroupRequest| -> Vec<String> {
            r.volume
                .iter()
                .filter_map(|v| v.disk_volume.as_ref())
                .map(|d| d.disk_id.clone())
                .collect()
        };
        let wanted = disks(request);
        if wanted.is_empty() {
            return None;
        }
        self.groups.values().find_map(|group| {
            disks(&group.request)
                .into_iter()
                .find(|disk| wanted.contains(disk))
                .map(|disk| (disk, group.id.clone()))
        })
    }

    /// CreateContainerGroup.
    pub fn create(
        &mut self,
        request: CreateContainerGroupRequest,
        now: Millis,
    ) -> Result<String, EciError> {
        self.advance(now);
        let valid = validate::create(
            &request,
            &self.settings.region,
            self.settings.init_duration_ms,
        )?;
        let fingerprint = fingerprint(&request);
        if let Some(id) = self.replayed(&request, fingerprint)? {
            return Ok(id);
        }
        if let Some((disk, holder)) = self.disk_holder(&request) {
            // A cloud disk is attached to one instance at a time (ReadWriteOnce).
            return Err(EciError::new(
                codes::DISK_IN_USE,
                format!(
                    "The disk {disk} is attached to container group {holder}; it can be used again once that group is deleted."
                ),
            ));
        }
        let strategy = placement::Strategy::parse(&request.schedule_strategy)?;
        let source = self.image_source(&request)?;
        if request.dry_run {
            return Err(EciError::new(
                codes::DRY_RUN_SUCCESS,
                "Request validation has been passed with DryRun flag set.",
            ));
        }
        let placed = self.placement(&request, strategy, fingerprint)?;
        let id = self.next_group_id();
        let mut cx = Cx {
            settings: &self.settings,
            timers: &mut self.timers,
            now,
        };
        let mut group = Group::new(id.clone(), request, valid, fingerprint, &mut cx);
        group.placement = Some(placed);
        self.adopt_image_source(&mut group, source, now);
        self.generation += 1;
        self.index(&group);
        self.groups.insert(id.clone(), group);
        Ok(id)
    }

    /// The group an earlier create with the same `ClientToken` made, if any; reusing the
    /// token for different parameters is an error.
    fn replayed(
        &self,
        request: &CreateContainerGroupRequest,
        fingerprint: u64,
    ) -> Result<Option<String>, EciError> {
        if request.client_token.is_empty() {
            return Ok(None);
        }
        let Some(existing) = self
            .tokens
            .get(&request.client_token)
            .and_then(|id| self.groups.get(id))
        else {
            return Ok(None);
        };
        if existing.fingerprint != fingerprint {
            return Err(EciError::new(
                codes::IDEMPOTENT_PARAMETER_MISMATCH,
                format!(
                    "ClientToken {:?} was already used by a request with different parameters (group {}).",
                    request.client_token, existing.id
                ),
            ));
        }
        Ok(Some(existing.id.clone()))
    }

    /// How the group `request` creates gets its images: from the image cache it names or
    /// matches, else from the registries.
    fn image_source(
        &self,
        request: &CreateContainerGroupRequest,
    ) -> Result<image_cache::ImageSource, EciError> {
        let images: Vec<&str> = request
            .init_container
            .iter()
            .chain(&request.container)
            .map(|container| container.image.as_str())
            .collect();
        self.caches.source_for(
            &request.image_snapshot_id,
            request.auto_match_image_cache,
            &images,
        )
    }

    /// Where the group `request` creates lands; the draw differs between creates, so
    /// identical requests still spread over a random strategy's vSwitches.
    fn placement(
        &self,
        request: &CreateContainerGroupRequest,
        strategy: placement::Strategy,
        fingerprint: u64,
    ) -> Result<placement::Placement, EciError> {
        let fallback = if request.zone_id.is_empty() {
            self.settings.zone.as_str()
        } else {
            request.zone_id.as_str()
        };
        placement::place(
            &request.v_switch_id,
            strategy,
            fingerprint ^ rng::mix(self.settings.seed ^ self.id_counter),
            placement::Zones {
                of_vswitch: &self.settings.vswitch_zones,
                fallback,
                no_stock: &self.settings.no_stock_zones,
            },
        )
    }

    /// A fresh group id: `eci-`, two letters of the region, then a draw from the id counter.
    fn next_group_id(&mut self) -> String {
        self.id_counter += 1;
        format!(
            "eci-{}{}",
            self.settings
                .region
                .chars()
                .filter(char::is_ascii_alphabetic)
                .take(2)
                .collect::<String>(),
            rng::base36(rng::mix(self.id_counter ^ rng::mix(self.settings.seed)), 13)
        )
    }

    /// Gives the new `group` its image `source`: the event saying so, and the matched cache's
    /// use recorded.
    fn adopt_image_source(
        &mut self,
        group: &mut Group,
        source: image_cache::ImageSource,
        now: Millis,
    ) {
        if let Some((kind, reason, message)) = source.event() {
            group.event(now, kind, reason, message);
        }
        if let image_cache::ImageSource::Cache { id: cache }
        | image_cache::ImageSource::PartialCache { id: cache, .. } = &source
        {
            self.caches.matched(cache, now);
        }
        group.image_source = source;
    }

    /// DescribeContainerGroups.
    pub fn describe_groups(
        &mut self,
        request: &DescribeContainerGroupsRequest,
        now: Millis,
    ) -> Result<DescribeContainerGroupsResponse, EciError> {
        self.advance(now);
        validate::region(&request.region_id, &self.settings.region)?;
        validate::ids(&request.container_group_ids)?;
        validate::tags(&request.tag, "Tag")?;
        if !request.status.is_empty() && request.status.parse::<GroupStatus>().is_err() {
            return Err(validate::invalid(
                "Status",
                format!("{:?} is not a container group status", request.status),
            ));
        }
        let limit = validate::limit(request.limit, validate::DESCRIBE_GROUPS_MAX_LIMIT)?;
        let after = validate::next_token(&request.next_token)?;
        let ids: BTreeSet<&str> = request
            .container_group_ids
            .iter()
            .map(String::as_str)
            .collect();
        let matches = |group: &Group| {
            (ids.is_empty() || ids.contains(group.id.as_str()))
                && (request.status.is_empty() || group.status.as_str() == request.status)
                && render::has_tags(&group.request.tag, &request.tag)
                && (request.container_group_name.is_empty()
                    || group.request.container_group_name == request.container_group_name)
                && (request.v_switch_id.is_empty() || group.vswitch() == request.v_switch_id)
                && (request.security_group_id.is_empty()
                    || group.request.security_group_id == request.security_group_id)
                && (request.zone_id.is_empty() || group.zone(&self.settings) == request.zone_id)
                && (request.resource_group_id.is_empty()
                    || group.request.resource_group_id == request.resource_group_id)
        };
        // A status filter goes stale as groups progress; other filters only with `generation`.
        // Named groups are counted as they are looked up: no key, so no other count is evicted.
        let key = (request.status.is_empty() && ids.is_empty()).then(|| {
            format!(
                "groups|{:?}|{}|{}|{}|{}|{}",
                request.tag,
                request.container_group_name,
                request.v_switch_id,
                request.security_group_id,
                request.zone_id,
                request.resource_group_id
            )
        });
        let cached = cached_count(self.count_cache.as_ref(), self.generation, key.as_deref());
        let (page, next_token, total) = paginate(&self.groups, &ids, after, limit, matches, cached);
        if let Some(key) = key {
            self.count_cache = Some((self.generation, key, total));
        }
        Ok(DescribeContainerGroupsResponse {
            request_id: String::new(),
            container_groups: page
                .into_iter()
                .map(|group| render::container_group(group, &self.settings, request.with_event))
                .collect(),
            next_token,
            total_count: i32::try_from(total).unwrap_or(i32::MAX),
        })
    }

    /// CreateImageCache: the cache's id.
    pub fn create_image_cache(
        &mut self,
        request: &CreateImageCacheRequest,
        now: Millis,
    ) -> Result<String, EciError> {
        self.advance(now);
        self.caches.create(request, &self.settings, now)
    }

    /// DescribeImageCaches.
    pub fn describe_image_caches(
        &mut self,
        request: &DescribeImageCachesRequest,
        now: Millis,
    ) -> Result<DescribeImageCachesResponse, EciError> {
        self.advance(now);
        self.caches.describe(request, &self.settings, now)
    }

    /// UpdateImageCache.
    pub fn update_image_cache(
        &mut self,
        request: &UpdateImageCacheRequest,
        now: Millis,
    ) -> Result<(), EciError> {
        self.advance(now);
        self.caches.update(request, &self.settings, now)
    }

    /// DeleteImageCache.
    pub fn delete_image_cache(
        &mut self,
        request: &DeleteImageCacheRequest,
        now: Millis,
    ) -> Result<(), EciError> {
        self.advance(now);
        self.caches.delete(request, &self.settings, now)
    }

    /// DescribeContainerGroupStatus.
    pub fn describe_status(
        &mut self,
        request: &DescribeContainerGroupStatusRequest,
        now: Millis,
    ) -> Result<DescribeContainerGroupStatusResponse, EciError> {
        self.advance(now);
        validate::region(&request.region_id, &self.settings.region)?;
        validate::ids(&request.container_group_ids)?;
        validate::tags(&request.tag, "Tag")?;
        let limit = validate::limit(request.limit, validate::DESCRIBE_STATUS_MAX_LIMIT)?;
        let after = validate::next_token(&request.next_token)?;
        let ids: BTreeSet<&str> = request
            .container_group_ids
            .iter()
            .map(String::as_str)
            .collect();
        let matches = |group: &Group| {
            (ids.is_empty() || ids.contains(group.id.as_str()))
                && render::has_tags(&group.request.tag, &request.tag)
                && (request.zone_id.is_empty() || group.zone(&self.settings) == request.zone_id)
                && (request.resource_group_id.is_empty()
                    || group.request.resource_group_id == request.resource_group_id)
        };
        let (page, next_token, total) = match request.since_second {
            None => {
                let key = ids.is_empty().then(|| {
                    format!(
                        "status|{:?}|{}|{}",
                        request.tag, request.zone_id, request.resource_group_id
                    )
                });
                let cached =
                    cached_count(self.count_cache.as_ref(), self.generation, key.as_deref());
                let result = paginate(&self.groups, &ids, after, limit, matches, cached);
                if let Some(key) = key {
                    self.count_cache = Some((self.generation, key, result.2));
                }
                result
            }
            Some(seconds) if seconds > 0 => {
                // Only the groups changed in the window: read them off the change index, then
                // page through them in id order like any other listing.
                let since = now - i64::from(seconds) * 1_000;
                let mut changed: Vec<&Group> = self
                    .changes
                    .range((since, String::new())..)
                    .filter_map(|(_, id)| self.groups.get(id))
                    .filter(|group| matches(group))
                    .collect();
                changed.sort_unstable_by(|a, b| a.id.cmp(&b.id));
                page_of(changed, after, limit)
            }
            Some(seconds) => {
                return Err(validate::invalid(
                    "SinceSecond",
                    format!("{seconds} must be positive"),
                ));
            }
        };
        Ok(DescribeContainerGroupStatusResponse {
            request_id: String::new(),
            data: page
                .into_iter()
                .map(render::container_group_status)
                .collect(),
            next_token,
            total_count: i32::try_from(total).unwrap_or(i32::MAX),
        })
    }

    /// DeleteContainerGroup.
    pub fn delete(
        &mut self,
        request: &DeleteContainerGroupRequest,
        now: Millis,
    ) -> Result<(), EciError> {
        self.advance(now);
        validate::region(&request.region_id, &self.settings.region)?;
        validate::client_token(&request.client_token)?;
        self.group(&request.container_group_id)?;
        let force = request.force;
        let gone_now = self
            .with_group(&request.container_group_id, now, |group, cx| {
                group.begin_termination(force, cx)
            })
            .unwrap_or(true);
        if gone_now {
            self.remove(&request.container_group_id);
        }
        Ok(())
    }

    /// RestartContainerGroup.
    pub fn restart(
        &mut self,
        request: &RestartContainerGroupRequest,
        now: Millis,
    ) -> Result<(), EciError> {
        self.advance(now);
        validate::region(&request.region_id, &self.settings.region)?;
        let group = self.group(&request.container_group_id)?;
        if group.status != GroupStatus::Running {
            return Err(incorrect_status(group, "restarted", "Running"));
        }
        self.with_group(&request.container_group_id, now, |group, cx| {
            group.begin_restart(cx);
        });
        Ok(())
    }

    /// The request group `id` was created with (updates applied).
    pub fn created_with(&self, id: &str) -> Option<CreateContainerGroupRequest> {
        self.group(id).ok().map(|group| group.request.clone())
    }

    /// UpdateContainerGroup.
    pub fn update(
        &mut self,
        request: &UpdateContainerGroupRequest,
        now: Millis,
    ) -> Result<(), EciError> {
        self.advance(now);
        validate::region(&request.region_id, &self.settings.region)?;
        let group = self.group(&request.container_group_id)?;
        if !matches!(group.status, GroupStatus::Running | GroupStatus::Pending) {
            return Err(incorrect_status(group, "updated", "Running or Pending"));
        }
        let updated = updated_request(&group.request, request)?;
        let rewritten = rewritten_files(&group.request.volume, &updated.volume);
        let containers_changed = !request.container.is_empty()
            || (updated.volume != group.request.volume && rewritten.is_none());
        let valid = validate::create(
            &updated,
            &self.settings.region,
            self.settings.init_duration_ms,
        )?;
        self.generation += 1;
        self.with_group(&request.container_group_id, now, move |group, cx| {
            group.request = updated;
            group.restart_policy = valid.restart_policy;
            group.cpu = valid.cpu;
            group.memory = valid.memory;
            if containers_changed && group.status == GroupStatus::Running {
                group.begin_update(cx);
            } else if let Some(names) = rewritten.filter(|names| !names.is_empty()) {
                group.rewrite_files(&names, cx);
            } else {
                group.touch(cx.now);
            }
        });
        Ok(())
    }

    /// DescribeContainerLog.
    pub fn log(
        &mut self,
        request: &DescribeContainerLogRequest,
        now: Millis,
    ) -> Result<DescribeContainerLogResponse, EciError> {
        self.log_with(request, now, None)
    }

    /// DescribeContainerLog; with `real`, the container's real output (CRI log files the
    /// service read) instead of the synthetic lines.
    pub fn log_with(
        &mut self,
        request: &DescribeContainerLogRequest,
        now: Millis,
        real: Option<&logs::RealLogs>,
    ) -> Result<DescribeContainerLogResponse, EciError> {
        self.advance(now);
        validate::region(&request.region_id, &self.settings.region)?;
        let group = self.group(&request.container_group_id)?;
        if request.container_name.is_empty() {
            return Err(validate::missing("ContainerName"));
        }
        let (spec, run) = group
            .find_container(&request.container_name)
            .ok_or_else(|| unknown_container(group, &request.container_name))?;
        let query = log_query(request, now)?;
        let content = match real {
            Some(real) => logs::render_cri(real_log(real, run, request)?, query),
            None => simulated_log(spec, run, request, now, query)?,
        };
        Ok(DescribeContainerLogResponse {
            request_id: String::new(),
            container_name: spec.name.clone(),
            content,
        })
    }

    /// ExecContainerCommand.
    pub fn exec(
        &mut self,
        request: &ExecContainerCommandRequest,
        now: Millis,
    ) -> Result<ExecContainerCommandResponse, EciError> {
        self.advance(now);
        validate::region(&request.region_id, &self.settings.region)?;
        let group = self.group(&request.container_group_id)?;
        exec_command(&request.command)?;
        let (spec, run) = group
            .find_container(&request.container_name)
            .ok_or_else(|| unknown_container(group, &request.container_name))?;
        if !run.state.is_running() {
            return Err(EciError::new(
                codes::INCORRECT_STATUS,
                format!(
                    "Container {:?} of {} is not running, so no command can run in it.",
                    spec.name, group.id
                ),
            ));
        }
        let ip = group.ip.map(|ip| ip.to_string()).unwrap_or_default();
        let cx = exec_context(group, spec, &ip, now);
        // Real mode runs the command in the container (the service does, for `Sync`); the
        // simulated runtime answers from its interpreter and runs nothing.
        let real = self.settings.real_runtime;
        let sync_response = if request.sync && !real {
            exec::run(&request.command, cx)
        } else {
            String::new()
        };
        let pending = pending_exec(request, &group.id, cx, real);
        let session = format!(
            "{:016x}",
            rng::stable_hash(format!("{}/{}/{now}", group.id, spec.name).as_bytes())
        );
        let web_socket_uri = if request.sync {
            None
        } else {
            self.exec_sessions.open(pending, now)
        }
        .unwrap_or_else(|| {
            format!(
                "wss://eci-exec.{}.mock-eci.invalid/exec/{session}",
                self.settings.region
            )
        });
        Ok(ExecContainerCommandResponse {
            request_id: String::new(),
            web_socket_uri,
            http_url: format!(
                "https://eci-exec.{}.mock-eci.invalid/exec/{session}",
                self.settings.region
            ),
            sync_response,
        })
    }

    /// Where interactive exec sessions are served (`ws://host:port`).
    pub fn set_exec_base(&mut self, base: String) {
        self.exec_sessions.set_base(base);
    }

    /// Takes the interactive exec session `session` for its one connection.
    pub fn take_exec(
        &mut self,
        session: &str,
        now: Millis,
    ) -> Option<crate::engine::exec_session::PendingExec> {
        self.exec_sessions.take(session, now)
    }

    /// DescribeContainerGroupMetric.
    pub fn metric(
        &mut self,
        request: &DescribeContainerGroupMetricRequest,
        now: Millis,
    ) -> Result<DescribeContainerGroupMetricResponse, EciError> {
        self.metric_with(request, now, None)
    }

    /// DescribeContainerGroupMetric; with `measured` (real mode), the figures are what the
    /// service read from the group's cgroups now. Nothing keeps earlier readings, so the
    /// answer then holds one record, taken now, when the window reaches now and the group
    /// runs: a series of past records would have to be made up.
    pub fn metric_with(
        &mut self,
        request: &DescribeContainerGroupMetricRequest,
        now: Millis,
        measured: Option<&usage::GroupMeasures>,
    ) -> Result<DescribeContainerGroupMetricResponse, EciError> {
        self.advance(now);
        validate::region(&request.region_id, &self.settings.region)?;
        let group = self.group(&request.container_group_id)?;
        let period = match request.period {
            None => 60,
            Some(period @ (15 | 60 | 600 | 3600)) => period,
            Some(other) => {
                return Err(validate::invalid(
                    "Period",
                    format!("{other}; use 15, 60, 600 or 3600"),
                ));
            }
        };
        let period_ms = i64::from(period) * 1_000;
        let time = |text: &str, param: &str| {
            parse_rfc3339(text).ok_or_else(|| {
                validate::invalid(param, format!("{text:?} is not an RFC 3339 time"))
            })
        };
        let end = if request.end_time.is_empty() {
            now
        } else {
            time(&request.end_time, "EndTime")?
        };
        let start = if request.start_time.is_empty() {
            end - 5 * 60_000
        } else {
            time(&request.start_time, "StartTime")?
        };
        if start > end {
            return Err(validate::invalid("StartTime", "must not be after EndTime"));
        }
        // Records exist while the group runs: from its start to its end or now.
        let running_from = group.provisioned_at.filter(|at| *at <= now);
        let running_until = group
            .succeeded_at
            .or(group.failed_at)
            .or(group.expired_at)
            .unwrap_or(now);
        let mut records = Vec::new();
        if let Some(measured) = measured {
            // To the second, as ECI writes times.
            let at = now - now.rem_euclid(1_000);
            let running = matches!(group.status, GroupStatus::Running | GroupStatus::Updating);
            if running && start <= at && at <= end {
                let no_measures = BTreeMap::new();
                let figures = measured.get(&group.id).unwrap_or(&no_measures);
                records.push(usage::record(group, &self.usage, at, true, Some(figures)));
            }
        } else if let Some(from) = running_from {
            let mut at = start.max(from) / period_ms * period_ms;
            if at < start.max(from) {
                at += period_ms;
            }
            while at <= end.min(running_until) && records.len() < 1_440 {
                records.push(usage::record(group, &self.usage, at, true, None));
                at += period_ms;
            }
        }
        Ok(DescribeContainerGroupMetricResponse {
            request_id: String::new(),
            container_group_id: group.id.clone(),
            records,
        })
    }

    /// DescribeMultiContainerGroupMetric.
    pub fn multi_metric(
        &mut self,
        request: &DescribeMultiContainerGroupMetricRequest,
        now: Millis,
    ) -> Result<DescribeMultiContainerGroupMetricResponse, EciError> {
        self.multi_metric_with(request, now, None)
    }

    /// DescribeMultiContainerGroupMetric; with `measured` (real mode), each group's CPU and
    /// memory figures are what the service read from its containers' cgroups.
    pub fn multi_metric_with(
        &mut self,
        request: &DescribeMultiContainerGroupMetricRequest,
        now: Millis,
        measured: Option<&usage::GroupMeasures>,
    ) -> Result<DescribeMultiContainerGroupMetricResponse, EciError> {
        self.advance(now);
        validate::region(&request.region_id, &self.settings.region)?;
        if request.container_group_ids.is_empty() {
            return Err(validate::missing("ContainerGroupIds"));
        }
        validate::ids(&request.container_group_ids)?;
        let with_containers = match request.metric_type.as_str() {
            "" | "summary" => false,
            "all" => true,
            other => {
                return Err(validate::invalid(
                    "MetricType",
                    format!("{other:?}; use summary or all"),
                ));
            }
        };
        let no_measures = std::collections::BTreeMap::new();
        let monitor_datas = request
            .container_group_ids
            .iter()
            .filter_map(|id| self.groups.get(id))
            .map(|group| MonitorData {
                container_group_id: group.id.clone(),
                // The newest sample, measured now: to the second, as ECI writes times. A group
                // updating its volumes keeps running, so it keeps its figures.
                records: if matches!(group.status, GroupStatus::Running | GroupStatus::Updating) {
                    vec![usage::record(
                        group,
                        &self.usage,
                        now - now.rem_euclid(1_000),
                        with_containers,
                        measured.map(|all| all.get(&group.id).unwrap_or(&no_measures)),
                    )]
                } else {
                    Vec::new()
                },
            })
            .collect();
        Ok(DescribeMultiContainerGroupMetricResponse {
            request_id: String::new(),
            monitor_datas,
        })
    }

    /// The load rules the metric calls follow.
    pub fn loads(&self) -> usage::LoadRules {
        self.usage.current()
    }

    /// Puts load rules in force from `now` on (a test switch); invalid rules change nothing.
    pub fn set_loads(&mut self, rules: usage::LoadRules, now: Millis) -> Result<(), String> {
        self.advance(now);
        self.usage.set(rules, now)
    }

    /// Out-of-band removal (a test switch): the group vanishes as if deleted elsewhere.
    pub fn vanish(&mut self, id: &str, now: Millis) -> Result<(), EciError> {
        self.advance(now);
        self.group(id)?;
        self.remove(id);
        Ok(())
    }

    /// Lines written into a running container's log (a test switch), at `now`.
    pub fn append_log(
        &mut self,
        id: &str,
        container: &str,
        lines: &[String],
        now: Millis,
    ) -> Result<(), EciError> {
        self.advance(now);
        self.group(id)?;
        self.with_group(id, now, |group, _| group.append_log(container, lines, now))
            .unwrap_or_else(|| Err(format!("no group {id}")))
            .map_err(|message| EciError::new(codes::INCORRECT_STATUS, message))
    }

    /// A running container exits now with `exit_code` (a test switch).
    pub fn exit_container(
        &mut self,
        id: &str,
        container: &str,
        exit_code: i32,
        now: Millis,
    ) -> Result<(), EciError> {
        self.advance(now);
        self.group(id)?;
        self.with_group(id, now, |group, cx| {
            group.exit_now(container, exit_code, cx)
        })
        .unwrap_or_else(|| Err(format!("no group {id}")))
        .map_err(|message| EciError::new(codes::INCORRECT_STATUS, message))
    }

    /// Spot reclaim announced (a test switch): the group gets the service's Warning event and
    /// runs on.
    pub fn announce_reclaim(&mut self, id: &str, now: Millis) -> Result<(), EciError> {
        self.advance(now);
        let group = self.group(id)?;
        if group.status.is_final() || group.status == GroupStatus::Terminating {
            return Err(incorrect_status(
                group,
                "announced for reclaim",
                "a non-final status",
            ));
        }
        self.with_group(id, now, |group, cx| group.announce_reclaim(cx.now));
        Ok(())
    }

    /// Spot reclaim (a test switch): the group ends `Expired`.
    pub fn expire(&mut self, id: &str, now: Millis) -> Result<(), EciError> {
        self.advance(now);
        let group = self.group(id)?;
        if group.status.is_final() || group.status == GroupStatus::Terminating {
            return Err(incorrect_status(group, "expired", "a non-final status"));
        }
        self.with_group(id, now, |group, cx| group.expire(cx));
        Ok(())
    }

    /// The restart policy of a group (tests).
    pub fn restart_policy(&self, id: &str) -> Option<RestartPolicy> {
        self.groups.get(id).map(|group| group.restart_policy)
    }
}

fn fingerprint(request: &CreateContainerGroupRequest) -> u64 {
    rng::stable_hash(&request.encode_to_vec())
}

fn not_found(id: &str) -> EciError {
    EciError::new(
        codes::CONTAINER_GROUP_NOT_FOUND,
        format!("The container group {id:?} does not exist."),
    )
}

/// The create request of a group, `before`, with the update `request` applied: what the update
/// gives replaces what the group had, the rest stays.
fn updated_request(
    before: &CreateContainerGroupRequest,
    request: &UpdateContainerGroupRequest,
) -> Result<CreateContainerGroupRequest, EciError> {
    let mut updated = before.clone();
    if !request.tag.is_empty() {
        validate::tags(&request.tag, "Tag")?;
        updated.tag.clone_from(&request.tag);
    }
    if !request.restart_policy.is_empty() {
        updated.restart_policy.clone_from(&request.restart_policy);
    }
    if request.cpu.is_some() || request.memory.is_some() {
        updated.cpu = request.cpu;
        updated.memory = request.memory;
    }
    let incremental = is_incremental(&request.update_type)?;
    if !request.container.is_empty() {
        update_containers(&mut updated.container, &request.container, incremental)?;
    }
    if !request.volume.is_empty() {
        update_volumes(
            &mut updated.volume,
            &before.volume,
            &request.volume,
            incremental,
        )?;
    }
    if let Some(dns) = &request.dns_config {
        updated.dns_config = Some(dns.clone());
    }
    if !request.image_registry_credential.is_empty() {
        updated
            .image_registry_credential
            .clone_from(&request.image_registry_credential);
    }
    Ok(updated)
}

/// `UpdateType`: whether the update changes only the containers and volumes it names
/// (`IncrementalUpdate`) rather than replacing them all (`RenewUpdate`, the default).
fn is_incremental(update_type: &str) -> Result<bool, EciError> {
    match update_type {
        "" | "RenewUpdate" => Ok(false),
        "IncrementalUpdate" => Ok(true),
        other => Err(validate::invalid(
            "UpdateType",
            format!("{other:?}; use RenewUpdate or IncrementalUpdate"),
        )),
    }
}

/// Applies the update's `changes` to `containers`: each replaces the container of its name
/// when `incremental`, else they replace the list.
fn update_containers(
    containers: &mut Vec<Container>,
    changes: &[Container],
    incremental: bool,
) -> Result<(), EciError> {
    if !incremental {
        *containers = changes.to_vec();
        return Ok(());
    }
    for change in changes {
        let slot = containers
            .iter_mut()
            .find(|existing| existing.name == change.name)
            .ok_or_else(|| {
                validate::invalid(
                    "Container.Name",
                    format!("the group has no container {:?}", change.name),
                )
            })?;
        *slot = change.clone();
    }
    Ok(())
}

/// Applies the update's `changes` to `volumes` (the group's were `before`), keeping the file
/// modes the update cannot give: each replaces the volume of its name when `incremental`, else
/// they replace the list.
fn update_volumes(
    volumes: &mut Vec<Volume>,
    before: &[Volume],
    changes: &[Volume],
    incremental: bool,
) -> Result<(), EciError> {
    if !incremental {
        *volumes = changes
            .iter()
            .map(
                |change| match before.iter().find(|v| v.name == change.name) {
                    Some(before) => with_kept_modes(before, change.clone()),
                    None => change.clone(),
                },
            )
            .collect();
        return Ok(());
    }
    // Volumes are matched by name, like containers: the others stay as they are.
    for change in changes {
        let slot = volumes
            .iter_mut()
            .find(|existing| existing.name == change.name)
            .ok_or_else(|| {
                validate::invalid(
                    "Volume.Name",
                    format!("the group has no volume {:?}", change.name),
                )
            })?;
        *slot = with_kept_modes(slot, change.clone());
    }
    Ok(())
}

/// `after` with the file modes of `before`: UpdateContainerGroup has no `Mode` or
/// `DefaultMode` parameter, so a rewritten file keeps the mode it was created with (by path)
/// and the volume its default mode.
fn with_kept_modes(before: &Volume, mut after: Volume) -> Volume {
    let (Some(old), Some(new)) = (&before.config_file_volume, &mut after.config_file_volume) else {
        return after;
    };
    if new.default_mode.is_none() {
        new.default_mode = old.default_mode;
    }
    for file in &mut new.config_file_to_path {
        if file.mode.is_none() {
            file.mode = old
                .config_file_to_path
                .iter()
                .find(|o| o.path == file.path)
                .and_then(|o| o.mode);
        }
    }
    after
}

/// The names of the `ConfigFileVolume`s whose files an update changes, when that is all it
/// changes about the volumes (the same volumes, in the same order, of the same types): such an
/// update rewrites the files in place. `None` when anything else about the volumes changes.
fn rewritten_files(before: &[Volume], after: &[Volume]) -> Option<Vec<String>> {
    if before.len() != after.len() {
        return None;
    }
    let mut names = Vec::new();
    for (old, new) in before.iter().zip(after) {
        if old == new {
            continue;
        }
        let only_files = old.name == new.name
            && old.r#type == new.r#type
            && new.r#type == "ConfigFileVolume"
            && Volume {
                config_file_volume: None,
                ..old.clone()
            } == Volume {
                config_file_volume: None,
                ..new.clone()
            };
        if !only_files {
            return None;
        }
        names.push(new.name.clone());
    }
    Some(names)
}

fn incorrect_status(group: &Group, action: &str, allowed: &str) -> EciError {
    EciError::new(
        codes::INCORRECT_STATUS,
        format!(
            "The container group {} is {} and cannot be {action}; it must be {allowed}.",
            group.id, group.status
        ),
    )
}

fn unknown_container(group: &Group, name: &str) -> EciError {
    let names: Vec<&str> = group
        .request
        .container
        .iter()
        .chain(&group.request.init_container)
        .map(|c| c.name.as_str())
        .collect();
    validate::invalid(
        "ContainerName",
        format!(
            "the group {} has no container {name:?} (it has {})",
            group.id,
            names.join(", ")
        ),
    )
}

/// One page of the groups after `after` that match, the token for the next page, and the number
/// of matches overall.
fn paginate<'a>(
    groups: &'a BTreeMap<String, Group>,
    ids: &BTreeSet<&str>,
    after: Option<&str>,
    limit: usize,
    matches: impl Fn(&Group) -> bool,
    known_total: Option<usize>,
) -> (Vec<&'a Group>, String, usize) {
    // Named groups are looked up, not found by scanning every group: a status poll names a
    // page of ids, and the account may hold tens of thousands.
    if !ids.is_empty() {
        let named: Vec<&Group> = ids
            .iter()
            .filter_map(|id| groups.get(*id))
            .filter(|group| matches(group))
            .collect();
        return page_of(named, after, limit);
    }
    let start = after.map_or(Bound::Unbounded, |after| Bound::Excluded(after.to_owned()));
    let page: Vec<&Group> = groups
        .range((start, Bound::Unbounded))
        .map(|(_, group)| group)
        .filter(|group| matches(group))
        .take(limit + 1)
        .collect();
    let total =
        known_total.unwrap_or_else(|| groups.values().filter(|group| matches(group)).count());
    finish_page(page, limit, total)
}

/// One page of `sorted` (every match, in id order) after `after`, and their count.
fn page_of<'a>(
    sorted: Vec<&'a Group>,
    after: Option<&str>,
    limit: usize,
) -> (Vec<&'a Group>, String, usize) {
    let total = sorted.len();
    let start = after.map_or(0, |after| {
        sorted.partition_point(|group| group.id.as_str() <= after)
    });
    let page = sorted.into_iter().skip(start).take(limit + 1).collect();
    finish_page(page, limit, total)
}

/// The cached `TotalCount` for `key`, if still valid.
fn cached_count(
    cache: Option<&(u64, String, usize)>,
    generation: u64,
    key: Option<&str>,
) -> Option<usize> {
    match (cache, key) {
        (Some((cached_generation, cached_key, total)), Some(key))
            if *cached_generation == generation && cached_key == key =>
        {
            Some(*total)
        }
        _ => None,
    }
}

fn finish_page(mut page: Vec<&Group>, limit: usize, total: usize) -> (Vec<&Group>, String, usize) {
    let next_token = if page.len() > limit {
        page.truncate(limit);
        page.last()
            .map(|group| group.id.clone())
            .unwrap_or_default()
    } else {
        String::new()
    };
    (page, next_token, total)
}

/// What a DescribeContainerLog request selects: `Tail`, `LimitBytes`, and the later of
/// `SinceSeconds` and `StartTime`.
fn log_query(request: &DescribeContainerLogRequest, now: Millis) -> Result<LogQuery, EciError> {
    let tail = match request.tail {
        None => 500,
        Some(tail) if (1..=2000).contains(&tail) => usize::try_from(tail).unwrap_or(500),
        Some(tail) => {
            return Err(validate::invalid(
                "Tail",
                format!("{tail} is out of range; use 1 to 2000"),
            ));
        }
    };
    let limit_bytes = match request.limit_bytes {
        None => None,
        Some(bytes) if (1..=1_048_576).contains(&bytes) => usize::try_from(bytes).ok(),
        Some(bytes) => {
            return Err(validate::invalid(
                "LimitBytes",
                format!("{bytes} is out of range; use 1 to 1048576"),
            ));
        }
    };
    Ok(LogQuery {
        since: log_since(request, now)?,
        tail,
        limit_bytes,
        timestamps: request.timestamps,
    })
}

/// The earliest time a log request wants: the later of `SinceSeconds` before `now` and
/// `StartTime`, when either is given.
fn log_since(
    request: &DescribeContainerLogRequest,
    now: Millis,
) -> Result<Option<Millis>, EciError> {
    let since = request
        .since_seconds
        .map(|seconds| {
            if seconds > 0 {
                Ok(now - i64::from(seconds) * 1_000)
            } else {
                Err(validate::invalid(
                    "SinceSeconds",
                    format!("{seconds} must be positive"),
                ))
            }
        })
        .transpose()?;
    if request.start_time.is_empty() {
        return Ok(since);
    }
    let start = parse_rfc3339(&request.start_time).ok_or_else(|| {
        validate::invalid(
            "StartTime",
            format!("{:?} is not an RFC 3339 time", request.start_time),
        )
    })?;
    Ok(Some(since.map_or(start, |s| s.max(start))))
}

/// The synthetic log a request asks for: the current run's, or with `LastTime` the previous
/// run's.
fn simulated_log(
    spec: &Container,
    run: &ContainerRun,
    request: &DescribeContainerLogRequest,
    now: Millis,
    query: LogQuery,
) -> Result<String, EciError> {
    let state: &RunState = if request.last_time {
        run.previous
            .as_ref()
            .ok_or_else(|| no_previous_log(&request.container_name))?
    } else {
        &run.state
    };
    Ok(logs::render(
        &spec.name,
        &spec.image,
        state,
        run.behaviour.log_interval_ms,
        now,
        &run.appended,
        query,
    ))
}

/// The real log a request asks for: the current run's, or with `LastTime` the ended run's.
fn real_log<'a>(
    real: &'a logs::RealLogs,
    run: &ContainerRun,
    request: &DescribeContainerLogRequest,
) -> Result<&'a str, EciError> {
    if !request.last_time {
        return Ok(real.current.as_str());
    }
    // During a back-off the ended run's log is still the live one: the runtime sets it aside
    // only when it starts the next run.
    let ended_run_still_live = run.previous.is_some().then_some(real.current.as_str());
    real.previous
        .as_deref()
        .or(ended_run_still_live)
        .ok_or_else(|| no_previous_log(&request.container_name))
}

/// `Command`: 1 to 20 items of at most 256 characters.
fn exec_command(command: &[String]) -> Result<(), EciError> {
    if command.is_empty() {
        return Err(validate::missing("Command"));
    }
    if command.len() > 20 || command.iter().any(|part| part.chars().count() > 256) {
        return Err(validate::invalid(
            "Command",
            "give at most 20 items of at most 256 characters",
        ));
    }
    Ok(())
}

/// What a command run in `container` of `group` sees.
fn exec_context<'a>(
    group: &'a Group,
    container: &'a Container,
    pod_ip: &'a str,
    now: Millis,
) -> exec::ExecContext<'a> {
    exec::ExecContext {
        container,
        // `HostName` when the create named one; the group's name otherwise, as ECI does.
        hostname: if group.request.host_name.is_empty() {
            &group.request.container_group_name
        } else {
            &group.request.host_name
        },
        group_name: &group.request.container_group_name,
        pod_ip,
        now,
    }
}

/// An exec waiting for its WebSocket: it runs in the container itself in `real` mode, in the
/// simulation otherwise.
fn pending_exec(
    request: &ExecContainerCommandRequest,
    group: &str,
    cx: exec::ExecContext<'_>,
    real: bool,
) -> exec_session::PendingExec {
    exec_session::PendingExec {
        command: request.command.clone(),
        tty: request.tty,
        stdin: request.stdin.unwrap_or(true),
        group: group.to_owned(),
        container: cx.container.name.clone(),
        target: if real {
            exec_session::ExecTarget::Container
        } else {
            exec_session::ExecTarget::Simulated(exec::Simulation::of(cx))
        },
        expires: cx.now + exec_session::SESSION_TTL_MS,
    }
}

/// DescribeContainerLog's refusal of `LastTime` for a container that has not restarted.
fn no_previous_log(container: &str) -> EciError {
    validate::invalid(
        "LastTime",
        format!("container {container:?} has not restarted, so it has no previous log"),
    )
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::{Container, Tag};

    use super::*;

    fn mk_request(name: &str, node: &str) -> CreateContainerGroupRequest {
        CreateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            security_group_id: "sg".into(),
            v_switch_id: "vsw".into(),
            container_group_name: name.into(),
            tag: vec![Tag {
                key: "node".into(),
                value: node.into(),
            }],
            container: vec![Container {
                name: "app".into(),
                image: "nginx".into(),
                ..Container::default()
            }],
            ..CreateContainerGroupRequest::default()
        }
    }

    fn status_request(
        node: &str,
        limit: i32,
        next_token: &str,
    ) -> DescribeContainerGroupStatusRequest {
        DescribeContainerGroupStatusRequest {
            region_id: "cn-hangzhou".into(),
            tag: vec![Tag {
                key: "node".into(),
                value: node.into(),
            }],
            limit: Some(limit),
            next_token: next_token.into(),
            ..DescribeContainerGroupStatusRequest::default()
        }
    }

    fn files(volume: &Volume) -> Vec<(String, Option<i32>)> {
        volume
            .config_file_volume
            .iter()
            .flat_map(|v| &v.config_file_to_path)
            .map(|f| (f.path.clone(), f.mode))
            .collect()
    }

    #[test]
    fn a_disk_is_one_groups_until_that_group_is_deleted() {
        use eci_proto::v20180808::DiskVolume;
        let with_disk = |name: &str, token: &str, disk: &str| {
            let mut request = mk_request(name, "vn-0");
            request.client_token = token.into();
            request.volume = vec![Volume {
                name: "data".into(),
                r#type: "DiskVolume".into(),
                disk_volume: Some(DiskVolume {
                    disk_id: disk.into(),
                    fs_type: "ext4".into(),
                    disk_size: 20,
                }),
                ..Volume::default()
            }];
            request
        };
        let mut engine = Engine::new(Settings::default());
        let first = engine
            .create(with_disk("group-a", "t-a", "d-1"), 0)
            .unwrap();
        // The same create again (a lost answer's retry) is the same group, not a conflict.
        assert_eq!(
            engine
                .create(with_disk("group-a", "t-a", "d-1"), 1)
                .unwrap(),
            first
        );
        let refused = engine
            .create(with_disk("group-b", "t-b", "d-1"), 2)
            .unwrap_err();
        assert_eq!(refused.code, codes::DISK_IN_USE);
        assert!(
            refused.message.contains("d-1") && refused.message.contains(&first),
            "{refused}"
        );
        // Another disk is free.
        engine
            .create(with_disk("group-c", "t-c", "d-2"), 3)
            .unwrap();
        // A DiskVolume without its disk is refused as ECI refuses an incomplete volume.
        let missing = engine
            .create(with_disk("group-d", "t-d", ""), 4)
            .unwrap_err();
        assert!(
            missing.code.starts_with(codes::INVALID_PARAMETER)
                && missing.message.contains("DiskId"),
            "{missing}"
        );
        engine
            .delete(
                &DeleteContainerGroupRequest {
                    region_id: "cn-hangzhou".into(),
                    container_group_id: first.clone(),
                    force: true,
                    ..DeleteContainerGroupRequest::default()
                },
                5,
            )
            .unwrap();
        // Gone once its termination ran (a forced delete: at once, or within its grace).
        let mut later = 6;
        for _ in 0..120 {
            if !engine.groups.contains_key(&first) {
                break;
            }
            later += 1_000;
            engine.advance(later);
        }
        assert!(!engine.groups.contains_key(&first), "the group went");
        engine
            .create(with_disk("group-b", "t-b", "d-1"), later)
            .unwrap();
    }

    #[test]
    fn a_group_is_described_with_its_network_and_size_from_creation_on() {
        let mut engine = Engine::new(Settings::default());
        let describe = |engine: &mut Engine, id: &str| {
            let answer = engine
                .describe_groups(
                    &DescribeContainerGroupsRequest {
                        region_id: "cn-hangzhou".into(),
                        container_group_ids: vec![id.to_owned()],
                        ..DescribeContainerGroupsRequest::default()
                    },
                    0,
                )
                .unwrap();
            answer.container_groups[0].clone()
        };
        let plain = engine.create(mk_request("plain", "vn-0"), 0).unwrap();
        let mut with_eip = mk_request("eip", "vn-0");
        with_eip.auto_create_eip = true;
        let with_eip = engine.create(with_eip, 0).unwrap();
        let mut bound = mk_request("bound", "vn-0");
        bound.eip_instance_id = "eip-1".into();
        let bound = engine.create(bound, 0).unwrap();

        let group = describe(&mut engine, &plain);
        assert!(group.eni_instance_id.starts_with("eni-"), "{group:?}");
        assert!(group.vpc_id.starts_with("vpc-"), "{group:?}");
        assert!(group.cpu > 0.0 && group.memory > 0.0, "{group:?}");
        assert_eq!(group.internet_ip, "", "no EIP asked for");
        for id in [&with_eip, &bound] {
            let group = describe(&mut engine, id);
            let address: std::net::Ipv4Addr = group.internet_ip.parse().unwrap();
            assert!(
                !address.is_private() && !address.is_unspecified(),
                "{address}"
            );
            assert_eq!(
                describe(&mut engine, id).internet_ip,
                group.internet_ip,
                "stable"
            );
        }
    }

    #[test]
    fn a_create_lands_in_the_first_listed_zone_with_stock_and_says_where() {
        let settings = Settings {
            vswitch_zones: [
                ("vsw-a", "zone-a"),
                ("vsw-b", "zone-b"),
                ("vsw-c", "zone-c"),
            ]
            .into_iter()
            .map(|(v, z)| (v.to_owned(), z.to_owned()))
            .collect(),
            ..Settings::default()
        };
        let mut engine = Engine::new(settings);
        engine.set_no_stock_zones(["zone-a".to_owned(), "zone-b".to_owned()].into());
        let described = |engine: &mut Engine, id: &str| {
            let answer = engine
                .describe_groups(
                    &DescribeContainerGroupsRequest {
                        region_id: "cn-hangzhou".into(),
                        container_group_ids: vec![id.to_owned()],
                        ..DescribeContainerGroupsRequest::default()
                    },
                    1,
                )
                .unwrap();
            let group = &answer.container_groups[0];
            (group.zone_id.clone(), group.v_switch_id.clone())
        };
        // Random order (the default): only c has stock.
        let mut request = mk_request("web", "vn-0");
        request.v_switch_id = "vsw-a,vsw-b,vsw-c".into();
        let id = engine.create(request, 0).unwrap();
        assert_eq!(
            described(&mut engine, &id),
            ("zone-c".into(), "vsw-c".into())
        );
        // Ordered: stock back in b, so b (listed before c) wins over c.
        engine.set_no_stock_zones(["zone-a".to_owned()].into());
        let mut request = mk_request("ordered", "vn-0");
        request.v_switch_id = "vsw-a,vsw-b,vsw-c".into();
        request.schedule_strategy = "VSwitchOrdered".into();
        let id = engine.create(request, 0).unwrap();
        assert_eq!(
            described(&mut engine, &id),
            ("zone-b".into(), "vsw-b".into())
        );
        // No stock in any listed zone: refused at once, nothing created.
        engine.set_no_stock_zones(
            [
                "zone-a".to_owned(),
                "zone-b".to_owned(),
                "zone-c".to_owned(),
            ]
            .into(),
        );
        let before = engine.len();
        let mut request = mk_request("none", "vn-0");
        request.v_switch_id = "vsw-a,vsw-b,vsw-c".into();
        let error = engine.create(request, 0).unwrap_err();
        assert_eq!(error.code, codes::NO_STOCK);
        assert_eq!(engine.len(), before);
        // An unmapped vSwitch is in the default zone, which has stock.
        let id = engine.create(mk_request("plain", "vn-0"), 0).unwrap();
        assert_eq!(
            described(&mut engine, &id),
            ("cn-hangzhou-k".into(), "vsw".into())
        );
        // A strategy the service does not know is refused.
        let mut request = mk_request("odd", "vn-0");
        request.schedule_strategy = "Closest".into();
        let error = engine.create(request, 0).unwrap_err();
        assert!(
            error.code.starts_with(codes::INVALID_PARAMETER),
            "{error:?}"
        );
    }

    #[test]
    fn the_port_echo_wants_the_tcp_ports_of_running_groups_at_their_ips() {
        use eci_proto::v20180808::Port;
        let with_ports = |name: &str, ports: &[(i32, &str)]| {
            let mut request = mk_request(name, "vn-0");
            request.container[0].port = ports
                .iter()
                .map(|(port, protocol)| Port {
                    port: *port,
                    protocol: (*protocol).into(),
                })
                .collect();
            request
        };
        let mut engine = Engine::new(Settings::default());
        let web = engine
            .create(
                with_ports("web", &[(80, "TCP"), (53, "UDP"), (8080, "")]),
                0,
            )
            .unwrap();
        // Created later: still provisioning (2 to 4 s by default) when asked.
        let late = engine
            .create(with_ports("late", &[(81, "TCP")]), 9_000)
            .unwrap();
        let at = |engine: &Engine, id: &str, port: u16| {
            SocketAddr::new(engine.group(id).unwrap().ip.unwrap().into(), port)
        };
        assert_eq!(
            engine.running_tcp_ports(10_000),
            HashSet::from([at(&engine, &web, 80), at(&engine, &web, 8080)]),
            "UDP and a pending group left out"
        );
        let delete = DeleteContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            container_group_id: web,
            ..DeleteContainerGroupRequest::default()
        };
        engine.delete(&delete, 10_000).unwrap();
        assert_eq!(
            engine.running_tcp_ports(60_000),
            HashSet::from([at(&engine, &late, 81)]),
            "a deleted group's ports go, a group that came to run has its own"
        );
    }

    #[test]
    fn a_reclaim_is_announced_ahead_and_the_group_runs_on() {
        let mut engine = Engine::new(Settings::default());
        let id = engine.create(mk_request("spot", "vn-0"), 0).unwrap();
        // Past provisioning (2 to 4 s by default): Running.
        engine.announce_reclaim(&id, 10_000).unwrap();
        let group = engine.group(&id).unwrap();
        assert_eq!(group.status, GroupStatus::Running);
        assert!(
            group
                .events
                .iter()
                .any(|e| e.kind == "Warning" && e.reason == group::SPOT_TO_BE_RELEASED),
            "{:?}",
            group.events
        );
        engine.expire(&id, 11_000).unwrap();
        let error = engine.announce_reclaim(&id, 12_000).unwrap_err();
        assert_eq!(
            error.code,
            codes::INCORRECT_STATUS,
            "a reclaimed group is final"
        );
    }

    #[test]
    fn an_update_without_modes_keeps_the_files_modes() {
        use eci_proto::v20180808::{ConfigFileToPath, ConfigFileVolume};
        let volume = |content: &str, mode: Option<i32>, default_mode: Option<i32>| Volume {
            name: "token".into(),
            r#type: "ConfigFileVolume".into(),
            config_file_volume: Some(ConfigFileVolume {
                config_file_to_path: vec![
                    ConfigFileToPath {
                        path: "token".into(),
                        content: content.into(),
                        mode,
                    },
                    ConfigFileToPath {
                        path: "ca.crt".into(),
                        content: "Y2E=".into(),
                        mode: None,
                    },
                ],
                default_mode,
            }),
            ..Volume::default()
        };
        let mut engine = Engine::new(Settings::default());
        let mut request = mk_request("web", "vn-0");
        request.volume = vec![volume("b2xk", Some(0o600), Some(0o440))];
        let id = engine.create(request, 0).unwrap();
        // What UpdateContainerGroup can say: paths and contents, no modes.
        let update = UpdateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            container_group_id: id.clone(),
            volume: vec![volume("bmV3", None, None)],
            ..UpdateContainerGroupRequest::default()
        };
        engine.update(&update, 1).unwrap();
        let stored = &engine.group(&id).unwrap().request.volume[0];
        assert_eq!(
            files(stored),
            [
                ("token".to_owned(), Some(0o600)),
                ("ca.crt".to_owned(), None)
            ]
        );
        let kept = stored.config_file_volume.as_ref().unwrap();
        assert_eq!(kept.default_mode, Some(0o440));
        assert_eq!(
            kept.config_file_to_path[0].content, "bmV3",
            "the content is new"
        );
    }

    #[test]
    fn total_count_follows_groups_appearing_and_disappearing() {
        let mut engine = Engine::new(Settings::default());
        for i in 0..5 {
            engine
                .create(mk_request(&format!("a-{i}"), "vn-0"), 0)
                .unwrap();
        }
        engine.create(mk_request("other", "vn-1"), 0).unwrap();
        let first = engine
            .describe_status(&status_request("vn-0", 2, ""), 0)
            .unwrap();
        assert_eq!(first.total_count, 5);
        let extra = engine.create(mk_request("a-late", "vn-0"), 0).unwrap();
        let second = engine
            .describe_status(&status_request("vn-0", 2, &first.next_token), 0)
            .unwrap();
        assert_eq!(
            second.total_count, 6,
            "a cached count must not hide a new group"
        );
        engine.vanish(&extra, 0).unwrap();
        let third = engine
            .describe_status(&status_request("vn-0", 2, &second.next_token), 0)
            .unwrap();
        assert_eq!(third.total_count, 5);
    }

    #[test]
    fn since_second_pages_in_id_order() {
        let mut engine = Engine::new(Settings::default());
        let mut ids: Vec<String> = (0..7)
            .map(|i| {
                engine
                    .create(mk_request(&format!("s-{i}"), "vn-0"), 0)
                    .unwrap()
            })
            .collect();
        ids.sort();
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let mut request = status_request("vn-0", 3, &token);
            request.since_second = Some(1);
            let page = engine.describe_status(&request, 100).unwrap();
            assert_eq!(page.total_count, 7);
            seen.extend(
                page.data
                    .into_iter()
                    .map(|status| status.container_group_id),
            );
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        assert_eq!(seen, ids);
        // Nothing changed in the last second at 60 s: every group was Running by 4 s.
        let mut request = status_request("vn-0", 3, "");
        request.since_second = Some(1);
        assert!(
            engine
                .describe_status(&request, 60_000)
                .unwrap()
                .data
                .is_empty()
        );
    }

    #[test]
    fn named_groups_page_in_id_order_with_the_other_filters_applied() {
        let mut engine = Engine::new(Settings::default());
        let mine: Vec<String> = (0..5)
            .map(|i| {
                engine
                    .create(mk_request(&format!("n-{i}"), "vn-0"), 0)
                    .unwrap()
            })
            .collect();
        let theirs = engine.create(mk_request("other", "vn-1"), 0).unwrap();
        let mut named = mine.clone();
        named.extend([theirs, "eci-gone".to_owned(), mine[0].clone()]);
        named.reverse();
        let mut expected = mine;
        expected.sort();

        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let mut request = status_request("vn-0", 2, &token);
            request.container_group_ids.clone_from(&named);
            let page = engine.describe_status(&request, 0).unwrap();
            assert_eq!(
                page.total_count, 5,
                "vn-1's group, an unknown id and a repeat are not counted"
            );
            seen.extend(page.data.into_iter().map(|s| s.container_group_id));
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        assert_eq!(seen, expected);

        let groups = engine
            .describe_groups(
                &DescribeContainerGroupsRequest {
                    region_id: "cn-hangzhou".into(),
                    container_group_ids: named,
                    tag: vec![Tag {
                        key: "node".into(),
                        value: "vn-0".into(),
                    }],
                    limit: Some(3),
                    ..DescribeContainerGroupsRequest::default()
                },
                0,
            )
            .unwrap();
        assert_eq!(groups.total_count, 5);
        let ids: Vec<_> = groups
            .container_groups
            .iter()
            .map(|g| g.container_group_id.clone())
            .collect();
        assert_eq!(ids, expected[..3]);
        assert_eq!(groups.next_token, expected[2]);
    }

    #[test]
    fn restored_engine_reuses_no_address_and_no_id() {
        let settings = Settings {
            ip_cidr: "10.0.0.0/29".parse().unwrap(),
            ..Settings::default()
        };
        let mut engine = Engine::new(settings.clone());
        let a = engine.create(mk_request("g-a", "vn-0"), 0).unwrap();
        let b = engine.create(mk_request("g-b", "vn-0"), 0).unwrap();
        engine.advance(5_000);
        engine.vanish(&a, 5_000).unwrap();
        let snapshot = engine.snapshot(5_000);
        let mut restored = Engine::restore(settings, snapshot);
        let c = restored.create(mk_request("g-c", "vn-0"), 5_000).unwrap();
        assert!(c != a && c != b);
        let groups = restored.all_groups(10_000);
        let ip_of = |id: &str| {
            groups
                .iter()
                .find(|g| g.container_group_id == id)
                .unwrap()
                .intranet_ip
                .clone()
        };
        assert_eq!(ip_of(&b), "10.0.0.3");
        assert_eq!(
            ip_of(&c),
            "10.0.0.2",
            "the address `a` freed is reused, `b`'s is not"
        );
    }
}
