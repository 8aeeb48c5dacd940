//! The product as users install it: the images `cargo xtask images` built (OCI layouts under
//! an output directory such as `target/images/`: operator, agent and the agents' tailscaled)
//! are pushed by digest to the lab's OCI registry ([`LabRegistry`]), the chart is packaged and
//! pushed there as an OCI artifact ([`Helm::publish_chart`]), and `helm` runs with its config,
//! cache and data in a directory of the run, keeping a transcript of every command.
//!
//! Used by `tno-lab` (the README's lab installs the chart) and by the install tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tno_testenv_kube::binaries::workspace_root;
use tno_testenv_kube::oci_registry::LabRegistry;

use crate::error::{E2eError, Result};

/// One image in the lab registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedImage {
    /// `<registry host>/<path>`.
    pub repository: String,
    /// `sha256:…` of the image index.
    pub digest: String,
}

/// The three images an install runs: the operator, the agent and the agents' tailscaled.
#[derive(Debug, Clone)]
pub struct ProductImages {
    pub operator: PushedImage,
    pub agent: PushedImage,
    pub tailscale: PushedImage,
}

impl ProductImages {
    /// The chart values that install exactly these images, by digest (`key=value` for
    /// `helm --set`).
    pub fn chart_values(&self) -> Result<Vec<String>> {
        Ok(vec![
            format!("image.repository={}", self.operator.repository),
            format!("image.digest={}", self.operator.digest),
            format!("agent.image.repository={}", self.agent.repository),
            format!("agent.image.digest={}", self.agent.digest),
            format!(
                "agent.tailscaleImage.repository={}",
                self.tailscale.repository
            ),
            format!("agent.tailscaleImage.digest={}", self.tailscale.digest),
        ])
    }
}

fn install_error(message: impl Into<String>) -> E2eError {
    E2eError::Install(message.into())
}

/// Pushes `<images_dir>/{tailnet-operator,tailnet-agent,tailnet-tailscaled}` (OCI layouts as
/// `cargo xtask images` writes them) as `tno/<name>`, by digest.
pub async fn push_product_images(
    registry: &LabRegistry,
    images_dir: &Path,
) -> Result<ProductImages> {
    let client = tno_oci::registry::Client::new();
    let mut pushed = Vec::new();
    for name in ["tailnet-operator", "tailnet-agent", "tailnet-tailscaled"] {
        let dir = images_dir.join(name);
        let layout = tno_oci::layout::Layout::read(&dir).map_err(|e| {
            install_error(format!(
                "{}: {e} (build the images with `cargo xtask images`)",
                dir.display()
            ))
        })?;
        client
            .push_layout(&layout, registry.host(), &format!("tno/{name}"), None)
            .await
            .map_err(|e| install_error(format!("push {name}: {e}\n{}", registry.log_tail(20))))?;
        pushed.push(PushedImage {
            repository: format!("{}/tno/{name}", registry.host()),
            digest: layout.digest().to_string(),
        });
    }
    let mut pushed = pushed.into_iter();
    match (pushed.next(), pushed.next(), pushed.next()) {
        (Some(operator), Some(agent), Some(tailscale)) => Ok(ProductImages {
            operator,
            agent,
            tailscale,
        }),
        _ => Err(install_error("not all three images were pushed")),
    }
}

/// The pinned tailscale version (`TAILSCALE_VERSION` of deps/versions.env).
pub fn tailscale_version() -> Result<String> {
    let path = workspace_root().join("deps/versions.env");
    let text =
        std::fs::read_to_string(&path).map_err(|e| E2eError::io(path.display().to_string(), e))?;
    text.lines()
        .find_map(|line| line.strip_prefix("TAILSCALE_VERSION=").map(str::to_string))
        .ok_or_else(|| install_error(format!("no TAILSCALE_VERSION in {}", path.display())))
}

/// The chart's version (charts/tailnet-operator/Chart.yaml).
pub fn chart_version() -> Result<String> {
    let path = workspace_root().join("charts/tailnet-operator/Chart.yaml");
    let text =
        std::fs::read_to_string(&path).map_err(|e| E2eError::io(path.display().to_string(), e))?;
    text.lines()
        .find_map(|line| line.strip_prefix("version: "))
        .map(|version| version.trim().trim_matches('"').to_string())
        .ok_or_else(|| install_error(format!("no version in {}", path.display())))
}

/// Runs helm with its config, cache and data under `home`, against `kubeconfig`; keeps the
/// transcript of every command (command line, output, exit status, duration).
#[derive(Debug)]
pub struct Helm {
    pub binary: PathBuf,
    pub kubeconfig: PathBuf,
    pub home: PathBuf,
    pub transcript: Vec<String>,
}

impl Helm {
    /// helm from `TNO_BIN_HELM` or the deps cache.
    pub fn new(kubeconfig: &Path, home: &Path) -> Result<Self> {
        let binary = tno_testenv_kube::binaries::helm()?;
        Ok(Self {
            binary,
            kubeconfig: kubeconfig.to_path_buf(),
            home: home.to_path_buf(),
            transcript: Vec::new(),
        })
    }

    /// Runs `helm args…`; returns stdout, or an error with both outputs when helm fails.
    pub fn run(&mut self, args: &[&str]) -> Result<String> {
        let started = Instant::now();
        let output = Command::new(&self.binary)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .output()
            .map_err(|e| E2eError::io(format!("running {}", self.binary.display()), e))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        self.transcript.push(format!(
            "$ helm {}\n{stdout}{stderr}({} after {:.1?})\n",
            args.join(" "),
            output.status,
            started.elapsed()
        ));
        if output.status.success() {
            Ok(stdout)
        } else {
            Err(E2eError::CommandFailed {
                command: format!("helm {}", args.join(" ")),
                status: output.status,
                output: format!("{stdout}{stderr}"),
            })
        }
    }

    /// The last transcript entry (for printing as it happens).
    pub fn last_entry(&self) -> &str {
        self.transcript.last().map_or("", String::as_str)
    }

    /// Packages charts/tailnet-operator into `package_dir` and pushes it to `registry`;
    /// returns the chart's OCI reference without the version (`oci://<host>/tno/charts/tailnet-operator`).
    pub fn publish_chart(&mut self, package_dir: &Path, registry: &LabRegistry) -> Result<String> {
        let chart_dir = workspace_root().join("charts/tailnet-operator");
        let path = |p: &Path| p.display().to_string();
        self.run(&[
            "package",
            &path(&chart_dir),
            "--destination",
            &path(package_dir),
        ])?;
        let package = package_dir.join(format!("tailnet-operator-{}.tgz", chart_version()?));
        let charts_url = format!("oci://{}/tno/charts", registry.host());
        self.run(&["push", &path(&package), &charts_url, "--plain-http"])?;
        Ok(format!("{charts_url}/tailnet-operator"))
    }
}
