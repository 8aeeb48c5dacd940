//! Accept loops of the listener kinds and the per-connection handlers of `egress` and
//! `tcp`. A listener's settings arrive through a `watch` channel, so a config change applies
//! to new connections while established ones keep running.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tailnet_api::agent_config::{BackendAddress, EgressListener, WeightedBackend};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::dial::{TailnetDialer, error_chain};
use crate::drain::Drain;
use crate::limits::{self, Admission, Gate};
use crate::metrics::{ActiveConnection, Direction, Metrics};
use crate::proxy::{HttpSite, ProxyContext, serve_connection};
use crate::relay::{HalfClose, Tally, relay, tune_tcp};
use crate::workers::ConnectionThreads;

/// Back-off after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What every connection handler shares.
#[derive(Clone)]
pub struct Shared {
    pub metrics: Arc<Metrics>,
    pub dialer: TailnetDialer,
    pub proxy: ProxyContext,
    /// Connection tasks, so shutdown can wait for them.
    pub connections: TaskTracker,
    /// Where connections are served (one single-threaded runtime per CPU).
    pub threads: Arc<ConnectionThreads>,
    /// All listeners' connections together (`limits.maxConnections`).
    pub agent_gate: Arc<Gate>,
    /// Started at shutdown: HTTP connections finish their requests and close.
    pub draining: Drain,
    pub backend_connect_timeout: Duration,
    /// How long an egress connection whose client sent EOF stays open while the target sends
    /// nothing (see [`HalfClose::HoldUntilUpstreamCloses`]).
    pub half_closed_idle: Duration,
}

/// A `tcp` ingress listener's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpForward {
    pub name: String,
    pub backend: BackendAddress,
    /// Weighted alternatives (a Gateway TCPRoute's backendRefs); empty: always `backend`.
    pub backends: Vec<WeightedBackend>,
}

impl TcpForward {
    /// The backend of one connection: by weight among `backends` when there are any (`None`:
    /// an unresolved reference's share, or all weights zero), else `backend`.
    fn pick(&self) -> Option<&BackendAddress> {
        if self.backends.is_empty() {
            return Some(&self.backend);
        }
        let weights: Vec<u32> = self.backends.iter().map(|b| b.weight).collect();
        let index = crate::http_rules::choose_backend(&weights, |total| fastrand::u64(0..total))?;
        self.backends.get(index)?.backend.as_ref()
    }
}

/// Accepts until `stop`; returning drops (closes) the listening socket. A connection beyond
/// the listener's or the agent's limit is reset at once (and counted); the others go to
/// `on_accept` with their slots, which they hold until they end.
async fn accept_loop<F>(
    listener: TcpListener,
    name: String,
    gate: Arc<Gate>,
    shared: &Shared,
    stop: CancellationToken,
    mut on_accept: F,
) where
    F: FnMut(TcpStream, SocketAddr, Admission),
{
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match limits::admit(&gate, &shared.agent_gate, peer.ip()) {
                    Ok(admission) => {
                        if admission.reclaimed() > 0 {
                            shared.metrics.count_reclaimed(&name);
                            debug!(listener = %name, %peer, "limit reached; ended the oldest held connection for this one");
                        }
                        on_accept(stream, peer, admission)
                    }
                    Err(refusal) => {
                        shared.metrics.count_refused(&name, refusal.label());
                        debug!(listener = %name, %peer, reason = refusal.label(), "connection limit reached; resetting the connection");
                        limits::refuse(stream);
                    }
                },
                Err(error) => {
                    warn!(listener = %name, %error, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
        }
    }
    debug!(listener = %name, "listener stopped");
}

/// Runs a relay listener (`egress`, `tcp`) until `stop`: each accepted connection goes to
/// `handle` with the settings current at its accept, on one of the connection threads. The
/// kind-specific parts are the settings type and its handler.
pub async fn run_relay<S, H, Fut>(
    listener: TcpListener,
    name: String,
    settings: watch::Receiver<S>,
    handle: H,
    gate: Arc<Gate>,
    stop: CancellationToken,
    shared: Shared,
) where
    S: Clone + Send + Sync + 'static,
    H: Fn(TcpStream, SocketAddr, S, Shared, Admission) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    accept_loop(
        listener,
        name,
        gate,
        &shared,
        stop,
        |stream, peer, admission| {
            let spec = settings.borrow().clone();
            let shared_for_task = shared.clone();
            shared
                .threads
                .spawn(&shared.connections, stream, move |stream| {
                    handle(stream, peer, spec, shared_for_task, admission)
                });
        },
    )
    .await;
}

/// An `egress` connection: dialed through the tailnet, then relayed.
pub async fn handle_egress(
    mut stream: TcpStream,
    peer: SocketAddr,
    spec: EgressListener,
    shared: Shared,
    admission: Admission,
) {
    let _active = ActiveConnection::open(&shared.metrics, &spec.name);
    tune_tcp(&stream);
    let tunnel = match shared
        .dialer
        .dial(&spec.target_host, spec.target_port)
        .await
    {
        Ok(tunnel) => tunnel,
        Err(failure) => {
            shared
                .metrics
                .count_dial_failure(&spec.name, failure.reason.label());
            warn!(
                listener = %spec.name,
                %peer,
                target = %format!("{}:{}", spec.target_host, spec.target_port),
                reason = failure.reason.label(),
                detail = %failure.message,
                "dial through the tailnet failed; closing the client connection"
            );
            // FIN, not RST: the client sees a clean close without any byte.
            let _ = stream.shutdown().await;
            return;
        }
    };
    let inbound = Tally::new(shared.metrics.bytes_counter(&spec.name, Direction::In));
    let outbound = Tally::new(shared.metrics.bytes_counter(&spec.name, Direction::Out));
    let result = relay(
        stream,
        tunnel,
        &inbound,
        &outbound,
        HalfClose::HoldUntilUpstreamCloses {
            idle: shared.half_closed_idle,
            reclaim: Some(&admission),
        },
        admission.idle_timeout(),
    )
    .await;
    debug!(
        listener = %spec.name,
        %peer,
        bytes_in = inbound.total(),
        bytes_out = outbound.total(),
        error = result.as_ref().err().map(|e| e.to_string()),
        "egress connection closed"
    );
}

/// A `tcp` ingress connection: connected to the backend, then spliced.
pub async fn handle_tcp(
    mut stream: TcpStream,
    peer: SocketAddr,
    spec: TcpForward,
    shared: Shared,
    admission: Admission,
) {
    let _active = ActiveConnection::open(&shared.metrics, &spec.name);
    tune_tcp(&stream);
    let Some(chosen) = spec.pick() else {
        // Gateway API: an unresolved backendRef's share of connections is rejected.
        shared
            .metrics
            .count_backend_failure(&spec.name, "no_backend");
        debug!(listener = %spec.name, %peer, "no backend for this connection");
        let _ = stream.shutdown().await;
        return;
    };
    let address = format!("{}:{}", chosen.host, chosen.port);
    let connect = TcpStream::connect((chosen.host.as_str(), chosen.port));
    let backend = match tokio::time::timeout(shared.backend_connect_timeout, connect).await {
        Ok(Ok(backend)) => backend,
        Ok(Err(error)) => {
            shared.metrics.count_backend_failure(&spec.name, "connect");
            warn!(listener = %spec.name, %peer, backend = %address, error = %error_chain(&error), "backend connect failed");
            let _ = stream.shutdown().await;
            return;
        }
        Err(_) => {
            shared.metrics.count_backend_failure(&spec.name, "timeout");
            warn!(listener = %spec.name, %peer, backend = %address, "backend connect timed out");
            let _ = stream.shutdown().await;
            return;
        }
    };
    tune_tcp(&backend);
    let inbound = Tally::new(shared.metrics.bytes_counter(&spec.name, Direction::In));
    let outbound = Tally::new(shared.metrics.bytes_counter(&spec.name, Direction::Out));
    let result = crate::splice::relay_tcp(
        stream,
        backend,
        &inbound,
        &outbound,
        admission.idle_timeout(),
    )
    .await;
    debug!(
        listener = %spec.name,
        %peer,
        bytes_in = inbound.total(),
        bytes_out = outbound.total(),
        error = result.as_ref().err().map(|e| e.to_string()),
        "tcp connection closed"
    );
}

pub async fn run_http(
    listener: TcpListener,
    site: watch::Receiver<Arc<HttpSite>>,
    gate: Arc<Gate>,
    stop: CancellationToken,
    shared: Shared,
) {
    let (name, scheme) = {
        let current = site.borrow();
        (current.listener.clone(), current.scheme())
    };
    info!(listener = %name, %scheme, "serving HTTP");
    accept_loop(
        listener,
        name,
        gate,
        &shared,
        stop,
        |stream, peer, admission| {
            // The connection follows the listener's routes (see `LiveSite`).
            let site = site.clone();
            let (context, draining) = (shared.proxy.clone(), shared.draining.watch());
            shared
                .threads
                .spawn(&shared.connections, stream, move |stream| {
                    serve_connection(site, context, stream, peer, draining, admission)
                });
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn address(host: &str) -> BackendAddress {
        BackendAddress {
            host: host.into(),
            port: 7,
        }
    }

    fn weighted(host: Option<&str>, weight: u32) -> WeightedBackend {
        WeightedBackend {
            backend: host.map(address),
            weight,
            backend_tls: None,
        }
    }

    /// Without alternatives every connection goes to `backend`; with them, each connection
    /// draws by weight: a zero weight is never drawn, an unresolved share yields no backend.
    #[test]
    fn connections_pick_backends_by_weight() {
        let single = TcpForward {
            name: "tcp".into(),
            backend: address("only"),
            backends: Vec::new(),
        };
        assert_eq!(single.pick(), Some(&address("only")));

        let spread = TcpForward {
            name: "tcp".into(),
            backend: address("a"),
            backends: vec![
                weighted(Some("a"), 7),
                weighted(Some("b"), 3),
                weighted(Some("never"), 0),
                weighted(None, 0),
            ],
        };
        let mut counts = BTreeMap::new();
        for _ in 0..4000 {
            let host = spread.pick().map(|b| b.host.clone());
            *counts.entry(host).or_insert(0u32) += 1;
        }
        assert_eq!(counts.len(), 2, "{counts:?}");
        let a = counts[&Some("a".to_string())];
        assert!((2600..=3000).contains(&a), "{counts:?}");

        let unresolved = TcpForward {
            name: "tcp".into(),
            backend: address("a"),
            backends: vec![weighted(None, 1)],
        };
        assert_eq!(unresolved.pick(), None);
    }
}
