//! The real `tailnet-agent` binary as an HTTPS reverse proxy: real TLS clients (reqwest,
//! hyper, tokio-tungstenite), real hyper backends, a generated PKI. Runs in a network
//! namespace of its own (needs root).

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::backend::{self, CHUNK, pattern_chunk, pattern_sha256};
use common::{Agent, Pki, admin_get, eventually, metric, parse_answer, tls_connect};
use futures_util::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

const HTTPS_PORT: u16 = 8443;
const WEB_BACKEND: u16 = 18080;
const TLS_BACKEND: u16 = 18443;
const HUNDRED_MIB: u64 = 100 * 1024 * 1024;

fn https() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, HTTPS_PORT))
}

fn client(pki: &Pki, http1_only: bool) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(pki.ca_pem.as_bytes())
                .unwrap_or_else(|e| panic!("ca: {e}")),
        )
        .no_proxy()
        .timeout(Duration::from_secs(120));
    for name in [
        "portal.test",
        "portal-alias.test",
        "slow.test",
        "admin.test",
        "wrongca.test",
    ] {
        builder = builder.resolve(name, https());
    }
    if http1_only {
        builder = builder.http1_only();
    }
    builder.build().unwrap_or_else(|e| panic!("client: {e}"))
}

fn config(dir: &std::path::Path) -> serde_json::Value {
    let web = json!({"host": "127.0.0.1", "port": WEB_BACKEND});
    let tls_backend = json!({"host": "127.0.0.1", "port": TLS_BACKEND});
    json!({
        "localapiSocket": dir.join("no-tailscaled.sock"),
        "adminPort": common::ADMIN_PORT,
        "ingress": [{
            "mode": "http",
            "port": HTTPS_PORT,
            "routes": [
                {"name": "web", "hostnames": ["portal.test", "portal-alias.test"], "backend": web},
                {"name": "slow", "hostnames": ["slow.test"], "backend": web,
                 "requestTimeoutSeconds": 2, "backendRequestTimeoutSeconds": 1},
                {"name": "admin", "hostnames": ["admin.test"], "backend": tls_backend,
                 "backendTls": {"serverName": "admin.backend.test", "caFile": dir.join("backend-ca.crt")}},
                {"name": "wrongca", "hostnames": ["wrongca.test"], "backend": tls_backend,
                 "backendTls": {"serverName": "admin.backend.test", "caFile": dir.join("other-ca.crt")}},
            ],
        }],
        "tls": {"certFile": dir.join("tls.crt"), "keyFile": dir.join("tls.key")},
    })
}

async fn wait_for_listener() {
    eventually(Duration::from_secs(20), "https listener up", || async {
        let (_, body) = common::raw_http(
            common::admin_address(),
            "GET /status HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await
        .ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        let up = status["listeners"]
            .as_array()?
            .iter()
            .any(|l| l["name"] == "https-8443" && l["up"] == true);
        up.then_some(())
    })
    .await;
}

#[test]
fn https_reverse_proxy_end_to_end() {
    let (run, netns, dir) = Agent::netns("http");
    let frontend = Pki::new("agent test CA");
    let backend_ca = Pki::new("backend CA");
    let other_ca = Pki::new("unrelated CA");
    let (cert, key) = frontend.leaf(&[
        "portal.test",
        "portal-alias.test",
        "slow.test",
        "admin.test",
        "wrongca.test",
    ]);
    std::fs::write(dir.join("tls.crt"), cert).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("tls.key"), key).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("backend-ca.crt"), &backend_ca.ca_pem)
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("other-ca.crt"), &other_ca.ca_pem).unwrap_or_else(|e| panic!("{e}"));
    let backend_tls = backend_ca.server_config(&["admin.backend.test"]);
    let mut agent = Agent::start_in(run, netns, dir.clone(), &config(&dir), &[]);
    let pid = agent.pid();

    agent.run(move || async move {
        backend::spawn(SocketAddr::from((Ipv4Addr::LOCALHOST, WEB_BACKEND)), None).await;
        backend::spawn(
            SocketAddr::from((Ipv4Addr::LOCALHOST, TLS_BACKEND)),
            Some(backend_tls),
        )
        .await;
        wait_for_listener().await;
        let h2 = client(&frontend, false);
        let h1 = client(&frontend, true);
        forwarding_headers(&h1, &h2).await;
        misdirected_host_and_unknown_sni(&frontend).await;
        gzip_and_range_untouched(&h1, &h2).await;
        hundred_mib_each_way(&h1, &h2).await;
        small_request_latency(&h2).await;
        http2_trailers(&frontend).await;
        route_timeouts(&h2).await;
        websocket_upgrade(&frontend).await;
        verified_backend_tls(&h2).await;
        metrics_and_readiness().await;
        sigterm_drains_in_flight(&h1, &h2, &frontend, pid).await;
    });
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
    assert!(status.success(), "{status:?}");
}

async fn forwarding_headers(h1: &reqwest::Client, h2: &reqwest::Client) {
    // Identity and forwarding headers: client copies stripped, ours set; both protocols.
    for (client, version) in [(&h2, "HTTP/1.1"), (&h1, "HTTP/1.1")] {
        let answer = client
            .get("https://portal.test:8443/echo-headers")
            .header("tailscale-user-login", "admin@evil")
            .header("x-forwarded-for", "6.6.6.6")
            .header("forwarded", "for=6.6.6.6")
            .send()
            .await
            .unwrap_or_else(|e| panic!("echo-headers: {e}"));
        assert_eq!(answer.status(), 200);
        let echoed: serde_json::Value =
            serde_json::from_str(&answer.text().await.unwrap_or_default()).unwrap_or_default();
        let headers = &echoed["headers"];
        assert_eq!(echoed["version"], version, "the backend speaks HTTP/1.1");
        assert_eq!(headers["x-forwarded-for"], "127.0.0.1", "{echoed}");
        assert_eq!(headers["x-forwarded-proto"], "https");
        assert_eq!(headers["x-forwarded-host"], "portal.test:8443");
        assert_eq!(headers["host"], "portal.test:8443");
        assert!(headers.get("tailscale-user-login").is_none(), "{echoed}");
        assert!(headers.get("forwarded").is_none(), "{echoed}");
    }
    let negotiated = h2
        .get("https://portal-alias.test:8443/echo-headers")
        .send()
        .await
        .unwrap_or_else(|e| panic!("alias: {e}"));
    assert_eq!(negotiated.version(), reqwest::Version::HTTP_2, "ALPN h2");
    assert_eq!(
        negotiated.status(),
        200,
        "the alias is served with the same certificate"
    );
}

async fn misdirected_host_and_unknown_sni(frontend: &Pki) {
    // A Host that does not belong to the SNI's route: 421. An unknown SNI: no handshake.
    let config = frontend.client_config(&[b"http/1.1"]);
    let mut tls = tls_connect(https(), "portal.test", config.clone())
        .await
        .unwrap_or_else(|e| panic!("tls: {e}"));
    tls.write_all(b"GET /echo-headers HTTP/1.1\r\nHost: admin.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    assert_eq!(
        parse_answer(&answer).0,
        421,
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        tls_connect(https(), "unknown.test", config.clone())
            .await
            .is_err()
    );
}

async fn gzip_and_range_untouched(h1: &reqwest::Client, h2: &reqwest::Client) {
    // gzip body and headers untouched.
    let answer = h2
        .get("https://portal.test:8443/gzip")
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap_or_else(|e| panic!("gzip: {e}"));
    assert_eq!(answer.headers()["content-encoding"], "gzip");
    assert_eq!(answer.headers()["etag"], "\"gz-1\"");
    let expected = backend::gzip_body();
    assert_eq!(
        answer.headers()["content-length"].to_str().ok(),
        Some(expected.len().to_string().as_str())
    );
    assert_eq!(
        answer.bytes().await.unwrap_or_default().as_ref(),
        expected.as_slice()
    );

    // Range.
    let answer = h1
        .get("https://portal.test:8443/blob")
        .header("range", "bytes=1000-1999")
        .send()
        .await
        .unwrap_or_else(|e| panic!("range: {e}"));
    assert_eq!(answer.status(), 206);
    assert_eq!(answer.headers()["content-range"], "bytes 1000-1999/1048576");
    assert_eq!(
        answer.bytes().await.unwrap_or_default().as_ref(),
        &backend::blob()[1000..2000]
    );
}

async fn hundred_mib_each_way(h1: &reqwest::Client, h2: &reqwest::Client) {
    // 100 MiB streamed each way, byte-identical.
    let started = Instant::now();
    let answer = h2
        .get(format!(
            "https://portal.test:8443/download?bytes={HUNDRED_MIB}"
        ))
        .send()
        .await
        .unwrap_or_else(|e| panic!("download: {e}"));
    let mut hasher = Sha256::new();
    let mut received = 0u64;
    let mut stream = answer.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap_or_else(|e| panic!("download chunk: {e}"));
        received += chunk.len() as u64;
        hasher.update(&chunk);
    }
    let download = started.elapsed();
    assert_eq!(received, HUNDRED_MIB);
    assert_eq!(
        format!("{:x}", hasher.finalize()),
        pattern_sha256(HUNDRED_MIB)
    );

    let started = Instant::now();
    let chunks = HUNDRED_MIB / CHUNK as u64;
    let upload = futures_util::stream::iter(0..chunks)
        .map(|index| Ok::<_, std::io::Error>(Bytes::from(pattern_chunk(index, CHUNK))));
    let answer = h1
        .post("https://portal.test:8443/upload")
        .body(reqwest::Body::wrap_stream(upload))
        .send()
        .await
        .unwrap_or_else(|e| panic!("upload: {e}"));
    assert_eq!(answer.status(), 200);
    let text = answer.text().await.unwrap_or_default();
    assert_eq!(
        text,
        format!("{HUNDRED_MIB} {}", pattern_sha256(HUNDRED_MIB))
    );
    let upload = started.elapsed();
    eprintln!(
        "100 MiB through the agent ({} build): download {:.2}s ({:.0} MiB/s), upload {:.2}s ({:.0} MiB/s)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        download.as_secs_f64(),
        100.0 / download.as_secs_f64(),
        upload.as_secs_f64(),
        100.0 / upload.as_secs_f64()
    );
}

async fn small_request_latency(h2: &reqwest::Client) {
    // Small requests: latency through the agent next to the backend directly.
    let direct = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"));
    let through_agent = small_requests(h2, "https://portal.test:8443/whoami").await;
    let straight = small_requests(&direct, &format!("http://127.0.0.1:{WEB_BACKEND}/whoami")).await;
    eprintln!(
        "{SMALL_REQUESTS} sequential small requests ({} build): through the agent (HTTPS, h2) {:.0}/s p50 {:?} p99 {:?}; backend directly (HTTP/1.1) {:.0}/s p50 {:?} p99 {:?}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        through_agent.0,
        through_agent.1,
        through_agent.2,
        straight.0,
        straight.1,
        straight.2
    );
}

async fn http2_trailers(frontend: &Pki) {
    // Trailers over HTTP/2 (the client asks with TE: trailers).
    let tls = tls_connect(https(), "portal.test", frontend.client_config(&[b"h2"]))
        .await
        .unwrap_or_else(|e| panic!("tls h2: {e}"));
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap_or_else(|e| panic!("h2 handshake: {e}"));
    tokio::spawn(connection);
    let request = http::Request::get("https://portal.test:8443/trailers")
        .header("te", "trailers")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap_or_else(|e| panic!("request: {e}"));
    let answer = sender
        .send_request(request)
        .await
        .unwrap_or_else(|e| panic!("trailers: {e}"));
    let collected = answer
        .into_body()
        .collect()
        .await
        .unwrap_or_else(|e| panic!("trailers body: {e}"));
    let trailers = collected.trailers().cloned().unwrap_or_default();
    assert_eq!(collected.to_bytes().as_ref(), b"body before trailers");
    assert_eq!(
        trailers.get("x-checksum").and_then(|v| v.to_str().ok()),
        Some("abc123")
    );
}

async fn route_timeouts(h2: &reqwest::Client) {
    // backendRequest timeout: 504 after ~1 s although the backend answers after 3 s.
    let started = Instant::now();
    let answer = h2
        .get("https://slow.test:8443/slow-head")
        .send()
        .await
        .unwrap_or_else(|e| panic!("slow head: {e}"));
    assert_eq!(answer.status(), 504);
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );

    // request timeout: an upload slower than 2 s is cut off.
    let started = Instant::now();
    let trickle = futures_util::stream::iter(0..40).then(|_| async {
        tokio::time::sleep(Duration::from_millis(250)).await;
        Ok::<_, std::io::Error>(Bytes::from_static(&[b'x'; 1024]))
    });
    let outcome = h2
        .post("https://slow.test:8443/upload")
        .body(reqwest::Body::wrap_stream(trickle))
        .send()
        .await;
    let elapsed = started.elapsed();
    match outcome {
        Ok(answer) => assert_eq!(answer.status(), 408),
        Err(error) => eprintln!("slow upload ended with a client error: {error}"),
    }
    assert!(
        elapsed < Duration::from_secs(5),
        "cut off after {elapsed:?}, not after the 10 s upload"
    );
}

async fn websocket_upgrade(frontend: &Pki) {
    // WebSocket: 1000 messages through the upgrade.
    let tls = tls_connect(
        https(),
        "portal.test",
        frontend.client_config(&[b"http/1.1"]),
    )
    .await
    .unwrap_or_else(|e| panic!("tls ws: {e}"));
    let (mut socket, _) = tokio_tungstenite::client_async("wss://portal.test:8443/ws", tls)
        .await
        .unwrap_or_else(|e| panic!("websocket handshake: {e}"));
    for index in 0..1000 {
        let text = format!("message {index}");
        socket
            .send(Message::text(text.clone()))
            .await
            .unwrap_or_else(|e| panic!("ws send: {e}"));
        let echoed = socket.next().await;
        match echoed {
            Some(Ok(Message::Text(echoed))) => assert_eq!(echoed.as_str(), text),
            other => panic!("ws echo {index}: {other:?}"),
        }
    }
    let _ = socket.close(None).await;
}

async fn verified_backend_tls(h2: &reqwest::Client) {
    // Verified TLS to the backend; a wrong CA is a 502 and counted.
    let answer = h2
        .get("https://admin.test:8443/whoami")
        .send()
        .await
        .unwrap_or_else(|e| panic!("admin: {e}"));
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap_or_default(), "admin-backend");
    let answer = h2
        .get("https://wrongca.test:8443/whoami")
        .send()
        .await
        .unwrap_or_else(|e| panic!("wrongca: {e}"));
    assert_eq!(answer.status(), 502);
    assert!(
        metric(
            "tailnet_agent_backend_tls_failures_total",
            &[("route", "wrongca")]
        )
        .await
            >= 1.0
    );
}

async fn metrics_and_readiness() {
    // Metrics and readiness.
    assert!(
        metric(
            "tailnet_agent_http_requests_total",
            &[("route", "web"), ("host", "portal.test"), ("status", "200")]
        )
        .await
            >= 4.0
    );
    assert!(metric("tailnet_agent_http_requests_total", &[("status", "421")]).await >= 1.0);
    assert!(
        metric(
            "tailnet_agent_bytes_total",
            &[("listener", "https-8443"), ("direction", "out")]
        )
        .await
            >= HUNDRED_MIB as f64
    );
    let (status, body) = admin_get("/readyz").await;
    assert_eq!(status, 503, "no tailscaled here: {body}");
    assert!(body.contains("tailnet not connected"), "{body}");
    let (status, _) = admin_get("/livez").await;
    assert_eq!(status, 200);
}

async fn sigterm_drains_in_flight(
    h1: &reqwest::Client,
    h2: &reqwest::Client,
    frontend: &Pki,
    pid: i32,
) {
    // SIGTERM while requests are in flight (HTTP/2 and HTTP/1.1): they complete, an idle
    // HTTP/1.1 keep-alive connection is closed at once, new connections are refused.
    let slow = |client: &reqwest::Client| {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .get("https://portal.test:8443/slow-head")
                .send()
                .await
        })
    };
    let (in_flight_h2, in_flight_h1) = (slow(h2), slow(h1));
    let mut idle = tls_connect(
        https(),
        "portal.test",
        frontend.client_config(&[b"http/1.1"]),
    )
    .await
    .unwrap_or_else(|e| panic!("idle connection: {e}"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // SAFETY: kill(2) on the agent's own pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(2), idle.read(&mut byte)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "the idle HTTP/1.1 connection stays open after SIGTERM: {closed:?}"
    );
    // Closed by the drain, not by the process ending: the slow answers (3 s) are still due.
    assert!(
        !in_flight_h1.is_finished() && !in_flight_h2.is_finished(),
        "the in-flight requests ended before the idle connection was closed"
    );
    eventually(
        Duration::from_secs(5),
        "listener closed after SIGTERM",
        || async {
            tokio::net::TcpStream::connect(https())
                .await
                .err()
                .map(|_| ())
        },
    )
    .await;
    for (protocol, in_flight) in [("HTTP/2", in_flight_h2), ("HTTP/1.1", in_flight_h1)] {
        let answer = in_flight
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{protocol} request cut by the shutdown: {e}"));
        assert_eq!(answer.status(), 200, "{protocol}");
        assert_eq!(
            answer.text().await.unwrap_or_default(),
            "finally",
            "{protocol}"
        );
    }
}

/// No certificate ⇒ the port is not even open (no plaintext, no HTTP answer); a certificate
/// written later is picked up without a restart; renewal swaps it; removal stops serving.
#[test]
fn certificate_missing_reloaded_and_removed() {
    let (run, netns, dir) = Agent::netns("cert");
    let pki = Pki::new("reload CA");
    let config = json!({
        "localapiSocket": dir.join("no-tailscaled.sock"),
        "adminPort": common::ADMIN_PORT,
        "ingress": [{"mode": "http", "port": HTTPS_PORT, "routes": [
            {"name": "web", "hostnames": ["portal.test"], "backend": {"host": "127.0.0.1", "port": WEB_BACKEND}}
        ]}],
        "tls": {"certFile": dir.join("tls/tls.crt"), "keyFile": dir.join("tls/tls.key")},
    });
    let agent = Agent::start_in(run, netns, dir.clone(), &config, &[]);
    let tls_dir = dir.join("tls");
    let config_path = agent.config_path.clone();
    let mut renamed = config.clone();
    renamed["ingress"][0]["routes"][0]["hostnames"] = json!(["other.test"]);
    agent.run(move || async move {
        backend::spawn(SocketAddr::from((Ipv4Addr::LOCALHOST, WEB_BACKEND)), None).await;
        eventually(Duration::from_secs(20), "admin up", || async {
            common::raw_http(
                common::admin_address(),
                "GET /livez HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            )
            .await
            .ok()
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let refused = tokio::net::TcpStream::connect(https()).await;
        assert!(refused.is_err(), "nothing may listen without a certificate");
        let (status, body) = admin_get("/readyz").await;
        assert_eq!(status, 503);
        assert!(body.contains("no valid certificate"), "{body}");
        let (_, status_json) = admin_get("/status").await;
        let report: serde_json::Value = serde_json::from_str(&status_json).unwrap_or_default();
        assert_eq!(report["certificate"]["loaded"], false, "{report}");

        // Issued: served without restarting.
        std::fs::create_dir_all(&tls_dir).unwrap_or_else(|e| panic!("{e}"));
        let (cert, key) = pki.leaf(&["portal.test"]);
        std::fs::write(tls_dir.join("tls.crt"), cert).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(tls_dir.join("tls.key"), key).unwrap_or_else(|e| panic!("{e}"));
        wait_for_listener().await;
        let config = pki.client_config(&[b"http/1.1"]);
        let first = presented_certificate(config.clone()).await;

        // Renewed in place: new handshakes get the new certificate.
        let (cert, key) = pki.leaf(&["portal.test"]);
        std::fs::write(tls_dir.join("tls.crt"), cert).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(tls_dir.join("tls.key"), key).unwrap_or_else(|e| panic!("{e}"));
        eventually(
            Duration::from_secs(10),
            "renewed certificate served",
            || {
                let (config, first) = (config.clone(), first.clone());
                async move { (presented_certificate(config).await != first).then_some(()) }
            },
        )
        .await;
        let (status, body) = common::raw_http(
            common::admin_address(),
            "GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status, 200);
        assert!(common::metric_in(&body, "tailnet_agent_certificate_reloads_total", &[]) >= 2.0);

        // A pair that does not match (a new certificate with another key, as a read between
        // two file swaps would see) is rejected and counted; the renewed one keeps serving.
        // Before: the certificate was unloaded and the listener closed.
        let renewed = presented_certificate(config.clone()).await;
        let failures = || async {
            let (_, body) = admin_get("/metrics").await;
            common::metric_in(
                &body,
                "tailnet_agent_certificate_reload_failures_total",
                &[],
            )
        };
        // (The renewal above wrote the two files one after the other: a poll between them may
        // have rejected a torn pair already.)
        let before = failures().await;
        let (cert, _) = pki.leaf(&["portal.test"]);
        let temporary = tls_dir.join("tls.crt.new");
        std::fs::write(&temporary, cert).unwrap_or_else(|e| panic!("{e}"));
        std::fs::rename(&temporary, tls_dir.join("tls.crt")).unwrap_or_else(|e| panic!("{e}"));
        eventually(
            Duration::from_secs(10),
            "mismatched pair rejected",
            || async { (failures().await == before + 1.0).then_some(()) },
        )
        .await;
        assert_eq!(presented_certificate(config.clone()).await, renewed);
        let (_, status_json) = admin_get("/status").await;
        let report: serde_json::Value = serde_json::from_str(&status_json).unwrap_or_default();
        assert_eq!(report["certificate"]["loaded"], true, "{report}");
        assert!(
            report["certificate"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("serving the previous one")),
            "{report}"
        );
        let (cert, key) = pki.leaf(&["portal.test"]);
        std::fs::write(tls_dir.join("tls.crt"), cert).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(tls_dir.join("tls.key"), key).unwrap_or_else(|e| panic!("{e}"));
        eventually(Duration::from_secs(10), "matching pair served", || {
            let (config, renewed) = (config.clone(), renewed.clone());
            async move { (presented_certificate(config).await != renewed).then_some(()) }
        })
        .await;

        // Routes change with the config, in the running listener: portal.test is gone.
        let temporary = config_path.with_extension("new");
        common::write_json(&temporary, &renamed);
        std::fs::rename(&temporary, &config_path).unwrap_or_else(|e| panic!("{e}"));
        eventually(Duration::from_secs(10), "route change applied", || {
            let config = config.clone();
            async move {
                tls_connect(https(), "portal.test", config)
                    .await
                    .err()
                    .map(|_| ())
            }
        })
        .await;

        // Removed: the listener closes again.
        std::fs::remove_file(tls_dir.join("tls.key")).unwrap_or_else(|e| panic!("{e}"));
        eventually(Duration::from_secs(10), "listener closed", || async {
            tokio::net::TcpStream::connect(https())
                .await
                .err()
                .map(|_| ())
        })
        .await;
    });
}

async fn presented_certificate(config: std::sync::Arc<rustls::ClientConfig>) -> Vec<u8> {
    let tls = tls_connect(https(), "portal.test", config)
        .await
        .unwrap_or_else(|e| panic!("tls: {e}"));
    let (_, session) = tls.get_ref();
    session
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|cert| cert.as_ref().to_vec())
        .unwrap_or_default()
}

const SMALL_REQUESTS: usize = 300;

/// (requests per second, p50, p99) of sequential GETs.
async fn small_requests(client: &reqwest::Client, url: &str) -> (f64, Duration, Duration) {
    let mut latencies = Vec::with_capacity(SMALL_REQUESTS);
    let started = Instant::now();
    for _ in 0..SMALL_REQUESTS {
        let begun = Instant::now();
        let answer = client
            .get(url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(answer.status(), 200);
        let _ = answer.bytes().await;
        latencies.push(begun.elapsed());
    }
    let rate = SMALL_REQUESTS as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    let at = |fraction: f64| {
        latencies[((latencies.len() as f64 * fraction) as usize).min(latencies.len() - 1)]
    };
    (rate, at(0.50), at(0.99))
}
