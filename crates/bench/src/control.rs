//! Benchmark 4: the control plane at scale, against the real apiserver and Headscale of the
//! test environment (`tno_testenv::E2eEnv`), plus the policy renderer in-process.
//!
//! Agents are not started: a ResourceQuota of zero pods in the namespace keeps the agent
//! Deployments from getting pods (kube-controller-manager's ReplicaSet controller is refused
//! by quota admission), so only the operator's own work is measured.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tailnet_api::{TailnetEgress, TailnetIngress};
use tailnet_policy::{
    EgressPolicy, EgressTarget, IngressPolicy, ObservedNode, PolicyInputs, TargetAddress,
};
use tno_testenv::{E2eEnv, E2eNamespace, OperatorArgs, OperatorProcess};

use crate::lab::{mib, rss_kib};
use crate::report::Table;
use crate::stats::Spread;

const TARGETS_PER_EGRESS: usize = 5;
const APPLY_CONCURRENCY: usize = 16;

/// Policy render time for `egresses` × 5 targets plus as many ingresses, in milliseconds
/// (every run), rendered against the base policy of the crate's fixtures.
pub fn policy_render_millis(egresses: usize, runs: usize) -> Result<Vec<f64>> {
    let base = tailnet_policy::parse_base(include_str!("../../policy/tests/fixtures/base.hujson"))
        .map_err(|e| anyhow::anyhow!("base policy: {e}"))?;
    let inputs = policy_inputs(egresses);
    let mut millis = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let rendered =
            tailnet_policy::render(&base, &inputs).map_err(|e| anyhow::anyhow!("render: {e}"))?;
        millis.push(started.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(rendered);
    }
    Ok(millis)
}

/// `egresses` egresses of 5 IP targets each (spread over 10.0.0.0/8, covered by 16 routers'
/// /12 routes), as many ingresses, and the routers as nodes.
pub fn policy_inputs(egresses: usize) -> PolicyInputs {
    let target_ip = |n: usize| {
        IpAddr::V4(Ipv4Addr::from(
            0x0a00_0000u32 + u32::try_from(n).unwrap_or(0) * 7 + 1,
        ))
    };
    let routers = (0..16u8)
        .map(|r| ObservedNode {
            id: u64::from(r) + 1,
            name: format!("router-{r}"),
            tags: vec!["tag:router".into()],
            ip_addresses: vec![IpAddr::V4(Ipv4Addr::new(100, 64, 1, r))],
            available_routes: vec![
                format!("10.{}.0.0/12", r * 16)
                    .parse()
                    .unwrap_or_else(|_| ipnet::IpNet::default()),
            ],
            approved_routes: vec![],
            online: true,
        })
        .collect();
    PolicyInputs {
        installation_id: "tailnet-operator/bench/demo".into(),
        tag_owners: vec!["group:platform".into()],
        route_approvers: vec!["tag:router".into()],
        ingress_source_allowlist: vec!["group:team-a".into()],
        egresses: (0..egresses)
            .map(|e| EgressPolicy {
                owner: format!("bench/egress-{e}"),
                tag: format!("tag:tno-egress-bench-{e}"),
                targets: (0..TARGETS_PER_EGRESS)
                    .map(|t| EgressTarget {
                        name: format!("e{e}-t{t}"),
                        address: TargetAddress::Ip(target_ip(e * TARGETS_PER_EGRESS + t)),
                        port: 5000 + u16::try_from(t).unwrap_or(0),
                    })
                    .collect(),
            })
            .collect(),
        ingresses: (0..egresses)
            .map(|i| IngressPolicy {
                kind: tailnet_policy::ResourceKind::TailnetIngress,
                owner: format!("bench/ingress-{i}"),
                tag: format!("tag:tno-ingress-bench-{i}"),
                allow_from: vec!["group:team-a".into()],
                ports: vec![443, 5432],
            })
            .collect(),
        nodes: routers,
        contributions: Vec::new(),
    }
}

pub fn policy_table(sizes: &[usize], runs: usize) -> Result<Table> {
    let mut table = Table::new(
        "Policy render time (in-process, tailnet_policy::render)",
        &[
            "egress targets (+ ingresses)",
            "render ms: median (min–max)",
        ],
    );
    for &egresses in sizes {
        // One warm-up render, not counted.
        policy_render_millis(egresses, 1)?;
        let millis = policy_render_millis(egresses, runs)?;
        let spread = Spread::of(&millis).context("no render times")?;
        table.row(vec![
            format!("{} ({egresses})", egresses * TARGETS_PER_EGRESS),
            spread.show(2),
        ]);
    }
    table.note(format!(
        "{runs} renders per size after one warm-up; target: < 100 ms for 5,000 targets."
    ));
    Ok(table)
}

fn egress_object(namespace: &str, tailnet: &str, index: usize) -> Value {
    let targets: Vec<Value> = (0..TARGETS_PER_EGRESS)
        .map(|t| {
            let n = index * TARGETS_PER_EGRESS + t;
            json!({"name": format!("e{index}-t{t}"),
                   "address": format!("192.0.2.{}", 1 + n % 250),
                   "port": 5000 + n / 250})
        })
        .collect();
    json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
        "metadata": {"name": format!("egress-{index}"), "namespace": namespace},
        "spec": {"tailnetRef": {"name": tailnet}, "consumerNamespaces": [namespace],
                 "targets": targets}
    })
}

fn ingress_object(namespace: &str, tailnet: &str, index: usize) -> Value {
    json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
        "metadata": {"name": format!("ingress-{index}"), "namespace": namespace},
        "spec": {"tailnetRef": {"name": tailnet}, "allowFrom": ["group:team-a"],
                 "exposes": [{"name": "db", "dnsLabel": format!("in{index}"), "mode": "tcp",
                              "port": 5432, "backend": {"service": "db", "port": 5432}}]}
    })
}

fn condition_true(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// How many egresses and ingresses are rendered with their grants live.
async fn count_done(
    egresses: &Api<TailnetEgress>,
    ingresses: &Api<TailnetIngress>,
) -> Result<(usize, usize)> {
    let egress_done = egresses
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|e| {
            e.status.as_ref().is_some_and(|s| {
                condition_true(&s.conditions, "ServicesReady")
                    && condition_true(&s.conditions, "PolicyEffective")
            })
        })
        .count();
    let ingress_done = ingresses
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|i| {
            i.status
                .as_ref()
                .is_some_and(|s| condition_true(&s.conditions, "PolicyEffective"))
        })
        .count();
    Ok((egress_done, ingress_done))
}

/// Mutating requests the apiserver answered with 2xx, by `verb resource[/subresource]`.
async fn apiserver_writes(client: &kube::Client) -> Result<BTreeMap<String, f64>> {
    tno_testenv::apiserver_writes(client)
        .await
        .map_err(|e| anyhow::anyhow!("apiserver /metrics: {e}"))
}

/// The store's current revision (the resourceVersion of a fresh list): every persisted write
/// of any object bumps it, a no-op apply does not.
async fn etcd_revision(client: &kube::Client) -> Result<u64> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let list = namespaces
        .list_metadata(&ListParams::default().limit(1))
        .await
        .context("listing namespaces")?;
    list.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .context("list without a numeric resourceVersion")
}

/// Sum of the operator's metric samples whose line starts with `prefix`.
fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Growth of every sample of `family` between two scrapes, by its label set (only those that
/// grew).
fn metric_growth(before: &str, after: &str, family: &str) -> BTreeMap<String, f64> {
    let samples = |text: &str| -> BTreeMap<String, f64> {
        text.lines()
            .filter_map(|line| line.strip_prefix(family))
            .filter_map(|rest| {
                let (labels, value) = rest.rsplit_once(' ')?;
                Some((labels.to_owned(), value.parse::<f64>().ok()?))
            })
            .collect()
    };
    let before = samples(before);
    samples(after)
        .into_iter()
        .filter_map(|(labels, v)| {
            let grown = v - before.get(&labels).copied().unwrap_or(0.0);
            (grown > 0.0).then_some((labels, grown))
        })
        .collect()
}

/// When each resource was applied (just before its apply request) and first seen done by the
/// bench's own watch, by `e/<name>` or `i/<name>`.
type Times = Arc<Mutex<HashMap<String, Instant>>>;

fn egress_done(e: &TailnetEgress) -> bool {
    e.status.as_ref().is_some_and(|s| {
        condition_true(&s.conditions, "ServicesReady")
            && condition_true(&s.conditions, "PolicyEffective")
    })
}

fn ingress_done(i: &TailnetIngress) -> bool {
    i.status
        .as_ref()
        .is_some_and(|s| condition_true(&s.conditions, "PolicyEffective"))
}

/// Records in `times` the first moment the bench's watch saw each object of `api` done.
fn watch_done<K>(
    api: Api<K>,
    prefix: &'static str,
    done: fn(&K) -> bool,
    times: Times,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    tokio::spawn(async move {
        let mut stream = Box::pin(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects(),
        );
        while let Some(item) = stream.next().await {
            let Ok(object) = item else { continue };
            if done(&object) {
                let now = Instant::now();
                times
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(format!("{prefix}/{}", object.name_any()))
                    .or_insert(now);
            }
        }
    })
}

/// The `p`-th percentile (nearest rank) of sorted seconds.
fn percentile_seconds(sorted: &[f64], p: f64) -> f64 {
    let durations: Vec<Duration> = sorted.iter().map(|s| Duration::from_secs_f64(*s)).collect();
    crate::stats::percentile(&durations, p).map_or(f64::NAN, |d| d.as_secs_f64())
}

/// Samples of a histogram family by label set: `(count, sum)`.
fn histogram(text: &str, family: &str) -> BTreeMap<String, (f64, f64)> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (suffix, is_sum) in [("_count", false), ("_sum", true)] {
        let prefix = format!("{family}{suffix}");
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let entry = out.entry(labels.to_owned()).or_default();
            if is_sum {
                entry.1 = value;
            } else {
                entry.0 = value;
            }
        }
    }
    out
}

/// Growth of a histogram between two scrapes: `(calls, seconds)` by label set.
fn histogram_growth(before: &str, after: &str, family: &str) -> BTreeMap<String, (f64, f64)> {
    let before = histogram(before, family);
    histogram(after, family)
        .into_iter()
        .filter_map(|(labels, (count, sum))| {
            let (c0, s0) = before.get(&labels).copied().unwrap_or_default();
            (count > c0).then_some((labels, (count - c0, sum - s0)))
        })
        .collect()
}

/// Requests on the agent kinds the apiserver did not answer with 2xx, by
/// `verb resource code` (finalizer-add conflicts show here as PATCH 409/422).
async fn apiserver_refusals(client: &kube::Client) -> BTreeMap<String, f64> {
    let Ok(request) = http::Request::get("/metrics").body(Vec::new()) else {
        return BTreeMap::new();
    };
    let Ok(text) = client.request_text(request).await else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for sample in tno_testenv::apiserver_requests(&text) {
        if !sample.resource.starts_with("tailnet") || sample.code.starts_with('2') {
            continue;
        }
        let key = format!("{} {} {}", sample.verb, sample.resource, sample.code);
        *out.entry(key).or_insert(0.0) += sample.count;
    }
    out
}

fn growth(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let grown = v - before.get(k).copied().unwrap_or(0.0);
            (grown > 0.0).then(|| (k.clone(), grown))
        })
        .collect()
}

/// Headscale server processes of this test environment (their command line names a file in
/// `dir`).
fn headscale_pids(dir: &Path) -> Vec<u32> {
    let dir = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            comm.trim() == "headscale" && String::from_utf8_lossy(&cmdline).contains(&dir)
        })
        .collect()
}

/// CPU seconds (user + system) used so far by `pids`.
fn cpu_seconds(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    pids.iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after_comm = stat.rsplit_once(") ")?.1;
            let fields: Vec<&str> = after_comm.split(' ').collect();
            // utime and stime are fields 14 and 15 of stat; 12 and 13 after `pid (comm)`.
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / ticks)
        })
        .sum()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split(' ').next().map(str::to_owned))
        .unwrap_or_default()
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// Headscale calls that mint keys and apply the policy (the part of a step that is
/// Headscale's own work, subtracted for the growth target).
const MINT: &str = "POST /api/v1/preauthkey\"";
const POLICY_APPLY: &str = "PUT /api/v1/policy\"";
/// At most this many reconciles (so key mints) in flight: 16 egress + 16 ingress (the
/// operator's default `--max-concurrent-reconciles`).
const MAX_MINTS_IN_FLIGHT: f64 = 32.0;

/// One growth step's measurements.
struct Step {
    egresses: usize,
    ingresses: usize,
    apply_seconds: f64,
    settle_seconds: f64,
    rss_kib: u64,
    peak_rss_kib: u64,
    policy_bytes: f64,
    /// Convergence (apply → done) of the resources added in this step, sorted, by kind.
    egress_seconds: Vec<f64>,
    ingress_seconds: Vec<f64>,
    /// Headscale call histogram growth during the step: `(calls, seconds)` by labels.
    headscale: BTreeMap<String, (f64, f64)>,
    headscale_cpu_seconds: f64,
    reconcile_errors: Vec<(String, f64)>,
    refusals: Vec<(String, f64)>,
    finalizer_failures_logged: usize,
    load: (String, String),
    /// Resources of the step not done when the bench gave up waiting (15 min).
    unfinished: usize,
}

impl Step {
    /// Headscale's own key-mint and policy-apply time: the mints' total call time over the
    /// most that can be in flight (a lower bound of the wall time they took) plus the policy
    /// applies (one at a time).
    fn headscale_bound_seconds(&self) -> f64 {
        self.headscale
            .iter()
            .map(|(labels, (_, seconds))| {
                if labels.contains(MINT) {
                    seconds / MAX_MINTS_IN_FLIGHT
                } else if labels.contains(POLICY_APPLY) {
                    *seconds
                } else {
                    0.0
                }
            })
            .sum()
    }
}

/// Runs the control-plane benchmark; `steps` are cumulative resource totals (half egress,
/// half ingress), e.g. `[10, 100, 400]`. The operator binary is `operator`.
pub async fn run(operator_binary: &Path, steps: &[usize], window: Duration) -> Result<Vec<Table>> {
    let started = Instant::now();
    let env = E2eEnv::shared()
        .await
        .map_err(|e| anyhow::anyhow!("test environment: {e}"))?;
    let env_seconds = started.elapsed().as_secs_f64();
    let ops = env
        .namespace("bench-cp")
        .await
        .map_err(|e| anyhow::anyhow!("namespace: {e}"))?;
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let apply = PatchParams::apply("tno-bench").force();
    let tailnet = format!("t-{ns}");
    prepare_namespace(&env, &ops, &client, &ns, &tailnet, &apply).await?;
    let mut operator = env
        .start_operator(operator_binary, &OperatorArgs::new(&ns).to_args())
        .await
        .map_err(|e| anyhow::anyhow!("operator: {e}"))?;
    operator
        .wait_ready(Duration::from_secs(60))
        .await
        .map_err(|e| anyhow::anyhow!("operator ready: {e}"))?;
    let idle_rss = rss_kib(operator.pid());
    let headscale = headscale_pids(env.dir().parent().unwrap_or(env.dir()));

    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), &ns);
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), &ns);
    let done: Times = Arc::default();
    let watches = [
        watch_done(egresses.clone(), "e", egress_done, done.clone()),
        watch_done(ingresses.clone(), "i", ingress_done, done.clone()),
    ];
    let applied: Times = Arc::default();
    let scale = ScaleRun {
        client: &client,
        ns: &ns,
        tailnet: &tailnet,
        apply: &apply,
        egresses: &egresses,
        ingresses: &ingresses,
        done: &done,
        applied: &applied,
        headscale: &headscale,
    };
    let mut results = Vec::new();
    let mut have = 0usize;
    let mut finalizer_logged_before = 0usize;
    for &total in steps {
        let half = total / 2;
        let (step, finalizer_logged) =
            scale_step(&scale, &mut operator, have, half, finalizer_logged_before).await?;
        let unfinished = step.unfinished;
        results.push(step);
        finalizer_logged_before = finalizer_logged;
        have = half;
        if unfinished > 0 {
            break;
        }
    }
    for watch in watches {
        watch.abort();
    }

    let steady = steady_state(&client, &operator, window).await?;
    let tables = vec![
        scale_table(&results, &steady, idle_rss, env_seconds),
        convergence_table(&results),
        headscale_table(&results, &headscale),
        errors_table(&results),
        writes_table(&steady, window),
        operator_calls_table(&steady, window),
    ];
    drop(operator);
    Ok(tables)
}

/// The benchmark namespace: the bootstrap objects, a quota of zero pods (no agents), the
/// backend Service the ingresses name, and the Tailnet.
async fn prepare_namespace(
    env: &E2eEnv,
    ops: &E2eNamespace<'_>,
    client: &kube::Client,
    ns: &str,
    tailnet: &str,
    apply: &PatchParams,
) -> Result<()> {
    ops.create_bootstrap(&env.base_policy().map_err(|e| anyhow::anyhow!("{e}"))?)
        .await
        .map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
    // No pods in this namespace: the agents are not started.
    Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(client.clone(), ns)
        .patch(
            "no-agents",
            apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "no-agents"}, "spec": {"hard": {"pods": "0"}}})),
        )
        .await
        .context("ResourceQuota")?;
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), ns)
        .patch(
            "db",
            apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "db"},
                "spec": {"selector": {"app": "db"}, "ports": [{"port": 5432}]}})),
        )
        .await
        .context("backend Service")?;
    Api::<tailnet_api::Tailnet>::all(client.clone())
        .patch(
            tailnet,
            apply,
            &Patch::Apply(env.tailnet_object(tailnet, "Apply")),
        )
        .await
        .context("Tailnet")?;
    Ok(())
}

/// What every step of the scale run works with.
struct ScaleRun<'a> {
    client: &'a kube::Client,
    ns: &'a str,
    tailnet: &'a str,
    apply: &'a PatchParams,
    egresses: &'a Api<TailnetEgress>,
    ingresses: &'a Api<TailnetIngress>,
    /// When each resource was first seen done (by the watches) and when it was applied.
    done: &'a Times,
    applied: &'a Times,
    headscale: &'a [u32],
}

/// One step: applies resources `have..half` of each kind, waits until all are done (15 min
/// at most) and measures; also returns the count of finalizer failures logged so far.
async fn scale_step(
    scale: &ScaleRun<'_>,
    operator: &mut OperatorProcess,
    have: usize,
    half: usize,
    finalizer_logged_before: usize,
) -> Result<(Step, usize)> {
    let &ScaleRun {
        client, headscale, ..
    } = scale;
    let load_start = load_average();
    let metrics_before = operator.metrics().await.unwrap_or_default();
    let refusals_before = apiserver_refusals(client).await;
    let cpu_before = cpu_seconds(headscale);
    let step_started = Instant::now();
    apply_resources(scale, have, half).await?;
    let apply_seconds = step_started.elapsed().as_secs_f64();
    let unfinished = wait_until_done(scale, operator, half).await?;
    let settle_seconds = step_started.elapsed().as_secs_f64();
    let metrics = operator.metrics().await.unwrap_or_default();
    let (egress_seconds, ingress_seconds) = convergence_seconds(scale, have, half);
    let log = operator.log_text();
    let finalizer_logged = log.matches("failed to add finalizer").count();
    let step = Step {
        egresses: half,
        ingresses: half,
        apply_seconds,
        settle_seconds,
        rss_kib: rss_kib(operator.pid()),
        peak_rss_kib: peak_rss_kib(operator.pid()),
        policy_bytes: metric_sum(&metrics, "tailnet_operator_policy_size_bytes"),
        egress_seconds,
        ingress_seconds,
        headscale: histogram_growth(
            &metrics_before,
            &metrics,
            "tailnet_operator_headscale_api_call_duration_seconds",
        ),
        headscale_cpu_seconds: cpu_seconds(headscale) - cpu_before,
        reconcile_errors: metric_growth(
            &metrics_before,
            &metrics,
            "tailnet_operator_reconcile_errors_total",
        )
        .into_iter()
        .collect(),
        refusals: growth(&refusals_before, &apiserver_refusals(client).await),
        finalizer_failures_logged: finalizer_logged.saturating_sub(finalizer_logged_before),
        load: (load_start, load_average()),
        unfinished,
    };
    Ok((step, finalizer_logged))
}

/// Applies resources `have..half` of each kind, `APPLY_CONCURRENCY` at a time, noting when
/// each was applied.
async fn apply_resources(scale: &ScaleRun<'_>, have: usize, half: usize) -> Result<()> {
    let &ScaleRun {
        ns,
        tailnet,
        apply,
        egresses,
        ingresses,
        applied,
        ..
    } = scale;
    let mut tasks = tokio::task::JoinSet::new();
    let mut objects: Vec<(bool, Value)> = (have..half)
        .flat_map(|i| {
            [
                (true, egress_object(ns, tailnet, i)),
                (false, ingress_object(ns, tailnet, i)),
            ]
        })
        .collect();
    while !objects.is_empty() || !tasks.is_empty() {
        while tasks.len() < APPLY_CONCURRENCY
            && let Some((is_egress, object)) = objects.pop()
        {
            let (egresses, ingresses, apply) = (egresses.clone(), ingresses.clone(), apply.clone());
            let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
            applied.lock().unwrap_or_else(|p| p.into_inner()).insert(
                format!("{}/{name}", if is_egress { "e" } else { "i" }),
                Instant::now(),
            );
            tasks.spawn(async move {
                if is_egress {
                    egresses
                        .patch(&name, &apply, &Patch::Apply(object))
                        .await
                        .map(|_| ())
                } else {
                    ingresses
                        .patch(&name, &apply, &Patch::Apply(object))
                        .await
                        .map(|_| ())
                }
            });
        }
        if let Some(finished) = tasks.join_next().await {
            finished
                .context("apply task")?
                .context("applying a resource")?;
        }
    }
    Ok(())
}

/// Waits until the watches and a list agree that all `half` resources of each kind are done;
/// after 15 minutes reports how many are not (the step's tables show them).
async fn wait_until_done(
    scale: &ScaleRun<'_>,
    operator: &mut OperatorProcess,
    half: usize,
) -> Result<usize> {
    let &ScaleRun {
        egresses,
        ingresses,
        done,
        ..
    } = scale;
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut unfinished = 0usize;
    let keys: Vec<String> = (0..half)
        .flat_map(|i| [format!("e/egress-{i}"), format!("i/ingress-{i}")])
        .collect();
    loop {
        let missing = {
            let done = done.lock().unwrap_or_else(|p| p.into_inner());
            keys.iter().filter(|k| !done.contains_key(*k)).count()
        };
        // The watch says all are done: confirm with a list.
        if missing == 0 {
            let (e, i) = count_done(egresses, ingresses).await?;
            if e >= half && i >= half {
                break;
            }
        }
        if Instant::now() > deadline {
            // Report what there is: the step's tables show how many never got done.
            let (e, i) = count_done(egresses, ingresses).await?;
            eprintln!(
                "after 15 min only {e}/{half} egresses and {i}/{half} ingresses are done\n{}",
                operator.log_tail(20)
            );
            unfinished = (half - e.min(half)) + (half - i.min(half));
            break;
        }
        if !operator.is_running() {
            bail!("the operator exited:\n{}", operator.log_tail(40));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(unfinished)
}

/// Apply → done seconds of the resources `have..half` of each kind, sorted.
fn convergence_seconds(scale: &ScaleRun<'_>, have: usize, half: usize) -> (Vec<f64>, Vec<f64>) {
    let &ScaleRun { done, applied, .. } = scale;
    let done = done.lock().unwrap_or_else(|p| p.into_inner());
    let applied = applied.lock().unwrap_or_else(|p| p.into_inner());
    let convergence = |prefix: &str, name: &str| -> Vec<f64> {
        let mut seconds: Vec<f64> = (have..half)
            .filter_map(|i| {
                let key = format!("{prefix}/{name}-{i}");
                let end = done.get(&key)?;
                let start = applied.get(&key)?;
                Some(end.saturating_duration_since(*start).as_secs_f64())
            })
            .collect();
        seconds.sort_by(f64::total_cmp);
        seconds
    };
    (convergence("e", "egress"), convergence("i", "ingress"))
}

/// Counters before and after the steady-state window.
struct Steady {
    before: BTreeMap<String, f64>,
    after: BTreeMap<String, f64>,
    revision_before: u64,
    revision_after: u64,
    operator_before: String,
    operator_after: String,
    steady_rss: u64,
    peak_rss: u64,
}

/// Steady state: everything done; counts writes over a window of resyncs.
async fn steady_state(
    client: &kube::Client,
    operator: &OperatorProcess,
    window: Duration,
) -> Result<Steady> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = apiserver_writes(client).await?;
    let revision_before = etcd_revision(client).await?;
    let operator_before = operator.metrics().await.unwrap_or_default();
    tokio::time::sleep(window).await;
    let after = apiserver_writes(client).await?;
    let revision_after = etcd_revision(client).await?;
    let operator_after = operator.metrics().await.unwrap_or_default();
    let steady_rss = rss_kib(operator.pid());
    let peak_rss = peak_rss_kib(operator.pid());
    Ok(Steady {
        before,
        after,
        revision_before,
        revision_after,
        operator_before,
        operator_after,
        steady_rss,
        peak_rss,
    })
}

/// Time, memory and policy size per step.
fn scale_table(results: &[Step], steady: &Steady, idle_rss: u64, env_seconds: f64) -> Table {
    let &Steady {
        steady_rss,
        peak_rss,
        ..
    } = steady;
    let mut scale = Table::new(
        "Control plane at scale (real apiserver + Headscale; agents not started)",
        &[
            "resources (egress × 5 targets + ingress)",
            "added",
            "apply (client) s",
            "all rendered + grants live, s",
            "s per added resource",
            "Headscale key mint + policy apply s (lower bound)",
            "s per added resource without Headscale's",
            "operator RSS MiB (peak)",
            "policy bytes",
            "load average (start → end)",
        ],
    );
    let mut previous = 0;
    for step in results {
        let total = step.egresses + step.ingresses;
        let added = total - previous;
        let headscale_seconds = step.headscale_bound_seconds();
        scale.row(vec![
            format!("{total} ({} + {})", step.egresses, step.ingresses),
            added.to_string(),
            format!("{:.1}", step.apply_seconds),
            if step.unfinished > 0 {
                format!(
                    "**not done**: {} still missing after {:.1}",
                    step.unfinished, step.settle_seconds
                )
            } else {
                format!("{:.1}", step.settle_seconds)
            },
            format!("{:.3}", step.settle_seconds / added.max(1) as f64),
            format!("{headscale_seconds:.1}"),
            format!(
                "{:.3}",
                (step.settle_seconds - headscale_seconds).max(0.0) / added.max(1) as f64
            ),
            format!("{} ({})", mib(step.rss_kib), mib(step.peak_rss_kib)),
            format!("{:.0}", step.policy_bytes),
            format!("{} → {}", step.load.0, step.load.1),
        ]);
        previous = total;
    }
    scale.note(format!(
        "Steps are cumulative (the next step adds resources to the previous ones). Operator RSS \
         idle before any resource: {} MiB; after the steady-state window {} MiB; peak (VmHWM) \
         {} MiB. Test environment start: {env_seconds:.0} s. Headscale's key mint + policy \
         apply: the step's total `POST /api/v1/preauthkey` call time from the operator's \
         headscale_api_call_duration_seconds ÷ {MAX_MINTS_IN_FLIGHT} (the most in flight) plus \
         its `PUT /api/v1/policy` time: a lower bound of the wall time they took.",
        mib(idle_rss),
        mib(steady_rss),
        mib(peak_rss)
    ));
    scale
}

/// Per-resource convergence percentiles per step and kind.
fn convergence_table(results: &[Step]) -> Table {
    let mut convergence = Table::new(
        "Per-resource convergence: its apply → Ready inputs live (seen by a watch), resources added in the step",
        &[
            "step",
            "kind",
            "resources",
            "p50 s",
            "p90 s",
            "p99 s",
            "max s",
        ],
    );
    let mut previous = 0;
    for step in results {
        let total = step.egresses + step.ingresses;
        for (kind, seconds) in [
            ("TailnetEgress", &step.egress_seconds),
            ("TailnetIngress", &step.ingress_seconds),
        ] {
            convergence.row(vec![
                format!("{previous} → {total}"),
                kind.into(),
                seconds.len().to_string(),
                format!("{:.1}", percentile_seconds(seconds, 50.0)),
                format!("{:.1}", percentile_seconds(seconds, 90.0)),
                format!("{:.1}", percentile_seconds(seconds, 99.0)),
                format!("{:.1}", seconds.last().copied().unwrap_or(f64::NAN)),
            ]);
        }
        previous = total;
    }
    convergence.note(
        "Egress done = ServicesReady and PolicyEffective True; ingress done = PolicyEffective \
         True. Measured from just before the resource's apply request to the first watch \
         event showing it done (nearest-rank percentiles), over the resources that got done.",
    );
    convergence
}

/// Headscale's calls and CPU per step.
fn headscale_table(results: &[Step], headscale: &[u32]) -> Table {
    let mut headscale_table = Table::new(
        "Headscale's share per step (the operator's headscale_api_call_duration_seconds; Headscale's CPU from /proc)",
        &[
            "step",
            "call {labels}",
            "calls",
            "total call s",
            "mean s per call",
        ],
    );
    let mut previous = 0;
    for step in results {
        let total = step.egresses + step.ingresses;
        for (labels, (calls, seconds)) in &step.headscale {
            headscale_table.row(vec![
                format!("{previous} → {total}"),
                labels.clone(),
                format!("{calls:.0}"),
                format!("{seconds:.1}"),
                format!("{:.3}", seconds / calls.max(1.0)),
            ]);
        }
        headscale_table.row(vec![
            format!("{previous} → {total}"),
            "Headscale process CPU (user + system)".into(),
            String::new(),
            format!("{:.1}", step.headscale_cpu_seconds),
            String::new(),
        ]);
        previous = total;
    }
    headscale_table.note(format!(
        "Calls of concurrent reconciles overlap: the total call time is not wall time. \
         Headscale processes found: {}.",
        headscale.len()
    ));
    headscale_table
}

/// Failed reconciles and refused writes per step.
fn errors_table(results: &[Step]) -> Table {
    let mut errors = Table::new(
        "Failed reconciles and refused writes per step (finalizer-conflict hypothesis)",
        &["step", "what", "count"],
    );
    let mut previous = 0;
    for step in results {
        let total = step.egresses + step.ingresses;
        let label = format!("{previous} → {total}");
        for (labels, count) in &step.reconcile_errors {
            errors.row(vec![
                label.clone(),
                format!("reconcile_errors_total {labels}"),
                format!("{count:.0}"),
            ]);
        }
        for (key, count) in &step.refusals {
            errors.row(vec![
                label.clone(),
                format!("apiserver {key}"),
                format!("{count:.0}"),
            ]);
        }
        errors.row(vec![
            label,
            "operator log: `failed to add finalizer`".into(),
            step.finalizer_failures_logged.to_string(),
        ]);
        previous = total;
    }
    errors.note(
        "reconcile_errors_total: the operator's failed reconciles by controller and reason \
         (each backs the object off 5 s, 10 s, 20 s, …); apiserver: requests on the agent \
         kinds answered with a non-2xx code (all clients), from apiserver_request_total.",
    );
    errors
}

/// API writes during the steady-state window (all clients), with the operator's reconciles,
/// Headscale policy writes and etcd revisions in the title.
fn writes_table(steady: &Steady, window: Duration) -> Table {
    let Steady {
        before,
        after,
        operator_before,
        operator_after,
        ..
    } = steady;
    let &Steady {
        revision_before,
        revision_after,
        ..
    } = steady;
    let reconciles = metric_sum(operator_after, "tailnet_operator_reconciles_total")
        - metric_sum(operator_before, "tailnet_operator_reconciles_total");
    let policy_applied = |text: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with("tailnet_operator_policy_syncs_total") && l.contains("applied")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let policy_writes = policy_applied(operator_after) - policy_applied(operator_before);
    let mut writes = Table::new(
        format!(
            "API writes during {} s of steady state ({reconciles:.0} reconciles; Headscale \
             policy writes: {policy_writes:.0}; etcd revisions: {})",
            window.as_secs(),
            revision_after.saturating_sub(revision_before)
        ),
        &["request (2xx, all clients of the apiserver)", "count"],
    );
    let mut any = false;
    for (key, value) in after {
        let delta = value - before.get(key).copied().unwrap_or(0.0);
        if delta > 0.0 {
            any = true;
            writes.row(vec![key.clone(), format!("{delta:.0}")]);
        }
    }
    if !any {
        writes.row(vec!["(none)".into(), "0".into()]);
    }
    writes.note(
        "Counted from the apiserver's apiserver_request_total (mutating verbs, 2xx) before \
         and after the window; it includes every client: kubelet and lease renewals, \
         kube-controller-manager, the operator's leader lease. A server-side apply that \
         changes nothing is still a request (and a full admission + diff on the apiserver) \
         but no etcd write: compare with the etcd revisions in the title.",
    );
    writes
}

/// The operator's own counters during the steady-state window.
fn operator_calls_table(steady: &Steady, window: Duration) -> Table {
    let Steady {
        operator_before,
        operator_after,
        ..
    } = steady;
    let mut operator_calls = Table::new(
        format!(
            "The operator's own counters during the same {} s",
            window.as_secs()
        ),
        &["counter {labels}", "growth"],
    );
    for family in [
        "tailnet_operator_child_applies_total",
        "tailnet_operator_headscale_api_calls_total",
    ] {
        for (labels, grown) in metric_growth(operator_before, operator_after, family) {
            operator_calls.row(vec![
                format!(
                    "{} {labels}",
                    family.trim_start_matches("tailnet_operator_")
                ),
                format!("{grown:.0}"),
            ]);
        }
    }
    operator_calls.note(
        "child_applies: `unchanged` = a server-side apply skipped because the rendered child is \
         what was last applied and (for watched kinds) still as applied; any other decision is \
         a request. headscale_api_calls: every call to Headscale's API by endpoint and HTTP \
         status.",
    );
    operator_calls
}
