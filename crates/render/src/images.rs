//! Default images. The tailscale version here must match `deps/versions.env`
//! (`TAILSCALE_VERSION`), which is what the tests run.

use tailnet_api::tailnet::AgentOverrides;

/// Official tailscale image (containerboot). Pin by digest in production via the Tailnet's
/// `spec.agent.tailscaleImage` or the chart's values.
pub const DEFAULT_TAILSCALE_IMAGE: &str = "ghcr.io/tailscale/tailscale:v1.102.5";
/// The agent image of this release.
pub const DEFAULT_AGENT_IMAGE: &str = concat!(
    "ghcr.io/tailnet-operator/tailnet-agent:v",
    env!("CARGO_PKG_VERSION")
);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    pub agent: String,
    pub tailscale: String,
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
        }
    }
}

impl Default for Images {
    fn default() -> Self {
        Images {
            agent: DEFAULT_AGENT_IMAGE.to_string(),
            tailscale: DEFAULT_TAILSCALE_IMAGE.to_string(),
        }
    }
}
