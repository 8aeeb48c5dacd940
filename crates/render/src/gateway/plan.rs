//! The data plan of one Gateway: what its agent serves, as plain data. Only listeners that
//! are Accepted, not Conflicted and whose references resolved are in it; only routes Accepted
//! on them contribute.
//!
//! How the data plane uses it:
//! - A connection on a port is assigned to one listener: the listeners of a port are ordered
//!   most specific hostname first (precise, then wildcards by labels, then none); the first
//!   whose hostname matches the SNI (TLS, HTTPS) or Host header (HTTP) takes it (listener
//!   isolation: a request never falls through to another listener).
//! - Within an HTTP(S) listener, the virtual hosts whose hostname matches the Host header are
//!   tried most specific first, and within each the entries in order: the first entry whose
//!   match holds decides. Nothing matches: 404.
//! - An entry's action: a fixed response if set, else a redirect if set, else the request
//!   (after its header and URL changes) goes to one backend chosen by weight; an invalid
//!   backend's share is answered with 500.
//! - TLS passthrough: the first SNI route (most specific hostname first) matching the SNI
//!   gets the connection, unmodified, forwarded to a backend by weight; none: the connection
//!   is closed.
//! - TCP: every connection goes to a backend of the listener's route by weight; no route or
//!   only invalid backends: the connection is closed.

use serde::Serialize;

use crate::backends::ObjectKey;

use super::RouteKind;

/// Everything the Gateway's agent serves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayPlan {
    /// Ordered by port, then hostname precedence within a port.
    pub listeners: Vec<ListenerPlan>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerPlan {
    pub name: String,
    pub port: u16,
    /// `None`: every hostname.
    pub hostname: Option<String>,
    pub serve: ListenerServe,
}

/// What a listener does with its connections.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "protocol")]
pub enum ListenerServe {
    /// Cleartext HTTP (the tailnet's WireGuard already encrypts and identifies the peer).
    Http(HttpServe),
    /// TLS terminated with the listed Secrets (`kubernetes.io/tls`), then HTTP.
    Https {
        certificates: Vec<ObjectKey>,
        #[serde(flatten)]
        http: HttpServe,
    },
    /// TLS passed through unmodified, by SNI.
    TlsPassthrough { routes: Vec<SniRoute> },
    /// Plain TCP forwarding; `None`: no route attached (connections are closed).
    Tcp { route: Option<TcpForward> },
}

/// The HTTP routing of one listener.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpServe {
    /// Most specific hostname first.
    pub virtual_hosts: Vec<VirtualHost>,
    /// The actions the entries point at (one per valid rule of each attached route).
    pub actions: Vec<HttpAction>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualHost {
    /// Precise, `*.`-prefixed, or `None` for every hostname.
    pub hostname: Option<String>,
    /// In precedence order: the first whose match holds decides.
    pub entries: Vec<HttpEntry>,
}

/// One match of one rule, pointing at the rule's action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpEntry {
    pub path: PathMatch,
    /// Upper-case method; `None`: any.
    pub method: Option<String>,
    /// Exact matches; names lower-cased (matched case-insensitively), first of a name only.
    pub headers: Vec<NameValue>,
    /// Exact matches; names case-sensitive, first of a name only.
    pub query_params: Vec<NameValue>,
    /// Index into [`HttpServe::actions`].
    pub action: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase", tag = "type", content = "value")]
pub enum PathMatch {
    /// The whole path, case-sensitive.
    Exact(String),
    /// Whole path segments: `/abc` matches `/abc`, `/abc/` and `/abc/def`, not `/abcd`.
    /// Stored without a trailing `/` (except `/` itself).
    PathPrefix(String),
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NameValue {
    pub name: String,
    pub value: String,
}

/// What one rule does with a request it matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpAction {
    /// The route and rule this comes from (for logs and metrics).
    pub route: ObjectKey,
    pub rule_index: usize,
    pub rule_name: Option<String>,
    pub request_headers: HeaderChanges,
    pub response_headers: HeaderChanges,
    pub url_rewrite: Option<UrlRewrite>,
    pub outcome: HttpOutcome,
    /// Milliseconds; `Some(0)` disables the timeout.
    pub request_timeout_ms: Option<u64>,
    pub backend_request_timeout_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum HttpOutcome {
    /// Answer with this status and no body (an unresolvable ExtensionRef filter, a rule
    /// without backends, all weights 0: 500).
    Fixed {
        status: u16,
    },
    Redirect(Redirect),
    /// Forward to one backend chosen by weight (weights > 0 only; at least one).
    Forward {
        backends: Vec<HttpBackend>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpBackend {
    pub weight: u32,
    pub target: BackendTarget,
    /// Header changes only for requests sent to this backend (after the rule's).
    pub request_headers: HeaderChanges,
    pub response_headers: HeaderChanges,
}

/// Header changes: `set` replaces, `add` appends, `remove` deletes (names compared
/// case-insensitively; one action per name).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderChanges {
    pub set: Vec<NameValue>,
    pub add: Vec<NameValue>,
    pub remove: Vec<String>,
}

impl HeaderChanges {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Redirect {
    /// `http`/`https`; `None`: the request's.
    pub scheme: Option<String>,
    /// `None`: the request's Host.
    pub hostname: Option<String>,
    pub path: Option<PathRewrite>,
    /// `None`: derived as the spec says (the scheme's well-known port when `scheme` is set,
    /// else the listener's port; omitted from Location when it is the scheme's default).
    pub port: Option<u16>,
    pub status_code: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UrlRewrite {
    /// Replaces the Host header.
    pub hostname: Option<String>,
    pub path: Option<PathRewrite>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "type", content = "value")]
pub enum PathRewrite {
    ReplaceFullPath(String),
    /// Replaces the matched prefix (whole segments); only on PathPrefix matches.
    ReplacePrefixMatch(String),
}

/// A TLSRoute's hostname on a passthrough listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SniRoute {
    /// Precise or `*.`-prefixed (TLSRoutes always name hostnames).
    pub hostname: String,
    pub route: ObjectKey,
    pub backends: Vec<WeightedBackend>,
}

/// The TCPRoute a TCP listener forwards to (the oldest attached one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpForward {
    pub route: ObjectKey,
    pub backends: Vec<WeightedBackend>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WeightedBackend {
    pub weight: u32,
    pub target: BackendTarget,
}

/// Where traffic for one backendRef goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum BackendTarget {
    /// `name.namespace.svc` on `port`.
    Service {
        namespace: String,
        name: String,
        port: u16,
    },
    /// A backendRef that did not resolve (reason as in the route's `ResolvedRefs`): HTTP
    /// answers 500 for its share, TLS/TCP close the connection.
    Invalid { reason: String },
}

/// Identifies a route in outputs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteId {
    pub kind: RouteKind,
    pub namespace: String,
    pub name: String,
}
