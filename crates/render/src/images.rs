//! Default images: this release's `tailnet-agent` and `tailnet-tailscaled` (both built and
//! published by `cargo xtask images` and the release workflow; the latter is tailscale's
//! `tailscaled` at `TAILSCALE_VERSION` of `deps/versions.env`, the build the tests run).

use tailnet_api::tailnet::AgentOverrides;

/// The tailscale container's image of this release: `tailnet-tailscaled`, tailscale's
/// `tailscaled` with only the features an agent pod uses (`deps/build.sh tailscale-minimal`;
/// 32 MiB idle instead of 44 MiB with the official image's full build, docs/benchmarks.md).
/// The pod runs `/usr/local/bin/tailscaled` (not an entrypoint), so the official
/// `ghcr.io/tailscale/tailscale` image of the same version is a drop-in replacement through the
/// Tailnet's `spec.agent.tailscaleImage`, the operator's `--tailscale-image` or the chart's
/// `agent.tailscaleImage`.
pub const DEFAULT_TAILSCALE_IMAGE: &str = concat!(
    "ghcr.io/tailnet-operator/tailnet-tailscaled:v",
    env!("CARGO_PKG_VERSION")
);
/// The agent image of this release.
pub const DEFAULT_AGENT_IMAGE: &str = concat!(
    "ghcr.io/tailnet-operator/tailnet-agent:v",
    env!("CARGO_PKG_VERSION")
);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    pub agent: String,
    pub tailscale: String,
    /// `imagePullPolicy` of the tailnet-agent container (`None`: Kubernetes' default).
    pub agent_pull_policy: Option<String>,
    /// `imagePullPolicy` of the tailscale container (`None`: Kubernetes' default).
    pub tailscale_pull_policy: Option<String>,
}

impl Images {
    /// Defaults (possibly replaced by operator flags), then the Tailnet's overrides.
    pub fn resolve(defaults: &Images, overrides: Option<&AgentOverrides>) -> Images {
        Images {
            agent: overrides
                .and_then(|o| o.image.clone())
                .unwrap_or_else(|| defaults.agent.clone()),
            tailscale: overrides
                .and_then(|o| o.tailscale_image.clone())
                .unwrap_or_else(|| defaults.tailscale.clone()),
            agent_pull_policy: defaults.agent_pull_policy.clone(),
            tailscale_pull_policy: defaults.tailscale_pull_policy.clone(),
        }
    }
}

impl Default for Images {
    fn default() -> Self {
        Images {
            agent: DEFAULT_AGENT_IMAGE.to_string(),
            tailscale: DEFAULT_TAILSCALE_IMAGE.to_string(),
            agent_pull_policy: None,
            tailscale_pull_policy: None,
        }
    }
}
