use super::*;
use crate::egress::TailnetEgressSpec;
use crate::ingress::TailnetIngressSpec;
use crate::tailnet::TailnetSpec;

const TAILNET: &str = r#"
server: https://control.example.net
apiSecretRef: {name: headscale-bootstrap, key: apiKey}
dns:
  hostsConfigMap: tailnet-hosts
  ingressNameTemplate: "{name}.{namespace}.lab.example.net"
  ingressAliasTemplate: "{name}.lab.example.net"
defaults:
  tls: {issuerRef: {name: apps-ca, kind: ClusterIssuer}}
policy:
  baseConfigMap: tailnet-policy
  mode: DryRun
  tagOwners: ["group:platform"]
  routeApprovers: ["tag:router"]
  ingressSourceAllowlist: ["group:team-a"]
"#;

const EGRESS: &str = r#"
tailnetRef: {name: demo}
consumerNamespaces: [team-a]
targets:
  - {name: remote-db, address: 192.0.2.10, port: 5432}
  - {name: remote-api, address: 198.51.100.20, port: 443, aliases: [api.site.example.net]}
"#;

const INGRESS: &str = r#"
tailnetRef: {name: demo}
allowFrom: ["group:team-a"]
exposes:
  - {name: web, dnsLabel: portal, alias: true, mode: http, port: 443, backend: {service: frontend, port: 8080}}
  - name: admin
    dnsLabel: admin
    mode: http
    port: 443
    backend:
      service: admin
      port: 8443
      tls: {serverName: admin.team-a.svc.cluster.local, caConfigMapRef: {name: backend-ca, key: ca.crt}}
    timeouts: {request: 600s, backendRequest: 60s}
"#;

fn tailnet_spec() -> TailnetSpec {
    serde_yaml::from_str(TAILNET).expect("tailnet fixture")
}

/// Parses a fixture after applying `edit` to its YAML value.
fn edited<T: serde::de::DeserializeOwned>(
    yaml: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> T {
    let mut value: serde_json::Value = serde_yaml::from_str(yaml).expect("fixture yaml");
    edit(&mut value);
    serde_json::from_value(value).expect("edited fixture still deserializes")
}

fn fields(errors: &[FieldError]) -> Vec<String> {
    errors.iter().map(|e| e.to_string()).collect()
}

#[test]
fn examples_are_valid() {
    assert!(tailnet(&tailnet_spec()).is_empty());
    let e: TailnetEgressSpec = edited(EGRESS, |_| {});
    assert_eq!(egress(&e), vec![]);
    let i: TailnetIngressSpec = edited(INGRESS, |_| {});
    assert_eq!(ingress(&i), vec![]);
    let names =
        ingress_in_context("team-a", "tailnet-system", &i, "demo", &tailnet_spec()).expect("valid");
    assert_eq!(
        names[0].hostnames,
        vec!["portal.team-a.lab.example.net", "portal.lab.example.net"]
    );
    assert_eq!(names[1].hostnames, vec!["admin.team-a.lab.example.net"]);
}

#[test]
fn bad_egress_inputs_name_the_field() {
    type Edit = fn(&mut serde_json::Value);
    let table: Vec<(&str, Edit, &str)> = vec![
        (
            "invalid IP",
            |v| v["targets"][0]["address"] = "192.0.2.300".into(),
            "spec.targets[remote-db].address: \"192.0.2.300\" is neither an IPv4/IPv6 address nor a lowercase DNS name; use e.g. 192.0.2.10, 2001:db8::10 or db.site.example.net",
        ),
        (
            "invalid hostname",
            |v| v["targets"][0]["address"] = "db_1.example.net".into(),
            "spec.targets[remote-db].address: \"db_1.example.net\" is neither an IPv4/IPv6 address nor a lowercase DNS name; use e.g. 192.0.2.10, 2001:db8::10 or db.site.example.net",
        ),
        (
            "port 0",
            |v| v["targets"][0]["port"] = 0.into(),
            "spec.targets[remote-db].port: port 0 is out of range; use 1-65535",
        ),
        (
            "port 70000",
            |v| v["targets"][1]["port"] = 70000.into(),
            "spec.targets[remote-api].port: port 70000 is out of range; use 1-65535",
        ),
        (
            "duplicate target",
            |v| v["targets"][1]["name"] = "remote-db".into(),
            "spec.targets[remote-db].name: duplicate target name; each target becomes a Service of that name",
        ),
        (
            "service name starting with a digit",
            |v| v["targets"][0]["name"] = "1db".into(),
            "spec.targets[1db].name: \"1db\" is not a Service name (lowercase letters, digits, '-', starting with a letter, at most 63)",
        ),
        (
            "no consumer namespaces",
            |v| v["consumerNamespaces"] = serde_json::json!([]),
            "spec.consumerNamespaces: must list at least one namespace whose pods may use the targets",
        ),
        (
            "bad alias",
            |v| v["targets"][1]["aliases"] = serde_json::json!(["API.example.net"]),
            "spec.targets[remote-api].aliases[0]: \"API.example.net\" is not a fully qualified lowercase hostname",
        ),
        (
            "bad probe interval",
            |v| v["targets"][0]["probe"] = serde_json::json!({"interval": "5 minutes"}),
            "spec.targets[remote-db].probe.interval: \"5 minutes\" is not a duration; use e.g. 30s, 1m30s or 2h",
        ),
    ];
    for (case, edit, expected) in table {
        let spec: TailnetEgressSpec = edited(EGRESS, edit);
        assert_eq!(
            fields(&egress(&spec)),
            vec![expected.to_string()],
            "case: {case}"
        );
    }
}

#[test]
fn dns_and_ipv6_targets_are_valid_addresses() {
    assert_eq!(
        TargetAddress::parse("f", "db.site.example.net"),
        Ok(TargetAddress::Dns("db.site.example.net".into()))
    );
    assert_eq!(
        TargetAddress::parse("f", "2001:db8::10"),
        Ok(TargetAddress::Ip("2001:db8::10".parse().expect("ip")))
    );
    assert!(TargetAddress::parse("f", "192.0.2.0/24").is_err());
    assert!(TargetAddress::parse("f", "fe80::1%eth0").is_err());
}

#[test]
fn bad_ingress_inputs_name_the_field() {
    type Edit = fn(&mut serde_json::Value);
    let table: Vec<(&str, Edit, &str)> = vec![
        (
            "duplicate expose",
            |v| v["exposes"][1]["name"] = "web".into(),
            "spec.exposes[web].name: duplicate expose name",
        ),
        (
            "port 0",
            |v| v["exposes"][0]["port"] = 0.into(),
            "spec.exposes[web].port: port 0 is out of range; use 1-65535",
        ),
        (
            "backend port 70000",
            |v| v["exposes"][0]["backend"]["port"] = 70000.into(),
            "spec.exposes[web].backend.port: port 70000 is out of range; use 1-65535",
        ),
        (
            "backend tls with tcp",
            |v| {
                v["exposes"][1]["mode"] = "tcp".into();
                v["exposes"][1]["port"] = 8443.into();
                v["exposes"][1]
                    .as_object_mut()
                    .map(|o| o.remove("timeouts"));
            },
            "spec.exposes[admin].backend.tls: backend.tls requires mode: http (tcp exposes forward bytes unchanged)",
        ),
        (
            "tcp sharing a port",
            |v| v["exposes"][0]["mode"] = "tcp".into(),
            "spec.exposes[web].port: port 443 is shared with another expose; a tcp expose needs a port of its own",
        ),
        (
            "bad principal",
            |v| v["allowFrom"] = serde_json::json!(["team-a"]),
            "spec.allowFrom[0]: \"team-a\" is not a policy principal; use group:<name>, tag:<name>, autogroup:<name> or <user>@",
        ),
        (
            "bad timeout",
            |v| v["exposes"][1]["timeouts"]["request"] = "10".into(),
            "spec.exposes[admin].timeouts.request: \"10\" is not a duration; use e.g. 30s, 1m30s or 2h",
        ),
    ];
    for (case, edit, expected) in table {
        let spec: TailnetIngressSpec = edited(INGRESS, edit);
        assert_eq!(
            fields(&ingress(&spec)),
            vec![expected.to_string()],
            "case: {case}"
        );
    }
}

#[test]
fn ingress_context_rules() {
    let tn = tailnet_spec();
    // Cross-namespace backend from a non-operator namespace.
    let spec: TailnetIngressSpec = edited(INGRESS, |v| {
        v["exposes"][0]["backend"]["namespace"] = "other".into()
    });
    let errors =
        ingress_in_context("team-a", "tailnet-system", &spec, "demo", &tn).expect_err("rejected");
    assert_eq!(
        fields(&errors),
        vec![
            "spec.exposes[web].backend.namespace: a backend in another namespace (\"other\") is only allowed for TailnetIngress objects in the operator namespace \"tailnet-system\"; expose the Service from \"other\" itself"
        ]
    );
    // ... but allowed from the operator namespace (administrative ingress).
    assert!(ingress_in_context("tailnet-system", "tailnet-system", &spec, "demo", &tn).is_ok());

    // http without any certificate source.
    let mut no_issuer = tn.clone();
    no_issuer.defaults = None;
    let spec: TailnetIngressSpec = edited(INGRESS, |_| {});
    let errors = ingress_in_context("team-a", "tailnet-system", &spec, "demo", &no_issuer)
        .expect_err("rejected");
    assert_eq!(
        fields(&errors),
        vec![
            "spec.tls.secretName: http exposes need a certificate: set spec.tls.secretName or spec.defaults.tls.issuerRef on Tailnet demo"
        ]
    );
    // tcp-only needs none.
    let tcp: TailnetIngressSpec = edited(INGRESS, |v| {
        v["exposes"] = serde_json::json!([{"name": "kube", "dnsLabel": "kube", "mode": "tcp", "port": 6443, "backend": {"service": "kubernetes", "port": 443}}]);
    });
    assert!(ingress_in_context("team-a", "tailnet-system", &tcp, "demo", &no_issuer).is_ok());

    // allowFrom outside the allowlist.
    let spec: TailnetIngressSpec = edited(INGRESS, |v| {
        v["allowFrom"] = serde_json::json!(["group:team-a", "group:everyone"])
    });
    assert_eq!(
        sources_not_allowed(&spec, &tn),
        vec!["group:everyone".to_string()]
    );
    assert!(sources_not_allowed(&edited::<TailnetIngressSpec>(INGRESS, |_| {}), &tn).is_empty());
}

#[test]
fn templates_accept_only_name_and_namespace() {
    assert_eq!(
        expand_template(
            "t",
            "{name}.{namespace}.lab.example.net",
            "portal",
            "team-a"
        ),
        Ok("portal.team-a.lab.example.net".into())
    );
    assert_eq!(
        expand_template("spec.dns.ingressNameTemplate", "{name}.{cluster}.example.net", "portal", "team-a").map_err(|e| e.to_string()),
        Err("spec.dns.ingressNameTemplate: unknown placeholder {cluster} in \"{name}.{cluster}.example.net\"; only {name} and {namespace} are allowed".into())
    );
    assert_eq!(
        expand_template("t", "{namespace}.example.net", "portal", "team-a").map_err(|e| e.to_string()),
        Err("t: \"{namespace}.example.net\" must contain {name} so that each expose gets its own hostname".into())
    );
    assert!(expand_template("t", "{name", "portal", "team-a").is_err());
    assert!(
        expand_template("t", "{name}", "portal", "team-a").is_err(),
        "a single label is not a hostname"
    );
    let mut tn = tailnet_spec();
    tn.dns.as_mut().expect("dns").ingress_alias_template = Some("{name}.{env}.example.net".into());
    assert_eq!(
        fields(&tailnet(&tn)),
        vec![
            "spec.dns.ingressAliasTemplate: unknown placeholder {env} in \"{name}.{env}.example.net\"; only {name} and {namespace} are allowed"
        ]
    );
}

#[test]
fn durations_parse_like_kubernetes() {
    assert_eq!(
        parse_duration("f", "600s"),
        Ok(std::time::Duration::from_secs(600))
    );
    assert_eq!(
        parse_duration("f", "1m30s"),
        Ok(std::time::Duration::from_secs(90))
    );
    assert!(parse_duration("f", "0s").is_err());
    assert!(parse_duration("f", "-5s").is_err());
    assert!(parse_duration("f", "5").is_err());
    let d = |v: &str| parse_duration("f", v);
    assert_eq!(d("1.5h"), Ok(std::time::Duration::from_secs(5400)));
    assert_eq!(d("250ms"), Ok(std::time::Duration::from_millis(250)));
    assert_eq!(
        d("2m3s4ms5us6ns"),
        Ok(std::time::Duration::new(123, 4_005_006))
    );
    assert_eq!(d("1µs"), Ok(std::time::Duration::from_micros(1)));
    assert_eq!(d("168h"), Ok(std::time::Duration::from_secs(7 * 24 * 3600)));
    // Beyond a week, and values that overflowed kube-core's parser (a panic found by fuzzing).
    assert_eq!(
        d("169h").map_err(|e| e.to_string()),
        Err("f: \"169h\" is longer than the maximum of 168h".into())
    );
    assert!(d("62222222222222222222ns6ns").is_err());
    assert!(d("99999999999999999999999999999h").is_err());
    assert!(d(&"1s".repeat(17)).is_err(), "longer than 32 characters");
}

#[test]
fn templates_refuse_labels_over_63_characters() {
    let name = "a".repeat(40);
    assert_eq!(
        expand_template(
            "spec.dns.ingressNameTemplate",
            "{name}{name}.example.net",
            &name,
            "team-a"
        )
        .map_err(|e| e.field),
        Err("spec.dns.ingressNameTemplate".to_string())
    );
    assert!(expand_template("t", "{name}.example.net", &"b".repeat(63), "ns").is_ok());
    assert!(expand_template("t", "{name}.example.net", &"b".repeat(64), "ns").is_err());
}

#[test]
fn egress_only_in_operator_namespace() {
    assert!(egress_namespace("tailnet-system", "tailnet-system").is_ok());
    let err = egress_namespace("team-a", "tailnet-system").expect_err("wrong namespace");
    assert_eq!(err.field, "metadata.namespace");
}

#[test]
fn built_in_patterns_compile() {
    for p in [
        patterns::DNS_LABEL,
        patterns::SERVICE_NAME,
        patterns::DNS_SUBDOMAIN,
        patterns::HOSTNAME,
        patterns::DURATION,
        patterns::GEP_2257_DURATION,
        patterns::PRINCIPAL,
        patterns::NAME_TEMPLATE,
        patterns::SERVER_URL,
        patterns::TAG_PREFIX,
        patterns::LOG_FILTER,
    ] {
        assert!(Regex::new(p).is_ok(), "{p}");
    }
}

/// `spec.agent.logLevel`: `render` refuses what the apiserver's pattern refuses, and the
/// CRD carries the same pattern; `logFormat` is `text` or `json`.
#[test]
fn agent_log_settings_are_checked_like_the_crd() {
    let with = |level: &str| {
        edited::<TailnetSpec>(TAILNET, |v| {
            v["agent"] = serde_json::json!({"logLevel": level, "logFormat": "json"});
        })
    };
    for good in [
        "info",
        "debug",
        "warn,tailnet_agent::proxy=debug,access=info",
        "off",
    ] {
        assert!(tailnet(&with(good)).is_empty(), "{good}");
    }
    let long = "d".repeat(257);
    for bad in [
        "info debug",
        "[span]=debug",
        "info,x={y}",
        "",
        long.as_str(),
    ] {
        let errors = fields(&tailnet(&with(bad)));
        assert_eq!(errors.len(), 1, "{bad}: {errors:?}");
        assert!(errors[0].starts_with("spec.agent.logLevel: "), "{errors:?}");
    }
    assert!(
        serde_json::from_value::<TailnetSpec>(serde_json::json!({
            "server": "https://h.example.net", "policy": {"tagOwners": ["group:a"]},
            "agent": {"logFormat": "xml"}
        }))
        .is_err()
    );
    let crd = serde_json::to_value(crate::crd::all().remove(0).1).expect("CRD JSON");
    let agent = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["agent"]["properties"];
    assert_eq!(agent["logLevel"]["pattern"], patterns::LOG_FILTER);
    assert_eq!(agent["logLevel"]["maxLength"], 256);
    assert_eq!(
        agent["logFormat"]["enum"],
        serde_json::json!(["text", "json"])
    );
}

fn ip(text: &str) -> std::net::IpAddr {
    text.parse().expect("test IP")
}

#[test]
fn valid_egress_parses_every_target_once() {
    let spec: TailnetEgressSpec = edited(EGRESS, |v| {
        v["targets"] = serde_json::json!([
            {"name": "v4", "address": "192.0.2.10", "port": 5432},
            {"name": "v6", "address": "2001:db8::10", "port": 443, "probe": {"interval": "1m30s"}},
            {"name": "dns", "address": "db.site.example.net", "port": 65535, "aliases": ["db.example.net"], "probe": {"enabled": false}},
            {"name": "off-with-interval", "address": "fd7a:115c:a1e0::7", "port": 1, "probe": {"enabled": false, "interval": "10s"}},
        ]);
    });
    let valid = valid_egress(&spec).expect("valid");
    assert_eq!(valid.consumer_namespaces, vec!["team-a"]);
    let expected = vec![
        ValidTarget {
            name: "v4".into(),
            address: TargetAddress::Ip(ip("192.0.2.10")),
            port: 5432,
            aliases: vec![],
            probe_interval: Some(DEFAULT_PROBE_INTERVAL),
        },
        ValidTarget {
            name: "v6".into(),
            address: TargetAddress::Ip(ip("2001:db8::10")),
            port: 443,
            aliases: vec![],
            probe_interval: Some(Duration::from_secs(90)),
        },
        ValidTarget {
            name: "dns".into(),
            address: TargetAddress::Dns("db.site.example.net".into()),
            port: 65535,
            aliases: vec!["db.example.net".into()],
            probe_interval: None,
        },
        ValidTarget {
            name: "off-with-interval".into(),
            address: TargetAddress::Ip(ip("fd7a:115c:a1e0::7")),
            port: 1,
            aliases: vec![],
            probe_interval: None,
        },
    ];
    assert_eq!(valid.targets, expected);
}

#[test]
fn valid_egress_returns_every_error_and_the_wrapper_the_same() {
    let spec: TailnetEgressSpec = edited(EGRESS, |v| {
        v["targets"][0]["port"] = 0.into();
        v["targets"][1]["address"] = "not an address".into();
        v["targets"][1]["probe"] = serde_json::json!({"enabled": false, "interval": "0s"});
    });
    let errors = valid_egress(&spec).expect_err("invalid");
    assert_eq!(
        fields(&errors),
        vec![
            "spec.targets[remote-db].port: port 0 is out of range; use 1-65535",
            "spec.targets[remote-api].address: \"not an address\" is neither an IPv4/IPv6 address nor a lowercase DNS name; use e.g. 192.0.2.10, 2001:db8::10 or db.site.example.net",
            "spec.targets[remote-api].probe.interval: must be greater than zero",
        ]
    );
    assert_eq!(egress(&spec), errors);
}

#[test]
fn valid_ingress_parses_ports_backends_and_timeouts() {
    let spec: TailnetIngressSpec = edited(INGRESS, |v| {
        v["exposes"][1]["backend"]["port"] = "https".into();
        v["exposes"].as_array_mut().expect("exposes").push(serde_json::json!(
            {"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 5432, "backend": {"service": "postgres", "namespace": "team-a", "port": 5432}}
        ));
    });
    let valid = valid_ingress(&spec).expect("valid");
    assert_eq!(valid.allow_from, vec!["group:team-a"]);
    assert_eq!(valid.tls_secret_name, None);
    let web = &valid.exposes[0];
    assert_eq!(
        (
            web.name.as_str(),
            web.dns_label.as_str(),
            web.alias,
            web.mode,
            web.port
        ),
        ("web", "portal", true, ExposeMode::Http, 443)
    );
    assert_eq!(web.backend.port, BackendPort::Number(8080));
    assert_eq!(web.backend.namespace_or("team-a"), "team-a");
    assert_eq!(web.timeouts, ValidTimeouts::default());
    let admin = &valid.exposes[1];
    assert_eq!(admin.backend.port, BackendPort::Name("https".into()));
    assert_eq!(
        admin
            .backend
            .tls
            .as_ref()
            .map(|t| t.ca_config_map_ref.key.as_str()),
        Some("ca.crt")
    );
    assert_eq!(
        admin.timeouts,
        ValidTimeouts {
            request: Some(Duration::from_secs(600)),
            backend_request: Some(Duration::from_secs(60)),
        }
    );
    let db = &valid.exposes[2];
    assert_eq!((db.mode, db.port), (ExposeMode::Tcp, 5432));
    assert_eq!(db.backend.namespace.as_deref(), Some("team-a"));
    assert_eq!(BackendPort::Number(8080).to_string(), "8080");
    assert_eq!(
        BackendPort::Name("http".into()).to_string(),
        "named \"http\""
    );
}

#[test]
fn valid_ingress_returns_every_error_and_the_wrapper_the_same() {
    let spec: TailnetIngressSpec = edited(INGRESS, |v| {
        v["exposes"][0]["backend"]["port"] = 0.into();
        v["exposes"][1]["backend"]["port"] = "Not_A_Name".into();
        v["exposes"][1]["timeouts"]["request"] = "soon".into();
        v["tls"] = serde_json::json!({"secretName": "Bad"});
    });
    let errors = valid_ingress(&spec).expect_err("invalid");
    assert_eq!(
        fields(&errors),
        vec![
            "spec.tls.secretName: \"Bad\" is not a Secret name",
            "spec.exposes[web].backend.port: port 0 is out of range; use 1-65535",
            "spec.exposes[admin].backend.port: \"Not_A_Name\" is not a port number or port name",
            "spec.exposes[admin].timeouts.request: \"soon\" is not a duration; use e.g. 30s, 1m30s or 2h",
        ]
    );
    assert_eq!(ingress(&spec), errors);
}

#[test]
fn valid_tailnet_keeps_the_checked_parts() {
    let valid = valid_tailnet(&tailnet_spec()).expect("valid");
    assert_eq!(valid.server, "https://control.example.net");
    assert_eq!(
        valid.hosts_config_map,
        Some(HostsConfigMap {
            name: "tailnet-hosts".into(),
            namespace: None
        })
    );
    assert_eq!(
        valid.ingress_name_template.as_deref(),
        Some("{name}.{namespace}.lab.example.net")
    );
    assert_eq!(valid.issuer.map(|i| i.name), Some("apps-ca".to_string()));
    assert_eq!(valid.policy.tag_owners, vec!["group:platform"]);

    let mut bad = tailnet_spec();
    bad.server = "control.example.net".into();
    bad.policy.tag_owners.clear();
    let errors = valid_tailnet(&bad).expect_err("invalid");
    assert_eq!(
        fields(&errors),
        vec![
            "spec.server: \"control.example.net\" is not an http(s) URL; use e.g. https://control.example.net",
            "spec.policy.tagOwners: must name at least one owner of the generated tags, e.g. group:platform",
        ]
    );
    assert_eq!(tailnet(&bad), errors);
}

#[test]
fn ingress_names_of_a_validated_spec_equal_the_raw_ones() {
    let tn = tailnet_spec();
    for (namespace, edit) in [
        (
            "team-a",
            (|_: &mut serde_json::Value| {}) as fn(&mut serde_json::Value),
        ),
        ("team-a", |v| {
            v["exposes"][0]["backend"]["namespace"] = "other".into()
        }),
        ("tailnet-system", |v| {
            v["exposes"][0]["backend"]["namespace"] = "other".into()
        }),
        ("team-a", |v| {
            v["tls"] = serde_json::json!({"secretName": "mine"})
        }),
    ] {
        let spec: TailnetIngressSpec = edited(INGRESS, edit);
        let valid = valid_ingress(&spec).expect("schema-valid");
        assert_eq!(
            ingress_names(namespace, "tailnet-system", &valid, "demo", &tn),
            ingress_in_context(namespace, "tailnet-system", &spec, "demo", &tn),
            "{namespace}"
        );
    }
    let mut no_issuer = tn.clone();
    no_issuer.defaults = None;
    let valid = valid_ingress(&edited(INGRESS, |_| {})).expect("valid");
    assert_eq!(
        fields(
            &ingress_names("team-a", "tailnet-system", &valid, "demo", &no_issuer)
                .expect_err("no certificate source")
        ),
        vec![
            "spec.tls.secretName: http exposes need a certificate: set spec.tls.secretName or spec.defaults.tls.issuerRef on Tailnet demo"
        ]
    );
}

/// Every Gateway API (GEP-2257) duration is accepted by the schema pattern and parses to its
/// GEP meaning, within our bounds (more than 0, at most 168h); the Go forms stored by earlier
/// releases still parse.
#[test]
fn gep_2257_durations_are_accepted() {
    use std::time::Duration;
    let gep = Regex::new(patterns::GEP_2257_DURATION).expect("GEP pattern");
    let ours = Regex::new(patterns::DURATION).expect("our pattern");
    for (text, expected) in [
        ("1h", Duration::from_secs(3600)),
        ("1h30m", Duration::from_secs(5400)),
        ("30m", Duration::from_secs(1800)),
        ("10s", Duration::from_secs(10)),
        ("500ms", Duration::from_millis(500)),
        ("10s500ms", Duration::from_millis(10_500)),
        ("1h2m3s4ms", Duration::new(3723, 4_000_000)),
        ("2h0m", Duration::from_secs(7200)),
        ("90m", Duration::from_secs(5400)),
        ("00001s", Duration::from_secs(1)),
        ("99999ms", Duration::from_millis(99_999)),
        ("168h", Duration::from_secs(168 * 3600)),
    ] {
        assert!(gep.is_match(text), "{text} is GEP-2257");
        assert!(ours.is_match(text), "{text} must match the CRD pattern");
        assert_eq!(parse_duration("f", text), Ok(expected), "{text}");
    }
    // GEP-2257 strings outside our bounds are refused with a message, not misread.
    for text in ["0s", "0h0m0s", "99999h"] {
        assert!(gep.is_match(text), "{text}");
        assert!(parse_duration("f", text).is_err(), "{text}");
    }
    // Formats accepted before (Go durations) keep parsing: stored objects stay valid.
    for (text, expected) in [
        ("1.5h", Duration::from_secs(5400)),
        ("600s", Duration::from_secs(600)),
        ("250us", Duration::from_micros(250)),
        ("1m30s", Duration::from_secs(90)),
    ] {
        assert!(ours.is_match(text), "{text}");
        assert_eq!(parse_duration("f", text), Ok(expected), "{text}");
    }
}

#[test]
fn in_cluster_namespaces_are_checked_sorted_and_keep_the_admin_port_free() {
    let spec: TailnetIngressSpec =
        edited(
            INGRESS,
            |v| v["inCluster"] = serde_json::json!({"namespaces": ["team-b", "team-a", "team-b"]}),
        );
    let valid = valid_ingress(&spec).expect("valid");
    assert_eq!(valid.in_cluster_namespaces, vec!["team-a", "team-b"]);
    let plain: TailnetIngressSpec = edited(INGRESS, |_| {});
    assert!(
        valid_ingress(&plain)
            .expect("valid")
            .in_cluster_namespaces
            .is_empty()
    );

    let bad: TailnetIngressSpec = edited(INGRESS, |v| {
        v["inCluster"] = serde_json::json!({"namespaces": ["Team A"]})
    });
    assert_eq!(
        fields(&valid_ingress(&bad).expect_err("bad namespace")),
        vec!["spec.inCluster.namespaces: \"Team A\" is not a namespace name"]
    );
    let too_many: TailnetIngressSpec = edited(INGRESS, |v| {
        v["inCluster"] = serde_json::json!({"namespaces": (0..33).map(|i| format!("ns-{i}")).collect::<Vec<_>>()})
    });
    assert_eq!(
        fields(&valid_ingress(&too_many).expect_err("too many")),
        vec!["spec.inCluster.namespaces: lists 33 namespaces; at most 32"]
    );
    // The admin port is only in the way once the listeners also bind the pod IP.
    let admin_port = |in_cluster: bool| -> TailnetIngressSpec {
        edited(INGRESS, |v| {
            v["exposes"] = serde_json::json!([{"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 9180, "backend": {"service": "db", "port": 5432}}]);
            if in_cluster {
                v["inCluster"] = serde_json::json!({"namespaces": ["team-a"]});
            }
        })
    };
    assert!(valid_ingress(&admin_port(false)).is_ok());
    assert_eq!(
        fields(&valid_ingress(&admin_port(true)).expect_err("admin port")),
        vec![
            "spec.exposes[db].port: port 9180 is the agent's admin port on its pod IP, where in-cluster clients (spec.inCluster) are served too; use another port"
        ]
    );
}

/// Issue 29 item 2: a Service read as an ingress needs no `ingressNameTemplate` for its tcp
/// exposes (its node's MagicDNS name names it); a TailnetIngress still does.
#[test]
fn services_fall_back_to_magic_dns_without_a_name_template() {
    let mut tn = tailnet_spec();
    if let Some(dns) = tn.dns.as_mut() {
        dns.ingress_name_template = None;
    }
    let tcp: TailnetIngressSpec = edited(INGRESS, |v| {
        v["exposes"] = serde_json::json!([{"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 5432, "backend": {"service": "db", "port": 5432}}]);
    });
    let names = service_in_context("team-a", "tailnet-system", &tcp, "demo", &tn).expect("valid");
    assert_eq!(names.len(), 1);
    assert!(names[0].hostnames.is_empty());
    assert!(ingress_in_context("team-a", "tailnet-system", &tcp, "demo", &tn).is_err());
    // With the template, a Service's names are the template's as before.
    let names = service_in_context("team-a", "tailnet-system", &tcp, "demo", &tailnet_spec())
        .expect("valid");
    assert_eq!(names[0].hostnames, vec!["db.team-a.lab.example.net"]);
}
