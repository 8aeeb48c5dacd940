//! Leadership when the leader's apiserver connection hangs (issue 14 item 5), against the real
//! kube-apiserver and a real Headscale 0.29.
//!
//! Two operator processes share a Lease (6 s). The first one (the leader) reaches the
//! apiserver through a TCP proxy of this test and Headscale (HTTPS behind the lab CA) through a
//! counting proxy (`HTTPS_PROXY`; the proxy answers `CONNECT`, terminates TLS with a
//! certificate of the same lab CA and opens its own TLS connection to Headscale, so every
//! Headscale request of that process is seen and timed). The test
//! freezes the leader's apiserver proxy (connections stay open, no byte moves: a hung
//! connection, not a refused one), then changes the base policy. The standby takes the Lease
//! and writes the new policy; the old leader's caches are frozen at the old policy, so if it
//! still reconciled it would put the old one back. Expected: the old leader steps down (its
//! process exits) before the standby takes over, and makes no Headscale write after the
//! takeover; the new policy stays live.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::local_operator::free_port;
use support::objects::{apply, tailnet_name};
use support::wait::wait_for;
use tailnet_api::Tailnet;
use tno_testenv_tailnet::TailnetEnv;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(90);
const LEASE_SECONDS: u64 = 6;
/// How long the test watches for writes of the old leader after the takeover: several
/// Headscale polls (2 s) of a replica that would still be reconciling.
const WATCH_AFTER_TAKEOVER: Duration = Duration::from_secs(12);

fn base_policy(port: u16) -> String {
    format!(
        r#"// Base policy of the leadership test (human-owned).
{{
  "groups": {{"group:platform": ["admin@"], "group:team-a": ["alice@"]}},
  "tagOwners": {{"tag:router": ["admin@"], "tag:client": ["admin@"], "tag:server": ["admin@"]}},
  "grants": [
    {{"src": ["tag:client"], "dst": ["tag:server"], "ip": ["tcp:{port}"]}},
  ],
}}
"#
    )
}

/// A TCP proxy that can freeze: while frozen, accepted connections stay open and no byte
/// moves in either direction (what a hung apiserver connection looks like to a client).
struct FreezeProxy {
    addr: SocketAddr,
    frozen: watch::Sender<bool>,
}

impl FreezeProxy {
    async fn start(upstream: SocketAddr) -> FreezeProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (frozen, _) = watch::channel(false);
        let gate = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let gate = gate.subscribe();
                tokio::spawn(async move {
                    let mut open = gate.clone();
                    let _ = open.wait_for(|frozen| !frozen).await;
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, gate.clone()), pump(sr, cw, gate));
                });
            }
        });
        FreezeProxy { addr, frozen }
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }
}

/// Copies `from` to `to`, holding every chunk while the gate says frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if gate.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if gate.wait_for(|frozen| !frozen).await.is_err() || to.write_all(&buf[..n]).await.is_err()
        {
            return;
        }
    }
}

/// One request seen by the counting proxy.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    method: String,
    target: String,
}

impl Seen {
    /// A request that changes Headscale's state (the policy check is a POST that does not).
    fn is_write(&self) -> bool {
        self.method != "GET" && self.method != "HEAD" && !self.target.ends_with("/policy/check")
    }
}

/// A forward proxy to one upstream (the HTTPS Headscale) that records every request line: the
/// old leader's Headscale traffic, and only its, goes through it (`HTTPS_PROXY`). It answers
/// the `CONNECT`, terminates the tunnelled TLS with `acceptor` (a lab CA certificate, trusted
/// by the operator through `spec.serverCA`) and forwards over its own TLS connection.
struct CountingProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl CountingProxy {
    async fn start(
        upstream: SocketAddr,
        ca_pem: &str,
        acceptor: tokio_rustls::TlsAcceptor,
    ) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let ca_pem = ca_pem.to_owned();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (log, ca_pem, acceptor) = (log.clone(), ca_pem.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let Some(client) = accept_connect(client, &acceptor).await else {
                        return;
                    };
                    let Ok(server) = support::lab_tls::connect(upstream, &ca_pem).await else {
                        return;
                    };
                    let (mut cr, mut cw) = tokio::io::split(client);
                    let (mut sr, mut sw) = tokio::io::split(server);
                    let requests = async {
                        forward_requests(&mut cr, &mut sw, &log).await;
                        let _ = sw.shutdown().await;
                    };
                    let responses = async {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                        let _ = cw.shutdown().await;
                    };
                    tokio::join!(requests, responses);
                });
            }
        });
        CountingProxy { addr, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("log").clone()
    }
}

/// Reads the proxy request (`CONNECT host:port`, nothing else is expected), answers 200 and
/// terminates the client's TLS inside the tunnel.
async fn accept_connect(
    mut client: TcpStream,
    acceptor: &tokio_rustls::TlsAcceptor,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || client.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"CONNECT ") {
        return None;
    }
    client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .ok()?;
    acceptor.accept(client).await.ok()
}

/// Forwards requests one after another on a kept-alive connection, recording each request
/// line: head, then Content-Length bytes of body (the client sends no chunked bodies).
async fn forward_requests(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    log: &Mutex<Vec<Seen>>,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut body_left = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        loop {
            if body_left > 0 {
                if pending.is_empty() {
                    break;
                }
                let take = body_left.min(pending.len());
                if to.write_all(&pending[..take]).await.is_err() {
                    return;
                }
                pending.drain(..take);
                body_left -= take;
                continue;
            }
            let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
                break;
            };
            let head_len = end + 4;
            let head = String::from_utf8_lossy(&pending[..head_len]).to_string();
            let mut line = head.lines().next().unwrap_or("").split(' ');
            let method = line.next().unwrap_or("").to_string();
            let target = line.next().unwrap_or("").to_string();
            log.lock().expect("log").push(Seen {
                at: Instant::now(),
                method,
                target,
            });
            body_left = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0);
            if to.write_all(&pending[..head_len]).await.is_err() {
                return;
            }
            pending.drain(..head_len);
        }
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// One operator replica as a process (flags as `support::local_operator`), with its own
/// kubeconfig and environment.
struct Replica {
    child: Child,
    log: PathBuf,
    admin: String,
}

impl Replica {
    fn start(
        kubeconfig: &Path,
        ns: &str,
        installation: &str,
        lease: &str,
        logs: &Path,
        identity: &str,
        http_proxy: Option<SocketAddr>,
    ) -> Replica {
        let port = free_port();
        let log = logs.join(format!("{identity}.log"));
        let file = std::fs::File::create(&log).expect("operator log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_tailnet-operator"));
        command
            .args(["run", "--operator-namespace", ns])
            .args(["--installation-id", installation])
            .args(["--admin-address", &format!("127.0.0.1:{port}")])
            .args([
                "--headscale-poll-interval",
                "2s",
                "--headscale-timeout",
                "3s",
            ])
            .args(["--lease-name", lease, "--identity", identity])
            .args(["--lease-duration", &format!("{LEASE_SECONDS}s")])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,tailnet_operator=debug")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .stdout(Stdio::null())
            .stderr(file);
        if let Some(proxy) = http_proxy {
            // reqwest (the Headscale client) tunnels its HTTPS requests to Headscale's lab
            // address (the Tailnet's spec.server) through the proxy. The kube client honours
            // HTTPS_PROXY too: NO_PROXY keeps its apiserver connections (127.0.0.1) direct.
            command.env("HTTPS_PROXY", format!("http://{proxy}"));
            command.env("NO_PROXY", "127.0.0.1");
        }
        Replica {
            child: command.spawn().expect("start tailnet-operator"),
            log,
            admin: format!("http://127.0.0.1:{port}"),
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    async fn leader_gauge(&self) -> Option<f64> {
        let text = reqwest::get(format!("{}/metrics", self.admin))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.starts_with("tailnet_operator_leader "))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = self.log_text();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            eprintln!("--- {} (last 60 lines) ---", self.log.display());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kubeconfig` with its server URL replaced by `server` (same CA and client certificate).
fn kubeconfig_via(kubeconfig: &Path, server: &str, out: &Path) -> PathBuf {
    let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let mut config: Value = serde_json::from_str(&text).expect("kubeconfig is JSON");
    config["clusters"][0]["cluster"]["server"] = json!(server);
    let path = out.join("via-proxy.kubeconfig");
    std::fs::write(&path, config.to_string()).expect("write kubeconfig");
    path
}

fn socket_addr(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).expect("url with scheme");
    rest.trim_end_matches('/').parse().expect("host:port")
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_a_hung_apiserver_connection_steps_down_before_the_takeover() {
    let kube = tno_testenv_kube::shared()
        .await
        .unwrap_or_else(|e| panic!("kube environment: {e}"));
    let tailnet_env = TailnetEnv::start().await.expect("tailnet environment");
    let ns = kube.namespace("lead").await.expect("namespace");
    let logs = tempfile::tempdir().expect("log dir");
    let result = tokio::time::timeout(
        Duration::from_secs(400),
        scenario(&kube, &tailnet_env, ns.name(), ns.client(), logs.path()),
    )
    .await;
    if !matches!(result, Ok(())) {
        for entry in std::fs::read_dir(logs.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!(
                "==== {} ====\n{}",
                entry.path().display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        panic!("scenario did not finish: {result:?}");
    }
}

async fn scenario(
    kube: &tno_testenv_kube::KubeEnv,
    env: &TailnetEnv,
    ns: &str,
    client: &kube::Client,
    logs: &Path,
) {
    let hs = tailnet_headscale::Client::new(
        &env.headscale.root_url(),
        tailnet_headscale::Secret::new(env.headscale.api_key()),
        tailnet_headscale::ClientOptions {
            server_ca_pem: Some(env.headscale.ca_pem().to_owned()),
            ..Default::default()
        },
    )
    .expect("headscale client");
    let tailnet = tailnet_name(ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    create_bootstrap_secret(env, ns, client).await;
    let set_base = |port: u16| {
        let cms = cms.clone();
        async move {
            apply(
                &cms,
                "tailnet-policy",
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "tailnet-policy", "namespace": ns},
                       "data": {"policy.hujson": base_policy(port)}}),
            )
            .await
            .expect("base policy");
        }
    };
    set_base(7100).await;
    apply_tailnet(env, client, &tailnet).await;

    // The first replica: apiserver through the freezable proxy, Headscale through the
    // counting one.
    let api_proxy = FreezeProxy::start(socket_addr(&kube.api_server_url())).await;
    let hs_proxy = CountingProxy::start(
        socket_addr(&env.headscale.root_url()),
        env.headscale.ca_pem(),
        support::lab_tls::acceptor(
            env.headscale.ca(),
            logs,
            "counting-proxy",
            &[env.lab.gateway().into()],
        ),
    )
    .await;
    let via_proxy = kubeconfig_via(
        kube.kubeconfig(),
        &format!("https://{}", api_proxy.addr),
        logs,
    );
    let installation = format!("test-{ns}");
    let lease = format!("lease-{ns}");
    let mut old = Replica::start(
        &via_proxy,
        ns,
        &installation,
        &lease,
        logs,
        "operator-1",
        Some(hs_proxy.addr),
    );
    wait_for("operator-1 to lead", WAIT, || async {
        match old.leader_gauge().await {
            Some(1.0) => Ok(()),
            other => Err(format!("leader gauge {other:?}")),
        }
    })
    .await;
    let live_has = |marker: &'static str| {
        let hs = hs.clone();
        async move {
            let live = hs.get_policy().await.map_err(|e| e.to_string())?;
            // The lab's own base policy has other ports; only the operator's document
            // carries the installation header.
            if live.policy.contains(marker)
                && live.policy.contains("// tailnet-operator-installation:")
            {
                Ok(live)
            } else {
                Err(format!("live policy without {marker}"))
            }
        }
    };
    wait_for("operator-1 to apply the first policy", WAIT, || {
        live_has("tcp:7100")
    })
    .await;
    assert!(
        hs_proxy.seen().iter().any(|s| s.method == "PUT"),
        "the counting proxy saw operator-1's policy PUT: {:?}",
        hs_proxy.seen()
    );

    let hs_proxy_2 = CountingProxy::start(
        socket_addr(&env.headscale.root_url()),
        env.headscale.ca_pem(),
        support::lab_tls::acceptor(
            env.headscale.ca(),
            logs,
            "proxy-2",
            &[env.lab.gateway().into()],
        ),
    )
    .await;
    let mut new = standby_replica(kube, ns, &installation, &lease, logs, hs_proxy_2.addr).await;

    // Freeze operator-1's apiserver connections, then change the base policy.
    api_proxy.freeze(true);
    let frozen_at = Instant::now();
    set_base(7101).await;

    // The takeover, as the apiserver records it (polled every 50 ms).
    let mut stepped_down: Option<Duration> = None;
    let takeover = wait_for_takeover(&leases, &lease, &mut old, frozen_at, &mut stepped_down).await;
    let takeover_at = frozen_at + takeover;
    wait_for_policy_of_operator_2(client, &tailnet, live_has).await;
    let applied = frozen_at.elapsed();

    // The partition heals: whatever operator-1 still had in flight goes on now (without the
    // fix: its reconcile, blocked on reading the base ConfigMap, compares with the policy it
    // read from Headscale before the freeze and PUTs). Watch for its Headscale requests.
    api_proxy.freeze(false);
    let healed = frozen_at.elapsed();
    let reverted = watch_after_healing(&hs, &mut old, frozen_at, &mut stepped_down).await;
    let seen = hs_proxy.seen();
    let (after_takeover, writes_after, last_request) =
        requests_after_takeover(&seen, takeover_at, frozen_at);
    let old_log = old.log_text();
    println!(
        "leadership: lease {LEASE_SECONDS} s; after the freeze: operator-1 stepped down (process exited) at {}, operator-2 took the Lease at +{}, new policy live at +{}, connection unfrozen at +{}; margin step-down → takeover {}; operator-1's Headscale requests after the takeover: {} ({} writes{}); its last Headscale request {}; old policy live again {} times in {} s of watching",
        stepped_down.map_or("never".to_string(), |d| format!("+{}", secs(d))),
        secs(takeover),
        secs(applied),
        secs(healed),
        stepped_down.map_or("none".to_string(), |d| if d < takeover {
            secs(takeover - d)
        } else {
            format!("-{} (stepped down after the takeover)", secs(d - takeover))
        }),
        after_takeover.len(),
        writes_after.len(),
        if writes_after.is_empty() {
            String::new()
        } else {
            format!(": {}", writes_after.join(", "))
        },
        last_request.unwrap_or_else(|| "none".into()),
        reverted,
        WATCH_AFTER_TAKEOVER.as_secs(),
    );
    new.child.kill().ok();
    check_step_down(
        &after_takeover,
        &writes_after,
        reverted,
        stepped_down,
        takeover,
        &old_log,
    );
}

/// Waits until the live policy carries the changed base (`live_has("tcp:7101")`); while it
/// does not, says what the Tailnet reports (operator-2's view).
async fn wait_for_policy_of_operator_2<F, Fut>(client: &kube::Client, tailnet: &str, live_has: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = Result<tailnet_headscale::Policy, String>>,
{
    let tailnets: Api<Tailnet> = Api::all(client.clone());
    wait_for("operator-2 to apply the changed policy", WAIT, || {
        let (live, tailnets) = (live_has("tcp:7101"), tailnets.clone());
        async move {
            let error = match live.await {
                Ok(_) => return Ok(()),
                Err(error) => error,
            };
            let conditions = tailnets
                .get(tailnet)
                .await
                .ok()
                .and_then(|t| t.status)
                .map(|s| {
                    s.conditions
                        .iter()
                        .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .unwrap_or_default();
            Err(format!("{error}; Tailnet: {conditions}"))
        }
    })
    .await;
}

async fn create_bootstrap_secret(env: &TailnetEnv, ns: &str, client: &kube::Client) {
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("headscale-bootstrap".into()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(
                    "apiKey".to_string(),
                    ByteString(env.headscale.api_key().as_bytes().to_vec()),
                )])),
                ..Default::default()
            },
        )
        .await
        .expect("bootstrap secret");
    // The lab CA of Headscale's certificate (the Tailnet's spec.serverCA).
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some("headscale-ca".into()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(
                    "ca.crt".to_string(),
                    env.headscale.ca_pem().to_owned(),
                )])),
                ..Default::default()
            },
        )
        .await
        .expect("lab CA ConfigMap");
}

async fn apply_tailnet(env: &TailnetEnv, client: &kube::Client, tailnet: &str) {
    apply(
        &Api::<Tailnet>::all(client.clone()),
        tailnet,
        json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "Tailnet",
            "metadata": {"name": tailnet},
            "spec": {
                // The lab address (reachable from the root netns too): unlike 127.0.0.1 it is
                // not in the proxied replica's NO_PROXY.
                "server": env.headscale.lab_url(),
                "serverCA": {"configMapRef": {"name": "headscale-ca", "key": "ca.crt"}},
                "apiSecretRef": {"name": "headscale-bootstrap", "key": "apiKey"},
                "policy": {"baseConfigMap": "tailnet-policy", "mode": "Apply",
                           "tagOwners": ["group:platform"]}
            }
        }),
    )
    .await
    .expect("Tailnet");
}

/// operator-2, straight to the apiserver, standing by.
/// Headscale's lab address (the Tailnet's `spec.server`) is served in the lab netns only, so
/// operator-2 reaches it through a proxy of its own (`headscale_proxy`, not inspected).
async fn standby_replica(
    kube: &tno_testenv_kube::KubeEnv,
    ns: &str,
    installation: &str,
    lease: &str,
    logs: &Path,
    headscale_proxy: SocketAddr,
) -> Replica {
    let new = Replica::start(
        kube.kubeconfig(),
        ns,
        installation,
        lease,
        logs,
        "operator-2",
        Some(headscale_proxy),
    );
    wait_for("operator-2 to stand by", WAIT, || async {
        let standing_by = new
            .log_text()
            .contains("standing by: lease held by another replica");
        match new.leader_gauge().await {
            Some(0.0) if standing_by => Ok(()),
            other => Err(format!("leader gauge {other:?}, standing by {standing_by}")),
        }
    })
    .await;
    new
}

/// When (after the freeze) operator-2 holds the Lease, as the apiserver records it (polled
/// every 50 ms); notes when operator-1 stepped down (exited) meanwhile.
async fn wait_for_takeover(
    leases: &Api<Lease>,
    lease: &str,
    old: &mut Replica,
    frozen_at: Instant,
    stepped_down: &mut Option<Duration>,
) -> Duration {
    loop {
        if stepped_down.is_none() && old.exited() {
            *stepped_down = Some(frozen_at.elapsed());
        }
        let holder = leases
            .get(lease)
            .await
            .ok()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        if holder.as_deref() == Some("operator-2") {
            break frozen_at.elapsed();
        }
        assert!(
            frozen_at.elapsed() < WAIT,
            "operator-2 never took the Lease (holder {holder:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Watches the live policy for [`WATCH_AFTER_TAKEOVER`]: how often the old one is live again;
/// notes when operator-1 stepped down meanwhile.
async fn watch_after_healing(
    hs: &tailnet_headscale::Client,
    old: &mut Replica,
    frozen_at: Instant,
    stepped_down: &mut Option<Duration>,
) -> u32 {
    let mut reverted = 0;
    let watch_until = Instant::now() + WATCH_AFTER_TAKEOVER;
    while Instant::now() < watch_until {
        if stepped_down.is_none() && old.exited() {
            *stepped_down = Some(frozen_at.elapsed());
        }
        if let Ok(live) = hs.get_policy().await
            && live.policy.contains("tcp:7100")
        {
            reverted += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    reverted
}

/// operator-1's Headscale requests at or after the takeover, its writes among them, and when
/// its last request was.
fn requests_after_takeover(
    seen: &[Seen],
    takeover_at: Instant,
    frozen_at: Instant,
) -> (Vec<&Seen>, Vec<String>, Option<String>) {
    let after_takeover: Vec<&Seen> = seen.iter().filter(|s| s.at >= takeover_at).collect();
    let writes_after: Vec<String> = after_takeover
        .iter()
        .filter(|s| s.is_write())
        .map(|s| {
            format!(
                "{} {} at +{}",
                s.method,
                s.target,
                secs(s.at.duration_since(frozen_at))
            )
        })
        .collect();
    let last_request = seen.last().map(|s| {
        if s.at >= frozen_at {
            format!("+{}", secs(s.at.duration_since(frozen_at)))
        } else {
            "before the freeze".to_string()
        }
    });
    (after_takeover, writes_after, last_request)
}

/// operator-1 stepped down before operator-2 took over and touched Headscale no more.
fn check_step_down(
    after_takeover: &[&Seen],
    writes_after: &[String],
    reverted: u32,
    stepped_down: Option<Duration>,
    takeover: Duration,
    old_log: &str,
) {
    let requests_after: Vec<String> = after_takeover
        .iter()
        .map(|s| format!("{} {}", s.method, s.target))
        .collect();
    assert!(
        writes_after.is_empty(),
        "operator-1 wrote to Headscale after operator-2 took over: {writes_after:?}"
    );
    assert_eq!(reverted, 0, "the old policy came back after the takeover");
    assert!(
        requests_after.is_empty(),
        "operator-1 still called Headscale after operator-2 took over: {requests_after:?}"
    );
    let stepped_down = stepped_down.unwrap_or_else(|| {
        panic!(
            "operator-1 did not step down; its log: {}",
            old_log
                .lines()
                .rev()
                .take(15)
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    assert!(
        stepped_down < takeover,
        "operator-1 stepped down at +{} but operator-2 took over at +{}",
        secs(stepped_down),
        secs(takeover)
    );
    assert!(
        old_log.contains("stepping down"),
        "operator-1 says why it stepped down"
    );
}
