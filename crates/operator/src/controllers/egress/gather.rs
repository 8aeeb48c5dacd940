//! Gather step of the TailnetEgress controller: everything `decide` needs, read once.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::{Api, ResourceExt};
use tailnet_api::TailnetEgress;
use tailnet_api::agent_status::StatusReport;
use tailnet_api::naming::{AgentKind, labels};
use tailnet_render::meta::Owner;

use super::super::access::{TailnetAccess, tailnet_access};
use super::super::agent_conditions::{NodeList, nodes_unobservable};
use super::super::agent_gather::{AgentObserved, gather_agent};
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::identity::AuthSecret;
use super::super::status::Problem;

/// What one reconcile of an egress observed.
#[derive(Clone)]
pub struct EgressObservation {
    /// The Tailnet and its Headscale client, or why `TailnetReady` is False. When this is an
    /// error, nothing below was read.
    pub access: Result<TailnetAccess, Problem>,
    /// Services in the operator namespace named like a target but held by someone else:
    /// target name → holder ("TailnetEgress other" or "no controller (created by hand)").
    pub foreign_services: BTreeMap<String, String>,
    /// This egress's own Services (watch cache or GET), by name, including those of removed
    /// targets.
    pub own_services: BTreeMap<String, Service>,
    /// Headscale's node list (the agent's node, and the routes of approver nodes).
    pub nodes: NodeList,
    pub auth_secret: AuthSecret,
    pub deployment: Option<Deployment>,
    /// The agent's `/status` (probe results); `None` when it could not be read.
    pub report: Option<StatusReport>,
}

pub async fn gather(
    ctx: &Context,
    egress: &TailnetEgress,
) -> Result<EgressObservation, ReconcileError> {
    let namespace = egress.namespace().unwrap_or_default();
    let access = tailnet_access(ctx, &egress.spec.tailnet_ref.name).await;
    let Ok(tailnet_access) = &access else {
        return Ok(EgressObservation {
            access,
            foreign_services: BTreeMap::new(),
            own_services: BTreeMap::new(),
            nodes: Err(nodes_unobservable()),
            auth_secret: AuthSecret::Absent,
            deployment: None,
            report: None,
        });
    };
    let (own_services, foreign_services) = services(ctx, egress, &namespace).await?;
    let owner = Owner::from_meta(
        AgentKind::Egress,
        &egress.metadata,
        &tailnet_access.tailnet.name_any(),
    )?;
    let AgentObserved {
        nodes,
        auth_secret,
        deployment,
        report,
    } = gather_agent(ctx, tailnet_access, &owner).await?;
    Ok(EgressObservation {
        access,
        foreign_services,
        own_services,
        nodes,
        auth_secret,
        deployment,
        report,
    })
}

/// This egress's Services and the target names whose Service belongs to someone else.
async fn services(
    ctx: &Context,
    egress: &TailnetEgress,
    namespace: &str,
) -> Result<(BTreeMap<String, Service>, BTreeMap<String, String>), ReconcileError> {
    let uid = egress.uid().unwrap_or_default();
    let short_name = tailnet_api::naming::shorten(&egress.name_any(), 63);
    // Ours carry the agent labels, so the watch cache has them (also those of removed
    // targets, which the act step deletes).
    let mut own: BTreeMap<String, Service> = ctx
        .caches
        .services
        .state()
        .iter()
        .filter(|svc| svc.namespace().as_deref() == Some(namespace))
        .filter(|svc| {
            svc.labels().get(labels::OWNER_KIND).map(String::as_str) == Some("TailnetEgress")
                && svc.labels().get(labels::OWNER_NAME) == Some(&short_name)
        })
        .filter(|svc| svc.owner_references().iter().any(|o| o.uid == uid))
        .map(|svc| (svc.name_any(), (**svc).clone()))
        .collect();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let mut foreign = BTreeMap::new();
    for target in &egress.spec.targets {
        if own.contains_key(&target.name) {
            continue;
        }
        // A new name, or a Service of someone else (which carries no agent labels): read it.
        let Some(existing) = api
            .get_opt(&target.name)
            .await
            .map_err(ReconcileError::kube("get Service"))?
        else {
            continue;
        };
        let controller = existing
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
            .cloned();
        if controller.as_ref().map(|o| o.uid.as_str()) == Some(uid.as_str()) {
            own.insert(target.name.clone(), existing);
        } else {
            let holder = controller
                .map(|o| format!("{} {}", o.kind, o.name))
                .unwrap_or_else(|| "no controller (created by hand)".to_string());
            foreign.insert(target.name.clone(), holder);
        }
    }
    Ok((own, foreign))
}
