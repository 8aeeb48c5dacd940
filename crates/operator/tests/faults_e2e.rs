//! Faults in the real environment (issue 9, SPEC §2/§4/§6): real apiserver, Headscale,
//! tailscaled agent pods and two operator replicas. One egress (`site` → 192.0.2.10:5432 behind
//! the remote site's subnet router) is set up once; then, in order:
//!
//! 1. Headscale down during steady state: an established connection keeps echoing every
//!    second, `HeadscaleReachable` goes False and recovers, nothing is duplicated, the
//!    operator's reconcile and Headscale call rates stay bounded (no hot loop).
//! 2. Headscale restarted with its database: every node back online with the same id.
//! 3. kube-apiserver restarted: a change made afterwards is reconciled (a new target, applied
//!    without replacing the agent pod or cutting its open connection), nothing duplicated.
//! 4. Leader SIGKILLed while it creates an agent (with a pre-auth key left behind as if a
//!    crash hit between minting and writing the Secret): the standby takes over within the
//!    Lease duration, finishes the agent; no valid orphaned key, no duplicate node.
//! 5. A base policy Headscale rejects: the previous policy stays live, the Tailnet says
//!    `Rejected`, the egress says which grants are not live, its connection keeps working.
//! 6. The router withdraws its routes: `RouteNotAdvertised`, new connections fail (and fast);
//!    re-advertised, they work again.
//! 7. Agent soak and agent pod killed under load: fds/RSS before and after, in-flight
//!    connections end (not hang), new ones succeed, the node identity is kept.
//!
//! Every phase runs even if an earlier one failed; the test prints a table (fault | expected
//! | observed, with measured numbers) and fails if any phase failed. CI runs the short version
//! (~4 min); the long one is `TNO_FAULTS_LONG=1 cargo test -p tailnet-operator --test
//! faults_e2e -- --nocapture` (Headscale down 60 s, a 10-minute soak at 100 connections/s);
//! `TNO_FAULTS_SOAK_SECS=<n>` sets another soak length.

mod support;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::conditions::{ConditionIs, WithConditions, condition_becomes};
use support::lab_operator;
use support::objects::{agent_pods, egress_object, tailnet_name};
use support::wait::{WAIT, eventually};
use tailnet_api::{Tailnet, TailnetEgress};
use tailnet_headscale::{Client as Headscale, ClientOptions, CreatePreAuthKey, Secret};
use tno_netlab::{PodNet, TcpForwarder};
use tno_testenv::{BASE_POLICY_CONFIG_MAP, BASE_POLICY_KEY, E2eEnv, OperatorArgs, OperatorProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LEASE: Duration = Duration::from_secs(15);
const ECHO_TIMEOUT: Duration = Duration::from_secs(5);
const EGRESS: &str = "site";
const DB_PORT: u16 = 5432;

/// Durations of the short (CI) and long versions.
struct Profile {
    headscale_down: Duration,
    soak: Duration,
    soak_rate: u32,
}

impl Profile {
    fn from_env() -> Profile {
        let mut profile = Profile::preset();
        // A soak of another length, e.g. to see whether RSS keeps growing or levels off.
        if let Some(seconds) = std::env::var("TNO_FAULTS_SOAK_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            profile.soak = Duration::from_secs(seconds);
        }
        profile
    }

    fn preset() -> Profile {
        if std::env::var("TNO_FAULTS_LONG").is_ok_and(|v| v == "1") {
            Profile {
                headscale_down: Duration::from_secs(60),
                soak: Duration::from_secs(600),
                soak_rate: 100,
            }
        } else {
            Profile {
                headscale_down: Duration::from_secs(20),
                soak: Duration::from_secs(20),
                soak_rate: 20,
            }
        }
    }
}

struct Row {
    fault: &'static str,
    expected: &'static str,
    observed: String,
    passed: bool,
}

type Outcome = Result<String, String>;

/// Everything the phases share.
struct Fixture {
    env: Arc<E2eEnv>,
    ns: String,
    client: kube::Client,
    tailnet_name: String,
    egresses: Api<TailnetEgress>,
    tailnets: Api<Tailnet>,
    headscale: Headscale,
    operators: Vec<OperatorProcess>,
    /// A pod network for the test's own client connections (like an application pod).
    client_net: PodNet,
    /// Root-netns listener forwarding into `client_net`, to the egress Service of remote-db.
    db_forwarder: TcpForwarder,
    tag: String,
    node_id: String,
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Sum of every sample of a counter family in Prometheus text (all label sets).
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An echo connection through the egress: each `ping` sends a numbered line and expects it
/// back within [`ECHO_TIMEOUT`].
struct EchoConnection {
    stream: TcpStream,
    seq: u64,
}

impl EchoConnection {
    async fn open(addr: SocketAddr) -> Result<EchoConnection, String> {
        let stream = tokio::time::timeout(ECHO_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| format!("connect: {e}"))?;
        Ok(EchoConnection { stream, seq: 0 })
    }

    async fn ping(&mut self) -> Result<(), String> {
        self.ping_within(ECHO_TIMEOUT).await.map(|_| ())
    }

    /// One echo, waiting up to `timeout`; returns its round-trip time.
    async fn ping_within(&mut self, timeout: Duration) -> Result<Duration, String> {
        self.seq += 1;
        let started = Instant::now();
        let line = format!("ping-{:06}\n", self.seq);
        let exchange = async {
            self.stream.write_all(line.as_bytes()).await?;
            let mut back = vec![0u8; line.len()];
            self.stream.read_exact(&mut back).await?;
            Ok::<_, std::io::Error>(back)
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Err(format!("ping {} timed out", self.seq)),
            Ok(Err(e)) => Err(format!("ping {}: {e}", self.seq)),
            Ok(Ok(back)) if back == line.as_bytes() => Ok(started.elapsed()),
            Ok(Ok(back)) => Err(format!(
                "ping {} echoed {:?}",
                self.seq,
                String::from_utf8_lossy(&back)
            )),
        }
    }
}

/// One fresh connection: connect, one echo, close. `Err` says how it failed and when.
async fn one_shot(addr: SocketAddr) -> Result<Duration, (Duration, String)> {
    let started = Instant::now();
    let result = async {
        let mut connection = EchoConnection::open(addr).await?;
        connection.ping().await
    }
    .await;
    match result {
        Ok(()) => Ok(started.elapsed()),
        Err(e) => Err((started.elapsed(), e)),
    }
}

/// New connections to `addr` (one every 500 ms) until one echoes or `limit` passes: how long
/// that took and how many attempts failed before it, or the last error.
async fn echo_within(
    addr: SocketAddr,
    limit: Duration,
) -> Result<(Duration, u32), (Duration, String)> {
    let started = Instant::now();
    let mut failed = 0;
    loop {
        match one_shot(addr).await {
            Ok(_) => return Ok((started.elapsed(), failed)),
            Err((_, e)) if started.elapsed() + Duration::from_millis(500) >= limit => {
                return Err((started.elapsed(), format!("{e}; {} attempts", failed + 1)));
            }
            Err(_) => {
                failed += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

impl Fixture {
    fn db_addr(&self) -> SocketAddr {
        self.db_forwarder.local_addr()
    }

    async fn egress(&self, name: &str) -> Result<TailnetEgress, String> {
        self.egresses.get(name).await.map_err(|e| e.to_string())
    }

    async fn tailnet(&self) -> Result<Tailnet, String> {
        self.tailnets
            .get(&self.tailnet_name)
            .await
            .map_err(|e| e.to_string())
    }

    async fn egress_condition_is(
        &self,
        name: &str,
        expected: ConditionIs<'_>,
        timeout: Duration,
    ) -> Result<TailnetEgress, String> {
        condition_becomes(&self.egresses, name, expected, timeout, None).await
    }

    async fn tailnet_condition_is(
        &self,
        expected: ConditionIs<'_>,
        timeout: Duration,
    ) -> Result<Tailnet, String> {
        condition_becomes(&self.tailnets, &self.tailnet_name, expected, timeout, None).await
    }

    /// The replica holding the Lease (by its `leader` gauge).
    async fn leader(&self) -> Option<usize> {
        for (index, operator) in self.operators.iter().enumerate() {
            if operator.metric("tailnet_operator_leader ").await == Some(1.0) {
                return Some(index);
            }
        }
        None
    }

    async fn start_operator(&self, identity: &str) -> Result<OperatorProcess, String> {
        let mut args = OperatorArgs::new(&self.ns).identity(identity);
        args.installation_id = "e2e-faults".into();
        args.extra = vec![
            "--lease-duration".into(),
            format!("{}s", LEASE.as_secs()),
            "--headscale-timeout".into(),
            "3s".into(),
        ];
        lab_operator::start_operator(&self.env, &args.to_args(), None).await
    }

    /// Nodes carrying `tag`, as (id, online).
    async fn tagged_nodes(&self, tag: &str) -> Result<Vec<(u64, bool)>, String> {
        Ok(self
            .headscale
            .list_nodes()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|n| n.tags.iter().any(|t| t == tag))
            .map(|n| (n.id, n.online))
            .collect())
    }

    /// Pre-auth keys of `tag` that could still register a node: unused and unexpired.
    async fn valid_keys(&self, tag: &str) -> Result<Vec<u64>, String> {
        let now = Timestamp::now();
        Ok(self
            .headscale
            .list_pre_auth_keys()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|k| k.acl_tags.iter().any(|t| t == tag))
            .filter(|k| !k.used && k.expiration.is_some_and(|e| e > now))
            .map(|k| k.id)
            .collect())
    }

    async fn key_count(&self) -> Result<usize, String> {
        Ok(self
            .headscale
            .list_pre_auth_keys()
            .await
            .map_err(|e| e.to_string())?
            .len())
    }

    async fn node_ids(&self) -> Result<BTreeSet<u64>, String> {
        Ok(self
            .headscale
            .list_nodes()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|n| n.id)
            .collect())
    }

    /// Exactly one node carries the egress tag and it is the one from the setup.
    async fn identity_kept(&self) -> Result<(), String> {
        let nodes = self.tagged_nodes(&self.tag).await?;
        if nodes.len() != 1 || nodes[0].0.to_string() != self.node_id {
            return Err(format!(
                "nodes with {}: {nodes:?}, expected exactly node {}",
                self.tag, self.node_id
            ));
        }
        Ok(())
    }

    /// Sums of reconciles and Headscale API calls over every replica's /metrics. A replica
    /// that does not answer fails the measurement (its activity would count as none).
    async fn activity(&self) -> Result<(f64, f64), String> {
        let mut reconciles = 0.0;
        let mut calls = 0.0;
        for operator in &self.operators {
            let text = operator
                .metrics()
                .await
                .map_err(|e| format!("scraping {}: {e}", operator.metrics_url()))?;
            reconciles += metric_sum(&text, "tailnet_operator_reconciles_total");
            calls += metric_sum(&text, "tailnet_operator_headscale_api_calls_total");
        }
        Ok((reconciles, calls))
    }

    async fn set_base_policy(&self, text: &str) -> Result<(), String> {
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.ns)
            .patch(
                BASE_POLICY_CONFIG_MAP,
                &PatchParams::apply("faults-test").force(),
                &Patch::Apply(json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": BASE_POLICY_CONFIG_MAP, "namespace": self.ns},
                    "data": {BASE_POLICY_KEY: text},
                })),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn apply_egress(&self, name: &str, targets: Value) -> Result<(), String> {
        self.egresses
            .patch(
                name,
                &PatchParams::apply("faults-test").force(),
                &Patch::Apply(egress_object(&self.ns, name, &self.tailnet_name, targets)),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn site_targets(extra: &[Value]) -> Value {
        let mut targets = vec![json!(
            {"name": "remote-db", "address": "192.0.2.10", "port": DB_PORT, "probe": {"interval": "2s"}}
        )];
        targets.extend(extra.iter().cloned());
        Value::Array(targets)
    }
}

async fn setup(env: Arc<E2eEnv>) -> Result<(Fixture, tno_testenv::E2eNamespace<'static>), String> {
    // The namespace borrows the env for the whole test; the env is process-wide anyway.
    let env_ref: &'static E2eEnv = Box::leak(Box::new(env.clone()));
    let ops = env_ref.namespace("flt").await.map_err(|e| e.to_string())?;
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    ops.create_bootstrap(&env.base_policy().map_err(|e| e.to_string())?)
        .await
        .map_err(|e| e.to_string())?;
    let tailnet_name = tailnet_name(&ns);
    let tailnets: Api<Tailnet> = Api::all(client.clone());
    tailnets
        .patch(
            &tailnet_name,
            &PatchParams::apply("faults-test").force(),
            &Patch::Apply(env.tailnet_object(&tailnet_name, "Apply")),
        )
        .await
        .map_err(|e| e.to_string())?;
    let headscale = Headscale::new(
        &env.headscale_root_url(),
        Secret::new(env.api_key().to_string()),
        ClientOptions {
            server_ca_pem: Some(env.tailnet().headscale.ca_pem().to_owned()),
            ..ClientOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let client_net = env
        .lab()
        .add_pod_netns(&format!("faults-client-{ns}"))
        .map_err(|e| e.to_string())?;
    let mut fixture = Fixture {
        env: env.clone(),
        ns: ns.clone(),
        client: client.clone(),
        tailnet_name,
        egresses: Api::namespaced(client.clone(), &ns),
        tailnets,
        headscale,
        operators: Vec::new(),
        db_forwarder: TcpForwarder::start(
            None,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            None,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 9)),
        )
        .map_err(|e| e.to_string())?,
        client_net,
        tag: String::new(),
        node_id: String::new(),
    };
    // Two replicas: operator-0 takes the Lease, operator-1 stands by.
    let first = fixture.start_operator("operator-0").await?;
    fixture.operators.push(first);
    let second = fixture.start_operator("operator-1").await?;
    fixture.operators.push(second);

    fixture
        .apply_egress(EGRESS, Fixture::site_targets(&[]))
        .await?;
    let ready = fixture
        .egress_condition_is(EGRESS, ConditionIs::new("Ready", "True"), WAIT)
        .await?;
    let status = ready.status.clone().unwrap_or_default();
    fixture.tag = status.tag.clone().ok_or("no tag in the egress status")?;
    fixture.node_id = status.node_id.clone().ok_or("no node id")?;
    let cluster_ip: Ipv4Addr = status
        .targets
        .iter()
        .find(|t| t.name == "remote-db")
        .and_then(|t| t.cluster_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .ok_or("no ClusterIP for remote-db")?;
    fixture.db_forwarder = TcpForwarder::start(
        None,
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        Some(&fixture.client_net.netns),
        SocketAddr::from((cluster_ip, DB_PORT)),
    )
    .map_err(|e| e.to_string())?;
    let addr = fixture.db_addr();
    eventually("a first echo through the egress", WAIT, || async {
        one_shot(addr).await.map(|_| ()).map_err(|(_, e)| e)
    })
    .await?;
    Ok((fixture, ops))
}

/// 1. Headscale down.
async fn headscale_down(fx: &Fixture, profile: &Profile) -> Outcome {
    let mut connection = EchoConnection::open(fx.db_addr()).await?;
    connection.ping().await?;
    let nodes_before = fx.node_ids().await?;
    let keys_before = fx.key_count().await?;
    let (reconciles_before, calls_before) = fx.activity().await?;

    fx.env.tailnet().headscale.kill();
    let down_at = Instant::now();
    let (mut pings_ok, mut ping_errors) = (0u32, Vec::new());
    let mut unreachable_after = None;
    let mut new_connection = None;
    while down_at.elapsed() < profile.headscale_down {
        let tick = Instant::now();
        match connection.ping().await {
            Ok(()) => pings_ok += 1,
            Err(e) => ping_errors.push(e),
        }
        if unreachable_after.is_none()
            && let Ok(t) = fx.tailnet().await
            && ConditionIs::new("HeadscaleReachable", "False").holds_for(&t)
        {
            unreachable_after = Some(down_at.elapsed());
        }
        if new_connection.is_none() && down_at.elapsed() > Duration::from_secs(5) {
            new_connection = Some(one_shot(fx.db_addr()).await);
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
    let outage = down_at.elapsed();
    let (reconciles_after, calls_after) = fx.activity().await?;
    let tailnet = fx.tailnet().await?;
    let egress = fx.egress(EGRESS).await?;
    let reachable_during = tailnet.condition("HeadscaleReachable");
    let egress_during = egress.condition("Ready");

    fx.env
        .tailnet()
        .headscale
        .restart()
        .await
        .map_err(|e| e.to_string())?;
    let restarted_at = Instant::now();
    // The established connection across Headscale's return: 10 echoes a second apart, each
    // allowed 30 s, so a stall is measured rather than mistaken for a break.
    let mut slowest_after = Duration::ZERO;
    let mut after_errors = Vec::new();
    for _ in 0..10 {
        let tick = Instant::now();
        match connection.ping_within(Duration::from_secs(30)).await {
            Ok(rtt) => slowest_after = slowest_after.max(rtt),
            Err(e) => {
                after_errors.push(e);
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
    fx.tailnet_condition_is(ConditionIs::new("HeadscaleReachable", "True"), WAIT)
        .await?;
    let reachable_again = restarted_at.elapsed();
    fx.egress_condition_is(EGRESS, ConditionIs::new("Ready", "True"), WAIT)
        .await?;
    let ready_again = restarted_at.elapsed();
    let after_recovery = connection.ping().await;
    let nodes_after = fx.node_ids().await?;
    let keys_after = fx.key_count().await?;
    fx.identity_kept().await?;
    let valid = fx.valid_keys(&fx.tag).await?;

    let seconds = outage.as_secs_f64();
    let reconcile_rate = (reconciles_after - reconciles_before) / seconds;
    let call_rate = (calls_after - calls_before) / seconds;
    let observed = format!(
        "down {}: {pings_ok} of {} pings on the established connection echoed; new connection during outage: {}; HeadscaleReachable=False after {} ({:?}); egress Ready during outage {:?}; \
         after the restart the same connection echoed {} more times (slowest {}); \
         {reconcile_rate:.2} reconciles/s and {call_rate:.2} Headscale calls/s (both replicas) while down; reachable again {} and egress Ready {} after restart; \
         nodes {} → {}, pre-auth keys {keys_before} → {keys_after}, valid keys of the tag {}",
        secs(outage),
        pings_ok as usize + ping_errors.len(),
        match &new_connection {
            Some(Ok(d)) => format!("echoed in {}", secs(*d)),
            Some(Err((d, e))) => format!("FAILED after {} ({e})", secs(*d)),
            None => "not tried".into(),
        },
        unreachable_after.map_or("never".into(), secs),
        reachable_during.map(|c| &c.reason),
        egress_during.map(|c| format!("{}/{}", c.status, c.reason)),
        10 - after_errors.len(),
        secs(slowest_after),
        secs(reachable_again),
        secs(ready_again),
        nodes_before.len(),
        nodes_after.len(),
        valid.len(),
    );
    let mut problems = Vec::new();
    if !ping_errors.is_empty() {
        problems.push(format!("established connection broke: {ping_errors:?}"));
    }
    if !after_errors.is_empty() || after_recovery.is_err() {
        problems.push(format!(
            "established connection broke after Headscale came back: {after_errors:?} {:?}",
            after_recovery.err()
        ));
    }
    if unreachable_after.is_none() {
        problems.push("HeadscaleReachable never went False".to_string());
    }
    if nodes_before != nodes_after {
        problems.push(format!("nodes changed: {nodes_before:?} → {nodes_after:?}"));
    }
    if keys_after != keys_before || !valid.is_empty() {
        problems.push(format!(
            "keys {keys_before} → {keys_after}, valid {valid:?}"
        ));
    }
    // Two replicas, the leader polling every 2 s: a hot loop would be hundreds per second.
    // The bound is only a measurement if the counters move: HeadscaleReachable went False,
    // so at least that reconcile was counted.
    if reconciles_after <= reconciles_before {
        problems.push(format!(
            "no reconcile counted while Headscale was down ({reconciles_before} → {reconciles_after}): the rate check measured nothing"
        ));
    }
    if reconcile_rate > 5.0 || call_rate > 10.0 {
        problems.push("reconcile or API call rate too high while Headscale is down".into());
    }
    if problems.is_empty() {
        Ok(observed)
    } else {
        Err(format!("{observed}; PROBLEMS: {}", problems.join("; ")))
    }
}

/// 2. Headscale restarted with its database.
async fn headscale_restart(fx: &Fixture) -> Outcome {
    let before = fx.headscale.list_nodes().await.map_err(|e| e.to_string())?;
    let ids_before: BTreeSet<u64> = before.iter().map(|n| n.id).collect();
    let keys_before = fx.key_count().await?;
    let started = Instant::now();
    fx.env
        .tailnet()
        .headscale
        .restart()
        .await
        .map_err(|e| e.to_string())?;
    let healthy = started.elapsed();
    let all_online = eventually("every node online again", WAIT, || async {
        let nodes = fx.headscale.list_nodes().await.map_err(|e| e.to_string())?;
        let offline: Vec<_> = nodes
            .iter()
            .filter(|n| !n.online)
            .map(|n| n.given_name.clone())
            .collect();
        if offline.is_empty() && !nodes.is_empty() {
            Ok(nodes)
        } else {
            Err(format!("offline: {offline:?}"))
        }
    })
    .await?;
    let online_after = started.elapsed();
    let ids_after: BTreeSet<u64> = all_online.iter().map(|n| n.id).collect();
    fx.egress_condition_is(EGRESS, ConditionIs::new("Ready", "True"), WAIT)
        .await?;
    // tailscaled re-establishes its control and DERP connections after Headscale comes back
    // (docs/reliability.md: stalls of several seconds were seen): a new connection must echo
    // within 30 s; the row reports how long it took and how many attempts failed first.
    let echo = echo_within(fx.db_addr(), Duration::from_secs(30)).await;
    let keys_after = fx.key_count().await?;
    fx.identity_kept().await?;
    let observed = format!(
        "healthy after {}, all {} nodes online after {}; node ids equal: {}; pre-auth keys {keys_before} → {keys_after}; new connection: {}",
        secs(healthy),
        ids_after.len(),
        secs(online_after),
        ids_before == ids_after,
        match &echo {
            Ok((d, 0)) => format!("echoed in {}", secs(*d)),
            Ok((d, failed)) => format!(
                "echoed after {} ({failed} earlier attempts failed while tailscaled reconnected)",
                secs(*d)
            ),
            Err((_, e)) => format!("FAILED within 30 s ({e})"),
        }
    );
    if ids_before != ids_after || keys_before != keys_after || echo.is_err() {
        return Err(format!("{observed}; ids {ids_before:?} → {ids_after:?}"));
    }
    Ok(observed)
}

/// Restarts every replica that exited (what the Deployment's pod restart would do).
async fn revive_operators(fx: &mut Fixture) -> Result<Vec<String>, String> {
    let mut revived = Vec::new();
    for index in 0..fx.operators.len() {
        if !fx.operators[index].is_running() {
            let identity = format!("operator-r{index}-{}", fx.operators.len());
            let log = fx.operators[index]
                .log_tail(1)
                .split("ERROR")
                .last()
                .unwrap_or_default()
                .trim()
                .to_string();
            fx.operators[index] = fx.start_operator(&identity).await?;
            revived.push(format!("replica {index} had exited ({log:?})"));
        }
    }
    Ok(revived)
}

/// 3. kube-apiserver restarted.
async fn apiserver_restart(fx: &mut Fixture) -> Outcome {
    let nodes_before = fx.node_ids().await?;
    let keys_before = fx.key_count().await?;
    let mut connection = EchoConnection::open(fx.db_addr()).await?;
    let unavailable = fx
        .env
        .kube()
        .restart_apiserver(Duration::from_secs(5))
        .await
        .map_err(|e| e.to_string())?;
    let data_plane = connection.ping().await;
    let running: Vec<bool> = fx.operators.iter_mut().map(|o| o.is_running()).collect();
    // A change made after the restart: a second target on the egress.
    let pod_before = agent_pod(fx).await?.uid().unwrap_or_default();
    let changed_at = Instant::now();
    fx.apply_egress(
        EGRESS,
        Fixture::site_targets(&[
            json!({"name": "remote-api", "address": "198.51.100.20", "port": 443}),
        ]),
    )
    .await?;
    let reconciled = eventually("the new target in the egress status", WAIT, || async {
        let e = fx.egress(EGRESS).await?;
        let status = e.status.clone().unwrap_or_default();
        let has_service = status
            .targets
            .iter()
            .any(|t| t.name == "remote-api" && t.cluster_ip.is_some());
        let ready = ConditionIs::new("Ready", "True").holds_for(&e);
        if has_service && ready && status.observed_generation == e.metadata.generation {
            Ok(())
        } else {
            Err(e.describe())
        }
    })
    .await;
    let converged = changed_at.elapsed();
    // The agent re-reads its config: adding a target neither replaces the pod nor cuts the
    // open connection to another target.
    let after_change = connection.ping().await;
    let pod_replaced = agent_pod(fx).await?.uid().unwrap_or_default() != pod_before;
    let policy = fx
        .tailnet_condition_is(ConditionIs::new("PolicyApplied", "True"), WAIT)
        .await;
    let revived = revive_operators(fx).await?;
    let nodes_after = fx.node_ids().await?;
    let keys_after = fx.key_count().await?;
    let identity = fx.identity_kept().await;
    let observed = format!(
        "apiserver unavailable {}; established connection {}; replicas running afterwards {running:?}{}; a target added afterwards reconciled (Service + Ready) in {}: {}; agent pod replaced by the change: {pod_replaced}, the open connection to the unchanged target {}; PolicyApplied: {}; nodes {} → {}, keys {keys_before} → {keys_after}",
        secs(unavailable),
        if data_plane.is_ok() {
            "kept echoing"
        } else {
            "BROKE"
        },
        if revived.is_empty() {
            String::new()
        } else {
            format!(" (revived: {})", revived.join(", "))
        },
        secs(converged),
        if reconciled.is_ok() { "yes" } else { "NO" },
        if after_change.is_ok() {
            "kept echoing"
        } else {
            "was cut"
        },
        if policy.is_ok() { "True" } else { "not True" },
        nodes_before.len(),
        nodes_after.len(),
    );
    if reconciled.is_err()
        || pod_replaced
        || after_change.is_err()
        || policy.is_err()
        || identity.is_err()
        || data_plane.is_err()
        || nodes_before != nodes_after
        || keys_before != keys_after
    {
        return Err(format!(
            "{observed}; {:?} {:?} {:?} {:?}",
            reconciled.err(),
            policy.err(),
            identity.err(),
            data_plane.err()
        ));
    }
    Ok(observed)
}

/// 4. Leader SIGKILLed mid-apply; failover to the standby.
async fn operator_killed(fx: &mut Fixture) -> Outcome {
    let leader = fx.leader().await.ok_or("no replica reports leader=1")?;
    let standby = 1 - leader;
    let crash_tag = "tag:tno-egress-crash".to_string();
    // The window between minting a key and writing its Secret, made deterministic: a valid
    // key of the new agent's tag that no Secret holds.
    let orphan = fx
        .headscale
        .create_pre_auth_key(&CreatePreAuthKey::single_use_tagged(
            vec![crash_tag.clone()],
            Timestamp::now() + SignedDuration::from_mins(60),
        ))
        .await
        .map(|k| k.id)
        .map_err(|e| e.to_string());
    fx.apply_egress(
        "crash",
        json!([{"name": "crash-db", "address": "192.0.2.10", "port": DB_PORT}]),
    )
    .await?;
    // Kill the leader while it works on the new agent (mint, Secret, Deployment, policy): once
    // it has written the new egress's first status. Without that the kill would not be
    // mid-apply, so the phase fails, saying what the egress showed.
    let started_on = eventually(
        "the leader to start on the new agent (a status on the crash egress)",
        Duration::from_secs(20),
        || async {
            let e = fx.egress("crash").await?;
            if e.status.is_some() {
                Ok(e)
            } else {
                Err(format!(
                    "no status yet (generation {:?}, finalizers {:?}); leader log: {}",
                    e.metadata.generation,
                    e.metadata.finalizers,
                    fx.operators[leader].log_tail(5)
                ))
            }
        },
    )
    .await;
    let at_kill = match started_on {
        Ok(e) => e
            .conditions()
            .iter()
            .map(|c| format!("{}={}/{}", c.type_, c.status, c.reason))
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => {
            let _ = fx.egresses.delete("crash", &DeleteParams::default()).await;
            return Err(format!(
                "the leader did not start on the new agent, nothing to kill it in: {e}"
            ));
        }
    };
    fx.operators[leader].kill();
    let killed_at = Instant::now();
    let takeover = eventually("the standby to take the Lease", LEASE * 3, || async {
        match fx.operators[standby]
            .metric("tailnet_operator_leader ")
            .await
        {
            Some(1.0) => Ok(killed_at.elapsed()),
            other => Err(format!("leader gauge {other:?}")),
        }
    })
    .await?;
    // The killed pod comes back as the new standby.
    fx.operators[leader] = fx.start_operator("operator-2").await?;
    let online = fx
        .egress_condition_is("crash", ConditionIs::new("NodeOnline", "True"), WAIT)
        .await;
    let policy = fx
        .tailnet_condition_is(ConditionIs::new("PolicyApplied", "True"), WAIT)
        .await;
    let effective = fx
        .egress_condition_is("crash", ConditionIs::new("PolicyEffective", "True"), WAIT)
        .await;
    let finished = killed_at.elapsed();
    let keys_clean = eventually(
        "no valid pre-auth key of the crash tag",
        Duration::from_secs(30),
        || async {
            let valid = fx.valid_keys(&crash_tag).await?;
            if valid.is_empty() {
                Ok(())
            } else {
                Err(format!("valid keys {valid:?}"))
            }
        },
    )
    .await;
    let nodes = fx.tagged_nodes(&crash_tag).await?;
    let observed = format!(
        "orphaned key injected: {}; killed with the crash egress at [{}]; standby took over {} after SIGKILL (Lease {}); new agent online, policy applied and effective {} after the kill: {}; nodes with the tag: {}; valid keys of the tag afterwards: {}",
        match &orphan {
            Ok(id) => format!("id {id}"),
            Err(e) => format!("no ({e})"),
        },
        at_kill,
        secs(takeover),
        secs(LEASE),
        secs(finished),
        if online.is_ok() && policy.is_ok() && effective.is_ok() {
            "yes"
        } else {
            "NO"
        },
        nodes.len(),
        match &keys_clean {
            Ok(()) => "none".to_string(),
            Err(e) => e.clone(),
        },
    );
    // Clean up the second agent (node removed by the finalizer).
    let _ = fx.egresses.delete("crash", &DeleteParams::default()).await;
    if orphan.is_err()
        || online.is_err()
        || policy.is_err()
        || effective.is_err()
        || keys_clean.is_err()
        || nodes.len() != 1
        || takeover > LEASE + Duration::from_secs(2)
    {
        return Err(format!(
            "{observed}; {:?} {:?} {:?}",
            online.err(),
            policy.err(),
            effective.err()
        ));
    }
    Ok(observed)
}

/// 5. Headscale rejects the rendered policy.
async fn policy_rejected(fx: &Fixture) -> Outcome {
    let base_text = fx.env.base_policy().map_err(|e| e.to_string())?;
    let base: Value = serde_json::from_str(&base_text).map_err(|e| e.to_string())?;
    let live_before = fx
        .headscale
        .get_policy()
        .await
        .map_err(|e| e.to_string())?
        .policy;
    // A grant from a group that is not defined: valid HuJSON, rejected by Headscale.
    let mut hostile = base.clone();
    hostile["grants"]
        .as_array_mut()
        .ok_or("no grants in the base policy")?
        .push(json!({"src": ["group:nobody-defined-this"], "dst": ["192.0.2.10/32"], "ip": ["tcp:22"]}));
    let hostile_text = serde_json::to_string_pretty(&hostile).map_err(|e| e.to_string())?;
    let mut connection = EchoConnection::open(fx.db_addr()).await?;
    connection.ping().await?;
    fx.set_base_policy(&hostile_text).await?;
    let rejected = fx
        .tailnet_condition_is(
            ConditionIs::new("PolicyApplied", "False").reason("Rejected"),
            WAIT,
        )
        .await
        .map(|t| t.condition_message("PolicyApplied"));
    // A resource whose grants only the rejected policy would carry: a new egress.
    fx.apply_egress(
        "late",
        json!([{"name": "late-api", "address": "198.51.100.20", "port": 8443, "probe": {"enabled": false}}]),
    )
    .await?;
    let late = fx
        .egress_condition_is(
            "late",
            ConditionIs::new("PolicyEffective", "False").reason("Rejected"),
            Duration::from_secs(60),
        )
        .await
        // The condition just matched, so it is there.
        .map(|e| {
            e.condition("PolicyEffective")
                .cloned()
                .expect("PolicyEffective")
        });
    let site = fx.egress(EGRESS).await?;
    let site_effective = site.condition("PolicyEffective");
    let live_during = fx
        .headscale
        .get_policy()
        .await
        .map_err(|e| e.to_string())?
        .policy;
    let established = connection.ping().await;
    let fresh = one_shot(fx.db_addr()).await;

    // Fixed: back to the good base; the new egress's grants go live.
    fx.set_base_policy(&base_text).await?;
    let recovered = fx
        .tailnet_condition_is(ConditionIs::new("PolicyApplied", "True"), WAIT)
        .await;
    let late_live = fx
        .egress_condition_is("late", ConditionIs::new("PolicyEffective", "True"), WAIT)
        .await;
    let _ = fx.egresses.delete("late", &DeleteParams::default()).await;
    let observed = format!(
        "Tailnet PolicyApplied=False/Rejected: {}; live policy unchanged: {}; new egress PolicyEffective: {}; existing egress PolicyEffective: {:?}; its established connection {}; a new connection {}; after fixing the base: PolicyApplied {} and the new egress effective {}",
        match &rejected {
            Ok(m) => format!("yes ({})", m.chars().take(140).collect::<String>()),
            Err(e) => format!("NO ({e})"),
        },
        live_during == live_before,
        match &late {
            Ok(c) => format!(
                "{}/{} ({})",
                c.status,
                c.reason,
                c.message.chars().take(100).collect::<String>()
            ),
            Err(e) => format!(
                "not False/Rejected ({})",
                e.chars().take(200).collect::<String>()
            ),
        },
        site_effective.map(|c| format!("{}/{}", c.status, c.reason)),
        if established.is_ok() {
            "kept echoing"
        } else {
            "BROKE"
        },
        if fresh.is_ok() { "echoed" } else { "FAILED" },
        if recovered.is_ok() {
            "True"
        } else {
            "not True"
        },
        if late_live.is_ok() {
            "True"
        } else {
            "not True"
        },
    );
    if rejected.is_err()
        || live_during != live_before
        || late.is_err()
        || site_effective.is_none_or(|c| c.status != "True")
        || established.is_err()
        || fresh.is_err()
        || recovered.is_err()
        || late_live.is_err()
    {
        return Err(observed);
    }
    Ok(observed)
}

/// 6. The router withdraws its routes.
async fn route_withdrawn(fx: &Fixture) -> Outcome {
    let tailnet_env = fx.env.tailnet();
    let router = &tailnet_env.site.router;
    router
        .tailscale_set(&tailnet_env.binaries, &["--advertise-routes="])
        .await
        .map_err(|e| e.to_string())?;
    let withdrawn_at = Instant::now();
    let condition = fx
        .egress_condition_is(
            EGRESS,
            ConditionIs::new("RoutesReady", "False").reason("RouteNotAdvertised"),
            WAIT,
        )
        .await;
    let named_after = withdrawn_at.elapsed();
    // Every new connection fails (the agent refuses; nothing reaches the target another way).
    let mut failures = Vec::new();
    for _ in 0..5 {
        failures.push(one_shot(fx.db_addr()).await);
    }
    let leaked = failures.iter().filter(|r| r.is_ok()).count();
    let slowest_failure = failures
        .iter()
        .filter_map(|r| r.as_ref().err().map(|(d, _)| *d))
        .max()
        .unwrap_or_default();
    let how = failures
        .iter()
        .find_map(|r| r.as_ref().err().map(|(_, e)| e.clone()))
        .unwrap_or_default();

    let routes = tno_testenv_tailnet::SITE_ROUTES.join(",");
    router
        .tailscale_set(
            &tailnet_env.binaries,
            &[&format!("--advertise-routes={routes}")],
        )
        .await
        .map_err(|e| e.to_string())?;
    let readvertised_at = Instant::now();
    let back = fx
        .egress_condition_is(EGRESS, ConditionIs::new("RoutesReady", "True"), WAIT)
        .await;
    let works = eventually("an echo after re-advertising", WAIT, || async {
        one_shot(fx.db_addr()).await.map_err(|(_, e)| e)
    })
    .await;
    let recovered = readvertised_at.elapsed();
    let observed = format!(
        "RoutesReady=False/RouteNotAdvertised {} after withdrawal: {}; {leaked} of 5 new connections echoed, slowest failure {} ({how}); re-advertised: RoutesReady=True and echo again after {}: {}",
        secs(named_after),
        if condition.is_ok() { "yes" } else { "NO" },
        secs(slowest_failure),
        secs(recovered),
        if back.is_ok() && works.is_ok() {
            "yes"
        } else {
            "NO"
        },
    );
    if condition.is_err() || leaked > 0 || back.is_err() || works.is_err() {
        return Err(format!("{observed}; {:?}", condition.err()));
    }
    Ok(observed)
}

/// The `tailnet-agent` process of `pod` (its network namespace is the pod's).
fn agent_pid(run_prefix: &str, pod_uid: &str) -> Option<u32> {
    let netns = std::fs::read_dir("/run/netns")
        .ok()?
        .filter_map(|entry| entry.ok())
        .find(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.starts_with(run_prefix) && name.ends_with(&format!("pod-{pod_uid}"))
        })?;
    let inode = std::fs::metadata(netns.path()).ok()?.ino();
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            exe.is_some_and(|exe| exe.file_name().is_some_and(|n| n == "tailnet-agent"))
                && std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| m.ino() == inode)
        })
}

/// (open fds, RSS in KiB) of a process.
fn fds_and_rss(pid: u32) -> Option<(usize, u64)> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((fds, rss))
}

async fn agent_pod(fx: &Fixture) -> Result<Pod, String> {
    let pods: Api<Pod> = Api::namespaced(fx.client.clone(), &fx.ns);
    agent_pods(&pods, &format!("tailnet-egress-{EGRESS}"))
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .ok_or_else(|| "no agent pod".to_string())
}

/// Fresh connections at `rate` per second for `duration`: (ok, failed, first error).
async fn load(addr: SocketAddr, rate: u32, duration: Duration) -> (u64, u64, Option<String>) {
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let mut interval = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    while started.elapsed() < duration {
        interval.tick().await;
        let (ok, failed, first_error) = (ok.clone(), failed.clone(), first_error.clone());
        tasks.spawn(async move {
            match one_shot(addr).await {
                Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                Err((_, e)) => {
                    first_error
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .get_or_insert(e);
                    failed.fetch_add(1, Ordering::Relaxed)
                }
            };
        });
        // Reap finished ones so the set stays small in a long soak.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let error = first_error
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    (
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        error,
    )
}

/// 7a. Soak: fds and RSS of the agent before and after.
async fn agent_soak(fx: &Fixture, profile: &Profile) -> Outcome {
    let run_prefix = fx.env.kube().run_id().netns_name("");
    let pod = agent_pod(fx).await?;
    let uid = pod.uid().ok_or("agent pod without uid")?;
    let pid = agent_pid(&run_prefix, &uid).ok_or("tailnet-agent process not found")?;
    // Warm up (allocator, connection pools), then settle past the half-closed idle timeout.
    let _ = load(fx.db_addr(), 10, Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (fds_before, rss_before) = fds_and_rss(pid).ok_or("reading /proc of the agent")?;
    let started = Instant::now();
    let soak = tokio::spawn(load(fx.db_addr(), profile.soak_rate, profile.soak));
    // RSS ten times during the soak: a leak keeps growing, allocator warm-up levels off.
    let mut samples = vec![rss_before];
    for _ in 0..10 {
        tokio::time::sleep(profile.soak / 10).await;
        if let Some((_, rss)) = fds_and_rss(pid) {
            samples.push(rss);
        }
    }
    let (ok, failed, error) = soak.await.map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (fds_after, rss_after) = fds_and_rss(pid).ok_or("reading /proc of the agent")?;
    let middle = samples[samples.len() / 2];
    let first_half = middle.saturating_sub(rss_before);
    let second_half = rss_after.saturating_sub(middle);
    let observed = format!(
        "{ok} connections echoed, {failed} failed{} in {} ({:.0}/s); agent fds {fds_before} → {fds_after}, RSS {rss_before} → {rss_after} KiB (+{first_half} KiB in the first half, +{second_half} KiB in the second; samples {samples:?})",
        error.map(|e| format!(" (first: {e})")).unwrap_or_default(),
        secs(elapsed),
        (ok + failed) as f64 / elapsed.as_secs_f64(),
    );
    // A leak of even one fd per thousand connections shows. RSS may grow while the
    // allocator warms up, but a leak grows as much in the second half as in the first.
    if failed > 0 || fds_after > fds_before + 8 || second_half > 8 * 1024 + first_half / 2 {
        return Err(observed);
    }
    Ok(observed)
}

/// 7b. The agent pod killed under load.
async fn agent_killed_under_load(fx: &Fixture) -> Outcome {
    let keys_before = fx.key_count().await?;
    let pod = agent_pod(fx).await?;
    let old_uid = pod.uid().unwrap_or_default();
    let mut in_flight = Vec::new();
    for _ in 0..5 {
        let mut connection = EchoConnection::open(fx.db_addr()).await?;
        connection.ping().await?;
        in_flight.push(connection);
    }
    let addr = fx.db_addr();
    let background = tokio::spawn(load(addr, 10, Duration::from_secs(20)));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pods: Api<Pod> = Api::namespaced(fx.client.clone(), &fx.ns);
    pods.delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
        .await
        .map_err(|e| e.to_string())?;
    let killed_at = Instant::now();
    // In-flight connections must end with an error or EOF, not hang.
    let mut ended = Vec::new();
    for mut connection in in_flight {
        let started = Instant::now();
        let mut outcome = Ok(());
        while started.elapsed() < Duration::from_secs(30) {
            outcome = connection.ping().await;
            if outcome.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        ended.push((killed_at.elapsed(), outcome));
    }
    let recovered = eventually("an echo through the new agent pod", WAIT, || async {
        one_shot(addr).await.map_err(|(_, e)| e)
    })
    .await;
    let gap = killed_at.elapsed();
    let (ok, failed, _) = background.await.map_err(|e| e.to_string())?;
    let new_pod = agent_pod(fx).await?;
    let identity = fx.identity_kept().await;
    let keys_after = fx.key_count().await?;
    let hung = ended
        .iter()
        .filter(|(_, o)| o.as_ref().is_err_and(|e| e.contains("timed out")) || o.is_ok())
        .count();
    let slowest = ended.iter().map(|(d, _)| *d).max().unwrap_or_default();
    let observed = format!(
        "5 in-flight connections: {} ended with an error/EOF (slowest {} after the kill), {hung} hung or kept working; new connection echoed {} after the kill: {}; background load {ok} ok / {failed} failed; new pod {}; same node id, one node: {}; pre-auth keys {keys_before} → {keys_after}",
        ended.len() - hung,
        secs(slowest),
        secs(gap),
        if recovered.is_ok() { "yes" } else { "NO" },
        if new_pod.uid().unwrap_or_default() != old_uid {
            "replaced"
        } else {
            "NOT replaced"
        },
        if identity.is_ok() { "yes" } else { "NO" },
    );
    if hung > 0 || recovered.is_err() || identity.is_err() || keys_before != keys_after || ok == 0 {
        return Err(format!("{observed}; {:?}", identity.err()));
    }
    Ok(observed)
}

/// Runs one phase (every phase runs even if an earlier one failed), prints its outcome as it
/// ends and adds its row to the table.
async fn run_phase(
    rows: &mut Vec<Row>,
    fault: &'static str,
    expected: &'static str,
    phase: impl std::future::Future<Output = Outcome>,
) {
    let started = Instant::now();
    let outcome = phase.await;
    eprintln!(
        "[{} in {}] {fault}: {outcome:?}",
        if outcome.is_ok() { "PASS" } else { "FAIL" },
        secs(started.elapsed())
    );
    let passed = outcome.is_ok();
    rows.push(Row {
        fault,
        expected,
        observed: outcome.unwrap_or_else(|e| e),
        passed,
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_keep_the_data_plane_and_lose_nothing() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let profile = Profile::from_env();
    let started = Instant::now();
    let (mut fx, ops) = setup(env.clone())
        .await
        .unwrap_or_else(|e| panic!("setup: {e}\n{}", env.diagnostics(None)));
    eprintln!("setup took {}", secs(started.elapsed()));

    let mut rows = Vec::new();
    run_phase(
        &mut rows,
        "Headscale down (process stopped)",
        "established egress connection keeps echoing; HeadscaleReachable=False then True; no node/key lost or duplicated; no hot loop",
        headscale_down(&fx, &profile),
    )
    .await;
    run_phase(
        &mut rows,
        "Headscale restarted with its database",
        "every node online again with the same id; no node or key created",
        headscale_restart(&fx),
    )
    .await;
    run_phase(
        &mut rows,
        "kube-apiserver restarted",
        "watches recover: a change made afterwards (a new target) is reconciled without replacing the agent pod or cutting its open connection; no duplicate node/key",
        apiserver_restart(&mut fx),
    )
    .await;
    run_phase(
        &mut rows,
        "Leader SIGKILLed while creating an agent (orphaned key injected)",
        "standby takes over within the Lease; agent finished; no valid orphaned key; one node",
        operator_killed(&mut fx),
    )
    .await;
    run_phase(
        &mut rows,
        "Base policy rejected by Headscale",
        "previous policy stays live; Tailnet Rejected; a new egress says PolicyEffective=False/Rejected, the existing one stays effective and keeps working",
        policy_rejected(&fx),
    )
    .await;
    run_phase(
        &mut rows,
        "Route withdrawn by the router",
        "RoutesReady=False/RouteNotAdvertised; new connections fail fast, nothing leaks; re-advertised works",
        route_withdrawn(&fx),
    )
    .await;
    run_phase(
        &mut rows,
        "Agent soak",
        "every connection echoes; agent fds and RSS back to their level",
        agent_soak(&fx, &profile),
    )
    .await;
    run_phase(
        &mut rows,
        "Agent pod killed under load",
        "in-flight connections end (error/EOF, no hang); new ones succeed; same node identity; no new key",
        agent_killed_under_load(&fx),
    )
    .await;

    let mut table = String::from("| fault | expected | observed |\n|---|---|---|\n");
    for row in &rows {
        table.push_str(&format!(
            "| {}{} | {} | {} |\n",
            row.fault,
            if row.passed { "" } else { " (FAILED)" },
            row.expected,
            row.observed
        ));
    }
    eprintln!("faults total {}\n{table}", secs(started.elapsed()));
    let failed: Vec<&str> = rows.iter().filter(|r| !r.passed).map(|r| r.fault).collect();
    if !failed.is_empty() {
        eprintln!("{}", env.diagnostics(Some(&fx.ns)));
        for operator in &fx.operators {
            eprintln!("==== {} ====\n{}", operator.name(), operator.log_tail(40));
        }
    }
    if let Ok(dir) = std::env::var("TNO_FAULTS_KEEP_LOGS") {
        let _ = std::fs::create_dir_all(&dir);
        for entry in std::fs::read_dir(env.dir()).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let _ = std::fs::copy(entry.path(), format!("{dir}/{name}"));
        }
        let pods = env.kube().kubelet().logs_dir();
        let _ = std::process::Command::new("cp")
            .args(["-r", &pods.to_string_lossy(), &format!("{dir}/pods")])
            .status();
        let _ = std::fs::copy(
            env.tailnet().site.router.log_path(),
            format!("{dir}/router.log"),
        );
        let _ = std::fs::copy(
            env.tailnet().headscale.log_path(),
            format!("{dir}/headscale.log"),
        );
    }
    for mut operator in std::mem::take(&mut fx.operators) {
        let _ = operator.terminate().await;
    }
    let _ = env
        .lab()
        .remove_pod_netns(&format!("faults-client-{}", fx.ns));
    drop(ops);
    assert!(failed.is_empty(), "faults failed: {failed:?}\n{table}");
}
