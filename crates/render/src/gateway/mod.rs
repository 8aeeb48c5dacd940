//! The Gateway API core (pure, no I/O): given a GatewayClass, a Gateway, the routes, the
//! ReferenceGrants and plain facts about the cluster (namespaces' labels, Secrets, Services)
//! and about the Gateway's agent (its tailnet addresses, whether it is ready), decide every
//! status the spec defines — GatewayClass `Accepted`; Gateway `Accepted`/`Programmed` and
//! `addresses`; per listener `Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`,
//! `OverlappingTLSConfig`, `supportedKinds`, `attachedRoutes`; per route and parent
//! `Accepted`, `ResolvedRefs`, `PartiallyInvalid` — and the data plan the agent serves
//! ([`plan::GatewayPlan`]).
//!
//! It lives in the render crate because it is a renderer like the others: the controller
//! gathers the objects, calls [`decide_gateway`], writes the statuses (merging conditions by
//! type, removing the types listed in `*_CONDITION_TYPES` that are no longer produced) and
//! turns the plan into the agent's config. The Gateway API types come from
//! `tailnet-gateway-api` (no behaviour there, only the upstream schema).
//!
//! Condition messages are bounded (`tailnet_api::bounded`); `lastTransitionTime` is left at
//! the epoch for `tailnet_api::conditions::upsert` to fill.

pub mod agent;
pub mod class;
pub mod grants;
pub mod hostnames;
pub mod http;
pub mod intent;
pub mod listeners;
pub mod objects;
pub mod plan;
pub mod routes;
pub mod selector;

mod decide;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::Serialize;
use tailnet_gateway_api::gateway::GatewayStatus;
use tailnet_gateway_api::{
    Gateway, HTTPRoute, ReferenceGrant, RouteParentStatus, TCPRoute, TLSRoute, conditions, kinds,
};

use crate::backends::ObjectKey;

pub use decide::decide_gateway;

/// The `controllerName` of GatewayClasses handled by tailnet-operator.
pub const CONTROLLER_NAME: &str = "tailnet-operator.dev/gateway";

/// Gateway condition types this core decides (the controller owns exactly these).
pub const GATEWAY_CONDITION_TYPES: &[&str] = &[
    conditions::gateway::ACCEPTED,
    conditions::gateway::PROGRAMMED,
];

/// Listener condition types this core decides; `OverlappingTLSConfig` is only present while
/// True.
pub const LISTENER_CONDITION_TYPES: &[&str] = &[
    conditions::listener::ACCEPTED,
    conditions::listener::CONFLICTED,
    conditions::listener::PROGRAMMED,
    conditions::listener::RESOLVED_REFS,
    conditions::listener::OVERLAPPING_TLS_CONFIG,
];

/// Route condition types this core decides per parent; `PartiallyInvalid` is only present
/// while True.
pub const ROUTE_CONDITION_TYPES: &[&str] = &[
    conditions::route::ACCEPTED,
    conditions::route::RESOLVED_REFS,
    conditions::route::PARTIALLY_INVALID,
];

/// The route kinds this implementation serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
// The variants are spelled (and serialized) as the Gateway API kind names.
#[allow(clippy::upper_case_acronyms)]
pub enum RouteKind {
    HTTPRoute,
    TLSRoute,
    TCPRoute,
}

impl RouteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::HTTPRoute => kinds::HTTP_ROUTE,
            RouteKind::TLSRoute => kinds::TLS_ROUTE,
            RouteKind::TCPRoute => kinds::TCP_ROUTE,
        }
    }

    pub fn parse(kind: &str) -> Option<Self> {
        match kind {
            kinds::HTTP_ROUTE => Some(RouteKind::HTTPRoute),
            kinds::TLS_ROUTE => Some(RouteKind::TLSRoute),
            kinds::TCP_ROUTE => Some(RouteKind::TCPRoute),
            _ => None,
        }
    }
}

/// A reason (one of the spec's constants) with a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: &'static str,
    pub message: String,
}

impl Problem {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Problem {
            reason,
            message: message.into(),
        }
    }
}

/// What a Secret named by a certificateRef holds, as the caller found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretFact {
    /// A parseable certificate chain and matching private key (`tls.crt`, `tls.key`).
    TlsKeyPair,
    /// Exists but cannot serve TLS; the message says why (missing key, malformed PEM, …).
    Unusable(String),
}

/// Plain facts about the cluster, gathered by the caller.
#[derive(Clone, Debug, Default)]
pub struct ClusterFacts {
    /// Labels of each namespace (for `allowedRoutes.namespaces.selector`).
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Secrets that certificateRefs may name.
    pub secrets: BTreeMap<ObjectKey, SecretFact>,
    /// Services that exist (backendRefs).
    pub services: BTreeSet<ObjectKey>,
    /// Headless Services (`clusterIP: None`) by key: Service port → numeric `targetPort`.
    /// Their name resolves to the endpoints' own addresses, so the agent dials the port the
    /// endpoints listen on ([`headless_target_ports`]).
    pub headless_target_ports: BTreeMap<ObjectKey, BTreeMap<u16, u16>>,
}

/// A headless Service's ports (`clusterIP: None`): Service port → the numeric `targetPort`
/// (absent: the same port). `None` for a Service with a cluster IP. A named `targetPort` is
/// left out (the Service port is dialled, as before): resolving it needs the EndpointSlices.
pub fn headless_target_ports(
    service: &k8s_openapi::api::core::v1::Service,
) -> Option<BTreeMap<u16, u16>> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let spec = service.spec.as_ref()?;
    if spec.cluster_ip.as_deref() != Some("None") {
        return None;
    }
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            let port = u16::try_from(p.port).ok()?;
            let target = match &p.target_port {
                None => port,
                Some(IntOrString::Int(target)) => u16::try_from(*target).ok()?,
                Some(IntOrString::String(_)) => return None,
            };
            Some((port, target))
        })
        .collect();
    Some(ports)
}

/// Why the Gateway's agent does not serve yet, in the spec's `Programmed=False` vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotReadyReason {
    /// Not ready yet (agent starting, node not online, policy not effective yet, …).
    Pending,
    /// The agent cannot be scheduled.
    NoResources,
    /// The tailnet node has no address yet.
    AddressNotAssigned,
}

impl NotReadyReason {
    fn as_str(self) -> &'static str {
        match self {
            NotReadyReason::Pending => conditions::gateway::reasons::PENDING,
            NotReadyReason::NoResources => conditions::gateway::reasons::NO_RESOURCES,
            NotReadyReason::AddressNotAssigned => {
                conditions::gateway::reasons::ADDRESS_NOT_ASSIGNED
            }
        }
    }
}

/// Our own preconditions (agent, node, policy), expressed in the spec's vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReady {
    pub reason: NotReadyReason,
    pub message: String,
}

/// What is known about the Gateway's agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayRuntime {
    /// The tailnet node's addresses (`status.addresses`); empty: none yet.
    pub addresses: Vec<IpAddr>,
    /// `None`: ready to serve.
    pub not_ready: Option<NotReady>,
}

/// Everything one Gateway's decision depends on. The routes and grants may include objects
/// that do not concern this Gateway; they are ignored.
#[derive(Clone, Copy, Debug)]
pub struct GatewayInputs<'a> {
    pub gateway: &'a Gateway,
    /// The Gateway's class verdict: `Ok` when the class is ours and Accepted, `Err(message)`
    /// when it is ours but not Accepted (classes of other controllers are not ours to decide).
    pub class_accepted: &'a Result<(), String>,
    pub http_routes: &'a [HTTPRoute],
    pub tls_routes: &'a [TLSRoute],
    pub tcp_routes: &'a [TCPRoute],
    pub reference_grants: &'a [ReferenceGrant],
    pub facts: &'a ClusterFacts,
    pub runtime: &'a GatewayRuntime,
}

/// The status entries of one route for the parentRefs that name this Gateway.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteParents {
    pub route: plan::RouteId,
    /// One per parentRef naming this Gateway, in spec order; `controllerName` is ours.
    pub parents: Vec<RouteParentStatus>,
}

/// Everything decided for one Gateway.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayDecision {
    pub status: GatewayStatus,
    /// Routes with at least one parentRef naming this Gateway, ordered by kind, namespace,
    /// name.
    pub routes: Vec<RouteParents>,
    /// What the agent serves; `None` while the Gateway is not Accepted.
    pub plan: Option<plan::GatewayPlan>,
}
