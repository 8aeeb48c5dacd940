//! The HTTP client: auth, timeouts, retries of idempotent calls, call observation.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use jiff::Timestamp;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::json;
use url::Url;

use crate::types::*;
use crate::{Error, Secret};

/// Every call the client makes; labels are used in errors and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    Health,
    Version,
    GetPolicy,
    SetPolicy,
    CheckPolicy,
    ListNodes,
    GetNode,
    ApproveRoutes,
    DeleteNode,
    CreatePreAuthKey,
    ListPreAuthKeys,
    ExpirePreAuthKey,
    CreateApiKey,
    ExpireApiKey,
    ListApiKeys,
    ListUsers,
}

impl Endpoint {
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Health => "GET /api/v1/health",
            Endpoint::Version => "GET /version",
            Endpoint::GetPolicy => "GET /api/v1/policy",
            Endpoint::SetPolicy => "PUT /api/v1/policy",
            Endpoint::CheckPolicy => "POST /api/v1/policy/check",
            Endpoint::ListNodes => "GET /api/v1/node",
            Endpoint::GetNode => "GET /api/v1/node/{id}",
            Endpoint::ApproveRoutes => "POST /api/v1/node/{id}/approve_routes",
            Endpoint::DeleteNode => "DELETE /api/v1/node/{id}",
            Endpoint::CreatePreAuthKey => "POST /api/v1/preauthkey",
            Endpoint::ListPreAuthKeys => "GET /api/v1/preauthkey",
            Endpoint::ExpirePreAuthKey => "POST /api/v1/preauthkey/expire",
            Endpoint::CreateApiKey => "POST /api/v1/apikey",
            Endpoint::ExpireApiKey => "POST /api/v1/apikey/expire",
            Endpoint::ListApiKeys => "GET /api/v1/apikey",
            Endpoint::ListUsers => "GET /api/v1/user",
        }
    }

    /// Safe to repeat: reads, full-state writes (policy, approved routes), deletes and
    /// expiries. Creating keys is not: a retry after a lost answer would mint a second key.
    pub fn idempotent(self) -> bool {
        !matches!(self, Endpoint::CreatePreAuthKey | Endpoint::CreateApiKey)
    }
}

/// Receives one observation per HTTP attempt (for metrics).
pub trait CallObserver: Send + Sync {
    /// `outcome` is the HTTP status (`"200"`, `"401"`) or the transport reason (`"Timeout"`).
    fn observe(&self, endpoint: Endpoint, outcome: &str, elapsed: Duration);
}

#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Bound of one attempt, connection included.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Attempts of idempotent calls (1 = no retry).
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubles each time.
    pub initial_backoff: Duration,
    /// PEM certificates of a private CA trusted besides the system roots (the Tailnet's
    /// `spec.serverCA`).
    pub server_ca_pem: Option<String>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            max_attempts: 3,
            initial_backoff: Duration::from_millis(200),
            server_ca_pem: None,
        }
    }
}

/// The certificates of a PEM bundle (at least one; anything that is not a `CERTIFICATE`
/// block is ignored, as with `ca.crt` files that carry comments).
pub fn server_ca_certificates(pem: &str) -> Result<Vec<reqwest::Certificate>, Error> {
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(Error::InvalidServerCa {
            message: "no \"-----BEGIN CERTIFICATE-----\" block in it".to_string(),
        });
    }
    let certificates = reqwest::Certificate::from_pem_bundle(pem.as_bytes()).map_err(|e| {
        Error::InvalidServerCa {
            message: e.to_string(),
        }
    })?;
    if certificates.is_empty() {
        return Err(Error::InvalidServerCa {
            message: "no certificate could be read from it".to_string(),
        });
    }
    Ok(certificates)
}

/// A Headscale API client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    base: Url,
    http: reqwest::Client,
    api_key: Secret,
    options: ClientOptions,
    observer: Option<Arc<dyn CallObserver>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .field("api_key", &self.api_key)
            .finish()
    }
}

impl Client {
    pub fn new(server: &str, api_key: Secret, options: ClientOptions) -> Result<Client, Error> {
        let mut base = Url::parse(server).map_err(|e| Error::InvalidUrl {
            url: server.to_string(),
            message: e.to_string(),
        })?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(Error::InvalidUrl {
                url: server.to_string(),
                message: "use http:// or https://".to_string(),
            });
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let builder = || {
            reqwest::Client::builder()
                .timeout(options.timeout)
                .connect_timeout(options.connect_timeout)
                .user_agent(concat!("tailnet-operator/", env!("CARGO_PKG_VERSION")))
        };
        let http = match &options.server_ca_pem {
            None => builder().build().map_err(Error::Client)?,
            Some(pem) => {
                let with_ca = server_ca_certificates(pem)?
                    .into_iter()
                    .fold(builder(), |b, certificate| {
                        b.add_root_certificate(certificate)
                    });
                // The TLS backend parses the certificates only here: a block that is not a
                // certificate fails the build, which the client without them would not.
                with_ca.build().map_err(|e| match builder().build() {
                    Ok(_) => Error::InvalidServerCa {
                        message: format!("a certificate in it cannot be used as a root: {e}"),
                    },
                    Err(_) => Error::Client(e),
                })?
            }
        };
        Ok(Client {
            base,
            http,
            api_key,
            options,
            observer: None,
        })
    }

    /// Whether it trusts a private CA ([`ClientOptions::server_ca_pem`]).
    pub fn trusts_private_ca(&self) -> bool {
        self.options.server_ca_pem.is_some()
    }

    /// Reports every attempt to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn CallObserver>) -> Client {
        self.observer = Some(observer);
        self
    }

    pub fn server(&self) -> &str {
        self.base.as_str()
    }

    async fn call<T: DeserializeOwned>(
        &self,
        endpoint: Endpoint,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        authenticated: bool,
    ) -> Result<T, Error> {
        let url = self.base.join(path).map_err(|e| Error::InvalidUrl {
            url: path.to_string(),
            message: e.to_string(),
        })?;
        let attempts = if endpoint.idempotent() {
            self.options.max_attempts.max(1)
        } else {
            1
        };
        let mut backoff = self.options.initial_backoff;
        let mut attempt = 1;
        loop {
            let result = self
                .attempt(
                    endpoint,
                    method.clone(),
                    url.clone(),
                    body.as_ref(),
                    authenticated,
                )
                .await;
            match result {
                Err(e) if attempt < attempts && e.is_transient() => {
                    tracing::debug!(endpoint = endpoint.label(), attempt, error = %e, "retrying Headscale call");
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn attempt<T: DeserializeOwned>(
        &self,
        endpoint: Endpoint,
        method: Method,
        url: Url,
        body: Option<&serde_json::Value>,
        authenticated: bool,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let mut request = self
            .http
            .request(method, url)
            .header("Accept", "application/json");
        if authenticated {
            request = request.bearer_auth(self.api_key.expose());
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                let error = Error::transport(endpoint.label(), e);
                self.observe(endpoint, error.reason(), started);
                return Err(error);
            }
        };
        let status = response.status();
        self.observe(endpoint, status.as_str(), started);
        let body = read_capped(response, endpoint.label(), MAX_RESPONSE_BYTES).await?;
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            return Err(Error::from_response(
                endpoint.label(),
                status.as_u16(),
                &text,
            ));
        }
        let text = if text.trim().is_empty() {
            "{}"
        } else {
            text.as_ref()
        };
        serde_json::from_str(text).map_err(|source| Error::Decode {
            endpoint: endpoint.label(),
            source,
        })
    }

    fn observe(&self, endpoint: Endpoint, outcome: &str, started: Instant) {
        if let Some(observer) = &self.observer {
            observer.observe(endpoint, outcome, started.elapsed());
        }
    }

    /// Unauthenticated server version (`/version`).
    pub async fn version(&self) -> Result<VersionInfo, Error> {
        self.call(Endpoint::Version, Method::GET, "version", None, false)
            .await
    }

    /// Authenticated health check: proves the key is accepted and the database reachable.
    pub async fn health(&self) -> Result<bool, Error> {
        let v: serde_json::Value = self
            .call(Endpoint::Health, Method::GET, "api/v1/health", None, true)
            .await?;
        Ok(v.get("databaseConnectivity")
            .and_then(|c| c.as_bool())
            .unwrap_or(false))
    }

    /// The live policy; an empty document when none was ever set (a fresh 0.29 database
    /// answers HTTP 500 "acl policy not found" instead of an empty policy).
    pub async fn get_policy(&self) -> Result<Policy, Error> {
        match self
            .call(
                Endpoint::GetPolicy,
                Method::GET,
                "api/v1/policy",
                None,
                true,
            )
            .await
        {
            Err(e) if e.is_missing_policy() => Ok(Policy::default()),
            other => other,
        }
    }

    /// Replaces the policy. Headscale validates it (including `tests`) and keeps the old one
    /// on rejection.
    pub async fn set_policy(&self, policy: &str) -> Result<Policy, Error> {
        self.call(
            Endpoint::SetPolicy,
            Method::PUT,
            "api/v1/policy",
            Some(json!({ "policy": policy })),
            true,
        )
        .await
    }

    /// Validates a policy (including `tests`) without storing it.
    pub async fn check_policy(&self, policy: &str) -> Result<(), Error> {
        let _: serde_json::Value = self
            .call(
                Endpoint::CheckPolicy,
                Method::POST,
                "api/v1/policy/check",
                Some(json!({ "policy": policy })),
                true,
            )
            .await?;
        Ok(())
    }

    pub async fn list_nodes(&self) -> Result<Vec<Node>, Error> {
        let r: NodesResponse = self
            .call(Endpoint::ListNodes, Method::GET, "api/v1/node", None, true)
            .await?;
        Ok(r.nodes)
    }

    pub async fn get_node(&self, id: u64) -> Result<Node, Error> {
        let r: NodeResponse = self
            .call(
                Endpoint::GetNode,
                Method::GET,
                &format!("api/v1/node/{id}"),
                None,
                true,
            )
            .await?;
        r.node.ok_or_else(|| missing(Endpoint::GetNode, "node"))
    }

    /// Sets the node's approved routes to exactly `routes` (the full set: callers pass the
    /// union with the existing approvals to add one).
    pub async fn approve_routes(&self, id: u64, routes: &[IpNet]) -> Result<Node, Error> {
        let routes: Vec<String> = routes.iter().map(ToString::to_string).collect();
        let r: NodeResponse = self
            .call(
                Endpoint::ApproveRoutes,
                Method::POST,
                &format!("api/v1/node/{id}/approve_routes"),
                Some(json!({ "routes": routes })),
                true,
            )
            .await?;
        r.node
            .ok_or_else(|| missing(Endpoint::ApproveRoutes, "node"))
    }

    pub async fn delete_node(&self, id: u64) -> Result<(), Error> {
        self.call(
            Endpoint::DeleteNode,
            Method::DELETE,
            &format!("api/v1/node/{id}"),
            None,
            true,
        )
        .await
        .map(|_: serde_json::Value| ())
        .or_else(already_gone)
    }

    /// Mints a pre-auth key. Never retried: a lost answer must not leave two valid keys.
    pub async fn create_pre_auth_key(
        &self,
        request: &CreatePreAuthKey,
    ) -> Result<PreAuthKey, Error> {
        let body = serde_json::to_value(request).map_err(|source| Error::Decode {
            endpoint: Endpoint::CreatePreAuthKey.label(),
            source,
        })?;
        let r: PreAuthKeyResponse = self
            .call(
                Endpoint::CreatePreAuthKey,
                Method::POST,
                "api/v1/preauthkey",
                Some(body),
                true,
            )
            .await?;
        r.pre_auth_key
            .ok_or_else(|| missing(Endpoint::CreatePreAuthKey, "preAuthKey"))
    }

    pub async fn list_pre_auth_keys(&self) -> Result<Vec<PreAuthKey>, Error> {
        let r: PreAuthKeysResponse = self
            .call(
                Endpoint::ListPreAuthKeys,
                Method::GET,
                "api/v1/preauthkey",
                None,
                true,
            )
            .await?;
        Ok(r.pre_auth_keys)
    }

    pub async fn expire_pre_auth_key(&self, id: u64) -> Result<(), Error> {
        self.call(
            Endpoint::ExpirePreAuthKey,
            Method::POST,
            "api/v1/preauthkey/expire",
            Some(json!({ "id": id.to_string() })),
            true,
        )
        .await
        .map(|_: serde_json::Value| ())
        .or_else(already_gone)
    }

    /// Mints an API key valid until `expiration` (always sent: without it Headscale stores
    /// an already expired key).
    pub async fn create_api_key(&self, expiration: Timestamp) -> Result<Secret, Error> {
        let r: ApiKeyResponse = self
            .call(
                Endpoint::CreateApiKey,
                Method::POST,
                "api/v1/apikey",
                Some(json!({ "expiration": expiration.to_string() })),
                true,
            )
            .await?;
        Ok(r.api_key)
    }

    pub async fn expire_api_key(&self, prefix: &str) -> Result<(), Error> {
        self.call(
            Endpoint::ExpireApiKey,
            Method::POST,
            "api/v1/apikey/expire",
            Some(json!({ "prefix": prefix })),
            true,
        )
        .await
        .map(|_: serde_json::Value| ())
        .or_else(already_gone)
    }

    pub async fn list_api_keys(&self) -> Result<Vec<ApiKeyInfo>, Error> {
        let r: ApiKeysResponse = self
            .call(
                Endpoint::ListApiKeys,
                Method::GET,
                "api/v1/apikey",
                None,
                true,
            )
            .await?;
        Ok(r.api_keys)
    }

    pub async fn list_users(&self) -> Result<Vec<User>, Error> {
        let r: UsersResponse = self
            .call(Endpoint::ListUsers, Method::GET, "api/v1/user", None, true)
            .await?;
        Ok(r.users)
    }
}

/// The largest Headscale response body read, in bytes: a node list of thousands of nodes
/// (about 2 KiB each) fits; reading stops here, before anything is parsed.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Reads a response body chunk by chunk and stops with [`Error::TooLarge`] once it holds more
/// than `limit` bytes (a declared `Content-Length` above it is refused before reading).
async fn read_capped(
    mut response: reqwest::Response,
    endpoint: &'static str,
    limit: usize,
) -> Result<Vec<u8>, Error> {
    let too_large = || Error::TooLarge { endpoint, limit };
    if response
        .content_length()
        .is_some_and(|length| length > u64::try_from(limit).unwrap_or(u64::MAX))
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Error::transport(endpoint, e))?
    {
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn missing(endpoint: Endpoint, field: &str) -> Error {
    Error::Api {
        endpoint: endpoint.label(),
        status: 200,
        code: None,
        message: format!("response has no {field}"),
    }
}

/// Deleting or expiring something that is already gone is done (Headscale 0.30 answers 404).
fn already_gone(error: Error) -> Result<(), Error> {
    if error.is_not_found() {
        Ok(())
    } else {
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_not_in_debug() {
        let c = Client::new(
            "https://hs.example.net",
            Secret::new("hskey-api-xyz"),
            ClientOptions::default(),
        )
        .expect("client");
        assert!(!format!("{c:?}").contains("hskey-api-xyz"));
    }

    #[test]
    fn urls_are_validated() {
        assert!(matches!(
            Client::new("ftp://x", Secret::new("k"), ClientOptions::default()),
            Err(Error::InvalidUrl { .. })
        ));
        assert!(matches!(
            Client::new("not a url", Secret::new("k"), ClientOptions::default()),
            Err(Error::InvalidUrl { .. })
        ));
        let c = Client::new(
            "https://hs.example.net/prefix",
            Secret::new("k"),
            ClientOptions::default(),
        )
        .expect("client");
        assert_eq!(c.server(), "https://hs.example.net/prefix/");
    }

    #[test]
    fn only_key_creation_is_not_idempotent() {
        assert!(!Endpoint::CreatePreAuthKey.idempotent());
        assert!(!Endpoint::CreateApiKey.idempotent());
        assert!(Endpoint::SetPolicy.idempotent());
        assert!(Endpoint::ApproveRoutes.idempotent());
    }

    /// Issue 26 item 6: a Headscale answer is read with a byte cap. A server answering with a
    /// body that never ends (no Content-Length) gets a named error after `limit` bytes and the
    /// connection is dropped; one declaring a larger Content-Length is refused before reading.
    /// Before, `response.text()` read the whole answer into memory.
    #[tokio::test]
    async fn response_bodies_are_read_with_a_cap() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = written.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut head = [0u8; 4096];
                    let Ok(n) = stream.read(&mut head).await else {
                        return;
                    };
                    let declared = String::from_utf8_lossy(&head[..n]).contains("declared");
                    if declared {
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 99999999\r\n\r\n";
                        let _ = stream.write_all(answer.as_bytes()).await;
                        return;
                    }
                    let answer = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, " ".repeat(64 * 1024));
                    // At most 1 GiB, so a client that never stops cannot hang the test.
                    for _ in 0..16 * 1024 {
                        if stream.write_all(chunk.as_bytes()).await.is_err() {
                            return;
                        }
                        count.fetch_add(64 * 1024, std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
        });
        let http = reqwest::Client::new();
        for (path, declared) in [("endless", false), ("declared", true)] {
            let response = http
                .get(format!("http://{address}/{path}"))
                .send()
                .await
                .expect("answer");
            let error = read_capped(response, "test", 1024 * 1024)
                .await
                .expect_err("refused");
            assert!(
                matches!(
                    error,
                    Error::TooLarge {
                        limit: 1_048_576,
                        ..
                    }
                ),
                "{declared}: {error}"
            );
            assert_eq!(error.reason(), "ResponseTooLarge");
        }
        let at_refusal = written.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            at_refusal < 64 * 1024 * 1024,
            "the server wrote {at_refusal} bytes: the read did not stop"
        );
    }
}
