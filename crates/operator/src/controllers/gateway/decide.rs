//! The Gateway's decisions (pure). A Gateway of a class of ours is one agent (one tailnet
//! identity, its tag injective over the Gateways); everything the Gateway API defines —
//! `Accepted`, `Programmed`, `addresses`, the listeners' and the routes' status, and the data
//! plan — comes from `tailnet_render::gateway::decide_gateway`; the plan becomes the agent's
//! listeners (`tailnet_render::gateway::agent`) and objects (`…::objects`). The generic agent
//! decisions (`agent/decide.rs`) add `TailnetReady`, `AgentReady`, `NodeOnline` and `Ready`;
//! while any of those is not True, `Programmed` is False with reason `Pending` naming it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use tailnet_api::Tailnet;
use tailnet_api::conditions::{self, Status, reasons, types};
use tailnet_api::naming::{AgentKind, AgentNames, tag_hostname};
use tailnet_api::validate::FieldError;
use tailnet_gateway_api::gateway::GatewayStatus;
use tailnet_gateway_api::{Gateway, ListenerStatus, RouteParentStatus};
use tailnet_headscale::Node;
use tailnet_render::RenderError;
use tailnet_render::backends::ObjectKey;
use tailnet_render::gateway::agent::agent_listeners;
use tailnet_render::gateway::objects::{self, GatewayInputs, certificate_files};
use tailnet_render::gateway::plan::{GatewayPlan, ListenerServe, RouteId};
use tailnet_render::gateway::routes::references_gateway;
use tailnet_render::gateway::{
    self as core, CONTROLLER_NAME, GatewayDecision, GatewayRuntime, NotReady, NotReadyReason,
    RouteKind, RouteParents,
};
use tailnet_render::ingress::IngressObjects;
use tailnet_render::intent::Claim;

use super::super::agent::conditions as shared;
use super::super::agent::decide::{AgentObjects, AgentStatus, Decide, Input, Planned};
use super::super::agent::identity::Identity;
use super::super::ingress::decide::Ingress;
use super::super::status::{ConditionSet, Problem, WithConditions};
use super::observation::{ClassState, GatewayObserved};

/// Conditions that must hold for `Ready` (and `Programmed`), in the order of their
/// dependencies.
pub const REQUIRED: [&str; 3] = [types::TAILNET_READY, types::AGENT_READY, types::NODE_ONLINE];

/// The Gateway kind (a Gateway API `Gateway` of a GatewayClass of ours).
#[derive(Debug)]
pub struct GatewayEntrance;

/// The agent's objects: an entrance agent's, plus the copy of the certificate Secrets.
#[derive(Clone, Debug)]
pub struct GatewayObjects {
    pub agent: IngressObjects,
    /// `None` without HTTPS listeners (or without a usable certificate).
    pub certificates: Option<Secret>,
}

/// One route's `status.parents` as it is to be written (every other controller's entry and
/// ours for other Gateways kept).
#[derive(Clone, Debug, PartialEq)]
pub struct RouteStatusWrite {
    pub route: RouteId,
    /// The version read: the write fails (and is retried) when the route changed since.
    pub resource_version: Option<String>,
    pub parents: Vec<RouteParentStatus>,
}

/// What the Gateway decided beyond its agent.
#[derive(Clone, Debug, Default)]
pub struct GatewayDecided {
    /// Routes whose status changes.
    pub routes: Vec<RouteStatusWrite>,
    /// What the plan asks for and the agent does not do (said in `Programmed`).
    pub notes: Vec<String>,
}

impl WithConditions for GatewayStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

impl AgentStatus for GatewayStatus {
    /// Conditions carry the generation.
    fn set_observed_generation(&mut self, _generation: Option<i64>) {}

    /// The addresses come from the Gateway decision (`report`).
    fn record_node(&mut self, _node: &Node) {}
}

impl Decide for GatewayEntrance {
    type Object = Gateway;
    type Status = GatewayStatus;
    type Intent = ();
    type Observed = GatewayObserved;
    type Objects = GatewayObjects;
    type Plan = GatewayDecided;
    type Acted = ();

    const AGENT: AgentKind = AgentKind::Gateway;
    const REQUIRED: &'static [&'static str] = &REQUIRED;
    const OBSERVED_IF_KNOWN: &'static [&'static str] = &[];

    fn status(gateway: &Gateway) -> Option<&GatewayStatus> {
        gateway.status.as_ref()
    }

    /// From the class's parameters (`AgentKind::tailnet_of` reads them).
    fn tailnet_name(_gateway: &Gateway) -> Option<&str> {
        None
    }

    /// Checked by the listeners and routes decision (`decide_gateway`), not here.
    fn intent(_gateway: &Gateway) -> Result<(), Vec<FieldError>> {
        Ok(())
    }

    fn hostnames(_names: &AgentNames, tag: &str) -> Vec<String> {
        vec![tag_hostname(tag)]
    }

    fn plan(
        input: &Input<'_, GatewayEntrance>,
        c: &mut ConditionSet,
        status: &mut GatewayStatus,
    ) -> Result<Option<Planned<GatewayEntrance>>, RenderError> {
        plan(input, c, status)
    }

    fn report(
        input: &Input<'_, GatewayEntrance>,
        planned: &Planned<GatewayEntrance>,
        identity: &Identity,
        c: &mut ConditionSet,
        status: &mut GatewayStatus,
    ) {
        let runtime = GatewayRuntime {
            addresses: node_addresses(identity.node()),
            not_ready: not_ready(c),
        };
        let decision = decide(input, &runtime);
        write_gateway_status(c, status, input.previous, decision.status, input.now);
        policy_effective(input, c);
        if !planned.plan.notes.is_empty() {
            note_programmed(c, &planned.plan.notes);
        }
    }

    fn agent_objects(objects: &GatewayObjects) -> AgentObjects<'_> {
        Ingress::agent_objects(&objects.agent)
    }

    /// Its tag among the Gateways in the cache.
    fn cleanup_tag(tailnet: &Tailnet, gateway: &Gateway, all: &[Arc<Gateway>]) -> Option<String> {
        gateway_tag(tailnet, gateway, all).ok()
    }

    fn amend(
        _gateway: &Gateway,
        status: GatewayStatus,
        _acted: &(),
        _now: Timestamp,
    ) -> GatewayStatus {
        status
    }
}

/// The claim of a Gateway on a tag (creation time, then namespace and name).
pub fn claim(gateway: &Gateway, tailnet: &str) -> Claim {
    Claim {
        kind: AgentKind::Gateway,
        created: gateway.metadata.creation_timestamp.as_ref().map(|t| t.0),
        namespace: gateway.namespace().unwrap_or_default(),
        name: gateway.name_any(),
        tailnet: tailnet.to_string(),
        recorded_tag: None,
    }
}

/// The Gateway's tag among `all` (Gateways; its own entry among them is fine): injective over
/// (namespace, name); `Err(holder)` on a hash collision.
pub fn gateway_tag(
    tailnet: &Tailnet,
    gateway: &Gateway,
    all: &[Arc<Gateway>],
) -> Result<String, String> {
    let name = tailnet.name_any();
    let others: Vec<Claim> = all
        .iter()
        .filter(|g| g.uid() != gateway.uid())
        .map(|g| claim(g, &name))
        .collect();
    tailnet_render::claims::ingress_tag_of(
        &name,
        &tailnet.spec.policy.tag_prefix,
        &claim(gateway, &name),
        &others,
    )
}

/// The class's verdict as `decide_gateway` reads it.
pub fn class_accepted(class: &ClassState) -> Result<(), String> {
    match class {
        ClassState::Ours(Ok(_)) => Ok(()),
        ClassState::Ours(Err(why)) => Err(why.clone()),
        ClassState::NotOurs => Err("the GatewayClass is not handled by tailnet-operator".into()),
    }
}

/// The Gateway API decision for the Gateway with `runtime`.
fn decide(input: &Input<'_, GatewayEntrance>, runtime: &GatewayRuntime) -> GatewayDecision {
    let observed = input.kind();
    let class = class_accepted(&observed.class);
    core::decide_gateway(&core::GatewayInputs {
        gateway: input.object,
        class_accepted: &class,
        http_routes: &observed.http_routes,
        tls_routes: &observed.tls_routes,
        tcp_routes: &observed.tcp_routes,
        reference_grants: &observed.reference_grants,
        facts: &observed.facts,
        runtime,
    })
}

/// The agent's runtime while it is being deployed: what the plan is decided with (its
/// addresses and readiness come later, in `report`).
pub fn starting() -> GatewayRuntime {
    GatewayRuntime {
        addresses: Vec::new(),
        not_ready: Some(NotReady {
            reason: NotReadyReason::Pending,
            message: "the agent is being deployed".into(),
        }),
    }
}

/// Before the identity: the Gateway API decision (its status while nothing runs yet), the
/// routes' status, the tag, and the agent's objects from the data plan. `None` (nothing done
/// for the agent) while the Gateway is not Accepted or has no tag of its own.
fn plan(
    input: &Input<'_, GatewayEntrance>,
    c: &mut ConditionSet,
    status: &mut GatewayStatus,
) -> Result<Option<Planned<GatewayEntrance>>, RenderError> {
    let decision = decide(input, &starting());
    let routes = route_writes(input.object, input.kind(), &decision.routes, input.now);
    let Some(data) = decision.plan.clone() else {
        write_gateway_status(c, status, input.previous, decision.status, input.now);
        return Ok(None);
    };
    let others: Vec<Arc<Gateway>> = input.kind().others.clone();
    let tag = match gateway_tag(input.tailnet, input.object, &others) {
        Ok(tag) => tag,
        Err(holder) => {
            c.fail(
                types::AGENT_READY,
                Problem::new(
                    reasons::TAG_CONFLICT,
                    format!(
                        "no tag of its own: the tag it would get is held by {holder}; rename this Gateway (or its namespace)"
                    ),
                ),
            );
            write_gateway_status(c, status, input.previous, decision.status, input.now);
            return Ok(None);
        }
    };
    let (objects, notes) = agent_objects(input, &data, &tag)?;
    Ok(Some(Planned {
        tag,
        objects: Some(objects),
        plan: GatewayDecided { routes, notes },
    }))
}

/// The agent's objects for the data plan, and what the agent does not do of it.
fn agent_objects(
    input: &Input<'_, GatewayEntrance>,
    data: &GatewayPlan,
    tag: &str,
) -> Result<(GatewayObjects, Vec<String>), RenderError> {
    let observed = input.kind();
    gateway_objects(
        input.owner,
        &input.render_context(),
        data,
        tag,
        &observed.key_pairs,
        &observed.backends,
        input.object,
        observed.class.in_cluster_namespaces(),
    )
}

/// The agent's objects for the data plan `data` with tag `tag` (pure; `tailnet-operator
/// render` calls it too): the listeners' certificate Secrets among `key_pairs` copied (only
/// those the plan serves), the agent's listeners, config and objects; and what the agent does
/// not do of the plan. `class_in_cluster`: the class's split-horizon clients (`gateway`'s
/// listeners may rule them out, noted).
#[allow(clippy::too_many_arguments)]
pub fn gateway_objects(
    owner: &tailnet_render::meta::Owner,
    render_ctx: &tailnet_render::RenderContext<'_>,
    data: &GatewayPlan,
    tag: &str,
    key_pairs: &BTreeMap<ObjectKey, objects::KeyPair>,
    backends: &tailnet_render::backends::ObservedBackends,
    gateway: &Gateway,
    class_in_cluster: &[String],
) -> Result<(GatewayObjects, Vec<String>), RenderError> {
    let wanted: Vec<&ObjectKey> = data
        .listeners
        .iter()
        .filter_map(|l| match &l.serve {
            ListenerServe::Https { certificates, .. } => Some(certificates),
            _ => None,
        })
        .flatten()
        .collect();
    let pairs: BTreeMap<ObjectKey, objects::KeyPair> = key_pairs
        .iter()
        .filter(|(key, _)| wanted.contains(key))
        .map(|(key, pair)| (key.clone(), pair.clone()))
        .collect();
    let files = pairs
        .keys()
        .map(|key| (key.clone(), certificate_files(key)))
        .collect();
    let mut agent = agent_listeners(data, render_ctx.cluster_domain, &files);
    let in_cluster_namespaces =
        match tailnet_render::gateway::intent::in_cluster_namespaces(gateway, class_in_cluster) {
            Ok(namespaces) => namespaces,
            Err(note) => {
                agent.notes.push(note);
                &[]
            }
        };
    let certificates = objects::certificate_secret(owner, &pairs);
    let rendered = objects::render(
        owner,
        render_ctx,
        &GatewayInputs {
            agent: &agent,
            node_hostname: tag_hostname(tag),
            certificates: certificates.is_some(),
            backends,
            in_cluster_namespaces,
        },
    )?;
    Ok((
        GatewayObjects {
            agent: rendered,
            certificates,
        },
        agent.notes,
    ))
}

/// `PolicyEffective`: the grant from the class's `allowFrom` to the listener ports is live
/// (informational: a Gateway without sources serves, but nobody is granted access).
fn policy_effective(input: &Input<'_, GatewayEntrance>, c: &mut ConditionSet) {
    let gateway = input.object;
    let key = format!(
        "{}/{}/{}",
        AgentKind::Gateway.resource_kind(),
        gateway.namespace().unwrap_or_default(),
        gateway.name_any()
    );
    let sources = match &input.kind().class {
        ClassState::Ours(Ok(parameters)) => parameters.allow_from.clone(),
        _ => Vec::new(),
    };
    let blocked = sources.is_empty().then(|| {
        Problem::new(
            reasons::GRANT_MISSING,
            "the class's TailnetGatewayParameters have no spec.allowFrom: no grant is generated (add sources there, or grant access in the base policy)",
        )
    });
    let live = format!(
        "{} may connect to the listener ports: the grant is live in Headscale",
        sources.join(", ")
    );
    shared::policy_effective(c, input.tailnet, &key, &live, blocked);
}

/// The node's tailnet addresses (those that parse).
fn node_addresses(node: Option<&Node>) -> Vec<IpAddr> {
    node.map(|n| {
        n.ip_addresses
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect()
    })
    .unwrap_or_default()
}

/// The first required condition that is not True, as `Programmed=False/Pending`.
fn not_ready(c: &ConditionSet) -> Option<NotReady> {
    REQUIRED.iter().find_map(|type_| match c.get(type_) {
        Some(condition) if condition.status == Status::True.as_str() => None,
        Some(condition) => Some(NotReady {
            reason: NotReadyReason::Pending,
            message: format!("{type_} is {}: {}", condition.status, condition.message),
        }),
        None => Some(NotReady {
            reason: NotReadyReason::Pending,
            message: format!("{type_} is not known yet"),
        }),
    })
}

fn parse_status(status: &str) -> Status {
    match status {
        "True" => Status::True,
        "False" => Status::False,
        _ => Status::Unknown,
    }
}

/// The decided Gateway status into the object's: `Accepted` and `Programmed` among the
/// conditions (with the generic ones), addresses, and listeners whose conditions keep their
/// transition times.
fn write_gateway_status(
    c: &mut ConditionSet,
    status: &mut GatewayStatus,
    previous: &GatewayStatus,
    decided: GatewayStatus,
    now: Timestamp,
) {
    for condition in &decided.conditions {
        c.set(
            &condition.type_,
            parse_status(&condition.status),
            &condition.reason,
            condition.message.clone(),
        );
    }
    status.addresses = decided.addresses;
    status.listeners = merge_listeners(&previous.listeners, decided.listeners, now);
}

/// Listener statuses with the previous transition times of unchanged conditions.
pub fn merge_listeners(
    previous: &[ListenerStatus],
    decided: Vec<ListenerStatus>,
    now: Timestamp,
) -> Vec<ListenerStatus> {
    let now = Time(now);
    decided
        .into_iter()
        .map(|mut listener| {
            let mut merged: Vec<Condition> = previous
                .iter()
                .find(|p| p.name == listener.name)
                .map(|p| p.conditions.clone())
                .unwrap_or_default();
            // Only the types decided now stay.
            merged.retain(|old| listener.conditions.iter().any(|c| c.type_ == old.type_));
            for condition in std::mem::take(&mut listener.conditions) {
                conditions::upsert(&mut merged, condition, &now);
            }
            listener.conditions = merged;
            listener
        })
        .collect()
}

/// What the agent does not do of the plan, said in `Programmed` (bounded).
fn note_programmed(c: &mut ConditionSet, notes: &[String]) {
    let Some(programmed) = c.get(core::GATEWAY_CONDITION_TYPES[1]).cloned() else {
        return;
    };
    let message = tailnet_api::bounded::bounded(
        &format!("{}; not served: {}", programmed.message, notes.join("; ")),
        tailnet_api::bounded::MAX_MESSAGE_BYTES,
    );
    c.set(
        &programmed.type_,
        parse_status(&programmed.status),
        &programmed.reason,
        message,
    );
}

/// Whether a parent status entry is this controller's for the Gateway.
fn ours_for(entry: &RouteParentStatus, route_namespace: &str, gateway: &Gateway) -> bool {
    entry.controller_name == CONTROLLER_NAME
        && references_gateway(
            &entry.parent_ref,
            route_namespace,
            &gateway.namespace().unwrap_or_default(),
            &gateway.name_any(),
        )
}

/// The `status.parents` writes of every observed route whose entries for this Gateway change:
/// entries of other controllers (and ours for other Gateways) are kept in place; ours for this
/// Gateway are replaced by the decided ones (conditions keep their transition times), or
/// removed when the route no longer names the Gateway.
pub fn route_writes(
    gateway: &Gateway,
    observed: &GatewayObserved,
    decided: &[RouteParents],
    now: Timestamp,
) -> Vec<RouteStatusWrite> {
    let mut current: Vec<(RouteId, Option<String>, Vec<RouteParentStatus>)> = Vec::new();
    let mut add = |kind: RouteKind,
                   meta: &kube::api::ObjectMeta,
                   parents: Option<&Vec<RouteParentStatus>>| {
        current.push((
            RouteId {
                kind,
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
            },
            meta.resource_version.clone(),
            parents.cloned().unwrap_or_default(),
        ));
    };
    for r in &observed.http_routes {
        add(
            RouteKind::HTTPRoute,
            &r.metadata,
            r.status.as_ref().map(|s| &s.parents),
        );
    }
    for r in &observed.tls_routes {
        add(
            RouteKind::TLSRoute,
            &r.metadata,
            r.status.as_ref().map(|s| &s.parents),
        );
    }
    for r in &observed.tcp_routes {
        add(
            RouteKind::TCPRoute,
            &r.metadata,
            r.status.as_ref().map(|s| &s.parents),
        );
    }
    let now = Time(now);
    let mut writes = Vec::new();
    for (id, resource_version, previous) in current {
        let new: &[RouteParentStatus] = decided
            .iter()
            .find(|d| d.route == id)
            .map(|d| d.parents.as_slice())
            .unwrap_or_default();
        let had_ours = previous.iter().any(|p| ours_for(p, &id.namespace, gateway));
        if new.is_empty() && !had_ours {
            continue;
        }
        let mut parents: Vec<RouteParentStatus> = previous
            .iter()
            .filter(|p| !ours_for(p, &id.namespace, gateway))
            .cloned()
            .collect();
        for entry in new {
            let mut merged: Vec<Condition> = previous
                .iter()
                .find(|p| p.controller_name == CONTROLLER_NAME && p.parent_ref == entry.parent_ref)
                .map(|p| p.conditions.clone())
                .unwrap_or_default();
            merged.retain(|old| entry.conditions.iter().any(|c| c.type_ == old.type_));
            for condition in entry.conditions.clone() {
                conditions::upsert(&mut merged, condition, &now);
            }
            parents.push(RouteParentStatus {
                conditions: merged,
                ..entry.clone()
            });
        }
        if !same_parents(&previous, &parents) {
            writes.push(RouteStatusWrite {
                route: id,
                resource_version,
                parents,
            });
        }
    }
    writes
}

/// Equal entries (order and transition times aside).
fn same_parents(a: &[RouteParentStatus], b: &[RouteParentStatus]) -> bool {
    a.len() == b.len()
        && a.iter().all(|x| {
            b.iter().any(|y| {
                x.parent_ref == y.parent_ref
                    && x.controller_name == y.controller_name
                    && conditions::same_ignoring_time(&x.conditions, &y.conditions)
            })
        })
}
