//! Route timeouts keep their precision end to end: a `500ms` in a TailnetIngress is 500 ms in
//! the rendered agent config and in the agent, and the proxy answers 504 after about 500 ms
//! (not after the 1 s the config's seconds field rounds it up to). No root needed: the proxy
//! runs in this process on 127.0.0.1.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Pki, parse_answer, tls_connect};
use tailnet_agent::drain::Drain;
use tailnet_agent::limits::{self, Gate};
use tailnet_agent::localapi::LocalApi;
use tailnet_agent::metrics::Metrics;
use tailnet_agent::proxy::{HttpSite, ProxyContext, ProxyDefaults, serve_connection};
use tailnet_agent::tls::CertStore;
use tailnet_api::agent_config::{HttpRoute, IngressListener};
use tailnet_api::validate::ingress_in_context;
use tailnet_api::{Tailnet, TailnetIngress};
use tailnet_render::RenderContext;
use tailnet_render::images::Images;
use tailnet_render::ingress::{self, IngressInputs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

fn example<T: serde::de::DeserializeOwned>(
    file: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> T {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut value: serde_json::Value =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    value["metadata"]["uid"] = "uid-1".into();
    edit(&mut value);
    serde_json::from_value(value).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The `admin` route of the example ingress with `timeouts` as given, rendered by the
/// operator's renderer and read back by the agent's config loader.
fn rendered_admin_route(timeouts: serde_json::Value) -> (HttpRoute, serde_json::Value) {
    let tailnet: Tailnet = example("10-tailnet.yaml", |_| {});
    let ingress: TailnetIngress = example("30-ingress.yaml", |value| {
        value["spec"]["exposes"][1]["timeouts"] = timeouts;
    });
    let names = ingress_in_context(
        "team-a",
        "tailnet-system",
        &ingress.spec,
        "demo",
        &tailnet.spec,
    )
    .unwrap_or_else(|e| panic!("valid ingress: {e:?}"));
    let inputs = IngressInputs {
        names,
        backend_ports: BTreeMap::from([("web".to_string(), 8080), ("admin".to_string(), 8443)]),
        serve_http: true,
        node_hostname: "tno-ingress-team-a-portal".to_string(),
        kind: tailnet_api::naming::AgentKind::Ingress,
        egress: None,
    };
    let ctx = RenderContext {
        operator_namespace: "tailnet-system",
        tailnet_name: "demo",
        tailnet: &tailnet.spec,
        images: Images::default(),
        cluster_domain: "cluster.local",
        server_ca_pem: None,
        cluster_network: None,
        restrict_agent_egress: true,
    };
    let objects =
        ingress::render(&ingress, &ctx, &inputs).unwrap_or_else(|e| panic!("render: {e}"));
    // The bytes the agent reads from its ConfigMap.
    let raw = serde_json::to_vec(&objects.config).unwrap_or_else(|e| panic!("config json: {e}"));
    let config = tailnet_agent::config::from_bytes(Path::new("config.json"), &raw)
        .unwrap_or_else(|e| panic!("the agent refuses the rendered config: {e}"));
    // What the agent read writes back byte for byte (the schema grew only optional fields).
    let rewritten = serde_json::to_vec(&config).unwrap_or_else(|e| panic!("config json: {e}"));
    assert_eq!(
        String::from_utf8_lossy(&rewritten),
        String::from_utf8_lossy(&raw)
    );
    let json: serde_json::Value = serde_json::from_slice(&raw).unwrap_or_else(|e| panic!("{e}"));
    let route = config
        .ingress
        .iter()
        .find_map(|listener| match listener {
            IngressListener::Http { routes, .. } => routes.iter().find(|r| r.name == "admin"),
            _ => None,
        })
        .cloned()
        .unwrap_or_else(|| panic!("no admin route in {json}"));
    let route_json = json["ingress"][0]["routes"]
        .as_array()
        .and_then(|routes| routes.iter().find(|r| r["name"] == "admin"))
        .cloned()
        .unwrap_or_else(|| panic!("no admin route in {json}"));
    (route, route_json)
}

#[test]
fn a_500ms_timeout_stays_500ms_from_the_crd_to_the_agent() {
    let (route, json) =
        rendered_admin_route(serde_json::json!({"request": "1500ms", "backendRequest": "500ms"}));
    assert_eq!(
        route.backend_request_timeout(),
        Some(Duration::from_millis(500))
    );
    assert_eq!(route.request_timeout(), Some(Duration::from_millis(1500)));
    // Agents that know only the seconds fields get the value rounded up, never down.
    assert_eq!(json["backendRequestTimeoutSeconds"], 1, "{json}");
    assert_eq!(json["backendRequestTimeoutMillis"], 500, "{json}");
    assert_eq!(json["requestTimeoutSeconds"], 2, "{json}");
    assert_eq!(json["requestTimeoutMillis"], 1500, "{json}");

    // Whole seconds render as before: no milliseconds field an older agent would refuse.
    let (route, json) =
        rendered_admin_route(serde_json::json!({"request": "600s", "backendRequest": "1m"}));
    assert_eq!(
        route.backend_request_timeout(),
        Some(Duration::from_secs(60))
    );
    assert_eq!(route.request_timeout(), Some(Duration::from_secs(600)));
    assert_eq!(json.get("backendRequestTimeoutMillis"), None, "{json}");
    assert_eq!(json.get("requestTimeoutMillis"), None, "{json}");
}

/// A backend that accepts connections and never answers.
async fn silent_backend() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("backend bind: {e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (address, task)
}

#[tokio::test]
async fn the_backend_request_timeout_fires_after_500ms_not_a_second() {
    let dir = std::env::temp_dir().join(format!("tno-route-timeouts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let pki = Pki::new("route timeout CA");
    let (cert, key) = pki.leaf(&["slow.test"]);
    std::fs::write(dir.join("tls.crt"), cert).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("tls.key"), key).unwrap_or_else(|e| panic!("{e}"));
    let store = Arc::new(CertStore::new(dir.join("tls.crt"), dir.join("tls.key")));
    store
        .reload()
        .unwrap_or_else(|e| panic!("certificate: {}", e.error));

    let (backend, _backend_task) = silent_backend().await;
    let route: HttpRoute = serde_json::from_value(serde_json::json!({
        "name": "slow", "hostnames": ["slow.test"],
        "backend": {"host": "127.0.0.1", "port": backend.port()},
        "backendRequestTimeoutSeconds": 1, "backendRequestTimeoutMillis": 500,
    }))
    .unwrap_or_else(|e| panic!("route: {e}"));
    let defaults = ProxyDefaults {
        backend_request_timeout: Duration::from_secs(60),
        backend_connect_timeout: Duration::from_secs(5),
    };
    let site = Arc::new(
        HttpSite::new("https-test".into(), &[route], store, defaults)
            .unwrap_or_else(|e| panic!("site: {e}")),
    );
    let context = ProxyContext {
        metrics: Arc::new(Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        )),
        localapi: LocalApi::new(dir.join("no-tailscaled.sock")),
        tunnels: TaskTracker::new(),
    };
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("proxy bind: {e}"));
    let proxy = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let drain = Drain::new();
    let serve = {
        let shutdown = drain.watch();
        tokio::spawn(async move {
            let (tcp, peer) = listener
                .accept()
                .await
                .unwrap_or_else(|e| panic!("accept: {e}"));
            let gate = Gate::new(8);
            let admission = limits::admit(&gate, &gate, std::net::Ipv4Addr::LOCALHOST.into())
                .unwrap_or_else(|_| panic!("admission"));
            serve_connection(site, context, tcp, peer, shutdown, admission).await;
        })
    };

    let mut tls = tls_connect(proxy, "slow.test", pki.client_config(&[b"http/1.1"]))
        .await
        .unwrap_or_else(|e| panic!("tls: {e}"));
    let sent = Instant::now();
    tls.write_all(b"GET / HTTP/1.1\r\nHost: slow.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("request: {e}"));
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("no answer within 10 s"))
        .unwrap_or_else(|e| panic!("answer: {e}"));
    let elapsed = sent.elapsed();
    let (status, _) = parse_answer(&answer);
    assert_eq!(status, 504, "{}", String::from_utf8_lossy(&answer));
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(950),
        "504 after {elapsed:?}: expected about 500 ms (1 s would be the rounded-up seconds field)"
    );
    drain.start();
    let _ = serve.await;
    let _ = std::fs::remove_dir_all(&dir);
}
