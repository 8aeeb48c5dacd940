//! How every agent-backed kind's controller wires itself, generic over the kind: a shared
//! watch cache of its objects per watch part (started before leadership, so a standby is
//! warm), one controller per part triggered by that cache, its agents' Deployments (and the
//! operator namespace's agent Services for kinds that own them), its Tailnet (only the
//! objects whose policy effect changed, see `fan_out.rs`) and the kind's own extra watches;
//! its store for the reconciles, its conditions for `/metrics`, and the Tailnet controller's
//! watch of its objects.
//!
//! The runtime holds the registered kinds as [`Registration`]s (`controllers::agent_kinds`)
//! and only starts them.

use std::marker::PhantomData;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tailnet_api::Tailnet;
use tokio_util::sync::CancellationToken;

use super::super::context::{Context, KindStores};
use super::super::status::WithConditions;
use super::fan_out;
use super::kind::AgentKind;
use super::reconcile::{error_policy, reconcile};
use crate::metrics::ConditionSource;
use crate::runtime::caches::{
    AgentChildren, Stop, Subscriptions, WatchBackoff, api_in, log_result, scoped_store,
    shared_cache_of,
};
use crate::scope::ScopedStore;

/// A registered agent kind, before its caches run.
pub trait Registration: Send {
    /// Its agents own Services in the operator namespace (see `AgentKind`).
    fn owns_operator_services(&self) -> bool;
    /// Starts the shared cache of its objects in each watch part.
    fn start(
        self: Box<Self>,
        client: &kube::Client,
        parts: &[Option<String>],
        lead: &CancellationToken,
    ) -> Box<dyn Wired>;
}

/// The registration of kind `K` (one line per kind in `controllers::agent_kinds`).
pub fn register<K: AgentKind>() -> Box<dyn Registration> {
    Box::new(Register::<K>(PhantomData))
}

struct Register<K>(PhantomData<fn() -> K>);

impl<K: AgentKind> Registration for Register<K> {
    fn owns_operator_services(&self) -> bool {
        K::OWNS_OPERATOR_SERVICES
    }

    fn start(
        self: Box<Self>,
        client: &kube::Client,
        parts: &[Option<String>],
        lead: &CancellationToken,
    ) -> Box<dyn Wired> {
        let parts = parts
            .iter()
            .map(|part| {
                let cache = shared_cache_of(
                    api_in::<K::Object>(client, part.as_deref()),
                    K::watcher_config(),
                    lead,
                    1,
                    |_| {},
                );
                (part.clone(), cache)
            })
            .collect();
        Box::new(Wiring::<K> { parts })
    }
}

/// What the controllers of one kind need from the runtime once this replica leads.
pub struct RunEnv {
    pub ctx: Arc<Context>,
    pub client: kube::Client,
    pub operator_namespace: String,
    /// Each part's controller settings: its share of `max_concurrent_reconciles` (every
    /// resource comes due on each poll; unbounded they all ran at once).
    pub per_part: controller::Config,
    pub stop: Stop,
    /// The shared caches of the agents' children, whose subscriptions the kinds take.
    pub children: AgentChildren,
}

/// A kind whose caches run.
pub trait Wired: Send {
    /// Adds the store of its objects (all parts) to the reconciles' context.
    fn add_store(&self, stores: &mut KindStores);
    /// Its objects' conditions for `/metrics`.
    fn conditions(&self) -> ConditionSource;
    /// The Tailnet controller's watch of its objects (one per part): each triggers its
    /// Tailnet.
    fn tailnet_watches(
        &self,
        controller: Controller<Tailnet>,
        client: &kube::Client,
    ) -> Controller<Tailnet>;
    /// Its controllers, one per watch part, ready to be polled.
    fn controllers<'a>(
        self: Box<Self>,
        env: &'a mut RunEnv,
    ) -> BoxFuture<'a, Vec<BoxFuture<'static, ()>>>;
}

struct Wiring<K: AgentKind> {
    /// Per watch part: the shared cache of the kind's objects (one subscription: its
    /// controller's).
    parts: Vec<(Option<String>, Subscriptions<K::Object>)>,
}

impl<K: AgentKind> Wiring<K> {
    fn store(&self) -> ScopedStore<K::Object> {
        scoped_store(
            self.parts
                .iter()
                .map(|(part, cache)| (part.clone(), cache.store.clone())),
        )
    }
}

impl<K: AgentKind> Wired for Wiring<K> {
    fn add_store(&self, stores: &mut KindStores) {
        stores.insert(self.store());
    }

    fn conditions(&self) -> ConditionSource {
        ConditionSource::scoped(self.store(), |o: &K::Object| {
            K::status(o)
                .filter(|_| K::ours(o))
                .map(WithConditions::conditions)
        })
    }

    fn tailnet_watches(
        &self,
        mut controller: Controller<Tailnet>,
        client: &kube::Client,
    ) -> Controller<Tailnet> {
        for (part, _) in &self.parts {
            // An object without a Tailnet name belongs to the default one (the only one): it
            // triggers every Tailnet there is.
            let tailnets = controller.store();
            controller = controller.watches(
                api_in::<K::Object>(client, part.as_deref()),
                K::watcher_config(),
                move |o: K::Object| match K::tailnet_name(&o) {
                    Some(name) => vec![ObjectRef::<Tailnet>::new(name)],
                    None => tailnets
                        .state()
                        .iter()
                        .map(|t| ObjectRef::from_obj(&**t))
                        .collect(),
                },
            );
        }
        controller
    }

    fn controllers<'a>(
        self: Box<Self>,
        env: &'a mut RunEnv,
    ) -> BoxFuture<'a, Vec<BoxFuture<'static, ()>>> {
        async move {
            let mut controllers = Vec::new();
            for (index, (part, cache)) in self.parts.into_iter().enumerate() {
                match part_controller::<K>(env, index, part, cache).await {
                    Some(controller) => controllers.push(controller),
                    None => tracing::error!(
                        controller = K::CONTROLLER,
                        "a shared cache subscription is missing: a watch part is not reconciled"
                    ),
                }
            }
            controllers
        }
        .boxed()
    }
}

/// The controller of kind `K` in one watch part (`None` when a subscription it was started
/// with is missing, which a consistent start does not allow).
async fn part_controller<K: AgentKind>(
    env: &mut RunEnv,
    index: usize,
    part: Option<String>,
    mut cache: Subscriptions<K::Object>,
) -> Option<BoxFuture<'static, ()>> {
    let store = cache.store.clone();
    let trigger = cache.take()?;
    let deployments = env.children.deployments.get_mut(index)?;
    let deployment_store = deployments.store.clone();
    let deployment_trigger = deployments.take()?;
    let mut controller =
        Controller::for_shared_stream(trigger.take(store.clone()).await, store.clone())
            .with_config(env.per_part.clone())
            .trigger_backoff(WatchBackoff::default())
            .owns_shared_stream(deployment_trigger.take(deployment_store).await);
    // Agent Services live in the operator namespace: the part that covers it owns them.
    if K::OWNS_OPERATOR_SERVICES
        && part
            .as_deref()
            .is_none_or(|namespace| namespace == env.operator_namespace)
        && let Some(services) = env.children.services.take()
    {
        let services_store = env.children.services.store.clone();
        controller = controller.owns_shared_stream(services.take(services_store).await);
    }
    let controller = K::extra_watches(controller, &env.client)
        .watches(
            Api::<Tailnet>::all(env.client.clone()),
            watcher::Config::default(),
            fan_out::of_kind::<K>(store),
        )
        .graceful_shutdown_on(env.stop.clone())
        .run(reconcile::<K>, error_policy::<K>, env.ctx.clone())
        .for_each(log_result)
        .boxed();
    Some(controller)
}
