//! Where the operator works: the whole cluster (the default), or only listed namespaces
//! (`--watch-namespaces`, chart value `watchNamespaces`: the chart then grants the namespaced
//! verbs through a Role in each of them and the ClusterRole keeps only what is cluster-wide).
//!
//! A namespace-scoped operator cannot list or watch cluster-wide, so every cache of a
//! namespaced kind is one watch per namespace. They cannot share one reflector store: each
//! watch's (re-)list replaces the whole store content, so namespace A's relist would drop B's
//! objects. [`ScopedStore`] is the set of per-namespace stores read as one.

use std::sync::Arc;

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

pub use crate::controllers::config::WatchScope;

/// Reads from a watch cache by object reference.
pub trait CacheRead<K: Resource<DynamicType = ()> + 'static>: Send + Sync {
    fn cached(&self, reference: &ObjectRef<K>) -> Option<Arc<K>>;
}

impl<K> CacheRead<K> for Store<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn cached(&self, reference: &ObjectRef<K>) -> Option<Arc<K>> {
        self.get(reference)
    }
}

/// One watch cache per watched namespace (or one for the whole cluster), read as one.
#[derive(Clone)]
pub struct ScopedStore<K: Resource<DynamicType = ()> + 'static> {
    /// `(None, store)`: cluster-wide; `(Some(namespace), store)`: that namespace only.
    parts: Vec<(Option<String>, Store<K>)>,
}

impl<K> ScopedStore<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    pub fn cluster(store: Store<K>) -> Self {
        ScopedStore {
            parts: vec![(None, store)],
        }
    }

    pub fn namespaced(parts: impl IntoIterator<Item = (String, Store<K>)>) -> Self {
        ScopedStore {
            parts: parts.into_iter().map(|(ns, s)| (Some(ns), s)).collect(),
        }
    }

    /// Every cached object, of all watched namespaces.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.parts.iter().flat_map(|(_, s)| s.state()).collect()
    }

    pub fn get(&self, reference: &ObjectRef<K>) -> Option<Arc<K>> {
        self.parts
            .iter()
            .filter(|(ns, _)| ns.is_none() || *ns == reference.namespace)
            .find_map(|(_, s)| s.get(reference))
    }
}

impl<K> CacheRead<K> for ScopedStore<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn cached(&self, reference: &ObjectRef<K>) -> Option<Arc<K>> {
        self.get(reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;

    fn config_map(namespace: &str, name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn empty_list_is_the_cluster_and_a_list_always_holds_the_operator_namespace() {
        assert_eq!(WatchScope::new("ops", &[]), WatchScope::Cluster);
        assert_eq!(
            WatchScope::new("ops", &[" ".into(), String::new()]),
            WatchScope::Cluster
        );
        let scope = WatchScope::new("ops", &["team-a".into(), "team-b".into()]);
        assert!(scope.contains("ops") && scope.contains("team-a") && scope.contains("team-b"));
        assert!(!scope.contains("team-c"));
        assert_eq!(scope.describe(), "namespaces ops, team-a, team-b");
        assert!(WatchScope::Cluster.contains("anything"));
    }

    #[test]
    fn one_namespaces_relist_does_not_drop_the_others_objects() {
        let (a, mut write_a) = store::<ConfigMap>();
        let (b, mut write_b) = store::<ConfigMap>();
        write_a.apply_watcher_event(&Event::Apply(config_map("a", "one")));
        write_b.apply_watcher_event(&Event::Apply(config_map("b", "two")));
        let scoped = ScopedStore::namespaced([("a".to_string(), a), ("b".to_string(), b)]);
        // A relist of namespace a that finds nothing.
        write_a.apply_watcher_event(&Event::Init);
        write_a.apply_watcher_event(&Event::InitDone);
        assert!(scoped.get(&ObjectRef::new("one").within("a")).is_none());
        assert!(scoped.get(&ObjectRef::new("two").within("b")).is_some());
        // A reference is only looked up in its own namespace's store.
        assert!(scoped.get(&ObjectRef::new("two").within("a")).is_none());
        assert_eq!(scoped.state().len(), 1);
    }
}
