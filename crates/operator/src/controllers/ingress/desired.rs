//! The ingress's calls into the shared desired-state composition (`tailnet_render::desired`
//! and `claims`), all in this one module (pure): its tag among the Tailnet's ingresses, its
//! hostnames after older claims, and its agent's objects.

use std::collections::BTreeMap;
use std::sync::Arc;

use tailnet_api::TailnetIngress;
use tailnet_api::validate::{FieldError, ValidIngress};
use tailnet_render::desired::{self, IngressDesired, IngressError, IngressNames};
use tailnet_render::{RenderContext, RenderError};

/// The tag of `ingress` among `others` of its Tailnet: `Err(holder)` when it has none of its
/// own (see `IngressObserved::tag`).
pub fn tag<'a>(
    ingress: &'a TailnetIngress,
    tailnet_name: &str,
    prefix: &str,
    others: impl IntoIterator<Item = &'a Arc<TailnetIngress>>,
) -> Result<String, String> {
    tailnet_render::claims::ingress_tag_of(
        tailnet_name,
        prefix,
        ingress,
        others.into_iter().map(|o| &**o),
    )
}

/// The ingress's hostnames per expose, after the claims in `claimed` (hostname → holder);
/// errors are the context rules (cross-namespace backends, templates, a certificate source).
pub fn names(
    ingress: &TailnetIngress,
    valid: &ValidIngress,
    ctx: &RenderContext,
    claimed: &BTreeMap<String, String>,
) -> Result<IngressNames, Vec<FieldError>> {
    let namespace = ingress.metadata.namespace.as_deref().unwrap_or_default();
    desired::ingress_names(namespace, valid, ctx, claimed)
}

/// Which of `names` an older ingress among `others` keeps (hostname → `namespace/name`).
pub fn claimed_elsewhere(
    ingress: &TailnetIngress,
    names: &IngressNames,
    others: &[Arc<TailnetIngress>],
    ctx: &RenderContext,
) -> BTreeMap<String, String> {
    desired::claimed_elsewhere(ingress, &names.names, others.iter().map(|o| &**o), ctx)
}

/// What the cluster knows of the ingress, for [`objects`].
pub struct Observed<'a> {
    pub backends: &'a tailnet_render::backends::ObservedBackends,
    pub claimed: &'a BTreeMap<String, String>,
    pub certificate_ready: bool,
    pub tag: &'a str,
}

/// Backends resolved and, when all resolve, the agent's objects (the pipeline
/// `tailnet-operator render` uses too). `Ok(Err(errors))`: the spec does not hold in the
/// Tailnet's context.
pub fn objects(
    ingress: &TailnetIngress,
    valid: &ValidIngress,
    ctx: &RenderContext,
    observed: &Observed,
) -> Result<Result<IngressDesired, Vec<FieldError>>, RenderError> {
    let wanted = desired::IngressObserved {
        backends: observed.backends,
        claimed: observed.claimed,
        certificate_ready: observed.certificate_ready,
        tag: observed.tag,
    };
    match desired::ingress(&ingress.metadata, valid, ctx, &wanted) {
        Ok(desired) => Ok(Ok(desired)),
        Err(IngressError::Context(errors)) => Ok(Err(errors)),
        Err(IngressError::Render(e)) => Err(e),
    }
}
