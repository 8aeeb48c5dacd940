//! What validation returns: the declarations with every field parsed once (ports as `u16`,
//! durations as [`Duration`], addresses as [`TargetAddress`]), so renderers never re-parse
//! and cannot meet an invalid value.

use std::fmt;
use std::time::Duration;

use crate::ingress::{BackendTls, ExposeMode};
use crate::tailnet::{IssuerRef, TailnetPolicy};

use super::TargetAddress;

/// Probe interval of a target that does not set one.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// A checked Tailnet spec.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidTailnet {
    /// The Headscale URL (http or https).
    pub server: String,
    /// Where the DNS entries go; `None` renders none.
    pub hosts_config_map: Option<HostsConfigMap>,
    pub ingress_name_template: Option<String>,
    pub ingress_alias_template: Option<String>,
    /// The issuer of ingress certificates when an ingress names no Secret.
    pub issuer: Option<IssuerRef>,
    pub policy: TailnetPolicy,
}

/// `spec.dns.hostsConfigMap` and its namespace (`None`: the operator namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostsConfigMap {
    pub name: String,
    pub namespace: Option<String>,
}

/// A checked TailnetEgress spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidEgress {
    pub consumer_namespaces: Vec<String>,
    /// In declaration order.
    pub targets: Vec<ValidTarget>,
    /// `spec.limits` resolved against the defaults.
    pub limits: crate::agent_config::ConnectionLimits,
}

/// One checked egress target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidTarget {
    /// Also the name of its Service.
    pub name: String,
    pub address: TargetAddress,
    pub port: u16,
    pub aliases: Vec<String>,
    /// `None`: the probe is switched off.
    pub probe_interval: Option<Duration>,
}

/// A checked TailnetIngress spec.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidIngress {
    pub allow_from: Vec<String>,
    /// `spec.tls.secretName`: the user's certificate Secret, else one is issued.
    pub tls_secret_name: Option<String>,
    /// In declaration order.
    pub exposes: Vec<ValidExpose>,
    /// `spec.limits` resolved against the defaults.
    pub limits: crate::agent_config::ConnectionLimits,
    /// `spec.inCluster.namespaces`, sorted and unique (empty: no in-cluster entrance).
    pub in_cluster_namespaces: Vec<String>,
}

/// One checked expose.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidExpose {
    pub name: String,
    pub dns_label: String,
    pub alias: bool,
    pub mode: ExposeMode,
    pub port: u16,
    pub backend: ValidBackend,
    pub timeouts: ValidTimeouts,
}

/// The backend of one expose; its port is resolved against the Service later (that needs
/// the cluster).
#[derive(Clone, Debug, PartialEq)]
pub struct ValidBackend {
    pub service: String,
    /// `None`: the ingress's own namespace.
    pub namespace: Option<String>,
    pub port: BackendPort,
    pub tls: Option<BackendTls>,
}

impl ValidBackend {
    /// The namespace the Service lives in, for an ingress in `ingress_namespace`.
    pub fn namespace_or<'a>(&'a self, ingress_namespace: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(ingress_namespace)
    }
}

/// `backend.port`: a Service port number or the name of a Service port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BackendPort {
    Number(u16),
    Name(String),
}

impl fmt::Display for BackendPort {
    /// As the status messages say it: `8080` or `named "http"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendPort::Number(n) => write!(f, "{n}"),
            BackendPort::Name(name) => write!(f, "named {name:?}"),
        }
    }
}

/// `timeouts` of an http expose; `None` leaves the agent's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValidTimeouts {
    pub request: Option<Duration>,
    pub backend_request: Option<Duration>,
}
