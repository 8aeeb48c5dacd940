use serde_json::json;

use super::*;
use crate::agent_config::{AgentConfig, HttpRoute, IngressListener};

/// What the renderer wrote before this schema grew (a TailnetIngress with a tcp and an http
/// listener, backend TLS, both timeout fields, inCluster, limits): it must read and write
/// back byte for byte, so the operator's config digest and older agents see no change.
const RENDERED_BEFORE_GATEWAY: &str = r#"{
  "localapiSocket": "/var/run/tailscale/tailscaled.sock",
  "adminPort": 9180,
  "ingress": [
    {
      "mode": "tcp",
      "port": 5432,
      "name": "db",
      "backend": {
        "host": "db.team-a.svc.cluster.local",
        "port": 5432
      }
    },
    {
      "mode": "http",
      "port": 443,
      "routes": [
        {
          "name": "admin",
          "hostnames": [
            "admin.team-a.lab.example.net"
          ],
          "backend": {
            "host": "admin.team-a.svc.cluster.local",
            "port": 8443
          },
          "backendTls": {
            "serverName": "admin.team-a.svc",
            "caFile": "/etc/tailnet-agent/ca/admin-ca/ca.crt"
          },
          "requestTimeoutSeconds": 2,
          "backendRequestTimeoutSeconds": 1,
          "requestTimeoutMillis": 1500,
          "backendRequestTimeoutMillis": 500
        },
        {
          "name": "web",
          "hostnames": [
            "portal.team-a.lab.example.net",
            "portal.lab.example.net"
          ],
          "backend": {
            "host": "web.team-a.svc.cluster.local",
            "port": 80
          }
        }
      ]
    }
  ],
  "tls": {
    "certFile": "/etc/tailnet-agent/tls/tls.crt",
    "keyFile": "/etc/tailnet-agent/tls/tls.key"
  },
  "limits": {
    "maxConnections": 100,
    "maxConnectionsPerListener": 50,
    "maxConnectionsPerSource": 25,
    "idleTimeoutSeconds": 60
  },
  "inCluster": true
}"#;

#[test]
fn configs_rendered_before_the_gateway_fields_round_trip_byte_for_byte() {
    let config: AgentConfig = serde_json::from_str(RENDERED_BEFORE_GATEWAY).expect("parses");
    let IngressListener::Http { routes, .. } = &config.ingress[1] else {
        panic!("second listener is http");
    };
    assert!(routes.iter().all(|route| route.rules.is_empty()));
    assert!(routes.iter().all(|route| route.backend.is_some()));
    let written = serde_json::to_string_pretty(&config).expect("writes");
    assert_eq!(written, RENDERED_BEFORE_GATEWAY);
}

fn gateway_config() -> serde_json::Value {
    json!({
        "localapiSocket": "/var/run/tailscale/tailscaled.sock",
        "adminPort": 9180,
        "ingress": [
            {"mode": "plainHttp", "port": 80, "routes": [{
                "name": "gw/web",
                "hostnames": ["*.example.com", "example.com"],
                "rules": [
                    {
                        "matches": [{
                            "path": {"type": "PathPrefix", "value": "/api"},
                            "headers": [{"type": "Exact", "name": "x-env", "value": "canary"}],
                            "queryParams": [{"type": "RegularExpression", "name": "v", "value": "[0-9]+"}],
                            "method": "GET"
                        }],
                        "filters": [
                            {"type": "RequestHeaderModifier", "set": [{"name": "x-a", "value": "1"}],
                             "add": [{"name": "x-b", "value": "2"}], "remove": ["x-c"]},
                            {"type": "ResponseHeaderModifier", "remove": ["server"]},
                            {"type": "URLRewrite", "hostname": "api.internal",
                             "path": {"type": "ReplacePrefixMatch", "value": "/"}}
                        ],
                        "backends": [
                            {"backend": {"host": "api-v1.team-a.svc.cluster.local", "port": 8080}, "weight": 90},
                            {"backend": {"host": "api-v2.team-a.svc.cluster.local", "port": 8080}, "weight": 10},
                            {"weight": 0}
                        ],
                        "requestTimeoutMillis": 1500
                    },
                    {
                        "matches": [{"path": {"type": "Exact", "value": "/old"}}],
                        "filters": [{"type": "RequestRedirect", "scheme": "https", "hostname": "new.example.com",
                                     "path": {"type": "ReplaceFullPath", "value": "/new"}, "statusCode": 301}]
                    }
                ]
            }]},
            {"mode": "tlsPassthrough", "port": 8443, "routes": [{
                "name": "gw/db",
                "hostnames": ["db.example.com", "*"],
                "backends": [{"backend": {"host": "db.team-a.svc.cluster.local", "port": 5432}, "weight": 1}]
            }]}
        ]
    })
}

#[test]
fn the_gateway_schema_reads_and_writes_back_the_same_document() {
    let value = gateway_config();
    let config: AgentConfig = serde_json::from_value(value.clone()).expect("parses");
    let IngressListener::PlainHttp { port, routes } = &config.ingress[0] else {
        panic!("plainHttp");
    };
    assert_eq!(*port, 80);
    let rule = &routes[0].rules[0];
    assert_eq!(
        rule.matches[0].path.as_ref().map(|path| path.kind),
        Some(PathMatchType::PathPrefix)
    );
    assert!(matches!(
        &rule.filters[2],
        HttpFilter::UrlRewrite(UrlRewrite { hostname: Some(host), .. }) if host == "api.internal"
    ));
    assert_eq!(rule.backends[2].backend, None);
    assert_eq!(config.ingress[1].port(), 8443);
    assert_eq!(serde_json::to_value(&config).expect("writes"), value);
}

#[test]
fn unknown_fields_and_types_are_refused_also_inside_filters() {
    let cases = [
        json!({"type": "RequestHeaderModifier", "sett": []}),
        json!({"type": "RequestMirror"}),
        json!({"type": "RequestRedirect", "statusCode": 301, "extra": 1}),
    ];
    for filter in cases {
        assert!(
            serde_json::from_value::<HttpFilter>(filter.clone()).is_err(),
            "{filter}"
        );
    }
    assert!(serde_json::from_value::<HttpRequestMatch>(json!({"paths": []})).is_err());
    let defaulted: WeightedBackend =
        serde_json::from_value(json!({"backend": {"host": "a", "port": 1}})).expect("backend");
    assert_eq!(defaulted.weight, 1, "the Gateway API's default weight");
    let header: ValueMatch =
        serde_json::from_value(json!({"name": "a", "value": "b"})).expect("match");
    assert_eq!(header.kind, ValueMatchType::Exact);
}

fn rule(value: serde_json::Value) -> HttpRule {
    serde_json::from_value(value).unwrap_or_else(|e| panic!("test rule: {e}"))
}

fn check(rules: &[HttpRule]) -> Result<(), RuleError> {
    check_http_rules(rules, "route", &mut RegexBudget::default())
}

#[test]
fn valid_rules_pass() {
    let config: AgentConfig = serde_json::from_value(gateway_config()).expect("parses");
    let IngressListener::PlainHttp { routes, .. } = &config.ingress[0] else {
        panic!("plainHttp");
    };
    assert_eq!(check(&routes[0].rules), Ok(()));
    // ReplacePrefixMatch with matches without a path: the default prefix `/`.
    let prefix_default = rule(json!({
        "matches": [{"method": "GET"}],
        "filters": [{"type": "URLRewrite", "path": {"type": "ReplacePrefixMatch", "value": ""}}],
        "backends": [{"backend": {"host": "a", "port": 1}}]
    }));
    assert_eq!(check(&[prefix_default]), Ok(()));
}

#[test]
fn bad_rules_are_refused_naming_the_field() {
    let backend = json!([{"backend": {"host": "a", "port": 1}}]);
    let many = |n: usize, item: serde_json::Value| vec![item; n];
    let header = |name: &str| json!({"name": name, "value": "v"});
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (
            json!({"matches": [{"path": {"type": "PathPrefix", "value": "api"}}]}),
            "route.rules[0].matches[0].path.value",
        ),
        (
            json!({"matches": [{"path": {"type": "Exact", "value": "/a?b=c"}}]}),
            "route.rules[0].matches[0].path.value",
        ),
        (
            json!({"matches": [{"path": {"type": "RegularExpression", "value": "(unclosed"}}]}),
            "route.rules[0].matches[0].path.value",
        ),
        (
            json!({"matches": [{"headers": [{"name": "bad name", "value": "x"}]}]}),
            "route.rules[0].matches[0].headers[0].name",
        ),
        (
            json!({"matches": [{"headers": many(17, header("x"))}]}),
            "route.rules[0].matches[0].headers",
        ),
        (
            json!({"matches": [{"queryParams": [{"name": "", "value": "x"}]}]}),
            "route.rules[0].matches[0].queryParams[0].name",
        ),
        (
            json!({"matches": [{"method": "get"}]}),
            "route.rules[0].matches[0].method",
        ),
        (
            json!({"matches": many(65, json!({}))}),
            "route.rules[0].matches",
        ),
        (
            json!({"filters": [{"type": "RequestHeaderModifier", "set": [header("Host")]}]}),
            "route.rules[0].filters[0].set[0]",
        ),
        (
            json!({"filters": [{"type": "RequestHeaderModifier", "remove": ["X-Forwarded-For"]}]}),
            "route.rules[0].filters[0].remove[0]",
        ),
        (
            json!({"filters": [{"type": "RequestHeaderModifier", "add": [header("tailscale-user-login")]}]}),
            "route.rules[0].filters[0].add[0]",
        ),
        (
            json!({"filters": [{"type": "ResponseHeaderModifier", "set": [header("content-length")]}]}),
            "route.rules[0].filters[0].set[0]",
        ),
        (
            json!({"filters": [{"type": "ResponseHeaderModifier", "set": [header("a"), header("A")]}]}),
            "route.rules[0].filters[0].set[1]",
        ),
        (
            json!({"filters": [{"type": "ResponseHeaderModifier",
                                "set": [{"name": "a", "value": "line\nbreak"}]}]}),
            "route.rules[0].filters[0].set[0].value",
        ),
        (
            json!({"filters": [{"type": "RequestHeaderModifier", "remove": many(17, json!("x"))}]}),
            "route.rules[0].filters[0].remove",
        ),
        (
            json!({"filters": [{"type": "ResponseHeaderModifier"}, {"type": "ResponseHeaderModifier"}]}),
            "route.rules[0].filters[1]",
        ),
        (
            json!({"filters": [{"type": "RequestRedirect"}, {"type": "URLRewrite"}]}),
            "route.rules[0].filters",
        ),
        (
            json!({"filters": [{"type": "RequestRedirect", "statusCode": 300}]}),
            "route.rules[0].filters[0].statusCode",
        ),
        (
            json!({"filters": [{"type": "RequestRedirect", "port": 0}]}),
            "route.rules[0].filters[0].port",
        ),
        (
            json!({"filters": [{"type": "RequestRedirect", "hostname": "*.example.com"}]}),
            "route.rules[0].filters[0].hostname",
        ),
        (
            json!({"filters": [{"type": "URLRewrite", "hostname": "a b"}]}),
            "route.rules[0].filters[0].hostname",
        ),
        (
            json!({"filters": [{"type": "URLRewrite", "path": {"type": "ReplaceFullPath", "value": ""}}]}),
            "route.rules[0].filters[0].path.value",
        ),
        (
            json!({"matches": [{"path": {"type": "Exact", "value": "/a"}}],
                   "filters": [{"type": "URLRewrite", "path": {"type": "ReplacePrefixMatch", "value": "/b"}}]}),
            "route.rules[0].filters[0].path.type",
        ),
        (
            json!({"matches": [{"path": {"type": "PathPrefix", "value": "/a"}}],
                   "filters": [{"type": "RequestRedirect", "path": {"type": "ReplacePrefixMatch", "value": "b"}}]}),
            "route.rules[0].filters[0].path.value",
        ),
        (
            json!({"filters": many(17, json!({"type": "URLRewrite"}))}),
            "route.rules[0].filters",
        ),
        (
            json!({"backends": [{"backend": {"host": "a", "port": 1}, "weight": 1_000_001}]}),
            "route.rules[0].backends[0].weight",
        ),
        (
            json!({"backends": [{"backend": {"host": " ", "port": 1}}]}),
            "route.rules[0].backends[0].backend.host",
        ),
        (
            json!({"backends": [{"backend": {"host": "a", "port": 0}}]}),
            "route.rules[0].backends[0].backend.port",
        ),
        (
            json!({"backends": [{"backend": {"host": "a", "port": 1},
                                 "backendTls": {"serverName": "a", "caFile": ""}}]}),
            "route.rules[0].backends[0].backendTls.caFile",
        ),
        (
            json!({"backends": many(17, backend[0].clone())}),
            "route.rules[0].backends",
        ),
        (
            json!({"backends": backend, "requestTimeoutMillis": 0}),
            "route.rules[0].requestTimeoutMillis",
        ),
    ];
    for (value, field) in cases {
        let result = check(&[rule(value.clone())]);
        assert_eq!(
            result.as_ref().map_err(|e| e.field.as_str()),
            Err(field),
            "{value}: {result:?}"
        );
    }
    let too_many_rules = vec![HttpRule::default(); MAX_RULES_PER_ROUTE + 1];
    assert_eq!(
        check(&too_many_rules).map_err(|e| e.field),
        Err("route.rules".to_string())
    );
}

#[test]
fn regular_expressions_are_anchored_and_bounded() {
    let regex = build_regex("/api/v[0-9]+").expect("compiles");
    assert!(regex.is_match("/api/v12"));
    assert!(!regex.is_match("/x/api/v1"), "anchored at the start");
    assert!(!regex.is_match("/api/v1/more"), "anchored at the end");
    // An alternation cannot escape the anchors.
    let alternation = build_regex("a|b").expect("compiles");
    assert!(!alternation.is_match("ab"));
    assert!(alternation.is_match("b"));
    // Compiles to far more than the size limit (Unicode word classes, repeated).
    assert!(build_regex(r"\w{500}").is_err());
    assert!(build_regex(&"a".repeat(MAX_REGEX_LENGTH + 1)).is_err());

    let regex_rule = rule(json!({
        "matches": [{"path": {"type": "RegularExpression", "value": "/a.*"}}]
    }));
    let mut budget = RegexBudget::default();
    let rules = vec![regex_rule; MAX_REGEXES];
    assert_eq!(check_http_rules(&rules, "r", &mut budget), Ok(()));
    let one_more = check_http_rules(&rules[..1], "r", &mut budget);
    assert_eq!(
        one_more.map_err(|e| e.field),
        Err("r.rules[0].matches[0].path.value".to_string()),
        "the budget is per config"
    );
}

#[test]
fn hostname_patterns_and_header_policy() {
    for good in [
        "*",
        "*.example.com",
        "example.com",
        "a-b.example.com.",
        "*.com",
    ] {
        assert!(check_hostname_pattern(good), "{good}");
    }
    for bad in [
        "",
        "*.",
        "**.example.com",
        "a.*.com",
        "example.com:443",
        "*example.com",
    ] {
        assert!(!check_hostname_pattern(bad), "{bad}");
    }
    assert!(is_reserved_request_header("X-Forwarded-Proto"));
    assert!(is_reserved_request_header("Tailscale-User-Name"));
    assert!(!is_reserved_request_header("x-request-id"));
    assert!(is_reserved_response_header("Transfer-Encoding"));
    assert!(!is_reserved_response_header("set-cookie"));
    assert!(is_header_value("a b\tc"));
    assert!(!is_header_value(" a"));
    assert!(!is_header_value("ä"));
}

#[test]
fn passthrough_backends_carry_no_tls() {
    let route: PassthroughRoute = serde_json::from_value(json!({
        "name": "db", "hostnames": ["db.example.com"],
        "backends": [{"backend": {"host": "a", "port": 1},
                      "backendTls": {"serverName": "a", "caFile": "/ca"}}]
    }))
    .expect("route");
    assert_eq!(
        check_backends(&route.backends, "routes[0].backends", false).map_err(|e| e.field),
        Err("routes[0].backends[0].backendTls".to_string())
    );
    // A route without rules needs no rules check; its `backend` stays what it was.
    let legacy: HttpRoute = serde_json::from_value(json!({
        "name": "web", "hostnames": ["a.example"], "backend": {"host": "a", "port": 1}
    }))
    .expect("route");
    assert!(legacy.rules.is_empty());
}
