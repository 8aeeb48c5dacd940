//! The Tailnet controller's decision table: hand-made observations and scripted Headscale
//! answers through the pure steps (`plan` → `after_check` → `after_set` → `finish`), every
//! reason they can produce. No environment; milliseconds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::events::EventType;
use tailnet_api::conditions::{self, Status, reasons, types};
use tailnet_api::tailnet::{PolicyMode, PolicyStatus, TailnetStatus};
use tailnet_api::{Tailnet, TailnetEgress};
use tailnet_policy::ObservedNode;

use super::super::config::OperatorConfig;
use super::super::reason_coverage::assert_every_reason_has_a_case;
use super::super::status::Problem;
use super::decide::{
    self, Answer, PolicyOutcome, PolicyStep, Refusal, TailnetPlan, rendered_policy_data,
};
use super::locations::BASE_POLICY_KEY;
use super::observation::{CurrentDns, TailnetObservation};
use tailnet_render::backends::ObjectKey;

const BASE: &str = r#"{
  // human-owned
  "groups": {"group:platform": ["alice@"]},
  "grants": []
}"#;

fn now() -> Timestamp {
    "2026-06-01T12:00:00Z".parse().expect("timestamp")
}

fn config() -> OperatorConfig {
    OperatorConfig {
        operator_namespace: "tailnet-system".to_string(),
        installation_id: "test-installation".to_string(),
        headscale_poll: Duration::from_secs(10),
        headscale_timeout: Duration::from_secs(5),
        images: tailnet_render::images::Images::default(),
        cluster_domain: "cluster.local".to_string(),
        approve_routes: true,
        reapply_interval: Duration::from_secs(600),
        max_concurrent_reconciles: 16,
        scope: crate::scope::WatchScope::Cluster,
        cluster_network: None,
        restrict_agent_egress: true,
    }
}

fn tailnet() -> Tailnet {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1",
        "kind": "Tailnet",
        "metadata": {"name": "demo", "uid": "tailnet-uid", "generation": 3},
        "spec": {
            "server": "https://headscale.example.net",
            "apiSecretRef": {"name": "headscale-api", "key": "apiKey"},
            "dns": {
                "hostsConfigMap": "tailnet-hosts",
                "ingressNameTemplate": "{name}.{namespace}.lab.example.net"
            },
            "policy": {
                "baseConfigMap": "tailnet-policy",
                "mode": "Apply",
                "tagOwners": ["group:platform"],
                "routeApprovers": ["tag:router"],
                "ingressSourceAllowlist": ["group:platform"]
            }
        }
    }))
    .expect("tailnet fixture")
}

fn egress() -> TailnetEgress {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1",
        "kind": "TailnetEgress",
        "metadata": {"name": "team-a", "namespace": "tailnet-system", "uid": "egress-uid"},
        "spec": {
            "tailnetRef": {"name": "demo"},
            "consumerNamespaces": ["team-a"],
            "targets": [
                {"name": "remote-db", "address": "192.0.2.10", "port": 5432, "aliases": ["db.site.example.net"]},
                {"name": "remote-api", "address": "198.51.100.20", "port": 443, "aliases": ["api.site.example.net"]}
            ]
        }
    }))
    .expect("egress fixture")
}

/// A subnet router advertising (not approving) the route of `remote-db`.
fn router() -> ObservedNode {
    ObservedNode {
        id: 7,
        name: "site-router".to_string(),
        tags: vec!["tag:router".to_string()],
        ip_addresses: vec!["100.64.0.7".parse().expect("ip")],
        available_routes: vec!["192.0.2.0/24".parse().expect("net")],
        approved_routes: vec![],
        online: true,
    }
}

/// Headscale reachable, an empty live policy, the base valid, no resources.
fn observation() -> TailnetObservation {
    TailnetObservation {
        headscale: Ok("v0.29.0".to_string()),
        nodes: Some(vec![]),
        live_policy: Some(String::new()),
        api_key: None,
        base: Ok(Some(BASE.to_string())),
        egresses: vec![],
        ingresses: vec![],
        services: vec![],
        gateways: vec![],
        egress_cluster_ips: BTreeMap::new(),
        dns_config_map: None,
        contributor_reads: vec![],
        contribution_store: BTreeMap::new(),
    }
}

fn unreachable(reason: &'static str) -> TailnetObservation {
    TailnetObservation {
        headscale: Err(Problem::new(reason, "Headscale cannot be used")),
        nodes: None,
        live_policy: None,
        ..observation()
    }
}

fn with_base(base: Result<Option<&str>, Problem>) -> TailnetObservation {
    TailnetObservation {
        base: base.map(|b| b.map(str::to_string)),
        ..observation()
    }
}

fn with_mode(mode: PolicyMode) -> Tailnet {
    let mut t = tailnet();
    t.spec.policy.mode = mode;
    t
}

fn with_previous(mut t: Tailnet, status: TailnetStatus) -> Tailnet {
    t.status = Some(status);
    t
}

/// The document this installation renders for `t` and `o` (against an empty live policy).
fn document_of(t: &Tailnet, o: &TailnetObservation, config: &OperatorConfig) -> String {
    decide::plan(t, o, config, now())
        .sync
        .expect("a sync against the empty live policy")
        .document
}

fn live(document: String) -> TailnetObservation {
    TailnetObservation {
        live_policy: Some(document),
        ..observation()
    }
}

/// A previous status saying PolicyApplied was `reason`, with `applied_hash`.
fn previous_status(reason: &str, applied_hash: Option<String>) -> TailnetStatus {
    let mut list = Vec::new();
    conditions::upsert(
        &mut list,
        conditions::condition(
            types::POLICY_APPLIED,
            Status::False,
            reason,
            "before",
            Some(2),
        ),
        &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()),
    );
    TailnetStatus {
        conditions: list,
        policy: Some(PolicyStatus {
            applied_hash,
            ..PolicyStatus::default()
        }),
        ..TailnetStatus::default()
    }
}

/// One reconcile through the pure steps, Headscale answering `check` and `set`.
struct Run {
    plan: TailnetPlan,
    outcome: Option<PolicyOutcome>,
    puts: usize,
    status: TailnetStatus,
}

/// `fresh`: the live policy as read again right before the PUT (`None`: unchanged since
/// gather).
fn drive_with(
    t: &Tailnet,
    o: &TailnetObservation,
    config: &OperatorConfig,
    check: Answer,
    set: Answer,
    fresh: Option<Result<String, Refusal>>,
) -> Run {
    let previous = t.status.clone().unwrap_or_default();
    let plan = decide::plan(t, o, config, now());
    let mut puts = 0;
    let outcome =
        plan.sync
            .as_ref()
            .map(|sync| match decide::after_check(sync, check, &previous) {
                PolicyStep::Done(outcome) => outcome,
                PolicyStep::Put { event } => {
                    let fresh = fresh.unwrap_or_else(|| Ok(sync.live.clone()));
                    match decide::before_put(sync, event, fresh, &previous) {
                        (_, PolicyStep::Done(outcome)) => outcome,
                        (sync, PolicyStep::Put { event }) => {
                            puts += 1;
                            decide::after_set(&sync, event, set)
                        }
                    }
                }
            });
    let status = decide::finish(plan.clone(), outcome.as_ref());
    Run {
        plan,
        outcome,
        puts,
        status,
    }
}

fn drive(
    t: &Tailnet,
    o: &TailnetObservation,
    config: &OperatorConfig,
    check: Answer,
    set: Answer,
) -> Run {
    drive_with(t, o, config, check, set, None)
}

fn rejected(message: &str) -> Answer {
    Err(Refusal::Rejected(message.to_string()))
}

fn failed(reason: &'static str) -> Answer {
    Err(Refusal::Failed(Problem::new(reason, "timed out")))
}

type Check = fn(&Run);

struct Case {
    name: &'static str,
    tailnet: Tailnet,
    observed: TailnetObservation,
    config: OperatorConfig,
    check: Answer,
    set: Answer,
    /// The live policy re-read right before the PUT (`None`: unchanged since gather).
    fresh: Option<Result<String, Refusal>>,
    /// (condition, status, reason) that must hold.
    expect: Vec<(&'static str, &'static str, &'static str)>,
    more: Check,
}

fn case(
    name: &'static str,
    observed: TailnetObservation,
    expect: Vec<(&'static str, &'static str, &'static str)>,
) -> Case {
    Case {
        name,
        tailnet: tailnet(),
        observed,
        config: config(),
        check: Ok(()),
        set: Ok(()),
        fresh: None,
        expect,
        more: |_| {},
    }
}

fn event_reason(run: &Run) -> Option<&'static str> {
    run.outcome.as_ref()?.event.as_ref().map(|e| e.reason)
}

fn headscale_cases() -> Vec<Case> {
    let not_reachable = |reason| {
        vec![
            (types::HEADSCALE_REACHABLE, "False", reason),
            (types::BASE_VALID, "True", reasons::VALID),
            (
                types::POLICY_APPLIED,
                "Unknown",
                reasons::HEADSCALE_UNREACHABLE,
            ),
            (types::READY, "False", reason),
        ]
    };
    let mut cases: Vec<Case> = [
        reasons::SECRET_MISSING,
        reasons::SECRET_UNREADABLE,
        reasons::SECRET_KEY_MISSING,
        reasons::headscale::UNAUTHORIZED,
        reasons::headscale::CONNECTION_FAILED,
    ]
    .into_iter()
    .map(|reason| Case {
        more: |run| {
            assert!(run.plan.sync.is_none() && run.plan.approvals.is_empty());
            assert_eq!(run.status.headscale_version, None);
        },
        ..case(
            "Headscale not usable",
            unreachable(reason),
            not_reachable(reason),
        )
    })
    .collect();
    let mut plain_http = tailnet();
    plain_http.spec.server = "http://headscale.example.net:8080".to_string();
    cases.push(Case {
        tailnet: plain_http.clone(),
        more: |run| {
            let events: Vec<_> = run
                .plan
                .events
                .iter()
                .map(|e| (e.type_, e.reason))
                .collect();
            assert_eq!(
                events,
                vec![(EventType::Warning, decide::INSECURE_SERVER_EVENT)],
                "plain http to a remote host: warned"
            );
            assert!(run.plan.events[0].note.contains("travels in clear"));
            let c = conditions::find(&run.status.conditions, types::HEADSCALE_REACHABLE)
                .expect("HeadscaleReachable");
            assert!(
                c.message.contains(decide::INSECURE_SERVER_NOTE),
                "{}",
                c.message
            );
            // The next reconcile (that status as the previous one): no second Event.
            let mut again = tailnet();
            again.spec.server = "http://headscale.example.net:8080".to_string();
            again.status = Some(run.status.clone());
            let next = decide::plan(&again, &observation(), &config(), now());
            assert!(next.events.is_empty(), "warned once: {:?}", next.events);
        },
        ..case(
            "plain http:// to a remote Headscale: a Warning Event, once",
            observation(),
            vec![(types::HEADSCALE_REACHABLE, "True", reasons::REACHABLE)],
        )
    });
    cases.push(Case {
        more: |run| assert!(run.plan.events.is_empty(), "https: no warning"),
        ..case(
            "https:// Headscale: no warning",
            observation(),
            vec![(types::HEADSCALE_REACHABLE, "True", reasons::REACHABLE)],
        )
    });
    cases.push(Case {
        more: |run| {
            assert_eq!(run.status.headscale_version.as_deref(), Some("v0.29.0"));
            assert!(
                run.plan.sync.is_none(),
                "no live policy: nothing to compare"
            );
        },
        ..case(
            "reachable, but the live policy could not be read",
            TailnetObservation {
                live_policy: None,
                ..observation()
            },
            vec![
                (types::HEADSCALE_REACHABLE, "True", reasons::REACHABLE),
                (
                    types::POLICY_APPLIED,
                    "Unknown",
                    reasons::HEADSCALE_UNREACHABLE,
                ),
                (types::READY, "False", reasons::HEADSCALE_UNREACHABLE),
            ],
        )
    });
    cases
}

fn base_cases() -> Vec<Case> {
    let invalid = |reason| {
        vec![
            (types::HEADSCALE_REACHABLE, "True", reasons::REACHABLE),
            (types::BASE_VALID, "False", reason),
            (types::POLICY_APPLIED, "False", reasons::BASE_INVALID),
            (types::READY, "False", reason),
        ]
    };
    let mut cases: Vec<Case> = [
        reasons::CONFIG_MAP_NOT_FOUND,
        reasons::CONFIG_MAP_UNREADABLE,
        reasons::KEY_MISSING,
    ]
    .into_iter()
    .map(|reason| {
        case(
            "base not readable",
            with_base(Err(Problem::new(reason, "no base"))),
            invalid(reason),
        )
    })
    .collect();
    cases.push(Case {
        more: |run| {
            let c = conditions::find(&run.status.conditions, types::BASE_VALID).expect("BaseValid");
            assert!(
                c.message
                    .contains("tailnet-system/tailnet-policy key policy.hujson: line"),
                "{}",
                c.message
            );
            assert!(
                run.plan.rendered.is_none()
                    && run
                        .status
                        .policy
                        .as_ref()
                        .is_some_and(|p| p.rendered_hash.is_none())
            );
        },
        ..case(
            "base does not parse",
            with_base(Ok(Some("{ \"grants\": [ "))),
            invalid(reasons::SYNTAX_ERROR),
        )
    });
    cases.push(case(
        "base parses but cannot be rendered",
        with_base(Ok(Some(r#"{"grants": {}}"#))),
        invalid(reasons::INVALID_BASE),
    ));
    cases.push(Case {
        more: |run| assert_eq!(run.puts, 1),
        ..case(
            "no baseConfigMap: the empty base",
            with_base(Ok(None)),
            vec![
                (types::BASE_VALID, "True", reasons::VALID),
                (types::POLICY_APPLIED, "True", reasons::APPLIED),
            ],
        )
    });
    cases
}

fn policy_cases() -> Vec<Case> {
    let t = tailnet();
    let ours = document_of(&t, &observation(), &config());
    let applied = vec![
        (types::POLICY_APPLIED, "True", reasons::APPLIED),
        (types::READY, "True", reasons::READY),
    ];
    let rejected_status = vec![
        (types::POLICY_APPLIED, "False", reasons::REJECTED),
        (types::READY, "False", reasons::REJECTED),
    ];
    vec![
        Case {
            more: |run| {
                assert_eq!(run.puts, 1);
                assert_eq!(event_reason(run), Some("PolicyApplied"));
                let o = run.outcome.as_ref().expect("outcome");
                assert_eq!(o.metric, Some("applied"));
                let policy = run.status.policy.clone().unwrap_or_default();
                assert!(
                    policy.applied_hash.is_some() && policy.applied_hash == policy.rendered_hash
                );
                assert_eq!(
                    policy.summary.as_deref(),
                    Some("0 tags, 0 grants, 0 routes")
                );
            },
            ..case(
                "Apply, empty live policy: PUT",
                observation(),
                applied.clone(),
            )
        },
        Case {
            more: |run| {
                assert_eq!(run.puts, 0, "up to date: no PUT");
                assert_eq!(
                    run.outcome.as_ref().and_then(|o| o.metric),
                    Some("unchanged")
                );
                assert_eq!(event_reason(run), None);
                assert!(
                    run.status
                        .policy
                        .as_ref()
                        .is_some_and(|p| p.applied_hash.is_some())
                );
            },
            ..case(
                "Apply, live is the rendered document",
                live(ours.clone()),
                applied.clone(),
            )
        },
        Case {
            tailnet: with_mode(PolicyMode::DryRun),
            more: |run| {
                assert_eq!(run.puts, 0, "DryRun never writes");
                assert!(run.plan.approvals.is_empty());
                let sync = run
                    .plan
                    .sync
                    .as_ref()
                    .expect("the rendered policy is published");
                assert_eq!(
                    sync.config_map.metadata.name.as_deref(),
                    Some("demo-rendered-policy")
                );
                assert!(
                    sync.config_map
                        .data
                        .as_ref()
                        .is_some_and(|d| d.contains_key(BASE_POLICY_KEY))
                );
                assert_eq!(run.outcome.as_ref().and_then(|o| o.metric), Some("dry_run"));
                assert!(
                    run.status
                        .policy
                        .as_ref()
                        .is_some_and(|p| p.applied_hash.is_none())
                );
            },
            ..case(
                "DryRun",
                observation(),
                vec![
                    (types::POLICY_APPLIED, "False", reasons::DRY_RUN),
                    (types::READY, "False", reasons::DRY_RUN),
                ],
            )
        },
        Case {
            check: rejected("grant 1: unknown group"),
            more: |run| {
                assert_eq!(run.puts, 0);
                let e = run
                    .outcome
                    .as_ref()
                    .and_then(|o| o.event.clone())
                    .expect("event");
                assert_eq!(
                    (e.type_, e.reason, e.action),
                    (EventType::Warning, reasons::REJECTED, "CheckPolicy")
                );
            },
            ..case(
                "the check rejects the document",
                observation(),
                rejected_status.clone(),
            )
        },
        Case {
            tailnet: with_previous(tailnet(), previous_status(reasons::REJECTED, None)),
            check: rejected("grant 1: unknown group"),
            more: |run| {
                assert_eq!(
                    event_reason(run),
                    None,
                    "no repeated Event while still rejected"
                )
            },
            ..case("still rejected", observation(), rejected_status.clone())
        },
        Case {
            set: rejected("write refused"),
            more: |run| {
                assert_eq!(run.puts, 1);
                let e = run
                    .outcome
                    .as_ref()
                    .and_then(|o| o.event.clone())
                    .expect("event");
                assert_eq!((e.reason, e.action), (reasons::REJECTED, "SetPolicy"));
                assert!(
                    run.status
                        .policy
                        .as_ref()
                        .is_some_and(|p| p.applied_hash.is_none())
                );
            },
            ..case("the PUT is rejected", observation(), rejected_status)
        },
    ]
}

/// The live document another installation wrote (its marker).
fn other_installation_document() -> String {
    document_of(
        &tailnet(),
        &observation(),
        &OperatorConfig {
            installation_id: "elsewhere".to_string(),
            ..config()
        },
    )
}

/// Our marker with the egress's grant: what we wrote before (and, against a render without
/// the egress, what someone edited).
fn our_document_with_egress() -> String {
    document_of(
        &tailnet(),
        &TailnetObservation {
            egresses: vec![egress()],
            ..observation()
        },
        &config(),
    )
}

fn applied_expect() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        (types::POLICY_APPLIED, "True", reasons::APPLIED),
        (types::READY, "True", reasons::READY),
    ]
}

/// The live policy re-read right before the PUT: edited, unchanged, taken over, unreadable.
fn race_cases() -> Vec<Case> {
    let other_installation = other_installation_document();
    let applied = applied_expect();
    // What we wrote last time (our marker, the egress's grant), as gathered; the check then
    // takes seconds, and meanwhile someone edits the live document.
    let ours_before = our_document_with_egress();
    let edited_during_check = ours_before.replace("tcp:5432", "tcp:5433");
    assert_ne!(
        edited_during_check, ours_before,
        "the fixture has a 5432 grant"
    );
    let applied_before = with_previous(
        tailnet(),
        previous_status(reasons::APPLIED, Some(decide::sha256(&ours_before))),
    );
    vec![
        Case {
            tailnet: applied_before.clone(),
            fresh: Some(Ok(edited_during_check.clone())),
            more: |run| {
                assert_eq!(run.puts, 1);
                let e = run
                    .outcome
                    .as_ref()
                    .and_then(|o| o.event.clone())
                    .expect("event");
                assert_eq!(
                    (e.type_, e.reason),
                    (EventType::Warning, decide::MANUAL_EDIT_EVENT)
                );
                assert!(e.note.contains("tcp:5433"), "the lost line: {}", e.note);
            },
            ..case(
                "an edit between the check and the PUT is reported",
                live(ours_before.clone()),
                applied.clone(),
            )
        },
        Case {
            tailnet: applied_before.clone(),
            more: |run| {
                assert_eq!(run.puts, 1);
                assert_eq!(event_reason(run), Some("PolicyApplied"));
            },
            ..case(
                "no edit between the check and the PUT: a plain write",
                live(ours_before.clone()),
                applied.clone(),
            )
        },
        Case {
            fresh: Some(Ok("// edited by hand\n{\"grants\": []}".to_string())),
            more: |run| {
                assert_eq!(run.puts, 1);
                assert_eq!(event_reason(run), Some(decide::MANUAL_EDIT_EVENT));
            },
            ..case(
                "an edit during the first check (no marker yet) is reported too",
                observation(),
                applied.clone(),
            )
        },
        Case {
            tailnet: applied_before.clone(),
            fresh: Some(Ok(other_installation.clone())),
            more: |run| assert_eq!(run.puts, 0, "taken over meanwhile: no PUT"),
            ..case(
                "another installation wrote between the check and the PUT",
                live(ours_before.clone()),
                vec![(types::POLICY_APPLIED, "False", reasons::OWNED_ELSEWHERE)],
            )
        },
        Case {
            tailnet: applied_before,
            fresh: Some(Err(Refusal::Failed(Problem::new(
                reasons::headscale::TIMEOUT,
                "timed out",
            )))),
            more: |run| assert_eq!(run.puts, 0, "never a blind PUT"),
            ..case(
                "the live policy cannot be re-read before the PUT",
                live(ours_before),
                vec![(
                    types::POLICY_APPLIED,
                    "Unknown",
                    reasons::headscale::TIMEOUT,
                )],
            )
        },
    ]
}

/// Ownership, manual edits, takeover and failed calls.
fn ownership_cases() -> Vec<Case> {
    let applied = applied_expect();
    vec![
        Case {
            more: |run| {
                assert_eq!(
                    run.puts, 0,
                    "another installation's policy is never overwritten"
                );
                assert_eq!(
                    run.outcome.as_ref().and_then(|o| o.metric),
                    Some("owned_elsewhere")
                );
            },
            ..case(
                "the live policy belongs to another installation",
                live(other_installation_document()),
                vec![(types::POLICY_APPLIED, "False", reasons::OWNED_ELSEWHERE)],
            )
        },
        Case {
            tailnet: with_previous(
                tailnet(),
                previous_status(reasons::APPLIED, Some(decide::sha256("what we wrote"))),
            ),
            more: |run| {
                assert_eq!(run.puts, 1);
                let e = run
                    .outcome
                    .as_ref()
                    .and_then(|o| o.event.clone())
                    .expect("event");
                assert_eq!(
                    (e.type_, e.reason),
                    (EventType::Warning, "ManualEditOverwritten")
                );
                assert!(e.note.contains("Lost: "), "{}", e.note);
            },
            ..case(
                "a manual edit is overwritten",
                live(our_document_with_egress()),
                applied.clone(),
            )
        },
        Case {
            more: |run| {
                assert_eq!(run.puts, 1);
                assert_eq!(event_reason(run), Some("PolicyTakenOver"));
            },
            ..case(
                "a policy without marker is taken over",
                live(r#"{"grants": []}"#.to_string()),
                applied,
            )
        },
        Case {
            check: failed(reasons::headscale::TIMEOUT),
            more: |run| {
                assert_eq!(run.puts, 0);
                assert_eq!(run.outcome.as_ref().and_then(|o| o.metric), None);
            },
            ..case(
                "the check fails",
                observation(),
                vec![
                    (
                        types::POLICY_APPLIED,
                        "Unknown",
                        reasons::headscale::TIMEOUT,
                    ),
                    (types::READY, "False", reasons::headscale::TIMEOUT),
                ],
            )
        },
        Case {
            set: failed(reasons::headscale::CONNECTION_FAILED),
            more: |run| {
                let c = conditions::find(&run.status.conditions, types::POLICY_APPLIED)
                    .expect("PolicyApplied");
                assert!(
                    c.message.starts_with("writing the policy failed"),
                    "{}",
                    c.message
                );
            },
            ..case(
                "the PUT fails",
                observation(),
                vec![(
                    types::POLICY_APPLIED,
                    "Unknown",
                    reasons::headscale::CONNECTION_FAILED,
                )],
            )
        },
    ]
}

/// A base without rules (Headscale's allow-all) with an egress: generated grants would make
/// everything else denied.
const RULELESS_BASE: &str = r#"{"groups": {"group:platform": ["alice@"]}}"#;

fn ruleless(live_policy: &str) -> TailnetObservation {
    TailnetObservation {
        base: Ok(Some(RULELESS_BASE.to_string())),
        live_policy: Some(live_policy.to_string()),
        egresses: vec![egress()],
        nodes: Some(vec![router()]),
        ..observation()
    }
}

fn accepting(mut t: Tailnet) -> Tailnet {
    t.spec.policy.accepted_notices = vec![tailnet_api::tailnet::AcceptedNotice::BaseHadNoRules];
    t
}

/// Never a lockdown by surprise: Apply refuses, DryRun says so, acceptance or an earlier
/// lockdown of ours lets it through.
fn lockdown_cases() -> Vec<Case> {
    let ours_locked = document_of(&accepting(tailnet()), &ruleless(""), &config());
    // The base had a rule of its own (an empty `grants` list would be deny-by-default
    // already: no rule of the base is lost, like `ours_locked`).
    let ours_with_rules = document_of(
        &tailnet(),
        &TailnetObservation {
            base: Ok(Some(BASE.replace(
                r#""grants": []"#,
                r#""grants": [{"src": ["group:platform"], "dst": ["*"], "ip": ["*"]}]"#,
            ))),
            egresses: vec![egress()],
            ..observation()
        },
        &config(),
    );
    vec![
        Case {
            more: |run| {
                assert_eq!(run.puts, 0, "the allow-all live policy stays");
                let outcome = run.outcome.as_ref().expect("outcome");
                assert!(!run.plan.approvals.is_empty(), "the router's route is due");
                assert!(
                    decide::approvals_after(&run.plan, Some(outcome)).is_empty(),
                    "nothing of the refused document is acted on"
                );
                assert_eq!(outcome.metric, Some("would_lock_down"));
                let event = outcome.event.as_ref().expect("a Warning Event");
                assert_eq!(
                    (event.type_, event.reason),
                    (EventType::Warning, reasons::WOULD_LOCK_DOWN)
                );
                let c = conditions::find(&run.status.conditions, types::POLICY_APPLIED)
                    .expect("PolicyApplied");
                for needle in [
                    "allows all",
                    "deny-by-default",
                    "acceptedNotices: [BaseHadNoRules]",
                    "docs/prerequisites.md",
                ] {
                    assert!(c.message.contains(needle), "{needle}: {}", c.message);
                }
                let sync = run.plan.sync.as_ref().expect("sync");
                let notices = sync
                    .config_map
                    .data
                    .as_ref()
                    .and_then(|d| d.get("notices"))
                    .cloned()
                    .unwrap_or_default();
                assert!(
                    notices.contains("allow-all"),
                    "the ConfigMap shows the notice: {notices}"
                );
            },
            ..case(
                "Apply with a rule-less base over an allow-all live policy is refused",
                ruleless(""),
                vec![(types::POLICY_APPLIED, "False", reasons::WOULD_LOCK_DOWN)],
            )
        },
        Case {
            tailnet: with_previous(tailnet(), previous_status(reasons::WOULD_LOCK_DOWN, None)),
            more: |run| {
                assert_eq!(run.puts, 0);
                assert!(
                    event_reason(run).is_none(),
                    "warned once, not on every poll"
                );
            },
            ..case(
                "the refusal repeats quietly",
                ruleless("{\n  \"groups\": {}\n}"),
                vec![(types::POLICY_APPLIED, "False", reasons::WOULD_LOCK_DOWN)],
            )
        },
        Case {
            tailnet: with_mode(PolicyMode::DryRun),
            more: |run| {
                let c = conditions::find(&run.status.conditions, types::POLICY_APPLIED)
                    .expect("PolicyApplied");
                assert!(
                    c.message.contains("deny-by-default"),
                    "DryRun shows the effect: {}",
                    c.message
                );
            },
            ..case(
                "DryRun shows the lockdown it would cause",
                ruleless(""),
                vec![(types::POLICY_APPLIED, "False", reasons::DRY_RUN)],
            )
        },
        Case {
            tailnet: accepting(tailnet()),
            more: |run| assert_eq!(run.puts, 1, "accepted: applied"),
            ..case(
                "an accepted lockdown is applied",
                ruleless(""),
                vec![(types::POLICY_APPLIED, "True", reasons::APPLIED)],
            )
        },
        Case {
            more: |run| assert_eq!(run.puts, 1, "already deny-by-default and ours: no surprise"),
            ..case(
                "the live policy is ours and already states rules",
                // Ours, deny-by-default already (an earlier accepted apply), one port since
                // changed: the PUT changes nothing outside the generated parts.
                ruleless(&ours_locked.replacen("5432", "5433", 1)),
                vec![(types::POLICY_APPLIED, "True", reasons::APPLIED)],
            )
        },
        Case {
            more: |run| {
                assert_eq!(run.puts, 0, "the base's rules must not vanish silently");
                let c = conditions::find(&run.status.conditions, types::POLICY_APPLIED)
                    .expect("PolicyApplied");
                assert!(
                    c.message
                        .contains("rules from the earlier base would be dropped"),
                    "{}",
                    c.message
                );
            },
            ..case(
                "the live policy is ours, rendered from a base with rules that are now gone",
                ruleless(&ours_with_rules),
                vec![(types::POLICY_APPLIED, "False", reasons::WOULD_LOCK_DOWN)],
            )
        },
        Case {
            more: |run| assert_eq!(run.puts, 1, "the base states rules: applied"),
            ..case(
                "a base with rules over an allow-all live policy is applied",
                TailnetObservation {
                    egresses: vec![egress()],
                    ..observation()
                },
                vec![(types::POLICY_APPLIED, "True", reasons::APPLIED)],
            )
        },
    ]
}

fn dns_cases() -> Vec<Case> {
    let mut no_dns = tailnet();
    no_dns.spec.dns = None;
    let with_egress = TailnetObservation {
        egresses: vec![egress()],
        egress_cluster_ips: BTreeMap::from([(
            ObjectKey::new("tailnet-system", "remote-db"),
            "10.96.0.20".parse().expect("ip"),
        )]),
        ..observation()
    };
    vec![
        Case {
            tailnet: no_dns,
            more: |run| assert!(run.plan.dns.is_none()),
            ..case(
                "DNS not configured",
                observation(),
                vec![
                    (types::DNS_RENDERED, "True", reasons::NOT_CONFIGURED),
                    (types::READY, "True", reasons::READY),
                ],
            )
        },
        Case {
            more: |run| {
                let cm = run
                    .plan
                    .dns
                    .as_ref()
                    .expect("a new DNS ConfigMap is written");
                let hosts = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get("hosts"))
                    .cloned()
                    .unwrap_or_default();
                assert!(hosts.contains("10.96.0.20 db.site.example.net"), "{hosts}");
                assert!(
                    cm.metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| o[0].uid == "tailnet-uid"),
                    "created by us: owned"
                );
                let c = conditions::find(&run.status.conditions, types::DNS_RENDERED)
                    .expect("DNSRendered");
                assert!(
                    c.message.contains("1 pending: api.site.example.net"),
                    "{}",
                    c.message
                );
            },
            ..case(
                "DNS rendered",
                with_egress.clone(),
                vec![(types::DNS_RENDERED, "True", reasons::RENDERED)],
            )
        },
    ]
}

/// The owner's Tailnet listing contributor `cosmos` (prefix `cos`, fragment in ConfigMap
/// `cosmos-fragment`).
fn owner_of_cosmos() -> Tailnet {
    let mut t = tailnet();
    t.spec.policy.contributors = vec![serde_json::from_value(serde_json::json!({
        "name": "cosmos", "tagPrefix": "cos", "source": {"configMap": "cosmos-fragment"},
        "limits": {"ingressSourceAllowlist": ["group:platform"], "egressDestinations": ["192.0.2.0/24"],
                   "dnsSuffixes": ["cosmos.example.net"]}
    }))
    .expect("contributor")];
    t
}

fn cosmos_fragment(egress_destination: &str) -> String {
    serde_json::json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "PolicyFragment",
        "installationId": "cosmos/main", "tagPrefix": "cos",
        "tags": ["tag:cos-egress-site"],
        "grants": [{"owner": "TailnetEgress/ops/site", "src": ["tag:cos-egress-site"],
                    "dst": [egress_destination], "ip": ["tcp:5432"]}],
        "routes": [], "dnsRecords": []
    })
    .to_string()
}

fn with_fragment(read: Result<String, Problem>) -> TailnetObservation {
    TailnetObservation {
        contributor_reads: vec![super::observation::ContributorRead {
            name: "cosmos".into(),
            read,
        }],
        ..observation()
    }
}

/// What the owner stored of `cosmos` an hour ago.
fn stored_cosmos() -> super::observation::StoredFragment {
    super::observation::StoredFragment {
        fragment: cosmos_fragment("192.0.2.10/32"),
        hash: "h1".into(),
        last_read: "2026-06-01T11:00:00Z".into(),
    }
}

/// The owner merging `cosmos`: accepted, refused entries, stale and malformed fragments.
fn owner_contribution_cases() -> Vec<Case> {
    let owner = |name, observed, expect, more: Check| Case {
        tailnet: owner_of_cosmos(),
        more,
        ..case(name, observed, expect)
    };
    let stored = stored_cosmos();
    vec![
        owner(
            "a contributor's fragment is accepted and merged",
            with_fragment(Ok(cosmos_fragment("192.0.2.10/32"))),
            vec![
                (types::CONTRIBUTIONS_ACCEPTED, "True", reasons::ACCEPTED),
                (types::READY, "True", reasons::READY),
            ],
            |run| {
                let document = &run.plan.rendered.as_ref().expect("rendered").document;
                assert!(
                    document.contains("contributor cosmos: TailnetEgress/ops/site"),
                    "{document}"
                );
                assert!(
                    run.plan.contribution_store.is_some(),
                    "the accepted fragment is kept"
                );
                assert_eq!(run.status.contributors[0].state, "Accepted");
            },
        ),
        owner(
            "an entry outside the limits is refused and left out",
            with_fragment(Ok(cosmos_fragment("198.51.100.7/32"))),
            vec![
                (
                    types::CONTRIBUTIONS_ACCEPTED,
                    "False",
                    reasons::CONTRIBUTION_REFUSED,
                ),
                (types::READY, "True", reasons::READY),
            ],
            |run| {
                let document = &run.plan.rendered.as_ref().expect("rendered").document;
                assert!(!document.contains("198.51.100.7"), "{document}");
                assert!(
                    document.contains("\"tag:cos-egress-site\""),
                    "its tag stays: {document}"
                );
                let status = &run.status.contributors[0];
                assert_eq!(status.state, "PartlyRefused");
                assert!(
                    status.refused[0].contains("limits.egressDestinations"),
                    "{:?}",
                    status.refused
                );
            },
        ),
        owner(
            "an unreadable contributor keeps its last accepted fragment",
            TailnetObservation {
                contribution_store: BTreeMap::from([("cosmos".to_string(), stored.clone())]),
                ..with_fragment(Err(Problem::new(
                    reasons::CONTRIBUTOR_STALE,
                    "connection refused",
                )))
            },
            vec![(
                types::CONTRIBUTIONS_ACCEPTED,
                "False",
                reasons::CONTRIBUTOR_STALE,
            )],
            |run| {
                let document = &run.plan.rendered.as_ref().expect("rendered").document;
                assert!(document.contains("192.0.2.10/32"), "{document}");
                assert!(
                    run.plan.contribution_store.is_none(),
                    "the store stays as it is"
                );
                let status = &run.status.contributors[0];
                assert_eq!(
                    (status.state.as_str(), status.last_read.as_deref()),
                    ("Stale", Some("2026-06-01T11:00:00Z"))
                );
            },
        ),
        owner(
            "a malformed fragment is refused whole and the previous one stays",
            TailnetObservation {
                contribution_store: BTreeMap::from([("cosmos".to_string(), stored)]),
                ..with_fragment(Ok("{\"apiVersion\": ".to_string()))
            },
            vec![(
                types::CONTRIBUTIONS_ACCEPTED,
                "False",
                reasons::CONTRIBUTOR_STALE,
            )],
            |run| {
                let status = &run.status.contributors[0];
                assert!(
                    status
                        .error
                        .as_deref()
                        .is_some_and(|e| e.contains("line 1, column")),
                    "{status:?}"
                );
                let document = &run.plan.rendered.as_ref().expect("rendered").document;
                assert!(document.contains("192.0.2.10/32"), "{document}");
            },
        ),
    ]
}

/// A contributor (`mode: Contribute`): its fragment published, live or not yet.
fn contributor_cases() -> Vec<Case> {
    let mut contributor = with_mode(PolicyMode::Contribute);
    contributor.spec.policy.tag_prefix = "cos".into();
    contributor.spec.policy.base_config_map = None;
    let contributing = |name, live_policy: &str, expect| Case {
        tailnet: contributor.clone(),
        more: |run: &Run| {
            assert!(
                run.plan.sync.is_none(),
                "a contributor never checks or writes the policy"
            );
            assert!(run.plan.approvals.is_empty());
            let fragment = run
                .plan
                .fragment
                .as_ref()
                .expect("the fragment is published");
            assert_eq!(
                fragment.metadata.name.as_deref(),
                Some("demo-policy-fragment")
            );
            assert!(conditions::find(&run.status.conditions, types::POLICY_APPLIED).is_none());
        },
        ..case(
            name,
            TailnetObservation {
                egresses: vec![egress()],
                nodes: Some(vec![router()]),
                live_policy: Some(live_policy.to_string()),
                ..observation()
            },
            expect,
        )
    };
    vec![
        contributing(
            "a contributor whose fragment is not live yet",
            "{}",
            vec![
                (types::FRAGMENT_LIVE, "False", reasons::FRAGMENT_NOT_LIVE),
                (types::READY, "False", reasons::FRAGMENT_NOT_LIVE),
            ],
        ),
        contributing(
            "a contributor whose fragment is live",
            r#"{"tagOwners": {"tag:cos-egress-team-a": ["group:platform"]},
                "grants": [{"src": ["tag:cos-egress-team-a"], "dst": ["192.0.2.10/32"], "ip": ["tcp:5432"]},
                           {"src": ["tag:cos-egress-team-a"], "dst": ["198.51.100.20/32"], "ip": ["tcp:443"]}],
                "autoApprovers": {"routes": {"192.0.2.0/24": ["tag:router"]}}}"#,
            vec![
                (types::FRAGMENT_LIVE, "True", reasons::FRAGMENT_LIVE),
                (types::READY, "True", reasons::READY),
            ],
        ),
    ]
}

#[test]
fn decision_table() {
    let started = std::time::Instant::now();
    let mut seen = BTreeSet::new();
    let cases: Vec<Case> = [
        headscale_cases(),
        base_cases(),
        policy_cases(),
        ownership_cases(),
        lockdown_cases(),
        race_cases(),
        dns_cases(),
        owner_contribution_cases(),
        contributor_cases(),
    ]
    .into_iter()
    .flatten()
    .collect();
    for case in cases {
        let run = drive_with(
            &case.tailnet,
            &case.observed,
            &case.config,
            case.check,
            case.set,
            case.fresh,
        );
        for (type_, status, reason) in &case.expect {
            let c = conditions::find(&run.status.conditions, type_).unwrap_or_else(|| {
                panic!("{}: no {type_} in {:?}", case.name, run.status.conditions)
            });
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                (*status, *reason),
                "{}: {type_}: {}",
                case.name,
                c.message
            );
            assert_eq!(c.observed_generation, Some(3), "{}", case.name);
        }
        (case.more)(&run);
        seen.extend(run.status.conditions.iter().map(|c| c.reason.clone()));
    }
    // InvalidSpec: only Ready, nothing else decided.
    let mut invalid = tailnet();
    invalid.spec.server = "ftp://headscale".to_string();
    let status = decide::refuse_invalid(&invalid, now()).expect("invalid spec");
    let ready = conditions::find(&status.conditions, types::READY).expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reasons::INVALID_SPEC)
    );
    assert!(ready.message.contains("spec.server"), "{}", ready.message);
    assert!(decide::refuse_invalid(&tailnet(), now()).is_none());
    seen.insert(ready.reason.clone());
    // Named in status.contributors[] lines, not as a condition's reason.
    seen.extend(budget_refusals_named());

    assert_every_reason_has_a_case(
        &seen,
        &[
            include_str!("decide.rs"),
            include_str!("dns.rs"),
            include_str!("gather.rs"),
            include_str!("contributions.rs"),
        ],
    );
    eprintln!("tailnet decision table: {:?}", started.elapsed());
}

#[test]
fn the_api_keys_expiry_is_shown_and_warned_once() {
    use super::observation::ApiKeyFacts;
    let key = |days: i64| ApiKeyFacts {
        prefix: "hskey-api-AbCdEf123456-***".to_string(),
        expiration: Some(
            now()
                .checked_add(jiff::SignedDuration::from_hours(24 * days))
                .expect("timestamp"),
        ),
    };
    let reachable = |run: &TailnetPlan| {
        run.conditions
            .get(types::HEADSCALE_REACHABLE)
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    // Far away: shown, no warning, no Event.
    let o = TailnetObservation {
        api_key: Some(key(90)),
        ..observation()
    };
    let plan = decide::plan(&tailnet(), &o, &config(), now());
    let message = reachable(&plan);
    assert!(
        message.contains(
            "the API key hskey-api-AbCdEf123456-*** expires 2026-08-30T12:00:00Z (in 90d 0h)"
        ),
        "{message}"
    );
    assert!(
        !message.contains(decide::API_KEY_EXPIRING_NOTE),
        "{message}"
    );
    assert!(plan.events.is_empty());
    // Within 14 days: a warning in HeadscaleReachable (still True: the key works) and one
    // Warning Event; the next reconcile, with that status, does not repeat the Event.
    let o = TailnetObservation {
        api_key: Some(key(1)),
        ..observation()
    };
    let run = drive(&tailnet(), &o, &config(), Ok(()), Ok(()));
    let c =
        conditions::find(&run.status.conditions, types::HEADSCALE_REACHABLE).expect("condition");
    assert_eq!(c.status, "True");
    assert!(
        c.message
            .contains("warning: the Headscale API key hskey-api-AbCdEf123456-*** expires"),
        "{}",
        c.message
    );
    assert!(c.message.contains("(in 1d 0h)"), "{}", c.message);
    assert!(
        c.message
            .contains("docs/prerequisites.md#rotating-the-api-key"),
        "{}",
        c.message
    );
    let events: Vec<_> = run
        .plan
        .events
        .iter()
        .map(|e| (e.type_, e.reason))
        .collect();
    assert_eq!(
        events,
        vec![(EventType::Warning, decide::API_KEY_EXPIRING_EVENT)]
    );
    let again = with_previous(tailnet(), run.status.clone());
    assert!(
        decide::plan(&again, &o, &config(), now()).events.is_empty(),
        "warned once"
    );
    // A key that does not expire says so; a key not in the list says nothing.
    let o = TailnetObservation {
        api_key: Some(ApiKeyFacts {
            prefix: "abcdefg***".into(),
            expiration: None,
        }),
        ..observation()
    };
    assert!(
        reachable(&decide::plan(&tailnet(), &o, &config(), now()))
            .contains("the API key abcdefg*** does not expire")
    );
    assert!(
        !reachable(&decide::plan(&tailnet(), &observation(), &config(), now())).contains("expire")
    );
}

#[test]
fn ready_follows_the_required_order() {
    // Headscale and the base both broken: Ready names Headscale first.
    let o = TailnetObservation {
        base: Err(Problem::new(reasons::CONFIG_MAP_NOT_FOUND, "no base")),
        ..unreachable(reasons::SECRET_MISSING)
    };
    let run = drive(&tailnet(), &o, &config(), Ok(()), Ok(()));
    let ready = conditions::find(&run.status.conditions, types::READY).expect("Ready");
    assert_eq!(ready.reason, reasons::SECRET_MISSING);
    assert!(
        ready.message.starts_with("HeadscaleReachable: "),
        "{}",
        ready.message
    );
    // The base broken, DryRun: BaseValid before PolicyApplied.
    let o = with_base(Err(Problem::new(reasons::KEY_MISSING, "no key")));
    let run = drive(
        &with_mode(PolicyMode::DryRun),
        &o,
        &config(),
        Ok(()),
        Ok(()),
    );
    let ready = conditions::find(&run.status.conditions, types::READY).expect("Ready");
    assert_eq!(ready.reason, reasons::KEY_MISSING);
}

#[test]
fn transition_times_stay_while_the_status_stays() {
    let first = drive(&tailnet(), &observation(), &config(), Ok(()), Ok(()));
    let later: Timestamp = "2026-06-01T13:00:00Z".parse().expect("timestamp");
    let t = with_previous(tailnet(), first.status.clone());
    let plan = decide::plan(&t, &observation(), &config(), later);
    let sync = plan.sync.clone().expect("sync");
    let outcome = match decide::after_check(&sync, Ok(()), &first.status) {
        PolicyStep::Put { event } => decide::after_set(&sync, event, Ok(())),
        PolicyStep::Done(o) => o,
    };
    let status = decide::finish(plan, Some(&outcome));
    for c in &status.conditions {
        assert_eq!(c.last_transition_time.0, now(), "{} moved", c.type_);
    }
}

#[test]
fn route_approvals_only_in_apply_with_approval_on_and_nodes_known() {
    let o = TailnetObservation {
        egresses: vec![egress()],
        nodes: Some(vec![router()]),
        ..observation()
    };
    let approvals = |t: &Tailnet, o: &TailnetObservation, config: &OperatorConfig| {
        decide::plan(t, o, config, now()).approvals
    };
    let apply = approvals(&tailnet(), &o, &config());
    assert_eq!(apply.len(), 1, "{apply:?}");
    assert_eq!(apply[0].node_id, 7);
    assert_eq!(
        decide::routes_approved_note(&apply[0]),
        "approved 192.0.2.0/24 on node site-router (id 7)"
    );
    assert!(approvals(&with_mode(PolicyMode::DryRun), &o, &config()).is_empty());
    let off = OperatorConfig {
        approve_routes: false,
        ..config()
    };
    assert!(approvals(&tailnet(), &o, &off).is_empty());
    // Approval off: no autoApprovers in the document either.
    let document = decide::plan(&tailnet(), &o, &off, now())
        .sync
        .expect("sync")
        .document;
    assert!(!document.contains("192.0.2.0/24"), "{document}");
    let unknown_nodes = TailnetObservation {
        nodes: None,
        ..o.clone()
    };
    assert!(approvals(&tailnet(), &unknown_nodes, &config()).is_empty());
}

#[test]
fn dns_config_map_written_only_on_change_and_owned_only_if_ours() {
    let o = TailnetObservation {
        egresses: vec![egress()],
        egress_cluster_ips: BTreeMap::from([(
            ObjectKey::new("tailnet-system", "remote-db"),
            "10.96.0.20".parse().expect("ip"),
        )]),
        ..observation()
    };
    let written = decide::plan(&tailnet(), &o, &config(), now())
        .dns
        .expect("new ConfigMap");
    let keys = written.data.clone().unwrap_or_default();
    // Same keys already there: nothing to write.
    let same = TailnetObservation {
        dns_config_map: Some(CurrentDns {
            keys: keys.clone(),
            owner_uids: vec![],
        }),
        ..o.clone()
    };
    assert!(
        decide::plan(&tailnet(), &same, &config(), now())
            .dns
            .is_none()
    );
    // Someone else's ConfigMap with stale keys: written, but not owned by the Tailnet.
    let shared = TailnetObservation {
        dns_config_map: Some(CurrentDns {
            keys: BTreeMap::from([("hosts".to_string(), "stale".to_string())]),
            owner_uids: vec!["someone-else".to_string()],
        }),
        ..o.clone()
    };
    let cm = decide::plan(&tailnet(), &shared, &config(), now())
        .dns
        .expect("changed");
    assert!(cm.metadata.owner_references.is_none());
    assert_eq!(
        cm.data.as_ref().map(BTreeMap::len),
        Some(3),
        "only our three keys are applied"
    );
    // Ours with stale keys: written and owned.
    let ours = TailnetObservation {
        dns_config_map: Some(CurrentDns {
            keys: BTreeMap::new(),
            owner_uids: vec!["tailnet-uid".to_string()],
        }),
        ..o
    };
    let cm = decide::plan(&tailnet(), &ours, &config(), now())
        .dns
        .expect("changed");
    assert!(cm.metadata.owner_references.is_some());
}

fn policy_data(document: &str, diff: &str, summary: &str) -> BTreeMap<String, String> {
    rendered_policy_data(decide::RenderedPolicyData {
        document,
        diff,
        summary,
        notices: &[],
    })
}

#[test]
fn rendered_policy_data_fits_the_configmap_limit() {
    let small = policy_data("{}", "+a\n", "1 grant");
    assert_eq!(small.get("diff").map(String::as_str), Some("+a\n"));
    assert_eq!(small.get(BASE_POLICY_KEY).map(String::as_str), Some("{}"));
    // Document and diff together too big: the diff goes, the document stays.
    let document = "x".repeat(600_000);
    let diff = "+".repeat(500_000);
    let data = policy_data(&document, &diff, "s");
    assert_eq!(data.get(BASE_POLICY_KEY), Some(&document));
    let diff_value = data.get("diff").cloned().unwrap_or_default();
    assert!(
        diff_value.starts_with("omitted: the diff is 500000 bytes"),
        "{diff_value}"
    );
    // The document alone too big: both go, the summary stays.
    let huge = "x".repeat(1_200_000);
    let data = policy_data(&huge, "", "s");
    let document_value = data.get(BASE_POLICY_KEY).cloned().unwrap_or_default();
    assert!(
        document_value.starts_with("omitted: the rendered document is 1200000 bytes"),
        "{document_value}"
    );
    assert_eq!(data.get("summary").map(String::as_str), Some("s"));
    let total: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(total <= 1_048_576);
}

#[test]
fn diff_helpers() {
    let diff = "--- live\n+++ rendered\n@@ -1,2 +1,2 @@\n-old line\n+new line\n context\n";
    assert_eq!(decide::diff_stats(diff), (1, 1));
    assert_eq!(decide::lost_lines(diff, 10), "old line");
    let many: String = (0..15).map(|i| format!("-line {i}\n")).collect();
    assert!(decide::lost_lines(&many, 3).ends_with("… (12 more lines)"));
}

/// The controller path of a contested DNS name: the `{name}` alias of two `portal` ingresses.
/// The older ingress keeps it in the hosts ConfigMap (as it keeps it in the agent's names),
/// although the newer ingress's node got the lower tailnet address.
#[test]
fn a_contested_dns_name_goes_to_the_first_claim_not_the_lowest_address() {
    let mut t = tailnet();
    if let Some(dns) = t.spec.dns.as_mut() {
        dns.ingress_alias_template = Some("{name}.lab.example.net".to_string());
    }
    let ingress = |namespace: &str, created: &str| -> tailnet_api::TailnetIngress {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1",
            "kind": "TailnetIngress",
            "metadata": {"name": "portal", "namespace": namespace, "uid": format!("{namespace}-uid"),
                         "creationTimestamp": created},
            "spec": {
                "tailnetRef": {"name": "demo"},
                "allowFrom": ["group:platform"],
                "exposes": [{"name": "web", "dnsLabel": "portal", "alias": true, "mode": "tcp",
                             "port": 443, "backend": {"service": "frontend", "port": 8080}}]
            }
        }))
        .expect("ingress fixture")
    };
    let older = ingress("team-b", "2026-01-01T00:00:00Z");
    let newer = ingress("team-a", "2026-01-02T00:00:00Z");
    let prefix = &t.spec.policy.tag_prefix;
    let node = |id, namespace: &str, ip: &str| ObservedNode {
        id,
        name: format!("agent-{namespace}"),
        tags: vec![tailnet_api::naming::ingress_tag(
            prefix, namespace, "portal",
        )],
        ip_addresses: vec![ip.parse().expect("ip")],
        available_routes: vec![],
        approved_routes: vec![],
        online: true,
    };
    let observed = TailnetObservation {
        ingresses: vec![newer, older],
        nodes: Some(vec![
            node(2, "team-a", "100.64.0.2"),
            node(9, "team-b", "100.64.0.9"),
        ]),
        ..observation()
    };
    let plan = decide::plan(&t, &observed, &config(), now());
    // Tailnet addresses are for tailnet clients (the extra records): split horizon.
    let records = plan
        .dns
        .as_ref()
        .and_then(|cm| cm.data.as_ref())
        .and_then(|d| d.get("extra-records.json"))
        .cloned()
        .expect("extra records");
    let records: Vec<serde_json::Value> = serde_json::from_str(&records).expect("json");
    let alias: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| r["name"] == "portal.lab.example.net")
        .map(|r| &r["value"])
        .collect();
    assert_eq!(alias, ["100.64.0.9"], "{records:?}");
    let c = plan.conditions.clone().finish(&super::role::REQUIRED, &[]);
    let dns = conditions::find(&c, types::DNS_RENDERED).expect("DNSRendered");
    assert!(
        dns.message
            .contains("kept by their first owner: portal.lab.example.net"),
        "{}",
        dns.message
    );
}

#[test]
fn insecure_server_is_plain_http_outside_loopback_and_the_cluster() {
    for (server, insecure) in [
        ("http://headscale.example.net", true),
        ("http://headscale.example.net:8080/", true),
        ("http://10.0.0.5:8080", true),
        ("http://[fd00::5]:8080", true),
        ("http://headscale.svc.example.net", true),
        ("http://cluster.local.example.net", true),
        ("https://headscale.example.net", false),
        ("http://127.0.0.1:8080", false),
        ("http://127.1.2.3", false),
        ("http://[::1]:8080", false),
        ("http://localhost:8080", false),
        ("http://LOCALHOST", false),
        ("http://headscale.headscale.svc", false),
        ("http://headscale.headscale.svc:8080", false),
        ("http://headscale.headscale.svc.cluster.local:8080", false),
        ("http://headscale.headscale.cluster.local", false),
    ] {
        assert_eq!(decide::insecure_server(server), insecure, "{server}");
    }
}

/// Issue 26 item 6: a failed Headscale node list keeps the last known DNS names (the
/// ConfigMap is not rewritten; before, every ingress name went pending and was dropped), and
/// a pending owner name stays the owner's claim (before, a contributor could take it).
#[test]
fn a_failed_node_list_keeps_the_dns_names_and_pending_names_stay_claimed() {
    let mut t = owner_of_cosmos();
    if let Some(dns) = t.spec.dns.as_mut() {
        dns.ingress_alias_template = Some("{name}.cosmos.example.net".to_string());
    }
    let ingress: tailnet_api::TailnetIngress = serde_json::from_value(serde_json::json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1",
        "kind": "TailnetIngress",
        "metadata": {"name": "portal", "namespace": "team-a", "uid": "portal-uid",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "tailnetRef": {"name": "demo"},
            "allowFrom": ["group:platform"],
            "exposes": [{"name": "web", "dnsLabel": "portal", "alias": true, "mode": "tcp",
                         "port": 443, "backend": {"service": "frontend", "port": 8080}}]
        }
    }))
    .expect("ingress fixture");
    let agent = ObservedNode {
        id: 2,
        name: "agent-team-a".to_string(),
        tags: vec![tailnet_api::naming::ingress_tag(
            &t.spec.policy.tag_prefix,
            "team-a",
            "portal",
        )],
        ip_addresses: vec!["100.64.0.2".parse().expect("ip")],
        available_routes: vec![],
        approved_routes: vec![],
        online: true,
    };
    let cosmos_node = ObservedNode {
        id: 5,
        name: "cosmos-agent".to_string(),
        tags: vec!["tag:cos-egress-site".to_string()],
        ip_addresses: vec!["100.64.0.5".parse().expect("ip")],
        available_routes: vec![],
        approved_routes: vec![],
        online: true,
    };
    let hosts_of = |plan: &TailnetPlan| {
        plan.dns
            .as_ref()
            .and_then(|cm| cm.data.as_ref())
            .and_then(|d| d.get("hosts"))
            .cloned()
            .unwrap_or_default()
    };
    let listed = TailnetObservation {
        ingresses: vec![ingress.clone()],
        nodes: Some(vec![agent.clone(), cosmos_node.clone()]),
        ..observation()
    };
    let written = decide::plan(&t, &listed, &config(), now());
    let records = written
        .dns
        .as_ref()
        .and_then(|cm| cm.data.as_ref())
        .and_then(|d| d.get("extra-records.json"))
        .cloned()
        .unwrap_or_default();
    assert!(
        records.contains("portal.cosmos.example.net") && records.contains("100.64.0.2"),
        "{records}"
    );
    let keys = written
        .dns
        .as_ref()
        .and_then(|cm| cm.data.clone())
        .expect("keys");

    // The node list fails: the ConfigMap keeps what it has, DNSRendered says why.
    let failed = TailnetObservation {
        nodes: None,
        dns_config_map: Some(CurrentDns {
            keys,
            owner_uids: vec!["tailnet-uid".to_string()],
        }),
        ..listed.clone()
    };
    let plan = decide::plan(&t, &failed, &config(), now());
    assert!(
        plan.dns.is_none(),
        "the DNS ConfigMap was rewritten without the node list: {}",
        hosts_of(&plan)
    );
    let c = plan.conditions.clone().finish(&super::role::REQUIRED, &[]);
    let dns = conditions::find(&c, types::DNS_RENDERED).expect("DNSRendered");
    assert_eq!(
        (dns.status.as_str(), dns.reason.as_str()),
        ("Unknown", reasons::HEADSCALE_UNREACHABLE)
    );
    assert!(
        dns.message.contains("keeps its last entries"),
        "{}",
        dns.message
    );

    // The owner's agent has no node yet (its name is pending): cosmos claims the same name
    // for its own node and is refused.
    let mut fragment: serde_json::Value =
        serde_json::from_str(&cosmos_fragment("192.0.2.10/32")).expect("fragment");
    fragment["dnsRecords"] = serde_json::json!([
        {"name": "portal.cosmos.example.net", "type": "A", "value": "100.64.0.5"}
    ]);
    let pending = TailnetObservation {
        nodes: Some(vec![cosmos_node]),
        ..with_fragment(Ok(fragment.to_string()))
    };
    let pending = TailnetObservation {
        ingresses: vec![ingress],
        ..pending
    };
    let plan = decide::plan(&t, &pending, &config(), now());
    let status = plan
        .status
        .contributors
        .iter()
        .find(|s| s.name == "cosmos")
        .expect("cosmos status");
    assert!(
        status
            .refused
            .iter()
            .any(|r| r.contains("portal.cosmos.example.net")),
        "a contributor took the owner's pending name: {status:?}"
    );
    assert!(
        !hosts_of(&plan).contains("portal.cosmos.example.net"),
        "{}",
        hosts_of(&plan)
    );
}

/// Issue 26 item 4: Headscale refuses the merged document (here: cosmos grants to a host
/// alias the base does not define), and accepts it without cosmos's entries. The owner
/// applies that one — its own egress's grant included —, cosmos's `status.contributors[]`
/// entry and `ContributionsAccepted` carry Headscale's reason, and nothing of cosmos's new
/// fragment is persisted as last accepted. Before: the check's refusal stopped the whole sync
/// (`PolicyApplied` Rejected, nothing applied) and the store kept the refused fragment.
#[test]
fn a_contributor_headscale_refuses_is_left_out_and_the_owner_applies() {
    let t = owner_of_cosmos();
    let mut fragment: serde_json::Value =
        serde_json::from_str(&cosmos_fragment("192.0.2.10/32")).expect("fragment");
    fragment["grants"][0]["dst"] = serde_json::json!(["db.site.internal"]);
    let mut config = config();
    config.approve_routes = false;
    let mut t = t;
    t.spec.policy.contributors[0].limits.egress_destinations =
        vec!["192.0.2.0/24".into(), "db.site.internal".into()];
    let o = TailnetObservation {
        egresses: vec![egress()],
        live_policy: Some(String::new()),
        ..with_fragment(Ok(fragment.to_string()))
    };
    let previous = t.status.clone().unwrap_or_default();
    let mut plan = decide::plan(&t, &o, &config, now());
    let merged = plan.sync.as_ref().expect("a sync").document.clone();
    assert!(merged.contains("db.site.internal"), "{merged}");
    assert_eq!(plan.exclusions.len(), 1, "one contributor: one exclusion");
    assert!(
        plan.contribution_store.is_some(),
        "the merge wants cosmos's fragment stored"
    );
    // Headscale: the merged document is refused, the one without cosmos accepted.
    let reason = r#"host "db.site.internal" is not defined in the policy"#;
    let without = plan.exclusions[0].sync.document.clone();
    assert!(!without.contains("db.site.internal") && !without.contains("tag:cos-"));
    assert!(
        without.contains("192.0.2.10"),
        "the owner's own grant stays: {without}"
    );
    decide::exclude(&mut plan, 0, reason);
    let sync = plan.sync.clone().expect("sync");
    assert_eq!(sync.document, without);
    let outcome = match decide::after_check(&sync, Ok(()), &previous) {
        PolicyStep::Put { event } => decide::after_set(&sync, event, Ok(())),
        PolicyStep::Done(outcome) => outcome,
    };
    assert!(
        plan.contribution_store.is_none(),
        "nothing of cosmos is persisted as accepted"
    );
    let status = decide::finish(plan, Some(&outcome));
    let applied = conditions::find(&status.conditions, types::POLICY_APPLIED).expect("applied");
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("True", reasons::APPLIED),
        "{}",
        applied.message
    );
    assert_eq!(
        status.policy.as_ref().and_then(|p| p.applied_hash.clone()),
        Some(decide::sha256(&without))
    );
    let cosmos = &status.contributors[0];
    assert_eq!(cosmos.state, "Refused");
    assert!(cosmos.refused[0].contains(reason), "{:?}", cosmos.refused);
    assert!(cosmos.merged_hash.is_none());
    let accepted = conditions::find(&status.conditions, types::CONTRIBUTIONS_ACCEPTED)
        .expect("ContributionsAccepted");
    assert_eq!(accepted.reason, reasons::CONTRIBUTION_REFUSED);
    assert!(
        accepted.message.contains("cosmos") && accepted.message.contains(reason),
        "{}",
        accepted.message
    );
}

/// Issue 26 item 4: when Headscale refuses the merged document and no exclusion helps (here
/// the scripted refusal covers everything), the store is not written: the refused fragment
/// is not persisted as last accepted. Before, the store was written whatever Headscale said.
#[test]
fn a_refused_document_persists_nothing_as_accepted() {
    let t = owner_of_cosmos();
    let o = with_fragment(Ok(cosmos_fragment("192.0.2.10/32")));
    let run = drive(&t, &o, &config(), rejected("no"), Ok(()));
    let mut plan = run.plan.clone();
    assert!(
        plan.contribution_store.is_some(),
        "the merge wants it stored"
    );
    decide::keep_store_unless_accepted(&mut plan, run.outcome.as_ref());
    assert!(plan.contribution_store.is_none());
    let accepted = drive(&t, &o, &config(), Ok(()), Ok(()));
    let mut plan = accepted.plan.clone();
    decide::keep_store_unless_accepted(&mut plan, accepted.outcome.as_ref());
    assert!(plan.contribution_store.is_some(), "accepted: stored");
}

/// `count` DNS records of `cosmos`, all pointing at its node 100.64.0.5, with long valid names
/// (`r0000.aaa….bbb….ccc….cosmos.example.net`, 207 characters) sorted as their numbers.
fn cosmos_fragment_with_records(count: usize) -> String {
    let labels = ["a", "b", "c"].map(|l| l.repeat(60)).join(".");
    let records: Vec<serde_json::Value> = (0..count)
        .map(|i| {
            serde_json::json!({"name": format!("r{i:04}.{labels}.cosmos.example.net"),
                               "type": "A", "value": "100.64.0.5"})
        })
        .collect();
    let mut fragment: serde_json::Value =
        serde_json::from_str(&cosmos_fragment("192.0.2.10/32")).expect("fragment");
    fragment["dnsRecords"] = serde_json::Value::Array(records);
    fragment.to_string()
}

fn cosmos_node() -> ObservedNode {
    ObservedNode {
        id: 5,
        name: "cosmos-agent".to_string(),
        tags: vec!["tag:cos-egress-site".to_string()],
        ip_addresses: vec!["100.64.0.5".parse().expect("ip")],
        available_routes: vec![],
        approved_routes: vec![],
        online: true,
    }
}

/// The budget refusals the two budget scenarios name in `status.contributors[]`.
fn budget_refusals_named() -> BTreeSet<String> {
    let lines = |plan: TailnetPlan| -> Vec<String> {
        plan.status
            .contributors
            .into_iter()
            .flat_map(|s| s.refused.into_iter().chain(s.error))
            .collect()
    };
    let mut all = lines(over_dns_budget());
    all.extend(lines(over_store_share(true)));
    [reasons::DNS_BUDGET_EXCEEDED, reasons::STORE_BUDGET_EXCEEDED]
        .into_iter()
        .filter(|reason| all.iter().any(|line| line.starts_with(reason)))
        .map(str::to_string)
        .collect()
}

/// The owner merging a `cosmos` fragment with 700 long DNS records (about 1.6 MiB of DNS
/// ConfigMap if all were written).
fn over_dns_budget() -> TailnetPlan {
    let observed = TailnetObservation {
        nodes: Some(vec![cosmos_node()]),
        ..with_fragment(Ok(cosmos_fragment_with_records(700)))
    };
    decide::plan(&owner_of_cosmos(), &observed, &config(), now())
}

/// The owner merging a `cosmos` fragment over its store share, with or without a previously
/// stored one.
fn over_store_share(previously_stored: bool) -> TailnetPlan {
    let big = cosmos_fragment_with_records(1300);
    assert!(big.len() > super::contributions::STORE_SHARE_BYTES);
    let observed = TailnetObservation {
        nodes: Some(vec![cosmos_node()]),
        contribution_store: if previously_stored {
            BTreeMap::from([("cosmos".to_string(), stored_cosmos())])
        } else {
            BTreeMap::new()
        },
        ..with_fragment(Ok(big))
    };
    decide::plan(&owner_of_cosmos(), &observed, &config(), now())
}

/// Issue 26 item 6: a contributor whose DNS records would bring the DNS ConfigMap over its
/// budget gets the records that do not fit refused, named `DnsBudgetExceeded`; the ones
/// that fit (sorted first) stay, the ConfigMap stays well under Kubernetes' 1 MiB, and the
/// status lists at most 20 refused lines and counts the rest. Before: every record was
/// written, whatever the size (700 of these names: about 1.6 MiB of ConfigMap).
#[test]
fn a_contributor_over_the_dns_budget_gets_the_excess_refused_by_name() {
    let plan = over_dns_budget();
    let data = plan
        .dns
        .as_ref()
        .and_then(|cm| cm.data.clone())
        .expect("DNS ConfigMap");
    // Split horizon: contributed records (tailnet addresses) go to the extra records only.
    let records = data.get("extra-records.json").cloned().unwrap_or_default();
    assert!(records.contains("\"r0000."), "the first records fit");
    assert!(
        !records.contains("\"r0699."),
        "the last records are over the budget"
    );
    let total: usize = data.values().map(String::len).sum();
    assert!(
        total <= super::contributions::DNS_BUDGET_BYTES,
        "{total} bytes in the DNS ConfigMap"
    );
    let status = &plan.status.contributors[0];
    assert_eq!(status.state, "PartlyRefused", "{status:?}");
    assert_eq!(status.refused.len(), 21, "20 listed and a count");
    assert!(
        status.refused[0].starts_with(reasons::DNS_BUDGET_EXCEEDED),
        "{}",
        status.refused[0]
    );
    assert!(
        status.refused[20].starts_with("… and "),
        "{}",
        status.refused[20]
    );
    let c = plan.conditions.clone().finish(&super::role::REQUIRED, &[]);
    let accepted = conditions::find(&c, types::CONTRIBUTIONS_ACCEPTED).expect("condition");
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("False", reasons::CONTRIBUTION_REFUSED)
    );
    assert!(accepted.message.contains(reasons::DNS_BUDGET_EXCEEDED));
    for condition in &c {
        assert!(
            condition.message.len() <= tailnet_api::bounded::MAX_MESSAGE_BYTES,
            "{}: {} bytes",
            condition.type_,
            condition.message.len()
        );
    }
    // The grant (not a DNS record) is merged all the same.
    let document = &plan.rendered.as_ref().expect("rendered").document;
    assert!(document.contains("contributor cosmos: TailnetEgress/ops/site"));
}

/// Issue 26 item 6: a fragment over its share of the contributions store is not stored as
/// accepted; the previously accepted one stays in force and in the store, and the refusal is
/// named `StoreBudgetExceeded`. Before: any fragment that parsed was stored (several of
/// these pass the store ConfigMap's 1 MiB).
#[test]
fn a_fragment_over_its_store_share_is_not_stored_and_the_previous_stays() {
    let plan = over_store_share(true);
    assert!(
        plan.contribution_store.is_none(),
        "the store keeps the previous fragment (unchanged)"
    );
    let status = &plan.status.contributors[0];
    assert_eq!(status.state, "Stale", "{status:?}");
    assert_eq!(status.merged_hash.as_deref(), Some("h1"));
    let error = status.error.as_deref().unwrap_or_default();
    assert!(error.starts_with(reasons::STORE_BUDGET_EXCEEDED), "{error}");
    let c = plan.conditions.clone().finish(&super::role::REQUIRED, &[]);
    let accepted = conditions::find(&c, types::CONTRIBUTIONS_ACCEPTED).expect("condition");
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("False", reasons::CONTRIBUTION_REFUSED)
    );
    // The stored fragment (its grant) stays merged; none of the new records is.
    let document = &plan.rendered.as_ref().expect("rendered").document;
    assert!(document.contains("contributor cosmos: TailnetEgress/ops/site"));
    assert!(
        plan.dns
            .as_ref()
            .and_then(|cm| cm.data.as_ref())
            .and_then(|d| d.get("hosts"))
            .is_none_or(|hosts| !hosts.contains("r0000."))
    );

    // Without a stored fragment, nothing of it is merged.
    let plan = over_store_share(false);
    assert_eq!(plan.status.contributors[0].state, "Refused");
    assert!(plan.contribution_store.is_none());
}
