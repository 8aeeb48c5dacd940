//! The real `tailnet-agent` binary serving one `https` port whose routes bring their own
//! certificates (a Gateway's HTTPS listeners, each with its `certificateRefs`): a rustls
//! client sees the certificate of the route its SNI selects — exact name, wildcard, or the
//! agent-level one for a route without its own — and reaches that route's backend; an unknown
//! name is refused; a route's rotated certificate is served at the next handshake; a route
//! whose certificate is gone fails its handshakes instead of getting another's. Runs in a
//! network namespace of its own (needs root).

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Agent, Pki, admin_get, eventually, parse_answer, tls_connect};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const HTTPS_PORT: u16 = 9443;
const FOO_BACKEND: u16 = 18091;
const WILD_BACKEND: u16 = 18092;
const PLAIN_BACKEND: u16 = 18093;
const ANY_BACKEND: u16 = 18094;

fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn files(dir: &Path, name: &str) -> serde_json::Value {
    json!({"certFile": dir.join(format!("{name}.crt")), "keyFile": dir.join(format!("{name}.key"))})
}

fn route(name: &str, hostnames: &[&str], port: u16) -> serde_json::Value {
    json!({"name": name, "hostnames": hostnames, "backend": {"host": "127.0.0.1", "port": port}})
}

/// foo.example.test with certificate `a`, *.example.test with `b`, plain.test without one of
/// its own (the agent-level `c`).
fn config(dir: &Path) -> serde_json::Value {
    let mut exact = route("foo", &["foo.example.test"], FOO_BACKEND);
    exact["tls"] = files(dir, "a");
    let mut wild = route("wild", &["*.example.test"], WILD_BACKEND);
    wild["tls"] = files(dir, "b");
    json!({
        "localapiSocket": dir.join("no-tailscaled.sock"),
        "adminPort": common::ADMIN_PORT,
        "ingress": [{"mode": "http", "port": HTTPS_PORT, "routes": [
            exact, wild, route("plain", &["plain.test"], PLAIN_BACKEND),
        ]}],
        "tls": files(dir, "c"),
    })
}

/// Writes a fresh leaf for `names` as `<file>.crt`/`.key` and returns its DER.
fn issue(pki: &Pki, dir: &Path, file: &str, names: &[&str]) -> Vec<u8> {
    let (cert, key) = pki.leaf(names);
    std::fs::write(dir.join(format!("{file}.crt")), &cert).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join(format!("{file}.key")), key).unwrap_or_else(|e| panic!("{e}"));
    CertificateDer::pem_slice_iter(cert.as_bytes())
        .next()
        .and_then(Result::ok)
        .map(|der| der.as_ref().to_vec())
        .unwrap_or_else(|| panic!("no certificate in the leaf PEM"))
}

/// Answers every request with its own name (HTTP/1.1, one request per connection).
async fn spawn_named_backend(port: u16, name: &'static str) {
    let listener = TcpListener::bind(local(port))
        .await
        .unwrap_or_else(|e| panic!("bind {port}: {e}"));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => head.extend_from_slice(&buffer[..read]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                    name.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
}

/// A client trusting `pki`'s CA, sending SNI or not (it still verifies the name it is given).
/// Without resumption: a resumed session carries the certificate of the one it resumes, and
/// every handshake here is to show what the agent presents now.
fn client_config(pki: &Pki, sni: bool) -> Arc<rustls::ClientConfig> {
    let mut config = (*pki.client_config(&[b"http/1.1"])).clone();
    config.enable_sni = sni;
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// What a TLS connection to the port saw: the leaf certificate, and the answer (status, body)
/// to `GET /` with `host`.
async fn exchange(
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
    host: &str,
) -> std::io::Result<(Vec<u8>, u16, String)> {
    let mut tls = tls_connect(local(HTTPS_PORT), server_name, config).await?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|cert| cert.as_ref().to_vec())
        .unwrap_or_default();
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    // A close without close_notify after the answer is not a failure here.
    let _ = tls.read_to_end(&mut answer).await;
    let (status, body) = parse_answer(&answer);
    Ok((leaf, status, body))
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
            .any(|l| l["name"] == format!("https-{HTTPS_PORT}") && l["up"] == true);
        up.then_some(())
    })
    .await;
}

#[test]
fn each_route_serves_its_own_certificate_by_sni() {
    let (run, netns, dir) = Agent::netns("route-certs");
    let pki = Pki::new("gateway listeners CA");
    let cert_a = issue(&pki, &dir, "a", &["foo.example.test"]);
    let cert_b = issue(&pki, &dir, "b", &["*.example.test"]);
    let cert_c = issue(&pki, &dir, "c", &["plain.test"]);
    let config = config(&dir);
    let agent = Agent::start_in(run, netns, dir.clone(), &config, &[]);
    let config_path = agent.config_path.clone();

    agent.run(move || async move {
        spawn_named_backend(FOO_BACKEND, "foo").await;
        spawn_named_backend(WILD_BACKEND, "wild").await;
        spawn_named_backend(PLAIN_BACKEND, "plain").await;
        spawn_named_backend(ANY_BACKEND, "any").await;
        wait_for_listener().await;
        let with_sni = client_config(&pki, true);
        let seen = |name: &'static str, host: &'static str| {
            let config = with_sni.clone();
            async move {
                exchange(config, name, host)
                    .await
                    .unwrap_or_else(|e| panic!("{name} (Host {host}): {e}"))
            }
        };

        // SNI picks the route, the route its certificate (the client verifies the name).
        let (leaf, status, body) = seen("foo.example.test", "foo.example.test").await;
        assert!(leaf == cert_a, "foo.example.test gets certificate A");
        assert_eq!((status, body.as_str()), (200, "foo"));
        let (leaf, status, body) = seen("bar.example.test", "bar.example.test").await;
        assert!(
            leaf == cert_b,
            "bar.example.test gets the wildcard's certificate B"
        );
        assert_eq!((status, body.as_str()), (200, "wild"));
        let (leaf, status, body) = seen("plain.test", "plain.test").await;
        assert!(
            leaf == cert_c,
            "a route without its own gets the agent-level C"
        );
        assert_eq!((status, body.as_str()), (200, "plain"));
        // Misdirected as before: another route's Host on foo's session; an unknown SNI.
        let (_, status, _) = seen("foo.example.test", "bar.example.test").await;
        assert_eq!(status, 421);
        assert!(
            tls_connect(local(HTTPS_PORT), "unknown.test", with_sni.clone())
                .await
                .is_err(),
            "an SNI no route serves fails the handshake"
        );
        // No SNI and no `*` route: the agent-level certificate.
        let (leaf, status, body) = exchange(client_config(&pki, false), "plain.test", "plain.test")
            .await
            .unwrap_or_else(|e| panic!("without SNI: {e}"));
        assert!(leaf == cert_c, "no SNI gets the agent-level certificate");
        assert_eq!((status, body.as_str()), (200, "plain"));

        // Rotation of a route's own certificate: the next handshake sees the new one; the
        // other routes keep theirs.
        let rotated_a = issue(&pki, &dir, "a", &["foo.example.test"]);
        eventually(
            Duration::from_secs(10),
            "rotated certificate A served",
            || {
                let seen = seen("foo.example.test", "foo.example.test");
                let rotated_a = rotated_a.clone();
                async move { (seen.await.0 == rotated_a).then_some(()) }
            },
        )
        .await;
        assert!(seen("bar.example.test", "bar.example.test").await.0 == cert_b);
        assert!(seen("plain.test", "plain.test").await.0 == cert_c);

        // A route whose certificate is gone fails its handshakes (no other certificate
        // stands in); the rest of the port serves on.
        std::fs::remove_file(dir.join("b.key")).unwrap_or_else(|e| panic!("{e}"));
        eventually(
            Duration::from_secs(10),
            "route B without certificate",
            || {
                let config = with_sni.clone();
                async move {
                    tls_connect(local(HTTPS_PORT), "bar.example.test", config)
                        .await
                        .err()
                        .map(|_| ())
                }
            },
        )
        .await;
        assert_eq!(seen("foo.example.test", "foo.example.test").await.2, "foo");
        let (_, body) = admin_get("/status").await;
        let report: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(report["certificate"]["loaded"], false, "{report}");
        assert!(
            report["certificate"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("b.crt") && m.contains("no valid certificate")),
            "{report}"
        );
        let cert_b = issue(&pki, &dir, "b", &["*.example.test"]);
        eventually(Duration::from_secs(10), "certificate B back", || {
            let (config, cert_b) = (with_sni.clone(), cert_b.clone());
            async move {
                let seen = exchange(config, "bar.example.test", "bar.example.test").await;
                (seen.ok()?.0 == cert_b).then_some(())
            }
        })
        .await;

        // A `*` route with its own certificate (a config change): it answers handshakes
        // without SNI, and names no other route serves.
        let cert_d = issue(&pki, &dir, "d", &["d.any.test", "unknown.test"]);
        let mut with_any = config.clone();
        let mut any = route("any", &["*"], ANY_BACKEND);
        any["tls"] = files(&dir, "d");
        with_any["ingress"][0]["routes"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("routes"))
            .push(any);
        let temporary = config_path.with_extension("new");
        common::write_json(&temporary, &with_any);
        std::fs::rename(&temporary, &config_path).unwrap_or_else(|e| panic!("{e}"));
        let without_sni = client_config(&pki, false);
        let (leaf, status, body) = eventually(Duration::from_secs(10), "the * route", || {
            let (config, cert_d) = (without_sni.clone(), cert_d.clone());
            async move {
                let seen = exchange(config, "d.any.test", "d.any.test").await.ok()?;
                (seen.0 == cert_d).then_some(seen)
            }
        })
        .await;
        assert!(leaf == cert_d);
        assert_eq!((status, body.as_str()), (200, "any"));
        let (leaf, _, body) = seen("unknown.test", "unknown.test").await;
        assert!(
            leaf == cert_d,
            "the * route's certificate for names no other route serves"
        );
        assert_eq!(body, "any");
        assert!(seen("foo.example.test", "foo.example.test").await.0 == rotated_a);
    });
}
