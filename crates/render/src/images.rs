//! Default images. The tailscale version here must match `deps/versions.env`
//! (`TAILSCALE_VERSION`), which is what the tests run.

use tailnet_api::tailnet::AgentOverrides;

/// Official tailscale image (the agent pod runs its `/usr/local/bin/tailscaled`, not its
/// containerboot entrypoint), pinned by version and digest (the multi-arch
/// index of v1.102.5; the same index is published to ghcr.io and Docker Hub). This is the one
/// place it is pinned; the Tailnet's `spec.agent.tailscaleImage` or the chart's values override it.
pub const DEFAULT_TAILSCALE_IMAGE: &str = "ghcr.io/tailscale/tailscale:v1.102.5@sha256:c507f3a2a6ab1cabd8d809b98edeb41edbd5c3fb6ad9632ffd098b4c7d0b4065";
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
