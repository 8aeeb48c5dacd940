//! Benchmark 2: through the tailnet. A client in a pod network namespace of the test
//! environment connects to the egress Service of `192.0.2.10:5432` (the remote site's echo
//! server behind its subnet router): pod → Service → agent → LocalAPI dial → the agent pod's
//! tailscaled (userspace) → WireGuard → router → echo. The baseline in the same run: the
//! laptop node's tailscaled dials the same target through its LocalAPI (the same userspace
//! stack, WireGuard and router, without the agent and the Service). The ratio is the agent's
//! share of the cost.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tailnet_api::TailnetEgress;
use tno_testenv::{E2eEnv, OperatorArgs};
use tno_testenv_tailnet::{Dialed, LocalApi};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::report::Table;
use crate::stats::{Spread, percentile};

const TARGET: &str = "192.0.2.10";
const PORT: u16 = 5432;
const MIB: f64 = 1024.0 * 1024.0;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
type BoxStream = Box<dyn Stream>;

/// How each path opens a connection to the echo target.
#[derive(Clone)]
enum Path2 {
    /// The egress Service's ClusterIP, from the client's pod netns.
    Agent(SocketAddr),
    /// The laptop's LocalAPI dial.
    Direct(LocalApi),
    /// The agent's listener on its pod IP (no Service hop), for the breakdown.
    AgentPod(SocketAddr),
    /// The agent pod's own tailscaled, dialed through its LocalAPI socket like the agent
    /// does (no Service, no agent), for the breakdown.
    AgentNode(LocalApi),
}

impl Path2 {
    fn name(&self) -> &'static str {
        match self {
            Path2::Agent(_) => "agent",
            Path2::Direct(_) => "direct",
            Path2::AgentPod(_) => "agent by pod IP",
            Path2::AgentNode(_) => "agent pod's tailscaled",
        }
    }

    fn connect(&self) -> Pin<Box<dyn Future<Output = Result<BoxStream>> + Send + '_>> {
        Box::pin(async move {
            match self {
                Path2::Agent(address) | Path2::AgentPod(address) => {
                    let stream = tokio::net::TcpStream::connect(address).await?;
                    stream.set_nodelay(true)?;
                    Ok(Box::new(stream) as BoxStream)
                }
                Path2::Direct(api) | Path2::AgentNode(api) => match api.dial(TARGET, PORT).await? {
                    Dialed::Tailnet(stream) => Ok(Box::new(stream) as BoxStream),
                    other => bail!("the laptop's dial did not go through the tailnet: {other:?}"),
                },
            }
        })
    }
}

/// Echoes `bytes` through one connection (writing and reading at once); MiB/s of payload.
async fn echo_bulk(path: &Path2, bytes: usize) -> Result<f64> {
    let stream = path.connect().await?;
    let started = Instant::now();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
    let send = async {
        let mut left = bytes;
        while left > 0 {
            let len = left.min(chunk.len());
            writer.write_all(&chunk[..len]).await?;
            left -= len;
        }
        writer.flush().await?;
        anyhow::Ok(())
    };
    let receive = async {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut received = 0usize;
        while received < bytes {
            let read = reader.read(&mut buffer).await?;
            if read == 0 {
                bail!("closed after {received} of {bytes} echoed bytes");
            }
            for (offset, byte) in buffer[..read].iter().enumerate() {
                if *byte != ((received + offset) % (64 * 1024) % 253) as u8 {
                    bail!("echoed byte {} differs", received + offset);
                }
            }
            received += read;
        }
        Ok(())
    };
    tokio::try_join!(send, receive)?;
    Ok(bytes as f64 / MIB / started.elapsed().as_secs_f64())
}

async fn parallel_echo(path: &Path2, total: usize, streams: usize) -> Result<f64> {
    let started = Instant::now();
    let each = total / streams;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..streams {
        let path = path.clone();
        tasks.spawn(async move { echo_bulk(&path, each).await });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok((each * streams) as f64 / MIB / started.elapsed().as_secs_f64())
}

async fn ping_pong(path: &Path2, rounds: usize) -> Result<Vec<Duration>> {
    let mut stream = path.connect().await?;
    let message = [0x5au8; 64];
    let mut answer = [0u8; 64];
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds + rounds / 10 {
        let started = Instant::now();
        stream.write_all(&message).await?;
        stream.read_exact(&mut answer).await?;
        if answer != message {
            bail!("ping-pong answer differs");
        }
        if round >= rounds / 10 {
            samples.push(started.elapsed());
        }
    }
    samples.sort();
    Ok(samples)
}

/// One short connection: connect, 1 byte echoed, close.
async fn short_connection(path: &Path2) -> Result<()> {
    let mut stream = path.connect().await?;
    stream.write_all(b"r").await?;
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await?;
    if &answer != b"r" {
        bail!("short connection echoed {answer:?}");
    }
    Ok(())
}

/// Completed short connections per second, and how many were reset (counted, not fatal). The
/// agent keeps a tunnel up to 5 s after its client closed (--half-closed-idle-seconds); a new
/// connection that finds its listener full takes the slot of the oldest such held tunnel
/// (`tailnet_agent_connections_reclaimed_total`), so the default limits do not cap the rate.
async fn connection_rate(path: &Path2, clients: usize, duration: Duration) -> Result<(f64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let reset = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (path, stop, done, reset) = (path.clone(), stop.clone(), done.clone(), reset.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match short_connection(&path).await {
                    Ok(()) => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error)
                        if error
                            .downcast_ref::<std::io::Error>()
                            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset) =>
                    {
                        reset.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => return Err(error),
                }
            }
            anyhow::Ok(())
        });
    }
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let completed = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    while let Some(task) = tasks.join_next().await {
        task??;
    }
    if completed == 0 {
        bail!("{}: no connection completed", path.name());
    }
    Ok((
        completed as f64 / elapsed.as_secs_f64(),
        reset.load(Ordering::Relaxed),
    ))
}

/// Per-connection cost, one connection at a time: connect (for a LocalAPI path: the dial
/// until its `101`), then one byte echoed, then close. Sorted samples of the whole, and of
/// the connect/dial step alone.
async fn connection_costs(path: &Path2, count: usize) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let mut whole = Vec::with_capacity(count);
    let mut setup = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let mut stream = path.connect().await?;
        let connected = started.elapsed();
        stream.write_all(b"b").await?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).await?;
        if &answer != b"b" {
            bail!("{}: the connection echoed {answer:?}", path.name());
        }
        whole.push(started.elapsed());
        setup.push(connected);
    }
    whole.sort();
    setup.sort();
    Ok((whole, setup))
}

/// Where the agent path's per-connection time goes: the same target through four paths,
/// each adding one hop to the previous one, interleaved per repetition.
async fn breakdown(paths: &[Path2], work: Workload) -> Result<Table> {
    const CONNECTIONS: usize = 200;
    // path → metric (connection p50, p99, setup p50, ping-pong p50) → one value per repetition
    let mut values: Vec<[Vec<f64>; 4]> = paths.iter().map(|_| Default::default()).collect();
    let micros = |samples: &[Duration], p| {
        percentile(samples, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
    };
    for repetition in 0..work.repeat {
        let mut order: Vec<usize> = (0..paths.len()).collect();
        order.rotate_left(repetition % paths.len());
        for index in order {
            let path = &paths[index];
            let (whole, setup) = connection_costs(path, CONNECTIONS)
                .await
                .context(path.name())?;
            let pongs = ping_pong(path, work.ping_pongs)
                .await
                .context(path.name())?;
            let slot = &mut values[index];
            slot[0].push(micros(&whole, 50.0));
            slot[1].push(micros(&whole, 99.0));
            slot[2].push(micros(&setup, 50.0));
            slot[3].push(micros(&pongs, 50.0));
            // The agent keeps a tunnel up to --half-closed-idle-seconds (5 s) after its
            // client closed: let them go before the next path is measured.
            tokio::time::sleep(Duration::from_secs(6)).await;
        }
    }
    let mut table = Table::new(
        "Through the tailnet, per connection: where the agent path's time goes (one connection \
         at a time: connect, 1 byte echoed, close)",
        &[
            "path",
            "connection p50 (µs)",
            "connection p99 (µs)",
            "of which connect or LocalAPI dial, p50 (µs)",
            "added to the previous row, p50 (µs)",
            "64 B ping-pong p50 (µs)",
        ],
    );
    let labels = [
        "laptop's tailscaled, LocalAPI dial (the direct path)",
        "agent pod's tailscaled, LocalAPI dial (+ the other node; no agent, no Service)",
        "agent by pod IP (+ the agent: accept, its LocalAPI dial, relay)",
        "agent by Service ClusterIP (+ the Service hop: kube-proxy DNAT)",
    ];
    for (index, label) in labels.iter().enumerate().take(paths.len()) {
        let [whole, p99, setup, pong] = &values[index];
        let show = |v: &[f64]| Spread::of(v).map_or("–".into(), |s| s.show(0));
        let added = if index == 0 {
            "–".to_owned()
        } else {
            let previous = &values[index - 1][0];
            let differences: Vec<f64> = whole.iter().zip(previous).map(|(a, b)| a - b).collect();
            Spread::of(&differences).map_or("–".into(), |s| {
                format!("{:+.0} ({:+.0}–{:+.0})", s.median, s.min, s.max)
            })
        };
        table.row(vec![
            (*label).to_owned(),
            show(whole),
            show(p99),
            show(setup),
            added,
            show(pong),
        ]);
    }
    table.note(format!(
        "{CONNECTIONS} connections one after another per path and repetition, then {} ping-pong \
         round trips; median (min–max) of {} repetitions, differences taken within each \
         repetition. For the agent paths the client's connect ends at the TCP handshake with \
         the agent (or kube-proxy's DNAT to it); the agent's own LocalAPI dial then runs while \
         the first byte waits, so it is part of the connection time, not of the connect step.",
        work.ping_pongs, work.repeat
    ));
    Ok(table)
}

/// What to run through both paths.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub bulk_bytes: usize,
    pub parallel_streams: usize,
    pub ping_pongs: usize,
    pub rate_duration: Duration,
    pub repeat: usize,
}

async fn measure(agent: Path2, direct: Path2, work: Workload) -> Result<Table> {
    // metric → [agent values, direct values]
    let metrics = ["single", "parallel", "rate", "p50", "p99"];
    let mut values: Vec<[Vec<f64>; 2]> = metrics.iter().map(|_| [vec![], vec![]]).collect();
    // Short connections reset (by the agent's connection limit), per path, all repetitions.
    let mut resets = [0u64; 2];
    for repetition in 0..work.repeat {
        let mut paths = [(0usize, &agent), (1usize, &direct)];
        if repetition % 2 == 1 {
            paths.reverse();
        }
        for (slot, path) in paths {
            values[0][slot].push(
                echo_bulk(path, work.bulk_bytes)
                    .await
                    .context(path.name())?,
            );
            values[1][slot].push(
                parallel_echo(path, work.bulk_bytes, work.parallel_streams)
                    .await
                    .context(path.name())?,
            );
            let (rate, reset) = connection_rate(path, 4, work.rate_duration)
                .await
                .context(path.name())?;
            values[2][slot].push(rate);
            resets[slot] += reset;
            // The agent holds each of those tunnels up to 5 s after its client closed and is
            // at its connection limit now: let them go, or the next connection is reset.
            tokio::time::sleep(Duration::from_secs(6)).await;
            let samples = ping_pong(path, work.ping_pongs)
                .await
                .context(path.name())?;
            let micros = |p| percentile(&samples, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6);
            values[3][slot].push(micros(50.0));
            values[4][slot].push(micros(99.0));
        }
    }
    let mut table = Table::new(
        "Through the tailnet: pod → agent → tailscaled (userspace) → router → 192.0.2.10 vs \
         the laptop's direct LocalAPI dial",
        &[
            "workload",
            "direct (LocalAPI dial)",
            "agent (pod → Service → agent)",
            "agent / direct",
        ],
    );
    let labels = [
        format!("1 stream echo, {} MiB (MiB/s)", work.bulk_bytes >> 20),
        format!(
            "{} streams echo, {} MiB total (MiB/s)",
            work.parallel_streams,
            work.bulk_bytes >> 20
        ),
        "short connections, 4 clients (conn/s)".to_owned(),
        "64 B ping-pong p50 (µs)".to_owned(),
        "64 B ping-pong p99 (µs)".to_owned(),
    ];
    for (index, label) in labels.into_iter().enumerate() {
        let [agent_values, direct_values] = &values[index];
        let ratios: Vec<f64> = agent_values
            .iter()
            .zip(direct_values)
            .map(|(a, d)| a / d)
            .collect();
        let show = |v: &[f64]| {
            Spread::of(v).map_or("–".into(), |s| s.show(if index >= 3 { 0 } else { 1 }))
        };
        table.row(vec![
            label,
            show(direct_values),
            show(agent_values),
            Spread::of(&ratios).map_or("–".into(), |s| format!("{}×", s.show(2))),
        ]);
    }
    table.note(format!(
        "Median (min–max) of {} repetitions, ratios within each. Echo workloads: every byte \
         is compared. The agent holds a tunnel open up to 5 s after its client closed \
         (--half-closed-idle-seconds); at its listener's default limit (512) a new connection \
         ends the oldest held tunnel instead of being reset. Short connections reset in all \
         repetitions: agent {}, direct {} (not counted as completed).",
        work.repeat, resets[0], resets[1]
    ));
    Ok(table)
}

/// The agent pod behind the egress Service `cluster_ip`: its listener (pod IP and target
/// port) and its tailscaled's LocalAPI socket (the pod's `tailscale-socket` emptyDir, which
/// the test environment's kubelet keeps under its run directory).
async fn agent_pod(
    client: &kube::Client,
    ns: &str,
    cluster_ip: &str,
    kubelet_dir: &Path,
) -> Result<(SocketAddr, LocalApi)> {
    use k8s_openapi::api::core::v1::{Pod, Service};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await?;
    let service = services
        .items
        .iter()
        .find(|s| s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some(cluster_ip))
        .context("no Service with the egress ClusterIP")?;
    let spec = service.spec.as_ref().context("Service spec")?;
    let selector = spec
        .selector
        .as_ref()
        .context("the egress Service has no selector")?
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let port = spec
        .ports
        .as_ref()
        .and_then(|ports| ports.iter().find(|p| p.port == i32::from(PORT)))
        .context("no Service port for the target")?;
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    let pod = pods
        .items
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
        .context("no agent pod with an IP")?;
    let pod_ip: Ipv4Addr = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .context("pod IP")?
        .parse()?;
    let target_port = match &port.target_port {
        Some(IntOrString::Int(number)) => u16::try_from(*number)?,
        Some(IntOrString::String(name)) => pod
            .spec
            .iter()
            .flat_map(|spec| &spec.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| u16::try_from(p.container_port))
            .context("named target port not in the pod")??,
        None => PORT,
    };
    let uid = pod.metadata.uid.as_deref().context("pod uid")?;
    let socket = kubelet_dir
        .join("pods")
        .join(uid)
        .join("volumes/tailscale-socket/tailscaled.sock");
    if !socket.exists() {
        bail!(
            "the agent pod's LocalAPI socket is not at {}",
            socket.display()
        );
    }
    // A unix socket path must fit in sockaddr_un (108 bytes); the kubelet's is longer.
    let short = std::env::temp_dir().join(format!("tno-bench-{}-ts.sock", std::process::id()));
    let _ = std::fs::remove_file(&short);
    std::os::unix::fs::symlink(&socket, &short)
        .with_context(|| format!("linking {} to {}", short.display(), socket.display()))?;
    Ok((
        SocketAddr::from((pod_ip, target_port)),
        LocalApi::new(short),
    ))
}

pub async fn run(operator_binary: &Path, work: Workload) -> Result<Vec<Table>> {
    let env = E2eEnv::shared()
        .await
        .map_err(|e| anyhow::anyhow!("test environment: {e}"))?;
    let ops = env
        .namespace("bench-tn")
        .await
        .map_err(|e| anyhow::anyhow!("namespace: {e}"))?;
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    // The base policy plus a grant for the laptop (group:team-a), so the operator's live
    // policy lets the direct dial through too.
    let mut base: serde_json::Value =
        serde_json::from_str(&env.base_policy().map_err(|e| anyhow::anyhow!("{e}"))?)?;
    base["grants"]
        .as_array_mut()
        .context("grants in the base policy")?
        .push(json!({"src": ["group:team-a"], "dst": [format!("{TARGET}/32")], "ip": [format!("tcp:{PORT}")]}));
    ops.create_bootstrap(&serde_json::to_string_pretty(&base)?)
        .await
        .map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
    let apply = PatchParams::apply("tno-bench").force();
    let tailnet = format!("t-{ns}");
    Api::<tailnet_api::Tailnet>::all(client.clone())
        .patch(
            &tailnet,
            &apply,
            &Patch::Apply(env.tailnet_object(&tailnet, "Apply")),
        )
        .await
        .context("Tailnet")?;
    let mut operator = env
        .start_operator(operator_binary, &OperatorArgs::new(&ns).to_args())
        .await
        .map_err(|e| anyhow::anyhow!("operator: {e}"))?;
    operator
        .wait_ready(Duration::from_secs(60))
        .await
        .map_err(|e| anyhow::anyhow!("operator ready: {e}"))?;
    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), &ns);
    egresses
        .patch(
            "site",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
                "metadata": {"name": "site", "namespace": ns},
                "spec": {"tailnetRef": {"name": tailnet}, "consumerNamespaces": [ns],
                         // Default limits (512 per listener): held tunnels give their slots
                         // to new connections, so the connection rate is not capped by them.
                         "targets": [{"name": "remote-db", "address": TARGET, "port": PORT}]}
            })),
        )
        .await
        .context("TailnetEgress")?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let cluster_ip = loop {
        let egress = egresses.get("site").await?;
        let status = egress.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let ip = status
            .targets
            .iter()
            .find(|t| t.name == "remote-db")
            .and_then(|t| t.cluster_ip.clone());
        if let (true, Some(ip)) = (ready, ip) {
            break ip;
        }
        if Instant::now() > deadline {
            bail!(
                "the egress is not Ready after 300 s: {:?}\n{}",
                status.conditions,
                operator.log_tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let service: Ipv4Addr = cluster_ip.parse().context("ClusterIP")?;
    let agent = Path2::Agent(SocketAddr::from((service, PORT)));
    let direct = Path2::Direct(env.tailnet().laptop.node.local_api());
    let (pod_address, agent_node) =
        agent_pod(&client, &ns, &cluster_ip, &env.kube().dir().join("kubelet")).await?;
    let breakdown_paths = vec![
        direct.clone(),
        Path2::AgentNode(agent_node),
        Path2::AgentPod(pod_address),
        agent.clone(),
    ];
    let lab = env.lab().clone();
    let pod = lab.add_pod_netns("bench-client").context("client netns")?;
    let netns = pod.netns.clone();
    // The client runs in a pod netns (so the Service is reached like from a pod); the
    // LocalAPI is a unix socket, reachable from any netns.
    // A thread of its own: a tokio blocking-pool thread would go back to the pool inside the
    // pod netns and carry it into later spawn_blocking work (the test env's forwarders).
    let client_thread = std::thread::spawn(move || {
        netns
            .enter_current_thread()
            .context("entering the client netns")?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            // Both paths must work before anything is measured (routes, grants, netmap).
            let warm_deadline = Instant::now() + Duration::from_secs(120);
            for path in &breakdown_paths {
                loop {
                    match tokio::time::timeout(Duration::from_secs(5), echo_bulk(path, 1024)).await
                    {
                        Ok(Ok(_)) => break,
                        result if Instant::now() > warm_deadline => {
                            bail!("{} never echoed: {result:?}", path.name())
                        }
                        _ => tokio::time::sleep(Duration::from_millis(500)).await,
                    }
                }
            }
            let main = measure(agent, direct, work).await?;
            let parts = breakdown(&breakdown_paths, work).await?;
            anyhow::Ok(vec![main, parts])
        })
    });
    let measured = tokio::task::spawn_blocking(move || {
        client_thread
            .join()
            .map_err(|_| anyhow::anyhow!("the client thread panicked"))?
    })
    .await;
    let _ = lab.remove_pod_netns("bench-client");
    drop(operator);
    measured.context("client thread")?
}
