//! Forged agent pods (issue 14.2): anyone who can create pods in a TailnetIngress's namespace
//! can copy the agent's labels. The operator must read `/status` only from the pod of the
//! agent Deployment it applied (owner chain Pod → ReplicaSet → Deployment, by uid), and never
//! without a size cap. Two forgeries next to a real ingress whose backend has no pods: one
//! claims every backend is reachable, one answers with a 1 GiB body. The status stays
//! truthful (BackendsReachable stays False, as the real agent reports) while the ingress is
//! reconciled many times, and the operator's memory stays flat.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::json;
use support::conditions::{ConditionIs, WithConditions};
use support::lab_operator::{reconciles, start_operator};
use support::objects::{apply, bootstrap_applied_tailnet, ingress_object, service_object};
use support::wait::{WAIT, wait_for};
use tailnet_api::TailnetIngress;
use tailnet_api::agent_config::ADMIN_PORT;
use tailnet_api::agent_status::{ProbeState, ProbeView, StatusReport};
use tno_testenv::{E2eEnv, OperatorArgs};

/// The operator's resident memory (kB) from /proc. A failed read fails the test: a zero would
/// let the memory check pass without measuring anything.
fn rss_kib(pid: u32) -> u64 {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading the operator's RSS from {path}: {e}"));
    parse_vm_rss(&status).unwrap_or_else(|| panic!("no VmRSS line in {path}:\n{status}"))
}

/// `VmRSS:   123456 kB` → 123456; `None` without a parsable, non-zero value (a live process
/// always has resident pages).
fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .filter(|kib| *kib > 0)
}

#[test]
fn rss_is_read_or_refused() {
    assert_eq!(
        parse_vm_rss("Name:\ttailnet-operator\nVmRSS:\t  52344 kB\n"),
        Some(52344)
    );
    assert_eq!(
        parse_vm_rss("Name:\tzombie\n"),
        None,
        "kernel threads and zombies"
    );
    assert_eq!(parse_vm_rss("VmRSS:\t0 kB\n"), None);
    assert_eq!(parse_vm_rss("VmRSS:\tlots kB\n"), None);
}

/// The first `limit` bytes `GET /status` answers on `ip`'s admin port, from the lab network.
async fn first_bytes(env: &E2eEnv, ip: &str, limit: usize) -> Result<String, String> {
    let addr: std::net::SocketAddr = format!("{ip}:{ADMIN_PORT}")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let lab = env.lab().clone();
    tokio::task::spawn_blocking(move || {
        let mut stream = lab
            .netns()
            .connect_tcp(addr, Duration::from_secs(5))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"GET /status HTTP/1.0\r\nHost: agent\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut buffer = vec![0u8; limit];
        let mut read = 0;
        while read < limit {
            match stream.read(&mut buffer[read..]) {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(String::from_utf8_lossy(&buffer[..read]).to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}

/// A Deployment whose pods carry the agent's labels (plus one of its own for its selector):
/// a bare pod with only the agent's labels would be adopted and deleted by the agent's
/// ReplicaSet, one with its own controller is not (that is how a forger keeps it running).
fn forged_deployment(
    name: &str,
    labels: &std::collections::BTreeMap<String, String>,
    args: serde_json::Value,
) -> serde_json::Value {
    let mut pod_labels = labels.clone();
    pod_labels.insert("forged".into(), name.into());
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"forged": name}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {"containers": [{
                    "name": "forger",
                    "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE,
                    "args": args
                }]}
            }
        }
    })
}

async fn running_ip(pods: &Api<Pod>, name: &str) -> String {
    wait_for(&format!("the pod of {name} running"), WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("forged={name}")))
            .await
            .map_err(|e| e.to_string())?;
        let running = list.items.iter().find_map(|pod| {
            let status = pod.status.clone().unwrap_or_default();
            match (status.phase.as_deref(), status.pod_ip) {
                (Some("Running"), Some(ip)) => Some(ip),
                _ => None,
            }
        });
        running.ok_or_else(|| format!("{} pods, none running", list.items.len()))
    })
    .await
}

/// Ingress reconciles counted by the operator (a failed scrape fails the test).
async fn ingress_reconciles(operator: &tno_testenv::OperatorProcess) -> f64 {
    reconciles(operator, "ingress").await
}

/// Holds for at least `reconciles` more ingress reconciles: BackendsReachable is never True
/// (what the forgeries claim). Returns the highest operator RSS seen.
async fn stays_truthful(
    what: &str,
    operator: &tno_testenv::OperatorProcess,
    ingresses: &Api<TailnetIngress>,
    reconciles: f64,
) -> u64 {
    let start = ingress_reconciles(operator).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut peak = 0;
    loop {
        let ingress = ingresses.get("shop").await.expect("ingress");
        let reachable = ingress.condition("BackendsReachable").cloned();
        assert!(
            reachable.as_ref().is_some_and(|c| c.status != "True"),
            "{what}: the operator took a forged report: {}",
            ingress.describe()
        );
        peak = peak.max(rss_kib(operator.pid()));
        let done = ingress_reconciles(operator).await - start;
        if done >= reconciles {
            eprintln!(
                "{what}: {done} ingress reconciles, BackendsReachable {reachable:?}, peak RSS {peak} kB"
            );
            return peak;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: only {done} ingress reconciles in 90 s (the witness that the window contained reconciles)"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_agent_pods_neither_lie_nor_exhaust_the_operator() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("fa").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let tailnet_name = bootstrap_applied_tailnet(&env, &ops).await;
    let operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");

    // A tcp ingress whose backend Service has no pods: the real agent's probe fails.
    apply(
        &Api::<Service>::namespaced(client.clone(), &ns),
        "db",
        service_object(&ns, "db", 5432),
    )
    .await
    .expect("backend Service");
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), &ns);
    apply(
        &ingresses,
        "shop",
        ingress_object(
            &ns,
            "shop",
            &tailnet_name,
            None,
            json!([{"name": "db", "dnsLabel": "shop-db", "mode": "tcp", "port": 5432, "backend": {"service": "db", "port": 5432}}]),
        ),
    )
    .await
    .expect("ingress");
    let agent_up = ConditionIs::new("AgentReady", "True");
    let unreachable = ConditionIs::new("BackendsReachable", "False");
    wait_for(
        "the real agent reporting the backend unreachable",
        WAIT,
        || async {
            let i = ingresses.get("shop").await.map_err(|e| e.to_string())?;
            if agent_up.holds_for(&i) && unreachable.holds_for(&i) {
                Ok(())
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

    // The forger copies the real agent pod's labels.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let real = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=tailnet-agent,!forged"))
        .await
        .expect("agent pods")
        .items;
    assert_eq!(real.len(), 1, "one real agent pod");
    let labels = real[0].labels().clone();

    // 1. A pod that claims every backend answers (sorted before the real pod by name).
    let lie = StatusReport {
        ready: true,
        reasons: Vec::new(),
        tailnet: Default::default(),
        listeners: Vec::new(),
        targets: Vec::new(),
        backends: vec![ProbeView {
            name: "db".into(),
            address: format!("db.{ns}.svc.cluster.local:5432"),
            state: ProbeState::Reachable,
            message: String::new(),
            last_probe: None,
        }],
        certificate: Default::default(),
        config: Default::default(),
    };
    let lie_json = serde_json::to_string(&lie).expect("report");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    apply(
        &deployments,
        "aaa-forged-liar",
        forged_deployment(
            "aaa-forged-liar",
            &labels,
            json!([
                "forged-status",
                "--listen",
                format!("0.0.0.0:{ADMIN_PORT}"),
                "--body",
                lie_json
            ]),
        ),
    )
    .await
    .expect("liar Deployment");
    let liar_ip = running_ip(&pods, "aaa-forged-liar").await;
    // Positive witness: the forgery is up and serves its lie where the operator would look.
    let answer = first_bytes(&env, &liar_ip, 4096)
        .await
        .expect("liar answers");
    assert!(
        answer.contains("\"reachable\"") || answer.contains("Reachable"),
        "{answer}"
    );
    let rss_before = rss_kib(operator.pid());
    stays_truthful("with a lying pod", &operator, &ingresses, 6.0).await;

    // 2. A pod whose /status is 1 GiB (sorted first of all).
    apply(
        &deployments,
        "aaa-forged-huge",
        forged_deployment(
            "aaa-forged-huge",
            &labels,
            json!([
                "forged-status",
                "--listen",
                format!("0.0.0.0:{ADMIN_PORT}"),
                "--huge-bytes",
                "1073741824"
            ]),
        ),
    )
    .await
    .expect("huge Deployment");
    let huge_ip = running_ip(&pods, "aaa-forged-huge").await;
    let answer = first_bytes(&env, &huge_ip, 1024)
        .await
        .expect("huge answers");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let peak = stays_truthful("with a 1 GiB pod", &operator, &ingresses, 6.0).await;
    let growth_mib = peak.saturating_sub(rss_before) / 1024;
    eprintln!(
        "operator RSS before the forgeries {rss_before} kB, peak {peak} kB (+{growth_mib} MiB)"
    );
    assert!(
        growth_mib < 64,
        "operator RSS grew by {growth_mib} MiB next to a pod with a 1 GiB /status"
    );
    // The real agent's report is still read: the backend's probe result comes through.
    let ingress = ingresses.get("shop").await.expect("ingress");
    let reachable = ingress
        .condition("BackendsReachable")
        .expect("BackendsReachable");
    assert_ne!(reachable.reason, "NotObserved", "{}", ingress.describe());
}
