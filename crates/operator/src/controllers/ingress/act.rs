//! The ingress's own act step (I/O): the cert-manager Certificate, applied after the agent's
//! basics and before its key and Deployment (see `agent/act.rs`), only while the agent's
//! objects are rendered.

use k8s_openapi::api::core::v1::Service;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tailnet_api::FIELD_MANAGER;
use tailnet_api::naming::labels;
use tailnet_render::certificate::Certificate;
use tailnet_render::ingress::{IngressObjects, in_cluster_service_name};
use tailnet_render::meta::Owner;

use super::super::agent::decide::AgentPlan;
use super::super::applied::{self, ChildRef, Decision, Live};
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::kube_io::{Watched, apply_cached};
use super::decide::{Acted, Ingress};
use crate::scope::CacheRead;

pub async fn act(ctx: &Context, plan: &AgentPlan<Ingress>) -> Result<Acted, ReconcileError> {
    let mut acted = Acted::default();
    let certificate = plan.objects.as_ref().and_then(|o| o.certificate.as_ref());
    if let Some(certificate) = certificate {
        acted.certificate_error =
            apply_certificate(ctx, &plan.owner.namespace, certificate).await?;
    }
    in_cluster_service(ctx, &plan.owner, plan.objects.as_ref()).await?;
    Ok(acted)
}

/// The in-cluster Service in front of the agent (split horizon): applied while
/// `spec.inCluster.namespaces` lists any, deleted once it lists none. Left as it is while
/// nothing is rendered (the last good configuration stays). Shared by every kind decided as
/// an ingress (TailnetIngress, Services of the tailnet `loadBalancerClass`).
pub async fn in_cluster_service(
    ctx: &Context,
    owner: &Owner,
    objects: Option<&IngressObjects>,
) -> Result<(), ReconcileError> {
    let Some(objects) = objects else {
        return Ok(());
    };
    let namespace = &owner.namespace;
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let store = ctx.kinds.store::<Service>();
    if let Some(service) = &objects.in_cluster_service {
        let watched = match store {
            Some(store) => Watched::In(store),
            None => Watched::No,
        };
        apply_cached(ctx, &api, namespace, service, watched).await?;
        return Ok(());
    }
    delete_in_cluster_service(ctx, owner).await
}

/// Deletes the agent's in-cluster Service (split horizon) if the Service cache has it and it
/// is ours: labelled for this agent by the operator (a Service of that name the user made is
/// never touched).
pub async fn delete_in_cluster_service(ctx: &Context, owner: &Owner) -> Result<(), ReconcileError> {
    let namespace = &owner.namespace;
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let store = ctx.kinds.store::<Service>();
    let name = in_cluster_service_name(owner.kind, &owner.name);
    let ours = store
        .and_then(|s| s.cached(&ObjectRef::new(&name).within(namespace)))
        .is_some_and(|live| {
            live.labels().get(labels::INSTANCE) == Some(&owner.names().base)
                && live.labels().get(labels::MANAGED_BY).map(String::as_str)
                    == Some("tailnet-operator")
        });
    if ours {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(ReconcileError::kube(format!(
                    "delete in-cluster Service {namespace}/{name}"
                ))(e));
            }
        }
    }
    Ok(())
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
