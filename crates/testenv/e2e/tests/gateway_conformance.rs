//! The upstream Gateway API conformance suite (v1.6.x, `deps/build.sh gateway-api-conformance`)
//! against the lab, its client on the tailnet. CI runs a subset ([`CI_SUBSET`], a few
//! minutes); the whole suite is opt-in (`#[ignore]`: 8-10 min); see
//! docs/gateway-api-conformance.md:
//!
//! ```sh
//! TNO_REQUIRE_REAL_ENV=1 cargo test -p tno-testenv --test gateway_conformance -- --ignored --nocapture
//! ```
//!
//! The shared e2e environment (kube + tailnet in one lab), the Gateway API Standard CRDs,
//! the operator with a Tailnet `conformance` (unless TNO_GATEWAY_CONFORMANCE_OPERATOR=off),
//! GatewayClass `tailnet` (controllerName `tailnet-operator.dev/gateway`), a kernel-mode
//! tailnet node of alice (`group:team-a`) in its own netns, and there the suite with a
//! kubeconfig for the apiserver's lab address. Its YAML report goes to
//! TNO_GATEWAY_CONFORMANCE_REPORT (default `<target>/gateway-conformance/report.yaml`), its
//! log beside it; the test prints passed/failed/skipped per profile and fails when the suite
//! does.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use tno_testenv::gateway_conformance::{
    ClassAcceptance, ClassParameters, ConformanceReport, GATEWAY_CLASS, RunnerConfig, SuiteExit,
    gateway_class_object, gateway_parameters_object, run_suite, stand_in_class_status, summary,
};
use tno_testenv::{E2eEnv, OperatorArgs, OperatorProcess, workspace_operator_binary};
use tno_testenv_kube::binaries::{tool, workspace_root};
use tno_testenv_kube::network::apply_all;
use tno_testenv_tailnet::{JoinOptions, JoinedNode, LAPTOP_USER, TEAM_A_GROUP, TunMode};

const SUITE_COMPONENT: &str = "gateway-api-conformance";
const SUITE_BINARY: &str = "gateway-api-conformance";
/// The client node's hostname (and netns name suffix).
const CLIENT_HOSTNAME: &str = "conformance";
/// The Tailnet the operator manages during the run.
const TAILNET: &str = "conformance";
const SETUP_DEADLINE: Duration = Duration::from_secs(120);

/// `<CARGO_TARGET_DIR or <workspace>/target>/gateway-conformance`.
fn default_dir() -> PathBuf {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map_or_else(|| root.join("target"), |dir| root.join(dir));
    target.join("gateway-conformance")
}

/// Applies the Standard-channel CRDs of `deps/build.sh gateway-api` (its safe-upgrades
/// admission policy is not needed by the suite).
async fn install_gateway_api_crds(client: &kube::Client) -> usize {
    tno_testenv_kube::crds::install_gateway_api_crds(client, &workspace_root(), SETUP_DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .len()
}

/// The operator with a Tailnet in Apply mode, as the operator's e2e tests run it.
async fn start_operator(env: &E2eEnv, namespace: &str, client: &kube::Client) -> OperatorProcess {
    env.create_bootstrap(client, namespace, &env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap Secret and policy");
    apply_all(client, &[env.tailnet_object(TAILNET, "Apply")])
        .await
        .expect("Tailnet applied");
    let mut operator = spawn_operator(env, namespace).await;
    operator
        .wait_ready(SETUP_DEADLINE)
        .await
        .unwrap_or_else(|error| panic!("operator ready: {error}\n{}", operator.log_tail(40)));
    operator
}

/// One operator process of the workspace's build for `namespace`.
async fn spawn_operator(env: &E2eEnv, namespace: &str) -> OperatorProcess {
    let binary = workspace_operator_binary().unwrap_or_else(|error| {
        panic!("{error} (or run with TNO_GATEWAY_CONFORMANCE_OPERATOR=off)")
    });
    env.start_operator(&binary, &OperatorArgs::new(namespace).to_args())
        .await
        .expect("operator started")
}

/// How often the operator is checked while the suite runs.
const OPERATOR_CHECK: Duration = Duration::from_secs(2);
/// Restarts of an exited operator during one suite run before the test gives up.
const OPERATOR_RESTARTS: usize = 3;

/// Runs `suite` to its end while keeping the operator up the way its Deployment would: an
/// operator that exits (it does so on purpose when it cannot renew its lease, e.g. an
/// apiserver slowed by a loaded machine) is started again, at most [`OPERATOR_RESTARTS`]
/// times; without that every later suite test would wait out its timeout against an
/// operator that is gone. Returns the suite's result and the restarts done.
async fn run_suite_supervised<F, T>(
    suite: F,
    env: &E2eEnv,
    namespace: &str,
    operator: &mut Option<OperatorProcess>,
) -> (T, usize)
where
    F: std::future::Future<Output = T>,
{
    let mut restarts = 0;
    tokio::pin!(suite);
    loop {
        tokio::select! {
            result = &mut suite => return (result, restarts),
            () = tokio::time::sleep(OPERATOR_CHECK), if operator.is_some() => {
                let Some(current) = operator.as_mut() else { continue };
                if current.is_running() {
                    continue;
                }
                assert!(
                    restarts < OPERATOR_RESTARTS,
                    "the operator exited {} times during the suite:\n{}",
                    restarts + 1,
                    current.log_tail(40)
                );
                eprintln!(
                    "==== the operator exited during the suite; starting it again (as its \
                     Deployment would) ====\n{}",
                    current.log_tail(15)
                );
                *current = spawn_operator(env, namespace).await;
                restarts += 1;
            }
        }
    }
}

/// The runner's harness check: marks the GatewayClass Accepted itself.
async fn accept_class_as_stand_in(client: &kube::Client) {
    let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "GatewayClass");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "gatewayclasses");
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let class = classes.get(GATEWAY_CLASS).await.expect("GatewayClass");
    let generation = class.metadata.generation.unwrap_or(1);
    let now = serde_json::to_value(Time(Timestamp::now())).expect("time");
    let now = now.as_str().unwrap_or_default();
    classes
        .patch_status(
            GATEWAY_CLASS,
            &PatchParams::default(),
            &Patch::Merge(stand_in_class_status(generation, now)),
        )
        .await
        .expect("stand-in status written");
}

/// A kernel-mode node of alice (group:team-a, whom the lab's Tailnet admits to entrances),
/// and a check that its netns reaches the apiserver's lab address.
async fn client_node(env: &E2eEnv) -> JoinedNode {
    let node = env
        .tailnet()
        .join_node(
            CLIENT_HOSTNAME,
            JoinOptions {
                owner: Some(LAPTOP_USER.into()),
                tun: TunMode::Kernel,
                ..JoinOptions::default()
            },
        )
        .await
        .expect("kernel-mode client node joins");
    let apiserver = SocketAddr::from((env.lab().gateway(), env.kube().api_port()));
    node.netns
        .connect_tcp(apiserver, Duration::from_secs(5))
        .expect("entering the client netns")
        .unwrap_or_else(|error| panic!("apiserver {apiserver} from the client netns: {error}"));
    node
}

/// The tests CI runs (`gateway_api_conformance_ci_subset`): the three profiles' core, each
/// kind of status and reference the controller decides, and the tests that failed in earlier
/// full runs. The whole suite stays a documented command (docs/gateway-api-conformance.md).
const CI_SUBSET: &[&str] = &[
    "GatewayClassObservedGenerationBump",
    "GatewayObservedGenerationBump",
    "GatewayWithAttachedRoutes",
    "GatewaySecretReferenceGrantSpecific",
    "GatewayInvalidTLSConfiguration",
    "HTTPRouteSimpleSameNamespace",
    "HTTPRouteMatching",
    "HTTPRouteCrossNamespace",
    "HTTPRouteReferenceGrant",
    "HTTPRouteInvalidCrossNamespaceBackendRef",
    "HTTPRouteHTTPSListener",
    "HTTPRouteHostnameIntersection",
    "TLSRouteSimpleSameNamespace",
    "TLSRouteListenerTerminateNotSupported",
    "TCPRouteWeightedRouting",
    "TCPRouteReferenceGrant",
];

/// The `-run` pattern of the suite for `tests` (Go's `-test.run`: one level per `/`).
fn run_pattern(tests: &[&str]) -> String {
    format!("-run=^TestConformance$/^({})$", tests.join("|"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the upstream Gateway API conformance suite (8-10 min): see docs/gateway-api-conformance.md"]
async fn gateway_api_conformance_suite_from_the_tailnet() {
    let config = RunnerConfig::from_vars(
        |name| std::env::var(name).ok(),
        &default_dir(),
        env!("CARGO_PKG_VERSION"),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    run_conformance(config).await;
}

/// [`CI_SUBSET`] of the suite with the default settings (the `TNO_GATEWAY_CONFORMANCE_*`
/// variables are for the whole run), its report in `<target>/gateway-conformance/ci-subset.yaml`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_conformance_ci_subset() {
    if let Err(missing) = tool(SUITE_COMPONENT, SUITE_BINARY) {
        assert!(
            std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
            "{missing}: run deps/build.sh {SUITE_COMPONENT}"
        );
        eprintln!("SKIP: {missing}: run deps/build.sh {SUITE_COMPONENT}");
        return;
    }
    let pattern = run_pattern(CI_SUBSET);
    let config = RunnerConfig::from_vars(
        |name| match name {
            "TNO_GATEWAY_CONFORMANCE_ARGS" => Some(pattern.clone()),
            "TNO_GATEWAY_CONFORMANCE_REPORT" => Some("ci-subset.yaml".to_owned()),
            _ => None,
        },
        &default_dir(),
        env!("CARGO_PKG_VERSION"),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    let log = run_conformance(config).await;
    // The pattern selected exactly the subset: every test ran (a renamed upstream test would
    // otherwise drop out silently) and passed.
    for test in CI_SUBSET {
        assert!(
            log.contains(&format!("--- PASS: TestConformance/{test} ")),
            "{test} did not run and pass in the subset"
        );
    }
}

/// One run of the suite as `config` says; returns its log; panics when it did not pass.
async fn run_conformance(config: RunnerConfig) -> String {
    let started = Instant::now();
    let suite = tool(SUITE_COMPONENT, SUITE_BINARY)
        .unwrap_or_else(|error| panic!("{error}: run deps/build.sh {SUITE_COMPONENT}"));
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|error| panic!("e2e environment: {error}"));
    let env_ready = started.elapsed();
    let ops = env.namespace("gwc").await.expect("operator namespace");
    let client = ops.client().clone();
    let crds = install_gateway_api_crds(&client).await;
    let operator = if config.operator {
        Some(start_operator(&env, ops.name(), &client).await)
    } else {
        None
    };
    // The class's parameters: the Tailnet, and alice's group (the suite's client) granted
    // every listener port; in the operator's namespace.
    let parameters = ClassParameters {
        namespace: ops.name(),
        name: GATEWAY_CLASS,
        tailnet: TAILNET,
        allow_from: &[TEAM_A_GROUP],
    };
    apply_all(
        &client,
        &[
            gateway_parameters_object(&parameters),
            gateway_class_object(GATEWAY_CLASS, &parameters),
        ],
    )
    .await
    .expect("TailnetGatewayParameters and GatewayClass applied");
    if config.acceptance == ClassAcceptance::StandIn {
        accept_class_as_stand_in(&client).await;
    }
    let node = client_node(&env).await;
    let setup_done = started.elapsed();

    if let Some(dir) = config.run.report.parent() {
        std::fs::create_dir_all(dir).expect("report directory");
    }
    for stale in [&config.run.report, &config.log] {
        let _ = std::fs::remove_file(stale);
    }
    eprintln!(
        "gateway-api-conformance in netns {} (kernel-mode node {}): {} {}\nlog: {}",
        node.netns.name(),
        CLIENT_HOSTNAME,
        suite.display(),
        config.run.args().join(" "),
        config.log.display()
    );
    let mut operator = operator;
    let (suite_run, operator_restarts) = run_suite_supervised(
        run_suite(
            &node.netns,
            &suite,
            env.lab_kubeconfig(),
            &config.run,
            &config.log,
            config.deadline,
        ),
        &env,
        ops.name(),
        &mut operator,
    )
    .await;
    let (exit, took) = suite_run.expect("suite process");
    let log = std::fs::read_to_string(&config.log).unwrap_or_default();
    let report = std::fs::read_to_string(&config.run.report)
        .ok()
        .map(|text| ConformanceReport::parse(&text, &config.run.report).expect("report parses"));
    eprintln!(
        "==== Gateway API conformance ({exit:?}) ====\n{}\
         timings: environment {env_ready:.1?}, setup (namespace, {crds} CRDs, operator: {}, \
         GatewayClass, client node) {:.1?}, suite {took:.1?}, total {:.1?}, operator \
         restarts {operator_restarts}\n\
         report: {}\nlog: {}",
        summary(report.as_ref(), &log),
        operator.is_some(),
        setup_done - env_ready,
        started.elapsed(),
        config.run.report.display(),
        config.log.display(),
    );
    let passed = matches!(&exit, SuiteExit::Exited(status) if status.success());
    if !passed {
        for namespace in [
            "gateway-conformance-infra",
            "gateway-conformance-app-backend",
        ] {
            eprintln!("{}", env.kube().diagnostics(Some(namespace), 10));
        }
        if let Some(operator) = &operator {
            eprintln!("==== operator ====\n{}", operator.log_tail(40));
        }
    }
    assert!(
        passed,
        "the conformance suite did not pass ({exit:?}); see above"
    );
    log
}
