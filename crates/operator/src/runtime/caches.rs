//! The runtime's watch-cache toolkit: caches kept current in the background (without
//! managedFields), shared caches whose subscriptions trigger controllers (held and drained
//! until this replica leads), per-namespace parts of a namespace-scoped operator, and the
//! watch backoff. Controllers wire themselves with these (`controllers::agent::wiring`,
//! `controllers::tailnet::wiring`); `run` only builds the shared caches.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::runtime::reflector::{self, ReflectHandle};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use crate::scope::{ScopedStore, WatchScope};

/// Selects the objects the operator creates for agents (owned-object watches).
pub const AGENT_SELECTOR: &str =
    "app.kubernetes.io/managed-by=tailnet-operator,app.kubernetes.io/name=tailnet-agent";

/// A watch cache kept up to date in the background (with the watch backoff below). Every
/// object is passed through `trim` before it is stored; managedFields are always dropped
/// (never read, and often the biggest part of an object).
pub fn cache_of<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    spawn_reflector(writer, api, config, trim);
    store
}

/// Keeps `writer`'s store filled from a watch of `api` (managed fields dropped, `trim`
/// applied), with the watch backoff, in a task of its own.
fn spawn_reflector<K>(
    writer: reflector::store::Writer<K>,
    api: Api<K>,
    config: watcher::Config,
    mut trim: impl FnMut(&mut K) + Send + 'static,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    tokio::spawn(
        reflector::reflector(
            writer,
            watcher(api, config).modify(move |object| {
                object.meta_mut().managed_fields = None;
                trim(object);
            }),
        )
        .backoff(WatchBackoff::default())
        .for_each(|_| async {}),
    );
}

/// How many object references a shared cache buffers per subscriber before its watch waits
/// (kube-runtime applies backpressure when a subscriber falls behind).
const SUBSCRIBER_BUFFER: usize = 1024;

/// [`cache_of`] whose events also trigger `subscribers` controllers (kube-runtime's shared
/// streams): each controller reads this store instead of keeping a watch and a full copy
/// of every object of its own (operator RSS at 1,000 resources, benchmark 4). A subscriber
/// yields an object after the store has it.
pub fn shared_cache_of<K>(
    api: Api<K>,
    config: watcher::Config,
    lead: &CancellationToken,
    subscribers: usize,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> Subscriptions<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store_shared::<K>(SUBSCRIBER_BUFFER);
    let held = (0..subscribers)
        .map(|_| {
            let handle = writer
                .subscribe()
                .expect("a shared store gives subscriptions");
            HeldSubscription::new(handle, lead.clone())
        })
        .collect();
    spawn_reflector(writer, api, config, trim);
    Subscriptions { store, held }
}

/// A shared cache's store and the subscriptions not handed out yet.
pub struct Subscriptions<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    pub store: reflector::Store<K>,
    held: Vec<HeldSubscription<K>>,
}

impl<K> Subscriptions<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The next subscription (each asked for when the cache was started); `None` when all
    /// are taken.
    pub fn take(&mut self) -> Option<HeldSubscription<K>> {
        self.held.pop()
    }
}

/// The stores of the watch parts read as one.
pub fn scoped_store<K>(
    parts: impl Iterator<Item = (Option<String>, reflector::Store<K>)>,
) -> ScopedStore<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let parts: Vec<_> = parts.collect();
    match parts.as_slice() {
        [(None, store)] => ScopedStore::cluster(store.clone()),
        _ => ScopedStore::namespaced(
            parts
                .into_iter()
                .map(|(namespace, store)| (namespace.unwrap_or_default(), store)),
        ),
    }
}

/// A controller's subscription to a shared cache, read and dropped until this replica leads:
/// a subscriber that nobody reads would stop the cache's watch once its buffer is full, and
/// a standby's caches must stay current.
pub struct HeldSubscription<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    task: tokio::task::JoinHandle<std::pin::Pin<Box<ReflectHandle<K>>>>,
}

impl<K> HeldSubscription<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn new(handle: ReflectHandle<K>, lead: CancellationToken) -> Self {
        let mut handle = Box::pin(handle);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = lead.cancelled() => return handle,
                    next = handle.next() => if next.is_none() { return handle; },
                }
            }
        });
        HeldSubscription { task }
    }

    /// The subscription, once `lead` is cancelled, followed by every object of `store` once
    /// it is filled (what the drained events would have triggered; a controller started on
    /// its own watch reconciles everything at start as well).
    pub async fn take(
        self,
        store: reflector::Store<K>,
    ) -> impl futures::Stream<Item = Arc<K>> + Send {
        let handle = self
            .task
            .await
            .expect("the drain of a shared cache subscription does not panic");
        let existing = futures::stream::once(async move {
            let _ = store.wait_until_ready().await;
            futures::stream::iter(store.state())
        })
        .flatten();
        futures::stream::select(existing, handle)
    }
}

/// The watch parts of a scope: `[None]` (the whole cluster) or one per namespace.
pub fn scope_parts(scope: &WatchScope) -> Vec<Option<String>> {
    match scope.namespaces() {
        None => vec![None],
        Some(namespaces) => namespaces.iter().cloned().map(Some).collect(),
    }
}

/// The Api of a namespaced kind in `namespace`, or cluster-wide for `None`.
pub fn api_in<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// [`cache_of`] over the scope: one cluster-wide watch, or one per watched namespace.
pub fn scoped_cache_of<K>(
    client: &kube::Client,
    scope: &WatchScope,
    config: watcher::Config,
    trim: impl Fn(&mut K) + Clone + Send + 'static,
) -> ScopedStore<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    match scope.namespaces() {
        None => ScopedStore::cluster(cache_of(Api::all(client.clone()), config, trim)),
        Some(namespaces) => ScopedStore::namespaced(namespaces.iter().map(|namespace| {
            let store = cache_of(
                Api::namespaced(client.clone(), namespace),
                config.clone(),
                trim.clone(),
            );
            (namespace.clone(), store)
        })),
    }
}

/// Backoff of the watch streams: 0.5 s doubling to at most 5 s, back to 0.5 s after any
/// event. kube-runtime's default (up to 30 s, reset only after 120 s without errors) is
/// shared by all of a controller's watches, so after an apiserver restart the errors of a
/// few of them (connect, 503, 410 Gone) kept every watch paused and a change waited over a
/// minute to be seen (fault e2e test). 5 s is still no hot loop against an apiserver.
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    next: Duration,
}

const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(500);
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(5);

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff {
            next: WATCH_BACKOFF_MIN,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let current = self.next;
        self.next = (current * 2).min(WATCH_BACKOFF_MAX);
        Some(current)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_MIN;
    }
}

/// Resolves when the controllers are to stop (shutdown or lost leadership).
pub type Stop = Shared<BoxFuture<'static, ()>>;

/// Logs what a controller's stream yields (a failed reconcile is logged by its error policy).
pub async fn log_result<T: std::fmt::Debug, E: std::fmt::Display>(result: Result<T, E>) {
    if let Err(e) = result {
        tracing::debug!(error = %e, "controller event");
    }
}

/// The shared caches of the agents' children, read by every reconcile instead of GETs (and
/// used to skip applies that would change nothing), whose events trigger the agent
/// controllers. Only what is read is kept.
pub struct AgentChildren {
    /// Per watch part (in [`scope_parts`] order): its agent Deployments (metadata and status:
    /// readiness), one subscription per agent kind.
    pub deployments: Vec<Subscriptions<Deployment>>,
    /// Agent Services of the operator namespace (drift, and each target's cluster IP in the
    /// egress status: the spec stays), one subscription per kind that owns them.
    pub services: Subscriptions<Service>,
    /// Of NetworkPolicies the metadata (operator RSS at 1,000 resources, benchmark 4).
    pub network_policies: ScopedStore<NetworkPolicy>,
    /// The operator namespace's Secrets (API keys, agent auth Secrets).
    pub operator_secrets: reflector::Store<Secret>,
    /// The operator namespace's ConfigMaps (the Tailnets' `spec.serverCA` bundles, read by
    /// every reconcile that builds a Headscale client).
    pub operator_config_maps: reflector::Store<ConfigMap>,
}

impl AgentChildren {
    /// Starts the caches: `kinds` controllers subscribe to each part's Deployments,
    /// `service_owners` of them to the operator namespace's Services.
    pub fn start(
        client: &kube::Client,
        scope: &WatchScope,
        operator_namespace: &str,
        lead: &CancellationToken,
        kinds: usize,
        service_owners: usize,
    ) -> Self {
        let agents = || watcher::Config::default().labels(AGENT_SELECTOR);
        let deployments = scope_parts(scope)
            .iter()
            .map(|part| {
                shared_cache_of(
                    api_in(client, part.as_deref()),
                    agents(),
                    lead,
                    kinds,
                    |d: &mut Deployment| d.spec = None,
                )
            })
            .collect();
        let services = shared_cache_of(
            Api::namespaced(client.clone(), operator_namespace),
            agents(),
            lead,
            service_owners,
            |s: &mut Service| s.status = None,
        );
        let network_policies =
            scoped_cache_of::<NetworkPolicy>(client, scope, agents(), |p| p.spec = None);
        let operator_secrets = cache_of::<Secret>(
            Api::namespaced(client.clone(), operator_namespace),
            watcher::Config::default(),
            |_| {},
        );
        let operator_config_maps = cache_of::<ConfigMap>(
            Api::namespaced(client.clone(), operator_namespace),
            watcher::Config::default(),
            |_| {},
        );
        AgentChildren {
            deployments,
            services,
            network_policies,
            operator_secrets,
            operator_config_maps,
        }
    }

    /// The Deployment caches of every part, read as one.
    pub fn deployment_store(&self, scope: &WatchScope) -> ScopedStore<Deployment> {
        scoped_store(
            scope_parts(scope)
                .into_iter()
                .zip(self.deployments.iter().map(|d| d.store.clone())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;

    #[test]
    fn watch_backoff_doubles_to_five_seconds_and_resets() {
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = (0..6).filter_map(|_| backoff.next()).collect();
        assert_eq!(
            delays,
            [500, 1000, 2000, 4000, 5000, 5000].map(Duration::from_millis)
        );
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(500)));
    }
}
