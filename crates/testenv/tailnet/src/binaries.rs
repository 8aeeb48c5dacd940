//! Where the pinned third-party binaries are: `deps/build.sh` builds them into
//! `${TNO_DEPS_DIR:-$HOME/.cache/tailnet-operator/deps}/<component>-<version>/bin/`, with versions
//! from `deps/versions.env`. `TNO_BIN_<NAME>` (as printed by `deps/build.sh --print-env`)
//! overrides a single binary.

use std::path::{Path, PathBuf};

use crate::error::{Result, TailnetError};

const VERSIONS_ENV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../deps/versions.env");

/// Paths of the binaries this crate runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub headscale: PathBuf,
    pub tailscaled: PathBuf,
    pub tailscale: PathBuf,
}

impl Binaries {
    /// Finds the binaries and checks that they exist.
    pub fn locate() -> Result<Binaries> {
        let versions_path = Path::new(VERSIONS_ENV);
        let versions =
            std::fs::read_to_string(versions_path).map_err(|source| TailnetError::Versions {
                path: versions_path.to_owned(),
                source,
            })?;
        let deps_dir = std::env::var_os("TNO_DEPS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let home = std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_default();
                home.join(".cache/tailnet-operator/deps")
            });
        // A matrix run's `TNO_<KEY>` (e.g. `TNO_HEADSCALE_VERSION=v0.29.2`) wins, as in
        // `deps/build.sh`.
        let pinned = |key: &'static str| {
            std::env::var(format!("TNO_{key}"))
                .ok()
                .filter(|v| !v.is_empty())
                .or_else(|| pinned_version(&versions, key))
                .ok_or_else(|| TailnetError::VersionNotPinned {
                    path: versions_path.to_owned(),
                    key,
                })
        };
        let headscale_dir = deps_dir.join(format!("headscale-{}", pinned("HEADSCALE_VERSION")?));
        let tailscale_dir = deps_dir.join(format!("tailscale-{}", pinned("TAILSCALE_VERSION")?));
        Ok(Binaries {
            headscale: binary("headscale", "TNO_BIN_HEADSCALE", &headscale_dir)?,
            tailscaled: binary("tailscaled", "TNO_BIN_TAILSCALED", &tailscale_dir)?,
            tailscale: binary("tailscale", "TNO_BIN_TAILSCALE", &tailscale_dir)?,
        })
    }
}

fn binary(name: &'static str, env_var: &'static str, component_dir: &Path) -> Result<PathBuf> {
    let path = std::env::var_os(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| component_dir.join("bin").join(name));
    if path.is_file() {
        Ok(path)
    } else {
        Err(TailnetError::MissingBinary {
            component: name,
            path,
            env_var,
        })
    }
}

/// `KEY=VALUE` lookup in `versions.env` (plain lines, `#` comments).
fn pinned_version(versions: &str, key: &str) -> Option<String> {
    versions
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .find(|(name, _)| name.trim() == key)
        .map(|(_, value)| value.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_plain_key_value_lines() {
        let text = "# comment\nHEADSCALE_VERSION=v0.29.2\nTAILSCALE_VERSION = v1.102.5\n";
        assert_eq!(
            pinned_version(text, "HEADSCALE_VERSION").as_deref(),
            Some("v0.29.2")
        );
        assert_eq!(
            pinned_version(text, "TAILSCALE_VERSION").as_deref(),
            Some("v1.102.5")
        );
        assert_eq!(pinned_version(text, "ETCD_VERSION"), None);
    }
}
