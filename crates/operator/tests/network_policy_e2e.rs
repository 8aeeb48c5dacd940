//! NetworkPolicies enforced for real: kube-router's firewall controller runs in the lab netns
//! (where every pod's traffic is routed, after kube-proxy's DNAT) for this test only
//! ([`tno_testenv::E2eEnv::start_network_policy_enforcer`]), and the operator's rendered
//! policies are checked by what gets through:
//!
//! - a pod in a listed consumer namespace reaches the egress Service: its bytes are echoed by
//!   the remote site (192.0.2.10:5432) through the tailnet;
//! - a pod in another namespace reaches the agent's metrics port and an unrelated pod (so its
//!   network works), but not the egress: the Service and the agent's listener port refuse it,
//!   and the agent's connection counter does not move (nothing reached the remote site);
//! - an ingress agent accepts nothing in-cluster but its metrics port: pods' connections to its
//!   listener ports fail, to 9180/metrics succeed. Its listeners bind loopback, so to make the
//!   check discriminating a witness listener of the test's own is bound on the agent pod's IP
//!   at the expose port: the node (lab netns) reaches it, pods do not.
//!
//! Connections are opened by the test inside the client pods' network namespaces (their pod
//! IPs as source, exactly what their containers would send), plus one real `tcp-check` pod on
//! each side through cluster DNS.
//!
//! `TNO_NETWORK_POLICY_ENFORCER=off` runs the same test without the enforcer, to see what it
//! catches: it then fails at the first cross-namespace check, whose connection gets through.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::agent::{agent_metrics, metric_sum, ready_pod_ip};
use support::conditions::{ConditionIs, WithConditions, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{
    agent_pods, apply, bootstrap_applied_tailnet, ingress_object, remote_db_target, service_object,
    tailnet_ipv4, test_server_deployment,
};
use support::tailnet::tcp_echo;
use support::wait::{WAIT, wait_for};
use tailnet_api::agent_config::ADMIN_PORT;
use tailnet_api::{TailnetEgress, TailnetIngress};
use tno_netlab::Netns;
use tno_testenv::{E2eEnv, E2eNamespace, OperatorArgs, OperatorProcess};

/// The ingress's tcp expose (the agent listens on 127.0.0.1:7100 in its pod).
const INGRESS_PORT: u16 = 7100;
/// Connection attempts that must all fail for "does not get through".
const DENIED_ATTEMPTS: usize = 3;

/// What one connection from a pod's netns achieved.
enum Outcome {
    /// Connected and read this back (possibly nothing before the peer closed).
    Answered(Vec<u8>),
    /// Connect failed (refused, timed out, unreachable).
    ConnectFailed(std::io::Error),
    /// Connected, but reading failed.
    ReadFailed(std::io::Error),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Answered(bytes) => write!(f, "answered {:?}", String::from_utf8_lossy(bytes)),
            Outcome::ConnectFailed(error) => {
                write!(f, "connect failed ({:?}): {error}", error.kind())
            }
            Outcome::ReadFailed(error) => write!(f, "read failed ({:?}): {error}", error.kind()),
        }
    }
}

impl Outcome {
    fn answered_with(&self, expected: &[u8]) -> bool {
        matches!(self, Outcome::Answered(bytes) if bytes.windows(expected.len()).any(|w| w == expected))
    }
}

/// Connects from `netns` to `addr`, sends `payload` and reads until `expect` is seen, the peer
/// closes, or 5 s pass.
async fn exchange(netns: &Arc<Netns>, addr: SocketAddr, payload: &[u8], expect: &[u8]) -> Outcome {
    let netns = netns.clone();
    let payload = payload.to_vec();
    let expect = expect.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut stream = match netns.connect_tcp(addr, Duration::from_secs(3)) {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Outcome::ConnectFailed(error),
            Err(error) => return Outcome::ConnectFailed(std::io::Error::other(error.to_string())),
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        if let Err(error) = stream.write_all(&payload) {
            return Outcome::ReadFailed(error);
        }
        let mut received = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => return Outcome::Answered(received),
                Ok(n) => {
                    received.extend_from_slice(&buffer[..n]);
                    if received.windows(expect.len().max(1)).any(|w| w == expect) {
                        return Outcome::Answered(received);
                    }
                }
                Err(error) if received.is_empty() => return Outcome::ReadFailed(error),
                Err(_) => return Outcome::Answered(received),
            }
        }
    })
    .await
    .unwrap_or_else(|e| Outcome::ConnectFailed(std::io::Error::other(e.to_string())))
}

/// Waits until `exchange` from `netns` to `addr` gets `expect` back (policies and ipsets are
/// written a moment after a pod appears).
async fn reaches(what: &str, netns: &Arc<Netns>, addr: SocketAddr, payload: &[u8], expect: &[u8]) {
    wait_for(what, WAIT, || async {
        match exchange(netns, addr, payload, expect).await {
            outcome if outcome.answered_with(expect) => Ok(()),
            outcome => Err(outcome.to_string()),
        }
    })
    .await;
}

/// Every one of [`DENIED_ATTEMPTS`] connections fails to get `expect` back; returns what
/// they got (for the log).
async fn denied(
    what: &str,
    netns: &Arc<Netns>,
    addr: SocketAddr,
    payload: &[u8],
    expect: &[u8],
) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..DENIED_ATTEMPTS {
        let outcome = exchange(netns, addr, payload, expect).await;
        assert!(
            !outcome.answered_with(expect),
            "{what}: the connection got through ({outcome}); is NetworkPolicy enforced?"
        );
        seen.push(outcome.to_string());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    seen
}

/// A pod of the test-servers image echoing on 8080, to connect from (and to).
async fn witness_pod(client: &kube::Client, namespace: &str, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "echo", "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE,
            "args": ["tcp-echo", "--listen", "0.0.0.0:8080"],
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}
    }))
    .expect("witness pod manifest");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("witness pod");
    wait_for(
        &format!("witness pod {namespace}/{name} Ready"),
        WAIT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            ready_pod_ip(&pod).map(|_| pod)
        },
    )
    .await
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    format!("{ip}:{port}").parse().expect("socket address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_policies_are_enforced_by_kube_router_in_the_lab() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let enforcer = if std::env::var("TNO_NETWORK_POLICY_ENFORCER").as_deref() == Ok("off") {
        eprintln!("TNO_NETWORK_POLICY_ENFORCER=off: no NetworkPolicy enforcer in the lab");
        None
    } else {
        let enforcer = env
            .start_network_policy_enforcer()
            .await
            .unwrap_or_else(|e| panic!("kube-router: {e}"));
        eprintln!(
            "enforcer: kube-router firewall controller, {}",
            enforcer.iptables_backend()
        );
        Some(enforcer)
    };

    let ops = env.namespace("np").await.expect("operator namespace");
    let consumer = env.namespace("npc").await.expect("consumer namespace");
    let outsider = env.namespace("npo").await.expect("outsider namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let tailnet = bootstrap_applied_tailnet(&env, &ops).await;
    env.approve_site_routes().await.expect("site routes");
    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");
    let (egresses, ingresses) = create_egress_and_ingress(&client, &ns, &tailnet, &consumer).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (cluster_ip, agent_port, egress_ip) = egress_agent_ready(&egresses, &pods, &operator).await;
    let consumer_pod = witness_pod(consumer.client(), consumer.name(), "witness").await;
    let outsider_pod = witness_pod(outsider.client(), outsider.name(), "witness").await;
    let netns_of =
        |pod: &Pod| Arc::new(env.pod_netns(pod.metadata.uid.as_deref().expect("pod uid")));
    let consumer_netns = netns_of(&consumer_pod);
    let outsider_netns = netns_of(&outsider_pod);
    let consumer_ip = ready_pod_ip(&consumer_pod).expect("consumer pod IP");
    let target = format!("remote-db.{ns}.svc.cluster.local:5432");
    let metrics_request = b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n";
    let w = Witnesses {
        env: &env,
        consumer_netns: &consumer_netns,
        outsider_netns: &outsider_netns,
        metrics_request,
    };
    consumer_reaches_the_site(&w, &consumer, &cluster_ip, &target).await;
    outsider_network_works(&w, &egress_ip, &consumer_ip).await;
    outsider_does_not_reach_the_egress(&w, &outsider, &cluster_ip, &egress_ip, agent_port, &target)
        .await;
    ingress_agent_only_on_metrics(&w, &ingresses, &pods, &operator).await;
    if let Some(enforcer) = enforcer {
        let forward = enforcer
            .packets_through("FORWARD")
            .expect("filter counters");
        let input = enforcer.packets_through("INPUT").expect("filter counters");
        eprintln!("kube-router's jumps saw {forward} packets in FORWARD, {input} in INPUT");
        assert!(
            forward > 0,
            "routed pod traffic never reached kube-router's FORWARD chain"
        );
        enforcer
            .stop()
            .expect("kube-router stops and its rules are removed");
    }
    operator.terminate().await.expect("operator stops cleanly");
}

/// What the reachability phases work with: the pods' network namespaces and the request
/// every agent's metrics port answers.
struct Witnesses<'a> {
    env: &'a E2eEnv,
    consumer_netns: &'a Arc<Netns>,
    outsider_netns: &'a Arc<Netns>,
    metrics_request: &'a [u8],
}

/// The egress, for the consumer namespace only; the ingress, a tcp expose of an echo backend
/// in its own namespace.
async fn create_egress_and_ingress(
    client: &kube::Client,
    ns: &str,
    tailnet: &str,
    consumer: &E2eNamespace<'_>,
) -> (Api<TailnetEgress>, Api<TailnetIngress>) {
    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), ns);
    apply(
        &egresses,
        "site",
        json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
            "metadata": {"name": "site", "namespace": ns},
            "spec": {"tailnetRef": {"name": tailnet}, "consumerNamespaces": [consumer.name()],
                     "targets": [remote_db_target()]}
        }),
    )
    .await
    .expect("egress");
    apply(
        &Api::namespaced(client.clone(), ns),
        "db",
        test_server_deployment(
            ns,
            "db",
            json!(["tcp-echo", "--listen", format!("0.0.0.0:{INGRESS_PORT}")]),
        ),
    )
    .await
    .map(|_: k8s_openapi::api::apps::v1::Deployment| ())
    .expect("backend Deployment");
    apply(
        &Api::<Service>::namespaced(client.clone(), ns),
        "db",
        service_object(ns, "db", INGRESS_PORT),
    )
    .await
    .expect("backend Service");
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), ns);
    apply(
        &ingresses,
        "db",
        ingress_object(
            ns,
            "db",
            tailnet,
            None,
            json!([{"name": "db", "dnsLabel": "db", "mode": "tcp", "port": INGRESS_PORT,
                    "backend": {"service": "db", "port": INGRESS_PORT}}]),
        ),
    )
    .await
    .expect("ingress");
    (egresses, ingresses)
}

/// The egress's ClusterIP and agent port for remote-db, and its Ready agent pod's IP.
async fn egress_agent_ready(
    egresses: &Api<TailnetEgress>,
    pods: &Api<Pod>,
    operator: &OperatorProcess,
) -> (String, u16, String) {
    let ready = wait_for_condition(
        egresses,
        "site",
        ConditionIs::new("TargetsReachable", "True").reason("Reachable"),
        Some(operator),
    )
    .await;
    let status = ready.status.clone().unwrap_or_default();
    let db = status
        .targets
        .iter()
        .find(|t| t.name == "remote-db")
        .expect("remote-db status");
    let cluster_ip = db.cluster_ip.clone().expect("remote-db ClusterIP");
    let agent_port = u16::try_from(db.agent_port).expect("agent port");
    let egress_ip = wait_for("the egress agent pod Ready", WAIT, || async {
        let found = agent_pods(pods, "tailnet-egress-site")
            .await
            .map_err(|e| e.to_string())?;
        found
            .iter()
            .find_map(|p| ready_pod_ip(p).ok())
            .ok_or_else(|| format!("{} agent pods, none Ready", found.len()))
    })
    .await;
    (cluster_ip, agent_port, egress_ip)
}

async fn consumer_reaches_the_site(
    w: &Witnesses<'_>,
    consumer: &E2eNamespace<'_>,
    cluster_ip: &str,
    target: &str,
) {
    let &Witnesses { consumer_netns, .. } = w;
    // The consumer reaches the remote site through the egress Service (ClusterIP), from its
    // pod netns and from a real client pod through cluster DNS.
    reaches(
        "the consumer pod's bytes echoed by the remote site via the egress Service",
        consumer_netns,
        addr(cluster_ip, 5432),
        b"hello-from-consumer\n",
        b"hello-from-consumer\n",
    )
    .await;
    let run = consumer
        .tcp_check("client", target, 30)
        .await
        .expect("consumer client pod");
    assert!(
        run.succeeded(),
        "a consumer pod through cluster DNS:\n{run}"
    );
}

async fn outsider_network_works(w: &Witnesses<'_>, egress_ip: &str, consumer_ip: &str) {
    let &Witnesses {
        outsider_netns,
        metrics_request,
        ..
    } = w;
    // Positive witnesses for the outsider: its network works, to the agent pod itself (the
    // metrics port is open to every peer) and to a pod of another namespace.
    reaches(
        "the outsider pod reaching the egress agent's metrics port",
        outsider_netns,
        addr(egress_ip, ADMIN_PORT),
        metrics_request,
        b"tailnet_agent_",
    )
    .await;
    reaches(
        "the outsider pod reaching the consumer's echo pod",
        outsider_netns,
        addr(consumer_ip, 8080),
        b"ping-from-outsider\n",
        b"ping-from-outsider\n",
    )
    .await;
}

async fn outsider_does_not_reach_the_egress(
    w: &Witnesses<'_>,
    outsider: &E2eNamespace<'_>,
    cluster_ip: &str,
    egress_ip: &str,
    agent_port: u16,
    target: &str,
) {
    let &Witnesses {
        env,
        consumer_netns,
        outsider_netns,
        ..
    } = w;
    // The outsider does not reach the egress: neither through the Service nor straight at the
    // agent's listener port, and the agent sees no connection (nothing reaches the site).
    let listener = ["listener=\"remote-db\""];
    let connections = |text: &str| metric_sum(text, "tailnet_agent_connections_total", &listener);
    let before = connections(&agent_metrics(env, egress_ip).await.expect("agent metrics"));
    let via_service = denied(
        "an outsider pod to the egress Service",
        outsider_netns,
        addr(cluster_ip, 5432),
        b"hello-from-outsider\n",
        b"hello-from-outsider\n",
    )
    .await;
    let direct = denied(
        "an outsider pod to the egress agent's listener port",
        outsider_netns,
        addr(egress_ip, agent_port),
        b"hello-from-outsider\n",
        b"hello-from-outsider\n",
    )
    .await;
    let run = outsider
        .tcp_check("client", target, 3)
        .await
        .expect("outsider client pod");
    assert!(
        !run.succeeded(),
        "an outsider pod through cluster DNS got through:\n{run}"
    );
    let after = connections(&agent_metrics(env, egress_ip).await.expect("agent metrics"));
    eprintln!(
        "outsider → egress Service: {via_service:?}; → agent {egress_ip}:{agent_port}: {direct:?}; agent connections {before} → {after}"
    );
    assert_eq!(
        before, after,
        "the agent accepted connections from the outsider namespace"
    );
    // The consumer still gets through, and the agent counts it: the counter is live.
    reaches(
        "the consumer pod again",
        consumer_netns,
        addr(cluster_ip, 5432),
        b"again\n",
        b"again\n",
    )
    .await;
    let counted = connections(&agent_metrics(env, egress_ip).await.expect("agent metrics"));
    assert!(
        counted > after,
        "the agent did not count the consumer ({after} → {counted})"
    );
}

async fn ingress_agent_only_on_metrics(
    w: &Witnesses<'_>,
    ingresses: &Api<TailnetIngress>,
    pods: &Api<Pod>,
    operator: &OperatorProcess,
) {
    let &Witnesses {
        env,
        consumer_netns,
        outsider_netns,
        metrics_request,
        ..
    } = w;
    let netns_of =
        |pod: &Pod| Arc::new(env.pod_netns(pod.metadata.uid.as_deref().expect("pod uid")));
    // The ingress agent: reachable over the tailnet, in-cluster only on its metrics port.
    let ingress = wait_for(
        "the ingress node online with its grants live",
        WAIT,
        || async {
            let i = ingresses.get("db").await.map_err(|e| e.to_string())?;
            if ConditionIs::new("NodeOnline", "True").holds_for(&i)
                && ConditionIs::new("PolicyEffective", "True").holds_for(&i)
            {
                Ok(i)
            } else {
                Err(format!(
                    "{}\n--- operator ---\n{}",
                    i.describe(),
                    operator.log_tail(10)
                ))
            }
        },
    )
    .await;
    let tailnet_ip = tailnet_ipv4(&ingress.status.clone().unwrap_or_default().tailnet_ips)
        .expect("ingress tailnet IPv4");
    let laptop = env.tailnet().laptop.node.local_api();
    wait_for("the tcp expose to echo for the laptop", WAIT, || async {
        tcp_echo(&laptop, &tailnet_ip, INGRESS_PORT).await
    })
    .await;
    let ingress_pod = wait_for("the ingress agent pod Ready", WAIT, || async {
        let found = agent_pods(pods, "tailnet-ingress-db")
            .await
            .map_err(|e| e.to_string())?;
        found
            .into_iter()
            .find(|p| ready_pod_ip(p).is_ok())
            .ok_or_else(|| "no Ready ingress agent pod".to_string())
    })
    .await;
    let ingress_ip = ready_pod_ip(&ingress_pod).expect("ingress pod IP");
    let ingress_netns = netns_of(&ingress_pod);
    // The witness listener on the agent pod's IP at the expose port, counting what it accepts
    // and echoing it.
    let witness: TcpListener = ingress_netns
        .bind_tcp(addr(&ingress_ip, INGRESS_PORT))
        .expect("witness listener in the ingress agent pod");
    let accepted = Arc::new(AtomicUsize::new(0));
    {
        let accepted = accepted.clone();
        std::thread::spawn(move || {
            for mut stream in witness.incoming().flatten() {
                accepted.fetch_add(1, Ordering::SeqCst);
                let mut buffer = [0u8; 256];
                if let Ok(n) = stream.read(&mut buffer) {
                    let _ = stream.write_all(&buffer[..n]);
                }
            }
        });
    }
    // The node itself (the lab netns, like a kubelet's probe) reaches the witness: it is there.
    reaches(
        "the node reaching the witness listener on the ingress pod",
        &Arc::new(Netns::adopt(env.lab().netns().name())),
        addr(&ingress_ip, INGRESS_PORT),
        b"from-node\n",
        b"from-node\n",
    )
    .await;
    let from_node = accepted.load(Ordering::SeqCst);
    for (who, netns) in [("consumer", &consumer_netns), ("outsider", &outsider_netns)] {
        reaches(
            &format!("the {who} pod reaching the ingress agent's metrics port"),
            netns,
            addr(&ingress_ip, ADMIN_PORT),
            metrics_request,
            b"tailnet_agent_",
        )
        .await;
        let seen = denied(
            &format!("the {who} pod to the ingress agent's port {INGRESS_PORT}"),
            netns,
            addr(&ingress_ip, INGRESS_PORT),
            b"from-pod\n",
            b"from-pod\n",
        )
        .await;
        eprintln!("{who} → ingress {ingress_ip}:{INGRESS_PORT}: {seen:?}");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        from_node,
        "the witness listener accepted a pod's connection"
    );
}
