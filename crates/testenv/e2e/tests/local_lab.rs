//! The README's first command, as CI runs it: `tno-lab --once` (what `scripts/lab.sh --once`
//! execs) starts the whole lab on its own, installs the product with `helm install` from the
//! lab registry (the images CI built with `cargo xtask images`, target/images, instead of the
//! lab profile's target/lab-images that scripts/lab.sh builds: same layout, no second build in
//! CI), applies `examples/` in Apply mode, sends one egress connection and one HTTPS ingress
//! request through the tailnet, uses the ingress name and the egress alias from inside the
//! cluster (a listed namespace answered, an unlisted one refused under kube-router), prints
//! `kubectl get tailnet,tailnetegress,tailnetingress -A`, shows the lockdown guard and stops.
//! Exit code and output are checked.

use std::process::Command;

#[test]
fn the_local_lab_demo_runs_once() {
    if tno_testenv_kube::binaries::Binaries::discover().is_err()
        && std::env::var_os("TNO_REQUIRE_REAL_ENV").is_none()
    {
        eprintln!("skipped: deps/build.sh binaries missing (set TNO_REQUIRE_REAL_ENV=1 to fail)");
        return;
    }
    let images = tno_testenv_kube::binaries::workspace_root().join("target/images");
    if !images.join("tailnet-operator/index.json").is_file() {
        assert!(
            std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
            "{} missing: run `cargo xtask images` first",
            images.display()
        );
        eprintln!("SKIP: {} missing (cargo xtask images)", images.display());
        return;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_tno-lab"))
        .arg("--once")
        .arg("--images")
        .arg(&images)
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
        "install: $ helm install tailnet-operator oci://",
        "STATUS: deployed",
        "demo: operator running as pod tailnet-system/tailnet-operator-",
        "demo: CoreDNS wired as docs/dns.md says",
        "demo: OK — egress",
        "demo: OK — in-cluster: team-a → https://portal.team-a.lab.example.net/",
        "demo: OK — in-cluster: elsewhere (not listed) is refused",
        "demo: OK — egress alias: api.site.example.net",
        "lab phases (tno-lab):",
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
