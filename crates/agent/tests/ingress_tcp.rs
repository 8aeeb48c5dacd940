//! The real `tailnet-agent` binary as a TCP forwarder: half-close, config changes without
//! dropping connections, graceful drain on SIGTERM, refusal of a loopback pod IP.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::{Agent, admin_get, eventually, metric};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BACKEND: u16 = 16443;
const FIRST: u16 = 6443;
const SECOND: u16 = 7443;

fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn tcp_config(dir: &std::path::Path, listeners: &[(&str, u16)]) -> serde_json::Value {
    let ingress: Vec<serde_json::Value> = listeners
        .iter()
        .map(|(name, port)| {
            json!({"mode": "tcp", "name": name, "port": port,
                   "backend": {"host": "127.0.0.1", "port": BACKEND}})
        })
        .collect();
    json!({
        "localapiSocket": dir.join("no-tailscaled.sock"),
        "adminPort": common::ADMIN_PORT,
        "ingress": ingress,
    })
}

/// Reads everything until the client's EOF, then answers with the reversed bytes and closes:
/// only works if the half-close reaches the backend and the answer still comes back.
async fn spawn_reverse_after_eof_backend() {
    let listener = TcpListener::bind(local(BACKEND))
        .await
        .unwrap_or_else(|e| panic!("backend bind: {e}"));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                if stream.read_to_end(&mut request).await.is_err() {
                    return;
                }
                request.reverse();
                let _ = stream.write_all(&request).await;
            });
        }
    });
}

async fn reverse_through(port: u16, payload: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(local(port))
        .await
        .unwrap_or_else(|e| panic!("connect {port}: {e}"));
    stream
        .write_all(payload)
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    stream
        .shutdown()
        .await
        .unwrap_or_else(|e| panic!("half-close: {e}"));
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .unwrap_or_else(|e| panic!("read: {e}"));
    answer
}

async fn listener_up(name: &'static str) {
    eventually(Duration::from_secs(20), name, || async move {
        let (_, body) = common::raw_http(
            common::admin_address(),
            "GET /status HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await
        .ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        status["listeners"]
            .as_array()?
            .iter()
            .any(|l| l["name"] == name && l["up"] == true)
            .then_some(())
    })
    .await;
}

#[test]
fn tcp_forward_half_close_config_reload_and_graceful_drain() {
    let (run, netns, dir) = Agent::netns("tcp");
    let config = tcp_config(&dir, &[("k8s-api", FIRST)]);
    let mut agent = Agent::start_in(
        run,
        netns,
        dir.clone(),
        &config,
        &["--drain-timeout-seconds", "20"],
    );
    let pid = agent.pid();
    let config_path_dir = dir.clone();
    let (reload_tx, reload_rx) = std::sync::mpsc::channel::<()>();
    let (reloaded_tx, reloaded_rx) = std::sync::mpsc::channel::<()>();
    let config_writer = std::thread::spawn(move || {
        // The test body signals when to rewrite the config (the file lives outside the netns
        // thread, but writing it from there would work too; this keeps the agent handle here).
        if reload_rx.recv().is_ok() {
            let temporary = config_path_dir.join("config.json.new");
            common::write_json(
                &temporary,
                &tcp_config(&config_path_dir, &[("k8s-api", FIRST), ("talos", SECOND)]),
            );
            let _ = std::fs::rename(&temporary, config_path_dir.join("config.json"));
            let _ = reloaded_tx.send(());
        }
    });

    agent.run(move || async move {
        spawn_reverse_after_eof_backend().await;
        listener_up("k8s-api").await;

        // Raw bytes, both directions, with the client's half-close reaching the backend.
        assert_eq!(reverse_through(FIRST, b"abcdef").await, b"fedcba");
        let big: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let mut expected = big.clone();
        expected.reverse();
        assert_eq!(reverse_through(FIRST, &big).await, expected);

        // A connection established before a config change survives it.
        let mut long_lived = TcpStream::connect(local(FIRST))
            .await
            .unwrap_or_else(|e| panic!("connect: {e}"));
        long_lived
            .write_all(b"before")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        reload_tx.send(()).unwrap_or_else(|e| panic!("{e}"));
        reloaded_rx.recv().unwrap_or_else(|e| panic!("{e}"));
        listener_up("talos").await;
        assert_eq!(reverse_through(SECOND, b"xyz").await, b"zyx");
        long_lived
            .write_all(b"+after")
            .await
            .unwrap_or_else(|e| panic!("{e}"));

        // SIGTERM: new connections are refused, the open one finishes.
        // SAFETY: kill(2) on the agent's own pid.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        eventually(
            Duration::from_secs(10),
            "listeners closed after SIGTERM",
            || async { TcpStream::connect(local(FIRST)).await.err().map(|_| ()) },
        )
        .await;
        long_lived
            .shutdown()
            .await
            .unwrap_or_else(|e| panic!("half-close: {e}"));
        let mut answer = Vec::new();
        long_lived
            .read_to_end(&mut answer)
            .await
            .unwrap_or_else(|e| panic!("read: {e}"));
        assert_eq!(
            answer, b"retfa+erofeb",
            "the open connection was drained, not cut"
        );
    });
    let _ = config_writer.join();

    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = agent.exit_status() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "agent did not exit after draining"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "graceful shutdown exits 0: {status:?}\n{}",
        agent.log()
    );
    assert!(
        agent.log().contains("all connections finished"),
        "{}",
        agent.log()
    );
}

#[test]
fn loopback_pod_ip_is_refused() {
    let (run, netns, dir) = Agent::netns("loopback");
    let config = tcp_config(&dir, &[]);
    let mut agent = Agent {
        config_path: dir.join("config.json"),
        dir,
        process: None,
        netns,
        run,
    };
    common::write_json(&agent.config_path, &config);
    agent.spawn_with_pod_ip("127.0.0.1", &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = agent.exit_status() {
            break status;
        }
        assert!(Instant::now() < deadline, "agent must refuse to start");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    assert!(
        agent
            .log()
            .contains("loopback is reachable from the tailnet"),
        "{}",
        agent.log()
    );
}

#[test]
fn backend_down_is_counted_and_probed() {
    let (run, netns, dir) = Agent::netns("tcpdown");
    let config = tcp_config(&dir, &[("nothing-there", FIRST)]);
    let agent = Agent::start_in(
        run,
        netns,
        dir,
        &config,
        &["--backend-probe-interval-seconds", "1"],
    );
    agent.run(|| async {
        listener_up("nothing-there").await;
        let mut stream = TcpStream::connect(local(FIRST))
            .await
            .unwrap_or_else(|e| panic!("connect: {e}"));
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer).await;
        assert!(answer.is_empty(), "{read:?}");
        assert!(
            metric(
                "tailnet_agent_backend_failures_total",
                &[("route", "nothing-there"), ("reason", "connect")]
            )
            .await
                >= 1.0
        );
        let backend = eventually(Duration::from_secs(10), "backend probed", || async {
            let (_, body) = admin_get("/status").await;
            let status: serde_json::Value = serde_json::from_str(&body).ok()?;
            let backend = status["backends"].as_array()?.first()?.clone();
            (backend["state"] != "Unknown").then_some(backend)
        })
        .await;
        assert_eq!(backend["state"], "Refused", "{backend}");
        assert_eq!(backend["address"], format!("127.0.0.1:{BACKEND}"));
    });
}
