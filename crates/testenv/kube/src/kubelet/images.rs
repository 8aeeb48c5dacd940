//! Image references → local programs. The test kubelet pulls nothing: an image is a set of
//! directories put first on `PATH` plus the image's entrypoint.

use std::path::{Path, PathBuf};

/// How one family of images runs locally.
#[derive(Debug, Clone)]
pub struct LocalImage {
    /// A short label for messages, e.g. `tailscale`.
    pub label: String,
    matcher: ImageMatcher,
    /// Searched first for the entrypoint and `command[0]`, and put first on the container's PATH.
    pub path_dirs: Vec<PathBuf>,
    /// The image's ENTRYPOINT (program name looked up in `path_dirs`).
    pub entrypoint: Vec<String>,
    /// The image's ENV: set before the pod's own variables, which override it.
    pub env: Vec<(String, String)>,
    /// Added to "program not found" errors, e.g. how to build the missing binary.
    pub hint: Option<String>,
}

/// Which image references a [`LocalImage`] stands for.
#[derive(Debug, Clone)]
pub enum ImageMatcher {
    /// The repository (reference without registry-less tag/digest) ends with this path,
    /// e.g. `tailscale/tailscale` matches `ghcr.io/tailscale/tailscale:v1.102.5`.
    RepositorySuffix(String),
    /// The last path component of the repository starts with this, e.g. `tailnet-agent`.
    NamePrefix(String),
}

impl ImageMatcher {
    fn matches(&self, image: &str) -> bool {
        let repository = repository_of(image);
        match self {
            ImageMatcher::RepositorySuffix(suffix) => {
                repository == suffix || repository.ends_with(&format!("/{suffix}"))
            }
            ImageMatcher::NamePrefix(prefix) => repository
                .rsplit('/')
                .next()
                .is_some_and(|name| name.starts_with(prefix.as_str())),
        }
    }
}

/// `registry:5000/a/b:tag@sha256:…` → `registry:5000/a/b`.
fn repository_of(image: &str) -> &str {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last_slash = without_digest.rfind('/').map_or(0, |index| index + 1);
    match without_digest[last_slash..].find(':') {
        Some(colon) => &without_digest[..last_slash + colon],
        None => without_digest,
    }
}

impl LocalImage {
    pub fn new(
        label: &str,
        matcher: ImageMatcher,
        path_dirs: Vec<PathBuf>,
        entrypoint: &[&str],
    ) -> Self {
        Self {
            label: label.to_string(),
            matcher,
            path_dirs,
            entrypoint: entrypoint.iter().map(|arg| arg.to_string()).collect(),
            env: Vec::new(),
            hint: None,
        }
    }

    /// Sets the hint shown when a program of the image cannot be found.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Adds an ENV default of the image.
    pub fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// A program of this image by name (or by the basename of an image path such as
    /// `/usr/local/bin/containerboot`), as a path inside the container (image directories are
    /// mounted at [`image_dir_in_container`]); host programs (`sh`) are the fallback.
    pub fn resolve_program(&self, program: &str) -> Option<PathBuf> {
        let name = Path::new(program).file_name()?.to_str()?;
        self.path_dirs
            .iter()
            .enumerate()
            .find(|(_, dir)| dir.join(name).is_file())
            .map(|(index, _)| image_dir_in_container(index).join(name))
            .or_else(|| {
                let as_given = Path::new(program);
                (as_given.is_absolute() && as_given.is_file()).then(|| as_given.to_path_buf())
            })
            .or_else(|| {
                HOST_PATH
                    .split(':')
                    .map(|dir| Path::new(dir).join(name))
                    .find(|candidate| candidate.is_file())
            })
    }

    /// The container's PATH: the image's directories, then the host's standard ones.
    pub fn path_env(&self) -> String {
        let mut parts: Vec<String> = (0..self.path_dirs.len())
            .map(|index| image_dir_in_container(index).display().to_string())
            .collect();
        parts.push(HOST_PATH.to_string());
        parts.join(":")
    }
}

/// Where the `index`th image directory appears inside containers. Binaries are mounted rather
/// than run from their host paths, which non-root users may not be allowed to traverse
/// (`/root/.cache/...`).
pub fn image_dir_in_container(index: usize) -> PathBuf {
    PathBuf::from(format!("/.tno-image/{index}"))
}

const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The image table of a kubelet.
#[derive(Debug, Clone, Default)]
pub struct ImageTable {
    images: Vec<LocalImage>,
}

impl ImageTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an entry; earlier entries win.
    pub fn with(mut self, image: LocalImage) -> Self {
        self.images.push(image);
        self
    }

    pub fn add(&mut self, image: LocalImage) {
        self.images.push(image);
    }

    pub fn lookup(&self, image: &str) -> Option<&LocalImage> {
        self.images
            .iter()
            .find(|entry| entry.matcher.matches(image))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_drops_tag_and_digest_but_keeps_registry_port() {
        assert_eq!(
            repository_of("tailscale/tailscale:v1.102.5"),
            "tailscale/tailscale"
        );
        assert_eq!(
            repository_of("localhost:5000/x/tailnet-agent:dev@sha256:abc"),
            "localhost:5000/x/tailnet-agent"
        );
        assert_eq!(repository_of("coredns"), "coredns");
    }

    #[test]
    fn matchers_accept_registry_variants() {
        let tailscale = ImageMatcher::RepositorySuffix("tailscale/tailscale".into());
        assert!(tailscale.matches("ghcr.io/tailscale/tailscale:v1.102.5"));
        assert!(tailscale.matches("tailscale/tailscale"));
        assert!(!tailscale.matches("ghcr.io/other/tailscale:v1"));
        let agent = ImageMatcher::NamePrefix("tailnet-agent".into());
        assert!(agent.matches("ghcr.io/tailnet-operator/tailnet-agent:0.1.0"));
        assert!(!agent.matches("ghcr.io/tailnet-agent/other:0.1.0"));
    }
}
