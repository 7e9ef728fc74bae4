//! Object storage: one resourceVersion counter, objects per type, and the ordered change log
//! that watches replay and follow.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use super::registry::TypeKey;

/// `ADDED`, `MODIFIED`, `DELETED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl ChangeKind {
    /// The watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion it produced.
    pub rv: u64,
    /// The type.
    pub key: TypeKey,
    /// The namespace (empty for cluster-scoped types).
    pub namespace: String,
    /// What happened.
    pub kind: ChangeKind,
    /// The object after the change (for a deletion: the last state, with the deletion's rv).
    pub object: Value,
    /// The object before the change, for modifications.
    pub old: Option<Value>,
}

/// Objects of one type by (namespace, name).
pub type Objects = BTreeMap<(String, String), Value>;

/// The storage.
#[derive(Debug)]
pub struct Store {
    rv: u64,
    objects: HashMap<TypeKey, Objects>,
    log: VecDeque<Arc<Change>>,
    log_capacity: usize,
    /// Changes with an rv at or below this are no longer in the log.
    compacted: u64,
    changes: broadcast::Sender<Arc<Change>>,
    /// Where each object (by uid) is, and which objects each uid owns: garbage collection must
    /// not scan every object on every delete.
    by_uid: HashMap<String, Location>,
    owned_by: HashMap<String, BTreeSet<Location>>,
}

/// An object's type, namespace and name.
pub type Location = (TypeKey, String, String);

fn uid_of(object: &Value) -> Option<&str> {
    object.pointer("/metadata/uid").and_then(Value::as_str)
}

fn owner_uids(object: &Value) -> impl Iterator<Item = &str> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

impl Store {
    /// Empty storage keeping the last `log_capacity` changes for watches.
    pub fn new(log_capacity: usize) -> Self {
        let (changes, _) = broadcast::channel(log_capacity.max(16));
        Self {
            rv: 1,
            objects: HashMap::new(),
            log: VecDeque::new(),
            log_capacity: log_capacity.max(1),
            compacted: 1,
            changes,
            by_uid: HashMap::new(),
            owned_by: HashMap::new(),
        }
    }

    /// The latest resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// Oldest resourceVersion a watch can start from.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Forgets the whole change log, as etcd compaction does (tests of 410 handling).
    pub fn compact(&mut self) {
        self.log.clear();
        self.compacted = self.rv;
    }

    /// The objects of a type.
    pub fn objects(&self, key: &TypeKey) -> Option<&Objects> {
        self.objects.get(key)
    }

    /// One object.
    pub fn get(&self, key: &TypeKey, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(key)?
            .get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Every (type, namespace, name) whose object satisfies `predicate`.
    pub fn find(&self, predicate: impl Fn(&Value) -> bool) -> Vec<(TypeKey, String, String)> {
        let mut found = Vec::new();
        for (key, objects) in &self.objects {
            for ((namespace, name), object) in objects {
                if predicate(object) {
                    found.push((key.clone(), namespace.clone(), name.clone()));
                }
            }
        }
        found
    }

    fn index(&mut self, location: &Location, object: &Value) {
        if let Some(uid) = uid_of(object) {
            self.by_uid.insert(uid.to_owned(), location.clone());
        }
        for owner in owner_uids(object) {
            self.owned_by
                .entry(owner.to_owned())
                .or_default()
                .insert(location.clone());
        }
    }

    fn unindex(&mut self, location: &Location, object: &Value) {
        if let Some(uid) = uid_of(object) {
            self.by_uid.remove(uid);
        }
        for owner in owner_uids(object) {
            if let Some(owned) = self.owned_by.get_mut(owner) {
                owned.remove(location);
                if owned.is_empty() {
                    self.owned_by.remove(owner);
                }
            }
        }
    }

    /// Whether an object with this uid exists.
    pub fn uid_exists(&self, uid: &str) -> bool {
        self.by_uid.contains_key(uid)
    }

    /// The objects that name `owner_uid` among their owners.
    pub fn dependents(&self, owner_uid: &str) -> Vec<Location> {
        self.owned_by
            .get(owner_uid)
            .map(|owned| owned.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Subscribes to changes committed from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Changes after `rv` still in the log, oldest first.
    pub fn changes_since(&self, rv: u64) -> impl Iterator<Item = &Arc<Change>> {
        self.log.iter().filter(move |change| change.rv > rv)
    }

    fn commit(
        &mut self,
        key: TypeKey,
        namespace: &str,
        kind: ChangeKind,
        object: Value,
        old: Option<Value>,
    ) {
        let change = Arc::new(Change {
            rv: self.rv,
            key,
            namespace: namespace.to_owned(),
            kind,
            object,
            old,
        });
        if self.log.len() == self.log_capacity {
            if let Some(dropped) = self.log.pop_front() {
                self.compacted = dropped.rv;
            }
        }
        self.log.push_back(change.clone());
        // Nobody listening is fine.
        let _ = self.changes.send(change);
    }

    fn next_rv(&mut self, object: &mut Value) -> u64 {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        self.rv
    }

    /// Stores a new object, stamping its resourceVersion.
    pub fn insert(
        &mut self,
        key: &TypeKey,
        namespace: &str,
        name: &str,
        mut object: Value,
    ) -> Value {
        self.next_rv(&mut object);
        self.index(
            &(key.clone(), namespace.to_owned(), name.to_owned()),
            &object,
        );
        self.objects
            .entry(key.clone())
            .or_default()
            .insert((namespace.to_owned(), name.to_owned()), object.clone());
        self.commit(
            key.clone(),
            namespace,
            ChangeKind::Added,
            object.clone(),
            None,
        );
        object
    }

    /// Replaces an object, stamping a new resourceVersion.
    pub fn replace(
        &mut self,
        key: &TypeKey,
        namespace: &str,
        name: &str,
        mut object: Value,
    ) -> Value {
        self.next_rv(&mut object);
        let old = self
            .objects
            .entry(key.clone())
            .or_default()
            .insert((namespace.to_owned(), name.to_owned()), object.clone());
        let location = (key.clone(), namespace.to_owned(), name.to_owned());
        if let Some(old) = &old {
            self.unindex(&location, old);
        }
        self.index(&location, &object);
        self.commit(
            key.clone(),
            namespace,
            ChangeKind::Modified,
            object.clone(),
            old,
        );
        object
    }

    /// Removes an object; the DELETED event carries the deletion's resourceVersion.
    pub fn remove(&mut self, key: &TypeKey, namespace: &str, name: &str) -> Option<Value> {
        let mut object = self
            .objects
            .get_mut(key)?
            .remove(&(namespace.to_owned(), name.to_owned()))?;
        self.unindex(
            &(key.clone(), namespace.to_owned(), name.to_owned()),
            &object,
        );
        self.next_rv(&mut object);
        self.commit(
            key.clone(),
            namespace,
            ChangeKind::Deleted,
            object.clone(),
            None,
        );
        Some(object)
    }
}
