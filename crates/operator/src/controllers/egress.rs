//! The TailnetEgress controller: one agent per egress (tagged node, Deployment, Services,
//! NetworkPolicy), its pre-auth key, and a status that names the missing precondition.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tailnet_api::conditions::{self, Status, reasons, types};
use tailnet_api::egress::{EgressTargetStatus, TailnetEgressStatus};
use tailnet_api::naming::{AgentKind, egress_tag, labels};
use tailnet_api::validate::{self, TargetAddress};
use tailnet_api::{Tailnet, TailnetEgress};
use tailnet_headscale::Node;
use tailnet_render::images::Images;
use tailnet_render::meta::Owner;
use tailnet_render::{RenderContext, egress as render_egress};

use super::agent;
use super::context::Context;
use super::{ReconcileError, Watched, apply_cached};

/// Finalizer that removes the agent's Headscale node and keys before the object goes.
pub const FINALIZER: &str = "tailnet-operator.dev/cleanup";
const CONTROLLER: &str = "egress";

fn key(e: &TailnetEgress) -> String {
    format!(
        "egress/{}/{}",
        e.namespace().unwrap_or_default(),
        e.name_any()
    )
}

pub async fn reconcile(
    egress: Arc<TailnetEgress>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    super::instrumented(&ctx, CONTROLLER, &key(&egress), run(egress.clone(), &ctx)).await
}

pub fn error_policy(
    egress: Arc<TailnetEgress>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    super::backoff_on_error(&ctx, CONTROLLER, &key(&egress), error)
}

async fn run(egress: Arc<TailnetEgress>, ctx: &Context) -> Result<Action, ReconcileError> {
    let namespace = egress.namespace().unwrap_or_default();
    let api: Api<TailnetEgress> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Err(e) = validate::egress_namespace(&namespace, &ctx.config.operator_namespace) {
        // Not honoured here: no finalizer, no objects, just say so.
        let mut status = egress.status.clone().unwrap_or_default();
        let previous = status.clone();
        let now = Time(Timestamp::now());
        conditions::upsert(
            &mut status.conditions,
            conditions::condition(
                types::READY,
                Status::False,
                reasons::WRONG_NAMESPACE,
                e.message,
                egress.metadata.generation,
            ),
            &now,
        );
        status.observed_generation = egress.metadata.generation;
        if status != previous {
            agent::patch_status(&api, &egress.name_any(), "TailnetEgress", &status).await?;
        }
        return Ok(Action::await_change());
    }
    finalizer(&api, FINALIZER, egress, |event| async move {
        match event {
            finalizer::Event::Apply(e) => apply_egress(&e, ctx).await,
            finalizer::Event::Cleanup(e) => cleanup(&e, ctx).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

/// Per IP target: whether an approver node advertises a covering route and whether it is
/// approved. Returns (route, state, message).
fn route_state(
    address: &IpAddr,
    approvers: &[String],
    nodes: &[Node],
) -> (Option<String>, &'static str, String) {
    let mut advertised = None;
    for node in nodes
        .iter()
        .filter(|n| n.tags.iter().any(|t| approvers.contains(t)))
    {
        for route in node
            .available_routes
            .iter()
            .filter_map(|r| r.parse::<IpNet>().ok())
        {
            if route.prefix_len() == 0 || !route.contains(address) {
                continue;
            }
            let approved = node
                .approved_routes
                .iter()
                .any(|a| a.parse::<IpNet>().ok() == Some(route));
            if approved {
                return (
                    Some(route.to_string()),
                    reasons::READY,
                    format!("{route} via {} (approved)", node.given_name),
                );
            }
            advertised = Some((route, node.given_name.clone()));
        }
    }
    match advertised {
        Some((route, node)) => (
            Some(route.to_string()),
            reasons::ROUTE_NOT_APPROVED,
            format!(
                "{route} is advertised by {node} but not approved; set the Tailnet to Apply (the operator approves it) or approve it in Headscale"
            ),
        ),
        None => (
            None,
            reasons::ROUTE_NOT_ADVERTISED,
            format!(
                "no node tagged {} advertises a route covering {address}; configure the subnet router to advertise it",
                approvers.join("/")
            ),
        ),
    }
}

async fn apply_egress(egress: &TailnetEgress, ctx: &Context) -> Result<Action, ReconcileError> {
    let namespace = egress.namespace().unwrap_or_default();
    let name = egress.name_any();
    let api: Api<TailnetEgress> = Api::namespaced(ctx.client.clone(), &namespace);
    let previous = egress.status.clone().unwrap_or_default();
    let mut c = agent::Conditions {
        list: previous.conditions.clone(),
        generation: egress.metadata.generation,
        now: Time(Timestamp::now()),
    };
    let mut status = TailnetEgressStatus {
        observed_generation: egress.metadata.generation,
        ..previous.clone()
    };
    let poll = Action::requeue(ctx.config.headscale_poll);
    let finish = |mut status: TailnetEgressStatus, c: agent::Conditions, required: &[&str]| {
        status.conditions = c.finish(required);
        status
    };
    const REQUIRED: [&str; 6] = [
        types::TAILNET_READY,
        types::SERVICES_READY,
        types::AGENT_READY,
        types::NODE_ONLINE,
        types::POLICY_EFFECTIVE,
        types::ROUTES_READY,
    ];

    // Invalid spec: keep what runs (last good config), say what to fix.
    let errors = validate::egress(&egress.spec);
    if !errors.is_empty() {
        c.set(
            types::SPEC_VALID,
            Status::False,
            reasons::INVALID_SPEC,
            format!(
                "{}; the last valid configuration stays applied",
                validate::summarize(&errors)
            ),
        );
        let status = finish(status, c, &[types::SPEC_VALID]);
        return agent::write_status_if_changed(
            &api,
            &egress.name_any(),
            "TailnetEgress",
            &previous,
            status,
            |s| &mut s.conditions,
        )
        .await
        .map(|_| poll);
    }
    c.list.retain(|x| x.type_ != types::SPEC_VALID);

    // The Tailnet and Headscale.
    let access = match agent::tailnet_access(ctx, &egress.spec.tailnet_ref.name).await {
        Ok(access) => access,
        Err((reason, message)) => {
            c.set(types::TAILNET_READY, Status::False, &reason, message);
            let required =
                agent::required_with_observed(&c, &REQUIRED, &[types::TARGETS_REACHABLE]);
            let status = finish(status, c, &required);
            return agent::write_status_if_changed(
                &api,
                &egress.name_any(),
                "TailnetEgress",
                &previous,
                status,
                |s| &mut s.conditions,
            )
            .await
            .map(|_| poll);
        }
    };
    let tailnet: &Tailnet = &access.tailnet;
    let tag = egress_tag(&tailnet.spec.policy.tag_prefix, &name);
    status.tag = Some(tag.clone());
    match &access.headscale {
        Ok(_) => c.set(
            types::TAILNET_READY,
            Status::True,
            reasons::READY,
            format!("Tailnet {} at {}", tailnet.name_any(), tailnet.spec.server),
        ),
        Err((reason, message)) => c.set(
            types::TAILNET_READY,
            Status::False,
            reason,
            format!("Tailnet {}: {message}", tailnet.name_any()),
        ),
    }

    // Service names: a target whose Service belongs to someone else is skipped.
    let uid = egress.uid().unwrap_or_default();
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut conflicts = BTreeMap::new();
    for target in &egress.spec.targets {
        // Our own Services are in the watch cache; anything else (a new name, or a Service
        // of someone else, which carries no agent labels) is read.
        let cached = ctx
            .caches
            .services
            .get(&ObjectRef::new(&target.name).within(&namespace));
        if cached
            .as_ref()
            .is_some_and(|s| s.owner_references().iter().any(|o| o.uid == uid))
        {
            continue;
        }
        if let Some(existing) = services
            .get_opt(&target.name)
            .await
            .map_err(ReconcileError::kube("get Service"))?
        {
            let owner = existing
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .cloned();
            if owner.as_ref().map(|o| o.uid.as_str()) != Some(uid.as_str()) {
                let holder = owner
                    .map(|o| format!("{} {}", o.kind, o.name))
                    .unwrap_or_else(|| "no controller (created by hand)".to_string());
                conflicts.insert(target.name.clone(), holder);
            }
        }
    }

    // Render and apply the agent.
    let previous_ports: BTreeMap<String, u16> = previous
        .targets
        .iter()
        .filter_map(|t| Some((t.name.clone(), u16::try_from(t.agent_port).ok()?)))
        .collect();
    let render_ctx = RenderContext {
        operator_namespace: &ctx.config.operator_namespace,
        tailnet_name: &tailnet.name_any(),
        tailnet: &tailnet.spec,
        images: Images::resolve(&ctx.config.images, tailnet.spec.agent.as_ref()),
        cluster_domain: &ctx.config.cluster_domain,
    };
    let objects = render_egress::render(egress, &render_ctx, &previous_ports)?;
    agent::apply_basics(
        ctx,
        &namespace,
        agent::AgentBasics {
            service_account: &objects.service_account,
            role: &objects.role,
            role_binding: &objects.role_binding,
            state_secret: &objects.state_secret,
            config_map: &objects.config_map,
            network_policy: &objects.network_policy,
        },
    )
    .await?;
    let mut applied_services = BTreeMap::new();
    for service in &objects.services {
        let service_name = service.name_any();
        if conflicts.contains_key(&service_name) {
            continue;
        }
        let applied = apply_cached(
            ctx,
            &services,
            &namespace,
            service,
            Watched::In(&ctx.caches.services),
        )
        .await?;
        let applied = match applied {
            Some(live) => live,
            None => services
                .get(&service_name)
                .await
                .map_err(ReconcileError::kube("get Service"))?,
        };
        applied_services.insert(service_name, applied);
    }
    // Services of removed targets (ours carry the agent labels, so the watch cache has them).
    let short_name = tailnet_api::naming::shorten(&name, 63);
    let removed: Vec<String> = ctx
        .caches
        .services
        .state()
        .iter()
        .filter(|svc| svc.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|svc| {
            svc.labels().get(labels::OWNER_KIND).map(String::as_str) == Some("TailnetEgress")
                && svc.labels().get(labels::OWNER_NAME) == Some(&short_name)
        })
        .filter(|svc| svc.owner_references().iter().any(|o| o.uid == uid))
        .map(|svc| svc.name_any())
        .filter(|n| !applied_services.contains_key(n) && !conflicts.contains_key(n))
        .collect();
    for service_name in removed {
        match services
            .delete(&service_name, &DeleteParams::default())
            .await
        {
            // The cache can still show a Service that is already gone.
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(ReconcileError::kube("delete Service")(e)),
        }
    }
    // Node and key before the Deployment: a pod started before its auth Secret exists finds
    // no key (TS_AUTHKEY is optional, the Secret goes once the node exists) and waits for an
    // interactive login for a minute (fault e2e test: leader killed mid-apply).
    let owner = Owner::from_meta(AgentKind::Egress, &egress.metadata, &tailnet.name_any())?;
    let observed = agent::observe_node(ctx, egress, &access, &owner, &tag, true, &mut c).await?;
    if let Some(n) = &observed.node {
        status.node_id = Some(n.id.to_string());
        status.tailnet_ips = n.ip_addresses.clone();
    }
    let nodes = observed.nodes;
    let deployment = agent::apply_deployment(ctx, &namespace, &objects.deployment).await?;

    if conflicts.is_empty() {
        c.set(
            types::SERVICES_READY,
            Status::True,
            reasons::READY,
            format!("{} Services", applied_services.len()),
        );
    } else {
        let list: Vec<String> = conflicts
            .iter()
            .map(|(s, holder)| format!("Service {namespace}/{s} belongs to {holder}"))
            .collect();
        c.set(
            types::SERVICES_READY,
            Status::False,
            reasons::SERVICE_NAME_CONFLICT,
            format!(
                "{}; those targets are skipped: rename them or remove the other Service",
                list.join("; ")
            ),
        );
    }
    let (agent_ready, agent_message) = agent::deployment_state(Some(&deployment));
    c.set(
        types::AGENT_READY,
        Status::from_bool(agent_ready),
        if agent_ready {
            reasons::READY
        } else {
            reasons::AGENT_NOT_READY
        },
        agent_message,
    );

    // Routes per IP target; DNS-name targets must be granted by the base.
    let approvers = &tailnet.spec.policy.route_approvers;
    let mut route_problems = Vec::new();
    let mut dns_targets = Vec::new();
    let mut target_status = Vec::new();
    for target in &egress.spec.targets {
        let agent_port = objects
            .ports
            .get(&target.name)
            .copied()
            .map(i32::from)
            .unwrap_or_default();
        let service = applied_services.get(&target.name);
        let mut entry = EgressTargetStatus {
            name: target.name.clone(),
            service: service.map(|s| s.name_any()),
            cluster_ip: service.and_then(|s| s.spec.as_ref()?.cluster_ip.clone()),
            port: target.port,
            agent_port,
            ..EgressTargetStatus::default()
        };
        if let Some(holder) = conflicts.get(&target.name) {
            entry.state = Some(reasons::SERVICE_NAME_CONFLICT.to_string());
            entry.message = Some(format!("Service belongs to {holder}"));
        } else {
            match TargetAddress::parse("", &target.address) {
                Ok(TargetAddress::Ip(ip)) => {
                    let (route, state, message) = route_state(&ip, approvers, &nodes);
                    if state != reasons::READY {
                        route_problems.push((state, format!("{}: {message}", target.name)));
                    }
                    entry.route = route;
                    entry.state = Some(state.to_string());
                    entry.message = Some(message);
                }
                _ => {
                    dns_targets.push(target.name.clone());
                    entry.state = Some(reasons::NOT_APPLICABLE.to_string());
                    entry.message = Some("DNS-name target: no route or grant is generated; grant it in the base policy".to_string());
                }
            }
        }
        target_status.push(entry);
    }
    status.targets = target_status;
    match route_problems.first() {
        Some((reason, _)) if access.headscale.is_ok() => {
            c.set(
                types::ROUTES_READY,
                Status::False,
                reason,
                route_problems
                    .iter()
                    .map(|(_, m)| m.clone())
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }
        Some(_) => c.set(
            types::ROUTES_READY,
            Status::Unknown,
            reasons::HEADSCALE_UNREACHABLE,
            "cannot observe routes (see TailnetReady)",
        ),
        None if !dns_targets.is_empty() && dns_targets.len() == egress.spec.targets.len() => {
            c.set(types::ROUTES_READY, Status::True, reasons::NOT_APPLICABLE, format!("DNS-name targets ({}) need no route from the operator; grant them in the base policy", dns_targets.join(", ")));
        }
        None => c.set(
            types::ROUTES_READY,
            Status::True,
            reasons::READY,
            "every IP target is covered by an approved route",
        ),
    }

    // Grants: effective only when live in Headscale.
    let key = format!("TailnetEgress/{namespace}/{name}");
    agent::policy_effective(
        &mut c,
        tailnet,
        &key,
        "the grants are live in Headscale",
        None,
    );
    // Reachability as the agent observes it (a TCP connect through the tailnet per target).
    let report = agent::agent_status(ctx, &owner).await;
    let probes = agent::reachability(
        &mut c,
        types::TARGETS_REACHABLE,
        report.as_ref().map(|r| r.targets.as_slice()),
    );
    for entry in &mut status.targets {
        if entry.state.as_deref() != Some(reasons::READY) {
            continue;
        }
        if let Some(probe) = probes.get(&entry.name)
            && probe.state != tailnet_api::agent_status::ProbeState::Reachable
            && probe.state != tailnet_api::agent_status::ProbeState::Unknown
        {
            entry.state = Some(probe.state.label().to_string());
            entry.message = Some(
                format!("{} {}", probe.state.label(), probe.message)
                    .trim()
                    .to_string(),
            );
        }
    }

    let ready_targets = status
        .targets
        .iter()
        .filter(|t| {
            matches!(
                t.state.as_deref(),
                Some(reasons::READY) | Some(reasons::NOT_APPLICABLE)
            )
        })
        .count();
    status.summary = Some(format!("{ready_targets}/{} targets", status.targets.len()));
    let required = agent::required_with_observed(&c, &REQUIRED, &[types::TARGETS_REACHABLE]);
    let status = finish(status, c, &required);
    agent::publish_ready_transition(ctx, egress, &previous.conditions, &status.conditions).await;
    agent::write_status_if_changed(
        &api,
        &egress.name_any(),
        "TailnetEgress",
        &previous,
        status,
        |s| &mut s.conditions,
    )
    .await?;
    Ok(poll)
}

async fn cleanup(egress: &TailnetEgress, ctx: &Context) -> Result<Action, ReconcileError> {
    let name = egress.name_any();
    agent::cleanup(
        ctx,
        egress,
        AgentKind::Egress,
        &egress.spec.tailnet_ref.name,
        |t| egress_tag(&t.spec.policy.tag_prefix, &name),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(approved: &[&str]) -> Node {
        Node {
            id: 1,
            given_name: "site-router".into(),
            tags: vec!["tag:router".into()],
            available_routes: vec!["192.0.2.0/24".into(), "0.0.0.0/0".into()],
            approved_routes: approved.iter().map(|s| s.to_string()).collect(),
            ..Node::default()
        }
    }

    #[test]
    fn route_states() {
        let ip: IpAddr = "192.0.2.10".parse().expect("ip");
        let approvers = vec!["tag:router".to_string()];
        assert_eq!(
            route_state(&ip, &approvers, &[router(&["192.0.2.0/24"])]).1,
            reasons::READY
        );
        assert_eq!(
            route_state(&ip, &approvers, &[router(&[])]).1,
            reasons::ROUTE_NOT_APPROVED
        );
        let other: IpAddr = "198.51.100.20".parse().expect("ip");
        let (route, state, message) = route_state(&other, &approvers, &[router(&["192.0.2.0/24"])]);
        assert_eq!((route, state), (None, reasons::ROUTE_NOT_ADVERTISED));
        assert!(message.contains("198.51.100.20"));
        // A non-approver advertising the route does not count; neither does an exit route.
        let mut stranger = router(&["192.0.2.0/24"]);
        stranger.tags = vec!["tag:laptop".into()];
        assert_eq!(
            route_state(&ip, &approvers, &[stranger]).1,
            reasons::ROUTE_NOT_ADVERTISED
        );
    }
}
