//! Wire types of Headscale's API v1 (protojson: camelCase names, `uint64` as strings,
//! timestamps as RFC 3339). Unknown fields are ignored so newer servers stay readable.

use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Secret;

/// `uint64` on the wire: a JSON string (protojson), tolerated as a number too.
pub(crate) mod id {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Text(String),
            Number(u64),
        }
        match Wire::deserialize(d)? {
            Wire::Number(n) => Ok(n),
            Wire::Text(t) if t.is_empty() => Ok(0),
            Wire::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

fn null_as_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct User {
    #[serde(deserialize_with = "id::deserialize")]
    pub id: u64,
    pub name: String,
    pub display_name: String,
    pub email: String,
    pub created_at: Option<Timestamp>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Node {
    #[serde(deserialize_with = "id::deserialize")]
    pub id: u64,
    pub name: String,
    pub given_name: String,
    #[serde(deserialize_with = "null_as_default")]
    pub user: Option<User>,
    #[serde(deserialize_with = "null_as_default")]
    pub ip_addresses: Vec<String>,
    pub online: bool,
    pub last_seen: Option<Timestamp>,
    pub expiry: Option<Timestamp>,
    pub created_at: Option<Timestamp>,
    pub register_method: String,
    #[serde(deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    /// Routes the node announces.
    #[serde(deserialize_with = "null_as_default")]
    pub available_routes: Vec<String>,
    /// Routes approved for the node (by autoApprovers or explicitly).
    #[serde(deserialize_with = "null_as_default")]
    pub approved_routes: Vec<String>,
    /// Routes that are announced and approved, i.e. in effect.
    #[serde(deserialize_with = "null_as_default")]
    pub subnet_routes: Vec<String>,
    pub node_key: String,
    pub machine_key: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PreAuthKey {
    #[serde(deserialize_with = "id::deserialize")]
    pub id: u64,
    /// The key itself; only meaningful right after creation.
    pub key: Secret,
    #[serde(deserialize_with = "null_as_default")]
    pub user: Option<User>,
    pub reusable: bool,
    pub ephemeral: bool,
    pub used: bool,
    pub expiration: Option<Timestamp>,
    pub created_at: Option<Timestamp>,
    #[serde(deserialize_with = "null_as_default")]
    pub acl_tags: Vec<String>,
}

impl Default for PreAuthKey {
    fn default() -> Self {
        PreAuthKey {
            id: 0,
            key: Secret::new(""),
            user: None,
            reusable: false,
            ephemeral: false,
            used: false,
            expiration: None,
            created_at: None,
            acl_tags: Vec::new(),
        }
    }
}

/// Request to mint a pre-auth key. `expiration` is mandatory by construction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatePreAuthKey {
    /// Owning user; `None` for a tags-only key.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_id")]
    pub user: Option<u64>,
    pub reusable: bool,
    pub ephemeral: bool,
    pub expiration: Timestamp,
    pub acl_tags: Vec<String>,
}

fn opt_id<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(id) => s.serialize_str(&id.to_string()),
        None => s.serialize_none(),
    }
}

impl CreatePreAuthKey {
    /// A single-use key for one tagged node, valid until `expiration`.
    pub fn single_use_tagged(tags: Vec<String>, expiration: Timestamp) -> Self {
        CreatePreAuthKey {
            user: None,
            reusable: false,
            ephemeral: false,
            expiration,
            acl_tags: tags,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ApiKeyInfo {
    #[serde(deserialize_with = "id::deserialize")]
    pub id: u64,
    pub prefix: String,
    pub expiration: Option<Timestamp>,
    pub created_at: Option<Timestamp>,
    pub last_seen: Option<Timestamp>,
}

/// Prefix of Headscale's API keys since 0.26: `hskey-api-<12 chars>-<secret>`.
const API_KEY_PREFIX: &str = "hskey-api-";
const API_KEY_PUBLIC_LENGTH: usize = 12;
const LEGACY_API_KEY_PUBLIC_LENGTH: usize = 7;

/// The public part of an API key, as Headscale lists it without the mask: `hskey-api-<12>`
/// for today's keys, the 7 characters before the `.` for legacy `<prefix>.<secret>` keys.
/// `None` for anything else. Only the public part is returned, never the secret.
pub fn api_key_public_part(key: &str) -> Option<&str> {
    if let Some(rest) = key.strip_prefix(API_KEY_PREFIX) {
        let public = rest.get(..API_KEY_PUBLIC_LENGTH)?;
        return (rest.as_bytes().get(API_KEY_PUBLIC_LENGTH) == Some(&b'-'))
            .then(|| &key[..API_KEY_PREFIX.len() + public.len()]);
    }
    let (public, _) = key.split_once('.')?;
    (public.len() == LEGACY_API_KEY_PUBLIC_LENGTH).then_some(public)
}

impl ApiKeyInfo {
    /// Whether this listed key is `key`: Headscale lists the public part masked
    /// (`hskey-api-<12>-***`, legacy `<7>***`); compared without the mask.
    pub fn is(&self, key: &str) -> bool {
        // Exactly the mask: the public part itself may end in `-` (URL-safe base64).
        let listed = self
            .prefix
            .strip_suffix("-***")
            .or_else(|| self.prefix.strip_suffix("***"))
            .unwrap_or(&self.prefix);
        !listed.is_empty() && api_key_public_part(key) == Some(listed)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Policy {
    /// The stored document, byte for byte as it was set (comments included).
    pub policy: String,
    pub updated_at: Option<Timestamp>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VersionInfo {
    pub version: String,
    pub commit: String,
    pub build_time: String,
    pub dirty: bool,
}

// Response envelopes.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct NodesResponse {
    #[serde(deserialize_with = "null_as_default")]
    pub nodes: Vec<Node>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct NodeResponse {
    pub node: Option<Node>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct UsersResponse {
    #[serde(deserialize_with = "null_as_default")]
    pub users: Vec<User>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct PreAuthKeyResponse {
    pub pre_auth_key: Option<PreAuthKey>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct PreAuthKeysResponse {
    #[serde(deserialize_with = "null_as_default")]
    pub pre_auth_keys: Vec<PreAuthKey>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ApiKeyResponse {
    pub api_key: Secret,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct ApiKeysResponse {
    #[serde(deserialize_with = "null_as_default")]
    pub api_keys: Vec<ApiKeyInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_from_protojson() {
        let json = r#"{"id":"7","machineKey":"mkey:1","nodeKey":"nodekey:2","ipAddresses":["100.64.0.7","fd7a:115c:a1e0::7"],
            "name":"tailnet-egress-team-a","user":null,"lastSeen":"2026-11-29T09:00:00Z","expiry":null,"preAuthKey":null,
            "createdAt":"2026-11-29T08:00:00.123456789Z","registerMethod":"REGISTER_METHOD_AUTH_KEY","givenName":"tailnet-egress-team-a",
            "online":true,"approvedRoutes":[],"availableRoutes":["192.0.2.0/24"],"subnetRoutes":[],"tags":["tag:tno-egress-team-a"],"futureField":1}"#;
        let node: Node = serde_json::from_str(json).expect("node");
        assert_eq!(node.id, 7);
        assert_eq!(node.ip_addresses.len(), 2);
        assert_eq!(node.tags, vec!["tag:tno-egress-team-a"]);
        assert_eq!(node.available_routes, vec!["192.0.2.0/24"]);
        assert!(node.online);
    }

    #[test]
    fn create_key_request_always_has_expiration_and_string_ids() {
        let exp: Timestamp = "2026-11-29T10:00:00Z".parse().expect("ts");
        let req = CreatePreAuthKey::single_use_tagged(vec!["tag:x".into()], exp);
        let json = serde_json::to_value(&req).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"reusable": false, "ephemeral": false, "expiration": "2026-11-29T10:00:00Z", "aclTags": ["tag:x"]})
        );
        let with_user = CreatePreAuthKey {
            user: Some(3),
            ..req
        };
        assert_eq!(serde_json::to_value(&with_user).expect("json")["user"], "3");
    }

    #[test]
    fn pre_auth_key_debug_hides_the_key() {
        let key: PreAuthKey =
            serde_json::from_str(r#"{"id":"1","key":"hskey-auth-secret","aclTags":["tag:x"]}"#)
                .expect("key");
        assert!(!format!("{key:?}").contains("hskey-auth-secret"));
        assert_eq!(key.key.expose(), "hskey-auth-secret");
    }
}

#[cfg(test)]
mod api_key_tests {
    use super::*;

    fn listed(prefix: &str) -> ApiKeyInfo {
        ApiKeyInfo {
            prefix: prefix.into(),
            ..ApiKeyInfo::default()
        }
    }

    #[test]
    fn a_key_is_found_by_its_public_part_only() {
        let key = "hskey-api-AbCdEf123456-s3cr3ts3cr3ts3cr3ts3cr3ts3cr3ts3cr3t";
        assert_eq!(api_key_public_part(key), Some("hskey-api-AbCdEf123456"));
        assert!(listed("hskey-api-AbCdEf123456-***").is(key));
        assert!(listed("hskey-api-AbCdEf123456").is(key));
        assert!(!listed("hskey-api-AbCdEf123457-***").is(key));
        // A public part that ends in `-` (URL-safe base64) keeps it.
        let dashed = "hskey-api-AbCdEf12345--s3cr3t";
        assert_eq!(api_key_public_part(dashed), Some("hskey-api-AbCdEf12345-"));
        assert!(listed("hskey-api-AbCdEf12345--***").is(dashed));
        assert!(!listed("hskey-api-AbCdEf12345--***").is(key));
        // Legacy keys: `<7>.<secret>`, listed as `<7>***`.
        assert_eq!(api_key_public_part("abcdefg.secret"), Some("abcdefg"));
        assert!(listed("abcdefg***").is("abcdefg.secret"));
        assert!(!listed("abcdefh***").is("abcdefg.secret"));
        // Not a key Headscale made: never matched, nothing of it returned.
        for odd in [
            "",
            "hskey-api-short",
            "hskey-api-AbCdEf123456_x",
            "abc.def",
            "no-dot",
        ] {
            assert_eq!(api_key_public_part(odd), None, "{odd}");
            assert!(!listed("").is(odd));
            assert!(!listed("***").is(odd));
        }
        // Multi-byte input cannot panic the slicing.
        assert_eq!(api_key_public_part("hskey-api-ééééééé"), None);
    }
}
