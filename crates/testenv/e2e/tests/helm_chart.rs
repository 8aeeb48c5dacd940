//! The Helm chart `charts/tailnet-operator`, checked with the real tools: `helm template`
//! (helm from `deps/build.sh helm`) renders it, the rendered manifests pass a server-side
//! dry-run on the test environment's real apiserver, the rendered PrometheusRule passes
//! `promtool check rules` (promtool from `deps/build.sh prometheus`), the chart's CRDs are the
//! generated ones, and every RBAC rule the chart grants is in the reasoned table below.
//!
//! helm and promtool missing: the tests skip (pass with a note) unless TNO_REQUIRE_REAL_ENV=1.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::Scope;
use serde_json::Value;
use tno_testenv::E2eEnv;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

fn chart_dir() -> PathBuf {
    root().join("charts/tailnet-operator")
}

/// `name` of `component` ([`tno_testenv_kube::binaries::tool`]: `TNO_BIN_<NAME>`, the deps
/// cache, `PATH`); `None` (the test skips) if it is not there and the real env is not required.
fn deps_binary(component: &str, name: &str) -> Option<PathBuf> {
    match tno_testenv_kube::binaries::tool(component, name) {
        Ok(path) => Some(path),
        Err(missing) => {
            assert!(
                std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
                "{missing}"
            );
            eprintln!("SKIP: {missing}");
            None
        }
    }
}

fn run(program: &Path, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} {} failed: {}\n{stdout}\n{}",
        program.display(),
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// `helm template <release> charts/tailnet-operator -n <namespace> <extra>` as JSON values.
fn template(helm: &Path, release: &str, namespace: &str, extra: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        release,
        chart.to_str().expect("UTF-8 path"),
        "--namespace",
        namespace,
    ];
    args.extend_from_slice(extra);
    let text = run(helm, &args);
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|doc| {
            let value: Value = serde::Deserialize::deserialize(doc).expect("helm output is YAML");
            (!value.is_null()).then_some(value)
        })
        .collect()
}

/// The Tailnet of `tailnet.create`: the manifest in the ConfigMap the operator applies.
fn chart_tailnet(docs: &[Value]) -> Value {
    let config_map = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-tailnet"))
        })
        .expect("the Tailnet manifest ConfigMap");
    let text = config_map["data"]["tailnet.yaml"]
        .as_str()
        .expect("tailnet.yaml");
    let tailnet: Value = serde_yaml::from_str(text).expect("the manifest is YAML");
    assert_eq!(tailnet["kind"], "Tailnet", "{text}");
    tailnet
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

#[test]
fn chart_crds_are_the_generated_crds() {
    // deploy/crds is checked against the Rust types by checked_in_crds_match_generated
    // (crates/operator); `cargo xtask generate` writes both directories.
    let names = |dir: PathBuf| -> BTreeSet<String> {
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    };
    let deploy = root().join("deploy/crds");
    let chart = chart_dir().join("files/crds");
    assert_eq!(names(deploy.clone()), names(chart.clone()));
    for file in names(deploy.clone()) {
        let want = std::fs::read_to_string(deploy.join(&file)).expect("deploy CRD");
        let got = std::fs::read_to_string(chart.join(&file)).expect("chart CRD");
        assert!(
            want == got,
            "charts/tailnet-operator/files/crds/{file} differs from deploy/crds/{file}: run `cargo xtask generate`"
        );
    }
}

#[test]
fn chart_lints_and_renders_restricted_pinned_deployment() {
    let Some(helm) = deps_binary("helm", "helm") else {
        return;
    };
    let chart = chart_dir();
    run(&helm, &["lint", "--strict", chart.to_str().expect("UTF-8")]);
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let docs = template(
        &helm,
        "ops",
        "tailnet-system",
        &[
            "--set",
            &format!("image.digest={digest}"),
            "--set",
            "replicaCount=2",
            "--set",
            "operator.logFormat=text",
            "--set",
            "nodeSelector.pool=system",
        ],
    );
    let deployment = find(&docs, "Deployment");
    let spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(spec["nodeSelector"]["pool"], "system");
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &spec["containers"][0];
    assert_eq!(
        container["image"],
        format!("ghcr.io/tailnet-operator/tailnet-operator:v0.1.0@{digest}")
    );
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for expected in [
        "run",
        "--operator-namespace=tailnet-system",
        "--admin-address=0.0.0.0:8080",
        "--log-format=text",
        "--lease-name=tailnet-operator-leader",
    ] {
        assert!(args.contains(&expected), "{expected} not in {args:?}");
    }
    // The default tailscale image is this release's tailnet-tailscaled.
    assert!(
        args.contains(&"--tailscale-image=ghcr.io/tailnet-operator/tailnet-tailscaled:v0.1.0"),
        "{args:?}"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "admin", "{probe}");
    }
    assert_eq!(container["ports"][0]["containerPort"], 8080);
    let service = find(&docs, "Service");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "admin");
    // Monitoring objects only on request.
    assert!(
        docs.iter()
            .all(|d| d["kind"] != "PrometheusRule" && d["kind"] != "ServiceMonitor")
    );
}

#[test]
fn rendered_prometheus_rule_passes_promtool() {
    let (Some(helm), Some(promtool)) = (
        deps_binary("helm", "helm"),
        deps_binary("prometheus", "promtool"),
    ) else {
        return;
    };
    let docs = template(
        &helm,
        "ops",
        "tailnet-system",
        &[
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.prometheusRule.runbookBaseUrl=https://docs.example.net/troubleshooting",
            // Rendered only where the cluster serves the kinds.
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor",
        ],
    );
    let rule = find(&docs, "PrometheusRule");
    let monitor = find(&docs, "ServiceMonitor");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    let dir = std::env::temp_dir().join(format!("tno-helm-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("rules.yaml");
    std::fs::write(&file, serde_json::to_string(&rule["spec"]).expect("JSON")).expect("write");
    let out = run(
        &promtool,
        &["check", "rules", file.to_str().expect("UTF-8")],
    );
    assert!(out.contains("SUCCESS: 12 rules found"), "{out}");
    let alerts: Vec<&Value> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .collect();
    for alert in &alerts {
        let runbook = alert["annotations"]["runbook_url"]
            .as_str()
            .expect("runbook_url");
        assert!(
            runbook.starts_with("https://docs.example.net/troubleshooting#"),
            "{}: {runbook}",
            alert["alert"]
        );
    }
    // The unit tests of the rule file: one per alert (each test names one alert).
    let tests = chart_dir().join("tests/prometheus-rules.test.yaml");
    let out = run(
        &promtool,
        &["test", "rules", tests.to_str().expect("UTF-8")],
    );
    assert!(out.contains("SUCCESS"), "{out}");
    let test_text = std::fs::read_to_string(&tests).expect("rule tests");
    for alert in &alerts {
        let name = alert["alert"].as_str().expect("alert name");
        assert!(
            test_text.contains(&format!("alertname: {name}")),
            "no promtool unit test for {name}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The alerts of `files/prometheus-rules.yaml`: (name, `for`).
fn rule_file_alerts() -> Vec<(String, String)> {
    let path = chart_dir().join("files/prometheus-rules.yaml");
    let rules: Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).expect("rule file")).expect("YAML");
    rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|group| group["rules"].as_array().into_iter().flatten())
        .filter_map(|rule| {
            Some((
                rule["alert"].as_str()?.to_string(),
                rule["for"].as_str().unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

/// Each alert is switchable and its `for` tunable in values.yaml, whose defaults are the rule
/// file's (what promtool's unit tests check); the rendered PrometheusRule follows the values.
#[test]
fn each_alert_is_switchable_and_its_for_tunable_in_values() {
    let (Some(helm), Some(promtool)) = (
        deps_binary("helm", "helm"),
        deps_binary("prometheus", "promtool"),
    ) else {
        return;
    };
    let alerts = rule_file_alerts();
    assert_eq!(alerts.len(), 12, "{alerts:?}");
    let values: Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart_dir().join("values.yaml")).expect("values.yaml"),
    )
    .expect("values YAML");
    let settings = values["metrics"]["prometheusRule"]["alerts"]
        .as_object()
        .expect("metrics.prometheusRule.alerts");
    assert_eq!(
        settings.len(),
        alerts.len(),
        "one entry per alert: {settings:?}"
    );
    for (name, for_) in &alerts {
        assert_eq!(
            settings.get(name),
            Some(&serde_json::json!({"enabled": true, "for": for_})),
            "values.yaml metrics.prometheusRule.alerts.{name}"
        );
    }
    let render = |extra: &[&str]| {
        let mut args = vec![
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
        ];
        args.extend_from_slice(extra);
        template(&helm, "ops", "tailnet-system", &args)
    };
    let rendered = |docs: &[Value]| -> Vec<(String, String)> {
        find(docs, "PrometheusRule")["spec"]["groups"][0]["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .map(|r| {
                let field = |key: &str| r[key].as_str().unwrap_or_default().to_string();
                (field("alert"), field("for"))
            })
            .collect()
    };
    assert_eq!(rendered(&render(&[])), alerts);
    let docs = render(&[
        "--set",
        "metrics.prometheusRule.alerts.TailnetAgentTargetUnreachable.enabled=false",
        "--set",
        "metrics.prometheusRule.alerts.TailnetHeadscaleUnreachable.for=90s",
    ]);
    let expected: Vec<(String, String)> = alerts
        .iter()
        .filter(|(name, _)| name != "TailnetAgentTargetUnreachable")
        .map(|(name, for_)| {
            let for_ = if name == "TailnetHeadscaleUnreachable" {
                "90s"
            } else {
                for_
            };
            (name.clone(), for_.to_string())
        })
        .collect();
    assert_eq!(rendered(&docs), expected);
    let dir = std::env::temp_dir().join(format!("tno-helm-tuned-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("rules.yaml");
    let spec = &find(&docs, "PrometheusRule")["spec"];
    std::fs::write(&file, serde_json::to_string(spec).expect("JSON")).expect("write");
    let out = run(
        &promtool,
        &["check", "rules", file.to_str().expect("UTF-8")],
    );
    assert!(out.contains("SUCCESS: 11 rules found"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
    // Every alert off: no PrometheusRule at all.
    let all_off: Vec<String> = alerts
        .iter()
        .map(|(name, _)| format!("metrics.prometheusRule.alerts.{name}.enabled=false"))
        .collect();
    let mut args: Vec<&str> = Vec::new();
    for set in &all_off {
        args.extend(["--set", set.as_str()]);
    }
    assert!(render(&args).iter().all(|d| d["kind"] != "PrometheusRule"));
    // A name that is no alert fails the render, naming it.
    let output = Command::new(&helm)
        .args([
            "template",
            "x",
            chart_dir().to_str().expect("UTF-8"),
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
            "--set",
            "metrics.prometheusRule.alerts.TailnetAgentOfline.enabled=false",
        ])
        .output()
        .expect("helm");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("metrics.prometheusRule.alerts.TailnetAgentOfline: no such alert"),
        "{stderr}"
    );
}

/// Every permission the chart grants, with the reason the operator needs it (`scope`:
/// `cluster` = ClusterRole in every mode; `workload` = where TailnetIngresses and agents live:
/// the ClusterRole by default, a Role in each watched namespace with `watchNamespaces`;
/// `namespace` = Role in the operator namespace).
/// `(scope, apiGroup, resource, verb, resourceName or "", reason)`.
const GRANTS: &[(&str, &str, &str, &str, &str, &str)] = &[
    (
        "cluster",
        "gateway.networking.k8s.io",
        "gatewayclasses",
        "get",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "gatewayclasses",
        "list",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "gatewayclasses",
        "watch",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "gateways",
        "get",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "gateways",
        "list",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "gateways",
        "watch",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "httproutes",
        "get",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "httproutes",
        "list",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "httproutes",
        "watch",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "tlsroutes",
        "get",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "tlsroutes",
        "list",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "tlsroutes",
        "watch",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "tcproutes",
        "get",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "tcproutes",
        "list",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "tcproutes",
        "watch",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "referencegrants",
        "get",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "referencegrants",
        "list",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "referencegrants",
        "watch",
        "",
        "Gateway API: the Gateway and GatewayClass controllers read and watch them (controllers/gateway, controllers/gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "gateways",
        "patch",
        "",
        "the finalizer of a served Gateway (controllers/agent/lifecycle.rs ensure_finalizer)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "gatewayclasses/status",
        "patch",
        "",
        "Gateway API status of our classes, Gateways and their routes (controllers/gateway/act.rs, gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "gateways/status",
        "patch",
        "",
        "Gateway API status of our classes, Gateways and their routes (controllers/gateway/act.rs, gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "httproutes/status",
        "patch",
        "",
        "Gateway API status of our classes, Gateways and their routes (controllers/gateway/act.rs, gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "tlsroutes/status",
        "patch",
        "",
        "Gateway API status of our classes, Gateways and their routes (controllers/gateway/act.rs, gateway_class)",
    ),
    (
        "cluster",
        "gateway.networking.k8s.io",
        "tcproutes/status",
        "patch",
        "",
        "Gateway API status of our classes, Gateways and their routes (controllers/gateway/act.rs, gateway_class)",
    ),
    (
        "cluster",
        "tailnet-operator.dev",
        "tailnetgatewayparameters",
        "get",
        "",
        "GatewayClass parametersRef (controllers/gateway/gather.rs class_state)",
    ),
    (
        "cluster",
        "tailnet-operator.dev",
        "tailnetgatewayparameters",
        "list",
        "",
        "GatewayClass parametersRef (controllers/gateway/gather.rs class_state)",
    ),
    (
        "cluster",
        "tailnet-operator.dev",
        "tailnetgatewayparameters",
        "watch",
        "",
        "GatewayClass parametersRef (controllers/gateway/gather.rs class_state)",
    ),
    (
        "cluster",
        "",
        "namespaces",
        "get",
        "",
        "labels of route namespaces for allowedRoutes.namespaces.selector (controllers/gateway/gather.rs namespace_labels)",
    ),
    (
        "cluster",
        "tailnet-operator.dev",
        "tailnets",
        "get",
        "",
        "agents read their Tailnet (controllers/agent.rs tailnet_access)",
    ),
    (
        "cluster",
        "tailnet-operator.dev",
        "tailnets",
        "list",
        "",
        "Tailnet controller and watches (runtime/mod.rs)",
    ),
    (
        "cluster",
        "tailnet-operator.dev",
        "tailnets",
        "watch",
        "",
        "Tailnet controller and watches (runtime/mod.rs)",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetegresses",
        "get",
        "",
        "finalizer helper re-reads the object",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetegresses",
        "list",
        "",
        "egress controller and reflector (runtime/mod.rs)",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetegresses",
        "watch",
        "",
        "egress controller and reflector (runtime/mod.rs)",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetegresses",
        "patch",
        "",
        "finalizer add/remove (kube finalizer, JSON patch)",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetingresses",
        "get",
        "",
        "finalizer helper re-reads the object",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetingresses",
        "list",
        "",
        "ingress controller and reflector (runtime/mod.rs)",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetingresses",
        "watch",
        "",
        "ingress controller and reflector (runtime/mod.rs)",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetingresses",
        "patch",
        "",
        "finalizer add/remove (kube finalizer, JSON patch)",
    ),
    (
        "cluster",
        "tailnet-operator.dev",
        "tailnets/status",
        "patch",
        "",
        "status (server-side apply, tailnet/mod.rs)",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetegresses/status",
        "patch",
        "",
        "status (server-side apply, agent::patch_status)",
    ),
    (
        "workload",
        "tailnet-operator.dev",
        "tailnetingresses/status",
        "patch",
        "",
        "status (server-side apply, agent::patch_status)",
    ),
    (
        "workload",
        "apps",
        "deployments",
        "get",
        "",
        "ingress reads its agent Deployment while a backend is unresolved",
    ),
    (
        "workload",
        "apps",
        "deployments",
        "list",
        "",
        "controllers own agent Deployments (label-selected watch)",
    ),
    (
        "workload",
        "apps",
        "deployments",
        "watch",
        "",
        "controllers own agent Deployments (label-selected watch)",
    ),
    (
        "workload",
        "apps",
        "deployments",
        "create",
        "",
        "server-side apply of a new agent Deployment needs create",
    ),
    (
        "workload",
        "apps",
        "deployments",
        "patch",
        "",
        "agent Deployment (server-side apply)",
    ),
    (
        "workload",
        "",
        "secrets",
        "get",
        "",
        "auth Secret of an agent, TLS Secret of an ingress (any namespace)",
    ),
    (
        "workload",
        "",
        "secrets",
        "create",
        "",
        "auth and state Secrets of new agents (server-side apply)",
    ),
    (
        "workload",
        "",
        "secrets",
        "patch",
        "",
        "auth and state Secrets of agents (server-side apply)",
    ),
    (
        "workload",
        "",
        "secrets",
        "update",
        "",
        "held so the agent Role (get/update/patch on its state Secret) can be created without `escalate`",
    ),
    (
        "workload",
        "",
        "secrets",
        "delete",
        "",
        "a used single-use pre-auth key Secret is deleted (agent.rs)",
    ),
    (
        "workload",
        "",
        "configmaps",
        "get",
        "",
        "base policy, DNS hosts ConfigMap (may live in kube-system), ingress CA ConfigMap",
    ),
    (
        "workload",
        "",
        "configmaps",
        "create",
        "",
        "agent config, rendered policy, DNS hosts ConfigMaps (server-side apply)",
    ),
    (
        "workload",
        "",
        "configmaps",
        "patch",
        "",
        "agent config, rendered policy, DNS hosts ConfigMaps (server-side apply)",
    ),
    (
        "workload",
        "",
        "services",
        "get",
        "",
        "ingress backend Services in the ingress namespace",
    ),
    (
        "workload",
        "",
        "services",
        "list",
        "",
        "Service kind: watch cache of Services (those of the tailnet loadBalancerClass are reconciled)",
    ),
    (
        "workload",
        "",
        "services",
        "watch",
        "",
        "Service kind: watch cache of Services (those of the tailnet loadBalancerClass are reconciled)",
    ),
    (
        "workload",
        "",
        "services",
        "patch",
        "",
        "Service kind: finalizer add (server-side apply) and release (merge patch)",
    ),
    (
        "workload",
        "",
        "services",
        "create",
        "",
        "split horizon: the in-cluster Service in front of an ingress's agent (server-side apply)",
    ),
    (
        "workload",
        "",
        "services",
        "delete",
        "",
        "split horizon: the in-cluster Service once inCluster lists no namespace",
    ),
    (
        "workload",
        "",
        "services/status",
        "patch",
        "",
        "Service kind: status.conditions and status.loadBalancer (server-side apply)",
    ),
    (
        "workload",
        "apps",
        "deployments",
        "delete",
        "",
        "Service kind: the agent of a released Service (its class removed) is deleted",
    ),
    (
        "workload",
        "",
        "configmaps",
        "delete",
        "",
        "Service kind: the agent of a released Service (its class removed) is deleted",
    ),
    (
        "workload",
        "",
        "serviceaccounts",
        "delete",
        "",
        "Service kind: the agent of a released Service (its class removed) is deleted",
    ),
    (
        "workload",
        "rbac.authorization.k8s.io",
        "roles",
        "delete",
        "",
        "Service kind: the agent of a released Service (its class removed) is deleted",
    ),
    (
        "workload",
        "rbac.authorization.k8s.io",
        "rolebindings",
        "delete",
        "",
        "Service kind: the agent of a released Service (its class removed) is deleted",
    ),
    (
        "workload",
        "networking.k8s.io",
        "networkpolicies",
        "delete",
        "",
        "Service kind: the agent of a released Service (its class removed) is deleted",
    ),
    (
        "workload",
        "",
        "pods",
        "list",
        "",
        "agent pods' /status is read (their addresses)",
    ),
    (
        "workload",
        "discovery.k8s.io",
        "endpointslices",
        "list",
        "",
        "the EndpointSlices of a backend Service without a selector: its agent's egress NetworkPolicy admits their addresses (controllers/reach.rs)",
    ),
    (
        "workload",
        "apps",
        "replicasets",
        "list",
        "",
        "/status is read only from pods whose ReplicaSet the agent Deployment owns (forged pods copy labels)",
    ),
    (
        "workload",
        "",
        "serviceaccounts",
        "create",
        "",
        "agent ServiceAccount (server-side apply)",
    ),
    (
        "workload",
        "",
        "serviceaccounts",
        "patch",
        "",
        "agent ServiceAccount (server-side apply)",
    ),
    (
        "workload",
        "rbac.authorization.k8s.io",
        "roles",
        "create",
        "",
        "agent Role: its state Secret only (server-side apply)",
    ),
    (
        "workload",
        "rbac.authorization.k8s.io",
        "roles",
        "patch",
        "",
        "agent Role (server-side apply)",
    ),
    (
        "workload",
        "rbac.authorization.k8s.io",
        "rolebindings",
        "create",
        "",
        "agent RoleBinding (server-side apply)",
    ),
    (
        "workload",
        "rbac.authorization.k8s.io",
        "rolebindings",
        "patch",
        "",
        "agent RoleBinding (server-side apply)",
    ),
    (
        "workload",
        "networking.k8s.io",
        "networkpolicies",
        "list",
        "",
        "watch cache of agent NetworkPolicies: a deleted or edited one is re-applied on the next poll",
    ),
    (
        "workload",
        "networking.k8s.io",
        "networkpolicies",
        "watch",
        "",
        "watch cache of agent NetworkPolicies: a deleted or edited one is re-applied on the next poll",
    ),
    (
        "workload",
        "networking.k8s.io",
        "networkpolicies",
        "create",
        "",
        "agent NetworkPolicy (server-side apply)",
    ),
    (
        "workload",
        "networking.k8s.io",
        "networkpolicies",
        "patch",
        "",
        "agent NetworkPolicy (server-side apply)",
    ),
    (
        "workload",
        "cert-manager.io",
        "certificates",
        "create",
        "",
        "Certificate for an ingress without tls.secretName",
    ),
    (
        "workload",
        "cert-manager.io",
        "certificates",
        "patch",
        "",
        "Certificate (server-side apply)",
    ),
    (
        "workload",
        "events.k8s.io",
        "events",
        "create",
        "",
        "events on Tailnets, egresses, ingresses (kube Recorder)",
    ),
    (
        "workload",
        "events.k8s.io",
        "events",
        "patch",
        "",
        "kube Recorder updates the series of a repeated event",
    ),
    (
        "cluster",
        "",
        "namespaces",
        "get",
        "kube-system",
        "default installation id = uid of kube-system",
    ),
    (
        "cluster",
        "discovery.k8s.io",
        "endpointslices",
        "get",
        "kubernetes",
        "Service kind: the Kubernetes API's endpoints its agent's egress NetworkPolicy admits",
    ),
    (
        "namespace",
        "",
        "secrets",
        "list",
        "",
        "Tailnet controller watches the API key Secret",
    ),
    (
        "namespace",
        "",
        "secrets",
        "watch",
        "",
        "Tailnet controller watches the API key Secret",
    ),
    (
        "namespace",
        "",
        "configmaps",
        "list",
        "",
        "Tailnet controller watches the base-policy ConfigMap",
    ),
    (
        "namespace",
        "",
        "configmaps",
        "watch",
        "",
        "Tailnet controller watches the base-policy ConfigMap",
    ),
    (
        "namespace",
        "",
        "services",
        "list",
        "",
        "egress Services (watch, DNS entries, removed targets)",
    ),
    (
        "namespace",
        "",
        "services",
        "watch",
        "",
        "egress Services (owned watch)",
    ),
    (
        "namespace",
        "",
        "services",
        "create",
        "",
        "egress Services (server-side apply)",
    ),
    (
        "namespace",
        "",
        "services",
        "patch",
        "",
        "egress Services (server-side apply)",
    ),
    (
        "namespace",
        "",
        "services",
        "delete",
        "",
        "Services of removed egress targets",
    ),
    (
        "namespace",
        "coordination.k8s.io",
        "leases",
        "create",
        "",
        "leader election: the first replica creates the Lease",
    ),
    (
        "namespace",
        "coordination.k8s.io",
        "leases",
        "get",
        "tailnet-operator-leader",
        "leader election",
    ),
    (
        "namespace",
        "coordination.k8s.io",
        "leases",
        "update",
        "tailnet-operator-leader",
        "leader election: acquire and renew",
    ),
];

/// `(scope, group, resource, verb, resourceName)` for every rule of a Role/ClusterRole.
fn expand(scope: &str, role: &Value) -> BTreeSet<(String, String, String, String, String)> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        let names = strings(&rule["resourceNames"]);
        let names = if names.is_empty() {
            vec![String::new()]
        } else {
            names
        };
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    for name in &names {
                        out.insert((
                            scope.to_owned(),
                            group.clone(),
                            resource.clone(),
                            verb.clone(),
                            name.clone(),
                        ));
                    }
                }
            }
        }
    }
    out
}

type Grant = (String, String, String, String, String);

/// The table's rows of `scope`, as granted under `as_scope`.
fn table_rows(scope: &str, as_scope: &str) -> BTreeSet<Grant> {
    GRANTS
        .iter()
        .filter(|row| row.0 == scope)
        .map(|(_, group, resource, verb, name, _)| {
            (
                as_scope.to_string(),
                group.to_string(),
                resource.to_string(),
                verb.to_string(),
                name.to_string(),
            )
        })
        .collect()
}

fn assert_same_grants(what: &str, granted: &BTreeSet<Grant>, expected: &BTreeSet<Grant>) {
    for (scope, group, resource, verb, _) in granted {
        assert!(
            !["*"].contains(&verb.as_str()) && resource != "*" && group != "*",
            "{what}: wildcards are never granted: {scope} {group}/{resource} {verb}"
        );
    }
    let unexplained: Vec<_> = granted.difference(expected).collect();
    assert!(
        unexplained.is_empty(),
        "{what}: the chart grants rules without a reason in GRANTS: {unexplained:#?}"
    );
    let stale: Vec<_> = expected.difference(granted).collect();
    assert!(
        stale.is_empty(),
        "{what}: GRANTS lists rules the chart does not grant: {stale:#?}"
    );
}

/// The rendered object of `kind` named `name` in `namespace` (`""`: cluster-scoped).
fn find_named<'a>(docs: &'a [Value], kind: &str, namespace: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"] == name
                && d["metadata"]["namespace"].as_str().unwrap_or_default() == namespace
        })
        .unwrap_or_else(|| panic!("no {kind} {namespace}/{name} rendered"))
}

#[test]
fn chart_rbac_grants_exactly_the_reasoned_table() {
    let Some(helm) = deps_binary("helm", "helm") else {
        return;
    };
    assert!(
        GRANTS
            .iter()
            .all(|row| ["cluster", "workload", "namespace"].contains(&row.0)),
        "unknown scope in GRANTS"
    );
    // Default: the whole cluster through the ClusterRole.
    let docs = template(&helm, "ops", "tailnet-system", &[]);
    let mut granted = expand(
        "cluster",
        find_named(&docs, "ClusterRole", "", "ops-tailnet-operator"),
    );
    granted.extend(expand("namespace", find(&docs, "Role")));
    let mut expected = table_rows("cluster", "cluster");
    expected.extend(table_rows("workload", "cluster"));
    expected.extend(table_rows("namespace", "namespace"));
    assert_same_grants("cluster-wide install", &granted, &expected);
    assert_eq!(
        docs.iter().filter(|d| d["kind"] == "Role").count(),
        1,
        "cluster-wide: only the operator namespace's Role"
    );
    // The ServiceAccount is bound to both.
    let sa = find(&docs, "ServiceAccount")["metadata"]["name"].clone();
    for binding in ["ClusterRoleBinding", "RoleBinding"] {
        assert_eq!(find(&docs, binding)["subjects"][0]["name"], sa, "{binding}");
    }
    let args =
        find(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(!args.contains("--watch-namespaces"), "{args}");
    // Without operator.clusterCIDRs the agents' egress stays as before (no flag).
    assert!(!args.contains("--cluster-cidrs"), "{args}");
    assert!(!args.contains("--cluster-dns-pods"), "{args}");
    assert!(args.contains("--restrict-agent-egress=true"), "{args}");

    // Namespace-scoped: the ClusterRole keeps only the cluster rows; the workload rows are a
    // Role in each watched namespace (the release namespace included); Events about Tailnets
    // in `default`.
    let docs = template(
        &helm,
        "ops",
        "tailnet-system",
        &["--set", "watchNamespaces={team-b,team-a}"],
    );
    assert_same_grants(
        "namespace-scoped install: ClusterRole",
        &expand(
            "cluster",
            find_named(&docs, "ClusterRole", "", "ops-tailnet-operator"),
        ),
        &table_rows("cluster", "cluster"),
    );
    assert_same_grants(
        "namespace-scoped install: operator namespace Role",
        &expand(
            "namespace",
            find_named(&docs, "Role", "tailnet-system", "ops-tailnet-operator"),
        ),
        &table_rows("namespace", "namespace"),
    );
    for namespace in ["tailnet-system", "team-a", "team-b"] {
        assert_same_grants(
            &format!("namespace-scoped install: Role in {namespace}"),
            &expand(
                "workload",
                find_named(&docs, "Role", namespace, "ops-tailnet-operator-workloads"),
            ),
            &table_rows("workload", "workload"),
        );
        let binding = find_named(
            &docs,
            "RoleBinding",
            namespace,
            "ops-tailnet-operator-workloads",
        );
        assert_eq!(
            binding["subjects"][0]["name"], sa,
            "RoleBinding in {namespace}"
        );
        assert_eq!(binding["subjects"][0]["namespace"], "tailnet-system");
    }
    let events = expand(
        "workload",
        find_named(
            &docs,
            "Role",
            "default",
            "ops-tailnet-operator-tailnet-events",
        ),
    );
    let event_rows: BTreeSet<Grant> = table_rows("workload", "workload")
        .into_iter()
        .filter(|(_, _, resource, _, _)| resource == "events")
        .collect();
    assert_same_grants(
        "namespace-scoped install: Events in default",
        &events,
        &event_rows,
    );
    let roles: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"] == "Role")
        .map(|d| {
            format!(
                "{}/{}",
                d["metadata"]["namespace"].as_str().unwrap_or_default(),
                d["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        roles.len(),
        5,
        "operator Role, three workload Roles, the events Role: {roles:?}"
    );
    let args =
        find(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("--watch-namespaces=tailnet-system,team-a,team-b"),
        "{args}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templated_manifests_pass_server_side_dry_run() {
    let Some(helm) = deps_binary("helm", "helm") else {
        return;
    };
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ns = env.namespace("helm").await.expect("namespace");
    let client = ns.client().clone();
    // Everything the chart can render except the prometheus-operator kinds (their CRDs are
    // not in the test env; the rule content is checked by promtool above).
    let docs = template(
        &helm,
        ns.name(),
        ns.name(),
        &[
            "--include-crds",
            "--set",
            "tailnet.create=true",
            "--set",
            "tailnet.server=https://headscale.example.net",
            "--set",
            "tailnet.apiKeySecret.create=true",
            "--set",
            "tailnet.apiKeySecret.value=not-a-real-key",
            "--set",
            "tailnet.policy.tagOwners={group:platform}",
            "--set",
            "replicaCount=2",
        ],
    );
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "Secret",
        "ConfigMap",
        "NetworkPolicy",
    ] {
        assert!(kinds.contains(kind), "{kind} not rendered: {kinds:?}");
    }
    let mut params = PatchParams::apply("helm-chart-test").force();
    params.dry_run = true;
    for doc in &docs {
        let api_version = doc["apiVersion"].as_str().expect("apiVersion");
        let kind = doc["kind"].as_str().expect("kind");
        let name = doc["metadata"]["name"].as_str().expect("name");
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = kube::discovery::pinned_kind(&client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("{api_version} {kind} is not served: {e}"));
        let api: kube::Api<DynamicObject> = match capabilities.scope {
            Scope::Namespaced => kube::Api::namespaced_with(client.clone(), ns.name(), &resource),
            Scope::Cluster => kube::Api::all_with(client.clone(), &resource),
        };
        let applied = api
            .patch(name, &params, &Patch::Apply(doc))
            .await
            .unwrap_or_else(|e| panic!("server-side dry-run of {kind} {name} rejected: {e}"));
        assert_eq!(applied.metadata.name.as_deref(), Some(name));
    }
}

#[test]
fn chart_schema_pdb_overrides_podmonitor_crds_and_agent_scheduling_render_as_documented() {
    let Some(helm) = deps_binary("helm", "helm") else {
        return;
    };
    let chart = chart_dir();
    let chart = chart.to_str().expect("UTF-8");
    // values.schema.json: helm lint and template reject bad values.
    for bad in [
        "replicaCount=-1",
        "operator.logFormat=xml",
        "typo=1",
        "image.digest=latest",
        "agent.image.pullPolicy=Sometimes",
        "networkPolicy.typo=1",
        "agent.logFormat=xml",
        "agent.logLevel=info debug",
        "metrics.prometheusRule.alerts.TailnetAgentOffline.for=soon",
        "metrics.prometheusRule.alerts.TailnetAgentOffline.typo=1",
    ] {
        let output = Command::new(&helm)
            .args(["template", "x", chart, "--set", bad])
            .output()
            .expect("helm");
        assert!(!output.status.success(), "--set {bad} was accepted");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("schema"),
            "--set {bad}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // One replica: no PodDisruptionBudget; CRDs templated with keep; NOTES exist.
    let single = template(&helm, "ops", "tailnet-system", &[]);
    assert!(single.iter().all(|d| d["kind"] != "PodDisruptionBudget"));
    let crds: Vec<&Value> = single
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    assert_eq!(crds.len(), 4);
    for crd in &crds {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{}",
            crd["metadata"]["name"]
        );
        assert_eq!(
            crd["metadata"]["labels"]["app.kubernetes.io/instance"],
            "ops"
        );
    }
    let notes = run(
        &helm,
        &[
            "install",
            "ops",
            chart,
            "--dry-run=client",
            "--namespace",
            "tailnet-system",
        ],
    );
    assert!(
        notes.contains("NOTES:") && notes.contains("get lease tailnet-operator-leader"),
        "{notes}"
    );
    // Two replicas: a PDB; overrides; security contexts; PodMonitor; no CRDs on request.
    let docs = template(
        &helm,
        "ops",
        "tailnet-system",
        &[
            "--set",
            "replicaCount=2",
            "--set",
            "fullnameOverride=tno",
            "--set",
            "nameOverride=tnop",
            "--set",
            "podSecurityContext.runAsUser=1234",
            "--set",
            "securityContext.readOnlyRootFilesystem=true",
            "--set",
            "agent.podMonitor.enabled=true",
            "--set",
            "crds.install=false",
            "--api-versions",
            "monitoring.coreos.com/v1/PodMonitor",
        ],
    );
    let pdb = find(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["metadata"]["name"], "tno");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "tnop"
    );
    let deployment = find(&docs, "Deployment");
    assert_eq!(deployment["metadata"]["name"], "tno");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"],
        1234
    );
    let pod_monitor = find(&docs, "PodMonitor");
    assert_eq!(
        pod_monitor["spec"]["podMetricsEndpoints"][0]["port"], "admin",
        "the agents' admin port serves /metrics"
    );
    assert_eq!(pod_monitor["spec"]["namespaceSelector"]["any"], true);
    assert!(docs.iter().all(|d| d["kind"] != "CustomResourceDefinition"));
    // Chart-level agent scheduling defaults go into the Tailnet the chart creates.
    let docs = template(
        &helm,
        "ops",
        "tailnet-system",
        &[
            "--set",
            "tailnet.create=true",
            "--set",
            "tailnet.server=https://headscale.example.net",
            "--set",
            "tailnet.policy.tagOwners={group:platform}",
            "--set",
            "agent.scheduling.nodeSelector.pool=edge",
            "--set",
            "agent.scheduling.priorityClassName=tailnet-agents",
            "--set",
            "agent.scheduling.imagePullSecrets[0].name=mirror",
            "--set",
            "agent.scheduling.tolerations[0].key=dedicated",
        ],
    );
    let agent = &chart_tailnet(&docs)["spec"]["agent"];
    assert_eq!(agent["nodeSelector"]["pool"], "edge");
    assert_eq!(agent["priorityClassName"], "tailnet-agents");
    assert_eq!(agent["imagePullSecrets"][0]["name"], "mirror");
    assert_eq!(agent["tolerations"][0]["key"], "dedicated");
}

/// `agent.logLevel`/`agent.logFormat` become the chart Tailnet's `spec.agent.logLevel` and
/// `logFormat`, in a form the CRD and `tailnet-operator render` accept; unset, no `spec.agent`.
#[test]
fn chart_agent_logging_goes_into_the_chart_tailnet() {
    let Some(helm) = deps_binary("helm", "helm") else {
        return;
    };
    let chart_tailnet_with = |extra: &[&str]| {
        let mut args = vec![
            "--set",
            "tailnet.create=true",
            "--set",
            "tailnet.server=https://headscale.example.net",
            "--set",
            "tailnet.policy.tagOwners={group:platform}",
        ];
        args.extend_from_slice(extra);
        chart_tailnet(&template(&helm, "ops", "tailnet-system", &args))
    };
    let tailnet = chart_tailnet_with(&[
        "--set",
        "agent.logLevel=info\\,tailnet_agent::proxy=debug",
        "--set",
        "agent.logFormat=json",
    ]);
    let agent = &tailnet["spec"]["agent"];
    assert_eq!(agent["logLevel"], "info,tailnet_agent::proxy=debug");
    assert_eq!(agent["logFormat"], "json");
    let spec: tailnet_api::TailnetSpec =
        serde_json::from_value(tailnet["spec"].clone()).expect("the chart Tailnet's spec");
    assert_eq!(tailnet_api::validate::tailnet(&spec), vec![]);
    // Unset: no spec.agent at all (the operator's defaults, info and text).
    assert!(chart_tailnet_with(&[])["spec"].get("agent").is_none());
}

#[test]
fn chart_tailnet_registry_extras_aggregated_roles_network_policy_and_monitoring_gates_render() {
    let Some(helm) = deps_binary("helm", "helm") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("tno-helm-values-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        r#"
global: {imageRegistry: mirror.example.net, imagePullSecrets: [{name: global-pull}]}
image: {pullPolicy: Always}
operator: {clusterCIDRs: [10.244.0.0/16, 10.96.0.0/12, "fd00:10:244::/56"], clusterDNSPods: dns/app=coredns, restrictAgentEgress: false}
agent:
  image: {registry: agents.example.net, pullPolicy: Always}
  tailscaleImage: {pullPolicy: Never}
  resources: {requests: {cpu: 10m}}
  tailscaleResources: {limits: {memory: 64Mi}}
tailnet:
  create: true
  name: main
  server: https://headscale.example.net
  policy: {tagOwners: ["group:platform"]}
  dns: {hostsConfigMap: tailnet-hosts, ingressNameTemplate: "{name}.{namespace}.example.net", magicDNSDomain: ts.example.net}
  defaults: {tls: {issuerRef: {name: apps-ca}}}
extraEnv: [{name: SSL_CERT_FILE, value: /etc/ca/ca.crt}]
extraVolumes: [{name: ca, configMap: {name: headscale-ca}}]
extraVolumeMounts: [{name: ca, mountPath: /etc/ca, readOnly: true}]
strategy: {type: Recreate}
metrics: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}}
"#,
    )
    .expect("values");
    let values = values.to_str().expect("UTF-8");
    let docs = template(&helm, "ops", "tailnet-system", &["-f", values]);
    // Monitoring kinds not served (helm template's default capabilities): not rendered.
    for kind in ["ServiceMonitor", "PrometheusRule", "PodMonitor", "Tailnet"] {
        assert!(docs.iter().all(|d| d["kind"] != kind), "{kind} rendered");
    }
    check_deployment_extras(find(&docs, "Deployment"));
    let tailnet = chart_tailnet(&docs);
    assert_eq!(tailnet["metadata"]["name"], "main");
    let spec = &tailnet["spec"];
    assert_eq!(
        spec["dns"]["ingressNameTemplate"],
        "{name}.{namespace}.example.net"
    );
    assert_eq!(spec["dns"]["magicDNSDomain"], "ts.example.net");
    assert_eq!(spec["defaults"]["tls"]["issuerRef"]["name"], "apps-ca");
    assert_eq!(
        spec["defaults"]["tls"]["issuerRef"]["kind"],
        "ClusterIssuer"
    );
    assert_eq!(spec["agent"]["resources"]["requests"]["cpu"], "10m");
    assert_eq!(
        spec["agent"]["tailscaleResources"]["limits"]["memory"],
        "64Mi"
    );
    assert_eq!(spec["agent"]["imagePullSecrets"][0]["name"], "global-pull");
    // The manifest is a Tailnet the operator's types accept.
    serde_json::from_value::<tailnet_api::Tailnet>(tailnet.clone()).expect("a valid Tailnet");
    // The only extra grant: applying this one Tailnet.
    let operator_role = find_named(&docs, "ClusterRole", "", "ops-tailnet-operator");
    let extra: BTreeSet<Grant> = expand("cluster", operator_role)
        .difference(&{
            let mut rows = table_rows("cluster", "cluster");
            rows.extend(table_rows("workload", "cluster"));
            rows
        })
        .cloned()
        .collect();
    let want: BTreeSet<Grant> = ["create", "patch"]
        .iter()
        .map(|verb| {
            (
                "cluster".to_string(),
                "tailnet-operator.dev".to_string(),
                "tailnets".to_string(),
                verb.to_string(),
                "main".to_string(),
            )
        })
        .collect();
    assert_eq!(
        extra, want,
        "tailnet.create grants create/patch of its Tailnet only"
    );
    check_aggregated_roles_and_network_policy(&docs);
    let docs = template(
        &helm,
        "ops",
        "tailnet-system",
        &[
            "-f",
            values,
            "--set",
            "networkPolicy.egress.enabled=true",
            "--set",
            "aggregatedRoles.enabled=false",
        ],
    );
    let policy = find(&docs, "NetworkPolicy");
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert!(
        policy["spec"]["egress"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    );
    assert_eq!(
        docs.iter().filter(|d| d["kind"] == "ClusterRole").count(),
        1
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Deployment of the values in
/// `chart_tailnet_registry_extras_aggregated_roles_network_policy_and_monitoring_gates_render`.
fn check_deployment_extras(deployment: &Value) {
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(deployment["spec"]["revisionHistoryLimit"], 10);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["imagePullSecrets"],
        serde_json::json!([{"name": "global-pull"}])
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        "mirror.example.net/ghcr.io/tailnet-operator/tailnet-operator:v0.1.0"
    );
    assert_eq!(container["imagePullPolicy"], "Always");
    let args = container["args"].to_string();
    for expected in [
        "--agent-image=agents.example.net/ghcr.io/tailnet-operator/tailnet-agent:v0.1.0",
        "--tailscale-image=mirror.example.net/ghcr.io/tailnet-operator/tailnet-tailscaled:v0.1.0",
        "--apply-tailnet=/etc/tailnet-operator/tailnet/tailnet.yaml",
        "--agent-image-pull-policy=Always",
        "--tailscale-image-pull-policy=Never",
        "--cluster-cidrs=10.244.0.0/16,10.96.0.0/12,fd00:10:244::/56",
        "--cluster-dns-pods=dns/app=coredns",
        "--restrict-agent-egress=false",
    ] {
        assert!(args.contains(expected), "{expected} not in {args}");
    }
    assert!(
        container["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "SSL_CERT_FILE"),
        "extraEnv"
    );
    let mounts = container["volumeMounts"].to_string();
    assert!(
        mounts.contains("/etc/tailnet-operator/tailnet") && mounts.contains("/etc/ca"),
        "{mounts}"
    );
    let volumes = pod["volumes"].to_string();
    assert!(
        volumes.contains("ops-tailnet-operator-tailnet") && volumes.contains("headscale-ca"),
        "{volumes}"
    );
    assert!(
        deployment["spec"]["template"]["metadata"]["annotations"]["checksum/tailnet"].is_string(),
        "a changed Tailnet manifest rolls the pods"
    );
}

fn check_aggregated_roles_and_network_policy(docs: &[Value]) {
    // Aggregated roles: view reads the three kinds; edit writes the two namespaced ones.
    let view = find_named(docs, "ClusterRole", "", "ops-tailnet-operator-view");
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );
    assert_eq!(
        view["rules"][0]["verbs"],
        serde_json::json!(["get", "list", "watch"])
    );
    let edit = find_named(docs, "ClusterRole", "", "ops-tailnet-operator-edit");
    assert_eq!(
        edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    assert!(
        !edit["rules"].to_string().contains("\"tailnets\""),
        "Tailnets stay administrative"
    );
    // NetworkPolicy: ingress to the admin port only; egress unrestricted by default.
    let policy = find(docs, "NetworkPolicy");
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 8080);
}

/// The Grafana dashboard ConfigMap: absent by default; with `metrics.grafanaDashboard.enabled`
/// labelled for Grafana's sidecar (plus the extra labels and annotations), holding the
/// dashboard JSON of `files/grafana-dashboard.json` with a Prometheus query in every panel.
#[test]
fn grafana_dashboard_is_optional_and_carries_the_sidecar_label() {
    let Some(helm) = deps_binary("helm", "helm") else {
        return;
    };
    let is_dashboard = |doc: &&Value| {
        doc["kind"] == "ConfigMap" && doc["metadata"]["labels"]["grafana_dashboard"] == "1"
    };
    let default = template(&helm, "ops", "tailnet-system", &[]);
    assert!(
        !default.iter().any(|d| is_dashboard(&d)),
        "no dashboard unless asked for"
    );
    let docs = template(
        &helm,
        "ops",
        "tailnet-system",
        &[
            "--set",
            "metrics.grafanaDashboard.enabled=true",
            "--set",
            "metrics.grafanaDashboard.labels.team=net",
            "--set",
            "metrics.grafanaDashboard.annotations.grafana_folder=Networking",
        ],
    );
    let config_map = docs.iter().find(is_dashboard).expect("dashboard ConfigMap");
    assert_eq!(config_map["metadata"]["namespace"], "tailnet-system");
    assert_eq!(config_map["metadata"]["labels"]["team"], "net");
    assert_eq!(
        config_map["metadata"]["annotations"]["grafana_folder"],
        "Networking"
    );
    let text = config_map["data"]["tailnet-operator.json"]
        .as_str()
        .expect("dashboard JSON in the ConfigMap");
    let dashboard: Value = serde_json::from_str(text).expect("valid JSON");
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("files/grafana-dashboard.json")).expect("file"),
    )
    .expect("file is JSON");
    assert_eq!(dashboard, file, "the ConfigMap carries the file unchanged");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for panel in panels {
        let expr = panel["targets"][0]["expr"].as_str().unwrap_or_default();
        assert!(
            expr.contains("tailnet_"),
            "panel {} queries no tailnet metric: {expr:?}",
            panel["title"]
        );
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
    }
    // The schema is strict: an unknown key under grafanaDashboard is refused.
    let refused = Command::new(&helm)
        .args(["template", "x"])
        .arg(chart_dir())
        .args(["--set", "metrics.grafanaDashboard.folder=x"])
        .output()
        .expect("helm runs");
    assert!(
        !refused.status.success(),
        "values.schema.json must refuse metrics.grafanaDashboard.folder"
    );
}
