//! Ingress data plane end to end, through the operator: the laptop (alice, group:team-a)
//! resolves the ingress names through Headscale's MagicDNS (fed from the rendered
//! `extra-records.json`, the DNS ConfigMap mounted into Headscale by the test kubelet's volume
//! code), and over the tailnet gets: the backend's answer with
//! `X-Forwarded-For` = its tailnet IP, the alias with the same certificate, a 64 MiB gzip object
//! byte-identical with its headers, a Range, a 256 MiB streamed upload, 1,000 WebSocket
//! messages, 504 from a slow backend, a cut-off slow upload, an HTTPS backend verified against
//! its CA (502 and a counted TLS failure with the wrong CA). Then: a node outside `allowFrom`
//! gets no TCP until its tag is allowed, the rejections (source outside the allowlist,
//! cross-namespace backend, alias taken) say so in conditions, and deletion removes node,
//! grants and DNS (the name no longer resolves). Small-request rate and p99 are printed next to a tcp expose of the same
//! backend (never asserted).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::agent::{agent_metrics, metric_sum, ready_pod_ip};
use support::conditions::{ConditionIs, WithConditions, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{
    agent_pods, apply, ingress_object, join_client_node, service_object, tailnet_ipv4,
    tailnet_name, test_server_deployment, tls_secret,
};
use support::tailnet::{tcp_echo, tls_connect};
use support::wait::{WAIT, wait_for};
use tailnet_api::TailnetIngress;
use tailnet_api::conditions::{reasons, types};
use tailnet_api::ingress::TailnetIngressStatus;
use tno_testenv::{E2eEnv, OperatorArgs, OperatorProcess};
use tno_testenv_kube::http_backend::{gzip_of_pattern, pattern_chunk, pattern_sha256};
use tno_testenv_tailnet::LocalApi;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

const GZIP_OBJECT_BYTES: u64 = 64 * 1024 * 1024;
const UPLOAD_BYTES: u64 = 256 * 1024 * 1024;
const WEBSOCKET_MESSAGES: usize = 1000;
const BACKEND_SERVER_NAME: &str = "admin-backend.internal";

/// A CA and certificates it signs (the cluster CA of this test).
struct TestCa {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().expect("CA key");
        let pem = params.self_signed(&key).expect("CA certificate").pem();
        TestCa { params, key, pem }
    }

    /// (certificate PEM, key PEM) for `names`.
    fn issue(&self, names: &[String]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = rcgen::CertificateParams::new(names.to_vec())
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("certificate");
        (cert.pem(), key.serialize_pem())
    }
}

type Sender<B> = hyper::client::conn::http1::SendRequest<B>;

/// An HTTP/1.1 connection (keep-alive) over `stream`.
async fn http1<S, B>(stream: S) -> Result<Sender<B>, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    Ok(sender)
}

/// One GET on a fresh TLS connection: (status, headers, body).
async fn get(
    node: &LocalApi,
    ip: &str,
    host: &str,
    path: &str,
    ca_pem: &str,
    extra: &[(&str, &str)],
) -> Result<(u16, http::HeaderMap, Bytes), String> {
    let tls = tls_connect(node, ip, 443, host, ca_pem).await?;
    let mut sender = http1::<_, Empty<Bytes>>(tls).await?;
    let mut request = http::Request::get(path).header("host", host);
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let request = request.body(Empty::new()).map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(120), sender.send_request(request))
        .await
        .map_err(|_| "response timed out".to_string())?
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(120), response.into_body().collect())
        .await
        .map_err(|_| "body timed out".to_string())?
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, headers, body))
}

use tailnet_api::digest::sha256_hex;

/// Whether `bytes` hold a whole HTTP/1.1 response: the head and `Content-Length` body bytes
/// (a response without one is complete with its head).
fn http1_response_complete(bytes: &[u8]) -> bool {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&bytes[..end]).to_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    bytes.len() >= end + 4 + length
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// A test-servers backend; with `tls_secret`, that Secret is mounted at /tls.
fn backend_deployment(
    ns: &str,
    name: &str,
    args: serde_json::Value,
    tls_secret: Option<&str>,
) -> serde_json::Value {
    let mut deployment = test_server_deployment(ns, name, args);
    if let Some(secret) = tls_secret {
        let pod_spec = &mut deployment["spec"]["template"]["spec"];
        pod_spec["containers"][0]["volumeMounts"] =
            json!([{"name": "tls", "mountPath": "/tls", "readOnly": true}]);
        pod_spec["volumes"] = json!([{"name": "tls", "secret": {"secretName": secret}}]);
    }
    deployment
}

/// `rounds` sequential GET /whoami to `host` on one keep-alive connection: each round trip.
async fn keep_alive_round_trips<S>(tls: S, host: &str, rounds: usize) -> Vec<Duration>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut sender = http1::<_, Empty<Bytes>>(tls).await.expect("HTTP");
    let mut round_trips = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let request = http::Request::get("/whoami")
            .header("host", host)
            .body(Empty::new())
            .expect("request");
        sender
            .ready()
            .await
            .expect("connection ready for the next request");
        let response = sender.send_request(request).await.expect("request");
        response.into_body().collect().await.expect("body");
        round_trips.push(started.elapsed());
    }
    round_trips
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_data_plane_through_the_operator() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("idp").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let apps = env.namespace("app").await.expect("app namespace");
    let app_ns = apps.name().to_string();
    ops.create_bootstrap(&env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap");
    let tailnet_name = tailnet_name(&ns);
    let tailnet_object = |allowlist: &[&str]| {
        let mut object = env.tailnet_object(&tailnet_name, "Apply");
        object["spec"]["dns"]["ingressAliasTemplate"] = json!("{name}.lab.example.net");
        object["spec"]["policy"]["ingressSourceAllowlist"] = json!(allowlist);
        object
    };
    let tailnets: Api<tailnet_api::Tailnet> = Api::all(client.clone());
    apply(&tailnets, &tailnet_name, tailnet_object(&["group:team-a"]))
        .await
        .expect("Tailnet");
    // Headscale reads the rendered extra-records.json from the DNS ConfigMap, mounted as a
    // volume (the test kubelet's projection: `..data` swapped on each change).
    let records = env
        .project_extra_records(client.clone(), &ns, tno_testenv::HOSTS_CONFIG_MAP)
        .expect("extra records mounted into Headscale");
    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");

    // PKI: the "cluster CA" signs the ingress certificate; a separate backend CA signs the
    // HTTPS backend's certificate; a third, unrelated CA is the wrong one.
    let cluster_ca = TestCa::new("test cluster CA");
    let backend_ca = TestCa::new("test backend CA");
    let wrong_ca = TestCa::new("unrelated CA");
    let portal = format!("portal.{ns}.lab.example.net");
    let alias = "portal.lab.example.net".to_string();
    let slow = format!("slow.{ns}.lab.example.net");
    let admin = format!("admin.{ns}.lab.example.net");
    let admin_wrong = format!("admin-wrong.{ns}.lab.example.net");
    let (cert_pem, key_pem) = cluster_ca.issue(&[
        portal.clone(),
        alias.clone(),
        slow.clone(),
        admin.clone(),
        admin_wrong.clone(),
    ]);
    store_certificates(&client, &ns, &cert_pem, &key_pem, &backend_ca, &wrong_ca).await;
    deploy_backends(&client, &ns).await;
    let (ingresses, status, ip) =
        apply_the_portal(&client, &ns, &tailnet_name, &operator, &alias).await;
    let laptop = env.tailnet().laptop.node.local_api();
    let resolved = magic_dns_names(&client, &ns, &portal, &alias, &ip, &laptop).await;
    let d = Data {
        env: &env,
        client: &client,
        ns: &ns,
        app_ns: &app_ns,
        tailnet_name: &tailnet_name,
        ingresses: &ingresses,
        ip: &ip,
        laptop: &laptop,
        resolved: &resolved,
        cluster_ca: &cluster_ca,
        backend_ca: &backend_ca,
        portal: &portal,
        alias: &alias,
        slow: &slow,
        admin: &admin,
        admin_wrong: &admin_wrong,
    };
    forwarding_headers(&d).await;
    gzip_and_range_untouched(&d).await;
    streamed_upload(&d).await;
    websocket_messages(&d).await;
    slow_backend_head(&d).await;
    slow_upload_gets_408(&d).await;
    verified_backend_tls(&d).await;
    small_requests(&d).await;
    allow_from_changes(&d, &tailnets, tailnet_object).await;
    from_an_app_namespace(&d).await;
    deletion_removes_node_grants_and_names(&d, &status).await;
    drop(records);
    operator.terminate().await.expect("operator stops cleanly");
}

/// What the data-plane phases work with: the namespaces, the ingress, the laptop and the
/// names it resolves, and the CAs.
struct Data<'a> {
    env: &'a E2eEnv,
    client: &'a kube::Client,
    ns: &'a str,
    app_ns: &'a str,
    tailnet_name: &'a str,
    ingresses: &'a Api<TailnetIngress>,
    /// The ingress node's tailnet IPv4.
    ip: &'a str,
    laptop: &'a LocalApi,
    /// The portal's address as the laptop resolves it (MagicDNS).
    resolved: &'a str,
    cluster_ca: &'a TestCa,
    backend_ca: &'a TestCa,
    portal: &'a str,
    alias: &'a str,
    slow: &'a str,
    admin: &'a str,
    admin_wrong: &'a str,
}

/// The ingress certificate, the HTTPS backend's certificate, and the backend CA bundles.
async fn store_certificates(
    client: &kube::Client,
    ns: &str,
    cert_pem: &str,
    key_pem: &str,
    backend_ca: &TestCa,
    wrong_ca: &TestCa,
) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("portal-tls", cert_pem, key_pem),
        )
        .await
        .expect("ingress TLS Secret");
    let (backend_cert, backend_key) = backend_ca.issue(&[BACKEND_SERVER_NAME.to_string()]);
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("admin-backend-tls", &backend_cert, &backend_key),
        )
        .await
        .expect("backend TLS Secret");
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for (name, pem) in [("backend-ca", &backend_ca.pem), ("wrong-ca", &wrong_ca.pem)] {
        let config_map = json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
            "data": {"ca.crt": pem}
        });
        apply(&config_maps, name, config_map)
            .await
            .expect("CA ConfigMap");
    }
}

async fn deploy_backends(client: &kube::Client, ns: &str) {
    // Backends: the HTTP test backend (plain) and the same over TLS.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    for (name, port, args, secret) in [
        (
            "files",
            8080,
            json!(["http-backend", "--listen", "0.0.0.0:8080"]),
            None,
        ),
        (
            "admin-backend",
            8443,
            json!([
                "http-backend",
                "--listen",
                "0.0.0.0:8443",
                "--cert",
                "/tls/tls.crt",
                "--key",
                "/tls/tls.key"
            ]),
            Some("admin-backend-tls"),
        ),
    ] {
        apply(
            &deployments,
            name,
            backend_deployment(ns, name, args, secret),
        )
        .await
        .expect("backend Deployment");
        apply(&services, name, service_object(ns, name, port))
            .await
            .expect("backend Service");
    }
}

/// Returns the ingress API, the Ready ingress's status and its tailnet IPv4.
async fn apply_the_portal(
    client: &kube::Client,
    ns: &str,
    tailnet_name: &str,
    operator: &OperatorProcess,
    alias: &str,
) -> (Api<TailnetIngress>, TailnetIngressStatus, String) {
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), ns);
    let exposes = json!([
        {"name": "web", "dnsLabel": "portal", "alias": true, "mode": "http", "port": 443,
         "backend": {"service": "files", "port": "main"}},
        {"name": "slow", "dnsLabel": "slow", "mode": "http", "port": 443,
         "backend": {"service": "files", "port": 8080},
         "timeouts": {"request": "3s", "backendRequest": "1s"}},
        {"name": "admin", "dnsLabel": "admin", "mode": "http", "port": 443,
         "backend": {"service": "admin-backend", "port": 8443,
                     "tls": {"serverName": BACKEND_SERVER_NAME, "caConfigMapRef": {"name": "backend-ca", "key": "ca.crt"}}}},
        {"name": "admin-wrong", "dnsLabel": "admin-wrong", "mode": "http", "port": 443,
         "backend": {"service": "admin-backend", "port": 8443,
                     "tls": {"serverName": BACKEND_SERVER_NAME, "caConfigMapRef": {"name": "wrong-ca", "key": "ca.crt"}}}},
        {"name": "files-tcp", "dnsLabel": "files-tcp", "mode": "tcp", "port": 8443,
         "backend": {"service": "admin-backend", "port": 8443}}
    ]);
    apply(
        &ingresses,
        "portal",
        ingress_object(ns, "portal", tailnet_name, Some("portal-tls"), exposes),
    )
    .await
    .expect("ingress");
    let ready = wait_for_condition(
        &ingresses,
        "portal",
        ConditionIs::new(types::READY, "True"),
        Some(operator),
    )
    .await;
    let status = ready.status.clone().unwrap_or_default();
    let ip = tailnet_ipv4(&status.tailnet_ips).expect("tailnet IPv4");
    assert!(
        status.hostnames.contains(&alias.to_string()),
        "{:?}",
        status.hostnames
    );
    (ingresses, status, ip)
}

/// Returns the portal's address as the laptop resolves it.
async fn magic_dns_names(
    client: &kube::Client,
    ns: &str,
    portal: &str,
    alias: &str,
    ip: &str,
    laptop: &LocalApi,
) -> String {
    // MagicDNS: Headscale serves the rendered extra-records.json, which reaches it through the
    // mounted ConfigMap (nothing here copies it).
    let hosts: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let records = wait_for(
        "extra-records.json with the ingress names",
        WAIT,
        || async {
            let cm = hosts
                .get("tailnet-hosts")
                .await
                .map_err(|e| e.to_string())?;
            let text = cm
                .data
                .unwrap_or_default()
                .get("extra-records.json")
                .cloned()
                .unwrap_or_default();
            if text.contains(portal) && text.contains(alias) {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await;
    eprintln!("extra-records.json in the ConfigMap: {records}");
    for name in [&portal, &alias] {
        wait_for(&format!("MagicDNS to resolve {name}"), WAIT, || async {
            let answer = laptop.resolve_ipv4(name).await.map_err(|e| e.to_string())?;
            if answer.iter().any(|a| a.to_string() == ip) {
                Ok(())
            } else {
                Err(format!("{name} -> {answer:?}"))
            }
        })
        .await;
    }

    laptop.resolve_ipv4(portal).await.expect("resolve")[0].to_string()
}

async fn forwarding_headers(d: &Data<'_>) {
    let &Data {
        env,
        laptop,
        resolved,
        cluster_ca,
        portal,
        alias,
        ..
    } = d;
    // The backend's answer, with X-Forwarded-For = the laptop's tailnet IP; the alias works
    // with the same certificate.
    let laptop_ip = env
        .tailnet()
        .laptop
        .node
        .tailnet_ipv4()
        .await
        .expect("laptop IP");
    for host in [&portal, &alias] {
        let (code, _, body) = wait_for(
            &format!("GET https://{host}/echo-headers"),
            WAIT,
            || async {
                get(
                    laptop,
                    resolved,
                    host,
                    "/echo-headers",
                    &cluster_ca.pem,
                    &[],
                )
                .await
            },
        )
        .await;
        let answer: serde_json::Value = serde_json::from_slice(&body).expect("echo JSON");
        assert_eq!(code, 200, "{answer}");
        assert_eq!(
            answer["headers"]["x-forwarded-for"],
            json!(laptop_ip),
            "{answer}"
        );
        assert_eq!(
            answer["headers"]["x-forwarded-proto"],
            json!("https"),
            "{answer}"
        );
        assert_eq!(
            answer["headers"]["x-forwarded-host"],
            json!(host),
            "{answer}"
        );
    }
}

async fn gzip_and_range_untouched(d: &Data<'_>) {
    let &Data {
        laptop,
        resolved,
        cluster_ca,
        portal,
        ..
    } = d;
    // 64 MiB served with Content-Encoding: gzip arrive byte-identical, headers intact.
    let expected_gzip = gzip_of_pattern(GZIP_OBJECT_BYTES);
    let (code, headers, body) = get(
        laptop,
        resolved,
        portal,
        &format!("/gzip-large?bytes={GZIP_OBJECT_BYTES}"),
        &cluster_ca.pem,
        &[("accept-encoding", "gzip")],
    )
    .await
    .expect("gzip object");
    assert_eq!(code, 200);
    assert_eq!(headers["content-encoding"], "gzip");
    assert_eq!(headers["etag"], "\"gz-large\"");
    assert_eq!(
        headers["content-length"].to_str().ok(),
        Some(expected_gzip.len().to_string().as_str())
    );
    assert_eq!(body.len(), expected_gzip.len());
    assert_eq!(
        sha256_hex(&body),
        sha256_hex(&expected_gzip),
        "gzip object changed on the way"
    );
    eprintln!("gzip object: {} bytes, sha256 equal", body.len());

    // A Range request returns exactly the range.
    let (code, headers, body) = get(
        laptop,
        resolved,
        portal,
        "/blob",
        &cluster_ca.pem,
        &[("range", "bytes=1000-1999")],
    )
    .await
    .expect("range");
    assert_eq!(code, 206);
    assert_eq!(headers["content-range"], "bytes 1000-1999/1048576");
    assert_eq!(body.as_ref(), &pattern_chunk(7, 1024 * 1024)[1000..2000]);
}

async fn streamed_upload(d: &Data<'_>) {
    let &Data {
        laptop,
        resolved,
        cluster_ca,
        portal,
        ..
    } = d;
    // A 256 MiB streamed upload arrives byte-identical (the backend hashes what it got).
    let tls = tls_connect(laptop, resolved, 443, portal, &cluster_ca.pem)
        .await
        .expect("TLS");
    let chunk_size = 64 * 1024u64;
    let chunks = UPLOAD_BYTES / chunk_size;
    let body = StreamBody::new(futures_util::stream::iter((0..chunks).map(move |index| {
        Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(pattern_chunk(
            index,
            chunk_size as usize,
        ))))
    })));
    let mut sender = http1::<_, StreamBody<_>>(tls).await.expect("HTTP");
    let request = http::Request::post("/upload")
        .header("host", portal)
        .header("content-length", UPLOAD_BYTES.to_string())
        .body(body)
        .expect("request");
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(300), sender.send_request(request))
        .await
        .expect("upload timed out")
        .expect("upload");
    let code = response.status().as_u16();
    let answer = response
        .into_body()
        .collect()
        .await
        .expect("upload answer")
        .to_bytes();
    let seconds = started.elapsed().as_secs_f64();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert_eq!(code, 200, "{answer}");
    assert_eq!(
        answer,
        format!("{UPLOAD_BYTES} {}", pattern_sha256(UPLOAD_BYTES))
    );
    eprintln!("256 MiB upload: identical, {:.1} MiB/s", 256.0 / seconds);
}

async fn websocket_messages(d: &Data<'_>) {
    let &Data {
        laptop,
        resolved,
        cluster_ca,
        portal,
        ..
    } = d;
    // WebSocket: 1,000 messages echoed in order over one upgraded connection.
    let tls = tls_connect(laptop, resolved, 443, portal, &cluster_ca.pem)
        .await
        .expect("TLS");
    let (mut socket, response) = tokio_tungstenite::client_async(format!("wss://{portal}/ws"), tls)
        .await
        .expect("WebSocket handshake through the ingress");
    assert_eq!(response.status().as_u16(), 101);
    for index in 0..WEBSOCKET_MESSAGES {
        let text = format!("message {index}");
        socket
            .send(Message::text(text.clone()))
            .await
            .expect("send");
        let echoed = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("echo timed out")
            .expect("socket open")
            .expect("message");
        assert_eq!(echoed, Message::text(text));
    }
    socket.close(None).await.expect("close");
}

async fn slow_backend_head(d: &Data<'_>) {
    let &Data {
        laptop,
        resolved,
        cluster_ca,
        slow,
        ..
    } = d;
    // A slow backend: 504 after backendRequest (1 s).
    let (code, _, body) = get(laptop, resolved, slow, "/slow-head", &cluster_ca.pem, &[])
        .await
        .expect("slow backend answer");
    assert_eq!(code, 504, "{}", String::from_utf8_lossy(&body));
}

async fn slow_upload_gets_408(d: &Data<'_>) {
    let &Data {
        env,
        client,
        ns,
        laptop,
        resolved,
        cluster_ca,
        slow,
        ..
    } = d;
    // An upload slower than `request` (3 s): the agent answers 408 while the body is still
    // arriving, so the backend never gets all of it (it would answer 200 with the byte count),
    // and counts the 408. Raw HTTP/1.1 over TLS, so the answer is read while the client is
    // still writing (an HTTP client may give up on its write error before reading it).
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let agent_ip = agent_pods(&pods, "tailnet-ingress-portal")
        .await
        .expect("agent pods")
        .iter()
        .find_map(|p| ready_pod_ip(p).ok())
        .expect("a Ready ingress agent pod");
    let host_label = format!("host=\"{slow}\"");
    let counted_408 = |metrics: &str| {
        metric_sum(
            metrics,
            "tailnet_agent_http_requests_total",
            &[host_label.as_str(), "status=\"408\""],
        )
    };
    let before = counted_408(&agent_metrics(env, &agent_ip).await.expect("agent metrics"));
    let tls = tls_connect(laptop, resolved, 443, slow, &cluster_ca.pem)
        .await
        .expect("TLS");
    let (mut reader, mut writer) = tokio::io::split(tls);
    let sent = Arc::new(AtomicUsize::new(0));
    let head = format!("POST /upload HTTP/1.1\r\nHost: {slow}\r\nContent-Length: 40\r\n\r\n");
    let started = Instant::now();
    let uploader = {
        let sent = sent.clone();
        tokio::spawn(async move {
            writer.write_all(head.as_bytes()).await?;
            writer.flush().await?;
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_millis(250)).await;
                writer.write_all(b"x").await?;
                writer.flush().await?;
                sent.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, std::io::Error>(())
        })
    };
    let mut answer = Vec::new();
    let mut first_byte = None;
    let mut buffer = [0u8; 4096];
    let read_deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !http1_response_complete(&answer) {
        match tokio::time::timeout_at(read_deadline, reader.read(&mut buffer)).await {
            Ok(Ok(read)) if read > 0 => {
                first_byte.get_or_insert((started.elapsed(), sent.load(Ordering::SeqCst)));
                answer.extend_from_slice(&buffer[..read]);
            }
            _ => break,
        }
    }
    uploader.abort();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (answered_after, body_bytes_sent) =
        first_byte.unwrap_or_else(|| panic!("the slow upload got no answer: {text:?}"));
    eprintln!(
        "slow upload: {:?} after {answered_after:?}, {body_bytes_sent} of 40 body bytes sent",
        text.lines().next().unwrap_or_default()
    );
    assert!(
        text.starts_with("HTTP/1.1 408"),
        "the slow upload must get 408 from the agent: {text:?}"
    );
    assert!(
        body_bytes_sent < 40,
        "the 408 must come while the upload is still running ({body_bytes_sent} of 40 bytes sent)"
    );
    assert!(
        answered_after >= Duration::from_millis(2500),
        "408 after {answered_after:?}, before the 3 s request timeout"
    );
    wait_for(
        "the agent to count the 408",
        Duration::from_secs(20),
        || async {
            let metrics = agent_metrics(env, &agent_ip).await?;
            let now = counted_408(&metrics);
            if now >= before + 1.0 {
                Ok(())
            } else {
                Err(format!("408s for {slow}: {before} → {now}"))
            }
        },
    )
    .await;
}

async fn verified_backend_tls(d: &Data<'_>) {
    let &Data {
        env,
        client,
        ns,
        laptop,
        resolved,
        cluster_ca,
        admin,
        admin_wrong,
        ..
    } = d;
    // HTTPS backend verified against its CA; with the wrong CA: 502, counted as TLS failure.
    let (code, _, body) = get(laptop, resolved, admin, "/whoami", &cluster_ca.pem, &[])
        .await
        .expect("admin");
    assert_eq!((code, body.as_ref()), (200, b"admin-backend".as_ref()));
    let (code, _, _) = get(
        laptop,
        resolved,
        admin_wrong,
        "/whoami",
        &cluster_ca.pem,
        &[],
    )
    .await
    .expect("admin with the wrong CA");
    assert_eq!(code, 502);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let agent_pod = agent_pods(&pods, "tailnet-ingress-portal")
        .await
        .expect("agent pods")
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
        .expect("agent pod with an IP");
    let pod_ip = agent_pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    let metrics = agent_metrics(env, &pod_ip).await.expect("agent metrics");
    let tls_failures = metric_sum(
        &metrics,
        "tailnet_agent_backend_tls_failures",
        &["admin-wrong"],
    );
    assert!(
        tls_failures >= 1.0,
        "backend TLS failure not counted:\n{metrics}"
    );
}

async fn small_requests(d: &Data<'_>) {
    let &Data {
        laptop,
        resolved,
        cluster_ca,
        backend_ca,
        portal,
        ..
    } = d;
    // Small HTTPS requests (keep-alive, sequential) through the http expose, next to the same
    // requests over a tcp expose to the TLS backend (TLS end to end, no proxy): printed only.
    let rounds = 300;
    let tls = tls_connect(laptop, resolved, 443, portal, &cluster_ca.pem)
        .await
        .expect("TLS");
    let mut through_proxy = keep_alive_round_trips(tls, portal, rounds).await;
    let tls = tls_connect(laptop, resolved, 8443, BACKEND_SERVER_NAME, &backend_ca.pem)
        .await
        .expect("TLS");
    let mut direct = keep_alive_round_trips(tls, BACKEND_SERVER_NAME, rounds).await;
    through_proxy.sort();
    direct.sort();
    let rate = |samples: &[Duration]| {
        samples.len() as f64 / samples.iter().sum::<Duration>().as_secs_f64()
    };
    eprintln!(
        "small HTTPS requests ({rounds}, keep-alive, sequential): http expose {:.0} req/s p50 {:?} p99 {:?}; tcp expose to the TLS backend {:.0} req/s p50 {:?} p99 {:?}; rate ratio {:.2}",
        rate(&through_proxy),
        percentile(&through_proxy, 0.5),
        percentile(&through_proxy, 0.99),
        rate(&direct),
        percentile(&direct, 0.5),
        percentile(&direct, 0.99),
        rate(&through_proxy) / rate(&direct),
    );
}

async fn allow_from_changes(
    d: &Data<'_>,
    tailnets: &Api<tailnet_api::Tailnet>,
    tailnet_object: impl Fn(&[&str]) -> serde_json::Value,
) {
    let &Data {
        env,
        ns,
        tailnet_name,
        ingresses,
        ip,
        laptop,
        resolved,
        cluster_ca,
        backend_ca,
        admin,
        ..
    } = d;
    // A node outside allowFrom gets no TCP connection; once its tag is in the allowlist and
    // allowFrom, it does (nothing restarted).
    let outsider = join_client_node(env, "outsider", ns).await;
    let outsider_api = outsider.node.local_api();
    let denied = tcp_echo(&outsider_api, ip, 8443).await;
    assert!(
        denied.is_err(),
        "outside allowFrom must get no TCP: {denied:?}"
    );

    // allowFrom outside the allowlist is rejected, and nothing working is lost.
    ingresses
        .patch(
            "portal",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "spec": {"allowFrom": ["group:team-a", "tag:client"]}
            })),
        )
        .await
        .expect("allowFrom with tag:client");
    let rejected = wait_for_condition(
        ingresses,
        "portal",
        ConditionIs::new(types::SOURCES_ALLOWED, "False").reason(reasons::SOURCE_NOT_ALLOWED),
        None,
    )
    .await
    .condition_message(types::SOURCES_ALLOWED);
    assert!(rejected.contains("tag:client"), "{rejected}");
    // The allowed source keeps its grant: PolicyEffective stays True and names both sides.
    let partly = ingresses.get("portal").await.expect("portal");
    let effective = partly
        .condition(types::POLICY_EFFECTIVE)
        .expect("PolicyEffective");
    assert_eq!(effective.status, "True", "{}", partly.describe());
    let message = &effective.message;
    assert!(message.contains("tag:client get no grant"), "{message}");
    get(laptop, resolved, admin, "/whoami", &cluster_ca.pem, &[])
        .await
        .expect("the laptop keeps working while the change is rejected");
    apply(
        tailnets,
        tailnet_name,
        tailnet_object(&["group:team-a", "tag:client"]),
    )
    .await
    .expect("allowlist with tag:client");
    wait_for(
        "the outsider, now allowed, to get a connection",
        WAIT,
        || async {
            // A TLS handshake on the tcp expose proves a TCP connection to the backend.
            tls_connect(
                &outsider_api,
                ip,
                8443,
                BACKEND_SERVER_NAME,
                &backend_ca.pem,
            )
            .await
            .map(|_| ())
        },
    )
    .await;
}

async fn from_an_app_namespace(d: &Data<'_>) {
    let &Data {
        client,
        ns,
        app_ns,
        tailnet_name,
        ingresses,
        alias,
        ..
    } = d;
    // From an app namespace: a cross-namespace backend is rejected; the alias taken by
    // `portal` stays with its first owner.
    let app_ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), app_ns);
    let cross_namespace = json!([{"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 5432,
                                  "backend": {"service": "files", "namespace": ns, "port": 8080}}]);
    apply(
        &app_ingresses,
        "sneaky",
        ingress_object(app_ns, "sneaky", tailnet_name, None, cross_namespace),
    )
    .await
    .expect("cross-namespace ingress");
    let taken_alias = json!([{"name": "raw", "dnsLabel": "portal", "alias": true, "mode": "tcp", "port": 7000,
                              "backend": {"service": "nothing", "port": 7000}}]);
    apply(
        &app_ingresses,
        "portal",
        ingress_object(app_ns, "portal", tailnet_name, None, taken_alias),
    )
    .await
    .expect("second portal");
    let sneaky = wait_for_condition(
        &app_ingresses,
        "sneaky",
        ConditionIs::new(types::BACKENDS_RESOLVED, "False")
            .reason(reasons::CROSS_NAMESPACE_BACKEND),
        None,
    )
    .await
    .condition_message(types::BACKENDS_RESOLVED);
    eprintln!("cross-namespace backend: {sneaky}");
    // No agent is deployed for it, so no pre-auth key was minted either.
    let app_secrets: Api<Secret> = Api::namespaced(client.clone(), app_ns);
    assert!(
        app_secrets
            .get_opt("tailnet-ingress-sneaky-auth")
            .await
            .expect("read auth Secret")
            .is_none(),
        "a key was minted for an ingress whose agent cannot be deployed"
    );
    let conflict = wait_for_condition(
        &app_ingresses,
        "portal",
        ConditionIs::new(types::HOSTNAMES_UNIQUE, "False").reason(reasons::HOSTNAME_CONFLICT),
        None,
    )
    .await
    .condition_message(types::HOSTNAMES_UNIQUE);
    assert!(conflict.contains(alias), "{conflict}");
    let first = ingresses.get("portal").await.expect("first portal");
    assert!(
        first
            .status
            .clone()
            .unwrap_or_default()
            .hostnames
            .contains(&alias.to_string()),
        "the first owner keeps the alias: {}",
        first.describe()
    );
}

async fn deletion_removes_node_grants_and_names(d: &Data<'_>, status: &TailnetIngressStatus) {
    let &Data {
        env,
        client,
        ns,
        ingresses,
        portal,
        laptop,
        ip,
        ..
    } = d;
    let hosts: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    // Deletion: node, grants and DNS names go.
    let node_id = status.node_id.clone().expect("node id");
    ingresses
        .delete("portal", &DeleteParams::default())
        .await
        .expect("delete ingress");
    wait_for(
        "the ingress to be gone with its node, grants and names",
        WAIT,
        || async {
            if ingresses
                .get_opt("portal")
                .await
                .map_err(|e| e.to_string())?
                .is_some()
            {
                return Err("ingress still there (finalizer)".into());
            }
            let nodes = env
                .headscale_api()
                .list_nodes()
                .await
                .map_err(|e| e.to_string())?;
            if nodes.iter().any(|n| n.id.to_string() == node_id) {
                return Err(format!("node {node_id} still in Headscale"));
            }
            let policy = env
                .headscale_api()
                .get_policy()
                .await
                .map_err(|e| e.to_string())?;
            let tag = format!("tag:tno-ingress-{ns}-portal");
            if policy.contains(&format!("\"{tag}\"")) {
                return Err(format!("{tag} still in the policy"));
            }
            let cm = hosts
                .get("tailnet-hosts")
                .await
                .map_err(|e| e.to_string())?;
            let data = cm.data.unwrap_or_default();
            if data.values().any(|v| v.contains(portal)) {
                return Err(format!("{portal} still in the DNS ConfigMap"));
            }
            Ok(())
        },
    )
    .await;
    // And out of MagicDNS: the emptied key reaches Headscale through the mounted ConfigMap.
    wait_for(&format!("MagicDNS to forget {portal}"), WAIT, || async {
        let answer = laptop
            .resolve_ipv4(portal)
            .await
            .map_err(|e| e.to_string())?;
        if answer.iter().any(|a| a.to_string() == ip) {
            Err(format!("{portal} -> {answer:?}"))
        } else {
            Ok(())
        }
    })
    .await;
}
