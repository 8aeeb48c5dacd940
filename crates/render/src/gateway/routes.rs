//! Routes and their parents: which listeners a parentRef selects (sectionName, port), which
//! of those admit the route (kind, namespace) and serve its hostnames, and how backendRefs
//! resolve (kind, ReferenceGrant, existence) — with the spec's reasons for each refusal.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use tailnet_gateway_api::conditions::route::reasons;
use tailnet_gateway_api::{
    BackendRef, CORE_GROUP, GROUP, HTTPRoute, ParentReference, ReferenceGrant, TCPRoute, TLSRoute,
    kinds,
};

use super::listeners::ListenerVerdict;
use super::plan::{BackendTarget, RouteId};
use super::{ClusterFacts, Problem, RouteKind, grants, hostnames};

/// The parts of a route that attachment and ordering need, whatever its kind.
#[derive(Clone, Debug)]
pub struct RouteView<'a> {
    pub id: RouteId,
    pub generation: Option<i64>,
    pub created: Option<Timestamp>,
    /// Empty for TCPRoutes (no hostnames).
    pub hostnames: &'a [String],
    pub parent_refs: &'a [ParentReference],
}

impl<'a> RouteView<'a> {
    fn new(
        kind: RouteKind,
        metadata: &ObjectMeta,
        hostnames: &'a [String],
        parent_refs: &'a [ParentReference],
    ) -> Self {
        RouteView {
            id: RouteId {
                kind,
                namespace: metadata.namespace.clone().unwrap_or_default(),
                name: metadata.name.clone().unwrap_or_default(),
            },
            generation: metadata.generation,
            created: metadata.creation_timestamp.as_ref().map(|t| t.0),
            hostnames,
            parent_refs,
        }
    }

    pub fn http(route: &'a HTTPRoute) -> Self {
        Self::new(
            RouteKind::HTTPRoute,
            &route.metadata,
            &route.spec.hostnames,
            &route.spec.parent_refs,
        )
    }

    pub fn tls(route: &'a TLSRoute) -> Self {
        Self::new(
            RouteKind::TLSRoute,
            &route.metadata,
            &route.spec.hostnames,
            &route.spec.parent_refs,
        )
    }

    pub fn tcp(route: &'a TCPRoute) -> Self {
        Self::new(
            RouteKind::TCPRoute,
            &route.metadata,
            &[],
            &route.spec.parent_refs,
        )
    }

    /// Precedence between routes when everything else ties (spec): the oldest first, then
    /// `namespace/name` alphabetically. A route without a creation time (never from the
    /// apiserver) sorts last.
    pub fn age_key(&self) -> (bool, Option<Timestamp>, &str, &str) {
        (
            self.created.is_none(),
            self.created,
            &self.id.namespace,
            &self.id.name,
        )
    }
}

/// Whether a parentRef of a route in `route_namespace` names the Gateway
/// `gateway_namespace/gateway_name` (group and kind default to the Gateway's).
pub fn references_gateway(
    parent: &ParentReference,
    route_namespace: &str,
    gateway_namespace: &str,
    gateway_name: &str,
) -> bool {
    parent.group.as_deref().unwrap_or(GROUP) == GROUP
        && parent.kind.as_deref().unwrap_or(kinds::GATEWAY) == kinds::GATEWAY
        && parent.namespace.as_deref().unwrap_or(route_namespace) == gateway_namespace
        && parent.name == gateway_name
}

/// The listeners (indices) a parentRef attaches the route to, or why it attaches to none.
///
/// Order of the checks, as the conformance suite expects: no listener with the parentRef's
/// sectionName and port → NoMatchingParent; none of those admits the route's kind and
/// namespace → NotAllowedByListeners; none of those has an intersecting hostname →
/// NoMatchingListenerHostname. A listener's own validity does not matter here (the spec
/// counts attached routes on invalid listeners too).
pub fn attach(
    route: &RouteView<'_>,
    parent: &ParentReference,
    listeners: &[ListenerVerdict],
    gateway_namespace: &str,
    facts: &ClusterFacts,
) -> Result<Vec<usize>, Problem> {
    let selected: Vec<usize> = (0..listeners.len())
        .filter(|&i| {
            parent
                .section_name
                .as_deref()
                .is_none_or(|section| listeners[i].name == section)
                && parent.port.is_none_or(|port| listeners[i].port == port)
        })
        .collect();
    if selected.is_empty() {
        return Err(Problem::new(
            reasons::NO_MATCHING_PARENT,
            no_matching_parent_message(parent),
        ));
    }
    let allowed: Vec<usize> = selected
        .into_iter()
        .filter(|&i| {
            listeners[i].supported_kinds.contains(&route.id.kind)
                && listeners[i].admits_namespace(&route.id.namespace, gateway_namespace, facts)
        })
        .collect();
    if allowed.is_empty() {
        return Err(Problem::new(
            reasons::NOT_ALLOWED_BY_LISTENERS,
            format!(
                "no selected listener admits {}s from namespace {}",
                route.id.kind.as_str(),
                route.id.namespace
            ),
        ));
    }
    if route.id.kind == RouteKind::TCPRoute {
        return Ok(allowed);
    }
    let matching: Vec<usize> = allowed
        .into_iter()
        .filter(|&i| {
            !hostnames::effective(listeners[i].hostname.as_deref(), route.hostnames).is_empty()
        })
        .collect();
    if matching.is_empty() {
        return Err(Problem::new(
            reasons::NO_MATCHING_LISTENER_HOSTNAME,
            format!(
                "no hostname of the route ({}) intersects a selected listener's hostname",
                route.hostnames.join(", ")
            ),
        ));
    }
    Ok(matching)
}

fn no_matching_parent_message(parent: &ParentReference) -> String {
    match (&parent.section_name, parent.port) {
        (Some(section), Some(port)) => format!("no listener named {section} on port {port}"),
        (Some(section), None) => format!("no listener named {section}"),
        (None, Some(port)) => format!("no listener on port {port}"),
        (None, None) => "the Gateway has no listeners".to_string(),
    }
}

/// Resolves one backendRef of a route: a core Service (else InvalidKind), in the route's
/// namespace or one whose ReferenceGrant allows it (else RefNotPermitted, without revealing
/// whether the Service exists), that exists (else BackendNotFound), with a port.
pub fn resolve_backend(
    reference: &BackendRef,
    route: &RouteView<'_>,
    grants: &[ReferenceGrant],
    facts: &ClusterFacts,
) -> Result<BackendTarget, Problem> {
    let group = reference.group.as_deref().unwrap_or(CORE_GROUP);
    let kind = reference.kind.as_deref().unwrap_or(kinds::SERVICE);
    let namespace = reference
        .namespace
        .as_deref()
        .unwrap_or(&route.id.namespace);
    let shown = format!("{namespace}/{}", reference.name);
    if group != CORE_GROUP || kind != kinds::SERVICE {
        return Err(Problem::new(
            reasons::INVALID_KIND,
            format!(
                "backendRef {shown} is a {kind} of group {group:?}; only core Services are supported"
            ),
        ));
    }
    let allowed = grants::permitted(
        grants,
        grants::From {
            group: GROUP,
            kind: route.id.kind.as_str(),
            namespace: &route.id.namespace,
        },
        grants::To {
            group: CORE_GROUP,
            kind: kinds::SERVICE,
            namespace,
            name: &reference.name,
        },
    );
    if !allowed {
        return Err(Problem::new(
            reasons::REF_NOT_PERMITTED,
            format!(
                "backendRef to Service {shown} is not permitted by a ReferenceGrant in {namespace}"
            ),
        ));
    }
    let key = crate::backends::ObjectKey::new(namespace, reference.name.as_str());
    if !facts.services.contains(&key) {
        return Err(Problem::new(
            reasons::BACKEND_NOT_FOUND,
            format!("Service {shown} not found"),
        ));
    }
    let port = reference
        .port
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| {
            Problem::new(
                reasons::BACKEND_NOT_FOUND,
                format!("backendRef {shown} needs a port (1-65535)"),
            )
        })?;
    // A headless Service's name resolves to its endpoints: dial the port they listen on.
    let port = facts
        .headless_target_ports
        .get(&key)
        .and_then(|ports| ports.get(&port))
        .copied()
        .unwrap_or(port);
    Ok(BackendTarget::Service {
        namespace: namespace.to_string(),
        name: reference.name.clone(),
        port,
    })
}

/// The target of a backendRef for the plan: its Service, or Invalid with the reason (the
/// data plane answers that share with 500 / closes the connection).
pub fn target_or_invalid(resolved: &Result<BackendTarget, Problem>) -> BackendTarget {
    match resolved {
        Ok(target) => target.clone(),
        Err(problem) => BackendTarget::Invalid {
            reason: problem.reason.to_string(),
        },
    }
}

/// A backendRef's weight for the plan (default 1; negative values, which the schema
/// forbids, count as 0).
pub fn weight(reference: &BackendRef) -> u32 {
    reference
        .weight
        .map_or(1, |w| u32::try_from(w).unwrap_or(0))
}
