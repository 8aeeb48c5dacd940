//! A real Prometheus (`prometheus` 3.16.0 from deps/build.sh, Kubernetes SD only) in the lab,
//! configured from what the chart renders: the ServiceMonitor and PodMonitor become its
//! Kubernetes-SD scrape jobs (same selectors and named ports as prometheus-operator
//! generates), the PrometheusRule's spec is its rule file. Test-only settings, all through
//! chart values except the first: evaluation every 1 s (Prometheus' global setting), scrape
//! intervals of 2 s (`metrics.serviceMonitor.interval`, `agent.podMonitor.interval`) and
//! short `for`s (`metrics.prometheusRule.alerts.<alert>.for`).
//!
//! The operator runs as a process in the lab (not a pod), so the test gives the chart's
//! metrics Service (its labels as rendered, no selector) an EndpointSlice with the operator's
//! lab address: service discovery, the ServiceMonitor's label selection and port-name match
//! are real. Agents are pods of the test kubelet, found through the PodMonitor.
//!
//! Phases: healthy (every target up, every rule evaluated, no alert), route withdrawn
//! (TailnetRouteMissing fires, resolves), Headscale stopped (TailnetHeadscaleUnreachable fires
//! within its `for` plus detection, resolves after the restart), an agent frozen (TailnetAgentOffline fires, resolves); then, healthy again (no
//! alert), a second egress whose Deployment a ResourceQuota refuses (TailnetOperatorReconcileErrors
//! fires), every metric of every rule has series in the live scrape and every panel of the
//! chart's Grafana dashboard is queried and returns data.

mod support;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::conditions::{ConditionIs, WithConditions, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{
    agent_pods, apply, apply_egress, bootstrap_applied_tailnet, ingress_object, remote_db_target,
    service_object, tailnet_ipv4, test_server_deployment, tls_secret,
};
use support::tailnet::{https_get_hello, ok_200, self_signed};
use support::wait::{WAIT, eventually, wait_for};
use tailnet_api::{TailnetEgress, TailnetIngress};
use tno_testenv::{ChartMonitoring, E2eEnv, LabPrometheus, OperatorArgs};

/// The release name the chart is rendered with.
const RELEASE: &str = "tno";
/// Port of the operator's admin server in its netns (`/metrics` there).
const OPERATOR_ADMIN_PORT: u16 = 8080;
/// The shortened `for` of the alerts this test drives.
const FOR: &str = "5s";
const FOR_SECONDS: u64 = 5;
/// Scrape interval of both monitors in the test.
const SCRAPE_INTERVAL: &str = "2s";
/// What a `rate(...[$__rate_interval])` of the dashboard becomes in the test (Grafana sets it
/// from the scrape interval; 1m covers many 2 s scrapes).
const RATE_INTERVAL: &str = "1m";
/// Metrics a rule uses that come from another exporter the lab does not run: cert-manager's
/// controller is not in the lab (its CRDs are; a stand-in issues certificates), so its
/// `certmanager_certificate_expiration_timestamp_seconds` has no series here.
const NOT_IN_THE_LAB: [&str; 1] = ["certmanager_certificate_expiration_timestamp_seconds"];

fn chart_values() -> Vec<String> {
    let mut sets = vec![
        format!("metrics.serviceMonitor.interval={SCRAPE_INTERVAL}"),
        format!("agent.podMonitor.interval={SCRAPE_INTERVAL}"),
        "metrics.grafanaDashboard.enabled=true".to_string(),
    ];
    for alert in [
        "TailnetHeadscaleUnreachable",
        "TailnetAgentOffline",
        "TailnetRouteMissing",
        "TailnetAgentTargetUnreachable",
        "TailnetOperatorReconcileErrors",
    ] {
        sets.push(format!("metrics.prometheusRule.alerts.{alert}.for={FOR}"));
    }
    sets
}

/// The chart's metrics Service without its selector (the operator is no pod here) and an
/// EndpointSlice naming the operator process' lab address on the Service's port.
async fn publish_operator_endpoint(
    client: &kube::Client,
    ns: &str,
    monitoring: &ChartMonitoring,
    operator_ip: &str,
) {
    let mut service = monitoring.metrics_service.clone();
    let name = service["metadata"]["name"]
        .as_str()
        .expect("metrics Service name")
        .to_owned();
    if let Some(spec) = service["spec"].as_object_mut() {
        spec.remove("selector");
    }
    let port = service["spec"]["ports"][0].clone();
    apply(
        &Api::<Service>::namespaced(client.clone(), ns),
        &name,
        service,
    )
    .await
    .expect("the chart's metrics Service");
    let slice_name = format!("{name}-operator-process");
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": slice_name, "namespace": ns, "labels": {
            "kubernetes.io/service-name": name,
            "endpointslice.kubernetes.io/managed-by": "tno-prometheus-e2e"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [operator_ip], "conditions": {"ready": true}}],
        "ports": [{"name": port["name"], "port": OPERATOR_ADMIN_PORT, "protocol": "TCP"}],
    });
    apply(
        &Api::<EndpointSlice>::namespaced(client.clone(), ns),
        &slice_name,
        slice,
    )
    .await
    .expect("EndpointSlice of the operator process");
}

/// The firing alerts named `alert` whose labels include `labels`.
async fn firing(prometheus: &LabPrometheus, alert: &str, labels: &[(&str, &str)]) -> Vec<Value> {
    alerts_named(prometheus, alert, labels)
        .await
        .into_iter()
        .filter(|a| a["state"] == "firing")
        .collect()
}

async fn alerts_named(
    prometheus: &LabPrometheus,
    alert: &str,
    labels: &[(&str, &str)],
) -> Vec<Value> {
    let all = prometheus.alerts().await.expect("/api/v1/alerts");
    all.into_iter()
        .filter(|a| {
            a["labels"]["alertname"] == alert && labels.iter().all(|(k, v)| a["labels"][*k] == *v)
        })
        .collect()
}

/// Waits until `alert` (with `labels`) is firing; returns the alert and when it fired
/// (measured from `since`).
async fn wait_firing(
    prometheus: &LabPrometheus,
    alert: &str,
    labels: &[(&str, &str)],
    since: Instant,
) -> (Value, Duration) {
    let found = wait_for(&format!("{alert} {labels:?} firing"), WAIT, || async {
        let fired = firing(prometheus, alert, labels).await;
        match fired.first() {
            Some(a) => Ok(a.clone()),
            None => Err(format!(
                "alerts now: {}",
                Value::Array(prometheus.alerts().await.unwrap_or_default())
            )),
        }
    })
    .await;
    let after = since.elapsed();
    println!("FIRING after {:.1}s: {found}", after.as_secs_f64());
    (found, after)
}

/// Waits until no alert `alert` with `labels` is pending or firing; returns how long it took.
async fn wait_resolved(
    prometheus: &LabPrometheus,
    alert: &str,
    labels: &[(&str, &str)],
    since: Instant,
) -> Duration {
    wait_for(&format!("{alert} {labels:?} resolved"), WAIT, || async {
        let left = alerts_named(prometheus, alert, labels).await;
        if left.is_empty() {
            Ok(())
        } else {
            Err(Value::Array(left).to_string())
        }
    })
    .await;
    let after = since.elapsed();
    println!(
        "RESOLVED after {:.1}s: {alert} {labels:?} no longer in /api/v1/alerts",
        after.as_secs_f64()
    );
    after
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_prometheus_fires_the_chart_alerts_and_answers_the_dashboard() {
    let started = Instant::now();
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("prom").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let tailnet_name = bootstrap_applied_tailnet(&env, &ops).await;
    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");
    let monitoring = ChartMonitoring::render(RELEASE, &ns, &chart_values()).expect("helm template");
    publish_operator_endpoint(&client, &ns, &monitoring, &operator.lab_ip().to_string()).await;
    let prometheus = env
        .start_prometheus(&monitoring, "1s")
        .await
        .expect("prometheus");
    let lab = Lab {
        env: &env,
        client: &client,
        ns: &ns,
        tailnet_name: &tailnet_name,
        prometheus: &prometheus,
        monitoring: &monitoring,
    };
    let agents = healthy_lab(&lab).await;
    route_withdrawn(&lab).await;
    headscale_stopped(&lab).await;
    agent_frozen(&lab, &agents).await;
    // Healthy again (every fault undone): nothing pending or firing. Counters of failures
    // (reconcile errors, Headscale API errors) have series now: they appear with their first
    // event, and the faults above were such events.
    no_alert(&prometheus).await;
    reconcile_errors(&lab).await;
    every_rule_selects_live_series(&lab).await;
    every_dashboard_panel_returns_data(&lab).await;
    operator.terminate().await.expect("operator stops cleanly");
    println!("wall time: {:.1}s", started.elapsed().as_secs_f64());
}

struct Lab<'a> {
    env: &'a E2eEnv,
    client: &'a kube::Client,
    ns: &'a str,
    tailnet_name: &'a str,
    prometheus: &'a LabPrometheus,
    monitoring: &'a ChartMonitoring,
}

/// An egress (probing the remote db every 2 s) and an https ingress the laptop requests
/// through; waits until Prometheus scrapes the operator and both agents, and nothing fires.
/// Returns the agent pods' names.
/// The egress (probing every 2 s) and the https ingress, each carrying traffic: a client
/// pod's connection through the egress, three requests of the laptop through the ingress.
async fn traffic_through_both_agents(lab: &Lab<'_>) {
    let &Lab {
        env,
        client,
        ns,
        tailnet_name,
        ..
    } = lab;
    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), ns);
    let mut target = remote_db_target();
    target["probe"] = json!({"interval": "2s"});
    apply_egress(&egresses, ns, "site", tailnet_name, json!([target]))
        .await
        .expect("egress");
    apply(
        &Api::<Deployment>::namespaced(client.clone(), ns),
        "frontend",
        test_server_deployment(
            ns,
            "frontend",
            json!([
                "http-echo",
                "--listen",
                "0.0.0.0:8080",
                "--name",
                "frontend"
            ]),
        ),
    )
    .await
    .expect("frontend");
    apply(
        &Api::<Service>::namespaced(client.clone(), ns),
        "frontend",
        service_object(ns, "frontend", 8080),
    )
    .await
    .expect("frontend Service");
    let portal = format!("portal.{ns}.lab.example.net");
    let (cert_pem, key_pem) = self_signed(std::slice::from_ref(&portal));
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &tls_secret("portal-tls", &cert_pem, &key_pem),
        )
        .await
        .expect("TLS Secret");
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), ns);
    apply(
        &ingresses,
        "portal",
        ingress_object(
            ns,
            "portal",
            tailnet_name,
            Some("portal-tls"),
            json!([{"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443,
                    "backend": {"service": "frontend", "port": "main"}}]),
        ),
    )
    .await
    .expect("ingress");
    wait_for_condition(&egresses, "site", ConditionIs::new("Ready", "True"), None).await;
    let ingress = wait_for_condition(
        &ingresses,
        "portal",
        ConditionIs::new("Ready", "True"),
        None,
    )
    .await;
    let ip = tailnet_ipv4(&ingress.status.clone().unwrap_or_default().tailnet_ips)
        .expect("tailnet IPv4");
    let laptop = env.tailnet().laptop.node.local_api();
    for _ in 0..3 {
        wait_for("https through the ingress", WAIT, || async {
            https_get_hello(&laptop, &ip, &portal, &cert_pem, &[])
                .await
                .and_then(ok_200)
        })
        .await;
    }
    // Bytes through the egress: a client pod's connection to the remote db.
    let run = lab
        .env
        .tcp_check(
            client,
            ns,
            "client",
            &format!("remote-db.{ns}.svc.cluster.local:5432"),
            30,
        )
        .await
        .expect("client pod");
    assert!(run.succeeded(), "the egress carries bytes:\n{run}");
}

async fn healthy_lab(lab: &Lab<'_>) -> Vec<String> {
    let &Lab {
        client,
        ns,
        prometheus,
        ..
    } = lab;
    traffic_through_both_agents(lab).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (targets, agents) = wait_for("every target scraped and up", WAIT, || async {
        let mut agents = Vec::new();
        for instance in ["tailnet-egress-site", "tailnet-ingress-portal"] {
            let found = agent_pods(&pods, instance)
                .await
                .map_err(|e| e.to_string())?;
            agents.extend(
                found
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .map(|p| p.name_any()),
            );
        }
        let active = prometheus
            .active_targets()
            .await
            .map_err(|e| e.to_string())?;
        let up: BTreeSet<String> = active
            .iter()
            .filter(|t| t["health"] == "up")
            .filter_map(|t| {
                let labels = &t["labels"];
                Some(format!(
                    "{}|{}",
                    labels["job"].as_str()?,
                    labels["pod"].as_str().unwrap_or("-")
                ))
            })
            .collect();
        let operator_up = up.iter().any(|t| t.ends_with("-metrics|-"));
        let agents_up = agents
            .iter()
            .all(|a| up.iter().any(|t| t.ends_with(&format!("|{a}"))));
        if operator_up && agents_up && agents.len() >= 2 {
            Ok((active, agents))
        } else {
            Err(format!("up: {up:?}; all: {}", Value::Array(active)))
        }
    })
    .await;
    for target in &targets {
        println!(
            "target {} {} health={} labels={}",
            target["scrapePool"], target["scrapeUrl"], target["health"], target["labels"]
        );
    }
    // Rules evaluated at least once with the live data, and nothing pending or firing.
    wait_for("every rule evaluated, no alert", WAIT, || async {
        let rules = prometheus
            .api("rules", &[])
            .await
            .map_err(|e| e.to_string())?;
        let all: Vec<&Value> = rules["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        if all.len() != lab.monitoring.alerts().len() {
            return Err(format!("{} rules loaded", all.len()));
        }
        if let Some(bad) = all.iter().find(|r| r["health"] != "ok") {
            return Err(format!("rule not ok: {bad}"));
        }
        Ok(())
    })
    .await;
    no_alert(prometheus).await;
    agents
}

/// Waits until no alert is pending or firing.
async fn no_alert(prometheus: &LabPrometheus) {
    wait_for("no alert pending or firing", WAIT, || async {
        let alerts = prometheus.alerts().await.map_err(|e| e.to_string())?;
        if alerts.is_empty() {
            Ok(())
        } else {
            Err(format!("alerts: {}", Value::Array(alerts)))
        }
    })
    .await;
}

/// Every metric every rule selects (Prometheus' own parser names them) has series in the live
/// scrape, except the documented [`NOT_IN_THE_LAB`] ones.
async fn every_rule_selects_live_series(lab: &Lab<'_>) {
    let prometheus = lab.prometheus;
    let alerts = lab.monitoring.alerts();
    assert!(alerts.len() >= 12, "the chart's alerts: {alerts:?}");
    let mut skipped = BTreeSet::new();
    for (alert, expr, _) in &alerts {
        let names = prometheus
            .selected_metric_names(expr)
            .await
            .unwrap_or_else(|e| panic!("{alert}: parse_query: {e}"));
        assert!(!names.is_empty(), "{alert}: no selector found in {expr}");
        for name in names {
            if NOT_IN_THE_LAB.contains(&name.as_str()) {
                skipped.insert(name);
                continue;
            }
            let query = format!("count({{__name__=\"{name}\"}})");
            let result = prometheus.query(&query).await.expect("query");
            assert!(
                !result.is_empty(),
                "{alert} selects {name}, which the live scrape does not have ({expr})"
            );
            println!("rule {alert}: {name} has {} series", result[0]["value"][1]);
        }
    }
    assert_eq!(
        skipped.into_iter().collect::<Vec<_>>(),
        NOT_IN_THE_LAB.to_vec(),
        "the exceptions are used, and only they"
    );
}

async fn route_withdrawn(lab: &Lab<'_>) {
    let tailnet_env = lab.env.tailnet();
    let router = &tailnet_env.site.router;
    router
        .tailscale_set(&tailnet_env.binaries, &["--advertise-routes="])
        .await
        .expect("withdraw the routes");
    let withdrawn = Instant::now();
    let labels = [("namespace", lab.ns), ("name", "site")];
    let (alert, _) = wait_firing(lab.prometheus, "TailnetRouteMissing", &labels, withdrawn).await;
    assert_eq!(alert["labels"]["reason"], "RouteNotAdvertised", "{alert}");
    let routes = tno_testenv_tailnet::SITE_ROUTES.join(",");
    router
        .tailscale_set(
            &tailnet_env.binaries,
            &[&format!("--advertise-routes={routes}")],
        )
        .await
        .expect("re-advertise the routes");
    let back = Instant::now();
    wait_resolved(lab.prometheus, "TailnetRouteMissing", &labels, back).await;
}

async fn headscale_stopped(lab: &Lab<'_>) {
    let headscale = &lab.env.tailnet().headscale;
    let labels = [("tailnet", lab.tailnet_name)];
    wait_resolved(
        lab.prometheus,
        "TailnetHeadscaleUnreachable",
        &labels,
        Instant::now(),
    )
    .await;
    headscale.kill();
    let stopped = Instant::now();
    let (alert, after) = wait_firing(
        lab.prometheus,
        "TailnetHeadscaleUnreachable",
        &labels,
        stopped,
    )
    .await;
    assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
    // `for` plus detection: the operator's poll (2 s) and its timeouts, a scrape (2 s), an
    // evaluation (1 s). A `for` that is ignored or a rule that never matches fails here.
    let bound = Duration::from_secs(FOR_SECONDS + 30);
    assert!(
        after <= bound,
        "firing only after {after:?} (bound {bound:?})"
    );
    let active_at = alert["activeAt"].as_str().unwrap_or_default();
    println!("TailnetHeadscaleUnreachable activeAt {active_at}, firing {after:?} after the stop");
    headscale.restart().await.expect("headscale restart");
    let restarted = Instant::now();
    wait_resolved(
        lab.prometheus,
        "TailnetHeadscaleUnreachable",
        &labels,
        restarted,
    )
    .await;
}

/// A ResourceQuota allowing no new Deployment in the test's namespace (the existing ones stay),
/// then a second egress there: the operator's apply of its agent Deployment is refused, every
/// reconcile of it fails, and TailnetOperatorReconcileErrors fires. The errors go on, so
/// `tailnet_operator_reconcile_errors_total` has series for the checks that follow (a labelled
/// counter is exported from its first increment on).
async fn reconcile_errors(lab: &Lab<'_>) {
    let ns = lab.ns;
    apply(
        &Api::<ResourceQuota>::namespaced(lab.client.clone(), ns),
        "no-new-deployments",
        json!({"apiVersion": "v1", "kind": "ResourceQuota",
               "metadata": {"name": "no-new-deployments", "namespace": ns},
               "spec": {"hard": {"count/deployments.apps": "0"}}}),
    )
    .await
    .expect("ResourceQuota");
    let egresses: Api<TailnetEgress> = Api::namespaced(lab.client.clone(), ns);
    apply_egress(
        &egresses,
        ns,
        "blocked",
        lab.tailnet_name,
        json!([remote_db_target()]),
    )
    .await
    .expect("egress");
    let created = Instant::now();
    let (alert, _) = wait_firing(
        lab.prometheus,
        "TailnetOperatorReconcileErrors",
        &[],
        created,
    )
    .await;
    assert_eq!(alert["labels"]["controller"], "egress", "{alert}");
}

/// Every pid whose network namespace is the pod `uid`'s.
fn pod_pids(uid: &str) -> Vec<i32> {
    let Some(netns) = std::fs::read_dir("/run/netns").ok().and_then(|entries| {
        entries.filter_map(|e| e.ok()).find(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with(&format!("pod-{uid}"))
        })
    }) else {
        return Vec::new();
    };
    let Ok(inode) = std::fs::metadata(netns.path()).map(|m| m.ino()) else {
        return Vec::new();
    };
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| m.ino() == inode)
        })
        .collect()
}

fn signal_all(pids: &[i32], signal: libc::c_int) {
    for pid in pids {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(*pid, signal) };
    }
}

/// The egress agent's pod frozen (SIGSTOP to every process of it: the agent and its
/// tailscaled stop answering, and the test kubelet, which restarts a killed container within
/// a second, leaves it as it is): TailnetAgentOffline fires; SIGCONT resolves it.
async fn agent_frozen(lab: &Lab<'_>, agents: &[String]) {
    let pods: Api<Pod> = Api::namespaced(lab.client.clone(), lab.ns);
    let name = agents
        .iter()
        .find(|a| a.starts_with("tailnet-egress-site"))
        .expect("the egress agent pod");
    let pod = pods.get(name).await.expect("agent pod");
    let uid = pod.uid().expect("uid");
    let labels = [("namespace", lab.ns), ("name", "site")];
    // From a clean state: an alert left over from the Headscale outage must not pass for this one.
    wait_resolved(
        lab.prometheus,
        "TailnetAgentOffline",
        &labels,
        Instant::now(),
    )
    .await;
    let pids = pod_pids(&uid);
    assert!(!pids.is_empty(), "no process in the netns of pod {uid}");
    signal_all(&pids, libc::SIGSTOP);
    let frozen = Instant::now();
    let fired = eventually("TailnetAgentOffline firing", WAIT, || async {
        firing(lab.prometheus, "TailnetAgentOffline", &labels)
            .await
            .into_iter()
            .next()
            .ok_or_else(|| "not firing".to_string())
    })
    .await;
    // Thaw before asserting, so a failure leaves a running pod behind.
    signal_all(&pod_pids(&uid), libc::SIGCONT);
    let alert = fired.unwrap_or_else(|e| panic!("{e}"));
    println!(
        "FIRING after {:.1}s: {alert}",
        frozen.elapsed().as_secs_f64()
    );
    let thawed = Instant::now();
    wait_resolved(lab.prometheus, "TailnetAgentOffline", &labels, thawed).await;
    let egresses: Api<TailnetEgress> = Api::namespaced(lab.client.clone(), lab.ns);
    let egress = egresses.get("site").await.expect("egress");
    assert!(
        ConditionIs::new("Ready", "True").holds_for(&egress),
        "{}",
        egress.describe()
    );
}

/// Every target of every panel of the chart's dashboard, `$__rate_interval` set to
/// [`RATE_INTERVAL`], returns a non-empty result from the lab's Prometheus.
async fn every_dashboard_panel_returns_data(lab: &Lab<'_>) {
    let config_map = lab
        .monitoring
        .documents
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("the dashboard ConfigMap (metrics.grafanaDashboard.enabled=true)");
    let text = config_map["data"]["tailnet-operator.json"]
        .as_str()
        .expect("dashboard JSON");
    let dashboard: Value = serde_json::from_str(text).expect("dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr");
            let query = expr.replace("$__rate_interval", RATE_INTERVAL);
            let result = eventually(&format!("panel {title}"), Duration::from_secs(30), || {
                let query = query.clone();
                async move {
                    let result = lab
                        .prometheus
                        .query(&query)
                        .await
                        .map_err(|e| e.to_string())?;
                    if result.is_empty() {
                        Err("empty result".to_string())
                    } else {
                        Ok(result)
                    }
                }
            })
            .await
            .unwrap_or_else(|e| panic!("{e}: {query}"));
            println!(
                "panel {title:?}: {} series, e.g. {}",
                result.len(),
                result[0]
            );
        }
    }
}
