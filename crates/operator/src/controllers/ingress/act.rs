//! The ingress's own act step (I/O): the cert-manager Certificate, applied after the agent's
//! basics and before its key and Deployment (see `agent/act.rs`), only while the agent's
//! objects are rendered.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, ResourceExt};
use tailnet_api::FIELD_MANAGER;
use tailnet_render::certificate::Certificate;

use super::super::agent::decide::AgentPlan;
use super::super::applied::{self, ChildRef, Decision, Live};
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::decide::{Acted, Ingress};

pub async fn act(ctx: &Context, plan: &AgentPlan<Ingress>) -> Result<Acted, ReconcileError> {
    let mut acted = Acted::default();
    let certificate = plan.objects.as_ref().and_then(|o| o.certificate.as_ref());
    if let Some(certificate) = certificate {
        acted.certificate_error =
            apply_certificate(ctx, &plan.owner.namespace, certificate).await?;
    }
    Ok(acted)
}

fn certificate_api(ctx: &Context, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cert-manager.io",
        "v1",
        "Certificate",
    ));
    Api::namespaced_with(ctx.client.clone(), namespace, &resource)
}

/// Applies the cert-manager Certificate. Not watched (cert-manager may not even be
/// installed): skipped while unchanged and younger than the re-apply interval, like the
/// other unwatched children. `Ok(Some(error))`: the apply failed.
async fn apply_certificate(
    ctx: &Context,
    namespace: &str,
    certificate: &Certificate,
) -> Result<Option<String>, ReconcileError> {
    let value = serde_json::to_value(certificate).map_err(|source| ReconcileError::Serialize {
        what: "Certificate".to_string(),
        source,
    })?;
    let name = certificate.metadata.name.clone().unwrap_or_default();
    let child = ChildRef {
        kind: "Certificate".to_string(),
        namespace: namespace.to_string(),
        name: name.clone(),
    };
    let fingerprint = applied::fingerprint(&value).ok();
    let unchanged = fingerprint
        .as_ref()
        .is_some_and(|f| ctx.applied.decide(&child, f, Live::Unwatched) == Decision::Unchanged);
    if unchanged {
        return Ok(None);
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match certificate_api(ctx, namespace)
        .patch(&name, &params, &Patch::Apply(&value))
        .await
    {
        Ok(live) => {
            if let Some(f) = fingerprint {
                ctx.applied.record(child, f, live.resource_version());
            }
            Ok(None)
        }
        Err(e) => Ok(Some(e.to_string())),
    }
}
