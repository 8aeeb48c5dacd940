//! A real Prometheus server in the lab (`prometheus` of `deps/build.sh prometheus`, built with
//! upstream's tags `remove_all_sd,enable_kubernetes_sd`: Kubernetes service discovery only).
//!
//! It is configured from what the chart renders, not from a copy: [`ChartMonitoring::render`]
//! runs `helm template` with the prometheus-operator kinds announced, and
//! [`scrape_configs`] turns the chart's ServiceMonitor and PodMonitor into the scrape jobs
//! prometheus-operator would generate for them (Kubernetes SD, `keep` on the selected labels
//! and the named port, `namespace`/`pod`/`service`/`container`/`endpoint` target labels). The
//! rule file Prometheus loads is the rendered PrometheusRule's `spec`. Test-only: the global
//! `evaluation_interval` (the chart has no value for it; prometheus-operator takes it from
//! the Prometheus object), and the shorter intervals and `for`s the tests pass as chart values.
//!
//! Prometheus runs in its own netns on the lab, like a pod: it reaches the apiserver at its
//! lab address (Kubernetes SD with [`E2eEnv::lab_kubeconfig`]) and scrapes pods at their pod
//! IPs. Its HTTP API is forwarded to a root-netns `127.0.0.1` port ([`LabPrometheus::url`]).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tno_netlab::{ChildProcess, Lab, TcpForwarder};
use tno_testenv_kube::binaries::workspace_root;

use crate::env::E2eEnv;
use crate::error::{E2eError, Result};

/// Port of Prometheus' web server inside its netns.
const WEB_PORT: u16 = 9090;
/// How long Prometheus may take to load its config and rules and answer `/-/ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The prometheus-operator kinds `helm template` is told the cluster serves.
const MONITORING_KINDS: [&str; 3] = ["ServiceMonitor", "PodMonitor", "PrometheusRule"];

/// The monitoring objects of one `helm template` of charts/tailnet-operator.
#[derive(Clone, Debug)]
pub struct ChartMonitoring {
    pub service_monitor: Value,
    pub pod_monitor: Value,
    /// The operator's metrics Service (its labels are what the ServiceMonitor selects).
    pub metrics_service: Value,
    /// `spec` of the PrometheusRule: `{groups: [...]}`, a Prometheus rule file.
    pub rule_file: Value,
    /// Every rendered document (ConfigMaps of dashboards included).
    pub documents: Vec<Value>,
}

impl ChartMonitoring {
    /// `helm template <release> charts/tailnet-operator -n <namespace>` with the ServiceMonitor,
    /// PodMonitor and PrometheusRule switched on and their API versions announced, plus `sets`
    /// (`key=value`, each passed as `--set`).
    pub fn render(release: &str, namespace: &str, sets: &[String]) -> Result<ChartMonitoring> {
        let helm = tno_testenv_kube::binaries::helm()?;
        let chart = workspace_root().join("charts/tailnet-operator");
        let mut command = Command::new(&helm);
        command
            .arg("template")
            .arg(release)
            .arg(&chart)
            .args(["--namespace", namespace]);
        for kind in MONITORING_KINDS {
            command.args([
                "--api-versions",
                &format!("monitoring.coreos.com/v1/{kind}"),
            ]);
        }
        for set in [
            "metrics.serviceMonitor.enabled=true",
            "agent.podMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(sets.iter().cloned())
        {
            command.args(["--set", &set]);
        }
        let output = command
            .output()
            .map_err(|e| E2eError::io(format!("running {}", helm.display()), e))?;
        if !output.status.success() {
            return Err(E2eError::CommandFailed {
                command: format!("helm template {release} {}", chart.display()),
                status: output.status,
                output: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let documents = parse_documents(&text)?;
        Self::from_documents(documents)
    }

    /// Picks the monitoring objects out of rendered documents.
    pub fn from_documents(documents: Vec<Value>) -> Result<ChartMonitoring> {
        let find = |what: &str, matches: &dyn Fn(&Value) -> bool| {
            documents
                .iter()
                .find(|doc| matches(doc))
                .cloned()
                .ok_or_else(|| E2eError::Install(format!("the chart rendered no {what}")))
        };
        let kind_is = |kind: &'static str| move |doc: &Value| doc["kind"] == kind;
        let rule = find("PrometheusRule", &kind_is("PrometheusRule"))?;
        Ok(ChartMonitoring {
            service_monitor: find("ServiceMonitor", &kind_is("ServiceMonitor"))?,
            pod_monitor: find("PodMonitor", &kind_is("PodMonitor"))?,
            metrics_service: find("metrics Service", &|doc| {
                doc["kind"] == "Service"
                    && doc["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"
            })?,
            rule_file: rule["spec"].clone(),
            documents,
        })
    }

    /// Every alerting rule of the rule file: (alert name, expression, `for`).
    pub fn alerts(&self) -> Vec<(String, String, String)> {
        rules_of(&self.rule_file)
            .filter_map(|rule| {
                Some((
                    rule["alert"].as_str()?.to_owned(),
                    rule["expr"].as_str()?.to_owned(),
                    rule["for"].as_str().unwrap_or("0s").to_owned(),
                ))
            })
            .collect()
    }
}

fn rules_of(rule_file: &Value) -> impl Iterator<Item = &Value> {
    rule_file["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|group| group["rules"].as_array().into_iter().flatten())
}

fn parse_documents(text: &str) -> Result<Vec<Value>> {
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document)
            .map_err(|e| E2eError::Install(format!("helm template output is not YAML: {e}")))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

/// A Kubernetes label name as Prometheus' Kubernetes SD spells it in meta labels.
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// `keep` rules for `matchLabels`, as prometheus-operator writes them: the label present and
/// equal, on the object whose meta labels start with `prefix`.
fn match_label_rules(selector: &Value, prefix: &str) -> std::result::Result<Vec<Value>, String> {
    if selector.get("matchExpressions").is_some() {
        return Err("selector.matchExpressions is not translated".into());
    }
    let labels = selector["matchLabels"]
        .as_object()
        .ok_or("selector without matchLabels")?;
    Ok(labels
        .iter()
        .map(|(name, value)| {
            let name = sanitize(name);
            json!({
                "action": "keep",
                "source_labels": [format!("{prefix}_label_{name}"), format!("{prefix}_labelpresent_{name}")],
                "regex": format!("({});true", value.as_str().unwrap_or_default()),
            })
        })
        .collect())
}

/// `kubernetes_sd_configs` namespaces for a monitor's `namespaceSelector`.
fn namespaces(selector: &Value) -> std::result::Result<Value, String> {
    if selector["any"] == true {
        return Ok(json!({}));
    }
    match selector["matchNames"].as_array() {
        Some(names) => Ok(json!({"names": names})),
        None => Err(format!("namespaceSelector {selector} is not translated")),
    }
}

/// Fields of an endpoint this translation understands; anything else fails it, so a chart
/// change is not silently left out of the lab's Prometheus.
const ENDPOINT_FIELDS: [&str; 3] = ["port", "path", "interval"];

fn endpoint_parts(endpoint: &Value) -> std::result::Result<(&str, &str, &str), String> {
    let fields = endpoint.as_object().ok_or("endpoint is no object")?;
    if let Some(other) = fields
        .keys()
        .find(|k| !ENDPOINT_FIELDS.contains(&k.as_str()))
    {
        return Err(format!("endpoint field {other} is not translated"));
    }
    let port = endpoint["port"].as_str().ok_or("endpoint without port")?;
    let path = endpoint["path"].as_str().unwrap_or("/metrics");
    let interval = endpoint["interval"].as_str().unwrap_or("30s");
    Ok((port, path, interval))
}

/// The scrape jobs prometheus-operator generates for `service_monitor` (role `endpointslice`)
/// and `pod_monitor` (role `pod`), with Kubernetes SD through `kubeconfig`. Pure.
pub fn scrape_configs(
    service_monitor: &Value,
    pod_monitor: &Value,
    kubeconfig: &Path,
) -> std::result::Result<Vec<Value>, String> {
    let mut jobs = Vec::new();
    let sm_name = service_monitor["metadata"]["name"].as_str().unwrap_or("sm");
    let sm_namespace = service_monitor["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let sm = &service_monitor["spec"];
    let endpoints = sm["endpoints"]
        .as_array()
        .ok_or("ServiceMonitor without endpoints")?;
    for (i, endpoint) in endpoints.iter().enumerate() {
        let (port, path, interval) = endpoint_parts(endpoint)?;
        let mut relabel = match_label_rules(&sm["selector"], "__meta_kubernetes_service")?;
        relabel.extend([
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": port}),
            json!({"source_labels": ["__meta_kubernetes_endpointslice_address_target_kind", "__meta_kubernetes_endpointslice_address_target_name"], "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"}),
            json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
            json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}),
            json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"}),
            json!({"target_label": "endpoint", "replacement": port}),
        ]);
        jobs.push(json!({
            "job_name": format!("serviceMonitor/{sm_namespace}/{sm_name}/{i}"),
            "scrape_interval": interval,
            "metrics_path": path,
            "honor_labels": false,
            "kubernetes_sd_configs": [{
                "role": "endpointslice",
                "kubeconfig_file": kubeconfig,
                "namespaces": namespaces(&sm["namespaceSelector"])?,
            }],
            "relabel_configs": relabel,
        }));
    }
    let pm_name = pod_monitor["metadata"]["name"].as_str().unwrap_or("pm");
    let pm_namespace = pod_monitor["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let pm = &pod_monitor["spec"];
    let endpoints = pm["podMetricsEndpoints"]
        .as_array()
        .ok_or("PodMonitor without podMetricsEndpoints")?;
    for (i, endpoint) in endpoints.iter().enumerate() {
        let (port, path, interval) = endpoint_parts(endpoint)?;
        let mut relabel = vec![
            json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}),
        ];
        relabel.extend(match_label_rules(&pm["selector"], "__meta_kubernetes_pod")?);
        relabel.extend([
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port}),
            json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
            json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
            json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
            json!({"target_label": "job", "replacement": format!("{pm_namespace}/{pm_name}")}),
            json!({"target_label": "endpoint", "replacement": port}),
        ]);
        jobs.push(json!({
            "job_name": format!("podMonitor/{pm_namespace}/{pm_name}/{i}"),
            "scrape_interval": interval,
            "metrics_path": path,
            "honor_labels": false,
            "kubernetes_sd_configs": [{
                "role": "pod",
                "kubeconfig_file": kubeconfig,
                "namespaces": namespaces(&pm["namespaceSelector"])?,
            }],
            "relabel_configs": relabel,
        }));
    }
    Ok(jobs)
}

/// `prometheus` running in a netns on the lab (killed and its netns removed on drop; its log
/// tail is printed if the test is panicking).
pub struct LabPrometheus {
    name: String,
    // Field order is drop order: the process before the forwarder into its netns.
    process: ChildProcess,
    forwarder: TcpForwarder,
    lab: Arc<Lab>,
    lab_ip: Ipv4Addr,
    http: reqwest::Client,
}

impl E2eEnv {
    /// Starts Prometheus with the scrape jobs of `monitoring`'s ServiceMonitor and PodMonitor
    /// and its PrometheusRule as the one rule file, evaluating every `evaluation_interval`
    /// (test-only), and waits for `/-/ready`. Files go to `<run>/e2e/prometheus/`.
    pub async fn start_prometheus(
        &self,
        monitoring: &ChartMonitoring,
        evaluation_interval: &str,
    ) -> Result<LabPrometheus> {
        let binary = tno_testenv_kube::binaries::tool("prometheus", "prometheus")?;
        let dir = self.dir().join("prometheus");
        std::fs::create_dir_all(dir.join("data"))
            .map_err(|e| E2eError::io(format!("creating {}", dir.display()), e))?;
        let jobs = scrape_configs(
            &monitoring.service_monitor,
            &monitoring.pod_monitor,
            self.lab_kubeconfig(),
        )
        .map_err(|e| E2eError::Install(format!("translating the chart's monitors: {e}")))?;
        let rules_path = dir.join("prometheus-rules.yaml");
        let config = json!({
            "global": {"evaluation_interval": evaluation_interval},
            "rule_files": [rules_path],
            "scrape_configs": jobs,
        });
        // JSON is YAML: Prometheus reads both files as they are written here.
        write_json(&rules_path, &monitoring.rule_file)?;
        let config_path = dir.join("prometheus.yml");
        write_json(&config_path, &config)?;
        let lab = self.lab().clone();
        let log_path = dir.join("prometheus.log");
        let mut prometheus = tokio::task::spawn_blocking(move || {
            spawn_prometheus(lab, &binary, &config_path, &dir, &log_path)
        })
        .await
        .map_err(|e| E2eError::io("starting prometheus", std::io::Error::other(e)))??;
        prometheus.wait_ready().await?;
        Ok(prometheus)
    }
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|source| E2eError::Json {
        what: path.display().to_string(),
        source,
    })?;
    std::fs::write(path, text).map_err(|e| E2eError::io(format!("writing {}", path.display()), e))
}

fn spawn_prometheus(
    lab: Arc<Lab>,
    binary: &Path,
    config: &Path,
    dir: &Path,
    log_path: &Path,
) -> Result<LabPrometheus> {
    let name = "prometheus".to_owned();
    let pod = lab.add_pod_netns(&name)?;
    let listen = SocketAddr::V4(SocketAddrV4::new(pod.ip, WEB_PORT));
    let started = (|| {
        let mut command = pod.netns.command(binary)?;
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .arg("--log.level=info");
        for variable in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            command.env_remove(variable);
        }
        let forwarder = TcpForwarder::start(
            None,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            Some(&pod.netns),
            listen,
        )?;
        let process = ChildProcess::spawn("prometheus", command, log_path)?;
        Ok::<_, tno_netlab::NetlabError>((process, forwarder))
    })();
    match started {
        Ok((process, forwarder)) => Ok(LabPrometheus {
            name,
            process,
            forwarder,
            lab,
            lab_ip: pod.ip,
            http: reqwest::Client::new(),
        }),
        Err(error) => {
            let _ = lab.remove_pod_netns(&name);
            Err(error.into())
        }
    }
}

impl LabPrometheus {
    /// `http://127.0.0.1:<port>`: the web server, forwarded into the root netns.
    pub fn url(&self) -> String {
        format!("http://{}", self.forwarder.local_addr())
    }

    /// Its address in the lab.
    pub fn lab_ip(&self) -> Ipv4Addr {
        self.lab_ip
    }

    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let url = format!("{}/-/ready", self.url());
        let started = Instant::now();
        loop {
            let last = match self.http.get(&url).send().await {
                Ok(response) if response.status().is_success() => return Ok(()),
                Ok(response) => format!("HTTP {}", response.status()),
                Err(error) => error.to_string(),
            };
            let exited = self.process.exit_status()?;
            if exited.is_some() || started.elapsed() > READY_TIMEOUT {
                return Err(E2eError::Timeout {
                    what: "prometheus to become ready".into(),
                    seconds: READY_TIMEOUT.as_secs(),
                    last: format!(
                        "{last} (exit: {exited:?}); log tail:\n{}",
                        self.log_tail(40)
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `GET /api/v1/<path>?<params>`: the `data` of a `success` answer, else an error with
    /// the body.
    pub async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value> {
        let url = format!("{}/api/v1/{path}", self.url());
        let failed = |detail: String| E2eError::Prometheus {
            request: format!("{path} {params:?}"),
            detail,
        };
        let response = self
            .http
            .get(&url)
            .query(params)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let body: Value = response.json().await.map_err(|e| failed(e.to_string()))?;
        if body["status"] != "success" {
            return Err(failed(body.to_string()));
        }
        Ok(body["data"].clone())
    }

    /// An instant query's result vector (or matrix/scalar as Prometheus gives it).
    pub async fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let data = self.api("query", &[("query", promql)]).await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// `/api/v1/alerts`: every pending and firing alert.
    pub async fn alerts(&self) -> Result<Vec<Value>> {
        let data = self.api("alerts", &[]).await?;
        Ok(data["alerts"].as_array().cloned().unwrap_or_default())
    }

    /// The active targets of `/api/v1/targets`.
    pub async fn active_targets(&self) -> Result<Vec<Value>> {
        let data = self.api("targets", &[("state", "active")]).await?;
        Ok(data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The metric names `promql` selects, from Prometheus' own parser (`/api/v1/parse_query`).
    pub async fn selected_metric_names(&self, promql: &str) -> Result<Vec<String>> {
        let ast = self.api("parse_query", &[("query", promql)]).await?;
        let mut names = Vec::new();
        collect_selector_names(&ast, &mut names);
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// Names of every vector and matrix selector in a `parse_query` AST.
fn collect_selector_names(node: &Value, names: &mut Vec<String>) {
    match node {
        Value::Object(fields) => {
            let selector = matches!(
                fields.get("type").and_then(Value::as_str),
                Some("vectorSelector" | "matrixSelector")
            );
            if selector && let Some(name) = fields.get("name").and_then(Value::as_str) {
                names.push(name.to_owned());
            }
            for value in fields.values() {
                collect_selector_names(value, names);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_selector_names(v, names)),
        _ => {}
    }
}

impl Drop for LabPrometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== prometheus ({}) ====\n{}",
                self.log_path().display(),
                self.log_tail(60)
            );
        }
        self.process.kill();
        if let Err(error) = self.lab.remove_pod_netns(&self.name) {
            eprintln!("tno-testenv: removing the netns of prometheus: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitors() -> (Value, Value) {
        let sm = json!({"metadata": {"name": "ops-tailnet-operator", "namespace": "tailnet-system"},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "tailnet-operator",
                "app.kubernetes.io/component": "metrics"}},
                "namespaceSelector": {"matchNames": ["tailnet-system"]},
                "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "2s"}]}});
        let pm = json!({"metadata": {"name": "ops-agents", "namespace": "tailnet-system"},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/part-of": "tailnet-operator"}},
                "namespaceSelector": {"any": true},
                "podMetricsEndpoints": [{"port": "admin", "path": "/metrics", "interval": "2s"}]}});
        (sm, pm)
    }

    #[test]
    fn monitors_become_kubernetes_sd_jobs_with_keep_rules() {
        let (sm, pm) = monitors();
        let jobs = scrape_configs(&sm, &pm, Path::new("/k")).expect("translates");
        assert_eq!(jobs.len(), 2);
        let service = &jobs[0];
        assert_eq!(
            service["job_name"],
            "serviceMonitor/tailnet-system/ops-tailnet-operator/0"
        );
        assert_eq!(service["scrape_interval"], "2s");
        assert_eq!(service["kubernetes_sd_configs"][0]["role"], "endpointslice");
        assert_eq!(
            service["kubernetes_sd_configs"][0]["namespaces"]["names"],
            json!(["tailnet-system"])
        );
        let relabel = service["relabel_configs"].to_string();
        assert!(relabel.contains("__meta_kubernetes_service_label_app_kubernetes_io_component"));
        assert!(relabel.contains("(metrics);true"), "{relabel}");
        let pods = &jobs[1];
        assert_eq!(pods["kubernetes_sd_configs"][0]["role"], "pod");
        assert_eq!(pods["kubernetes_sd_configs"][0]["namespaces"], json!({}));
        let relabel = pods["relabel_configs"].to_string();
        assert!(relabel.contains("__meta_kubernetes_pod_labelpresent_app_kubernetes_io_part_of"));
        assert!(relabel.contains("__meta_kubernetes_pod_container_port_name"));
    }

    #[test]
    fn an_untranslated_monitor_field_fails_the_translation() {
        let (sm, mut pm) = monitors();
        pm["spec"]["podMetricsEndpoints"][0]["relabelings"] = json!([]);
        let error = scrape_configs(&sm, &pm, Path::new("/k")).expect_err("relabelings");
        assert!(error.contains("relabelings"), "{error}");
        let (mut sm, pm) = monitors();
        sm["spec"]["selector"]["matchExpressions"] = json!([]);
        assert!(scrape_configs(&sm, &pm, Path::new("/k")).is_err());
    }

    #[test]
    fn selector_names_come_from_every_branch_of_the_ast() {
        let ast = json!({"type": "binaryExpr", "lhs": {"type": "aggregation", "expr":
            {"type": "call", "args": [{"type": "matrixSelector", "name": "a_total", "range": 600000}]}},
            "rhs": {"type": "vectorSelector", "name": "b", "matchers": [{"name": "__name__", "value": "b"}]}});
        let mut names = Vec::new();
        collect_selector_names(&ast, &mut names);
        names.sort();
        assert_eq!(names, ["a_total", "b"]);
    }
}
