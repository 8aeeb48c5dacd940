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
                forget_series(&deps.metrics, key.0, &key.1);
            }
            wanted
        });
        deps.state.retain_probes(&keep);
        let mut to_start = Vec::new();
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
            deps.state.declare_probe(
                spec.kind,
                &spec.name,
                &spec.address(),
                initial,
                spec.interval.is_some(),
            );
            let stop = CancellationToken::new();
            if let Some(interval) = spec.interval {
                to_start.push((spec.clone(), interval, stop.clone()));
            }
            self.running.insert(key, (spec.clone(), stop));
        }
        // Every probe is declared (pending its first result) before the first one runs: a
        // fast first result must not leave the pending set empty while others are undeclared.
        for (spec, interval, stop) in to_start {
            tokio::spawn(probe_loop(spec, interval, deps.clone(), stop));
        }
    }

    pub fn stop_all(&mut self) {
        for (_, (_, stop)) in self.running.drain() {
            stop.cancel();
        }
    }
}

/// The label of a probe kind in metrics.
fn kind_label(kind: ProbeKind) -> &'static str {
    match kind {
        ProbeKind::Target => "target",
        ProbeKind::Backend => "backend",
    }
}

/// Drops the metric series of a probe that left the config: a removed target must not keep
/// its last `probe_reachable` (an unreachable one would keep its alert firing).
fn forget_series(metrics: &Metrics, kind: ProbeKind, name: &str) {
    let kind = kind_label(kind);
    metrics.probe_reachable.remove(&ProbeTargetLabels {
        kind: kind.into(),
        name: name.to_owned(),
    });
    for state in [
        ProbeState::Unknown,
        ProbeState::Reachable,
        ProbeState::NoRoute,
        ProbeState::Refused,
        ProbeState::Timeout,
        ProbeState::Error,
    ] {
        metrics.probes.remove(&ProbeLabels {
            kind: kind.into(),
            name: name.to_owned(),
            state: state.label().into(),
        });
    }
}

/// The first retry after a failed probe; each further failure doubles it, up to the
/// probe's interval. At start a target often fails once or twice (the remote peer has not
/// yet got the netmap with this node): retried within seconds, not an interval later.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The wait before the next probe: the interval after a success, a doubling backoff (from
/// [`FIRST_RETRY`], capped at the interval) after consecutive failures.
fn next_probe_delay(interval: Duration, consecutive_failures: u32) -> Duration {
    if consecutive_failures == 0 {
        return interval;
    }
    let doublings = (consecutive_failures - 1).min(16);
    FIRST_RETRY.saturating_mul(1u32 << doublings).min(interval)
}

async fn probe_loop(spec: ProbeSpec, interval: Duration, deps: ProbeDeps, stop: CancellationToken) {
    let kind_label = kind_label(spec.kind);
    // A target is dialed through the tailnet: its first probe waits for the connection
    // (a dial before it can only fail), and runs the moment it is up.
    if spec.kind == ProbeKind::Target {
        let mut connectivity = deps.state.connectivity();
        if !*connectivity.borrow_and_update() {
            deps.state.set_probe_pending(
                spec.kind,
                &spec.name,
                "waiting for the tailnet connection",
            );
            tokio::select! {
                () = stop.cancelled() => return,
                _ = connectivity.wait_for(|connected| *connected) => {}
            }
        }
    }
    let mut consecutive_failures = 0u32;
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
        consecutive_failures = if state == ProbeState::Reachable {
            0
        } else {
            consecutive_failures.saturating_add(1)
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(next_probe_delay(interval, consecutive_failures)) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_that_leaves_the_config_leaves_no_series() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::new(&mut registry);
        for name in ["gone", "kept"] {
            let target = ProbeTargetLabels {
                kind: "target".into(),
                name: name.into(),
            };
            metrics.probe_reachable.get_or_create(&target).set(0);
            metrics
                .probes
                .get_or_create(&ProbeLabels {
                    kind: "target".into(),
                    name: name.into(),
                    state: "Timeout".into(),
                })
                .inc();
        }
        forget_series(&metrics, ProbeKind::Target, "gone");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        assert!(!text.contains("name=\"gone\""), "{text}");
        assert!(text.contains("name=\"kept\""), "{text}");
    }

    #[test]
    fn failures_are_retried_sooner_than_the_interval_and_successes_wait_for_it() {
        let interval = Duration::from_secs(30);
        assert_eq!(next_probe_delay(interval, 0), interval);
        let delays: Vec<u64> = (1..=7)
            .map(|failures| next_probe_delay(interval, failures).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(
            next_probe_delay(Duration::from_secs(2), 5),
            Duration::from_secs(2),
            "never longer than a short interval"
        );
        assert_eq!(next_probe_delay(interval, u32::MAX), interval);
    }
}
