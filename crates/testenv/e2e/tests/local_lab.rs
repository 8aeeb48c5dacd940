//! The README's first command, as CI runs it: `tno-lab --once` (what `scripts/lab.sh --once`
//! execs) starts the whole lab on its own, runs the operator, applies `examples/` in Apply
//! mode, sends one egress connection and one HTTPS ingress request through the tailnet,
//! prints `kubectl get tailnet,tailnetegress,tailnetingress -A` and stops. Exit code and output
//! are checked.

use std::process::Command;

#[test]
fn the_local_lab_demo_runs_once() {
    if tno_testenv_kube::binaries::Binaries::discover().is_err()
        && std::env::var_os("TNO_REQUIRE_REAL_ENV").is_none()
    {
        eprintln!("skipped: deps/build.sh binaries missing (set TNO_REQUIRE_REAL_ENV=1 to fail)");
        return;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_tno-lab"))
        .arg("--once")
        .output()
        .expect("tno-lab runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    assert!(
        output.status.success(),
        "tno-lab --once failed ({}):\n{stdout}\n--- stderr ---\n{stderr}",
        output.status
    );
    for expected in [
        "demo: OK — egress",
        "demo: OK — ingress",
        "demo: OK — lockdown refused: the live policy is unchanged",
        "WouldLockDown",
        "HTTP/1.1 200",
        "tailnetegress.tailnet-operator.dev/team-a",
        "tailnetingress.tailnet-operator.dev/portal",
        "demo: success",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in the lab output:\n{stdout}\n--- stderr ---\n{stderr}"
        );
    }
}
