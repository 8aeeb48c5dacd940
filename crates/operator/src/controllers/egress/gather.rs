//! The egress's own gather step (I/O): its target Services and Headscale's grant checks;
//! what every agent shares is read by the generic gather (`agent/gather.rs`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use kube::{Api, ResourceExt};
use tailnet_api::TailnetEgress;
use tailnet_api::naming::{egress_tag, labels};
use tailnet_api::validate::TargetAddress;
use tailnet_render::targets::{self, TargetClass};

use super::super::agent::kind::GatherInput;
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::observation::{EgressObserved, GrantCheck};

/// The egress's own reads: its target Services (and those held by someone else), and, for
/// MagicDNS targets on known nodes, whether the live policy grants them.
pub async fn gather(
    ctx: &Context,
    egress: &TailnetEgress,
    input: GatherInput<'_>,
) -> Result<EgressObserved, ReconcileError> {
    let namespace = egress.namespace().unwrap_or_default();
    let (own_services, foreign_services) = services(ctx, egress, &namespace).await?;
    let access = input.access;
    let grants = match (&access.headscale, &input.agent.nodes) {
        (Ok(headscale), Ok(nodes)) => {
            grant_checks(ctx, headscale, &access.tailnet, egress, nodes).await
        }
        _ => BTreeMap::new(),
    };
    Ok(EgressObserved {
        foreign_services,
        own_services,
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
