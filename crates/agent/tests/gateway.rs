//! The real `tailnet-agent` binary serving Gateway API routes: a `plainHttp` listener with
//! rules (path, header, query, method and regex matches; header modifiers, redirects,
//! rewrites; weighted and missing backends; wildcard, exact and catch-all hostnames) and a
//! `tlsPassthrough` listener routing ClientHellos by SNI to TLS backends that present their
//! own certificates. Real TCP, real hyper servers, reqwest and rustls clients. Runs in a
//! network namespace of its own (needs root).

mod common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Agent, Pki, eventually, metric, tls_connect};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

const HTTP_PORT: u16 = 8080;
const PASSTHROUGH_PORT: u16 = 8443;
const HTTPS_PORT: u16 = 9443;
const BACKEND_A: u16 = 18081;
const BACKEND_B: u16 = 18082;
const TLS_BACKEND_A: u16 = 18443;
const TLS_BACKEND_B: u16 = 18444;
const SPLIT_REQUESTS: usize = 200;

fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn backend(port: u16, weight: u32) -> serde_json::Value {
    json!({"backend": {"host": "127.0.0.1", "port": port}, "weight": weight})
}

fn prefix(value: &str) -> serde_json::Value {
    json!([{"path": {"type": "PathPrefix", "value": value}}])
}

fn rules() -> serde_json::Value {
    let a = || json!([backend(BACKEND_A, 1)]);
    let b = || json!([backend(BACKEND_B, 1)]);
    json!([
        {"matches": [{"path": {"type": "Exact", "value": "/exact"}}], "backends": a()},
        {"matches": prefix("/prefix"), "backends": b()},
        {"matches": [{"headers": [{"name": "X-Env", "value": "canary"}]}], "backends": b()},
        {"matches": [{"queryParams": [{"name": "version", "value": "2"}]}], "backends": b()},
        {"matches": [{"method": "DELETE"}], "backends": b()},
        {"matches": [{"path": {"type": "RegularExpression", "value": "/re/[0-9]+"}}], "backends": b()},
        {"matches": prefix("/req-headers"), "backends": a(), "filters": [{
            "type": "RequestHeaderModifier",
            "set": [{"name": "x-set", "value": "set-by-route"}],
            "add": [{"name": "x-add", "value": "added-by-route"}],
            "remove": ["x-remove"]}]},
        {"matches": prefix("/resp-headers"), "backends": a(), "filters": [{
            "type": "ResponseHeaderModifier",
            "set": [{"name": "x-resp-set", "value": "set-by-route"}],
            "add": [{"name": "x-resp-add", "value": "added-by-route"}],
            "remove": ["x-backend-only"]}]},
        {"matches": prefix("/redirect"), "filters": [{
            "type": "RequestRedirect", "scheme": "https", "hostname": "new.test",
            "path": {"type": "ReplacePrefixMatch", "value": "/moved"}, "statusCode": 301}]},
        {"matches": [{"path": {"type": "Exact", "value": "/plain-redirect"}}],
         "filters": [{"type": "RequestRedirect"}]},
        {"matches": prefix("/rewrite"), "backends": a(), "filters": [{
            "type": "URLRewrite", "hostname": "rewritten.test",
            "path": {"type": "ReplacePrefixMatch", "value": "/new"}}]},
        {"matches": prefix("/strip"), "backends": a(), "filters": [{
            "type": "URLRewrite", "path": {"type": "ReplacePrefixMatch", "value": "/"}}]},
        {"matches": prefix("/full"), "backends": a(), "filters": [{
            "type": "URLRewrite", "path": {"type": "ReplaceFullPath", "value": "/replaced"}}]},
        {"matches": prefix("/zero"), "backends": [backend(BACKEND_A, 0), backend(BACKEND_B, 100)]},
        {"matches": prefix("/split"), "backends": [backend(BACKEND_A, 50), backend(BACKEND_B, 50)]},
        {"matches": prefix("/all-zero"), "backends": [backend(BACKEND_A, 0)]},
        {"matches": prefix("/unresolved"), "backends": [{"weight": 1}]},
        {"matches": prefix("/no-backend")},
    ])
}

fn config(dir: &std::path::Path) -> serde_json::Value {
    json!({
        "localapiSocket": dir.join("no-tailscaled.sock"),
        "adminPort": common::ADMIN_PORT,
        "ingress": [
            {"mode": "plainHttp", "port": HTTP_PORT, "routes": [
                {"name": "gw-web", "hostnames": ["web.test", "*.wild.test"], "rules": rules()},
                {"name": "gw-exact", "hostnames": ["exact.wild.test"],
                 "backend": {"host": "127.0.0.1", "port": BACKEND_A}},
                {"name": "gw-any", "hostnames": ["*"],
                 "backend": {"host": "127.0.0.1", "port": BACKEND_B}},
            ]},
            {"mode": "tlsPassthrough", "port": PASSTHROUGH_PORT, "routes": [
                {"name": "pass-a", "hostnames": ["a.pass.test"], "backends": [backend(TLS_BACKEND_A, 1)]},
                {"name": "pass-b", "hostnames": ["*.b.pass.test"], "backends": [backend(TLS_BACKEND_B, 1)]},
            ]},
            {"mode": "http", "port": HTTPS_PORT, "routes": [
                {"name": "tls-web", "hostnames": ["*.tls.test"], "rules": [
                    {"matches": prefix("/go"), "filters": [{"type": "RequestRedirect",
                     "path": {"type": "ReplaceFullPath", "value": "/gone"}}]},
                    {"backends": [backend(BACKEND_A, 1)]},
                ]},
            ]},
        ],
        "tls": {"certFile": dir.join("tls.crt"), "keyFile": dir.join("tls.key")},
    })
}

/// Answers every request with what it saw: backend name, method, target, headers (all
/// values); and two response headers for the response modifier to work on.
async fn spawn_echo(port: u16, name: &'static str) {
    let listener = TcpListener::bind(local(port))
        .await
        .unwrap_or_else(|e| panic!("bind {port}: {e}"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| async move {
                    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
                    for (header, value) in request.headers() {
                        headers
                            .entry(header.as_str().to_owned())
                            .or_default()
                            .push(value.to_str().unwrap_or("<binary>").to_owned());
                    }
                    let body = json!({
                        "backend": name,
                        "method": request.method().as_str(),
                        "target": request.uri().to_string(),
                        "headers": headers,
                    });
                    let response = Response::builder()
                        .header("x-backend-only", "internal")
                        .header("x-resp-set", "from-backend")
                        .body(Full::new(Bytes::from(body.to_string())))
                        .unwrap_or_else(|e| panic!("response: {e}"));
                    Ok::<_, Infallible>(response)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

/// A TLS server with its own certificate: answers a line `x` with `<name>:x`.
async fn spawn_tls_backend(port: u16, name: &'static str, config: Arc<rustls::ServerConfig>) {
    let listener = TcpListener::bind(local(port))
        .await
        .unwrap_or_else(|e| panic!("bind {port}: {e}"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let mut tls = BufReader::new(tls);
                let mut line = String::new();
                if tls.read_line(&mut line).await.is_ok() {
                    let answer = format!("{name}:{line}");
                    let _ = tls.get_mut().write_all(answer.as_bytes()).await;
                    let _ = tls.get_mut().shutdown().await;
                }
            });
        }
    });
}

async fn wait_for_listeners() {
    eventually(Duration::from_secs(20), "gateway listeners up", || async {
        let (_, body) = common::raw_http(
            common::admin_address(),
            "GET /status HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await
        .ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        let listeners = status["listeners"].as_array()?;
        let up = |name: &str| {
            listeners
                .iter()
                .any(|l| l["name"] == name && l["up"] == true)
        };
        (up("http-8080") && up("tls-8443") && up("https-9443")).then_some(())
    })
    .await;
}

fn client() -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30));
    for name in [
        "web.test",
        "x.wild.test",
        "deep.x.wild.test",
        "exact.wild.test",
        "other.test",
    ] {
        builder = builder.resolve(name, local(HTTP_PORT));
    }
    builder.build().unwrap_or_else(|e| panic!("client: {e}"))
}

#[test]
fn gateway_routes_end_to_end() {
    let (run, netns, dir) = Agent::netns("gateway");
    let config = config(&dir);
    let frontend = Pki::new("gateway listener CA");
    let (cert, key) = frontend.leaf(&["*.tls.test"]);
    std::fs::write(dir.join("tls.crt"), cert).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("tls.key"), key).unwrap_or_else(|e| panic!("{e}"));
    let agent = Agent::start_in(run, netns, dir, &config, &[]);
    let backend_ca = Pki::new("passthrough backends CA");
    let (cert_a, key_a) = backend_ca.leaf(&["a.pass.test", "c.pass.test"]);
    let (cert_b, key_b) = backend_ca.leaf(&["*.b.pass.test"]);
    let server_a = server_config(&cert_a, &key_a);
    let server_b = server_config(&cert_b, &key_b);
    let client_tls = backend_ca.client_config(&[]);
    let frontend_ca = frontend.ca_pem.clone();
    let reloaded = reloaded_config(&config);
    let agent_for_reload = AgentConfigWriter {
        path: agent.config_path.clone(),
        dir: agent.dir.clone(),
    };
    agent.run(move || async move {
        spawn_echo(BACKEND_A, "a").await;
        spawn_echo(BACKEND_B, "b").await;
        spawn_tls_backend(TLS_BACKEND_A, "tls-a", server_a).await;
        spawn_tls_backend(TLS_BACKEND_B, "tls-b", server_b).await;
        wait_for_listeners().await;
        let client = client();
        matches_route_requests(&client).await;
        hostnames_by_specificity(&client).await;
        header_modifiers(&client).await;
        redirects(&client).await;
        rewrites(&client).await;
        weights_and_missing_backends(&client).await;
        passthrough_by_sni(client_tls.clone(), &[cert_a, cert_b]).await;
        rule_metrics().await;
        tls_listener_with_rules(&frontend_ca).await;
        agent_for_reload.write(&reloaded);
        routes_follow_a_config_change(&client, client_tls).await;
    });
}

/// Writes a new config the way kubelet updates a ConfigMap (write, then rename).
struct AgentConfigWriter {
    path: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl AgentConfigWriter {
    fn write(&self, config: &serde_json::Value) {
        let temporary = self.dir.join("config.json.new");
        common::write_json(&temporary, config);
        std::fs::rename(&temporary, &self.path).unwrap_or_else(|e| panic!("rename: {e}"));
    }
}

/// The same config with the `/zero` weights turned around and a passthrough route for
/// `c.pass.test` added.
fn reloaded_config(config: &serde_json::Value) -> serde_json::Value {
    let mut config = config.clone();
    config["ingress"][0]["routes"][0]["rules"][13]["backends"] =
        json!([backend(BACKEND_A, 100), backend(BACKEND_B, 0)]);
    if let Some(routes) = config["ingress"][1]["routes"].as_array_mut() {
        routes.push(json!({"name": "pass-c", "hostnames": ["c.pass.test"],
                           "backends": [backend(TLS_BACKEND_A, 1)]}));
    }
    config
}

async fn tls_listener_with_rules(ca_pem: &str) {
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap_or_else(|e| panic!("{e}")),
        )
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .resolve("x.tls.test", local(HTTPS_PORT))
        .resolve("y.tls.test", local(HTTPS_PORT))
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"));
    // A wildcard name is served with the wildcard certificate; the rules apply.
    let (status, seen) = send(client.get(format!("https://x.tls.test:{HTTPS_PORT}/page"))).await;
    assert_eq!(status, 200);
    assert_eq!(seen["backend"], "a");
    assert_eq!(seen["headers"]["x-forwarded-proto"][0], "https", "{seen}");
    let answer = client
        .get(format!("https://y.tls.test:{HTTPS_PORT}/go?x=1"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("redirect: {e}"));
    assert_eq!(answer.status(), 302);
    assert_eq!(
        answer.headers()["location"],
        "https://y.tls.test:9443/gone?x=1",
        "the listener's scheme and port"
    );
}

async fn routes_follow_a_config_change(
    client: &reqwest::Client,
    config: Arc<rustls::ClientConfig>,
) {
    let url = format!("http://web.test:{HTTP_PORT}/zero");
    eventually(Duration::from_secs(20), "new weights applied", || {
        let request = client.get(&url);
        async move { (backend_of(request).await == "a").then_some(()) }
    })
    .await;
    for _ in 0..20 {
        assert_eq!(backend_of(client.get(&url)).await, "a");
    }
    let mut tls = eventually(Duration::from_secs(20), "new passthrough route", || {
        let config = config.clone();
        async move {
            tls_connect(local(PASSTHROUGH_PORT), "c.pass.test", config)
                .await
                .ok()
        }
    })
    .await;
    tls.write_all(b"again\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut answer = String::new();
    let _ = tls.read_to_string(&mut answer).await;
    assert_eq!(answer, "tls-a:again\n");
}

fn server_config(cert: &str, key: &str) -> Arc<rustls::ServerConfig> {
    use rustls_pki_types::pem::PemObject;
    let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("chain: {e}"));
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())
        .unwrap_or_else(|e| panic!("key: {e}"));
    let config = rustls::ServerConfig::builder_with_provider(tailnet_agent::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("versions: {e}"))
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap_or_else(|e| panic!("server cert: {e}"));
    Arc::new(config)
}

/// What the echo backend saw: (status, JSON); status 0 and null when the proxy answered
/// with something else than JSON.
async fn send(request: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
    let answer = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("request: {e}"));
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or_default())
}

async fn backend_of(request: reqwest::RequestBuilder) -> String {
    let (status, seen) = send(request).await;
    if status != 200 {
        return status.to_string();
    }
    seen["backend"].as_str().unwrap_or("?").to_owned()
}

async fn matches_route_requests(client: &reqwest::Client) {
    let url = |path: &str| format!("http://web.test:{HTTP_PORT}{path}");
    let cases = [
        (client.get(url("/exact")), "a"),
        (client.get(url("/exact/more")), "404"),
        (client.get(url("/prefix")), "b"),
        (client.get(url("/prefix/deeper")), "b"),
        (client.get(url("/prefixed")), "404"),
        (client.get(url("/any")).header("x-env", "canary"), "b"),
        (client.get(url("/any")).header("x-env", "stable"), "404"),
        (client.get(url("/any?version=2")), "b"),
        (client.get(url("/any?version=3")), "404"),
        (client.delete(url("/any")), "b"),
        (client.put(url("/any")), "404"),
        (client.get(url("/re/42")), "b"),
        (client.get(url("/re/4x")), "404"),
    ];
    for (request, expected) in cases {
        let described = format!("{request:?}");
        assert_eq!(backend_of(request).await, expected, "{described}");
    }
    // The plain listener forwards as HTTP: the backend learns so.
    let (_, seen) = send(client.get(url("/exact"))).await;
    assert_eq!(seen["headers"]["x-forwarded-proto"][0], "http", "{seen}");
    assert_eq!(seen["headers"]["host"][0], "web.test:8080", "{seen}");
    assert_eq!(seen["method"], "GET");
}

async fn hostnames_by_specificity(client: &reqwest::Client) {
    let cases = [
        // `*.wild.test` routes by rules, at any depth.
        (format!("http://x.wild.test:{HTTP_PORT}/exact"), "a"),
        (format!("http://deep.x.wild.test:{HTTP_PORT}/prefix"), "b"),
        // The exact name beats the wildcard (its route sends everything to a).
        (format!("http://exact.wild.test:{HTTP_PORT}/prefix"), "a"),
        // Everything else: the catch-all route (b).
        (format!("http://other.test:{HTTP_PORT}/exact"), "b"),
        (format!("http://127.0.0.1:{HTTP_PORT}/exact"), "b"),
    ];
    for (url, expected) in cases {
        assert_eq!(backend_of(client.get(&url)).await, expected, "{url}");
    }
}

async fn header_modifiers(client: &reqwest::Client) {
    let (status, seen) = send(
        client
            .get(format!("http://web.test:{HTTP_PORT}/req-headers"))
            .header("x-set", "from-client")
            .header("x-add", "from-client")
            .header("x-remove", "from-client")
            .header("x-kept", "from-client"),
    )
    .await;
    assert_eq!(status, 200);
    let headers = &seen["headers"];
    assert_eq!(headers["x-set"], json!(["set-by-route"]), "{seen}");
    assert_eq!(
        headers["x-add"],
        json!(["from-client", "added-by-route"]),
        "{seen}"
    );
    assert!(headers.get("x-remove").is_none(), "{seen}");
    assert_eq!(headers["x-kept"], json!(["from-client"]));

    let answer = client
        .get(format!("http://web.test:{HTTP_PORT}/resp-headers"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("resp-headers: {e}"));
    assert_eq!(answer.status(), 200);
    let headers = answer.headers();
    assert_eq!(headers["x-resp-set"], "set-by-route");
    assert_eq!(headers["x-resp-add"], "added-by-route");
    assert!(headers.get("x-backend-only").is_none(), "{headers:?}");
    // Without the filter, the backend's headers pass.
    let answer = client
        .get(format!("http://web.test:{HTTP_PORT}/exact"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("exact: {e}"));
    assert_eq!(answer.headers()["x-backend-only"], "internal");
}

async fn redirects(client: &reqwest::Client) {
    let cases = [
        ("/redirect/page?q=1", 301, "https://new.test/moved/page?q=1"),
        ("/redirect", 301, "https://new.test/moved"),
        (
            "/plain-redirect",
            302,
            "http://web.test:8080/plain-redirect",
        ),
    ];
    for (path, status, location) in cases {
        let answer = client
            .get(format!("http://web.test:{HTTP_PORT}{path}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(answer.status().as_u16(), status, "{path}");
        assert_eq!(answer.headers()["location"], location, "{path}");
    }
}

async fn rewrites(client: &reqwest::Client) {
    let cases = [
        ("/rewrite/page?x=1", "/new/page?x=1", "rewritten.test"),
        ("/rewrite", "/new", "rewritten.test"),
        ("/strip/page", "/page", "web.test:8080"),
        ("/full/anything?y=2", "/replaced?y=2", "web.test:8080"),
    ];
    for (path, target, host) in cases {
        let (status, seen) = send(client.get(format!("http://web.test:{HTTP_PORT}{path}"))).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(seen["target"], target, "{path}: {seen}");
        assert_eq!(seen["headers"]["host"][0], host, "{path}: {seen}");
        // X-Forwarded-Host keeps what the client asked for.
        assert_eq!(
            seen["headers"]["x-forwarded-host"][0], "web.test:8080",
            "{path}"
        );
    }
}

async fn weights_and_missing_backends(client: &reqwest::Client) {
    let url = |path: &str| format!("http://web.test:{HTTP_PORT}{path}");
    // Weight 0 never gets a request.
    for _ in 0..20 {
        assert_eq!(backend_of(client.get(url("/zero"))).await, "b");
    }
    // 50/50 over many requests: both get a share near half.
    let mut to_a = 0;
    for _ in 0..SPLIT_REQUESTS {
        match backend_of(client.get(url("/split"))).await.as_str() {
            "a" => to_a += 1,
            "b" => {}
            other => panic!("split answered {other}"),
        }
    }
    assert!(
        (60..=140).contains(&to_a),
        "{to_a} of {SPLIT_REQUESTS} went to a"
    );
    // No weight, an unresolved backend, no backend at all: 500.
    for path in ["/all-zero", "/unresolved", "/no-backend"] {
        assert_eq!(backend_of(client.get(url(path))).await, "500", "{path}");
    }
}

async fn passthrough_by_sni(config: Arc<rustls::ClientConfig>, certificates: &[String]) {
    let leaf_der = |pem: &str| {
        use rustls_pki_types::pem::PemObject;
        rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap_or_else(|e| panic!("cert: {e}"))
    };
    for (sni, expected, certificate) in [
        ("a.pass.test", "tls-a", &certificates[0]),
        ("x.b.pass.test", "tls-b", &certificates[1]),
    ] {
        let mut tls = tls_connect(local(PASSTHROUGH_PORT), sni, config.clone())
            .await
            .unwrap_or_else(|e| panic!("{sni}: handshake through the agent: {e}"));
        // The certificate the client verified is the backend's own.
        let presented = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first().cloned())
            .unwrap_or_else(|| panic!("{sni}: no certificate"));
        assert_eq!(presented, leaf_der(certificate), "{sni}");
        tls.write_all(b"ping\n")
            .await
            .unwrap_or_else(|e| panic!("{sni}: write: {e}"));
        let mut answer = String::new();
        let _ = tls.read_to_string(&mut answer).await;
        assert_eq!(answer, format!("{expected}:ping\n"), "{sni}");
    }
    // An SNI no route serves: the connection is closed without an answer (EOF, no alert).
    let refused = tls_connect(local(PASSTHROUGH_PORT), "c.pass.test", config.clone()).await;
    let error = refused
        .err()
        .unwrap_or_else(|| panic!("unknown SNI completed a handshake"));
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::UnexpectedEof,
        "unexpected error: {error}"
    );
    // Not TLS at all: closed without an answer.
    let (status, body) = common::raw_http(
        local(PASSTHROUGH_PORT),
        "GET / HTTP/1.1\r\nHost: a.pass.test\r\n\r\n",
    )
    .await
    .unwrap_or_else(|e| panic!("plain request to passthrough: {e}"));
    assert_eq!((status, body.as_str()), (0, ""));
    assert!(
        metric(
            "tailnet_agent_tls_handshake_failures_total",
            &[("listener", "tls-8443")]
        )
        .await
            >= 2.0
    );
}

async fn rule_metrics() {
    let split = |backend: &'static str| async move {
        metric(
            "tailnet_agent_http_rule_requests_total",
            &[("route", "gw-web"), ("rule", "14"), ("backend", backend)],
        )
        .await
    };
    let total = split("0").await + split("1").await;
    assert_eq!(total, SPLIT_REQUESTS as f64);
    assert_eq!(
        metric(
            "tailnet_agent_http_rule_requests_total",
            &[("route", "gw-web"), ("rule", "13"), ("backend", "0")]
        )
        .await,
        0.0,
        "weight 0"
    );
    assert!(
        metric(
            "tailnet_agent_http_rule_requests_total",
            &[("route", "gw-web"), ("rule", "8"), ("backend", "redirect")]
        )
        .await
            >= 2.0
    );
    // The host label is the configured pattern, never the client's Host.
    assert!(
        metric(
            "tailnet_agent_http_requests_total",
            &[
                ("route", "gw-web"),
                ("host", "*.wild.test"),
                ("status", "200")
            ]
        )
        .await
            >= 2.0
    );
    assert_eq!(
        metric(
            "tailnet_agent_http_requests_total",
            &[("host", "deep.x.wild.test")]
        )
        .await,
        0.0
    );
}
