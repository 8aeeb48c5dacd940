//! Headscale policy rendering for tailnet-operator (pure: no I/O, no Kubernetes types).
//!
//! The operator PUTs **one complete document**: the human-owned base (HuJSON from a
//! ConfigMap) plus generated parts for every `TailnetEgress` / `TailnetIngress`:
//!
//! * `tagOwners`: every agent tag → `policy.tagOwners`;
//! * `autoApprovers.routes`: for each IP egress target, each route advertised by an approver
//!   node (a node carrying a `routeApprovers` tag) that covers the target → `routeApprovers`;
//! * egress grants `{"src": [egress tag], "dst": ["ip/32" | "ip/128"], "ip": ["tcp:PORT", …]}`,
//!   one per (resource, target address), ports merged; nothing for DNS-name targets (they
//!   must be granted in the base and are reported in [`ResourceOutcome::targets`]);
//! * ingress grants `{"src": allowFrom, "dst": [ingress tag], "ip": ["tcp:PORT", …]}`, only
//!   when every `allowFrom` entry is in `ingressSourceAllowlist` (exact string match).
//!
//! # API
//! [`parse_base`] → [`BasePolicy`]; [`render`] → [`RenderedPolicy`] (document, per-resource
//! [`ResourceOutcome`]s with typed [`PolicyIssue`]s, [`AutoApproverRoute`]s, [`PolicyNotice`]s,
//! [`RenderSummary`]); [`routes_needing_approval`] → [`RouteApproval`]s for
//! `POST /api/v1/node/{id}/approve_routes`; [`ownership_marker`], [`semantically_equal`],
//! [`up_to_date`] and [`diff`] for the live document.
//!
//! # Document layout
//! ```text
//! // tailnet-operator-installation: <installation id>      <- ownership marker, line 1
//! // Rendered by tailnet-operator: … (3 more header lines)
//! <the base text, byte for byte, with insertions:>
//!   "tagOwners": { <base entries>
//!     // tailnet-operator: begin generated tag owners (overwritten on every render)
//!     // TailnetEgress ns/name
//!     "tag:…": ["group:platform"],
//!     // tailnet-operator: end generated tag owners
//!   },
//! ```
//! The base is never re-serialised: comments, key order and formatting are kept, and the
//! generated blocks are inserted before the closing bracket of `tagOwners`,
//! `autoApprovers.routes` and `grants` (those keys are appended to the root object when the
//! base lacks them). Generated entries are sorted (tags, routes; egress grants by owner then
//! address, then ingress grants by owner), so the same inputs in any order give
//! byte-identical output. The base must not itself contain a rendered document
//! ([`RenderError::BaseContainsRenderedOutput`]).
//!
//! # Conflicts
//! * The base owns a generated tag with other owners → [`PolicyIssue::TagOwnedDifferently`];
//!   the base entry stays, the resource gets no grants. Same owners (as a set) → the base
//!   entry is used ([`TagOwnerSource::Base`]), nothing is added (a duplicate key would be
//!   rejected by Headscale).
//! * Two resources compute the same tag → [`PolicyIssue::DuplicateTag`] on each; the tag
//!   owner entry is generated once, but none of them gets grants.
//! * `allowFrom` outside the allowlist → [`PolicyIssue::SourceNotAllowed`] naming the entries.
//! * The base already has `autoApprovers.routes[prefix]` for a prefix we need → **union**:
//!   the missing `routeApprovers` are appended to the base's list (marked with a comment) and
//!   [`PolicyNotice::AutoApproverMerged`] reports it. Rationale: autoApprovers only widen who
//!   may approve a route the router already advertises, and the operator approves these
//!   routes explicitly anyway; a duplicate key would make Headscale reject the document.
//! * Base-level problems — `tagOwners`/`autoApprovers`/`autoApprovers.routes` not an object,
//!   `grants` not an array, a key present twice with different case (Headscale matches
//!   top-level names case-insensitively) — are [`RenderError`]s naming the key.
//!
//! # Headscale 0.29 findings (read in `juanfont/headscale` at tag `v0.29.2`)
//! * **Grants are supported** next to `acls`: `hscontrol/policy/v2/types.go` `type Grant`
//!   (`src`, `dst`, `ip`, `app`, `via`), `ProtocolPort.UnmarshalJSON` parses `"tcp:5432"`
//!   (and `"*"`, `"443"`); `Policy.validate` requires `ip` or `app`, rejects `/0` grant
//!   destinations, and checks that tags/groups/hosts used in grants are defined. Bare IP
//!   and `ip/32` destinations are both `Prefix` aliases. `acls` entries are converted to
//!   grants internally (`aclToGrants`), so either syntax works; grants are used here.
//! * **Unknown fields are rejected**: `policyJSONOpts` = `RejectUnknownMembers(true)` +
//!   `MatchCaseInsensitiveNames(true)` (`types.go`), and `unmarshalPolicy` turns it into
//!   `ErrUnknownField`. So the ownership marker cannot be a top-level field (only `acls`
//!   entries skip `#`-prefixed keys, for headscale-admin).
//! * **Comments survive storage**: in database mode `SetPolicy` stores the request string
//!   as-is (`hscontrol/grpcv1.go` `SetPolicy` → `state.SetPolicyInDB` →
//!   `hscontrol/db/policy.go` `SetPolicy` inserts `types.Policy{Data: policy}`), and
//!   `GetPolicy` returns `p.Data` unchanged. Parsing (`unmarshalPolicy`) uses
//!   `hujson.Parse` + `Standardize` on a copy only. Hence the marker is a first-line
//!   comment. `POST /api/v1/policy/check` (`CheckPolicy`) builds a policy manager from the
//!   text and runs `SetPolicy` on it, i.e. including `tests`, without persisting.
//! * **autoApprovers** (`AutoApproverPolicy{Routes map[netip.Prefix]AutoApprovers,
//!   ExitNode}`): approvers are users (`x@`), `group:` or `tag:` (each must be defined).
//!   `policy.go` `NodeCanApproveRoute` approves a route when a key equals it or a key with
//!   fewer or equal bits overlaps it, i.e. the advertised route must lie *within* an
//!   approver prefix; exit routes only via `exitNode`. The renderer uses the advertised route
//!   itself as key and ignores `/0` routes.
//! * **tagOwners** map `tag:<letter>…` (`Tag.Validate`) to users, groups or tags; **groups**
//!   map `group:…` to users (`alice@`). Referencing an undefined tag/group is a validation
//!   error, hence [`PolicyNotice::UndefinedGroup`]/[`PolicyNotice::UndefinedTag`].
//! * **tests** (`hscontrol/policy/v2/test.go` `PolicyTest`): `{"src": one alias, "proto"?,
//!   "accept": ["host:port"], "deny": ["host:port"]}`; they evaluate the compiled filter of
//!   acls **and** grants, so generated grants are visible to the base's tests. A test whose
//!   src or dst resolves to no IP fails ("resolved to no IP addresses"): a base test that
//!   names an agent tag passes only once that agent's node exists. Tests run on
//!   `policy set`/`check`, not on boot.
//! * A policy with neither `acls` nor `grants` is allow-all (`evaluateTests`,
//!   `FilterAllowAll`); adding generated grants to such a base makes it deny-by-default
//!   ([`PolicyNotice::BaseHadNoRules`]).
//! * HuJSON is JSON + comments + trailing commas only; [`parse_base`] rejects the other
//!   JSON5-ish extensions `jsonc-parser` would accept, and duplicate keys (Go's JSON v2
//!   rejects them).
//! * Verified against a real `headscale` v0.29.2 (database policy mode, loopback): the
//!   snapshot `tests/snapshots/example.hujson` passes `headscale policy check -f <file>` and
//!   `POST /api/v1/policy/check`; after `PUT /api/v1/policy`, `GET /api/v1/policy` returns
//!   the text byte for byte (marker and comments included); an unknown top-level key is
//!   rejected (`unknown field`); a test with `src: "tag:<agent>"` fails with "resolved to no
//!   IP addresses" while no node has the tag; a rendered document for an empty base is
//!   rejected for exactly the undefined groups/tags the notices report.
//! * Only ambiguous user references fail validation (`policy.go` `validateUserReferences`);
//!   a group naming a user that does not exist yet is accepted.
//!
//! # Limits
//! * Approver nodes are recognised by their tags only: a `routeApprovers` entry that is a
//!   group or user is written into `autoApprovers` but matches no node here (node ownership
//!   by users is not part of [`ObservedNode`]).
//! * Array order counts in [`semantically_equal`] (JSON semantics), so a reordered live
//!   document is re-PUT; rendering is deterministic, so this only happens after manual edits.
//! * Inserted entries follow the base's indentation; a base written on a single line gets
//!   correct but unevenly indented insertions.

mod compare;
mod hujson;
mod hujson_edit;
mod issues;
mod model;
mod render;
mod routes;
mod tags;

use serde_json::Value;
use thiserror::Error;

pub use compare::{
    base_states_rules, diff, ownership_marker, semantically_equal, states_rules, up_to_date,
};
pub use issues::{PolicyIssue, PolicyNotice};
pub use model::{
    AutoApproverRoute, ContributedGrant, Contribution, CoveringRoute, EgressPolicy, EgressTarget,
    GeneratedGrant, IngressPolicy, ObservedNode, PolicyInputs, RenderSummary, RenderedPolicy,
    ResourceKind, ResourceOutcome, RouteApproval, TagOwnerSource, TargetAddress, TargetOutcome,
};
pub use render::render;
pub use routes::routes_needing_approval;
pub use tags::valid_tag;

/// The comment prefix of the ownership marker (first line of every rendered document).
pub const MARKER_PREFIX: &str = "tailnet-operator-installation:";

/// A parsed, validated base policy. Keeps the original text so comments can be preserved.
#[derive(Debug, Clone, PartialEq)]
pub struct BasePolicy {
    text: String,
    value: Value,
}

impl BasePolicy {
    /// The base text (without a leading byte-order mark).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The base as plain JSON (comments dropped).
    pub fn value(&self) -> &Value {
        &self.value
    }
}

/// A HuJSON syntax error, or a base that is not an object. Line and column are 1-based.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}, column {column}: {message}")]
pub struct BaseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Why no document could be rendered at all (per-resource problems are [`PolicyIssue`]s).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RenderError {
    #[error("base policy: {0}")]
    Base(BaseError),
    #[error("base policy: {key} must be {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error(
        "base policy: {key} is given more than once ({found:?}); Headscale matches these names case-insensitively"
    )]
    AmbiguousKey { key: String, found: Vec<String> },
    #[error(
        "base policy already contains tailnet-operator output (an ownership marker or generated block); use the human-owned base, not the rendered document"
    )]
    BaseContainsRenderedOutput,
    #[error("installation id {0:?} must be non-empty and free of control characters")]
    InvalidInstallationId(String),
}

/// A document given to [`semantically_equal`]/[`up_to_date`] does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CompareError {
    #[error("first document: {0}")]
    First(BaseError),
    #[error("second document: {0}")]
    Second(BaseError),
}

/// Largest base accepted, in bytes: what one Kubernetes ConfigMap can hold. Bounds the
/// parse and render time and memory of a hostile or mistaken base.
pub const MAX_BASE_BYTES: usize = 1024 * 1024;
/// Deepest object/array nesting accepted in any parsed document (a real policy needs about
/// 5). `jsonc-parser` itself stops at 512 levels; this tighter bound keeps every recursive
/// walk here (conversion, rendering) shallow and gives an error that names the limit.
pub const MAX_NESTING_DEPTH: usize = 64;

/// Parses the human-owned base: HuJSON (comments, trailing commas), must be an object, at
/// most [`MAX_BASE_BYTES`] long and [`MAX_NESTING_DEPTH`] deep.
pub fn parse_base(text: &str) -> Result<BasePolicy, BaseError> {
    let text = hujson::strip_bom(text);
    if text.len() > MAX_BASE_BYTES {
        return Err(BaseError {
            line: 1,
            column: 1,
            message: format!(
                "the base policy is {} bytes; at most {MAX_BASE_BYTES} are accepted (the size of one ConfigMap)",
                text.len()
            ),
        });
    }
    let parsed = hujson::parse_ast(text)?;
    let value = match parsed.value.as_ref() {
        None => {
            return Err(BaseError {
                line: 1,
                column: 1,
                message: "the base policy is empty; expected an object".into(),
            });
        }
        Some(v) => hujson::to_json(text, v)?,
    };
    if !value.is_object() {
        let start = parsed.value.as_ref().map_or(0, |v| match v {
            jsonc_parser::ast::Value::StringLit(x) => x.range.start,
            jsonc_parser::ast::Value::NumberLit(x) => x.range.start,
            jsonc_parser::ast::Value::BooleanLit(x) => x.range.start,
            jsonc_parser::ast::Value::Object(x) => x.range.start,
            jsonc_parser::ast::Value::Array(x) => x.range.start,
            jsonc_parser::ast::Value::NullKeyword(x) => x.range.start,
        });
        let (line, column) = hujson::line_column(text, start);
        return Err(BaseError {
            line,
            column,
            message: format!(
                "the base policy must be an object, found {}",
                parsed.value.as_ref().map_or("nothing", hujson::type_name)
            ),
        });
    }
    Ok(BasePolicy {
        text: text.to_string(),
        value,
    })
}

/// The live `policy` (HuJSON) as plain JSON with its `tests` replaced by one: `src` may
/// reach `accept` (`ip:port`) over TCP. Given to Headscale's `POST /api/v1/policy/check`, it
/// answers whether the policy grants that, evaluated exactly as Headscale enforces it (the
/// egress controller asks it for MagicDNS targets, which get no generated grant). An empty
/// live policy stays empty (allow-all: the check passes).
pub fn with_tests(policy: &str, src: &str, accept: &str) -> Result<String, BaseError> {
    let mut value = hujson::parse_value(policy)?.unwrap_or_else(|| serde_json::json!({}));
    let Some(object) = value.as_object_mut() else {
        return Err(BaseError {
            line: 1,
            column: 1,
            message: "the policy is not an object".into(),
        });
    };
    // Headscale matches top-level names case-insensitively.
    object.retain(|k, _| !k.eq_ignore_ascii_case("tests"));
    object.insert(
        "tests".into(),
        serde_json::json!([{"src": src, "proto": "tcp", "accept": [accept]}]),
    );
    Ok(value.to_string())
}

#[cfg(test)]
mod with_tests_tests {
    #[test]
    fn replaces_the_tests_and_keeps_the_rest() {
        let live = "// marker\n{\"grants\": [], // c\n \"Tests\": [{\"src\": \"x\"}],}";
        let doc = super::with_tests(live, "tag:e", "100.64.0.2:7000").expect("doc");
        let v: serde_json::Value = serde_json::from_str(&doc).expect("json");
        assert_eq!(v["grants"], serde_json::json!([]));
        assert!(v.get("Tests").is_none());
        assert_eq!(
            v["tests"],
            serde_json::json!([{"src": "tag:e", "proto": "tcp", "accept": ["100.64.0.2:7000"]}])
        );
        assert_eq!(
            super::with_tests("", "tag:e", "a:1").map(|d| d.contains("tests")),
            Ok(true)
        );
    }
}
