//! The GatewayClass controller: classes whose `controllerName` is
//! `tailnet-operator.dev/gateway` get `status.conditions` (`Accepted`) and
//! `status.supportedFeatures`; every other class is never touched. A class's parameters are a
//! `TailnetGatewayParameters` (its `parametersRef`), checked against the Tailnet it names
//! (`decide.rs`, pure). The Gateway kind (`controllers::gateway`) reads the same verdict
//! ([`class_verdict`]) to decide whether a Gateway of the class is served, and in which
//! Tailnet.
//!
//! It runs only where the Gateway API CRDs are installed (`gateway_api_installed`).

pub mod decide;

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tailnet_api::Tailnet;
use tailnet_api::gateway_parameters::{GatewayParameters, TailnetGatewayParameters};
use tailnet_api::tailnet::TailnetSpec;
use tailnet_gateway_api::GatewayClass;
use tailnet_gateway_api::gatewayclass::GatewayClassStatus;
use tailnet_render::gateway::class::supported_features;

use super::access::default_tailnet;
use super::context::Context;
use super::error::ReconcileError;
use super::instrument::{backoff_on_error, instrumented};
use super::kube_io::get_opt_cached;
use super::publish::write_status;
use super::status::WithConditions;
use crate::runtime::caches::{Stop, WatchBackoff, log_result};
use decide::{ClassObserved, ours, parameters_ref};

/// Label of the controller's reconcile metrics.
pub const CONTROLLER: &str = "gatewayclass";

impl WithConditions for GatewayClassStatus {
    fn conditions(&self) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
        &self.conditions
    }
    fn conditions_mut(
        &mut self,
    ) -> &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
        &mut self.conditions
    }
}

/// Whether the Gateway API CRDs this operator serves are installed (discovery of
/// `gateway.networking.k8s.io/v1` with `gatewayclasses` and `gateways`). Without them the
/// Gateway controllers are not started (the rest of the operator works as before).
pub async fn gateway_api_installed(client: &kube::Client) -> bool {
    let version = format!(
        "{}/{}",
        tailnet_gateway_api::GROUP,
        tailnet_gateway_api::VERSION
    );
    match client.list_api_group_resources(&version).await {
        Ok(list) => {
            let has = |plural: &str| list.resources.iter().any(|r| r.name == plural);
            has("gatewayclasses") && has("gateways")
        }
        Err(error) => {
            tracing::debug!(%error, "Gateway API group not discovered");
            false
        }
    }
}

/// The verdict on class `class`'s parameters (read now): `Ok` with the Tailnet and sources,
/// `Err` with why the class is not Accepted.
pub async fn class_verdict(
    ctx: &Context,
    class: &GatewayClass,
) -> Result<Result<GatewayParameters, String>, ReconcileError> {
    let spec = match parameters_ref(class) {
        Ok(Some((namespace, name))) => {
            let api: Api<TailnetGatewayParameters> =
                Api::namespaced(ctx.client.clone(), &namespace);
            Some(
                get_opt_cached(&api, &name)
                    .await
                    .map_err(ReconcileError::kube("get TailnetGatewayParameters"))?
                    .map(|p| p.spec),
            )
        }
        Ok(None) | Err(_) => None,
    };
    let tailnets = ctx.caches.tailnets.clone();
    let lookup = move |name: &str| -> Option<TailnetSpec> {
        tailnets
            .get(&ObjectRef::<Tailnet>::new(name))
            .map(|t| t.spec.clone())
    };
    let observed = ClassObserved {
        parameters: spec.as_ref().map(Option::as_ref),
        default_tailnet: default_tailnet(ctx).map_err(|p| p.message),
        tailnet: &lookup,
    };
    Ok(decide::verdict(class, &observed))
}

async fn reconcile(class: Arc<GatewayClass>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let key = format!("{CONTROLLER}/{}", class.name_any());
    instrumented(&ctx, CONTROLLER, &key, apply(&class, &ctx)).await
}

async fn apply(class: &GatewayClass, ctx: &Context) -> Result<Action, ReconcileError> {
    if !ours(class) {
        return Ok(Action::await_change());
    }
    let verdict = class_verdict(ctx, class).await?;
    let Some(status) = decide::status(
        class,
        &verdict,
        &supported_features(),
        jiff::Timestamp::now(),
    ) else {
        return Ok(Action::await_change());
    };
    let previous = class.status.clone().unwrap_or_default();
    let api: Api<GatewayClass> = Api::all(ctx.client.clone());
    write_status(ctx, &api, class, &previous, &status).await?;
    // The Tailnet's allowlist may change without an event here: checked again now and then.
    Ok(Action::requeue(std::time::Duration::from_secs(300)))
}

fn error_policy(class: Arc<GatewayClass>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    let key = format!("{CONTROLLER}/{}", class.name_any());
    backoff_on_error(&ctx, CONTROLLER, &key, error)
}

/// The GatewayClass controller, triggered by the classes, by the parameters they name, and by
/// Tailnets (the default Tailnet and allowlists decide acceptance).
pub fn run(ctx: Arc<Context>, stop: Stop) -> BoxFuture<'static, ()> {
    let client = ctx.client.clone();
    let controller = Controller::new(
        Api::<GatewayClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .trigger_backoff(WatchBackoff::default());
    let classes = controller.store();
    let by_parameters = {
        let classes = classes.clone();
        move |p: TailnetGatewayParameters| {
            let (namespace, name) = (p.namespace().unwrap_or_default(), p.name_any());
            classes
                .state()
                .iter()
                .filter(|c| {
                    parameters_ref(c).ok().flatten() == Some((namespace.clone(), name.clone()))
                })
                .map(|c| ObjectRef::from_obj(&**c))
                .collect::<Vec<_>>()
        }
    };
    let every_class = move |_: Tailnet| {
        classes
            .state()
            .iter()
            .filter(|c| ours(c))
            .map(|c| ObjectRef::from_obj(&**c))
            .collect::<Vec<_>>()
    };
    controller
        .watches(
            Api::<TailnetGatewayParameters>::all(client.clone()),
            watcher::Config::default(),
            by_parameters,
        )
        .watches(
            Api::<Tailnet>::all(client),
            watcher::Config::default(),
            every_class,
        )
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(log_result)
        .boxed()
}
