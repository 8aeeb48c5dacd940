//! Validation of the declarations, pure and shared by the controllers and `tailnet-operator
//! render`.
//!
//! The first half repeats what the CRD schema/CEL already enforce (the offline `render` command
//! never passes through an apiserver, and it must reject exactly the same input); the second
//! half needs other objects (the Tailnet, the operator namespace) and is only knowable by the
//! reconciler. Every error names the field (`spec.targets[remote-db].address`) and says what
//! to do.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::LazyLock;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use regex::Regex;

use crate::egress::TailnetEgressSpec;
use crate::ingress::{Expose, ExposeMode, TailnetIngressSpec};
use crate::patterns;
use crate::tailnet::TailnetSpec;

mod valid;

pub use valid::{
    BackendPort, DEFAULT_PROBE_INTERVAL, HostsConfigMap, ValidBackend, ValidEgress, ValidExpose,
    ValidIngress, ValidTailnet, ValidTarget, ValidTimeouts,
};

/// One invalid field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, e.g. `spec.exposes[web].port`.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Joins errors into one condition message.
pub fn summarize(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn regex(pattern: &'static str) -> Regex {
    // The patterns are compile-time constants covered by the tests below.
    Regex::new(pattern).unwrap_or_else(|e| panic!("invalid built-in pattern {pattern}: {e}"))
}

static DNS_LABEL: LazyLock<Regex> = LazyLock::new(|| regex(patterns::DNS_LABEL));
static SERVICE_NAME: LazyLock<Regex> = LazyLock::new(|| regex(patterns::SERVICE_NAME));
static DNS_SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| regex(patterns::DNS_SUBDOMAIN));
static HOSTNAME: LazyLock<Regex> = LazyLock::new(|| regex(patterns::HOSTNAME));
static TARGET_DNS_NAME: LazyLock<Regex> = LazyLock::new(|| regex(patterns::TARGET_DNS_NAME));
static DURATION: LazyLock<Regex> = LazyLock::new(|| regex(patterns::DURATION));
static PRINCIPAL: LazyLock<Regex> = LazyLock::new(|| regex(patterns::PRINCIPAL));
static NAME_TEMPLATE: LazyLock<Regex> = LazyLock::new(|| regex(patterns::NAME_TEMPLATE));
static SERVER_URL: LazyLock<Regex> = LazyLock::new(|| regex(patterns::SERVER_URL));
static TAG_PREFIX: LazyLock<Regex> = LazyLock::new(|| regex(patterns::TAG_PREFIX));
static LOG_FILTER: LazyLock<Regex> = LazyLock::new(|| regex(patterns::LOG_FILTER));
static PLACEHOLDER: LazyLock<Regex> = LazyLock::new(|| regex(r"\{[^}]*\}?"));

/// Where an egress target lives.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TargetAddress {
    Ip(IpAddr),
    Dns(String),
}

impl TargetAddress {
    /// Parses `address` as an IP, else as a lowercase DNS name.
    pub fn parse(field: &str, address: &str) -> Result<Self, FieldError> {
        if let Ok(ip) = address.parse::<IpAddr>() {
            return Ok(TargetAddress::Ip(ip));
        }
        if address.len() <= 253 && TARGET_DNS_NAME.is_match(address) {
            return Ok(TargetAddress::Dns(address.to_string()));
        }
        Err(FieldError::new(
            field,
            format!(
                "{address:?} is neither an IPv4/IPv6 address nor a lowercase DNS name; use e.g. 192.0.2.10, 2001:db8::10 or db.site.example.net"
            ),
        ))
    }
}

impl fmt::Display for TargetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetAddress::Ip(ip) => write!(f, "{ip}"),
            TargetAddress::Dns(name) => f.write_str(name),
        }
    }
}

/// Parses a Go/Kubernetes duration such as `600s` or `1m30s`.
pub fn parse_duration(field: &str, value: &str) -> Result<std::time::Duration, FieldError> {
    let invalid = || {
        FieldError::new(
            field,
            format!("{value:?} is not a duration; use e.g. 30s, 1m30s or 2h"),
        )
    };
    if value.len() > MAX_DURATION_TEXT || !DURATION.is_match(value) {
        return Err(invalid());
    }
    let duration = go_duration(value).ok_or_else(|| {
        FieldError::new(
            field,
            format!("{value:?} is longer than the maximum of 168h"),
        )
    })?;
    if duration.is_zero() {
        return Err(FieldError::new(field, "must be greater than zero"));
    }
    Ok(duration)
}

/// Longest duration string accepted (the CRD schema says the same).
pub const MAX_DURATION_TEXT: usize = 32;
/// Longest duration accepted: timeouts and probe intervals beyond a week are mistakes.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Sums the `<number><unit>` parts of a string that matched [`patterns::DURATION`] with
/// checked arithmetic; `None` beyond [`MAX_DURATION`]. (kube-core's parser panics on huge
/// values, found by the templates fuzz target.)
fn go_duration(value: &str) -> Option<std::time::Duration> {
    const UNITS: [(&str, u128); 7] = [
        ("ns", 1),
        ("us", 1_000),
        ("µs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
        ("m", 60_000_000_000),
        ("h", 3_600_000_000_000),
    ];
    let max = MAX_DURATION.as_nanos();
    let mut total: u128 = 0;
    let mut rest = value;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        // Longest unit first: "ms" before "m", "ns"/"us" before "s".
        let (unit, scale) = UNITS
            .iter()
            .filter(|(unit, _)| after.starts_with(unit))
            .max_by_key(|(unit, _)| unit.len())?;
        rest = &after[unit.len()..];
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let whole: u128 = whole.parse().ok()?;
        let mut part = whole.checked_mul(*scale)?;
        // Fractions beyond nanoseconds are dropped, as Go does.
        let mut place = *scale;
        for digit in fraction.bytes().take(20) {
            place /= 10;
            part = part.checked_add(u128::from(digit - b'0') * place)?;
        }
        total = total.checked_add(part)?;
        if total > max {
            return None;
        }
    }
    let nanos = u64::try_from(total).ok()?;
    Some(std::time::Duration::from_nanos(nanos))
}

/// Expands a name template with `{name}` and `{namespace}`; anything else is an error naming
/// the template field.
pub fn expand_template(
    field: &str,
    template: &str,
    name: &str,
    namespace: &str,
) -> Result<String, FieldError> {
    for placeholder in PLACEHOLDER.find_iter(template) {
        let p = placeholder.as_str();
        if p != "{name}" && p != "{namespace}" {
            return Err(FieldError::new(
                field,
                format!(
                    "unknown placeholder {p} in {template:?}; only {{name}} and {{namespace}} are allowed"
                ),
            ));
        }
    }
    if !template.contains("{name}") {
        return Err(FieldError::new(
            field,
            format!("{template:?} must contain {{name}} so that each expose gets its own hostname"),
        ));
    }
    if !NAME_TEMPLATE.is_match(template) {
        return Err(FieldError::new(
            field,
            format!(
                "{template:?} may only contain lowercase letters, digits, '-', '.', {{name}} and {{namespace}}"
            ),
        ));
    }
    let expanded = template
        .replace("{name}", name)
        .replace("{namespace}", namespace);
    if expanded.len() > 253 || !HOSTNAME.is_match(&expanded) {
        return Err(FieldError::new(
            field,
            format!("{template:?} expands to {expanded:?}, which is not a valid hostname"),
        ));
    }
    if let Some(label) = expanded.split('.').find(|label| label.len() > 63) {
        return Err(FieldError::new(
            field,
            format!(
                "{template:?} expands to {expanded:?}, whose label {label:?} is longer than 63 characters; shorten the template or the dnsLabel"
            ),
        ));
    }
    Ok(expanded)
}

/// A port in 1-65535, or an error naming `field`.
fn check_port(errors: &mut Vec<FieldError>, field: String, port: i32) -> Option<u16> {
    match u16::try_from(port) {
        Ok(valid) if valid > 0 => Some(valid),
        _ => {
            errors.push(FieldError::new(
                field,
                format!("port {port} is out of range; use 1-65535"),
            ));
            None
        }
    }
}

/// `true` when `value` matched; otherwise records an error naming `field`.
fn check_match(
    errors: &mut Vec<FieldError>,
    re: &Regex,
    max: usize,
    field: String,
    value: &str,
    what: &str,
) -> bool {
    if value.is_empty() || value.len() > max || !re.is_match(value) {
        errors.push(FieldError::new(field, format!("{value:?} is not {what}")));
        return false;
    }
    true
}

/// `Some` duration when `value` is absent or parses; `None` after recording the error.
fn check_duration(
    errors: &mut Vec<FieldError>,
    field: String,
    value: Option<&String>,
) -> Option<Option<Duration>> {
    match value.map(|v| parse_duration(&field, v)).transpose() {
        Ok(parsed) => Some(parsed),
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

/// Whether `value` is a policy principal (`group:`, `tag:`, `autogroup:`, `<user>@`, `*`).
pub fn is_principal(value: &str) -> bool {
    PRINCIPAL.is_match(value)
}

fn check_principals(errors: &mut Vec<FieldError>, field: &str, values: &[String]) {
    for (i, value) in values.iter().enumerate() {
        if !PRINCIPAL.is_match(value) {
            errors.push(FieldError::new(
                format!("{field}[{i}]"),
                format!("{value:?} is not a policy principal; use group:<name>, tag:<name>, autogroup:<name> or <user>@"),
            ));
        }
    }
}

/// All errors, or the value built while checking (only meaningful without errors).
fn finish<T>(errors: Vec<FieldError>, value: impl FnOnce() -> T) -> Result<T, Vec<FieldError>> {
    if errors.is_empty() {
        Ok(value())
    } else {
        Err(errors)
    }
}

/// Schema-level checks of a Tailnet, returning its checked parts.
pub fn valid_tailnet(spec: &TailnetSpec) -> Result<ValidTailnet, Vec<FieldError>> {
    let mut errors = Vec::new();
    if !SERVER_URL.is_match(&spec.server) {
        errors.push(FieldError::new(
            "spec.server",
            format!(
                "{:?} is not an http(s) URL; use e.g. https://control.example.net",
                spec.server
            ),
        ));
    }
    match &spec.api_secret_ref {
        Some(reference) => {
            check_match(
                &mut errors,
                &DNS_SUBDOMAIN,
                253,
                "spec.apiSecretRef.name".into(),
                &reference.name,
                "a Secret name",
            );
        }
        None if spec.policy.mode != crate::tailnet::PolicyMode::Contribute => {
            errors.push(FieldError::new(
                "spec.apiSecretRef",
                "required unless spec.policy.mode is Contribute (a contributor without a key gets its agents' pre-auth keys and node facts from the owner)",
            ));
        }
        None => {}
    }
    let dns = spec.dns.clone().unwrap_or_default();
    if let Some(ns) = &dns.hosts_config_map_namespace {
        check_match(
            &mut errors,
            &DNS_LABEL,
            63,
            "spec.dns.hostsConfigMapNamespace".into(),
            ns,
            "a namespace name",
        );
    }
    if let Some(cm) = &dns.hosts_config_map {
        check_match(
            &mut errors,
            &DNS_SUBDOMAIN,
            253,
            "spec.dns.hostsConfigMap".into(),
            cm,
            "a ConfigMap name",
        );
    }
    for (field, template) in [
        ("spec.dns.ingressNameTemplate", &dns.ingress_name_template),
        ("spec.dns.ingressAliasTemplate", &dns.ingress_alias_template),
    ] {
        if let Some(template) = template
            && let Err(e) = expand_template(field, template, "probe", "probe")
        {
            errors.push(e);
        }
    }
    let policy = &spec.policy;
    if policy.tag_owners.is_empty() {
        errors.push(FieldError::new(
            "spec.policy.tagOwners",
            "must name at least one owner of the generated tags, e.g. group:platform",
        ));
    }
    check_principals(&mut errors, "spec.policy.tagOwners", &policy.tag_owners);
    check_principals(
        &mut errors,
        "spec.policy.routeApprovers",
        &policy.route_approvers,
    );
    check_principals(
        &mut errors,
        "spec.policy.ingressSourceAllowlist",
        &policy.ingress_source_allowlist,
    );
    if !TAG_PREFIX.is_match(&policy.tag_prefix) {
        errors.push(FieldError::new(
            "spec.policy.tagPrefix",
            "must be 1-16 lowercase letters, digits or '-', starting with a letter",
        ));
    }
    if let Some(filter) = spec.agent.as_ref().and_then(|a| a.log_level.as_ref()) {
        check_match(
            &mut errors,
            &LOG_FILTER,
            256,
            "spec.agent.logLevel".into(),
            filter,
            "a log filter: a level such as info or debug, or directives such as info,tailnet_agent::proxy=debug",
        );
    }
    finish(errors, || ValidTailnet {
        server: spec.server.clone(),
        hosts_config_map: dns.hosts_config_map.clone().map(|name| HostsConfigMap {
            name,
            namespace: dns.hosts_config_map_namespace.clone(),
        }),
        ingress_name_template: dns.ingress_name_template.clone(),
        ingress_alias_template: dns.ingress_alias_template.clone(),
        issuer: spec
            .defaults
            .as_ref()
            .and_then(|d| d.tls.as_ref())
            .map(|t| t.issuer_ref.clone()),
        policy: policy.clone(),
    })
}

/// Schema-level checks of a Tailnet (the errors of [`valid_tailnet`]).
pub fn tailnet(spec: &TailnetSpec) -> Vec<FieldError> {
    valid_tailnet(spec).err().unwrap_or_default()
}

/// Schema-level checks of a TailnetEgress, returning its targets parsed: addresses as IP or
/// DNS name, `u16` ports, probe intervals as [`Duration`].
pub fn valid_egress(spec: &TailnetEgressSpec) -> Result<ValidEgress, Vec<FieldError>> {
    let mut errors = Vec::new();
    if spec.consumer_namespaces.is_empty() {
        errors.push(FieldError::new(
            "spec.consumerNamespaces",
            "must list at least one namespace whose pods may use the targets",
        ));
    }
    for (i, ns) in spec.consumer_namespaces.iter().enumerate() {
        check_match(
            &mut errors,
            &DNS_LABEL,
            63,
            format!("spec.consumerNamespaces[{i}]"),
            ns,
            "a namespace name",
        );
    }
    if spec.targets.is_empty() {
        errors.push(FieldError::new(
            "spec.targets",
            "must list at least one target",
        ));
    }
    let mut seen = BTreeSet::new();
    let mut targets = Vec::new();
    for target in &spec.targets {
        let at = format!("spec.targets[{}]", target.name);
        if !seen.insert(target.name.as_str()) {
            errors.push(FieldError::new(
                format!("{at}.name"),
                "duplicate target name; each target becomes a Service of that name",
            ));
        }
        check_match(
            &mut errors,
            &SERVICE_NAME,
            63,
            format!("{at}.name"),
            &target.name,
            "a Service name (lowercase letters, digits, '-', starting with a letter, at most 63)",
        );
        let address = TargetAddress::parse(&format!("{at}.address"), &target.address)
            .map_err(|e| errors.push(e))
            .ok();
        let port = check_port(&mut errors, format!("{at}.port"), target.port);
        for (j, alias) in target.aliases.iter().enumerate() {
            check_match(
                &mut errors,
                &HOSTNAME,
                253,
                format!("{at}.aliases[{j}]"),
                alias,
                "a fully qualified lowercase hostname",
            );
        }
        // An interval is checked even when the probe is off: it is still a typo to fix.
        let interval = check_duration(
            &mut errors,
            format!("{at}.probe.interval"),
            target.probe.as_ref().and_then(|p| p.interval.as_ref()),
        );
        let enabled = target.probe.as_ref().is_none_or(|p| p.enabled);
        if let (Some(address), Some(port), Some(interval)) = (address, port, interval) {
            targets.push(ValidTarget {
                name: target.name.clone(),
                address,
                port,
                aliases: target.aliases.clone(),
                probe_interval: enabled.then(|| interval.unwrap_or(DEFAULT_PROBE_INTERVAL)),
            });
        }
    }
    let limits = resolve_limits(spec.limits.as_ref(), &mut errors);
    finish(errors, || ValidEgress {
        consumer_namespaces: spec.consumer_namespaces.clone(),
        targets,
        limits,
    })
}

/// Schema-level checks of a TailnetEgress (the errors of [`valid_egress`]).
pub fn egress(spec: &TailnetEgressSpec) -> Vec<FieldError> {
    valid_egress(spec).err().unwrap_or_default()
}

/// Schema-level checks of a TailnetIngress, returning its exposes parsed: `u16` ports,
/// backend ports as number or name, timeouts as [`Duration`].
pub fn valid_ingress(spec: &TailnetIngressSpec) -> Result<ValidIngress, Vec<FieldError>> {
    let mut errors = Vec::new();
    if spec.allow_from.is_empty() {
        errors.push(FieldError::new(
            "spec.allowFrom",
            "must name at least one principal, e.g. group:team-a",
        ));
    }
    check_principals(&mut errors, "spec.allowFrom", &spec.allow_from);
    let secret_name = spec.tls.as_ref().and_then(|t| t.secret_name.clone());
    if let Some(secret) = &secret_name {
        check_match(
            &mut errors,
            &DNS_SUBDOMAIN,
            253,
            "spec.tls.secretName".into(),
            secret,
            "a Secret name",
        );
    }
    if spec.exposes.is_empty() {
        errors.push(FieldError::new(
            "spec.exposes",
            "must list at least one expose",
        ));
    }
    let mut seen = SeenExposes::default();
    let exposes = spec
        .exposes
        .iter()
        .filter_map(|expose| valid_expose(&mut errors, spec, expose, &mut seen))
        .collect();
    let limits = resolve_limits(spec.limits.as_ref(), &mut errors);
    let in_cluster_namespaces = valid_in_cluster(&mut errors, spec);
    finish(errors, || ValidIngress {
        allow_from: spec.allow_from.clone(),
        tls_secret_name: secret_name,
        exposes,
        limits,
        in_cluster_namespaces,
    })
}

/// `spec.inCluster.namespaces` checked (DNS labels, at most [`MAX_IN_CLUSTER_NAMESPACES`]),
/// sorted and unique. With any listed, the agent serves every expose port on its pod IP too,
/// where its admin port already listens: no expose may use that port.
fn valid_in_cluster(errors: &mut Vec<FieldError>, spec: &TailnetIngressSpec) -> Vec<String> {
    let namespaces = spec.in_cluster_namespaces();
    if namespaces.len() > MAX_IN_CLUSTER_NAMESPACES {
        errors.push(FieldError::new(
            "spec.inCluster.namespaces",
            format!(
                "lists {} namespaces; at most {MAX_IN_CLUSTER_NAMESPACES}",
                namespaces.len()
            ),
        ));
        return Vec::new();
    }
    for namespace in namespaces {
        check_match(
            errors,
            &DNS_LABEL,
            63,
            "spec.inCluster.namespaces".to_string(),
            namespace,
            "a namespace name",
        );
    }
    if !namespaces.is_empty() {
        let admin = i32::from(crate::agent_config::ADMIN_PORT);
        for expose in spec.exposes.iter().filter(|e| e.port == admin) {
            errors.push(FieldError::new(
                format!("spec.exposes[{}].port", expose.name),
                format!("port {admin} is the agent's admin port on its pod IP, where in-cluster clients (spec.inCluster) are served too; use another port"),
            ));
        }
    }
    let unique: BTreeSet<String> = namespaces.iter().cloned().collect();
    unique.into_iter().collect()
}

/// The most namespaces `spec.inCluster.namespaces` may list (as the CRD schema says).
pub const MAX_IN_CLUSTER_NAMESPACES: usize = 32;

/// Expose names and (dnsLabel, port) pairs seen so far: each must be unique.
#[derive(Default)]
struct SeenExposes<'a> {
    names: BTreeSet<&'a str>,
    label_ports: BTreeSet<(&'a str, i32)>,
}

/// One expose checked (errors appended in field order); `None` when a part did not parse.
fn valid_expose<'a>(
    errors: &mut Vec<FieldError>,
    spec: &TailnetIngressSpec,
    expose: &'a Expose,
    seen: &mut SeenExposes<'a>,
) -> Option<ValidExpose> {
    let at = format!("spec.exposes[{}]", expose.name);
    let port = check_expose_names_and_port(errors, spec, expose, seen, &at);
    let backend = valid_backend(errors, expose, &at);
    let timeouts = valid_timeouts(errors, expose, &at);
    Some(ValidExpose {
        name: expose.name.clone(),
        dns_label: expose.dns_label.clone(),
        alias: expose.alias,
        mode: expose.mode,
        port: port?,
        backend: backend?,
        timeouts: timeouts?,
    })
}

/// The expose's name, dnsLabel and port: each well-formed, unique where they must be.
fn check_expose_names_and_port<'a>(
    errors: &mut Vec<FieldError>,
    spec: &TailnetIngressSpec,
    expose: &'a Expose,
    seen: &mut SeenExposes<'a>,
    at: &str,
) -> Option<u16> {
    if !seen.names.insert(expose.name.as_str()) {
        errors.push(FieldError::new(
            format!("{at}.name"),
            "duplicate expose name",
        ));
    }
    check_match(
        errors,
        &DNS_LABEL,
        63,
        format!("{at}.name"),
        &expose.name,
        "a DNS label",
    );
    check_match(
        errors,
        &DNS_LABEL,
        63,
        format!("{at}.dnsLabel"),
        &expose.dns_label,
        "a DNS label",
    );
    let port = check_port(errors, format!("{at}.port"), expose.port);
    if !seen
        .label_ports
        .insert((expose.dns_label.as_str(), expose.port))
    {
        errors.push(FieldError::new(
            format!("{at}.dnsLabel"),
            format!(
                "dnsLabel {:?} is already used on port {}",
                expose.dns_label, expose.port
            ),
        ));
    }
    if expose.mode == ExposeMode::Tcp
        && spec
            .exposes
            .iter()
            .any(|o| o.name != expose.name && o.port == expose.port)
    {
        errors.push(FieldError::new(
            format!("{at}.port"),
            format!(
                "port {} is shared with another expose; a tcp expose needs a port of its own",
                expose.port
            ),
        ));
    }
    port
}

/// The expose's backend: Service, namespace, port (number or name), verified TLS.
fn valid_backend(errors: &mut Vec<FieldError>, expose: &Expose, at: &str) -> Option<ValidBackend> {
    let backend = &expose.backend;
    check_match(
        errors,
        &SERVICE_NAME,
        63,
        format!("{at}.backend.service"),
        &backend.service,
        "a Service name",
    );
    if let Some(ns) = &backend.namespace {
        check_match(
            errors,
            &DNS_LABEL,
            63,
            format!("{at}.backend.namespace"),
            ns,
            "a namespace name",
        );
    }
    let backend_port = match &backend.port {
        IntOrString::Int(port) => {
            check_port(errors, format!("{at}.backend.port"), *port).map(BackendPort::Number)
        }
        IntOrString::String(name) => check_match(
            errors,
            &DNS_LABEL,
            15,
            format!("{at}.backend.port"),
            name,
            "a port number or port name",
        )
        .then(|| BackendPort::Name(name.clone())),
    };
    if let Some(tls) = &backend.tls {
        if expose.mode != ExposeMode::Http {
            errors.push(FieldError::new(
                format!("{at}.backend.tls"),
                "backend.tls requires mode: http (tcp exposes forward bytes unchanged)",
            ));
        }
        check_match(
            errors,
            &DNS_SUBDOMAIN,
            253,
            format!("{at}.backend.tls.serverName"),
            &tls.server_name,
            "a hostname",
        );
        check_match(
            errors,
            &DNS_SUBDOMAIN,
            253,
            format!("{at}.backend.tls.caConfigMapRef.name"),
            &tls.ca_config_map_ref.name,
            "a ConfigMap name",
        );
    }
    Some(ValidBackend {
        service: backend.service.clone(),
        namespace: backend.namespace.clone(),
        port: backend_port?,
        tls: backend.tls.clone(),
    })
}

/// The expose's timeouts (http only), parsed.
fn valid_timeouts(
    errors: &mut Vec<FieldError>,
    expose: &Expose,
    at: &str,
) -> Option<ValidTimeouts> {
    let timeouts = expose.timeouts.clone().unwrap_or_default();
    if expose.timeouts.is_some() && expose.mode != ExposeMode::Http {
        errors.push(FieldError::new(
            format!("{at}.timeouts"),
            "timeouts require mode: http",
        ));
    }
    let request = check_duration(
        errors,
        format!("{at}.timeouts.request"),
        timeouts.request.as_ref(),
    );
    let backend_request = check_duration(
        errors,
        format!("{at}.timeouts.backendRequest"),
        timeouts.backend_request.as_ref(),
    );
    Some(ValidTimeouts {
        request: request?,
        backend_request: backend_request?,
    })
}

/// Schema-level checks of a TailnetIngress (the errors of [`valid_ingress`]).
pub fn ingress(spec: &TailnetIngressSpec) -> Vec<FieldError> {
    valid_ingress(spec).err().unwrap_or_default()
}

/// Checks of a TailnetEgress that need its namespace: egresses are only honoured in the
/// operator namespace (they publish Services there).
pub fn egress_namespace(namespace: &str, operator_namespace: &str) -> Result<(), FieldError> {
    if namespace == operator_namespace {
        Ok(())
    } else {
        Err(FieldError::new(
            "metadata.namespace",
            format!(
                "TailnetEgress is only honoured in the operator namespace {operator_namespace:?}; move it there and list {namespace:?} in spec.consumerNamespaces"
            ),
        ))
    }
}

/// `allowFrom` entries outside the Tailnet's `ingressSourceAllowlist`.
pub fn sources_not_allowed(spec: &TailnetIngressSpec, tailnet: &TailnetSpec) -> Vec<String> {
    let allowed = &tailnet.policy.ingress_source_allowlist;
    spec.allow_from
        .iter()
        .filter(|s| !allowed.contains(s))
        .cloned()
        .collect()
}

/// The hostnames of one expose: the name from the template, plus the alias when requested.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExposeNames {
    pub expose: String,
    pub mode: ExposeMode,
    pub port: u16,
    pub hostnames: Vec<String>,
}

/// The facts of one expose that the context checks need, from a raw or a validated spec.
struct ExposeFacts<'a> {
    name: &'a str,
    dns_label: &'a str,
    alias: bool,
    mode: ExposeMode,
    /// `None` when out of range (the schema checks report it).
    port: Option<u16>,
    backend_namespace: Option<&'a str>,
}

/// Checks of a TailnetIngress that need the Tailnet and the operator namespace: cross-namespace
/// backends, the name templates, a certificate source for http exposes. Returns the hostnames
/// per expose when valid. Works on unvalidated specs too (the hostnames other ingresses
/// claim); [`ingress_names`] is the same for a validated one.
pub fn ingress_in_context(
    namespace: &str,
    operator_namespace: &str,
    spec: &TailnetIngressSpec,
    tailnet_name: &str,
    tailnet: &TailnetSpec,
) -> Result<Vec<ExposeNames>, Vec<FieldError>> {
    let facts: Vec<ExposeFacts> = spec
        .exposes
        .iter()
        .map(|e| ExposeFacts {
            name: &e.name,
            dns_label: &e.dns_label,
            alias: e.alias,
            mode: e.mode,
            port: u16::try_from(e.port).ok(),
            backend_namespace: e.backend.namespace.as_deref(),
        })
        .collect();
    let has_secret = spec.tls.as_ref().is_some_and(|t| t.secret_name.is_some());
    names_in_context(
        namespace,
        operator_namespace,
        &facts,
        has_secret,
        tailnet_name,
        tailnet,
        NameSource::Template,
    )
}

/// Where an entrance's hostnames come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameSource {
    /// The Tailnet's `ingressNameTemplate` (required): a TailnetIngress.
    Template,
    /// The template when the Tailnet has one, else none of its own: a Service of the tailnet
    /// `loadBalancerClass` is then named by its node's MagicDNS name (`<node>.<magicDNSDomain>`).
    TemplateOrMagicDns,
}

/// [`ingress_in_context`] for the TailnetIngress spec a Service of the tailnet
/// `loadBalancerClass` is read as: without the Tailnet's `ingressNameTemplate` its exposes
/// have no names of their own (its node's MagicDNS name serves them).
pub fn service_in_context(
    namespace: &str,
    operator_namespace: &str,
    spec: &TailnetIngressSpec,
    tailnet_name: &str,
    tailnet: &TailnetSpec,
) -> Result<Vec<ExposeNames>, Vec<FieldError>> {
    let facts: Vec<ExposeFacts> = spec
        .exposes
        .iter()
        .map(|e| ExposeFacts {
            name: &e.name,
            dns_label: &e.dns_label,
            alias: e.alias,
            mode: e.mode,
            port: u16::try_from(e.port).ok(),
            backend_namespace: e.backend.namespace.as_deref(),
        })
        .collect();
    names_in_context(
        namespace,
        operator_namespace,
        &facts,
        false,
        tailnet_name,
        tailnet,
        NameSource::TemplateOrMagicDns,
    )
}

/// [`ingress_in_context`] for a validated ingress.
pub fn ingress_names(
    namespace: &str,
    operator_namespace: &str,
    ingress: &ValidIngress,
    tailnet_name: &str,
    tailnet: &TailnetSpec,
) -> Result<Vec<ExposeNames>, Vec<FieldError>> {
    let facts: Vec<ExposeFacts> = ingress
        .exposes
        .iter()
        .map(|e| ExposeFacts {
            name: &e.name,
            dns_label: &e.dns_label,
            alias: e.alias,
            mode: e.mode,
            port: Some(e.port),
            backend_namespace: e.backend.namespace.as_deref(),
        })
        .collect();
    names_in_context(
        namespace,
        operator_namespace,
        &facts,
        ingress.tls_secret_name.is_some(),
        tailnet_name,
        tailnet,
        NameSource::Template,
    )
}

fn names_in_context(
    namespace: &str,
    operator_namespace: &str,
    exposes: &[ExposeFacts],
    has_secret: bool,
    tailnet_name: &str,
    tailnet: &TailnetSpec,
    source: NameSource,
) -> Result<Vec<ExposeNames>, Vec<FieldError>> {
    let mut errors = Vec::new();
    let mut result = Vec::new();
    let dns = tailnet.dns.clone().unwrap_or_default();
    for expose in exposes {
        let at = format!("spec.exposes[{}]", expose.name);
        if let Some(backend_ns) = expose.backend_namespace
            && backend_ns != namespace
            && namespace != operator_namespace
        {
            errors.push(FieldError::new(
                format!("{at}.backend.namespace"),
                format!("a backend in another namespace ({backend_ns:?}) is only allowed for TailnetIngress objects in the operator namespace {operator_namespace:?}; expose the Service from {backend_ns:?} itself"),
            ));
        }
        let mut hostnames = Vec::new();
        match &dns.ingress_name_template {
            Some(template) => match expand_template(&format!("Tailnet {tailnet_name}: spec.dns.ingressNameTemplate"), template, expose.dns_label, namespace) {
                Ok(name) => hostnames.push(name),
                Err(e) => errors.push(e),
            },
            // Named by its node's MagicDNS name (no name of its own in the records).
            None if source == NameSource::TemplateOrMagicDns && expose.mode == ExposeMode::Tcp => {}
            None => errors.push(FieldError::new(
                format!("Tailnet {tailnet_name}: spec.dns.ingressNameTemplate"),
                "is not set; ingresses need it to name their exposes (e.g. \"{name}.{namespace}.lab.example.net\")",
            )),
        }
        if expose.alias {
            match &dns.ingress_alias_template {
                Some(template) => match expand_template(
                    &format!("Tailnet {tailnet_name}: spec.dns.ingressAliasTemplate"),
                    template,
                    expose.dns_label,
                    namespace,
                ) {
                    Ok(name) => hostnames.push(name),
                    Err(e) => errors.push(e),
                },
                None => errors.push(FieldError::new(
                    format!("{at}.alias"),
                    format!(
                        "alias: true needs spec.dns.ingressAliasTemplate on Tailnet {tailnet_name}"
                    ),
                )),
            }
        }
        if let Some(port) = expose.port {
            result.push(ExposeNames {
                expose: expose.name.to_string(),
                mode: expose.mode,
                port,
                hostnames,
            });
        }
    }
    let has_http = exposes.iter().any(|e| e.mode == ExposeMode::Http);
    let has_issuer = tailnet
        .defaults
        .as_ref()
        .and_then(|d| d.tls.as_ref())
        .is_some();
    if has_http && !has_secret && !has_issuer {
        errors.push(FieldError::new(
            "spec.tls.secretName",
            format!("http exposes need a certificate: set spec.tls.secretName or spec.defaults.tls.issuerRef on Tailnet {tailnet_name}"),
        ));
    }
    finish(errors, || result)
}

#[cfg(test)]
mod tests;

/// `spec.limits` checked and resolved against the defaults. The per-listener limit is capped
/// at the per-agent one.
fn resolve_limits(
    limits: Option<&crate::egress::AgentLimits>,
    errors: &mut Vec<FieldError>,
) -> crate::agent_config::ConnectionLimits {
    use crate::agent_config::{ConnectionLimits, MAX_CONNECTIONS_CEILING};
    let defaults = ConnectionLimits::default();
    let mut check = |field: &str, value: Option<i32>, default: u32| match value {
        None => default,
        Some(value) => match u32::try_from(value) {
            Ok(value) if (1..=MAX_CONNECTIONS_CEILING).contains(&value) => value,
            _ => {
                errors.push(FieldError::new(
                    format!("spec.limits.{field}"),
                    format!("must be between 1 and {MAX_CONNECTIONS_CEILING}"),
                ));
                default
            }
        },
    };
    let limits = limits.cloned().unwrap_or_default();
    let max_connections = check(
        "maxConnections",
        limits.max_connections,
        defaults.max_connections,
    );
    let per_listener = check(
        "maxConnectionsPerListener",
        limits.max_connections_per_listener,
        defaults.max_connections_per_listener,
    );
    ConnectionLimits {
        max_connections,
        max_connections_per_listener: per_listener.min(max_connections),
        ..defaults
    }
}
