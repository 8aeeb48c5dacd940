//! The product as users install it: the images `cargo xtask images` built (OCI layouts under
//! an output directory such as `target/images/`) and the lab's build of the tailscale image are
//! pushed by digest to the lab's OCI registry ([`LabRegistry`]), the chart is packaged and
//! pushed there as an OCI artifact ([`Helm::publish_chart`]), and `helm` runs with its config,
//! cache and data in a directory of the run, keeping a transcript of every command.
//!
//! Used by `tno-lab` (the README's lab installs the chart) and by the install tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tno_testenv_kube::binaries::{Binaries, workspace_root};
use tno_testenv_kube::oci_registry::LabRegistry;

use crate::error::{E2eError, Result};

/// Repository path of the lab's tailscale image in the lab registry.
pub const LAB_TAILSCALE_REPOSITORY: &str = "lab/tailscale-lab-build";

/// One image in the lab registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedImage {
    /// `<registry host>/<path>`.
    pub repository: String,
    /// `sha256:…` of the image index.
    pub digest: String,
}

/// The three images an install runs: the operator, the agent and the tailscale image.
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
            format!("agent.tailscaleImage.tag={}", tailscale_version()?),
            format!("agent.tailscaleImage.digest={}", self.tailscale.digest),
        ])
    }
}

fn install_error(message: impl Into<String>) -> E2eError {
    E2eError::Install(message.into())
}

/// Pushes `<images_dir>/tailnet-operator` and `<images_dir>/tailnet-agent` (OCI layouts as
/// `cargo xtask images` writes them) as `tno/<name>`, and the lab's tailscale image (assembled
/// under `scratch`), by digest.
pub async fn push_product_images(
    registry: &LabRegistry,
    images_dir: &Path,
    binaries: &Binaries,
    scratch: &Path,
) -> Result<ProductImages> {
    let client = tno_oci::registry::Client::new();
    let mut pushed = Vec::new();
    for name in ["tailnet-operator", "tailnet-agent"] {
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
    let tailscale = push_lab_tailscale_image(binaries, registry, scratch).await?;
    let agent = pushed
        .pop()
        .ok_or_else(|| install_error("no agent image"))?;
    let operator = pushed
        .pop()
        .ok_or_else(|| install_error("no operator image"))?;
    Ok(ProductImages {
        operator,
        agent,
        tailscale,
    })
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

/// The lab's build of the tailscale image (not the official one): `containerboot`,
/// `tailscaled` and `tailscale` from deps/ (tailscale.com at the pinned version) at the
/// official image's paths (`/usr/local/bin/`) with its entrypoint (`containerboot`), on the
/// same empty base as our images, plus the setting the lab needs (no log uploads: no
/// Internet). Pushed as [`LAB_TAILSCALE_REPOSITORY`]. Its layout is assembled once per set of
/// inputs and kept beside the binaries in the deps cache (gzip of ~70 MB of binaries), else
/// (cache not writable) under `<scratch>/lab-tailscale-image`.
pub async fn push_lab_tailscale_image(
    binaries: &Binaries,
    registry: &LabRegistry,
    scratch: &Path,
) -> Result<PushedImage> {
    let oci = |what: &str, e: &dyn std::fmt::Display| install_error(format!("{what}: {e}"));
    let dir = lab_tailscale_layout(binaries, scratch)?;
    let layout = tno_oci::layout::Layout::read(&dir).map_err(|e| oci("layout", &e))?;
    tno_oci::registry::Client::new()
        .push_layout(&layout, registry.host(), LAB_TAILSCALE_REPOSITORY, None)
        .await
        .map_err(|e| oci("push the lab tailscale image", &e))?;
    Ok(PushedImage {
        repository: format!("{}/{LAB_TAILSCALE_REPOSITORY}", registry.host()),
        digest: layout.digest().to_string(),
    })
}

/// The files of the lab's tailscale image: host path → path in the image, mode.
fn lab_tailscale_files(binaries: &Binaries) -> Vec<(PathBuf, String, u32)> {
    let root = workspace_root();
    let mut files = vec![
        (
            root.join("images/rootfs/etc/passwd"),
            "etc/passwd".into(),
            0o644,
        ),
        (
            root.join("images/rootfs/etc/group"),
            "etc/group".into(),
            0o644,
        ),
        (
            PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
            "etc/ssl/certs/ca-certificates.crt".into(),
            0o644,
        ),
    ];
    for (name, path) in [
        ("containerboot", &binaries.containerboot),
        ("tailscaled", &binaries.tailscaled),
        ("tailscale", &binaries.tailscale),
    ] {
        files.push((path.clone(), format!("usr/local/bin/{name}"), 0o755));
    }
    files
}

/// The directory of the lab tailscale image's OCI layout, assembled if not cached: the key is
/// the inputs' paths, sizes and modification times and the tailscale version.
fn lab_tailscale_layout(binaries: &Binaries, scratch: &Path) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let files = lab_tailscale_files(binaries);
    let version = tailscale_version()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    version.hash(&mut hasher);
    for (path, target, mode) in &files {
        let meta =
            std::fs::metadata(path).map_err(|e| E2eError::io(path.display().to_string(), e))?;
        (path, target, mode, meta.len(), meta.modified().ok()).hash(&mut hasher);
    }
    let cached = binaries
        .tailscaled
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(format!("lab-image-{:016x}", hasher.finish())));
    if let Some(dir) = &cached
        && dir.join("index.json").is_file()
    {
        return Ok(dir.clone());
    }
    let staging = scratch.join("lab-tailscale-image");
    assemble_lab_tailscale_image(&files, &version, &staging)?;
    // Keep it for the next start; a read-only cache only costs the assembly next time.
    if let Some(dir) = cached
        && copy_layout(&staging, &dir).is_ok()
    {
        return Ok(dir);
    }
    Ok(staging)
}

/// Copies a layout directory into place (through a temporary sibling, renamed at the end).
fn copy_layout(from: &Path, to: &Path) -> std::io::Result<()> {
    let temporary = to.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&temporary);
    copy_tree(from, &temporary)?;
    std::fs::rename(&temporary, to)
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Writes the lab tailscale image's OCI layout into `dir`.
fn assemble_lab_tailscale_image(
    files: &[(PathBuf, String, u32)],
    version: &str,
    dir: &Path,
) -> Result<()> {
    let oci = |what: &str, e: &dyn std::fmt::Display| install_error(format!("{what}: {e}"));
    let mut base = tno_oci::layer::LayerSpec::new();
    let mut programs = tno_oci::layer::LayerSpec::new();
    for (path, target, mode) in files {
        let layer = if target.starts_with("usr/") {
            &mut programs
        } else {
            &mut base
        };
        layer
            .host_file(target, *mode, path)
            .map_err(|e| oci(target, &e))?;
    }
    base.dir("tmp", 0o1777, 0, 0).map_err(|e| oci("tmp", &e))?;
    let labels = BTreeMap::from([(
        "org.opencontainers.image.title".to_string(),
        format!(
            "tailscale {version}: the tailnet-operator lab's build (deps/), not the official image"
        ),
    )]);
    let platform = tno_oci::Platform::host().ok_or_else(|| {
        install_error("the lab tailscale image is built for amd64 or arm64 hosts only")
    })?;
    let image = tno_oci::image::PlatformImage::build(
        platform,
        vec![
            (base.build(0).map_err(|e| oci("base", &e))?, "base".into()),
            (
                programs.build(0).map_err(|e| oci("programs", &e))?,
                "tailscale.com binaries".into(),
            ),
        ],
        &tno_oci::image::RunConfig {
            entrypoint: vec!["/usr/local/bin/containerboot".into()],
            cmd: Vec::new(),
            env: vec![
                "PATH=/usr/local/bin:/usr/bin:/bin".into(),
                "TS_NO_LOGS_NO_SUPPORT=true".into(),
            ],
            user: String::new(),
            working_dir: "/".into(),
            labels: labels.clone(),
        },
        "1970-01-01T00:00:00Z",
        &labels,
    )
    .map_err(|e| oci("image", &e))?;
    let index = tno_oci::image::index(std::slice::from_ref(&image), &labels)
        .map_err(|e| oci("index", &e))?;
    let _ = std::fs::remove_dir_all(dir);
    tno_oci::layout::write(dir, &index, std::slice::from_ref(&image), version)
        .map_err(|e| oci("layout", &e))
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
