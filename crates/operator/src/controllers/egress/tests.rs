//! The egress decision table: `decide` driven through every reason it can produce, with
//! hand-made observations (no environment).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tailnet_api::TailnetEgress;
use tailnet_api::agent_status::ProbeState;
use tailnet_api::conditions::{reasons, types};
use tailnet_api::egress::TailnetEgressStatus;
use tailnet_headscale::Node;

use super::super::agent::decide::{self as agent, Decision};
use super::super::agent::identity::KeyAction;
use super::super::agent::observation::{AgentObserved, AuthSecret, Observation};
use super::super::reason_coverage::assert_every_reason_has_a_case;
use super::super::status::Problem;
use super::super::test_fixtures::{self as fx, OPERATOR_NAMESPACE};
use super::decide::{self, Egress};
use super::observation::{EgressObserved, GrantCheck};

type EgressDecision = Decision<Egress>;
type EgressObservation = Observation<EgressObserved>;

const RESOURCE: &str = "TailnetEgress/tailnet-system/team-a";
const TAG: &str = "tag:tno-egress-team-a";

fn egress(targets: serde_json::Value) -> TailnetEgress {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1",
        "kind": "TailnetEgress",
        "metadata": {"name": "team-a", "namespace": OPERATOR_NAMESPACE, "uid": "egress-uid", "generation": 3},
        "spec": {
            "tailnetRef": {"name": "demo"},
            "consumerNamespaces": ["team-a"],
            "targets": targets
        }
    }))
    .expect("egress fixture")
}

fn ip_egress() -> TailnetEgress {
    egress(serde_json::json!([{"name": "remote-db", "address": "192.0.2.10", "port": 5432}]))
}

fn agent_node(online: bool) -> Node {
    fx::node(
        7,
        "tailnet-egress-team-a",
        TAG,
        online,
        &["100.64.0.7", "fd7a:115c:a1e0::7"],
    )
}

/// Everything in order: approved route, node online, agent ready, grants live, reachable.
fn healthy() -> EgressObservation {
    let tailnet = fx::tailnet(&[RESOURCE]);
    EgressObservation {
        access: Ok(fx::access(tailnet)),
        agent: AgentObserved {
            nodes: Ok(Arc::new(vec![
                fx::router(&["192.0.2.0/24"], &["192.0.2.0/24"]),
                agent_node(true),
            ])),
            auth_secret: AuthSecret::RemovedByUs,
            deployment: Some(fx::deployment(1)),
            report: Some(fx::report(
                vec![fx::probe(
                    "remote-db",
                    "192.0.2.10:5432",
                    ProbeState::Reachable,
                )],
                vec![],
            )),
        },
        kind: EgressObserved {
            foreign_services: BTreeMap::new(),
            own_services: BTreeMap::new(),
            grants: BTreeMap::new(),
        },
    }
}

fn run(egress: &TailnetEgress, observed: &EgressObservation) -> EgressDecision {
    let valid = agent::validated::<Egress>(egress, fx::now()).expect("a valid egress");
    agent::decide::<Egress>(egress, &valid, observed, &fx::config(), fx::now()).expect("decide")
}

/// A case: its name, the decision's status, and the expected (type, status, reason) checks.
struct Case {
    name: &'static str,
    status: TailnetEgressStatus,
    expect: Vec<(&'static str, &'static str, &'static str)>,
}

fn case(
    name: &'static str,
    egress: &TailnetEgress,
    observed: EgressObservation,
    expect: Vec<(&'static str, &'static str, &'static str)>,
) -> Case {
    Case {
        name,
        status: run(egress, &observed).status,
        expect,
    }
}

fn with(change: impl FnOnce(&mut EgressObservation)) -> EgressObservation {
    let mut observed = healthy();
    change(&mut observed);
    observed
}

fn tailnet_with(tailnet: tailnet_api::Tailnet) -> EgressObservation {
    with(|o| o.access = Ok(fx::access(tailnet)))
}

fn cases() -> Vec<Case> {
    let ip = ip_egress();
    let dns_only = egress(
        serde_json::json!([{"name": "wiki", "address": "wiki.site.example.net", "port": 443}]),
    );
    let mut v = vec![
        case(
            "healthy",
            &ip,
            healthy(),
            vec![
                (types::READY, "True", reasons::READY),
                (types::ROUTES_READY, "True", reasons::READY),
                (types::NODE_ONLINE, "True", reasons::ONLINE),
                (types::TARGETS_REACHABLE, "True", reasons::REACHABLE),
            ],
        ),
        case(
            "tailnet missing",
            &ip,
            with(|o| o.access = Err(Problem::new(reasons::TAILNET_NOT_FOUND, "gone"))),
            vec![(types::READY, "False", reasons::TAILNET_NOT_FOUND)],
        ),
        case(
            "tailnet unreadable",
            &ip,
            with(|o| o.access = Err(Problem::new(reasons::TAILNET_UNREADABLE, "403"))),
            vec![(types::TAILNET_READY, "False", reasons::TAILNET_UNREADABLE)],
        ),
        case(
            "headscale unusable",
            &ip,
            with(|o| {
                let mut access = fx::access(fx::tailnet(&[]));
                access.headscale = Err(Problem::new(reasons::SECRET_MISSING, "no key"));
                o.access = Ok(access);
                o.agent.nodes = Err(super::super::agent::observation::nodes_unobservable());
            }),
            vec![
                (types::READY, "False", reasons::SECRET_MISSING),
                (
                    types::NODE_ONLINE,
                    "Unknown",
                    reasons::HEADSCALE_UNREACHABLE,
                ),
                (
                    types::ROUTES_READY,
                    "Unknown",
                    reasons::HEADSCALE_UNREACHABLE,
                ),
            ],
        ),
        case(
            "node list fails",
            &ip,
            with(|o| {
                o.agent.nodes = Err(Problem::new(
                    reasons::headscale::TIMEOUT,
                    "listing Headscale nodes failed",
                ))
            }),
            vec![
                (types::NODE_ONLINE, "Unknown", reasons::headscale::TIMEOUT),
                (types::ROUTES_READY, "Unknown", reasons::headscale::TIMEOUT),
            ],
        ),
        case(
            "service name held by someone else",
            &ip,
            with(|o| {
                o.kind
                    .foreign_services
                    .insert("remote-db".into(), "no controller (created by hand)".into());
            }),
            vec![(types::READY, "False", reasons::SERVICE_NAME_CONFLICT)],
        ),
        case(
            "node offline",
            &ip,
            with(|o| {
                o.agent.nodes = Ok(Arc::new(vec![
                    fx::router(&["192.0.2.0/24"], &["192.0.2.0/24"]),
                    agent_node(false),
                ]))
            }),
            vec![(types::NODE_ONLINE, "False", reasons::NODE_OFFLINE)],
        ),
        case(
            "node not registered",
            &ip,
            with(|o| {
                o.agent.nodes = Ok(Arc::new(vec![fx::router(
                    &["192.0.2.0/24"],
                    &["192.0.2.0/24"],
                )]));
                o.agent.auth_secret = AuthSecret::Absent;
            }),
            vec![(types::NODE_ONLINE, "False", reasons::NODE_NOT_REGISTERED)],
        ),
        case(
            "no Headscale key, the owner has not written one for the tag yet",
            &ip,
            with(|o| {
                o.agent.nodes = Ok(Arc::new(vec![fx::router(
                    &["192.0.2.0/24"],
                    &["192.0.2.0/24"],
                )]));
                o.agent.auth_secret = AuthSecret::Absent;
                if let Ok(view) = &mut o.access {
                    view.owner_keys = Some(Default::default());
                }
            }),
            vec![(types::NODE_ONLINE, "False", reasons::AWAITING_OWNER_KEY)],
        ),
        case(
            "agent not ready",
            &ip,
            with(|o| o.agent.deployment = Some(fx::deployment(0))),
            vec![(types::READY, "False", reasons::AGENT_NOT_READY)],
        ),
        case(
            "no deployment yet",
            &ip,
            with(|o| o.agent.deployment = None),
            vec![(types::AGENT_READY, "False", reasons::AGENT_NOT_READY)],
        ),
    ];
    v.extend(route_policy_and_probe_cases(&ip, &dns_only));
    v.extend(starting_cases(&ip));
    v
}

/// Routes, grants and the agent's probes.
fn route_policy_and_probe_cases(ip: &TailnetEgress, dns_only: &TailnetEgress) -> Vec<Case> {
    let (ip, dns_only) = (ip.clone(), dns_only.clone());
    let mut v = vec![
        case(
            "route not approved",
            &ip,
            with(|o| {
                o.agent.nodes = Ok(Arc::new(vec![
                    fx::router(&["192.0.2.0/24"], &[]),
                    agent_node(true),
                ]))
            }),
            vec![(types::ROUTES_READY, "False", reasons::ROUTE_NOT_APPROVED)],
        ),
        case(
            "route not advertised",
            &ip,
            with(|o| {
                o.agent.nodes = Ok(Arc::new(vec![
                    fx::router(&["198.51.100.0/24"], &["198.51.100.0/24"]),
                    agent_node(true),
                ]))
            }),
            vec![(types::READY, "False", reasons::ROUTE_NOT_ADVERTISED)],
        ),
        case(
            "dns targets need no route",
            &dns_only,
            with(|o| {
                o.agent.report = Some(fx::report(
                    vec![fx::probe(
                        "wiki",
                        "wiki.site.example.net:443",
                        ProbeState::Reachable,
                    )],
                    vec![],
                ))
            }),
            vec![
                (types::ROUTES_READY, "True", reasons::NOT_APPLICABLE),
                (types::READY, "True", reasons::READY),
            ],
        ),
        case(
            "grants not live yet",
            &ip,
            tailnet_with(fx::tailnet(&[])),
            vec![(types::POLICY_EFFECTIVE, "False", reasons::NOT_EFFECTIVE)],
        ),
        case(
            "agent report unreadable",
            &ip,
            with(|o| o.agent.report = None),
            vec![
                (types::TARGETS_REACHABLE, "Unknown", reasons::NOT_OBSERVED),
                (types::READY, "True", reasons::READY),
            ],
        ),
        case(
            "not probed yet",
            &ip,
            with(|o| {
                o.agent.report = Some(fx::report(
                    vec![fx::probe(
                        "remote-db",
                        "192.0.2.10:5432",
                        ProbeState::Unknown,
                    )],
                    vec![],
                ))
            }),
            vec![(types::TARGETS_REACHABLE, "Unknown", reasons::NOT_PROBED_YET)],
        ),
    ];
    let mut dry_run = fx::tailnet(&[]);
    dry_run.spec.policy.mode = tailnet_api::tailnet::PolicyMode::DryRun;
    v.push(case(
        "tailnet in DryRun",
        &ip,
        tailnet_with(dry_run),
        vec![(types::POLICY_EFFECTIVE, "False", reasons::DRY_RUN)],
    ));
    let mut contributing = fx::tailnet(&[]);
    contributing.spec.policy.mode = tailnet_api::tailnet::PolicyMode::Contribute;
    v.push(case(
        "tailnet contributing, grants not merged by the owner yet",
        &ip,
        tailnet_with(contributing),
        vec![(types::POLICY_EFFECTIVE, "False", reasons::CONTRIBUTING)],
    ));
    for reason in [
        reasons::REJECTED,
        reasons::OWNED_ELSEWHERE,
        reasons::BASE_INVALID,
        reasons::HEADSCALE_UNREACHABLE,
    ] {
        v.push(Case {
            name: "tailnet policy not applied",
            status: run(
                &ip,
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
                &ip,
                &with(|o| {
                    o.agent.report = Some(fx::report(
                        vec![fx::probe("remote-db", "192.0.2.10:5432", state)],
                        vec![],
                    ))
                }),
            )
            .status,
            expect: vec![
                (types::TARGETS_REACHABLE, "False", reason),
                (types::READY, "False", reason),
            ],
        });
    }
    v.extend(device_cases());
    v
}

/// While tailscaled logs in, target probes cannot succeed: `AgentStarting`, not `Error`.
fn starting_cases(ip: &TailnetEgress) -> Vec<Case> {
    vec![
        case(
            "the agent is starting: a failed probe is not an Error",
            ip,
            with(|o| {
                let mut report = fx::report(
                    vec![fx::probe("remote-db", "192.0.2.10:5432", ProbeState::Error)],
                    vec![],
                );
                report.tailnet.connected = false;
                report.tailnet.backend_state = "NeedsLogin".into();
                o.agent.report = Some(report);
            }),
            vec![(types::TARGETS_REACHABLE, "Unknown", reasons::AGENT_STARTING)],
        ),
        case(
            "tailscaled Running without an IP (lost control) is not a start",
            ip,
            with(|o| {
                let mut report = fx::report(
                    vec![fx::probe(
                        "remote-db",
                        "192.0.2.10:5432",
                        ProbeState::Timeout,
                    )],
                    vec![],
                );
                report.tailnet.connected = false;
                o.agent.report = Some(report);
            }),
            vec![(types::TARGETS_REACHABLE, "False", reasons::TIMEOUT)],
        ),
    ]
}

/// A user-owned device in the tailnet (a NAS): IPv4 and IPv6.
fn device(online: bool) -> Node {
    Node {
        user: Some(tailnet_headscale::User {
            name: "alice".into(),
            ..Default::default()
        }),
        tags: vec![],
        last_seen: Some("2026-06-01T11:58:00Z".parse().expect("time")),
        ..fx::node(
            9,
            "nas",
            "unused",
            online,
            &["100.64.0.9", "fd7a:115c:a1e0::9"],
        )
    }
}

fn device_observed(device: Node, probes: Vec<(&str, &str, ProbeState)>) -> EgressObservation {
    with(|o| {
        o.agent.nodes = Ok(Arc::new(vec![
            fx::router(&["192.0.2.0/24"], &["192.0.2.0/24"]),
            agent_node(true),
            device,
        ]));
        o.agent.report = Some(fx::report(
            probes
                .into_iter()
                .map(|(n, a, s)| fx::probe(n, a, s))
                .collect(),
            vec![],
        ));
    })
}

fn device_cases() -> Vec<Case> {
    let by_ip = egress(serde_json::json!([
        {"name": "nas-v4", "address": "100.64.0.9", "port": 7000},
        {"name": "nas-v6", "address": "fd7a:115c:a1e0::9", "port": 7000}
    ]));
    let reachable = vec![
        ("nas-v4", "100.64.0.9:7000", ProbeState::Reachable),
        ("nas-v6", "[fd7a:115c:a1e0::9]:7000", ProbeState::Reachable),
    ];
    let by_name =
        egress(serde_json::json!([{"name": "nas", "address": "nas.ts.example.net", "port": 7000}]));
    let mut magic = fx::tailnet(&[RESOURCE]);
    if let Some(dns) = magic.spec.dns.as_mut() {
        dns.magic_dns_domain = Some("ts.example.net".into());
    }
    let named = |grant: Option<GrantCheck>| {
        let mut o = device_observed(
            device(true),
            vec![("nas", "nas.ts.example.net:7000", ProbeState::Reachable)],
        );
        o.access = Ok(fx::access(magic.clone()));
        if let Some(g) = grant {
            o.kind.grants.insert("nas".into(), g);
        }
        o
    };
    let mut expired = device(true);
    expired.expiry = Some("2026-05-01T00:00:00Z".parse().expect("time"));
    let unknown_ip = egress(serde_json::json!([
        {"name": "gone", "address": "100.64.0.99", "port": 7000}
    ]));
    let unknown_name = egress(serde_json::json!([
        {"name": "gone", "address": "gone.ts.example.net", "port": 7000}
    ]));
    let mut unknown_name_observed = named(None);
    unknown_name_observed.agent.report = Some(fx::report(vec![], vec![]));
    vec![
        case(
            "device by tailnet IPv4 and IPv6: no route involved",
            &by_ip,
            device_observed(device(true), reachable.clone()),
            vec![
                (types::ROUTES_READY, "True", reasons::NOT_APPLICABLE),
                (types::TARGETS_REACHABLE, "True", reasons::REACHABLE),
                (types::READY, "True", reasons::READY),
            ],
        ),
        case(
            "device offline",
            &by_ip,
            device_observed(
                device(false),
                vec![
                    ("nas-v4", "100.64.0.9:7000", ProbeState::Timeout),
                    ("nas-v6", "[fd7a:115c:a1e0::9]:7000", ProbeState::Timeout),
                ],
            ),
            vec![
                (
                    types::TARGETS_REACHABLE,
                    "False",
                    reasons::TARGET_NODE_OFFLINE,
                ),
                (types::READY, "False", reasons::TARGET_NODE_OFFLINE),
                (types::ROUTES_READY, "True", reasons::NOT_APPLICABLE),
            ],
        ),
        case(
            "device key expired",
            &by_ip,
            device_observed(expired, reachable),
            vec![(types::READY, "False", reasons::TARGET_NODE_EXPIRED)],
        ),
        case(
            "tailnet address no node holds",
            &unknown_ip,
            device_observed(device(true), vec![]),
            vec![(
                types::TARGETS_REACHABLE,
                "False",
                reasons::TARGET_NODE_UNKNOWN,
            )],
        ),
        case(
            "MagicDNS name of no node",
            &unknown_name,
            unknown_name_observed,
            vec![(types::READY, "False", reasons::TARGET_NODE_UNKNOWN)],
        ),
        case(
            "MagicDNS name granted by the base",
            &by_name,
            named(Some(GrantCheck::Granted)),
            vec![
                (types::POLICY_EFFECTIVE, "True", reasons::READY),
                (types::ROUTES_READY, "True", reasons::NOT_APPLICABLE),
                (types::READY, "True", reasons::READY),
            ],
        ),
        case(
            "MagicDNS name without a grant",
            &by_name,
            named(Some(GrantCheck::Missing)),
            vec![
                (types::POLICY_EFFECTIVE, "False", reasons::GRANT_MISSING),
                (types::READY, "False", reasons::GRANT_MISSING),
            ],
        ),
    ]
}

#[test]
fn target_classes_and_their_nodes_in_the_status() {
    use tailnet_api::egress::TargetKind;
    let mixed = egress(serde_json::json!([
        {"name": "db", "address": "192.0.2.10", "port": 5432},
        {"name": "nas-v6", "address": "fd7a:115c:a1e0::9", "port": 7000},
        {"name": "nas", "address": "nas", "port": 7000},
        {"name": "wiki", "address": "wiki.site.example.net", "port": 443}
    ]));
    let mut observed = device_observed(
        device(false),
        vec![("db", "192.0.2.10:5432", ProbeState::Reachable)],
    );
    observed
        .kind
        .grants
        .insert("nas".into(), GrantCheck::Missing);
    let status = run(&mixed, &observed).status;
    let kinds: Vec<_> = status.targets.iter().map(|t| t.kind).collect();
    assert_eq!(
        kinds,
        [
            Some(TargetKind::SubnetRoute),
            Some(TargetKind::TailnetNode),
            Some(TargetKind::MagicDns),
            Some(TargetKind::DnsName)
        ]
    );
    assert_eq!(
        status.kinds.as_deref(),
        Some("1 TailnetNode, 1 SubnetRoute, 1 MagicDNS, 1 DNSName")
    );
    let nas = &status.targets[1];
    let node = nas.node.as_ref().expect("node");
    assert_eq!(
        (node.name.as_str(), node.online, node.ips.len()),
        ("nas", false, 2)
    );
    assert_eq!(node.last_seen.as_deref(), Some("2026-06-01T11:58:00Z"));
    assert_eq!(nas.state.as_deref(), Some(reasons::TARGET_NODE_OFFLINE));
    let message = nas.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("offline, last seen 2026-06-01T11:58:00Z"),
        "{message}"
    );
    // The offline node wins over its (missing) grant: first the node must be there.
    assert_eq!(
        status.targets[2].state.as_deref(),
        Some(reasons::TARGET_NODE_OFFLINE)
    );
    // Routes: only the subnet target needs one.
    let routes = fx::condition(&status.conditions, types::ROUTES_READY);
    assert_eq!(routes, ("True", reasons::READY));
    // Online again, the missing grant is named with the exact line to add.
    let mut observed = device_observed(device(true), vec![]);
    observed
        .kind
        .grants
        .insert("nas".into(), GrantCheck::Missing);
    let status = run(&mixed, &observed).status;
    assert_eq!(
        status.targets[2].missing_grant.as_deref(),
        Some(
            r#"{"src": ["tag:tno-egress-team-a"], "dst": ["100.64.0.9", "fd7a:115c:a1e0::9"], "ip": ["tcp:7000"]}"#
        )
    );
    let policy = status
        .conditions
        .iter()
        .find(|c| c.type_ == types::POLICY_EFFECTIVE)
        .expect("PolicyEffective");
    assert_eq!(policy.reason, reasons::GRANT_MISSING);
    assert!(
        policy.message.contains(r#""dst": ["100.64.0.9""#),
        "{}",
        policy.message
    );
    // Headscale unreachable: no kind is claimed for IPs (a node address looks like a subnet).
    let mut observed = device_observed(device(true), vec![]);
    observed.agent.nodes = Err(Problem::new(reasons::HEADSCALE_UNREACHABLE, "down"));
    let status = run(&mixed, &observed).status;
    assert!(status.targets.iter().all(|t| t.kind.is_none()));
}

/// Headscale's node list unreadable (its server stopped): an IP target's route is unknown,
/// not `RouteNotAdvertised` with advice to reconfigure a router that is fine, and
/// `RoutesReady` is Unknown with the list's reason. Seen in `two_headscales_e2e` before the
/// fix: `state: RouteNotAdvertised, "configure the subnet router to advertise it"`.
#[test]
fn unreadable_node_list_leaves_the_route_of_an_ip_target_unknown() {
    let observed = with(|o| {
        o.agent.nodes = Err(Problem::new(
            reasons::headscale::TIMEOUT,
            "listing Headscale nodes failed: timed out",
        ))
    });
    let status = run(&ip_egress(), &observed).status;
    let target = &status.targets[0];
    assert_eq!(target.state.as_deref(), Some(reasons::headscale::TIMEOUT));
    let message = target.message.clone().unwrap_or_default();
    assert!(
        message.contains("unknown") && message.contains("timed out"),
        "{message}"
    );
    assert_eq!(target.route, None);
    assert_eq!(
        fx::condition(&status.conditions, types::ROUTES_READY),
        ("Unknown", reasons::headscale::TIMEOUT)
    );
    // The same egress with the list readable and no router: RouteNotAdvertised.
    let observed = with(|o| o.agent.nodes = Ok(Arc::new(vec![agent_node(true)])));
    let status = run(&ip_egress(), &observed).status;
    assert_eq!(
        status.targets[0].state.as_deref(),
        Some(reasons::ROUTE_NOT_ADVERTISED)
    );
    assert_eq!(
        fx::condition(&status.conditions, types::ROUTES_READY),
        ("False", reasons::ROUTE_NOT_ADVERTISED)
    );
}

/// The reasons a status shows: its conditions' and its targets' states.
fn reasons_of(status: &TailnetEgressStatus) -> impl Iterator<Item = String> + '_ {
    status
        .conditions
        .iter()
        .map(|c| c.reason.clone())
        .chain(status.targets.iter().filter_map(|t| t.state.clone()))
}

#[test]
fn decision_table() {
    let mut seen = BTreeSet::new();
    for case in cases() {
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
    // The decisions made before the observation: wrong namespace, invalid spec.
    let mut elsewhere = ip_egress();
    elsewhere.metadata.namespace = Some("team-a".into());
    let status =
        decide::wrong_namespace(&elsewhere, OPERATOR_NAMESPACE, fx::now()).expect("refused");
    assert_eq!(
        fx::condition(&status.conditions, types::READY),
        ("False", reasons::WRONG_NAMESPACE)
    );
    seen.extend(reasons_of(&status));
    assert!(decide::wrong_namespace(&ip_egress(), OPERATOR_NAMESPACE, fx::now()).is_none());
    let invalid =
        egress(serde_json::json!([{"name": "Bad_Name", "address": "192.0.2.10", "port": 0}]));
    let refused = agent::validated::<Egress>(&invalid, fx::now()).expect_err("invalid");
    assert_eq!(
        fx::condition(&refused.status.conditions, types::SPEC_VALID),
        ("False", reasons::INVALID_SPEC)
    );
    assert!(refused.agent.is_none(), "an invalid spec applies nothing");
    seen.extend(reasons_of(&refused.status));
    assert!(agent::validated::<Egress>(&ip_egress(), fx::now()).is_ok());
    assert_every_reason_has_a_case(
        &seen,
        &[
            include_str!("decide.rs"),
            include_str!("../agent/conditions.rs"),
        ],
    );
}

#[test]
fn ready_names_the_first_missing_precondition_in_dependency_order() {
    // Node offline and the route unapproved and grants not live: NodeOnline comes first.
    let observed = with(|o| {
        o.agent.nodes = Ok(Arc::new(vec![
            fx::router(&["192.0.2.0/24"], &[]),
            agent_node(false),
        ]));
        o.access = Ok(fx::access(fx::tailnet(&[])));
    });
    let status = run(&ip_egress(), &observed).status;
    assert_eq!(
        fx::condition(&status.conditions, types::READY),
        ("False", reasons::NODE_OFFLINE)
    );
    // Services conflict beats everything after it.
    let observed = with(|o| {
        o.kind
            .foreign_services
            .insert("remote-db".into(), "TailnetEgress other".into());
        o.agent.deployment = None;
    });
    let status = run(&ip_egress(), &observed).status;
    assert_eq!(
        fx::condition(&status.conditions, types::READY),
        ("False", reasons::SERVICE_NAME_CONFLICT)
    );
}

#[test]
fn what_is_applied_and_minted() {
    // Healthy: the Service is applied, no key action (the Secret was removed by us).
    let decision = run(&ip_egress(), &healthy());
    let plan = decision.agent.expect("plan");
    assert_eq!(plan.kind.services.len(), 1);
    assert_eq!(plan.key, KeyAction::Keep);
    assert_eq!(plan.tag, TAG);
    // A conflicting Service name is not applied; a removed target's Service is deleted.
    let mut observed = with(|o| {
        o.kind
            .foreign_services
            .insert("remote-db".into(), "no controller (created by hand)".into());
        o.kind
            .own_services
            .insert("old-target".into(), Default::default());
    });
    let plan = run(&ip_egress(), &observed).agent.expect("plan");
    assert!(plan.kind.services.is_empty());
    assert_eq!(plan.kind.delete_services, vec!["old-target".to_string()]);
    // No node, no key: mint one valid for the key lifetime.
    observed = with(|o| {
        o.agent.nodes = Ok(Arc::new(vec![]));
        o.agent.auth_secret = AuthSecret::Absent;
    });
    let plan = run(&ip_egress(), &observed).agent.expect("plan");
    assert!(
        matches!(plan.key, KeyAction::Mint { held: None, .. }),
        "{:?}",
        plan.key
    );
    // A device tagged by hand with the egress's tag (another hostname): not taken for the
    // agent's node, named, and no key is minted while the agent has no node of its own.
    let device = || Node {
        name: "nas".to_string(),
        ..fx::node(42, "nas", TAG, true, &["100.64.0.42"])
    };
    observed = with(|o| {
        o.agent.nodes = Ok(Arc::new(vec![device()]));
        o.agent.auth_secret = AuthSecret::Absent;
    });
    let decision = run(&ip_egress(), &observed);
    assert_eq!(decision.agent.expect("plan").key, KeyAction::Keep);
    assert_eq!(
        fx::condition(&decision.status.conditions, types::AGENT_READY),
        ("False", reasons::TAG_CONFLICT)
    );
    assert_eq!(
        fx::condition(&decision.status.conditions, types::NODE_ONLINE).1,
        reasons::NODE_NOT_REGISTERED
    );
    assert!(
        decision.status.node_id.is_none(),
        "the device is not the agent's node"
    );
    // With its own node as well, the agent keeps it (the conflict is still named).
    observed = with(|o| o.agent.nodes = Ok(Arc::new(vec![device(), agent_node(true)])));
    let decision = run(&ip_egress(), &observed);
    assert_eq!(decision.status.node_id.as_deref(), Some("7"));
    let agent_ready = decision
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == types::AGENT_READY)
        .expect("AgentReady");
    assert_eq!(agent_ready.reason, reasons::TAG_CONFLICT);
    assert!(
        agent_ready
            .message
            .contains("nas (id 42, hostname \"nas\")"),
        "{}",
        agent_ready.message
    );
    // Headscale unreadable: no key action at all (the node may well exist).
    observed = with(|o| {
        o.agent.nodes = Err(Problem::new(reasons::headscale::TIMEOUT, "timeout"));
        o.agent.auth_secret = AuthSecret::Absent;
    });
    assert_eq!(
        run(&ip_egress(), &observed).agent.expect("plan").key,
        KeyAction::Keep
    );
    // The Tailnet missing: nothing is applied.
    observed = with(|o| o.access = Err(Problem::new(reasons::TAILNET_NOT_FOUND, "gone")));
    assert!(run(&ip_egress(), &observed).agent.is_none());
}

#[test]
fn route_states() {
    let ip = "192.0.2.10".parse().expect("ip");
    let approvers = vec!["tag:router".to_string()];
    let approved = fx::router(&["192.0.2.0/24", "0.0.0.0/0"], &["192.0.2.0/24"]);
    assert_eq!(
        decide::route_state(&ip, &approvers, std::slice::from_ref(&approved)).state,
        reasons::READY
    );
    let unapproved = fx::router(&["192.0.2.0/24"], &[]);
    assert_eq!(
        decide::route_state(&ip, &approvers, &[unapproved]).state,
        reasons::ROUTE_NOT_APPROVED
    );
    let other = "198.51.100.20".parse().expect("ip");
    let state = decide::route_state(&other, &approvers, std::slice::from_ref(&approved));
    assert_eq!(
        (state.route, state.state),
        (None, reasons::ROUTE_NOT_ADVERTISED)
    );
    // A non-approver advertising the route does not count; neither does an exit route.
    let mut stranger = approved;
    stranger.tags = vec!["tag:laptop".into()];
    assert_eq!(
        decide::route_state(&ip, &approvers, &[stranger]).state,
        reasons::ROUTE_NOT_ADVERTISED
    );
}
