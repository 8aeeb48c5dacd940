//! The image-building section of docs/quick-start.md ("3. Images and chart"), run against the
//! lab registry with authentication on: `cargo xtask images --push <registry>/<prefix>
//! --chart` (the xtask binary; prebuilt stand-in binaries via `--binaries` so that no release
//! build runs here) pushes to `crane registry serve` behind the token-flow front of
//! `tno_testenv_kube::registry_auth` (Bearer realm/service/scope, token for Basic
//! credentials only). helm is found on `PATH` (TNO_BIN_HELM unset). Without credentials in the
//! Docker config the push is refused and nothing reaches the registry; with a wrong password it
//! is refused; with the right `auths` entry the images and the chart arrive and can be read back
//! from the registry. The password never appears in the output.
//!
//! crane or helm missing: skips unless TNO_REQUIRE_REAL_ENV=1.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64_free::encode;
use tno_testenv_kube::oci_registry::LabRegistry;
use tno_testenv_kube::registry_auth::AuthFront;

const USER: &str = "ci-robot";
const PASSWORD: &str = "s3cret:with-colon";

/// Base64 without a dependency (the test's own, so it cannot share a bug with tno-oci's).
mod base64_free {
    pub fn encode(input: &[u8]) -> String {
        const TABLE: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in input.chunks(3) {
            let b = [
                chunk[0],
                chunk.get(1).copied().unwrap_or(0),
                chunk.get(2).copied().unwrap_or(0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(TABLE[((n >> (18 - 6 * i)) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }
}

fn skip_or_panic(what: &str) {
    assert!(
        std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
        "{what}"
    );
    eprintln!("SKIP: {what}");
}

/// `<dir>/<rust-target>/{tailnet-operator,tailnet-agent}`: stand-ins for the release binaries.
fn fake_binaries(dir: &Path) -> PathBuf {
    let platform = tno_oci::Platform::host().expect("amd64 or arm64");
    let target = dir.join(platform.rust_target());
    std::fs::create_dir_all(&target).expect("mkdir");
    for name in ["tailnet-operator", "tailnet-agent"] {
        std::fs::write(target.join(name), format!("#!stand-in {name}\n")).expect("write");
    }
    dir.to_path_buf()
}

/// `cargo xtask images --binaries … --out … --push <front>/tno --chart` with `DOCKER_CONFIG`.
fn xtask_push(front: &str, docker_config: &Path, scratch: &Path, helm: &Path) -> Output {
    let out = scratch.join("images");
    let path = std::env::join_paths(
        std::iter::once(helm.parent().expect("helm dir").to_path_buf()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ),
    )
    .expect("PATH");
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["images", "--binaries"])
        .arg(scratch.join("bin"))
        .arg("--out")
        .arg(&out)
        .args(["--push", &format!("{front}/tno"), "--chart"])
        .env("DOCKER_CONFIG", docker_config)
        .env_remove("TNO_BIN_HELM")
        .env("PATH", path)
        .env("HELM_CONFIG_HOME", scratch.join("helm/config"))
        .env("HELM_CACHE_HOME", scratch.join("helm/cache"))
        .env("HELM_DATA_HOME", scratch.join("helm/data"))
        .output()
        .expect("xtask runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!(
        "$ DOCKER_CONFIG={} cargo xtask images --push {front}/tno --chart\n{text}",
        docker_config.display()
    );
    assert!(
        !text.contains(PASSWORD),
        "the password is never printed:\n{text}"
    );
    output
}

fn docker_config(dir: &Path, registry: &str, password: &str) -> PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    let auth = encode(format!("{USER}:{password}").as_bytes());
    std::fs::write(
        dir.join("config.json"),
        format!(r#"{{"auths": {{"{registry}": {{"auth": "{auth}"}}}}}}"#),
    )
    .expect("config");
    dir.to_path_buf()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_push_and_chart_use_the_docker_config_credentials_on_an_authenticated_registry() {
    let (Ok(crane), Ok(helm)) = (
        tno_testenv_kube::binaries::tool("crane", "crane"),
        tno_testenv_kube::binaries::helm(),
    ) else {
        return skip_or_panic("crane or helm missing (deps/build.sh crane helm)");
    };
    let scratch = tempfile::tempdir().expect("tempdir");
    let scratch = scratch.path();
    fake_binaries(&scratch.join("bin"));
    let registry = LabRegistry::start(&crane, &scratch.join("registry"))
        .await
        .expect("registry");
    let front = AuthFront::start(registry.host(), USER, PASSWORD)
        .await
        .expect("front");
    let host = front.host().to_string();

    // No credentials: refused, nothing forwarded.
    let empty = scratch.join("docker-empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let run = {
        let (host, empty, scratch, helm) = (
            host.clone(),
            empty.clone(),
            scratch.to_path_buf(),
            helm.clone(),
        );
        tokio::task::spawn_blocking(move || xtask_push(&host, &empty, &scratch, &helm))
    };
    let output = run.await.expect("xtask");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "pushed without credentials");
    assert!(
        stderr.contains("no credentials for this registry"),
        "{stderr}"
    );
    assert!(front.refused() > 0);
    assert_eq!(front.forwarded(), 0, "nothing reached the registry");

    // A wrong password: the token service refuses it.
    let wrong = docker_config(&scratch.join("docker-wrong"), &host, "not-the-password");
    let run = {
        let (host, scratch, helm) = (host.clone(), scratch.to_path_buf(), helm.clone());
        tokio::task::spawn_blocking(move || xtask_push(&host, &wrong, &scratch, &helm))
    };
    let output = run.await.expect("xtask");
    assert!(!output.status.success(), "pushed with a wrong password");
    assert!(front.token_refusals() > 0);
    assert_eq!(front.forwarded(), 0, "nothing reached the registry");

    // The right credentials: images and chart pushed.
    let good = docker_config(&scratch.join("docker-good"), &host, PASSWORD);
    let run = {
        let (host, scratch, helm) = (host.clone(), scratch.to_path_buf(), helm.clone());
        tokio::task::spawn_blocking(move || xtask_push(&host, &good, &scratch, &helm))
    };
    let output = run.await.expect("xtask");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "push with credentials failed:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        registry.log_tail(20)
    );
    assert!(
        stdout.contains(&format!("{host}: user {USER} from")),
        "{stdout}"
    );
    assert!(
        !scratch
            .join("images/chart/.helm-registry-config.json")
            .exists(),
        "helm's temporary registry config is removed"
    );
    read_back(&registry, scratch, &helm).await;
    assert!(front.forwarded() > 0);
}

/// What was pushed, read from the registry itself (behind the front, no authentication).
async fn read_back(registry: &LabRegistry, scratch: &Path, helm: &Path) {
    let summary: serde_json::Value = serde_json::from_slice(
        &std::fs::read(scratch.join("images/images.json")).expect("images.json"),
    )
    .expect("JSON");
    let platform = tno_oci::Platform::host().expect("platform");
    for name in ["tailnet-operator", "tailnet-agent"] {
        let digest = summary[name]["digest"].as_str().expect("digest");
        let reference = tno_oci::registry::Reference::parse(&format!(
            "{}/tno/{name}@{digest}",
            registry.host()
        ))
        .expect("reference");
        let pulled = tno_oci::registry::Client::new()
            .pull(&reference, platform)
            .await
            .unwrap_or_else(|e| panic!("{name} is in the registry: {e}"));
        assert_eq!(pulled.digest, digest);
    }
    let chart = Command::new(helm)
        .args(["show", "values"])
        .arg(format!(
            "oci://{}/tno/charts/tailnet-operator",
            registry.host()
        ))
        .arg("--plain-http")
        .env("HELM_CONFIG_HOME", scratch.join("helm/config"))
        .env("HELM_CACHE_HOME", scratch.join("helm/cache"))
        .env("HELM_DATA_HOME", scratch.join("helm/data"))
        .output()
        .expect("helm show values");
    let values = String::from_utf8_lossy(&chart.stdout);
    assert!(
        chart.status.success(),
        "the chart is in the registry: {}",
        String::from_utf8_lossy(&chart.stderr)
    );
    let operator_digest = summary["tailnet-operator"]["digest"]
        .as_str()
        .expect("digest");
    assert!(
        values.contains(operator_digest),
        "the pushed chart pins the pushed operator image: {values}"
    );
}
