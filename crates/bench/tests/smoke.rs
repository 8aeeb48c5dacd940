//! CI smoke of the benchmarks (issue 8): the data-plane benchmarks (egress forwarding against
//! socat, HTTPS ingress against nginx and Caddy) and the policy render run once, briefly, with
//! the real agent, socat, nginx, Caddy and wrk, so they do not rot. It checks only that the
//! workloads' bytes and requests arrived (tno-bench fails otherwise) and that every table came
//! out; it never looks at a number. The benchmarks on the full test environment (control
//! plane at scale, through the tailnet) are left out: each needs minutes of environment and
//! agent start-up, beyond the smoke's budget (docs/benchmarks.md).

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The workspace binaries next to this test's own `tno-bench` (same target dir and profile).
fn sibling(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_tno-bench")).with_file_name(name)
}

fn caddy() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TNO_BIN_CADDY") {
        return Some(PathBuf::from(path));
    }
    let output = Command::new("bash")
        .arg(workspace_root().join("deps/build.sh"))
        .arg("--print-env")
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("TNO_BIN_CADDY=").map(PathBuf::from))
}

fn on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn every_benchmark_runs_and_its_bytes_arrive() {
    let agent = sibling("tailnet-agent");
    let caddy = caddy().filter(|c| c.is_file());
    let mut missing: Vec<String> = ["socat", "nginx", "wrk", "curl", "unshare"]
        .into_iter()
        .filter(|p| !on_path(p))
        .map(str::to_owned)
        .collect();
    if !agent.is_file() {
        missing.push(format!(
            "{} (cargo build --workspace --bins)",
            agent.display()
        ));
    }
    if caddy.is_none() {
        missing.push("caddy (deps/build.sh caddy)".into());
    }
    if !missing.is_empty() {
        assert!(
            std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
            "missing for the benchmark smoke: {missing:?}"
        );
        eprintln!("skipping the benchmark smoke; missing: {missing:?}");
        return;
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_tno-bench"));
    command
        .args([
            "run",
            "--smoke",
            "--only",
            "egress,ingress,policy",
            "--agent",
        ])
        .arg(&agent);
    if let Some(caddy) = &caddy {
        command.arg("--caddy").arg(caddy);
    }
    // The same build as its own baseline: the before/after column's code runs too.
    command.arg("--baseline-agent").arg(&agent);
    // And the stack's floor, so its proxy stays a working one.
    command.arg("--hyper-floor");
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("tno-bench: {e}"));
    let tables = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tno-bench --smoke failed ({}):\n{tables}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    for column in ["agent / baseline", "hyper-floor / nginx"] {
        assert!(
            tables.contains(column),
            "no column {column:?} in:\n{tables}"
        );
    }
    for title in [
        "Egress TCP forwarding",
        "Ingress HTTPS",
        "Ingress server memory",
        "Policy render time",
    ] {
        assert!(tables.contains(title), "no table {title:?} in:\n{tables}");
    }
    // All five HTTPS servers answered every request (wrk counts failures).
    assert!(
        tables.contains("agent 0, baseline 0, hyper-floor 0, nginx 0, caddy 0"),
        "wrk saw failed requests:\n{tables}"
    );
}
