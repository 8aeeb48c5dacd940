//! The ingress's calls into the shared desired-state composition (`tailnet_render::compose`,
//! `desired` and `claims`), all in this one module (pure): its typed intent, its tag among
//! the Tailnet's ingresses, its hostnames after older claims, and its agent's objects.

use std::sync::Arc;

use tailnet_api::TailnetIngress;
use tailnet_api::validate::{FieldError, ValidIngress};
use tailnet_render::compose;
use tailnet_render::desired::{self, IngressDesired, IngressNames};
use tailnet_render::intent::{Claim, IngressIntent, TailnetScope};
use tailnet_render::{RenderContext, RenderError};

/// The tag of `ingress` among `others` of its Tailnet: `Err(holder)` when it has none of its
/// own (see `IngressObserved::tag`).
pub fn tag<'a>(
    ingress: &'a TailnetIngress,
    tailnet_name: &str,
    prefix: &str,
    others: impl IntoIterator<Item = &'a Arc<TailnetIngress>>,
) -> Result<String, String> {
    let others: Vec<Claim> = others.into_iter().map(|o| Claim::of_ingress(o)).collect();
    tailnet_render::claims::ingress_tag_of(
        tailnet_name,
        prefix,
        &Claim::of_ingress(ingress),
        &others,
    )
}

fn scope<'a>(ctx: &'a RenderContext) -> TailnetScope<'a> {
    TailnetScope {
        name: ctx.tailnet_name,
        spec: ctx.tailnet,
        operator_namespace: ctx.operator_namespace,
    }
}

/// The ingress read once in its Tailnet: its hostnames per expose before any claim; `Err`
/// holds the context rules it breaks (cross-namespace backends, templates, a certificate
/// source).
pub fn intent(
    ingress: &TailnetIngress,
    ctx: &RenderContext,
    kind: tailnet_api::naming::AgentKind,
) -> Result<IngressIntent, Vec<FieldError>> {
    let intent = IngressIntent::of_kind(ingress, &scope(ctx), kind);
    match &intent.names {
        Ok(_) => Ok(intent),
        Err(errors) => Err(errors.clone()),
    }
}

/// The ingress's hostnames after the claims of the older ingresses among `others` (the
/// composition's step; only those that claimed first are read).
/// `entrances`: the intents of the Tailnet's other entrances (Services of the tailnet
/// `loadBalancerClass`), which claim names like ingresses.
pub fn names(
    intent: &IngressIntent,
    others: &[Arc<TailnetIngress>],
    entrances: &[IngressIntent],
    ctx: &RenderContext,
) -> Result<IngressNames, Vec<FieldError>> {
    let scope = scope(ctx);
    let earlier: Vec<IngressIntent> = others
        .iter()
        .filter(|o| desired::may_claim_before(&intent.claim, o))
        .map(|o| IngressIntent::new(o, &scope))
        .collect();
    compose::ingress_names_among(intent, earlier.iter().chain(entrances))
}

/// What the cluster knows of the ingress, for [`objects`].
pub struct Observed<'a> {
    pub backends: &'a tailnet_render::backends::ObservedBackends,
    pub certificate_ready: bool,
    pub tag: &'a str,
    /// `Ingress`, or `Service` for a Service read as an ingress.
    pub kind: tailnet_api::naming::AgentKind,
}

/// Backends resolved and, when all resolve, the agent's objects (the pipeline
/// `tailnet-operator render` uses too).
pub fn objects(
    ingress: &TailnetIngress,
    valid: &ValidIngress,
    names: IngressNames,
    ctx: &RenderContext,
    observed: &Observed,
) -> Result<IngressDesired, RenderError> {
    let wanted = desired::IngressObserved {
        backends: observed.backends,
        certificate_ready: observed.certificate_ready,
        tag: observed.tag,
        kind: observed.kind,
    };
    desired::ingress(&ingress.metadata, valid, names, ctx, &wanted)
}
