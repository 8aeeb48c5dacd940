//! HTTPRoute rules: validation (a rule with a value this implementation does not support is
//! dropped, with the spec's reason), translation into plan entries and actions, and the
//! precedence order of entries from all routes of one hostname.

use std::cmp::{Ordering, Reverse};

use tailnet_gateway_api::conditions::route::reasons;
use tailnet_gateway_api::httproute::{
    HTTPHeader, HTTPHeaderFilter, HTTPPathModifier, HTTPRouteFilter, HTTPRouteMatch, HTTPRouteRule,
    HTTPRouteTimeouts, filter_types, methods, path_match_types, path_modifier_types,
    value_match_types,
};
use tailnet_gateway_api::{BackendRef, HTTPRoute};

use super::Problem;
use super::plan::{
    BackendTarget, HeaderChanges, HttpAction, HttpBackend, HttpEntry, HttpOutcome, NameValue,
    PathMatch, PathRewrite, Redirect, UrlRewrite,
};
use super::routes::{RouteView, weight};

/// A valid rule: its entries (one per match; `action` still 0) and its action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledRule {
    pub index: usize,
    pub entries: Vec<HttpEntry>,
    pub action: HttpAction,
}

/// The rules of one route: the valid ones, and why the others were dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompiledRoute {
    pub rules: Vec<CompiledRule>,
    /// `(rule index, problem)` of each dropped rule.
    pub dropped: Vec<(usize, Problem)>,
}

/// Compiles every rule of a route; `resolve` gives each backendRef's target.
pub fn compile(
    route: &HTTPRoute,
    view: &RouteView<'_>,
    resolve: &dyn Fn(&BackendRef) -> BackendTarget,
) -> CompiledRoute {
    // The CRD defaults an absent rule list to one rule matching every path (no backends).
    let default_rules = [HTTPRouteRule::default()];
    let rules = if route.spec.rules.is_empty() {
        &default_rules[..]
    } else {
        &route.spec.rules[..]
    };
    let mut compiled = CompiledRoute::default();
    for (index, rule) in rules.iter().enumerate() {
        match compile_rule(index, rule, view, resolve) {
            Ok(rule) => compiled.rules.push(rule),
            Err(problem) => compiled.dropped.push((index, problem)),
        }
    }
    compiled
}

fn unsupported(message: impl Into<String>) -> Problem {
    Problem::new(reasons::UNSUPPORTED_VALUE, message)
}

fn compile_rule(
    index: usize,
    rule: &HTTPRouteRule,
    view: &RouteView<'_>,
    resolve: &dyn Fn(&BackendRef) -> BackendTarget,
) -> Result<CompiledRule, Problem> {
    let default_match = [HTTPRouteMatch::default()];
    let matches = if rule.matches.is_empty() {
        &default_match[..]
    } else {
        &rule.matches[..]
    };
    let entries = matches
        .iter()
        .map(compile_match)
        .collect::<Result<Vec<_>, _>>()?;
    let filters = compile_filters(&rule.filters, true)?;
    let prefix_rewrite = [filters.redirect_path(), filters.rewrite_path()]
        .into_iter()
        .flatten()
        .any(|p| matches!(p, PathRewrite::ReplacePrefixMatch(_)));
    if prefix_rewrite
        && entries
            .iter()
            .any(|e| !matches!(e.path, PathMatch::PathPrefix(_)))
    {
        return Err(unsupported(
            "ReplacePrefixMatch needs every match of the rule to be a PathPrefix match",
        ));
    }
    let (request_timeout_ms, backend_request_timeout_ms) =
        compile_timeouts(rule.timeouts.as_ref())?;
    let outcome = if filters.extension_ref {
        // An unresolvable custom filter must not be skipped: the rule answers with an error.
        HttpOutcome::Fixed { status: 500 }
    } else if let Some(redirect) = filters.redirect.clone() {
        HttpOutcome::Redirect(redirect)
    } else {
        let mut backends = Vec::new();
        for backend in &rule.backend_refs {
            let own = compile_filters(&backend.filters, false)?;
            let w = weight(&backend.backend_ref);
            if w > 0 {
                backends.push(HttpBackend {
                    weight: w,
                    target: resolve(&backend.backend_ref),
                    request_headers: own.request_headers,
                    response_headers: own.response_headers,
                });
            }
        }
        if backends.is_empty() {
            // No backendRefs, or all of weight 0: the spec's 500.
            HttpOutcome::Fixed { status: 500 }
        } else {
            HttpOutcome::Forward { backends }
        }
    };
    Ok(CompiledRule {
        index,
        entries,
        action: HttpAction {
            route: crate::backends::ObjectKey::new(&view.id.namespace, &view.id.name),
            rule_index: index,
            rule_name: rule.name.clone(),
            request_headers: filters.request_headers,
            response_headers: filters.response_headers,
            url_rewrite: filters.rewrite,
            outcome,
            request_timeout_ms,
            backend_request_timeout_ms,
        },
    })
}

fn compile_match(m: &HTTPRouteMatch) -> Result<HttpEntry, Problem> {
    let (kind, value) = m
        .path
        .as_ref()
        .map_or((None, None), |p| (p.type_.as_deref(), p.value.as_deref()));
    let value = value.unwrap_or("/");
    if !value.starts_with('/') {
        return Err(unsupported(format!("path {value:?} must start with /")));
    }
    let path = match kind.unwrap_or(path_match_types::PATH_PREFIX) {
        path_match_types::EXACT => PathMatch::Exact(value.to_string()),
        path_match_types::PATH_PREFIX => {
            // A trailing "/" is ignored: "/abc/" matches like "/abc".
            let trimmed = value.trim_end_matches('/');
            PathMatch::PathPrefix(if trimmed.is_empty() { "/" } else { trimmed }.to_string())
        }
        other => {
            return Err(unsupported(format!(
                "path match type {other} is not supported"
            )));
        }
    };
    let mut headers: Vec<NameValue> = Vec::new();
    for h in &m.headers {
        exact_only(h.type_.as_deref(), "header")?;
        let name = h.name.to_ascii_lowercase();
        // Of several entries with one (case-insensitive) name only the first counts.
        if !headers.iter().any(|x| x.name == name) {
            headers.push(NameValue {
                name,
                value: h.value.clone(),
            });
        }
    }
    let mut query_params: Vec<NameValue> = Vec::new();
    for q in &m.query_params {
        exact_only(q.type_.as_deref(), "query parameter")?;
        if !query_params.iter().any(|x| x.name == q.name) {
            query_params.push(NameValue {
                name: q.name.clone(),
                value: q.value.clone(),
            });
        }
    }
    if let Some(method) = &m.method
        && !methods::ALL.contains(&method.as_str())
    {
        return Err(unsupported(format!("method {method:?} is not supported")));
    }
    Ok(HttpEntry {
        path,
        method: m.method.clone(),
        headers,
        query_params,
        action: 0,
    })
}

fn exact_only(kind: Option<&str>, what: &str) -> Result<(), Problem> {
    match kind.unwrap_or(value_match_types::EXACT) {
        value_match_types::EXACT => Ok(()),
        other => Err(unsupported(format!(
            "{what} match type {other} is not supported"
        ))),
    }
}

#[derive(Default)]
struct Filters {
    request_headers: HeaderChanges,
    response_headers: HeaderChanges,
    redirect: Option<Redirect>,
    rewrite: Option<UrlRewrite>,
    extension_ref: bool,
}

impl Filters {
    fn redirect_path(&self) -> Option<&PathRewrite> {
        self.redirect.as_ref().and_then(|r| r.path.as_ref())
    }

    fn rewrite_path(&self) -> Option<&PathRewrite> {
        self.rewrite.as_ref().and_then(|r| r.path.as_ref())
    }
}

/// Validates and translates a filter list. On a rule (`rule_level`) every core and supported
/// extended filter is allowed; on a backendRef only the header modifiers.
fn compile_filters(filters: &[HTTPRouteFilter], rule_level: bool) -> Result<Filters, Problem> {
    let mut out = Filters::default();
    let mut seen: Vec<&str> = Vec::new();
    for filter in filters {
        let kind = filter.type_.as_str();
        if kind != filter_types::EXTENSION_REF && seen.contains(&kind) {
            return Err(unsupported(format!(
                "filter {kind} is given more than once"
            )));
        }
        seen.push(kind);
        let header_only = matches!(
            kind,
            filter_types::REQUEST_HEADER_MODIFIER | filter_types::RESPONSE_HEADER_MODIFIER
        );
        if !rule_level && !header_only {
            return Err(unsupported(format!(
                "filter {kind} is not supported on a backendRef (only header modifiers are)"
            )));
        }
        match kind {
            filter_types::REQUEST_HEADER_MODIFIER => {
                out.request_headers =
                    header_changes(filter.request_header_modifier.as_ref(), kind)?;
            }
            filter_types::RESPONSE_HEADER_MODIFIER => {
                out.response_headers =
                    header_changes(filter.response_header_modifier.as_ref(), kind)?;
            }
            filter_types::REQUEST_REDIRECT => out.redirect = Some(redirect(filter)?),
            filter_types::URL_REWRITE => out.rewrite = Some(rewrite(filter)?),
            filter_types::EXTENSION_REF => out.extension_ref = true,
            other => return Err(unsupported(format!("filter {other} is not supported"))),
        }
    }
    if out.redirect.is_some() && out.rewrite.is_some() {
        return Err(Problem::new(
            reasons::INCOMPATIBLE_FILTERS,
            "RequestRedirect and URLRewrite cannot be combined in one rule",
        ));
    }
    Ok(out)
}

/// One action per header name (case-insensitive) across set, add and remove.
fn header_changes(body: Option<&HTTPHeaderFilter>, kind: &str) -> Result<HeaderChanges, Problem> {
    let body = body.ok_or_else(|| unsupported(format!("filter {kind} has no configuration")))?;
    let mut names: Vec<String> = Vec::new();
    let mut claim = |name: &str| -> Result<String, Problem> {
        let lower = name.to_ascii_lowercase();
        if names.contains(&lower) {
            return Err(unsupported(format!(
                "filter {kind} names header {name} more than once"
            )));
        }
        names.push(lower.clone());
        Ok(lower)
    };
    let mut pairs = |list: &[HTTPHeader]| -> Result<Vec<NameValue>, Problem> {
        list.iter()
            .map(|h| {
                Ok(NameValue {
                    name: claim(&h.name)?,
                    value: h.value.clone(),
                })
            })
            .collect()
    };
    let set = pairs(&body.set)?;
    let add = pairs(&body.add)?;
    let remove = body
        .remove
        .iter()
        .map(|name| claim(name))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HeaderChanges { set, add, remove })
}

fn path_rewrite(modifier: Option<&HTTPPathModifier>) -> Result<Option<PathRewrite>, Problem> {
    let Some(m) = modifier else { return Ok(None) };
    match m.type_.as_str() {
        path_modifier_types::REPLACE_FULL_PATH => m
            .replace_full_path
            .clone()
            .map(|p| Some(PathRewrite::ReplaceFullPath(p)))
            .ok_or_else(|| unsupported("ReplaceFullPath needs replaceFullPath")),
        path_modifier_types::REPLACE_PREFIX_MATCH => m
            .replace_prefix_match
            .clone()
            .map(|p| Some(PathRewrite::ReplacePrefixMatch(p)))
            .ok_or_else(|| unsupported("ReplacePrefixMatch needs replacePrefixMatch")),
        other => Err(unsupported(format!(
            "path modifier type {other} is not supported"
        ))),
    }
}

fn redirect(filter: &HTTPRouteFilter) -> Result<Redirect, Problem> {
    let body = filter
        .request_redirect
        .as_ref()
        .ok_or_else(|| unsupported("filter RequestRedirect has no configuration"))?;
    if let Some(scheme) = &body.scheme
        && scheme != "http"
        && scheme != "https"
    {
        return Err(unsupported(format!(
            "redirect scheme {scheme:?} is not supported"
        )));
    }
    let status_code = match body.status_code.unwrap_or(302) {
        code @ (301 | 302 | 303 | 307 | 308) => code as u16,
        other => {
            return Err(unsupported(format!(
                "redirect status code {other} is not supported"
            )));
        }
    };
    let port = body
        .port
        .map(|p| {
            u16::try_from(p)
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| unsupported(format!("redirect port {p} is not a port")))
        })
        .transpose()?;
    Ok(Redirect {
        scheme: body.scheme.clone(),
        hostname: body.hostname.clone(),
        path: path_rewrite(body.path.as_ref())?,
        port,
        status_code,
    })
}

fn rewrite(filter: &HTTPRouteFilter) -> Result<UrlRewrite, Problem> {
    let body = filter
        .url_rewrite
        .as_ref()
        .ok_or_else(|| unsupported("filter URLRewrite has no configuration"))?;
    Ok(UrlRewrite {
        hostname: body.hostname.clone(),
        path: path_rewrite(body.path.as_ref())?,
    })
}

type Timeouts = (Option<u64>, Option<u64>);

/// Timeouts in milliseconds; the backend timeout may not exceed the request timeout.
fn compile_timeouts(timeouts: Option<&HTTPRouteTimeouts>) -> Result<Timeouts, Problem> {
    let Some(t) = timeouts else {
        return Ok((None, None));
    };
    let parse = |field: &str, value: &Option<String>| {
        value
            .as_deref()
            .map(|v| {
                parse_duration_ms(v).ok_or_else(|| {
                    unsupported(format!(
                        "timeouts.{field} {v:?} is not a Gateway API duration"
                    ))
                })
            })
            .transpose()
    };
    let request = parse("request", &t.request)?;
    let backend = parse("backendRequest", &t.backend_request)?;
    if let (Some(r), Some(b)) = (request, backend)
        && r != 0
        && (b == 0 || b > r)
    {
        return Err(unsupported(
            "timeouts.backendRequest must not be longer than timeouts.request",
        ));
    }
    Ok((request, backend))
}

/// A GEP-2257 duration (`^([0-9]{1,5}(h|m|s|ms)){1,4}$`) in milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    let (mut i, mut parts, mut total) = (0usize, 0usize, 0u64);
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > 5 {
            return None;
        }
        let number: u64 = text[start..i].parse().ok()?;
        let unit_ms = match (bytes.get(i), bytes.get(i + 1)) {
            (Some(b'm'), Some(b's')) => {
                i += 2;
                1
            }
            (Some(b'h'), _) => {
                i += 1;
                3_600_000
            }
            (Some(b'm'), _) => {
                i += 1;
                60_000
            }
            (Some(b's'), _) => {
                i += 1;
                1_000
            }
            _ => return None,
        };
        total += number * unit_ms;
        parts += 1;
        if parts > 4 {
            return None;
        }
    }
    (parts > 0).then_some(total)
}

/// The spec's precedence between two entries of one hostname: an Exact path before a
/// prefix; the longer prefix; a method match; more header matches; more query matches;
/// then the older route, then `namespace/name`; then rule order, then match order.
pub fn entry_precedence(
    a: (&HttpEntry, &RouteView<'_>, usize, usize),
    b: (&HttpEntry, &RouteView<'_>, usize, usize),
) -> Ordering {
    fn specificity(e: &HttpEntry) -> (bool, Reverse<usize>, bool, Reverse<usize>, Reverse<usize>) {
        let (prefix, len) = match &e.path {
            PathMatch::Exact(p) => (false, p.len()),
            PathMatch::PathPrefix(p) => (true, p.len()),
        };
        (
            prefix,
            Reverse(len),
            e.method.is_none(),
            Reverse(e.headers.len()),
            Reverse(e.query_params.len()),
        )
    }
    let (ea, ra, rule_a, match_a) = a;
    let (eb, rb, rule_b, match_b) = b;
    specificity(ea)
        .cmp(&specificity(eb))
        .then_with(|| ra.age_key().cmp(&rb.age_key()))
        .then_with(|| (rule_a, match_a).cmp(&(rule_b, match_b)))
}
