//! The ingress decision table: `decide` driven through every reason it can produce, with
//! hand-made observations (no environment).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tailnet_api::TailnetIngress;
use tailnet_api::agent_status::ProbeState;
use tailnet_api::conditions::{self, reasons, types};
use tailnet_api::ingress::TailnetIngressStatus;
use tailnet_api::naming::ingress_tag;
use tailnet_headscale::Node;
use tailnet_render::backends::{ObjectKey, ObservedBackends, ServicePortInfo};

use super::super::agent::decide::{self as agent, Decision};
use super::super::agent::identity::KeyAction;
use super::super::agent::observation::{
    AgentObserved, AuthSecret, Observation, nodes_unobservable,
};
use super::super::config::OperatorConfig;
use super::super::reason_coverage::assert_every_reason_has_a_case;
use super::super::status::Problem;
use super::super::test_fixtures as fx;
use super::decide::{self, Ingress};
use super::observation::IngressObserved;

type IngressDecision = Decision<Ingress>;
type IngressObservation = Observation<IngressObserved>;

const NAMESPACE: &str = "team-a";
const RESOURCE: &str = "TailnetIngress/team-a/portal";
const PORTAL: &str = "portal.team-a.lab.example.net";
const ALIAS: &str = "portal.lab.example.net";
const DB: &str = "db.team-a.lab.example.net";

fn tag() -> String {
    ingress_tag(
        &fx::tailnet(&[]).spec.policy.tag_prefix,
        NAMESPACE,
        "portal",
    )
}

/// An ingress `portal` in team-a with these exposes (and `tls`, `allowFrom` overrides).
fn ingress_with(exposes: serde_json::Value, extra: serde_json::Value) -> TailnetIngress {
    let mut spec = serde_json::json!({
        "tailnetRef": {"name": "demo"},
        "allowFrom": ["group:team-a"],
        "exposes": exposes,
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1",
        "kind": "TailnetIngress",
        "metadata": {
            "name": "portal", "namespace": NAMESPACE, "uid": "ingress-uid", "generation": 2,
            "creationTimestamp": "2026-05-01T00:00:00Z"
        },
        "spec": spec,
    }))
    .expect("ingress fixture")
}

fn web() -> serde_json::Value {
    serde_json::json!({"name": "web", "dnsLabel": "portal", "alias": true, "mode": "http", "port": 443,
        "backend": {"service": "frontend", "port": 8080}})
}

fn db() -> serde_json::Value {
    serde_json::json!({"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 5432,
        "backend": {"service": "db", "port": "postgres"}})
}

/// web (http, with alias) and db (tcp, named backend port).
fn ingress() -> TailnetIngress {
    ingress_with(serde_json::json!([web(), db()]), serde_json::json!({}))
}

/// The same, with a TLS Secret of the user's (no Certificate is issued).
fn own_secret() -> TailnetIngress {
    ingress_with(
        serde_json::json!([web(), db()]),
        serde_json::json!({"tls": {"secretName": "portal-tls"}}),
    )
}

fn cert(names: &[&str], not_before: (i32, u8, u8), not_after: (i32, u8, u8)) -> Vec<u8> {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names).expect("params");
    params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
    params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
    let key = rcgen::KeyPair::generate().expect("key");
    params.self_signed(&key).expect("cert").pem().into_bytes()
}

fn valid_cert() -> Vec<u8> {
    cert(&[PORTAL, ALIAS], (2026, 1, 1), (2027, 1, 1))
}

fn port(name: &str, number: i32) -> ServicePortInfo {
    ServicePortInfo {
        name: Some(name.to_string()),
        port: number,
    }
}

fn agent_node(online: bool) -> Node {
    fx::node(
        9,
        &tailnet_api::naming::tag_hostname(&tag()),
        &tag(),
        online,
        &["100.64.0.9"],
    )
}

/// Everything in order: backends, certificate, node online, agent ready, grant live,
/// backends reachable.
fn healthy() -> IngressObservation {
    IngressObservation {
        access: Ok(fx::access(fx::tailnet(&[RESOURCE]))),
        agent: AgentObserved {
            nodes: Ok(Arc::new(vec![agent_node(true)])),
            auth_secret: AuthSecret::RemovedByUs,
            deployment: Some(fx::deployment(1)),
            report: Some(fx::report(
                vec![],
                vec![
                    fx::probe("web", "frontend.team-a.svc:8080", ProbeState::Reachable),
                    fx::probe("db", "db.team-a.svc:5432", ProbeState::Reachable),
                ],
            )),
        },
        kind: IngressObserved {
            others: Vec::new(),
            entrances: Vec::new(),
            tag: Some(Ok(tag())),
            backends: ObservedBackends {
                services: BTreeMap::from([
                    (
                        ObjectKey::new(NAMESPACE, "frontend"),
                        vec![port("http", 8080)],
                    ),
                    (
                        ObjectKey::new(NAMESPACE, "db"),
                        vec![port("postgres", 5432)],
                    ),
                ]),
                config_maps: BTreeMap::new(),
                ..ObservedBackends::default()
            },
            tls_certificate: Some(valid_cert()),
        },
    }
}

fn with(change: impl FnOnce(&mut IngressObservation)) -> IngressObservation {
    let mut observed = healthy();
    change(&mut observed);
    observed
}

fn tailnet_with(tailnet: tailnet_api::Tailnet) -> IngressObservation {
    with(|o| o.access = Ok(fx::access(tailnet)))
}

fn run(ingress: &TailnetIngress, observed: &IngressObservation) -> IngressDecision {
    let valid = agent::validated::<Ingress>(ingress, fx::now()).expect("a valid ingress");
    agent::decide::<Ingress>(ingress, &valid, observed, &fx::config(), fx::now()).expect("decide")
}

/// A case: its name, the decision's status, and the expected (type, status, reason) checks.
struct Case {
    name: &'static str,
    status: TailnetIngressStatus,
    expect: Vec<(&'static str, &'static str, &'static str)>,
}

fn case(
    name: &'static str,
    ingress: &TailnetIngress,
    observed: IngressObservation,
    expect: Vec<(&'static str, &'static str, &'static str)>,
) -> Case {
    Case {
        name,
        status: run(ingress, &observed).status,
        expect,
    }
}

/// An older ingress of another namespace whose alias is `portal.lab.example.net` too.
fn older_rival() -> Arc<TailnetIngress> {
    let mut rival = ingress_with(serde_json::json!([web()]), serde_json::json!({}));
    rival.metadata.namespace = Some("team-b".into());
    rival.metadata.uid = Some("rival-uid".into());
    rival.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-04-01T00:00:00Z".parse().expect("time"),
    ));
    Arc::new(rival)
}

fn tailnet_and_headscale_cases() -> Vec<Case> {
    let i = ingress();
    vec![
        case(
            "healthy",
            &i,
            healthy(),
            vec![
                (types::READY, "True", reasons::READY),
                (types::TAILNET_READY, "True", reasons::READY),
                (types::SOURCES_ALLOWED, "True", reasons::READY),
                (types::BACKENDS_RESOLVED, "True", reasons::READY),
                (types::HOSTNAMES_UNIQUE, "True", reasons::READY),
                (types::CERTIFICATE_READY, "True", reasons::READY),
                (types::NODE_ONLINE, "True", reasons::ONLINE),
                (types::AGENT_READY, "True", reasons::READY),
                (types::POLICY_EFFECTIVE, "True", reasons::READY),
                (types::BACKENDS_REACHABLE, "True", reasons::REACHABLE),
            ],
        ),
        case(
            "tailnet missing",
            &i,
            with(|o| o.access = Err(Problem::new(reasons::TAILNET_NOT_FOUND, "gone"))),
            vec![(types::READY, "False", reasons::TAILNET_NOT_FOUND)],
        ),
        case(
            "tailnet unreadable",
            &i,
            with(|o| o.access = Err(Problem::new(reasons::TAILNET_UNREADABLE, "403"))),
            vec![(types::TAILNET_READY, "False", reasons::TAILNET_UNREADABLE)],
        ),
        case(
            "headscale unusable",
            &i,
            with(|o| {
                let mut access = fx::access(fx::tailnet(&[RESOURCE]));
                access.headscale = Err(Problem::new(reasons::SECRET_MISSING, "no key"));
                o.access = Ok(access);
                o.agent.nodes = Err(nodes_unobservable());
            }),
            vec![
                (types::READY, "False", reasons::SECRET_MISSING),
                (
                    types::NODE_ONLINE,
                    "Unknown",
                    reasons::HEADSCALE_UNREACHABLE,
                ),
            ],
        ),
        case(
            "node list fails",
            &i,
            with(|o| {
                o.agent.nodes = Err(Problem::new(
                    reasons::headscale::TIMEOUT,
                    "listing Headscale nodes failed",
                ))
            }),
            vec![
                (types::NODE_ONLINE, "Unknown", reasons::headscale::TIMEOUT),
                (types::READY, "False", reasons::headscale::TIMEOUT),
            ],
        ),
        case(
            "node offline",
            &i,
            with(|o| o.agent.nodes = Ok(Arc::new(vec![agent_node(false)]))),
            vec![
                (types::NODE_ONLINE, "False", reasons::NODE_OFFLINE),
                (types::READY, "False", reasons::NODE_OFFLINE),
            ],
        ),
        case(
            "node not registered, key waiting",
            &i,
            with(|o| {
                o.agent.nodes = Ok(Arc::new(vec![]));
                o.agent.auth_secret = AuthSecret::Absent;
            }),
            vec![(types::NODE_ONLINE, "False", reasons::NODE_NOT_REGISTERED)],
        ),
        case(
            "no Headscale key, the owner has not written one for the tag yet",
            &i,
            with(|o| {
                o.agent.nodes = Ok(Arc::new(vec![]));
                o.agent.auth_secret = AuthSecret::Absent;
                if let Ok(view) = &mut o.access {
                    view.owner_keys = Some(Default::default());
                }
            }),
            vec![(types::NODE_ONLINE, "False", reasons::AWAITING_OWNER_KEY)],
        ),
        case(
            "agent not ready",
            &i,
            with(|o| o.agent.deployment = Some(fx::deployment(0))),
            vec![(types::READY, "False", reasons::AGENT_NOT_READY)],
        ),
        case(
            "no deployment yet",
            &i,
            with(|o| o.agent.deployment = None),
            vec![(types::AGENT_READY, "False", reasons::AGENT_NOT_READY)],
        ),
    ]
}

fn spec_and_backend_cases() -> Vec<Case> {
    let i = ingress();
    let cross = ingress_with(
        serde_json::json!([{"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 5432,
            "backend": {"service": "db", "namespace": "databases", "port": 5432}}]),
        serde_json::json!({}),
    );
    let mut no_issuer = fx::tailnet(&[RESOURCE]);
    no_issuer.spec.defaults = None;
    let verified = ingress_with(
        serde_json::json!([{"name": "web", "dnsLabel": "portal", "alias": true, "mode": "http", "port": 443,
            "backend": {"service": "frontend", "port": "http",
                "tls": {"serverName": "frontend.team-a.svc", "caConfigMapRef": {"name": "backend-ca", "key": "ca.crt"}}}}]),
        serde_json::json!({}),
    );
    let mut outsider = ingress();
    outsider.spec.allow_from = vec!["group:team-a".into(), "group:evil".into()];
    let mut only_outsiders = ingress();
    only_outsiders.spec.allow_from = vec!["group:evil".into()];
    vec![
        case(
            "backend in another namespace",
            &cross,
            healthy(),
            vec![
                (
                    types::BACKENDS_RESOLVED,
                    "False",
                    reasons::CROSS_NAMESPACE_BACKEND,
                ),
                // As before the split: decided before SourcesAllowed, which a new object lacks.
                (types::READY, "Unknown", reasons::PENDING),
            ],
        ),
        case(
            "no certificate source in the Tailnet",
            &i,
            tailnet_with(no_issuer),
            vec![(types::BACKENDS_RESOLVED, "False", reasons::INVALID_SPEC)],
        ),
        case(
            "backend Service missing",
            &i,
            with(|o| {
                o.kind
                    .backends
                    .services
                    .remove(&ObjectKey::new(NAMESPACE, "db"));
                o.agent.nodes = Ok(Arc::new(vec![]));
                o.agent.auth_secret = AuthSecret::Absent;
            }),
            vec![
                (
                    types::BACKENDS_RESOLVED,
                    "False",
                    reasons::BACKEND_NOT_FOUND,
                ),
                (types::NODE_ONLINE, "False", reasons::NODE_NOT_REGISTERED),
                (types::READY, "False", reasons::BACKEND_NOT_FOUND),
            ],
        ),
        case(
            "backend port missing",
            &i,
            with(|o| {
                o.kind
                    .backends
                    .services
                    .insert(ObjectKey::new(NAMESPACE, "db"), vec![port("other", 5433)]);
            }),
            vec![(
                types::BACKENDS_RESOLVED,
                "False",
                reasons::BACKEND_NOT_FOUND,
            )],
        ),
        case(
            "backend CA ConfigMap without the key",
            &verified,
            with(|o| {
                o.kind.backends.config_maps.insert(
                    ObjectKey::new(NAMESPACE, "backend-ca"),
                    BTreeSet::from(["other.crt".to_string()]),
                );
            }),
            vec![(
                types::BACKENDS_RESOLVED,
                "False",
                reasons::BACKEND_NOT_FOUND,
            )],
        ),
        case(
            "backend CA ConfigMap present",
            &verified,
            with(|o| {
                o.kind.backends.config_maps.insert(
                    ObjectKey::new(NAMESPACE, "backend-ca"),
                    BTreeSet::from(["ca.crt".to_string()]),
                );
            }),
            vec![(types::BACKENDS_RESOLVED, "True", reasons::READY)],
        ),
        case(
            "a source outside the allowlist",
            &outsider,
            healthy(),
            vec![
                (types::SOURCES_ALLOWED, "False", reasons::SOURCE_NOT_ALLOWED),
                (types::POLICY_EFFECTIVE, "True", reasons::READY),
            ],
        ),
        case(
            "every source outside the allowlist",
            &only_outsiders,
            tailnet_with(fx::tailnet(&[])),
            vec![
                (types::SOURCES_ALLOWED, "False", reasons::SOURCE_NOT_ALLOWED),
                (
                    types::POLICY_EFFECTIVE,
                    "False",
                    reasons::SOURCE_NOT_ALLOWED,
                ),
            ],
        ),
        case(
            "a hostname kept by an older ingress",
            &i,
            with(|o| o.kind.others = vec![older_rival()]),
            vec![
                (types::HOSTNAMES_UNIQUE, "False", reasons::HOSTNAME_CONFLICT),
                (types::READY, "False", reasons::HOSTNAME_CONFLICT),
            ],
        ),
        case(
            "its tag is held by another ingress",
            &i,
            with(|o| o.kind.tag = Some(Err("team-x/dev-api".to_string()))),
            vec![(types::AGENT_READY, "False", reasons::TAG_CONFLICT)],
        ),
    ]
}

/// The lab pair through the gather-side assignment: `team-x/dev-api` (older) keeps today's
/// tag, `team-x-dev/api` gets a tag of its own, whichever reconciles first.
#[test]
fn the_lab_pair_gets_two_tags_whichever_reconciles_first() {
    let at = |ns: &str, name: &str, created: &str| {
        let mut i = ingress();
        i.metadata.namespace = Some(ns.to_string());
        i.metadata.name = Some(name.to_string());
        i.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            created.parse().expect("timestamp"),
        ));
        std::sync::Arc::new(i)
    };
    let older = at("team-x", "dev-api", "2026-01-01T00:00:00Z");
    let newer = at("team-x-dev", "api", "2026-01-02T00:00:00Z");
    let t = fx::tailnet(&[]);
    let name = kube::ResourceExt::name_any(&t);
    let prefix = t.spec.policy.tag_prefix.clone();
    let older_tag = super::desired::tag(&older, &name, &prefix, std::slice::from_ref(&newer));
    let newer_tag = super::desired::tag(&newer, &name, &prefix, std::slice::from_ref(&older));
    assert_eq!(older_tag, Ok(ingress_tag(&prefix, "team-x", "dev-api")));
    let newer_tag = newer_tag.expect("a tag of its own");
    assert_ne!(Ok(newer_tag.clone()), older_tag);
    assert!(newer_tag.len() <= 63 + 4, "{newer_tag}");
}

fn certificate_cases() -> Vec<Case> {
    let (i, own) = (ingress(), own_secret());
    let tcp_only = ingress_with(serde_json::json!([db()]), serde_json::json!({}));
    vec![
        case(
            "waiting for cert-manager",
            &i,
            with(|o| o.kind.tls_certificate = None),
            vec![(types::CERTIFICATE_READY, "False", reasons::ISSUING)],
        ),
        case(
            "re-issuing for new names",
            &i,
            with(|o| o.kind.tls_certificate = Some(cert(&[PORTAL], (2026, 1, 1), (2027, 1, 1)))),
            vec![(types::CERTIFICATE_READY, "False", reasons::ISSUING)],
        ),
        case(
            "own Secret missing",
            &own,
            with(|o| o.kind.tls_certificate = None),
            vec![
                (types::CERTIFICATE_READY, "False", reasons::SECRET_MISSING),
                (types::READY, "False", reasons::SECRET_MISSING),
            ],
        ),
        case(
            "own Secret does not cover the names",
            &own,
            with(|o| {
                o.kind.tls_certificate =
                    Some(cert(&["other.example.net"], (2026, 1, 1), (2027, 1, 1)))
            }),
            vec![(
                types::CERTIFICATE_READY,
                "False",
                reasons::NAMES_NOT_COVERED,
            )],
        ),
        case(
            "own Secret with a valid certificate",
            &own,
            healthy(),
            vec![(types::CERTIFICATE_READY, "True", reasons::READY)],
        ),
        case(
            "expired",
            &own,
            with(|o| {
                o.kind.tls_certificate = Some(cert(&[PORTAL, ALIAS], (2025, 1, 1), (2026, 1, 1)))
            }),
            vec![(types::CERTIFICATE_READY, "False", reasons::EXPIRED)],
        ),
        case(
            "not yet valid",
            &i,
            with(|o| {
                o.kind.tls_certificate = Some(cert(&[PORTAL, ALIAS], (2027, 1, 1), (2028, 1, 1)))
            }),
            vec![(types::CERTIFICATE_READY, "False", reasons::NOT_YET_VALID)],
        ),
        case(
            "not a certificate",
            &own,
            with(|o| o.kind.tls_certificate = Some(b"garbage".to_vec())),
            vec![(
                types::CERTIFICATE_READY,
                "False",
                reasons::INVALID_CERTIFICATE,
            )],
        ),
        case(
            "tcp only",
            &tcp_only,
            with(|o| o.kind.tls_certificate = None),
            vec![
                (types::CERTIFICATE_READY, "True", reasons::NOT_APPLICABLE),
                (types::READY, "True", reasons::READY),
            ],
        ),
    ]
}

fn policy_and_reachability_cases() -> Vec<Case> {
    let i = ingress();
    let mut dry_run = fx::tailnet(&[]);
    dry_run.spec.policy.mode = tailnet_api::tailnet::PolicyMode::DryRun;
    let mut v = vec![
        case(
            "grants not live yet",
            &i,
            tailnet_with(fx::tailnet(&[])),
            vec![(types::POLICY_EFFECTIVE, "False", reasons::NOT_EFFECTIVE)],
        ),
        case(
            "tailnet in DryRun",
            &i,
            tailnet_with(dry_run),
            vec![(types::POLICY_EFFECTIVE, "False", reasons::DRY_RUN)],
        ),
        case(
            "tailnet contributing, grants not merged by the owner yet",
            &i,
            tailnet_with({
                let mut t = fx::tailnet(&[]);
                t.spec.policy.mode = tailnet_api::tailnet::PolicyMode::Contribute;
                t
            }),
            vec![(types::POLICY_EFFECTIVE, "False", reasons::CONTRIBUTING)],
        ),
        case(
            "agent report unreadable",
            &i,
            with(|o| o.agent.report = None),
            vec![
                (types::BACKENDS_REACHABLE, "Unknown", reasons::NOT_OBSERVED),
                (types::READY, "True", reasons::READY),
            ],
        ),
        case(
            "not probed yet",
            &i,
            with(|o| {
                o.agent.report = Some(fx::report(
                    vec![],
                    vec![fx::probe("web", "frontend:8080", ProbeState::Unknown)],
                ))
            }),
            vec![
                (
                    types::BACKENDS_REACHABLE,
                    "Unknown",
                    reasons::NOT_PROBED_YET,
                ),
                (types::READY, "True", reasons::READY),
            ],
        ),
    ];
    for reason in [
        reasons::REJECTED,
        reasons::OWNED_ELSEWHERE,
        reasons::BASE_INVALID,
        reasons::HEADSCALE_UNREACHABLE,
    ] {
        v.push(Case {
            name: "tailnet policy not applied",
            status: run(
                &i,
                &tailnet_with(fx::with_policy_applied_false(fx::tailnet(&[]), reason)),
            )
            .status,
            expect: vec![(types::POLICY_EFFECTIVE, "False", reason)],
        });
    }
    for (state, reason) in [
        (ProbeState::NoRoute, reasons::NO_ROUTE),
        (ProbeState::Refused, reasons::REFUSED),
        (ProbeState::Timeout, reasons::TIMEOUT),
        (ProbeState::Error, reasons::PROBE_ERROR),
    ] {
        v.push(Case {
            name: "probe fails",
            status: run(
                &i,
                &with(|o| {
                    o.agent.report = Some(fx::report(
                        vec![],
                        vec![fx::probe("web", "frontend:8080", state)],
                    ))
                }),
            )
            .status,
            expect: vec![
                (types::BACKENDS_REACHABLE, "False", reason),
                (types::READY, "False", reason),
            ],
        });
    }
    v
}

/// The reasons a status shows: its conditions' and its exposes' states.
fn reasons_of(status: &TailnetIngressStatus) -> impl Iterator<Item = String> + '_ {
    status
        .conditions
        .iter()
        .map(|c| c.reason.clone())
        .chain(status.exposes.iter().filter_map(|e| e.state.clone()))
}

#[test]
fn decision_table() {
    let mut seen = BTreeSet::new();
    let cases = [
        tailnet_and_headscale_cases(),
        spec_and_backend_cases(),
        certificate_cases(),
        policy_and_reachability_cases(),
    ];
    for case in cases.into_iter().flatten() {
        for (type_, status, reason) in &case.expect {
            assert_eq!(
                fx::condition(&case.status.conditions, type_),
                (*status, *reason),
                "case {:?}: {type_}",
                case.name
            );
        }
        seen.extend(reasons_of(&case.status));
    }
    // Decided outside `decide`: an invalid spec, a Certificate the apiserver refused.
    let invalid = ingress_with(
        serde_json::json!([{"name": "Bad_Name", "dnsLabel": "portal", "mode": "http", "port": 0,
            "backend": {"service": "frontend", "port": 8080}}]),
        serde_json::json!({}),
    );
    let refused = agent::validated::<Ingress>(&invalid, fx::now()).expect_err("invalid");
    assert_eq!(
        fx::condition(&refused.status.conditions, types::SPEC_VALID),
        ("False", reasons::INVALID_SPEC)
    );
    assert_eq!(
        fx::condition(&refused.status.conditions, types::READY),
        ("False", reasons::INVALID_SPEC)
    );
    assert!(refused.agent.is_none(), "an invalid spec applies nothing");
    seen.extend(reasons_of(&refused.status));
    // Decided with another operator config (see the namespace-scoped test).
    seen.extend(reasons_of(&scoped_elsewhere().status));
    assert!(agent::validated::<Ingress>(&ingress(), fx::now()).is_ok());
    let decided = run(&ingress(), &healthy()).status;
    let status = decide::certificate_not_created(
        &ingress(),
        &decided,
        "the server could not find the requested resource",
        fx::now(),
    );
    assert_eq!(
        fx::condition(&status.conditions, types::CERTIFICATE_READY),
        ("False", reasons::CERTIFICATE_NOT_CREATED)
    );
    assert_eq!(
        fx::condition(&status.conditions, types::READY),
        ("False", reasons::CERTIFICATE_NOT_CREATED)
    );
    seen.extend(reasons_of(&status));
    assert_every_reason_has_a_case(
        &seen,
        &[
            include_str!("decide.rs"),
            include_str!("../agent/conditions.rs"),
            include_str!("../agent/identity.rs"),
        ],
    );
}

#[test]
fn ready_names_the_first_missing_precondition_in_dependency_order() {
    let ready = |ingress: &TailnetIngress, observed: IngressObservation| {
        let status = run(ingress, &observed).status;
        let (s, r) = fx::condition(&status.conditions, types::READY);
        (s.to_string(), r.to_string())
    };
    let failing = |reason: &str| ("False".to_string(), reason.to_string());
    let mut outsider = own_secret();
    outsider.spec.allow_from.push("group:evil".into());
    let broken = |o: &mut IngressObservation| {
        o.kind.backends.services.clear();
        o.kind.tls_certificate = None;
        o.agent.deployment = Some(fx::deployment(0));
        o.agent.nodes = Ok(Arc::new(vec![agent_node(false)]));
        o.access = Ok(fx::access(fx::tailnet(&[])));
        o.kind.others = vec![older_rival()];
        o.agent.report = Some(fx::report(
            vec![],
            vec![fx::probe("web", "frontend:8080", ProbeState::Timeout)],
        ));
    };
    // Everything wrong: the sources come first, then each fix reveals the next one.
    assert_eq!(
        ready(&outsider, with(broken)),
        failing(reasons::SOURCE_NOT_ALLOWED)
    );
    let own = own_secret();
    assert_eq!(
        ready(&own, with(broken)),
        failing(reasons::BACKEND_NOT_FOUND)
    );
    let step = |o: &mut IngressObservation| {
        broken(o);
        o.kind.backends = healthy().kind.backends;
    };
    assert_eq!(ready(&own, with(step)), failing(reasons::SECRET_MISSING));
    let step = |o: &mut IngressObservation| {
        step(o);
        o.kind.tls_certificate = Some(valid_cert());
    };
    assert_eq!(ready(&own, with(step)), failing(reasons::AGENT_NOT_READY));
    let step = |o: &mut IngressObservation| {
        step(o);
        o.agent.deployment = Some(fx::deployment(1));
    };
    assert_eq!(ready(&own, with(step)), failing(reasons::NODE_OFFLINE));
    let step = |o: &mut IngressObservation| {
        step(o);
        o.agent.nodes = Ok(Arc::new(vec![agent_node(true)]));
    };
    assert_eq!(ready(&own, with(step)), failing(reasons::NOT_EFFECTIVE));
    let step = |o: &mut IngressObservation| {
        step(o);
        o.access = Ok(fx::access(fx::tailnet(&[RESOURCE])));
    };
    assert_eq!(ready(&own, with(step)), failing(reasons::HOSTNAME_CONFLICT));
    let step = |o: &mut IngressObservation| {
        step(o);
        o.kind.others.clear();
    };
    // An observed reachability failure counts once the required ones hold; none blocks.
    assert_eq!(ready(&own, with(step)), failing(reasons::TIMEOUT));
    let step = |o: &mut IngressObservation| {
        step(o);
        o.agent.report = None;
    };
    assert_eq!(
        ready(&own, with(step)),
        ("True".to_string(), reasons::READY.to_string())
    );
    // The Tailnet before everything.
    assert_eq!(
        ready(
            &outsider,
            with(|o| {
                broken(o);
                o.access = Err(Problem::new(reasons::TAILNET_NOT_FOUND, "gone"));
            })
        ),
        failing(reasons::TAILNET_NOT_FOUND)
    );
}

#[test]
fn status_lists_hostnames_urls_and_the_node() {
    let status = run(&ingress(), &healthy()).status;
    assert_eq!(
        status.hostnames,
        vec![DB.to_string(), ALIAS.to_string(), PORTAL.to_string()]
    );
    assert_eq!(
        status.urls,
        vec![
            format!("https://{ALIAS}/"),
            format!("https://{PORTAL}/"),
            format!("tcp://{DB}:5432"),
        ]
    );
    assert_eq!(
        status.summary.as_deref(),
        Some(format!("{DB} (+2)").as_str())
    );
    assert_eq!(status.tag, Some(tag()));
    assert_eq!(status.node_id.as_deref(), Some("9"));
    assert_eq!(status.tailnet_ips, vec!["100.64.0.9".to_string()]);
    assert_eq!(status.observed_generation, Some(2));
    let states: Vec<_> = status
        .exposes
        .iter()
        .map(|e| (e.name.as_str(), e.state.as_deref()))
        .collect();
    assert_eq!(
        states,
        vec![("web", Some(reasons::READY)), ("db", Some(reasons::READY))]
    );
    // Without a certificate the http expose is not served (never plaintext); tcp still is.
    let status = run(&ingress(), &with(|o| o.kind.tls_certificate = None)).status;
    let states: Vec<_> = status
        .exposes
        .iter()
        .map(|e| (e.name.as_str(), e.state.as_deref()))
        .collect();
    assert_eq!(
        states,
        vec![
            ("web", Some(reasons::NOT_SERVED)),
            ("db", Some(reasons::READY))
        ]
    );
    // A name kept by an older ingress is neither served nor listed.
    let status = run(&ingress(), &with(|o| o.kind.others = vec![older_rival()])).status;
    assert!(
        !status.hostnames.contains(&ALIAS.to_string()),
        "{:?}",
        status.hostnames
    );
    assert!(
        !status.urls.iter().any(|u| u.contains(ALIAS)),
        "{:?}",
        status.urls
    );
    // A newer ingress claiming the same names does not take them.
    let mut newer = (*older_rival()).clone();
    newer.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-05-02T00:00:00Z".parse().expect("time"),
    ));
    let status = run(&ingress(), &with(|o| o.kind.others = vec![Arc::new(newer)])).status;
    assert_eq!(
        fx::condition(&status.conditions, types::HOSTNAMES_UNIQUE),
        ("True", reasons::READY)
    );
}

#[test]
fn what_is_applied_and_minted() {
    // Healthy: everything is rendered, with a Certificate (no secretName); no key action.
    let plan = run(&ingress(), &healthy()).agent.expect("plan");
    let objects = plan.objects.expect("objects");
    assert!(objects.certificate.is_some());
    assert_eq!(objects.hostnames.len(), 3);
    assert_eq!(plan.key, KeyAction::Keep);
    assert_eq!(plan.tag, tag());
    // The user's own Secret: no Certificate.
    let plan = run(&own_secret(), &healthy()).agent.expect("plan");
    assert!(plan.objects.expect("objects").certificate.is_none());
    // A backend missing: nothing rendered, no key minted, the last hostnames stay.
    let mut listed = ingress();
    listed.status = Some(TailnetIngressStatus {
        hostnames: vec!["kept.example.net".into()],
        ..Default::default()
    });
    let missing = |o: &mut IngressObservation| {
        o.kind.backends.services.clear();
        o.agent.nodes = Ok(Arc::new(vec![]));
        o.agent.auth_secret = AuthSecret::Absent;
    };
    let decision = run(&listed, &with(missing));
    assert_eq!(
        decision.status.hostnames,
        vec!["kept.example.net".to_string()]
    );
    let plan = decision.agent.expect("plan");
    assert!(plan.objects.is_none());
    assert_eq!(plan.key, KeyAction::Keep);
    // ... but a spent key is still retired once the node exists.
    let plan = run(
        &ingress(),
        &with(|o| {
            o.kind.backends.services.clear();
            o.agent.auth_secret = AuthSecret::Present {
                key_id: Some(4),
                expires: None,
            };
        }),
    )
    .agent
    .expect("plan");
    assert_eq!(
        plan.key,
        KeyAction::Retire {
            key_id: Some(4),
            delete_secret: true
        }
    );
    // No node, deployable: mint one.
    let plan = run(
        &ingress(),
        &with(|o| {
            o.agent.nodes = Ok(Arc::new(vec![]));
            o.agent.auth_secret = AuthSecret::Absent;
        }),
    )
    .agent
    .expect("plan");
    assert!(
        matches!(plan.key, KeyAction::Mint { held: None, .. }),
        "{:?}",
        plan.key
    );
    // Headscale unreadable: no key action at all (the node may well exist), objects still.
    let plan = run(
        &ingress(),
        &with(|o| {
            o.agent.nodes = Err(Problem::new(reasons::headscale::TIMEOUT, "timeout"));
            o.agent.auth_secret = AuthSecret::Absent;
        }),
    )
    .agent
    .expect("plan");
    assert_eq!(plan.key, KeyAction::Keep);
    assert!(plan.objects.is_some());
    // The Tailnet missing, or the spec out of context: nothing is done.
    assert!(
        run(
            &ingress(),
            &with(|o| o.access = Err(Problem::new(reasons::TAILNET_NOT_FOUND, "gone")))
        )
        .agent
        .is_none()
    );
    let mut no_issuer = fx::tailnet(&[RESOURCE]);
    no_issuer.spec.defaults = None;
    assert!(run(&ingress(), &tailnet_with(no_issuer)).agent.is_none());
}

#[test]
fn a_refused_certificate_keeps_ready_transition_times() {
    // Ready was False/CertificateNotCreated since `then`; the next decision alone would say
    // True: the fix-up says CertificateNotCreated again, with the old transition time.
    let then: jiff::Timestamp = "2026-05-31T00:00:00Z".parse().expect("time");
    let mut ingress = ingress();
    let mut before = conditions::condition(
        types::READY,
        conditions::Status::False,
        reasons::CERTIFICATE_NOT_CREATED,
        "x",
        Some(2),
    );
    before.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(then);
    ingress.status = Some(TailnetIngressStatus {
        conditions: vec![before],
        ..Default::default()
    });
    let decided = run(&ingress, &healthy()).status;
    assert_eq!(
        fx::condition(&decided.conditions, types::READY),
        ("True", reasons::READY)
    );
    let status =
        decide::certificate_not_created(&ingress, &decided, "no kind Certificate", fx::now());
    let ready = conditions::find(&status.conditions, types::READY).expect("ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reasons::CERTIFICATE_NOT_CREATED)
    );
    assert_eq!(ready.last_transition_time.0, then);
    assert!(
        ready.message.contains("is cert-manager installed?"),
        "{}",
        ready.message
    );
}

/// The healthy ingress decided by an operator that watches only namespace `elsewhere`.
fn scoped_elsewhere() -> IngressDecision {
    let ingress = ingress();
    let valid = agent::validated::<Ingress>(&ingress, fx::now()).expect("a valid ingress");
    let mut config = fx::config();
    config.scope = crate::scope::WatchScope::new(&config.operator_namespace, &["elsewhere".into()]);
    agent::decide::<Ingress>(&ingress, &valid, &healthy(), &config, fx::now()).expect("decide")
}

#[test]
fn a_namespace_scoped_operator_names_a_backend_outside_its_namespaces_and_renders_nothing() {
    let ingress = ingress();
    let valid = agent::validated::<Ingress>(&ingress, fx::now()).expect("a valid ingress");
    let mut config = fx::config();
    // The ingress's own namespace (and so its backends) is watched: nothing changes.
    config.scope =
        crate::scope::WatchScope::new(&config.operator_namespace, &[NAMESPACE.to_string()]);
    let watched =
        agent::decide::<Ingress>(&ingress, &valid, &healthy(), &config, fx::now()).expect("decide");
    assert!(
        reasons_of(&watched.status).all(|r| r != reasons::BACKEND_NAMESPACE_NOT_WATCHED),
        "{:?}",
        watched.status.conditions
    );
    // Backends in an unwatched namespace: named, and no agent objects (nor key) planned.
    let decision = scoped_elsewhere();
    let resolved = decision
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == types::BACKENDS_RESOLVED)
        .expect("BackendsResolved");
    assert_eq!(
        (resolved.status.as_str(), resolved.reason.as_str()),
        ("False", reasons::BACKEND_NAMESPACE_NOT_WATCHED)
    );
    assert!(
        resolved.message.contains("Service team-a/frontend")
            && resolved
                .message
                .contains("add team-a to the chart's watchNamespaces"),
        "{}",
        resolved.message
    );
    let ready = decision
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == types::READY)
        .expect("Ready");
    assert_eq!(ready.reason, reasons::BACKEND_NAMESPACE_NOT_WATCHED);
    assert!(decision.agent.is_none_or(|a| a.objects.is_none()));
}

/// Issue 29 item 4 for TailnetIngress agents (the Service kind's code path): the egress
/// reaches the backends (a selector's pods on the targetPort; a selector-less Service's
/// EndpointSlice addresses), DNS, the control plane and the transport; with the operator's
/// cluster ranges, transport outside them and DNS to the DNS pods; unrestricted without the
/// control plane's addresses.
#[test]
fn the_ingress_agent_reaches_its_backends_and_with_cluster_ranges_nothing_else_in_cluster() {
    let service = |yaml: &str| -> k8s_openapi::api::core::v1::Service {
        serde_yaml::from_str(yaml).expect("service")
    };
    let observed = with(|o| {
        let backends = &mut o.kind.backends;
        backends.add_service(&service(
            "metadata: {name: frontend, namespace: team-a}\nspec: {selector: {app: web}, ports: [{name: http, port: 8080, targetPort: 80}]}",
        ));
        backends.add_service(&service(
            "metadata: {name: db, namespace: team-a}\nspec: {ports: [{name: postgres, port: 5432}]}",
        ));
        let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_yaml::from_str(
            "metadata: {name: db-1}\naddressType: IPv4\nendpoints: [{addresses: [192.0.2.40]}]\nports: [{name: postgres, port: 15432}]",
        )
        .expect("slice");
        backends.add_endpoint_slices(ObjectKey::new(NAMESPACE, "db"), &[slice]);
    });
    let egress_of = |observed: &IngressObservation, config: &OperatorConfig| {
        let ingress = ingress();
        let valid = agent::validated::<Ingress>(&ingress, fx::now()).expect("valid");
        let decision = agent::decide::<Ingress>(&ingress, &valid, observed, config, fx::now())
            .expect("decide");
        let spec = decision
            .agent
            .and_then(|a| a.objects)
            .expect("objects")
            .network_policy
            .spec
            .expect("spec");
        (
            spec.policy_types,
            serde_json::to_string(&spec.egress).expect("json"),
        )
    };
    // No control plane observed: unrestricted, as before.
    let (types, egress) = egress_of(&observed, &fx::config());
    assert_eq!(
        (types, egress.as_str()),
        (Some(vec!["Ingress".to_string()]), "null")
    );

    let observed = {
        let mut observed = observed;
        observed.kind.backends.control_plane = vec!["192.0.2.1:6443".parse().expect("addr")];
        observed
    };
    let (types, open) = egress_of(&observed, &fx::config());
    assert_eq!(
        types,
        Some(vec!["Ingress".to_string(), "Egress".to_string()])
    );
    assert_eq!(
        open,
        concat!(
            r#"[{"ports":[{"port":80,"protocol":"TCP"}],"to":[{"podSelector":{"matchLabels":{"app":"web"}}}]},"#,
            r#"{"ports":[{"port":15432,"protocol":"TCP"}],"to":[{"ipBlock":{"cidr":"192.0.2.40/32"}}]},"#,
            r#"{"ports":[{"port":53,"protocol":"UDP"},{"port":53,"protocol":"TCP"}]},"#,
            r#"{"ports":[{"protocol":"UDP"},{"port":443,"protocol":"TCP"}]},"#,
            r#"{"ports":[{"port":6443,"protocol":"TCP"}],"to":[{"ipBlock":{"cidr":"192.0.2.1/32"}}]}]"#,
        )
    );
    // `--restrict-agent-egress=false`: no egress rules whatever is known.
    let off = OperatorConfig {
        restrict_agent_egress: false,
        ..fx::config()
    };
    let (types, egress) = egress_of(&observed, &off);
    assert_eq!(
        (types, egress.as_str()),
        (Some(vec!["Ingress".to_string()]), "null")
    );
    let mut config = fx::config();
    config.cluster_network = Some(tailnet_render::reach::ClusterNetwork {
        cidrs: vec![
            tailnet_render::reach::parse_cidr("10.244.0.0/16").expect("cidr"),
            tailnet_render::reach::parse_cidr("10.96.0.0/12").expect("cidr"),
        ],
        dns: tailnet_render::reach::DnsPods::default(),
    });
    let (_, closed) = egress_of(&observed, &config);
    assert!(
        closed.contains(concat!(
            r#"{"ports":[{"port":53,"protocol":"UDP"},{"port":53,"protocol":"TCP"}],"to":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kube-system"}},"podSelector":{"matchLabels":{"k8s-app":"kube-dns"}}}]},"#,
            r#"{"ports":[{"protocol":"UDP"},{"port":443,"protocol":"TCP"}],"to":[{"ipBlock":{"cidr":"0.0.0.0/0","except":["10.244.0.0/16","10.96.0.0/12"]}},{"ipBlock":{"cidr":"::/0"}}]}"#,
        )),
        "{closed}"
    );
}
