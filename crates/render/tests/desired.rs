//! The desired-state entry point on the examples: what the controllers and `render` share.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tailnet_api::agent_config::IngressListener;
use tailnet_api::validate::{valid_egress, valid_ingress};
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tailnet_policy::ObservedNode;
use tailnet_render::RenderContext;
use tailnet_render::backends::{BackendProblem, ObjectKey, ObservedBackends, ServicePortInfo};
use tailnet_render::desired::{self, IngressObserved};
use tailnet_render::dns::{ClaimRank, DnsEntry, PendingName};
use tailnet_render::images::Images;
use tailnet_render::intent::{Claim, EgressIntent, IngressIntent, TailnetScope};

fn load<T: serde::de::DeserializeOwned>(
    file: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> T {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("example file");
    let mut value: serde_json::Value = serde_yaml::from_str(&text).expect("yaml");
    value["metadata"]["uid"] = "uid-1".into();
    edit(&mut value);
    serde_json::from_value(value).expect("typed example")
}

fn tailnet() -> Tailnet {
    load("10-tailnet.yaml", |_| {})
}

fn egress() -> TailnetEgress {
    load("20-egress.yaml", |_| {})
}

/// examples/30-ingress.yaml without its `spec.inCluster` (the tailnet-only entrance; the
/// split-horizon cases add their own).
fn ingress() -> TailnetIngress {
    load("30-ingress.yaml", |v| {
        if let Some(spec) = v["spec"].as_object_mut() {
            spec.remove("inCluster");
        }
    })
}

fn scope(tailnet: &Tailnet) -> TailnetScope<'_> {
    TailnetScope {
        name: "demo",
        spec: &tailnet.spec,
        operator_namespace: "tailnet-system",
    }
}

/// The typed intents of egresses, as the composition builds them.
fn egress_intents(egresses: &[TailnetEgress]) -> Vec<EgressIntent> {
    egresses
        .iter()
        .map(|e| EgressIntent::new(e, "tailnet-system"))
        .collect()
}

/// The typed intents of ingresses read in the demo Tailnet.
fn ingress_intents(tailnet: &Tailnet, ingresses: &[TailnetIngress]) -> Vec<IngressIntent> {
    ingresses
        .iter()
        .map(|i| IngressIntent::new(i, &scope(tailnet)))
        .collect()
}

fn ctx(tailnet: &Tailnet) -> RenderContext<'_> {
    RenderContext {
        operator_namespace: "tailnet-system",
        tailnet_name: "demo",
        tailnet: &tailnet.spec,
        images: Images::default(),
        cluster_domain: "cluster.local",
        server_ca_pem: None,
        cluster_network: None,
        restrict_agent_egress: true,
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test IP")
}

fn node(tag: &str, ips: &[&str]) -> ObservedNode {
    serde_json::from_value(serde_json::json!({
        "id": 7, "name": "agent", "tags": [tag], "ipAddresses": ips, "online": true
    }))
    .expect("node")
}

const INGRESS_TAG: &str = "tag:tno-ingress-team-a-portal";

/// What the examples' backends look like in the cluster.
fn backends() -> ObservedBackends {
    let port = |name: &str, port| ServicePortInfo {
        name: Some(name.to_string()),
        port,
    };
    ObservedBackends {
        services: BTreeMap::from([
            (
                ObjectKey::new("team-a", "frontend"),
                vec![port("http", 8080)],
            ),
            (ObjectKey::new("team-a", "admin"), vec![port("https", 8443)]),
        ]),
        config_maps: BTreeMap::from([(
            ObjectKey::new("team-a", "backend-ca"),
            BTreeSet::from(["ca.crt".to_string()]),
        )]),
        ..ObservedBackends::default()
    }
}

#[test]
fn dns_inputs_point_aliases_at_cluster_ips_and_names_at_the_agent_node() {
    let tailnet = tailnet();
    let ips = BTreeMap::from([(
        ObjectKey::new("tailnet-system", "remote-api"),
        ip("fd00:10:96::20"),
    )]);
    let nodes = vec![node(INGRESS_TAG, &["100.64.0.7", "fd7a:115c:a1e0::7"])];
    let inputs = desired::dns_inputs(
        &tailnet,
        "tailnet-system",
        &egress_intents(&[egress()]),
        &ingress_intents(&tailnet, &[ingress()]),
        &ips,
        &nodes,
    );
    let entry = |hostname: &str, address: &str, owner: &str| DnsEntry {
        hostname: hostname.into(),
        address: ip(address),
        owner: owner.into(),
        rank: {
            let parts: Vec<&str> = owner.split('/').collect();
            ClaimRank::new(None, parts[1], parts[2])
        },
    };
    assert_eq!(
        inputs.egress_aliases,
        vec![entry(
            "api.site.example.net",
            "fd00:10:96::20",
            "TailnetEgress/tailnet-system/team-a"
        )]
    );
    let portal = "TailnetIngress/team-a/portal";
    assert_eq!(
        inputs.ingress_names,
        vec![
            entry("portal.team-a.lab.example.net", "100.64.0.7", portal),
            entry("portal.team-a.lab.example.net", "fd7a:115c:a1e0::7", portal),
            entry("portal.lab.example.net", "100.64.0.7", portal),
            entry("portal.lab.example.net", "fd7a:115c:a1e0::7", portal),
            entry("admin.team-a.lab.example.net", "100.64.0.7", portal),
            entry("admin.team-a.lab.example.net", "fd7a:115c:a1e0::7", portal),
        ]
    );
    assert_eq!(inputs.pending, vec![]);
}

/// Split horizon: an ingress listing `inCluster.namespaces` has its names → its in-cluster
/// Service's ClusterIP in the cluster's inputs (pending until the Service has one); one
/// without has none there; the tailnet addresses stay for the extra records.
#[test]
fn dns_inputs_point_in_cluster_names_at_the_in_cluster_service() {
    let tailnet = tailnet();
    let listed: TailnetIngress = load("30-ingress.yaml", |v| {
        v["spec"]["inCluster"] = serde_json::json!({"namespaces": ["team-c"]});
    });
    let nodes = vec![node(INGRESS_TAG, &["100.64.0.7"])];
    let service = ObjectKey::new("team-a", "tailnet-ingress-portal");
    let with_ip = BTreeMap::from([(service.clone(), ip("10.96.0.40"))]);
    let plain = desired::dns_inputs(
        &tailnet,
        "tailnet-system",
        &[],
        &ingress_intents(&tailnet, &[ingress()]),
        &with_ip,
        &nodes,
    );
    assert!(plain.in_cluster_names.is_empty());
    assert_eq!(plain.ingress_names.len(), 3);
    let inputs = desired::dns_inputs(
        &tailnet,
        "tailnet-system",
        &[],
        &ingress_intents(&tailnet, std::slice::from_ref(&listed)),
        &with_ip,
        &nodes,
    );
    let names: Vec<(&str, String)> = inputs
        .in_cluster_names
        .iter()
        .map(|e| (e.hostname.as_str(), e.address.to_string()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("portal.team-a.lab.example.net", "10.96.0.40".to_string()),
            ("portal.lab.example.net", "10.96.0.40".to_string()),
            ("admin.team-a.lab.example.net", "10.96.0.40".to_string()),
        ]
    );
    assert_eq!(inputs.ingress_names.len(), 3);
    let rendered = tailnet_render::dns::render(&inputs);
    assert!(!rendered.hosts.contains("100.64."), "{}", rendered.hosts);
    assert!(rendered.extra_records_json.contains("100.64.0.7"));
    let waiting = desired::dns_inputs(
        &tailnet,
        "tailnet-system",
        &[],
        &ingress_intents(&tailnet, &[listed]),
        &BTreeMap::new(),
        &nodes,
    );
    assert!(waiting.in_cluster_names.is_empty());
    assert_eq!(
        waiting.pending[0].reason,
        "in-cluster Service team-a/tailnet-ingress-portal has no ClusterIP yet"
    );
}

#[test]
fn dns_inputs_say_why_a_name_is_pending_and_skip_what_is_not_ours() {
    let tailnet = tailnet();
    let other_namespace: TailnetEgress = load("20-egress.yaml", |v| {
        v["metadata"]["namespace"] = "team-a".into();
        v["metadata"]["name"] = "misplaced".into();
    });
    let other_tailnet: TailnetIngress = load("30-ingress.yaml", |v| {
        v["spec"]["tailnetRef"]["name"] = "other".into();
    });
    let inputs = desired::dns_inputs(
        &tailnet,
        "tailnet-system",
        &egress_intents(&[egress(), other_namespace]),
        &ingress_intents(&tailnet, &[ingress(), other_tailnet]),
        &BTreeMap::new(),
        &[node("tag:someone-else", &["100.64.0.9"])],
    );
    assert!(inputs.egress_aliases.is_empty() && inputs.ingress_names.is_empty());
    let pending = |hostname: &str, owner: &str, reason: &str| PendingName {
        hostname: hostname.into(),
        owner: owner.into(),
        reason: reason.into(),
    };
    let no_node = format!("no Headscale node tagged {INGRESS_TAG} yet");
    let portal = "TailnetIngress/team-a/portal";
    assert_eq!(
        inputs.pending,
        vec![
            pending(
                "api.site.example.net",
                "TailnetEgress/tailnet-system/team-a",
                "Service tailnet-system/remote-api has no ClusterIP yet"
            ),
            pending("portal.team-a.lab.example.net", portal, &no_node),
            pending("portal.lab.example.net", portal, &no_node),
            pending("admin.team-a.lab.example.net", portal, &no_node),
        ]
    );
}

#[test]
fn policy_without_route_approval_has_no_route_approvers() {
    let tailnet = tailnet();
    let nodes = vec![node("tag:router", &["100.64.0.1"])];
    let with = desired::policy(
        &tailnet,
        "id",
        &egress_intents(&[egress()]),
        &ingress_intents(&tailnet, &[ingress()]),
        &nodes,
        true,
    );
    assert_eq!(with.route_approvers, vec!["tag:router"]);
    let without = desired::policy(
        &tailnet,
        "id",
        &egress_intents(&[egress()]),
        &ingress_intents(&tailnet, &[ingress()]),
        &nodes,
        false,
    );
    assert!(without.route_approvers.is_empty());
    assert_eq!(
        (without.egresses, without.ingresses),
        (with.egresses, with.ingresses)
    );
}

#[test]
fn egress_renders_parsed_targets() {
    let tailnet = tailnet();
    let e: TailnetEgress = load("20-egress.yaml", |v| {
        v["spec"]["targets"] = serde_json::json!([
            {"name": "v6", "address": "2001:db8::10", "port": 443, "probe": {"interval": "90s"}},
            {"name": "dns", "address": "db.site.example.net", "port": 5432, "probe": {"enabled": false}},
        ]);
    });
    let valid = valid_egress(&e.spec).expect("valid");
    let objects =
        desired::egress(&e.metadata, &valid, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    let listeners: Vec<(&str, &str, u16, Option<u64>)> = objects
        .config
        .egress
        .iter()
        .map(|l| {
            (
                l.name.as_str(),
                l.target_host.as_str(),
                l.target_port,
                l.probe_interval_seconds,
            )
        })
        .collect();
    assert_eq!(
        listeners,
        vec![
            ("dns", "db.site.example.net", 5432, None),
            ("v6", "2001:db8::10", 443, Some(90)),
        ]
    );
}

/// Decides `i` as the controller and `render` do.
fn decide(
    i: &TailnetIngress,
    backends: &ObservedBackends,
    claimed: &BTreeMap<String, String>,
    certificate_ready: bool,
) -> Result<desired::IngressDesired, String> {
    let tailnet = tailnet();
    let valid = valid_ingress(&i.spec).expect("schema-valid");
    let intent = IngressIntent::new(i, &scope(&tailnet));
    let names = desired::ingress_names(&intent, claimed)
        .map_err(|errors| tailnet_api::validate::summarize(&errors))?;
    desired::ingress(
        &i.metadata,
        &valid,
        names,
        &ctx(&tailnet),
        &IngressObserved {
            backends,
            certificate_ready,
            tag: "tag:tno-ingress-team-a-portal",
            kind: tailnet_api::naming::AgentKind::Ingress,
        },
    )
    .map_err(|e| e.to_string())
}

#[test]
fn ingress_renders_when_every_backend_resolves() {
    let i = ingress();
    let backends = backends();
    let claimed = BTreeMap::new();
    let decided = decide(&i, &backends, &claimed, true).expect("decided");
    assert_eq!(decided.problems, vec![]);
    assert_eq!(
        decided.backend_ports,
        BTreeMap::from([("admin".to_string(), 8443), ("web".to_string(), 8080)])
    );
    assert_eq!(
        decided.names.http_hostnames,
        vec![
            "admin.team-a.lab.example.net",
            "portal.lab.example.net",
            "portal.team-a.lab.example.net"
        ]
    );
    let objects = decided.objects.expect("objects");
    assert_eq!(objects.config.ingress.len(), 1);
}

#[test]
fn ingress_with_a_missing_backend_renders_nothing_and_says_why() {
    let i = ingress();
    let mut backends = backends();
    backends
        .services
        .remove(&ObjectKey::new("team-a", "frontend"));
    let claimed = BTreeMap::new();
    let decided = decide(&i, &backends, &claimed, true).expect("decided");
    assert!(decided.objects.is_none());
    let messages: Vec<String> = decided.problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        vec!["exposes[web]: Service team-a/frontend does not exist"]
    );
    assert!(matches!(
        decided.problems[0],
        BackendProblem::ServiceMissing { .. }
    ));
    assert_eq!(decided.backend_ports.get("admin"), Some(&8443));
}

#[test]
fn ingress_without_a_certificate_serves_no_http_and_claimed_names_are_dropped() {
    let i = ingress();
    let backends = backends();
    let claimed = BTreeMap::from([(
        "portal.lab.example.net".to_string(),
        "team-b/portal".to_string(),
    )]);
    let decided = decide(&i, &backends, &claimed, false).expect("decided");
    assert_eq!(decided.names.claimed, claimed);
    assert!(
        !decided
            .names
            .http_hostnames
            .contains(&"portal.lab.example.net".to_string())
    );
    let objects = decided.objects.expect("objects");
    assert!(
        !objects
            .config
            .ingress
            .iter()
            .any(|l| matches!(l, IngressListener::Http { .. }))
    );
    assert!(
        !objects
            .hostnames
            .contains(&"portal.lab.example.net".to_string())
    );
}

#[test]
fn ingress_context_errors_stop_the_decision() {
    let tailnet = tailnet();
    let i: TailnetIngress = load("30-ingress.yaml", |v| {
        v["spec"]["exposes"][0]["backend"]["namespace"] = "other".into();
    });
    assert!(valid_ingress(&i.spec).is_ok(), "schema-valid");
    // The intent carries the context errors; the names step (and so the decision) stops.
    let intent = IngressIntent::new(&i, &scope(&tailnet));
    let errors =
        desired::ingress_names(&intent, &BTreeMap::new()).expect_err("cross-namespace backend");
    assert_eq!(errors[0].field, "spec.exposes[web].backend.namespace");
}

#[test]
fn the_older_ingress_keeps_a_contested_hostname() {
    let tailnet = tailnet();
    let at = |v: &mut serde_json::Value, name: &str, time: &str| {
        v["metadata"]["name"] = name.into();
        v["metadata"]["creationTimestamp"] = time.into();
    };
    // Same dnsLabels in the same namespace: every hostname collides.
    let older: TailnetIngress = load("30-ingress.yaml", |v| {
        at(v, "portal", "2026-01-01T00:00:00Z")
    });
    let younger: TailnetIngress = load("30-ingress.yaml", |v| {
        at(v, "portal-copy", "2026-02-01T00:00:00Z");
        v["metadata"]["uid"] = "uid-2".into();
    });
    let elsewhere: TailnetIngress = load("30-ingress.yaml", |v| {
        at(v, "portal-other", "2025-01-01T00:00:00Z");
        v["spec"]["tailnetRef"]["name"] = "other".into();
    });
    // An intent of the other Tailnet's ingress, read as if it were in this one (so only its
    // tailnetRef keeps it out).
    let all = ingress_intents(&tailnet, &[older.clone(), younger.clone(), elsewhere]);
    assert_eq!(desired::claimed_elsewhere(&all[0], &all), BTreeMap::new());
    let claimed = desired::claimed_elsewhere(&all[1], &all);
    assert_eq!(
        claimed.keys().cloned().collect::<Vec<_>>(),
        vec![
            "admin.team-a.lab.example.net",
            "portal.lab.example.net",
            "portal.team-a.lab.example.net"
        ]
    );
    assert!(claimed.values().all(|holder| holder == "team-a/portal"));
}

#[test]
fn dns_config_map_lives_where_the_tailnet_says() {
    let tailnet = tailnet();
    let rendered = tailnet_render::dns::render(&Default::default());
    let cm = desired::dns_config_map(&tailnet, "tailnet-system", &rendered, None).expect("set");
    assert_eq!(cm.metadata.name.as_deref(), Some("tailnet-hosts"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some("tailnet-system"));
    assert_eq!(cm.metadata.owner_references, None);
    let data = cm.data.expect("data");
    assert_eq!(
        data.keys().cloned().collect::<Vec<_>>(),
        vec!["extra-records.json", "hosts", "tailnet.server"]
    );

    let owner = OwnerReference {
        name: "demo".into(),
        ..OwnerReference::default()
    };
    let mut shared = tailnet.clone();
    if let Some(dns) = shared.spec.dns.as_mut() {
        dns.hosts_config_map_namespace = Some("kube-system".into());
    }
    let cm = desired::dns_config_map(&shared, "tailnet-system", &rendered, Some(owner.clone()))
        .expect("set");
    assert_eq!(cm.metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(cm.metadata.owner_references, Some(vec![owner]));

    let mut unset = tailnet;
    unset.spec.dns = None;
    assert!(desired::dns_config_map(&unset, "tailnet-system", &rendered, None).is_none());
}

/// A contested name (the `portal.lab.example.net` alias of two `portal` ingresses) goes to the
/// first claim in the hosts file and the extra records, as the ingress names do
/// (`claimed_elsewhere`), although the newer ingress's node has the lower address.
#[test]
fn a_contested_name_points_at_the_first_claim_not_the_lowest_address() {
    let tailnet = tailnet();
    let at = |t: &str| serde_json::Value::from(t);
    let in_cluster = || serde_json::json!({"namespaces": ["team-c"]});
    let older: TailnetIngress = load("30-ingress.yaml", |v| {
        v["metadata"]["namespace"] = "team-b".into();
        v["metadata"]["creationTimestamp"] = at("2026-01-01T00:00:00Z");
        v["spec"]["inCluster"] = in_cluster();
    });
    let newer: TailnetIngress = load("30-ingress.yaml", |v| {
        v["metadata"]["creationTimestamp"] = at("2026-01-02T00:00:00Z");
        v["spec"]["inCluster"] = in_cluster();
    });
    // Their in-cluster Services (split horizon): the cluster's records point there.
    let cluster_ips = BTreeMap::from([
        (
            ObjectKey::new("team-b", "tailnet-ingress-portal"),
            "10.96.0.9".parse().expect("ip"),
        ),
        (
            ObjectKey::new("team-a", "tailnet-ingress-portal"),
            "10.96.0.2".parse().expect("ip"),
        ),
    ]);
    let prefix = &tailnet.spec.policy.tag_prefix;
    let older_tag = tailnet_api::naming::ingress_tag(prefix, "team-b", "portal");
    let newer_tag = tailnet_api::naming::ingress_tag(prefix, "team-a", "portal");
    let mut older_node = node(&older_tag, &["100.64.0.9"]);
    older_node.id = 9;
    let newer_node = node(&newer_tag, &["100.64.0.2"]);
    for ingresses in [
        vec![older.clone(), newer.clone()],
        vec![newer.clone(), older.clone()],
    ] {
        let inputs = desired::dns_inputs(
            &tailnet,
            "tailnet-system",
            &[],
            &ingress_intents(&tailnet, &ingresses),
            &cluster_ips,
            &[newer_node.clone(), older_node.clone()],
        );
        let rendered = tailnet_render::dns::render(&inputs);
        assert!(
            rendered.hosts.contains("10.96.0.9 portal.lab.example.net"),
            "{}",
            rendered.hosts
        );
        assert!(
            !rendered.hosts.contains("10.96.0.2 portal.lab.example.net"),
            "{}",
            rendered.hosts
        );
        assert!(!rendered.hosts.contains("100.64."), "{}", rendered.hosts);
        let records: serde_json::Value =
            serde_json::from_str(&rendered.extra_records_json).expect("json");
        let alias: Vec<&serde_json::Value> = records
            .as_array()
            .expect("array")
            .iter()
            .filter(|r| r["name"] == "portal.lab.example.net")
            .collect();
        assert_eq!(alias.len(), 1, "{records}");
        assert_eq!(alias[0]["value"], "100.64.0.9");
        assert_eq!(
            rendered.conflicts,
            vec![(
                "portal.lab.example.net".to_string(),
                vec!["TailnetIngress/team-a/portal".to_string()]
            )]
        );
    }
    // The ingress side agrees: the newer one is told the older holds the name.
    let intents = ingress_intents(&tailnet, &[older, newer]);
    let claimed = desired::claimed_elsewhere(&intents[1], &intents);
    assert_eq!(
        claimed.get("portal.lab.example.net").map(String::as_str),
        Some("team-b/portal")
    );
}

/// `ingress_tag_of` (one ingress, only the claims that can touch its tag) gives every ingress
/// exactly what `ingress_tags` (all of them at once, it last) gives it, on a set built to collide:
/// dash-joined names that meet (`team-a/dev-api`, `team-a-dev/api`), names so long that their
/// shortened tags meet, recorded tags that are an ingress's own other form or someone else's,
/// equal creation times, the same key twice with different status, and another Tailnet's.
#[test]
fn the_tag_of_one_ingress_is_its_tag_among_all() {
    use tailnet_api::naming::{ingress_tag, ingress_tag_discriminated};
    use tailnet_render::claims::ingress_tag_of;
    let prefix = "tno";
    let long = "x".repeat(60);
    let make =
        |namespace: &str, name: &str, second: i64, tailnet: &str, recorded: Option<String>| {
            let mut ingress = ingress();
            ingress.metadata = serde_json::from_value(serde_json::json!({
                "name": name,
                "namespace": namespace,
                "creationTimestamp": format!("2026-12-01T10:00:{second:02}Z"),
            }))
            .expect("metadata");
            ingress.spec.tailnet_ref.name = tailnet.to_string();
            ingress.status = recorded.map(|tag| {
                serde_json::from_value(serde_json::json!({"tag": tag})).expect("status")
            });
            ingress
        };
    let all = vec![
        make("team-a", "dev-api", 5, "demo", None),
        make("team-a-dev", "api", 3, "demo", None),
        // Recorded the other one's legacy form: not its own, so it is not kept.
        make(
            "team",
            "a-dev-api",
            1,
            "demo",
            Some(ingress_tag(prefix, "team-a", "dev-api")),
        ),
        // Keeps its recorded discriminated form although it is older than nobody.
        make(
            "team-b",
            "portal",
            9,
            "demo",
            Some(ingress_tag_discriminated(prefix, "team-b", "portal")),
        ),
        make("team-b-portal", "x", 2, "demo", None),
        make("team-c", &format!("{long}-a"), 4, "demo", None),
        make("team-c", &format!("{long}-b"), 4, "demo", None),
        make("team-c", &format!("{long}-c"), 0, "demo", None),
        // The same key twice (the cache's copy and the reconcile's), different status.
        make(
            "team-d",
            "api",
            6,
            "demo",
            Some(ingress_tag_discriminated(prefix, "team-d", "api")),
        ),
        make("team-d", "api", 6, "demo", None),
        make("team-a", "dev-api-other", 7, "other", None),
        make("team-e", "alone", 8, "demo", None),
    ];
    let all: Vec<Claim> = all.iter().map(Claim::of_ingress).collect();
    let together = desired::ingress_tags("demo", prefix, &all);
    assert!(together.len() >= 10, "{together:#?}");
    let discriminated = together
        .values()
        .filter(|tag| {
            tag.as_ref()
                .is_ok_and(|t| t.len() > 4 && t.rsplit('-').next().is_some_and(|h| h.len() == 10))
        })
        .count();
    assert!(discriminated >= 3, "the set collides: {together:#?}");
    for (index, ingress) in all.iter().enumerate() {
        let others = all
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index)
            .map(|(_, o)| o);
        let key = ingress.tag_key();
        // The contract: what assigning all of them gives, in the same order (with the same
        // key twice, the earlier copy's recorded tag counts).
        let expected = desired::ingress_tags(
            "demo",
            prefix,
            others.clone().chain(std::iter::once(ingress)),
        )
        .remove(&key)
        .unwrap_or_else(|| Err(String::new()));
        let alone = ingress_tag_of("demo", prefix, ingress, others);
        assert_eq!(alone, expected, "{key:?}");
    }
}
