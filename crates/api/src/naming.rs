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
    entrance_tag(AgentKind::Ingress, prefix, namespace, name)
}

/// The word of an entrance kind in its tags: `ingress` (TailnetIngress), `svc` (Service of
/// the tailnet `loadBalancerClass`). Distinct words keep the readable forms of different
/// kinds apart.
fn tag_word(kind: AgentKind) -> &'static str {
    match kind {
        AgentKind::Service => "svc",
        AgentKind::Egress => "egress",
        AgentKind::Ingress => "ingress",
        AgentKind::Gateway => "gw",
    }
}

/// Readable tag of an entrance (an object of kind `kind` reached from the tailnet):
/// `tag:<prefix>-ingress-<namespace>-<name>` for a TailnetIngress,
/// `tag:<prefix>-svc-<namespace>-<name>` for a Service.
pub fn entrance_tag(kind: AgentKind, prefix: &str, namespace: &str, name: &str) -> String {
    format!(
        "tag:{}",
        shorten(
            &format!("{prefix}-{}-{namespace}-{name}", tag_word(kind)).to_lowercase(),
            MAX_NAME
        )
    )
}

/// The tag of an ingress that must not take [`ingress_tag`]: the dash-joined form is
/// ambiguous (`team-a/dev-api` and `team-a-dev/api` both join to `team-a-dev-api`), so this
/// form appends `-` + 10 hex digits of the SHA-256 of the unambiguous tuple
/// (`ingress`, prefix, namespace, name, NUL-separated), shortening the readable part so the
/// whole stays ≤ 63 characters. Distinct tuples give distinct tags (up to a 40-bit hash
/// collision, which [`assign_ingress_tags`] still detects and reports).
pub fn ingress_tag_discriminated(prefix: &str, namespace: &str, name: &str) -> String {
    entrance_tag_discriminated(AgentKind::Ingress, prefix, namespace, name)
}

/// [`ingress_tag_discriminated`] of an entrance of kind `kind` (the kind is part of the
/// hashed tuple: `ingress` or `service`).
pub fn entrance_tag_discriminated(
    kind: AgentKind,
    prefix: &str,
    namespace: &str,
    name: &str,
) -> String {
    let digest =
        Sha256::digest(format!("{}\0{prefix}\0{namespace}\0{name}", kind.as_str()).as_bytes());
    let suffix: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let readable = format!("{prefix}-{}-{namespace}-{name}", tag_word(kind)).to_lowercase();
    let keep = MAX_NAME - suffix.len() - 1;
    let readable = readable[..readable.len().min(keep)].trim_end_matches('-');
    format!("tag:{readable}-{suffix}")
}

/// The tailnet hostname of the node that carries `tag`: the tag's name (`tag:` removed). Tags
/// are lowercase letters, digits and dashes of at most 63 characters, so this is a valid DNS
/// label, and it is unique wherever the tag is.
pub fn tag_hostname(tag: &str) -> String {
    tag.strip_prefix("tag:").unwrap_or(tag).to_string()
}

/// Who asks for an entrance tag: its kind (`Ingress` or `Service`), namespace and name.
pub type TagKey = (AgentKind, String, String);

/// One entrance (ingress or Service) asking for a tag, for [`assign_ingress_tags`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagClaim {
    pub kind: AgentKind,
    pub namespace: String,
    pub name: String,
    /// The tag its status records (what its node carries today), if any.
    pub current: Option<String>,
}

/// The tag of every ingress of one Tailnet, injective over (namespace, name). `claims` come in
/// first-claim order (creation time, then namespace/name). Upgrade-safe: an ingress keeps the
/// tag its status records when that is one of its own two forms and nobody earlier took it;
/// otherwise it gets today's [`ingress_tag`] unless an earlier claim holds that string, then
/// the [`ingress_tag_discriminated`] form. `Err(holder)`: even that is taken (a hash
/// collision), `holder` is `namespace/name` of the ingress that has it; the later one gets no
/// tag and must touch nothing.
pub fn assign_ingress_tags(
    prefix: &str,
    claims: &[TagClaim],
) -> std::collections::BTreeMap<TagKey, Result<String, String>> {
    use std::collections::BTreeMap;
    let mut taken: BTreeMap<String, String> = BTreeMap::new();
    let mut out: BTreeMap<TagKey, Result<String, String>> = BTreeMap::new();
    let key = |c: &TagClaim| (c.kind, c.namespace.clone(), c.name.clone());
    let holder = |c: &TagClaim| match c.kind {
        AgentKind::Service => format!("Service {}/{}", c.namespace, c.name),
        _ => format!("{}/{}", c.namespace, c.name),
    };
    // Recorded tags first: the nodes that exist keep their identity.
    for c in claims {
        let own = [
            entrance_tag(c.kind, prefix, &c.namespace, &c.name),
            entrance_tag_discriminated(c.kind, prefix, &c.namespace, &c.name),
        ];
        if let Some(current) = c.current.as_ref().filter(|t| own.contains(t))
            && !taken.contains_key(current)
            && !out.contains_key(&key(c))
        {
            taken.insert(current.clone(), holder(c));
            out.insert(key(c), Ok(current.clone()));
        }
    }
    for c in claims {
        if out.contains_key(&key(c)) {
            continue;
        }
        let legacy = entrance_tag(c.kind, prefix, &c.namespace, &c.name);
        let discriminated = entrance_tag_discriminated(c.kind, prefix, &c.namespace, &c.name);
        let result = if !taken.contains_key(&legacy) {
            Ok(legacy)
        } else if !taken.contains_key(&discriminated) {
            Ok(discriminated)
        } else {
            Err(taken[&discriminated].clone())
        };
        if let Ok(tag) = &result {
            taken.insert(tag.clone(), holder(c));
        }
        out.insert(key(c), result);
    }
    out
}

/// Which kind of agent a set of objects belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AgentKind {
    Egress,
    #[default]
    Ingress,
    /// A `Service` of the tailnet `loadBalancerClass` (read as an ingress).
    Service,
    /// A Gateway API `Gateway` of a GatewayClass of `tailnet-operator.dev/gateway`.
    Gateway,
}

impl AgentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Egress => "egress",
            AgentKind::Ingress => "ingress",
            AgentKind::Service => "service",
            AgentKind::Gateway => "gateway",
        }
    }

    pub fn resource_kind(self) -> &'static str {
        match self {
            AgentKind::Egress => "TailnetEgress",
            AgentKind::Ingress => "TailnetIngress",
            AgentKind::Service => "Service",
            AgentKind::Gateway => "Gateway",
        }
    }

    /// The owning resource's `apiVersion` (owner references of the agent's objects).
    pub fn api_version(self) -> String {
        match self {
            AgentKind::Service => "v1".to_string(),
            AgentKind::Gateway => "gateway.networking.k8s.io/v1".to_string(),
            AgentKind::Egress | AgentKind::Ingress => {
                format!("{}/{}", crate::GROUP, crate::VERSION)
            }
        }
    }
}

/// Names of the objects of one agent; all live in the owning resource's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentNames {
    /// Deployment, ServiceAccount, Role, RoleBinding and NetworkPolicy name; also the
    /// tailnet hostname of the node.
    pub base: String,
    /// Secret tailscaled keeps the node state in (`--state=kube:<secret>`).
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

    /// A small deterministic generator (no external crate): dash-heavy DNS labels.
    struct Labels(u64);

    impl Labels {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }

        fn label(&mut self, max: usize) -> String {
            let alphabet = b"ab-";
            let len = 1 + (self.next() as usize) % max;
            let mut s: String = (0..len)
                .map(|_| alphabet[(self.next() as usize) % alphabet.len()] as char)
                .collect();
            // DNS label: starts and ends alphanumeric.
            s.replace_range(0..1, "a");
            if s.ends_with('-') {
                s.pop();
                s.push('b');
            }
            s
        }
    }

    /// Property: whatever the lengths and dashes, distinct (namespace, name) pairs of one
    /// Tailnet get distinct tags (every tag ≤ 63 chars in Headscale's charset) and distinct
    /// agent objects; the first claim of a dash-joined string keeps today's tag.
    #[test]
    fn tags_and_agent_names_are_injective_over_namespace_and_name() {
        let mut g = Labels(0x5eed);
        for round in 0..400 {
            let mut seen = std::collections::BTreeSet::new();
            let mut claims = Vec::new();
            let size = 2 + (g.next() as usize) % 30;
            while claims.len() < size {
                // Short labels make the dash-joined forms collide often; long ones hash.
                let max = if round % 4 == 0 { 63 } else { 5 };
                let (ns, name) = (g.label(max), g.label(max));
                if seen.insert((ns.clone(), name.clone())) {
                    claims.push(TagClaim {
                        kind: AgentKind::Ingress,
                        namespace: ns,
                        name,
                        current: None,
                    });
                }
            }
            let tags = assign_ingress_tags("tno", &claims);
            let mut distinct = std::collections::BTreeMap::new();
            for c in &claims {
                let tag = tags[&(AgentKind::Ingress, c.namespace.clone(), c.name.clone())]
                    .clone()
                    .expect("a tag for every claim");
                let body = tag.strip_prefix("tag:").expect("tag:");
                assert!(body.len() <= MAX_NAME, "{tag}");
                assert!(
                    body.chars()
                        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-'),
                    "{tag}"
                );
                assert!(!body.ends_with('-') && !body.starts_with('-'), "{tag}");
                if let Some(other) = distinct.insert(tag.clone(), c.clone()) {
                    panic!("{other:?} and {c:?} share {tag}");
                }
                // Agent objects live in the resource's namespace: (namespace, base) is the
                // object identity, and base is injective over the name.
                let names = AgentNames::new(AgentKind::Ingress, &c.name);
                assert!(names.base.len() <= MAX_AGENT_NAME);
            }
            // The first claim of each joined string keeps today's tag.
            let mut first = std::collections::BTreeSet::new();
            for c in &claims {
                let legacy = ingress_tag("tno", &c.namespace, &c.name);
                let got = tags[&(AgentKind::Ingress, c.namespace.clone(), c.name.clone())]
                    .clone()
                    .expect("tag");
                if first.insert(legacy.clone()) {
                    assert_eq!(got, legacy, "the first claim keeps today's tag");
                } else {
                    assert_eq!(got, ingress_tag_discriminated("tno", &c.namespace, &c.name));
                }
            }
        }
        // Agent base names: injective over the name (per kind), long ones hashed.
        let mut g = Labels(7);
        let mut bases = std::collections::BTreeMap::new();
        for _ in 0..5000 {
            let name = g.label(63);
            let base = AgentNames::new(AgentKind::Ingress, &name).base;
            if let Some(other) = bases.insert(base.clone(), name.clone()) {
                assert_eq!(other, name, "two names share the agent name {base}");
            }
        }
    }

    /// The lab's pair: `team-x/dev-api` first, then `team-x-dev/api`. The first keeps today's
    /// tag; the second gets its own; recorded tags survive (an upgrade keeps the node).
    #[test]
    fn the_lab_pair_gets_two_identities_and_recorded_tags_stay() {
        let claim = |ns: &str, name: &str, current: Option<&str>| TagClaim {
            kind: AgentKind::Ingress,
            namespace: ns.into(),
            name: name.into(),
            current: current.map(str::to_string),
        };
        let first = ingress_tag("tno", "team-x", "dev-api");
        assert_eq!(
            first,
            ingress_tag("tno", "team-x-dev", "api"),
            "the old collision"
        );
        let tags = assign_ingress_tags(
            "tno",
            &[
                claim("team-x", "dev-api", None),
                claim("team-x-dev", "api", None),
            ],
        );
        let of = |ns: &str, n: &str| {
            tags[&(AgentKind::Ingress, ns.to_string(), n.to_string())]
                .clone()
                .expect("tag")
        };
        assert_eq!(of("team-x", "dev-api"), first);
        let second = of("team-x-dev", "api");
        assert_ne!(second, first);
        assert!(
            second.starts_with("tag:tno-ingress-team-x-dev-api-"),
            "{second}"
        );
        // Both recorded the old tag before the upgrade: the older keeps it.
        let tags = assign_ingress_tags(
            "tno",
            &[
                claim("team-x", "dev-api", Some(&first)),
                claim("team-x-dev", "api", Some(&first)),
            ],
        );
        assert_eq!(
            tags[&(AgentKind::Ingress, "team-x".into(), "dev-api".into())],
            Ok(first.clone())
        );
        assert_eq!(
            tags[&(AgentKind::Ingress, "team-x-dev".into(), "api".into())],
            Ok(second.clone())
        );
        // The older one is deleted: the newer keeps its recorded (discriminated) tag.
        let tags = assign_ingress_tags("tno", &[claim("team-x-dev", "api", Some(&second))]);
        assert_eq!(
            tags[&(AgentKind::Ingress, "team-x-dev".into(), "api".into())],
            Ok(second)
        );
        // A recorded tag that is not one of its own forms is ignored.
        let tags = assign_ingress_tags("tno", &[claim("team-a", "portal", Some("tag:other"))]);
        assert_eq!(
            tags[&(AgentKind::Ingress, "team-a".into(), "portal".into())],
            Ok("tag:tno-ingress-team-a-portal".to_string())
        );
    }

    #[test]
    fn tags_are_lowercased() {
        assert_eq!(egress_tag("tno", "Team-A"), "tag:tno-egress-team-a");
    }
}
