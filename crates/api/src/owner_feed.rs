//! What the owner writes into a keyless contributor's cluster (SPEC §4a): one Secret,
//! `<contributor tailnet>-owner-keys` in its operator namespace, key `feed.json`, with its
//! agents' single-use pre-auth keys and the node facts its conditions need. The contributor
//! holds no Headscale key and reads these instead of calling Headscale. Plain data.

use serde::{Deserialize, Serialize};

/// `apiVersion` of a feed document.
pub const FEED_API_VERSION: &str = "tailnet-operator.dev/v1alpha1";
/// `kind` of a feed document.
pub const FEED_KIND: &str = "OwnerFeed";
/// The Secret key holding the feed.
pub const FEED_KEY: &str = "feed.json";
/// Largest feed either side reads or writes (a Secret holds at most 1 MiB).
pub const MAX_FEED_BYTES: usize = 768 * 1024;
/// Most nodes a feed carries.
pub const MAX_FEED_NODES: usize = 2000;

/// Name of the Secret a keyless contributing Tailnet reads its feed from.
pub fn owner_keys_secret(tailnet: &str) -> String {
    format!("{tailnet}-owner-keys")
}

/// The feed document.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct OwnerFeed {
    pub api_version: String,
    pub kind: String,
    /// The Headscale version the owner sees.
    pub headscale_version: String,
    /// The contributor's tag prefix this feed is for.
    pub tag_prefix: String,
    /// RFC 3339: until when the owner vouches for these facts. The owner rewrites it well
    /// before; a contributor does not use a feed past it (the owner no longer lists it, or
    /// cannot reach its cluster).
    #[serde(default)]
    pub valid_until: String,
    /// Nodes: the contributor's own (a tag under its prefix) in full; others only as far as
    /// its limits reach (addresses inside `egressDestinations`; the owner's route approvers
    /// with routes inside them).
    #[serde(default)]
    pub nodes: Vec<FeedNode>,
    /// The part of the live policy that concerns the contributor: tag owners of its tags,
    /// grants naming its tags, auto-approved routes inside its limits (a HuJSON/JSON
    /// document; `None` when the owner could not read the live policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_policy: Option<String>,
    /// Pre-auth keys waiting for an agent's first login, one per tag.
    #[serde(default)]
    pub keys: Vec<FeedKey>,
}

/// One node as a contributor sees it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FeedNode {
    pub id: u64,
    /// The hostname the node registered with.
    pub name: String,
    pub given_name: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub ip_addresses: Vec<String>,
    pub online: bool,
    /// RFC 3339; only while offline (it moves on every poll while online).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    /// RFC 3339 key expiry, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<String>,
    #[serde(default)]
    pub available_routes: Vec<String>,
    #[serde(default)]
    pub approved_routes: Vec<String>,
}

/// One single-use, tagged pre-auth key.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FeedKey {
    pub tag: String,
    /// Headscale's id of the key.
    pub id: u64,
    /// The key itself (never logged: `Debug` redacts it).
    pub key: String,
    /// RFC 3339.
    pub expires: String,
}

impl std::fmt::Debug for FeedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedKey")
            .field("tag", &self.tag)
            .field("id", &self.id)
            .field("key", &"<redacted>")
            .field("expires", &self.expires)
            .finish()
    }
}

/// Why a feed was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FeedError {
    #[error("{FEED_KEY} is larger than {MAX_FEED_BYTES} bytes")]
    TooLarge,
    #[error("{FEED_KEY} does not parse: {0}")]
    Syntax(String),
    #[error("{FEED_KEY} is not an {FEED_KIND} of {FEED_API_VERSION}")]
    Kind,
    #[error("{FEED_KEY} is for tag prefix {found:?}, this Tailnet's is {expected:?}")]
    Prefix { found: String, expected: String },
}

/// Parses a feed (size-capped), checking its kind and that it is for `tag_prefix`.
pub fn parse_feed(bytes: &[u8], tag_prefix: &str) -> Result<OwnerFeed, FeedError> {
    if bytes.len() > MAX_FEED_BYTES {
        return Err(FeedError::TooLarge);
    }
    let feed: OwnerFeed =
        serde_json::from_slice(bytes).map_err(|e| FeedError::Syntax(e.to_string()))?;
    if feed.api_version != FEED_API_VERSION || feed.kind != FEED_KIND {
        return Err(FeedError::Kind);
    }
    if feed.tag_prefix != tag_prefix {
        return Err(FeedError::Prefix {
            found: feed.tag_prefix,
            expected: tag_prefix.to_string(),
        });
    }
    Ok(feed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_round_trips_and_is_checked() {
        let feed = OwnerFeed {
            api_version: FEED_API_VERSION.into(),
            kind: FEED_KIND.into(),
            headscale_version: "0.29.3".into(),
            tag_prefix: "cob".into(),
            keys: vec![FeedKey {
                tag: "tag:cob-egress-a".into(),
                id: 3,
                key: "secret-value".into(),
                expires: "2026-01-01T00:00:00Z".into(),
            }],
            ..OwnerFeed::default()
        };
        let text = serde_json::to_vec(&feed).expect("json");
        assert_eq!(parse_feed(&text, "cob"), Ok(feed.clone()));
        assert!(matches!(
            parse_feed(&text, "hyd"),
            Err(FeedError::Prefix { .. })
        ));
        assert!(matches!(parse_feed(b"{", "cob"), Err(FeedError::Syntax(_))));
        assert_eq!(
            parse_feed(&vec![b' '; MAX_FEED_BYTES + 1], "cob"),
            Err(FeedError::TooLarge)
        );
        assert!(!format!("{feed:?}").contains("secret-value"));
    }
}
