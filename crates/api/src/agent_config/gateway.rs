//! The Gateway API part of the agent config: HTTP routing rules (matches, filters, weighted
//! backends) and TLS passthrough routes, with their bounds and the checks the agent applies.
//!
//! The checks are here, not only in the agent, so that the operator can run the same ones on
//! a route before it puts the route into an agent config: one tenant's invalid rule must make
//! that route `Accepted=False`, not the whole agent config unusable.

use serde::{Deserialize, Serialize};

use super::{BackendAddress, BackendTlsFiles};

/// Rules of one route (the operator merges the rules of all HTTPRoutes of a hostname).
pub const MAX_RULES_PER_ROUTE: usize = 512;
/// Matches of one rule (the Gateway API allows 64).
pub const MAX_MATCHES_PER_RULE: usize = 64;
/// Header matches, and query parameter matches, of one match (Gateway API: 16 each).
pub const MAX_HEADER_MATCHES: usize = 16;
pub const MAX_QUERY_PARAM_MATCHES: usize = 16;
/// Filters of one rule (Gateway API: 16).
pub const MAX_FILTERS_PER_RULE: usize = 16;
/// Entries of each of `set`, `add` and `remove` of a header modifier (Gateway API: 16).
pub const MAX_HEADER_MODIFIER_ENTRIES: usize = 16;
/// Backends of one rule or passthrough route (Gateway API: 16 backendRefs).
pub const MAX_BACKENDS: usize = 16;
/// The largest backend weight (the Gateway API's bound).
pub const MAX_BACKEND_WEIGHT: u32 = 1_000_000;
/// Routes of one listener.
pub const MAX_ROUTES_PER_LISTENER: usize = 1024;
/// Hostnames of one route.
pub const MAX_HOSTNAMES_PER_ROUTE: usize = 1024;
/// Path values of matches and modifiers (Gateway API: 1024).
pub const MAX_PATH_LENGTH: usize = 1024;
pub const MAX_HEADER_NAME_LENGTH: usize = 256;
/// Header and query parameter values (Gateway API: 4096).
pub const MAX_HEADER_VALUE_LENGTH: usize = 4096;
/// Length of a regular expression's source.
pub const MAX_REGEX_LENGTH: usize = 1024;
/// Compiled size of one regular expression (the `regex` crate's `size_limit`): compiling
/// stops with an error beyond it, which bounds compile time and memory.
pub const REGEX_SIZE_LIMIT: usize = 64 * 1024;
/// The lazy DFA cache of one regular expression (per thread that runs it).
pub const REGEX_DFA_SIZE_LIMIT: usize = 64 * 1024;
/// Regular expressions in one agent config.
pub const MAX_REGEXES: usize = 128;

/// A checked field and what is wrong with it; `field` is a path like
/// `rules[2].matches[0].path.value`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RuleError {
    pub field: String,
    pub message: String,
}

fn error(field: impl Into<String>, message: impl Into<String>) -> RuleError {
    RuleError {
        field: field.into(),
        message: message.into(),
    }
}

/// One rule of an HTTP route.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRule {
    /// A request meets the rule if it meets any of them; none: every request (the Gateway
    /// API's default `PathPrefix /`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HttpRequestMatch>,
    /// Applied in this order; at most one of each type, and not both `RequestRedirect` and
    /// `URLRewrite`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpFilter>,
    /// One is chosen per request by weight. None, or only weights 0: 500 (unless the rule
    /// redirects). A backend without an address stands for an unresolved reference: its
    /// share of requests is answered 500.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<WeightedBackend>,
    /// Overrides the route's request timeout for this rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_millis: Option<u64>,
    /// Overrides the route's backend request timeout for this rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request_timeout_millis: Option<u64>,
}

/// Conditions that must all hold (those left out hold).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRequestMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<ValueMatch>,
    /// One of [`HTTP_METHODS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// The methods a match may name (the Gateway API's list).
pub const HTTP_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathMatch {
    #[serde(rename = "type")]
    pub kind: PathMatchType,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathMatchType {
    /// The path equals the value (case-sensitive).
    Exact,
    /// Segment-wise: `/foo` matches `/foo`, `/foo/` and `/foo/bar`, not `/foobar`; a trailing
    /// `/` of the value is ignored.
    PathPrefix,
    /// The whole path matches the regular expression ([`build_regex`]).
    RegularExpression,
}

/// A header (name case-insensitive) or query parameter (name case-sensitive) condition. When
/// a name appears more than once in one match, only its first entry counts (the Gateway
/// API's rule).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValueMatch {
    #[serde(rename = "type", default)]
    pub kind: ValueMatchType,
    pub name: String,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ValueMatchType {
    #[default]
    Exact,
    RegularExpression,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "type")]
pub enum HttpFilter {
    /// Edits the request headers the backend gets.
    RequestHeaderModifier(HeaderModifier),
    /// Edits the response headers the client gets.
    ResponseHeaderModifier(HeaderModifier),
    /// Answers with a redirect instead of forwarding.
    RequestRedirect(RequestRedirect),
    /// Rewrites the Host and/or path the backend gets.
    #[serde(rename = "URLRewrite")]
    UrlRewrite(UrlRewrite),
}

impl HttpFilter {
    pub fn type_name(&self) -> &'static str {
        match self {
            HttpFilter::RequestHeaderModifier(_) => "RequestHeaderModifier",
            HttpFilter::ResponseHeaderModifier(_) => "ResponseHeaderModifier",
            HttpFilter::RequestRedirect(_) => "RequestRedirect",
            HttpFilter::UrlRewrite(_) => "URLRewrite",
        }
    }
}

/// `set` replaces a header's values, `add` appends one, `remove` drops all; applied in that
/// order. Names compare case-insensitively.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderModifier {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<HeaderValue>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<HeaderValue>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderValue {
    pub name: String,
    pub value: String,
}

/// Fields left out keep the request's: scheme (the listener's), hostname (the Host without
/// its port), path and query. The port, when left out, is the scheme's well-known one if
/// `scheme` is set, else the listener's; 80 for `http` and 443 for `https` are not written.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestRedirect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<RedirectScheme>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
    /// One of [`REDIRECT_STATUS_CODES`]; absent: 302.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
}

pub const REDIRECT_STATUS_CODES: [u16; 5] = [301, 302, 303, 307, 308];
pub const DEFAULT_REDIRECT_STATUS: u16 = 302;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RedirectScheme {
    Http,
    Https,
}

impl RedirectScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            RedirectScheme::Http => "http",
            RedirectScheme::Https => "https",
        }
    }

    pub fn well_known_port(self) -> u16 {
        match self {
            RedirectScheme::Http => 80,
            RedirectScheme::Https => 443,
        }
    }
}

/// The backend gets `hostname` as its Host (X-Forwarded-Host keeps the client's) and/or the
/// rewritten path (the query is kept).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UrlRewrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathModifier {
    #[serde(rename = "type")]
    pub kind: PathModifierType,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathModifierType {
    /// The whole path becomes the value.
    ReplaceFullPath,
    /// The matched `PathPrefix` is replaced by the value (only in rules whose matches are all
    /// `PathPrefix` or have no path): prefix `/foo` to `/bar` turns `/foo/baz` into
    /// `/bar/baz`, to `/` (or the empty string) into `/baz`.
    ReplacePrefixMatch,
}

/// A backend and its share of requests (weight / sum of the rule's weights).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightedBackend {
    /// Absent: an unresolved reference (its share is answered 500 or, for passthrough,
    /// closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendAddress>,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// TLS towards this backend (HTTP routes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_tls: Option<BackendTlsFiles>,
}

fn default_weight() -> u32 {
    1
}

/// A route of a `tlsPassthrough` listener: ClientHellos whose SNI it serves go, unopened, to
/// one of its backends by weight.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PassthroughRoute {
    pub name: String,
    /// As for HTTP routes; `*` also takes ClientHellos without SNI.
    pub hostnames: Vec<String>,
    pub backends: Vec<WeightedBackend>,
}

/// The `regex` crate builds automata that match in linear time; the size limits bound what
/// compiling one may take. Anchored: the whole path or value must match.
pub fn build_regex(pattern: &str) -> Result<regex::Regex, RuleError> {
    if pattern.len() > MAX_REGEX_LENGTH {
        return Err(error("", format!("longer than {MAX_REGEX_LENGTH} bytes")));
    }
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_DFA_SIZE_LIMIT)
        .build()
        .map_err(|source| error("", format!("not a usable regular expression: {source}")))
}

/// How many more regular expressions a config may compile ([`MAX_REGEXES`]).
#[derive(Debug)]
pub struct RegexBudget {
    left: usize,
}

impl Default for RegexBudget {
    fn default() -> Self {
        RegexBudget { left: MAX_REGEXES }
    }
}

impl RegexBudget {
    fn spend(&mut self, pattern: &str, field: &str) -> Result<(), RuleError> {
        if self.left == 0 {
            return Err(error(
                field,
                format!("more than {MAX_REGEXES} regular expressions in one agent config"),
            ));
        }
        self.left -= 1;
        build_regex(pattern)
            .map(|_| ())
            .map_err(|e| error(field, e.message))
    }
}

/// Hostnames of a route: DNS names, `*.`-wildcards and `*`.
pub fn check_hostname_pattern(pattern: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    is_dns_name(pattern.strip_prefix("*.").unwrap_or(pattern))
}

/// Letters, digits, `-` and dots, labels of 1-63 characters, one trailing dot allowed.
pub fn is_dns_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
        })
}

/// A header name as HTTP allows it (RFC 9110 token characters).
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HEADER_NAME_LENGTH
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}

/// A header value HTTP can carry: visible ASCII, spaces and tabs, no leading or trailing
/// whitespace.
pub fn is_header_value(value: &str) -> bool {
    value.len() <= MAX_HEADER_VALUE_LENGTH
        && value.trim_matches([' ', '\t']).len() == value.len()
        && value
            .bytes()
            .all(|byte| byte == b'\t' || (0x20..0x7f).contains(&byte))
}

/// Headers a request modifier may not touch: those the agent sets itself (Host, forwarding
/// and tailnet identity headers: a route must not be able to forge who the client is) and
/// those that frame the message.
pub fn is_reserved_request_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    is_framing_header(&name)
        || matches!(name.as_str(), "host" | "expect" | "forwarded")
        || name.starts_with("tailscale-")
        || name.starts_with("x-forwarded-")
}

/// Headers a response modifier may not touch: those that frame the message.
pub fn is_reserved_response_header(name: &str) -> bool {
    is_framing_header(&name.to_ascii_lowercase())
}

fn is_framing_header(lower: &str) -> bool {
    matches!(
        lower,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "transfer-encoding"
            | "upgrade"
            | "trailer"
            | "content-length"
    )
}

/// A path of a match or a modifier: starts with `/`, visible ASCII without `?` and `#`.
fn is_path(value: &str) -> bool {
    value.starts_with('/')
        && value.len() <= MAX_PATH_LENGTH
        && value
            .bytes()
            .all(|byte| (0x21..0x7f).contains(&byte) && byte != b'?' && byte != b'#')
}

/// Checks the rules of one HTTP route; `at` is the route's field path.
pub fn check_http_rules(
    rules: &[HttpRule],
    at: &str,
    regexes: &mut RegexBudget,
) -> Result<(), RuleError> {
    if rules.len() > MAX_RULES_PER_ROUTE {
        return Err(error(
            format!("{at}.rules"),
            format!("more than {MAX_RULES_PER_ROUTE} rules"),
        ));
    }
    for (index, rule) in rules.iter().enumerate() {
        check_http_rule(rule, &format!("{at}.rules[{index}]"), regexes)?;
    }
    Ok(())
}

fn check_http_rule(rule: &HttpRule, at: &str, regexes: &mut RegexBudget) -> Result<(), RuleError> {
    if rule.matches.len() > MAX_MATCHES_PER_RULE {
        return Err(error(
            format!("{at}.matches"),
            format!("more than {MAX_MATCHES_PER_RULE} matches"),
        ));
    }
    for (index, request_match) in rule.matches.iter().enumerate() {
        check_match(request_match, &format!("{at}.matches[{index}]"), regexes)?;
    }
    check_filters(rule, at)?;
    check_backends(&rule.backends, &format!("{at}.backends"), true)?;
    for (field, value) in [
        ("requestTimeoutMillis", rule.request_timeout_millis),
        (
            "backendRequestTimeoutMillis",
            rule.backend_request_timeout_millis,
        ),
    ] {
        if value == Some(0) {
            return Err(error(format!("{at}.{field}"), "must be at least 1"));
        }
    }
    Ok(())
}

fn check_match(
    request_match: &HttpRequestMatch,
    at: &str,
    regexes: &mut RegexBudget,
) -> Result<(), RuleError> {
    if let Some(path) = &request_match.path {
        let field = format!("{at}.path.value");
        match path.kind {
            PathMatchType::Exact | PathMatchType::PathPrefix => {
                if !is_path(&path.value) {
                    return Err(error(
                        field,
                        format!(
                            "{:?} is not a path (starts with /, at most {MAX_PATH_LENGTH} visible ASCII characters, no ? or #)",
                            path.value
                        ),
                    ));
                }
            }
            PathMatchType::RegularExpression => regexes.spend(&path.value, &field)?,
        }
    }
    for (list, entries, bound) in [
        ("headers", &request_match.headers, MAX_HEADER_MATCHES),
        (
            "queryParams",
            &request_match.query_params,
            MAX_QUERY_PARAM_MATCHES,
        ),
    ] {
        if entries.len() > bound {
            return Err(error(
                format!("{at}.{list}"),
                format!("more than {bound} entries"),
            ));
        }
        for (index, entry) in entries.iter().enumerate() {
            let field = format!("{at}.{list}[{index}]");
            let name_ok = if list == "headers" {
                is_header_name(&entry.name)
            } else {
                !entry.name.is_empty() && entry.name.len() <= MAX_HEADER_NAME_LENGTH
            };
            if !name_ok {
                return Err(error(
                    format!("{field}.name"),
                    format!("{:?} is not a valid name", entry.name),
                ));
            }
            match entry.kind {
                ValueMatchType::Exact if entry.value.len() > MAX_HEADER_VALUE_LENGTH => {
                    return Err(error(
                        format!("{field}.value"),
                        format!("longer than {MAX_HEADER_VALUE_LENGTH} bytes"),
                    ));
                }
                ValueMatchType::Exact => {}
                ValueMatchType::RegularExpression => {
                    regexes.spend(&entry.value, &format!("{field}.value"))?;
                }
            }
        }
    }
    if let Some(method) = &request_match.method
        && !HTTP_METHODS.contains(&method.as_str())
    {
        return Err(error(
            format!("{at}.method"),
            format!("{method:?} is not one of {}", HTTP_METHODS.join(", ")),
        ));
    }
    Ok(())
}

fn check_filters(rule: &HttpRule, at: &str) -> Result<(), RuleError> {
    if rule.filters.len() > MAX_FILTERS_PER_RULE {
        return Err(error(
            format!("{at}.filters"),
            format!("more than {MAX_FILTERS_PER_RULE} filters"),
        ));
    }
    let mut seen: Vec<&'static str> = Vec::new();
    for (index, filter) in rule.filters.iter().enumerate() {
        let field = format!("{at}.filters[{index}]");
        let kind = filter.type_name();
        if seen.contains(&kind) {
            return Err(error(field, format!("a second {kind} filter")));
        }
        seen.push(kind);
        match filter {
            HttpFilter::RequestHeaderModifier(modifier) => {
                check_header_modifier(modifier, &field, is_reserved_request_header)?;
            }
            HttpFilter::ResponseHeaderModifier(modifier) => {
                check_header_modifier(modifier, &field, is_reserved_response_header)?;
            }
            HttpFilter::RequestRedirect(redirect) => {
                check_redirect(redirect, &field)?;
                check_path_modifier(redirect.path.as_ref(), rule, &format!("{field}.path"))?;
            }
            HttpFilter::UrlRewrite(rewrite) => {
                if let Some(hostname) = &rewrite.hostname
                    && !is_dns_name(hostname)
                {
                    return Err(error(
                        format!("{field}.hostname"),
                        format!("{hostname:?} is not a DNS name"),
                    ));
                }
                check_path_modifier(rewrite.path.as_ref(), rule, &format!("{field}.path"))?;
            }
        }
    }
    if seen.contains(&"RequestRedirect") && seen.contains(&"URLRewrite") {
        return Err(error(
            format!("{at}.filters"),
            "RequestRedirect and URLRewrite cannot be combined",
        ));
    }
    Ok(())
}

fn check_header_modifier(
    modifier: &HeaderModifier,
    at: &str,
    reserved: fn(&str) -> bool,
) -> Result<(), RuleError> {
    fn pairs(entries: &[HeaderValue]) -> Vec<(&str, Option<&str>)> {
        entries
            .iter()
            .map(|entry| (entry.name.as_str(), Some(entry.value.as_str())))
            .collect()
    }
    let removed = modifier
        .remove
        .iter()
        .map(|name| (name.as_str(), None))
        .collect();
    for (list, entries) in [
        ("set", pairs(&modifier.set)),
        ("add", pairs(&modifier.add)),
        ("remove", removed),
    ] {
        let len = entries.len();
        if len > MAX_HEADER_MODIFIER_ENTRIES {
            return Err(error(
                format!("{at}.{list}"),
                format!("more than {MAX_HEADER_MODIFIER_ENTRIES} entries"),
            ));
        }
        let mut names: Vec<String> = Vec::with_capacity(len);
        for (index, (name, value)) in entries.into_iter().enumerate() {
            let field = format!("{at}.{list}[{index}]");
            if !is_header_name(name) {
                return Err(error(field, format!("{name:?} is not a header name")));
            }
            if reserved(name) {
                return Err(error(
                    field,
                    format!(
                        "{name} is set by the agent or frames the message; it cannot be modified"
                    ),
                ));
            }
            let lower = name.to_ascii_lowercase();
            if names.contains(&lower) {
                return Err(error(field, format!("{name} is listed twice")));
            }
            names.push(lower);
            if let Some(value) = value
                && !is_header_value(value)
            {
                return Err(error(
                    format!("{field}.value"),
                    "not a header value (visible ASCII, at most 4096 bytes, no surrounding whitespace)",
                ));
            }
        }
    }
    Ok(())
}

fn check_redirect(redirect: &RequestRedirect, at: &str) -> Result<(), RuleError> {
    if let Some(hostname) = &redirect.hostname
        && !is_dns_name(hostname)
    {
        return Err(error(
            format!("{at}.hostname"),
            format!("{hostname:?} is not a DNS name"),
        ));
    }
    if redirect.port == Some(0) {
        return Err(error(format!("{at}.port"), "must be 1-65535"));
    }
    if let Some(code) = redirect.status_code
        && !REDIRECT_STATUS_CODES.contains(&code)
    {
        return Err(error(
            format!("{at}.statusCode"),
            format!("{code} is not one of 301, 302, 303, 307, 308"),
        ));
    }
    Ok(())
}

fn check_path_modifier(
    modifier: Option<&PathModifier>,
    rule: &HttpRule,
    at: &str,
) -> Result<(), RuleError> {
    let Some(modifier) = modifier else {
        return Ok(());
    };
    match modifier.kind {
        PathModifierType::ReplaceFullPath => {
            if !is_path(&modifier.value) {
                return Err(error(
                    format!("{at}.value"),
                    format!("{:?} is not a path", modifier.value),
                ));
            }
        }
        PathModifierType::ReplacePrefixMatch => {
            if !modifier.value.is_empty() && !is_path(&modifier.value) {
                return Err(error(
                    format!("{at}.value"),
                    format!("{:?} is not a path (or empty)", modifier.value),
                ));
            }
            let other_match = rule.matches.iter().position(|request_match| {
                request_match
                    .path
                    .as_ref()
                    .is_some_and(|path| path.kind != PathMatchType::PathPrefix)
            });
            if let Some(index) = other_match {
                return Err(error(
                    format!("{at}.type"),
                    format!(
                        "ReplacePrefixMatch needs PathPrefix matches, but matches[{index}] is another type"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Backends of a rule (`tls_allowed`) or of a passthrough route.
pub fn check_backends(
    backends: &[WeightedBackend],
    at: &str,
    tls_allowed: bool,
) -> Result<(), RuleError> {
    if backends.len() > MAX_BACKENDS {
        return Err(error(at, format!("more than {MAX_BACKENDS} backends")));
    }
    for (index, backend) in backends.iter().enumerate() {
        let field = format!("{at}[{index}]");
        if backend.weight > MAX_BACKEND_WEIGHT {
            return Err(error(
                format!("{field}.weight"),
                format!("must be 0-{MAX_BACKEND_WEIGHT}"),
            ));
        }
        if let Some(address) = &backend.backend {
            if address.host.trim().is_empty() {
                return Err(error(format!("{field}.backend.host"), "must not be empty"));
            }
            if address.port == 0 {
                return Err(error(format!("{field}.backend.port"), "must be 1-65535"));
            }
        }
        match (&backend.backend_tls, tls_allowed) {
            (Some(_), false) => {
                return Err(error(
                    format!("{field}.backendTls"),
                    "passthrough does not originate TLS",
                ));
            }
            (Some(tls), true) => {
                if tls.server_name.trim().is_empty() {
                    return Err(error(
                        format!("{field}.backendTls.serverName"),
                        "must not be empty",
                    ));
                }
                if tls.ca_file.trim().is_empty() {
                    return Err(error(
                        format!("{field}.backendTls.caFile"),
                        "must not be empty",
                    ));
                }
            }
            (None, _) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
