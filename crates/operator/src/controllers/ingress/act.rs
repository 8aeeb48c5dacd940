//! Act step of the TailnetIngress controller: applies what `decide` planned, in an order that
//! never starts a pod before what it mounts exists.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, ResourceExt};
use tailnet_api::{FIELD_MANAGER, TailnetIngress};
use tailnet_render::certificate::Certificate;

use super::super::applied::{self, ChildRef, Decision, Live};
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::identity::act_on_agent_key;
use super::super::kube_io::{AgentBasics, apply_basics, apply_deployment};
use super::decide::AgentPlan;
use super::gather::IngressObservation;

/// What happened that the status must say (beyond the decision).
#[derive(Debug, Default)]
pub struct Acted {
    /// The cert-manager Certificate could not be applied (e.g. cert-manager is not
    /// installed): this error. Not a reconcile error: the status says it.
    pub certificate_error: Option<String>,
}

pub async fn act(
    ctx: &Context,
    ingress: &TailnetIngress,
    observed: &IngressObservation,
    plan: &AgentPlan,
) -> Result<Acted, ReconcileError> {
    let namespace = &plan.owner.namespace;
    let mut acted = Acted::default();
    if let Some(objects) = &plan.objects {
        apply_basics(
            ctx,
            namespace,
            AgentBasics {
                service_account: &objects.service_account,
                role: &objects.role,
                role_binding: &objects.role_binding,
                state_secret: &objects.state_secret,
                config_map: &objects.config_map,
                network_policy: &objects.network_policy,
            },
        )
        .await?;
        if let Some(certificate) = &objects.certificate {
            acted.certificate_error = apply_certificate(ctx, namespace, certificate).await?;
        }
    }
    // The key before the Deployment: a pod started before its auth Secret exists finds no key
    // and waits for an interactive login for a minute (see the egress controller). Also while
    // nothing is deployed: a spent key is retired once the node exists.
    act_on_agent_key(
        ctx,
        ingress,
        &observed.access,
        &plan.owner,
        &plan.tag,
        &plan.key,
    )
    .await?;
    if let Some(objects) = &plan.objects {
        apply_deployment(ctx, namespace, &objects.deployment).await?;
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
