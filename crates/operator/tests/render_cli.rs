//! `tailnet-operator render` end to end on the files in `examples/`: output is exactly the
//! reviewed golden file, deterministic, and bad input fails naming file, object and field.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn render(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tailnet-operator"))
        .arg("render")
        .args(args)
        .current_dir(root())
        .output()
        .expect("run tailnet-operator");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const OBSERVED: &str = "examples/observed/headscale-state.json";

#[test]
fn examples_render_the_reviewed_policy() {
    let (ok, policy, stderr) = render(&["examples/", "--observed", OBSERVED, "--only", "policy"]);
    assert!(ok, "{stderr}");
    let golden_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/examples-policy.hujson");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden_path, &policy).expect("write golden");
    }
    let golden = std::fs::read_to_string(&golden_path).expect("golden file");
    assert_eq!(
        policy, golden,
        "rendered policy differs from tests/golden/examples-policy.hujson (UPDATE_GOLDEN=1 after review)"
    );
}

#[test]
fn output_is_deterministic_and_complete() {
    let (ok, first, stderr) = render(&["examples/", "--observed", OBSERVED]);
    assert!(ok, "{stderr}");
    let (_, second, _) = render(&["examples/", "--observed", OBSERVED]);
    assert_eq!(first, second);
    for expected in [
        "kind: Deployment",
        "name: tailnet-egress-team-a",
        "name: tailnet-ingress-portal",
        "name: remote-db",
        "name: remote-api",
        "kind: NetworkPolicy",
        "kind: Certificate",
        "10.96.0.20 api.site.example.net",
        "100.64.0.7 portal.team-a.lab.example.net",
        "TS_KUBE_SECRET",
        "net.ipv4.ip_unprivileged_port_start",
    ] {
        assert!(
            first.contains(expected),
            "missing {expected:?} in render output"
        );
    }
    assert!(
        !first.contains("TS_SOCKS5_SERVER"),
        "agents must not run a SOCKS5 proxy"
    );
}

#[test]
fn objects_are_valid_yaml_documents() {
    let (ok, objects, stderr) = render(&["examples/", "--observed", OBSERVED, "--only", "objects"]);
    assert!(ok, "{stderr}");
    let kinds: Vec<String> = objects
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| {
            let value: serde_json::Value = serde_yaml::from_str(d).expect("valid YAML document");
            value["kind"].as_str().expect("kind").to_string()
        })
        .collect();
    assert_eq!(kinds.iter().filter(|k| *k == "Deployment").count(), 2);
    assert_eq!(kinds.iter().filter(|k| *k == "Service").count(), 2);
}

/// Copies `examples/` into a temp dir, applies `edit` to one file, renders it with the
/// examples' observed state.
fn render_edited(file: &str, edit: impl Fn(&str) -> String) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(root().join("examples")).expect("examples") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            let name = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&path).expect("read");
            let text = if name == file { edit(&text) } else { text };
            std::fs::write(dir.path().join(&name), text).expect("write");
        }
    }
    let (ok, _, stderr) = render(&[
        dir.path().to_str().expect("utf-8 path"),
        "--observed",
        OBSERVED,
    ]);
    (
        ok,
        stderr.replace(&dir.path().display().to_string(), "<dir>"),
    )
}

#[test]
fn bad_inputs_fail_naming_file_object_and_field() {
    let cases: Vec<(&str, &str, &str, &str)> = vec![
        (
            "20-egress.yaml",
            "port: 5432",
            "port: 70000",
            "<dir>/20-egress.yaml (document 1, TailnetEgress tailnet-system/team-a): spec.targets[remote-db].port: port 70000 is out of range; use 1-65535",
        ),
        (
            "20-egress.yaml",
            "address: 192.0.2.10",
            "address: 192.0.2.300",
            "<dir>/20-egress.yaml (document 1, TailnetEgress tailnet-system/team-a): spec.targets[remote-db].address: \"192.0.2.300\" is neither an IPv4/IPv6 address nor a lowercase DNS name",
        ),
        (
            "20-egress.yaml",
            "namespace: tailnet-system",
            "namespace: team-a",
            "<dir>/20-egress.yaml (document 1, TailnetEgress team-a/team-a): metadata.namespace: TailnetEgress is only honoured in the operator namespace \"tailnet-system\"",
        ),
        (
            "20-egress.yaml",
            "port: 5432",
            "port: fast",
            "<dir>/20-egress.yaml (document 1, TailnetEgress tailnet-system/team-a): spec.targets[0].port: invalid type: string \"fast\", expected i32",
        ),
        (
            "30-ingress.yaml",
            "tailnet-operator.dev/v1alpha1",
            "tailnet-operator.dev/v1",
            "<dir>/30-ingress.yaml (document 1, TailnetIngress team-a/portal): apiVersion: \"tailnet-operator.dev/v1\" is not served",
        ),
        (
            "30-ingress.yaml",
            "        port: 8080",
            "        port: 8080\n        namespace: other",
            "<dir>/30-ingress.yaml (document 1, TailnetIngress team-a/portal): spec.exposes[web].backend.namespace: a backend in another namespace (\"other\") is only allowed for TailnetIngress objects in the operator namespace",
        ),
        (
            "30-ingress.yaml",
            "allowFrom: [\"group:team-a\"]",
            "allowFrom: [\"group:team-a\", \"group:everyone\"]",
            "TailnetIngress team-a/portal: allowFrom entries [\"group:everyone\"] are not in the Tailnet's policy.ingressSourceAllowlist",
        ),
        (
            "10-tailnet.yaml",
            "\"{name}.lab.example.net\"",
            "\"{name}.{cluster}.example.net\"",
            "spec.dns.ingressAliasTemplate: unknown placeholder {cluster}",
        ),
        (
            "11-base-policy.yaml",
            "\"ci-runner\": \"100.64.0.50\",",
            "\"ci-runner\": \"100.64.0.50\" \"x\",",
            "<dir>/11-base-policy.yaml (document 1, ConfigMap tailnet-system/tailnet-policy): data.policy.hujson: the base policy is not valid HuJSON at line 9, column",
        ),
        (
            "30-ingress.yaml",
            "        port: 8080",
            "        port: 8081",
            "<dir>/30-ingress.yaml (document 1, TailnetIngress team-a/portal): spec.exposes[web].backend.port: Service team-a/frontend has no port 8081 among the inputs; use a port Service team-a/frontend has, or add the port to the Service in the inputs",
        ),
        (
            "30-ingress.yaml",
            "        port: 8443",
            "        port: https-alt",
            "spec.exposes[admin].backend.port: Service team-a/admin has no port named \"https-alt\" among the inputs",
        ),
        (
            "30-ingress.yaml",
            "key: ca.crt",
            "key: root.pem",
            "spec.exposes[admin].backend.tls.caConfigMapRef: ConfigMap team-a/backend-ca with key \"root.pem\" (backend.tls.caConfigMapRef) does not exist among the inputs; add the ConfigMap manifest to the inputs, or its keys to the --observed file: \"configMaps\": {\"team-a/backend-ca\": [\"root.pem\"]}",
        ),
        (
            "10-tailnet.yaml",
            "name: demo",
            "name: other",
            "spec.tailnetRef.name: Tailnet \"demo\" is not among the inputs",
        ),
    ];
    for (file, from, to, expected) in cases {
        let (ok, stderr) = render_edited(file, |text| {
            assert!(text.contains(from), "fixture {file} lacks {from:?}");
            text.replacen(from, to, 1)
        });
        assert!(!ok, "{file}: {from} -> {to} should fail");
        assert!(
            stderr.contains(expected),
            "{file}: {from} -> {to}\nexpected: {expected}\ngot: {stderr}"
        );
    }
}

#[test]
fn backends_are_resolved_like_the_controller_does() {
    // Without the observed state, the backend Services and the CA ConfigMap are unknown: the
    // same precondition the controller reports as BackendsResolved=False.
    let (ok, _, stderr) = render(&["examples/"]);
    assert!(!ok, "backends without Services must fail");
    for expected in [
        "examples/30-ingress.yaml (document 1, TailnetIngress team-a/portal): spec.exposes[web].backend.service: Service team-a/frontend does not exist among the inputs; add the Service manifest to the inputs, or its ports to the --observed file: \"services\": {\"team-a/frontend\": [{\"port\": 8080}]}",
        "spec.exposes[admin].backend.service: Service team-a/admin does not exist among the inputs",
        "spec.exposes[admin].backend.tls.caConfigMapRef: ConfigMap team-a/backend-ca with key \"ca.crt\" (backend.tls.caConfigMapRef) does not exist among the inputs",
    ] {
        assert!(
            stderr.contains(expected),
            "expected: {expected}\ngot: {stderr}"
        );
    }

    // A Service manifest among the inputs counts like an observed entry.
    let dir = tempfile::tempdir().expect("tempdir");
    let backends = dir.path().join("backends.yaml");
    std::fs::write(
        &backends,
        "apiVersion: v1\nkind: Service\nmetadata: {name: frontend, namespace: team-a}\nspec: {ports: [{name: http, port: 8080}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: admin, namespace: team-a}\nspec: {ports: [{port: 8443}]}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: backend-ca, namespace: team-a}\ndata: {ca.crt: placeholder}\n",
    )
    .expect("write");
    let (ok, with_manifests, stderr) = render(&[
        "examples/",
        backends.to_str().expect("utf-8 path"),
        "--only",
        "objects",
    ]);
    assert!(ok, "{stderr}");
    let (_, with_observed, _) = render(&["examples/", "--observed", OBSERVED, "--only", "objects"]);
    assert_eq!(with_manifests, with_observed);
}

#[test]
fn observed_keys_must_be_namespace_slash_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let observed = dir.path().join("observed.json");
    std::fs::write(&observed, r#"{"services": {"frontend": [{"port": 8080}]}}"#).expect("write");
    let (ok, _, stderr) = render(&["examples/", "--observed", observed.to_str().expect("utf-8")]);
    assert!(!ok);
    assert!(
        stderr.contains(
            "services: key \"frontend\" is not namespace/name; write e.g. \"team-a/frontend\""
        ),
        "{stderr}"
    );
}

#[test]
fn missing_inputs_are_named() {
    let (ok, _, stderr) = render(&["does-not-exist/"]);
    assert!(!ok);
    assert!(stderr.contains("does-not-exist"), "{stderr}");
}
