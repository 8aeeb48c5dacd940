//! Loading and semantic validation of the agent config (`tailnet_api::agent_config`). The
//! operator renders it; the agent still checks it, because a config that would bind one port
//! twice or route one hostname two ways must fail loudly instead of half-working.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tailnet_api::agent_config::{AgentConfig, HttpRoute, IngressListener};

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
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
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
    let mut has_http = false;
    for (index, listener) in config.ingress.iter().enumerate() {
        let at = format!("ingress[{index}]");
        match listener {
            IngressListener::Tcp {
                port,
                name,
                backend,
            } => {
                require_name(name, &format!("{at}.name"))?;
                if !names.insert(name.clone()) {
                    return Err(invalid(format!("{at}.name"), "duplicate listener name"));
                }
                claim_port(&mut loopback_ports, *port, &format!("{at}.port"))?;
                require_backend(&backend.host, backend.port, &format!("{at}.backend"))?;
            }
            IngressListener::Http { port, routes } => {
                has_http = true;
                claim_port(&mut loopback_ports, *port, &format!("{at}.port"))?;
                if routes.is_empty() {
                    return Err(invalid(format!("{at}.routes"), "must not be empty"));
                }
                let mut hostnames = BTreeMap::new();
                for (route_index, route) in routes.iter().enumerate() {
                    let at = format!("{at}.routes[{route_index}]");
                    validate_route(route, &at)?;
                    if !names.insert(route.name.clone()) {
                        return Err(invalid(format!("{at}.name"), "duplicate listener name"));
                    }
                    for hostname in &route.hostnames {
                        let normalized = normalize_hostname(hostname);
                        if let Some(other) = hostnames.insert(normalized, route.name.clone()) {
                            return Err(invalid(
                                format!("{at}.hostnames"),
                                format!("{hostname} is also served by route {other} on this port"),
                            ));
                        }
                    }
                }
            }
        }
    }
    // In-cluster twins of the ingress listeners bind the pod IP, beside admin and egress.
    if config.in_cluster {
        for (index, listener) in config.ingress.iter().enumerate() {
            let port = match listener {
                IngressListener::Tcp { port, .. } | IngressListener::Http { port, .. } => *port,
            };
            claim_port(
                &mut pod_ip_ports,
                port,
                &format!("ingress[{index}].port (inCluster: also on the pod IP)"),
            )?;
        }
    }
    if has_http && config.tls.is_none() {
        return Err(invalid(
            "tls",
            "http ingress listeners need certFile and keyFile",
        ));
    }
    if let Some(tls) = &config.tls
        && (tls.cert_file.trim().is_empty() || tls.key_file.trim().is_empty())
    {
        return Err(invalid("tls", "certFile and keyFile must not be empty"));
    }
    Ok(())
}

fn validate_route(route: &HttpRoute, at: &str) -> Result<(), ConfigError> {
    require_name(&route.name, &format!("{at}.name"))?;
    if route.hostnames.is_empty() {
        return Err(invalid(format!("{at}.hostnames"), "must not be empty"));
    }
    for hostname in &route.hostnames {
        if !is_plausible_hostname(hostname) {
            return Err(invalid(
                format!("{at}.hostnames"),
                format!("{hostname:?} is not a DNS name"),
            ));
        }
    }
    require_backend(
        &route.backend.host,
        route.backend.port,
        &format!("{at}.backend"),
    )?;
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

/// Letters, digits, `-` and dots, labels of 1-63 characters; enough to reject a URL or a
/// `host:port` that slipped into the hostnames.
fn is_plausible_hostname(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
        })
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
