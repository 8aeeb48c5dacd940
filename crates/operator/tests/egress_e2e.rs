//! Egress end to end: the operator (in the lab, like a pod), a real agent pod (containerboot +
//! tailscaled + tailnet-agent) and real Headscale. A pod connects to
//! `remote-db.<ns>.svc.cluster.local:5432` and its bytes reach the echo server at
//! 192.0.2.10:5432 behind the site's subnet router. A 100 MiB transfer through the egress
//! comes back byte-identical, and its throughput is printed next to a direct LocalAPI dial of
//! the same target from the laptop node (never asserted: tests do not assert speed). Once bytes
//! crossed, `promtool check metrics` lints the live `/metrics` of the operator and the agent.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::agent::{agent_metrics, metric_sum, ready_pod_ip};
use support::conditions::{ConditionIs, WithConditions, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{agent_pods, apply, apply_egress, pod_uids, tailnet_name};
use support::tailnet::dial;
use support::wait::{WAIT, wait_for};
use tailnet_api::TailnetEgress;
use tailnet_api::egress::TailnetEgressStatus;
use tno_testenv::{
    CLIENT_POD_DEADLINE, E2eEnv, E2eNamespace, OperatorArgs, OperatorProcess, http_body,
    promtool_check_metrics, tls_check_pod,
};
use tno_testenv_tailnet::{SITE_API_NAME, SITE_BANNER_TEXT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// CoreDNS's own ConfigMap in the test env (its `hosts` key is served by the `hosts` plugin).
const COREDNS_CONFIG_MAP: &str = "coredns";
const COREDNS_NAMESPACE: &str = "kube-system";
/// The bulk transfer: 100 MiB, seed 1 (see `tno-test-servers tcp-bulk`).
const BULK_BYTES: usize = 100 * 1024 * 1024;
const BULK_SEED: u64 = 1;
const BULK_TIMEOUT: Duration = Duration::from_secs(180);

/// The egress's two targets; `extra` are added after them.
fn site_targets(extra: &[Value]) -> Value {
    let mut targets = vec![
        json!({"name": "remote-db", "address": "192.0.2.10", "port": 5432, "probe": {"interval": "2s"}}),
        json!({"name": "remote-api", "address": "198.51.100.20", "port": 443, "aliases": ["api.site.example.net"]}),
    ];
    targets.extend(extra.iter().cloned());
    Value::Array(targets)
}

/// The stream `tno-test-servers tcp-bulk` sends for `seed`: word `i` (8 bytes, little endian)
/// is splitmix64 of `seed ^ i * golden`.
fn bulk_payload(seed: u64, len: usize) -> Vec<u8> {
    fn splitmix64(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let mut payload = Vec::with_capacity(len.div_ceil(8) * 8);
    for index in 0..len.div_ceil(8) as u64 {
        payload.extend_from_slice(
            &splitmix64(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes(),
        );
    }
    payload.truncate(len);
    payload
}

use tailnet_api::digest::sha256_hex;

fn mib_per_s(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / seconds.max(1e-9)
}

/// Writes `payload` to `stream` while reading as many bytes back; returns them and the seconds
/// from the first write to the last byte read. The write half stays open until then.
async fn echo_transfer<S>(stream: S, payload: &[u8]) -> std::io::Result<(Vec<u8>, f64)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    let started = std::time::Instant::now();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let send = async {
        for chunk in payload.chunks(64 * 1024) {
            writer.write_all(chunk).await?;
        }
        writer.flush().await
    };
    let receive = async {
        let mut received = vec![0u8; payload.len()];
        let mut filled = 0;
        while filled < received.len() {
            let read = reader.read(&mut received[filled..]).await?;
            if read == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("closed after {filled} of {} bytes", payload.len()),
                ));
            }
            filled += read;
        }
        Ok(received)
    };
    let ((), received) = tokio::try_join!(send, receive)?;
    Ok((received, started.elapsed().as_secs_f64()))
}

/// A pod running `tno-test-servers tcp-bulk` against `target`.
fn tcp_bulk_pod(name: &str, target: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "e2e-client"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "client",
                "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE,
                "args": [
                    "tcp-bulk", "--target", target,
                    "--bytes", BULK_BYTES.to_string(),
                    "--seed", BULK_SEED.to_string(),
                    "--timeout-secs", BULK_TIMEOUT.as_secs().to_string(),
                ],
            }],
        },
    })
}

/// `mib_per_s` of the `bulk: ok bytes=N seconds=S mib_per_s=X ...` line, if the line says
/// `ok` for exactly `bytes`.
fn parse_bulk_line(log: &str, bytes: usize) -> Option<f64> {
    let line = log.lines().find(|l| l.starts_with("bulk: ok "))?;
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
    };
    if field("bytes")?.parse::<usize>().ok()? != bytes || field("identical")? != "true" {
        return None;
    }
    field("mib_per_s")?.parse().ok()
}

/// What is wrong with an egress agent's NetworkPolicy: it must select the agent pod, restrict
/// ingress, give every rule numbered ports (no ports opens every port; a named port or a range
/// cannot be checked against the listeners), open ports to any peer (no or empty `from`) only
/// for the admin port (metrics), and open the listener ports only to `consumers` (by namespace
/// name) — each listener port to all of them.
fn network_policy_problems(
    policy: &NetworkPolicy,
    consumers: &[String],
    listener_ports: &[i32],
    agent_labels: &BTreeMap<String, String>,
) -> Vec<String> {
    let admin = i32::from(tailnet_api::agent_config::ADMIN_PORT);
    let mut problems = Vec::new();
    let Some(spec) = policy.spec.as_ref() else {
        return vec!["no spec".into()];
    };
    let selector = spec
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    if selector.is_empty() || selector.iter().any(|(k, v)| agent_labels.get(k) != Some(v)) {
        problems.push(format!(
            "podSelector {selector:?} does not select the agent pod {agent_labels:?}"
        ));
    }
    if !spec.policy_types.iter().flatten().any(|t| t == "Ingress") {
        problems.push(format!(
            "policyTypes {:?} without Ingress",
            spec.policy_types
        ));
    }
    let mut covered: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for (index, rule) in spec.ingress.iter().flatten().enumerate() {
        let ports = rule.ports.clone().unwrap_or_default();
        if ports.is_empty() {
            problems.push(format!(
                "rule {index} has no ports: every port is open to its peers"
            ));
        }
        let mut numbers = Vec::new();
        for port in &ports {
            match (&port.port, port.end_port) {
                (Some(IntOrString::Int(number)), None) => numbers.push(*number),
                (Some(IntOrString::Int(number)), Some(end)) => {
                    problems.push(format!("rule {index} opens the range {number}-{end}"))
                }
                (Some(IntOrString::String(name)), _) => {
                    problems.push(format!("rule {index} opens the named port {name:?}"))
                }
                (None, _) => {
                    problems.push(format!("rule {index} opens every {:?} port", port.protocol))
                }
            }
        }
        let peers = rule.from.clone().unwrap_or_default();
        if peers.is_empty() {
            // Open to every pod and address: only the admin port may be.
            if ports.is_empty()
                || numbers.iter().any(|p| *p != admin)
                || numbers.len() != ports.len()
            {
                problems.push(format!(
                    "rule {index} opens {:?} to any peer (only the admin port {admin} may be)",
                    rule.ports
                ));
            }
            continue;
        }
        let mut namespaces = Vec::new();
        for peer in &peers {
            let by_name = peer.namespace_selector.as_ref().map(|s| {
                let expressions = s.match_expressions.clone().unwrap_or_default();
                let only_names = s.match_labels.as_ref().is_none_or(|l| l.is_empty())
                    && !expressions.is_empty()
                    && expressions
                        .iter()
                        .all(|e| e.key == "kubernetes.io/metadata.name" && e.operator == "In");
                (
                    only_names,
                    expressions
                        .iter()
                        .flat_map(|e| e.values.clone().unwrap_or_default())
                        .collect::<Vec<_>>(),
                )
            });
            match by_name {
                Some((true, names)) if peer.ip_block.is_none() && peer.pod_selector.is_none() => {
                    namespaces.extend(names)
                }
                _ => problems.push(format!(
                    "rule {index} has a peer other than consumer namespaces by name: {peer:?}"
                )),
            }
        }
        if let Some(outsider) = namespaces.iter().find(|n| !consumers.contains(n)) {
            problems.push(format!(
                "rule {index} admits namespace {outsider} (consumers: {consumers:?})"
            ));
        }
        for number in numbers {
            covered
                .entry(number)
                .or_default()
                .extend(namespaces.clone());
        }
    }
    for port in listener_ports {
        let admitted = covered.get(port).cloned().unwrap_or_default();
        if consumers.iter().any(|c| !admitted.contains(c)) {
            problems.push(format!(
                "listener port {port} open to {admitted:?}, not to every consumer {consumers:?}"
            ));
        }
    }
    problems
}

/// Copies of a good egress NetworkPolicy with one hole each, to show that
/// [`network_policy_problems`] finds them.
fn broken_policies(
    good: &NetworkPolicy,
    listener_ports: &[i32],
) -> Vec<(&'static str, NetworkPolicy)> {
    let mut broken = Vec::new();
    fn rules(policy: &mut NetworkPolicy) -> &mut Vec<NetworkPolicyIngressRule> {
        policy
            .spec
            .as_mut()
            .and_then(|s| s.ingress.as_mut())
            .expect("rules")
    }
    let is_listener_rule = |rule: &NetworkPolicyIngressRule| {
        rule.ports
            .iter()
            .flatten()
            .any(|p| matches!(&p.port, Some(IntOrString::Int(n)) if listener_ports.contains(n)))
    };
    let mut all_ports = good.clone();
    for rule in rules(&mut all_ports)
        .iter_mut()
        .filter(|r| is_listener_rule(r))
    {
        rule.ports = None;
    }
    broken.push(("a consumer rule without ports (all ports)", all_ports));
    let mut any_peer = good.clone();
    for rule in rules(&mut any_peer)
        .iter_mut()
        .filter(|r| is_listener_rule(r))
    {
        rule.from = Some(Vec::new());
    }
    broken.push(("the listener ports open to any peer (empty from)", any_peer));
    let mut extra = good.clone();
    rules(&mut extra).push(NetworkPolicyIngressRule {
        from: None,
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::String("main".into())),
            protocol: Some("TCP".into()),
            end_port: None,
        }]),
    });
    broken.push(("a named port open to any peer (no from)", extra));
    let mut everything = good.clone();
    rules(&mut everything).push(NetworkPolicyIngressRule::default());
    broken.push(("a rule with neither ports nor peers", everything));
    broken
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_reaches_the_remote_site_through_the_tailnet() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("eg").await.expect("operator namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    // The base policy plus a grant for the laptop (alice, group:team-a) to the echo target, so
    // the operator's live policy lets the direct LocalAPI dial through for the comparison.
    let mut base_policy: serde_json::Value =
        serde_json::from_str(&env.base_policy().expect("base policy")).expect("base policy JSON");
    base_policy["grants"]
        .as_array_mut()
        .expect("grants in the base policy")
        .push(json!({"src": ["group:team-a"], "dst": ["192.0.2.10/32"], "ip": ["tcp:5432"]}));
    ops.create_bootstrap(&serde_json::to_string_pretty(&base_policy).expect("policy text"))
        .await
        .expect("bootstrap");
    let tailnet_name = tailnet_name(&ns);
    let tailnets: Api<tailnet_api::Tailnet> = Api::all(client.clone());
    // The DNS entries go into CoreDNS's own ConfigMap (key `hosts`, which the test env's
    // CoreDNS serves with its `hosts` plugin), as docs/dns.md tells users to wire it.
    let tailnet_object = |mode: &str| {
        let mut object = env.tailnet_object(&tailnet_name, mode);
        object["spec"]["dns"]["hostsConfigMap"] = json!(COREDNS_CONFIG_MAP);
        object["spec"]["dns"]["hostsConfigMapNamespace"] = json!(COREDNS_NAMESPACE);
        object
    };
    apply(&tailnets, &tailnet_name, tailnet_object("DryRun"))
        .await
        .expect("Tailnet");
    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");

    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), &ns);
    apply_egress(&egresses, &ns, "site", &tailnet_name, site_targets(&[]))
        .await
        .expect("egress");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let target = format!("remote-db.{ns}.svc.cluster.local:5432");
    let site = Site {
        env: &env,
        ops: &ops,
        client: &client,
        ns: &ns,
        tailnet_name: &tailnet_name,
        egresses: &egresses,
        pods: &pods,
        target: &target,
        operator: &operator,
    };
    dry_run_refuses(&site).await;
    // Apply: nothing is restarted; the grant and route approval make it work.
    apply(&tailnets, &tailnet_name, tailnet_object("Apply"))
        .await
        .expect("Tailnet to Apply");
    let (status, node_id) = ready_and_bytes_cross(&site).await;
    live_scrapes_pass_promtool(&site).await;
    bulk_transfer_and_direct_dial(&site).await;
    auth_secret_gone_and_alias_served(&site, &status).await;
    network_policy_opens_only_what_it_must(&site, &status).await;
    steady_state_writes_nothing(&site).await;
    drift_is_repaired(&site).await;
    a_new_target_is_picked_up(&site).await;
    a_restarted_agent_keeps_its_identity(&site, &node_id).await;
    a_hand_tagged_device_is_a_tag_conflict(&site, &node_id).await;
    a_foreign_service_is_left_alone(&site).await;
    deletion_cleans_up(&site).await;
    operator.terminate().await.expect("operator stops cleanly");
}

/// What every phase of the scenario works with.
struct Site<'a> {
    env: &'a E2eEnv,
    ops: &'a E2eNamespace<'a>,
    client: &'a kube::Client,
    ns: &'a str,
    tailnet_name: &'a str,
    egresses: &'a Api<TailnetEgress>,
    pods: &'a Api<Pod>,
    /// remote-db's Service, as a client pod dials it.
    target: &'a str,
    operator: &'a OperatorProcess,
}

async fn dry_run_refuses(site: &Site<'_>) {
    let &Site {
        env,
        ops,
        egresses,
        pods,
        target,
        ..
    } = site;
    // DryRun: the agent runs, but the grant is not live, so the egress is not effective and
    // connections fail.
    let dry = wait_for_condition(
        egresses,
        "site",
        ConditionIs::new("PolicyEffective", "False").reason("DryRun"),
        None,
    )
    .await;
    assert_eq!(
        dry.condition("Ready").map(|c| c.status.as_str()),
        Some("False")
    );
    // The failure must be the agent's refusal, not a missing listener: first its pod is Ready
    // (a Service endpoint) with the remote-db listener up; then its metrics count the client's
    // connections as accepted, each with a failed tailnet dial.
    let listener = ["listener=\"remote-db\""];
    let (agent_ip, dry_metrics) = wait_for(
        "the DryRun egress agent Ready with its remote-db listener up",
        WAIT,
        || async {
            let found = agent_pods(pods, "tailnet-egress-site")
                .await
                .map_err(|e| e.to_string())?;
            let ip = found
                .iter()
                .find_map(|p| ready_pod_ip(p).ok())
                .ok_or_else(|| {
                    let why: Vec<_> = found.iter().filter_map(|p| ready_pod_ip(p).err()).collect();
                    format!("no Ready agent pod: {why:?}")
                })?;
            let metrics = agent_metrics(env, &ip).await?;
            match metric_sum(&metrics, "tailnet_agent_listener_up", &listener) {
                1.0 => Ok((ip, metrics)),
                up => Err(format!("listener_up {{listener=\"remote-db\"}} = {up}")),
            }
        },
    )
    .await;
    let accepted_before = metric_sum(&dry_metrics, "tailnet_agent_connections_total", &listener);
    let failed_before = metric_sum(&dry_metrics, "tailnet_agent_dial_failures_total", &listener);
    let run = ops
        .tcp_check("client-dry", target, 3)
        .await
        .expect("client pod in DryRun");
    assert!(
        !run.succeeded(),
        "DryRun must not let traffic through:\n{run}"
    );
    let dry_after = agent_metrics(env, &agent_ip)
        .await
        .expect("agent metrics after the DryRun client");
    let accepted =
        metric_sum(&dry_after, "tailnet_agent_connections_total", &listener) - accepted_before;
    let failed =
        metric_sum(&dry_after, "tailnet_agent_dial_failures_total", &listener) - failed_before;
    let reasons: Vec<&str> = dry_after
        .lines()
        .filter(|l| l.starts_with("tailnet_agent_dial_failures_total") && l.contains(listener[0]))
        .collect();
    eprintln!(
        "DryRun client: agent accepted {accepted} connections, {failed} tailnet dials failed: {reasons:?}"
    );
    assert!(
        accepted >= 1.0 && failed == accepted,
        "in DryRun the agent must accept the client's connections and fail their tailnet dials: {accepted} accepted, {failed} dials failed\n{run}"
    );
}

/// Returns the egress's status once Ready and its node's id.
async fn ready_and_bytes_cross(site: &Site<'_>) -> (TailnetEgressStatus, String) {
    let &Site {
        env,
        ops,
        ns,
        egresses,
        target,
        operator,
        ..
    } = site;
    // Every precondition turns true: tailnet, Services, agent, node, grants, routes.
    let ready = wait_for_condition(
        egresses,
        "site",
        ConditionIs::new("Ready", "True"),
        Some(operator),
    )
    .await;
    let status = ready.status.clone().unwrap_or_default();
    let db = status
        .targets
        .iter()
        .find(|t| t.name == "remote-db")
        .expect("remote-db status");
    assert_eq!(db.route.as_deref(), Some("192.0.2.0/24"));
    assert!(db.cluster_ip.is_some() && db.agent_port >= 10000, "{db:?}");
    assert_eq!(status.tailnet_ips.len(), 2, "{status:?}");
    let node_id = status.node_id.clone().expect("node id");

    // The agent's probes reach both targets through the tailnet.
    wait_for_condition(
        egresses,
        "site",
        ConditionIs::new("TargetsReachable", "True").reason("Reachable"),
        None,
    )
    .await;

    // The bytes cross the tailnet: a pod uses the Service like any other.
    let run = ops
        .tcp_check("client-1", target, 30)
        .await
        .expect("client pod");
    assert!(
        run.succeeded(),
        "echo through the egress failed:\n{run}\n{}",
        env.diagnostics(Some(ns))
    );
    tailscaled_logged_in_over_the_lab_ca(site).await;
    (status, node_id)
}

/// `promtool check metrics` on live scrapes of the operator and of the egress agent, whose
/// listener has just carried bytes and whose probes ran: zero problems (a family without HELP
/// fails here), and neither scrape is empty: counters with labels, `build_info` and the
/// process metrics are there.
async fn live_scrapes_pass_promtool(site: &Site<'_>) {
    let &Site {
        env,
        pods,
        operator,
        ..
    } = site;
    let operator_text = operator.metrics().await.expect("operator /metrics");
    let agents = agent_pods(pods, "tailnet-egress-site")
        .await
        .expect("agent pods");
    let pod_ip = agents
        .iter()
        .find_map(|pod| ready_pod_ip(pod).ok())
        .expect("a Ready agent pod");
    let response = agent_metrics(env, &pod_ip).await.expect("agent /metrics");
    let agent_text = http_body(&response).expect("an HTTP response with a body");
    let scrapes = [
        (
            "operator",
            operator_text.as_str(),
            &[
                "tailnet_operator_reconciles_total{",
                "tailnet_operator_headscale_api_calls_total{",
                "tailnet_operator_child_applies_total{",
                "tailnet_operator_policy_syncs_total{",
                "tailnet_operator_reconciles_in_flight{",
                "tailnet_operator_build_info{version=",
                "process_cpu_seconds_total ",
                "process_resident_memory_bytes ",
                "process_open_fds ",
                "process_start_time_seconds ",
            ][..],
        ),
        (
            "agent",
            agent_text,
            &[
                "tailnet_agent_connections_total{",
                "tailnet_agent_bytes_total{",
                "tailnet_agent_probes_total{",
                "tailnet_agent_build_info{version=",
                "process_cpu_seconds_total ",
                "process_resident_memory_bytes ",
            ][..],
        ),
    ];
    for (who, text, samples) in scrapes {
        for sample in samples {
            assert!(
                text.lines().any(|line| line.starts_with(sample)),
                "{who} /metrics has no {sample}… sample:\n{text}"
            );
        }
        if let Err(problems) = promtool_check_metrics(text) {
            panic!("{who} /metrics: {problems}\n--- scrape ---\n{text}");
        }
        println!(
            "promtool check metrics: the {who}'s live /metrics ({} lines, {} HELP): no problems",
            text.lines().count(),
            text.lines().filter(|l| l.starts_with("# HELP ")).count()
        );
    }
}

/// The agent's tailscaled fetched the control key from the HTTPS Headscale (a TLS connection
/// verified against the lab CA the operator mounted from `spec.serverCA`; the system roots do
/// not know that CA) and logged in: its own log says so.
async fn tailscaled_logged_in_over_the_lab_ca(site: &Site<'_>) {
    let pods = agent_pods(site.pods, "tailnet-egress-site")
        .await
        .expect("agent pods");
    let pod = pods
        .first()
        .and_then(|p| p.metadata.name.clone())
        .expect("agent pod");
    let log = site.ops.container_log(&pod, "tailscale");
    let wanted = format!("control server key from {}", site.env.headscale_url());
    let line = log
        .lines()
        .find(|l| l.contains(&wanted))
        .unwrap_or_else(|| panic!("no {wanted:?} in the tailscale container's log:\n{log}"));
    assert!(wanted.contains("https://"), "{wanted}");
    assert!(
        !log.contains("x509: certificate signed by unknown authority"),
        "tailscaled distrusted the lab CA:\n{log}"
    );
    println!("egress agent {pod}, tailscale container: {}", line.trim());
}

async fn bulk_transfer_and_direct_dial(site: &Site<'_>) {
    let &Site {
        env, ops, target, ..
    } = site;
    // 100 MiB through the egress come back byte-identical (the pod compares every byte).
    let run = ops
        .run_pod(
            tcp_bulk_pod("client-bulk", target),
            CLIENT_POD_DEADLINE + BULK_TIMEOUT,
        )
        .await
        .expect("bulk client pod");
    let egress_mib_per_s = parse_bulk_line(run.log("client"), BULK_BYTES);
    assert!(
        run.succeeded() && egress_mib_per_s.is_some(),
        "100 MiB through the egress did not come back identical:\n{run}"
    );
    let egress_mib_per_s = egress_mib_per_s.unwrap_or_default();

    // The same 100 MiB to the same target, dialled directly by the laptop's tailscaled
    // (LocalAPI), for a throughput figure from the same run. Byte identity is asserted (by
    // SHA-256 of sent and received); speed is only printed.
    let laptop = env.tailnet().laptop.node.local_api();
    wait_for(
        "a direct LocalAPI dial of 192.0.2.10:5432 to echo",
        WAIT,
        || async {
            let stream = dial(&laptop, "192.0.2.10", 5432, Duration::from_secs(5)).await?;
            let (echo, _) =
                tokio::time::timeout(Duration::from_secs(5), echo_transfer(stream, b"ping\n"))
                    .await
                    .map_err(|_| "echo timed out".to_string())?
                    .map_err(|e| e.to_string())?;
            if echo == b"ping\n" {
                Ok(())
            } else {
                Err(format!("echo {echo:?}"))
            }
        },
    )
    .await;
    let payload = bulk_payload(BULK_SEED, BULK_BYTES);
    let stream = dial(&laptop, "192.0.2.10", 5432, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("direct dial through the tailnet: {e}"));
    let (received, seconds) = tokio::time::timeout(BULK_TIMEOUT, echo_transfer(stream, &payload))
        .await
        .expect("direct 100 MiB transfer timed out")
        .expect("direct 100 MiB transfer");
    let sent_hash = sha256_hex(&payload);
    let received_hash = sha256_hex(&received);
    assert_eq!(received.len(), BULK_BYTES);
    assert_eq!(
        sent_hash, received_hash,
        "the direct transfer came back different"
    );
    let direct_mib_per_s = mib_per_s(BULK_BYTES, seconds);
    eprintln!(
        "throughput: egress {egress_mib_per_s:.1} MiB/s, direct LocalAPI dial {direct_mib_per_s:.1} MiB/s, ratio {:.2} (100 MiB each, sha256 {sent_hash})",
        egress_mib_per_s / direct_mib_per_s
    );
}

async fn auth_secret_gone_and_alias_served(site: &Site<'_>, status: &TailnetEgressStatus) {
    let &Site {
        env,
        ops,
        client,
        ns,
        ..
    } = site;
    // The pre-auth key is gone once the node exists; the alias is in the hosts ConfigMap.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    wait_for("the spent auth Secret to be removed", WAIT, || async {
        match secrets
            .get_opt("tailnet-egress-site-auth")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("auth Secret still there".to_string()),
        }
    })
    .await;
    let hosts: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), COREDNS_NAMESPACE);
    let api_ip = status
        .targets
        .iter()
        .find(|t| t.name == "remote-api")
        .and_then(|t| t.cluster_ip.clone())
        .expect("remote-api ClusterIP");
    wait_for("the alias in the hosts ConfigMap", WAIT, || async {
        let cm = hosts
            .get(COREDNS_CONFIG_MAP)
            .await
            .map_err(|e| e.to_string())?;
        let text = cm
            .data
            .unwrap_or_default()
            .get("hosts")
            .cloned()
            .unwrap_or_default();
        if text.contains(&format!("{api_ip} api.site.example.net")) {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;

    // A pod resolves the alias through CoreDNS, reaches 198.51.100.20:443 through the egress
    // and completes TLS with SNI api.site.example.net against the remote server's own
    // certificate: the agent forwards bytes and does not terminate TLS.
    let site = &env.tailnet().site;
    let run = ops
        .run_pod(
            tls_check_pod(
                "client-tls",
                &format!("{SITE_API_NAME}:443"),
                SITE_API_NAME,
                &site.ca_pem,
                SITE_BANNER_TEXT.trim_end(),
                60,
            ),
            CLIENT_POD_DEADLINE + Duration::from_secs(60),
        )
        .await
        .expect("TLS client pod");
    assert!(
        run.succeeded(),
        "TLS through the alias failed:\n{run}\n{}",
        env.diagnostics(Some(ns))
    );
    eprintln!("alias: {}", run.log("client").trim());
}

async fn network_policy_opens_only_what_it_must(site: &Site<'_>, status: &TailnetEgressStatus) {
    let &Site {
        client, ns, pods, ..
    } = site;
    // Only the consumer namespaces may reach the listeners (enforced by a CNI; the test env
    // has none, so the applied object is what is checked): every rule names numbered ports, a
    // rule open to any peer opens only the admin port, and the listener ports are open to
    // exactly the consumer namespaces.
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let policy = policies
        .get("tailnet-egress-site")
        .await
        .expect("the egress NetworkPolicy");
    let listener_ports: Vec<i32> = status.targets.iter().map(|t| t.agent_port).collect();
    let agent_labels = agent_pods(pods, "tailnet-egress-site")
        .await
        .expect("agent pods")
        .into_iter()
        .find_map(|p| p.metadata.labels)
        .expect("agent pod labels");
    let consumers = vec![ns.to_string()];
    let problems = network_policy_problems(&policy, &consumers, &listener_ports, &agent_labels);
    assert!(
        problems.is_empty(),
        "egress NetworkPolicy: {problems:?}\n{:?}",
        policy.spec
    );
    // The check catches what it is for: the same object with all ports, any peer, or a named
    // port open to any peer is refused.
    for (what, broken) in broken_policies(&policy, &listener_ports) {
        let found = network_policy_problems(&broken, &consumers, &listener_ports, &agent_labels);
        assert!(
            !found.is_empty(),
            "the NetworkPolicy check misses {what}: {:?}",
            broken.spec
        );
    }
}

async fn steady_state_writes_nothing(site: &Site<'_>) {
    let &Site {
        client, operator, ..
    } = site;
    // Steady state: the egress is reconciled every 2 s (the poll interval), and those
    // resyncs send nothing: no server-side apply of unchanged children, no status write.
    // Witness: the apiserver's own request counters; the operator's counter of skipped
    // applies shows the reconciles did run in the window.
    let skipped =
        "tailnet_operator_child_applies_total{kind=\"Deployment\",decision=\"unchanged\"}";
    let skipped_before = operator.metric(skipped).await.unwrap_or(0.0);
    let writes_before = tno_testenv::apiserver_writes(client)
        .await
        .expect("apiserver metrics");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let writes = tno_testenv::writes_between(
        &writes_before,
        &tno_testenv::apiserver_writes(client)
            .await
            .expect("apiserver metrics"),
    );
    let skipped_in_window = operator.metric(skipped).await.unwrap_or(0.0) - skipped_before;
    eprintln!(
        "steady state, 10 s: writes by all clients {writes:?}; unchanged Deployment applies skipped: {skipped_in_window}"
    );
    assert!(
        skipped_in_window >= 3.0,
        "the egress was not resynced in the window ({skipped_in_window} skipped applies)"
    );
    let operator_writes: Vec<&String> = writes
        .keys()
        .filter(|k| (k.starts_with("APPLY ") && !k.ends_with(" leases")) || k.contains(" tailnet"))
        .collect();
    assert!(
        operator_writes.is_empty(),
        "steady-state resyncs must not write (all writes in the window: {writes:?})"
    );
}

async fn drift_is_repaired(site: &Site<'_>) {
    let &Site { client, ns, .. } = site;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    // Drift of watched children is repaired on the next resync: a deleted NetworkPolicy and
    // a deleted target Service come back (the Service keeps its name; its ClusterIP may change).
    policies
        .delete("tailnet-egress-site", &DeleteParams::default())
        .await
        .expect("delete the egress NetworkPolicy");
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    services
        .delete("remote-db", &DeleteParams::default())
        .await
        .expect("delete the remote-db Service");
    wait_for(
        "the deleted NetworkPolicy and Service to be re-applied",
        WAIT,
        || async {
            let policy = policies
                .get_opt("tailnet-egress-site")
                .await
                .map_err(|e| e.to_string())?;
            let service = services
                .get_opt("remote-db")
                .await
                .map_err(|e| e.to_string())?;
            match (&policy, &service) {
                (Some(p), Some(s))
                    if p.metadata.deletion_timestamp.is_none()
                        && s.metadata.deletion_timestamp.is_none() =>
                {
                    Ok(())
                }
                _ => Err(format!(
                    "NetworkPolicy present: {}, Service present: {}",
                    policy.is_some(),
                    service.is_some()
                )),
            }
        },
    )
    .await;
}

async fn a_new_target_is_picked_up(site: &Site<'_>) {
    let &Site {
        ops,
        ns,
        tailnet_name,
        egresses,
        pods,
        ..
    } = site;
    // A new target is picked up by the running agent: its Service works, and the pod (with
    // its connections and node) is not replaced.
    let agent = "tailnet-egress-site";
    let before = pod_uids(&agent_pods(pods, agent).await.expect("pods"));
    apply_egress(
        egresses,
        ns,
        "site",
        tailnet_name,
        site_targets(&[json!({"name": "db-replica", "address": "192.0.2.10", "port": 5432})]),
    )
    .await
    .expect("egress with a third target");
    let run = ops
        .tcp_check(
            "client-added",
            &format!("db-replica.{ns}.svc.cluster.local:5432"),
            60,
        )
        .await
        .expect("client pod for the added target");
    assert!(run.succeeded(), "the added target does not work:\n{run}");
    let after = pod_uids(&agent_pods(pods, agent).await.expect("pods"));
    assert_eq!(
        before, after,
        "adding a target must not replace the agent pod"
    );
}

async fn a_restarted_agent_keeps_its_identity(site: &Site<'_>, node_id: &str) {
    let &Site {
        env,
        ops,
        pods,
        target,
        ..
    } = site;
    let agent = "tailnet-egress-site";
    // A restarted agent keeps its identity: same node, no second node, no new key.
    for pod in agent_pods(pods, agent).await.expect("pods") {
        pods.delete(&pod.name_any(), &DeleteParams::default())
            .await
            .expect("delete agent pod");
    }
    let run = ops
        .tcp_check("client-2", target, 60)
        .await
        .expect("client pod after restart");
    assert!(run.succeeded(), "echo after agent restart failed:\n{run}");
    let nodes = env.headscale_api().list_nodes().await.expect("nodes");
    let tagged: Vec<_> = nodes
        .iter()
        .filter(|n| n.tags.iter().any(|t| t == "tag:tno-egress-site"))
        .collect();
    assert_eq!(
        tagged.len(),
        1,
        "exactly one node carries the egress tag: {tagged:?}"
    );
    assert_eq!(
        tagged[0].id.to_string(),
        node_id,
        "the restarted agent kept its node"
    );
}

/// A device tagged by hand with the egress's tag (another hostname) would receive the
/// egress's grants: `AgentReady=False/TagConflict` names it, the egress keeps its own node
/// and still carries bytes, nothing of the device is touched; once the device is gone from
/// Headscale, `AgentReady` is True again.
async fn a_hand_tagged_device_is_a_tag_conflict(site: &Site<'_>, node_id: &str) {
    let &Site {
        env,
        ops,
        ns,
        egresses,
        target,
        ..
    } = site;
    let tag = egresses
        .get("site")
        .await
        .expect("egress")
        .status
        .and_then(|s| s.tag)
        .expect("the egress's tag in its status");
    let hostname = format!("hand-tagged-{}", &ns[ns.len() - 5..]);
    let device = env
        .tailnet()
        .join_node(
            &hostname,
            tno_testenv_tailnet::JoinOptions {
                tags: vec![tag.clone()],
                ..Default::default()
            },
        )
        .await
        .expect("a device carrying the egress's tag");
    let device_id = env
        .tailnet()
        .node_id(&hostname)
        .await
        .expect("nodes")
        .expect("the device is registered");
    let conflicted = wait_for_condition(
        egresses,
        "site",
        ConditionIs::new("AgentReady", "False").reason("TagConflict"),
        None,
    )
    .await;
    let message = conflicted
        .condition("AgentReady")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&format!("id {device_id}")) && message.contains(&hostname),
        "the condition names the device: {message}"
    );
    assert_eq!(
        conflicted
            .status
            .clone()
            .unwrap_or_default()
            .node_id
            .as_deref(),
        Some(node_id),
        "the egress keeps its own node"
    );
    let run = ops
        .tcp_check("client-conflict", target, 60)
        .await
        .expect("client pod beside the conflict");
    assert!(
        run.succeeded(),
        "echo beside the tag conflict failed:\n{run}"
    );
    let headscale = tailnet_headscale::Client::new(
        &env.tailnet().headscale.root_url(),
        tailnet_headscale::Secret::new(env.tailnet().headscale.api_key()),
        tailnet_headscale::ClientOptions {
            server_ca_pem: Some(env.tailnet().headscale.ca_pem().to_owned()),
            ..Default::default()
        },
    )
    .expect("headscale client");
    let device_node = headscale
        .get_node(device_id)
        .await
        .expect("the device's node");
    assert!(
        device_node.tags.contains(&tag),
        "the operator left the device's tags alone: {:?}",
        device_node.tags
    );
    eprintln!("egress TagConflict: {message}");
    drop(device);
    headscale
        .delete_node(device_id)
        .await
        .expect("delete the device's node");
    wait_for_condition(
        egresses,
        "site",
        ConditionIs::new("AgentReady", "True"),
        None,
    )
    .await;
}

async fn a_foreign_service_is_left_alone(site: &Site<'_>) {
    let &Site {
        client,
        ns,
        tailnet_name,
        egresses,
        ..
    } = site;
    // A Service name owned by someone else: that target is skipped, nothing foreign touched.
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    apply_egress(
        egresses,
        ns,
        "other",
        tailnet_name,
        json!([{"name": "remote-db", "address": "192.0.2.11", "port": 5432}]),
    )
    .await
    .expect("conflicting egress");
    let other = wait_for_condition(
        egresses,
        "other",
        ConditionIs::new("ServicesReady", "False").reason("ServiceNameConflict"),
        None,
    )
    .await;
    assert_eq!(
        other.condition("Ready").map(|c| c.reason.as_str()),
        Some("ServiceNameConflict")
    );
    let svc = services.get("remote-db").await.expect("remote-db Service");
    assert_eq!(
        svc.owner_references()[0].name,
        "site",
        "the first egress keeps its Service"
    );
}

async fn deletion_cleans_up(site: &Site<'_>) {
    let &Site {
        env,
        egresses,
        operator,
        ..
    } = site;
    // Deletion: node removed from Headscale, Services collected.
    egresses
        .delete("other", &DeleteParams::default())
        .await
        .expect("delete other");
    egresses
        .delete("site", &DeleteParams::default())
        .await
        .expect("delete site");
    wait_for("the node to leave Headscale", WAIT, || async {
        let nodes = env
            .headscale_api()
            .list_nodes()
            .await
            .map_err(|e| e.to_string())?;
        let left: Vec<_> = nodes
            .iter()
            .filter(|n| n.tags.iter().any(|t| t.starts_with("tag:tno-egress-")))
            .map(|n| format!("{} {} {:?} online={}", n.id, n.given_name, n.tags, n.online))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{left:?}\n--- operator ---\n{}",
                operator.log_tail(40)
            ))
        }
    })
    .await;
    wait_for("the egress objects to be gone", WAIT, || async {
        let list = egresses
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        if list.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", list.items.len()))
        }
    })
    .await;
}
