//! Headscale REST API v1 helpers (Bearer API key). Only what the tests need; the product's own
//! typed client lives in `tailnet-headscale`.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::json;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// A failed Headscale API call, naming the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{method} {endpoint}: request failed")]
    Request {
        method: &'static str,
        endpoint: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{method} {endpoint}: HTTP {status}: {body}")]
    Status {
        method: &'static str,
        endpoint: String,
        status: u16,
        body: String,
    },
    #[error("{method} {endpoint}: unexpected response body: {body}")]
    Decode {
        method: &'static str,
        endpoint: String,
        body: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot compute an expiration {valid_for:?} from now")]
    Expiration {
        valid_for: Duration,
        #[source]
        source: jiff::Error,
    },
}

/// A client for one Headscale server. Cheap to create; create one per test (an HTTP connection
/// pool must not outlive the async runtime it was used on).
#[derive(Clone, Debug)]
pub struct HeadscaleApi {
    http: reqwest::Client,
    base_url: String,
    api_key: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct User {
    #[serde(deserialize_with = "u64_from_string_or_number")]
    pub id: u64,
    pub name: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreAuthKey {
    #[serde(deserialize_with = "u64_from_string_or_number")]
    pub id: u64,
    pub key: String,
    #[serde(default)]
    pub reusable: bool,
    #[serde(default)]
    pub ephemeral: bool,
    #[serde(default, alias = "acl_tags")]
    pub acl_tags: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    #[serde(deserialize_with = "u64_from_string_or_number")]
    pub id: u64,
    #[serde(default)]
    pub name: String,
    #[serde(default, alias = "given_name")]
    pub given_name: String,
    #[serde(default, alias = "ip_addresses")]
    pub ip_addresses: Vec<String>,
    #[serde(default)]
    pub online: bool,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default, alias = "approved_routes")]
    pub approved_routes: Vec<String>,
    #[serde(default, alias = "available_routes")]
    pub available_routes: Vec<String>,
    #[serde(default, alias = "subnet_routes")]
    pub subnet_routes: Vec<String>,
}

/// What to mint with [`HeadscaleApi::create_preauth_key`]. Always sent with an expiration:
/// Headscale stores a key without one as already expired.
#[derive(Clone, Debug)]
pub struct PreAuthKeyRequest {
    /// Owning user; `None` for a tags-only key.
    pub user: Option<u64>,
    pub tags: Vec<String>,
    pub reusable: bool,
    pub ephemeral: bool,
    pub valid_for: Duration,
}

impl PreAuthKeyRequest {
    /// A single-use key for a node with these tags, valid for an hour.
    pub fn tagged<I: IntoIterator<Item = S>, S: Into<String>>(tags: I) -> Self {
        PreAuthKeyRequest {
            user: None,
            tags: tags.into_iter().map(Into::into).collect(),
            reusable: false,
            ephemeral: false,
            valid_for: Duration::from_secs(3600),
        }
    }

    /// A single-use key for a node owned by a user (no tags), valid for an hour.
    pub fn for_user(user_id: u64) -> Self {
        PreAuthKeyRequest {
            user: Some(user_id),
            ..PreAuthKeyRequest::tagged(Vec::<String>::new())
        }
    }

    pub fn reusable(mut self) -> Self {
        self.reusable = true;
        self
    }
}

impl HeadscaleApi {
    /// `base_url` like `http://127.0.0.1:8080` (no trailing slash).
    /// A client with the system roots only (a plain-http Headscale, or a stand-in).
    pub fn new(base_url: impl Into<String>, api_key: impl Into<String>) -> Self {
        HeadscaleApi {
            http: reqwest::Client::new(),
            base_url: base_url.into(),
            api_key: api_key.into(),
        }
    }

    /// A client that also trusts the CA of `ca_pem` (the lab CA of an HTTPS Headscale). An
    /// unusable PEM leaves only the system roots, so the first call names the TLS failure.
    pub fn with_ca(base_url: impl Into<String>, api_key: impl Into<String>, ca_pem: &str) -> Self {
        let mut builder = reqwest::Client::builder();
        for certificate in
            reqwest::Certificate::from_pem_bundle(ca_pem.as_bytes()).unwrap_or_default()
        {
            builder = builder.add_root_certificate(certificate);
        }
        HeadscaleApi {
            http: builder.build().unwrap_or_default(),
            base_url: base_url.into(),
            api_key: api_key.into(),
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `GET /health` (no auth), `Ok` on 200.
    pub async fn health(&self) -> Result<(), ApiError> {
        let endpoint = "/health".to_owned();
        let response = self
            .http
            .get(format!("{}{endpoint}", self.base_url))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|source| ApiError::Request {
                method: "GET",
                endpoint: endpoint.clone(),
                source,
            })?;
        let status = response.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        Err(ApiError::Status {
            method: "GET",
            endpoint,
            status,
            body: response.text().await.unwrap_or_default(),
        })
    }

    pub async fn create_user(&self, name: &str) -> Result<User, ApiError> {
        #[derive(Deserialize)]
        struct Response {
            user: User,
        }
        let response: Response = self
            .call("POST", "/api/v1/user", Some(json!({ "name": name })))
            .await?;
        Ok(response.user)
    }

    pub async fn list_users(&self) -> Result<Vec<User>, ApiError> {
        #[derive(Deserialize)]
        struct Response {
            #[serde(default)]
            users: Vec<User>,
        }
        let response: Response = self.call("GET", "/api/v1/user", None).await?;
        Ok(response.users)
    }

    pub async fn create_preauth_key(
        &self,
        request: &PreAuthKeyRequest,
    ) -> Result<PreAuthKey, ApiError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Response {
            #[serde(alias = "pre_auth_key")]
            pre_auth_key: PreAuthKey,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Body<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            user: Option<String>,
            reusable: bool,
            ephemeral: bool,
            expiration: String,
            acl_tags: &'a [String],
        }
        let expiration = expiration_after(request.valid_for)?;
        let body = Body {
            user: request.user.map(|id| id.to_string()),
            reusable: request.reusable,
            ephemeral: request.ephemeral,
            expiration,
            acl_tags: &request.tags,
        };
        let body = serde_json::to_value(&body).map_err(|source| ApiError::Decode {
            method: "POST",
            endpoint: "/api/v1/preauthkey".into(),
            body: String::new(),
            source,
        })?;
        let response: Response = self.call("POST", "/api/v1/preauthkey", Some(body)).await?;
        Ok(response.pre_auth_key)
    }

    pub async fn list_nodes(&self) -> Result<Vec<Node>, ApiError> {
        #[derive(Deserialize)]
        struct Response {
            #[serde(default)]
            nodes: Vec<Node>,
        }
        let response: Response = self.call("GET", "/api/v1/node", None).await?;
        Ok(response.nodes)
    }

    /// Sets the node's approved routes to exactly `routes` (the full set, not a delta).
    pub async fn approve_routes(&self, node_id: u64, routes: &[&str]) -> Result<Node, ApiError> {
        #[derive(Deserialize)]
        struct Response {
            node: Node,
        }
        let response: Response = self
            .call(
                "POST",
                &format!("/api/v1/node/{node_id}/approve_routes"),
                Some(json!({ "routes": routes })),
            )
            .await?;
        Ok(response.node)
    }

    /// The live policy document (empty when none was set).
    pub async fn get_policy(&self) -> Result<String, ApiError> {
        #[derive(Deserialize)]
        struct Response {
            #[serde(default)]
            policy: String,
        }
        let response: Response = self.call("GET", "/api/v1/policy", None).await?;
        Ok(response.policy)
    }

    pub async fn set_policy(&self, policy: &str) -> Result<(), ApiError> {
        let _: serde_json::Value = self
            .call("PUT", "/api/v1/policy", Some(json!({ "policy": policy })))
            .await?;
        Ok(())
    }

    /// `POST /api/v1/policy/check`: `Err(ApiError::Status)` carries Headscale's reason.
    pub async fn check_policy(&self, policy: &str) -> Result<(), ApiError> {
        let _: serde_json::Value = self
            .call(
                "POST",
                "/api/v1/policy/check",
                Some(json!({ "policy": policy })),
            )
            .await?;
        Ok(())
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: &'static str,
        endpoint: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, ApiError> {
        let url = format!("{}{endpoint}", self.base_url);
        let request = match method {
            "POST" => self.http.post(url),
            "PUT" => self.http.put(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.get(url),
        };
        let request = request.bearer_auth(&self.api_key).timeout(REQUEST_TIMEOUT);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        let request_failed = |source| ApiError::Request {
            method,
            endpoint: endpoint.to_owned(),
            source,
        };
        let response = request.send().await.map_err(request_failed)?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(request_failed)?;
        if !(200..300).contains(&status) {
            return Err(ApiError::Status {
                method,
                endpoint: endpoint.to_owned(),
                status,
                body: text,
            });
        }
        serde_json::from_str(&text).map_err(|source| ApiError::Decode {
            method,
            endpoint: endpoint.to_owned(),
            body: text,
            source,
        })
    }
}

/// RFC 3339 timestamp `valid_for` from now.
fn expiration_after(valid_for: Duration) -> Result<String, ApiError> {
    let span = jiff::SignedDuration::try_from(valid_for)
        .map_err(|source| ApiError::Expiration { valid_for, source })?;
    jiff::Timestamp::now()
        .checked_add(span)
        .map(|timestamp| timestamp.to_string())
        .map_err(|source| ApiError::Expiration { valid_for, source })
}

/// grpc-gateway encodes uint64 as a JSON string; accept numbers too.
fn u64_from_string_or_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        Text(String),
        Number(u64),
    }
    match Id::deserialize(deserializer)? {
        Id::Number(id) => Ok(id),
        Id::Text(text) => text.parse().map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_grpc_gateway_node_json() {
        let node: Node = serde_json::from_str(
            r#"{"id":"7","givenName":"router","ipAddresses":["100.64.0.1"],"online":true,
                "tags":["tag:router"],"approvedRoutes":[],"availableRoutes":["192.0.2.0/24"],
                "user":{"id":"1","name":"admin"}}"#,
        )
        .expect("decode");
        assert_eq!(node.id, 7);
        assert_eq!(node.available_routes, vec!["192.0.2.0/24"]);
        assert_eq!(node.user.map(|user| user.id), Some(1));
    }

    #[test]
    fn expiration_is_rfc3339_in_the_future() {
        let text = expiration_after(Duration::from_secs(60)).expect("expiration");
        let timestamp: jiff::Timestamp = text.parse().expect("rfc3339");
        assert!(timestamp > jiff::Timestamp::now());
    }
}
