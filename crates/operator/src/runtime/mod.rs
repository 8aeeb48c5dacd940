//! `tailnet-operator run`: Kubernetes client, admin server, the shared watch caches, leader
//! election, then the registered controllers (each wires itself: `controllers::agent::wiring`,
//! `controllers::tailnet::wiring`), graceful shutdown.

pub mod admin;
pub mod caches;
pub mod chart_tailnet;
pub mod leader;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, ResourceExt};
use tailnet_api::Tailnet;
use tokio_util::sync::CancellationToken;

use crate::controllers::agent::wiring::{RunEnv, Wired};
use crate::controllers::context::{Caches, Context, KindStores, OperatorConfig};
use crate::controllers::{agent_kinds, gateway_class, tailnet};
use crate::metrics::{ConditionSource, Metrics};
use crate::scope::ScopedStore;
use admin::Health;
use caches::{AgentChildren, Stop, scope_parts};
use leader::{LeaderElector, LeaseConfig};

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
    /// `--apply-tailnet`: applied at start by every replica (idempotent).
    pub apply_tailnet: Option<chart_tailnet::ChartTailnet>,
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
    settings.operator.installation_id = installation_id(&client, &settings).await?;
    tracing::info!(installation = %settings.operator.installation_id, namespace = %settings.operator.operator_namespace, scope = %settings.operator.scope.describe(), "starting");

    let shutdown = CancellationToken::new();
    shutdown_on_signal(shutdown.clone());
    return_freed_memory();
    if let Some(tailnet) = settings.apply_tailnet.clone() {
        tokio::spawn(chart_tailnet::apply_until_done(
            client.clone(),
            tailnet,
            shutdown.clone(),
        ));
    }
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
    // standby is warm when it takes over). The agent controllers and the Deployment and
    // Service triggers read these same caches (shared streams): one watch and one copy of
    // each object, without managedFields.
    let lead = CancellationToken::new();
    let gateway_api = gateway_class::gateway_api_installed(&client).await;
    if !gateway_api {
        tracing::info!(
            "the Gateway API CRDs (gateway.networking.k8s.io/v1) are not installed: the GatewayClass and Gateway controllers are not started"
        );
    }
    let caches = SharedCaches::start(&client, &settings.operator, &lead, gateway_api);
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
    let stop: Stop = {
        let (shutdown, lost) = (shutdown.clone(), lost.clone());
        async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = lost.cancelled() => {}
            }
        }
        .boxed()
        .shared()
    };
    let controllers = caches.controllers(client, &settings, &metrics, stop).await;
    // Lost leadership: drop the controllers at once instead of letting in-flight reconciles
    // finish (a graceful shutdown would wait for them, and one blocked on a hung apiserver
    // connection could still write to Headscale after a standby took over).
    tokio::select! {
        _ = futures::future::join_all(controllers) => {}
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

/// `--installation-id`, or the kube-system namespace's uid (it identifies the cluster).
async fn installation_id(
    client: &kube::Client,
    settings: &RunSettings,
) -> Result<String, RunError> {
    if let Some(id) = &settings.installation_id {
        return Ok(id.clone());
    }
    Ok(Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .map_err(RunError::InstallationId)?
        .uid()
        .unwrap_or_default())
}

/// The watch caches started before leadership: every registered agent kind's objects (per
/// watch part) and the agents' children.
struct SharedCaches {
    kinds: Vec<Box<dyn Wired>>,
    children: AgentChildren,
    /// The Gateway API CRDs are installed: the GatewayClass controller runs too.
    gateway_api: bool,
}

impl SharedCaches {
    fn start(
        client: &kube::Client,
        config: &OperatorConfig,
        lead: &CancellationToken,
        gateway_api: bool,
    ) -> Self {
        let registered = agent_kinds(gateway_api);
        let parts = scope_parts(&config.scope);
        let service_owners = registered
            .iter()
            .filter(|k| k.owns_operator_services())
            .count();
        let children = AgentChildren::start(
            client,
            &config.scope,
            &config.operator_namespace,
            lead,
            registered.len(),
            service_owners,
        );
        let kinds = registered
            .into_iter()
            .map(|kind| kind.start(client, &parts, lead))
            .collect();
        SharedCaches {
            kinds,
            children,
            gateway_api,
        }
    }

    /// The context of every reconcile and the registered controllers (the Tailnet's and one
    /// per agent kind and watch part), ready to be polled.
    async fn controllers(
        self,
        client: kube::Client,
        settings: &RunSettings,
        metrics: &Metrics,
        stop: Stop,
    ) -> Vec<BoxFuture<'static, ()>> {
        let SharedCaches {
            kinds,
            children,
            gateway_api,
        } = self;
        let config = &settings.operator;
        let reporter = Reporter {
            controller: "tailnet-operator".to_string(),
            instance: Some(settings.lease.identity.clone()),
        };
        let tailnet = tailnet::wiring::controller(&client);
        let tailnets = tailnet.store();
        let mut stores = KindStores::default();
        for kind in &kinds {
            kind.add_store(&mut stores);
        }
        let ctx = Arc::new(Context::new(
            client.clone(),
            config.clone(),
            metrics.clone(),
            Recorder::new(client.clone(), reporter),
            stores,
            Caches {
                tailnets: tailnets.clone(),
                deployments: children.deployment_store(&config.scope),
                services: children.services.store.clone(),
                network_policies: children.network_policies.clone(),
                operator_secrets: children.operator_secrets.clone(),
                operator_config_maps: children.operator_config_maps.clone(),
            },
        ));
        let tailnet_conditions =
            ConditionSource::scoped(ScopedStore::cluster(tailnets), |t: &Tailnet| {
                t.status.as_ref().map(|s| s.conditions.as_slice())
            });
        metrics.watch_conditions(
            std::iter::once(tailnet_conditions)
                .chain(kinds.iter().map(|k| k.conditions()))
                .collect(),
        );
        let mut controllers = vec![tailnet::wiring::run(
            tailnet,
            ctx.clone(),
            &kinds,
            stop.clone(),
        )];
        if gateway_api {
            controllers.push(gateway_class::run(ctx.clone(), stop.clone()));
        }
        // One controller per agent kind and watch part (one for the whole cluster by
        // default), at most `max_concurrent_reconciles` reconciles of a kind at once, shared
        // out among the parts.
        let parts = scope_parts(&config.scope).len().max(1);
        let share =
            (config.max_concurrent_reconciles / u16::try_from(parts).unwrap_or(u16::MAX)).max(1);
        let mut env = RunEnv {
            ctx,
            client,
            operator_namespace: config.operator_namespace.clone(),
            per_part: controller::Config::default().concurrency(share),
            stop,
            children,
        };
        for kind in kinds {
            controllers.extend(kind.controllers(&mut env).await);
        }
        controllers
    }
}
