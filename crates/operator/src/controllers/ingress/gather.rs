//! Gather step of the TailnetIngress controller: everything `decide` needs, read once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServicePort};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tailnet_api::TailnetIngress;
use tailnet_api::agent_status::StatusReport;
use tailnet_api::ingress::ExposeMode;
use tailnet_api::naming::AgentKind;
use tailnet_render::meta::Owner;

use super::super::access::{TailnetAccess, tailnet_access};
use super::super::agent_conditions::{NodeList, nodes_unobservable};
use super::super::agent_report::agent_status;
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::identity::{AuthSecret, gather_auth_secret, read_secret};
use super::super::kube_io::{from_cache_or_get, get_opt_cached};
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
    /// Backend Services that exist, by (namespace, name): their ports. A backend in another
    /// namespace is only read for an ingress in the operator namespace (elsewhere it is
    /// rejected before it matters).
    pub services: BTreeMap<(String, String), Vec<ServicePort>>,
    /// CA ConfigMaps of `backend.tls.caConfigMapRef` (ingress namespace) that exist, by name:
    /// their `data` keys.
    pub ca_config_maps: BTreeMap<String, BTreeSet<String>>,
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
            services: BTreeMap::new(),
            ca_config_maps: BTreeMap::new(),
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
) -> Result<IngressObservation, ReconcileError> {
    let namespace = ingress.namespace().unwrap_or_default();
    let access = tailnet_access(ctx, &ingress.spec.tailnet_ref.name).await;
    let Ok(tailnet_access) = &access else {
        return Ok(IngressObservation::only_access(access));
    };
    let tailnet_name = tailnet_access.tailnet.name_any();
    let others = ctx
        .ingresses
        .state()
        .into_iter()
        .filter(|other| other.uid() != ingress.uid() && other.spec.tailnet_ref.name == tailnet_name)
        .collect();
    let (services, ca_config_maps) = backends(ctx, ingress, &namespace).await?;
    let owner = Owner::from_meta(AgentKind::Ingress, &ingress.metadata, &tailnet_name)?;
    let tls_certificate = tls_certificate(ctx, ingress, &owner).await?;
    let nodes = match &tailnet_access.headscale {
        Ok(headscale) => ctx
            .nodes
            .get(headscale.server(), || headscale.list_nodes())
            .await
            .map_err(|e| Problem::headscale(&e, format!("listing Headscale nodes failed: {e}"))),
        Err(_) => Err(nodes_unobservable()),
    };
    let auth_secret = gather_auth_secret(ctx, &owner).await?;
    let deployment = from_cache_or_get(
        &ctx.caches.deployments,
        &Api::<Deployment>::namespaced(ctx.client.clone(), &namespace),
        &ObjectRef::new(&owner.names().base).within(&namespace),
    )
    .await
    .map_err(ReconcileError::kube("get Deployment"))?;
    let report = agent_status(ctx, &owner, deployment.as_ref()).await;
    Ok(IngressObservation {
        access,
        others,
        services,
        ca_config_maps,
        tls_certificate,
        nodes,
        auth_secret,
        deployment,
        report,
    })
}

type Backends = (
    BTreeMap<(String, String), Vec<ServicePort>>,
    BTreeMap<String, BTreeSet<String>>,
);

/// Each expose's backend Service (its ports) and backend CA ConfigMap (its keys).
async fn backends(
    ctx: &Context,
    ingress: &TailnetIngress,
    namespace: &str,
) -> Result<Backends, ReconcileError> {
    let administrative = namespace == ctx.config.operator_namespace;
    let mut services = BTreeMap::new();
    let mut config_maps = BTreeMap::new();
    for expose in &ingress.spec.exposes {
        let backend = &expose.backend;
        let ns = backend.namespace.as_deref().unwrap_or(namespace);
        let key = (ns.to_string(), backend.service.clone());
        if (ns == namespace || administrative) && !services.contains_key(&key) {
            let api: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
            if let Some(service) = get_opt_cached(&api, &backend.service)
                .await
                .map_err(ReconcileError::kube("get backend Service"))?
            {
                let ports = service.spec.and_then(|s| s.ports).unwrap_or_default();
                services.insert(key, ports);
            }
        }
        if let Some(tls) = &backend.tls
            && !config_maps.contains_key(&tls.ca_config_map_ref.name)
        {
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
            if let Some(cm) = get_opt_cached(&api, &tls.ca_config_map_ref.name)
                .await
                .map_err(ReconcileError::kube("get CA ConfigMap"))?
            {
                let keys = cm.data.unwrap_or_default().into_keys().collect();
                config_maps.insert(tls.ca_config_map_ref.name.clone(), keys);
            }
        }
    }
    Ok((services, config_maps))
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
