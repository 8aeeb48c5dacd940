//! Loading and semantic validation of the agent config (`tailnet_api::agent_config`). The
//! operator renders it; the agent still checks it, because a config that would bind one port
//! twice or route one hostname two ways must fail loudly instead of half-working.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tailnet_api::agent_config::{
    AgentConfig, HttpRoute, IngressListener, MAX_HOSTNAMES_PER_ROUTE, MAX_ROUTES_PER_LISTENER,
    RegexBudget, RuleError, check_backends, check_hostname_pattern, check_http_rules,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not a valid agent config")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid agent config: {field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Reads, parses and validates the config file; also returns the raw bytes so a poller can
/// tell whether the file changed.
pub fn load(path: &Path) -> Result<(AgentConfig, Vec<u8>), ConfigError> {
    let raw = std::fs::read(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let config = from_bytes(path, &raw)?;
    Ok((config, raw))
}

/// Parses and validates config bytes read from `path`.
pub fn from_bytes(path: &Path, raw: &[u8]) -> Result<AgentConfig, ConfigError> {
    parse(raw).map_err(|error| match error {
        ParseError::Json(source) => ConfigError::Parse {
            path: path.to_owned(),
            source,
        },
        ParseError::Invalid(error) => error,
    })
}

enum ParseError {
    Json(serde_json::Error),
    Invalid(ConfigError),
}

fn parse(raw: &[u8]) -> Result<AgentConfig, ParseError> {
    let config: AgentConfig = serde_json::from_slice(raw).map_err(ParseError::Json)?;
    validate(&config).map_err(ParseError::Invalid)?;
    Ok(config)
}

/// Lower-cases and strips one trailing dot: SNI, Host and configured names compare this way.
pub fn normalize_hostname(name: &str) -> String {
    normalized_hostname(name).into_owned()
}

/// [`normalize_hostname`] without a copy when `name` is already normalized (the request path:
/// clients send lowercase names).
pub fn normalized_hostname(name: &str) -> Cow<'_, str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        Cow::Borrowed(name)
    }
}

/// Checks what the JSON schema cannot: unique names and ports, hostnames that route one way
/// only, a certificate for `http` listeners, sane timeouts.
pub fn validate(config: &AgentConfig) -> Result<(), ConfigError> {
    if config.localapi_socket.trim().is_empty() {
        return Err(invalid("localapiSocket", "must not be empty"));
    }
    if config.admin_port == 0 {
        return Err(invalid("adminPort", "must be 1-65535"));
    }
    // A limit of 0 would refuse every connection; one above the ceiling defeats the memory
    // bound the limits are for.
    let ceiling = tailnet_api::agent_config::MAX_CONNECTIONS_CEILING;
    for (field, value) in [
        ("limits.maxConnections", config.limits.max_connections),
        (
            "limits.maxConnectionsPerListener",
            config.limits.max_connections_per_listener,
        ),
        (
            "limits.maxConnectionsPerSource",
            config.limits.max_connections_per_source,
        ),
    ] {
        if !(1..=ceiling).contains(&value) {
            return Err(invalid(field, format!("must be 1-{ceiling}")));
        }
    }
    let longest = tailnet_api::agent_config::MAX_IDLE_TIMEOUT_SECONDS;
    if !(1..=longest).contains(&config.limits.idle_timeout_seconds) {
        return Err(invalid(
            "limits.idleTimeoutSeconds",
            format!("must be 1-{longest}"),
        ));
    }
    // Admin and egress listeners share the pod IP; ingress listeners share 127.0.0.1.
    let mut pod_ip_ports = BTreeMap::from([(config.admin_port, "adminPort".to_string())]);
    let mut names = BTreeSet::new();
    for (index, listener) in config.egress.iter().enumerate() {
        let at = format!("egress[{index}]");
        require_name(&listener.name, &format!("{at}.name"))?;
        if !names.insert(listener.name.clone()) {
            return Err(invalid(format!("{at}.name"), "duplicate listener name"));
        }
        claim_port(
            &mut pod_ip_ports,
            listener.listen_port,
            &format!("{at}.listenPort"),
        )?;
        if listener.target_host.trim().is_empty() {
            return Err(invalid(format!("{at}.targetHost"), "must not be empty"));
        }
        if listener.target_port == 0 {
            return Err(invalid(format!("{at}.targetPort"), "must be 1-65535"));
        }
        if listener.probe_interval_seconds == Some(0) {
            return Err(invalid(
                format!("{at}.probeIntervalSeconds"),
                "must be at least 1 (omit it to switch probing off)",
            ));
        }
    }

    let mut loopback_ports = BTreeMap::new();
    let mut regexes = RegexBudget::default();
    for (index, listener) in config.ingress.iter().enumerate() {
        let at = format!("ingress[{index}]");
        claim_port(&mut loopback_ports, listener.port(), &format!("{at}.port"))?;
        match listener {
            IngressListener::Tcp {
                name,
                backend,
                backends,
                ..
            } => {
                require_name(name, &format!("{at}.name"))?;
                if !names.insert(name.clone()) {
                    return Err(invalid(format!("{at}.name"), "duplicate listener name"));
                }
                require_backend(&backend.host, backend.port, &format!("{at}.backend"))?;
                check_backends(backends, &format!("{at}.backends"), false).map_err(rule_error)?;
            }
            IngressListener::Http { routes, .. } | IngressListener::PlainHttp { routes, .. } => {
                let terminates_tls = matches!(listener, IngressListener::Http { .. });
                check_route_count(routes.len(), &at)?;
                let mut hostnames = BTreeMap::new();
                for (route_index, route) in routes.iter().enumerate() {
                    let at = format!("{at}.routes[{route_index}]");
                    validate_route(route, &at, &mut regexes)?;
                    check_route_certificate(route, terminates_tls, config.tls.is_some(), &at)?;
                    claim_route(&mut names, &route.name, &at)?;
                    claim_hostnames(&mut hostnames, &route.hostnames, &route.name, &at)?;
                }
            }
            IngressListener::TlsPassthrough { routes, .. } => {
                check_route_count(routes.len(), &at)?;
                let mut hostnames = BTreeMap::new();
                for (route_index, route) in routes.iter().enumerate() {
                    let at = format!("{at}.routes[{route_index}]");
                    require_name(&route.name, &format!("{at}.name"))?;
                    check_hostnames(&route.hostnames, &at)?;
                    check_backends(&route.backends, &format!("{at}.backends"), false)
                        .map_err(rule_error)?;
                    claim_route(&mut names, &route.name, &at)?;
                    claim_hostnames(&mut hostnames, &route.hostnames, &route.name, &at)?;
                }
            }
        }
    }
    // In-cluster twins of the ingress listeners bind the pod IP, beside admin and egress.
    if config.in_cluster {
        for (index, listener) in config.ingress.iter().enumerate() {
            claim_port(
                &mut pod_ip_ports,
                listener.port(),
                &format!("ingress[{index}].port (inCluster: also on the pod IP)"),
            )?;
        }
    }
    if let Some(tls) = &config.tls
        && (tls.cert_file.trim().is_empty() || tls.key_file.trim().is_empty())
    {
        return Err(invalid("tls", "certFile and keyFile must not be empty"));
    }
    Ok(())
}

/// A route of an `http` listener is served with its own certificate or the agent-level one;
/// a `plainHttp` route serves no TLS, so a certificate there is a mistake.
fn check_route_certificate(
    route: &HttpRoute,
    terminates_tls: bool,
    agent_certificate: bool,
    at: &str,
) -> Result<(), ConfigError> {
    let field = format!("{at}.tls");
    match (&route.tls, terminates_tls) {
        (Some(_), false) => Err(invalid(
            field,
            "a plainHttp route serves no TLS: certificates belong to http listeners",
        )),
        (Some(tls), true) if tls.cert_file.trim().is_empty() || tls.key_file.trim().is_empty() => {
            Err(invalid(field, "certFile and keyFile must not be empty"))
        }
        (None, true) if !agent_certificate => Err(invalid(
            field,
            "the route has no certificate of its own (certFile, keyFile) and the agent-level tls is absent",
        )),
        _ => Ok(()),
    }
}

fn rule_error(error: RuleError) -> ConfigError {
    invalid(error.field, error.message)
}

/// No routes is valid: a Gateway listener nothing is attached to yet still listens (plain
/// HTTP answers 404, a TLS handshake finds no name) and the Gateway is Programmed.
fn check_route_count(count: usize, at: &str) -> Result<(), ConfigError> {
    if count > MAX_ROUTES_PER_LISTENER {
        return Err(invalid(
            format!("{at}.routes"),
            format!("more than {MAX_ROUTES_PER_LISTENER} routes"),
        ));
    }
    Ok(())
}

fn claim_route(names: &mut BTreeSet<String>, name: &str, at: &str) -> Result<(), ConfigError> {
    if !names.insert(name.to_owned()) {
        return Err(invalid(format!("{at}.name"), "duplicate listener name"));
    }
    Ok(())
}

/// A hostname (or wildcard) is served by one route per port.
fn claim_hostnames(
    taken: &mut BTreeMap<String, String>,
    hostnames: &[String],
    route: &str,
    at: &str,
) -> Result<(), ConfigError> {
    for hostname in hostnames {
        let normalized = normalize_hostname(hostname);
        if let Some(other) = taken.insert(normalized, route.to_owned()) {
            return Err(invalid(
                format!("{at}.hostnames"),
                format!("{hostname} is also served by route {other} on this port"),
            ));
        }
    }
    Ok(())
}

fn check_hostnames(hostnames: &[String], at: &str) -> Result<(), ConfigError> {
    if hostnames.is_empty() {
        return Err(invalid(format!("{at}.hostnames"), "must not be empty"));
    }
    if hostnames.len() > MAX_HOSTNAMES_PER_ROUTE {
        return Err(invalid(
            format!("{at}.hostnames"),
            format!("more than {MAX_HOSTNAMES_PER_ROUTE} hostnames"),
        ));
    }
    for hostname in hostnames {
        if !check_hostname_pattern(hostname) {
            return Err(invalid(
                format!("{at}.hostnames"),
                format!("{hostname:?} is not a DNS name, a *. wildcard or *"),
            ));
        }
    }
    Ok(())
}

fn validate_route(
    route: &HttpRoute,
    at: &str,
    regexes: &mut RegexBudget,
) -> Result<(), ConfigError> {
    require_name(&route.name, &format!("{at}.name"))?;
    check_hostnames(&route.hostnames, at)?;
    match (&route.backend, route.rules.is_empty()) {
        (Some(backend), true) => {
            require_backend(&backend.host, backend.port, &format!("{at}.backend"))?;
        }
        (None, false) => {
            if route.backend_tls.is_some() {
                return Err(invalid(
                    format!("{at}.backendTls"),
                    "a route with rules sets backendTls per backend",
                ));
            }
            check_http_rules(&route.rules, at, regexes).map_err(rule_error)?;
        }
        (Some(_), false) => {
            return Err(invalid(
                format!("{at}.backend"),
                "a route has either backend or rules, not both",
            ));
        }
        // Neither: the route serves its names with 404 (a Gateway listener's hostname no
        // HTTPRoute serves: its certificate still answers the handshake).
        (None, true) => {
            if route.backend_tls.is_some() {
                return Err(invalid(
                    format!("{at}.backendTls"),
                    "a route without backend has no backend to reach over TLS",
                ));
            }
        }
    }
    if let Some(tls) = &route.backend_tls {
        if tls.server_name.trim().is_empty() {
            return Err(invalid(
                format!("{at}.backendTls.serverName"),
                "must not be empty",
            ));
        }
        if tls.ca_file.trim().is_empty() {
            return Err(invalid(
                format!("{at}.backendTls.caFile"),
                "must not be empty",
            ));
        }
    }
    for (field, value) in [
        ("requestTimeoutSeconds", route.request_timeout_seconds),
        (
            "backendRequestTimeoutSeconds",
            route.backend_request_timeout_seconds,
        ),
        ("requestTimeoutMillis", route.request_timeout_millis),
        (
            "backendRequestTimeoutMillis",
            route.backend_request_timeout_millis,
        ),
    ] {
        if value == Some(0) {
            return Err(invalid(format!("{at}.{field}"), "must be at least 1"));
        }
    }
    Ok(())
}

fn require_name(name: &str, field: &str) -> Result<(), ConfigError> {
    if name.trim().is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    Ok(())
}

fn require_backend(host: &str, port: u16, field: &str) -> Result<(), ConfigError> {
    if host.trim().is_empty() {
        return Err(invalid(format!("{field}.host"), "must not be empty"));
    }
    if port == 0 {
        return Err(invalid(format!("{field}.port"), "must be 1-65535"));
    }
    Ok(())
}

fn claim_port(
    taken: &mut BTreeMap<u16, String>,
    port: u16,
    field: &str,
) -> Result<(), ConfigError> {
    if port == 0 {
        return Err(invalid(field, "must be 1-65535"));
    }
    if let Some(other) = taken.insert(port, field.to_string()) {
        return Err(invalid(
            field,
            format!("port {port} is already used by {other}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(value: serde_json::Value) -> Result<AgentConfig, ConfigError> {
        match parse(value.to_string().as_bytes()) {
            Ok(config) => Ok(config),
            Err(ParseError::Invalid(error)) => Err(error),
            Err(ParseError::Json(error)) => panic!("test input is not a config: {error}"),
        }
    }

    fn route(name: &str, hostnames: &[&str]) -> serde_json::Value {
        json!({"name": name, "hostnames": hostnames, "backend": {"host": "web.a.svc", "port": 80}})
    }

    fn base() -> serde_json::Value {
        json!({
            "localapiSocket": "/var/run/tailscale/tailscaled.sock",
            "adminPort": 9180,
            "egress": [
                {"name": "db", "listenPort": 10000, "targetHost": "192.0.2.10", "targetPort": 5432,
                 "probeIntervalSeconds": 30}
            ],
            "ingress": [
                {"mode": "tcp", "name": "k8s", "port": 6443,
                 "backend": {"host": "kubernetes.default.svc", "port": 443}},
                {"mode": "http", "port": 443, "routes": [route("web", &["portal.example.net"])]}
            ],
            "tls": {"certFile": "/tls/tls.crt", "keyFile": "/tls/tls.key"}
        })
    }

    fn error_field(value: serde_json::Value) -> String {
        match config(value) {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn accepts_a_rendered_config() {
        assert!(config(base()).is_ok());
    }

    /// `inCluster` binds every ingress port on the pod IP too, where the admin port and the
    /// egress listeners are: a collision there fails loudly.
    #[test]
    fn in_cluster_ports_must_not_collide_on_the_pod_ip() {
        let mut in_cluster = base();
        in_cluster["egress"] = json!([]);
        in_cluster["inCluster"] = json!(true);
        assert!(config(in_cluster.clone()).expect("valid").in_cluster);
        let mut on_admin = in_cluster.clone();
        on_admin["ingress"][0]["port"] = json!(9180);
        assert_eq!(
            error_field(on_admin.clone()),
            "ingress[0].port (inCluster: also on the pod IP)"
        );
        // Without inCluster the same port is only on loopback.
        on_admin["inCluster"] = json!(false);
        assert!(config(on_admin).is_ok());
        let mut on_egress = in_cluster;
        on_egress["egress"] = base()["egress"].clone();
        on_egress["egress"][0]["listenPort"] = json!(443);
        assert_eq!(
            error_field(on_egress),
            "ingress[1].port (inCluster: also on the pod IP)"
        );
    }

    #[test]
    fn rejects_bad_input_naming_the_field() {
        type Mutation = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(&str, Mutation, &str)> = vec![
            (
                "egress port = admin port",
                Box::new(|c| c["egress"][0]["listenPort"] = json!(9180)),
                "egress[0].listenPort",
            ),
            (
                "zero connection limit",
                Box::new(|c| {
                    c["limits"] = json!({"maxConnections": 0, "maxConnectionsPerListener": 1})
                }),
                "limits.maxConnections",
            ),
            (
                "per-listener limit above the ceiling",
                Box::new(|c| {
                    c["limits"] = json!({"maxConnections": 1, "maxConnectionsPerListener": 100000})
                }),
                "limits.maxConnectionsPerListener",
            ),
            (
                "zero per-source limit",
                Box::new(|c| {
                    c["limits"] = json!({"maxConnections": 10, "maxConnectionsPerListener": 5,
                                         "maxConnectionsPerSource": 0})
                }),
                "limits.maxConnectionsPerSource",
            ),
            (
                "zero idle timeout",
                Box::new(|c| {
                    c["limits"] = json!({"maxConnections": 10, "maxConnectionsPerListener": 5,
                                         "idleTimeoutSeconds": 0})
                }),
                "limits.idleTimeoutSeconds",
            ),
            (
                "zero probe interval",
                Box::new(|c| c["egress"][0]["probeIntervalSeconds"] = json!(0)),
                "egress[0].probeIntervalSeconds",
            ),
            (
                "empty target",
                Box::new(|c| c["egress"][0]["targetHost"] = json!(" ")),
                "egress[0].targetHost",
            ),
            (
                "two ingress listeners on one port",
                Box::new(|c| c["ingress"][0]["port"] = json!(443)),
                "ingress[1].port",
            ),
            (
                "http without certificate",
                Box::new(|c| {
                    c.as_object_mut().map(|o| o.remove("tls"));
                }),
                "ingress[1].routes[0].tls",
            ),
            (
                "empty agent-level certificate",
                Box::new(|c| c["tls"]["keyFile"] = json!(" ")),
                "tls",
            ),
            (
                "one hostname in two routes of a port",
                Box::new(|c| {
                    c["ingress"][1]["routes"] = json!([
                        route("a", &["portal.example.net"]),
                        route("b", &["Portal.Example.Net."])
                    ])
                }),
                "ingress[1].routes[1].hostnames",
            ),
            (
                "host:port as hostname",
                Box::new(|c| c["ingress"][1]["routes"][0]["hostnames"] = json!(["a.b:443"])),
                "ingress[1].routes[0].hostnames",
            ),
            (
                "duplicate names",
                Box::new(|c| c["ingress"][0]["name"] = json!("db")),
                "ingress[0].name",
            ),
            (
                "zero timeout",
                Box::new(|c| c["ingress"][1]["routes"][0]["requestTimeoutSeconds"] = json!(0)),
                "ingress[1].routes[0].requestTimeoutSeconds",
            ),
            (
                "zero millisecond timeout",
                Box::new(|c| {
                    c["ingress"][1]["routes"][0]["backendRequestTimeoutMillis"] = json!(0);
                }),
                "ingress[1].routes[0].backendRequestTimeoutMillis",
            ),
            (
                "backend TLS without CA",
                Box::new(|c| {
                    c["ingress"][1]["routes"][0]["backendTls"] =
                        json!({"serverName": "a", "caFile": ""})
                }),
                "ingress[1].routes[0].backendTls.caFile",
            ),
        ];
        for (what, mutate, field) in cases {
            let mut value = base();
            mutate(&mut value);
            assert_eq!(error_field(value), field, "{what}");
        }
    }

    fn gateway() -> serde_json::Value {
        json!({
            "localapiSocket": "/var/run/tailscale/tailscaled.sock",
            "adminPort": 9180,
            "ingress": [
                {"mode": "plainHttp", "port": 80, "routes": [
                    {"name": "web", "hostnames": ["*.example.net", "example.net"], "rules": [
                        {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                         "backends": [{"backend": {"host": "api.a.svc", "port": 80}, "weight": 1}]}
                    ]},
                    {"name": "all", "hostnames": ["*"], "backend": {"host": "web.a.svc", "port": 80}}
                ]},
                {"mode": "tlsPassthrough", "port": 443, "routes": [
                    {"name": "db", "hostnames": ["db.example.net", "*.db.example.net"],
                     "backends": [{"backend": {"host": "db.a.svc", "port": 5432}}]}
                ]}
            ]
        })
    }

    /// Plain HTTP and passthrough listeners need no certificate; wildcards and `*` are
    /// hostnames there (and in `http` listeners).
    #[test]
    fn accepts_a_gateway_config_without_certificate() {
        let config = config(gateway()).expect("valid");
        assert_eq!(config.ingress.len(), 2);
        let mut with_http = gateway();
        with_http["ingress"][0]["mode"] = json!("http");
        assert_eq!(error_field(with_http.clone()), "ingress[0].routes[0].tls");
        with_http["tls"] = json!({"certFile": "/c", "keyFile": "/k"});
        assert!(config_ok(with_http));
    }

    /// A Gateway listener nothing is attached to yet is still served (its Gateway must be
    /// Programmed): every mode accepts an empty route list.
    #[test]
    fn accepts_listeners_without_routes() {
        let mut empty = gateway();
        empty["ingress"][0]["routes"] = json!([]);
        empty["ingress"][1]["routes"] = json!([]);
        let config = config(empty.clone()).expect("valid");
        assert_eq!(config.ingress.len(), 2);
        empty["ingress"][0]["mode"] = json!("http");
        assert!(config_ok(empty));
        // A route with neither backend nor rules serves its names with 404.
        let mut answers_404 = gateway();
        answers_404["ingress"][0]["routes"][1]
            .as_object_mut()
            .map(|route| route.remove("backend"));
        assert!(config_ok(answers_404));
    }

    /// An `http` listener's routes may each carry their own certificate; routes without one
    /// need the agent-level `tls`; `plainHttp` routes carry none.
    #[test]
    fn route_certificates_are_checked_naming_the_field() {
        let own = json!({"certFile": "/gw/a/tls.crt", "keyFile": "/gw/a/tls.key"});
        let mut https = gateway();
        https["ingress"][0]["mode"] = json!("http");
        https["ingress"][0]["routes"][0]["tls"] = own.clone();
        https["ingress"][0]["routes"][1]["tls"] = own.clone();
        assert!(
            config_ok(https.clone()),
            "every route has its own: no agent-level tls"
        );

        type Mutation = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(&str, Mutation, &str)> = vec![
            (
                "a route without its own and no agent-level tls",
                Box::new(|c| {
                    c["ingress"][0]["routes"][1]
                        .as_object_mut()
                        .map(|route| route.remove("tls"));
                }),
                "ingress[0].routes[1].tls",
            ),
            (
                "an empty key file",
                Box::new(|c| c["ingress"][0]["routes"][0]["tls"]["keyFile"] = json!("")),
                "ingress[0].routes[0].tls",
            ),
            (
                "an empty certificate file",
                Box::new(|c| c["ingress"][0]["routes"][1]["tls"]["certFile"] = json!(" ")),
                "ingress[0].routes[1].tls",
            ),
            (
                "a certificate on a plainHttp route",
                Box::new(|c| c["ingress"][0]["mode"] = json!("plainHttp")),
                "ingress[0].routes[0].tls",
            ),
        ];
        for (what, mutate, field) in cases {
            let mut value = https.clone();
            mutate(&mut value);
            assert_eq!(error_field(value), field, "{what}");
        }

        // With the agent-level certificate a route may go without its own.
        let mut mixed = https.clone();
        mixed["ingress"][0]["routes"][1]
            .as_object_mut()
            .map(|route| route.remove("tls"));
        mixed["tls"] = json!({"certFile": "/c", "keyFile": "/k"});
        let parsed = config(mixed).expect("valid");
        let IngressListener::Http { routes, .. } = &parsed.ingress[0] else {
            panic!("http listener");
        };
        assert!(routes[0].tls.is_some() && routes[1].tls.is_none());
        // A certificate on a passthrough route is not a field at all.
        let mut passthrough = gateway();
        passthrough["ingress"][1]["routes"][0]["tls"] = own;
        assert!(matches!(
            parse(passthrough.to_string().as_bytes()),
            Err(ParseError::Json(_))
        ));
    }

    fn config_ok(value: serde_json::Value) -> bool {
        config(value).is_ok()
    }

    /// The fuzz seeds start from valid configs (else the fuzzer starts in the error path).
    #[test]
    fn the_fuzz_seeds_are_valid_configs() {
        for seed in [
            include_str!("../../../fuzz/seeds/agent_config/full.json"),
            include_str!("../../../fuzz/seeds/agent_config/gateway.json"),
            include_str!("../../../fuzz/seeds/agent_config/gateway-https.json"),
        ] {
            let value: serde_json::Value = serde_json::from_str(seed).expect("seed is JSON");
            assert!(config(value).is_ok());
        }
    }

    #[test]
    fn rejects_bad_gateway_input_naming_the_field() {
        type Mutation = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(&str, Mutation, &str)> = vec![
            (
                "backend and rules",
                Box::new(|c| {
                    c["ingress"][0]["routes"][0]["backend"] = json!({"host": "a", "port": 1})
                }),
                "ingress[0].routes[0].backend",
            ),
            (
                "neither backend nor rules, with backendTls",
                Box::new(|c| {
                    c["ingress"][0]["routes"][1]
                        .as_object_mut()
                        .map(|route| route.remove("backend"));
                    c["ingress"][0]["routes"][1]["backendTls"] =
                        json!({"serverName": "a", "caFile": "/ca"});
                }),
                "ingress[0].routes[1].backendTls",
            ),
            (
                "route-level backendTls with rules",
                Box::new(|c| {
                    c["ingress"][0]["routes"][0]["backendTls"] =
                        json!({"serverName": "a", "caFile": "/ca"})
                }),
                "ingress[0].routes[0].backendTls",
            ),
            (
                "a bad rule",
                Box::new(|c| {
                    c["ingress"][0]["routes"][0]["rules"][0]["matches"][0]["path"]["value"] =
                        json!("api")
                }),
                "ingress[0].routes[0].rules[0].matches[0].path.value",
            ),
            (
                "one wildcard in two routes",
                Box::new(|c| c["ingress"][0]["routes"][1]["hostnames"] = json!(["*.Example.net."])),
                "ingress[0].routes[1].hostnames",
            ),
            (
                "a malformed wildcard",
                Box::new(|c| c["ingress"][1]["routes"][0]["hostnames"] = json!(["db.*.net"])),
                "ingress[1].routes[0].hostnames",
            ),
            (
                "TCP backends originate no TLS",
                Box::new(|c| {
                    if let Some(listeners) = c["ingress"].as_array_mut() {
                        listeners.push(json!({
                            "mode": "tcp", "port": 5432, "name": "pg",
                            "backend": {"host": "a.svc", "port": 5432},
                            "backends": [{"backend": {"host": "a.svc", "port": 5432},
                                          "backendTls": {"serverName": "a", "caFile": "/ca"}}]
                        }));
                    }
                }),
                "ingress[2].backends[0].backendTls",
            ),
            (
                "passthrough backend TLS",
                Box::new(|c| {
                    c["ingress"][1]["routes"][0]["backends"][0]["backendTls"] =
                        json!({"serverName": "a", "caFile": "/ca"})
                }),
                "ingress[1].routes[0].backends[0].backendTls",
            ),
            (
                "passthrough weight beyond the bound",
                Box::new(|c| {
                    c["ingress"][1]["routes"][0]["backends"][0]["weight"] = json!(2_000_000)
                }),
                "ingress[1].routes[0].backends[0].weight",
            ),
            (
                "route names are unique across listeners",
                Box::new(|c| c["ingress"][1]["routes"][0]["name"] = json!("web")),
                "ingress[1].routes[0].name",
            ),
            (
                "two listeners on one port",
                Box::new(|c| c["ingress"][1]["port"] = json!(80)),
                "ingress[1].port",
            ),
        ];
        for (what, mutate, field) in cases {
            let mut value = gateway();
            mutate(&mut value);
            assert_eq!(error_field(value), field, "{what}");
        }
        let mut many_routes = gateway();
        let route = many_routes["ingress"][1]["routes"][0].clone();
        many_routes["ingress"][1]["routes"] = json!(
            (0..=MAX_ROUTES_PER_LISTENER)
                .map(|index| {
                    let mut route = route.clone();
                    route["name"] = json!(format!("db-{index}"));
                    route["hostnames"] = json!([format!("db-{index}.example.net")]);
                    route
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(error_field(many_routes), "ingress[1].routes");
    }

    #[test]
    fn unknown_fields_are_a_parse_error() {
        let mut value = base();
        value["surprise"] = json!(true);
        assert!(matches!(
            parse(value.to_string().as_bytes()),
            Err(ParseError::Json(_))
        ));
    }

    #[test]
    fn hostnames_compare_case_insensitively_without_trailing_dot() {
        assert_eq!(
            normalize_hostname("Portal.Example.NET."),
            "portal.example.net"
        );
    }
}
