//! The ingress's own gather step (I/O): the other ingresses of its Tailnet, its backends and
//! its certificate; what every agent shares is read by the generic gather
//! (`agent/gather.rs`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::{Api, ResourceExt};
use tailnet_api::TailnetIngress;
use tailnet_api::ingress::ExposeMode;
use tailnet_api::validate::ValidIngress;
use tailnet_render::backends::{self, ObservedBackends};
use tailnet_render::meta::Owner;

use super::super::agent::keys::read_secret;
use super::super::agent::kind::GatherInput;
use super::super::context::Context;
use super::super::entrances::service_intents;
use super::super::error::ReconcileError;
use super::super::kube_io::get_opt_cached;
use super::desired;
use super::observation::{IngressObserved, tls_secret_name};

/// The ingress's own reads: the other ingresses of its Tailnet and its tag among them, its
/// backends, and its certificate.
pub async fn gather(
    ctx: &Context,
    ingress: &TailnetIngress,
    valid: &ValidIngress,
    input: GatherInput<'_>,
) -> Result<IngressObserved, ReconcileError> {
    let namespace = ingress.namespace().unwrap_or_default();
    let tailnet = &input.access.tailnet;
    let tailnet_name = tailnet.name_any();
    let others: Vec<Arc<TailnetIngress>> = ctx
        .kinds
        .objects::<TailnetIngress>()
        .into_iter()
        .filter(|other| other.uid() != ingress.uid() && other.spec.tailnet_ref.name == tailnet_name)
        .collect();
    let prefix = &tailnet.spec.policy.tag_prefix;
    let tag = Some(desired::tag(ingress, &tailnet_name, prefix, &others));
    let mut backends = backends(ctx, valid, &namespace).await?;
    super::super::reach::observe(ctx, &tailnet.spec.server, &mut backends).await;
    let tls_certificate = tls_certificate(ctx, ingress, input.owner).await?;
    let entrances = service_intents(ctx, tailnet, None)
        .into_iter()
        .map(|s| s.intent)
        .collect();
    Ok(IngressObserved {
        others,
        entrances,
        tag,
        backends,
        tls_certificate,
    })
}

/// The backend Services and CA ConfigMaps the exposes reference, as they exist.
async fn backends(
    ctx: &Context,
    valid: &ValidIngress,
    namespace: &str,
) -> Result<ObservedBackends, ReconcileError> {
    let administrative = namespace == ctx.config.operator_namespace;
    let wanted = backends::referenced(namespace, &valid.exposes);
    let mut observed = ObservedBackends::default();
    for key in &wanted.services {
        // Elsewhere rejected before it matters; out of a namespace-scoped operator's reach
        // (`decide` names it): not read.
        if (key.namespace != namespace && !administrative)
            || !ctx.config.scope.contains(&key.namespace)
        {
            continue;
        }
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &key.namespace);
        if let Some(service) = get_opt_cached(&api, &key.name)
            .await
            .map_err(ReconcileError::kube("get backend Service"))?
        {
            observed.add_service(&service);
        }
    }
    for key in &wanted.config_maps {
        if !ctx.config.scope.contains(&key.namespace) {
            continue;
        }
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &key.namespace);
        if let Some(cm) = get_opt_cached(&api, &key.name)
            .await
            .map_err(ReconcileError::kube("get CA ConfigMap"))?
        {
            observed.add_config_map(&cm);
        }
    }
    Ok(observed)
}

/// `tls.crt` of the TLS Secret, when there is an http expose to serve with it.
async fn tls_certificate(
    ctx: &Context,
    ingress: &TailnetIngress,
    owner: &Owner,
) -> Result<Option<Vec<u8>>, ReconcileError> {
    if !ingress
        .spec
        .exposes
        .iter()
        .any(|e| e.mode == ExposeMode::Http)
    {
        return Ok(None);
    }
    let secret = read_secret(ctx, &owner.namespace, &tls_secret_name(ingress, owner)).await?;
    Ok(secret
        .and_then(|s| s.data)
        .and_then(|mut d| d.remove("tls.crt"))
        .map(|b| b.0))
}
