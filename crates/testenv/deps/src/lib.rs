//! Where `deps/build.sh` puts the pinned third-party binaries:
//! `${TNO_DEPS_DIR:-$HOME/.cache/tailnet-operator/deps}/<component>-<version>/bin/<binary>`,
//! versions from `deps/versions.env`; `TNO_BIN_<BINARY>` (as `deps/build.sh --print-env`
//! prints them) overrides one binary. Components that provide files rather than programs keep
//! them beside: `<component>-<version>/crds/` (the Gateway API CRDs: [`gateway_api_crds`],
//! overridden by `TNO_GATEWAY_API_CRDS`).
//!
//! Standard library only: `cargo xtask` (release tooling) finds helm here without pulling in
//! the test environment's dependencies (kube, hyper, rustls, nix, ...), and the test
//! environment (`tno_testenv_kube::binaries`) builds on it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// A binary that is nowhere to be found, with every place that was tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    pub binary: String,
    /// What was tried, in order (paths, or why a place could not be tried).
    pub tried: Vec<String>,
}

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} not found (tried {}); build it with deps/build.sh or set {}",
            self.binary,
            self.tried.join(", "),
            override_var(&self.binary)
        )
    }
}

impl std::error::Error for NotFound {}

/// `TNO_BIN_<NAME>`, e.g. `TNO_BIN_KUBE_APISERVER` for `kube-apiserver`.
pub fn override_var(binary: &str) -> String {
    format!("TNO_BIN_{}", binary.to_uppercase().replace('-', "_"))
}

/// The cache root: `TNO_DEPS_DIR`, else `$HOME/.cache/tailnet-operator/deps`; `None` without
/// either variable.
pub fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("TNO_DEPS_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".cache/tailnet-operator/deps"))
        })
}

/// The variable that names the Gateway API CRD directory (as `deps/build.sh --print-env`
/// prints it).
pub const GATEWAY_API_CRDS_VAR: &str = "TNO_GATEWAY_API_CRDS";

/// `KEY=VALUE` lines of `deps/versions.env`; comments and anything else are ignored (same
/// rule as `deps/build.sh`).
pub fn parse_versions(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.trim().to_string(), value.trim().to_string()))
        .filter(|(key, value)| !key.is_empty() && !value.is_empty())
        .collect()
}

/// The version of `component` the tests use: `TNO_<COMPONENT>_VERSION` from the environment
/// (a version-matrix run, e.g. `TNO_HEADSCALE_VERSION=v0.29.2`; `deps/build.sh` reads the same
/// variable), else the pinned one (`HELM_VERSION` for `helm`, `KUBE_ROUTER_VERSION` for
/// `kube-router`) from `<workspace>/deps/versions.env`. `cert-manager-controller` (our wrapper
/// main over cert-manager's controller packages) has cert-manager's version,
/// `gateway-api-conformance` (the suite and its echo-basic backend) gateway-api's.
pub fn pinned_version(workspace: &Path, component: &str) -> Result<String, String> {
    let key = version_key(component);
    if let Some(version) = std::env::var(format!("TNO_{key}"))
        .ok()
        .filter(|v| !v.is_empty())
    {
        return Ok(version);
    }
    let path = workspace.join("deps/versions.env");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_versions(&text)
        .remove(&key)
        .ok_or_else(|| format!("{key} missing from {}", path.display()))
}

/// The `deps/versions.env` key of `component` (as `version_key` in `deps/build.sh`).
pub fn version_key(component: &str) -> String {
    match component {
        "cert-manager-controller" => "CERT_MANAGER_VERSION".to_string(),
        "gateway-api-conformance" => "GATEWAY_API_VERSION".to_string(),
        "tailscale-minimal" => "TAILSCALE_VERSION".to_string(),
        _ => format!("{}_VERSION", component.to_uppercase().replace('-', "_")),
    }
}

/// Where `deps/build.sh` puts everything of `component`: `<cache>/<component>-<version>` (not
/// checked for existence).
pub fn component_dir(workspace: &Path, component: &str) -> Result<PathBuf, String> {
    let version = pinned_version(workspace, component)?;
    let cache = cache_dir().ok_or("neither TNO_DEPS_DIR nor HOME is set")?;
    Ok(cache.join(format!("{component}-{version}")))
}

/// Where `deps/build.sh` puts `binary` of `component`: `<cache>/<component>-<version>/bin/<binary>`
/// (not checked for existence).
pub fn cached(workspace: &Path, component: &str, binary: &str) -> Result<PathBuf, String> {
    Ok(component_dir(workspace, component)?
        .join("bin")
        .join(binary))
}

/// The directory of the Gateway API Standard-channel files (`deps/build.sh gateway-api`: one
/// CRD per `*.yaml`, plus the upstream safe-upgrades ValidatingAdmissionPolicy):
/// `TNO_GATEWAY_API_CRDS` if set, else `<cache>/gateway-api-<version>/crds` (not checked for
/// existence).
pub fn gateway_api_crds(workspace: &Path) -> Result<PathBuf, String> {
    gateway_api_crds_with(
        std::env::var_os(GATEWAY_API_CRDS_VAR).as_deref(),
        component_dir(workspace, "gateway-api"),
    )
}

/// [`gateway_api_crds`] with its inputs given: the override, the component's cache directory.
fn gateway_api_crds_with(
    override_dir: Option<&OsStr>,
    component_dir: Result<PathBuf, String>,
) -> Result<PathBuf, String> {
    match override_dir.filter(|dir| !dir.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => Ok(component_dir?.join("crds")),
    }
}

/// `binary` of `component`: `TNO_BIN_<BINARY>` if set, else the pinned build in the deps
/// cache, else (last resort, any version) the first `binary` on `PATH`. Only existing files
/// count.
pub fn find(workspace: &Path, component: &str, binary: &str) -> Result<PathBuf, NotFound> {
    let path_var = std::env::var_os("PATH");
    find_with(
        std::env::var_os(override_var(binary)).as_deref(),
        cached(workspace, component, binary),
        path_var.as_deref(),
        binary,
    )
}

/// helm (chart lint, template, install, package, push): see [`find`].
pub fn helm(workspace: &Path) -> Result<PathBuf, NotFound> {
    find(workspace, "helm", "helm")
}

/// The variable `deps/build.sh --print-env` names the minimal tailscaled build with (the
/// binary is called `tailscaled` like the full build's, so it has a variable of its own).
pub const TAILSCALED_MINIMAL_VAR: &str = "TNO_BIN_TAILSCALED_MINIMAL";

/// Where the agent pods' tailscaled is (`deps/build.sh tailscale-minimal`, the
/// `tailnet-tailscaled` image's program): `TNO_BIN_TAILSCALED_MINIMAL` if set, else the
/// pinned build in the deps cache (not checked for existence). Never a `tailscaled` on `PATH`
/// (that one is a full build, or another version).
pub fn tailscaled_minimal_path(workspace: &Path) -> Result<PathBuf, String> {
    match std::env::var_os(TAILSCALED_MINIMAL_VAR) {
        Some(path) => Ok(PathBuf::from(path)),
        None => cached(workspace, "tailscale-minimal", "tailscaled"),
    }
}

/// [`tailscaled_minimal_path`] when that file exists; the error names the path and how to
/// build it.
pub fn tailscaled_minimal(workspace: &Path) -> Result<PathBuf, String> {
    let path = tailscaled_minimal_path(workspace)?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "the minimal tailscaled not found at {}; build it with `bash deps/build.sh \
             tailscale-minimal` or set {TAILSCALED_MINIMAL_VAR}",
            path.display()
        ))
    }
}

/// [`find`] with its inputs given: the override, the cache path, `PATH`.
fn find_with(
    override_path: Option<&OsStr>,
    cached: Result<PathBuf, String>,
    path_var: Option<&OsStr>,
    binary: &str,
) -> Result<PathBuf, NotFound> {
    let mut tried = Vec::new();
    if let Some(path) = override_path {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        tried.push(format!("{}={}", override_var(binary), path.display()));
    }
    match cached {
        Ok(path) if path.is_file() => return Ok(path),
        Ok(path) => tried.push(path.display().to_string()),
        Err(why) => tried.push(format!("the deps cache ({why})")),
    }
    if let Some(path_var) = path_var
        && let Some(found) = std::env::split_paths(path_var)
            .map(|dir| dir.join(binary))
            .find(|candidate| candidate.is_file())
    {
        return Ok(found);
    }
    tried.push(format!("{binary} on PATH"));
    Err(NotFound {
        binary: binary.to_string(),
        tried,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_wrapper_shares_cert_managers_version_key() {
        assert_eq!(
            version_key("cert-manager-controller"),
            "CERT_MANAGER_VERSION"
        );
        assert_eq!(version_key("cert-manager"), "CERT_MANAGER_VERSION");
        assert_eq!(version_key("kube-router"), "KUBE_ROUTER_VERSION");
        assert_eq!(version_key("tailscale-minimal"), "TAILSCALE_VERSION");
    }

    #[test]
    fn the_conformance_suite_shares_gateway_apis_version_key() {
        assert_eq!(
            version_key("gateway-api-conformance"),
            "GATEWAY_API_VERSION"
        );
        assert_eq!(version_key("gateway-api"), "GATEWAY_API_VERSION");
    }

    #[test]
    fn gateway_api_crds_come_from_the_override_else_the_component_dir() {
        let component = Ok(PathBuf::from("/cache/gateway-api-v1.6.3"));
        assert_eq!(
            gateway_api_crds_with(Some(OsStr::new("/elsewhere/crds")), component.clone()),
            Ok(PathBuf::from("/elsewhere/crds"))
        );
        assert_eq!(
            gateway_api_crds_with(None, component.clone()),
            Ok(PathBuf::from("/cache/gateway-api-v1.6.3/crds"))
        );
        // An empty variable is unset (as `VAR= cmd` leaves it), not the current directory.
        assert_eq!(
            gateway_api_crds_with(Some(OsStr::new("")), component),
            Ok(PathBuf::from("/cache/gateway-api-v1.6.3/crds"))
        );
        assert_eq!(
            gateway_api_crds_with(None, Err("no HOME".into())),
            Err("no HOME".to_string())
        );
    }

    #[test]
    fn the_pinned_gateway_api_version_is_read_from_versions_env() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
        let version = pinned_version(&workspace, "gateway-api-conformance").expect("pinned");
        assert!(version.starts_with("v1."), "{version}");
        assert_eq!(
            pinned_version(&workspace, "gateway-api").expect("pinned"),
            version
        );
    }

    #[test]
    fn versions_file_lines_become_a_map() {
        let versions =
            parse_versions("# comment\nKUBERNETES_VERSION=v1.36.3\n\nETCD_VERSION=v3.6.16\n");
        assert_eq!(
            versions.get("KUBERNETES_VERSION").map(String::as_str),
            Some("v1.36.3")
        );
        assert_eq!(
            versions.get("ETCD_VERSION").map(String::as_str),
            Some("v3.6.16")
        );
        assert_eq!(versions.len(), 2);
    }

    #[test]
    fn override_then_cache_then_path() {
        let dir = std::env::temp_dir().join(format!("tno-deps-test-{}", std::process::id()));
        let (explicit, cache, on_path) =
            (dir.join("explicit"), dir.join("cache"), dir.join("path"));
        for d in [&explicit, &cache, &on_path] {
            std::fs::create_dir_all(d).expect("dir");
            std::fs::write(d.join("helm"), "").expect("file");
        }
        let path_var = std::env::join_paths([dir.join("empty"), on_path.clone()]).expect("PATH");
        let find = |override_path: Option<&Path>, cached: Result<PathBuf, String>| {
            find_with(
                override_path.map(Path::as_os_str),
                cached,
                Some(&path_var),
                "helm",
            )
        };
        let in_cache = Ok(cache.join("helm"));
        let missing = Ok(dir.join("missing/helm"));
        assert_eq!(
            find(Some(&explicit.join("helm")), in_cache.clone()),
            Ok(explicit.join("helm"))
        );
        assert_eq!(find(None, in_cache.clone()), Ok(cache.join("helm")));
        // A stale override does not hide the cache.
        assert_eq!(
            find(Some(&dir.join("gone")), in_cache),
            Ok(cache.join("helm"))
        );
        assert_eq!(find(None, missing.clone()), Ok(on_path.join("helm")));
        assert_eq!(find(None, Err("no HOME".into())), Ok(on_path.join("helm")));
        let error = find_with(None, missing, None, "helm").expect_err("nowhere");
        assert_eq!(error.tried.len(), 2, "{error}");
        assert!(error.to_string().contains("TNO_BIN_HELM"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
