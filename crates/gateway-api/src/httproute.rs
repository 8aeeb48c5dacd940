//! `HTTPRoute` (`apis/v1/httproute_types.go`): HTTP routing by hostname, path, headers, query
//! parameters and method, with filters and weighted backends.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::shared::{BackendRef, ParentReference, RouteStatus};

/// Routes HTTP requests of the parents' HTTP/HTTPS listeners.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "HTTPRoute",
    namespaced,
    status = "RouteStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    /// Host header names, precise or `*.`-prefixed; empty: every hostname of the listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// The CRD defaults it to one rule matching the prefix `/`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<HTTPRouteRule>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// ORed; empty: the prefix `/` (the CRD's default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HTTPRouteMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HTTPRouteFilter>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<HTTPBackendRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<HTTPRouteTimeouts>,
}

/// Conditions ANDed together.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteMatch {
    /// The CRD defaults it to the prefix `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HTTPPathMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HTTPHeaderMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<HTTPQueryParamMatch>,
    /// Upper case, e.g. `GET` ([`methods`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPPathMatch {
    /// `Exact`, `PathPrefix` (default) or `RegularExpression` ([`path_match_types`]).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Default `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPHeaderMatch {
    /// `Exact` (default) or `RegularExpression` ([`value_match_types`]).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Case-insensitive; of several entries with one name only the first counts.
    pub name: String,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPQueryParamMatch {
    /// `Exact` (default) or `RegularExpression` ([`value_match_types`]).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Exact (case-sensitive); of several entries with one name only the first counts.
    pub name: String,
    pub value: String,
}

/// One filter; `type` says which of the optional fields applies ([`filter_types`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteFilter {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HTTPHeaderFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HTTPHeaderFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<HTTPRequestRedirectFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<HTTPURLRewriteFilter>,
}

/// Header changes; one action per header name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPHeaderFilter {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<HTTPHeader>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<HTTPHeader>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPHeader {
    pub name: String,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRequestRedirectFilter {
    /// `http` or `https`; unset: the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HTTPPathModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// 301, 302 (the CRD's default), 303, 307 or 308.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPURLRewriteFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HTTPPathModifier>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPPathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch` ([`path_modifier_types`]).
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

/// A backend of a rule, with filters applied only to requests sent to it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPBackendRef {
    #[serde(flatten)]
    pub backend_ref: BackendRef,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HTTPRouteFilter>,
}

/// Gateway API durations (`1h2m3s4ms` style, GEP-2257).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteTimeouts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<String>,
}

/// `HTTPPathMatch.type` values.
pub mod path_match_types {
    pub const EXACT: &str = "Exact";
    pub const PATH_PREFIX: &str = "PathPrefix";
    pub const REGULAR_EXPRESSION: &str = "RegularExpression";
}

/// `HTTPHeaderMatch.type` / `HTTPQueryParamMatch.type` values.
pub mod value_match_types {
    pub const EXACT: &str = "Exact";
    pub const REGULAR_EXPRESSION: &str = "RegularExpression";
}

/// `HTTPRouteFilter.type` values.
pub mod filter_types {
    pub const REQUEST_HEADER_MODIFIER: &str = "RequestHeaderModifier";
    pub const RESPONSE_HEADER_MODIFIER: &str = "ResponseHeaderModifier";
    pub const REQUEST_MIRROR: &str = "RequestMirror";
    pub const REQUEST_REDIRECT: &str = "RequestRedirect";
    pub const URL_REWRITE: &str = "URLRewrite";
    pub const EXTENSION_REF: &str = "ExtensionRef";
    pub const CORS: &str = "CORS";
    /// Experimental channel only (not in the Standard CRD's enum).
    pub const EXTERNAL_AUTH: &str = "ExternalAuth";
}

/// `HTTPPathModifier.type` values.
pub mod path_modifier_types {
    pub const REPLACE_FULL_PATH: &str = "ReplaceFullPath";
    pub const REPLACE_PREFIX_MATCH: &str = "ReplacePrefixMatch";
}

/// `HTTPRouteMatch.method` values.
pub mod methods {
    pub const ALL: &[&str] = &[
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
}
