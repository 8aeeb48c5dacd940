//! `render` with Gateway API inputs: a Gateway with HTTPS (certificate Secret), TLS passthrough
//! and TCP listeners, two HTTPRoutes (one with a cross-namespace backend), a TLSRoute and a
//! TCPRoute; a Gateway of another class; invalid class parameters.

use std::path::{Path, PathBuf};

use clap::Parser;
use serde_json::Value;

use super::super::render::{RenderArgs, RenderCommandError, render_with_warnings};
use super::REDACTED_ANNOTATION;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    render: RenderArgs,
}

pub(crate) const TAILNET: &str = r#"
apiVersion: tailnet-operator.dev/v1alpha1
kind: Tailnet
metadata: {name: demo}
spec:
  server: https://control.example.net
  apiSecretRef: {name: headscale-bootstrap, key: apiKey}
  dns: {hostsConfigMap: tailnet-hosts}
  policy:
    mode: DryRun
    tagOwners: ["group:platform"]
    ingressSourceAllowlist: ["group:team-a"]
"#;

pub(crate) const GATEWAY: &str = r#"
apiVersion: tailnet-operator.dev/v1alpha1
kind: TailnetGatewayParameters
metadata: {name: tailnet, namespace: tailnet-system}
spec:
  tailnetRef: {name: demo}
  allowFrom: ["group:team-a"]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: tailnet}
spec:
  controllerName: tailnet-operator.dev/gateway
  parametersRef: {group: tailnet-operator.dev, kind: TailnetGatewayParameters, name: tailnet, namespace: tailnet-system}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: other}
spec:
  controllerName: example.net/gateway
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: infra}
spec:
  gatewayClassName: tailnet
  listeners:
    - {name: https, port: 443, protocol: HTTPS, hostname: app.example.net,
       tls: {certificateRefs: [{name: web-cert}]}, allowedRoutes: {namespaces: {from: All}}}
    - {name: tls, port: 8443, protocol: TLS, hostname: "*.tls.example.net",
       tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}
    - {name: db, port: 5432, protocol: TCP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: elsewhere, namespace: infra}
spec:
  gatewayClassName: other
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: frontend, namespace: team-a}
spec:
  parentRefs: [{name: web, namespace: infra, sectionName: https}]
  hostnames: [app.example.net]
  rules:
    - backendRefs: [{name: frontend, port: 8080}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: api, namespace: team-a}
spec:
  parentRefs: [{name: web, namespace: infra}]
  rules:
    - matches: [{path: {type: PathPrefix, value: /api}}]
      backendRefs: [{name: api, namespace: team-b, port: 9000}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: secure, namespace: team-a}
spec:
  parentRefs: [{name: web, namespace: infra, sectionName: tls}]
  hostnames: [db.tls.example.net]
  rules: [{backendRefs: [{name: secure, port: 8443}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: pg, namespace: infra}
spec:
  parentRefs: [{name: web, sectionName: db}]
  rules: [{backendRefs: [{name: pg, port: 5432}]}]
---
apiVersion: v1
kind: Service
metadata: {name: frontend, namespace: team-a}
spec: {selector: {app: frontend}, ports: [{name: http, port: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: team-b}
spec: {selector: {app: api}, ports: [{port: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: secure, namespace: team-a}
spec: {selector: {app: secure}, ports: [{port: 8443}]}
---
apiVersion: v1
kind: Service
metadata: {name: pg, namespace: infra}
spec: {selector: {app: pg}, ports: [{port: 5432}]}
"#;

pub(crate) const GRANT: &str = r#"
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: from-team-a, namespace: team-b}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: team-a}]
  to: [{group: "", kind: Service}]
"#;

/// The certificate Secret `infra/web-cert` (a fresh self-signed pair) and its key's PEM.
pub(crate) fn certificate_secret() -> (String, String) {
    let issued =
        rcgen::generate_simple_self_signed(vec!["app.example.net".into()]).expect("certificate");
    let cert = issued.cert.pem();
    let key = issued.signing_key.serialize_pem();
    // stringData, as a manifest may hold it (the apiserver merges it into data).
    let indent = |pem: &str| {
        pem.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: web-cert, namespace: infra}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(&cert),
        indent(&key)
    );
    (secret, key)
}

/// A temporary directory with one file per document set.
fn inputs(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write input");
    }
    dir
}

fn run(dir: &Path, extra: &[&str]) -> Result<(String, Vec<String>), RenderCommandError> {
    let mut argv: Vec<String> = vec!["render".into(), dir.display().to_string()];
    argv.extend(
        ["--installation-id", "preview"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string()),
    );
    let cli = Cli::try_parse_from(argv).expect("arguments");
    render_with_warnings(&cli.render)
}

fn yaml_items(text: &str) -> Vec<Value> {
    let list: Value = serde_yaml::from_str(text).expect("a YAML List");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn find<'a>(items: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    items
        .iter()
        .find(|i| i["kind"] == kind && i["metadata"]["name"] == name)
}

fn agent_config(items: &[Value]) -> String {
    find(items, "ConfigMap", "tailnet-gateway-web-config")
        .and_then(|c| c["data"].as_object())
        .map(|d| {
            d.values()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

#[test]
fn render_gateway_policy_dns_objects_and_redacted_certificate() {
    let (secret, key) = certificate_secret();
    let dir = inputs(&[
        ("10-tailnet.yaml", TAILNET),
        ("20-gateway.yaml", GATEWAY),
        ("21-grant.yaml", GRANT),
        ("22-secret.yaml", &secret),
    ]);
    let (text, warnings) = run(dir.path(), &["-o", "yaml"]).expect("rendered");
    // Key material never printed, in any form.
    let key_body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!text.contains(line), "key material printed");
    }
    assert!(!text.contains("PRIVATE KEY") && !key_body.is_empty());
    let items = yaml_items(&text);

    // 1. Policy: the Gateway's tag and the grant of allowFrom to the listener ports.
    let policy = items
        .iter()
        .find(|i| i["metadata"]["name"] == "demo-rendered-policy")
        .and_then(|p| p["data"]["policy.hujson"].as_str())
        .expect("policy");
    let tag = "tag:tno-gw-infra-web";
    assert!(policy.contains(&format!("\"{tag}\"")), "{policy}");
    for port in ["tcp:443", "tcp:8443", "tcp:5432"] {
        assert!(policy.contains(port), "{port} in {policy}");
    }
    assert!(policy.contains("group:team-a"), "{policy}");
    // DNS: the precise listener hostname, pending without the node's addresses; no record for
    // the wildcard listener.
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("DNS name app.example.net") && w.contains("infra/web")),
        "{warnings:#?}"
    );
    assert!(!warnings.iter().any(|w| w.contains("DNS name *.tls")));

    // 2. The agent's objects, as the Gateway controller plans them.
    for (kind, name) in [
        ("ServiceAccount", "tailnet-gateway-web"),
        ("Role", "tailnet-gateway-web"),
        ("RoleBinding", "tailnet-gateway-web"),
        ("ConfigMap", "tailnet-gateway-web-config"),
        ("Deployment", "tailnet-gateway-web"),
        ("NetworkPolicy", "tailnet-gateway-web"),
    ] {
        let object = find(&items, kind, name).unwrap_or_else(|| panic!("{kind} {name}"));
        assert_eq!(object["metadata"]["namespace"], "infra", "{kind}");
    }
    let config = agent_config(&items);
    for wanted in [
        "app.example.net",
        "frontend.team-a.svc.cluster.local",
        "api.team-b.svc.cluster.local",
        "db.tls.example.net",
        "secure.team-a.svc.cluster.local",
        "pg.infra.svc.cluster.local",
        "infra.web-cert.crt",
    ] {
        assert!(config.contains(wanted), "{wanted} in {config}");
    }
    // The certificate copy: keys kept, values emptied, the annotation says so.
    let copy = find(&items, "Secret", "tailnet-gateway-web-tls").expect("certificate copy");
    let data = copy["data"].as_object().expect("data");
    let keys: Vec<&String> = data.keys().collect();
    assert_eq!(keys, ["infra.web-cert.crt", "infra.web-cert.key"]);
    assert!(data.values().all(|v| v == ""), "{data:?}");
    assert!(copy["metadata"]["annotations"][REDACTED_ANNOTATION].is_string());

    // The Gateway of another class is ignored, and said so.
    assert!(find(&items, "Deployment", "tailnet-gateway-elsewhere").is_none());
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("Gateway infra/elsewhere")
                && w.contains("spec.gatewayClassName")
                && w.contains("example.net/gateway")),
        "{warnings:#?}"
    );
    // Nothing to report of the routes with the grant.
    assert!(
        !warnings.iter().any(|w| w.contains("RefNotPermitted")),
        "{warnings:#?}"
    );
}

#[test]
fn render_gateway_cross_namespace_backend_without_grant_is_named() {
    let (secret, _) = certificate_secret();
    let dir = inputs(&[
        ("10-tailnet.yaml", TAILNET),
        ("20-gateway.yaml", GATEWAY),
        ("22-secret.yaml", &secret),
    ]);
    let (text, warnings) = run(dir.path(), &["-o", "yaml"]).expect("rendered");
    let note = warnings
        .iter()
        .find(|w| w.contains("HTTPRoute team-a/api"))
        .unwrap_or_else(|| panic!("{warnings:#?}"));
    assert!(
        note.contains("spec.rules[].backendRefs")
            && note.contains("ResolvedRefs=False (RefNotPermitted)")
            && note.contains("Gateway infra/web"),
        "{note}"
    );
    // Its share is answered 500 by the agent: no address of the refused backend.
    let config = agent_config(&yaml_items(&text));
    assert!(!config.contains("api.team-b.svc"), "{config}");
    assert!(config.contains("frontend.team-a.svc.cluster.local"));
}

#[test]
fn render_gateway_missing_certificate_and_text_output() {
    let dir = inputs(&[("10-tailnet.yaml", TAILNET), ("20-gateway.yaml", GATEWAY)]);
    let (text, warnings) = run(dir.path(), &[]).expect("rendered");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("spec.listeners[0] (https)")
                && w.contains("InvalidCertificateRef")
                && w.contains("--observed tlsSecrets")),
        "{warnings:#?}"
    );
    // Text mode: the notes as comments before the objects; no certificate copy (the
    // Deployment mounts it, optional, all the same).
    assert!(text.contains("# note: Gateway infra/web: spec.listeners[0] (https)"));
    assert!(
        !text
            .lines()
            .any(|line| line.trim() == "name: tailnet-gateway-web-tls"),
        "{text}"
    );
    assert!(text.contains("secretName: tailnet-gateway-web-tls\n"));
    // The Secret listed as usable in --observed: the copy is printed (redacted).
    let observed = dir.path().join("observed.json");
    std::fs::write(&observed, r#"{"tlsSecrets": ["infra/web-cert"]}"#).expect("observed");
    let inputs: Vec<PathBuf> = vec![
        dir.path().join("10-tailnet.yaml"),
        dir.path().join("20-gateway.yaml"),
    ];
    let mut argv: Vec<String> = vec!["render".into()];
    argv.extend(inputs.iter().map(|p| p.display().to_string()));
    argv.extend(["--observed", &observed.display().to_string(), "-o", "json"].map(String::from));
    let cli = Cli::try_parse_from(argv).expect("arguments");
    let (json, warnings) = render_with_warnings(&cli.render).expect("rendered");
    assert!(
        !warnings.iter().any(|w| w.contains("InvalidCertificateRef")),
        "{warnings:#?}"
    );
    let list: Value = serde_json::from_str(&json).expect("JSON List");
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let copy = find(&items, "Secret", "tailnet-gateway-web-tls").expect("copy");
    assert_eq!(copy["data"]["infra.web-cert.key"], "");
}

#[test]
fn render_gateway_invalid_parameters_are_named_and_render_nothing_of_the_gateway() {
    let (secret, _) = certificate_secret();
    let refused = GATEWAY.replace(
        "allowFrom: [\"group:team-a\"]",
        "allowFrom: [\"group:team-a\", \"group:other\"]",
    );
    let dir = inputs(&[
        ("10-tailnet.yaml", TAILNET),
        ("20-gateway.yaml", &refused),
        ("22-secret.yaml", &secret),
    ]);
    let (text, warnings) = run(dir.path(), &["-o", "yaml"]).expect("rendered");
    assert!(
        warnings.iter().any(|w| w.contains("GatewayClass tailnet")
            && w.contains("InvalidParameters")
            && w.contains("TailnetGatewayParameters tailnet-system/tailnet")
            && w.contains("spec.allowFrom[1]")),
        "{warnings:#?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("Gateway infra/web") && w.contains("Accepted=False")),
        "{warnings:#?}"
    );
    let items = yaml_items(&text);
    assert!(find(&items, "Deployment", "tailnet-gateway-web").is_none());
    assert!(!text.contains("tno-gw-infra-web"), "no tag, no grant");
}

#[test]
fn render_gateway_output_dir_writes_the_redacted_copy() {
    let (secret, key) = certificate_secret();
    let dir = inputs(&[
        ("10-tailnet.yaml", TAILNET),
        ("20-gateway.yaml", GATEWAY),
        ("21-grant.yaml", GRANT),
        ("22-secret.yaml", &secret),
    ]);
    let out = tempfile::tempdir().expect("out dir");
    let mut argv: Vec<String> = vec!["render".into(), dir.path().display().to_string()];
    argv.extend(["--output-dir", &out.path().display().to_string()].map(String::from));
    let cli = Cli::try_parse_from(argv).expect("arguments");
    super::super::render::run(&cli.render).expect("written");
    let mut names: Vec<String> = std::fs::read_dir(out.path())
        .expect("listing")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    assert!(
        names
            .iter()
            .any(|n| n.ends_with("-secret-infra-tailnet-gateway-web-tls.yaml")),
        "{names:?}"
    );
    let key_line = key.lines().nth(1).unwrap_or_default().to_string();
    for name in names {
        let text = std::fs::read_to_string(out.path().join(&name)).expect("file");
        assert!(!text.contains(&key_line), "{name} holds key material");
    }
}

#[test]
fn render_gateway_conflicts_and_routes_not_accepted_are_named() {
    let (secret, _) = certificate_secret();
    // A second HTTPS listener with the same port and hostname (Conflicted), a TCPRoute from a
    // namespace the TCP listener does not admit (Same), a listener admitting routes of
    // namespaces labelled team=a (the label from the Namespace manifest).
    let gateway = GATEWAY
        .replace(
            "    - {name: db, port: 5432, protocol: TCP}",
            "    - {name: db, port: 5432, protocol: TCP}\n    - {name: again, port: 443, protocol: HTTPS, hostname: app.example.net,\n       tls: {certificateRefs: [{name: web-cert}]}}\n    - {name: plain, port: 80, protocol: HTTP,\n       allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {team: a}}}}}",
        )
        .replace(
            "metadata: {name: pg, namespace: infra}",
            "metadata: {name: pg, namespace: team-a}",
        )
        .replace(
            "parentRefs: [{name: web, sectionName: db}]",
            "parentRefs: [{name: web, namespace: infra, sectionName: db}]",
        );
    let extra = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team-a, labels: {team: a}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: plain, namespace: team-a}
spec:
  parentRefs: [{name: web, namespace: infra, sectionName: plain}]
  rules: [{backendRefs: [{name: frontend, port: 8080}]}]
"#;
    let dir = inputs(&[
        ("10-tailnet.yaml", TAILNET),
        ("20-gateway.yaml", &gateway),
        ("21-grant.yaml", GRANT),
        ("22-secret.yaml", &secret),
        ("23-extra.yaml", extra),
    ]);
    let (text, warnings) = run(dir.path(), &["-o", "yaml"]).expect("rendered");
    let has = |parts: &[&str]| warnings.iter().any(|w| parts.iter().all(|p| w.contains(p)));
    assert!(
        has(&["spec.listeners[3] (again)", "Conflicted=True"]),
        "{warnings:#?}"
    );
    assert!(
        has(&[
            "TCPRoute team-a/pg: spec.parentRefs[0] (parent Gateway infra/web)",
            "Accepted=False",
        ]),
        "{warnings:#?}"
    );
    // The Namespace's label admits the route on the Selector listener.
    assert!(!has(&["HTTPRoute team-a/plain"]), "{warnings:#?}");
    let config = agent_config(&yaml_items(&text));
    assert!(config.contains("\"port\": 80"), "{config}");
}

#[test]
fn render_gateway_malformed_manifest_names_file_object_and_field() {
    let broken = GATEWAY.replace(
        "- {name: db, port: 5432, protocol: TCP}",
        "- {name: db, port: many, protocol: TCP}",
    );
    let dir = inputs(&[("10-tailnet.yaml", TAILNET), ("20-gateway.yaml", &broken)]);
    let error = run(dir.path(), &[]).expect_err("refused");
    assert_eq!(
        error.exit_code(),
        super::super::render_output::exit::INVALID
    );
    let message = error.to_string();
    assert!(
        message.contains("20-gateway.yaml")
            && message.contains("Gateway infra/web")
            && message.contains("spec.listeners[2].port"),
        "{message}"
    );
}
