//! The Service's own gather step: the Tailnet's TailnetIngresses and its other Services of
//! the tailnet `loadBalancerClass` (claims on names; the tag among the Services), and the
//! Service itself as the backend (it is in the watch cache already: not read again); what its
//! agent's egress admits (`super::super::reach`: the control plane's addresses and, for a
//! Service without a selector, its EndpointSlices).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use tailnet_api::TailnetIngress;
use tailnet_render::backends::ObservedBackends;
use tailnet_render::intent::{Claim, IngressIntent};

use super::super::agent::kind::GatherInput;
use super::super::context::Context;
use super::super::entrances::service_intents;
use super::super::error::ReconcileError;
use super::super::ingress::observation::IngressObserved;
use super::decide::ServiceIntent;

pub async fn gather(
    ctx: &Context,
    service: &Service,
    _intent: &ServiceIntent,
    input: GatherInput<'_>,
) -> Result<IngressObserved, ReconcileError> {
    let tailnet = &input.access.tailnet;
    let name = tailnet.name_any();
    let others: Vec<Arc<TailnetIngress>> = ctx
        .kinds
        .objects::<TailnetIngress>()
        .into_iter()
        .filter(|i| i.spec.tailnet_ref.name == name)
        .collect();
    let entrances: Vec<IngressIntent> =
        service_intents(ctx, tailnet, service.metadata.uid.as_deref())
            .into_iter()
            .map(|s| s.intent)
            .collect();
    let claim = Claim::of_service(service, &name);
    let tag = tailnet_render::claims::ingress_tag_of(
        &name,
        &tailnet.spec.policy.tag_prefix,
        &claim,
        entrances.iter().map(|e| &e.claim),
    );
    let mut backends = ObservedBackends::default();
    backends.add_service(service);
    super::super::reach::observe(ctx, &tailnet.spec.server, &mut backends).await;
    Ok(IngressObserved {
        others,
        entrances,
        tag: Some(tag),
        backends,
        tls_certificate: None,
    })
}
