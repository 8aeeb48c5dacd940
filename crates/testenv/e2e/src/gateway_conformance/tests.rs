use std::collections::HashMap;

use super::*;

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

fn config(pairs: &[(&str, &str)]) -> Result<RunnerConfig, ConformanceError> {
    RunnerConfig::from_vars(vars(pairs), Path::new("/t/gwc"), "0.1.0")
}

fn refused(pairs: &[(&str, &str)], variable: &str) -> String {
    match config(pairs) {
        Err(ConformanceError::Setting {
            variable: got,
            reason,
        }) => {
            assert_eq!(got, variable, "{reason}");
            reason
        }
        other => panic!("{pairs:?} must be refused for {variable}, got {other:?}"),
    }
}

#[test]
fn defaults_run_the_three_profiles_with_the_core_features_and_a_report_under_the_dir() {
    let config = config(&[]).expect("defaults");
    assert_eq!(config.run.gateway_class, "tailnet");
    assert_eq!(
        config.run.profiles,
        ["GATEWAY-HTTP", "GATEWAY-TLS", "GATEWAY-TCP"]
    );
    assert_eq!(
        config.run.supported_features,
        [
            "Gateway",
            "HTTPRoute",
            "ReferenceGrant",
            "TLSRoute",
            "TCPRoute"
        ]
    );
    assert_eq!(config.run.report, PathBuf::from("/t/gwc/report.yaml"));
    assert_eq!(config.log, PathBuf::from("/t/gwc/report.log"));
    assert_eq!(config.acceptance, ClassAcceptance::Controller);
    assert!(config.operator);
    assert_eq!(config.deadline, Duration::from_secs(3 * 3600));
    assert_eq!(config.run.implementation.version, "0.1.0");
    assert!(config.run.timeouts.is_empty());
    assert!(config.run.extra_args.is_empty());
}

#[test]
fn every_setting_is_read_and_blank_ones_mean_the_default() {
    let config = config(&[
        ("TNO_GATEWAY_CONFORMANCE_REPORT", "/abs/out.yaml"),
        ("TNO_GATEWAY_CONFORMANCE_PROFILES", "GATEWAY-HTTP"),
        (
            "TNO_GATEWAY_CONFORMANCE_FEATURES",
            " Gateway, HTTPRoute ,GatewayPort8080,",
        ),
        (
            "TNO_GATEWAY_CONFORMANCE_TIMEOUTS",
            "GWCMustBeAccepted:30; GatewayMustHaveCondition : 45",
        ),
        (
            "TNO_GATEWAY_CONFORMANCE_ARGS",
            " -run-test=HTTPRouteSimpleSameNamespace  -cleanup-base-resources=false ",
        ),
        ("TNO_GATEWAY_CONFORMANCE_CLASS_STATUS", "stand-in"),
        ("TNO_GATEWAY_CONFORMANCE_OPERATOR", "off"),
        ("TNO_GATEWAY_CONFORMANCE_DEADLINE", "600"),
        ("TNO_GATEWAY_CONFORMANCE_VERSION", "v0.2.0-rc.1"),
    ])
    .expect("valid settings");
    assert_eq!(config.run.report, PathBuf::from("/abs/out.yaml"));
    assert_eq!(config.log, PathBuf::from("/abs/out.log"));
    assert_eq!(config.run.profiles, ["GATEWAY-HTTP"]);
    assert_eq!(
        config.run.supported_features,
        ["Gateway", "HTTPRoute", "GatewayPort8080"]
    );
    assert_eq!(
        config.run.timeouts,
        [
            ("GWCMustBeAccepted".to_string(), 30),
            ("GatewayMustHaveCondition".to_string(), 45)
        ]
    );
    assert_eq!(
        config.run.extra_args,
        [
            "-run-test=HTTPRouteSimpleSameNamespace",
            "-cleanup-base-resources=false"
        ]
    );
    assert_eq!(config.acceptance, ClassAcceptance::StandIn);
    assert!(!config.operator);
    assert_eq!(config.deadline, Duration::from_secs(600));
    assert_eq!(config.run.implementation.version, "v0.2.0-rc.1");

    let relative = RunnerConfig::from_vars(
        vars(&[
            ("TNO_GATEWAY_CONFORMANCE_REPORT", "runs/one.yaml"),
            ("TNO_GATEWAY_CONFORMANCE_CLASS_STATUS", "controller"),
            ("TNO_GATEWAY_CONFORMANCE_OPERATOR", "on"),
            ("TNO_GATEWAY_CONFORMANCE_FEATURES", "  "),
        ]),
        Path::new("/t/gwc"),
        "0.1.0",
    )
    .expect("valid");
    assert_eq!(relative.run.report, PathBuf::from("/t/gwc/runs/one.yaml"));
    assert_eq!(relative.acceptance, ClassAcceptance::Controller);
    assert!(relative.operator);
    assert_eq!(relative.run.supported_features.len(), CORE_FEATURES.len());
}

#[test]
fn malformed_settings_are_refused_with_their_variable() {
    let cases: &[(&str, &str)] = &[
        ("TNO_GATEWAY_CONFORMANCE_CLASS_STATUS", "accepted"),
        ("TNO_GATEWAY_CONFORMANCE_OPERATOR", "yes"),
        ("TNO_GATEWAY_CONFORMANCE_FEATURES", "Gateway;HTTPRoute"),
        ("TNO_GATEWAY_CONFORMANCE_FEATURES", "Gateway,HTTP Route"),
        ("TNO_GATEWAY_CONFORMANCE_FEATURES", ",,,"),
        ("TNO_GATEWAY_CONFORMANCE_FEATURES", "9Gateway"),
        ("TNO_GATEWAY_CONFORMANCE_PROFILES", "GATEWAY_HTTP=1"),
        ("TNO_GATEWAY_CONFORMANCE_TIMEOUTS", "GatewayTimeout:30"),
        ("TNO_GATEWAY_CONFORMANCE_TIMEOUTS", "GWCMustBeAccepted=30"),
        ("TNO_GATEWAY_CONFORMANCE_TIMEOUTS", "GWCMustBeAccepted:0"),
        ("TNO_GATEWAY_CONFORMANCE_TIMEOUTS", "GWCMustBeAccepted:1m"),
        ("TNO_GATEWAY_CONFORMANCE_TIMEOUTS", ";;"),
        ("TNO_GATEWAY_CONFORMANCE_ARGS", "-v extra"),
        ("TNO_GATEWAY_CONFORMANCE_DEADLINE", "0"),
        ("TNO_GATEWAY_CONFORMANCE_DEADLINE", "86401"),
        ("TNO_GATEWAY_CONFORMANCE_DEADLINE", "-5"),
    ];
    for (variable, value) in cases {
        refused(&[(variable, value)], variable);
    }
    let long = "x".repeat(MAX_VALUE_LEN + 1);
    refused(
        &[("TNO_GATEWAY_CONFORMANCE_REPORT", long.as_str())],
        "TNO_GATEWAY_CONFORMANCE_REPORT",
    );
    let many = vec!["Gateway"; MAX_LIST_ITEMS + 1].join(",");
    refused(
        &[("TNO_GATEWAY_CONFORMANCE_FEATURES", many.as_str())],
        "TNO_GATEWAY_CONFORMANCE_FEATURES",
    );
    let reason = refused(
        &[("TNO_GATEWAY_CONFORMANCE_TIMEOUTS", "Nope:3")],
        "TNO_GATEWAY_CONFORMANCE_TIMEOUTS",
    );
    assert!(reason.contains("GWCMustBeAccepted"), "{reason}");
}

#[test]
fn every_timeout_name_is_accepted() {
    let text: Vec<String> = TIMEOUT_NAMES
        .iter()
        .map(|name| format!("{name}:7"))
        .collect();
    let timeouts = parse_timeouts(&text.join(";")).expect("all names");
    assert_eq!(timeouts.len(), TIMEOUT_NAMES.len());
    assert!(timeouts.iter().all(|(_, seconds)| *seconds == 7));
}

#[test]
fn args_carry_class_profiles_features_metadata_report_timeouts_then_extras() {
    let run = SuiteRun {
        gateway_class: "tailnet".into(),
        profiles: vec!["GATEWAY-HTTP".into(), "GATEWAY-TCP".into()],
        supported_features: vec!["Gateway".into(), "HTTPRoute".into()],
        implementation: Implementation::tailnet_operator("0.1.0"),
        report: PathBuf::from("/out/report.yaml"),
        timeouts: vec![
            ("GWCMustBeAccepted".into(), 30),
            ("RequestTimeout".into(), 5),
        ],
        extra_args: vec!["-run-test=HTTPRouteSimpleSameNamespace".into()],
    };
    assert_eq!(
        run.args(),
        [
            "-v",
            "-gateway-class=tailnet",
            "-conformance-profiles=GATEWAY-HTTP,GATEWAY-TCP",
            "-supported-features=Gateway,HTTPRoute",
            "-organization=tailnet-operator",
            "-project=tailnet-operator",
            "-url=https://github.com/tailnet-operator/tailnet-operator",
            "-version=0.1.0",
            "-contact=https://github.com/tailnet-operator/tailnet-operator/issues",
            "-report-output=/out/report.yaml",
            "-timeout-config-overrides=GWCMustBeAccepted:30;RequestTimeout:5",
            "-run-test=HTTPRouteSimpleSameNamespace",
        ]
    );
    let plain = SuiteRun {
        timeouts: Vec::new(),
        extra_args: Vec::new(),
        ..run
    };
    assert!(
        !plain
            .args()
            .iter()
            .any(|arg| arg.starts_with("-timeout-config-overrides"))
    );
    assert_eq!(plain.args().len(), 10);
}

#[test]
fn gateway_class_names_our_controller_and_the_stand_in_says_who_accepted_it() {
    let parameters = ClassParameters {
        namespace: "gwc-1",
        name: "tailnet",
        tailnet: "conformance",
        allow_from: &["group:team-a"],
    };
    let class = gateway_class_object("tailnet", &parameters);
    assert_eq!(
        class["spec"]["parametersRef"],
        json!({"group": "tailnet-operator.dev", "kind": "TailnetGatewayParameters",
               "name": "tailnet", "namespace": "gwc-1"})
    );
    let object = gateway_parameters_object(&parameters);
    assert_eq!(object["metadata"]["namespace"], "gwc-1");
    assert_eq!(object["spec"]["tailnetRef"]["name"], "conformance");
    assert_eq!(object["spec"]["allowFrom"], json!(["group:team-a"]));
    assert_eq!(class["kind"], "GatewayClass");
    assert_eq!(class["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(class["metadata"]["name"], "tailnet");
    assert_eq!(
        class["spec"]["controllerName"],
        "tailnet-operator.dev/gateway"
    );
    let description = class["spec"]["description"].as_str().unwrap_or_default();
    assert!(
        !description.is_empty() && description.len() <= 64,
        "{description:?}"
    );
    let status = stand_in_class_status(3, "2026-12-05T09:00:00Z");
    let condition = &status["status"]["conditions"][0];
    assert_eq!(condition["type"], "Accepted");
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["observedGeneration"], 3);
    assert_eq!(condition["lastTransitionTime"], "2026-12-05T09:00:00Z");
    assert!(
        condition["message"]
            .as_str()
            .is_some_and(|m| m.contains("stand-in"))
    );
}

const GO_TEST_LOG: &str = "\
=== RUN   TestConformance
    suite.go:390: Test Setup: Ensuring GatewayClass has been accepted
=== RUN   TestConformance/HTTPRouteSimpleSameNamespace
=== RUN   TestConformance/HTTPRouteSimpleSameNamespace/0_request_to_'/'
    --- PASS: TestConformance/HTTPRouteSimpleSameNamespace (3.10s)
        --- PASS: TestConformance/HTTPRouteSimpleSameNamespace/0_request_to_'/' (0.20s)
    --- FAIL: TestConformance/TCPRouteSimple (60.00s)
        --- FAIL: TestConformance/TCPRouteSimple/echo (60.00s)
    --- SKIP: TestConformance/UDPRouteSimple (0.00s)
--- FAIL: TestConformance (63.40s)
FAIL
";

#[test]
fn subtest_outcomes_are_the_suites_tests_only() {
    assert_eq!(
        subtest_outcomes(GO_TEST_LOG),
        [
            ("HTTPRouteSimpleSameNamespace".to_string(), Outcome::Pass),
            ("TCPRouteSimple".to_string(), Outcome::Fail),
            ("UDPRouteSimple".to_string(), Outcome::Skip),
        ]
    );
    assert!(subtest_outcomes("--- FAIL: TestConformance (1.0s)\nFAIL\n").is_empty());
    assert!(subtest_outcomes("--- PASS: TestConformance/ (1s)\n").is_empty());
    assert!(subtest_outcomes("--- PASS: OtherTest/X (1s)\n").is_empty());
}

const SETUP_FAILURE_LOG: &str = "\
=== RUN   TestConformance
    suite.go:389: 2026-12-05T09:30:00Z: Test Setup: Ensuring GatewayClass has been accepted
    helpers.go:151:
        \tError Trace:\t/src/helpers.go:151
        \tError:      \tReceived unexpected error:
        \t            \tcontext deadline exceeded
        \tTest:       \tTestConformance
        \tMessages:   \terror waiting for tailnet GatewayClass to have Accepted condition set to True
--- FAIL: TestConformance (180.02s)
FAIL
";

#[test]
fn failure_messages_join_testifys_fields() {
    assert_eq!(
        failure_messages(SETUP_FAILURE_LOG),
        [
            "Received unexpected error: context deadline exceeded (error waiting for tailnet GatewayClass to have Accepted condition set to True)"
        ]
    );
    assert!(failure_messages(GO_TEST_LOG).is_empty());
    let two = "\tError Trace:\ta.go:1\n\tError:\tfirst\n    log line\n\tError Trace:\tb.go:2\n\tError:\tsecond\n\t\tmore\n\tMessages:\t\n";
    assert_eq!(failure_messages(two), ["first", "second more"]);
}

const REPORT: &str = r#"apiVersion: gateway.networking.k8s.io/v1
date: "2026-12-05T09:40:00Z"
gatewayAPIChannel: standard
gatewayAPIVersion: v1.6.3
implementation:
  contact:
  - https://github.com/tailnet-operator/tailnet-operator/issues
  organization: tailnet-operator
  project: tailnet-operator
  url: https://github.com/tailnet-operator/tailnet-operator
  version: 0.1.0
kind: ConformanceReport
mode: default
profiles:
- core:
    failedTests:
    - GatewayInvalidRouteKind
    - HTTPRouteSimpleSameNamespace
    result: failure
    statistics:
      Failed: 2
      Passed: 30
      Skipped: 1
    skippedTests:
    - GatewayStaticAddresses
  extended:
    result: partial
    statistics:
      Failed: 0
      Passed: 0
      Skipped: 0
    unsupportedFeatures:
    - GatewayPort8080
  name: GATEWAY-HTTP
  summary: Core tests failed with 2 test failures.
- core:
    result: success
    statistics:
      Failed: 0
      Passed: 11
      Skipped: 0
  name: GATEWAY-TCP
  summary: Core tests succeeded.
"#;

#[test]
fn report_parses_per_profile_and_the_summary_lists_counts_and_tests() {
    let report = ConformanceReport::parse(REPORT, Path::new("r.yaml")).expect("parses");
    assert_eq!(report.gateway_api_version, "v1.6.3");
    assert_eq!(report.gateway_api_channel, "standard");
    assert_eq!(report.profiles.len(), 2);
    let http = &report.profiles[0];
    assert_eq!(http.name, "GATEWAY-HTTP");
    assert_eq!(
        http.core.statistics,
        Statistics {
            passed: 30,
            failed: 2,
            skipped: 1
        }
    );
    assert_eq!(
        http.core.failed_tests,
        ["GatewayInvalidRouteKind", "HTTPRouteSimpleSameNamespace"]
    );
    assert_eq!(
        http.extended
            .as_ref()
            .map(|e| e.unsupported_features.clone()),
        Some(vec!["GatewayPort8080".to_string()])
    );
    assert!(report.profiles[1].extended.is_none());

    let text = summary(Some(&report), GO_TEST_LOG);
    for expected in [
        "report: Gateway API v1.6.3 (standard), mode default",
        "GATEWAY-HTTP: Core tests failed with 2 test failures.",
        "  core: failure (passed 30, failed 2, skipped 1)",
        "    failed: GatewayInvalidRouteKind, HTTPRouteSimpleSameNamespace",
        "    skipped: GatewayStaticAddresses",
        "  extended: partial (passed 0, failed 0, skipped 0)",
        "    not declared: GatewayPort8080",
        "GATEWAY-TCP: Core tests succeeded.",
        "  core: success (passed 11, failed 0, skipped 0)",
        "suite subtests: 1 passed, 1 failed, 1 skipped",
        "  Fail: TCPRouteSimple",
    ] {
        assert!(text.contains(expected), "{expected:?} missing in:\n{text}");
    }
    assert!(!text.contains("setup failed"), "{text}");
}

#[test]
fn summary_of_a_setup_failure_says_why_and_that_no_test_ran() {
    let empty = ConformanceReport::parse(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: ConformanceReport\nmode: default\nprofiles: []\n",
        Path::new("r.yaml"),
    )
    .expect("parses");
    let text = summary(Some(&empty), SETUP_FAILURE_LOG);
    assert!(
        text.contains("report: no profile results (no test ran)"),
        "{text}"
    );
    assert!(
        text.contains("suite subtests: 0 passed, 0 failed, 0 skipped"),
        "{text}"
    );
    assert!(
        text.contains("setup failed: Received unexpected error: context deadline exceeded (error waiting for tailnet GatewayClass"),
        "{text}"
    );
    // What the suite writes when its setup failed.
    let null = ConformanceReport::parse(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: ConformanceReport\nmode: default\nprofiles: null\n",
        Path::new("r.yaml"),
    )
    .expect("parses");
    assert!(null.profiles.is_empty());
    assert!(summary(None, "").contains("report: none written"));
    assert!(matches!(
        ConformanceReport::parse("profiles: 3", Path::new("bad.yaml")),
        Err(ConformanceError::Report { .. })
    ));
}
