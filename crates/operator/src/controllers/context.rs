//! What every reconcile shares.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as K8sSecret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tailnet_headscale::{Client as HeadscaleClient, ClientOptions, Node, PreAuthKey, Secret};

use super::applied::AppliedObjects;
pub use super::config::OperatorConfig;
use super::shared_list::SharedList;
use crate::metrics::Metrics;
use crate::scope::ScopedStore;

/// How long a Headscale node or key list serves every reconcile that asks (see shared_list).
const HEADSCALE_LIST_TTL: Duration = Duration::from_secs(1);
/// Periodic polls of one kind are spread so that they ask for at most one reconcile per this
/// long (50 a second): see [`Context::poll_interval`].
const POLL_SPACING: Duration = Duration::from_millis(20);
/// How long Headscale's answer to a grant question (egress MagicDNS targets) is reused for
/// the same live policy, tag and destination: Headscale's policy check compiles the whole
/// policy, so it is not asked on every poll. Node or group changes show within this time.
const GRANT_CHECK_TTL: Duration = Duration::from_secs(60);

/// `poll`, but no sooner than `resources` × [`POLL_SPACING`] (see [`Context::poll_interval`]).
fn spread_poll(poll: Duration, resources: usize) -> Duration {
    let floor = POLL_SPACING.saturating_mul(u32::try_from(resources).unwrap_or(u32::MAX));
    poll.max(floor)
}

/// Watch caches of what the operator reads on every reconcile (reads from here instead of
/// GETs; a miss falls back to a GET, so a cache that is still filling is never trusted to
/// say "absent" where that would matter).
#[derive(Clone)]
pub struct Caches {
    pub tailnets: Store<Tailnet>,
    /// Agent Deployments in the watched namespaces (label-selected).
    pub deployments: ScopedStore<Deployment>,
    /// Agent Services in the operator namespace (label-selected).
    pub services: Store<Service>,
    /// Agent NetworkPolicies in the watched namespaces (label-selected): a security control, so a
    /// deleted or edited one is re-applied on the next poll, not only after the re-apply
    /// interval.
    pub network_policies: ScopedStore<NetworkPolicy>,
    /// Secrets in the operator namespace (API keys, agent auth Secrets).
    pub operator_secrets: Store<K8sSecret>,
    /// ConfigMaps in the operator namespace (the Tailnets' `spec.serverCA` bundles).
    pub operator_config_maps: Store<ConfigMap>,
}

/// The watch caches of every registered agent kind's objects, by object type (each kind's
/// wiring adds its own; a kind's reconciles read its objects here, e.g. for claims).
#[derive(Clone, Default)]
pub struct KindStores {
    stores: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl KindStores {
    pub fn insert<K>(&mut self, store: ScopedStore<K>)
    where
        K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.stores.insert(TypeId::of::<K>(), Arc::new(store));
    }

    pub fn store<K>(&self) -> Option<&ScopedStore<K>>
    where
        K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.stores.get(&TypeId::of::<K>())?.downcast_ref()
    }

    /// Every cached object of type `K` (none when no kind of that type is registered).
    pub fn objects<K>(&self) -> Vec<Arc<K>>
    where
        K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.store::<K>()
            .map(ScopedStore::state)
            .unwrap_or_default()
    }

    pub fn count<K>(&self) -> usize
    where
        K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.objects::<K>().len()
    }

    /// The store of `K`, or an empty one.
    fn scoped<K>(&self) -> ScopedStore<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.store::<K>()
            .cloned()
            .unwrap_or_else(|| ScopedStore::namespaced(Vec::new()))
    }
}

pub struct Context {
    pub client: kube::Client,
    pub config: OperatorConfig,
    pub metrics: Metrics,
    pub recorder: Recorder,
    /// The registered agent kinds' objects.
    pub kinds: KindStores,
    /// The egresses and ingresses (the same caches as in `kinds`), for the Tailnet controller.
    pub egresses: ScopedStore<TailnetEgress>,
    pub ingresses: ScopedStore<TailnetIngress>,
    /// For reading agents' `/status` (short timeouts: an agent that does not answer only
    /// leaves reachability unobserved).
    pub agent_http: reqwest::Client,
    pub caches: Caches,
    /// What was last applied per child object (to skip unchanged applies).
    pub applied: AppliedObjects,
    /// Node and pre-auth key lists per Headscale server, shared by concurrent reconciles.
    pub nodes: SharedList<Node>,
    pub pre_auth_keys: SharedList<PreAuthKey>,
    /// The live policy text per Headscale server (a list of one), shared like the nodes.
    pub live_policies: SharedList<String>,
    grant_checks: Mutex<HashMap<String, (Instant, bool)>>,
    headscale_clients: Mutex<HashMap<(String, String, String), HeadscaleClient>>,
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    pub fn new(
        client: kube::Client,
        config: OperatorConfig,
        metrics: Metrics,
        recorder: Recorder,
        kinds: KindStores,
        caches: Caches,
    ) -> Self {
        let reapply_interval = config.reapply_interval;
        Context {
            client,
            config,
            metrics,
            recorder,
            egresses: kinds.scoped(),
            ingresses: kinds.scoped(),
            kinds,
            agent_http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .connect_timeout(Duration::from_secs(2))
                .build()
                .unwrap_or_default(),
            caches,
            applied: AppliedObjects::new(reapply_interval),
            nodes: SharedList::new(HEADSCALE_LIST_TTL),
            pre_auth_keys: SharedList::new(HEADSCALE_LIST_TTL),
            live_policies: SharedList::new(HEADSCALE_LIST_TTL),
            grant_checks: Mutex::default(),
            headscale_clients: Mutex::default(),
            failures: Mutex::default(),
        }
    }

    /// A remembered answer (granted or not) to the grant question `key` (server, policy
    /// digest, tag, destination), younger than [`GRANT_CHECK_TTL`].
    pub fn cached_grant(&self, key: &str) -> Option<bool> {
        let checks = self.grant_checks.lock().unwrap_or_else(|p| p.into_inner());
        checks
            .get(key)
            .filter(|(at, _)| at.elapsed() < GRANT_CHECK_TTL)
            .map(|(_, granted)| *granted)
    }

    /// Remembers an answer to a grant question; expired entries are dropped.
    pub fn remember_grant(&self, key: String, granted: bool) {
        let mut checks = self.grant_checks.lock().unwrap_or_else(|p| p.into_inner());
        checks.retain(|_, (at, _)| at.elapsed() < GRANT_CHECK_TTL);
        checks.insert(key, (Instant::now(), granted));
    }

    /// A Headscale client for `server` with `key`, trusting `server_ca` (PEM) besides the
    /// system roots, reused while all three stay the same (the key is part of the cache key
    /// only as a SHA-256, never stored in clear beside it).
    pub fn headscale(
        &self,
        server: &str,
        key: &Secret,
        server_ca: Option<&str>,
    ) -> Result<HeadscaleClient, tailnet_headscale::Error> {
        let cache_key = (
            server.to_string(),
            tailnet_api::digest::sha256_hex(key.expose()),
            server_ca
                .map(tailnet_api::digest::sha256_hex)
                .unwrap_or_default(),
        );
        let mut clients = self
            .headscale_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(&cache_key) {
            return Ok(client.clone());
        }
        let options = ClientOptions {
            timeout: self.config.headscale_timeout,
            server_ca_pem: server_ca.map(str::to_owned),
            ..ClientOptions::default()
        };
        let client = HeadscaleClient::new(server, key.clone(), options)?
            .with_observer(std::sync::Arc::new(self.metrics.clone()));
        clients.retain(|(s, _, _), _| s != server);
        clients.insert(cache_key, client.clone());
        Ok(client)
    }

    /// When a resource of a kind with `resources` objects is polled again: the Headscale poll
    /// interval, but no sooner than `resources` × 20 ms, so that periodic polls take at most
    /// 50 reconciles a second per kind.
    ///
    /// kube-runtime's scheduler is not first-in first-out once the reconciles it may run at
    /// once are all busy: what came due meanwhile waits in a hash set, and each free slot goes
    /// to the first entry in that set's (fixed) order. With every resource polled every 2 s,
    /// 1,000 resources asked for 500 reconciles a second, more than two cores deliver, and
    /// the same resources always came last: 46 ingresses were not reconciled once in 10
    /// minutes (benchmark 4). Below saturation the order does not matter. The default 30 s
    /// poll reaches this floor only above 1,500 resources of a kind.
    pub fn poll_interval(&self, resources: usize) -> Duration {
        spread_poll(self.config.headscale_poll, resources)
    }

    /// Exponential backoff per object for failed reconciles: 5 s, 10 s, … capped at 5 min.
    pub fn failure_backoff(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let count = failures.entry(key.to_string()).or_insert(0);
        *count = count.saturating_add(1);
        let exponent = (*count - 1).min(6);
        Duration::from_secs(5u64.saturating_mul(1 << exponent)).min(Duration::from_secs(300))
    }

    pub fn reset_backoff(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_are_spread_to_at_most_fifty_reconciles_a_second_per_kind() {
        let two = Duration::from_secs(2);
        assert_eq!(spread_poll(two, 0), two);
        assert_eq!(spread_poll(two, 100), two);
        assert_eq!(spread_poll(two, 500), Duration::from_secs(10));
        let thirty = Duration::from_secs(30);
        assert_eq!(spread_poll(thirty, 1000), thirty);
        assert_eq!(spread_poll(thirty, 2000), Duration::from_secs(40));
    }
}
