//! The real `tailnet-agent` binary under more concurrent connections than it may serve: the
//! per-listener and per-agent limits (`limits` in its config) hold, a connection beyond them
//! is reset at once (no hang), counted in `tailnet_agent_connections_refused_total` and in
//! `/status`, the agent's memory stays bounded, and it keeps serving afterwards. Runs in a
//! network namespace of its own (needs root).
//!
//! Every check prints a `| input | expected | observed |` row (docs/reliability.md).

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::{Agent, admin_get, eventually, metric};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BACKEND: u16 = 17443;
const LISTENER: &str = "hold";
const PORT: u16 = 6543;
/// Per connection, through the agent and back: more than a relay buffer, so both of its
/// buffers are really touched (resident), as under real traffic.
const PAYLOAD: usize = 96 * 1024;
/// A served connection echoes within this; a refused one ends well before it.
const ECHO_BOUND: Duration = Duration::from_secs(10);

fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn row(input: &str, expected: &str, observed: &str) {
    println!("| {input} | {expected} | {observed} |");
}

fn config(dir: &std::path::Path, limits: Option<serde_json::Value>) -> serde_json::Value {
    let mut config = json!({
        "localapiSocket": dir.join("no-tailscaled.sock"),
        "adminPort": common::ADMIN_PORT,
        "ingress": [
            {"mode": "tcp", "name": LISTENER, "port": PORT,
             "backend": {"host": "127.0.0.1", "port": BACKEND}},
        ],
    });
    if let Some(limits) = limits {
        config["limits"] = limits;
    }
    config
}

/// Echoes everything and keeps every connection open until the client closes it.
async fn spawn_echo_backend() {
    let listener = TcpListener::bind(local(BACKEND))
        .await
        .unwrap_or_else(|e| panic!("backend bind: {e}"));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
}

async fn listener_up() {
    eventually(Duration::from_secs(20), "listener up", || async {
        let request = "GET /status HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n";
        let (_, body) = common::raw_http(common::admin_address(), request)
            .await
            .ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        let up = status["listeners"]
            .as_array()?
            .iter()
            .any(|l| l["name"] == LISTENER && l["up"] == true);
        up.then_some(())
    })
    .await;
}

fn listener_status(body: &str) -> serde_json::Value {
    let status: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("/status: {e}: {body}"));
    status["listeners"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == LISTENER).cloned())
        .unwrap_or_else(|| panic!("no listener {LISTENER} in {body}"))
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS for pid {pid} (agent gone?)"))
}

enum Outcome {
    /// The payload came back; the connection stays open (held by the caller).
    Served(TcpStream),
    /// Reset or closed before the echo, after this long.
    Refused(Duration),
}

/// One connection: send [`PAYLOAD`], wait for its echo.
async fn attempt() -> Outcome {
    let started = Instant::now();
    let mut stream = match TcpStream::connect(local(PORT)).await {
        Ok(stream) => stream,
        Err(_) => return Outcome::Refused(started.elapsed()),
    };
    let payload = vec![0x5a_u8; PAYLOAD];
    let exchange = async {
        let (mut read, mut write) = stream.split();
        let send = async {
            write.write_all(&payload).await?;
            std::io::Result::Ok(())
        };
        let receive = async {
            let mut echoed = vec![0u8; PAYLOAD];
            read.read_exact(&mut echoed).await?;
            std::io::Result::Ok(echoed)
        };
        let (sent, received) = tokio::join!(send, receive);
        sent.and(received)
    };
    match tokio::time::timeout(ECHO_BOUND, exchange).await {
        Ok(Ok(echoed)) if echoed == payload => Outcome::Served(stream),
        Ok(_) => Outcome::Refused(started.elapsed()),
        Err(_) => panic!("a connection neither echoed nor ended within {ECHO_BOUND:?} (hang)"),
    }
}

/// Opens `count` connections one after the other and holds the served ones open.
async fn open_many(count: usize) -> (Vec<TcpStream>, Vec<Duration>) {
    let (mut held, mut refused) = (Vec::new(), Vec::new());
    for _ in 0..count {
        match attempt().await {
            Outcome::Served(stream) => held.push(stream),
            Outcome::Refused(after) => refused.push(after),
        }
    }
    (held, refused)
}

fn slowest(durations: &[Duration]) -> Duration {
    durations.iter().copied().max().unwrap_or_default()
}

#[test]
fn connections_beyond_the_listener_limit_are_reset_at_once() {
    const LIMIT: usize = 200;
    const EXTRA: usize = 100;
    let (run, netns, dir) = Agent::netns("agent-limit");
    let config = config(
        &dir,
        Some(json!({"maxConnections": 1024, "maxConnectionsPerListener": LIMIT})),
    );
    let agent = Agent::start_in(run, netns, dir, &config, &[]);
    let pid = agent.pid();
    agent.run(move || async move {
        spawn_echo_backend().await;
        listener_up().await;
        let before = rss_kib(pid);
        let (held, refused) = open_many(LIMIT + EXTRA).await;
        let peak = rss_kib(pid);
        row(
            &format!("{} connections, limit {LIMIT}", LIMIT + EXTRA),
            &format!("{LIMIT} served, {EXTRA} reset at once"),
            &format!(
                "{} served, {} refused (slowest refusal {:?}); VmRSS {before} KiB before, {peak} KiB at peak",
                held.len(),
                refused.len(),
                slowest(&refused)
            ),
        );
        assert_eq!(held.len(), LIMIT, "served");
        assert_eq!(refused.len(), EXTRA, "refused");
        assert!(
            slowest(&refused) < Duration::from_secs(1),
            "refusals took up to {:?}",
            slowest(&refused)
        );
        let counted = metric(
            "tailnet_agent_connections_refused_total",
            &[("listener", LISTENER), ("reason", "limit")],
        )
        .await;
        assert_eq!(counted as usize, EXTRA, "refused metric");
        let (_, body) = admin_get("/status").await;
        let view = listener_status(&body);
        row(
            "/status while at the limit",
            "maxConnections, activeConnections, refusedConnections",
            &view.to_string(),
        );
        assert_eq!(view["maxConnections"], LIMIT, "{view}");
        assert_eq!(view["activeConnections"], LIMIT, "{view}");
        assert_eq!(view["refusedConnections"], EXTRA, "{view}");

        // Closing the held connections frees their slots: the agent serves again.
        drop(held);
        let served_again = eventually(Duration::from_secs(10), "slots freed", || async {
            let (_, body) = admin_get("/status").await;
            (listener_status(&body)["activeConnections"] == 0).then_some(())
        })
        .await;
        let () = served_again;
        let (held, refused) = open_many(LIMIT).await;
        row(
            "after the clients closed",
            &format!("{LIMIT} served again"),
            &format!("{} served, {} refused", held.len(), refused.len()),
        );
        assert_eq!((held.len(), refused.len()), (LIMIT, 0));
    });
}

#[test]
fn default_limits_bound_memory_under_a_connection_flood() {
    // Two thousand connections from one client, as in the OOM report (egress agent, 256 Mi):
    // with the defaults, one listener serves at most 512 and the agent's memory stays flat.
    const FLOOD: usize = 2000;
    let (run, netns, dir) = Agent::netns("agent-flood");
    let config = config(&dir, None);
    let agent = Agent::start_in(run, netns, dir, &config, &[]);
    let pid = agent.pid();
    agent.run(move || async move {
        spawn_echo_backend().await;
        listener_up().await;
        let before = rss_kib(pid);
        let (held, refused) = open_many(FLOOD).await;
        let peak = rss_kib(pid);
        row(
            &format!("{FLOOD} connections with {PAYLOAD} bytes each, default limits"),
            "512 served, the rest reset at once, VmRSS bounded",
            &format!(
                "{} served, {} refused (slowest refusal {:?}); VmRSS {before} KiB before, {peak} KiB at peak",
                held.len(),
                refused.len(),
                slowest(&refused)
            ),
        );
        assert_eq!(held.len(), 512, "served");
        assert_eq!(refused.len(), FLOOD - 512, "refused");
        assert!(slowest(&refused) < Duration::from_secs(1));
        // 512 × (2 × 32 KiB buffers + sockets, task) is far below the container's 256 Mi.
        assert!(
            peak < 96 * 1024,
            "VmRSS {peak} KiB at peak (before: {before} KiB)"
        );
        drop(held);
        eventually(Duration::from_secs(10), "serves after the flood", || async {
            match attempt().await {
                Outcome::Served(_) => Some(()),
                Outcome::Refused(_) => None,
            }
        })
        .await;
    });
}

#[test]
fn the_agent_limit_holds_across_listeners() {
    // Two listeners of 100 each under an agent limit of 150: the second listener gets only
    // what the first left, and its refusals say `agent_limit`.
    const SECOND: u16 = 6544;
    let (run, netns, dir) = Agent::netns("agent-total");
    let mut config = config(
        &dir,
        Some(json!({"maxConnections": 150, "maxConnectionsPerListener": 100})),
    );
    config["ingress"]
        .as_array_mut()
        .unwrap_or_else(|| panic!("ingress"))
        .push(json!({"mode": "tcp", "name": "second", "port": SECOND,
                     "backend": {"host": "127.0.0.1", "port": BACKEND}}));
    let agent = Agent::start_in(run, netns, dir, &config, &[]);
    agent.run(move || async move {
        spawn_echo_backend().await;
        listener_up().await;
        let (first_held, first_refused) = open_many(100).await;
        let mut second_held = Vec::new();
        let mut second_refused = 0;
        for _ in 0..100 {
            // The reset can beat the client's own view of the handshake on loopback.
            let mut stream = match TcpStream::connect(local(SECOND)).await {
                Ok(stream) => stream,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    second_refused += 1;
                    continue;
                }
                Err(e) => panic!("connect: {e}"),
            };
            let mut byte = [0u8; 1];
            let _ = stream.write_all(b"x").await;
            match tokio::time::timeout(ECHO_BOUND, stream.read(&mut byte)).await {
                Ok(Ok(1)) => second_held.push(stream),
                Ok(_) => second_refused += 1,
                Err(_) => panic!("hang on the second listener"),
            }
        }
        let by_agent = metric(
            "tailnet_agent_connections_refused_total",
            &[("listener", "second"), ("reason", "agent_limit")],
        )
        .await;
        row(
            "100 + 100 connections on two listeners, 100 each, 150 per agent",
            "100 + 50 served, 50 reset as agent_limit",
            &format!(
                "{} + {} served, {} + {second_refused} refused; agent_limit counted {by_agent}",
                first_held.len(),
                second_held.len(),
                first_refused.len()
            ),
        );
        assert_eq!((first_held.len(), first_refused.len()), (100, 0));
        assert_eq!((second_held.len(), second_refused), (50, 50));
        assert_eq!(by_agent as usize, 50);
    });
}
