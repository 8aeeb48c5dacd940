//! Typed findings: per-resource issues (they block that resource's generated grants) and
//! document-level notices (they block nothing but should be surfaced).

use std::fmt;

use ipnet::IpNet;
use serde::Serialize;

/// Why a resource's grants (or its tag) were not generated. `reason()` is the CamelCase
/// condition reason; `Display` is a message that says what to do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "reason", rename_all_fields = "camelCase")]
pub enum PolicyIssue {
    /// `allowFrom` names entries outside `ingressSourceAllowlist`: no grant at all.
    SourceNotAllowed {
        offending: Vec<String>,
        allowlist: Vec<String>,
    },
    /// The base defines the tag in `tagOwners` with other owners. The base entry is kept
    /// and no grants are generated: someone else could mint the tag.
    TagOwnedDifferently {
        tag: String,
        base_owners: Vec<String>,
        wanted_owners: Vec<String>,
    },
    /// Another resource computed the same tag: whose grant is whose cannot be told apart,
    /// so none of them gets grants.
    DuplicateTag {
        tag: String,
        shared_with: Vec<String>,
    },
    /// The tag is not `tag:<letter>…` as Headscale requires; it would reject the document.
    InvalidTag { tag: String },
    /// `allowFrom` is empty: nothing to grant.
    NoSources,
    /// The ingress has no ports: nothing to grant.
    NoPorts,
    /// A target's port is 0; that target gets no grant.
    InvalidPort { target: String },
}

impl PolicyIssue {
    /// Whether the issue withholds the resource's grants. `SourceNotAllowed` does not: the
    /// allowed sources keep their grant (a bad edit must not cut off what already works); only
    /// the offending entries get none.
    pub fn blocks_grants(&self) -> bool {
        !matches!(self, PolicyIssue::SourceNotAllowed { .. })
    }

    /// CamelCase reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PolicyIssue::SourceNotAllowed { .. } => "SourceNotAllowed",
            PolicyIssue::TagOwnedDifferently { .. } => "TagOwnedDifferently",
            PolicyIssue::DuplicateTag { .. } => "DuplicateTag",
            PolicyIssue::InvalidTag { .. } => "InvalidTag",
            PolicyIssue::NoSources => "NoSources",
            PolicyIssue::NoPorts => "NoPorts",
            PolicyIssue::InvalidPort { .. } => "InvalidPort",
        }
    }
}

impl fmt::Display for PolicyIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyIssue::SourceNotAllowed {
                offending,
                allowlist,
            } => write!(
                f,
                "allowFrom entries {offending:?} are not in the Tailnet's \
                 policy.ingressSourceAllowlist {allowlist:?}; they get no grant (the allowed \
                 sources keep theirs) — remove them or ask the platform team to allow them"
            ),
            PolicyIssue::TagOwnedDifferently {
                tag,
                base_owners,
                wanted_owners,
            } => write!(
                f,
                "the base policy already owns {tag} with {base_owners:?}, not the Tailnet's \
                 policy.tagOwners {wanted_owners:?}; the base entry was kept and no grants were \
                 generated — remove the entry from the base or make the owners equal"
            ),
            PolicyIssue::DuplicateTag { tag, shared_with } => write!(
                f,
                "tag {tag} is also computed for {shared_with:?}; no grants were generated for \
                 any of them — rename one resource"
            ),
            PolicyIssue::InvalidTag { tag } => write!(
                f,
                "{tag:?} is not a valid Headscale tag (tag:<letter>…); nothing was generated"
            ),
            PolicyIssue::NoSources => f.write_str("allowFrom is empty; no grant was generated"),
            PolicyIssue::NoPorts => f.write_str("no ports to expose; no grant was generated"),
            PolicyIssue::InvalidPort { target } => {
                write!(f, "target {target:?} has port 0; it got no grant")
            }
        }
    }
}

/// Document-level findings; they do not block a resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "reason", rename_all_fields = "camelCase")]
pub enum PolicyNotice {
    /// The base already had `autoApprovers.routes[route]`; the missing route approvers were
    /// appended to its list (a union: nothing of the base is removed).
    AutoApproverMerged {
        route: IpNet,
        base_approvers: Vec<String>,
        added: Vec<String>,
    },
    /// The base has neither `acls` nor `grants`, which Headscale treats as allow-all; adding
    /// generated grants turns the tailnet into deny-by-default except those grants.
    BaseHadNoRules,
    /// A group used by the generated parts is not defined in the base's `groups`;
    /// Headscale will reject the document.
    UndefinedGroup { group: String, used_in: String },
    /// A tag used as route approver is not in `tagOwners` (base or generated); Headscale
    /// will reject the document.
    UndefinedTag { tag: String, used_in: String },
}

impl PolicyNotice {
    /// CamelCase reason.
    pub fn reason(&self) -> &'static str {
        match self {
            PolicyNotice::AutoApproverMerged { .. } => "AutoApproverMerged",
            PolicyNotice::BaseHadNoRules => "BaseHadNoRules",
            PolicyNotice::UndefinedGroup { .. } => "UndefinedGroup",
            PolicyNotice::UndefinedTag { .. } => "UndefinedTag",
        }
    }
}

impl fmt::Display for PolicyNotice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyNotice::AutoApproverMerged {
                route,
                base_approvers,
                added,
            } => write!(
                f,
                "base autoApprovers.routes[{route}] = {base_approvers:?}; added {added:?}"
            ),
            PolicyNotice::BaseHadNoRules => f.write_str(
                "the base has no acls or grants (allow-all in Headscale); with generated grants \
                 only granted traffic is allowed — add explicit rules to the base",
            ),
            PolicyNotice::UndefinedGroup { group, used_in } => write!(
                f,
                "{group} (used in {used_in}) is not defined in the base's groups; Headscale \
                 will reject the policy"
            ),
            PolicyNotice::UndefinedTag { tag, used_in } => write!(
                f,
                "{tag} (used in {used_in}) has no tagOwners entry; Headscale will reject the \
                 policy"
            ),
        }
    }
}
