//! Reachability probes: egress targets through the tailnet (a LocalAPI dial, no payload),
//! ingress backends with a TCP connect from the pod. Results go to `/status` and metrics.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::dial::{TailnetDialer, error_chain};
use crate::metrics::{Metrics, ProbeLabels, ProbeTargetLabels};
use crate::state::{AgentState, ProbeKind, ProbeState};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    pub kind: ProbeKind,
    pub name: String,
    pub host: String,
    pub port: u16,
    /// `None`: probing switched off (the entry still shows up as `Unknown`).
    pub interval: Option<Duration>,
}

impl ProbeSpec {
    fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

#[derive(Clone)]
pub struct ProbeDeps {
    pub state: Arc<AgentState>,
    pub metrics: Arc<Metrics>,
    pub dialer: TailnetDialer,
    pub connect_timeout: Duration,
}

/// Keeps one probe task per configured target/backend.
#[derive(Default)]
pub struct Prober {
    running: HashMap<(ProbeKind, String), (ProbeSpec, CancellationToken)>,
}

impl Prober {
    pub fn reconcile(&mut self, specs: &[ProbeSpec], deps: &ProbeDeps) {
        let keep: Vec<(ProbeKind, String)> = specs
            .iter()
            .map(|spec| (spec.kind, spec.name.clone()))
            .collect();
        self.running.retain(|key, (_, stop)| {
            let wanted = keep.contains(key);
            if !wanted {
                stop.cancel();
            }
            wanted
        });
        deps.state.retain_probes(&keep);
        for spec in specs {
            let key = (spec.kind, spec.name.clone());
            if let Some((running, stop)) = self.running.get(&key) {
                if running == spec {
                    continue;
                }
                stop.cancel();
            }
            let initial = if spec.interval.is_some() {
                "not probed yet"
            } else {
                "probing is switched off"
            };
            deps.state
                .declare_probe(spec.kind, &spec.name, &spec.address(), initial);
            let stop = CancellationToken::new();
            if let Some(interval) = spec.interval {
                tokio::spawn(probe_loop(
                    spec.clone(),
                    interval,
                    deps.clone(),
                    stop.clone(),
                ));
            }
            self.running.insert(key, (spec.clone(), stop));
        }
    }

    pub fn stop_all(&mut self) {
        for (_, (_, stop)) in self.running.drain() {
            stop.cancel();
        }
    }
}

async fn probe_loop(spec: ProbeSpec, interval: Duration, deps: ProbeDeps, stop: CancellationToken) {
    let kind_label = match spec.kind {
        ProbeKind::Target => "target",
        ProbeKind::Backend => "backend",
    };
    loop {
        let (state, message) = tokio::select! {
            () = stop.cancelled() => return,
            result = probe_once(&spec, &deps) => result,
        };
        debug!(kind = kind_label, name = %spec.name, state = state.label(), detail = %message, "probe");
        deps.metrics
            .probes
            .get_or_create(&ProbeLabels {
                kind: kind_label.into(),
                name: spec.name.clone(),
                state: state.label().into(),
            })
            .inc();
        deps.metrics
            .probe_reachable
            .get_or_create(&ProbeTargetLabels {
                kind: kind_label.into(),
                name: spec.name.clone(),
            })
            .set(i64::from(state == ProbeState::Reachable));
        deps.state
            .set_probe_result(spec.kind, &spec.name, state, message);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

async fn probe_once(spec: &ProbeSpec, deps: &ProbeDeps) -> (ProbeState, String) {
    match spec.kind {
        ProbeKind::Target => match deps.dialer.dial(&spec.host, spec.port).await {
            // Dropping the stream closes it: a connect, no payload.
            Ok(_stream) => (ProbeState::Reachable, String::new()),
            Err(failure) => (
                crate::state::probe_state_from_dial_failure(failure.reason),
                failure.message,
            ),
        },
        ProbeKind::Backend => {
            let connect = TcpStream::connect((spec.host.as_str(), spec.port));
            match tokio::time::timeout(deps.connect_timeout, connect).await {
                Ok(Ok(_stream)) => (ProbeState::Reachable, String::new()),
                Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                    (ProbeState::Refused, error_chain(&error))
                }
                Ok(Err(error)) => (ProbeState::Error, error_chain(&error)),
                Err(_) => (
                    ProbeState::Timeout,
                    format!(
                        "no TCP connection within {}s",
                        deps.connect_timeout.as_secs()
                    ),
                ),
            }
        }
    }
}
