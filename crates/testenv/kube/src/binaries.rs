//! Where the pinned third-party binaries live (built by `deps/build.sh`, see `deps/versions.env`;
//! the lookup itself is `tno_deps`).

use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

/// Paths of every third-party program the environment runs.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_proxy: PathBuf,
    pub coredns: PathBuf,
    pub containerboot: PathBuf,
    pub tailscaled: PathBuf,
    pub tailscale: PathBuf,
    /// The agent pods' tailscaled (`deps/build.sh tailscale-minimal`: only the features an
    /// agent uses), what the `tailnet-tailscaled` image ships.
    pub tailscaled_minimal: PathBuf,
    /// kube-router, run only as the lab's NetworkPolicy enforcer (its firewall controller) by
    /// the tests that start one (`tno_testenv::E2eEnv::start_network_policy_enforcer`).
    pub kube_router: PathBuf,
    /// Directory holding cert-manager's CRD YAMLs.
    pub cert_manager_crds: PathBuf,
    /// `crane` (go-containerregistry): `crane registry serve` is the lab's OCI registry.
    pub crane: PathBuf,
}

/// The repository root (this crate lives in `crates/testenv/kube`); `TNO_WORKSPACE` overrides.
pub fn workspace_root() -> PathBuf {
    if let Some(root) = std::env::var_os("TNO_WORKSPACE") {
        return PathBuf::from(root);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

impl Binaries {
    /// Fails naming every program the Kubernetes environment cannot start without. (The
    /// tailscale programs are only needed by pods with the tailscale image; such pods report
    /// a missing program in their container status.)
    pub fn require_kubernetes(&self) -> Result<()> {
        // CoreDNS is checked when its pod starts (and only if cluster DNS is enabled).
        let programs = [
            &self.etcd,
            &self.kube_apiserver,
            &self.kube_controller_manager,
            &self.kube_proxy,
        ];
        let missing: Vec<String> = programs
            .iter()
            .filter(|path| !path.is_file())
            .map(|path| path.display().to_string())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::MissingBinary {
                name: missing.join(", "),
                hint: "build them with deps/build.sh (or set TNO_BIN_<NAME>)".into(),
            })
        }
    }

    /// Resolves paths the way `deps/build.sh` lays them out:
    /// `${TNO_DEPS_DIR:-~/.cache/tailnet-operator/deps}/<component>-<version>/bin/<binary>`.
    /// `TNO_BIN_<BINARY>` (e.g. `TNO_BIN_KUBE_APISERVER`) overrides a single binary. Paths are
    /// not checked here: see [`Binaries::require_all`].
    pub fn discover() -> Result<Self> {
        let root = workspace_root();
        let cache = tno_deps::cache_dir().ok_or_else(|| Error::MissingBinary {
            name: "deps cache".into(),
            hint: "neither TNO_DEPS_DIR nor HOME is set".into(),
        })?;
        // The pinned version, or a matrix run's `TNO_<COMPONENT>_VERSION`.
        let component_dir = |component: &str| -> Result<PathBuf> {
            let version = tno_deps::pinned_version(&root, component).map_err(|hint| {
                Error::MissingBinary {
                    name: component.into(),
                    hint,
                }
            })?;
            Ok(cache.join(format!("{component}-{version}")))
        };
        let binary = |component: &str, name: &str| -> Result<PathBuf> {
            let path = match std::env::var_os(tno_deps::override_var(name)) {
                Some(path) => PathBuf::from(path),
                None => component_dir(component)?.join("bin").join(name),
            };
            Ok(path)
        };
        Ok(Self {
            etcd: binary("etcd", "etcd")?,
            kube_apiserver: binary("kubernetes", "kube-apiserver")?,
            kube_controller_manager: binary("kubernetes", "kube-controller-manager")?,
            kube_proxy: binary("kubernetes", "kube-proxy")?,
            coredns: binary("coredns", "coredns")?,
            containerboot: binary("tailscale", "containerboot")?,
            tailscaled: binary("tailscale", "tailscaled")?,
            tailscale: binary("tailscale", "tailscale")?,
            tailscaled_minimal: tno_deps::tailscaled_minimal_path(&root).map_err(|hint| {
                Error::MissingBinary {
                    name: "tailscaled (tailscale-minimal)".into(),
                    hint,
                }
            })?,
            kube_router: binary("kube-router", "kube-router")?,
            cert_manager_crds: component_dir("cert-manager")?.join("crds"),
            crane: binary("crane", "crane")?,
        })
    }
}

/// `binary` of `component` (helm, promtool, ...): `TNO_BIN_<BINARY>`, the pinned build in the
/// deps cache, else (any version) `binary` on `PATH` ([`tno_deps::find`], the one lookup the
/// tests and `cargo xtask` share).
pub fn tool(component: &str, binary: &str) -> Result<PathBuf> {
    tno_deps::find(&workspace_root(), component, binary).map_err(|missing| Error::MissingBinary {
        name: binary.into(),
        hint: missing.to_string(),
    })
}

/// helm: see [`tool`].
pub fn helm() -> Result<PathBuf> {
    tool("helm", "helm")
}

/// Our own binaries (`tno-test-servers`, `tailnet-agent`): next to the running executable's
/// target directory (`target/<profile>/`), or named by `TNO_BIN_<NAME>`.
pub fn workspace_binary(name: &str) -> Result<PathBuf> {
    let override_var = tno_deps::override_var(name);
    if let Some(path) = std::env::var_os(&override_var) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().io_context(|| "locating the current executable".into())?;
    // Test binaries live in target/<profile>/deps, binaries in target/<profile>.
    let candidates = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(name))
        .collect::<Vec<_>>();
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .ok_or_else(|| Error::MissingBinary {
            name: name.into(),
            hint: format!(
                "looked at {candidates:?}; build it (cargo build -p <its package>) or set {override_var}"
            ),
        })
}
