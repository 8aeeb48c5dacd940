//! Benchmark: from apply to traffic. On an idle test environment, one resource at a time: a
//! TailnetEgress of the remote site's echo server (`192.0.2.10:5432`) and a TailnetIngress
//! (`mode: tcp`) of an in-cluster echo Service. For each the bench records, on its own clock
//! from the apply, when it first saw each step: the agent Deployment, the agent pod running
//! and ready, the node in Headscale and online, each condition `True`, and the first bytes
//! echoed through the new entrance (egress: from a pod netns through the egress Service;
//! ingress: from the laptop through its tailscaled). Steps are polled every
//! [`POLL`], so each time is late by at most that much.
//!
//! Builds are measured side by side: with a baseline (another operator and agent), the
//! repetitions alternate between the two, one operator running at a time.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use serde_json::{Value, json};
use tailnet_api::agent_config::ADMIN_PORT;
use tailnet_api::agent_status::StatusReport;
use tailnet_api::{TailnetEgress, TailnetIngress};
use tno_testenv::{E2eEnv, OperatorArgs, OperatorProcess};
use tno_testenv_kube::env::TEST_SERVERS_IMAGE;
use tno_testenv_tailnet::{Dialed, HeadscaleApi, LocalApi};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::footprint::{self, ProcessRss};
use crate::report::Table;
use crate::stats::Spread;

const TARGET: &str = "192.0.2.10";
const TARGET_PORT: u16 = 5432;
const INGRESS_PORT: u16 = 6000;
const POLL: Duration = Duration::from_millis(100);
/// `--headscale-poll-interval`'s default (and the chart's `headscalePollInterval`).
const PRODUCT_POLL_INTERVAL: &str = "30s";
/// One resource must be Ready and carry bytes within this, else the run fails.
const DEADLINE: Duration = Duration::from_secs(120);

/// An operator build and the agent image its pods run.
#[derive(Clone, Debug)]
pub struct Build {
    pub label: String,
    pub operator: PathBuf,
    /// `--agent-image` (the test kubelet maps it to a local binary).
    pub agent_image: String,
    /// `--tailscale-image` when not the tests' default (the baseline tailscaled's image).
    pub tailscale_image: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Egress,
    Ingress,
}

impl Kind {
    fn label(self) -> &'static str {
        self.kind()
    }

    /// The object's `kind`.
    fn kind(self) -> &'static str {
        match self {
            Kind::Egress => "TailnetEgress",
            Kind::Ingress => "TailnetIngress",
        }
    }
}

/// The steps, in the order they usually happen (the table's columns).
const STEPS: &[&str] = &[
    "Deployment",
    "pod running",
    "node registered",
    "node online",
    "NodeOnline",
    "PolicyEffective",
    "agent connected",
    "first probe",
    "probe reachable",
    "agent ready",
    "pod ready",
    "AgentReady",
    "reachable",
    "first byte",
    "Ready",
];

/// When each step was first seen, from the apply.
type Timeline = BTreeMap<String, Duration>;

/// How long the pod idles after its first bytes before its idle RSS is read.
const IDLE_SETTLE: Duration = Duration::from_secs(10);
/// The load: this many clients, each echoing a line on a new connection after another.
const LOAD_CLIENTS: usize = 16;
const LOAD_FOR: Duration = Duration::from_secs(10);
const RSS_SAMPLE: Duration = Duration::from_millis(500);

/// The agent pod's RSS per process: idle after Ready and its first bytes, and the highest
/// seen under load.
#[derive(Clone, Debug)]
struct Footprint {
    idle: ProcessRss,
    /// Private memory (USS) of each process at the idle reading.
    idle_private: ProcessRss,
    loaded: ProcessRss,
    /// Connections echoed through the entrance during the load.
    echoed: u64,
}

/// The processes the footprint table shows, in this order (containerboot: pods of operators
/// before tailscaled ran without it).
const PROCESSES: &[&str] = &["containerboot", "tailscaled", "tailnet-agent"];

struct Environment<'a> {
    env: &'a E2eEnv,
    client: kube::Client,
    ns: String,
    tailnet: String,
    headscale: HeadscaleApi,
    laptop: LocalApi,
    pod_client: PodClient,
}

/// Runs `repeat` repetitions of each kind for each build; returns the summary and the
/// per-step table.
pub async fn run(builds: &[Build], repeat: usize) -> Result<Vec<Table>> {
    let env = E2eEnv::shared()
        .await
        .map_err(|e| anyhow::anyhow!("test environment: {e}"))?;
    let ops = env
        .namespace("bench-up")
        .await
        .map_err(|e| anyhow::anyhow!("namespace: {e}"))?;
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    ops.create_bootstrap(&env.base_policy().map_err(|e| anyhow::anyhow!("{e}"))?)
        .await
        .map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
    let tailnet = format!("t-{ns}");
    let apply = PatchParams::apply("tno-bench").force();
    Api::<tailnet_api::Tailnet>::all(client.clone())
        .patch(
            &tailnet,
            &apply,
            &Patch::Apply(env.tailnet_object(&tailnet, "Apply")),
        )
        .await
        .context("Tailnet")?;
    start_echo_backend(&client, &ns).await?;
    let lab = Environment {
        env: &env,
        client,
        ns,
        tailnet,
        headscale: env.headscale_api(),
        laptop: env.tailnet().laptop.node.local_api(),
        pod_client: PodClient::start(env.lab())?,
    };
    let mut results: BTreeMap<(Kind, String), Vec<Timeline>> = BTreeMap::new();
    let mut footprints: BTreeMap<(Kind, String), Vec<Footprint>> = BTreeMap::new();
    for repetition in 0..repeat {
        for (index, build) in builds.iter().enumerate() {
            let mut operator = start_operator(&lab, build).await?;
            for kind in [Kind::Egress, Kind::Ingress] {
                let name = format!("up-{index}-{repetition}");
                let (timeline, entrance) = measure_one(&lab, kind, &name)
                    .await
                    .with_context(|| format!("{} {name} ({})", kind.label(), build.label))?;
                let footprint = measure_footprint(&lab, kind, &name, &entrance)
                    .await
                    .with_context(|| format!("RSS of {} {name} ({})", kind.label(), build.label))?;
                eprintln!(
                    "startup: {} {name} ({}): RSS MiB idle {:?} (private {:?}), under load {:?} ({} connections echoed)",
                    kind.label(),
                    build.label,
                    footprint.idle,
                    footprint.idle_private,
                    footprint.loaded,
                    footprint.echoed
                );
                footprints
                    .entry((kind, build.label.clone()))
                    .or_default()
                    .push(footprint);
                eprintln!(
                    "startup: {} {name} ({}): {}",
                    kind.label(),
                    build.label,
                    describe(&timeline)
                );
                results
                    .entry((kind, build.label.clone()))
                    .or_default()
                    .push(timeline);
                remove_one(&lab, kind, &name).await?;
            }
            operator
                .terminate()
                .await
                .map_err(|e| anyhow::anyhow!("stopping the operator: {e}"))?;
        }
    }
    let _ = env.lab().remove_pod_netns(CLIENT_NETNS);
    let mut tables = tables(&results, repeat);
    tables.push(footprint_table(&footprints, repeat));
    Ok(tables)
}

/// The agent pod's RSS per process after [`IDLE_SETTLE`] of idling, then the highest of each
/// process while [`LOAD_CLIENTS`] clients echo through the entrance for [`LOAD_FOR`].
async fn measure_footprint(
    lab: &Environment<'_>,
    kind: Kind,
    name: &str,
    entrance: &Entrance,
) -> Result<Footprint> {
    let deployments: Api<Deployment> = Api::namespaced(lab.client.clone(), &lab.ns);
    let pods: Api<Pod> = Api::namespaced(lab.client.clone(), &lab.ns);
    let deployment = agent_deployment(&deployments, kind, name)
        .await?
        .context("the agent Deployment")?;
    let selector = selector_of(&deployment);
    tokio::time::sleep(IDLE_SETTLE).await;
    let footprint::PodMemory {
        rss: idle,
        private: idle_private,
    } = footprint::pod_memory(lab.env, &pods, &selector).await?;
    let started = Instant::now();
    let echoed = std::sync::atomic::AtomicU64::new(0);
    let client = || async {
        while started.elapsed() < LOAD_FOR {
            if attempt_first_byte(lab, kind, entrance).await.is_ok() {
                echoed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    };
    let load = futures::future::join_all((0..LOAD_CLIENTS).map(|_| client()));
    let sample = async {
        let mut loaded = idle.clone();
        while started.elapsed() < LOAD_FOR {
            tokio::time::sleep(RSS_SAMPLE).await;
            if let Ok(now) = footprint::pod_memory(lab.env, &pods, &selector).await {
                loaded = footprint::max_each(&loaded, &now.rss);
            }
        }
        loaded
    };
    let ((), loaded) = tokio::join!(
        async {
            load.await;
        },
        sample
    );
    let echoed = echoed.into_inner();
    if echoed == 0 {
        bail!("no connection went through {name} under load");
    }
    Ok(Footprint {
        idle,
        idle_private,
        loaded,
        echoed,
    })
}

fn footprint_table(footprints: &BTreeMap<(Kind, String), Vec<Footprint>>, repeat: usize) -> Table {
    let mut header = vec!["resource", "build", "state"];
    header.extend(PROCESSES.iter().copied());
    header.push("pod total");
    header.push("connections echoed under load");
    let mut table = Table::new("Agent pod RSS (MiB, median per process)", &header);
    for ((kind, build), runs) in footprints {
        for (state, of) in [
            (
                "idle",
                (|f: &Footprint| &f.idle) as fn(&Footprint) -> &ProcessRss,
            ),
            ("idle, private (USS)", |f: &Footprint| &f.idle_private),
            ("under load (max)", |f: &Footprint| &f.loaded),
        ] {
            let mut row = vec![kind.label().to_string(), build.clone(), state.to_string()];
            for process in PROCESSES {
                let values: Vec<f64> = runs
                    .iter()
                    .filter_map(|f| of(f).get(*process).copied())
                    .collect();
                row.push(mib(Spread::of(&values)));
            }
            let totals: Vec<f64> = runs.iter().map(|f| footprint::total(of(f))).collect();
            row.push(mib(Spread::of(&totals)));
            let echoed: Vec<f64> = runs.iter().map(|f| f.echoed as f64).collect();
            row.push(match (state, Spread::of(&echoed)) {
                ("idle" | "idle, private (USS)", _) | (_, None) => "—".into(),
                (_, Some(s)) => format!("{:.0} ({:.0}–{:.0})", s.median, s.min, s.max),
            });
            table.row(row);
        }
    }
    table.note(format!(
        "{repeat} repetitions per build; VmRSS of each process in the agent pod's network namespace, median (min–max); private (USS): Private_Clean + Private_Dirty of /proc/<pid>/smaps_rollup, the memory only that process holds (a binary's pages shared by every agent pod on a node are not in it). Idle: {} s after the first bytes went through; under load: the highest of {} samples while {LOAD_CLIENTS} clients echo a line per connection through the entrance for {} s. Target: ≤ 40 MiB per idle agent pod.",
        IDLE_SETTLE.as_secs(),
        LOAD_FOR.as_millis() / RSS_SAMPLE.as_millis(),
        LOAD_FOR.as_secs()
    ));
    table
}

fn mib(spread: Option<Spread>) -> String {
    match spread {
        Some(s) => format!("{:.1} ({:.1}–{:.1})", s.median, s.min, s.max),
        None => "—".into(),
    }
}

async fn start_operator(lab: &Environment<'_>, build: &Build) -> Result<OperatorProcess> {
    let mut args = OperatorArgs::new(&lab.ns);
    args.agent_image = build.agent_image.clone();
    if let Some(image) = &build.tailscale_image {
        args.tailscale_image = image.clone();
    }
    // The product's default poll (the e2e tests' 2 s would hide what waits for a poll).
    args.headscale_poll_interval = PRODUCT_POLL_INTERVAL.into();
    let mut operator = lab
        .env
        .start_operator(&build.operator, &args.to_args())
        .await
        .map_err(|e| anyhow::anyhow!("operator {}: {e}", build.label))?;
    operator
        .wait_ready(Duration::from_secs(60))
        .await
        .map_err(|e| anyhow::anyhow!("operator {} ready: {e}", build.label))?;
    Ok(operator)
}

/// The in-cluster echo server the ingress exposes.
async fn start_echo_backend(client: &kube::Client, ns: &str) -> Result<()> {
    let apply = PatchParams::apply("tno-bench").force();
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "echo", "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "echo"}},
                 "template": {"metadata": {"labels": {"app": "echo"}},
                              "spec": {"containers": [{"name": "server",
                                       "image": TEST_SERVERS_IMAGE,
                                       "args": ["tcp-echo", "--listen", "0.0.0.0:5432"]}]}}}
    });
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch("echo", &apply, &Patch::Apply(deployment))
        .await
        .context("echo Deployment")?;
    let service = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": ns},
        "spec": {"selector": {"app": "echo"}, "ports": [{"name": "main", "port": 5432, "targetPort": 5432}]}
    });
    Api::<Service>::namespaced(client.clone(), ns)
        .patch("echo", &apply, &Patch::Apply(service))
        .await
        .context("echo Service")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let list = pods.list(&ListParams::default().labels("app=echo")).await?;
        if list.items.iter().any(pod_ready) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the echo backend is not ready after {DEADLINE:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

fn object(lab: &Environment<'_>, kind: Kind, name: &str) -> Value {
    match kind {
        Kind::Egress => json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
            "metadata": {"name": name, "namespace": lab.ns},
            "spec": {"tailnetRef": {"name": lab.tailnet}, "consumerNamespaces": [lab.ns],
                     "targets": [{"name": "remote-db", "address": TARGET, "port": TARGET_PORT}]}
        }),
        Kind::Ingress => json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
            "metadata": {"name": name, "namespace": lab.ns},
            "spec": {"tailnetRef": {"name": lab.tailnet}, "allowFrom": ["group:team-a"],
                     "exposes": [{"name": "db", "dnsLabel": name, "mode": "tcp", "port": INGRESS_PORT,
                                  "backend": {"service": "echo", "port": 5432}}]}
        }),
    }
}

fn resource_api(lab: &Environment<'_>, kind: Kind) -> Api<DynamicObject> {
    let resource = match kind {
        Kind::Egress => ApiResource::erase::<TailnetEgress>(&()),
        Kind::Ingress => ApiResource::erase::<TailnetIngress>(&()),
    };
    Api::namespaced_with(lab.client.clone(), &lab.ns, &resource)
}

/// Applies one resource and follows it until it is Ready and bytes went through: the steps
/// are polled in one loop, the first bytes are tried beside it (an attempt can take seconds).
async fn measure_one(
    lab: &Environment<'_>,
    kind: Kind,
    name: &str,
) -> Result<(Timeline, Entrance)> {
    let api = resource_api(lab, kind);
    let started = Instant::now();
    api.patch(
        name,
        &PatchParams::apply("tno-bench").force(),
        &Patch::Apply(object(lab, kind, name)),
    )
    .await
    .context("apply")?;
    let (entrance, entrance_known) = tokio::sync::watch::channel(Entrance::default());
    let first_byte = std::sync::OnceLock::new();
    let last_error = std::sync::Mutex::new(String::new());
    let observe = observe_steps(lab, &api, (kind, name), started, &entrance, &first_byte);
    let bytes = try_first_byte(lab, kind, entrance_known, started, &first_byte, &last_error);
    let (seen, ()) = tokio::join!(observe, bytes);
    let mut seen = seen.map_err(|error| {
        let last = last_error.lock().map(|e| e.clone()).unwrap_or_default();
        error.context(format!("last first-byte attempt: {last}"))
    })?;
    if let Some(at) = first_byte.get() {
        mark(&mut seen, "first byte", *at);
    }
    let reached = entrance.borrow().clone();
    Ok((seen, reached))
}

/// Where the first bytes go: the egress Service's ClusterIP, the ingress node's IPv4.
#[derive(Clone, Debug, Default)]
struct Entrance {
    cluster_ip: Option<String>,
    node_ipv4: Option<String>,
}

/// Polls every step until the resource is Ready and the first bytes went through.
async fn observe_steps(
    lab: &Environment<'_>,
    api: &Api<DynamicObject>,
    (kind, name): (Kind, &str),
    started: Instant,
    entrance: &tokio::sync::watch::Sender<Entrance>,
    first_byte: &std::sync::OnceLock<Duration>,
) -> Result<Timeline> {
    let deployments: Api<Deployment> = Api::namespaced(lab.client.clone(), &lab.ns);
    let pods: Api<Pod> = Api::namespaced(lab.client.clone(), &lab.ns);
    let secrets: Api<Secret> = Api::namespaced(lab.client.clone(), &lab.ns);
    let mut seen = Timeline::new();
    let mut hostname: Option<String> = None;
    loop {
        let at = started.elapsed();
        let resource = api.get(name).await.context("get the resource")?;
        for condition in true_conditions(&resource) {
            match condition.as_str() {
                "TargetsReachable" | "BackendsReachable" => mark(&mut seen, "reachable", at),
                // Every condition is kept (the log line shows them all; the table some).
                other => mark(&mut seen, other, at),
            }
        }
        let cluster_ip = resource.data["status"]["targets"][0]["clusterIP"]
            .as_str()
            .map(str::to_owned);
        entrance.send_modify(|e| e.cluster_ip = cluster_ip);
        if let Some(deployment) = agent_deployment(&deployments, kind, name).await? {
            mark(&mut seen, "Deployment", at);
            let agent_pods = pods
                .list(&ListParams::default().labels(&selector_of(&deployment)))
                .await?;
            if agent_pods.items.iter().any(pod_running) {
                mark(&mut seen, "pod running", at);
            }
            if agent_pods.items.iter().any(pod_ready) {
                mark(&mut seen, "pod ready", at);
            }
            let pod_ip = agent_pods
                .items
                .iter()
                .find_map(|p| p.status.as_ref()?.pod_ip.clone());
            if let Some(ip) = pod_ip
                && let Some(report) = lab.pod_client.agent_status(&ip).await
            {
                for step in report_steps(&report) {
                    mark(&mut seen, step, at);
                }
            }
            if hostname.is_none() {
                hostname = node_hostname(&secrets, &deployment).await;
            }
            if let Some(hostname) = &hostname {
                let nodes = lab.headscale.list_nodes().await.unwrap_or_default();
                if let Some(node) = nodes
                    .iter()
                    .find(|n| &n.given_name == hostname || &n.name == hostname)
                {
                    mark(&mut seen, "node registered", at);
                    if node.online {
                        mark(&mut seen, "node online", at);
                    }
                    let ipv4 = node
                        .ip_addresses
                        .iter()
                        .find(|ip| !ip.contains(':'))
                        .cloned();
                    entrance.send_modify(|e| e.node_ipv4 = ipv4);
                }
            }
        }
        if seen.contains_key("Ready") && first_byte.get().is_some() {
            return Ok(seen);
        }
        if started.elapsed() > DEADLINE {
            bail!(
                "not Ready with bytes through after {DEADLINE:?}; seen: {}; conditions: {}",
                describe(&seen),
                resource.data["status"]["conditions"]
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Starts an attempt at the entrance every [`POLL`] (each bounded by [`ATTEMPT`], at most
/// [`ATTEMPTS_IN_FLIGHT`] at once, so a hanging dial does not hide a path that just opened)
/// until a line comes back.
async fn try_first_byte(
    lab: &Environment<'_>,
    kind: Kind,
    entrance: tokio::sync::watch::Receiver<Entrance>,
    started: Instant,
    first_byte: &std::sync::OnceLock<Duration>,
    last_error: &std::sync::Mutex<String>,
) {
    use futures::StreamExt;
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut ticker = tokio::time::interval(POLL);
    while started.elapsed() < DEADLINE {
        tokio::select! {
            _ = ticker.tick(), if in_flight.len() < ATTEMPTS_IN_FLIGHT => {
                let current = entrance.borrow().clone();
                in_flight.push(async move {
                    tokio::time::timeout(ATTEMPT, attempt_first_byte(lab, kind, &current))
                        .await
                        .unwrap_or_else(|_| Err(format!("no echo within {ATTEMPT:?}")))
                });
            }
            Some(result) = in_flight.next() => match result {
                Ok(()) => {
                    let _ = first_byte.set(started.elapsed());
                    return;
                }
                Err(error) => {
                    if let Ok(mut last) = last_error.lock() {
                        *last = error;
                    }
                }
            },
        }
    }
}

/// First-byte attempts running at once.
const ATTEMPTS_IN_FLIGHT: usize = 8;

async fn attempt_first_byte(lab: &Environment<'_>, kind: Kind, entrance: &Entrance) -> Echoed {
    match kind {
        Kind::Egress => {
            let ip = entrance
                .cluster_ip
                .as_deref()
                .ok_or("no ClusterIP in the status yet")?;
            let address = format!("{ip}:{TARGET_PORT}")
                .parse::<SocketAddr>()
                .map_err(|e| format!("ClusterIP {ip}: {e}"))?;
            lab.pod_client.echo(address).await
        }
        Kind::Ingress => {
            let ip = entrance
                .node_ipv4
                .as_deref()
                .ok_or("the node has no IPv4 address yet")?;
            match lab.laptop.dial(ip, INGRESS_PORT).await {
                Ok(Dialed::Tailnet(mut stream)) => echo(&mut stream).await,
                Ok(Dialed::DialSelf { addr }) => Err(format!("Dial-Self for {addr}")),
                Err(error) => Err(format!("laptop dial {ip}:{INGRESS_PORT}: {error}")),
            }
        }
    }
}

/// The steps an agent's report shows as done.
fn report_steps(report: &StatusReport) -> Vec<&'static str> {
    let probes: Vec<_> = report.targets.iter().chain(&report.backends).collect();
    let mut steps = Vec::new();
    if report.tailnet.connected {
        steps.push("agent connected");
    }
    if !probes.is_empty() && probes.iter().all(|p| p.last_probe.is_some()) {
        steps.push("first probe");
    }
    if !probes.is_empty()
        && probes
            .iter()
            .all(|p| p.state == tailnet_api::agent_status::ProbeState::Reachable)
    {
        steps.push("probe reachable");
    }
    if report.ready {
        steps.push("agent ready");
    }
    steps
}

fn mark(seen: &mut Timeline, step: &str, at: Duration) {
    if !seen.contains_key(step) {
        seen.insert(step.to_owned(), at);
    }
}

/// One first-byte attempt at most takes this long.
const ATTEMPT: Duration = Duration::from_secs(2);

async fn echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(stream: &mut S) -> Echoed {
    let line = b"first byte\n";
    stream
        .write_all(line)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut back = [0u8; 11];
    stream
        .read_exact(&mut back)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if &back == line {
        Ok(())
    } else {
        Err(format!("echoed {:?}", String::from_utf8_lossy(&back)))
    }
}

/// A client in a pod netns of the lab (as an in-cluster client is): a thread of its own
/// entered into the netns, with its own runtime, echoing a line to each address it is sent.
struct PodClient {
    requests: tokio::sync::mpsc::Sender<(Request, tokio::sync::oneshot::Sender<Answer>)>,
}

type Echoed = std::result::Result<(), String>;
type Answer = std::result::Result<String, String>;

/// What the pod client does: echo a line, or read an agent's `/status`.
#[derive(Clone, Copy)]
enum Request {
    Echo(SocketAddr),
    Status(SocketAddr),
}

async fn serve_request(request: Request) -> Answer {
    match request {
        Request::Echo(address) => {
            let mut stream = tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| format!("connect {address}: {e}"))?;
            echo(&mut stream).await.map(|()| String::new())
        }
        Request::Status(address) => {
            let mut stream = tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| format!("connect {address}: {e}"))?;
            stream
                .write_all(b"GET /status HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
                .await
                .map_err(|e| format!("write: {e}"))?;
            let mut response = Vec::new();
            stream
                .take(1 << 20)
                .read_to_end(&mut response)
                .await
                .map_err(|e| format!("read: {e}"))?;
            let text = String::from_utf8_lossy(&response);
            text.split_once("\r\n\r\n")
                .map(|(_, body)| body.to_owned())
                .ok_or_else(|| "no HTTP body".to_string())
        }
    }
}

const CLIENT_NETNS: &str = "bench-up-client";

impl PodClient {
    fn start(lab: &std::sync::Arc<tno_netlab::Lab>) -> Result<PodClient> {
        let pod = lab.add_pod_netns(CLIENT_NETNS).context("client netns")?;
        let (requests, mut incoming) =
            tokio::sync::mpsc::channel::<(Request, tokio::sync::oneshot::Sender<Answer>)>(8);
        // A thread of its own: a tokio blocking-pool thread would go back to the pool inside
        // the pod netns.
        std::thread::spawn(move || {
            if pod.netns.enter_current_thread().is_err() {
                return;
            }
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                // Each request on its own task: a slow echo does not hold up a status read.
                while let Some((request, reply)) = incoming.recv().await {
                    tokio::spawn(async move {
                        let answer = tokio::time::timeout(ATTEMPT, serve_request(request))
                            .await
                            .unwrap_or_else(|_| Err(format!("no answer within {ATTEMPT:?}")));
                        let _ = reply.send(answer);
                    });
                }
            });
        });
        Ok(PodClient { requests })
    }

    async fn ask(&self, request: Request) -> Answer {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.requests
            .send((request, reply))
            .await
            .map_err(|_| "the pod client thread ended".to_string())?;
        answer
            .await
            .map_err(|_| "the pod client thread ended".to_string())?
    }

    async fn echo(&self, address: SocketAddr) -> Echoed {
        self.ask(Request::Echo(address)).await.map(drop)
    }

    /// The agent's own report, from its admin port.
    async fn agent_status(&self, pod_ip: &str) -> Option<StatusReport> {
        let address = SocketAddr::new(pod_ip.parse().ok()?, ADMIN_PORT);
        let body = self.ask(Request::Status(address)).await.ok()?;
        serde_json::from_str(&body).ok()
    }
}

/// Deletes the resource and waits until its agent and node are gone.
async fn remove_one(lab: &Environment<'_>, kind: Kind, name: &str) -> Result<()> {
    let api = resource_api(lab, kind);
    // The node the operator recorded in the status.
    let node_id = api.get(name).await.context("get the resource")?.data["status"]["nodeId"]
        .as_str()
        .map(str::to_owned);
    api.delete(name, &DeleteParams::default())
        .await
        .context("delete")?;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let gone = api.get_opt(name).await?.is_none();
        let node_left = match &node_id {
            Some(id) => !lab
                .headscale
                .list_nodes()
                .await
                .unwrap_or_default()
                .iter()
                .any(|n| &n.id.to_string() == id),
            None => true,
        };
        if gone && node_left {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{name} or its node is still there after {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn true_conditions(resource: &DynamicObject) -> Vec<String> {
    resource.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == "True")
        .filter_map(|c| c["type"].as_str().map(str::to_owned))
        .collect()
}

/// The agent Deployment of resource `name` (the one whose owner reference names it).
async fn agent_deployment(
    api: &Api<Deployment>,
    kind: Kind,
    name: &str,
) -> Result<Option<Deployment>> {
    let list = api.list(&ListParams::default()).await?;
    Ok(list.items.into_iter().find(|d| {
        d.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.name == name && o.kind == kind.kind())
    }))
}

fn selector_of(deployment: &Deployment) -> String {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// The agent's tailnet hostname: containerboot's `TS_HOSTNAME` (a baseline operator's pods),
/// else the `Hostname` of tailscaled's login config in the auth Secret (`<agent>-auth`, there
/// until the node exists).
async fn node_hostname(secrets: &Api<Secret>, deployment: &Deployment) -> Option<String> {
    if let Some(hostname) = ts_hostname(deployment) {
        return Some(hostname);
    }
    let name = format!("{}-auth", deployment.metadata.name.as_deref()?);
    let secret = secrets.get_opt(&name).await.ok()??;
    let config = secret.data?.remove(tailnet_render::pod::LOGIN_CONFIG_KEY)?;
    let config: Value = serde_json::from_slice(&config.0).ok()?;
    config["Hostname"].as_str().map(str::to_owned)
}

fn ts_hostname(deployment: &Deployment) -> Option<String> {
    deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "TS_HOSTNAME")
        .and_then(|e| e.value.clone())
}

fn pod_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|statuses| {
            !statuses.is_empty()
                && statuses
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

fn describe(timeline: &Timeline) -> String {
    let mut steps: Vec<(&String, &Duration)> = timeline.iter().collect();
    steps.sort_by_key(|(_, at)| **at);
    steps
        .iter()
        .map(|(step, at)| format!("{step} {:.1}s", at.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn seconds(spread: Option<Spread>, with_max: bool) -> String {
    match spread {
        Some(s) if with_max => format!("{:.1} / {:.1}", s.median, s.max),
        Some(s) => format!("{:.1}", s.median),
        None => "—".into(),
    }
}

fn step_spread(timelines: &[Timeline], step: &str) -> Option<Spread> {
    let values: Vec<f64> = timelines
        .iter()
        .filter_map(|t| t.get(step).map(Duration::as_secs_f64))
        .collect();
    Spread::of(&values)
}

fn tables(results: &BTreeMap<(Kind, String), Vec<Timeline>>, repeat: usize) -> Vec<Table> {
    let mut summary = Table::new(
        "From apply to traffic (idle lab, one resource at a time)",
        &[
            "resource",
            "build",
            "apply → Ready, p50 / max s",
            "apply → first byte, p50 / max s",
            "n",
        ],
    );
    let mut header = vec!["resource", "build"];
    header.extend(STEPS.iter().copied());
    let mut steps = Table::new(
        "Apply → each step, median s (first seen by the bench, polling every 0.1 s)",
        &header,
    );
    for ((kind, build), timelines) in results {
        summary.row(vec![
            kind.label().into(),
            build.clone(),
            seconds(step_spread(timelines, "Ready"), true),
            seconds(step_spread(timelines, "first byte"), true),
            timelines.len().to_string(),
        ]);
        let mut row = vec![kind.label().to_string(), build.clone()];
        row.extend(
            STEPS
                .iter()
                .map(|step| seconds(step_spread(timelines, step), false)),
        );
        steps.row(row);
    }
    summary.note(format!(
        "{repeat} repetitions per build, alternating; p50 is the median. Target: p50 ≤ 5 s to Ready for both kinds."
    ));
    steps.note(
        "Agent steps (\"agent connected\" … \"agent ready\") are read from the agent's `/status` by a client in a pod netns. \"reachable\" is TargetsReachable (egress) or BackendsReachable (ingress); \"first byte\": a line echoed through the entrance (egress: pod netns → Service → agent → tailnet → the remote echo server; ingress: laptop → tailnet → agent → echo Service).",
    );
    vec![summary, steps]
}
