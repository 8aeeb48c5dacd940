//! The Kubernetes-native entrances of a Tailnet (SPEC §3): the Services of the tailnet
//! `loadBalancerClass` in the watch cache of the Service kind, by the Tailnet they belong to
//! (their annotation, else the default Tailnet). Read by the Tailnet controller (policy and
//! DNS) and by the ingress and Service kinds (names and tags are claimed across them).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use tailnet_api::Tailnet;
use tailnet_api::service::{is_tailnet_load_balancer, tailnet_annotation};
use tailnet_render::intent::{ServiceIntent, TailnetScope};

use super::access::default_tailnet;
use super::context::Context;

/// The cached Services of the tailnet `loadBalancerClass` that belong to Tailnet `tailnet`,
/// and those that left the class but are still being released (they carry the finalizer:
/// like a deleted ingress, their grant and names stay until their node is gone).
pub fn services_of(ctx: &Context, tailnet: &str) -> Vec<Arc<Service>> {
    let default = default_tailnet(ctx).ok();
    ctx.kinds
        .objects::<Service>()
        .into_iter()
        .filter(|s| is_tailnet_load_balancer(s) || releasing(s))
        .filter(|s| tailnet_annotation(s).or(default.as_deref()) == Some(tailnet))
        .collect()
}

/// The intents of Tailnet `tailnet`'s Services, except the one of uid `except` (a Service's
/// own reconcile reads the others).
pub fn service_intents(
    ctx: &Context,
    tailnet: &Tailnet,
    except: Option<&str>,
) -> Vec<ServiceIntent> {
    let name = tailnet.name_any();
    let scope = TailnetScope {
        name: &name,
        spec: &tailnet.spec,
        operator_namespace: &ctx.config.operator_namespace,
    };
    services_of(ctx, &name)
        .iter()
        .filter(|s| except.is_none() || s.metadata.uid.as_deref() != except)
        .map(|s| ServiceIntent::new(s, &scope))
        .collect()
}

/// A Service the operator handled and has not released yet (it carries the finalizer).
fn releasing(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == tailnet_api::FINALIZER)
}
