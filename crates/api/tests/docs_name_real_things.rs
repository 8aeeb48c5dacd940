//! The docs name only things that exist: every command-line flag (`--name` in a code span or
//! block), every environment variable of ours (`TNO_*`, `TAILNET_OPERATOR_*`, `TAILNET_AGENT_*`)
//! and every chart value (`agent.image`, `--set tailnet.policy.mode=Apply`) named in
//! `README.md` and `docs/` is defined by the code, the scripts or the chart's `values.yaml`;
//! every metric named there, in the chart's alert rules or in its Grafana dashboard is one the binaries export, and
//! `docs/observability.md` lists every one they export.
//! Flags of third-party tools the docs show (kubectl, headscale, tailscale, cargo) are listed
//! below with their tool. Not checked: `docs/benchmarks-history.md` (a dated notebook) and
//! `docs/reference/crds.md` (generated from the types).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Files under `dir` (recursively) whose name ends with one of `extensions`.
fn files(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                files(&path, extensions, out);
            }
        } else if extensions.iter().any(|e| name.ends_with(e)) {
            out.push(path);
        }
    }
}

/// `(relative path, text)` of the checked documentation.
fn documentation() -> Vec<(String, String)> {
    let mut paths = vec![repo().join("README.md")];
    files(&repo().join("docs"), &[".md"], &mut paths);
    paths
        .into_iter()
        .filter(|p| !p.ends_with("benchmarks-history.md") && !p.ends_with("reference/crds.md"))
        .map(|p| {
            let relative = p.strip_prefix(repo()).unwrap_or(&p).display().to_string();
            (relative, read(&p))
        })
        .collect()
}

/// Everything that defines names: our Rust sources, scripts, the chart, the workflows.
fn code() -> String {
    let mut paths = Vec::new();
    for dir in [
        "crates",
        "xtask",
        "scripts",
        "deps",
        "charts",
        ".github/workflows",
    ] {
        files(
            &repo().join(dir),
            &[".rs", ".sh", ".yaml", ".yml", ".tpl", ".env"],
            &mut paths,
        );
    }
    paths.iter().map(|p| read(p)).collect::<Vec<_>>().join("\n")
}

/// The code spans (inline and fenced) of a Markdown text: where commands are written.
fn code_spans(text: &str) -> Vec<&str> {
    let fenced = Regex::new(r"(?s)```.*?```").expect("regex");
    let mut spans: Vec<&str> = fenced.find_iter(text).map(|m| m.as_str()).collect();
    let inline = Regex::new(r"`[^`\n]+`").expect("regex");
    let mut rest = 0;
    for m in fenced.find_iter(text) {
        spans.extend(inline.find_iter(&text[rest..m.start()]).map(|s| s.as_str()));
        rest = m.end();
    }
    spans.extend(inline.find_iter(&text[rest..]).map(|s| s.as_str()));
    spans
}

/// Flags of other programs that the docs show in their commands.
const THIRD_PARTY_FLAGS: &[(&str, &str)] = &[
    ("accept-dns", "tailscale up"),
    ("advertise-tags", "tailscale up"),
    ("as", "kubectl (impersonation)"),
    ("field-selector", "kubectl get"),
    ("for", "kubectl wait --for"),
    ("from-file", "kubectl create configmap/secret"),
    ("from-literal", "kubectl create secret"),
    ("index", "tailscale/headscale CLI listing"),
    ("nocapture", "cargo test -- --nocapture"),
    ("prefix", "headscale apikeys expire"),
    ("profile", "cargo build --profile"),
    ("raw", "kubectl get --raw"),
    ("restart", "headscale/systemd examples"),
    ("rm", "docker/kubectl run --rm"),
    ("routes", "headscale nodes approve-routes"),
    ("server-side", "kubectl apply --server-side"),
    ("tags", "headscale preauthkeys create"),
    ("type", "kubectl create secret --type"),
];

/// `--flag` → the docs naming it.
fn documented_flags(docs: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let flag = Regex::new(r"(?:^|[^\w-])--([a-z][a-z0-9-]*[a-z0-9])").expect("regex");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in docs {
        for span in code_spans(text) {
            for c in flag.captures_iter(span) {
                out.entry(c[1].to_string())
                    .or_default()
                    .insert(path.clone());
            }
        }
    }
    out
}

/// Flags our programs and scripts define: clap's `long = "x"`, `#[arg(long …)] field_name`
/// (→ `--field-name`), and literal `--x` in sources and scripts.
fn defined_flags(code: &str) -> BTreeSet<String> {
    let explicit = Regex::new(r#"long\s*=\s*"([a-z0-9-]+)""#).expect("regex");
    let derived = Regex::new(
        r"#\[arg\(([^\]]*)\)\]\s*(?:(?:///[^\n]*|#\[[^\n]*\])\s*)*(?:pub\s+)?([a-z_][a-z0-9_]*)\s*:",
    )
    .expect("regex");
    let literal = Regex::new(r"--([a-z][a-z0-9-]*)").expect("regex");
    let mut out: BTreeSet<String> = explicit
        .captures_iter(code)
        .map(|c| c[1].to_string())
        .collect();
    out.extend(
        derived
            .captures_iter(code)
            .filter(|c| c[1].contains("long") && !c[1].contains("long ="))
            .map(|c| c[2].replace('_', "-")),
    );
    out.extend(literal.captures_iter(code).map(|c| c[1].to_string()));
    out
}

fn missing_flags(docs: &[(String, String)], code: &str) -> Vec<String> {
    let defined = defined_flags(code);
    documented_flags(docs)
        .into_iter()
        .filter(|(flag, _)| {
            !defined.contains(flag) && !THIRD_PARTY_FLAGS.iter().any(|(f, _)| f == flag)
        })
        .map(|(flag, paths)| {
            format!(
                "--{flag} ({})",
                paths.into_iter().collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}

/// Our environment variables named in the docs that the code does not read or set.
/// `TNO_BIN_<NAME>` is derived (`tno_deps::override_var`): it exists when `<name>` (lowercase,
/// `-` for `_`) is a binary the code names.
fn missing_env(docs: &[(String, String)], code: &str) -> Vec<String> {
    let var = Regex::new(r"\b((?:TNO|TAILNET_OPERATOR|TAILNET_AGENT)_[A-Z0-9_]*[A-Z0-9])\b")
        .expect("regex");
    let mut out = BTreeSet::new();
    for (path, text) in docs {
        for c in var.captures_iter(text) {
            let name = &c[1];
            let derived = name.strip_prefix("TNO_BIN_").is_some_and(|binary| {
                code.contains(&format!("\"{}\"", binary.to_lowercase().replace('_', "-")))
            });
            if !code.contains(name) && !derived {
                out.insert(format!("{name} ({path})"));
            }
        }
    }
    out.into_iter().collect()
}

/// Chart values named in the docs (`` `agent.image` ``, `--set a.b=…`) that `values` lacks.
/// Returns how many names were checked, and the missing ones.
fn missing_values(docs: &[(String, String)], values: &serde_yaml::Value) -> (usize, Vec<String>) {
    let Some(top) = values.as_mapping() else {
        return (0, vec!["values.yaml is not a mapping".into()]);
    };
    let keys: Vec<String> = top
        .keys()
        .filter_map(|k| k.as_str().map(regex::escape))
        .collect();
    let path = format!(r"((?:{})(?:\.[A-Za-z0-9_]+)+)", keys.join("|"));
    let in_span = Regex::new(&format!(r"^`{path}(?:=[^`]*)?`$")).expect("regex");
    let in_set = Regex::new(&format!(r"--set(?:-string)?[ =]{path}=")).expect("regex");
    let file_name = Regex::new(r"\.(rs|md|ya?ml|json|sh|toml|tpl)$").expect("regex");
    let mut out = BTreeSet::new();
    let mut checked = 0;
    for (doc, text) in docs {
        for span in code_spans(text) {
            let named = in_span
                .captures_iter(span)
                .chain(in_set.captures_iter(span))
                .map(|c| c[1].to_string());
            for name in named.filter(|n| !file_name.is_match(n)) {
                checked += 1;
                let mut at = values;
                let found = name.split('.').all(|key| match at.get(key) {
                    Some(next) => {
                        at = next;
                        true
                    }
                    None => false,
                });
                if !found {
                    out.insert(format!("{name} ({doc})"));
                }
            }
        }
    }
    (checked, out.into_iter().collect())
}

fn chart_values() -> serde_yaml::Value {
    let path = repo().join("charts/tailnet-operator/values.yaml");
    serde_yaml::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn documented_flags_exist() {
    let docs = documentation();
    let named = documented_flags(&docs).len();
    assert!(
        named >= 30,
        "only {named} flags found in the docs: is the extraction broken?"
    );
    let missing = missing_flags(&docs, &code());
    assert!(
        missing.is_empty(),
        "flags named in the docs that nothing defines (a typo, a removed flag, or another \
         program's flag: then add it to THIRD_PARTY_FLAGS with its tool): {missing:?}"
    );
}

#[test]
fn documented_environment_variables_exist() {
    let missing = missing_env(&documentation(), &code());
    assert!(
        missing.is_empty(),
        "environment variables named in the docs that no code reads or sets: {missing:?}"
    );
}

#[test]
fn documented_chart_values_exist() {
    let (checked, missing) = missing_values(&documentation(), &chart_values());
    assert!(
        checked >= 10,
        "only {checked} chart values found in the docs: is the extraction broken?"
    );
    assert!(
        missing.is_empty(),
        "chart values named in the docs that charts/tailnet-operator/values.yaml lacks: {missing:?}"
    );
}

/// Metric names the binaries export, read from their sources: each `register("name", "help",
/// field.clone())` with the field's type (a counter's samples end in `_total`), the
/// collectors' `encode_descriptor("name", …)`, and the process metrics of crates/telemetry.
fn exported_metrics() -> BTreeSet<String> {
    let field =
        Regex::new(r"pub (\w+): (?:Family<\w+, )?(Counter|Gauge|Histogram)\b").expect("regex");
    let register = Regex::new(
        r#"register\(\s*"(\w+)",\s*"(?:[^"\\]|\\.)*",\s*(?:metrics\.|self\.)?(\w+)\.clone\(\)"#,
    )
    .expect("regex");
    let descriptor = Regex::new(r#"encode_descriptor\(\s*"(\w+)",(?s:.*?)MetricType::(Counter|Gauge)|encode_descriptor\(\s*"(\w+)""#)
        .expect("regex");
    let process_gauge = Regex::new(r#"gauge\(\s*e,\s*"(process_\w+)""#).expect("regex");
    let mut out = BTreeSet::new();
    let build = read(&repo().join("crates/telemetry/src/build.rs"));
    assert!(
        build.contains(r#""build_info","#),
        "build_info is registered in crates/telemetry"
    );
    for (file, prefix) in [
        ("crates/operator/src/metrics.rs", "tailnet_operator_"),
        ("crates/agent/src/metrics.rs", "tailnet_agent_"),
    ] {
        let text = read(&repo().join(file));
        let types: BTreeMap<&str, &str> = field
            .captures_iter(&text)
            .map(|c| {
                (
                    c.get(1).map_or("", |m| m.as_str()),
                    c.get(2).map_or("", |m| m.as_str()),
                )
            })
            .collect();
        for c in register.captures_iter(&text) {
            let suffix = match types.get(&c[2]) {
                Some(&"Counter") => "_total",
                Some(_) => "",
                None => panic!("{file}: no field {} for metric {}", &c[2], &c[1]),
            };
            out.insert(format!("{prefix}{}{suffix}", &c[1]));
        }
        for c in descriptor.captures_iter(&text) {
            let name = c.get(1).or(c.get(3)).map_or("", |m| m.as_str());
            let suffix = if c.get(2).is_some_and(|t| t.as_str() == "Counter") {
                "_total"
            } else {
                ""
            };
            out.insert(format!("{prefix}{name}{suffix}"));
        }
        out.insert(format!("{prefix}build_info"));
    }
    let process = read(&repo().join("crates/telemetry/src/process.rs"));
    for c in descriptor.captures_iter(&process) {
        let name = c.get(1).or(c.get(3)).map_or("", |m| m.as_str());
        let suffix = if c.get(2).is_some_and(|t| t.as_str() == "Counter") {
            "_total"
        } else {
            ""
        };
        out.insert(format!("{name}{suffix}"));
    }
    out.extend(
        process_gauge
            .captures_iter(&process)
            .map(|c| c[1].to_string()),
    );
    out
}

/// Metric names (ours and the process ones) in a text.
fn metric_names(text: &str) -> BTreeSet<String> {
    let name =
        Regex::new(r"\b(tailnet_(?:operator|agent)_[a-z0-9_]*[a-z0-9]|process_[a-z_]*[a-z])\b")
            .expect("regex");
    name.captures_iter(text).map(|c| c[1].to_string()).collect()
}

/// `name` is exported, or a histogram's `_bucket`/`_sum`/`_count` series of one that is.
fn is_exported(exported: &BTreeSet<String>, name: &str) -> bool {
    exported.contains(name)
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| exported.contains(base) && base.ends_with("_seconds"))
        })
}

#[test]
fn documented_metrics_exist_and_observability_lists_every_one() {
    let exported = exported_metrics();
    assert!(
        exported.len() >= 45
            && exported.contains("tailnet_operator_reconciles_total")
            && exported.contains("tailnet_operator_resource_condition")
            && exported.contains("tailnet_agent_active_connections")
            && exported.contains("process_cpu_seconds_total"),
        "the extraction from the sources looks broken: {exported:?}"
    );
    let mut texts = documentation();
    for file in [
        "charts/tailnet-operator/README.md",
        "charts/tailnet-operator/files/prometheus-rules.yaml",
        "charts/tailnet-operator/files/grafana-dashboard.json",
        "crates/agent/README.md",
    ] {
        texts.push((file.to_string(), read(&repo().join(file))));
    }
    let unknown: Vec<String> = texts
        .iter()
        .flat_map(|(path, text)| {
            metric_names(text)
                .into_iter()
                .filter(|name| !is_exported(&exported, name))
                .map(move |name| format!("{name} ({path})"))
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "metrics named in the docs or the alert rules that the binaries do not export: {unknown:?}"
    );
    let listed = metric_names(&read(&repo().join("docs/observability.md")));
    let unlisted: Vec<&String> = exported.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "metrics the binaries export that docs/observability.md does not list: {unlisted:?}"
    );
}

/// The checks see a planted mistake of each kind (and nothing in correct text).
#[test]
fn the_checks_find_planted_mistakes() {
    let doc = |text: &str| vec![("planted.md".to_string(), text.to_string())];
    let code = r#"#[arg(long, env = "TAILNET_OPERATOR_REAL")]
    headscale_poll_interval: u64,
    #[arg(long = "only")] only: Vec<String>,
    let binary = "tno-test-servers";
    let helm = ["--set"];"#;
    let good = doc(
        "Run `tailnet-operator run --headscale-poll-interval 30s --only x` with \
         `TAILNET_OPERATOR_REAL` and `TNO_BIN_TNO_TEST_SERVERS`; `kubectl apply --server-side`; \
         set `agent.image` or `helm install --set tailnet.policy.mode=Apply`; see `metrics.rs`.",
    );
    assert_eq!(missing_flags(&good, code), Vec::<String>::new());
    assert_eq!(missing_env(&good, code), Vec::<String>::new());
    let values = chart_values();
    assert_eq!(missing_values(&good, &values), (2, Vec::<String>::new()));
    let bad = doc(
        "```sh\ntailnet-operator run --headscale-pol-interval 30s\n```\n\
         `TAILNET_OPERATOR_UNREAL`, `TNO_BIN_NO_SUCH_TOOL`, `agent.imag`, and\n\
         ```sh\nhelm install x --set tailnet.policy.mod=Apply\n```",
    );
    assert_eq!(
        missing_flags(&bad, code),
        vec!["--headscale-pol-interval (planted.md)".to_string()]
    );
    assert_eq!(
        missing_env(&bad, code),
        vec![
            "TAILNET_OPERATOR_UNREAL (planted.md)".to_string(),
            "TNO_BIN_NO_SUCH_TOOL (planted.md)".to_string()
        ]
    );
    assert_eq!(
        missing_values(&bad, &values).1,
        vec![
            "agent.imag (planted.md)".to_string(),
            "tailnet.policy.mod (planted.md)".to_string()
        ]
    );
}
