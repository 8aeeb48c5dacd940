//! Listener validation: protocol, TLS settings and certificateRefs, allowedRoutes (kinds and
//! namespaces), and the distinctness rules between listeners of one Gateway (conflicts and
//! overlapping TLS hostnames), each with the condition and reason the spec names.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use tailnet_api::conditions::{Status, condition};
use tailnet_gateway_api::conditions::listener::{self, reasons};
use tailnet_gateway_api::gateway::ListenerStatus;
use tailnet_gateway_api::{
    CORE_GROUP, GROUP, Gateway, Listener, ReferenceGrant, RouteGroupKind, SecretObjectReference,
    from_namespaces, kinds, protocols, tls_modes,
};

use super::{ClusterFacts, Problem, RouteKind, SecretFact, grants, hostnames, selector};
use crate::backends::ObjectKey;

/// The protocols this implementation serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    Http,
    Https,
    Tls,
    Tcp,
}

impl Protocol {
    fn parse(protocol: &str) -> Option<Self> {
        match protocol {
            protocols::HTTP => Some(Protocol::Http),
            protocols::HTTPS => Some(Protocol::Https),
            protocols::TLS => Some(Protocol::Tls),
            protocols::TCP => Some(Protocol::Tcp),
            _ => None,
        }
    }

    /// Protocols of one family can share a port: HTTPS and TLS are both dispatched by SNI;
    /// HTTP and TCP need a port of their own.
    fn family(self) -> u8 {
        match self {
            Protocol::Http => 0,
            Protocol::Https | Protocol::Tls => 1,
            Protocol::Tcp => 2,
        }
    }

    /// The route kinds a listener of this protocol can serve.
    pub fn route_kinds(self) -> &'static [RouteKind] {
        match self {
            Protocol::Http | Protocol::Https => &[RouteKind::HTTPRoute],
            Protocol::Tls => &[RouteKind::TLSRoute],
            Protocol::Tcp => &[RouteKind::TCPRoute],
        }
    }
}

/// Which namespaces' routes a listener admits.
#[derive(Clone, Debug, PartialEq)]
pub enum NamespacePolicy {
    Same,
    All,
    Selector(LabelSelector),
    /// The listener's `allowedRoutes.namespaces` is invalid: nothing is admitted.
    Nothing,
}

/// Everything decided about one listener.
#[derive(Clone, Debug, PartialEq)]
pub struct ListenerVerdict {
    pub name: String,
    pub port: i32,
    /// Unset for TCP (hostnames do not apply).
    pub hostname: Option<String>,
    /// `None`: a protocol this implementation does not serve.
    pub protocol: Option<Protocol>,
    /// `status.supportedKinds`: the allowed kinds this listener can serve.
    pub supported_kinds: Vec<RouteKind>,
    pub namespaces: NamespacePolicy,
    /// Resolved certificateRefs (HTTPS).
    pub certificates: Vec<ObjectKey>,
    /// Reasons for `Accepted=False` (other than conflicts).
    pub not_accepted: Vec<Problem>,
    /// Reasons for `ResolvedRefs=False`.
    pub unresolved: Vec<Problem>,
    /// `Conflicted=True` with this reason.
    pub conflict: Option<Problem>,
    /// `OverlappingTLSConfig=True` (reason OverlappingHostnames).
    pub overlapping_tls: Option<String>,
}

impl ListenerVerdict {
    pub fn accepted(&self) -> bool {
        self.not_accepted.is_empty() && self.conflict.is_none()
    }

    pub fn resolved(&self) -> bool {
        self.unresolved.is_empty()
    }

    /// Whether the data plane serves this listener.
    pub fn serves(&self) -> bool {
        self.accepted() && self.resolved()
    }

    /// Whether routes of `route_namespace` may attach.
    pub fn admits_namespace(
        &self,
        route_namespace: &str,
        gateway_namespace: &str,
        facts: &ClusterFacts,
    ) -> bool {
        match &self.namespaces {
            NamespacePolicy::Same => route_namespace == gateway_namespace,
            NamespacePolicy::All => true,
            NamespacePolicy::Selector(s) => {
                let empty = BTreeMap::new();
                let labels = facts
                    .namespace_labels
                    .get(route_namespace)
                    .unwrap_or(&empty);
                selector::matches(s, labels)
            }
            NamespacePolicy::Nothing => false,
        }
    }

    /// The listener's status. `gateway_programmed`: `Err(message)` while the Gateway as a whole
    /// is not Programmed (its listeners then are not either).
    pub fn status(
        &self,
        generation: Option<i64>,
        attached_routes: i32,
        gateway_programmed: &Result<(), String>,
    ) -> ListenerStatus {
        let accepted = match (self.not_accepted.first(), &self.conflict) {
            (Some(p), _) | (None, Some(p)) => condition(
                listener::ACCEPTED,
                Status::False,
                p.reason,
                all_messages(self),
                generation,
            ),
            (None, None) => condition(
                listener::ACCEPTED,
                Status::True,
                reasons::ACCEPTED,
                "listener is valid",
                generation,
            ),
        };
        let resolved = match self.unresolved.first() {
            Some(p) => condition(
                listener::RESOLVED_REFS,
                Status::False,
                p.reason,
                join(&self.unresolved),
                generation,
            ),
            None => condition(
                listener::RESOLVED_REFS,
                Status::True,
                reasons::RESOLVED_REFS,
                "all references resolved",
                generation,
            ),
        };
        let conflicted = match &self.conflict {
            Some(p) => condition(
                listener::CONFLICTED,
                Status::True,
                p.reason,
                p.message.as_str(),
                generation,
            ),
            None => condition(
                listener::CONFLICTED,
                Status::False,
                reasons::NO_CONFLICTS,
                "no conflicts",
                generation,
            ),
        };
        let programmed = match (self.serves(), gateway_programmed) {
            (false, _) => condition(
                listener::PROGRAMMED,
                Status::False,
                reasons::INVALID,
                all_messages(self),
                generation,
            ),
            (true, Err(why)) => condition(
                listener::PROGRAMMED,
                Status::False,
                reasons::PENDING,
                why.as_str(),
                generation,
            ),
            (true, Ok(())) => condition(
                listener::PROGRAMMED,
                Status::True,
                reasons::PROGRAMMED,
                "served by the Gateway's agent",
                generation,
            ),
        };
        let mut conditions = vec![accepted, conflicted, programmed, resolved];
        if let Some(message) = &self.overlapping_tls {
            conditions.push(condition(
                listener::OVERLAPPING_TLS_CONFIG,
                Status::True,
                reasons::OVERLAPPING_HOSTNAMES,
                message.as_str(),
                generation,
            ));
        }
        ListenerStatus {
            name: self.name.clone(),
            supported_kinds: self
                .supported_kinds
                .iter()
                .map(|kind| RouteGroupKind {
                    group: Some(GROUP.to_string()),
                    kind: kind.as_str().to_string(),
                })
                .collect(),
            attached_routes,
            conditions,
        }
    }
}

fn join(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

fn all_messages(verdict: &ListenerVerdict) -> String {
    let mut all: Vec<Problem> = verdict.not_accepted.clone();
    all.extend(verdict.conflict.clone());
    all.extend(verdict.unresolved.iter().cloned());
    join(&all)
}

/// Evaluates every listener of the Gateway, including the conflicts between them.
pub fn evaluate(
    gateway: &Gateway,
    grants: &[ReferenceGrant],
    facts: &ClusterFacts,
) -> Vec<ListenerVerdict> {
    let namespace = gateway.metadata.namespace.as_deref().unwrap_or_default();
    let frontend_validation = gateway
        .spec
        .tls
        .as_ref()
        .is_some_and(|tls| tls.frontend.is_some());
    let mut verdicts: Vec<ListenerVerdict> = gateway
        .spec
        .listeners
        .iter()
        .map(|l| evaluate_one(l, namespace, frontend_validation, grants, facts))
        .collect();
    mark_conflicts(&mut verdicts);
    mark_overlapping_tls(&mut verdicts);
    verdicts
}

fn evaluate_one(
    listener: &Listener,
    gateway_namespace: &str,
    frontend_validation: bool,
    grants: &[ReferenceGrant],
    facts: &ClusterFacts,
) -> ListenerVerdict {
    let protocol = Protocol::parse(&listener.protocol);
    let mut verdict = ListenerVerdict {
        name: listener.name.clone(),
        port: listener.port,
        hostname: match protocol {
            Some(Protocol::Tcp) => None,
            _ => listener.hostname.clone().filter(|h| !h.is_empty()),
        },
        protocol,
        supported_kinds: Vec::new(),
        namespaces: NamespacePolicy::Nothing,
        certificates: Vec::new(),
        not_accepted: Vec::new(),
        unresolved: Vec::new(),
        conflict: None,
        overlapping_tls: None,
    };
    let Some(protocol) = protocol else {
        verdict.not_accepted.push(Problem::new(
            reasons::UNSUPPORTED_PROTOCOL,
            format!(
                "protocol {:?} is not supported (HTTP, HTTPS, TLS and TCP are)",
                listener.protocol
            ),
        ));
        return verdict;
    };
    if u16::try_from(listener.port).map_or(true, |p| p == 0) {
        verdict.not_accepted.push(Problem::new(
            reasons::PORT_UNAVAILABLE,
            format!("port {} is not a TCP port", listener.port),
        ));
    }
    check_tls(
        listener,
        protocol,
        gateway_namespace,
        grants,
        facts,
        &mut verdict,
    );
    if frontend_validation && protocol == Protocol::Https {
        verdict.not_accepted.push(Problem::new(
            reasons::UNSUPPORTED_VALUE,
            "client certificate validation (spec.tls.frontend) is not supported",
        ));
    }
    if tls_mode_serves(listener, protocol) {
        allowed_kinds(listener, protocol, &mut verdict);
    }
    match namespace_policy(listener) {
        Ok(policy) => verdict.namespaces = policy,
        Err(problem) => verdict.not_accepted.push(problem),
    }
    verdict
}

/// Whether the listener's TLS mode is one this protocol serves (TLS: Passthrough; HTTPS:
/// Terminate, the default; others: any). A listener in a mode it cannot serve supports no
/// route kinds: `supportedKinds` stays empty (conformance TLSRouteListenerTerminateNotSupported
/// expects exactly that besides `Accepted=False/UnsupportedValue`).
fn tls_mode_serves(listener: &Listener, protocol: Protocol) -> bool {
    let mode = listener.tls.as_ref().and_then(|t| t.mode.as_deref());
    match protocol {
        Protocol::Tls => mode == Some(tls_modes::PASSTHROUGH),
        Protocol::Https => mode.unwrap_or(tls_modes::TERMINATE) == tls_modes::TERMINATE,
        Protocol::Http | Protocol::Tcp => true,
    }
}

/// TLS settings per protocol: HTTPS terminates with certificateRefs; TLS only passes through
/// (termination on TLS listeners is not supported); HTTP and TCP take none.
fn check_tls(
    listener: &Listener,
    protocol: Protocol,
    gateway_namespace: &str,
    grants: &[ReferenceGrant],
    facts: &ClusterFacts,
    verdict: &mut ListenerVerdict,
) {
    let tls = listener.tls.as_ref();
    let mode = tls.and_then(|t| t.mode.as_deref());
    match protocol {
        Protocol::Http | Protocol::Tcp => {
            if tls.is_some() {
                verdict.not_accepted.push(Problem::new(
                    reasons::UNSUPPORTED_VALUE,
                    format!("tls must not be set on a {} listener", listener.protocol),
                ));
            }
        }
        Protocol::Tls => match mode {
            Some(tls_modes::PASSTHROUGH) => {}
            Some(tls_modes::TERMINATE) => verdict.not_accepted.push(Problem::new(
                reasons::UNSUPPORTED_VALUE,
                "TLS listeners only pass TLS through: tls.mode Terminate is not supported (use HTTPS)",
            )),
            other => verdict.not_accepted.push(Problem::new(
                reasons::UNSUPPORTED_VALUE,
                format!("TLS listeners need tls.mode Passthrough, not {other:?}"),
            )),
        },
        Protocol::Https => {
            let Some(tls) = tls else {
                verdict.unresolved.push(Problem::new(
                    reasons::INVALID_CERTIFICATE_REF,
                    "an HTTPS listener needs tls.certificateRefs",
                ));
                return;
            };
            if mode.unwrap_or(tls_modes::TERMINATE) != tls_modes::TERMINATE {
                verdict.not_accepted.push(Problem::new(
                    reasons::UNSUPPORTED_VALUE,
                    "HTTPS listeners terminate TLS: tls.mode must be Terminate",
                ));
            }
            if !tls.options.is_empty() {
                let names: Vec<&str> = tls.options.keys().map(String::as_str).collect();
                verdict.not_accepted.push(Problem::new(
                    reasons::UNSUPPORTED_VALUE,
                    format!("tls.options are not supported: {}", names.join(", ")),
                ));
            }
            if tls.certificate_refs.is_empty() {
                verdict.unresolved.push(Problem::new(
                    reasons::INVALID_CERTIFICATE_REF,
                    "an HTTPS listener needs tls.certificateRefs",
                ));
            }
            for reference in &tls.certificate_refs {
                match resolve_certificate(reference, gateway_namespace, grants, facts) {
                    Ok(key) => verdict.certificates.push(key),
                    Err(problem) => verdict.unresolved.push(problem),
                }
            }
        }
    }
}

/// A certificateRef must name a core Secret, in the Gateway's namespace or one whose
/// ReferenceGrant allows it, that holds a usable TLS key pair. A refused cross-namespace
/// reference says RefNotPermitted without revealing whether the Secret exists.
fn resolve_certificate(
    reference: &SecretObjectReference,
    gateway_namespace: &str,
    grants: &[ReferenceGrant],
    facts: &ClusterFacts,
) -> Result<ObjectKey, Problem> {
    let group = reference.group.as_deref().unwrap_or(CORE_GROUP);
    let kind = reference.kind.as_deref().unwrap_or(kinds::SECRET);
    let namespace = reference.namespace.as_deref().unwrap_or(gateway_namespace);
    let key = ObjectKey::new(namespace, reference.name.as_str());
    if group != CORE_GROUP || kind != kinds::SECRET {
        return Err(Problem::new(
            reasons::INVALID_CERTIFICATE_REF,
            format!(
                "certificateRef {key} is a {kind} of group {group:?}; only core Secrets are supported"
            ),
        ));
    }
    let allowed = grants::permitted(
        grants,
        grants::From {
            group: GROUP,
            kind: kinds::GATEWAY,
            namespace: gateway_namespace,
        },
        grants::To {
            group: CORE_GROUP,
            kind: kinds::SECRET,
            namespace,
            name: &reference.name,
        },
    );
    if !allowed {
        return Err(Problem::new(
            reasons::REF_NOT_PERMITTED,
            format!(
                "certificateRef to Secret {key} is not permitted by a ReferenceGrant in {namespace}"
            ),
        ));
    }
    match facts.secrets.get(&key) {
        Some(SecretFact::TlsKeyPair) => Ok(key),
        Some(SecretFact::Unusable(why)) => Err(Problem::new(
            reasons::INVALID_CERTIFICATE_REF,
            format!("Secret {key} is not a usable TLS key pair: {why}"),
        )),
        None => Err(Problem::new(
            reasons::INVALID_CERTIFICATE_REF,
            format!("Secret {key} not found"),
        )),
    }
}

/// `supportedKinds`: the listed kinds this protocol can serve (all of them when none are
/// listed); any other listed kind makes `ResolvedRefs=False` (InvalidRouteKinds).
fn allowed_kinds(listener: &Listener, protocol: Protocol, verdict: &mut ListenerVerdict) {
    let servable = protocol.route_kinds();
    let listed = listener
        .allowed_routes
        .as_ref()
        .map(|a| a.kinds.as_slice())
        .unwrap_or_default();
    if listed.is_empty() {
        verdict.supported_kinds = servable.to_vec();
        return;
    }
    let mut invalid = Vec::new();
    for entry in listed {
        let group = entry.group.as_deref().unwrap_or(GROUP);
        match RouteKind::parse(&entry.kind).filter(|k| group == GROUP && servable.contains(k)) {
            Some(kind) if !verdict.supported_kinds.contains(&kind) => {
                verdict.supported_kinds.push(kind);
            }
            Some(_) => {}
            None => invalid.push(format!("{group}/{}", entry.kind)),
        }
    }
    if !invalid.is_empty() {
        verdict.unresolved.push(Problem::new(
            reasons::INVALID_ROUTE_KINDS,
            format!(
                "route kinds {} cannot attach to a {} listener",
                invalid.join(", "),
                listener.protocol
            ),
        ));
    }
}

fn namespace_policy(listener: &Listener) -> Result<NamespacePolicy, Problem> {
    let namespaces = listener
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let from = namespaces
        .and_then(|n| n.from.as_deref())
        .unwrap_or(from_namespaces::SAME);
    match from {
        from_namespaces::SAME => Ok(NamespacePolicy::Same),
        from_namespaces::ALL => Ok(NamespacePolicy::All),
        from_namespaces::SELECTOR => {
            let Some(s) = namespaces.and_then(|n| n.selector.as_ref()) else {
                return Err(Problem::new(
                    reasons::UNSUPPORTED_VALUE,
                    "allowedRoutes.namespaces.from is Selector but no selector is given",
                ));
            };
            selector::validate(s).map_err(|e| {
                Problem::new(
                    reasons::UNSUPPORTED_VALUE,
                    format!("allowedRoutes.namespaces.{e}"),
                )
            })?;
            Ok(NamespacePolicy::Selector(s.clone()))
        }
        other => Err(Problem::new(
            reasons::UNSUPPORTED_VALUE,
            format!(
                "allowedRoutes.namespaces.from {other:?} is not supported (All, Selector, Same are)"
            ),
        )),
    }
}

/// Distinct listeners (spec `listeners` doc): on one port, protocols must be of one family
/// (else every listener there is ProtocolConflict), and listeners of that family must differ
/// in hostname (else those with the same one are HostnameConflict). No winner is picked:
/// every indistinct listener is refused. Unsupported protocols take no part.
fn mark_conflicts(verdicts: &mut [ListenerVerdict]) {
    let mut by_port: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, v) in verdicts.iter().enumerate() {
        if v.protocol.is_some() {
            by_port.entry(v.port).or_default().push(i);
        }
    }
    for (port, indices) in by_port {
        let families: BTreeSet<u8> = indices
            .iter()
            .filter_map(|&i| verdicts[i].protocol.map(Protocol::family))
            .collect();
        if families.len() > 1 {
            let names = listener_names(verdicts, &indices);
            for &i in &indices {
                verdicts[i].conflict = Some(Problem::new(
                    reasons::PROTOCOL_CONFLICT,
                    format!(
                        "port {port} is shared by listeners of incompatible protocols ({names})"
                    ),
                ));
            }
            continue;
        }
        let mut by_hostname: BTreeMap<Option<String>, Vec<usize>> = BTreeMap::new();
        for &i in &indices {
            by_hostname
                .entry(verdicts[i].hostname.clone())
                .or_default()
                .push(i);
        }
        for (hostname, same) in by_hostname.into_iter().filter(|(_, same)| same.len() > 1) {
            let names = listener_names(verdicts, &same);
            let shown = hostname.as_deref().unwrap_or("(any)");
            for &i in &same {
                verdicts[i].conflict = Some(Problem::new(
                    reasons::HOSTNAME_CONFLICT,
                    format!("listeners {names} on port {port} have the same hostname {shown}"),
                ));
            }
        }
    }
}

fn listener_names(verdicts: &[ListenerVerdict], indices: &[usize]) -> String {
    indices
        .iter()
        .map(|&i| verdicts[i].name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `OverlappingTLSConfig`: HTTPS listeners on one port whose hostnames can match the same
/// name (e.g. `*.example.com` and `foo.example.com`) — a connection coalesced by a client
/// may reach the other listener's routes with the first one's certificate.
fn mark_overlapping_tls(verdicts: &mut [ListenerVerdict]) {
    let https: Vec<usize> = (0..verdicts.len())
        .filter(|&i| {
            verdicts[i].protocol == Some(Protocol::Https) && verdicts[i].conflict.is_none()
        })
        .collect();
    for &a in &https {
        let overlapping: Vec<&str> = https
            .iter()
            .filter(|&&b| {
                b != a
                    && verdicts[b].port == verdicts[a].port
                    && hostnames::overlap(
                        verdicts[a].hostname.as_deref(),
                        verdicts[b].hostname.as_deref(),
                    )
            })
            .map(|&b| verdicts[b].name.as_str())
            .collect();
        if !overlapping.is_empty() {
            let message = format!(
                "hostname overlaps with listener(s) {} on port {}",
                overlapping.join(", "),
                verdicts[a].port
            );
            verdicts[a].overlapping_tls = Some(message);
        }
    }
}
