//! `tailnet-operator render` end to end on the files in `examples/`: output is exactly the
//! reviewed golden file (rewritten with `UPDATE_GOLDEN=1`, never when `CI` is set),
//! deterministic, and bad input fails naming file, object and field.

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
    let update = update_requested(std::env::var_os("UPDATE_GOLDEN"), std::env::var_os("CI"))
        .unwrap_or_else(|refused| panic!("{refused}"));
    if update {
        std::fs::write(&golden_path, &policy).expect("write golden");
    }
    let golden = std::fs::read_to_string(&golden_path).expect("golden file");
    assert_eq!(
        policy, golden,
        "rendered policy differs from tests/golden/examples-policy.hujson (UPDATE_GOLDEN=1 after review)"
    );
}

/// Whether the golden file may be rewritten: only when `UPDATE_GOLDEN` is set and `CI` is not. Under CI
/// a golden file that rewrites itself would let any output pass, so the variable is refused there.
fn update_requested(
    update: Option<std::ffi::OsString>,
    ci: Option<std::ffi::OsString>,
) -> Result<bool, String> {
    match (update, ci) {
        (Some(_), Some(ci)) => Err(format!(
            "UPDATE_GOLDEN is set while CI is set (CI={}): the golden file is never rewritten in CI; unset UPDATE_GOLDEN",
            ci.to_string_lossy()
        )),
        (update, None) => Ok(update.is_some()),
        (None, Some(_)) => Ok(false),
    }
}

#[test]
fn golden_updates_are_refused_under_ci() {
    let set = || Some(std::ffi::OsString::from("1"));
    assert_eq!(update_requested(None, None), Ok(false));
    assert_eq!(update_requested(set(), None), Ok(true));
    assert_eq!(update_requested(None, Some("true".into())), Ok(false));
    let refused = update_requested(set(), Some("true".into())).expect_err("refused under CI");
    assert!(
        refused.contains("UPDATE_GOLDEN") && refused.contains("CI"),
        "{refused}"
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
        // Tailnet clients' record (extra records); the cluster's hosts has none (split horizon).
        "\"value\": \"100.64.0.7\"",
        "--state=kube:tailnet-egress-team-a-state",
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
    assert!(
        !first.contains("100.64.0.7 portal.team-a.lab.example.net"),
        "a tailnet address in the cluster's records"
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
    // Agents of the egresses team-a and devices and of the ingress portal; the egress targets'
    // Services and the portal's in-cluster Service (it lists team-a in spec.inCluster).
    assert_eq!(kinds.iter().filter(|k| *k == "Deployment").count(), 3);
    assert_eq!(kinds.iter().filter(|k| *k == "Service").count(), 6);
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

/// Runs the real binary: exit code, stdout, stderr. `stdin` is piped when given; `env` is
/// added to a cleared environment (render must not depend on it).
fn run_cli(
    args: &[&str],
    stdin: Option<&str>,
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    use std::io::Write;
    let mut command = Command::new(env!("CARGO_BIN_EXE_tailnet-operator"));
    command
        .args(args)
        .current_dir(root())
        .env_clear()
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("run tailnet-operator");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write stdin");
    }
    let output = child.wait_with_output().expect("wait");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The documented exit codes (docs/cli.md), each from the real binary.
#[test]
fn exit_codes_are_documented_and_distinct() {
    let dir = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(root().join("examples")).expect("examples") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::copy(&path, dir.path().join(path.file_name().expect("name"))).expect("copy");
        }
    }
    let issues = dir.path().join("issues");
    std::fs::create_dir(&issues).expect("mkdir");
    for entry in std::fs::read_dir(dir.path()).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            let text = std::fs::read_to_string(&path).expect("read");
            let text = text.replace(
                "allowFrom: [\"group:team-a\"]",
                "allowFrom: [\"group:team-a\", \"group:everyone\"]",
            );
            std::fs::write(issues.join(path.file_name().expect("name")), text).expect("write");
        }
    }
    let invalid = dir.path().join("invalid.yaml");
    std::fs::write(
        &invalid,
        "apiVersion: tailnet-operator.dev/v1alpha1\nkind: TailnetEgress\nmetadata: {name: x}\nspec: {tailnetRef: {name: demo}, consumerNamespaces: [a], targets: [{name: db, address: 192.0.2.1, port: 70000}]}\n",
    )
    .expect("write");
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, "").expect("write");
    let issues = issues.to_str().expect("utf-8");
    let invalid = invalid.to_str().expect("utf-8");
    let out_file = format!("{}/sub", not_a_dir.display());
    let table: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["render", "examples/", "--observed", OBSERVED], 0, ""),
        (vec!["render", "--help"], 0, "Exit codes: 0 rendered"),
        (
            vec!["render", "examples/", "--no-such-flag"],
            2,
            "unexpected argument",
        ),
        (
            vec!["render", "examples/", "-o", "xml"],
            2,
            "invalid value 'xml'",
        ),
        (vec!["render"], 2, "required"),
        (vec!["render", "does-not-exist/"], 1, "does-not-exist"),
        (
            vec!["render", "examples/", "--observed", "no-such-file.json"],
            1,
            "no-such-file.json",
        ),
        (
            vec![
                "render",
                "examples/",
                "--observed",
                OBSERVED,
                "--output-dir",
                &out_file,
            ],
            1,
            "writing",
        ),
        (
            vec!["render", "examples/", invalid, "--observed", OBSERVED],
            3,
            "spec.targets[db].port: port 70000 is out of range",
        ),
        (
            vec!["render", "examples/"],
            3,
            "does not exist among the inputs",
        ),
        (
            vec![
                "render",
                "examples/",
                "--observed",
                OBSERVED,
                "--tailnet",
                "nope",
            ],
            3,
            "--tailnet nope",
        ),
        (
            vec!["render", issues, "--observed", OBSERVED],
            4,
            "policy issues (use --allow-issues to print anyway)",
        ),
        (
            vec![
                "render",
                issues,
                "--observed",
                OBSERVED,
                "--allow-issues",
                "-o",
                "json",
            ],
            0,
            "policy issue: Tailnet demo",
        ),
    ];
    for (args, code, stderr_has) in table {
        let (got, _, stderr) = run_cli(&args, None, &[]);
        assert_eq!(got, Some(code), "{args:?}: {stderr}");
        let all = format!("{stderr}{}", run_cli(&args, None, &[]).1);
        assert!(
            all.contains(stderr_has),
            "{args:?}: {stderr_has:?} not in {all}"
        );
    }
}

/// `-o yaml` and `-o json` are one parseable stream each: a v1 List of the Kubernetes
/// objects plus the policy and the DNS as ConfigMap-shaped data, every item annotated with
/// its Tailnet; the policy data is exactly `--only policy`.
#[test]
fn yaml_and_json_output_parse_as_one_list() {
    let (code, yaml, stderr) = run_cli(
        &["render", "-o", "yaml", "examples/", "--observed", OBSERVED],
        None,
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let list: serde_json::Value = serde_yaml::from_str(&yaml).expect("one YAML document");
    let (code, json, _) = run_cli(
        &["render", "-o", "json", "examples/", "--observed", OBSERVED],
        None,
        &[],
    );
    assert_eq!(code, Some(0));
    let from_json: serde_json::Value = serde_json::from_str(&json).expect("one JSON document");
    assert_eq!(list, from_json, "YAML and JSON carry the same List");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().expect("items");
    for item in items {
        let annotations = &item["metadata"]["annotations"];
        assert_eq!(
            annotations["render.tailnet-operator.dev/tailnet"], "demo",
            "{item}"
        );
    }
    let part = |p: &str| -> Vec<&serde_json::Value> {
        items
            .iter()
            .filter(|i| i["metadata"]["annotations"]["render.tailnet-operator.dev/part"] == p)
            .collect()
    };
    let policy = part("policy");
    assert_eq!(policy.len(), 1);
    assert_eq!(policy[0]["kind"], "ConfigMap");
    assert_eq!(policy[0]["metadata"]["name"], "demo-rendered-policy");
    let (_, only_policy, _) = run_cli(
        &[
            "render",
            "examples/",
            "--observed",
            OBSERVED,
            "--only",
            "policy",
            "-o",
            "yaml",
        ],
        None,
        &[],
    );
    assert_eq!(policy[0]["data"]["policy.hujson"], only_policy.as_str());
    assert!(only_policy.starts_with("// tailnet-operator-installation: "));
    let dns = part("dns");
    assert_eq!(dns.len(), 1);
    assert!(
        dns[0]["data"]["hosts"]
            .as_str()
            .expect("hosts")
            .contains("10.96.0.20 api.site.example.net")
    );
    let kinds: Vec<&str> = part("object")
        .iter()
        .map(|o| o["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(kinds.iter().filter(|k| **k == "Deployment").count(), 3);
    assert!(kinds.contains(&"Certificate"));
    assert_eq!(items.len(), 2 + kinds.len());
}

/// `-` reads standard input; `--output-dir` writes one file per object.
#[test]
fn stdin_and_output_dir() {
    let mut stream = String::new();
    let mut files: Vec<_> = std::fs::read_dir(root().join("examples"))
        .expect("examples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for path in files {
        stream.push_str("---\n");
        stream.push_str(&std::fs::read_to_string(path).expect("read"));
    }
    let args = ["render", "-o", "yaml", "--observed", OBSERVED];
    let (code, from_stdin, stderr) = run_cli(&[&args[..], &["-"]].concat(), Some(&stream), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let (_, from_dir, _) = run_cli(&[&args[..], &["examples/"]].concat(), None, &[]);
    assert_eq!(from_stdin, from_dir);

    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let (code, stdout, stderr) = run_cli(
        &[
            &args[..],
            &["examples/", "--output-dir", out.to_str().expect("utf-8")],
        ]
        .concat(),
        None,
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.is_empty());
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let list: serde_json::Value = serde_yaml::from_str(&from_dir).expect("list");
    let items = list["items"].as_array().expect("items");
    assert_eq!(names.len(), items.len() + 1, "{names:?}");
    assert!(names.contains(&"demo.policy.hujson".to_string()));
    assert!(names.contains(&"01-configmap-tailnet-system-demo-rendered-policy.yaml".to_string()));
    for (name, item) in names.iter().filter(|n| n.ends_with(".yaml")).zip(items) {
        let text = std::fs::read_to_string(out.join(name)).expect("read");
        let value: serde_json::Value = serde_yaml::from_str(&text).expect("one object");
        assert_eq!(&value, item, "{name}");
    }
}

/// What render cannot know offline is named: on stderr, as comments in text mode (also with
/// `--only dns`), in an annotation and in the policy object's data with `-o yaml`.
#[test]
fn names_unknown_offline_are_pending_not_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The backends, but no ClusterIPs and no Headscale nodes.
    let backends = dir.path().join("backends.yaml");
    std::fs::write(
        &backends,
        "apiVersion: v1\nkind: Service\nmetadata: {name: frontend, namespace: team-a}\nspec: {ports: [{name: http, port: 8080}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: admin, namespace: team-a}\nspec: {ports: [{port: 8443}]}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: backend-ca, namespace: team-a}\ndata: {ca.crt: placeholder}\n",
    )
    .expect("write");
    let backends = backends.to_str().expect("utf-8");
    let (code, dns, stderr) = run_cli(
        &["render", "examples/", backends, "--only", "dns"],
        None,
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    for expected in [
        "DNS name api.site.example.net (TailnetEgress/tailnet-system/team-a) is pending, not rendered: Service tailnet-system/remote-api has no ClusterIP yet",
        "DNS name portal.team-a.lab.example.net (TailnetIngress/team-a/portal) is pending",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }
    assert!(
        dns.contains("# pending (not in data above): api.site.example.net (TailnetEgress/tailnet-system/team-a): Service tailnet-system/remote-api has no ClusterIP yet"),
        "{dns}"
    );
    let _: serde_json::Value = serde_yaml::from_str(&dns).expect("still one YAML document");
    let (_, yaml, _) = run_cli(&["render", "examples/", backends, "-o", "yaml"], None, &[]);
    let list: serde_json::Value = serde_yaml::from_str(&yaml).expect("list");
    let items = list["items"].as_array().expect("items");
    let dns_cm = items
        .iter()
        .find(|i| i["metadata"]["annotations"]["render.tailnet-operator.dev/part"] == "dns")
        .expect("dns");
    let pending = dns_cm["metadata"]["annotations"]["render.tailnet-operator.dev/pending"]
        .as_str()
        .expect("pending annotation");
    assert!(pending.contains("api.site.example.net (TailnetEgress/tailnet-system/team-a)"));
    assert_eq!(items[0]["data"]["pending"].as_str(), Some(pending));
}

/// render reads no environment variables: the operator's (old and new names) change nothing;
/// the installation id comes from the flag and is written as the operator writes it.
#[test]
fn render_reads_no_environment_and_marks_like_the_operator() {
    let args = [
        "render",
        "examples/",
        "--observed",
        OBSERVED,
        "--only",
        "policy",
    ];
    let (_, plain, stderr) = run_cli(&args, None, &[]);
    assert!(
        stderr.contains("--installation-id not given")
            && stderr.contains("kubectl get ns kube-system -o jsonpath='{.metadata.uid}'"),
        "{stderr}"
    );
    let mut with_env = Vec::new();
    for (old, value) in [
        ("OPERATOR_NAMESPACE", "elsewhere"),
        ("INSTALLATION_ID", "from-env"),
        ("ROUTE_APPROVAL", "false"),
        ("CLUSTER_DOMAIN", "example.internal"),
    ] {
        with_env.push((old.to_string(), value));
        with_env.push((format!("TAILNET_OPERATOR_{old}"), value));
    }
    let env: Vec<(&str, &str)> = with_env.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let (_, changed, _) = run_cli(&args, None, &env);
    assert_eq!(plain, changed, "render must not read environment variables");
    let uid = "6f1c2a3b-0000-4000-8000-000000000001";
    let (code, policy, stderr) = run_cli(
        &[&args[..], &["--installation-id", uid]].concat(),
        None,
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        policy.lines().next(),
        Some(format!("// tailnet-operator-installation: {uid}/demo").as_str())
    );
    assert!(!stderr.contains("--installation-id not given"));
}

#[test]
fn help_has_examples_for_render_and_run() {
    for (sub, expected) in [
        ("render", "tailnet-operator render -o yaml"),
        ("run", "TAILNET_OPERATOR_OPERATOR_NAMESPACE"),
    ] {
        let (code, help, _) = run_cli(&[sub, "--help"], None, &[]);
        assert_eq!(code, Some(0));
        assert!(
            help.contains("Examples:") && help.contains(expected),
            "{help}"
        );
    }
}

#[test]
fn second_cluster_examples_render_a_fragment_and_patch_the_owner_validly() {
    // The contributor's manifests give the fragment the lab's second cluster publishes.
    let (ok, fragment, stderr) = render(&[
        "examples/second-cluster/10-tailnet.yaml",
        "examples/second-cluster/20-egress.yaml",
        "--fragment",
    ]);
    assert!(ok, "{stderr}");
    let fragment: serde_json::Value = serde_json::from_str(&fragment).expect("fragment JSON");
    assert_eq!(fragment["tagPrefix"], "cob", "{fragment}");
    assert!(
        fragment["tags"]
            .as_array()
            .is_some_and(|tags| tags.iter().any(|t| t == "tag:cob-egress-site")),
        "{fragment}"
    );
    assert!(fragment.to_string().contains("192.0.2.10"), "{fragment}");
    // The owner's merge patch applied to examples/10-tailnet.yaml still renders with the
    // other examples (schema-valid contributors entry).
    let patch: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("examples/second-cluster/owner-contributors.yaml"))
            .expect("patch"),
    )
    .expect("patch YAML");
    let (ok, stderr) = render_edited("10-tailnet.yaml", |text| {
        let mut owner: serde_json::Value = serde_yaml::from_str(text).expect("owner YAML");
        owner["spec"]["policy"]["contributors"] = patch["spec"]["policy"]["contributors"].clone();
        serde_yaml::to_string(&owner).expect("owner YAML")
    });
    assert!(ok, "{stderr}");
}

/// A Service of the tailnet `loadBalancerClass` renders like an ingress (issue 29): its agent,
/// a grant to its `svc` tag on its TCP ports, its name in the DNS ConfigMap, and a note for
/// its UDP port; a Service of another class renders nothing.
#[test]
fn services_of_the_tailnet_class_render_like_ingresses() {
    let dir = std::env::temp_dir().join(format!("tno-render-service-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("service.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: team-a
  annotations:
    tailnet-operator.dev/allow-from: "group:team-a"
    tailnet-operator.dev/dns-label: shop
spec:
  type: LoadBalancer
  loadBalancerClass: tailnet-operator.dev/tailnet
  selector: {app: web}
  ports:
    - {name: http, port: 80, targetPort: 8080}
    - {name: dns, port: 53, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata:
  name: elsewhere
  namespace: team-a
spec:
  type: LoadBalancer
  loadBalancerClass: other
  ports: [{port: 80}]
"#,
    )
    .expect("write service");
    let path = file.to_str().expect("UTF-8");
    let (ok, out, stderr) = render(&["examples/", path, "--observed", OBSERVED]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(ok, "{stderr}");
    for expected in [
        "name: tailnet-service-web",
        "tag:tno-svc-team-a-web",
        "// Service team-a/web",
        "\"tcp:80\"",
        "shop.team-a.lab.example.net",
        "dns (53/UDP) not served",
    ] {
        assert!(
            out.contains(expected) || stderr.contains(expected),
            "{expected} missing from the output:\n{out}\n{stderr}"
        );
    }
    assert!(
        !out.contains("tailnet-service-elsewhere"),
        "a Service of another class is not rendered"
    );
}
