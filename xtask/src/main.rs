//! Developer tasks: `cargo xtask <task>`.
//!
//! - `generate`: rewrite generated files (CRD YAML in `deploy/crds/`, `docs/reference/crds.md`).
//! - `deps`: build the third-party binaries the tests need (delegates to `deps/build.sh`).
//! - `images`: build the container images of `images/` (docker, podman or buildah).
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
    /// Build the container images (images/*.Dockerfile); fails if no container builder works.
    Images {
        #[arg(long, default_value = "ghcr.io/tailnet-operator")]
        registry: String,
        #[arg(long, default_value = concat!("v", env!("CARGO_PKG_VERSION")))]
        tag: String,
        /// docker, podman or buildah (default: the first that works).
        #[arg(long)]
        builder: Option<String>,
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
    // The Helm chart ships the same CRDs (the drift test compares both).
    let chart_dir = root().join("charts/tailnet-operator/crds");
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

fn main() -> ExitCode {
    let result = match Args::parse().task {
        Task::Generate => generate(),
        Task::Deps { components } => deps(&components),
        Task::Images {
            registry,
            tag,
            builder,
        } => images::images(&root(), &registry, &tag, builder.as_deref()),
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
