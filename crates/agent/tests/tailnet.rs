//! The agent in a REAL tailnet: Headscale 0.29, tailscaled 1.102 (userspace networking) for
//! the agent's node, a subnet router in front of the remote site 192.0.2.0/24, a laptop node
//! owned by alice, and the real `tailnet-agent` binary in the node's network namespace
//! talking to its LocalAPI socket. Egress goes out through the router; ingress comes in from
//! the laptop through tailscaled's loopback forwarding, with the identity from whois.
//!
//! Needs root and the binaries from `deps/build.sh`. Without the binaries the test says so
//! and passes, unless `TNO_REQUIRE_REAL_ENV=1` (then it fails).

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Agent, admin_get, eventually, metric};
use serde_json::json;
use sha2::{Digest, Sha256};
use tno_netlab::{Netns, RunId};
use tno_testenv_tailnet::{
    Binaries, CLIENT_TAG, Dialed, JoinOptions, JoinedNode, SITE_BANNER, SITE_ECHO, SITE_ROUTES,
    TailnetEnv,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const REMOTE_DB: u16 = 10000;
const NOT_ROUTED: u16 = 10001;
const CLOSED_PORT: u16 = 10002;
const UNGRANTED_PORT: u16 = 10003;
const UNGRANTED_HOST: u16 = 10004;
/// A server in the agent's own netns on its lab address: reachable from the pod network,
/// not a tailnet route. If anything dialed it, traffic would have left the tailnet.
const LEAK_WITNESS_PORT: u16 = 17777;
const TRANSFER_BYTES: usize = 16 * 1024 * 1024;
const INGRESS_HTTPS: u16 = 8443;
const INGRESS_TCP: u16 = 6443;
const INGRESS_BACKEND: u16 = 18080;

fn skip_without_binaries() -> bool {
    match Binaries::locate() {
        Ok(_) => false,
        Err(error) if std::env::var_os("TNO_REQUIRE_REAL_ENV").is_none() => {
            eprintln!("SKIPPED: real tailnet binaries missing ({error}); run deps/build.sh");
            true
        }
        Err(error) => panic!("TNO_REQUIRE_REAL_ENV is set but: {error}"),
    }
}

fn agent_port(port: u16) -> SocketAddr {
    SocketAddr::from((common::POD_IP, port))
}

/// Writes `payload` and reads as many bytes back concurrently; returns (sha256, seconds).
async fn echo_transfer<S>(stream: S, payload: Arc<Vec<u8>>) -> (String, f64)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let length = payload.len();
    let writing = tokio::spawn(async move {
        for chunk in payload.chunks(64 * 1024) {
            writer.write_all(chunk).await?;
        }
        std::io::Result::Ok(writer)
    });
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut received = 0;
    while received < length {
        let read = reader
            .read(&mut buffer)
            .await
            .unwrap_or_else(|e| panic!("echo read: {e}"));
        assert!(read > 0, "echo closed after {received} bytes");
        hasher.update(&buffer[..read]);
        received += read;
    }
    let _writer = writing.await.unwrap_or_else(|e| panic!("{e}"));
    (
        format!("{:x}", hasher.finalize()),
        started.elapsed().as_secs_f64(),
    )
}

async fn echo_once(port: u16) -> Result<(), String> {
    let attempt = async {
        let mut stream = TcpStream::connect(agent_port(port))
            .await
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"hello")
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = [0u8; 5];
        stream
            .read_exact(&mut answer)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if &answer == b"hello" {
            Ok(())
        } else {
            Err(format!("wrong echo {answer:?}"))
        }
    };
    tokio::time::timeout(Duration::from_secs(6), attempt)
        .await
        .unwrap_or_else(|_| Err("no echo within 6s".into()))
}

#[test]
fn agent_in_a_real_tailnet() {
    if skip_without_binaries() {
        return;
    }
    let root_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let (env, joined) = root_runtime.block_on(join_agent_node());
    let (agent_ip, laptop_ip) = root_runtime.block_on(async {
        let agent_ip = joined
            .node
            .tailnet_ipv4()
            .await
            .unwrap_or_else(|e| panic!("agent tailnet ip: {e}"));
        let laptop_ip = env
            .laptop
            .node
            .tailnet_ipv4()
            .await
            .unwrap_or_else(|e| panic!("laptop tailnet ip: {e}"));
        (agent_ip, laptop_ip)
    });
    let laptop_api = env.laptop.node.local_api();

    joined
        .netns
        .ip(&[
            "addr",
            "add",
            &format!("{}/32", common::POD_IP),
            "dev",
            "lo",
        ])
        .unwrap_or_else(|e| panic!("pod ip: {e}"));
    let lab_addr = joined.lab_addr;
    let socket = joined.node.local_api().socket().to_owned();
    let run = RunId::generate().unwrap_or_else(|e| panic!("run id: {e}"));
    let dir = run.scratch_dir();
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let pki = common::Pki::new("tailnet test CA");
    let (cert, key) = pki.leaf(&["portal.test"]);
    std::fs::write(dir.join("tls.crt"), cert).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("tls.key"), key).unwrap_or_else(|e| panic!("{e}"));
    let config = agent_config(&socket, lab_addr, &dir);
    let config_file = dir.join("config.json");
    let mut limited_config = config.clone();
    limited_config["limits"] = json!({"maxConnections": 1024, "maxConnectionsPerListener": 3});
    let agent = Agent::start_in(
        run,
        Netns::adopt(joined.netns.name()),
        dir,
        &config,
        &["--dial-timeout-seconds", "3"],
    );
    let direct_api = tno_testenv_tailnet::LocalApi::new(&socket);
    let agent_pid = agent.pid();

    agent.run(move || async move {
        common::backend::spawn(
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, INGRESS_BACKEND)),
            None,
        )
        .await;
        let leaks = leak_witness(lab_addr).await;
        egress_phase(&direct_api).await;
        dial_self_phase().await;
        probe_phase(&leaks).await;
        no_leak_phase(agent_pid).await;
        ingress_phase(&laptop_api, &agent_ip, &laptop_ip, &pki).await;
        reclaim_phase(&config_file, &limited_config).await;
    });
    drop(agent);
    let _ = root_runtime;
    drop(joined);
    let _ = env;
}

/// Joins the agent's node (tag:client, accepting routes), grants it the remote site's echo
/// ports and team-a the ingress ports, and approves the subnet router's routes.
async fn join_agent_node() -> (&'static TailnetEnv, JoinedNode) {
    let env = TailnetEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("tailnet environment: {e}"));
    let joined = env
        .join_node(
            "egress-agent",
            JoinOptions {
                tags: vec![CLIENT_TAG.into()],
                accept_routes: true,
                ..JoinOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("agent node joins: {e}\n{}", env.log_report(&[])));
    let api = env.headscale.api();
    let grant = json!({
        "src": [CLIENT_TAG],
        "dst": [format!("{}/32", SITE_ECHO.ip())],
        "ip": [format!("tcp:{}", SITE_ECHO.port()), format!("tcp:{}", SITE_ECHO.port() + 1)],
    });
    let ingress_grant = json!({
        "src": [tno_testenv_tailnet::TEAM_A_GROUP],
        "dst": [CLIENT_TAG],
        "ip": [format!("tcp:{INGRESS_HTTPS}"), format!("tcp:{INGRESS_TCP}")],
    });
    let policy = env
        .policy_with_grants(&[grant, ingress_grant])
        .unwrap_or_else(|e| panic!("policy: {e}"));
    api.set_policy(&policy)
        .await
        .unwrap_or_else(|e| panic!("set policy: {e}"));
    let router = eventually(Duration::from_secs(60), "router advertises", || async {
        let nodes = api.list_nodes().await.ok()?;
        nodes.into_iter().find(|node| {
            node.given_name == "router"
                && SITE_ROUTES
                    .iter()
                    .all(|route| node.available_routes.iter().any(|r| r == route))
        })
    })
    .await;
    api.approve_routes(router.id, &SITE_ROUTES)
        .await
        .unwrap_or_else(|e| panic!("approve routes: {e}"));
    (env, joined)
}

/// The agent's config: five egress targets (routed, Dial-Self, closed, ungranted port and
/// host), a tcp and an https ingress in front of the local backend.
fn agent_config(socket: &Path, lab_addr: Ipv4Addr, dir: &Path) -> serde_json::Value {
    let ingress_backend = json!({"host": "127.0.0.1", "port": INGRESS_BACKEND});
    let echo_host = SITE_ECHO.ip().to_string();
    let config = json!({
        "localapiSocket": socket,
        "adminPort": common::ADMIN_PORT,
        "egress": [
            {"name": "remote-db", "listenPort": REMOTE_DB, "targetHost": echo_host,
             "targetPort": SITE_ECHO.port(), "probeIntervalSeconds": 1},
            {"name": "not-routed", "listenPort": NOT_ROUTED, "targetHost": lab_addr.to_string(),
             "targetPort": LEAK_WITNESS_PORT, "probeIntervalSeconds": 1},
            {"name": "closed-port", "listenPort": CLOSED_PORT, "targetHost": echo_host,
             "targetPort": SITE_ECHO.port() + 1, "probeIntervalSeconds": 1},
            {"name": "ungranted-port", "listenPort": UNGRANTED_PORT, "targetHost": echo_host,
             "targetPort": SITE_ECHO.port() + 2, "probeIntervalSeconds": 2},
            {"name": "ungranted-host", "listenPort": UNGRANTED_HOST, "targetHost": SITE_BANNER.ip().to_string(),
             "targetPort": SITE_BANNER.port(), "probeIntervalSeconds": 2},
        ],
        "ingress": [
            {"mode": "tcp", "name": "raw", "port": INGRESS_TCP, "backend": ingress_backend},
            {"mode": "http", "port": INGRESS_HTTPS, "routes": [
                {"name": "web", "hostnames": ["portal.test"], "backend": ingress_backend}
            ]},
        ],
        "tls": {"certFile": dir.join("tls.crt"), "keyFile": dir.join("tls.key")},
    });
    config
}

/// A server on the node's lab address (reachable from the pod network, not a tailnet route)
/// that counts the connections it gets: anything dialing it left the tailnet.
async fn leak_witness(lab_addr: Ipv4Addr) -> Arc<AtomicUsize> {
    let leaks = Arc::new(AtomicUsize::new(0));
    let witness = TcpListener::bind(SocketAddr::new(IpAddr::V4(lab_addr), LEAK_WITNESS_PORT))
        .await
        .unwrap_or_else(|e| panic!("leak witness: {e}"));
    {
        let leaks = leaks.clone();
        tokio::spawn(async move {
            while witness.accept().await.is_ok() {
                leaks.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    // The witness is reachable from the pod network: leaking would be possible.
    TcpStream::connect(SocketAddr::new(IpAddr::V4(lab_addr), LEAK_WITNESS_PORT))
        .await
        .unwrap_or_else(|e| panic!("witness reachable from the pod: {e}"));
    eventually(Duration::from_secs(5), "witness saw the check", || async {
        (leaks.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    leaks.store(0, Ordering::SeqCst);
    leaks
}

/// Ready, then bytes through the router both ways (throughput next to a direct LocalAPI
/// dial), and a half-close that keeps the tunnel until the answer.
async fn egress_phase(direct_api: &tno_testenv_tailnet::LocalApi) {
    // While the agent starts, its targets' states as /status shows them: a normal start has
    // no `Error` (target probes wait for the tailnet instead of failing before it).
    let seen_states = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let read_states = || async {
        if let Ok((200, body)) = common::raw_http(
            common::admin_address(),
            "GET /status HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await
        {
            let report: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            for target in report["targets"].as_array().into_iter().flatten() {
                let state = format!("{}={}", target["name"], target["state"]);
                if let Ok(mut seen) = seen_states.lock() {
                    seen.insert((state, target["message"].to_string()));
                }
            }
        }
    };
    let ready = eventually(Duration::from_secs(60), "agent ready", || async {
        read_states().await;
        let (status, body) = common::raw_http(
            common::admin_address(),
            "GET /readyz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await
        .ok()?;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(ready, "ok\n");
    // A fast start can be ready at the first poll, before /status listed the targets: the
    // states once ready belong to the start too.
    read_states().await;
    let seen = seen_states.into_inner().unwrap_or_default();
    assert!(
        !seen.is_empty(),
        "the status was never read during the start"
    );
    let errors: Vec<_> = seen
        .iter()
        .filter(|(s, _)| s.ends_with("\"Error\""))
        .collect();
    assert!(
        errors.is_empty(),
        "a probe reported Error during a normal start: {errors:?}"
    );
    // The first readiness waits for every probed target's first result.
    let (_, body) = common::raw_http(
        common::admin_address(),
        "GET /status HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap_or_else(|e| panic!("status: {e}"));
    let report: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let targets = report["targets"].as_array().cloned().unwrap_or_default();
    assert_eq!(targets.len(), 5, "{report}");
    for target in &targets {
        assert!(
            target["lastProbe"].is_string(),
            "ready before the first result of {}: {target}",
            target["name"]
        );
    }

    // Bytes reach 192.0.2.10:5432 behind the subnet router and come back.
    let mut last = String::new();
    let converged = Instant::now() + Duration::from_secs(60);
    while let Err(reason) = echo_once(REMOTE_DB).await {
        assert!(Instant::now() < converged, "egress never worked: {reason}");
        last = reason;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!("egress echo works (last failure before: {last:?})");

    // Throughput through the agent next to a direct LocalAPI dial, same run.
    let payload: Arc<Vec<u8>> = Arc::new((0..TRANSFER_BYTES).map(|i| (i % 253) as u8).collect());
    let expected = tailnet_api::digest::sha256_hex(payload.as_slice());
    let stream = TcpStream::connect(agent_port(REMOTE_DB))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let (hash, through_agent) = echo_transfer(stream, payload.clone()).await;
    assert_eq!(hash, expected, "byte-identical through the agent");
    let direct = match direct_api
        .dial(&SITE_ECHO.ip().to_string(), SITE_ECHO.port())
        .await
        .unwrap_or_else(|e| panic!("direct dial: {e}"))
    {
        Dialed::Tailnet(stream) => stream,
        Dialed::DialSelf { addr } => panic!("direct dial answered Dial-Self {addr}"),
    };
    let (hash, direct_seconds) = echo_transfer(direct, payload.clone()).await;
    assert_eq!(hash, expected);
    let mib = TRANSFER_BYTES as f64 / (1024.0 * 1024.0);
    eprintln!(
        "{mib:.0} MiB echo via the tailnet ({} build): agent {through_agent:.2}s ({:.1} MiB/s), direct LocalAPI dial {direct_seconds:.2}s ({:.1} MiB/s), ratio {:.2}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        mib / through_agent,
        mib / direct_seconds,
        direct_seconds / through_agent
    );

    // The client's half-close does not tear down tailscaled's tunnel before the answer.
    let mut stream = TcpStream::connect(agent_port(REMOTE_DB))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    stream
        .write_all(b"ping")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    stream.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    let mut answer = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("no echo after half-close"))
        .unwrap_or_else(|e| panic!("echo after half-close: {e}"));
    assert_eq!(&answer, b"ping");
}

async fn dial_self_phase() {
    // Dial-Self: refused, counted, never dialed from the pod network.
    let started = Instant::now();
    let mut stream = TcpStream::connect(agent_port(NOT_ROUTED))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let _ = stream.write_all(b"must not leave the tailnet").await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("the refused connection was not closed"));
    assert!(answer.is_empty(), "{read:?} {answer:?}");
    eprintln!("Dial-Self refusal took {:?}", started.elapsed());
    assert!(
        metric(
            "tailnet_agent_dial_failures_total",
            &[("listener", "not-routed"), ("reason", "dial_self")]
        )
        .await
            >= 1.0
    );
}

async fn probe_phase(leaks: &AtomicUsize) {
    // Probe results as the operator reads them.
    let expected_states = [
        ("remote-db", "Reachable"),
        ("not-routed", "NoRoute"),
        ("closed-port", "Refused"),
        ("ungranted-port", "Timeout"),
        ("ungranted-host", "NoRoute"),
    ];
    let mut seen = Default::default();
    let probed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let (_, body) = admin_get("/status").await;
            let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let targets: std::collections::BTreeMap<String, serde_json::Value> = status["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| (t["name"].as_str().unwrap_or_default().to_owned(), t.clone()))
                .collect();
            let done = expected_states
                .iter()
                .all(|(name, state)| targets.get(*name).is_some_and(|t| t["state"] == *state));
            seen = targets;
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let targets: std::collections::BTreeMap<String, serde_json::Value> = seen;
    for (name, target) in &targets {
        eprintln!("probe {name}: {} ({})", target["state"], target["message"]);
    }
    assert!(probed.is_ok(), "probe states {targets:?}");
    assert_eq!(targets["remote-db"]["state"], "Reachable");
    assert_eq!(targets["not-routed"]["state"], "NoRoute");
    assert!(
        targets["not-routed"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Dial-Self")),
        "{}",
        targets["not-routed"]
    );
    assert_eq!(targets["closed-port"]["state"], "Refused");
    // A granted host on an ungranted port: the router's filter drops the SYN.
    assert_eq!(targets["ungranted-port"]["state"], "Timeout");
    // A host no grant covers: Headscale leaves it out of this node's routes altogether,
    // so tailscaled answers Dial-Self although the router advertises (and has approved)
    // 198.51.100.0/24. NoRoute therefore also means "no grant" with Headscale 0.29.
    assert_eq!(targets["ungranted-host"]["state"], "NoRoute");

    // Every probe of the unrouted target was refused too: nothing reached the witness.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        leaks.load(Ordering::SeqCst),
        0,
        "a non-tailnet target was dialed"
    );
    let (_, metrics) = admin_get("/metrics").await;
    assert_eq!(
        common::metric_in(&metrics, "tailnet_agent_tailnet_connected", &[]),
        1.0
    );
    assert!(
        common::metric_in(
            &metrics,
            "tailnet_agent_bytes_total",
            &[("listener", "remote-db"), ("direction", "out")]
        ) >= TRANSFER_BYTES as f64
    );
}

async fn no_leak_phase(agent_pid: i32) {
    // No task or fd leak: after a burst of relayed and refused connections the agent is
    // back to its idle file descriptors and no connection is counted as active.
    let open_fds = || {
        std::fs::read_dir(format!("/proc/{agent_pid}/fd"))
            .map(|entries| entries.count())
            .unwrap_or(0)
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_fds = open_fds();
    for round in 0..20 {
        echo_once(REMOTE_DB)
            .await
            .unwrap_or_else(|e| panic!("echo {round}: {e}"));
        let mut refused = TcpStream::connect(agent_port(NOT_ROUTED))
            .await
            .unwrap_or_else(|e| panic!("connect: {e}"));
        let mut nothing = Vec::new();
        let _ = refused.read_to_end(&mut nothing).await;
    }
    let settled = eventually(Duration::from_secs(20), "connections closed", || async {
        let active = metric("tailnet_agent_active_connections", &[]).await;
        let fds = open_fds();
        (active == 0.0 && fds <= idle_fds + 2).then_some(fds)
    })
    .await;
    eprintln!("agent fds: {idle_fds} idle, {settled} after 40 connections");
}

async fn ingress_phase(
    laptop_api: &tno_testenv_tailnet::LocalApi,
    agent_ip: &str,
    laptop_ip: &str,
    pki: &common::Pki,
) {
    // Ingress: alice's laptop → the agent node's tailnet IP → tailscaled's loopback
    // forward → the agent's TLS listener → backend, with her identity from whois.
    let client_config = pki.client_config(&[b"http/1.1"]);
    let echoed = eventually(Duration::from_secs(60), "laptop reaches the https ingress", || {
        let (laptop_api, agent_ip, client_config) =
            (laptop_api.clone(), agent_ip, client_config.clone());
        async move {
            let attempt = async {
                let Dialed::Tailnet(stream) =
                    laptop_api.dial(agent_ip, INGRESS_HTTPS).await.ok()?
                else {
                    return None;
                };
                let name = rustls::pki_types::ServerName::try_from("portal.test").ok()?;
                let mut tls = tokio_rustls::TlsConnector::from(client_config)
                    .connect(name, stream)
                    .await
                    .ok()?;
                tls.write_all(
                    b"GET /echo-headers HTTP/1.1\r\nHost: portal.test\r\nTailscale-User-Login: mallory@\r\nConnection: close\r\n\r\n",
                )
                .await
                .ok()?;
                let mut answer = Vec::new();
                let _ = tls.read_to_end(&mut answer).await;
                let (status, body) = common::parse_answer(&answer);
                (status == 200).then_some(body)
            };
            tokio::time::timeout(Duration::from_secs(6), attempt).await.ok().flatten()
        }
    })
    .await;
    let echoed: serde_json::Value = serde_json::from_str(&echoed).unwrap_or_default();
    let headers = &echoed["headers"];
    eprintln!("backend saw, from the laptop: {headers}");
    assert_eq!(headers["x-forwarded-for"], laptop_ip, "{echoed}");
    assert_eq!(headers["x-forwarded-proto"], "https");
    assert!(
        headers["tailscale-user-login"]
            .as_str()
            .is_some_and(|login| login.contains(tno_testenv_tailnet::LAPTOP_USER)
                && !login.contains("mallory")),
        "{echoed}"
    );
    assert!(
        headers["tailscale-node-name"]
            .as_str()
            .is_some_and(|n| n.starts_with("laptop")),
        "{echoed}"
    );

    let raw = eventually(
        Duration::from_secs(30),
        "laptop reaches the tcp ingress",
        || {
            let (laptop_api, agent_ip) = (laptop_api.clone(), agent_ip);
            async move {
                let attempt = async {
                    let Dialed::Tailnet(mut stream) =
                        laptop_api.dial(agent_ip, INGRESS_TCP).await.ok()?
                    else {
                        return None;
                    };
                    stream
                        .write_all(b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .await
                        .ok()?;
                    let mut answer = Vec::new();
                    let _ = stream.read_to_end(&mut answer).await;
                    let (status, body) = common::parse_answer(&answer);
                    (status == 200).then_some(body)
                };
                tokio::time::timeout(Duration::from_secs(6), attempt)
                    .await
                    .ok()
                    .flatten()
            }
        },
    )
    .await;
    assert_eq!(raw, "admin-backend");
}

async fn reclaim_phase(config_file: &Path, limited_config: &serde_json::Value) {
    // Under pressure, held egress tunnels (the client sent EOF and the target is silent; a
    // client that closed looks the same) give their slots to new connections instead of
    // the new ones being reset. With 3 slots and the 5 s hold, short connections one
    // after another find the listener full from the fourth on.
    let temporary = config_file.with_extension("json.new");
    common::write_json(&temporary, limited_config);
    std::fs::rename(&temporary, config_file).unwrap_or_else(|e| panic!("rename: {e}"));
    eventually(
        Duration::from_secs(20),
        "the listener limit of 3 is loaded",
        || async {
            let (_, body) = admin_get("/status").await;
            let status: serde_json::Value = serde_json::from_str(&body).ok()?;
            status["listeners"]
                .as_array()?
                .iter()
                .any(|l| l["name"] == "remote-db" && l["maxConnections"] == 3)
                .then_some(())
        },
    )
    .await;
    let remote_db = [("listener", "remote-db")];
    let counts = || async {
        (
            metric("tailnet_agent_connections_reclaimed_total", &remote_db).await,
            metric("tailnet_agent_connections_refused_total", &remote_db).await,
        )
    };
    // Nothing of the earlier phases is held any more (5 s hold).
    eventually(
        Duration::from_secs(20),
        "no egress connection open",
        || async {
            (metric("tailnet_agent_active_connections", &remote_db).await == 0.0).then_some(())
        },
    )
    .await;
    let (reclaimed_before, refused_before) = counts().await;
    let started = Instant::now();
    for round in 0..12 {
        echo_once(REMOTE_DB)
            .await
            .unwrap_or_else(|e| panic!("short connection {round} with 3 slots: {e}"));
        // Lets the agent read this client's EOF, and the held tunnel stay quiet for
        // `limits::RECLAIM_QUIET` (200 ms), before the next one arrives: only an idle held
        // tunnel may be taken.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let elapsed = started.elapsed();
    let (reclaimed, refused) = counts().await;
    let (reclaimed, refused) = (reclaimed - reclaimed_before, refused - refused_before);
    eprintln!(
        "12 short connections, 3 slots: {reclaimed} held ones reclaimed, {refused} refused, in {elapsed:?}"
    );
    assert_eq!(refused, 0.0, "no short connection may be reset");
    assert!(
        reclaimed >= 1.0,
        "the fourth connection found the listener full"
    );
    if elapsed < Duration::from_secs(5) {
        // No hold expired on its own meanwhile: every connection from the fourth took one.
        assert_eq!(reclaimed, 9.0);
    }
    // Active connections are never taken: with three open (no EOF), a fourth is reset.
    eventually(
        Duration::from_secs(20),
        "the held connections ended",
        || async {
            (metric("tailnet_agent_active_connections", &remote_db).await == 0.0).then_some(())
        },
    )
    .await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(agent_port(REMOTE_DB))
            .await
            .unwrap_or_else(|e| panic!("connect: {e}"));
        stream
            .write_all(b"hold")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut answer = [0u8; 4];
        stream
            .read_exact(&mut answer)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        open.push(stream);
    }
    // The agent resets it at once: often before the client's connect even returns.
    let mut nothing = Vec::new();
    let fourth = async {
        let mut stream = TcpStream::connect(agent_port(REMOTE_DB)).await?;
        stream.write_all(b"nope").await?;
        stream.read_to_end(&mut nothing).await
    };
    let reset = tokio::time::timeout(Duration::from_secs(5), fourth)
        .await
        .unwrap_or_else(|_| panic!("the fourth connection was neither reset nor served"));
    assert!(
        reset.is_err() || nothing.is_empty(),
        "the fourth connection got {nothing:?}"
    );
    let (_, refused_after) = counts().await;
    assert_eq!(
        refused_after - refused_before,
        1.0,
        "the fourth connection is refused"
    );
    for stream in &mut open {
        stream
            .write_all(b"live")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut answer = [0u8; 4];
        stream
            .read_exact(&mut answer)
            .await
            .unwrap_or_else(|e| panic!("still served: {e}"));
        assert_eq!(&answer, b"live");
    }
}
