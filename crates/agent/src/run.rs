//! The agent's main loop: admin listener, tailnet status polling, and a supervisor that keeps
//! listeners, certificate and probes in line with the config file (re-read on change, so a
//! ConfigMap update applies without dropping established connections), then drains on
//! shutdown.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use tailnet_api::agent_config::{
    AgentConfig, BackendAddress, EgressListener, HttpRoute, IngressListener, PassthroughRoute,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::admin::{self, Admin};
use crate::certificates::Certificates;
use crate::config::{self, ConfigError};
use crate::dial::{TailnetDialer, error_chain};
use crate::drain::Drain;
use crate::limits::Gate;
use crate::listeners::{self, Shared, TcpForward};
use crate::localapi::LocalApi;
use crate::login::LoginWatch;
use crate::metrics::{Metrics, TailnetStateLabels};
use crate::passthrough::{PassthroughSite, handle_passthrough};
use crate::probe::{ProbeDeps, ProbeSpec, Prober};
use crate::proxy::{HttpSite, ProxyContext, ProxyDefaults};
use crate::state::{AgentState, ListenerKind, ListenerView, ProbeKind};
use crate::tls::ListenerCertificates;
use crate::workers::ConnectionThreads;

const STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the LocalAPI status is read while the tailnet is not connected.
const CONNECTING_STATUS_INTERVAL: Duration = Duration::from_millis(250);

/// Everything that is not in the config file.
#[derive(Clone, Debug)]
pub struct Options {
    pub config_path: PathBuf,
    /// The pod IP: admin and egress listeners bind it.
    pub pod_ip: IpAddr,
    pub dial_timeout: Duration,
    /// How often the config file and the certificate are re-read.
    pub reload_interval: Duration,
    pub status_interval: Duration,
    /// How long shutdown waits for open connections.
    pub drain_timeout: Duration,
    pub backend_probe_interval: Duration,
    pub backend_connect_timeout: Duration,
    /// For routes without `backendRequestTimeoutSeconds`.
    pub backend_request_timeout: Duration,
    /// Egress: how long after the client's EOF a silent target keeps the tunnel open.
    pub half_closed_idle: Duration,
    /// Single-threaded runtimes that serve the connections (0: one per CPU).
    pub connection_threads: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "POD_IP {0} cannot carry the admin and egress listeners: loopback is reachable from the tailnet, and the unspecified address would include it"
    )]
    PodAddress(IpAddr),
    #[error("the config at startup is unusable")]
    Config(#[from] ConfigError),
    #[error("cannot bind the admin listener on {address}")]
    AdminBind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Runs until `shutdown` resolves, then stops accepting and waits up to the drain timeout
/// for open connections.
pub async fn run(options: Options, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    if options.pod_ip.is_loopback() || options.pod_ip.is_unspecified() {
        return Err(RunError::PodAddress(options.pod_ip));
    }
    let (config, raw) = config::load(&options.config_path)?;
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    let state = Arc::new(AgentState::new());
    let localapi = LocalApi::new(&config.localapi_socket);

    let admin_address = SocketAddr::new(options.pod_ip, config.admin_port);
    let admin_listener =
        TcpListener::bind(admin_address)
            .await
            .map_err(|source| RunError::AdminBind {
                address: admin_address,
                source,
            })?;
    let background = CancellationToken::new();
    tokio::spawn(admin::serve(
        admin_listener,
        Admin {
            registry: Arc::new(registry),
            metrics: metrics.clone(),
            state: state.clone(),
        },
        background.clone(),
    ));
    info!(address = %admin_address, "admin listener up (/metrics, /livez, /readyz, /status)");
    // The control runtime's workers give freed memory back too, whichever runs this (the
    // connection threads run a collection each: src/workers.rs).
    tokio::spawn(crate::memory::release_periodically());
    // Once before anything dials: egress is refused until tailscaled's version is known.
    let mut last_logged = None;
    refresh_status(&localapi, &state, &metrics, &mut last_logged).await;
    tokio::spawn(poll_status(
        localapi.clone(),
        state.clone(),
        metrics.clone(),
        options.status_interval,
        background.clone(),
        last_logged,
    ));

    let dialer = TailnetDialer::new(localapi.clone(), options.dial_timeout, state.clone());
    let shared = Shared {
        metrics: metrics.clone(),
        dialer: dialer.clone(),
        proxy: ProxyContext {
            metrics: metrics.clone(),
            localapi: localapi.clone(),
            tunnels: TaskTracker::new(),
        },
        connections: TaskTracker::new(),
        threads: Arc::new(ConnectionThreads::start(options.connection_threads)),
        agent_gate: Gate::new(config.limits.max_connections),
        draining: Drain::new(),
        backend_connect_timeout: options.backend_connect_timeout,
        half_closed_idle: options.half_closed_idle,
    };
    let mut supervisor = Supervisor {
        probe_deps: ProbeDeps {
            state: state.clone(),
            metrics: metrics.clone(),
            dialer,
            connect_timeout: options.backend_connect_timeout,
        },
        options: options.clone(),
        state: state.clone(),
        metrics,
        shared: shared.clone(),
        config,
        raw,
        rejected_raw: None,
        running: BTreeMap::new(),
        gates: BTreeMap::new(),
        certificates: Certificates::default(),
        prober: Prober::default(),
    };
    supervisor.reconcile().await;

    let mut ticker = tokio::time::interval(options.reload_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => {
                supervisor.reload_config();
                supervisor.reconcile().await;
            }
        }
    }

    info!(
        drain_seconds = options.drain_timeout.as_secs(),
        "shutting down: listeners closed, waiting for open connections"
    );
    state.begin_shutdown();
    supervisor.stop_all().await;
    shared.draining.start();
    shared.connections.close();
    shared.proxy.tunnels.close();
    let drained = tokio::time::timeout(options.drain_timeout, async {
        shared.connections.wait().await;
        shared.proxy.tunnels.wait().await;
    })
    .await
    .is_ok();
    if drained {
        info!("all connections finished");
    } else {
        warn!(
            open = shared.connections.len() + shared.proxy.tunnels.len(),
            "drain timeout reached; closing the remaining connections"
        );
    }
    background.cancel();
    Ok(())
}

async fn poll_status(
    localapi: LocalApi,
    state: Arc<AgentState>,
    metrics: Arc<Metrics>,
    interval: Duration,
    stop: CancellationToken,
    mut last_logged: Option<(bool, String)>,
) {
    let mut login = LoginWatch::default();
    loop {
        // Until tailscaled is up, asked often: the connection starts the first target probes
        // and readiness, and every second here is a second of the resource's start.
        let wait = if state.tailnet().connected {
            interval
        } else {
            interval.min(CONNECTING_STATUS_INTERVAL)
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let backend_state = refresh_status(&localapi, &state, &metrics, &mut last_logged).await;
        if login.observe(backend_state.as_deref(), Instant::now()) {
            metrics.login_retries.inc();
            retry_login(&localapi).await;
        }
    }
}

/// tailscaled has been waiting for a login: it re-reads its config (with the key the auth
/// Secret holds now) and starts again (see [`crate::login`]).
async fn retry_login(localapi: &LocalApi) {
    match tokio::time::timeout(STATUS_TIMEOUT, localapi.retry_login()).await {
        Ok(Ok(())) => info!("tailscaled needs a login: had it re-read its login config and start"),
        Ok(Err(error)) => warn!(error = %error_chain(&error), "retrying tailscaled's login failed"),
        Err(_) => warn!(
            "retrying tailscaled's login: no answer within {}s",
            STATUS_TIMEOUT.as_secs()
        ),
    }
}

/// One LocalAPI status read into state and metrics; logs transitions only. Returns
/// tailscaled's `BackendState` (`None` when the LocalAPI did not answer).
async fn refresh_status(
    localapi: &LocalApi,
    state: &AgentState,
    metrics: &Metrics,
    last_logged: &mut Option<(bool, String)>,
) -> Option<String> {
    let mut backend_state = None;
    let outcome = match tokio::time::timeout(STATUS_TIMEOUT, localapi.status()).await {
        Ok(Ok(status)) => {
            backend_state = Some(status.backend_state.clone());
            state.set_tailnet_status(&status);
            metrics.tailnet_state.clear();
            metrics
                .tailnet_state
                .get_or_create(&TailnetStateLabels {
                    backend_state: status.backend_state.clone(),
                })
                .set(1);
            Ok(())
        }
        Ok(Err(error)) => Err(error_chain(&error)),
        Err(_) => Err(format!(
            "LocalAPI status did not answer within {}s",
            STATUS_TIMEOUT.as_secs()
        )),
    };
    if let Err(message) = outcome {
        metrics.localapi_errors.inc();
        metrics.tailnet_state.clear();
        state.set_tailnet_unreachable(message);
    }
    let tailnet = state.tailnet();
    metrics.tailnet_connected.set(i64::from(tailnet.connected));
    metrics
        .tailnet_ips
        .set(i64::try_from(tailnet.tailnet_ips.len()).unwrap_or(i64::MAX));
    let current = (tailnet.connected, tailnet.message.clone());
    if last_logged.as_ref() != Some(&current) {
        if tailnet.connected {
            info!(ips = ?tailnet.tailnet_ips, version = %tailnet.version, "tailnet connected");
        } else {
            warn!(detail = %tailnet.message, "tailnet not connected");
        }
        *last_logged = Some(current);
    }
    backend_state
}

enum Payload {
    Egress(EgressListener),
    Tcp(TcpForward),
    /// TLS-terminating: needs the certificate.
    Http(Vec<HttpRoute>),
    PlainHttp(Vec<HttpRoute>),
    Passthrough(Vec<PassthroughRoute>),
}

impl Payload {
    fn needs_certificate(&self) -> bool {
        matches!(self, Payload::Http(_))
    }
}

struct Desired {
    key: String,
    name: String,
    kind: ListenerKind,
    address: SocketAddr,
    payload: Payload,
    /// On the pod IP for in-cluster clients (split horizon): never a tailnet identity.
    in_cluster: bool,
}

enum Update {
    Egress(watch::Sender<EgressListener>),
    Tcp(watch::Sender<TcpForward>),
    /// `http` and `plainHttp` listeners (`certificates`: those of a TLS one).
    Http {
        site: watch::Sender<Arc<HttpSite>>,
        routes: Vec<HttpRoute>,
        certificates: Option<ListenerCertificates>,
    },
    Passthrough(watch::Sender<Arc<PassthroughSite>>),
}

struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
    update: Update,
}

struct Supervisor {
    options: Options,
    state: Arc<AgentState>,
    metrics: Arc<Metrics>,
    shared: Shared,
    probe_deps: ProbeDeps,
    config: AgentConfig,
    raw: Vec<u8>,
    rejected_raw: Option<Vec<u8>>,
    running: BTreeMap<String, Running>,
    /// Connection gates by listener key; they outlive a listener's restart (its open
    /// connections keep their slots) and go when the listener leaves the config.
    gates: BTreeMap<String, Arc<Gate>>,
    certificates: Certificates,
    prober: Prober,
}

fn desired_listeners(config: &AgentConfig, pod_ip: IpAddr) -> Vec<Desired> {
    let mut desired = Vec::new();
    for egress in &config.egress {
        let address = SocketAddr::new(pod_ip, egress.listen_port);
        desired.push(Desired {
            key: format!("egress:{address}"),
            name: egress.name.clone(),
            kind: ListenerKind::Egress,
            address,
            payload: Payload::Egress(egress.clone()),
            in_cluster: false,
        });
    }
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // Tailnet clients arrive through tailscaled on loopback; with `inCluster`, pods reach the
    // same listener on the pod IP (named `<name>/in-cluster`: its own metrics and limits).
    let mut hosts = vec![(loopback, false)];
    if config.in_cluster {
        hosts.push((pod_ip, true));
    }
    for (host, in_cluster) in hosts {
        let suffix = if in_cluster { IN_CLUSTER_SUFFIX } else { "" };
        for ingress in &config.ingress {
            desired.push(ingress_listener(ingress, host, suffix, in_cluster));
        }
    }
    desired
}

/// Suffix of the names of the in-cluster twins of ingress listeners (a `/` no expose name
/// has, so they never collide).
pub const IN_CLUSTER_SUFFIX: &str = "/in-cluster";

fn ingress_listener(
    ingress: &IngressListener,
    host: IpAddr,
    suffix: &str,
    in_cluster: bool,
) -> Desired {
    match ingress {
        IngressListener::Tcp {
            port,
            name,
            backend,
            backends,
        } => {
            let address = SocketAddr::new(host, *port);
            let name = format!("{name}{suffix}");
            Desired {
                key: format!("tcp:{address}"),
                name: name.clone(),
                kind: ListenerKind::Tcp,
                address,
                payload: Payload::Tcp(TcpForward {
                    name,
                    backend: backend.clone(),
                    backends: backends.clone(),
                }),
                in_cluster,
            }
        }
        IngressListener::Http { port, routes } => {
            let address = SocketAddr::new(host, *port);
            Desired {
                key: format!("http:{address}"),
                name: format!("https-{port}{suffix}"),
                kind: ListenerKind::Http,
                address,
                payload: Payload::Http(routes.clone()),
                in_cluster,
            }
        }
        IngressListener::PlainHttp { port, routes } => {
            let address = SocketAddr::new(host, *port);
            Desired {
                key: format!("plain-http:{address}"),
                name: format!("http-{port}{suffix}"),
                kind: ListenerKind::Http,
                address,
                payload: Payload::PlainHttp(routes.clone()),
                in_cluster,
            }
        }
        // Reported as `tcp` in /status: it relays TCP (operators before it know no other kind).
        IngressListener::TlsPassthrough { port, routes } => {
            let address = SocketAddr::new(host, *port);
            Desired {
                key: format!("tls-passthrough:{address}"),
                name: format!("tls-{port}{suffix}"),
                kind: ListenerKind::Tcp,
                address,
                payload: Payload::Passthrough(routes.clone()),
                in_cluster,
            }
        }
    }
}

fn probe_specs(config: &AgentConfig, options: &Options) -> Vec<ProbeSpec> {
    let mut specs: Vec<ProbeSpec> = config
        .egress
        .iter()
        .map(|egress| ProbeSpec {
            kind: ProbeKind::Target,
            name: egress.name.clone(),
            host: egress.target_host.clone(),
            port: egress.target_port,
            interval: egress.probe_interval_seconds.map(Duration::from_secs),
        })
        .collect();
    for ingress in &config.ingress {
        match ingress {
            IngressListener::Tcp { name, backend, .. } => specs.push(ProbeSpec {
                kind: ProbeKind::Backend,
                name: name.clone(),
                host: backend.host.clone(),
                port: backend.port,
                interval: Some(options.backend_probe_interval),
            }),
            IngressListener::Http { routes, .. } | IngressListener::PlainHttp { routes, .. } => {
                for route in routes {
                    let backends = route.backend.iter().chain(
                        route
                            .rules
                            .iter()
                            .flat_map(|rule| &rule.backends)
                            .filter_map(|weighted| weighted.backend.as_ref()),
                    );
                    specs.extend(route_probes(&route.name, backends, options));
                }
            }
            IngressListener::TlsPassthrough { routes, .. } => {
                for route in routes {
                    let backends = route
                        .backends
                        .iter()
                        .filter_map(|weighted| weighted.backend.as_ref());
                    specs.extend(route_probes(&route.name, backends, options));
                }
            }
        }
    }
    specs
}

/// One probe per distinct backend of a route: named after the route when it has one backend
/// (as TailnetIngress routes always have), else `<route>/<host>:<port>`.
fn route_probes<'a>(
    route: &str,
    backends: impl Iterator<Item = &'a BackendAddress>,
    options: &Options,
) -> Vec<ProbeSpec> {
    let mut distinct: Vec<&BackendAddress> = Vec::new();
    for backend in backends {
        if !distinct.contains(&backend) {
            distinct.push(backend);
        }
    }
    let single = distinct.len() == 1;
    distinct
        .into_iter()
        .map(|backend| ProbeSpec {
            kind: ProbeKind::Backend,
            name: if single {
                route.to_owned()
            } else {
                format!("{route}/{}:{}", backend.host, backend.port)
            },
            host: backend.host.clone(),
            port: backend.port,
            interval: Some(options.backend_probe_interval),
        })
        .collect()
}

impl Supervisor {
    /// Re-reads the config file; a changed, valid file replaces the config, an invalid one is
    /// reported and the running config stays.
    fn reload_config(&mut self) {
        let path = &self.options.config_path;
        let result = std::fs::read(path)
            .map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })
            .and_then(|raw| {
                if raw == self.raw {
                    return Ok(None);
                }
                config::from_bytes(path, &raw).map(|config| Some((config, raw)))
            });
        match result {
            Ok(None) => {}
            Ok(Some((config, raw))) => {
                if config.admin_port != self.config.admin_port
                    || config.localapi_socket != self.config.localapi_socket
                {
                    warn!("adminPort and localapiSocket changes take effect only after a restart");
                }
                info!(path = %path.display(), "config changed; applying it to new connections");
                self.config = config;
                self.raw = raw;
                self.rejected_raw = None;
                self.state.set_config_reload_error(String::new());
            }
            Err(error) => {
                let message = error_chain(&error);
                let raw = std::fs::read(path).ok();
                if raw != self.rejected_raw || raw.is_none() {
                    error!(error = %message, "changed config rejected; keeping the running one");
                    self.metrics.config_reload_failures.inc();
                    self.rejected_raw = raw;
                }
                self.state.set_config_reload_error(message);
            }
        }
    }

    async fn reconcile(&mut self) {
        let view = self.certificates.refresh(&self.config, &self.metrics);
        self.state.set_certificate(view);
        let desired = desired_listeners(&self.config, self.options.pod_ip);
        // By listener key, for `http` listeners: `Err` says why it cannot serve.
        let certificates: BTreeMap<String, Result<ListenerCertificates, String>> = desired
            .iter()
            .filter_map(|wanted| match &wanted.payload {
                Payload::Http(routes) => Some((
                    wanted.key.clone(),
                    self.certificates.for_listener(&self.config, routes),
                )),
                _ => None,
            })
            .collect();

        // Stop what is no longer wanted first: a port may move between listener kinds.
        let mut to_stop = Vec::new();
        for key in self.running.keys() {
            let wanted = desired.iter().find(|d| &d.key == key);
            let keep = match wanted {
                None => false,
                Some(d) => !matches!(certificates.get(d.key.as_str()), Some(Err(_))),
            };
            if !keep {
                to_stop.push(key.clone());
            }
        }
        for key in to_stop {
            if let Some(running) = self.running.remove(&key) {
                running.stop.cancel();
                // The task owns the socket; waiting for it frees the port.
                if let Err(error) = running.task.await {
                    warn!(%key, %error, "listener task ended abnormally");
                }
                info!(%key, "listener stopped");
            }
            if !desired.iter().any(|d| d.key == key) {
                self.state.remove_listener(&key);
            }
        }
        self.gates
            .retain(|key, _| desired.iter().any(|d| &d.key == key));
        let limits = self.config.limits;
        self.shared.agent_gate.set_limit(limits.max_connections);
        for wanted in &desired {
            let gate = self
                .gates
                .entry(wanted.key.clone())
                .or_insert_with(|| Gate::for_listener(&limits));
            gate.configure_listener(&limits);
            self.state.set_listener_gate(&wanted.key, gate.clone());
        }

        // Probes are declared before any listener starts: the first readiness waits for
        // every declared probe's first result, and a /readyz between "all listeners up" and
        // the declaration would latch the pod ready with targets still unprobed.
        let specs = probe_specs(&self.config, &self.options);
        self.prober.reconcile(&specs, &self.probe_deps);

        let defaults = self.proxy_defaults();
        for wanted in desired {
            let view = |up: bool, message: String| ListenerView {
                name: wanted.name.clone(),
                kind: wanted.kind,
                address: wanted.address.to_string(),
                up,
                message,
                max_connections: limits.max_connections_per_listener,
                active_connections: 0,
                refused_connections: 0,
                reclaimed_connections: 0,
            };
            let listener_certificates = certificates.get(wanted.key.as_str());
            if let Some(Err(reason)) = listener_certificates {
                self.set_listener(&wanted.key, view(false, reason.clone()));
                continue;
            }
            let listener_certificates = listener_certificates.and_then(|c| c.as_ref().ok());
            if let Some(running) = self.running.get_mut(&wanted.key) {
                update_running(running, &wanted, listener_certificates, defaults);
                continue;
            }
            match self.start(&wanted, listener_certificates).await {
                Ok(running) => {
                    info!(listener = %wanted.name, address = %wanted.address, kind = ?wanted.kind, "listener up");
                    self.running.insert(wanted.key.clone(), running);
                    self.set_listener(&wanted.key, view(true, String::new()));
                }
                Err(message) => {
                    let previous = self
                        .state
                        .listeners()
                        .into_iter()
                        .find(|l| l.name == wanted.name)
                        .map(|l| l.message);
                    if previous.as_deref() != Some(message.as_str()) {
                        warn!(listener = %wanted.name, address = %wanted.address, detail = %message, "listener not up; retrying");
                    }
                    self.set_listener(&wanted.key, view(false, message));
                }
            }
        }

        self.metrics
            .ready
            .set(i64::from(self.state.readiness().is_ok()));
    }

    fn set_listener(&self, key: &str, view: ListenerView) {
        self.metrics
            .listener_up
            .get_or_create(&self.metrics.listener(&view.name))
            .set(i64::from(view.up));
        self.state.set_listener(key, view);
    }

    fn proxy_defaults(&self) -> ProxyDefaults {
        ProxyDefaults {
            backend_request_timeout: self.options.backend_request_timeout,
            backend_connect_timeout: self.options.backend_connect_timeout,
        }
    }

    async fn start(
        &self,
        wanted: &Desired,
        certificates: Option<&ListenerCertificates>,
    ) -> Result<Running, String> {
        // Build before binding, so a bad route never leaves a bound port that serves nothing.
        let site = match &wanted.payload {
            Payload::Http(routes) | Payload::PlainHttp(routes) => {
                let certificates = certificates.filter(|_| wanted.payload.needs_certificate());
                let site = build_site(wanted, routes, certificates, self.proxy_defaults())?;
                Some((site, routes.clone(), certificates.cloned()))
            }
            _ => None,
        };
        let listener = TcpListener::bind(wanted.address)
            .await
            .map_err(|error| format!("cannot bind {}: {error}", wanted.address))?;
        let stop = CancellationToken::new();
        let shared = self.shared.clone();
        let gate = self
            .gates
            .get(&wanted.key)
            .cloned()
            .unwrap_or_else(|| Gate::for_listener(&self.config.limits));
        let (task, update) = match (&wanted.payload, site) {
            (Payload::Egress(egress), _) => {
                let (sender, receiver) = watch::channel(egress.clone());
                (
                    tokio::spawn(listeners::run_relay(
                        listener,
                        egress.name.clone(),
                        receiver,
                        listeners::handle_egress,
                        gate,
                        stop.clone(),
                        shared,
                    )),
                    Update::Egress(sender),
                )
            }
            (Payload::Tcp(forward), _) => {
                let (sender, receiver) = watch::channel(forward.clone());
                (
                    tokio::spawn(listeners::run_relay(
                        listener,
                        forward.name.clone(),
                        receiver,
                        listeners::handle_tcp,
                        gate,
                        stop.clone(),
                        shared,
                    )),
                    Update::Tcp(sender),
                )
            }
            (Payload::Passthrough(routes), _) => {
                let site = PassthroughSite::new(wanted.name.clone(), routes);
                let (sender, receiver) = watch::channel(Arc::new(site));
                (
                    tokio::spawn(listeners::run_relay(
                        listener,
                        wanted.name.clone(),
                        receiver,
                        handle_passthrough,
                        gate,
                        stop.clone(),
                        shared,
                    )),
                    Update::Passthrough(sender),
                )
            }
            (Payload::Http(_) | Payload::PlainHttp(_), Some((site, routes, certificates))) => {
                let (sender, receiver) = watch::channel(Arc::new(site));
                (
                    tokio::spawn(listeners::run_http(
                        listener,
                        receiver,
                        gate,
                        stop.clone(),
                        shared,
                    )),
                    Update::Http {
                        site: sender,
                        routes,
                        certificates,
                    },
                )
            }
            (Payload::Http(_) | Payload::PlainHttp(_), None) => {
                return Err("no site built".into());
            }
        };
        Ok(Running { stop, task, update })
    }

    async fn stop_all(&mut self) {
        self.prober.stop_all();
        for (key, running) in std::mem::take(&mut self.running) {
            running.stop.cancel();
            if let Err(error) = running.task.await {
                warn!(%key, %error, "listener task ended abnormally");
            }
        }
    }
}

/// The site of an `http` (with `certificates`) or `plainHttp` listener.
fn build_site(
    wanted: &Desired,
    routes: &[HttpRoute],
    certificates: Option<&ListenerCertificates>,
    defaults: ProxyDefaults,
) -> Result<HttpSite, String> {
    let site = match (wanted.payload.needs_certificate(), certificates) {
        (true, Some(certificates)) => {
            HttpSite::new(wanted.name.clone(), routes, certificates.clone(), defaults)
        }
        (true, None) => return Err("no valid certificate".into()),
        (false, _) => HttpSite::plain(wanted.name.clone(), routes, defaults),
    };
    site.map(|site| site.in_cluster(wanted.in_cluster))
        .map_err(|error| error_chain(&error))
}

/// Hands a running listener the settings of the current config (new connections get them;
/// established ones keep theirs). An `http` listener's site is rebuilt when its routes or
/// its certificate stores changed (`certificates`: `None` for a plain listener, or a TLS one
/// that cannot serve, which is left alone).
fn update_running(
    running: &mut Running,
    wanted: &Desired,
    certificates: Option<&ListenerCertificates>,
    defaults: ProxyDefaults,
) {
    match (&mut running.update, &wanted.payload) {
        (Update::Egress(sender), Payload::Egress(egress)) => {
            sender.send_if_modified(|current| replace_if_changed(current, egress));
        }
        (Update::Tcp(sender), Payload::Tcp(forward)) => {
            sender.send_if_modified(|current| replace_if_changed(current, forward));
        }
        (Update::Passthrough(sender), Payload::Passthrough(routes)) => {
            sender.send_if_modified(|current| {
                if current.routes == *routes {
                    return false;
                }
                *current = Arc::new(PassthroughSite::new(wanted.name.clone(), routes));
                true
            });
        }
        (
            Update::Http {
                site,
                routes,
                certificates: current,
            },
            Payload::Http(new_routes) | Payload::PlainHttp(new_routes),
        ) => {
            let new_certificates = if wanted.payload.needs_certificate() {
                let Some(new_certificates) = certificates else {
                    return;
                };
                Some(new_certificates)
            } else {
                None
            };
            let certificates_changed = match (new_certificates, current.as_ref()) {
                (Some(new), Some(current)) => !new.same_as(current),
                (new, current) => new.is_some() != current.is_some(),
            };
            if routes == new_routes && !certificates_changed {
                return;
            }
            match build_site(wanted, new_routes, new_certificates, defaults) {
                Ok(new_site) => {
                    site.send_replace(Arc::new(new_site));
                    *routes = new_routes.clone();
                    *current = new_certificates.cloned();
                }
                Err(message) => {
                    warn!(listener = %wanted.name, error = %message, "routes not applied");
                }
            }
        }
        _ => {}
    }
}

fn replace_if_changed<T: Clone + PartialEq>(current: &mut T, new: &T) -> bool {
    if current == new {
        return false;
    }
    *current = new.clone();
    true
}

#[cfg(test)]
mod in_cluster_tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Every ingress listener once on loopback (tailscaled forwards the tailnet there) and,
    /// with `inCluster`, once more on the pod IP under its own name (no tailnet identity).
    #[test]
    fn in_cluster_twins_bind_the_pod_ip() {
        let config: AgentConfig = serde_json::from_value(serde_json::json!({
            "localapiSocket": "/var/run/tailscale/tailscaled.sock",
            "adminPort": 9180,
            "ingress": [
                {"mode": "tcp", "name": "db", "port": 5432,
                 "backend": {"host": "db.a.svc", "port": 5432}},
                {"mode": "http", "port": 443, "routes": [{"name": "web",
                 "hostnames": ["portal.example.net"],
                 "backend": {"host": "web.a.svc", "port": 80}}]}
            ],
            "tls": {"certFile": "/tls/tls.crt", "keyFile": "/tls/tls.key"},
            "inCluster": true
        }))
        .expect("config");
        let pod_ip: IpAddr = "10.244.0.7".parse().expect("ip");
        let seen = |config: &AgentConfig| -> Vec<(String, String, bool)> {
            desired_listeners(config, pod_ip)
                .into_iter()
                .map(|d| (d.name, d.address.to_string(), d.in_cluster))
                .collect()
        };
        assert_eq!(
            seen(&config),
            vec![
                ("db".to_string(), "127.0.0.1:5432".to_string(), false),
                ("https-443".to_string(), "127.0.0.1:443".to_string(), false),
                (
                    "db/in-cluster".to_string(),
                    "10.244.0.7:5432".to_string(),
                    true
                ),
                (
                    "https-443/in-cluster".to_string(),
                    "10.244.0.7:443".to_string(),
                    true
                ),
            ]
        );
        let keys: BTreeSet<String> = desired_listeners(&config, pod_ip)
            .into_iter()
            .map(|d| d.key)
            .collect();
        assert_eq!(keys.len(), 4, "each listener has a key of its own");
        let loopback_only = AgentConfig {
            in_cluster: false,
            ..config
        };
        assert!(
            seen(&loopback_only).iter().all(|(_, address, in_cluster)| {
                address.starts_with("127.0.0.1:") && !in_cluster
            })
        );
    }
}
