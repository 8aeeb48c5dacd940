//! The egress's decisions (pure): its intent, the target Services, each target's class,
//! route and grant, and the conditions that are the egress's own. The Tailnet, the identity
//! and `Ready` are decided by `agent/decide.rs`, which calls [`Decide::plan`] and
//! [`Decide::report`] around the identity.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use tailnet_api::agent_status::{ProbeState, ProbeView, StatusReport};
use tailnet_api::conditions::{reasons, types};
use tailnet_api::egress::{EgressTargetStatus, TailnetEgressStatus, TargetKind, TargetNode};
use tailnet_api::naming::{AgentKind, AgentNames, egress_tag};
use tailnet_api::validate::{self, FieldError, TargetAddress, ValidEgress, ValidTarget};
use tailnet_api::{Tailnet, TailnetEgress};
use tailnet_headscale::Node;
use tailnet_render::egress::EgressObjects;
use tailnet_render::targets::{self, NodeProblem, NodeView, TargetClass};
use tailnet_render::{RenderError, desired};

use super::super::agent::conditions as shared;
use super::super::agent::decide::{Admission, AgentObjects, AgentStatus, Decide, Input, Planned};
use super::super::agent::identity::Identity;
use super::super::agent::observation::{AgentObserved, NodeList, nodes_unobservable};
use super::super::config::OperatorConfig;
use super::super::status::{ConditionSet, Problem};
use super::node_views::node_views;
use super::observation::{EgressObserved, GrantCheck};

/// Conditions that must hold for `Ready`, in the order of their dependencies.
pub const REQUIRED: [&str; 6] = [
    types::TAILNET_READY,
    types::SERVICES_READY,
    types::AGENT_READY,
    types::NODE_ONLINE,
    types::POLICY_EFFECTIVE,
    types::ROUTES_READY,
];
/// Conditions that count for `Ready` once they have been observed.
pub const OBSERVED_IF_KNOWN: [&str; 1] = [types::TARGETS_REACHABLE];

/// The TailnetEgress kind.
#[derive(Debug)]
pub struct Egress;

/// What the egress decided beyond its agent.
#[derive(Clone, Debug)]
pub struct EgressPlan {
    /// The target Services to apply (those whose name is held by someone else are left out).
    pub services: Vec<Service>,
    /// Own Services of targets that were removed.
    pub delete_services: Vec<String>,
    /// The agent port of each target (for the status).
    ports: BTreeMap<String, u16>,
}

impl AgentStatus for TailnetEgressStatus {
    fn set_observed_generation(&mut self, generation: Option<i64>) {
        self.observed_generation = generation;
    }

    fn record_node(&mut self, node: &Node) {
        self.node_id = Some(node.id.to_string());
        self.tailnet_ips = node.ip_addresses.clone();
    }
}

impl Decide for Egress {
    type Object = TailnetEgress;
    type Status = TailnetEgressStatus;
    type Intent = ValidEgress;
    type Observed = EgressObserved;
    type Objects = EgressObjects;
    type Plan = EgressPlan;
    type Acted = ();

    const AGENT: AgentKind = AgentKind::Egress;
    const REQUIRED: &'static [&'static str] = &REQUIRED;
    const OBSERVED_IF_KNOWN: &'static [&'static str] = &OBSERVED_IF_KNOWN;

    fn status(egress: &TailnetEgress) -> Option<&TailnetEgressStatus> {
        egress.status.as_ref()
    }

    fn tailnet_name(egress: &TailnetEgress) -> Option<&str> {
        Some(&egress.spec.tailnet_ref.name)
    }

    fn admit(
        egress: &TailnetEgress,
        config: &OperatorConfig,
        now: Timestamp,
    ) -> Admission<TailnetEgressStatus> {
        match wrong_namespace(egress, &config.operator_namespace, now) {
            Some(status) => Admission::Refuse(status),
            None => Admission::Handle,
        }
    }

    fn intent(egress: &TailnetEgress) -> Result<ValidEgress, Vec<FieldError>> {
        validate::valid_egress(&egress.spec)
    }

    /// An egress's node is named after its objects.
    fn hostnames(names: &AgentNames, _tag: &str) -> Vec<String> {
        vec![names.base.clone()]
    }

    fn plan(
        input: &Input<'_, Egress>,
        c: &mut ConditionSet,
        status: &mut TailnetEgressStatus,
    ) -> Result<Option<Planned<Egress>>, RenderError> {
        plan(input, c, status).map(Some)
    }

    fn report(
        input: &Input<'_, Egress>,
        planned: &Planned<Egress>,
        identity: &Identity,
        c: &mut ConditionSet,
        status: &mut TailnetEgressStatus,
    ) {
        report(input, &planned.plan, identity, c, status);
    }

    fn agent_objects(objects: &EgressObjects) -> AgentObjects<'_> {
        let EgressObjects {
            service_account,
            role,
            role_binding,
            state_secret,
            config_map,
            deployment,
            network_policy,
            login,
            services: _,
            config: _,
            ports: _,
        } = objects;
        AgentObjects {
            service_account,
            role,
            role_binding,
            state_secret,
            config_map,
            network_policy,
            deployment,
            login,
        }
    }

    fn cleanup_tag(
        tailnet: &Tailnet,
        egress: &TailnetEgress,
        _all: &[Arc<TailnetEgress>],
    ) -> Option<String> {
        Some(egress_tag(
            &tailnet.spec.policy.tag_prefix,
            &egress.name_any(),
        ))
    }

    fn amend(
        _egress: &TailnetEgress,
        status: TailnetEgressStatus,
        _acted: &(),
        _now: Timestamp,
    ) -> TailnetEgressStatus {
        status
    }
}

/// The status written for an egress outside the operator namespace (not honoured there: no
/// finalizer, no objects). `None` when it is in the operator namespace.
pub fn wrong_namespace(
    egress: &TailnetEgress,
    operator_namespace: &str,
    now: Timestamp,
) -> Option<TailnetEgressStatus> {
    let namespace = egress.namespace().unwrap_or_default();
    let error = validate::egress_namespace(&namespace, operator_namespace).err()?;
    let previous = egress.status.clone().unwrap_or_default();
    let mut c = ConditionSet::new(&previous.conditions, egress.metadata.generation, now);
    c.fail(
        types::READY,
        Problem::new(reasons::WRONG_NAMESPACE, error.message),
    );
    Some(TailnetEgressStatus {
        observed_generation: egress.metadata.generation,
        conditions: c.into_list(),
        ..previous
    })
}

/// Before the identity: the tag, the agent's objects and the target Services (those whose
/// name someone else holds are skipped: `ServicesReady` says so).
fn plan(
    input: &Input<'_, Egress>,
    c: &mut ConditionSet,
    status: &mut TailnetEgressStatus,
) -> Result<Planned<Egress>, RenderError> {
    let egress = input.object;
    let namespace = egress.namespace().unwrap_or_default();
    let tag = egress_tag(&input.tailnet.spec.policy.tag_prefix, &egress.name_any());
    status.tag = Some(tag.clone());
    // Agent ports stay where they were (the agent listens on them).
    let previous_ports: BTreeMap<String, u16> = input
        .previous
        .targets
        .iter()
        .filter_map(|t| Some((t.name.clone(), u16::try_from(t.agent_port).ok()?)))
        .collect();
    let render_ctx = input.render_context();
    let objects = desired::egress(&egress.metadata, input.intent, &render_ctx, &previous_ports)?;
    let observed = input.kind();
    let conflicts = &observed.foreign_services;
    let services: Vec<Service> = objects
        .services
        .iter()
        .filter(|s| !conflicts.contains_key(&s.name_any()))
        .cloned()
        .collect();
    let delete_services: Vec<String> = observed
        .own_services
        .keys()
        .filter(|n| !egress.spec.targets.iter().any(|t| &t.name == *n))
        .cloned()
        .collect();
    services_ready(c, &namespace, services.len(), conflicts);
    let ports = objects.ports.clone();
    Ok(Planned {
        tag,
        objects: Some(objects),
        plan: EgressPlan {
            services,
            delete_services,
            ports,
        },
    })
}

/// After the identity: each target's class from Headscale's node list, routes per subnet
/// target, node targets following their node, names granted by the base; then the agent's
/// probes.
fn report(
    input: &Input<'_, Egress>,
    plan: &EgressPlan,
    identity: &Identity,
    c: &mut ConditionSet,
    status: &mut TailnetEgressStatus,
) {
    let (egress, tailnet, agent) = (input.object, input.tailnet, input.agent());
    let views = node_views(agent.listed_nodes(), input.now);
    let domain = tailnet
        .spec
        .dns
        .as_ref()
        .and_then(|d| d.magic_dns_domain.as_deref());
    let classes: Vec<TargetClass> = input
        .intent
        .targets
        .iter()
        .map(|t| targets::classify(&t.address, &views, domain))
        .collect();
    let observed = Targets {
        agent,
        kind: input.kind(),
        ports: &plan.ports,
        approvers: &tailnet.spec.policy.route_approvers,
        tag: &identity.tag,
    };
    status.targets = target_status(input.intent, &classes, &observed);
    routes_ready(c, &status.targets, &agent.nodes, egress.spec.targets.len());
    // Grants: effective only when live in Headscale; a MagicDNS target needs its grant in
    // the base, and Headscale's policy check says whether it is there.
    shared::policy_effective(
        c,
        tailnet,
        &format!(
            "TailnetEgress/{}/{}",
            egress.namespace().unwrap_or_default(),
            egress.name_any()
        ),
        "the grants are live in Headscale",
        None,
    );
    grants_for_names(c, &status.targets, &input.kind().grants);
    // Reachability as the agent observes it (a TCP connect through the tailnet per target),
    // overruled by what Headscale says of a target's node (offline, expired, unknown).
    let probes = target_reachability(c, agent.report.as_ref());
    target_nodes(c, &status.targets, &agent.nodes);
    overlay_probes(status, &probes);
}

/// What the per-target status is decided from.
struct Targets<'a> {
    agent: &'a AgentObserved,
    kind: &'a EgressObserved,
    ports: &'a BTreeMap<String, u16>,
    approvers: &'a [String],
    tag: &'a str,
}

/// A target whose route is fine but whose probe fails shows the probe's state; the summary
/// counts the targets that work (or need nothing from the operator).
fn overlay_probes(status: &mut TailnetEgressStatus, probes: &BTreeMap<String, ProbeView>) {
    for entry in &mut status.targets {
        // Targets that are fine as far as the operator sees (route approved, node online,
        // name granted) show what the probe found.
        if !matches!(
            entry.state.as_deref(),
            Some(reasons::READY) | Some(reasons::NOT_APPLICABLE)
        ) {
            continue;
        }
        if let Some(probe) = probes.get(&entry.name)
            && !matches!(probe.state, ProbeState::Reachable | ProbeState::Unknown)
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
    let mut kinds: BTreeMap<TargetKind, usize> = BTreeMap::new();
    for kind in status.targets.iter().filter_map(|t| t.kind) {
        *kinds.entry(kind).or_default() += 1;
    }
    status.kinds = (!kinds.is_empty()).then(|| {
        kinds
            .iter()
            .map(|(k, n)| format!("{n} {}", k.label()))
            .collect::<Vec<_>>()
            .join(", ")
    });
}

fn services_ready(
    c: &mut ConditionSet,
    namespace: &str,
    applied: usize,
    conflicts: &BTreeMap<String, String>,
) {
    if conflicts.is_empty() {
        c.ok(
            types::SERVICES_READY,
            reasons::READY,
            format!("{applied} Services"),
        );
        return;
    }
    let list: Vec<String> = conflicts
        .iter()
        .map(|(s, holder)| format!("Service {namespace}/{s} belongs to {holder}"))
        .collect();
    c.fail(
        types::SERVICES_READY,
        Problem::new(
            reasons::SERVICE_NAME_CONFLICT,
            format!(
                "{}; those targets are skipped: rename them or remove the other Service",
                list.join("; ")
            ),
        ),
    );
}

fn target_node(node: &NodeView) -> TargetNode {
    TargetNode {
        name: node.name.clone(),
        id: node.id.to_string(),
        online: node.online,
        ips: node.ips.iter().map(IpAddr::to_string).collect(),
        last_seen: node.last_seen.clone(),
        expired_at: node.expired_at.clone(),
    }
}

/// The state of a target on a node (address or MagicDNS name): `None` when the node serves.
fn node_state(class: &TargetClass, address: &str) -> Option<(&'static str, String)> {
    match class {
        TargetClass::UnknownNodeAddress => Some((
            reasons::TARGET_NODE_UNKNOWN,
            format!(
                "{address} is in the tailnet's address range but no Headscale node holds it; check the address (headscale nodes list) or whether the node was removed"
            ),
        )),
        TargetClass::UnknownMagicDnsName => Some((
            reasons::TARGET_NODE_UNKNOWN,
            format!(
                "{address} is under the MagicDNS domain but no Headscale node has that name; check the name (headscale nodes list: GIVEN NAME)"
            ),
        )),
        _ => {
            let (problem, message) = targets::node_problem(class.node()?)?;
            let reason = match problem {
                NodeProblem::Offline => reasons::TARGET_NODE_OFFLINE,
                NodeProblem::Expired => reasons::TARGET_NODE_EXPIRED,
            };
            Some((reason, message))
        }
    }
}

/// Per-target status: its Service, agent port, class, node and route (or why not).
fn target_status(
    valid: &ValidEgress,
    classes: &[TargetClass],
    observed: &Targets,
) -> Vec<EgressTargetStatus> {
    valid
        .targets
        .iter()
        .zip(classes)
        .map(|(target, class)| target_entry(target, class, observed))
        .collect()
}

fn target_entry(
    target: &ValidTarget,
    class: &TargetClass,
    observed: &Targets,
) -> EgressTargetStatus {
    let nodes_known = observed.agent.nodes.is_ok();
    let service = observed.kind.own_services.get(&target.name);
    let mut entry = EgressTargetStatus {
        name: target.name.clone(),
        service: service.map(|s| s.name_any()),
        cluster_ip: service.and_then(|s| s.spec.as_ref()?.cluster_ip.clone()),
        port: i32::from(target.port),
        agent_port: observed
            .ports
            .get(&target.name)
            .copied()
            .map(i32::from)
            .unwrap_or_default(),
        // Without the node list an IP is only known to be an IP.
        kind: nodes_known.then(|| class.kind()),
        node: class.node().map(target_node),
        ..EgressTargetStatus::default()
    };
    if let Some(holder) = observed.kind.foreign_services.get(&target.name) {
        entry.state = Some(reasons::SERVICE_NAME_CONFLICT.to_string());
        entry.message = Some(format!("Service belongs to {holder}"));
        return entry;
    }
    let address = target.address.to_string();
    if nodes_known && let Some((reason, message)) = node_state(class, &address) {
        entry.state = Some(reason.to_string());
        entry.message = Some(message);
        return entry;
    }
    match (class, &target.address) {
        (TargetClass::TailnetNode(node), _) => {
            entry.state = Some(reasons::NOT_APPLICABLE.to_string());
            entry.message = Some(format!(
                "tailnet node {} ({}): the grant is generated, no route is involved",
                node.name,
                node.ips
                    .iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        (TargetClass::MagicDns(node), _) => {
            let (state, message) = magic_dns_state(&mut entry, target, node, observed);
            entry.state = Some(state.to_string());
            entry.message = Some(message);
        }
        (_, TargetAddress::Ip(ip)) => match &observed.agent.nodes {
            Ok(nodes) => {
                let route = route_state(ip, observed.approvers, nodes);
                entry.route = route.route;
                entry.state = Some(route.state.to_string());
                entry.message = Some(route.message);
            }
            // Without the node list no route is known to be missing: an empty list would
            // read as `RouteNotAdvertised` and send the user to a router that is fine.
            Err(problem) => {
                entry.state = Some(problem.reason.to_string());
                entry.message = Some(format!(
                    "whether a route covers {ip} is unknown until Headscale's node list can be read: {}",
                    problem.message
                ));
            }
        },
        (_, TargetAddress::Dns(_)) => {
            entry.state = Some(reasons::NOT_APPLICABLE.to_string());
            entry.message = Some(
                "DNS-name target: no route or grant is generated; grant it in the base policy"
                    .to_string(),
            );
        }
    }
    entry
}

/// A MagicDNS target on a known node: whether the base grants it (the operator generates no
/// grant for names); the missing grant line is recorded in the entry.
fn magic_dns_state(
    entry: &mut EgressTargetStatus,
    target: &ValidTarget,
    node: &NodeView,
    observed: &Targets,
) -> (&'static str, String) {
    let tag = observed.tag;
    let grant = targets::grant_line(tag, node, target.port);
    match observed.kind.grants.get(&target.name) {
        Some(GrantCheck::Missing) => {
            entry.missing_grant = Some(grant.clone());
            (
                reasons::GRANT_MISSING,
                format!(
                    "MagicDNS name of node {}: the live policy does not grant {tag} tcp:{} on it (MagicDNS cannot resolve a node outside the agent's netmap); add to the base policy's grants: {grant}",
                    node.name, target.port
                ),
            )
        }
        Some(GrantCheck::Granted) => (
            reasons::NOT_APPLICABLE,
            format!(
                "MagicDNS name of node {}: granted by the base policy (no grant or route is generated for names)",
                node.name
            ),
        ),
        Some(GrantCheck::Unknown(why)) => (
            reasons::NOT_APPLICABLE,
            format!(
                "MagicDNS name of node {}: whether the base grants it is unknown ({why}); it needs {grant}",
                node.name
            ),
        ),
        None => (
            reasons::NOT_APPLICABLE,
            format!(
                "MagicDNS name of node {}: no grant is generated for names; the base policy must grant {grant}",
                node.name
            ),
        ),
    }
}

/// `PolicyEffective=False/GrantMissing` when a MagicDNS target's node is not granted by the
/// live policy (only once the generated grants are live: those problems come first).
fn grants_for_names(
    c: &mut ConditionSet,
    targets: &[EgressTargetStatus],
    checks: &BTreeMap<String, GrantCheck>,
) {
    if c.get(types::POLICY_EFFECTIVE)
        .is_some_and(|p| p.status != "True")
    {
        return;
    }
    let missing: Vec<String> = targets
        .iter()
        .filter(|t| checks.get(&t.name) == Some(&GrantCheck::Missing))
        .filter_map(|t| Some(format!("{}: add {}", t.name, t.missing_grant.as_ref()?)))
        .collect();
    if missing.is_empty() {
        return;
    }
    c.fail(
        types::POLICY_EFFECTIVE,
        Problem::new(
            reasons::GRANT_MISSING,
            format!(
                "the generated grants are live, but the base policy does not grant these MagicDNS targets (the operator generates no grant for names): {}",
                missing.join("; ")
            ),
        ),
    );
}

/// `TargetsReachable=False` naming the target nodes Headscale reports unknown, offline or
/// expired: "the NAS is off", not a timeout.
fn target_nodes(c: &mut ConditionSet, targets: &[EgressTargetStatus], nodes: &NodeList) {
    if nodes.is_err() {
        return;
    }
    let node_reasons = [
        reasons::TARGET_NODE_UNKNOWN,
        reasons::TARGET_NODE_OFFLINE,
        reasons::TARGET_NODE_EXPIRED,
    ];
    let problems: Vec<(&'static str, String)> = targets
        .iter()
        .filter_map(|t| {
            let reason = node_reasons
                .into_iter()
                .find(|r| t.state.as_deref() == Some(*r))?;
            Some((
                reason,
                format!("{}: {}", t.name, t.message.clone().unwrap_or_default()),
            ))
        })
        .collect();
    if let Some((reason, _)) = problems.first() {
        c.fail(
            types::TARGETS_REACHABLE,
            Problem::new(
                reason,
                problems
                    .iter()
                    .map(|(_, m)| m.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        );
    }
}

/// `RoutesReady` from the per-target route states.
fn routes_ready(
    c: &mut ConditionSet,
    targets: &[EgressTargetStatus],
    nodes: &NodeList,
    count: usize,
) {
    let route_states = [reasons::ROUTE_NOT_ADVERTISED, reasons::ROUTE_NOT_APPROVED];
    // IP targets whose route is unknown carry the node list's reason (see `target_entry`).
    let unknown_state = nodes.as_ref().err().map(|problem| problem.reason);
    let problems: Vec<(&str, String)> = targets
        .iter()
        .filter_map(|t| {
            let state = route_states
                .into_iter()
                .chain(unknown_state)
                .find(|s| t.state.as_deref() == Some(*s))?;
            Some((
                state,
                format!("{}: {}", t.name, t.message.clone().unwrap_or_default()),
            ))
        })
        .collect();
    // Targets that need no route: names, and addresses of tailnet nodes.
    let no_route: Vec<String> = targets
        .iter()
        .filter(|t| {
            matches!(
                t.kind,
                Some(TargetKind::TailnetNode | TargetKind::MagicDns | TargetKind::DnsName)
            ) || t.state.as_deref() == Some(reasons::NOT_APPLICABLE)
        })
        .map(|t| match (&t.node, t.kind) {
            (Some(node), Some(TargetKind::MagicDns)) => {
                format!("{} (MagicDNS name of {})", t.name, node.name)
            }
            (Some(node), _) => format!("{} (tailnet node {})", t.name, node.name),
            (None, _) => t.name.clone(),
        })
        .collect();
    match problems.first() {
        Some((reason, _)) if nodes.is_ok() => c.fail(
            types::ROUTES_READY,
            Problem::new(
                reason,
                problems
                    .iter()
                    .map(|(_, m)| m.clone())
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        ),
        Some(_) => {
            let problem = nodes.as_ref().err().cloned().unwrap_or_else(nodes_unobservable);
            let message = if problem.reason == reasons::HEADSCALE_UNREACHABLE {
                "cannot observe routes (see TailnetReady)".to_string()
            } else {
                format!("cannot observe routes: {}", problem.message)
            };
            c.unknown(types::ROUTES_READY, Problem::new(problem.reason, message));
        }
        None if !no_route.is_empty() && no_route.len() == count => c.ok(
            types::ROUTES_READY,
            reasons::NOT_APPLICABLE,
            format!(
                "no target needs a route: {} (tailnet nodes are reached directly, DNS names are granted in the base policy)",
                no_route.join(", ")
            ),
        ),
        None if !no_route.is_empty() => c.ok(
            types::ROUTES_READY,
            reasons::READY,
            format!(
                "every subnet target is covered by an approved route; {} need none",
                no_route.join(", ")
            ),
        ),
        None => c.ok(
            types::ROUTES_READY,
            reasons::READY,
            "every IP target is covered by an approved route",
        ),
    }
}

/// Whether an approver node advertises a route covering an IP target, and whether it is
/// approved.
#[derive(Debug, PartialEq, Eq)]
pub struct RouteState {
    pub route: Option<String>,
    pub state: &'static str,
    pub message: String,
}

pub fn route_state(address: &IpAddr, approvers: &[String], nodes: &[Node]) -> RouteState {
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
                return RouteState {
                    route: Some(route.to_string()),
                    state: reasons::READY,
                    message: format!("{route} via {} (approved)", node.given_name),
                };
            }
            advertised = Some((route, node.given_name.clone()));
        }
    }
    match advertised {
        Some((route, node)) => RouteState {
            route: Some(route.to_string()),
            state: reasons::ROUTE_NOT_APPROVED,
            message: format!(
                "{route} is advertised by {node} but not approved; set the Tailnet to Apply (the operator approves it) or approve it in Headscale"
            ),
        },
        None => RouteState {
            route: None,
            state: reasons::ROUTE_NOT_ADVERTISED,
            message: format!(
                "no node tagged {} advertises a route covering {address}; configure the subnet router to advertise it",
                approvers.join("/")
            ),
        },
    }
}

/// `TargetsReachable` from the agent's report. Target probes go through the tailnet: while
/// the agent's tailscaled has not reached `Running` (the pod just started and is logging
/// in), a failing or missing probe is the agent starting, reported as `AgentStarting`
/// (Unknown), never as the probe's `Error`/`Timeout`.
fn target_reachability(
    c: &mut ConditionSet,
    report: Option<&StatusReport>,
) -> BTreeMap<String, ProbeView> {
    let probes = shared::reachability(
        c,
        types::TARGETS_REACHABLE,
        report.map(|r| r.targets.as_slice()),
    );
    if let Some(starting) = report.and_then(|r| agent_starting(&r.tailnet)) {
        let settled = c
            .get(types::TARGETS_REACHABLE)
            .is_some_and(|cond| cond.status == "True");
        if !settled {
            c.unknown(
                types::TARGETS_REACHABLE,
                Problem::new(reasons::AGENT_STARTING, starting),
            );
        }
    }
    probes
}

/// Why the agent counts as still starting (`None`: its tailscaled is up). tailscaled that
/// was `Running` and lost its control connection stays `Running`: that is not a start.
fn agent_starting(tailnet: &tailnet_api::agent_status::TailnetView) -> Option<String> {
    if tailnet.connected || tailnet.backend_state == tailnet_api::agent_status::BACKEND_RUNNING {
        return None;
    }
    let state = if tailnet.backend_state.is_empty() {
        "not answering yet"
    } else {
        tailnet.backend_state.as_str()
    };
    Some(format!(
        "the agent is starting: tailscaled is {state} (targets are probed through the tailnet once it is Running)"
    ))
}
