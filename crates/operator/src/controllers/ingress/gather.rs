//! Gather step of the TailnetIngress controller: everything `decide` needs, read once.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::{Api, ResourceExt};
use tailnet_api::TailnetIngress;
use tailnet_api::agent_status::StatusReport;
use tailnet_api::ingress::ExposeMode;
use tailnet_api::naming::AgentKind;
use tailnet_api::validate::ValidIngress;
use tailnet_render::backends::{self, ObservedBackends};
use tailnet_render::intent::Claim;
use tailnet_render::meta::Owner;

use super::super::access::{TailnetAccess, tailnet_access};
use super::super::agent_conditions::{NodeList, nodes_unobservable};
use super::super::agent_gather::{AgentObserved, gather_agent};
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::identity::{AuthSecret, read_secret};
use super::super::kube_io::get_opt_cached;
use super::super::status::Problem;

/// What one reconcile of an ingress observed.
#[derive(Clone)]
pub struct IngressObservation {
    /// The Tailnet and its Headscale client, or why `TailnetReady` is False. When this is an
    /// error, nothing below was read.
    pub access: Result<TailnetAccess, Problem>,
    /// The other TailnetIngresses of the same Tailnet (watch cache): the first to claim a
    /// hostname keeps it.
    pub others: Vec<Arc<TailnetIngress>>,
    /// This ingress's tag from the assignment over the Tailnet's ingresses
    /// (`desired::ingress_tags`: injective, first claim keeps today's form, recorded tags
    /// stay); `Err(holder)`: no tag of its own (`namespace/name` of the ingress holding it).
    /// `None`: not gathered; `decide` assigns it from `others` (the same function).
    pub tag: Option<Result<String, String>>,
    /// Backend Services that exist (their ports) and the CA ConfigMaps of
    /// `backend.tls.caConfigMapRef` (their keys). A backend in another namespace is only read
    /// for an ingress in the operator namespace (elsewhere it is rejected before it matters).
    pub backends: ObservedBackends,
    /// `tls.crt` of the TLS Secret (read only when there is an http expose); `None` when the
    /// Secret or the key does not exist.
    pub tls_certificate: Option<Vec<u8>>,
    /// Headscale's node list (the agent's node).
    pub nodes: NodeList,
    pub auth_secret: AuthSecret,
    pub deployment: Option<Deployment>,
    /// The agent's `/status` (probe results); `None` when it could not be read.
    pub report: Option<StatusReport>,
}

impl IngressObservation {
    /// Only the Tailnet access (or its problem); nothing else read.
    pub fn only_access(access: Result<TailnetAccess, Problem>) -> Self {
        IngressObservation {
            access,
            others: Vec::new(),
            tag: None,
            backends: ObservedBackends::default(),
            tls_certificate: None,
            nodes: Err(nodes_unobservable()),
            auth_secret: AuthSecret::Absent,
            deployment: None,
            report: None,
        }
    }
}

pub async fn gather(
    ctx: &Context,
    ingress: &TailnetIngress,
    valid: &ValidIngress,
) -> Result<IngressObservation, ReconcileError> {
    let namespace = ingress.namespace().unwrap_or_default();
    let access = tailnet_access(ctx, &ingress.spec.tailnet_ref.name).await;
    let Ok(tailnet_access) = &access else {
        return Ok(IngressObservation::only_access(access));
    };
    let tailnet_name = tailnet_access.tailnet.name_any();
    let others: Vec<Arc<TailnetIngress>> = ctx
        .ingresses
        .state()
        .into_iter()
        .filter(|other| other.uid() != ingress.uid() && other.spec.tailnet_ref.name == tailnet_name)
        .collect();
    let tag = Some(ingress_tag(
        ingress,
        &tailnet_name,
        &tailnet_access.tailnet.spec.policy.tag_prefix,
        &others,
    ));
    let backends = backends(ctx, valid, &namespace).await?;
    let owner = Owner::from_meta(AgentKind::Ingress, &ingress.metadata, &tailnet_name)?;
    let tls_certificate = tls_certificate(ctx, ingress, &owner).await?;
    let AgentObserved {
        nodes,
        auth_secret,
        deployment,
        report,
    } = gather_agent(ctx, tailnet_access, &owner).await?;
    Ok(IngressObservation {
        access,
        others,
        tag,
        backends,
        tls_certificate,
        nodes,
        auth_secret,
        deployment,
        report,
    })
}

/// The tag of `ingress` among `others` of its Tailnet (see `IngressObservation::tag`).
pub fn ingress_tag(
    ingress: &TailnetIngress,
    tailnet_name: &str,
    prefix: &str,
    others: &[Arc<TailnetIngress>],
) -> Result<String, String> {
    let others: Vec<Claim> = others.iter().map(|o| Claim::of_ingress(o)).collect();
    tailnet_render::claims::ingress_tag_of(
        tailnet_name,
        prefix,
        &Claim::of_ingress(ingress),
        &others,
    )
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

/// The name of the Secret the agent reads its certificate from: `spec.tls.secretName`, else
/// the one cert-manager issues for the operator's Certificate.
pub fn tls_secret_name(ingress: &TailnetIngress, owner: &Owner) -> String {
    ingress
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.secret_name.clone())
        .unwrap_or_else(|| owner.names().tls)
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
