//! Developer tasks: `cargo xtask <task>`.
//!
//! - `generate`: rewrite generated files (CRD YAML in `deploy/crds/`, `docs/reference/crds.md`).
//! - `deps`: build the third-party binaries the tests need (delegates to `deps/build.sh`).
//! - `images`: build the OCI images without a daemon (reproducible; `--push`, `--chart`), or
//!   with `--dockerfile` from `images/*.Dockerfile` (docker, podman or buildah).
//! - `package-chart`: the chart with images by digest in its values, packaged (release).
//! - `bench`: run the benchmarks (crates/bench, docs/benchmarks.md).

mod bench;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};

mod crd_reference;
mod images;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Regenerate deploy/crds/*.yaml and docs/reference/crds.md from the Rust types.
    Generate,
    /// Build (or verify the cache of) the Go-built third-party binaries.
    Deps {
        /// Components to build (default: all).
        components: Vec<String>,
    },
    /// Build the OCI images of tailnet-operator, tailnet-agent and tailnet-tailscaled (the
    /// agents' tailscaled, from `deps/build.sh tailscale-minimal`) without a container daemon
    /// (static release binaries on an empty base; reproducible), as OCI layouts under --out.
    Images {
        #[arg(long, default_value = concat!("v", env!("CARGO_PKG_VERSION")))]
        tag: String,
        /// linux/amd64 and/or linux/arm64 (repeatable; default: the host's).
        #[arg(long = "platform")]
        platforms: Vec<String>,
        /// Output directory (default: target/images).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Use binaries from <dir>/<rust-target>/<name> instead of building them (tailscaled
        /// too when there; else the host's from the deps cache).
        #[arg(long)]
        binaries: Option<PathBuf>,
        /// The CA bundle put at /etc/ssl/certs/ca-certificates.crt.
        #[arg(long, default_value = "/etc/ssl/certs/ca-certificates.crt")]
        ca_bundle: PathBuf,
        /// Push every image by digest (and --tag) to <registry>/<prefix>/<name>.
        #[arg(long)]
        push: Option<String>,
        /// With --push: package the chart with the pushed digests and `helm push` it to
        /// oci://<registry>/<prefix>/charts.
        #[arg(long)]
        chart: bool,
        /// Assemble every image a second time and fail unless the digests are equal.
        #[arg(long)]
        verify_reproducible: bool,
        /// Cargo profile of the binaries: `release` (LTO; what releases ship) or `lab`
        /// (the local lab's images: static, unoptimised, built in the time of a debug build).
        #[arg(long, default_value = "release", value_parser = ["release", "lab"])]
        profile: String,
        /// Build images/*.Dockerfile with a container builder instead (needs a daemon or
        /// podman/buildah), tagged <registry>/<name>:<tag>.
        #[arg(long)]
        dockerfile: bool,
        #[arg(long, default_value = "ghcr.io/tailnet-operator")]
        registry: String,
        /// With --dockerfile: docker, podman or buildah (default: the first that works).
        #[arg(long)]
        builder: Option<String>,
    },
    /// Package the Helm chart with the given images (by digest) filled into its values.
    PackageChart {
        /// <name>=<repository>@sha256:<digest>, for tailnet-operator, tailnet-agent and
        /// tailnet-tailscaled.
        #[arg(long = "image", required = true)]
        images: Vec<String>,
        /// Output directory (the package goes to <out>/chart/; default: target/images).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run the benchmarks (`--smoke`: briefly, to check they still work); see docs/benchmarks.md.
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn generate() -> Result<(), String> {
    let dir = root().join("deploy/crds");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let files = tailnet_api::crd::yaml_files().map_err(|e| e.to_string())?;
    // The Helm chart ships the same CRDs as templates of the release (templates/crds.yaml;
    // the drift test compares both).
    let chart_dir = root().join("charts/tailnet-operator/files/crds");
    for (file, yaml) in files {
        for dir in [&dir, &chart_dir] {
            let path = dir.join(file);
            std::fs::write(&path, &yaml).map_err(|e| format!("{}: {e}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    let reference = crd_reference::write(&root())?;
    println!("wrote {}", reference.display());
    Ok(())
}

fn deps(components: &[String]) -> Result<(), String> {
    let script = root().join("deps/build.sh");
    let mut command = Command::new("bash");
    command.arg(&script);
    if components.is_empty() {
        command.arg("all");
    } else {
        command.args(components);
    }
    let status = command
        .status()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed: {status}", script.display()))
    }
}

fn images_options(
    tag: String,
    platforms: Vec<String>,
    out: Option<PathBuf>,
    binaries: Option<PathBuf>,
    ca_bundle: PathBuf,
    push: Option<String>,
    chart: bool,
) -> Result<images::Options, String> {
    let mut options = images::Options::new(&root(), tag);
    if !platforms.is_empty() {
        options.platforms = platforms
            .iter()
            .map(|name| tno_oci::Platform::parse(name).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
    }
    if options.platforms.is_empty() {
        return Err("no platform: pass --platform linux/amd64 or linux/arm64".into());
    }
    if let Some(out) = out {
        options.out = out;
    }
    options.binaries = binaries;
    options.ca_bundle = ca_bundle;
    options.push = push;
    options.chart = chart;
    Ok(options)
}

fn main() -> ExitCode {
    let result = match Args::parse().task {
        Task::Generate => generate(),
        Task::Deps { components } => deps(&components),
        Task::Images {
            tag,
            platforms,
            out,
            binaries,
            ca_bundle,
            push,
            chart,
            verify_reproducible,
            profile,
            dockerfile,
            registry,
            builder,
        } => {
            if dockerfile {
                images::dockerfile_images(&root(), &registry, &tag, builder.as_deref())
            } else {
                images_options(tag, platforms, out, binaries, ca_bundle, push, chart)
                    .map(|mut options| {
                        options.verify_reproducible = verify_reproducible;
                        options.profile = profile;
                        options
                    })
                    .and_then(|options| images::images(&root(), &options))
            }
        }
        Task::PackageChart { images, out } => images::package_chart_with(
            &root(),
            &out.unwrap_or_else(|| root().join("target/images")),
            &images,
        ),
        Task::Bench { args } => bench::bench(&args, &root()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
