//! The agent's `/status` document: the contract between `tailnet-agent` (which serves it on
//! its admin port) and the operator (which reads it to fill `TargetsReachable` and
//! `BackendsReachable`). Like [`crate::agent_config`], it is plain data with no I/O.

use serde::{Deserialize, Serialize};

/// Result of the last reachability probe of a target or backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeState {
    /// Not probed yet, or probing is switched off.
    Unknown,
    Reachable,
    /// tailscaled answered Dial-Self: the target is not routed through the tailnet.
    NoRoute,
    Refused,
    /// No answer in time: the ACL drops it, or the target is down.
    Timeout,
    Error,
}

impl ProbeState {
    pub fn label(self) -> &'static str {
        match self {
            ProbeState::Unknown => "Unknown",
            ProbeState::Reachable => "Reachable",
            ProbeState::NoRoute => "NoRoute",
            ProbeState::Refused => "Refused",
            ProbeState::Timeout => "Timeout",
            ProbeState::Error => "Error",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeView {
    pub name: String,
    /// `host:port` that is probed.
    pub address: String,
    pub state: ProbeState,
    pub message: String,
    /// RFC 3339 time of the last probe, absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe: Option<String>,
}

/// tailscaled's `BackendState` once it is up (logged in, on the tailnet).
pub const BACKEND_RUNNING: &str = "Running";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TailnetView {
    /// BackendState `Running` with at least one tailnet IP.
    pub connected: bool,
    pub backend_state: String,
    pub tailnet_ips: Vec<String>,
    pub version: String,
    /// Whether this tailscaled answers Dial-Self (≥ 1.98); egress dials are refused otherwise.
    pub dial_self_supported: bool,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    Egress,
    Tcp,
    Http,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerView {
    pub name: String,
    pub kind: ListenerKind,
    /// `ip:port` it binds.
    pub address: String,
    pub up: bool,
    pub message: String,
    /// Concurrent connections this listener serves at most (0: unknown, an older agent).
    #[serde(default)]
    pub max_connections: u32,
    /// Connections open now.
    #[serde(default)]
    pub active_connections: u64,
    /// Connections reset at accept since the agent started because a limit was reached.
    #[serde(default)]
    pub refused_connections: u64,
    /// Held egress connections (client sent EOF, target silent) ended to admit new ones
    /// since the agent started.
    #[serde(default)]
    pub reclaimed_connections: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateView {
    /// An `http` listener is configured, so a certificate is needed.
    pub required: bool,
    pub loaded: bool,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigView {
    /// Empty while the file in use is the last one read; else why the newer one was rejected.
    pub reload_error: String,
}

/// `GET /status` on the admin listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub ready: bool,
    /// Why not ready; empty when ready.
    pub reasons: Vec<String>,
    pub tailnet: TailnetView,
    pub listeners: Vec<ListenerView>,
    /// Egress targets (probed through the tailnet).
    pub targets: Vec<ProbeView>,
    /// Ingress backends (probed with a TCP connect from the pod).
    pub backends: Vec<ProbeView>,
    pub certificate: CertificateView,
    pub config: ConfigView,
}
