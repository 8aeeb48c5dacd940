//! Errors of the Headscale client.

use std::error::Error as _;

/// What went wrong below HTTP, so a condition can say what to fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// The server name does not resolve.
    Dns,
    /// TCP connection refused or unreachable.
    Connect,
    /// The server's certificate is not signed by a trusted CA (e.g. a private CA that the
    /// client was not given) or not valid for the server's name.
    CertificateUntrusted,
    /// Another TLS handshake failure.
    Tls,
    /// No answer in time.
    Timeout,
    Other,
}

impl TransportKind {
    /// CamelCase reason for conditions and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            TransportKind::Dns => "DNSError",
            TransportKind::Connect => "ConnectionFailed",
            TransportKind::CertificateUntrusted => "CertificateUntrusted",
            TransportKind::Tls => "TLSError",
            TransportKind::Timeout => "Timeout",
            TransportKind::Other => "TransportError",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{endpoint}: {kind:?}: {message}")]
    Transport {
        endpoint: &'static str,
        kind: TransportKind,
        message: String,
        #[source]
        source: reqwest::Error,
    },
    /// 401: the API key is wrong, expired or revoked.
    #[error(
        "{endpoint}: unauthorized (HTTP 401): the API key was rejected; check the key in the bootstrap Secret and that it is not expired"
    )]
    Unauthorized { endpoint: &'static str },
    /// Headscale answered with an error (gRPC status or problem+json).
    #[error("{endpoint}: HTTP {status}: {message}")]
    Api {
        endpoint: &'static str,
        status: u16,
        /// gRPC status code (0.29) when present.
        code: Option<i64>,
        message: String,
    },
    #[error("{endpoint}: unexpected response: {source}")]
    Decode {
        endpoint: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The answer was larger than the client reads (it stopped reading there).
    #[error("{endpoint}: the answer is larger than {limit} bytes; stopped reading it")]
    TooLarge {
        endpoint: &'static str,
        limit: usize,
    },
    #[error("invalid Headscale URL {url:?}: {message}")]
    InvalidUrl { url: String, message: String },
    #[error("building the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// The CA bundle given for the server holds no usable PEM certificate.
    #[error("the server CA bundle is not usable: {message}")]
    InvalidServerCa { message: String },
}

impl Error {
    /// CamelCase reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Transport { kind, .. } => kind.reason(),
            Error::Unauthorized { .. } => "Unauthorized",
            Error::Api { .. } => "APIError",
            Error::Decode { .. } => "UnexpectedResponse",
            Error::TooLarge { .. } => "ResponseTooLarge",
            Error::InvalidUrl { .. } => "InvalidURL",
            Error::Client(_) => "ClientError",
            Error::InvalidServerCa { .. } => "ServerCAInvalid",
        }
    }

    /// Headscale 0.29 reports "no policy set yet" as HTTP 500 with this message.
    pub fn is_missing_policy(&self) -> bool {
        matches!(self, Error::Api { message, .. } if message.contains("acl policy not found"))
    }

    /// Worth retrying: the server may answer differently next time.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport { .. } => true,
            Error::Api { .. } if self.is_missing_policy() => false,
            Error::Api { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }

    pub(crate) fn transport(endpoint: &'static str, source: reqwest::Error) -> Error {
        let chain = {
            let mut parts = vec![source.to_string()];
            let mut cause = source.source();
            while let Some(c) = cause {
                parts.push(c.to_string());
                cause = c.source();
            }
            parts.join(": ")
        };
        let lower = chain.to_lowercase();
        let kind = if source.is_timeout() || lower.contains("timed out") {
            TransportKind::Timeout
        } else if lower.contains("dns error")
            || lower.contains("failed to lookup address")
            || lower.contains("name or service not known")
        {
            TransportKind::Dns
        } else if lower.contains("unknownissuer")
            || lower.contains("notvalidforname")
            || lower.contains("invalid peer certificate")
        {
            TransportKind::CertificateUntrusted
        } else if lower.contains("certificate")
            || lower.contains("tls")
            || lower.contains("handshake")
        {
            TransportKind::Tls
        } else if source.is_connect() {
            TransportKind::Connect
        } else {
            TransportKind::Other
        };
        Error::Transport {
            endpoint,
            kind,
            message: chain,
            source,
        }
    }

    /// The thing asked for does not exist (HTTP 404). For deletes and expiries that is the
    /// wanted end state: 0.30 answers 404 for a node or key that is already gone.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Api { status: 404, .. })
    }

    /// Parses an error body: 0.29's `{"code": 3, "message": "..."}`, 0.30's problem+json
    /// `{"title", "detail", "status", "errors": [{"message", "location"}]}` (the first
    /// error's message appended, with its location), or plain text (first 512 characters).
    pub(crate) fn from_response(endpoint: &'static str, status: u16, body: &str) -> Error {
        if status == 401 {
            return Error::Unauthorized { endpoint };
        }
        let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
        let text = |v: &serde_json::Value, key: &str| {
            v.get(key).and_then(|m| m.as_str()).map(str::to_string)
        };
        let (code, message) = match &parsed {
            Some(v) => {
                let message = text(v, "message")
                    .or_else(|| problem_message(v))
                    .unwrap_or_else(|| body.trim().chars().take(512).collect());
                (v.get("code").and_then(|c| c.as_i64()), message)
            }
            None => (None, body.trim().chars().take(512).collect()),
        };
        Error::Api {
            endpoint,
            status,
            code,
            message,
        }
    }
}

/// The message of an RFC 9457 problem+json body (Headscale 0.30, huma): `title: detail`,
/// then the first entry of `errors` (`message`, and `location` when present).
fn problem_message(v: &serde_json::Value) -> Option<String> {
    let text =
        |v: &serde_json::Value, key: &str| v.get(key).and_then(|m| m.as_str()).map(str::to_string);
    let head = match (text(v, "title"), text(v, "detail")) {
        (Some(t), Some(d)) => Some(format!("{t}: {d}")),
        (t, d) => t.or(d),
    };
    let first = v.get("errors").and_then(|e| e.get(0));
    let detail = first.and_then(|e| text(e, "message")).map(|m| {
        match first.and_then(|e| text(e, "location")) {
            Some(location) => format!("{m} ({location})"),
            None => m,
        }
    });
    match (head, detail) {
        (Some(h), Some(d)) => Some(format!("{h}: {d}")),
        (h, d) => h.or(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_gateway_error_body() {
        let e = Error::from_response(
            "PUT /api/v1/policy",
            400,
            r#"{"code":3,"message":"setting policy: test(s) failed","details":[]}"#,
        );
        assert_eq!(
            e.to_string(),
            "PUT /api/v1/policy: HTTP 400: setting policy: test(s) failed"
        );
        assert!(matches!(e, Error::Api { code: Some(3), .. }));
        assert!(!e.is_transient());
    }

    #[test]
    fn missing_policy_is_not_an_outage() {
        let e = Error::from_response(
            "GET /api/v1/policy",
            500,
            r#"{"code":2,"message":"loading ACL from database: acl policy not found","details":[]}"#,
        );
        assert!(e.is_missing_policy());
        assert!(!e.is_transient());
    }

    #[test]
    fn problem_json_body() {
        let e = Error::from_response(
            "PUT /api/v1/policy",
            400,
            r#"{"type":"about:blank","title":"Bad Request","status":400,"detail":"invalid policy"}"#,
        );
        assert_eq!(
            e.to_string(),
            "PUT /api/v1/policy: HTTP 400: Bad Request: invalid policy"
        );
    }

    /// Headscale 0.30's documented shapes (huma problem+json, RFC 9457).
    #[test]
    fn headscale_0_30_problem_bodies() {
        let e = Error::from_response(
            "PUT /api/v1/policy",
            422,
            r#"{"$schema":"https://h/schemas/ErrorModel.json","title":"Unprocessable Entity","status":422,"detail":"validation failed","errors":[{"message":"expected string","location":"body.policy","value":3},{"message":"second"}]}"#,
        );
        assert_eq!(
            e.to_string(),
            "PUT /api/v1/policy: HTTP 422: Unprocessable Entity: validation failed: expected string (body.policy)"
        );
        // 401 as problem+json is still Unauthorized (never a key in the message).
        assert!(matches!(
            Error::from_response(
                "GET /api/v1/node",
                401,
                r#"{"title":"Unauthorized","status":401,"detail":"invalid API key"}"#
            ),
            Error::Unauthorized { .. }
        ));
        // 404 on delete/expire: already gone.
        let gone = Error::from_response(
            "DELETE /api/v1/node/7",
            404,
            r#"{"title":"Not Found","status":404,"detail":"node not found"}"#,
        );
        assert!(gone.is_not_found());
        assert_eq!(
            gone.to_string(),
            "DELETE /api/v1/node/7: HTTP 404: Not Found: node not found"
        );
        assert!(!Error::from_response("x", 400, "bad").is_not_found());
        // Only errors[0]: the message stays bounded by what the first error says.
        let only_errors = Error::from_response("x", 400, r#"{"errors":[{"message":"m"}]}"#);
        assert_eq!(only_errors.to_string(), "x: HTTP 400: m");
        // A huge plain body is cut.
        let long = Error::from_response("x", 500, &"a".repeat(10_000));
        assert!(long.to_string().len() < 600);
    }

    #[test]
    fn unauthorized_and_server_errors() {
        assert!(matches!(
            Error::from_response("GET /api/v1/node", 401, "Unauthorized"),
            Error::Unauthorized { .. }
        ));
        let e = Error::from_response("GET /api/v1/node", 503, "overloaded");
        assert!(e.is_transient());
        assert_eq!(e.reason(), "APIError");
    }
}
