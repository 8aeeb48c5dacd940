//! `cargo xtask images`: builds the container images of `images/*.Dockerfile` with the first
//! container builder that works here (docker with a reachable daemon, podman, buildah).
//! Without one it says so and fails: nothing is faked.

use std::path::Path;
use std::process::{Command, Stdio};

/// (image name, Dockerfile under `images/`).
const IMAGES: &[(&str, &str)] = &[
    ("tailnet-operator", "operator.Dockerfile"),
    ("tailnet-agent", "agent.Dockerfile"),
];

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
         docker daemon, then run `cargo xtask images` again",
        if tried.is_empty() {
            "none matched --builder".to_string()
        } else {
            tried.join("; ")
        }
    ))
}

/// Builds every image as `<registry>/<name>:<tag>` from the repository root.
pub fn images(root: &Path, registry: &str, tag: &str, builder: Option<&str>) -> Result<(), String> {
    let builder = find_builder(builder)?;
    for (name, dockerfile) in IMAGES {
        let reference = format!("{}/{name}:{tag}", registry.trim_end_matches('/'));
        let file = root.join("images").join(dockerfile);
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
