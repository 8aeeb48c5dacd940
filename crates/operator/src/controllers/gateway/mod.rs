//! The Gateway kind: a Gateway API `Gateway` whose GatewayClass is ours
//! (`controllerName: tailnet-operator.dev/gateway`) and Accepted gets one agent (one tailnet
//! identity) serving its listeners; every other Gateway is never touched, and one moved to
//! another class is released. Its decisions (`decide.rs`) come from
//! `tailnet_render::gateway`; its own reads (`gather.rs`): the class and its parameters (the
//! Tailnet), routes, ReferenceGrants, certificate Secrets and backend Services; its own writes
//! (`act.rs`): the agent's copy of the certificates and the routes' status. Its controller is
//! also triggered by the routes naming it, ReferenceGrants, its class and the classes'
//! parameters (Secrets and Services are read on each poll: the operator does not watch them).

pub mod act;
pub mod decide;
pub mod gather;
pub mod intents;
pub mod observation;
#[cfg(test)]
mod tests;

use kube::runtime::controller::Controller;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tailnet_api::gateway_parameters::TailnetGatewayParameters;
use tailnet_gateway_api::{
    Gateway, GatewayClass, HTTPRoute, ParentReference, ReferenceGrant, TCPRoute, TLSRoute,
};

use super::agent::decide::{Admission, AgentPlan};
use super::agent::kind::{AgentKind, GatherInput};
use super::context::Context;
use super::error::ReconcileError;
pub use decide::GatewayEntrance;
use observation::{ClassState, GatewayObserved};

impl AgentKind for GatewayEntrance {
    const CONTROLLER: &'static str = "gateway";

    /// A Gateway of a class of ours is handled (also while the class is not Accepted: its
    /// status says so and the last good agent stays); any other is ignored (released if it
    /// was ours).
    async fn admission(
        ctx: &Context,
        gateway: &Gateway,
        _now: jiff::Timestamp,
    ) -> Result<Admission<tailnet_gateway_api::GatewayStatus>, ReconcileError> {
        Ok(match gather::class_state(ctx, gateway).await? {
            ClassState::NotOurs => Admission::Ignore,
            ClassState::Ours(_) => Admission::Handle,
        })
    }

    /// The Tailnet of the class's parameters (`None`: the default Tailnet).
    async fn tailnet_of(ctx: &Context, gateway: &Gateway) -> Option<String> {
        match gather::class_state(ctx, gateway).await {
            Ok(ClassState::Ours(Ok(parameters))) => parameters.tailnet,
            _ => None,
        }
    }

    fn extra_watches(
        controller: Controller<Gateway>,
        client: &kube::Client,
    ) -> Controller<Gateway> {
        let gateways = controller.store();
        let all = |gateways: Store<Gateway>| {
            move |_: ()| {
                gateways
                    .state()
                    .iter()
                    .map(|g| ObjectRef::from_obj(&**g))
                    .collect::<Vec<_>>()
            }
        };
        let every_gateway = all(gateways.clone());
        let every_gateway_again = all(gateways.clone());
        let by_class = {
            let gateways = gateways.clone();
            move |class: GatewayClass| {
                let name = class.name_any();
                gateways
                    .state()
                    .iter()
                    .filter(|g| g.spec.gateway_class_name == name)
                    .map(|g| ObjectRef::from_obj(&**g))
                    .collect::<Vec<_>>()
            }
        };
        let config = watcher::Config::default;
        controller
            .watches(
                Api::<HTTPRoute>::all(client.clone()),
                config(),
                |r: HTTPRoute| parents(&r.namespace().unwrap_or_default(), &r.spec.parent_refs),
            )
            .watches(
                Api::<TLSRoute>::all(client.clone()),
                config(),
                |r: TLSRoute| parents(&r.namespace().unwrap_or_default(), &r.spec.parent_refs),
            )
            .watches(
                Api::<TCPRoute>::all(client.clone()),
                config(),
                |r: TCPRoute| parents(&r.namespace().unwrap_or_default(), &r.spec.parent_refs),
            )
            .watches(
                Api::<ReferenceGrant>::all(client.clone()),
                config(),
                move |_: ReferenceGrant| every_gateway(()),
            )
            .watches(Api::<GatewayClass>::all(client.clone()), config(), by_class)
            .watches(
                Api::<TailnetGatewayParameters>::all(client.clone()),
                config(),
                move |_: TailnetGatewayParameters| every_gateway_again(()),
            )
    }

    async fn gather(
        ctx: &Context,
        gateway: &Gateway,
        _intent: &(),
        input: GatherInput<'_>,
    ) -> Result<GatewayObserved, ReconcileError> {
        gather::gather(ctx, gateway, input).await
    }

    async fn act(
        ctx: &Context,
        _gateway: &Gateway,
        plan: &AgentPlan<GatewayEntrance>,
    ) -> Result<(), ReconcileError> {
        act::act(ctx, plan).await
    }
}

/// The Gateways a route's parentRefs name.
fn parents(route_namespace: &str, refs: &[ParentReference]) -> Vec<ObjectRef<Gateway>> {
    refs.iter()
        .filter(|p| {
            p.group.as_deref().unwrap_or(tailnet_gateway_api::GROUP) == tailnet_gateway_api::GROUP
                && p.kind
                    .as_deref()
                    .unwrap_or(tailnet_gateway_api::kinds::GATEWAY)
                    == tailnet_gateway_api::kinds::GATEWAY
        })
        .map(|p| ObjectRef::new(&p.name).within(p.namespace.as_deref().unwrap_or(route_namespace)))
        .collect()
}
