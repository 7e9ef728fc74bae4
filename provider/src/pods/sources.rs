//! Keeping a running group's file volumes current, as the kubelet keeps a running pod's
//! `configMap`, `secret`, `projected` and `downwardAPI` volumes: which running pods show which
//! ConfigMaps and Secrets, or their own labels and annotations ([`Dependents`], pure), and the
//! watch that says when one of those objects changed ([`watch`]; the pod watch reports the
//! labels). A change schedules a push of the pod's file volumes through the token refresher's
//! queue ([`crate::pods::tokens`]), which rebuilds them from the objects as they are then and
//! hands them to the group with `UpdateContainerGroup`: the files change in place, no container
//! restarts.
//!
//! The watch is of metadata only (kube-runtime's `metadata_watcher`), so the daemon holds a
//! resourceVersion per object some pod shows, never the data. An object seen again after the
//! watch re-listed counts as changed only when its resourceVersion moved.

use std::collections::{BTreeSet, HashMap};

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::ops::chain::Chain;
use crate::pods::tokens::{Entry, TokenRefresher};
use vne_core::refs::{self, Kind};

/// An object a pod's volumes show as files.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Source {
    /// ConfigMap or Secret.
    pub kind: Kind,
    /// Its namespace (the pod's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl Source {
    /// The objects `pod`'s file volumes show.
    pub fn of(pod: &Pod) -> Vec<Self> {
        let namespace = pod.namespace().unwrap_or_default();
        let refs = refs::file_volume_references(pod);
        let config_maps = refs
            .config_maps
            .into_iter()
            .map(|name| (Kind::ConfigMap, name));
        let secrets = refs.secrets.into_iter().map(|name| (Kind::Secret, name));
        config_maps
            .chain(secrets)
            .map(|(kind, name)| Self {
                kind,
                namespace: namespace.clone(),
                name,
            })
            .collect()
    }
}

/// How the watch saw an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Created, changed or deleted while watched.
    Changed,
    /// Listed again after the watch re-listed: changed only if its resourceVersion moved.
    Listed,
}

/// The running pods whose files show an object, and the version they were last told of.
#[derive(Debug, Default)]
struct Readers {
    /// The pods (uids) that show the object.
    pods: BTreeSet<String>,
    /// Its resourceVersion when last seen by the watch.
    version: Option<String>,
}

/// What a running pod shows as files.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileInputs {
    /// The ConfigMaps and Secrets.
    pub sources: Vec<Source>,
    /// The fingerprint of the labels and annotations its downward API files show, if any.
    pub metadata: Option<u64>,
}

impl FileInputs {
    /// What `pod` shows.
    pub fn of(pod: &Pod) -> Self {
        Self {
            sources: Source::of(pod),
            metadata: vne_core::to_eci::downward_metadata(pod),
        }
    }

    fn is_empty(&self) -> bool {
        self.sources.is_empty() && self.metadata.is_none()
    }
}

/// Which running pods show which objects.
#[derive(Debug, Default)]
pub struct Dependents {
    pods: HashMap<String, (Entry, FileInputs)>,
    sources: HashMap<Source, Readers>,
}

impl Dependents {
    /// Pod `entry.uid` shows `shows` from now on (replacing what it showed before).
    pub fn register(&mut self, entry: Entry, shows: FileInputs) {
        self.forget(&entry.uid);
        if shows.is_empty() {
            return;
        }
        for source in &shows.sources {
            self.sources
                .entry(source.clone())
                .or_default()
                .pods
                .insert(entry.uid.clone());
        }
        self.pods.insert(entry.uid.clone(), (entry, shows));
    }

    /// The pod `uid` was seen with labels and annotations of fingerprint `metadata`: its entry
    /// when its downward API files show them and they changed.
    pub fn metadata_seen(&mut self, uid: &str, metadata: Option<u64>) -> Option<Entry> {
        let (entry, shows) = self.pods.get_mut(uid)?;
        let known = shows.metadata?;
        let now = metadata?;
        (known != now).then(|| {
            shows.metadata = Some(now);
            entry.clone()
        })
    }

    /// Pod `uid` is gone: it shows nothing any more.
    pub fn forget(&mut self, uid: &str) {
        let Some((_, shows)) = self.pods.remove(uid) else {
            return;
        };
        for source in shows.sources {
            if let Some(shown) = self.sources.get_mut(&source) {
                shown.pods.remove(uid);
                if shown.pods.is_empty() {
                    self.sources.remove(&source);
                }
            }
        }
    }

    /// The watch saw `source` at `version`: the pods whose file volumes must be pushed again.
    pub fn observed(&mut self, source: &Source, version: Option<&str>, seen: Seen) -> Vec<Entry> {
        let Some(shown) = self.sources.get_mut(source) else {
            return Vec::new();
        };
        let previous = std::mem::replace(&mut shown.version, version.map(str::to_owned));
        let changed = match seen {
            Seen::Changed => true,
            Seen::Listed => previous.is_some() && previous.as_deref() != version,
        };
        if !changed {
            return Vec::new();
        }
        shown
            .pods
            .iter()
            .filter_map(|uid| self.pods.get(uid).map(|(entry, _)| entry.clone()))
            .collect()
    }

    /// Pods registered.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether no pod is registered.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// Watches the metadata of every ConfigMap and Secret until `stop`, telling `refresher` what
/// it sees. A failing watch is retried with kube-runtime's back-off, and logged.
pub async fn watch(client: kube::Client, refresher: TokenRefresher, stop: CancellationToken) {
    let config_maps = changes::<ConfigMap>(&client, Kind::ConfigMap);
    let secrets = changes::<Secret>(&client, Kind::Secret);
    let mut both = futures::stream::select(config_maps, secrets);
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = both.next() => next,
        };
        match next {
            Some(Ok((source, version, seen))) => {
                refresher.source_observed(&source, version.as_deref(), seen);
            }
            Some(Err(error)) => {
                warn!(error = %Chain(&error), "cannot watch ConfigMaps and Secrets; volume contents are not kept current until it recovers");
            }
            None => return,
        }
    }
}

type Observation = (Source, Option<String>, Seen);

fn changes<K>(
    client: &kube::Client,
    kind: Kind,
) -> impl Stream<Item = Result<Observation, watcher::Error>> + Send + Unpin + use<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    K: Clone + std::fmt::Debug + Send + Sync + 'static,
{
    // An Api of PartialObjectMeta asks for metadata only.
    let api: Api<PartialObjectMeta<K>> = Api::all(client.clone());
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .map(move |event| {
            event.map(|event| match event {
                Event::Apply(meta) | Event::Delete(meta) => {
                    Some(observation(kind, &meta, Seen::Changed))
                }
                Event::InitApply(meta) => Some(observation(kind, &meta, Seen::Listed)),
                Event::Init | Event::InitDone => None,
            })
        })
        .filter_map(|event| async move { event.transpose() })
        .boxed()
}

fn observation<K>(kind: Kind, meta: &PartialObjectMeta<K>, seen: Seen) -> Observation {
    let source = Source {
        kind,
        namespace: meta.metadata.namespace.clone().unwrap_or_default(),
        name: meta.metadata.name.clone().unwrap_or_default(),
    };
    (source, meta.metadata.resource_version.clone(), seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(uid: &str) -> Entry {
        Entry {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("pod-{uid}"),
            group: format!("eci-{uid}"),
            duty: crate::pods::tokens::Duty::Push,
            attempt: 0,
        }
    }

    fn config_map(name: &str) -> Source {
        Source {
            kind: Kind::ConfigMap,
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn shows(config_maps: &[&str]) -> FileInputs {
        FileInputs {
            sources: config_maps.iter().map(|name| config_map(name)).collect(),
            metadata: None,
        }
    }

    #[test]
    fn a_pod_showing_its_labels_is_pushed_when_they_change() {
        let mut dependents = Dependents::default();
        dependents.register(
            entry("a"),
            FileInputs {
                sources: Vec::new(),
                metadata: Some(1),
            },
        );
        dependents.register(entry("b"), shows(&["app"]));
        assert_eq!(dependents.metadata_seen("a", Some(1)), None, "unchanged");
        assert_eq!(
            dependents.metadata_seen("a", Some(2)).map(|e| e.uid),
            Some("a".to_owned())
        );
        assert_eq!(
            dependents.metadata_seen("a", Some(2)),
            None,
            "once per change"
        );
        assert_eq!(
            dependents.metadata_seen("b", Some(7)),
            None,
            "its files show no labels"
        );
        assert_eq!(
            dependents.metadata_seen("c", Some(7)),
            None,
            "not running here"
        );
    }

    fn uids(entries: &[Entry]) -> Vec<&str> {
        entries.iter().map(|e| e.uid.as_str()).collect()
    }

    #[test]
    fn a_change_concerns_the_pods_that_show_the_object_until_they_are_gone() {
        let mut dependents = Dependents::default();
        dependents.register(entry("a"), shows(&["app", "root-ca"]));
        dependents.register(entry("b"), shows(&["root-ca"]));
        let app = config_map("app");
        let root = config_map("root-ca");
        assert_eq!(
            uids(&dependents.observed(&root, Some("2"), Seen::Changed)),
            ["a", "b"]
        );
        assert_eq!(
            uids(&dependents.observed(&app, Some("3"), Seen::Changed)),
            ["a"]
        );
        assert!(
            dependents
                .observed(&config_map("other"), Some("4"), Seen::Changed)
                .is_empty(),
            "an object no pod shows concerns nobody"
        );
        dependents.forget("a");
        assert!(
            dependents
                .observed(&app, Some("5"), Seen::Changed)
                .is_empty()
        );
        assert_eq!(
            uids(&dependents.observed(&root, Some("6"), Seen::Changed)),
            ["b"]
        );
        dependents.forget("b");
        assert!(dependents.is_empty());
        assert!(
            dependents.sources.is_empty(),
            "nothing is kept for objects nobody shows"
        );
    }

    #[test]
    fn a_relisted_object_counts_as_changed_only_when_its_version_moved() {
        let mut dependents = Dependents::default();
        dependents.register(entry("a"), shows(&["app"]));
        let app = config_map("app");
        // First sight in a listing: nothing to compare with, nothing pushed.
        assert!(
            dependents
                .observed(&app, Some("1"), Seen::Listed)
                .is_empty()
        );
        assert!(
            dependents
                .observed(&app, Some("1"), Seen::Listed)
                .is_empty()
        );
        assert_eq!(
            uids(&dependents.observed(&app, Some("2"), Seen::Listed)),
            ["a"]
        );
        // A live change is a change whatever the version says.
        assert_eq!(
            uids(&dependents.observed(&app, Some("2"), Seen::Changed)),
            ["a"]
        );
    }

    #[test]
    fn registering_again_replaces_what_the_pod_showed() {
        let mut dependents = Dependents::default();
        dependents.register(entry("a"), shows(&["old"]));
        dependents.register(entry("a"), shows(&["new"]));
        assert!(
            dependents
                .observed(&config_map("old"), Some("2"), Seen::Changed)
                .is_empty()
        );
        assert_eq!(
            uids(&dependents.observed(&config_map("new"), Some("2"), Seen::Changed)),
            ["a"]
        );
        dependents.register(entry("a"), FileInputs::default());
        assert!(dependents.is_empty());
    }
}
