//! Gather step of the TailnetEgress controller: everything `decide` needs, read once.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::{Api, ResourceExt};
use tailnet_api::TailnetEgress;
use tailnet_api::agent_status::StatusReport;
use tailnet_api::naming::{AgentKind, egress_tag, labels};
use tailnet_api::validate::TargetAddress;
use tailnet_render::meta::Owner;
use tailnet_render::targets::{self, TargetClass};

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
    /// Per MagicDNS target on a known node (by target name): whether the live policy grants
    /// this egress's tag the node's address and port (asked of Headscale's policy check).
    pub grants: BTreeMap<String, GrantCheck>,
}

/// Headscale's answer to "does the live policy let this egress reach that node's port?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrantCheck {
    Granted,
    Missing,
    /// Could not be decided (e.g. the agent's node does not exist yet), and why.
    Unknown(String),
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
            grants: BTreeMap::new(),
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
    let grants = match (&tailnet_access.headscale, &nodes) {
        (Ok(headscale), Ok(nodes)) => {
            grant_checks(ctx, headscale, &tailnet_access.tailnet, egress, nodes).await
        }
        _ => BTreeMap::new(),
    };
    Ok(EgressObservation {
        access,
        foreign_services,
        own_services,
        nodes,
        auth_secret,
        deployment,
        report,
        grants,
    })
}

/// Asks Headscale, for each MagicDNS target on a known node, whether the live policy grants
/// the egress's tag that node's address and port: the live policy with one `tests` entry
/// (`src` = the tag, `accept` = `ip:port`) through `POST /api/v1/policy/check`, which
/// evaluates it exactly as Headscale enforces it, without storing anything.
async fn grant_checks(
    ctx: &Context,
    headscale: &tailnet_headscale::Client,
    tailnet: &tailnet_api::Tailnet,
    egress: &TailnetEgress,
    nodes: &[tailnet_headscale::Node],
) -> BTreeMap<String, GrantCheck> {
    let domain = tailnet
        .spec
        .dns
        .as_ref()
        .and_then(|d| d.magic_dns_domain.as_deref());
    let views = super::node_views::node_views(nodes, jiff::Timestamp::now());
    let checks: Vec<(String, String)> = egress
        .spec
        .targets
        .iter()
        .filter_map(|t| {
            let address = TargetAddress::parse("address", &t.address).ok()?;
            let TargetClass::MagicDns(node) = targets::classify(&address, &views, domain) else {
                return None;
            };
            let ip = node
                .ips
                .iter()
                .find(|ip| ip.is_ipv4())
                .or(node.ips.first())?;
            let port = u16::try_from(t.port).ok()?;
            let dst = match ip {
                std::net::IpAddr::V4(v4) => format!("{v4}:{port}"),
                std::net::IpAddr::V6(v6) => format!("[{v6}]:{port}"),
            };
            Some((t.name.clone(), dst))
        })
        .collect();
    let mut out = BTreeMap::new();
    if checks.is_empty() {
        return out;
    }
    let live = match ctx
        .live_policies
        .get(headscale.server(), || async {
            headscale.get_policy().await.map(|p| vec![p.policy])
        })
        .await
    {
        Ok(policy) => policy.first().cloned().unwrap_or_default(),
        Err(e) => {
            for (name, _) in checks {
                out.insert(
                    name,
                    GrantCheck::Unknown(format!("reading the live policy failed: {e}")),
                );
            }
            return out;
        }
    };
    let tag = egress_tag(&tailnet.spec.policy.tag_prefix, &egress.name_any());
    let digest = tailnet_api::digest::sha256_hex(&live);
    for (name, dst) in checks {
        let key = format!("{}\n{digest}\n{tag}\n{dst}", headscale.server());
        if let Some(granted) = ctx.cached_grant(&key) {
            let check = if granted {
                GrantCheck::Granted
            } else {
                GrantCheck::Missing
            };
            out.insert(name, check);
            continue;
        }
        let check = match tailnet_policy::with_tests(&live, &tag, &dst) {
            Err(e) => GrantCheck::Unknown(format!("the live policy does not parse: {e}")),
            Ok(document) => match headscale.check_policy(&document).await {
                Ok(()) => {
                    ctx.remember_grant(key, true);
                    GrantCheck::Granted
                }
                Err(e) if e.to_string().contains("expected ALLOWED, got DENIED") => {
                    ctx.remember_grant(key, false);
                    GrantCheck::Missing
                }
                Err(e) => {
                    GrantCheck::Unknown(format!("Headscale's policy check of {tag} -> {dst}: {e}"))
                }
            },
        };
        out.insert(name, check);
    }
    out
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
