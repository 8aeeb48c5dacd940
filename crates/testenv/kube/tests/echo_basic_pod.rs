//! The Gateway API conformance suite's backend image in the lab: pods of
//! `registry.k8s.io/gateway-api/echo-basic:<tag>` (the test kubelet runs the echo-basic binary
//! of `deps/build.sh gateway-api-conformance`) with the suite's own env (POD_NAME and
//! NAMESPACE from the downward API) answer HTTP on :3000 with the request and their pod
//! context, directly and through a ClusterIP Service (kube-proxy; the client in a pod netns
//! of its own), and with
//! `TCP_ECHO_SERVER` speak the suite's TCP protocol (welcome line, `PING`/`PONG`, `TEST` →
//! JSON context).
//!
//! echo-basic is an optional component (not in `deps/build.sh all`): without it the test
//! skips with a note, unless TNO_REQUIRE_GATEWAY_CONFORMANCE=1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use tno_netlab::Netns;
use tno_testenv_kube::binaries::tool;
use tno_testenv_kube::env::{ECHO_BASIC_BINARY, ECHO_BASIC_COMPONENT};
use tno_testenv_kube::process::poll_until;
use tno_testenv_kube::{KubeEnv, shared};

const DEADLINE: Duration = Duration::from_secs(90);
/// One of the tags the suite's manifests name (all map to the same binary).
const IMAGE: &str = "registry.k8s.io/gateway-api/echo-basic:v1.5.1";
const TCP_IMAGE: &str = "registry.k8s.io/gateway-api/echo-basic:v1.6.0-dev.2";

/// The shared environment, or `None` (skip) without the echo-basic binary.
async fn env_with_echo_basic() -> Option<Arc<KubeEnv>> {
    if let Err(missing) = tool(ECHO_BASIC_COMPONENT, ECHO_BASIC_BINARY) {
        assert!(
            std::env::var("TNO_REQUIRE_GATEWAY_CONFORMANCE").as_deref() != Ok("1"),
            "{missing}: run deps/build.sh {ECHO_BASIC_COMPONENT}"
        );
        eprintln!("SKIPPED: {missing} (deps/build.sh {ECHO_BASIC_COMPONENT})");
        return None;
    }
    Some(
        shared()
            .await
            .unwrap_or_else(|error| panic!("environment failed to start: {error}")),
    )
}

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("test object matches its type")
}

/// The suite's backend env: pod name and namespace from the downward API.
fn suite_env() -> Value {
    json!([
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ])
}

/// `GET path` with `Host: host` over a connection made in `netns`; returns the status line
/// and the JSON body.
fn http_get(
    netns: &Netns,
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> Result<(String, Value), String> {
    let mut stream: TcpStream = netns
        .connect_tcp(addr, Duration::from_secs(3))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("read: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head: {response:?}"))?;
    let status = head.lines().next().unwrap_or_default().to_owned();
    let body = serde_json::from_str(body).map_err(|e| format!("body {body:?}: {e}"))?;
    Ok((status, body))
}

/// Retries [`http_get`] until it answers (the pod may still be starting).
async fn http_get_eventually(
    netns: &Arc<Netns>,
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> (String, Value) {
    let (host, path) = (host.to_owned(), path.to_owned());
    poll_until(&format!("echo-basic at {addr} to answer"), DEADLINE, || {
        let (netns, host, path) = (netns.clone(), host.clone(), path.clone());
        async move {
            tokio::task::spawn_blocking(move || http_get(&netns, addr, &host, &path).ok())
                .await
                .ok()
                .flatten()
        }
    })
    .await
    .unwrap_or_else(|error| panic!("{error}"))
}

/// The suite's TCP exchange with a `TCP_ECHO_SERVER` pod: welcome line, PING → PONG, TEST →
/// the pod context as JSON.
fn tcp_exchange(env: &KubeEnv, addr: SocketAddr) -> Result<(String, String, Value), String> {
    let stream = env
        .lab()
        .netns()
        .connect_tcp(addr, Duration::from_secs(3))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let mut line = |what: &str| {
        let mut text = String::new();
        reader
            .read_line(&mut text)
            .map_err(|e| format!("reading the {what}: {e}"))?;
        Ok::<_, String>(text.trim_end().to_owned())
    };
    let welcome = line("welcome line")?;
    writer.write_all(b"PING\n").map_err(|e| e.to_string())?;
    let pong = line("PONG")?;
    writer.write_all(b"TEST\n").map_err(|e| e.to_string())?;
    let context = line("TEST answer")?;
    let context = serde_json::from_str(&context).map_err(|e| format!("{context:?}: {e}"))?;
    Ok((welcome, pong, context))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_basic_pods_answer_http_directly_and_through_their_service() {
    let Some(env) = env_with_echo_basic().await else {
        return;
    };
    let namespace = env.namespace("echo-basic").await.expect("namespace");
    let ns = namespace.name().to_string();
    let client = namespace.client().clone();
    // The suite's infra-backend-v1, with a readiness probe of ours to know when it listens.
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &object(json!({
                "metadata": {"name": "infra-backend-v1", "labels": {"app": "infra-backend-v1"}},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "infra-backend-v1"}},
                    "template": {
                        "metadata": {"labels": {"app": "infra-backend-v1"}},
                        "spec": {"containers": [{
                            "name": "infra-backend-v1",
                            "image": IMAGE,
                            "env": suite_env(),
                            "readinessProbe": {"tcpSocket": {"port": 3000}, "periodSeconds": 1},
                        }]},
                    },
                },
            })),
        )
        .await
        .expect("Deployment created");
    let service: Service = Api::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &object(json!({
                "metadata": {"name": "infra-backend-v1"},
                "spec": {
                    "selector": {"app": "infra-backend-v1"},
                    "ports": [{"name": "first-port", "port": 8080, "targetPort": 3000}],
                },
            })),
        )
        .await
        .expect("Service created");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (pod_name, pod_ip) = poll_until("the echo-basic pod to be Ready", DEADLINE, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        let pod = list.items.into_iter().next()?;
        let status = pod.status?;
        let ready = status
            .conditions?
            .iter()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True");
        ready.then_some((pod.metadata.name?, status.pod_ip?))
    })
    .await
    .unwrap_or_else(|error| panic!("{error}\n{}", env.diagnostics(Some(&ns), 30)));

    // A client in a pod netns of its own: the lab netns (the node) has no route to the
    // Service CIDR, pods reach it through the lab's kube-proxy rules.
    let client_uid = format!("client-{ns}");
    let client_net = env.lab().add_pod_netns(&client_uid).expect("client netns");
    let direct: SocketAddr = format!("{pod_ip}:3000").parse().expect("pod address");
    let (status, body) = http_get_eventually(
        &client_net.netns,
        direct,
        "echo.example.com",
        "/backend/v1?q=1",
    )
    .await;
    assert!(status.ends_with("200 OK"), "{status}: {body}");
    assert_eq!(body["pod"], pod_name.as_str(), "{body}");
    assert_eq!(body["namespace"], ns.as_str(), "{body}");
    assert_eq!(body["host"], "echo.example.com", "{body}");
    assert_eq!(body["path"], "/backend/v1?q=1", "{body}");
    assert_eq!(body["method"], "GET", "{body}");

    let cluster_ip = service
        .spec
        .and_then(|spec| spec.cluster_ip)
        .expect("a ClusterIP");
    let through_service: SocketAddr = format!("{cluster_ip}:8080").parse().expect("address");
    let (status, body) =
        http_get_eventually(&client_net.netns, through_service, "svc.example.com", "/").await;
    assert!(status.ends_with("200 OK"), "{status}: {body}");
    assert_eq!(body["pod"], pod_name.as_str(), "{body}");
    assert_eq!(body["host"], "svc.example.com", "{body}");
    env.lab()
        .remove_pod_netns(&client_uid)
        .expect("client netns removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_basic_tcp_mode_speaks_the_suites_tcp_protocol() {
    let Some(env) = env_with_echo_basic().await else {
        return;
    };
    let namespace = env.namespace("echo-basic-tcp").await.expect("namespace");
    let ns = namespace.name().to_string();
    let pods: Api<Pod> = Api::namespaced(namespace.client().clone(), &ns);
    let mut env_vars = suite_env();
    if let Some(list) = env_vars.as_array_mut() {
        list.push(json!({"name": "TCP_ECHO_SERVER", "value": "true"}));
    }
    pods.create(
        &PostParams::default(),
        &object(json!({
            "metadata": {"name": "tcp-backend"},
            "spec": {"containers": [{
                "name": "tcp-backend",
                "image": TCP_IMAGE,
                "env": env_vars,
                "readinessProbe": {"tcpSocket": {"port": 3000}, "periodSeconds": 1},
            }]},
        })),
    )
    .await
    .expect("Pod created");
    let pod_ip = poll_until("the TCP echo-basic pod to be Ready", DEADLINE, || async {
        let status = pods.get_opt("tcp-backend").await.ok()??.status?;
        let ready = status
            .conditions?
            .iter()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True");
        ready.then_some(status.pod_ip?)
    })
    .await
    .unwrap_or_else(|error| panic!("{error}\n{}", env.diagnostics(Some(&ns), 30)));
    let addr: SocketAddr = format!("{pod_ip}:3000").parse().expect("pod address");
    let exchange = {
        let env = env.clone();
        tokio::task::spawn_blocking(move || tcp_exchange(&env, addr))
            .await
            .expect("exchange thread")
    };
    let (welcome, pong, context) = exchange.unwrap_or_else(|error| {
        panic!(
            "{error}\n{}",
            namespace.container_log("tcp-backend", "tcp-backend")
        )
    });
    assert_eq!(welcome, "Gateway API Test TCP Server");
    assert_eq!(pong, "PONG");
    assert_eq!(context["pod"], "tcp-backend", "{context}");
    assert_eq!(context["namespace"], ns.as_str(), "{context}");
    assert_eq!(context["isTLS"], false, "{context}");
}
