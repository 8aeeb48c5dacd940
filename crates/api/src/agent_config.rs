//! The contract between the operator and `tailnet-agent`: the JSON file in the agent's
//! ConfigMap. The operator renders it, the agent reads it; nothing else configures the agent.

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod gateway;
pub use gateway::*;

/// Path of the config file inside the agent container.
pub const CONFIG_PATH: &str = "/etc/tailnet-agent/config/config.json";
/// Directory the config ConfigMap is mounted at.
pub const CONFIG_DIR: &str = "/etc/tailnet-agent/config";
/// Key of the config inside the ConfigMap.
pub const CONFIG_KEY: &str = "config.json";
/// Directory shared by tailscaled and the agent for the LocalAPI socket.
pub const SOCKET_DIR: &str = "/var/run/tailscale";
/// LocalAPI socket of tailscaled (`TS_SOCKET`).
pub const LOCALAPI_SOCKET: &str = "/var/run/tailscale/tailscaled.sock";
/// Where the ingress TLS Secret is mounted.
pub const TLS_DIR: &str = "/etc/tailnet-agent/tls";
/// Where backend CA bundles are mounted (one sub-directory per ConfigMap).
pub const CA_DIR: &str = "/etc/tailnet-agent/ca";
/// Port of the agent's admin listener (`/metrics`, `/readyz`, `/livez`) on the pod IP; not
/// the tailscale image's usual 9002 (containerboot's health port), so the two never collide
/// should the image's entrypoint be used.
pub const ADMIN_PORT: u16 = 9180;
/// First port allocated to egress listeners.
pub const FIRST_EGRESS_PORT: u16 = 10000;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentConfig {
    /// LocalAPI unix socket of tailscaled.
    pub localapi_socket: String,
    /// Admin listener port; it binds the pod IP (env `POD_IP`), never loopback, because
    /// loopback is reachable from the tailnet.
    pub admin_port: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressListener>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<IngressListener>,
    /// Certificate for the routes of `http` ingress listeners that carry none of their own
    /// (and for handshakes without SNI when no route serves `*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
    /// Concurrent connection limits; absent: [`ConnectionLimits::default`].
    #[serde(default, skip_serializing_if = "ConnectionLimits::is_default")]
    pub limits: ConnectionLimits,
    /// Split horizon: every ingress listener is also served on the pod IP (same port) for
    /// in-cluster clients, which reach it through the ingress's in-cluster Service. They get
    /// the same certificate and virtual hosts, but never a tailnet identity: no whois, and
    /// identity headers they send are dropped as any client's are. Absent: false (configs
    /// without it stay byte for byte what older agents read).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_cluster: bool,
}

/// Default of [`ConnectionLimits::max_connections`]: with two 32 KiB relay buffers and the
/// socket and task overhead (≈ 100 KiB a relayed connection in all, measured), 1024
/// connections stay near 100 MiB, well under the agent container's 256 Mi limit.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 1024;
/// Default of [`ConnectionLimits::max_connections_per_listener`]: one consumer hammering
/// one target leaves the agent's other listeners room.
pub const DEFAULT_MAX_CONNECTIONS_PER_LISTENER: u32 = 512;
/// The largest limit the API accepts (per agent and per listener).
pub const MAX_CONNECTIONS_CEILING: u32 = 2048;
/// Default of [`ConnectionLimits::max_connections_per_source`]: half a listener's default
/// slots, so one client address cannot take all of them from the others.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: u32 = 256;
/// Default of [`ConnectionLimits::idle_timeout_seconds`]: an hour without a byte either way
/// ends a relayed TCP connection (database sessions idle for minutes keep theirs).
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u32 = 3600;
/// The longest relay idle timeout the agent accepts (a week).
pub const MAX_IDLE_TIMEOUT_SECONDS: u32 = 7 * 24 * 3600;

/// Concurrent connections the agent serves; beyond them a new connection is accepted and
/// reset at once (counted in `tailnet_agent_connections_refused_total`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectionLimits {
    /// Across all listeners of the agent.
    pub max_connections: u32,
    /// Per listener (an egress target, a tcp expose, an https port).
    pub max_connections_per_listener: u32,
    /// Per client address on one listener (loopback addresses are not counted: ingress
    /// connections all arrive from tailscaled on 127.0.0.1).
    #[serde(default = "default_max_connections_per_source")]
    pub max_connections_per_source: u32,
    /// A relayed TCP connection (`egress`, `tcp` ingress) ends after this many seconds
    /// without a byte either way.
    #[serde(default = "default_idle_timeout_seconds")]
    pub idle_timeout_seconds: u32,
}

fn default_max_connections_per_source() -> u32 {
    DEFAULT_MAX_CONNECTIONS_PER_SOURCE
}

fn default_idle_timeout_seconds() -> u32 {
    DEFAULT_IDLE_TIMEOUT_SECONDS
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_listener: DEFAULT_MAX_CONNECTIONS_PER_LISTENER,
            max_connections_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
            idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT_SECONDS,
        }
    }
}

impl ConnectionLimits {
    pub fn is_default(&self) -> bool {
        *self == ConnectionLimits::default()
    }
}

/// An egress listener: pod IP:`listen_port` → tailnet `target_host:target_port`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressListener {
    pub name: String,
    pub listen_port: u16,
    pub target_host: String,
    pub target_port: u16,
    /// Seconds between reachability probes; `None` disables probing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_interval_seconds: Option<u64>,
}

/// An ingress listener on `127.0.0.1:port` (tailscaled forwards its tailnet IP there).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(
    rename_all = "camelCase",
    tag = "mode",
    rename_all_fields = "camelCase"
)]
pub enum IngressListener {
    /// Raw TCP forward.
    #[serde(rename = "tcp")]
    Tcp {
        port: u16,
        name: String,
        /// Where connections go; with `backends`, the heaviest of them (probed for
        /// readiness).
        backend: BackendAddress,
        /// A Gateway TCPRoute with several backendRefs: each connection goes to one of them
        /// by weight (an unresolved one's share is closed). Empty: every connection goes to
        /// `backend` (TailnetIngress configs stay byte for byte what they were).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        backends: Vec<WeightedBackend>,
    },
    /// TLS termination and HTTP reverse proxy, virtual hosts by SNI/Host.
    #[serde(rename = "http")]
    Http { port: u16, routes: Vec<HttpRoute> },
    /// HTTP/1.1 reverse proxy without TLS, virtual hosts by Host (the Gateway API's `HTTP`
    /// listeners: on a tailnet the transport is WireGuard-encrypted already).
    #[serde(rename = "plainHttp")]
    PlainHttp { port: u16, routes: Vec<HttpRoute> },
    /// TLS passthrough: the ClientHello's SNI picks the route, and the connection (ClientHello
    /// included) is relayed to its backend untouched; the backend terminates TLS.
    #[serde(rename = "tlsPassthrough")]
    TlsPassthrough {
        port: u16,
        routes: Vec<PassthroughRoute>,
    },
}

impl IngressListener {
    /// The loopback port it binds.
    pub fn port(&self) -> u16 {
        match self {
            IngressListener::Tcp { port, .. }
            | IngressListener::Http { port, .. }
            | IngressListener::PlainHttp { port, .. }
            | IngressListener::TlsPassthrough { port, .. } => *port,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRoute {
    pub name: String,
    /// Hostnames served by this route (SNI and Host): DNS names, `*.`-prefixed wildcards
    /// (any name under the suffix, at any depth, not the suffix itself) or `*` (every name).
    /// An exact name beats a wildcard, a longer wildcard a shorter one, and both beat `*`.
    pub hostnames: Vec<String>,
    /// The certificate served to TLS handshakes whose SNI selects this route (`http`
    /// listeners only: a Gateway's HTTPS listeners each bring their own `certificateRefs`).
    /// Absent: the agent-level `tls` (and TailnetIngress configs stay byte for byte what
    /// they were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
    /// The one backend of a route without `rules` (every request goes there); absent when
    /// the route has `rules`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendAddress>,
    /// TLS towards `backend` (a route with `rules` sets it per backend instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_tls: Option<BackendTlsFiles>,
    /// Bound of the whole exchange in whole seconds, rounded up ([`timeout_seconds`]); what
    /// agents before `requestTimeoutMillis` read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_seconds: Option<u64>,
    /// Wait for the backend's response head in whole seconds, rounded up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request_timeout_seconds: Option<u64>,
    /// The exact bound in milliseconds when it is not whole seconds ([`timeout_millis`]);
    /// takes precedence over `requestTimeoutSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_millis: Option<u64>,
    /// The exact wait in milliseconds when it is not whole seconds; takes precedence over
    /// `backendRequestTimeoutSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request_timeout_millis: Option<u64>,
    /// Gateway API routing: the first rule (in this order) whose matches the request meets
    /// serves it; none: 404. Absent: `backend` serves every request (TailnetIngress); absent
    /// with no `backend` either: every request gets 404 (a Gateway listener's names no
    /// HTTPRoute serves).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<HttpRule>,
}

impl HttpRoute {
    /// The bound of the whole exchange: the milliseconds field if set, else the seconds one.
    pub fn request_timeout(&self) -> Option<Duration> {
        read_timeout(self.request_timeout_millis, self.request_timeout_seconds)
    }

    /// The wait for the backend's response head: the milliseconds field if set, else the
    /// seconds one.
    pub fn backend_request_timeout(&self) -> Option<Duration> {
        read_timeout(
            self.backend_request_timeout_millis,
            self.backend_request_timeout_seconds,
        )
    }
}

fn read_timeout(millis: Option<u64>, seconds: Option<u64>) -> Option<Duration> {
    millis
        .map(Duration::from_millis)
        .or_else(|| seconds.map(Duration::from_secs))
}

/// The seconds field of a route timeout: whole seconds rounded up, at least 1 (a timeout
/// never fires before the one asked for).
pub fn timeout_seconds(timeout: Option<Duration>) -> Option<u64> {
    timeout.map(|timeout| {
        let seconds = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
        seconds.max(1)
    })
}

/// The milliseconds field of a route timeout: only when it is not whole seconds (rounded up
/// to whole milliseconds), so a config of whole seconds stays byte for byte what agents
/// before the field read (they refuse unknown fields; see docs/upgrades.md).
pub fn timeout_millis(timeout: Option<Duration>) -> Option<u64> {
    let timeout = timeout.filter(|timeout| timeout.subsec_nanos() > 0)?;
    let millis = timeout.as_millis() + u128::from(timeout.subsec_nanos() % 1_000_000 > 0);
    Some(u64::try_from(millis).unwrap_or(u64::MAX))
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendAddress {
    /// Service DNS name, e.g. `frontend.team-a.svc.cluster.local`.
    pub host: String,
    pub port: u16,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendTlsFiles {
    pub server_name: String,
    pub ca_file: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsFiles {
    pub cert_file: String,
    pub key_file: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_timeouts_keep_their_precision_and_old_agents_their_seconds() {
        let cases = [
            // (timeout, seconds field, millis field)
            (Duration::from_millis(500), 1, Some(500)),
            (Duration::from_secs(60), 60, None),
            (Duration::from_millis(1500), 2, Some(1500)),
            (Duration::from_micros(250), 1, Some(1)),
            (Duration::from_micros(1_000_250), 2, Some(1001)),
        ];
        for (timeout, seconds, millis) in cases {
            assert_eq!(timeout_seconds(Some(timeout)), Some(seconds), "{timeout:?}");
            assert_eq!(timeout_millis(Some(timeout)), millis, "{timeout:?}");
        }
        assert_eq!(timeout_seconds(None), None);
        assert_eq!(timeout_millis(None), None);
    }

    /// A route's own certificate is `tls` beside its hostnames; without one the route
    /// serializes as before (no `tls` key at all).
    #[test]
    fn a_route_certificate_is_optional_and_absent_from_older_configs() {
        let plain = serde_json::json!({
            "name": "web", "hostnames": ["web.example"],
            "backend": {"host": "web", "port": 80},
        });
        let route: HttpRoute = serde_json::from_value(plain.clone()).expect("route");
        assert_eq!(route.tls, None);
        assert_eq!(serde_json::to_value(&route).expect("json"), plain);
        let mut with_tls = plain;
        with_tls["tls"] = serde_json::json!({"certFile": "/c/tls.crt", "keyFile": "/c/tls.key"});
        let route: HttpRoute = serde_json::from_value(with_tls.clone()).expect("route");
        assert_eq!(
            route.tls,
            Some(TlsFiles {
                cert_file: "/c/tls.crt".into(),
                key_file: "/c/tls.key".into(),
            })
        );
        assert_eq!(serde_json::to_value(&route).expect("json"), with_tls);
    }

    #[test]
    fn the_millis_field_wins_and_old_configs_read_as_seconds() {
        let route = |extra: serde_json::Value| -> HttpRoute {
            let mut value = serde_json::json!({
                "name": "web", "hostnames": ["web.example"],
                "backend": {"host": "web", "port": 80},
            });
            if let (Some(object), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
                object.extend(extra.clone());
            }
            serde_json::from_value(value).expect("route")
        };
        let old = route(serde_json::json!({"backendRequestTimeoutSeconds": 3}));
        assert_eq!(old.backend_request_timeout(), Some(Duration::from_secs(3)));
        assert_eq!(old.request_timeout(), None);
        let new = route(serde_json::json!({
            "requestTimeoutSeconds": 1, "requestTimeoutMillis": 500,
            "backendRequestTimeoutSeconds": 1, "backendRequestTimeoutMillis": 250,
        }));
        assert_eq!(new.request_timeout(), Some(Duration::from_millis(500)));
        assert_eq!(
            new.backend_request_timeout(),
            Some(Duration::from_millis(250))
        );
    }
}
