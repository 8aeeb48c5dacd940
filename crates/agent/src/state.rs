//! What the agent knows about itself: tailnet state from the LocalAPI, listeners, probe
//! results, certificate, config. Feeds `/readyz`, `/status` and the dial gate.
//!
//! The `/status` document ([`StatusReport`]) is what the operator reads to fill
//! `TargetsReachable`/`BackendsReachable`; its types derive `Deserialize` for that reader.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::watch;

use crate::limits::Gate;
use crate::localapi::{self, DialFailureReason};

pub use tailnet_api::agent_status::{
    CertificateView, ConfigView, ListenerKind, ListenerView, ProbeState, ProbeView, StatusReport,
    TailnetView,
};

/// The probe state a failed dial stands for.
pub fn probe_state_from_dial_failure(reason: DialFailureReason) -> ProbeState {
    match reason {
        DialFailureReason::DialSelf => ProbeState::NoRoute,
        DialFailureReason::Refused => ProbeState::Refused,
        DialFailureReason::Timeout => ProbeState::Timeout,
        DialFailureReason::Error => ProbeState::Error,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Target,
    Backend,
}

/// Whether the tailnet is connected, for tasks that wait for it (the first target probe).
#[derive(Debug)]
struct Connectivity(watch::Sender<bool>);

impl Default for Connectivity {
    fn default() -> Self {
        Connectivity(watch::Sender::new(false))
    }
}

#[derive(Debug, Default)]
pub struct AgentState {
    tailnet: RwLock<TailnetView>,
    connectivity: Connectivity,
    listeners: RwLock<BTreeMap<String, ListenerView>>,
    /// The connection gates of the listeners, by key: `/status` reads their live counts.
    gates: RwLock<BTreeMap<String, Arc<Gate>>>,
    probes: RwLock<BTreeMap<(ProbeKind, String), ProbeView>>,
    /// Probes (with an interval) that have no result yet. Until the agent is first ready, it
    /// waits for them: a pod that turns ready has its first results in `/status`, so the
    /// operator, woken by the readiness change, reports reachability at once.
    first_results_pending: RwLock<BTreeSet<(ProbeKind, String)>>,
    /// Set once the agent was ready: from then on probes never affect readiness (a target
    /// added later must not take the pod out of its Service).
    started: AtomicBool,
    certificate: RwLock<CertificateView>,
    config: RwLock<ConfigView>,
    shutting_down: AtomicBool,
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl AgentState {
    pub fn new() -> Self {
        AgentState::default()
    }

    /// Records a LocalAPI status answer.
    pub fn set_tailnet_status(&self, status: &localapi::Status) {
        let tailnet_ips = status.tailscale_ips.clone().unwrap_or_default();
        let connected = status.backend_state == "Running" && !tailnet_ips.is_empty();
        let dial_self_supported = localapi::supports_dial_self(&status.version);
        let mut message = String::new();
        if !connected {
            message = format!(
                "tailscaled is {} without tailnet IPs",
                if status.backend_state.is_empty() {
                    "in an unknown state"
                } else {
                    status.backend_state.as_str()
                }
            );
            if status.backend_state == "Running" {
                message = "tailscaled is Running but has no tailnet IP yet".into();
            }
        }
        if !dial_self_supported {
            message = format!(
                "tailscaled {:?} is older than 1.98: its LocalAPI dial has no Dial-Self answer and would dial unrouted targets from the pod network, so egress dials are refused",
                status.version
            );
        }
        self.connectivity.0.send_if_modified(|current| {
            let changed = *current != connected;
            *current = connected;
            changed
        });
        *write(&self.tailnet) = TailnetView {
            connected,
            backend_state: status.backend_state.clone(),
            tailnet_ips,
            version: status.version.clone(),
            dial_self_supported,
            message,
        };
    }

    /// Records that the LocalAPI could not be asked.
    pub fn set_tailnet_unreachable(&self, message: String) {
        let mut tailnet = write(&self.tailnet);
        tailnet.connected = false;
        tailnet.backend_state = String::new();
        tailnet.message = message;
        // The version stays as last seen: tailscaled restarting does not downgrade it.
        self.connectivity
            .0
            .send_if_modified(|current| std::mem::replace(current, false));
    }

    /// Follows whether the tailnet is connected (`true`: Running with a tailnet IP).
    pub fn connectivity(&self) -> watch::Receiver<bool> {
        self.connectivity.0.subscribe()
    }

    pub fn tailnet(&self) -> TailnetView {
        read(&self.tailnet).clone()
    }

    /// Egress may dial only through a tailscaled known to answer Dial-Self.
    pub fn dial_permitted(&self) -> Result<(), String> {
        let tailnet = read(&self.tailnet);
        if tailnet.dial_self_supported {
            return Ok(());
        }
        if tailnet.version.is_empty() {
            return Err("tailscaled's version is not known yet (no LocalAPI status so far); refusing to dial".into());
        }
        Err(tailnet.message.clone())
    }

    pub fn set_listener(&self, key: &str, view: ListenerView) {
        write(&self.listeners).insert(key.to_owned(), view);
    }

    pub fn remove_listener(&self, key: &str) {
        write(&self.listeners).remove(key);
        write(&self.gates).remove(key);
    }

    /// The gate whose limit and counts `/status` shows for the listener `key`.
    pub fn set_listener_gate(&self, key: &str, gate: Arc<Gate>) {
        write(&self.gates).insert(key.to_owned(), gate);
    }

    pub fn listeners(&self) -> Vec<ListenerView> {
        let gates = read(&self.gates);
        read(&self.listeners)
            .iter()
            .map(|(key, view)| {
                let mut view = view.clone();
                if let Some(gate) = gates.get(key) {
                    view.max_connections = gate.limit();
                    view.active_connections = gate.active();
                    view.refused_connections = gate.refused();
                    view.reclaimed_connections = gate.reclaimed();
                }
                view
            })
            .collect()
    }

    /// Registers a probed target/backend (state `Unknown`) or updates its address, keeping
    /// the last result when the address is unchanged. `probed`: an interval is set, so a
    /// first result will come (readiness at start waits for it).
    pub fn declare_probe(
        &self,
        kind: ProbeKind,
        name: &str,
        address: &str,
        message: &str,
        probed: bool,
    ) {
        let mut probes = write(&self.probes);
        let entry = probes
            .entry((kind, name.to_owned()))
            .or_insert_with(|| ProbeView {
                name: name.to_owned(),
                address: address.to_owned(),
                state: ProbeState::Unknown,
                message: message.to_owned(),
                last_probe: None,
            });
        if entry.address != address {
            entry.address = address.to_owned();
            entry.state = ProbeState::Unknown;
            entry.message = message.to_owned();
            entry.last_probe = None;
        } else if entry.state == ProbeState::Unknown {
            entry.message = message.to_owned();
        }
        let mut pending = write(&self.first_results_pending);
        let key = (kind, name.to_owned());
        if probed && entry.last_probe.is_none() {
            pending.insert(key);
        } else {
            pending.remove(&key);
        }
    }

    /// Keeps only the probes named in `keep`.
    pub fn retain_probes(&self, keep: &[(ProbeKind, String)]) {
        write(&self.probes).retain(|key, _| keep.contains(key));
        write(&self.first_results_pending).retain(|key| keep.contains(key));
    }

    /// The message of a probe that has no result yet (e.g. why it waits).
    pub fn set_probe_pending(&self, kind: ProbeKind, name: &str, message: &str) {
        if let Some(entry) = write(&self.probes).get_mut(&(kind, name.to_owned()))
            && entry.last_probe.is_none()
        {
            entry.message = message.to_owned();
        }
    }

    pub fn set_probe_result(
        &self,
        kind: ProbeKind,
        name: &str,
        state: ProbeState,
        message: String,
    ) {
        write(&self.first_results_pending).remove(&(kind, name.to_owned()));
        if let Some(entry) = write(&self.probes).get_mut(&(kind, name.to_owned())) {
            entry.state = state;
            entry.message = message;
            entry.last_probe = Some(
                jiff::Timestamp::now()
                    .round(jiff::Unit::Second)
                    .map_or_else(
                        |_| jiff::Timestamp::now().to_string(),
                        |rounded| rounded.to_string(),
                    ),
            );
        }
    }

    pub fn probes(&self, kind: ProbeKind) -> Vec<ProbeView> {
        read(&self.probes)
            .iter()
            .filter(|((probe_kind, _), _)| *probe_kind == kind)
            .map(|(_, view)| view.clone())
            .collect()
    }

    pub fn set_certificate(&self, view: CertificateView) {
        *write(&self.certificate) = view;
    }

    pub fn certificate(&self) -> CertificateView {
        read(&self.certificate).clone()
    }

    pub fn set_config_reload_error(&self, message: String) {
        write(&self.config).reload_error = message;
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Ready = tailnet connected AND every configured listener up (and not shutting down);
    /// the first time also every probe's first result known (see `first_results_pending`).
    pub fn readiness(&self) -> Result<(), Vec<String>> {
        let mut reasons = self.serving_problems();
        if !self.started.load(Ordering::SeqCst) {
            reasons.extend(
                read(&self.first_results_pending)
                    .iter()
                    .map(|(kind, name)| {
                        let kind = match kind {
                            ProbeKind::Target => "target",
                            ProbeKind::Backend => "backend",
                        };
                        format!("starting: the first probe of {kind} {name} has no result yet")
                    }),
            );
            if reasons.is_empty() {
                self.started.store(true, Ordering::SeqCst);
            }
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons)
        }
    }

    /// Why the agent cannot serve now (shutting down, tailnet, listeners).
    fn serving_problems(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        if self.is_shutting_down() {
            reasons.push("shutting down".to_owned());
        }
        let tailnet = self.tailnet();
        if !tailnet.connected {
            reasons.push(format!("tailnet not connected: {}", tailnet.message));
        } else if !tailnet.dial_self_supported {
            reasons.push(tailnet.message.clone());
        }
        for listener in self.listeners() {
            if !listener.up {
                reasons.push(format!(
                    "listener {} ({:?} on {}) is not up: {}",
                    listener.name, listener.kind, listener.address, listener.message
                ));
            }
        }
        reasons
    }

    pub fn report(&self) -> StatusReport {
        let (ready, reasons) = match self.readiness() {
            Ok(()) => (true, Vec::new()),
            Err(reasons) => (false, reasons),
        };
        StatusReport {
            ready,
            reasons,
            tailnet: self.tailnet(),
            listeners: self.listeners(),
            targets: self.probes(ProbeKind::Target),
            backends: self.probes(ProbeKind::Backend),
            certificate: self.certificate(),
            config: read(&self.config).clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: &str, version: &str, ips: &[&str]) -> localapi::Status {
        localapi::Status {
            version: version.into(),
            backend_state: state.into(),
            tailscale_ips: Some(ips.iter().map(|ip| ip.to_string()).collect()),
            health: None,
        }
    }

    fn listener(up: bool) -> ListenerView {
        ListenerView {
            name: "db".into(),
            kind: ListenerKind::Egress,
            address: "10.0.0.5:10000".into(),
            up,
            message: if up {
                String::new()
            } else {
                "bind failed".into()
            },
            max_connections: 0,
            active_connections: 0,
            refused_connections: 0,
            reclaimed_connections: 0,
        }
    }

    #[test]
    fn ready_needs_a_connected_tailnet_and_all_listeners_up() {
        let state = AgentState::new();
        assert!(state.readiness().is_err(), "nothing known yet");
        state.set_tailnet_status(&status("Running", "1.102.5", &["100.64.0.7"]));
        state.set_listener("a", listener(true));
        assert_eq!(state.readiness(), Ok(()));
        state.set_listener("b", listener(false));
        let reasons = state.readiness().err().unwrap_or_default();
        assert!(reasons[0].contains("bind failed"), "{reasons:?}");
        state.remove_listener("b");
        state.set_tailnet_status(&status("Starting", "1.102.5", &[]));
        assert!(state.readiness().is_err());
        state.set_tailnet_status(&status("Running", "1.102.5", &["100.64.0.7"]));
        state.begin_shutdown();
        assert!(state.readiness().is_err());
    }

    #[test]
    fn the_first_readiness_waits_for_every_probe_s_first_result_and_later_ones_do_not() {
        let state = AgentState::new();
        state.set_tailnet_status(&status("Running", "1.102.5", &["100.64.0.7"]));
        state.set_listener("a", listener(true));
        state.declare_probe(ProbeKind::Target, "db", "192.0.2.10:5432", "waiting", true);
        state.declare_probe(ProbeKind::Target, "off", "192.0.2.11:5432", "off", false);
        let reasons = state.readiness().err().unwrap_or_default();
        assert_eq!(
            reasons,
            ["starting: the first probe of target db has no result yet"],
            "a probe without interval is not waited for"
        );
        // A failed first result counts: readiness is about knowing, not about reachability.
        state.set_probe_result(ProbeKind::Target, "db", ProbeState::Timeout, "t".into());
        assert_eq!(state.readiness(), Ok(()));
        // Once started, a new target (not probed yet) does not take the pod out of service.
        state.declare_probe(ProbeKind::Target, "new", "192.0.2.12:5432", "waiting", true);
        assert_eq!(state.readiness(), Ok(()));
        // The tailnet still matters.
        state.set_tailnet_unreachable("socket gone".into());
        assert!(state.readiness().is_err());
    }

    #[test]
    fn connectivity_follows_the_tailnet_state() {
        let state = AgentState::new();
        let mut connected = state.connectivity();
        assert!(!*connected.borrow_and_update());
        state.set_tailnet_status(&status("Starting", "1.102.5", &[]));
        assert!(
            !connected.has_changed().unwrap_or(true),
            "no change, no wake-up"
        );
        state.set_tailnet_status(&status("Running", "1.102.5", &["100.64.0.7"]));
        assert!(*connected.borrow_and_update());
        state.set_tailnet_unreachable("socket gone".into());
        assert!(!*connected.borrow_and_update());
    }

    #[test]
    fn dialing_is_gated_on_a_dial_self_capable_tailscaled() {
        let state = AgentState::new();
        assert!(state.dial_permitted().is_err(), "version unknown");
        state.set_tailnet_status(&status("Running", "1.96.2", &["100.64.0.7"]));
        let message = state.dial_permitted().err().unwrap_or_default();
        assert!(message.contains("older than 1.98"), "{message}");
        assert!(state.readiness().is_err());
        state.set_tailnet_status(&status("Starting", "1.98.0", &[]));
        assert_eq!(state.dial_permitted(), Ok(()));
        state.set_tailnet_unreachable("socket gone".into());
        assert_eq!(
            state.dial_permitted(),
            Ok(()),
            "a restart keeps the known version"
        );
    }

    #[test]
    fn probes_keep_results_until_their_address_changes() {
        let state = AgentState::new();
        state.declare_probe(
            ProbeKind::Target,
            "db",
            "192.0.2.10:5432",
            "not probed yet",
            true,
        );
        state.set_probe_result(
            ProbeKind::Target,
            "db",
            ProbeState::Reachable,
            String::new(),
        );
        state.declare_probe(
            ProbeKind::Target,
            "db",
            "192.0.2.10:5432",
            "not probed yet",
            true,
        );
        let db = &state.probes(ProbeKind::Target)[0];
        assert_eq!(db.state, ProbeState::Reachable);
        assert!(db.last_probe.is_some());
        state.declare_probe(
            ProbeKind::Target,
            "db",
            "192.0.2.11:5432",
            "not probed yet",
            true,
        );
        assert_eq!(
            state.probes(ProbeKind::Target)[0].state,
            ProbeState::Unknown
        );
        state.retain_probes(&[]);
        assert!(state.probes(ProbeKind::Target).is_empty());
    }

    #[test]
    fn the_status_document_has_the_documented_shape() {
        let state = AgentState::new();
        state.declare_probe(
            ProbeKind::Target,
            "db",
            "192.0.2.10:5432",
            "not probed yet",
            true,
        );
        state.set_probe_result(
            ProbeKind::Target,
            "db",
            ProbeState::NoRoute,
            "Dial-Self".into(),
        );
        let json = serde_json::to_value(state.report()).unwrap_or_default();
        assert_eq!(json["targets"][0]["name"], "db");
        assert_eq!(json["targets"][0]["state"], "NoRoute");
        assert!(json["targets"][0]["lastProbe"].is_string());
        assert_eq!(json["ready"], false);
    }
}
