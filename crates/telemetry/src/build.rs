//! `<prefix>_build_info{version,git_commit,rustc_version,target} 1`, the usual way to see
//! which build runs where (`count by (version) (tailnet_agent_build_info)`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Commit of the source tree at build time (`TNO_GIT_COMMIT`, else `git rev-parse HEAD`;
/// `unknown` without either).
pub const GIT_COMMIT: &str = env!("TNO_BUILD_GIT_COMMIT");
/// `rustc --version`'s version.
pub const RUSTC_VERSION: &str = env!("TNO_BUILD_RUSTC_VERSION");
/// The target triple, e.g. `x86_64-unknown-linux-musl`.
pub const TARGET: &str = env!("TNO_BUILD_TARGET");

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
    pub git_commit: String,
    pub rustc_version: String,
    pub target: String,
}

impl BuildLabels {
    pub fn of(version: &str) -> Self {
        BuildLabels {
            version: version.to_string(),
            git_commit: GIT_COMMIT.to_string(),
            rustc_version: RUSTC_VERSION.to_string(),
            target: TARGET.to_string(),
        }
    }
}

/// Registers `build_info` (value 1) in `registry` (the binary's prefixed registry).
pub fn register(registry: &mut Registry, version: &str) {
    let info = Family::<BuildLabels, Gauge>::default();
    info.get_or_create(&BuildLabels::of(version)).set(1);
    registry.register(
        "build_info",
        "Always 1; the labels name the build: version, git commit, rustc version and target",
        info,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::Format;

    #[test]
    fn build_info_names_version_commit_rustc_and_target() {
        let mut registry = Registry::default();
        register(registry.sub_registry_with_prefix("x"), "1.2.3");
        let text = Format::Prometheus.encode(&registry).expect("text");
        let sample = format!(
            "x_build_info{{version=\"1.2.3\",git_commit=\"{GIT_COMMIT}\",rustc_version=\"{RUSTC_VERSION}\",target=\"{TARGET}\"}} 1"
        );
        assert!(text.contains(&sample), "{text}");
        assert!(text.contains("# TYPE x_build_info gauge"), "{text}");
        // Built from this repository: git was there.
        assert!(
            GIT_COMMIT == "unknown"
                || GIT_COMMIT.trim_end_matches("-dirty").len() == 40
                    && GIT_COMMIT.chars().take(40).all(|c| c.is_ascii_hexdigit()),
            "{GIT_COMMIT}"
        );
        assert!(RUSTC_VERSION.split('.').count() >= 3, "{RUSTC_VERSION}");
        assert!(TARGET.contains('-'), "{TARGET}");
    }
}
