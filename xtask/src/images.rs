//! `cargo xtask images`: the `tailnet-operator`, `tailnet-agent` and `tailnet-tailscaled` OCI
//! images, built without a container daemon and reproducibly.
//!
//! `tailnet-tailscaled` is the agent pods' `tailscaled`: tailscale's own program at the pinned
//! version (`TAILSCALE_VERSION` of `deps/versions.env`), built by `deps/build.sh
//! tailscale-minimal` from the Go module proxy (checksums verified against the Go checksum
//! database) with only the features an agent pod uses (its `ts_omit_*` build tags), static
//! (`CGO_ENABLED=0`, `-trimpath`). It is not built here: `--binaries <dir>` takes
//! `<dir>/<rust-target>/tailscaled`, otherwise the host platform's comes from the deps cache
//! (`TNO_BIN_TAILSCALED_MINIMAL`, as `deps/build.sh --print-env` prints it).
//!
//! Each image is a static binary on an empty base, in two layers:
//!
//! 1. base: `/etc/passwd` and `/etc/group` (`images/rootfs/etc/`: root and `nonroot` 65532),
//!    the CA bundle at `/etc/ssl/certs/ca-certificates.crt` (the build machine's Debian
//!    `ca-certificates`, or `--ca-bundle`), `/home/nonroot` (0700, 65532) and `/tmp` (1777);
//! 2. the program at `/usr/local/bin/<program>` (0755, root).
//!
//! No shell, no libc, no package manager: nothing but what the binary needs, so a
//! read-only root file system works (the programs write only to mounted volumes). User
//! `65532:65532`, entrypoint the binary, `PATH=/usr/local/bin`, `SSL_CERT_FILE` set.
//!
//! Reproducible: layers are written by [`tno_oci::layer`] (sorted entries, fixed mtime =
//! the commit time or `SOURCE_DATE_EPOCH`, numeric owners, gzip without name or time),
//! JSON is canonical, and the binaries are built with `--locked` and the host paths
//! remapped (`--remap-path-prefix`), so the same commit, toolchain and CA bundle give the
//! same digests (`--verify-reproducible` assembles every image twice and compares).
//!
//! Output: one OCI image layout per image under `--out` (default `target/images/<name>/`)
//! with a multi-platform index (`--platform`, default the host's), and `images.json`
//! (digests, sizes). `--push <registry>/<prefix>` pushes each layout by digest (and the tag)
//! to `<registry>/<prefix>/<name>`; `--chart` then packages the Helm chart with those
//! repositories and digests filled into its values and pushes it with `helm push` to
//! `oci://<registry>/<prefix>/charts`. Both use the user's credentials for the registry from
//! the Docker config (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`, `auths`;
//! a registry served by a credential helper is refused with the helper's name), anonymous
//! without an entry; helm is `TNO_BIN_HELM`, the deps cache, else `helm` on `PATH`.
//!
//! `--dockerfile` builds `images/*.Dockerfile` instead, with docker/podman/buildah (for users
//! with a container daemon; same file system layout, see `images/rootfs.sh`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tno_oci::Platform;
use tno_oci::image::{PlatformImage, RunConfig};
use tno_oci::layer::LayerSpec;

/// One image: its name, its Dockerfile under `images/`, the program it runs
/// (`/usr/local/bin/<program>`, the entrypoint) and the program's licence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSpec {
    pub name: &'static str,
    pub dockerfile: &'static str,
    pub program: &'static str,
    pub licenses: &'static str,
}

impl ImageSpec {
    /// Whether the program is a binary of this workspace (built by cargo) rather than
    /// tailscale's `tailscaled` (built by `deps/build.sh`).
    pub fn is_workspace_binary(&self) -> bool {
        self.program != TAILSCALED
    }
}

/// The agent pods' tailscaled (see the module documentation).
pub const TAILSCALED: &str = "tailscaled";

pub const IMAGES: &[ImageSpec] = &[
    ImageSpec {
        name: "tailnet-operator",
        dockerfile: "operator.Dockerfile",
        program: "tailnet-operator",
        licenses: "Apache-2.0",
    },
    ImageSpec {
        name: "tailnet-agent",
        dockerfile: "agent.Dockerfile",
        program: "tailnet-agent",
        licenses: "Apache-2.0",
    },
    ImageSpec {
        name: "tailnet-tailscaled",
        dockerfile: "tailscaled.Dockerfile",
        program: TAILSCALED,
        licenses: "BSD-3-Clause",
    },
];

pub const USER: &str = "65532:65532";
pub const PATH_ENV: &str = "PATH=/usr/local/bin";
pub const CA_PATH: &str = "etc/ssl/certs/ca-certificates.crt";
const DEFAULT_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Options of `cargo xtask images`.
#[derive(Debug, Clone)]
pub struct Options {
    pub tag: String,
    pub platforms: Vec<Platform>,
    pub out: PathBuf,
    /// Directory with `<rust-target>/<name>` binaries already built (skips cargo).
    pub binaries: Option<PathBuf>,
    pub ca_bundle: PathBuf,
    pub push: Option<String>,
    pub chart: bool,
    pub verify_reproducible: bool,
    /// Cargo profile the binaries are built with (`release`, or `lab` for the local lab).
    pub profile: String,
}

impl Options {
    pub fn new(root: &Path, tag: String) -> Self {
        Self {
            tag,
            platforms: Platform::host().into_iter().collect(),
            out: root.join("target/images"),
            binaries: None,
            ca_bundle: PathBuf::from(DEFAULT_CA_BUNDLE),
            push: None,
            chart: false,
            verify_reproducible: false,
            profile: "release".into(),
        }
    }
}

/// The seconds since the epoch that every timestamp of the images is set to.
pub fn source_date_epoch(root: &Path) -> Result<u64, String> {
    if let Ok(value) = std::env::var("SOURCE_DATE_EPOCH") {
        return value
            .trim()
            .parse()
            .map_err(|e| format!("SOURCE_DATE_EPOCH={value:?}: {e}"));
    }
    let output = git(root, &["log", "-1", "--format=%ct"])?;
    output
        .trim()
        .parse()
        .map_err(|e| format!("git commit time {output:?}: {e}"))
}

fn git(root: &Path, args: &[&str]) -> Result<String, String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .map_err(|e| format!("git: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// RFC 3339 UTC of a Unix time (civil-from-days, no time zone database needed).
pub fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let seconds = epoch % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        seconds / 3600,
        seconds % 3600 / 60,
        seconds % 60
    )
}

/// The base layer (the same for every image).
pub fn base_layer(root: &Path, ca_bundle: &Path) -> Result<LayerSpec, String> {
    let mut layer = LayerSpec::new();
    let fail = |e: tno_oci::Error| e.to_string();
    layer
        .host_file("etc/passwd", 0o644, &root.join("images/rootfs/etc/passwd"))
        .map_err(fail)?;
    layer
        .host_file("etc/group", 0o644, &root.join("images/rootfs/etc/group"))
        .map_err(fail)?;
    layer.host_file(CA_PATH, 0o644, ca_bundle).map_err(fail)?;
    layer
        .dir("home/nonroot", 0o700, 65532, 65532)
        .map_err(fail)?;
    layer.dir("tmp", 0o1777, 0, 0).map_err(fail)?;
    Ok(layer)
}

/// The binary layer: `binary` as `/usr/local/bin/<program>`.
pub fn binary_layer(program: &str, binary: &Path) -> Result<LayerSpec, String> {
    let mut layer = LayerSpec::new();
    layer
        .host_file(&format!("usr/local/bin/{program}"), 0o755, binary)
        .map_err(|e| e.to_string())?;
    Ok(layer)
}

pub fn run_config(program: &str, labels: BTreeMap<String, String>) -> RunConfig {
    RunConfig {
        entrypoint: vec![format!("/usr/local/bin/{program}")],
        cmd: Vec::new(),
        env: vec![PATH_ENV.to_string(), format!("SSL_CERT_FILE=/{CA_PATH}")],
        user: USER.to_string(),
        working_dir: "/".to_string(),
        labels,
    }
}

/// What was built for one image.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub name: String,
    pub digest: String,
    pub platforms: Vec<(Platform, String, u64, u64)>,
    pub layout: PathBuf,
}

/// Assembles the images from built binaries (`binary(platform, program)`) into layouts under
/// `out`.
pub fn assemble(
    root: &Path,
    options: &Options,
    epoch: u64,
    revision: &str,
    binary: &dyn Fn(Platform, &str) -> PathBuf,
    out: &Path,
) -> Result<Vec<BuiltImage>, String> {
    let created = rfc3339(epoch);
    let base = base_layer(root, &options.ca_bundle)?
        .build(epoch)
        .map_err(|e| e.to_string())?;
    // The `dev.tailnet-operator.tailscale.version` label of tailnet-tailscaled.
    let tailscale_version = tno_deps::pinned_version(root, "tailscale-minimal")?;
    let mut built = Vec::new();
    for spec in IMAGES {
        let name = spec.name;
        let mut labels = BTreeMap::new();
        labels.insert(
            "org.opencontainers.image.source".to_string(),
            "https://github.com/tailnet-operator/tailnet-operator".to_string(),
        );
        labels.insert(
            "org.opencontainers.image.revision".to_string(),
            revision.to_string(),
        );
        labels.insert(
            "org.opencontainers.image.version".to_string(),
            options.tag.clone(),
        );
        labels.insert(
            "org.opencontainers.image.created".to_string(),
            created.clone(),
        );
        labels.insert(
            "org.opencontainers.image.title".to_string(),
            name.to_string(),
        );
        labels.insert(
            "org.opencontainers.image.licenses".to_string(),
            spec.licenses.to_string(),
        );
        if !spec.is_workspace_binary() {
            labels.insert(
                "dev.tailnet-operator.tailscale.version".to_string(),
                tailscale_version.clone(),
            );
        }
        let mut images = Vec::new();
        for platform in &options.platforms {
            let path = binary(*platform, spec.program);
            let layer = binary_layer(spec.program, &path)?
                .build(epoch)
                .map_err(|e| e.to_string())?;
            let image =
                PlatformImage::build(
                    *platform,
                    vec![
                    (
                        base.clone(),
                        "base: images/rootfs/etc/{passwd,group}, CA bundle, /home/nonroot, /tmp"
                            .to_string(),
                    ),
                    (layer, format!("binary: /usr/local/bin/{} (static, release)", spec.program)),
                ],
                    &run_config(spec.program, labels.clone()),
                    &created,
                    &labels,
                )
                .map_err(|e| e.to_string())?;
            images.push(image);
        }
        let index = tno_oci::image::index(&images, &labels).map_err(|e| e.to_string())?;
        let layout = out.join(name);
        tno_oci::layout::write(&layout, &index, &images, &options.tag)
            .map_err(|e| e.to_string())?;
        built.push(BuiltImage {
            name: name.to_string(),
            digest: index.digest.clone(),
            platforms: images
                .iter()
                .map(|image| {
                    (
                        image.platform,
                        image.manifest.digest.clone(),
                        image.compressed_size(),
                        image.uncompressed_size(),
                    )
                })
                .collect(),
            layout,
        });
    }
    Ok(built)
}

/// Builds the images' static binaries for `platform` with cargo in `profile`; returns their
/// directory.
/// `revision` becomes the binaries' `git_commit` label of `*_build_info` (`TNO_GIT_COMMIT`,
/// read by crates/telemetry/build.rs), `-dirty` included.
fn cargo_build(
    root: &Path,
    platform: Platform,
    profile: &str,
    revision: &str,
) -> Result<PathBuf, String> {
    let target = platform.rust_target();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|home| Path::new(&home).join(".cargo")))
        .map_err(|_| "neither CARGO_HOME nor HOME is set".to_string())?;
    let root = root
        .canonicalize()
        .map_err(|e| format!("{}: {e}", root.display()))?;
    // Host paths end up in panic locations: map them to fixed ones.
    let flags = [
        format!("--remap-path-prefix={}=/cargo", home.display()),
        format!("--remap-path-prefix={}=/src", root.display()),
    ];
    let rustflags = format!(
        "target.{target}.rustflags=[{}]",
        flags
            .iter()
            .map(|flag| format!("{flag:?}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    println!(
        "building {profile} binaries for {} ({target})",
        platform.name()
    );
    let status = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "--locked",
            "--profile",
            profile,
            "--target",
            target,
        ])
        .args(["--config", &rustflags])
        .env("TNO_GIT_COMMIT", revision)
        .args(["-p", "tailnet-operator", "--bin", "tailnet-operator"])
        .args(["-p", "tailnet-agent", "--bin", "tailnet-agent"])
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo build --profile {profile} --target {target} failed: {status} (is the target installed? \
             `rustup target add {target}`; ring needs a C compiler for it, e.g. musl-tools)"
        ));
    }
    // Where cargo put them: `CARGO_TARGET_DIR` when set (relative to the workspace root).
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                root.join(dir)
            }
        })
        .unwrap_or_else(|| root.join("target"));
    Ok(target_dir.join(target).join(profile))
}

/// The `tailscaled` of each platform: `<--binaries>/<rust-target>/tailscaled` when that file
/// exists, else for the host platform the deps cache's `tailscale-minimal` build.
fn tailscaled_binaries(
    root: &Path,
    options: &Options,
) -> Result<BTreeMap<&'static str, PathBuf>, String> {
    let mut found = BTreeMap::new();
    for platform in &options.platforms {
        let given = options
            .binaries
            .as_ref()
            .map(|dir| dir.join(platform.rust_target()).join(TAILSCALED))
            .filter(|path| path.is_file());
        let path = match given {
            Some(path) => path,
            None if Platform::host() == Some(*platform) => tno_deps::tailscaled_minimal(root)
                .map_err(|missing| format!("{missing} (the tailnet-tailscaled image's program)"))?,
            None => {
                return Err(format!(
                    "tailscaled for {} is built on that platform (`bash deps/build.sh \
                     tailscale-minimal`) and passed with --binaries <dir> as \
                     <dir>/{}/tailscaled",
                    platform.name(),
                    platform.rust_target()
                ));
            }
        };
        found.insert(platform.name(), path);
    }
    Ok(found)
}

/// `cargo xtask images`.
pub fn images(root: &Path, options: &Options) -> Result<(), String> {
    let epoch = source_date_epoch(root)?;
    let mut revision = git(root, &["rev-parse", "HEAD"])?;
    if !git(root, &["status", "--porcelain", "--untracked-files=no"])?.is_empty() {
        revision.push_str("-dirty");
    }
    // Before the (long) cargo builds: a missing tailscaled fails at once.
    let tailscaled = tailscaled_binaries(root, options)?;
    let mut dirs = BTreeMap::new();
    for platform in &options.platforms {
        let dir = match &options.binaries {
            Some(dir) => dir.join(platform.rust_target()),
            None => cargo_build(root, *platform, &options.profile, &revision)?,
        };
        dirs.insert(platform.name(), dir);
    }
    let binary = |platform: Platform, program: &str| {
        if program == TAILSCALED {
            tailscaled[platform.name()].clone()
        } else {
            dirs[platform.name()].join(program)
        }
    };
    let built = assemble(root, options, epoch, &revision, &binary, &options.out)?;
    if options.verify_reproducible {
        let again = options.out.join(".reproducibility-check");
        let second = assemble(root, options, epoch, &revision, &binary, &again)?;
        std::fs::remove_dir_all(&again).map_err(|e| format!("{}: {e}", again.display()))?;
        for (a, b) in built.iter().zip(&second) {
            if a.digest != b.digest {
                return Err(format!(
                    "{} is not reproducible: {} then {}",
                    a.name, a.digest, b.digest
                ));
            }
            println!("reproducible: {} {} (assembled twice)", a.name, a.digest);
        }
    }
    let mut summary = serde_json::Map::new();
    for image in &built {
        for (platform, manifest, compressed, uncompressed) in &image.platforms {
            println!(
                "{} {} {}: manifest {manifest}, {compressed} bytes compressed, {uncompressed} bytes unpacked",
                image.name,
                image.digest,
                platform.name()
            );
        }
        summary.insert(
            image.name.clone(),
            serde_json::json!({
                "digest": image.digest,
                "layout": image.layout,
                "platforms": image.platforms.iter().map(|(platform, manifest, compressed, uncompressed)| {
                    serde_json::json!({
                        "platform": platform.name(),
                        "manifest": manifest,
                        "compressedBytes": compressed,
                        "uncompressedBytes": uncompressed,
                    })
                }).collect::<Vec<_>>(),
            }),
        );
    }
    let mut pushed = BTreeMap::new();
    if let Some(target) = &options.push {
        let (registry, prefix) = split_registry(target);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio: {e}"))?;
        let credentials = registry_credentials(registry)?;
        let client = tno_oci::registry::Client::with_credentials(credentials);
        for image in &built {
            let layout = tno_oci::layout::Layout::read(&image.layout).map_err(|e| e.to_string())?;
            let repository = join_repo(prefix, &image.name);
            let reference = runtime
                .block_on(client.push_layout(&layout, registry, &repository, Some(&options.tag)))
                .map_err(|e| e.to_string())?;
            println!("pushed {reference} (tag {})", options.tag);
            pushed.insert(
                image.name.clone(),
                (format!("{registry}/{repository}"), image.digest.clone()),
            );
        }
        summary.insert("pushed".into(), serde_json::json!(pushed));
    }
    let summary_path = options.out.join("images.json");
    std::fs::write(
        &summary_path,
        serde_json::to_vec_pretty(&summary).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", summary_path.display()))?;
    println!("wrote {}", summary_path.display());
    if options.chart {
        let target = options
            .push
            .as_deref()
            .ok_or("--chart needs --push <registry>/<prefix>")?;
        let chart = package_chart(root, &options.out, &pushed)?;
        push_chart(&chart, target)?;
    }
    Ok(())
}

/// The user's credentials for `registry` from the Docker config (`$DOCKER_CONFIG/config.json`,
/// else `~/.docker/config.json`); `None`: anonymous. Says which it uses, never the password.
fn registry_credentials(registry: &str) -> Result<Option<tno_oci::auth::Credentials>, String> {
    let credentials = tno_oci::auth::docker_credentials(registry).map_err(|e| e.to_string())?;
    let config = tno_oci::auth::docker_config_path().map_or_else(
        || "no Docker config".to_string(),
        |p| p.display().to_string(),
    );
    match &credentials {
        Some(c) => println!("{registry}: user {} from {config}", c.username),
        None => println!("{registry}: no credentials in {config}; pushing anonymously"),
    }
    Ok(credentials)
}

fn split_registry(target: &str) -> (&str, &str) {
    match target.split_once('/') {
        Some((registry, prefix)) => (registry, prefix.trim_matches('/')),
        None => (target, ""),
    }
}

fn join_repo(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

/// helm: `TNO_BIN_HELM`, the pinned build in the deps cache, else helm on `PATH`
/// ([`tno_deps::helm`], the lookup the tests share).
pub fn helm(root: &Path) -> Result<PathBuf, String> {
    tno_deps::helm(root).map_err(|missing| missing.to_string())
}

/// Sets `repository:` and `digest:` of the values block that starts with `block` (e.g.
/// `image:` at the top level or `  image:` under `agent:`), keeping every comment.
pub fn fill_image_values(
    values: &str,
    block: &str,
    repository: &str,
    digest: &str,
) -> Result<String, String> {
    let indent = block.len() - block.trim_start().len() + 2;
    let mut out = Vec::new();
    let mut inside = false;
    let mut seen = (false, false);
    for line in values.lines() {
        let current_indent = line.len() - line.trim_start().len();
        if line == block {
            inside = true;
            out.push(line.to_string());
            continue;
        }
        if inside && !line.trim().is_empty() && current_indent < indent {
            inside = false;
        }
        if inside && current_indent == indent {
            let pad = " ".repeat(indent);
            if line.trim_start().starts_with("repository:") {
                out.push(format!("{pad}repository: {repository}"));
                seen.0 = true;
                continue;
            }
            if line.trim_start().starts_with("digest:") {
                out.push(format!("{pad}digest: {digest}"));
                seen.1 = true;
                continue;
            }
        }
        out.push(line.to_string());
    }
    if seen != (true, true) {
        return Err(format!(
            "values.yaml: block {block:?} with repository and digest not found"
        ));
    }
    Ok(out.join("\n") + "\n")
}

/// `cargo xtask package-chart --image tailnet-operator=<repository>@<digest> --image
/// tailnet-agent=<repository>@<digest>`: the chart with those images in its values, packaged
/// under `<out>/chart/` (the release workflow pushes it with `helm push`). Prints its path.
pub fn package_chart_with(root: &Path, out: &Path, images: &[String]) -> Result<(), String> {
    let mut pushed = BTreeMap::new();
    for image in images {
        let (name, reference) = image
            .split_once('=')
            .ok_or_else(|| format!("--image {image:?}: expected <name>=<repository>@<digest>"))?;
        let (repository, digest) = reference
            .split_once('@')
            .ok_or_else(|| format!("--image {image:?}: no @sha256:<digest>"))?;
        pushed.insert(
            name.to_string(),
            (repository.to_string(), digest.to_string()),
        );
    }
    package_chart(root, out, &pushed).map(|_| ())
}

/// Copies the chart, fills the pushed images into its values and `helm package`s it.
fn package_chart(
    root: &Path,
    out: &Path,
    pushed: &BTreeMap<String, (String, String)>,
) -> Result<PathBuf, String> {
    let source = root.join("charts/tailnet-operator");
    let staging = out.join("chart/tailnet-operator");
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    }
    copy_dir(&source, &staging)?;
    let values_path = staging.join("values.yaml");
    let mut values = std::fs::read_to_string(&values_path)
        .map_err(|e| format!("{}: {e}", values_path.display()))?;
    for (name, block) in [
        ("tailnet-operator", "image:"),
        ("tailnet-agent", "  image:"),
        ("tailnet-tailscaled", "  tailscaleImage:"),
    ] {
        let (repository, digest) = pushed
            .get(name)
            .ok_or_else(|| format!("{name} was not pushed"))?;
        values = fill_image_values(&values, block, repository, digest)?;
    }
    std::fs::write(&values_path, values).map_err(|e| format!("{}: {e}", values_path.display()))?;
    let helm = helm(root)?;
    let destination = out.join("chart");
    let output = Command::new(&helm)
        .arg("package")
        .arg(&staging)
        .arg("--destination")
        .arg(&destination)
        .output()
        .map_err(|e| format!("{}: {e}", helm.display()))?;
    if !output.status.success() {
        return Err(format!(
            "helm package: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout
        .lines()
        .find_map(|line| line.split(": ").nth(1))
        .map(|path| PathBuf::from(path.trim()))
        .ok_or_else(|| format!("helm package printed no path: {stdout}"))?;
    println!("packaged {}", path.display());
    Ok(path)
}

fn push_chart(chart: &Path, target: &str) -> Result<(), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let helm = helm(&root)?;
    let (registry, prefix) = split_registry(target);
    let url = format!("oci://{registry}/{}", join_repo(prefix, "charts"));
    let mut command = Command::new(&helm);
    command.arg("push").arg(chart).arg(&url);
    if tno_oci::registry::is_loopback_host(registry) {
        command.arg("--plain-http");
    }
    // The same credentials as the image push, in a registry config of helm's own (Docker
    // config format, mode 0600, removed afterwards): not on helm's command line.
    let registry_config = match registry_credentials(registry)? {
        Some(credentials) => {
            let path = chart
                .parent()
                .unwrap_or(Path::new("."))
                .join(".helm-registry-config.json");
            write_private(&path, &helm_registry_config(registry, &credentials))?;
            command.arg("--registry-config").arg(&path);
            Some(path)
        }
        None => None,
    };
    let status = command.status();
    if let Some(path) = &registry_config {
        let _ = std::fs::remove_file(path);
    }
    let status = status.map_err(|e| format!("{}: {e}", helm.display()))?;
    if !status.success() {
        return Err(format!("helm push {} {url}: {status}", chart.display()));
    }
    Ok(())
}

/// `{"auths": {"<registry>": {"auth": "<base64 user:password>"}}}`.
fn helm_registry_config(registry: &str, credentials: &tno_oci::auth::Credentials) -> String {
    let auth = credentials
        .basic_header()
        .trim_start_matches("Basic ")
        .to_string();
    serde_json::json!({ "auths": { registry: { "auth": auth } } }).to_string()
}

fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all(text.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", from.display()))?;
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target)?;
        } else {
            std::fs::copy(&path, &target).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

// ------------------------------------------------------------ Dockerfile builds (a daemon)

#[derive(Clone, Copy, Debug)]
enum Builder {
    Docker,
    Podman,
    Buildah,
}

impl Builder {
    fn program(self) -> &'static str {
        match self {
            Builder::Docker => "docker",
            Builder::Podman => "podman",
            Builder::Buildah => "buildah",
        }
    }

    /// The command that proves the builder can build (docker needs its daemon).
    fn probe(self) -> &'static [&'static str] {
        match self {
            Builder::Docker => &["info", "--format", "{{.ServerVersion}}"],
            Builder::Podman | Builder::Buildah => &["version"],
        }
    }

    fn build_args(self) -> &'static [&'static str] {
        match self {
            Builder::Docker | Builder::Podman => &["build"],
            Builder::Buildah => &["build", "--layers"],
        }
    }
}

fn usable(builder: Builder) -> Result<(), String> {
    let output = Command::new(builder.program())
        .args(builder.probe())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", builder.program()))?;
    if output.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(format!(
            "{} {}: {}",
            builder.program(),
            builder.probe().join(" "),
            stderr.lines().last().unwrap_or("failed")
        ))
    }
}

fn find_builder(wanted: Option<&str>) -> Result<Builder, String> {
    let candidates = [Builder::Docker, Builder::Podman, Builder::Buildah];
    let mut tried = Vec::new();
    for builder in candidates
        .into_iter()
        .filter(|b| wanted.is_none_or(|w| w == b.program()))
    {
        match usable(builder) {
            Ok(()) => return Ok(builder),
            Err(reason) => tried.push(reason),
        }
    }
    Err(format!(
        "no usable container builder (tried: {}). Install podman or buildah, or start the \
         docker daemon; or run `cargo xtask images` without --dockerfile (no daemon needed)",
        if tried.is_empty() {
            "none matched --builder".to_string()
        } else {
            tried.join("; ")
        }
    ))
}

/// `cargo xtask images --dockerfile`: every image as `<registry>/<name>:<tag>` from the
/// repository root with a container builder.
pub fn dockerfile_images(
    root: &Path,
    registry: &str,
    tag: &str,
    builder: Option<&str>,
) -> Result<(), String> {
    let builder = find_builder(builder)?;
    for spec in IMAGES {
        let reference = format!("{}/{}:{tag}", registry.trim_end_matches('/'), spec.name);
        let file = root.join("images").join(spec.dockerfile);
        println!(
            "building {reference} from {} with {}",
            file.display(),
            builder.program()
        );
        let status = Command::new(builder.program())
            .args(builder.build_args())
            .arg("--file")
            .arg(&file)
            .arg("--tag")
            .arg(&reference)
            .arg(root)
            .status()
            .map_err(|e| format!("{}: {e}", builder.program()))?;
        if !status.success() {
            return Err(format!("building {reference} failed: {status}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn fake_binaries(dir: &Path) -> PathBuf {
        for spec in IMAGES {
            let path = dir.join(spec.program);
            std::fs::write(&path, format!("#!fake {}\n", spec.program)).expect("write");
        }
        dir.to_path_buf()
    }

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_116_146), "2026-12-01T09:09:06Z");
    }

    /// Same inputs assembled twice, in different directories, from binaries with different
    /// host mtimes: the same digests; a changed binary changes only its image.
    #[test]
    fn images_are_reproducible_and_content_addressed() {
        let scratch = tempfile::tempdir().expect("tempdir");
        let bins = fake_binaries(&scratch.path().join("bin-a").tap_mkdir());
        let mut options = Options::new(&root(), "v0.0.0-test".into());
        options.platforms = vec![Platform::LinuxAmd64, Platform::LinuxArm64];
        options.ca_bundle = root().join("images/rootfs/etc/group");
        let binary = |_: Platform, name: &str| bins.join(name);
        let a = assemble(
            &root(),
            &options,
            1,
            "rev",
            &binary,
            &scratch.path().join("a"),
        )
        .expect("assemble");
        std::thread::sleep(std::time::Duration::from_millis(10));
        let bins_b = fake_binaries(&scratch.path().join("bin-b").tap_mkdir());
        let binary_b = |_: Platform, name: &str| bins_b.join(name);
        let b = assemble(
            &root(),
            &options,
            1,
            "rev",
            &binary_b,
            &scratch.path().join("b"),
        )
        .expect("assemble");
        let digests = |built: &[BuiltImage]| {
            built
                .iter()
                .map(|image| image.digest.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(digests(&a), digests(&b));
        std::fs::write(bins_b.join("tailnet-agent"), "#!changed\n").expect("write");
        let c = assemble(
            &root(),
            &options,
            1,
            "rev",
            &binary_b,
            &scratch.path().join("c"),
        )
        .expect("assemble");
        assert_eq!(a[0].digest, c[0].digest, "operator image unchanged");
        assert_ne!(a[1].digest, c[1].digest, "agent image changed");
        assert_eq!(a[2].digest, c[2].digest, "tailscaled image unchanged");
        assert_eq!(
            a.iter()
                .map(|image| image.name.as_str())
                .collect::<Vec<_>>(),
            ["tailnet-operator", "tailnet-agent", "tailnet-tailscaled"]
        );
        // The layout reads back with every blob verified, two platforms in the index.
        let layout = tno_oci::layout::Layout::read(&a[1].layout).expect("layout");
        assert_eq!(layout.digest(), a[1].digest);
        assert_eq!(layout.manifests.len(), 2);
        assert_eq!(layout.tag.as_deref(), Some("v0.0.0-test"));
    }

    trait TapMkdir {
        fn tap_mkdir(self) -> Self;
    }

    impl TapMkdir for PathBuf {
        fn tap_mkdir(self) -> Self {
            std::fs::create_dir_all(&self).expect("mkdir");
            self
        }
    }

    /// `images/rootfs.sh` (what the Dockerfiles run) lays out the same paths, modes and (as
    /// root) owners as the daemonless image; the Dockerfiles' final stage is `FROM scratch`
    /// with the same user, entrypoint and environment.
    #[test]
    fn dockerfile_layout_matches_the_daemonless_image() {
        let scratch = tempfile::tempdir().expect("tempdir");
        let bins = fake_binaries(scratch.path());
        let ca = root().join("images/rootfs/etc/group");
        for spec in IMAGES {
            let (name, dockerfile, program) = (spec.name, spec.dockerfile, spec.program);
            let dest = scratch.path().join(format!("rootfs-{name}"));
            let status = Command::new("sh")
                .arg(root().join("images/rootfs.sh"))
                .arg(bins.join(program))
                .arg(&ca)
                .arg(&dest)
                .status()
                .expect("sh");
            assert!(status.success(), "images/rootfs.sh failed: {status}");
            let mut from_script = Vec::new();
            walk(&dest, &dest, &mut from_script);
            from_script.sort();
            let mut expected = Vec::new();
            for layer in [
                base_layer(&root(), &ca).expect("base"),
                binary_layer(program, &bins.join(program)).expect("binary"),
            ] {
                let built = layer.build(0).expect("build");
                let mut archive =
                    tar::Archive::new(flate2::read::GzDecoder::new(&built.compressed[..]));
                for entry in archive.entries().expect("entries") {
                    let entry = entry.expect("entry");
                    let header = entry.header();
                    let path = entry.path().expect("path").display().to_string();
                    expected.push((
                        path.trim_end_matches('/').to_string(),
                        header.mode().expect("mode") & 0o7777,
                        header.uid().expect("uid"),
                    ));
                }
            }
            expected.sort();
            expected.dedup();
            let probe = scratch.path().join("owner-probe");
            std::fs::write(&probe, "").expect("probe");
            let is_root = std::fs::metadata(&probe).expect("probe").uid() == 0;
            let strip_owner = |list: &[(String, u32, u64)]| {
                list.iter()
                    .map(|(path, mode, uid)| (path.clone(), *mode, if is_root { *uid } else { 0 }))
                    .collect::<Vec<_>>()
            };
            assert_eq!(strip_owner(&from_script), strip_owner(&expected), "{name}");

            let text = std::fs::read_to_string(root().join("images").join(dockerfile))
                .expect("Dockerfile");
            let final_stage = text.rsplit("\nFROM ").next().expect("stages");
            assert!(
                final_stage.starts_with("scratch"),
                "{dockerfile}: final stage not scratch"
            );
            let config = run_config(program, BTreeMap::new());
            assert!(final_stage.contains(&format!("USER {}", config.user)));
            assert!(final_stage.contains(&format!(
                "ENTRYPOINT [\"{}\"]",
                config.entrypoint.join("\", \"")
            )));
            for env in &config.env {
                assert!(
                    final_stage.contains(&format!("ENV {env}")),
                    "{dockerfile}: ENV {env}"
                );
            }
            assert!(final_stage.contains("COPY --from=build /rootfs/ /"));
            let rootfs_call = if spec.is_workspace_binary() {
                format!(
                    "sh images/rootfs.sh target/release/{program} /etc/ssl/certs/ca-certificates.crt /rootfs"
                )
            } else {
                format!(
                    "sh images/rootfs.sh /out/{program} /etc/ssl/certs/ca-certificates.crt /rootfs"
                )
            };
            assert!(text.contains(&rootfs_call), "{dockerfile}: {rootfs_call}");
        }
    }

    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, u32, u64)>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let entry = entry.expect("entry");
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).expect("metadata");
            let relative = path
                .strip_prefix(base)
                .expect("inside")
                .display()
                .to_string();
            out.push((
                relative,
                meta.permissions().mode() & 0o7777,
                u64::from(meta.uid()),
            ));
            if meta.is_dir() {
                walk(base, &path, out);
            }
        }
    }

    #[test]
    fn chart_values_get_the_pushed_repositories_and_digests() {
        let values = std::fs::read_to_string(root().join("charts/tailnet-operator/values.yaml"))
            .expect("values");
        let filled = fill_image_values(&values, "image:", "r/op", "sha256:1").expect("operator");
        let filled = fill_image_values(&filled, "  image:", "r/agent", "sha256:2").expect("agent");
        let filled = fill_image_values(&filled, "  tailscaleImage:", "r/tailscaled", "sha256:3")
            .expect("tailscaled");
        let parsed: serde_json::Value = serde_yaml_norway(&filled);
        assert_eq!(parsed["image"]["repository"], "r/op");
        assert_eq!(parsed["image"]["digest"], "sha256:1");
        assert_eq!(parsed["agent"]["image"]["repository"], "r/agent");
        assert_eq!(parsed["agent"]["image"]["digest"], "sha256:2");
        assert_eq!(
            parsed["agent"]["tailscaleImage"]["repository"],
            "r/tailscaled"
        );
        assert_eq!(parsed["agent"]["tailscaleImage"]["digest"], "sha256:3");
        assert!(fill_image_values(&values, "nothing:", "r", "d").is_err());
    }

    fn serde_yaml_norway(text: &str) -> serde_json::Value {
        serde_yaml::from_str(text).expect("yaml")
    }
}
