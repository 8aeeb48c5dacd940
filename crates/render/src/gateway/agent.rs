//! The Gateway's data plan ([`GatewayPlan`]) as the agent's listeners (pure).
//!
//! - Ports: a Gateway listener's port is the port on the tailnet node; tailscaled (userspace
//!   networking) hands each tailnet connection to the same port on loopback, where the agent
//!   listens — as for TailnetIngress exposes. Several Gateway listeners on one port become one
//!   agent listener.
//! - HTTP/HTTPS: every virtual host of a Gateway listener becomes one agent [`HttpRoute`]
//!   whose hostname is the virtual host's pattern (`*` for "every hostname") and whose `rules`
//!   are the entries of that virtual host followed by those of the listener's less specific
//!   virtual hosts that also match it (Gateway API hostname precedence: a request for
//!   `foo.example.com` falls through from `foo.example.com` to `*.example.com` and `*`). The
//!   agent picks the most specific matching pattern, and of equal patterns the first one
//!   keeps its route: listeners are inserted most specific first, and a pattern that a more
//!   specific listener of the port captures is left out, so a request never reaches another
//!   listener's routes (listener isolation).
//! - TLS passthrough: one `tlsPassthrough` listener per port, its SNI routes in listener
//!   precedence order under the same isolation rule.
//! - TCP: one `tcp` listener per port, to the attached route's backend.
//!
//! What the agent cannot express is left out and said in [`GatewayAgent::notes`] (never
//! silently): per-backend header filters on a rule with several backends, more than one
//! backend of a TCP route (the heaviest valid one is used), a second protocol on one port.

use std::collections::BTreeMap;

use tailnet_api::agent_config::{
    self, BackendAddress, HeaderModifier, HeaderValue, HttpFilter, HttpRequestMatch, HttpRoute,
    HttpRule, IngressListener, MAX_RULES_PER_ROUTE, PassthroughRoute, PathModifier,
    PathModifierType, RedirectScheme, RequestRedirect, TlsFiles, ValueMatch, ValueMatchType,
};

use super::hostnames;
use super::plan::{
    BackendTarget, GatewayPlan, HeaderChanges, HttpAction, HttpBackend, HttpEntry, HttpOutcome,
    HttpServe, ListenerPlan, ListenerServe, NameValue, PathMatch, PathRewrite, SniRoute,
    TcpForward, WeightedBackend,
};
use crate::backends::ObjectKey;

/// The hostname pattern of the agent for "every hostname".
const EVERY_HOSTNAME: &str = "*";

/// The agent's part of a Gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayAgent {
    /// Sorted by port.
    pub listeners: Vec<IngressListener>,
    /// The default certificate of the `http` (TLS-terminating) listeners: a ClientHello
    /// without SNI gets it; each route carries its own listener's (`HttpRoute.tls`).
    pub tls: Option<TlsFiles>,
    /// The backend Services the agent dials (`namespace/name`, port), sorted and unique: its
    /// egress NetworkPolicy admits them.
    pub backends: Vec<(ObjectKey, u16)>,
    /// What the plan asks for and the agent cannot do (left out).
    pub notes: Vec<String>,
}

/// The agent's listeners for `plan`. `certificates` gives the files of each certificate Secret
/// as the agent mounts them; `cluster_domain` addresses the backend Services.
pub fn agent_listeners(
    plan: &GatewayPlan,
    cluster_domain: &str,
    certificates: &BTreeMap<ObjectKey, TlsFiles>,
) -> GatewayAgent {
    let mut out = GatewayAgent::default();
    let mut by_port: BTreeMap<u16, Vec<&ListenerPlan>> = BTreeMap::new();
    for listener in &plan.listeners {
        by_port.entry(listener.port).or_default().push(listener);
    }
    let mut backends = Backends {
        cluster_domain,
        used: Vec::new(),
    };
    for (port, mut listeners) in by_port {
        // Most specific hostname first (the plan's order already; made sure here).
        listeners.sort_by(|a, b| {
            hostnames::by_precedence(a.hostname.as_deref(), b.hostname.as_deref())
                .then_with(|| a.name.cmp(&b.name))
        });
        if let Some(listener) =
            port_listener(port, &listeners, &mut backends, certificates, &mut out)
        {
            out.listeners.push(listener);
        }
    }
    out.tls = choose_certificate(plan, certificates, &mut out.notes);
    backends.used.sort();
    backends.used.dedup();
    out.backends = backends.used;
    out
}

/// Addresses backend Services and records which were used.
struct Backends<'a> {
    cluster_domain: &'a str,
    used: Vec<(ObjectKey, u16)>,
}

impl Backends<'_> {
    /// The agent's address of a target; `None` for an invalid backend.
    fn address(&mut self, target: &BackendTarget) -> Option<BackendAddress> {
        match target {
            BackendTarget::Service {
                namespace,
                name,
                port,
            } => {
                self.used.push((ObjectKey::new(namespace, name), *port));
                Some(BackendAddress {
                    host: format!("{name}.{namespace}.svc.{}", self.cluster_domain),
                    port: *port,
                })
            }
            BackendTarget::Invalid { .. } => None,
        }
    }

    fn weighted(&mut self, backends: &[WeightedBackend]) -> Vec<agent_config::WeightedBackend> {
        backends
            .iter()
            .map(|b| agent_config::WeightedBackend {
                backend: self.address(&b.target),
                weight: b.weight,
                backend_tls: None,
            })
            .collect()
    }
}

/// The one agent listener of a port: the protocol of its most specific Gateway listener;
/// listeners of another protocol on the port are left out (noted).
fn port_listener(
    port: u16,
    listeners: &[&ListenerPlan],
    backends: &mut Backends<'_>,
    certificates: &BTreeMap<ObjectKey, TlsFiles>,
    out: &mut GatewayAgent,
) -> Option<IngressListener> {
    let first = listeners.first()?;
    let kind = protocol_of(&first.serve);
    let (same, other): (Vec<&ListenerPlan>, Vec<&ListenerPlan>) = listeners
        .iter()
        .copied()
        .partition(|l| protocol_of(&l.serve) == kind);
    for l in other {
        out.notes.push(format!(
            "listener {} ({}) is not served: port {port} already serves {} (listener {})",
            l.name,
            protocol_of(&l.serve),
            kind,
            first.name
        ));
    }
    match &first.serve {
        ListenerServe::Http(_) => Some(IngressListener::PlainHttp {
            port,
            routes: http_routes(&same, backends, certificates, &mut out.notes),
        }),
        ListenerServe::Https { .. } => Some(IngressListener::Http {
            port,
            routes: http_routes(&same, backends, certificates, &mut out.notes),
        }),
        ListenerServe::TlsPassthrough { .. } => Some(IngressListener::TlsPassthrough {
            port,
            routes: passthrough_routes(&same, backends),
        }),
        ListenerServe::Tcp { route } => tcp_listener(port, first, route.as_ref(), backends, out),
    }
}

fn protocol_of(serve: &ListenerServe) -> &'static str {
    match serve {
        ListenerServe::Http(_) => "HTTP",
        ListenerServe::Https { .. } => "HTTPS",
        ListenerServe::TlsPassthrough { .. } => "TLS",
        ListenerServe::Tcp { .. } => "TCP",
    }
}

/// Whether a more specific listener of the port (one of `earlier`) takes requests for
/// `pattern`: then this listener must not serve it (listener isolation).
fn captured_by_earlier(pattern: Option<&str>, earlier: &[&ListenerPlan]) -> bool {
    earlier
        .iter()
        .any(|l| match (l.hostname.as_deref(), pattern) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(listener), Some(pattern)) => hostnames::matches(listener, pattern),
        })
}

fn http_serve(listener: &ListenerPlan) -> Option<&HttpServe> {
    match &listener.serve {
        ListenerServe::Http(serve) | ListenerServe::Https { http: serve, .. } => Some(serve),
        ListenerServe::TlsPassthrough { .. } | ListenerServe::Tcp { .. } => None,
    }
}

/// The certificate an HTTPS listener's routes are served with: the first of its
/// `certificateRefs` the agent has (`None` for plain HTTP, or none mounted: then the
/// Gateway's default certificate).
fn listener_certificate(
    listener: &ListenerPlan,
    certificates: &BTreeMap<ObjectKey, TlsFiles>,
) -> Option<TlsFiles> {
    match &listener.serve {
        ListenerServe::Https {
            certificates: refs, ..
        } => refs.iter().find_map(|r| certificates.get(r)).cloned(),
        _ => None,
    }
}

/// The agent routes of the HTTP(S) listeners of one port, most specific listener first; an
/// HTTPS listener's routes carry its certificate (chosen by SNI in the agent).
fn http_routes(
    listeners: &[&ListenerPlan],
    backends: &mut Backends<'_>,
    certificates: &BTreeMap<ObjectKey, TlsFiles>,
    notes: &mut Vec<String>,
) -> Vec<HttpRoute> {
    let mut routes: Vec<HttpRoute> = Vec::new();
    for (i, listener) in listeners.iter().enumerate() {
        let Some(serve) = http_serve(listener) else {
            continue;
        };
        let tls = listener_certificate(listener, certificates);
        let earlier = &listeners[..i];
        let mut hosts: Vec<_> = serve.virtual_hosts.iter().collect();
        hosts
            .sort_by(|a, b| hostnames::by_precedence(a.hostname.as_deref(), b.hostname.as_deref()));
        for (h, host) in hosts.iter().enumerate() {
            let pattern = host.hostname.as_deref();
            if captured_by_earlier(pattern, earlier) {
                continue;
            }
            let agent_pattern = pattern.unwrap_or(EVERY_HOSTNAME).to_string();
            if routes.iter().any(|r| r.hostnames.contains(&agent_pattern)) {
                continue;
            }
            // This virtual host's entries, then those of the less specific ones matching it.
            let entries =
                hosts[h..]
                    .iter()
                    .filter(|other| match (other.hostname.as_deref(), pattern) {
                        (None, _) => true,
                        (Some(_), None) => false,
                        (Some(wider), Some(name)) => hostnames::matches(wider, name),
                    });
            let mut rules: Vec<HttpRule> = entries
                .flat_map(|other| other.entries.iter())
                .filter_map(|entry| {
                    let action = serve.actions.get(entry.action)?;
                    Some(http_rule(entry, action, backends, &listener.name, notes))
                })
                .collect();
            if rules.len() > MAX_RULES_PER_ROUTE {
                notes.push(format!(
                    "listener {} hostname {agent_pattern}: {} rules, only the first {MAX_RULES_PER_ROUTE} are served",
                    listener.name,
                    rules.len()
                ));
                rules.truncate(MAX_RULES_PER_ROUTE);
            }
            routes.push(agent_route(
                &listener.name,
                agent_pattern,
                tls.clone(),
                rules,
            ));
        }
        // The listener's own hostname (or every name) without a route of its own: a route
        // without rules, so a handshake for such a name completes with the listener's
        // certificate and its requests get 404 (Gateway API), not a refused handshake.
        let own = listener.hostname.as_deref();
        let agent_pattern = own.unwrap_or(EVERY_HOSTNAME).to_string();
        if !captured_by_earlier(own, earlier)
            && !routes.iter().any(|r| r.hostnames.contains(&agent_pattern))
        {
            routes.push(agent_route(&listener.name, agent_pattern, tls, Vec::new()));
        }
    }
    routes
}

/// The agent route of one hostname pattern of a listener (no rules: every request is 404),
/// served with `tls` (`None`: the agent-level certificate, or plain HTTP).
fn agent_route(
    listener: &str,
    pattern: String,
    tls: Option<TlsFiles>,
    rules: Vec<HttpRule>,
) -> HttpRoute {
    HttpRoute {
        name: format!("{listener}/{pattern}"),
        hostnames: vec![pattern],
        tls,
        backend: None,
        backend_tls: None,
        request_timeout_seconds: None,
        backend_request_timeout_seconds: None,
        request_timeout_millis: None,
        backend_request_timeout_millis: None,
        rules,
    }
}

/// One entry (one match of one rule) with its rule's action.
fn http_rule(
    entry: &HttpEntry,
    action: &HttpAction,
    backends: &mut Backends<'_>,
    listener: &str,
    notes: &mut Vec<String>,
) -> HttpRule {
    let mut request_headers = action.request_headers.clone();
    let mut response_headers = action.response_headers.clone();
    let mut filters = Vec::new();
    let mut weighted = Vec::new();
    match &action.outcome {
        // No backends: the agent answers 500.
        HttpOutcome::Fixed { .. } => {}
        HttpOutcome::Redirect(redirect) => {
            filters.push(HttpFilter::RequestRedirect(RequestRedirect {
                scheme: redirect.scheme.as_deref().and_then(redirect_scheme),
                hostname: redirect.hostname.clone(),
                port: redirect.port,
                path: redirect.path.as_ref().map(path_modifier),
                status_code: Some(redirect.status_code),
            }));
        }
        HttpOutcome::Forward { backends: list } => {
            fold_backend_headers(
                list,
                &mut request_headers,
                &mut response_headers,
                action,
                listener,
                notes,
            );
            weighted = list
                .iter()
                .map(|b| agent_config::WeightedBackend {
                    backend: backends.address(&b.target),
                    weight: b.weight,
                    backend_tls: None,
                })
                .collect();
        }
    }
    let mut all_filters = Vec::new();
    if !request_headers.is_empty() {
        all_filters.push(HttpFilter::RequestHeaderModifier(header_modifier(
            &request_headers,
        )));
    }
    if !response_headers.is_empty() {
        all_filters.push(HttpFilter::ResponseHeaderModifier(header_modifier(
            &response_headers,
        )));
    }
    if let Some(rewrite) = &action.url_rewrite {
        all_filters.push(HttpFilter::UrlRewrite(agent_config::UrlRewrite {
            hostname: rewrite.hostname.clone(),
            path: rewrite.path.as_ref().map(path_modifier),
        }));
    }
    all_filters.extend(filters);
    HttpRule {
        matches: vec![request_match(entry)],
        filters: all_filters,
        backends: weighted,
        // 0 switches the timeout off: the agent's default (none) then.
        request_timeout_millis: action.request_timeout_ms.filter(|ms| *ms > 0),
        backend_request_timeout_millis: action.backend_request_timeout_ms.filter(|ms| *ms > 0),
    }
}

/// Per-backend header changes: the agent has them per rule only, so they are the rule's when
/// the rule has one backend and sets no change of that direction itself; otherwise they are
/// left out (noted).
fn fold_backend_headers(
    list: &[HttpBackend],
    request: &mut HeaderChanges,
    response: &mut HeaderChanges,
    action: &HttpAction,
    listener: &str,
    notes: &mut Vec<String>,
) {
    let with_changes = list
        .iter()
        .filter(|b| !b.request_headers.is_empty() || !b.response_headers.is_empty())
        .count();
    if with_changes == 0 {
        return;
    }
    if let [only] = list
        && (only.request_headers.is_empty() || request.is_empty())
        && (only.response_headers.is_empty() || response.is_empty())
    {
        if !only.request_headers.is_empty() {
            *request = only.request_headers.clone();
        }
        if !only.response_headers.is_empty() {
            *response = only.response_headers.clone();
        }
        return;
    }
    notes.push(format!(
        "listener {listener}: HTTPRoute {} rule {}: header filters on backendRefs are not applied (the agent applies header filters per rule; use one backendRef or rule filters)",
        action.route, action.rule_index
    ));
}

fn redirect_scheme(scheme: &str) -> Option<RedirectScheme> {
    match scheme {
        "http" => Some(RedirectScheme::Http),
        "https" => Some(RedirectScheme::Https),
        _ => None,
    }
}

fn path_modifier(path: &PathRewrite) -> PathModifier {
    match path {
        PathRewrite::ReplaceFullPath(value) => PathModifier {
            kind: PathModifierType::ReplaceFullPath,
            value: value.clone(),
        },
        PathRewrite::ReplacePrefixMatch(value) => PathModifier {
            kind: PathModifierType::ReplacePrefixMatch,
            value: value.clone(),
        },
    }
}

fn header_values(list: &[NameValue]) -> Vec<HeaderValue> {
    list.iter()
        .map(|nv| HeaderValue {
            name: nv.name.clone(),
            value: nv.value.clone(),
        })
        .collect()
}

fn header_modifier(changes: &HeaderChanges) -> HeaderModifier {
    HeaderModifier {
        set: header_values(&changes.set),
        add: header_values(&changes.add),
        remove: changes.remove.clone(),
    }
}

fn exact(list: &[NameValue]) -> Vec<ValueMatch> {
    list.iter()
        .map(|nv| ValueMatch {
            kind: ValueMatchType::Exact,
            name: nv.name.clone(),
            value: nv.value.clone(),
        })
        .collect()
}

fn request_match(entry: &HttpEntry) -> HttpRequestMatch {
    let path = match &entry.path {
        PathMatch::Exact(value) => agent_config::PathMatch {
            kind: agent_config::PathMatchType::Exact,
            value: value.clone(),
        },
        PathMatch::PathPrefix(value) => agent_config::PathMatch {
            kind: agent_config::PathMatchType::PathPrefix,
            value: value.clone(),
        },
    };
    HttpRequestMatch {
        path: Some(path),
        headers: exact(&entry.headers),
        query_params: exact(&entry.query_params),
        method: entry.method.clone(),
    }
}

/// The SNI routes of the TLS listeners of one port, most specific listener first; a hostname
/// a more specific listener captures (or another listener has already) is left out.
fn passthrough_routes(
    listeners: &[&ListenerPlan],
    backends: &mut Backends<'_>,
) -> Vec<PassthroughRoute> {
    let mut routes: Vec<PassthroughRoute> = Vec::new();
    for (i, listener) in listeners.iter().enumerate() {
        let ListenerServe::TlsPassthrough { routes: sni } = &listener.serve else {
            continue;
        };
        let earlier = &listeners[..i];
        for SniRoute {
            hostname,
            route,
            backends: list,
        } in sni
        {
            if captured_by_earlier(Some(hostname), earlier)
                || routes.iter().any(|r| r.hostnames.contains(hostname))
            {
                continue;
            }
            routes.push(PassthroughRoute {
                name: format!("{}/{route}", listener.name),
                hostnames: vec![hostname.clone()],
                backends: backends.weighted(list),
            });
        }
    }
    routes
}

/// A TCP listener to the route's backends: several are chosen per connection by weight
/// (`backends`, an unresolved one's share closed), `backend` is the heaviest valid one (the
/// agent probes it); no route or no valid backend: no listener (noted).
fn tcp_listener(
    port: u16,
    listener: &ListenerPlan,
    route: Option<&TcpForward>,
    backends: &mut Backends<'_>,
    out: &mut GatewayAgent,
) -> Option<IngressListener> {
    let Some(route) = route else {
        out.notes.push(format!(
            "listener {} (TCP, port {port}): no TCPRoute attached; the port is not served",
            listener.name
        ));
        return None;
    };
    let valid: Vec<&WeightedBackend> = route
        .backends
        .iter()
        .filter(|b| matches!(b.target, BackendTarget::Service { .. }))
        .collect();
    let Some(chosen) = valid.iter().max_by(|a, b| {
        a.weight
            .cmp(&b.weight)
            .then_with(|| b.target_key().cmp(&a.target_key()))
    }) else {
        out.notes.push(format!(
            "listener {} (TCP, port {port}): TCPRoute {} has no valid backend; the port is not served",
            listener.name, route.route
        ));
        return None;
    };
    let backend = backends.address(&chosen.target)?;
    let weighted = if route.backends.len() > 1 {
        backends.weighted(&route.backends)
    } else {
        Vec::new()
    };
    Some(IngressListener::Tcp {
        port,
        name: listener.name.clone(),
        backend,
        backends: weighted,
    })
}

impl WeightedBackend {
    /// `namespace/name:port` of a Service target (ties of weights are broken by it).
    fn target_key(&self) -> String {
        match &self.target {
            BackendTarget::Service {
                namespace,
                name,
                port,
            } => format!("{namespace}/{name}:{port}"),
            BackendTarget::Invalid { reason } => format!("invalid ({reason})"),
        }
    }
}

/// The Gateway's default certificate (agent-level `tls`, for a ClientHello without SNI): the
/// first certificate of the most specific HTTPS listener. Each listener's routes carry their
/// own ([`listener_certificate`]); a listener none of whose certificates is mounted is noted
/// (its routes fall back to this one, never to plaintext).
fn choose_certificate(
    plan: &GatewayPlan,
    certificates: &BTreeMap<ObjectKey, TlsFiles>,
    notes: &mut Vec<String>,
) -> Option<TlsFiles> {
    let mut default = None;
    for listener in &plan.listeners {
        let ListenerServe::Https {
            certificates: refs, ..
        } = &listener.serve
        else {
            continue;
        };
        match listener_certificate(listener, certificates) {
            Some(files) => {
                default.get_or_insert(files);
            }
            None => {
                let named: Vec<String> = refs.iter().map(ToString::to_string).collect();
                notes.push(format!(
                    "listener {}: certificate Secret {} is not mounted; its routes are served with the Gateway's default certificate",
                    listener.name,
                    named.join(", ")
                ));
            }
        }
    }
    default
}

#[cfg(test)]
#[path = "tests/agent_config.rs"]
mod tests;
