//! `tailnet-operator run`: Kubernetes client, admin server, leader election, controllers,
//! graceful shutdown.

pub mod admin;
pub mod leader;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, ReflectHandle};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tokio_util::sync::CancellationToken;

use crate::controllers::context::{Caches, Context, OperatorConfig};
use crate::controllers::{egress, ingress, tailnet};
use crate::scope::{ScopedStore, WatchScope};

/// Selects the objects the operator creates for agents (owned-object watches).
const AGENT_SELECTOR: &str =
    "app.kubernetes.io/managed-by=tailnet-operator,app.kubernetes.io/name=tailnet-agent";

/// How long the Tailnet controller waits for more changes before reconciling.
const TAILNET_DEBOUNCE: Duration = Duration::from_millis(500);

/// A watch cache kept up to date in the background (with the watch backoff below). Every
/// object is passed through `trim` before it is stored; managedFields are always dropped
/// (never read, and often the biggest part of an object).
fn cache_of<K>(
    api: Api<K>,
    config: watcher::Config,
    mut trim: impl FnMut(&mut K) + Send + 'static,
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
    store
}

/// How many object references a shared cache buffers per subscriber before its watch waits
/// (kube-runtime applies backpressure when a subscriber falls behind).
const SUBSCRIBER_BUFFER: usize = 1024;

/// [`cache_of`] whose events also trigger `subscribers` controllers (kube-runtime's shared
/// streams): each controller reads this store instead of keeping a watch and a full copy
/// of every object of its own (operator RSS at 1,000 resources, benchmark 4). A subscriber
/// yields an object after the store has it.
fn shared_cache_of<K, const N: usize>(
    api: Api<K>,
    config: watcher::Config,
    lead: &CancellationToken,
    mut trim: impl FnMut(&mut K) + Send + 'static,
) -> (reflector::Store<K>, [HeldSubscription<K>; N])
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
    let subscriptions = std::array::from_fn(|_| {
        let handle = writer
            .subscribe()
            .expect("a shared store gives subscriptions");
        HeldSubscription::new(handle, lead.clone())
    });
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
    (store, subscriptions)
}

/// The shared caches of one watch part (the whole cluster, or one namespace) and the
/// subscriptions of that part's egress and ingress controllers.
struct PartWatches {
    namespace: Option<String>,
    egresses: reflector::Store<TailnetEgress>,
    egress_trigger: HeldSubscription<TailnetEgress>,
    ingresses: reflector::Store<TailnetIngress>,
    ingress_trigger: HeldSubscription<TailnetIngress>,
    deployments: reflector::Store<Deployment>,
    egress_deployments: HeldSubscription<Deployment>,
    ingress_deployments: HeldSubscription<Deployment>,
}

/// The stores of the watch parts read as one.
fn scoped_store<K>(
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
struct HeldSubscription<K>
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
    async fn take(self, store: reflector::Store<K>) -> impl futures::Stream<Item = Arc<K>> + Send {
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

/// Which of a kind's resources a Tailnet event should reconcile now.
///
/// Every change of a Tailnet's status (each policy apply, each resource that becomes
/// effective, the pending-DNS message) used to trigger every egress and ingress of the
/// Tailnet. kube-runtime's scheduler moves each triggered object to "now" and pops objects
/// scheduled for the same instant last-in first-out, so while these fan-outs came faster
/// than a saturated controller drained them, the same objects (the first of the cache's
/// iteration order) stayed at the back: at 1,000 resources 46 ingresses were not reconciled
/// once in 10 minutes (benchmark 4, the tail beyond 400). Now all of them are triggered only
/// when the Tailnet itself changes (new uid or generation, a condition's status or reason);
/// on any other status change only those whose `PolicyEffective` disagrees with the
/// Tailnet's `effective_for`. Each resource's own poll still sees everything else.
#[derive(Default)]
struct TailnetFanOut {
    /// Per Tailnet name: a hash of uid, generation and conditions (type, status, reason).
    seen: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

impl TailnetFanOut {
    fn affected<K>(
        &self,
        tailnet: &Tailnet,
        resources: Vec<Arc<K>>,
        kind: &str,
        tailnet_of: impl Fn(&K) -> &str,
        conditions_of: impl Fn(
            &K,
        )
            -> Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]>,
    ) -> Vec<ObjectRef<K>>
    where
        K: kube::Resource<DynamicType = ()> + 'static,
    {
        use std::hash::{Hash, Hasher};
        let name = tailnet.name_any();
        let status = tailnet.status.as_ref();
        let shape = {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            tailnet.metadata.uid.hash(&mut hasher);
            tailnet.metadata.generation.hash(&mut hasher);
            for c in status.iter().flat_map(|s| &s.conditions) {
                (c.type_.as_str(), c.status.as_str(), c.reason.as_str()).hash(&mut hasher);
            }
            hasher.finish()
        };
        let changed = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), shape)
            != Some(shape);
        let effective: std::collections::HashSet<&str> = status
            .and_then(|s| s.policy.as_ref())
            .map(|p| p.effective_for.iter().map(String::as_str).collect())
            .unwrap_or_default();
        resources
            .iter()
            .filter(|r| tailnet_of(r) == name)
            .filter(|r| {
                changed || {
                    let key = format!(
                        "{kind}/{}/{}",
                        r.meta().namespace.as_deref().unwrap_or_default(),
                        r.meta().name.as_deref().unwrap_or_default()
                    );
                    let shown = conditions_of(r).unwrap_or_default().iter().any(|c| {
                        c.type_ == tailnet_api::conditions::types::POLICY_EFFECTIVE
                            && c.status == "True"
                    });
                    effective.contains(key.as_str()) != shown
                }
            })
            .map(|r| ObjectRef::from_obj(&**r))
            .collect()
    }
}

/// The watch parts of a scope: `[None]` (the whole cluster) or one per namespace.
fn scope_parts(scope: &WatchScope) -> Vec<Option<String>> {
    match scope.namespaces() {
        None => vec![None],
        Some(namespaces) => namespaces.iter().cloned().map(Some).collect(),
    }
}

/// The Api of a namespaced kind in `namespace`, or cluster-wide for `None`.
fn api_in<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// [`cache_of`] over the scope: one cluster-wide watch, or one per watched namespace.
fn scoped_cache_of<K>(
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
struct WatchBackoff {
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

/// How often freed heap memory is handed back to the kernel (glibc builds).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MALLOC_TRIM_INTERVAL: Duration = Duration::from_secs(10);

/// glibc keeps what its per-thread arenas freed resident: at 1,000 resources the operator held
/// 126 MB from the kernel for 59 MB in use (`malloc_stats`, benchmark 4), the rest freed
/// memory of the burst (watch lists, policy renders, Headscale key lists). `malloc_trim`
/// returns the free pages of every arena. The release images link musl, whose allocator
/// returns freed memory itself; there this does nothing.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(async {
        let mut every = tokio::time::interval(MALLOC_TRIM_INTERVAL);
        loop {
            every.tick().await;
            // SAFETY: malloc_trim has no preconditions; it only gives free pages back.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    });
}

async fn log_result<T: std::fmt::Debug, E: std::fmt::Display>(result: Result<T, E>) {
    if let Err(e) = result {
        tracing::debug!(error = %e, "controller event");
    }
}
use crate::metrics::Metrics;
use admin::Health;
use leader::{LeaderElector, LeaseConfig};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("connecting to Kubernetes: {0}")]
    Kube(#[source] kube::Error),
    #[error(
        "reading namespace kube-system for the installation id (or pass --installation-id): {0}"
    )]
    InstallationId(#[source] kube::Error),
    #[error("binding the admin address {address}: {source}")]
    Admin {
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("lost leadership; exiting so that a fresh process stands by")]
    LostLeadership,
}

/// Settings of `run` after parsing flags.
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub operator: OperatorConfig,
    pub installation_id: Option<String>,
    pub admin_address: std::net::SocketAddr,
    pub lease: LeaseConfig,
}

/// Cancels `token` on SIGTERM or Ctrl-C.
fn shutdown_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutting down");
        token.cancel();
    });
}

pub async fn run(mut settings: RunSettings) -> Result<(), RunError> {
    let client = kube::Client::try_default().await.map_err(RunError::Kube)?;
    settings.operator.installation_id = match settings.installation_id.clone() {
        Some(id) => id,
        // The kube-system namespace's uid identifies the cluster.
        None => Api::<Namespace>::all(client.clone())
            .get("kube-system")
            .await
            .map_err(RunError::InstallationId)?
            .uid()
            .unwrap_or_default(),
    };
    tracing::info!(installation = %settings.operator.installation_id, namespace = %settings.operator.operator_namespace, scope = %settings.operator.scope.describe(), "starting");

    let shutdown = CancellationToken::new();
    shutdown_on_signal(shutdown.clone());
    return_freed_memory();
    let metrics = Metrics::default();
    let health = Health::default();
    let listener = admin::bind(settings.admin_address)
        .await
        .map_err(|source| RunError::Admin {
            address: settings.admin_address,
            source,
        })?;
    tokio::spawn(admin::serve(
        listener,
        metrics.clone(),
        health.clone(),
        shutdown.clone(),
    ));

    // Caches of the resources that feed the Tailnet's policy (kept on every replica, so a
    // standby is warm when it takes over). The egress and ingress controllers and the
    // Deployment and Service triggers read these same caches (shared streams): one watch and
    // one copy of each object, without managedFields.
    let scope = settings.operator.scope.clone();
    let lead = CancellationToken::new();
    let ns = settings.operator.operator_namespace.clone();
    let mut parts: Vec<PartWatches> = Vec::new();
    for namespace in scope_parts(&scope) {
        let part = namespace.as_deref();
        let (egresses, [egress_trigger]) = shared_cache_of(
            api_in(&client, part),
            watcher::Config::default(),
            &lead,
            |_| {},
        );
        let (ingresses, [ingress_trigger]) = shared_cache_of(
            api_in(&client, part),
            watcher::Config::default(),
            &lead,
            |_| {},
        );
        // Watch caches of the agents' children, read by every reconcile instead of GETs (and
        // used to skip applies that would change nothing). Only what is read is kept: of
        // Deployments the metadata and status (readiness).
        let (deployments, [egress_deployments, ingress_deployments]) = shared_cache_of(
            api_in(&client, part),
            watcher::Config::default().labels(AGENT_SELECTOR),
            &lead,
            |d: &mut Deployment| d.spec = None,
        );
        parts.push(PartWatches {
            namespace,
            egresses,
            egress_trigger,
            ingresses,
            ingress_trigger,
            deployments,
            egress_deployments,
            ingress_deployments,
        });
    }
    let egresses = scoped_store(
        parts
            .iter()
            .map(|p| (p.namespace.clone(), p.egresses.clone())),
    );
    let ingresses = scoped_store(
        parts
            .iter()
            .map(|p| (p.namespace.clone(), p.ingresses.clone())),
    );
    let deployments = scoped_store(
        parts
            .iter()
            .map(|p| (p.namespace.clone(), p.deployments.clone())),
    );
    // Agent Services of the operator namespace (drift, and each target's cluster IP in the
    // egress status: the spec stays).
    let (services, [service_trigger]) = shared_cache_of(
        Api::namespaced(client.clone(), &ns),
        watcher::Config::default().labels(AGENT_SELECTOR),
        &lead,
        |s: &mut Service| s.status = None,
    );
    let mut service_trigger = Some(service_trigger);
    // Of NetworkPolicies the metadata (operator RSS at 1,000 resources, benchmark 4).
    let network_policies = scoped_cache_of::<NetworkPolicy>(
        &client,
        &scope,
        watcher::Config::default().labels(AGENT_SELECTOR),
        |p| p.spec = None,
    );
    // The operator namespace's Secrets (API keys, agent auth Secrets).
    let operator_secrets = cache_of::<Secret>(
        Api::namespaced(client.clone(), &ns),
        watcher::Config::default(),
        |_| {},
    );
    health.ready.store(true, Ordering::Relaxed);

    let elector = LeaderElector::new(client.clone(), settings.lease.clone());
    if !elector.acquire(&shutdown).await {
        return Ok(());
    }
    lead.cancel();
    metrics.leader.set(1);
    let lost = CancellationToken::new();
    {
        let (shutdown, lost) = (shutdown.clone(), lost.clone());
        tokio::spawn(async move { elector.keep(shutdown, lost).await });
    }

    let reporter = Reporter {
        controller: "tailnet-operator".to_string(),
        instance: Some(settings.lease.identity.clone()),
    };
    // One policy render serves a burst of changes (hundreds of resources applied at once
    // each trigger the Tailnet; without a pause every change rendered and compared again).
    let controller = Controller::new(
        Api::<Tailnet>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(kube::runtime::controller::Config::default().debounce(TAILNET_DEBOUNCE))
    .trigger_backoff(WatchBackoff::default());
    let tailnets = controller.store();
    let ctx = Arc::new(Context::new(
        client.clone(),
        settings.operator.clone(),
        metrics.clone(),
        Recorder::new(client.clone(), reporter),
        egresses,
        ingresses,
        Caches {
            tailnets: tailnets.clone(),
            deployments,
            services: services.clone(),
            network_policies,
            operator_secrets,
        },
    ));
    metrics.watch_conditions(
        tailnets.clone(),
        ctx.egresses.clone(),
        ctx.ingresses.clone(),
    );
    let by_config_map = {
        let tailnets = tailnets.clone();
        move |cm: ConfigMap| {
            let name = cm.name_any();
            tailnets
                .state()
                .iter()
                .filter(|t| {
                    t.spec.policy.base_config_map.as_deref() == Some(name.as_str())
                        || t.spec
                            .dns
                            .as_ref()
                            .and_then(|d| d.hosts_config_map.as_deref())
                            == Some(name.as_str())
                        // A contributor's fragment delivered into this cluster (also the
                        // fragment another Tailnet of this cluster publishes).
                        || t.spec
                            .policy
                            .contributors
                            .iter()
                            .any(|c| c.source.config_map.as_deref() == Some(name.as_str()))
                })
                .map(|t| ObjectRef::from_obj(&**t))
                .collect::<Vec<_>>()
        }
    };
    let by_secret = {
        let tailnets = tailnets.clone();
        move |secret: Secret| {
            let name = secret.name_any();
            tailnets
                .state()
                .iter()
                .filter(|t| t.spec.api_secret_ref.name == name)
                .map(|t| ObjectRef::from_obj(&**t))
                .collect::<Vec<_>>()
        }
    };
    let stop = {
        let (shutdown, lost) = (shutdown.clone(), lost.clone());
        futures::FutureExt::shared(Box::pin(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = lost.cancelled() => {}
            }
        }))
    };
    let tailnet_controller = controller
        .watches(
            Api::<ConfigMap>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            by_config_map,
        )
        .watches(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            by_secret,
        )
        .watches(
            Api::<Service>::namespaced(client.clone(), &ns),
            watcher::Config::default().labels(&format!(
                "{}=TailnetEgress",
                tailnet_api::naming::labels::OWNER_KIND
            )),
            |s: Service| {
                s.labels()
                    .get(tailnet_api::naming::labels::TAILNET)
                    .map(|t| ObjectRef::new(t))
            },
        );
    let mut tailnet_controller = tailnet_controller;
    for namespace in scope_parts(&scope) {
        tailnet_controller = tailnet_controller
            .watches(
                api_in::<TailnetEgress>(&client, namespace.as_deref()),
                watcher::Config::default(),
                |e: TailnetEgress| Some(ObjectRef::<Tailnet>::new(&e.spec.tailnet_ref.name)),
            )
            .watches(
                api_in::<TailnetIngress>(&client, namespace.as_deref()),
                watcher::Config::default(),
                |i: TailnetIngress| Some(ObjectRef::<Tailnet>::new(&i.spec.tailnet_ref.name)),
            );
    }
    let tailnet_controller = tailnet_controller
        .graceful_shutdown_on(stop.clone())
        .run(tailnet::reconcile, tailnet::error_policy, ctx.clone())
        .for_each(log_result);
    // One egress and one ingress controller per watched namespace (one for the whole cluster
    // by default). At most `max_concurrent_reconciles` egress (and as many ingress) reconciles
    // at once, shared out among the namespaces: every resource comes due on each poll, and
    // unbounded they all ran at once (memory and Headscale load in bursts of N).
    let per_part = kube::runtime::controller::Config::default().concurrency(
        (settings.operator.max_concurrent_reconciles / parts.len().max(1) as u16).max(1),
    );
    let mut agent_controllers = Vec::new();
    for part in parts {
        let store = part.egresses.clone();
        let mut egresses = Controller::for_shared_stream(
            part.egress_trigger.take(part.egresses.clone()).await,
            part.egresses.clone(),
        )
        .with_config(per_part.clone())
        .trigger_backoff(WatchBackoff::default())
        .owns_shared_stream(part.egress_deployments.take(part.deployments.clone()).await);
        // Egress Services live in the operator namespace.
        if part.namespace.as_deref().is_none_or(|n| n == ns)
            && let Some(trigger) = service_trigger.take()
        {
            egresses = egresses.owns_shared_stream(trigger.take(services.clone()).await);
        }
        agent_controllers.push(
            egresses
                .watches(
                    Api::<Tailnet>::all(client.clone()),
                    watcher::Config::default(),
                    {
                        let fan_out = TailnetFanOut::default();
                        move |t: Tailnet| {
                            fan_out.affected(
                                &t,
                                store.state(),
                                "TailnetEgress",
                                |e: &TailnetEgress| e.spec.tailnet_ref.name.as_str(),
                                |e| e.status.as_ref().map(|s| s.conditions.as_slice()),
                            )
                        }
                    },
                )
                .graceful_shutdown_on(stop.clone())
                .run(egress::reconcile, egress::error_policy, ctx.clone())
                .for_each(log_result)
                .boxed(),
        );
        let store = part.ingresses.clone();
        agent_controllers.push(
            Controller::for_shared_stream(
                part.ingress_trigger.take(part.ingresses.clone()).await,
                part.ingresses.clone(),
            )
            .with_config(per_part.clone())
            .trigger_backoff(WatchBackoff::default())
            .owns_shared_stream(
                part.ingress_deployments
                    .take(part.deployments.clone())
                    .await,
            )
            .watches(
                Api::<Tailnet>::all(client.clone()),
                watcher::Config::default(),
                {
                    let fan_out = TailnetFanOut::default();
                    move |t: Tailnet| {
                        fan_out.affected(
                            &t,
                            store.state(),
                            "TailnetIngress",
                            |i: &TailnetIngress| i.spec.tailnet_ref.name.as_str(),
                            |i| i.status.as_ref().map(|s| s.conditions.as_slice()),
                        )
                    }
                },
            )
            .graceful_shutdown_on(stop.clone())
            .run(ingress::reconcile, ingress::error_policy, ctx.clone())
            .for_each(log_result)
            .boxed(),
        );
    }
    // Lost leadership: drop the controllers at once instead of letting in-flight reconciles
    // finish (a graceful shutdown would wait for them, and one blocked on a hung apiserver
    // connection could still write to Headscale after a standby took over).
    tokio::select! {
        _ = async { futures::join!(tailnet_controller, futures::future::join_all(agent_controllers)) } => {}
        _ = lost.cancelled() => {}
    }
    metrics.leader.set(0);
    if lost.is_cancelled() && !shutdown.is_cancelled() {
        return Err(RunError::LostLeadership);
    }
    // Give the lease release a moment to complete.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;

    fn ingress(name: &str, effective: bool) -> Arc<TailnetIngress> {
        let mut ingress: TailnetIngress = serde_json::from_value(serde_json::json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
            "metadata": {"name": name, "namespace": "apps"},
            "spec": {"tailnetRef": {"name": "demo"}, "allowFrom": ["group:team-a"], "exposes": []}
        }))
        .expect("ingress fixture");
        if effective {
            let mut status = ingress.status.clone().unwrap_or_default();
            status
                .conditions
                .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: "PolicyEffective".into(),
                    status: "True".into(),
                    reason: "Ready".into(),
                    message: String::new(),
                    last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        Default::default(),
                    ),
                    observed_generation: None,
                });
            ingress.status = Some(status);
        }
        Arc::new(ingress)
    }

    fn names(refs: Vec<ObjectRef<TailnetIngress>>) -> Vec<String> {
        let mut names: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }

    #[test]
    fn a_tailnet_status_change_triggers_only_the_resources_whose_policy_effect_changed() {
        let fan_out = TailnetFanOut::default();
        let affected = |tailnet: &Tailnet, resources: Vec<Arc<TailnetIngress>>| {
            names(fan_out.affected(
                tailnet,
                resources,
                "TailnetIngress",
                |i: &TailnetIngress| i.spec.tailnet_ref.name.as_str(),
                |i| i.status.as_ref().map(|s| s.conditions.as_slice()),
            ))
        };
        let resources = || vec![ingress("a", true), ingress("b", false), ingress("c", false)];
        let tailnet = crate::controllers::test_fixtures::tailnet(&["TailnetIngress/apps/a"]);
        // First sight of the Tailnet: all of its resources.
        assert_eq!(affected(&tailnet, resources()), ["a", "b", "c"]);
        // Only effective_for changed (b became live): only b.
        let tailnet = crate::controllers::test_fixtures::tailnet(&[
            "TailnetIngress/apps/a",
            "TailnetIngress/apps/b",
        ]);
        assert_eq!(affected(&tailnet, resources()), ["b"]);
        // A new generation (spec change): all again.
        let mut changed = tailnet.clone();
        changed.metadata.generation = Some(2);
        assert_eq!(affected(&changed, resources()), ["a", "b", "c"]);
        // Another Tailnet's resources are never triggered.
        let mut other = tailnet.clone();
        other.metadata.name = Some("other".into());
        assert!(affected(&other, resources()).is_empty());
    }

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
