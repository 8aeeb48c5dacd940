//! Egress to every target class through the operator and a real agent pod (issue 15), in one
//! environment: a tailnet device (the lab's `nas`, a user-owned tailscaled with a TCP echo and
//! a TLS server on its tailnet addresses) by its tailnet IPv4, IPv6 and MagicDNS name; the
//! remote site by its IPv6 ULA (route advertised by the router, approved by the operator) and
//! by a split-DNS name (`db.site.internal`, answered by the site's DNS server through the
//! tailnet, wired as Headscale `dns.nameservers.split`). Every path carries bytes that are
//! echoed and compared. Then:
//! - the MagicDNS target starts without a grant in the base: `PolicyEffective=False/
//!   GrantMissing` and the target prints the exact grant line; adding that line to the base
//!   makes it work (TLS to the device by its MagicDNS name, certificate and SNI verified);
//! - the device is switched off: `TargetsReachable=False/TargetNodeOffline` names it (with its
//!   last-seen time) within one probe interval of Headscale noticing, a connection fails; the
//!   device switched on again: everything works with nothing touched in the cluster;
//! - the admin expires the device's node (`headscale nodes expire`): `TargetNodeExpired`.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::{Value, json};
use std::net::IpAddr;
use support::conditions::{ConditionIs, WithConditions, condition_becomes, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{apply, apply_egress, tailnet_name};
use tailnet_api::TailnetEgress;
use tailnet_api::egress::TargetKind;

use tno_testenv::{
    BASE_POLICY_CONFIG_MAP, BASE_POLICY_KEY, E2eEnv, E2eNamespace, OperatorArgs, OperatorProcess,
};
use tno_testenv_tailnet::{
    BASE_DOMAIN, DEVICE_BANNER_TEXT, DEVICE_ECHO_PORT, DEVICE_HOSTNAME, DEVICE_TLS_PORT, Device,
    SITE_DB_NAME, SITE_DNS, SITE_ECHO, SITE_ECHO_V6,
};

const EGRESS: &str = "dev";
/// The agent's probe interval for every target here.
const PROBE_INTERVAL: Duration = Duration::from_secs(2);
const TIMEOUT: Duration = Duration::from_secs(120);

/// The base policy plus `grants` (what a user writes into the base for names).
fn base_with(env: &E2eEnv, grants: &[Value]) -> String {
    let mut base: Value =
        serde_json::from_str(&env.base_policy().expect("base policy")).expect("base JSON");
    if let Some(list) = base["grants"].as_array_mut() {
        list.extend_from_slice(grants);
    }
    serde_json::to_string_pretty(&base).expect("base text")
}

fn kubectl(env: &E2eEnv, args: &[&str]) -> String {
    let kubectl = tno_testenv_kube::binaries::Binaries::discover()
        .map(|b| b.kube_apiserver.with_file_name("kubectl"))
        .unwrap_or_else(|_| "kubectl".into());
    let output = std::process::Command::new(kubectl)
        .arg(format!("--kubeconfig={}", env.kubeconfig().display()))
        .args(args)
        .output();
    match output {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("kubectl: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_to_devices_names_and_ipv6_end_to_end() {
    let started = Instant::now();
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let device = env.tailnet().start_device().await.expect("device");
    let ips = device.tailnet_ips().await.expect("device addresses");
    let (v4, v6) = (ips[0], ips[ips.len() - 1]);
    assert!(v4.is_ipv4() && v6.is_ipv6(), "device addresses {ips:?}");
    let magic_name = format!("{DEVICE_HOSTNAME}.{BASE_DOMAIN}");
    eprintln!(
        "[{:?}] device {magic_name} at {v4}, {v6}",
        started.elapsed()
    );

    // The Headscale admin approved the site's IPv4 network (where its DNS server lives); the
    // IPv6 ULA route is left to the operator (the site-v6 target needs it).
    let router = env.tailnet().site.router.hostname().to_owned();
    env.approve_routes(&router, &["192.0.2.0/24"])
        .await
        .expect("approve the site's IPv4 route");
    let ops = env.namespace("dev").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let tag = tailnet_api::naming::egress_tag("tno", EGRESS);
    // The base grants what names need (the operator generates no grant for them): the
    // site's DNS server (queried through the tailnet) and the split-DNS name's IPv4 address.
    // Not yet the device on the MagicDNS target's port.
    let name_grants = [
        json!({"src": [tag], "dst": [format!("{}/32", SITE_DNS.ip())], "ip": ["udp:53", "tcp:53"]}),
        json!({"src": [tag], "dst": [format!("{}/32", SITE_ECHO.ip())], "ip": [format!("tcp:{}", SITE_ECHO.port())]}),
    ];
    ops.create_bootstrap(&base_with(&env, &name_grants))
        .await
        .expect("bootstrap");
    let tailnet = tailnet_name(&ns);
    let mut tailnet_object = env.tailnet_object(&tailnet, "Apply");
    tailnet_object["spec"]["dns"]["magicDNSDomain"] = json!(BASE_DOMAIN);
    apply(
        &Api::<tailnet_api::Tailnet>::all(client.clone()),
        &tailnet,
        tailnet_object,
    )
    .await
    .expect("Tailnet");
    let operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");

    let probe = json!({"interval": format!("{}s", PROBE_INTERVAL.as_secs())});
    let targets = json!([
        {"name": "nas-v4", "address": v4.to_string(), "port": DEVICE_ECHO_PORT, "probe": probe},
        {"name": "nas-v6", "address": v6.to_string(), "port": DEVICE_ECHO_PORT, "probe": probe},
        {"name": "nas-name", "address": magic_name, "port": DEVICE_TLS_PORT, "probe": probe},
        {"name": "site-v6", "address": SITE_ECHO_V6.ip().to_string(), "port": SITE_ECHO_V6.port(), "probe": probe},
        {"name": "site-db", "address": SITE_DB_NAME, "port": SITE_ECHO.port(), "probe": probe},
    ]);
    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), &ns);
    apply_egress(&egresses, &ns, EGRESS, &tailnet, targets)
        .await
        .expect("egress");
    let sc = Scenario {
        env: &env,
        ops: &ops,
        ns: &ns,
        client: &client,
        egresses: &egresses,
        operator: &operator,
        started,
    };
    let (line, e) = classes_missing_grant_and_routes(&sc, &tag, v4, v6).await;
    bytes_through_every_class(&sc, &e).await;
    the_grant_makes_the_magicdns_target_work(&sc, &name_grants, &line, &magic_name, &device).await;
    let e = the_device_switched_off_is_named(&sc, &device).await;
    switched_on_again_it_works(&sc, &device, &e).await;
    the_expired_device_is_named(&sc).await;
}

/// What every phase of the scenario works with.
struct Scenario<'a> {
    env: &'a E2eEnv,
    ops: &'a E2eNamespace<'a>,
    ns: &'a str,
    client: &'a kube::Client,
    egresses: &'a Api<TailnetEgress>,
    operator: &'a OperatorProcess,
    started: Instant,
}

impl Scenario<'_> {
    /// The egress once its condition `type_` is `status` with `reason` (within [`TIMEOUT`]).
    async fn becomes(
        &self,
        type_: &'static str,
        status: &'static str,
        reason: &'static str,
    ) -> Result<TailnetEgress, String> {
        condition_becomes(
            self.egresses,
            EGRESS,
            ConditionIs::new(type_, status).reason(reason),
            TIMEOUT,
            Some(self.operator),
        )
        .await
    }
}

/// Returns the missing grant line and the egress as last seen.
async fn classes_missing_grant_and_routes(
    sc: &Scenario<'_>,
    tag: &str,
    v4: IpAddr,
    v6: IpAddr,
) -> (String, TailnetEgress) {
    let &Scenario {
        egresses,
        operator,
        started,
        ..
    } = sc;
    let becomes = |type_, status, reason| sc.becomes(type_, status, reason);
    // 1. Classes, the missing grant line, routes.
    let e = becomes("PolicyEffective", "False", "GrantMissing")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "[{:?}] PolicyEffective=False/GrantMissing",
        started.elapsed()
    );
    let status = e.status.clone().unwrap_or_default();
    let kinds: Vec<(String, Option<TargetKind>)> = status
        .targets
        .iter()
        .map(|t| (t.name.clone(), t.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("nas-v4".to_string(), Some(TargetKind::TailnetNode)),
            ("nas-v6".to_string(), Some(TargetKind::TailnetNode)),
            ("nas-name".to_string(), Some(TargetKind::MagicDns)),
            ("site-v6".to_string(), Some(TargetKind::SubnetRoute)),
            ("site-db".to_string(), Some(TargetKind::DnsName)),
        ]
    );
    let nas_name = &status.targets[2];
    let node = nas_name.node.as_ref().expect("the MagicDNS target's node");
    assert_eq!((node.name.as_str(), node.online), (DEVICE_HOSTNAME, true));
    let line = nas_name
        .missing_grant
        .clone()
        .expect("the missing grant line");
    assert_eq!(
        line,
        format!(
            r#"{{"src": ["{tag}"], "dst": ["{v4}", "{v6}"], "ip": ["tcp:{DEVICE_TLS_PORT}"]}}"#
        )
    );
    assert!(
        e.condition_message("PolicyEffective").contains(&line),
        "{}",
        e.describe()
    );
    let e = wait_for_condition(
        egresses,
        EGRESS,
        ConditionIs::new("RoutesReady", "True").reason("Ready"),
        Some(operator),
    )
    .await;
    let routes = e.condition_message("RoutesReady");
    assert!(
        routes.contains("nas-v4 (tailnet node nas)"),
        "node targets need no route: {routes}"
    );
    let site_v6 = &e.status.clone().unwrap_or_default().targets[3];
    assert_eq!(
        site_v6.route.as_deref(),
        Some("fd00:5ee::/64"),
        "{site_v6:?}"
    );
    (line, e)
}

async fn bytes_through_every_class(sc: &Scenario<'_>, e: &TailnetEgress) {
    let &Scenario {
        ops, ns, started, ..
    } = sc;
    // 2. Bytes through every class that the policy grants.
    let service = |name: &str, port: u16| format!("{name}.{ns}.svc.cluster.local:{port}");
    for (target, port) in [
        ("nas-v4", DEVICE_ECHO_PORT),
        ("nas-v6", DEVICE_ECHO_PORT),
        ("site-v6", SITE_ECHO_V6.port()),
        ("site-db", SITE_ECHO.port()),
    ] {
        let t0 = Instant::now();
        let run = ops
            .tcp_check(&format!("c-{target}"), &service(target, port), 30)
            .await
            .expect("client pod");
        assert!(run.succeeded(), "{target}:\n{run}\n{}", e.describe());
        eprintln!(
            "[{:?}] {target}: echoed ({:?})",
            started.elapsed(),
            t0.elapsed()
        );
    }
}

async fn the_grant_makes_the_magicdns_target_work(
    sc: &Scenario<'_>,
    name_grants: &[Value],
    line: &str,
    magic_name: &str,
    device: &Device,
) {
    let &Scenario {
        env,
        ops,
        ns,
        client,
        started,
        ..
    } = sc;
    let becomes = |type_, status, reason| sc.becomes(type_, status, reason);
    let service = |name: &str, port: u16| format!("{name}.{ns}.svc.cluster.local:{port}");
    // 3. The missing grant added to the base: the MagicDNS target works.
    let mut grants = name_grants.to_vec();
    grants.push(serde_json::from_str(line).expect("the grant line is JSON"));
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    apply(
        &config_maps,
        BASE_POLICY_CONFIG_MAP,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": BASE_POLICY_CONFIG_MAP, "namespace": ns},
               "data": {BASE_POLICY_KEY: base_with(env, &grants)}}),
    )
    .await
    .expect("base policy");
    becomes("PolicyEffective", "True", "Ready")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let tls = ops
        .run_pod(
            tno_testenv::tls_check_pod(
                "c-nas-name",
                &service("nas-name", DEVICE_TLS_PORT),
                magic_name,
                &device.ca_pem,
                DEVICE_BANNER_TEXT.trim(),
                30,
            ),
            Duration::from_secs(90),
        )
        .await
        .expect("tls client pod");
    assert!(
        tls.succeeded(),
        "TLS to the device, SNI {magic_name}:\n{tls}"
    );
    eprintln!(
        "[{:?}] nas-name (MagicDNS): TLS verified after the grant",
        started.elapsed()
    );
    let e = becomes("Ready", "True", "Ready")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "[{:?}] MagicDNS target works after the grant; Ready=True ({})",
        started.elapsed(),
        e.status
            .clone()
            .unwrap_or_default()
            .summary
            .unwrap_or_default()
    );
    eprintln!(
        "--- kubectl get tailnetegress -o wide (device on) ---\n{}",
        kubectl(env, &["-n", ns, "get", "tailnetegress", "-o", "wide"])
    );
    eprintln!(
        "--- kubectl describe tailnetegress (device on) ---\n{}",
        kubectl(env, &["-n", ns, "describe", "tailnetegress", EGRESS])
    );
}

async fn the_device_switched_off_is_named(sc: &Scenario<'_>, device: &Device) -> TailnetEgress {
    let &Scenario {
        env,
        ops,
        ns,
        started,
        ..
    } = sc;
    let becomes = |type_, status, reason| sc.becomes(type_, status, reason);
    let service = |name: &str, port: u16| format!("{name}.{ns}.svc.cluster.local:{port}");
    // 4. The device switched off: named, not a timeout; connections fail.
    device.switch_off();
    let off = Instant::now();
    // When Headscale itself notices (its own detection, ≈ 10 s after tailscaled is gone) …
    support::wait::eventually("Headscale marks the device offline", TIMEOUT, || async {
        match env.node(DEVICE_HOSTNAME).await {
            Ok(n) if !n.online => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let headscale_after = off.elapsed();
    // … the egress names it within a Headscale poll plus a probe interval (2 s + 2 s here;
    // the bound leaves room for a loaded machine).
    let e = becomes("TargetsReachable", "False", "TargetNodeOffline")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let named_after = off.elapsed();
    let lag = named_after.saturating_sub(headscale_after);
    eprintln!("Headscale offline after {headscale_after:?}, the egress named it {lag:?} later");
    assert!(
        lag < Duration::from_secs(15),
        "TargetNodeOffline {lag:?} after Headscale knew"
    );
    let message = e.condition_message("TargetsReachable");
    assert!(
        message.contains("node nas") && message.contains("last seen"),
        "{message}"
    );
    assert!(
        ConditionIs::new("Ready", "False")
            .reason("TargetNodeOffline")
            .holds_for(&e),
        "{}",
        e.describe()
    );
    let headscale_offline = env
        .node(DEVICE_HOSTNAME)
        .await
        .map(|n| !n.online)
        .unwrap_or(false);
    assert!(headscale_offline, "Headscale says the device is offline");
    eprintln!(
        "[{:?}] device off: TargetNodeOffline after {named_after:?}: {message}",
        started.elapsed()
    );
    let t0 = Instant::now();
    let run = ops
        .tcp_check("c-off", &service("nas-v4", DEVICE_ECHO_PORT), 1)
        .await
        .expect("client pod");
    assert!(!run.succeeded(), "the device is off:\n{run}");
    eprintln!(
        "[{:?}] connection to the switched-off device failed after {:?} (pod run included)",
        started.elapsed(),
        t0.elapsed()
    );
    eprintln!(
        "--- kubectl get tailnetegress -o wide (device off) ---\n{}",
        kubectl(env, &["-n", ns, "get", "tailnetegress", "-o", "wide"])
    );
    eprintln!(
        "--- kubectl describe tailnetegress (device off) ---\n{}",
        kubectl(env, &["-n", ns, "describe", "tailnetegress", EGRESS])
    );
    e
}

async fn switched_on_again_it_works(sc: &Scenario<'_>, device: &Device, e: &TailnetEgress) {
    let &Scenario {
        env,
        ops,
        ns,
        started,
        ..
    } = sc;
    let becomes = |type_, status, reason| sc.becomes(type_, status, reason);
    let service = |name: &str, port: u16| format!("{name}.{ns}.svc.cluster.local:{port}");
    // 5. Switched on again: works, nothing touched in the cluster.
    let generation = e.metadata.generation;
    device
        .switch_on(&env.tailnet().binaries)
        .await
        .expect("device on");
    let on = Instant::now();
    let e = becomes("TargetsReachable", "True", "Reachable")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "[{:?}] device on: Reachable after {:?}",
        started.elapsed(),
        on.elapsed()
    );
    assert_eq!(e.metadata.generation, generation, "nothing was changed");
    let run = ops
        .tcp_check("c-back", &service("nas-v4", DEVICE_ECHO_PORT), 30)
        .await
        .expect("client pod");
    assert!(run.succeeded(), "the device is back:\n{run}");
}

async fn the_expired_device_is_named(sc: &Scenario<'_>) {
    let &Scenario { env, started, .. } = sc;
    let becomes = |type_, status, reason| sc.becomes(type_, status, reason);
    // 6. The admin expires the device's key: named as expired, not as a timeout.
    let id = env.node(DEVICE_HOSTNAME).await.expect("device node").id;
    env.tailnet()
        .headscale
        .cli(&["nodes", "expire", "--identifier", &id.to_string()])
        .await
        .expect("headscale nodes expire");
    let e = becomes("TargetsReachable", "False", "TargetNodeExpired")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "[{:?}] device expired: {}",
        started.elapsed(),
        e.condition_message("TargetsReachable")
    );
    eprintln!("[{:?}] done", started.elapsed());
}
