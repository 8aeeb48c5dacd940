//! Drift between these types and the upstream CRDs (Standard channel of
//! [`tailnet_gateway_api::BUNDLE_VERSION`]): a fully populated sample of each kind is
//! serialized, and every field path it writes must exist in the CRD's `openAPIV3Schema` of the
//! version we use (`v1`, which must be served), with the same JSON type; every object it
//! writes must carry the schema's required fields; and every enum value the types name must be
//! one the schema allows.
//!
//! The CRDs are read from `$TNO_GATEWAY_API_CRDS` (a directory with the standard CRD files),
//! else from the Go module cache (`go env GOMODCACHE`, after
//! `go mod download sigs.k8s.io/gateway-api@v1.6.3`). Neither present: the test skips (passes
//! with a note) unless `TNO_REQUIRE_REAL_ENV=1`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, LabelSelectorRequirement, ObjectMeta, Time,
};
use serde_json::{Value, json};
use tailnet_gateway_api::gateway::{
    AllowedRoutes, GatewayInfrastructure, GatewaySpecAddress, GatewayStatusAddress,
    GatewayTlsConfig, ListenerTlsConfig, RouteNamespaces,
};
use tailnet_gateway_api::gatewayclass::SupportedFeature;
use tailnet_gateway_api::httproute::{
    HTTPBackendRef, HTTPHeader, HTTPHeaderFilter, HTTPHeaderMatch, HTTPPathMatch, HTTPPathModifier,
    HTTPQueryParamMatch, HTTPRequestRedirectFilter, HTTPRouteFilter, HTTPRouteMatch, HTTPRouteRule,
    HTTPRouteTimeouts, HTTPURLRewriteFilter, filter_types, methods, path_match_types,
    path_modifier_types, value_match_types,
};
use tailnet_gateway_api::referencegrant::{ReferenceGrantFrom, ReferenceGrantTo};
use tailnet_gateway_api::shared::{LocalParametersReference, ParametersReference};
use tailnet_gateway_api::tcproute::TCPRouteRule;
use tailnet_gateway_api::tlsroute::TLSRouteRule;
use tailnet_gateway_api::{
    BUNDLE_VERSION, BackendRef, Gateway, GatewayClass, GatewayClassSpec, GatewaySpec,
    GatewayStatus, HTTPRoute, HTTPRouteSpec, Listener, ListenerStatus, ParentReference,
    ReferenceGrant, ReferenceGrantSpec, RouteGroupKind, RouteParentStatus, RouteStatus,
    SecretObjectReference, TCPRoute, TCPRouteSpec, TLSRoute, TLSRouteSpec, from_namespaces,
    gatewayclass::GatewayClassStatus, tls_modes,
};

/// The standard CRD directory, or `None` (skip) when neither source exists.
fn crd_dir() -> Option<PathBuf> {
    let candidate = match std::env::var_os("TNO_GATEWAY_API_CRDS") {
        Some(dir) => Some(PathBuf::from(dir)),
        None => go_mod_cache().map(|cache| {
            cache
                .join(format!("sigs.k8s.io/gateway-api@{BUNDLE_VERSION}"))
                .join("config/crd/standard")
        }),
    };
    match candidate {
        Some(dir) if dir.is_dir() => Some(dir),
        other => {
            let why = format!(
                "Gateway API {BUNDLE_VERSION} standard CRDs not found (looked at {other:?}; set \
                 TNO_GATEWAY_API_CRDS or run `go mod download sigs.k8s.io/gateway-api@{BUNDLE_VERSION}`)"
            );
            assert!(
                std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
                "{why}"
            );
            eprintln!("SKIP: {why}");
            None
        }
    }
}

fn go_mod_cache() -> Option<PathBuf> {
    let output = std::process::Command::new("go")
        .args(["env", "GOMODCACHE"])
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let trimmed = text.trim();
    (output.status.success() && !trimmed.is_empty()).then(|| PathBuf::from(trimmed))
}

/// The `v1` schema of `gateway.networking.k8s.io_<plural>.yaml`, after checking that `v1` is
/// served.
fn v1_schema(dir: &Path, plural: &str) -> Value {
    let path = dir.join(format!("gateway.networking.k8s.io_{plural}.yaml"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let crd: Value =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    let versions = crd["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let v1 = versions
        .iter()
        .find(|v| v["name"] == "v1")
        .unwrap_or_else(|| panic!("{plural}: no v1 version in the CRD"));
    assert_eq!(v1["served"], json!(true), "{plural}: v1 is not served");
    v1["schema"]["openAPIV3Schema"].clone()
}

/// JSON type name of a value as the schema's `type` spells it.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Walks `value` along `schema`, collecting every mismatch (missing path, wrong type, missing
/// required field, value outside an enum). `metadata` at the root is ObjectMeta, not in the
/// CRD schema.
fn check(value: &Value, schema: &Value, path: &str, problems: &mut Vec<String>) {
    if let Some(want) = schema["type"].as_str() {
        let got = json_type(value);
        if got != want && !(want == "number" && got == "integer") {
            problems.push(format!("{path}: we write {got}, the schema says {want}"));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        problems.push(format!("{path}: {value} is not one of {allowed:?}"));
    }
    match value {
        Value::Object(fields) => {
            for required in schema["required"].as_array().into_iter().flatten() {
                if let Some(name) = required.as_str()
                    && !fields.contains_key(name)
                {
                    problems.push(format!("{path}: required field {name} not written"));
                }
            }
            for (key, child) in fields {
                let child_path = format!("{path}.{key}");
                if path == "$" && key == "metadata" {
                    continue;
                }
                let child_schema = match schema["properties"].get(key) {
                    Some(s) => s,
                    None if schema["additionalProperties"].is_object() => {
                        &schema["additionalProperties"]
                    }
                    None => {
                        problems.push(format!("{child_path}: not in the CRD schema"));
                        continue;
                    }
                };
                check(child, child_schema, &child_path, problems);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check(item, &schema["items"], &format!("{path}[{i}]"), problems);
            }
        }
        _ => {}
    }
}

fn assert_matches_crd(dir: &Path, plural: &str, samples: &[Value]) {
    let schema = v1_schema(dir, plural);
    let mut problems = Vec::new();
    for sample in samples {
        check(sample, &schema, "$", &mut problems);
    }
    assert!(
        problems.is_empty(),
        "{plural}: types drifted from the {BUNDLE_VERSION} CRD:\n{}",
        problems.join("\n")
    );
}

fn to_json<T: serde::Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("sample serializes")
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        generation: Some(4),
        ..ObjectMeta::default()
    }
}

fn condition(type_: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: "True".into(),
        reason: type_.into(),
        message: "sample".into(),
        observed_generation: Some(4),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

fn parent_ref() -> ParentReference {
    ParentReference {
        group: Some("gateway.networking.k8s.io".into()),
        kind: Some("Gateway".into()),
        namespace: Some("infra".into()),
        name: "web".into(),
        section_name: Some("https".into()),
        port: Some(443),
    }
}

fn backend_ref() -> BackendRef {
    BackendRef {
        group: Some(String::new()),
        kind: Some("Service".into()),
        name: "app".into(),
        namespace: Some("backends".into()),
        port: Some(8080),
        weight: Some(2),
    }
}

fn route_status() -> RouteStatus {
    RouteStatus {
        parents: vec![RouteParentStatus {
            parent_ref: parent_ref(),
            controller_name: "tailnet-operator.dev/gateway".into(),
            conditions: vec![condition("Accepted"), condition("ResolvedRefs")],
        }],
    }
}

fn header_filter() -> HTTPHeaderFilter {
    let header = HTTPHeader {
        name: "x-a".into(),
        value: "1".into(),
    };
    HTTPHeaderFilter {
        set: vec![header.clone()],
        add: vec![header],
        remove: vec!["x-b".into()],
    }
}

fn full_filters() -> Vec<HTTPRouteFilter> {
    let full_path = HTTPPathModifier {
        type_: path_modifier_types::REPLACE_FULL_PATH.into(),
        replace_full_path: Some("/new".into()),
        replace_prefix_match: Some("/p".into()),
    };
    vec![
        HTTPRouteFilter {
            type_: filter_types::REQUEST_HEADER_MODIFIER.into(),
            request_header_modifier: Some(header_filter()),
            response_header_modifier: Some(header_filter()),
            ..HTTPRouteFilter::default()
        },
        HTTPRouteFilter {
            type_: filter_types::REQUEST_REDIRECT.into(),
            request_redirect: Some(HTTPRequestRedirectFilter {
                scheme: Some("https".into()),
                hostname: Some("other.example.com".into()),
                path: Some(full_path.clone()),
                port: Some(8443),
                status_code: Some(301),
            }),
            ..HTTPRouteFilter::default()
        },
        HTTPRouteFilter {
            type_: filter_types::URL_REWRITE.into(),
            url_rewrite: Some(HTTPURLRewriteFilter {
                hostname: Some("internal.example.com".into()),
                path: Some(full_path),
            }),
            ..HTTPRouteFilter::default()
        },
    ]
}

fn http_route() -> HTTPRoute {
    let rule = HTTPRouteRule {
        name: Some("api".into()),
        matches: vec![HTTPRouteMatch {
            path: Some(HTTPPathMatch {
                type_: Some(path_match_types::PATH_PREFIX.into()),
                value: Some("/api".into()),
            }),
            headers: vec![HTTPHeaderMatch {
                type_: Some(value_match_types::EXACT.into()),
                name: "version".into(),
                value: "2".into(),
            }],
            query_params: vec![HTTPQueryParamMatch {
                type_: Some(value_match_types::EXACT.into()),
                name: "debug".into(),
                value: "1".into(),
            }],
            method: Some("GET".into()),
        }],
        filters: full_filters(),
        backend_refs: vec![HTTPBackendRef {
            backend_ref: backend_ref(),
            filters: full_filters(),
        }],
        timeouts: Some(HTTPRouteTimeouts {
            request: Some("10s".into()),
            backend_request: Some("2s".into()),
        }),
    };
    HTTPRoute {
        metadata: meta("app", Some("team-a")),
        spec: HTTPRouteSpec {
            parent_refs: vec![parent_ref()],
            hostnames: vec!["app.example.com".into(), "*.example.com".into()],
            rules: vec![rule],
        },
        status: Some(route_status()),
    }
}

fn gateway() -> Gateway {
    let listener = Listener {
        name: "https".into(),
        hostname: Some("*.example.com".into()),
        port: 443,
        protocol: "HTTPS".into(),
        tls: Some(ListenerTlsConfig {
            mode: Some(tls_modes::TERMINATE.into()),
            certificate_refs: vec![SecretObjectReference {
                group: Some(String::new()),
                kind: Some("Secret".into()),
                name: "cert".into(),
                namespace: Some("certs".into()),
            }],
            options: BTreeMap::from([("example.com/opt".into(), "v".into())]),
        }),
        allowed_routes: Some(AllowedRoutes {
            namespaces: Some(RouteNamespaces {
                from: Some(from_namespaces::SELECTOR.into()),
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("team".into(), "a".into())])),
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "env".into(),
                        operator: "In".into(),
                        values: Some(vec!["prod".into()]),
                    }]),
                }),
            }),
            kinds: vec![RouteGroupKind {
                group: Some("gateway.networking.k8s.io".into()),
                kind: "HTTPRoute".into(),
            }],
        }),
    };
    let status = GatewayStatus {
        addresses: vec![GatewayStatusAddress {
            type_: Some("IPAddress".into()),
            value: "100.64.0.7".into(),
        }],
        conditions: vec![condition("Accepted"), condition("Programmed")],
        listeners: vec![ListenerStatus {
            name: "https".into(),
            supported_kinds: vec![RouteGroupKind {
                group: Some("gateway.networking.k8s.io".into()),
                kind: "HTTPRoute".into(),
            }],
            attached_routes: 2,
            conditions: vec![condition("Accepted"), condition("Conflicted")],
        }],
    };
    Gateway {
        metadata: meta("web", Some("infra")),
        spec: GatewaySpec {
            gateway_class_name: "tailnet".into(),
            listeners: vec![listener],
            addresses: vec![GatewaySpecAddress {
                type_: Some("IPAddress".into()),
                value: Some("100.64.0.7".into()),
            }],
            infrastructure: Some(GatewayInfrastructure {
                labels: BTreeMap::from([("a".into(), "b".into())]),
                annotations: BTreeMap::from([("c".into(), "d".into())]),
                parameters_ref: Some(LocalParametersReference {
                    group: "tailnet-operator.dev".into(),
                    kind: "Params".into(),
                    name: "p".into(),
                }),
            }),
            tls: Some(GatewayTlsConfig {
                backend: Some(serde_json::Map::new()),
                frontend: Some(serde_json::Map::from_iter([(
                    "default".to_string(),
                    json!({}),
                )])),
            }),
        },
        status: Some(status),
    }
}

fn gateway_class() -> GatewayClass {
    GatewayClass {
        metadata: meta("tailnet", None),
        spec: GatewayClassSpec {
            controller_name: "tailnet-operator.dev/gateway".into(),
            parameters_ref: Some(ParametersReference {
                group: "tailnet-operator.dev".into(),
                kind: "Params".into(),
                name: "p".into(),
                namespace: Some("ops".into()),
            }),
            description: Some("tailnet".into()),
        },
        status: Some(GatewayClassStatus {
            conditions: vec![condition("Accepted")],
            supported_features: vec![SupportedFeature {
                name: "Gateway".into(),
            }],
        }),
    }
}

#[test]
fn gateway_class_matches_the_crd() {
    let Some(dir) = crd_dir() else { return };
    assert_matches_crd(&dir, "gatewayclasses", &[to_json(&gateway_class())]);
}

#[test]
fn gateway_matches_the_crd() {
    let Some(dir) = crd_dir() else { return };
    // Minimal status: the always-written fields of an empty listener status are valid too.
    let mut minimal = gateway();
    minimal.status = Some(GatewayStatus {
        listeners: vec![ListenerStatus {
            name: "udp".into(),
            ..ListenerStatus::default()
        }],
        ..GatewayStatus::default()
    });
    assert_matches_crd(&dir, "gateways", &[to_json(&gateway()), to_json(&minimal)]);
}

#[test]
fn http_route_matches_the_crd() {
    let Some(dir) = crd_dir() else { return };
    let mut minimal = http_route();
    minimal.status = Some(RouteStatus::default());
    assert_matches_crd(
        &dir,
        "httproutes",
        &[to_json(&http_route()), to_json(&minimal)],
    );
}

#[test]
fn tls_route_matches_the_crd() {
    let Some(dir) = crd_dir() else { return };
    let route = TLSRoute {
        metadata: meta("db", Some("team-a")),
        spec: TLSRouteSpec {
            parent_refs: vec![parent_ref()],
            hostnames: vec!["db.example.com".into()],
            rules: vec![TLSRouteRule {
                name: Some("only".into()),
                backend_refs: vec![backend_ref()],
            }],
        },
        status: Some(route_status()),
    };
    assert_matches_crd(&dir, "tlsroutes", &[to_json(&route)]);
}

#[test]
fn tcp_route_matches_the_crd() {
    let Some(dir) = crd_dir() else { return };
    let route = TCPRoute {
        metadata: meta("raw", Some("team-a")),
        spec: TCPRouteSpec {
            parent_refs: vec![parent_ref()],
            rules: vec![TCPRouteRule {
                name: Some("only".into()),
                backend_refs: vec![backend_ref()],
            }],
        },
        status: Some(route_status()),
    };
    assert_matches_crd(&dir, "tcproutes", &[to_json(&route)]);
}

#[test]
fn reference_grant_matches_the_crd() {
    let Some(dir) = crd_dir() else { return };
    let grant = ReferenceGrant {
        metadata: meta("allow", Some("backends")),
        spec: ReferenceGrantSpec {
            from: vec![ReferenceGrantFrom {
                group: "gateway.networking.k8s.io".into(),
                kind: "HTTPRoute".into(),
                namespace: "team-a".into(),
            }],
            to: vec![ReferenceGrantTo {
                group: String::new(),
                kind: "Service".into(),
                name: Some("app".into()),
            }],
        },
    };
    assert_matches_crd(&dir, "referencegrants", &[to_json(&grant)]);
}

/// The checker itself reports each kind of drift (so a passing run means something).
#[test]
fn checker_reports_unknown_paths_wrong_types_missing_required_and_enum_values() {
    let schema = json!({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "port": {"type": "integer"},
                    "mode": {"type": "string", "enum": ["A", "B"]},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "items": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "string"}}}}
                }
            }
        }
    });
    let good = json!({"metadata": {"anything": 1}, "spec": {"name": "n", "port": 1, "mode": "A", "labels": {"k": "v"}, "items": [{"x": "y"}]}});
    let mut problems = Vec::new();
    check(&good, &schema, "$", &mut problems);
    assert_eq!(problems, Vec::<String>::new());
    let bad = json!({"spec": {"port": "80", "mode": "C", "labels": {"k": 1}, "items": [{"z": "y"}], "extra": true}});
    check(&bad, &schema, "$", &mut problems);
    problems.sort();
    assert_eq!(
        problems,
        vec![
            "$.spec.extra: not in the CRD schema".to_string(),
            "$.spec.items[0].z: not in the CRD schema".to_string(),
            "$.spec.labels.k: we write integer, the schema says string".to_string(),
            "$.spec.mode: \"C\" is not one of [String(\"A\"), String(\"B\")]".to_string(),
            "$.spec.port: we write string, the schema says integer".to_string(),
            "$.spec: required field name not written".to_string(),
        ]
    );
}

/// Every enum constant the crate names is a value the schema allows at its field.
#[test]
fn enum_constants_are_values_of_the_crd() {
    let Some(dir) = crd_dir() else { return };
    let gateways = v1_schema(&dir, "gateways");
    let listener = &gateways["properties"]["spec"]["properties"]["listeners"]["items"];
    let routes = v1_schema(&dir, "httproutes");
    let rule = &routes["properties"]["spec"]["properties"]["rules"]["items"];
    let match_ = &rule["properties"]["matches"]["items"]["properties"];
    let filter = &rule["properties"]["filters"]["items"]["properties"];
    let modifier = &filter["urlRewrite"]["properties"]["path"]["properties"]["type"];
    let cases: Vec<(&str, &Value, Vec<&str>)> = vec![
        (
            "tls mode",
            &listener["properties"]["tls"]["properties"]["mode"],
            vec![tls_modes::TERMINATE, tls_modes::PASSTHROUGH],
        ),
        (
            "allowedRoutes.namespaces.from",
            &listener["properties"]["allowedRoutes"]["properties"]["namespaces"]["properties"]["from"],
            vec![
                from_namespaces::ALL,
                from_namespaces::SELECTOR,
                from_namespaces::SAME,
            ],
        ),
        (
            "path match type",
            &match_["path"]["properties"]["type"],
            vec![
                path_match_types::EXACT,
                path_match_types::PATH_PREFIX,
                path_match_types::REGULAR_EXPRESSION,
            ],
        ),
        (
            "header match type",
            &match_["headers"]["items"]["properties"]["type"],
            vec![
                value_match_types::EXACT,
                value_match_types::REGULAR_EXPRESSION,
            ],
        ),
        ("method", &match_["method"], methods::ALL.to_vec()),
        (
            "filter type (standard)",
            &filter["type"],
            vec![
                filter_types::REQUEST_HEADER_MODIFIER,
                filter_types::RESPONSE_HEADER_MODIFIER,
                filter_types::REQUEST_MIRROR,
                filter_types::REQUEST_REDIRECT,
                filter_types::URL_REWRITE,
                filter_types::EXTENSION_REF,
                filter_types::CORS,
            ],
        ),
        (
            "path modifier type",
            modifier,
            vec![
                path_modifier_types::REPLACE_FULL_PATH,
                path_modifier_types::REPLACE_PREFIX_MATCH,
            ],
        ),
    ];
    let mut problems = Vec::new();
    for (what, schema, values) in cases {
        let allowed = schema["enum"].as_array().cloned().unwrap_or_default();
        for value in values {
            if !allowed.contains(&json!(value)) {
                problems.push(format!("{what}: {value} not in {allowed:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
