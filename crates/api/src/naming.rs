//! Names derived from the declarations: tags, agent objects, labels.
//!
//! Every name here must stay a valid Kubernetes/Headscale name whatever the input length, so
//! long names are shortened with a stable hash suffix instead of being rejected.

use sha2::{Digest, Sha256};

/// Maximum length of a tag's name (after `tag:`) and of a Kubernetes label value.
pub const MAX_NAME: usize = 63;
/// Agent object names leave room for ReplicaSet/Pod suffixes (`-<hash>-<rand>`).
pub const MAX_AGENT_NAME: usize = 47;

/// Shortens `name` to `max` characters by keeping a prefix and appending `-` + 8 hex digits of
/// the SHA-256 of the full name. Names that fit are returned unchanged.
pub fn shorten(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_string();
    }
    let digest = Sha256::digest(name.as_bytes());
    let suffix: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let keep = max.saturating_sub(suffix.len() + 1);
    let prefix = name[..keep].trim_end_matches('-');
    format!("{prefix}-{suffix}")
}

/// Tag of the node of a TailnetEgress: `tag:<prefix>-egress-<name>` (egresses only live in
/// the operator namespace, so the name is unique).
pub fn egress_tag(prefix: &str, name: &str) -> String {
    format!(
        "tag:{}",
        shorten(&format!("{prefix}-egress-{name}").to_lowercase(), MAX_NAME)
    )
}

/// Tag of the node of a TailnetIngress: `tag:<prefix>-ingress-<namespace>-<name>`.
pub fn ingress_tag(prefix: &str, namespace: &str, name: &str) -> String {
    format!(
        "tag:{}",
        shorten(
            &format!("{prefix}-ingress-{namespace}-{name}").to_lowercase(),
            MAX_NAME
        )
    )
}

/// Which kind of agent a set of objects belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentKind {
    Egress,
    Ingress,
}

impl AgentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Egress => "egress",
            AgentKind::Ingress => "ingress",
        }
    }

    pub fn resource_kind(self) -> &'static str {
        match self {
            AgentKind::Egress => "TailnetEgress",
            AgentKind::Ingress => "TailnetIngress",
        }
    }
}

/// Names of the objects of one agent; all live in the owning resource's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentNames {
    /// Deployment, ServiceAccount, Role, RoleBinding and NetworkPolicy name; also the
    /// tailnet hostname of the node.
    pub base: String,
    /// Secret containerboot keeps the node state in (`TS_KUBE_SECRET`).
    pub state_secret: String,
    /// Secret holding the single-use pre-auth key while the node does not exist yet.
    pub auth_secret: String,
    /// ConfigMap with the agent's config.
    pub config: String,
    /// TLS Secret (and cert-manager Certificate) for ingress http exposes.
    pub tls: String,
}

impl AgentNames {
    pub fn new(kind: AgentKind, resource_name: &str) -> Self {
        let base = shorten(
            &format!("tailnet-{}-{resource_name}", kind.as_str()),
            MAX_AGENT_NAME,
        );
        Self {
            state_secret: format!("{base}-state"),
            auth_secret: format!("{base}-auth"),
            config: format!("{base}-config"),
            tls: format!("{base}-tls"),
            base,
        }
    }
}

/// Label keys set on every object the operator creates.
pub mod labels {
    pub const NAME: &str = "app.kubernetes.io/name";
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    pub const PART_OF: &str = "app.kubernetes.io/part-of";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const OWNER_KIND: &str = "tailnet-operator.dev/owner-kind";
    pub const OWNER_NAME: &str = "tailnet-operator.dev/owner-name";
    pub const TAILNET: &str = "tailnet-operator.dev/tailnet";
    /// Annotation carrying the hash of the agent config, so a config change rolls the pod.
    pub const CONFIG_HASH: &str = "tailnet-operator.dev/config-hash";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_unchanged() {
        assert_eq!(egress_tag("tno", "team-a"), "tag:tno-egress-team-a");
        assert_eq!(
            ingress_tag("tno", "team-a", "portal"),
            "tag:tno-ingress-team-a-portal"
        );
        assert_eq!(
            AgentNames::new(AgentKind::Egress, "team-a").base,
            "tailnet-egress-team-a"
        );
    }

    #[test]
    fn long_names_are_hashed_and_bounded() {
        let ns = "a".repeat(63);
        let name = "b".repeat(63);
        let tag = ingress_tag("tno", &ns, &name);
        let body = tag.strip_prefix("tag:").expect("tag prefix");
        assert_eq!(body.len(), MAX_NAME);
        assert!(body.starts_with("tno-ingress-aaaa"));
        // Stable and distinct for distinct inputs.
        assert_eq!(tag, ingress_tag("tno", &ns, &name));
        assert_ne!(tag, ingress_tag("tno", &ns, &"c".repeat(63)));
        let names = AgentNames::new(AgentKind::Ingress, &name);
        assert!(names.base.len() <= MAX_AGENT_NAME);
        assert!(names.state_secret.len() <= 63);
    }

    #[test]
    fn shortening_never_leaves_double_dash_before_hash() {
        let name = format!("{}-{}", "x".repeat(53), "y".repeat(20));
        let short = shorten(&name, 63);
        assert!(short.len() <= 63);
        assert!(!short.contains("--"));
    }

    #[test]
    fn tags_are_lowercased() {
        assert_eq!(egress_tag("tno", "Team-A"), "tag:tno-egress-team-a");
    }
}
