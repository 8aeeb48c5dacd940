//! Prometheus metrics of the agent (`/metrics` on the admin listener; OpenMetrics or the
//! Prometheus text format as the scraper asks), with `tailnet_agent_build_info` and the
//! `process_*` metrics.
//! Label values come from the config (listener, route and host names), never from clients,
//! so cardinality stays bounded.

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: String,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Direction {
    /// From the connecting client towards the target/backend.
    In,
    /// From the target/backend back to the client.
    Out,
}

impl EncodeLabelValue for Direction {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            Direction::In => "in",
            Direction::Out => "out",
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BytesLabels {
    pub listener: String,
    pub direction: Direction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DialFailureLabels {
    pub listener: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub listener: String,
    /// `limit` (the listener's) or `agent_limit` (all listeners together).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    /// `target` (egress, through the tailnet) or `backend` (ingress, from the pod).
    pub kind: String,
    pub name: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeTargetLabels {
    pub kind: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpRequestLabels {
    pub route: String,
    /// A configured hostname, or `unknown` for a Host no route serves.
    pub host: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpDurationLabels {
    pub route: String,
    pub host: String,
}

/// A Gateway API rule's requests: `rule` is its index in the route, `backend` the index of
/// the backend it chose, `none` (no backend: 500) or `redirect`. All from the config.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleRequestLabels {
    pub route: String,
    pub rule: String,
    pub backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendFailureLabels {
    pub route: String,
    /// `connect`, `tls`, `timeout`, `protocol`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TailnetStateLabels {
    pub backend_state: String,
}

/// Every metric family, registered once.
#[derive(Debug)]
pub struct Metrics {
    pub connections: Family<ListenerLabels, Counter>,
    pub active_connections: Family<ListenerLabels, Gauge>,
    pub connections_refused: Family<RefusedLabels, Counter>,
    pub connections_reclaimed: Family<ListenerLabels, Counter>,
    pub bytes: Family<BytesLabels, Counter>,
    pub dial_failures: Family<DialFailureLabels, Counter>,
    pub probes: Family<ProbeLabels, Counter>,
    pub probe_reachable: Family<ProbeTargetLabels, Gauge>,
    pub http_requests: Family<HttpRequestLabels, Counter>,
    pub http_duration: Family<HttpDurationLabels, Histogram>,
    pub http_rule_requests: Family<RuleRequestLabels, Counter>,
    pub backend_failures: Family<BackendFailureLabels, Counter>,
    pub backend_tls_failures: Family<RouteLabels, Counter>,
    pub tls_handshake_failures: Family<ListenerLabels, Counter>,
    pub listener_up: Family<ListenerLabels, Gauge>,
    pub tailnet_connected: Gauge,
    pub tailnet_state: Family<TailnetStateLabels, Gauge>,
    pub tailnet_ips: Gauge,
    pub localapi_errors: Counter,
    pub login_retries: Counter,
    pub certificate_loaded: Gauge,
    pub certificate_reloads: Counter,
    pub certificate_reload_failures: Counter,
    pub config_reload_failures: Counter,
    pub admin_connections_refused: Counter,
    pub ready: Gauge,
}

fn duration_histogram() -> Histogram {
    // 1 ms … ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            connections: Family::default(),
            active_connections: Family::default(),
            connections_refused: Family::default(),
            connections_reclaimed: Family::default(),
            bytes: Family::default(),
            dial_failures: Family::default(),
            probes: Family::default(),
            probe_reachable: Family::default(),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(duration_histogram),
            http_rule_requests: Family::default(),
            backend_failures: Family::default(),
            backend_tls_failures: Family::default(),
            tls_handshake_failures: Family::default(),
            listener_up: Family::default(),
            tailnet_connected: Gauge::default(),
            tailnet_state: Family::default(),
            tailnet_ips: Gauge::default(),
            localapi_errors: Counter::default(),
            login_retries: Counter::default(),
            certificate_loaded: Gauge::default(),
            certificate_reloads: Counter::default(),
            certificate_reload_failures: Counter::default(),
            config_reload_failures: Counter::default(),
            admin_connections_refused: Counter::default(),
            ready: Gauge::default(),
        };
        metrics.register(registry);
        metrics
    }

    /// Registers every family under `tailnet_agent_` (and the common build/process ones).
    fn register(&self, registry: &mut Registry) {
        tailnet_telemetry::register_common(registry, "tailnet_agent", env!("CARGO_PKG_VERSION"));
        let registry = registry.sub_registry_with_prefix("tailnet_agent");
        registry.register(
            "connections",
            "Connections accepted, by listener",
            self.connections.clone(),
        );
        registry.register(
            "active_connections",
            "Connections open now, by listener",
            self.active_connections.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections reset at accept because a connection limit was reached, by listener and reason (limit = the listener's, agent_limit = the agent's)",
            self.connections_refused.clone(),
        );
        registry.register(
            "connections_reclaimed",
            "Held egress connections (client sent EOF, target silent) ended at accept to admit a new connection to a full listener or agent, by the new connection's listener",
            self.connections_reclaimed.clone(),
        );
        registry.register(
            "bytes",
            "Bytes relayed, by listener and direction (in = client to target)",
            self.bytes.clone(),
        );
        registry.register(
            "dial_failures",
            "Egress dials through the tailnet that failed, by reason (dial_self = not routed through the tailnet, refused, timeout, error)",
            self.dial_failures.clone(),
        );
        registry.register(
            "probes",
            "Reachability probes by kind, name and result",
            self.probes.clone(),
        );
        registry.register(
            "probe_reachable",
            "1 when the last probe of the target/backend reached it",
            self.probe_reachable.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests by route, host and status",
            self.http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Time from request head to the end of the response, by route and host",
            self.http_duration.clone(),
        );
        registry.register(
            "http_rule_requests",
            "HTTP requests a route rule served, by route, rule index and backend (index, none = no backend: 500, redirect)",
            self.http_rule_requests.clone(),
        );
        registry.register(
            "backend_failures",
            "Backend requests that got no response, by route and reason",
            self.backend_failures.clone(),
        );
        registry.register(
            "backend_tls_failures",
            "TLS handshakes with a backend that failed (verification or protocol), by route",
            self.backend_tls_failures.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "Client TLS handshakes that failed, by listener",
            self.tls_handshake_failures.clone(),
        );
        registry.register(
            "listener_up",
            "1 when the listener is bound and serving",
            self.listener_up.clone(),
        );
        registry.register(
            "tailnet_connected",
            "1 when tailscaled is Running with a tailnet IP",
            self.tailnet_connected.clone(),
        );
        registry.register(
            "tailnet_backend_state",
            "1 for tailscaled's current BackendState",
            self.tailnet_state.clone(),
        );
        registry.register(
            "tailnet_ips",
            "Number of tailnet IPs of this node",
            self.tailnet_ips.clone(),
        );
        registry.register(
            "localapi_errors",
            "LocalAPI status requests that failed",
            self.localapi_errors.clone(),
        );
        registry.register(
            "login_retries",
            "Times tailscaled, waiting for a login for 15 s, was made to re-read its login config (with the auth Secret's current pre-auth key) and start again",
            self.login_retries.clone(),
        );
        registry.register(
            "certificate_loaded",
            "1 when every configured serving certificate (agent-level and routes' own) is loaded",
            self.certificate_loaded.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Serving certificates (re)loaded from disk",
            self.certificate_reloads.clone(),
        );
        registry.register(
            "certificate_reload_failures",
            "Changed certificate files that were rejected (unreadable, not PEM, or a key that does not match the certificate); the previous certificate keeps serving",
            self.certificate_reload_failures.clone(),
        );
        registry.register(
            "admin_connections_refused",
            "Admin listener connections reset because ADMIN_MAX_CONNECTIONS were open",
            self.admin_connections_refused.clone(),
        );
        registry.register(
            "config_reload_failures",
            "Changed config files that were rejected",
            self.config_reload_failures.clone(),
        );
        registry.register("ready", "1 when /readyz answers ready", self.ready.clone());
    }

    pub fn listener(&self, listener: &str) -> ListenerLabels {
        ListenerLabels {
            listener: listener.to_owned(),
        }
    }

    pub fn bytes_counter(&self, listener: &str, direction: Direction) -> Counter {
        self.bytes
            .get_or_create(&BytesLabels {
                listener: listener.to_owned(),
                direction,
            })
            .clone()
    }

    pub fn count_refused(&self, listener: &str, reason: &str) {
        self.connections_refused
            .get_or_create(&RefusedLabels {
                listener: listener.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn count_reclaimed(&self, listener: &str) {
        self.connections_reclaimed
            .get_or_create(&ListenerLabels {
                listener: listener.to_owned(),
            })
            .inc();
    }

    pub fn count_dial_failure(&self, listener: &str, reason: &str) {
        self.dial_failures
            .get_or_create(&DialFailureLabels {
                listener: listener.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn count_backend_failure(&self, route: &str, reason: &str) {
        self.backend_failures
            .get_or_create(&BackendFailureLabels {
                route: route.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
        if reason == "tls" {
            self.backend_tls_failures
                .get_or_create(&RouteLabels {
                    route: route.to_owned(),
                })
                .inc();
        }
    }
}

/// Decrements the active-connection gauge when the connection task ends, however it ends.
pub struct ActiveConnection {
    gauge: Gauge,
}

impl ActiveConnection {
    pub fn open(metrics: &Metrics, listener: &str) -> Self {
        let labels = metrics.listener(listener);
        metrics.connections.get_or_create(&labels).inc();
        let gauge = metrics.active_connections.get_or_create(&labels).clone();
        gauge.inc();
        ActiveConnection { gauge }
    }
}

impl Drop for ActiveConnection {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}
