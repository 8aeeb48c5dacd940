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
use kube::runtime::reflector::{self, ObjectRef};
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
    // standby is warm when it takes over).
    let scope = settings.operator.scope.clone();
    let egresses =
        scoped_cache_of::<TailnetEgress>(&client, &scope, watcher::Config::default(), |_| {});
    let ingresses =
        scoped_cache_of::<TailnetIngress>(&client, &scope, watcher::Config::default(), |_| {});
    // Watch caches of the agents' children and the operator namespace's Secrets, read by
    // every reconcile instead of GETs (and used to skip applies that would change nothing).
    // Only what is read is kept: of Deployments the metadata and status (readiness), of
    // NetworkPolicies the metadata (operator RSS at 1,000 resources, benchmark 4).
    let deployments = scoped_cache_of::<Deployment>(
        &client,
        &scope,
        watcher::Config::default().labels(AGENT_SELECTOR),
        |d| d.spec = None,
    );
    let services = cache_of::<Service>(
        Api::namespaced(client.clone(), &settings.operator.operator_namespace),
        watcher::Config::default().labels(AGENT_SELECTOR),
        |_| {},
    );
    let network_policies = scoped_cache_of::<NetworkPolicy>(
        &client,
        &scope,
        watcher::Config::default().labels(AGENT_SELECTOR),
        |p| p.spec = None,
    );
    let operator_secrets = cache_of::<Secret>(
        Api::namespaced(client.clone(), &settings.operator.operator_namespace),
        watcher::Config::default(),
        |_| {},
    );
    health.ready.store(true, Ordering::Relaxed);

    let elector = LeaderElector::new(client.clone(), settings.lease.clone());
    if !elector.acquire(&shutdown).await {
        return Ok(());
    }
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
    let ns = settings.operator.operator_namespace.clone();
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
            services,
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
    let parts = scope_parts(&scope);
    let per_part = kube::runtime::controller::Config::default().concurrency(
        (settings.operator.max_concurrent_reconciles / parts.len().max(1) as u16).max(1),
    );
    let mut agent_controllers = Vec::new();
    for namespace in &parts {
        let namespace = namespace.as_deref();
        let egresses = Controller::new(
            api_in::<TailnetEgress>(&client, namespace),
            watcher::Config::default(),
        )
        .with_config(per_part.clone())
        .trigger_backoff(WatchBackoff::default());
        let store = egresses.store();
        let mut egresses = egresses.owns(
            api_in::<Deployment>(&client, namespace),
            watcher::Config::default().labels(AGENT_SELECTOR),
        );
        // Egress Services live in the operator namespace.
        if namespace.is_none_or(|n| n == ns) {
            egresses = egresses.owns(
                Api::<Service>::namespaced(client.clone(), &ns),
                watcher::Config::default().labels(AGENT_SELECTOR),
            );
        }
        agent_controllers.push(
            egresses
                .watches(
                    Api::<Tailnet>::all(client.clone()),
                    watcher::Config::default(),
                    move |t: Tailnet| {
                        let name = t.name_any();
                        store
                            .state()
                            .iter()
                            .filter(|e| e.spec.tailnet_ref.name == name)
                            .map(|e| ObjectRef::from_obj(&**e))
                            .collect::<Vec<_>>()
                    },
                )
                .graceful_shutdown_on(stop.clone())
                .run(egress::reconcile, egress::error_policy, ctx.clone())
                .for_each(log_result)
                .boxed(),
        );
        let ingresses = Controller::new(
            api_in::<TailnetIngress>(&client, namespace),
            watcher::Config::default(),
        )
        .with_config(per_part.clone())
        .trigger_backoff(WatchBackoff::default());
        let store = ingresses.store();
        agent_controllers.push(
            ingresses
                .owns(
                    api_in::<Deployment>(&client, namespace),
                    watcher::Config::default().labels(AGENT_SELECTOR),
                )
                .watches(
                    Api::<Tailnet>::all(client.clone()),
                    watcher::Config::default(),
                    move |t: Tailnet| {
                        let name = t.name_any();
                        store
                            .state()
                            .iter()
                            .filter(|i| i.spec.tailnet_ref.name == name)
                            .map(|i| ObjectRef::from_obj(&**i))
                            .collect::<Vec<_>>()
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
