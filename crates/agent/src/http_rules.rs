//! Gateway API rules of an HTTP route, compiled once per config and evaluated per request.
//! Pure: the request's method, path, query and headers in; the rule that serves it (the first
//! in the configured order whose matches it meets — the operator orders rules by the spec's
//! precedence), its header edits, redirect, rewrite and backend choice out.

use std::borrow::Cow;

use http::Method;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use regex::Regex;
use tailnet_api::agent_config::{
    DEFAULT_REDIRECT_STATUS, HeaderModifier, HttpFilter, HttpRequestMatch, HttpRule, PathMatchType,
    PathModifier, PathModifierType, RequestRedirect, UrlRewrite, ValueMatch, ValueMatchType,
    build_regex,
};

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> CompileError {
    CompileError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// What a request is matched against.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    /// Without the `?`.
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
}

/// One rule, ready to evaluate.
#[derive(Debug)]
pub struct CompiledRule {
    /// Empty: every request.
    matches: Vec<CompiledMatch>,
    pub request_headers: Option<HeaderEdits>,
    pub response_headers: Option<HeaderEdits>,
    pub redirect: Option<RequestRedirect>,
    pub rewrite: Option<UrlRewrite>,
    /// The backends' weights, in the configured order.
    pub weights: Vec<u32>,
}

#[derive(Debug)]
struct CompiledMatch {
    path: PathCondition,
    headers: Vec<(HeaderName, ValueCondition)>,
    query: Vec<(String, ValueCondition)>,
    method: Option<Method>,
}

#[derive(Debug)]
enum PathCondition {
    Any,
    Exact(String),
    /// Without trailing `/` (`/` itself is the empty prefix: every path).
    Prefix(String),
    Regex(Regex),
}

#[derive(Debug)]
enum ValueCondition {
    Exact(String),
    Regex(Regex),
}

impl ValueCondition {
    fn compile(entry: &ValueMatch, field: &str) -> Result<Self, CompileError> {
        match entry.kind {
            ValueMatchType::Exact => Ok(ValueCondition::Exact(entry.value.clone())),
            ValueMatchType::RegularExpression => build_regex(&entry.value)
                .map(ValueCondition::Regex)
                .map_err(|error| invalid(field, error.message)),
        }
    }

    fn holds(&self, value: &[u8]) -> bool {
        match self {
            ValueCondition::Exact(expected) => value == expected.as_bytes(),
            ValueCondition::Regex(regex) => {
                std::str::from_utf8(value).is_ok_and(|value| regex.is_match(value))
            }
        }
    }
}

/// The rule that serves a request.
#[derive(Debug)]
pub struct Selected<'r> {
    pub index: usize,
    pub rule: &'r CompiledRule,
    /// The `PathPrefix` (without trailing `/`) of the match that matched: what
    /// `ReplacePrefixMatch` replaces; empty when the match had no path condition (the
    /// default prefix `/`).
    pub matched_prefix: &'r str,
}

impl CompiledRule {
    /// `at` names the rule in errors (its regular expressions were checked by the config
    /// validation already; this only fails on a config that skipped it).
    pub fn compile(rule: &HttpRule, at: &str) -> Result<Self, CompileError> {
        let matches = rule
            .matches
            .iter()
            .enumerate()
            .map(|(index, request_match)| {
                CompiledMatch::compile(request_match, &format!("{at}.matches[{index}]"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut compiled = CompiledRule {
            matches,
            request_headers: None,
            response_headers: None,
            redirect: None,
            rewrite: None,
            weights: rule.backends.iter().map(|backend| backend.weight).collect(),
        };
        for (index, filter) in rule.filters.iter().enumerate() {
            let field = format!("{at}.filters[{index}]");
            match filter {
                HttpFilter::RequestHeaderModifier(modifier) => {
                    compiled.request_headers = Some(HeaderEdits::compile(modifier, &field)?);
                }
                HttpFilter::ResponseHeaderModifier(modifier) => {
                    compiled.response_headers = Some(HeaderEdits::compile(modifier, &field)?);
                }
                HttpFilter::RequestRedirect(redirect) => compiled.redirect = Some(redirect.clone()),
                HttpFilter::UrlRewrite(rewrite) => compiled.rewrite = Some(rewrite.clone()),
            }
        }
        Ok(compiled)
    }

    /// The rule for a route without rules: every request, one backend.
    pub fn single_backend() -> Self {
        CompiledRule {
            matches: Vec::new(),
            request_headers: None,
            response_headers: None,
            redirect: None,
            rewrite: None,
            weights: vec![1],
        }
    }

    /// The prefix of the first of its matches the request meets; `None` if it meets none.
    fn matched_prefix(&self, request: &RequestView<'_>) -> Option<&str> {
        if self.matches.is_empty() {
            return Some("");
        }
        self.matches
            .iter()
            .find(|candidate| candidate.holds(request))
            .map(|found| match &found.path {
                PathCondition::Prefix(prefix) => prefix.as_str(),
                _ => "",
            })
    }
}

impl CompiledMatch {
    fn compile(request_match: &HttpRequestMatch, at: &str) -> Result<Self, CompileError> {
        let path = match &request_match.path {
            None => PathCondition::Any,
            Some(path) => match path.kind {
                PathMatchType::Exact => PathCondition::Exact(path.value.clone()),
                PathMatchType::PathPrefix => {
                    PathCondition::Prefix(path.value.trim_end_matches('/').to_owned())
                }
                PathMatchType::RegularExpression => build_regex(&path.value)
                    .map(PathCondition::Regex)
                    .map_err(|error| invalid(format!("{at}.path.value"), error.message))?,
            },
        };
        // A name listed twice: only its first entry counts (the Gateway API's rule).
        let mut headers: Vec<(HeaderName, ValueCondition)> = Vec::new();
        for (index, entry) in request_match.headers.iter().enumerate() {
            let field = format!("{at}.headers[{index}]");
            let name = HeaderName::from_bytes(entry.name.as_bytes())
                .map_err(|_| invalid(format!("{field}.name"), "not a header name"))?;
            if headers.iter().all(|(seen, _)| *seen != name) {
                headers.push((
                    name,
                    ValueCondition::compile(entry, &format!("{field}.value"))?,
                ));
            }
        }
        let mut query: Vec<(String, ValueCondition)> = Vec::new();
        for (index, entry) in request_match.query_params.iter().enumerate() {
            let field = format!("{at}.queryParams[{index}].value");
            if query.iter().all(|(seen, _)| *seen != entry.name) {
                query.push((entry.name.clone(), ValueCondition::compile(entry, &field)?));
            }
        }
        let method = request_match
            .method
            .as_deref()
            .map(|method| {
                Method::from_bytes(method.as_bytes())
                    .map_err(|_| invalid(format!("{at}.method"), "not a method"))
            })
            .transpose()?;
        Ok(CompiledMatch {
            path,
            headers,
            query,
            method,
        })
    }

    fn holds(&self, request: &RequestView<'_>) -> bool {
        let path_holds = match &self.path {
            PathCondition::Any => true,
            PathCondition::Exact(value) => request.path == value,
            PathCondition::Prefix(prefix) => prefix_matches(prefix, request.path),
            PathCondition::Regex(regex) => regex.is_match(request.path),
        };
        path_holds
            && self
                .method
                .as_ref()
                .is_none_or(|method| method == request.method)
            && self.headers.iter().all(|(name, condition)| {
                request
                    .headers
                    .get_all(name)
                    .iter()
                    .any(|value| condition.holds(value.as_bytes()))
            })
            && self.query.iter().all(|(name, condition)| {
                query_value(request.query, name)
                    .is_some_and(|value| condition.holds(value.as_bytes()))
            })
    }
}

/// Segment-wise: `prefix` (without trailing `/`) is the whole path or followed by `/`.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.is_empty(),
        None => false,
    }
}

/// The first rule, in order, whose matches the request meets.
pub fn select<'r>(rules: &'r [CompiledRule], request: &RequestView<'_>) -> Option<Selected<'r>> {
    rules.iter().enumerate().find_map(|(index, rule)| {
        rule.matched_prefix(request).map(|matched_prefix| Selected {
            index,
            rule,
            matched_prefix,
        })
    })
}

/// The (percent-decoded) value of the first `name` parameter in `query` (names compare
/// percent-decoded and case-sensitively; a repeated parameter's later values do not count).
pub fn query_value<'q>(query: Option<&'q str>, name: &str) -> Option<Cow<'q, str>> {
    query?
        .split('&')
        .filter(|pair| !pair.is_empty())
        .find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key) == name).then(|| percent_decode(value))
        })
}

/// `%XX` decoded; malformed escapes stay as they are; bytes that are not UTF-8 become U+FFFD.
fn percent_decode(text: &str) -> Cow<'_, str> {
    if !text.contains('%') {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        let escaped = (byte == b'%')
            .then(|| bytes.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(value) => {
                decoded.push(value);
                index += 3;
            }
            None => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&decoded).into_owned())
}

/// A compiled header modifier: `set` replaces, `add` appends, `remove` drops, in that order.
#[derive(Debug, Default)]
pub struct HeaderEdits {
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl HeaderEdits {
    pub fn compile(modifier: &HeaderModifier, at: &str) -> Result<Self, CompileError> {
        let pair = |entry: &tailnet_api::agent_config::HeaderValue, field: String| {
            let name = HeaderName::from_bytes(entry.name.as_bytes())
                .map_err(|_| invalid(format!("{field}.name"), "not a header name"))?;
            let value = HeaderValue::from_str(&entry.value)
                .map_err(|_| invalid(format!("{field}.value"), "not a header value"))?;
            Ok::<_, CompileError>((name, value))
        };
        let set = modifier
            .set
            .iter()
            .enumerate()
            .map(|(index, entry)| pair(entry, format!("{at}.set[{index}]")))
            .collect::<Result<_, _>>()?;
        let add = modifier
            .add
            .iter()
            .enumerate()
            .map(|(index, entry)| pair(entry, format!("{at}.add[{index}]")))
            .collect::<Result<_, _>>()?;
        let remove = modifier
            .remove
            .iter()
            .enumerate()
            .map(|(index, name)| {
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| invalid(format!("{at}.remove[{index}]"), "not a header name"))
            })
            .collect::<Result<_, _>>()?;
        Ok(HeaderEdits { set, add, remove })
    }

    pub fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
        for name in &self.remove {
            headers.remove(name);
        }
    }
}

/// The path a `ReplaceFullPath` or `ReplacePrefixMatch` modifier makes of `path`;
/// `matched_prefix` is [`Selected::matched_prefix`]. Prefix semantics as the Gateway API's
/// table: `/foo` → `/xyz` makes `/foo/bar` `/xyz/bar`, `/foo/` `/xyz/`, `/foo` `/xyz`; → `/`
/// or `` makes `/foo/bar` `/bar` and `/foo` `/`. Trailing `/` of prefix and value do not count.
pub fn modified_path(modifier: &PathModifier, path: &str, matched_prefix: &str) -> String {
    match modifier.kind {
        PathModifierType::ReplaceFullPath => modifier.value.clone(),
        PathModifierType::ReplacePrefixMatch => {
            let prefix = matched_prefix.trim_end_matches('/');
            // The prefix matched segment-wise, so the rest is empty or starts with `/`.
            let rest = path.strip_prefix(prefix).unwrap_or(path);
            let replacement = modifier.value.trim_end_matches('/');
            let joined = format!("{replacement}{rest}");
            if joined.is_empty() {
                "/".to_owned()
            } else if joined.starts_with('/') {
                joined
            } else {
                format!("/{joined}")
            }
        }
    }
}

/// The request as a redirect sees it.
#[derive(Clone, Copy, Debug)]
pub struct RedirectSource<'a> {
    /// `http` or `https`: the listener's.
    pub scheme: &'a str,
    /// The Host without its port.
    pub host: &'a str,
    /// The port the listener serves (the Gateway listener's port).
    pub listener_port: u16,
    pub path: &'a str,
    pub query: Option<&'a str>,
}

/// The status of a redirect (302 when not configured).
pub fn redirect_status(redirect: &RequestRedirect) -> u16 {
    redirect.status_code.unwrap_or(DEFAULT_REDIRECT_STATUS)
}

/// The `Location` of a redirect, per the Gateway API: scheme, hostname and path default to
/// the request's; the port to the scheme's well-known one when the redirect sets a scheme,
/// else to the listener's; `:80` on `http` and `:443` on `https` are left out. The query is
/// kept.
pub fn redirect_location(
    redirect: &RequestRedirect,
    source: &RedirectSource<'_>,
    matched_prefix: &str,
) -> String {
    let scheme = redirect
        .scheme
        .map_or(source.scheme, |scheme| scheme.as_str());
    let host = redirect.hostname.as_deref().unwrap_or(source.host);
    let port = redirect.port.unwrap_or_else(|| {
        redirect
            .scheme
            .map_or(source.listener_port, |scheme| scheme.well_known_port())
    });
    let path = match &redirect.path {
        Some(modifier) => Cow::Owned(modified_path(modifier, source.path, matched_prefix)),
        None => Cow::Borrowed(source.path),
    };
    let default_port = matches!((scheme, port), ("http", 80) | ("https", 443));
    let mut location = String::with_capacity(scheme.len() + host.len() + path.len() + 16);
    location.push_str(scheme);
    location.push_str("://");
    if host.contains(':') {
        // An IPv6 literal (the Host's brackets were taken off with the port).
        location.push('[');
        location.push_str(host);
        location.push(']');
    } else {
        location.push_str(host);
    }
    if !default_port {
        location.push(':');
        location.push_str(&port.to_string());
    }
    location.push_str(&path);
    if let Some(query) = source.query {
        location.push('?');
        location.push_str(query);
    }
    location
}

/// Picks a backend index by weight: `random(total)` must return a number below `total` (a
/// larger one counts as `total - 1`). `None` when no backend has weight (the spec's 500).
pub fn choose_backend(weights: &[u32], random: impl FnOnce(u64) -> u64) -> Option<usize> {
    let total: u64 = weights.iter().map(|weight| u64::from(*weight)).sum();
    if total == 0 {
        return None;
    }
    let mut point = random(total).min(total - 1);
    for (index, weight) in weights.iter().enumerate() {
        let weight = u64::from(*weight);
        if point < weight {
            return Some(index);
        }
        point -= weight;
    }
    None
}

#[cfg(test)]
mod tests;
