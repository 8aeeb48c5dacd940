//! What an `http` or `plainHttp` listener serves for one config generation: the virtual
//! hosts, each route's compiled rules with their backends (connection pools), timeouts and
//! metric handles, and the TLS acceptor (none for plain HTTP).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::uri::Authority;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use tailnet_api::agent_config::{BackendAddress, BackendTlsFiles, HttpRoute};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::backend::{BackendConnector, BackendTls};
use crate::body::ProxyBody;
use crate::http_rules::{CompileError, CompiledRule};
use crate::metrics::{Metrics, RuleRequestLabels};
use crate::routing::RouteTable;
use crate::tls::{CaBundle, ListenerCertificates, TlsError, server_config};

const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Defaults for what a route leaves open.
#[derive(Clone, Copy, Debug)]
pub struct ProxyDefaults {
    pub backend_request_timeout: Duration,
    pub backend_connect_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    #[error("TLS server configuration")]
    Tls(#[from] TlsError),
    #[error("route rules")]
    Rules(#[from] CompileError),
}

/// Everything an `http` or `plainHttp` listener serves for one config generation.
pub struct HttpSite {
    pub listener: String,
    /// Serves in-cluster clients on the pod IP (split horizon): their connections are never
    /// looked up in tailscaled (no tailnet identity headers; the ones a client sends are
    /// dropped as always).
    pub(crate) in_cluster: bool,
    pub(crate) routes: RouteTable,
    /// `None`: plain HTTP.
    pub(crate) acceptor: Option<TlsAcceptor>,
    /// By route index (as in `routes`).
    pub(crate) served: Vec<SiteRoute>,
}

/// The site a connection serves its requests with: a fixed one, or its listener's current
/// one, so that a route change applies to the next request of an established (keep-alive,
/// HTTP/2) connection too; its TLS session keeps the certificate it was opened with.
#[derive(Clone)]
pub enum LiveSite {
    Fixed(Arc<HttpSite>),
    Following(watch::Receiver<Arc<HttpSite>>),
}

impl LiveSite {
    pub fn current(&self) -> Arc<HttpSite> {
        match self {
            LiveSite::Fixed(site) => site.clone(),
            LiveSite::Following(receiver) => receiver.borrow().clone(),
        }
    }
}

impl From<Arc<HttpSite>> for LiveSite {
    fn from(site: Arc<HttpSite>) -> Self {
        LiveSite::Fixed(site)
    }
}

impl From<watch::Receiver<Arc<HttpSite>>> for LiveSite {
    fn from(receiver: watch::Receiver<Arc<HttpSite>>) -> Self {
        LiveSite::Following(receiver)
    }
}

/// One route's rules, ready to serve.
pub(crate) struct SiteRoute {
    /// For metrics and logs (shared, not copied per request).
    pub name: Arc<str>,
    pub rules: Vec<CompiledRule>,
    /// By rule index.
    pub runtime: Vec<RuleRuntime>,
}

/// What serving a rule needs besides its pure part.
pub(crate) struct RuleRuntime {
    /// By backend index; `None`: an unresolved reference (500).
    pub backends: Vec<Option<Arc<RouteBackend>>>,
    pub request_timeout: Option<Duration>,
    pub backend_request_timeout: Duration,
    /// `tailnet_agent_http_rule_requests` of this rule by backend index, then `none` (500)
    /// and `redirect`; created at first use.
    counters: Vec<OnceLock<Counter>>,
    route: Arc<str>,
    rule: usize,
}

/// Where a rule's request went, for the rule metric.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RuleOutcome {
    Backend(usize),
    NoBackend,
    Redirect,
}

impl RuleRuntime {
    pub fn count(&self, metrics: &Metrics, outcome: RuleOutcome) {
        let backends = self.backends.len();
        let (slot, label) = match outcome {
            RuleOutcome::Backend(index) => (index, None),
            RuleOutcome::NoBackend => (backends, Some("none")),
            RuleOutcome::Redirect => (backends + 1, Some("redirect")),
        };
        let Some(cell) = self.counters.get(slot) else {
            return;
        };
        cell.get_or_init(|| {
            metrics
                .http_rule_requests
                .get_or_create(&RuleRequestLabels {
                    route: self.route.to_string(),
                    rule: self.rule.to_string(),
                    backend: label.map_or_else(|| slot.to_string(), str::to_owned),
                })
                .clone()
        })
        .inc();
    }
}

/// A backend's connection pool; shared by the rules of a route that name the same backend.
pub(crate) struct RouteBackend {
    /// The route's name for metrics and logs.
    pub name: Arc<str>,
    /// Which backend this is, for a client connection's own backend connection (compared by
    /// pointer: a backend of another route or rule with another address never reuses it).
    pub identity: Arc<str>,
    /// HTTP/2 clients and WebSocket upgrades.
    pub client: Client<BackendConnector, ProxyBody>,
    /// HTTP/1.1 clients: a backend connection of their own ([`crate::dedicated`]).
    pub connector: BackendConnector,
    /// Parsed once: every request's URI is built from it without formatting or parsing.
    /// `None` if the configured host and port do not form one (every request then gets the
    /// 400 a failed URI always got).
    pub authority: Option<Authority>,
}

impl RouteBackend {
    fn new(
        route: &Arc<str>,
        address: &BackendAddress,
        tls: Option<&BackendTlsFiles>,
        connect_timeout: Duration,
    ) -> Self {
        let tls = tls.map(|tls| BackendTls {
            server_name: tls.server_name.clone(),
            ca: CaBundle::new(&tls.ca_file),
        });
        let connector = BackendConnector::new(&address.host, address.port, tls, connect_timeout);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(connector.clone());
        let host = &address.host;
        let authority = if host.parse::<std::net::Ipv6Addr>().is_ok() {
            format!("[{host}]:{}", address.port)
        } else {
            format!("{host}:{}", address.port)
        };
        RouteBackend {
            name: route.clone(),
            identity: Arc::from(format!("{route} {authority}").as_str()),
            client,
            connector,
            authority: Authority::try_from(authority.as_str()).ok(),
        }
    }
}

impl HttpSite {
    /// The same site for in-cluster clients (`true`): no whois, no identity headers.
    #[must_use]
    pub fn in_cluster(mut self, in_cluster: bool) -> Self {
        self.in_cluster = in_cluster;
        self
    }

    /// A TLS-terminating (`http`) listener's site (`certificates`: one store for every
    /// route, or each route's own, see [`ListenerCertificates`]).
    pub fn new(
        listener: String,
        routes: &[HttpRoute],
        certificates: impl Into<ListenerCertificates>,
        defaults: ProxyDefaults,
    ) -> Result<Self, SiteError> {
        let table = RouteTable::new(routes);
        let config = server_config(certificates.into(), table.clone())?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        Self::build(listener, table, Some(acceptor), defaults)
    }

    /// A `plainHttp` listener's site.
    pub fn plain(
        listener: String,
        routes: &[HttpRoute],
        defaults: ProxyDefaults,
    ) -> Result<Self, SiteError> {
        Self::build(listener, RouteTable::new(routes), None, defaults)
    }

    fn build(
        listener: String,
        table: RouteTable,
        acceptor: Option<TlsAcceptor>,
        defaults: ProxyDefaults,
    ) -> Result<Self, SiteError> {
        let served = table
            .routes()
            .iter()
            .map(|entry| site_route(&entry.route, defaults))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HttpSite {
            listener,
            in_cluster: false,
            routes: table,
            acceptor,
            served,
        })
    }

    /// `https` or `http`: what `X-Forwarded-Proto` and redirects say.
    pub fn scheme(&self) -> &'static str {
        if self.acceptor.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// Compiles a route: a route without rules is one rule that takes every request to its
/// `backend`; rules get their backends' pools (one per distinct backend of the route) and
/// their timeouts (the rule's, else the route's, else the default).
fn site_route(route: &HttpRoute, defaults: ProxyDefaults) -> Result<SiteRoute, CompileError> {
    let name: Arc<str> = Arc::from(route.name.as_str());
    let route_request_timeout = route.request_timeout();
    let route_backend_timeout = route
        .backend_request_timeout()
        .unwrap_or(defaults.backend_request_timeout);
    let mut pools: HashMap<String, Arc<RouteBackend>> = HashMap::new();
    let mut pool = |address: &BackendAddress, tls: Option<&BackendTlsFiles>| {
        let key = format!(
            "{}\0{}\0{}",
            address.host,
            address.port,
            tls.map(|tls| format!("{}\0{}", tls.server_name, tls.ca_file))
                .unwrap_or_default()
        );
        pools
            .entry(key)
            .or_insert_with(|| {
                Arc::new(RouteBackend::new(
                    &name,
                    address,
                    tls,
                    defaults.backend_connect_timeout,
                ))
            })
            .clone()
    };
    let runtime_of =
        |rule: usize, backends: Vec<Option<Arc<RouteBackend>>>, request, backend| RuleRuntime {
            counters: (0..backends.len() + 2).map(|_| OnceLock::new()).collect(),
            backends,
            request_timeout: request,
            backend_request_timeout: backend,
            route: name.clone(),
            rule,
        };
    let mut rules = Vec::with_capacity(route.rules.len().max(1));
    let mut runtime = Vec::with_capacity(route.rules.len().max(1));
    match &route.backend {
        Some(backend) if route.rules.is_empty() => {
            rules.push(CompiledRule::single_backend());
            let backends = vec![Some(pool(backend, route.backend_tls.as_ref()))];
            runtime.push(runtime_of(
                0,
                backends,
                route_request_timeout,
                route_backend_timeout,
            ));
        }
        _ => {
            for (index, rule) in route.rules.iter().enumerate() {
                let at = format!("route {}: rules[{index}]", route.name);
                rules.push(CompiledRule::compile(rule, &at)?);
                let backends = rule
                    .backends
                    .iter()
                    .map(|weighted| {
                        weighted
                            .backend
                            .as_ref()
                            .map(|address| pool(address, weighted.backend_tls.as_ref()))
                    })
                    .collect();
                runtime.push(runtime_of(
                    index,
                    backends,
                    rule.request_timeout_millis
                        .map(Duration::from_millis)
                        .or(route_request_timeout),
                    rule.backend_request_timeout_millis
                        .map_or(route_backend_timeout, Duration::from_millis),
                ));
            }
        }
    }
    Ok(SiteRoute {
        name,
        rules,
        runtime,
    })
}
