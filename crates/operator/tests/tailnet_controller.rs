//! The Tailnet controller against a real kube-apiserver and a real Headscale 0.29.2: DryRun
//! leaves Headscale alone, Apply writes once, route catch-up, manual edits, ownership, base
//! errors, rejected policies, wrong keys (never leaked), leader election and Headscale outage.
//! One scenario in order, because all steps share one Headscale policy.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::conditions::{ConditionIs, WithConditions, condition_becomes, describe};
use support::local_operator::LocalOperator;
use support::objects::{apply, egress_object, ingress_object, tailnet_name};
use support::wait::wait_for;
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tno_testenv_tailnet::TailnetEnv;

const WAIT: Duration = Duration::from_secs(90);

fn base_policy(extra_tests: &str) -> String {
    format!(
        r#"// Base policy of the operator test (human-owned).
{{
  "groups": {{
    "group:platform": ["admin@"],
    "group:team-a": ["alice@"],
  }},
  "tagOwners": {{
    "tag:router": ["admin@"],
    "tag:client": ["admin@"],
    "tag:server": ["admin@"],
  }},
  "grants": [
    {{"src": ["tag:client", "group:team-a"], "dst": ["tag:server"], "ip": ["tcp:7000"]}},
  ],
  "tests": [{extra_tests}],
}}
"#
    )
}

fn cm(name: &str, ns: &str, key: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        ..Default::default()
    }
}

fn secret(name: &str, ns: &str, key: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "apiKey".to_string(),
            ByteString(key.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

/// The Tailnet of this scenario against `server` (not the e2e lab's), in `mode`, with `dns`.
fn tailnet_object(name: &str, server: &str, mode: &str, dns: Value) -> Value {
    json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "Tailnet", "metadata": {"name": name},
        "spec": {
            "server": server,
            "serverCA": {"configMapRef": {"name": "headscale-ca", "key": "ca.crt"}},
            "apiSecretRef": {"name": "headscale-bootstrap", "key": "apiKey"},
            "dns": dns,
            "policy": {"baseConfigMap": "tailnet-policy", "mode": mode, "tagOwners": ["group:platform"],
                       "routeApprovers": ["tag:router"], "ingressSourceAllowlist": ["group:team-a"]}
        }
    })
}

/// The hosts ConfigMap `tailnet-hosts` in the operator namespace.
fn own_hosts_config_map() -> Value {
    json!({"hostsConfigMap": "tailnet-hosts", "ingressNameTemplate": "{name}.{namespace}.lab.example.net"})
}

/// Replaces the base policy document (ConfigMap `tailnet-policy`).
async fn set_base_policy(cms: &Api<ConfigMap>, ns: &str, text: &str) -> kube::Result<ConfigMap> {
    let config_map = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tailnet-policy", "namespace": ns},
        "data": {"policy.hujson": text}
    });
    apply(cms, "tailnet-policy", config_map).await
}

/// Waits until the Tailnet's condition `type_` has `status` and `reason`.
async fn wait_condition(
    api: &Api<Tailnet>,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> Tailnet {
    let expected = ConditionIs::new(type_, status).reason(reason);
    condition_becomes(api, name, expected, WAIT, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until `operator` has counted `count` more policy syncs with `result` for `tailnet`:
/// a "nothing was written" window that provably held reconciles.
async fn more_policy_syncs(operator: &LocalOperator, tailnet: &str, result: &str, count: f64) {
    let sample =
        format!("tailnet_operator_policy_syncs_total{{tailnet=\"{tailnet}\",result=\"{result}\"}}");
    let before = operator.metric(&sample).await.unwrap_or(0.0);
    wait_for(
        &format!("{count} more {result} policy syncs"),
        WAIT,
        || async {
            let now = operator.metric(&sample).await.unwrap_or(0.0);
            if now >= before + count {
                Ok(())
            } else {
                Err(format!("{sample}: {before} → {now}"))
            }
        },
    )
    .await;
}

/// A TCP proxy in front of Headscale that, once armed, edits the live policy (through
/// Headscale directly) as soon as a request carrying `trigger` passes through it, before
/// forwarding that request: an edit that lands between the operator's read of the live
/// policy and its PUT.
struct EditingProxy {
    url: String,
    state: std::sync::Arc<std::sync::Mutex<ProxyState>>,
}

#[derive(Default)]
struct ProxyState {
    /// (trigger, from, to) while armed.
    armed: Option<(String, String, String)>,
    edited: bool,
}

impl EditingProxy {
    /// Plain HTTP towards the operator (the test reads the requests), TLS towards the lab's
    /// HTTPS Headscale `upstream` (trusting `ca_pem`).
    async fn start(upstream: &str, api_key: &str, ca_pem: &str) -> EditingProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy listener");
        let url = format!("http://{}", listener.local_addr().expect("proxy address"));
        let upstream_addr: std::net::SocketAddr = upstream
            .strip_prefix("https://")
            .expect("HTTPS Headscale")
            .trim_end_matches('/')
            .parse()
            .expect("host:port");
        let state = std::sync::Arc::new(std::sync::Mutex::new(ProxyState::default()));
        let hs = tailnet_headscale::Client::new(
            upstream,
            tailnet_headscale::Secret::new(api_key),
            tailnet_headscale::ClientOptions {
                server_ca_pem: Some(ca_pem.to_owned()),
                ..Default::default()
            },
        )
        .expect("headscale client");
        let ca_pem = ca_pem.to_owned();
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let (state, hs, ca_pem) = (shared.clone(), hs.clone(), ca_pem.clone());
                tokio::spawn(async move {
                    let Ok(server) = support::lab_tls::connect(upstream_addr, &ca_pem).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = tokio::io::split(server);
                    let down = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                    });
                    let mut buffer = vec![0u8; 64 * 1024];
                    let mut tail = String::new();
                    loop {
                        let n = match client_read.read(&mut buffer).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let seen = format!("{tail}{}", String::from_utf8_lossy(&buffer[..n]));
                        let edit = {
                            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                            match &s.armed {
                                Some((trigger, _, _)) if seen.contains(trigger.as_str()) => {
                                    s.armed.take()
                                }
                                _ => None,
                            }
                        };
                        if let Some((_, from, to)) = edit {
                            let live = hs.get_policy().await.expect("proxy: live policy");
                            let edited = live.policy.replace(&from, &to);
                            assert_ne!(edited, live.policy, "proxy: nothing to edit");
                            hs.set_policy(&edited).await.expect("proxy: edit");
                            state.lock().unwrap_or_else(|p| p.into_inner()).edited = true;
                        }
                        tail = seen
                            .chars()
                            .rev()
                            .take(64)
                            .collect::<Vec<_>>()
                            .into_iter()
                            .rev()
                            .collect();
                        if server_write.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                    down.abort();
                });
            }
        });
        EditingProxy { url, state }
    }

    fn arm(&self, trigger: &str, from: &str, to: &str) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.armed = Some((trigger.to_string(), from.to_string(), to.to_string()));
        s.edited = false;
    }

    fn edited(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).edited
    }
}

/// How often the operator reported an overwritten manual edit of `tailnet`'s policy (an
/// Event's series count; 1 without a series).
async fn manual_edit_reports(events: &Api<Event>, tailnet: &str) -> Result<i32, String> {
    let list = events
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some("ManualEditOverwritten")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(tailnet)
        })
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tailnet_controller_scenario() {
    let kube = tno_testenv_kube::shared()
        .await
        .unwrap_or_else(|e| panic!("kube environment: {e}"));
    let tailnet_env = TailnetEnv::start().await.expect("tailnet environment");
    let ns = kube.namespace("op").await.expect("namespace");
    let client = ns.client().clone();
    let logs = tempfile::tempdir().expect("log dir");
    let result = tokio::time::timeout(
        Duration::from_secs(600),
        scenario(&kube, &tailnet_env, ns.name(), &client, logs.path()),
    )
    .await;
    if !matches!(result, Ok(())) {
        for entry in std::fs::read_dir(logs.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            eprintln!(
                "==== {} ====\n{}",
                entry.path().display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        eprintln!("{}", tailnet_env.log_report(&[]));
        panic!("scenario did not finish: {result:?}");
    }
}

/// What every phase of the scenario shares.
struct Scenario<'a> {
    kube: &'a tno_testenv_kube::KubeEnv,
    env: &'a TailnetEnv,
    ns: &'a str,
    client: &'a kube::Client,
    logs: &'a std::path::Path,
    tailnet_name: String,
    /// Headscale directly (not through the operator).
    hs: tailnet_headscale::Client,
    tailnets: Api<Tailnet>,
    cms: Api<ConfigMap>,
    secrets: Api<Secret>,
    events: Api<Event>,
    /// Headscale's URL, as the Tailnet names it.
    server: String,
    installation: String,
    lease: String,
}

impl Scenario<'_> {
    async fn tailnet_becomes(
        &self,
        type_: &'static str,
        status: &'static str,
        reason: &'static str,
    ) -> Tailnet {
        wait_condition(&self.tailnets, &self.tailnet_name, type_, status, reason).await
    }

    /// Applies the Tailnet against `server`, in `mode`, with `dns`.
    async fn apply_tailnet(&self, server: &str, mode: &str, dns: Value, what: &str) {
        apply(
            &self.tailnets,
            &self.tailnet_name,
            tailnet_object(&self.tailnet_name, server, mode, dns),
        )
        .await
        .expect(what);
    }

    fn start_operator(&self, identity: &str) -> LocalOperator {
        LocalOperator::start(
            self.kube.kubeconfig(),
            self.ns,
            &self.installation,
            &self.lease,
            self.logs,
            identity,
        )
    }
}

/// The phases in order: each leaves Headscale's policy as the next expects it.
async fn scenario(
    kube: &tno_testenv_kube::KubeEnv,
    env: &TailnetEnv,
    ns: &str,
    client: &kube::Client,
    logs: &std::path::Path,
) {
    let s = Scenario {
        kube,
        env,
        ns,
        client,
        logs,
        tailnet_name: tailnet_name(ns),
        hs: tailnet_headscale::Client::new(
            &env.headscale.root_url(),
            tailnet_headscale::Secret::new(env.headscale.api_key()),
            tailnet_headscale::ClientOptions {
                server_ca_pem: Some(env.headscale.ca_pem().to_owned()),
                ..Default::default()
            },
        )
        .expect("headscale client"),
        tailnets: Api::all(client.clone()),
        cms: Api::namespaced(client.clone(), ns),
        secrets: Api::namespaced(client.clone(), ns),
        events: Api::all(client.clone()),
        server: env.headscale.root_url(),
        installation: format!("test-{ns}"),
        lease: format!("lease-{ns}"),
    };
    declare(&s).await;
    let before = s.hs.get_policy().await.expect("live policy before");
    let first = s.start_operator("operator-1");
    let router = dry_run(&s, &first, &before).await;
    no_surprise_lockdown(&s, &first, &before).await;
    let live = apply_mode(&s, &first, &router).await;
    manual_edit(&s, &live).await;
    edit_during_check(&s).await;
    let good = owned_elsewhere(&s, &first, &live).await;
    broken_bases(&s, &good).await;
    wrong_key(&s, &first).await;
    server_ca(&s).await;
    short_lived_key(&s, &first).await;
    let mut second = leader_handover(&s, first).await;
    headscale_outage(&s, &mut second).await;
    shared_dns_config_map(&s).await;
}

/// Declarations: key, base, Tailnet (DryRun), an egress and a tcp ingress in the operator
/// namespace.
async fn declare(s: &Scenario<'_>) {
    let client = s.client;
    let ns = s.ns;
    s.secrets
        .create(
            &PostParams::default(),
            &secret("headscale-bootstrap", ns, s.env.headscale.api_key()),
        )
        .await
        .expect("secret");
    s.cms
        .create(
            &PostParams::default(),
            &cm("tailnet-policy", ns, "policy.hujson", &base_policy("")),
        )
        .await
        .expect("base");
    s.cms
        .create(
            &PostParams::default(),
            &cm("headscale-ca", ns, "ca.crt", s.env.headscale.ca_pem()),
        )
        .await
        .expect("lab CA");
    s.apply_tailnet(&s.server, "DryRun", own_hosts_config_map(), "Tailnet")
        .await;
    apply(
        &Api::<TailnetEgress>::namespaced(client.clone(), ns),
        "site",
        egress_object(
            ns,
            "site",
            &s.tailnet_name,
            json!([{"name": "remote-db", "address": "192.0.2.10", "port": 5432, "aliases": ["db.site.example.net"]}]),
        ),
    )
    .await
    .expect("egress");
    apply(
        &Api::<TailnetIngress>::namespaced(client.clone(), ns),
        "kube",
        ingress_object(
            ns,
            "kube",
            &s.tailnet_name,
            None,
            json!([{"name": "api", "dnsLabel": "kube", "mode": "tcp", "port": 6443, "backend": {"service": "kubernetes", "namespace": "default", "port": 443}}]),
        ),
    )
    .await
    .expect("ingress");
}

/// DryRun: checked and published, Headscale untouched. Returns the router node.
async fn dry_run(
    s: &Scenario<'_>,
    first: &LocalOperator,
    before: &tailnet_headscale::Policy,
) -> tailnet_headscale::Node {
    let hs = &s.hs;
    let cms = &s.cms;
    let tailnet_name = &s.tailnet_name;
    let t = s.tailnet_becomes("PolicyApplied", "False", "DryRun").await;
    let reachable = t
        .condition("HeadscaleReachable")
        .expect("HeadscaleReachable");
    assert_eq!(reachable.status, "True", "{}", describe(t.conditions()));
    assert!(reachable.message.contains("0.29"), "{}", reachable.message);
    assert_eq!(
        t.condition("BaseValid").map(|c| c.status.as_str()),
        Some("True")
    );
    assert_eq!(
        t.condition("Ready").map(|c| c.reason.as_str()),
        Some("DryRun")
    );
    let rendered_cm = cms
        .get(&format!("{tailnet_name}-rendered-policy"))
        .await
        .expect("rendered policy ConfigMap");
    let data = rendered_cm.data.clone().unwrap_or_default();
    let rendered = data
        .get("policy.hujson")
        .cloned()
        .expect("rendered document");
    assert!(
        rendered.contains("tag:tno-egress-site") && rendered.contains("192.0.2.10/32"),
        "{rendered}"
    );
    assert!(
        !data.get("diff").cloned().unwrap_or_default().is_empty(),
        "DryRun publishes a diff"
    );
    // A few polls: the window holds two more DryRun syncs (rendered, checked, not written).
    more_policy_syncs(first, tailnet_name, "dry_run", 2.0).await;
    let during = hs.get_policy().await.expect("live policy during DryRun");
    assert_eq!(
        during.policy, before.policy,
        "DryRun must not write the policy"
    );
    assert_eq!(during.updated_at, before.updated_at);
    let router = hs
        .list_nodes()
        .await
        .expect("nodes")
        .into_iter()
        .find(|n| n.tags.contains(&"tag:router".to_string()))
        .expect("router");
    assert!(
        router.approved_routes.is_empty(),
        "DryRun must not approve routes"
    );
    router
}

/// A base without `acls`/`grants` in Apply: refused with `WouldLockDown` (the live policy,
/// which has rules of its own, stays byte for byte through several refused syncs), the
/// rendered-policy ConfigMap lists the notice; then the base with rules is back (DryRun).
async fn no_surprise_lockdown(
    s: &Scenario<'_>,
    first: &LocalOperator,
    before: &tailnet_headscale::Policy,
) {
    let ruleless = r#"// No rules: Headscale's allow-all.
{
  "groups": {"group:platform": ["admin@"], "group:team-a": ["alice@"]},
  "tagOwners": {"tag:router": ["admin@"], "tag:client": ["admin@"], "tag:server": ["admin@"]},
}
"#;
    set_base_policy(&s.cms, s.ns, ruleless)
        .await
        .expect("rule-less base");
    s.apply_tailnet(
        &s.server,
        "Apply",
        own_hosts_config_map(),
        "Tailnet in Apply",
    )
    .await;
    let t = s
        .tailnet_becomes("PolicyApplied", "False", "WouldLockDown")
        .await;
    let applied = t.condition("PolicyApplied").expect("PolicyApplied");
    for needle in ["deny-by-default", "acceptedNotices: [BaseHadNoRules]"] {
        assert!(
            applied.message.contains(needle),
            "{needle}: {}",
            applied.message
        );
    }
    eprintln!(
        "lockdown refused: PolicyApplied=False/WouldLockDown: {}",
        applied.message
    );
    // Positive witness: two more refused syncs happened, and the live policy is untouched.
    more_policy_syncs(first, &s.tailnet_name, "would_lock_down", 2.0).await;
    let during = s.hs.get_policy().await.expect("live policy");
    assert_eq!(during.policy, before.policy, "the live policy must stay");
    assert_eq!(during.updated_at, before.updated_at);
    let notices = s
        .cms
        .get(&format!("{}-rendered-policy", s.tailnet_name))
        .await
        .expect("rendered policy ConfigMap")
        .data
        .unwrap_or_default()
        .get("notices")
        .cloned()
        .unwrap_or_default();
    assert!(notices.contains("allow-all"), "notices: {notices:?}");
    let warned = s
        .events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some("WouldLockDown"));
    assert!(warned, "a Warning Event WouldLockDown");
    set_base_policy(&s.cms, s.ns, &base_policy(""))
        .await
        .expect("base back");
    s.apply_tailnet(
        &s.server,
        "DryRun",
        own_hosts_config_map(),
        "Tailnet back in DryRun",
    )
    .await;
    s.tailnet_becomes("PolicyApplied", "False", "DryRun").await;
}

/// A key that expires in a day: `HeadscaleReachable` stays True and warns (naming the key by
/// its public prefix only), a Warning Event `ApiKeyExpiring`, the expiry metric; then the
/// long-lived key is back.
async fn short_lived_key(s: &Scenario<'_>, first: &LocalOperator) {
    let expires = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(24))
        .expect("timestamp");
    let key = s.hs.create_api_key(expires).await.expect("a 1-day key");
    s.secrets
        .replace(
            "headscale-bootstrap",
            &PostParams::default(),
            &secret("headscale-bootstrap", s.ns, key.expose()),
        )
        .await
        .expect("short-lived key");
    let public = tailnet_headscale::api_key_public_part(key.expose())
        .expect("a hskey-api key")
        .to_string();
    let message = reachable_message(s, |m| {
        m.contains("warning: the Headscale API key") && m.contains(public.as_str())
    })
    .await;
    eprintln!("1-day key: HeadscaleReachable=True: {message}");
    assert!(
        message.contains("(in 0d 23h)") || message.contains("(in 1d 0h)"),
        "{message}"
    );
    assert!(
        !message.contains(key.expose()),
        "the key itself is never shown"
    );
    let sample = format!(
        "tailnet_operator_headscale_api_key_expiry_timestamp_seconds{{tailnet=\"{}\"}}",
        s.tailnet_name
    );
    let metric = first.metric(&sample).await.expect("expiry metric");
    assert!(
        (metric - expires.as_second() as f64).abs() <= 1.0,
        "{sample} = {metric}, key expires {expires}"
    );
    let events = s
        .events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items;
    let warnings: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ApiKeyExpiring"))
        .collect();
    assert_eq!(warnings.len(), 1, "one Warning Event: {warnings:?}");
    let text = serde_json::to_string(&events).unwrap_or_default();
    assert!(!text.contains(key.expose()), "events leak the key");
    assert!(
        !first.log_text().contains(key.expose()),
        "log leaks the key"
    );
    s.secrets
        .replace(
            "headscale-bootstrap",
            &PostParams::default(),
            &secret("headscale-bootstrap", s.ns, s.env.headscale.api_key()),
        )
        .await
        .expect("key back");
    reachable_message(s, |m| !m.contains(public.as_str())).await;
}

/// (In Apply mode, as the phases before leave it.) The Tailnet's `spec.serverCA` against the
/// lab's HTTPS Headscale: another CA, no CA at all,
/// a missing key and a text without a certificate are each a named `HeadscaleReachable`
/// reason saying which; the lab CA back, reachable again.
async fn server_ca(s: &Scenario<'_>) {
    let set_ca = |text: String| async move {
        s.cms
            .replace(
                "headscale-ca",
                &PostParams::default(),
                &cm("headscale-ca", s.ns, "ca.crt", &text),
            )
            .await
            .expect("CA ConfigMap replaced");
    };
    let message_of = |t: &Tailnet| {
        t.condition("HeadscaleReachable")
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    let scratch = s.logs.join(format!("other-ca-{}", s.ns));
    let other = tno_testenv_tailnet::LabCa::generate(&scratch, "another CA").expect("other CA");
    set_ca(other.cert_pem().to_owned()).await;
    let t = s
        .tailnet_becomes("HeadscaleReachable", "False", "CertificateUntrusted")
        .await;
    let message = message_of(&t);
    eprintln!("another CA: HeadscaleReachable=False/CertificateUntrusted: {message}");
    assert!(
        message.contains("spec.serverCA, ConfigMap headscale-ca key \"ca.crt\""),
        "{message}"
    );

    set_ca("not a certificate".to_owned()).await;
    let t = s
        .tailnet_becomes("HeadscaleReachable", "False", "ServerCAInvalid")
        .await;
    eprintln!(
        "garbage: HeadscaleReachable=False/ServerCAInvalid: {}",
        message_of(&t)
    );

    s.cms
        .delete("headscale-ca", &Default::default())
        .await
        .expect("CA ConfigMap deleted");
    let t = s
        .tailnet_becomes("HeadscaleReachable", "False", "ServerCAMissing")
        .await;
    let message = message_of(&t);
    eprintln!("no ConfigMap: HeadscaleReachable=False/ServerCAMissing: {message}");
    assert!(message.contains("headscale-ca"), "{message}");

    // Without spec.serverCA: the system roots do not know the lab CA.
    let mut without = tailnet_object(&s.tailnet_name, &s.server, "Apply", own_hosts_config_map());
    without["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("serverCA");
    apply(&s.tailnets, &s.tailnet_name, without)
        .await
        .expect("Tailnet without serverCA");
    let t = s
        .tailnet_becomes("HeadscaleReachable", "False", "CertificateUntrusted")
        .await;
    let message = message_of(&t);
    eprintln!("no serverCA: HeadscaleReachable=False/CertificateUntrusted: {message}");
    assert!(message.contains("system roots only"), "{message}");

    s.cms
        .create(
            &PostParams::default(),
            &cm("headscale-ca", s.ns, "ca.crt", s.env.headscale.ca_pem()),
        )
        .await
        .expect("lab CA back");
    s.apply_tailnet(
        &s.server,
        "Apply",
        own_hosts_config_map(),
        "Tailnet with serverCA",
    )
    .await;
    s.tailnet_becomes("HeadscaleReachable", "True", "Reachable")
        .await;
}

/// Waits until the Tailnet's `HeadscaleReachable` is True with a message that `wanted`
/// accepts; returns that message.
async fn reachable_message(s: &Scenario<'_>, wanted: impl Fn(&str) -> bool) -> String {
    wait_for(
        "HeadscaleReachable=True with the expected message",
        WAIT,
        || async {
            let t = s
                .tailnets
                .get(&s.tailnet_name)
                .await
                .map_err(|e| e.to_string())?;
            match t.condition("HeadscaleReachable") {
                Some(c) if c.status == "True" && wanted(&c.message) => Ok(c.message.clone()),
                other => Err(format!("HeadscaleReachable: {other:?}")),
            }
        },
    )
    .await
}

/// Apply: written once, routes caught up, grants effective; DNS rendered. Returns the live
/// policy as written.
async fn apply_mode(
    s: &Scenario<'_>,
    first: &LocalOperator,
    router: &tailnet_headscale::Node,
) -> String {
    let hs = &s.hs;
    let tailnets = &s.tailnets;
    let cms = &s.cms;
    let tailnet_name = &s.tailnet_name;
    let server = &s.server;
    let ns = s.ns;
    let installation = &s.installation;
    apply(
        tailnets,
        tailnet_name,
        tailnet_object(tailnet_name, server, "Apply", own_hosts_config_map()),
    )
    .await
    .expect("switch to Apply");
    let t = s.tailnet_becomes("PolicyApplied", "True", "Applied").await;
    let live = hs.get_policy().await.expect("live policy after Apply");
    assert!(
        live.policy.starts_with(&format!(
            "// tailnet-operator-installation: {installation}/{tailnet_name}"
        )),
        "{}",
        live.policy
    );
    assert!(live.policy.contains("\"tag:tno-egress-site\""));
    let effective = t
        .status
        .clone()
        .unwrap_or_default()
        .policy
        .unwrap_or_default()
        .effective_for;
    assert_eq!(
        effective,
        vec![
            format!("TailnetEgress/{ns}/site"),
            format!("TailnetIngress/{ns}/kube")
        ]
    );
    wait_for("the router's 192.0.2.0/24 to be approved", WAIT, || async {
        let node = hs.get_node(router.id).await.map_err(|e| e.to_string())?;
        if node.approved_routes.contains(&"192.0.2.0/24".to_string()) {
            Ok(())
        } else {
            Err(format!("{:?}", node.approved_routes))
        }
    })
    .await;
    let node = hs.get_node(router.id).await.expect("router");
    assert!(
        !node
            .approved_routes
            .contains(&"198.51.100.0/24".to_string()),
        "only routes covering IP targets are approved"
    );
    // No write on unchanged reconciles.
    let updated = hs.get_policy().await.expect("policy").updated_at;
    more_policy_syncs(first, tailnet_name, "unchanged", 2.0).await;
    assert_eq!(
        hs.get_policy().await.expect("policy").updated_at,
        updated,
        "an unchanged reconcile must not PUT"
    );
    let applied = first
        .metric(&format!(
            "tailnet_operator_policy_syncs_total{{tailnet=\"{tailnet_name}\",result=\"applied\"}}"
        ))
        .await;
    assert_eq!(applied, Some(1.0));
    assert!(first.metric(&format!("tailnet_operator_policy_syncs_total{{tailnet=\"{tailnet_name}\",result=\"unchanged\"}}")).await.unwrap_or(0.0) >= 1.0);

    // DNS: the ingress has no node yet → pending; rendered into the hosts ConfigMap.
    let hosts = cms.get("tailnet-hosts").await.expect("hosts ConfigMap");
    assert!(
        hosts
            .data
            .unwrap_or_default()
            .contains_key("extra-records.json")
    );
    live.policy
}

/// A manual edit is overwritten and reported.
async fn manual_edit(s: &Scenario<'_>, live: &str) {
    let hs = &s.hs;
    let tailnet_name = &s.tailnet_name;
    let client = s.client;
    let edited = live.replace("\"tcp:5432\"", "\"tcp:5433\"");
    assert_ne!(edited, live);
    hs.set_policy(&edited).await.expect("manual edit");
    wait_for("the manual edit to be overwritten", WAIT, || async {
        let now = hs.get_policy().await.map_err(|e| e.to_string())?;
        if now.policy.contains("\"tcp:5432\"") {
            Ok(())
        } else {
            Err("still edited".to_string())
        }
    })
    .await;
    let events: Api<Event> = Api::all(client.clone());
    wait_for("a ManualEditOverwritten event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let found = list.items.iter().find(|e| {
            e.reason.as_deref() == Some("ManualEditOverwritten")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                    == Some(tailnet_name.as_str())
        });
        match found {
            Some(e) if e.note.clone().unwrap_or_default().contains("5433") => Ok(()),
            Some(e) => Err(format!("note without the lost line: {:?}", e.note)),
            None => Err("no event yet".to_string()),
        }
    })
    .await;
}

/// An edit made while the operator checks its document (between its read of the live
/// policy and its PUT) is reported, not silently overwritten. A proxy in front of
/// Headscale makes the window observable: when the check of the new document passes
/// through it, it edits the live policy first.
async fn edit_during_check(s: &Scenario<'_>) {
    let hs = &s.hs;
    let tailnets = &s.tailnets;
    let cms = &s.cms;
    let tailnet_name = &s.tailnet_name;
    let server = &s.server;
    let env = s.env;
    let ns = s.ns;
    let events = &s.events;
    let proxy = EditingProxy::start(
        &env.headscale.root_url(),
        env.headscale.api_key(),
        env.headscale.ca_pem(),
    )
    .await;
    apply(
        tailnets,
        tailnet_name,
        tailnet_object(tailnet_name, &proxy.url, "Apply", own_hosts_config_map()),
    )
    .await
    .expect("Tailnet through the proxy");
    wait_for("the operator to talk through the proxy", WAIT, || async {
        let t = tailnets
            .get(tailnet_name)
            .await
            .map_err(|e| e.to_string())?;
        let message = t.condition_message("HeadscaleReachable");
        if message.contains(&proxy.url) {
            Ok(())
        } else {
            Err(message)
        }
    })
    .await;
    // Events with the same reason are one Event with a series (the note is the first one's):
    // count the reports.
    let reported_before = manual_edit_reports(events, tailnet_name)
        .await
        .expect("events");
    proxy.arm("group:race", "\"tcp:5432\"", "\"tcp:5434\"");
    set_base_policy(
        cms,
        ns,
        &base_policy("").replace(
            "\"group:team-a\": [\"alice@\"],",
            "\"group:team-a\": [\"alice@\"],\n    \"group:race\": [\"bob@\"],",
        ),
    )
    .await
    .expect("base with a new group");
    wait_for(
        "the proxy to edit the live policy during the check",
        WAIT,
        || async {
            if proxy.edited() {
                Ok(())
            } else {
                Err("no check of the new document yet".to_string())
            }
        },
    )
    .await;
    wait_for(
        "the edit made during the check to be reported",
        WAIT,
        || async {
            let now = hs.get_policy().await.map_err(|e| e.to_string())?;
            let reported = manual_edit_reports(events, tailnet_name).await?;
            if now.policy.contains("group:race")
                && !now.policy.contains("5434")
                && reported > reported_before
            {
                Ok(())
            } else {
                Err(format!(
                    "ManualEditOverwritten reported {reported} times (before: {reported_before}); live has group:race: {}, 5434: {}",
                    now.policy.contains("group:race"),
                    now.policy.contains("5434")
                ))
            }
        },
    )
    .await;
    // The write that overwrote the edit was not announced as a plain PolicyApplied.
    let plain = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("PolicyApplied")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                    == Some(tailnet_name.as_str())
        })
        .map(|e| e.note.unwrap_or_default())
        .collect::<Vec<_>>();
    assert!(plain.is_empty(), "the overwrite was reported as {plain:?}");
    set_base_policy(cms, ns, &base_policy(""))
        .await
        .expect("base back");
    apply(
        tailnets,
        tailnet_name,
        tailnet_object(tailnet_name, server, "Apply", own_hosts_config_map()),
    )
    .await
    .expect("Tailnet back to Headscale directly");
    wait_for("the base without group:race to be live", WAIT, || async {
        let now = hs.get_policy().await.map_err(|e| e.to_string())?;
        if now.policy.contains("group:race") {
            Err("still the race base".to_string())
        } else {
            Ok(())
        }
    })
    .await;
}

/// Another installation's document is never overwritten. Returns ours, live again.
async fn owned_elsewhere(
    s: &Scenario<'_>,
    first: &LocalOperator,
    live: &str,
) -> tailnet_headscale::Policy {
    let hs = &s.hs;
    let tailnet_name = &s.tailnet_name;
    let foreign = "// tailnet-operator-installation: another-cluster/demo\n{\"groups\": {\"group:team-a\": [\"alice@\"]}, \"tagOwners\": {\"tag:router\": [\"admin@\"], \"tag:client\": [\"admin@\"], \"tag:server\": [\"admin@\"]}}";
    hs.set_policy(foreign).await.expect("foreign policy");
    s.tailnet_becomes("PolicyApplied", "False", "OwnedElsewhere")
        .await;
    more_policy_syncs(first, tailnet_name, "owned_elsewhere", 2.0).await;
    assert_eq!(
        hs.get_policy().await.expect("policy").policy,
        foreign,
        "OwnedElsewhere: no write"
    );
    hs.set_policy(live).await.expect("restore our policy");
    s.tailnet_becomes("PolicyApplied", "True", "Applied").await;

    hs.get_policy().await.expect("policy")
}

/// A base with a syntax error, then one whose tests fail: the good policy stays live.
async fn broken_bases(s: &Scenario<'_>, good: &tailnet_headscale::Policy) {
    let hs = &s.hs;
    let cms = &s.cms;
    let ns = s.ns;
    // A base with a syntax error: BaseValid=False with the position; live untouched.
    set_base_policy(
        cms,
        ns,
        "{\n  \"groups\": {\n    \"group:team-a\": [\"alice@\"] \"oops\"\n  }\n}\n",
    )
    .await
    .expect("broken base");
    let t = s.tailnet_becomes("BaseValid", "False", "SyntaxError").await;
    let message = t.condition_message("BaseValid");
    assert!(message.contains("line 3, column"), "{message}");
    assert_eq!(hs.get_policy().await.expect("policy").policy, good.policy);

    // A base whose tests fail against the generated grants: Rejected, old policy stays.
    set_base_policy(
        cms,
        ns,
        &base_policy(r#"{"src": "alice@", "accept": ["tag:router:22"]}"#),
    )
    .await
    .expect("base with failing test");
    let t = s
        .tailnet_becomes("PolicyApplied", "False", "Rejected")
        .await;
    let message = t.condition_message("PolicyApplied");
    assert!(message.contains("previous one stays live"), "{message}");
    assert_eq!(
        hs.get_policy().await.expect("policy").policy,
        good.policy,
        "a rejected policy leaves the old one live"
    );
    set_base_policy(cms, ns, &base_policy(""))
        .await
        .expect("base fixed");
    s.tailnet_becomes("PolicyApplied", "True", "Applied").await;
}

/// A wrong API key: a clear 401 condition; the key appears nowhere.
async fn wrong_key(s: &Scenario<'_>, first: &LocalOperator) {
    let secrets = &s.secrets;
    let env = s.env;
    let ns = s.ns;
    let events = &s.events;
    let wrong_key = "hskey-api-wrongprefix0-thisisnotthekey1234567890";
    secrets
        .replace(
            "headscale-bootstrap",
            &PostParams::default(),
            &secret("headscale-bootstrap", ns, wrong_key),
        )
        .await
        .expect("wrong key");
    let t = s
        .tailnet_becomes("HeadscaleReachable", "False", "Unauthorized")
        .await;
    let status_text = serde_json::to_string(&t.status).unwrap_or_default();
    assert!(
        !status_text.contains("thisisnotthekey"),
        "status leaks the key"
    );
    assert!(
        !first.log_text().contains("thisisnotthekey"),
        "log leaks the key"
    );
    assert!(
        !first.log_text().contains(env.headscale.api_key()),
        "log leaks the real key"
    );
    let event_text = serde_json::to_string(
        &events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items,
    )
    .unwrap_or_default();
    assert!(
        !event_text.contains("thisisnotthekey") && !event_text.contains(env.headscale.api_key()),
        "events leak a key"
    );
    secrets
        .replace(
            "headscale-bootstrap",
            &PostParams::default(),
            &secret("headscale-bootstrap", ns, env.headscale.api_key()),
        )
        .await
        .expect("key back");
    s.tailnet_becomes("HeadscaleReachable", "True", "Reachable")
        .await;
}

/// Two replicas: the second stands by; it takes over when the first stops. Returns the
/// second.
async fn leader_handover(s: &Scenario<'_>, mut first: LocalOperator) -> LocalOperator {
    let client = s.client;
    let ns = s.ns;
    let lease = &s.lease;
    let second = s.start_operator("operator-2");
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    wait_for("the second replica to be up", WAIT, || async {
        second
            .metric("tailnet_operator_leader")
            .await
            .map(|_| ())
            .ok_or("no metrics yet".to_string())
    })
    .await;
    // The standby tried and found the lease held (its log) while the leader renewed it twice;
    // its leader gauge stays 0 throughout.
    let renew_time = || async {
        leases
            .get(lease)
            .await
            .ok()
            .and_then(|l| l.spec)
            .and_then(|s| s.renew_time)
            .map(|t| t.0)
    };
    let window = std::time::Instant::now();
    let mut last_renewal = renew_time().await;
    let mut renewals = 0;
    loop {
        assert_eq!(
            second.metric("tailnet_operator_leader").await,
            Some(0.0),
            "standby must not lead"
        );
        let renewed = renew_time().await;
        if renewed != last_renewal {
            renewals += 1;
            last_renewal = renewed;
        }
        let standing_by = second
            .log_text()
            .contains("standing by: lease held by another replica");
        if renewals >= 2 && standing_by {
            break;
        }
        assert!(
            window.elapsed() < WAIT,
            "no window of two lease renewals with the standby standing by: {renewals} renewals, standby log says standing by: {standing_by}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(first.metric("tailnet_operator_leader").await, Some(1.0));
    let holder = leases
        .get(lease)
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("operator-1"));
    first.terminate();
    wait_for(
        "the standby to take over",
        Duration::from_secs(30),
        || async {
            match second.metric("tailnet_operator_leader").await {
                Some(1.0) => Ok(()),
                other => Err(format!("leader gauge {other:?}")),
            }
        },
    )
    .await;
    let holder = leases
        .get(lease)
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("operator-2"));
    second
}

/// Headscale down: condition within a few polls, the operator keeps running; back on the
/// same database, it recovers by itself without re-writing the unchanged policy.
async fn headscale_outage(s: &Scenario<'_>, second: &mut LocalOperator) {
    let hs = &s.hs;
    let tailnet_name = &s.tailnet_name;
    let env = s.env;
    let updated_before_outage = hs.get_policy().await.expect("policy").updated_at;
    env.headscale.kill();
    let t = s
        .tailnet_becomes("HeadscaleReachable", "False", "ConnectionFailed")
        .await;
    assert!(
        second.is_running(),
        "the operator must survive Headscale being down"
    );
    assert!(t.name_any() == *tailnet_name);

    // Headscale back on the same database: the operator recovers by itself and does not
    // re-write the unchanged policy.
    env.headscale.restart().await.expect("restart headscale");
    s.tailnet_becomes("HeadscaleReachable", "True", "Reachable")
        .await;
    s.tailnet_becomes("PolicyApplied", "True", "Applied").await;
    assert!(second.is_running());
    assert_eq!(
        hs.get_policy().await.expect("policy").updated_at,
        updated_before_outage,
        "recovery must not re-write an unchanged policy"
    );
}

/// DNS entries into a shared ConfigMap where CoreDNS runs (another namespace): only our
/// keys are written, the others stay, and the Tailnet does not take ownership of it.
async fn shared_dns_config_map(s: &Scenario<'_>) {
    let tailnets = &s.tailnets;
    let tailnet_name = &s.tailnet_name;
    let server = &s.server;
    let kube = s.kube;
    let client = s.client;
    let dns_ns = kube.namespace("dns").await.expect("dns namespace");
    let shared: Api<ConfigMap> = Api::namespaced(client.clone(), dns_ns.name());
    shared
        .create(
            &PostParams::default(),
            &cm(
                "coredns",
                dns_ns.name(),
                "Corefile",
                ".:53 { hosts /etc/coredns/hosts }",
            ),
        )
        .await
        .expect("shared ConfigMap");
    let shared_dns = json!({"hostsConfigMap": "coredns", "hostsConfigMapNamespace": dns_ns.name(), "ingressNameTemplate": "{name}.{namespace}.lab.example.net"});
    apply(
        tailnets,
        tailnet_name,
        tailnet_object(tailnet_name, server, "Apply", shared_dns),
    )
    .await
    .expect("Tailnet with shared DNS ConfigMap");
    let merged = wait_for("the hosts key in the shared ConfigMap", WAIT, || async {
        let c = shared.get("coredns").await.map_err(|e| e.to_string())?;
        let data = c.data.clone().unwrap_or_default();
        if data.contains_key("hosts") && data.contains_key("extra-records.json") {
            Ok(c)
        } else {
            Err(format!("{:?}", data.keys().collect::<Vec<_>>()))
        }
    })
    .await;
    assert!(
        merged
            .data
            .clone()
            .unwrap_or_default()
            .contains_key("Corefile"),
        "the shared ConfigMap keeps its other keys"
    );
    assert!(
        merged.owner_references().is_empty(),
        "a shared ConfigMap must not be owned (and GC'd) by the Tailnet"
    );
}
