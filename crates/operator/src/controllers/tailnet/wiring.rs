//! How the Tailnet controller wires itself: the Tailnets (debounced: one policy render serves
//! a burst of changes), the operator namespace's ConfigMaps (base policy, hosts, contributor
//! fragments) and Secrets (API keys), the egress Services (cluster IPs for DNS), and the
//! objects of every registered agent kind (their Tailnet's policy and DNS depend on them).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tailnet_api::Tailnet;

use super::super::agent::wiring::Wired;
use super::super::context::Context;
use crate::runtime::caches::{Stop, WatchBackoff, log_result};

/// How long the Tailnet controller waits for more changes before reconciling (hundreds of
/// resources applied at once each trigger the Tailnet; without a pause every change rendered
/// and compared again).
const TAILNET_DEBOUNCE: Duration = Duration::from_millis(500);

/// The Tailnet controller before its context exists (its store is part of the context).
pub fn controller(client: &kube::Client) -> Controller<Tailnet> {
    Controller::new(
        Api::<Tailnet>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(controller::Config::default().debounce(TAILNET_DEBOUNCE))
    .trigger_backoff(WatchBackoff::default())
}

/// The Tailnet controller with every watch, ready to be polled.
pub fn run(
    controller: Controller<Tailnet>,
    ctx: Arc<Context>,
    kinds: &[Box<dyn Wired>],
    stop: Stop,
) -> BoxFuture<'static, ()> {
    let client = ctx.client.clone();
    let ns = ctx.config.operator_namespace.clone();
    let tailnets = controller.store();
    let mut controller = controller
        .watches(
            Api::<ConfigMap>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            by_config_map(tailnets.clone()),
        )
        .watches(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            by_secret(tailnets),
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
    for kind in kinds {
        controller = kind.tailnet_watches(controller, &client);
    }
    controller
        .graceful_shutdown_on(stop)
        .run(super::reconcile, super::error_policy, ctx)
        .for_each(log_result)
        .boxed()
}

/// The Tailnets a ConfigMap feeds: base policy, hosts, or a contributor's fragment.
fn by_config_map(
    tailnets: Store<Tailnet>,
) -> impl Fn(ConfigMap) -> Vec<ObjectRef<Tailnet>> + Send + Sync + 'static {
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
}

/// The Tailnets whose API key a Secret holds.
fn by_secret(
    tailnets: Store<Tailnet>,
) -> impl Fn(Secret) -> Vec<ObjectRef<Tailnet>> + Send + Sync + 'static {
    move |secret: Secret| {
        let name = secret.name_any();
        tailnets
            .state()
            .iter()
            .filter(|t| t.spec.api_secret_ref.name == name)
            .map(|t| ObjectRef::from_obj(&**t))
            .collect::<Vec<_>>()
    }
}
