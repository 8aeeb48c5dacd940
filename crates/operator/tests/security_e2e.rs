//! Security end to end, against the real apiserver (PodSecurity admission in enforce mode),
//! real Headscale and real tailscaled nodes:
//! - the agent pods the operator renders are admitted in a namespace enforcing the
//!   "restricted" Pod Security Standard, and their ServiceAccount may touch only their own
//!   state Secret; in the running pods, the agent container's process has no service-account
//!   token (no mount, no file at the token path in its filesystem) while the tailscale
//!   container's process, beside it, has one;
//! - no secret value (Headscale API key, pre-auth keys, TLS private key, state Secret
//!   contents) appears in the operator's debug/trace log, Events, statuses, metrics,
//!   ConfigMaps or the live policy;
//! - pre-auth keys are single-use, tagged and short-lived, and used up once the node exists;
//!   a stolen auth Secret cannot log in another node;
//! - from the tailnet, an agent answers on its declared ports only; the admin port listens on
//!   the pod IP only.
//!
//! Prints `| check | expected | observed |` rows (docs/reliability.md).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod, Secret, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::conditions::{ConditionIs, WithConditions, describe, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{
    agent_pods, apply, apply_egress, bootstrap_applied_tailnet, ingress_object, join_client_node,
    remote_db_target, service_object, tailnet_ipv4, tls_secret,
};
use support::tailnet::{dial, self_signed};
use support::wait::{WAIT, wait_for};
use tailnet_api::naming::{AgentKind, AgentNames};
use tailnet_api::{TailnetEgress, TailnetIngress};
use tno_testenv::{E2eEnv, OperatorArgs, OperatorProcess};
use tno_testenv_tailnet::JoinedNode;

fn row(check: &str, expected: &str, observed: &str) {
    println!("| {check} | {expected} | {observed} |");
}

/// The key material in a tailscaled state Secret value: every `privkey:…`/`nlpriv:…` token,
/// whether the value is the key itself (`_machinekey`) or JSON that embeds keys (login
/// profiles). The rest of the state (node name, control URL, node id) is public: the
/// operator reports it in status.
fn secret_needles(value: &[u8], out: &mut Vec<String>) {
    let text = String::from_utf8_lossy(value);
    for token in text.split(|c: char| c == '"' || c == ',' || c.is_whitespace()) {
        if (token.starts_with("privkey:") || token.starts_with("nlpriv:")) && token.len() > 20 {
            out.push(token.to_string());
        }
    }
}

async fn dial_opens(node: &tno_testenv_tailnet::LocalApi, ip: &str, port: u16) -> bool {
    dial(node, ip, port, Duration::from_secs(4)).await.is_ok()
}

/// A dry-run create of `pod`: what admission (PodSecurity) says, nothing stored.
async fn dry_run_create(pods: &Api<Pod>, pod: &Pod) -> kube::Result<Pod> {
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    pods.create(&dry_run, pod).await
}

/// Whether `user` may `verb` the `resource` (one object when `name` is given) in `namespace`,
/// by a SubjectAccessReview.
async fn user_may(
    client: &kube::Client,
    user: &str,
    namespace: &str,
    verb: &str,
    resource: &str,
    name: Option<&str>,
) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                verb: Some(verb.into()),
                resource: Some(resource.into()),
                name: name.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

#[test]
fn agents_are_restricted_least_privileged_and_leak_no_secrets() {
    // Before any thread exists: the operator runs with trace logging for our crates and
    // debug for its libraries (start_operator passes the test process's RUST_LOG on).
    // SAFETY: single-threaded at this point (one test in this binary, no runtime yet).
    unsafe {
        std::env::set_var(
            "RUST_LOG",
            "debug,tailnet_operator=trace,tailnet_headscale=trace,tailnet_render=trace,tailnet_policy=trace",
        );
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"))
        .block_on(run());
}

async fn run() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("sec").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    namespace_enforces_restricted(&client, &ns, &pods).await;
    let tailnet_name = bootstrap_applied_tailnet(&env, &ops).await;
    let key_pem = ingress_tls_and_frontend(&client, &ns).await;
    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");
    let (egresses, ingresses) = apply_egress_and_ingress(&client, &ns, &tailnet_name).await;
    // Capture the pre-auth keys from the auth Secrets as soon as they exist.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let agents = [
        ("egress", AgentNames::new(AgentKind::Egress, "site")),
        ("ingress", AgentNames::new(AgentKind::Ingress, "portal")),
    ];
    let auth_keys = capture_auth_keys(&secrets, &agents).await;
    let egress = wait_for_condition(
        &egresses,
        "site",
        ConditionIs::new("NodeOnline", "True"),
        Some(&operator),
    )
    .await;
    let ingress = wait_for("ingress NodeOnline and PolicyEffective", WAIT, || async {
        let i = ingresses.get("portal").await.map_err(|e| e.to_string())?;
        if ConditionIs::new("NodeOnline", "True").holds_for(&i)
            && ConditionIs::new("PolicyEffective", "True").holds_for(&i)
        {
            Ok(i)
        } else {
            Err(describe(i.conditions()))
        }
    })
    .await;
    let headscale = tailnet_headscale::Client::new(
        &env.headscale_root_url(),
        tailnet_headscale::Secret::new(env.api_key()),
        tailnet_headscale::ClientOptions {
            server_ca_pem: Some(env.tailnet().headscale.ca_pem().to_owned()),
            ..Default::default()
        },
    )
    .expect("headscale client");
    let sec = Sec {
        env: &env,
        client: &client,
        ns: &ns,
        tailnet_name: &tailnet_name,
        pods: &pods,
        secrets: &secrets,
        egresses: &egresses,
        ingresses: &ingresses,
        agents: &agents,
        headscale: &headscale,
    };
    agent_pods_restricted_and_least_privileged(&sec).await;
    running_agent_containers_hold_no_token(&sec).await;
    pre_auth_keys_single_use(&sec, &egress, &ingress).await;
    let thief = stolen_auth_secret_refused(&sec, &auth_keys).await;
    tailnet_scan_finds_declared_ports_only(&sec, &egress, &ingress).await;
    ingress_agent_listeners(&sec).await;
    no_secret_values_anywhere(&sec, &operator, &auth_keys, &key_pem).await;
    a_refused_key_is_replaced_without_a_restart(&sec).await;
    operator.terminate().await.expect("operator stops cleanly");
    drop(thief);
    let _ = egress.name_any();
}

/// What the checks work with.
struct Sec<'a> {
    env: &'a E2eEnv,
    client: &'a kube::Client,
    ns: &'a str,
    tailnet_name: &'a str,
    pods: &'a Api<Pod>,
    secrets: &'a Api<Secret>,
    egresses: &'a Api<TailnetEgress>,
    ingresses: &'a Api<TailnetIngress>,
    /// (kind, names) of the egress and the ingress agent.
    agents: &'a [(&'a str, AgentNames); 2],
    headscale: &'a tailnet_headscale::Client,
}

async fn namespace_enforces_restricted(client: &kube::Client, ns: &str, pods: &Api<Pod>) {
    // (a) The namespace enforces "restricted" before any agent exists.
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::apply("security-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest"}}
            })),
        )
        .await
        .expect("label the namespace");
    let privileged: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged-probe"},
        "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": true}}]}
    }))
    .expect("pod");
    let refused = dry_run_create(pods, &privileged).await;
    row(
        "control: a privileged pod in the namespace (dry run)",
        "refused by PodSecurity (enforce=restricted)",
        &match &refused {
            Ok(_) => "admitted".to_string(),
            Err(e) => format!(
                "refused: {}",
                e.to_string().chars().take(120).collect::<String>()
            ),
        },
    );
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("PodSecurity")),
        "PodSecurity admission is not enforcing: {refused:?}"
    );
}

/// A TLS key the test knows, for the ingress (returned), and the frontend Service.
async fn ingress_tls_and_frontend(client: &kube::Client, ns: &str) -> String {
    let portal = format!("portal.{ns}.lab.example.net");
    let (cert_pem, key_pem) = self_signed(std::slice::from_ref(&portal));
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &tls_secret("portal-tls", &cert_pem, &key_pem),
        )
        .await
        .expect("TLS Secret");
    apply(
        &Api::<Service>::namespaced(client.clone(), ns),
        "frontend",
        service_object(ns, "frontend", 8080),
    )
    .await
    .expect("frontend Service");
    key_pem
}

async fn apply_egress_and_ingress(
    client: &kube::Client,
    ns: &str,
    tailnet_name: &str,
) -> (Api<TailnetEgress>, Api<TailnetIngress>) {
    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), ns);
    apply_egress(
        &egresses,
        ns,
        "site",
        tailnet_name,
        json!([remote_db_target()]),
    )
    .await
    .expect("egress");
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), ns);
    let exposes = json!([
        {"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443, "backend": {"service": "frontend", "port": 8080}},
        {"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 5432, "backend": {"service": "frontend", "port": 8080}}
    ]);
    apply(
        &ingresses,
        "portal",
        ingress_object(ns, "portal", tailnet_name, Some("portal-tls"), exposes),
    )
    .await
    .expect("ingress");
    (egresses, ingresses)
}

/// The pre-auth keys from the auth Secrets, captured as soon as they exist: (kind, key).
async fn capture_auth_keys(
    secrets: &Api<Secret>,
    agents: &[(&str, AgentNames); 2],
) -> Vec<(String, String)> {
    // Both Secrets are read in every round: an agent deletes its key from the Secret once it
    // has logged in, within seconds of starting, so waiting for one after the other can miss
    // the second (seen in CI under load).
    let captured = std::sync::Mutex::new(std::collections::BTreeMap::<String, String>::new());

    wait_for("the egress and ingress auth Secrets", WAIT, || async {
        for (kind, names) in agents {
            if captured
                .lock()
                .map_err(|e| e.to_string())?
                .contains_key(*kind)
            {
                continue;
            }
            let key = secrets
                .get_opt(&names.auth_secret)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|secret| {
                    secret
                        .data
                        .unwrap_or_default()
                        .get(tailnet_render::pod::AUTH_KEY)
                        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                })
                .filter(|v| !v.is_empty());
            if let Some(key) = key {
                captured
                    .lock()
                    .map_err(|e| e.to_string())?
                    .insert((*kind).to_string(), key);
            }
        }
        let captured = captured.lock().map_err(|e| e.to_string())?;
        let missing: Vec<&str> = agents
            .iter()
            .map(|(kind, _)| *kind)
            .filter(|kind| !captured.contains_key(*kind))
            .collect();
        if !missing.is_empty() {
            return Err(format!("no authkey yet for {missing:?}"));
        }
        Ok(captured
            .iter()
            .map(|(kind, key)| (kind.clone(), key.clone()))
            .collect::<Vec<_>>())
    })
    .await
}

async fn agent_pods_restricted_and_least_privileged(sec: &Sec<'_>) {
    let &Sec {
        client,
        ns,
        pods,
        agents,
        ..
    } = sec;
    // (a) The agent pods were admitted under enforce=restricted; their template passes a
    // dry-run create as a bare Pod too; their ServiceAccount reaches only the state Secret.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for (kind, names) in agents {
        let running = agent_pods(pods, &names.base).await.expect("agent pods");
        let deployment = deployments
            .get(&names.base)
            .await
            .expect("agent Deployment");
        let template = deployment.spec.map(|s| s.template).expect("pod template");
        let mut pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{}-dry-run", names.base)),
                labels: template.metadata.and_then(|m| m.labels),
                ..Default::default()
            },
            spec: template.spec,
            ..Default::default()
        };
        let admitted = dry_run_create(pods, &pod).await;
        row(
            &format!("{kind} agent pod under enforce=restricted"),
            "admitted (pods running; dry-run create of the template as a Pod admitted)",
            &format!(
                "{} pod(s) created by the ReplicaSet; dry run: {}",
                running.len(),
                match &admitted {
                    Ok(_) => "admitted".to_string(),
                    Err(e) => format!("refused: {e}"),
                }
            ),
        );
        assert!(!running.is_empty(), "no {kind} agent pod was admitted");
        assert!(
            admitted.is_ok(),
            "{kind} agent pod template refused: {admitted:?}"
        );

        let spec = pod.spec.take().expect("spec");
        let account = spec.service_account_name.clone().unwrap_or_default();
        let user = format!("system:serviceaccount:{ns}:{account}");
        let mut verdicts = Vec::new();
        for (verb, name, expected) in [
            ("get", Some(names.state_secret.as_str()), true),
            ("update", Some(names.state_secret.as_str()), true),
            ("get", Some(names.auth_secret.as_str()), false),
            ("get", Some("portal-tls"), false),
            ("list", None, false),
            ("create", None, false),
        ] {
            let allowed = user_may(client, &user, ns, verb, "secrets", name).await;
            verdicts.push(format!(
                "{verb} {}: {}",
                name.unwrap_or("*"),
                if allowed { "yes" } else { "no" }
            ));
            assert_eq!(
                allowed, expected,
                "{kind} agent SA may {verb} secret {name:?}"
            );
        }
        for (verb, resource) in [
            ("list", "pods"),
            ("get", "configmaps"),
            ("list", "tailnetegresses"),
        ] {
            let allowed = user_may(client, &user, ns, verb, resource, None).await;
            verdicts.push(format!(
                "{verb} {resource}: {}",
                if allowed { "yes" } else { "no" }
            ));
            assert!(!allowed, "{kind} agent SA may {verb} {resource}");
        }
        row(
            &format!("{kind} agent ServiceAccount (SubjectAccessReview)"),
            "only get/update of its own state Secret",
            &verdicts.join("; "),
        );
    }
}

/// Where the kubelet mounts a service-account token.
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The agent container holds no Kubernetes credentials, checked on the running pods (not the
/// rendered object): the test kubelet runs each container as a process with its own mount
/// namespace, so the filesystem the agent process sees is read through `/proc/<pid>/root`
/// and its mounts through `/proc/<pid>/mountinfo`. The tailscale container's process in the
/// same pod is the witness that the check finds a token where one is mounted.
async fn running_agent_containers_hold_no_token(sec: &Sec<'_>) {
    let &Sec {
        env, pods, agents, ..
    } = sec;
    for (kind, names) in agents {
        let pod = agent_pods(pods, &names.base)
            .await
            .expect("agent pods")
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no {kind} agent pod"));
        let uid = pod.metadata.uid.clone().expect("pod uid");
        let pids = env
            .pod_netns(&uid)
            .pids()
            .expect("processes of the pod's netns");
        let process_of = |program: &str| {
            pids.iter()
                .copied()
                .find(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(program))
                })
                .unwrap_or_else(|| panic!("no {program} process in the {kind} agent pod: {pids:?}"))
        };
        let agent = token_view(process_of("tailnet-agent"));
        let tailscale = token_view(process_of("tailscaled"));
        row(
            &format!("{kind} agent pod: service-account token as the running containers see it"),
            &format!("tailnet-agent: no mount at {TOKEN_DIR}, no token file; tailscale: both"),
            &format!("tailnet-agent: {agent}; tailscale: {tailscale}"),
        );
        assert!(
            tailscale.mounted && tailscale.jwt,
            "{kind}: the tailscale container shows no token, so the check cannot see one: {tailscale}"
        );
        assert!(
            !agent.mounted && !agent.file_exists,
            "{kind}: the agent container holds a Kubernetes token: {agent}"
        );
    }
}

/// What one container process sees of a service-account token.
struct TokenView {
    pid: u32,
    /// A mount point at (or below) the token directory in its mount namespace.
    mounted: bool,
    /// Something at `<TOKEN_DIR>/token` in its filesystem.
    file_exists: bool,
    /// …and it is a JWT (three dot-separated parts).
    jwt: bool,
}

impl std::fmt::Display for TokenView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} mount={} token file={} jwt={}",
            self.pid, self.mounted, self.file_exists, self.jwt
        )
    }
}

fn token_view(pid: u32) -> TokenView {
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/mountinfo: {e}"));
    // /var/run is a link to /run in most images: the mount point shows the resolved path.
    let resolved_dir = TOKEN_DIR.trim_start_matches("/var");
    let mounted = mountinfo.lines().any(|line| {
        line.split_whitespace()
            .nth(4)
            .is_some_and(|point| point.starts_with(TOKEN_DIR) || point.starts_with(resolved_dir))
    });
    let token = in_container(pid, &format!("{TOKEN_DIR}/token"));
    let contents = token.as_ref().and_then(|path| std::fs::read(path).ok());
    TokenView {
        pid,
        mounted,
        file_exists: token
            .as_ref()
            .is_some_and(|path| path.symlink_metadata().is_ok()),
        jwt: contents.is_some_and(|jwt| {
            let parts: Vec<&[u8]> = jwt.split(|b| *b == b'.').collect();
            parts.len() == 3 && parts.iter().all(|part| !part.is_empty())
        }),
    }
}

/// `path` as process `pid` sees it, as a host path below `/proc/<pid>/root`: each symlink is
/// resolved against the process's root (an absolute link such as `/var/run -> /run` leads
/// into the container, not to the host's). `None` for a link loop.
fn in_container(pid: u32, path: &str) -> Option<std::path::PathBuf> {
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    let components = |text: &str| -> std::collections::VecDeque<String> {
        text.split('/')
            .filter(|part| !part.is_empty() && *part != ".")
            .map(str::to_string)
            .collect()
    };
    let mut resolved = std::path::PathBuf::new();
    let mut pending = components(path);
    let mut links = 0;
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&part);
        match std::fs::read_link(root.join(&candidate)) {
            Ok(target) => {
                links += 1;
                if links > 40 {
                    return None;
                }
                let target = target.to_string_lossy().into_owned();
                if target.starts_with('/') {
                    resolved = std::path::PathBuf::new();
                }
                let mut next = components(&target);
                next.extend(pending.drain(..));
                pending = next;
            }
            Err(_) => resolved = candidate,
        }
    }
    Some(root.join(resolved))
}

async fn pre_auth_keys_single_use(sec: &Sec<'_>, egress: &TailnetEgress, ingress: &TailnetIngress) {
    let &Sec { headscale, .. } = sec;
    // (c) Pre-auth keys: single-use, tagged, short-lived, used up once the node exists.
    let keys = headscale.list_pre_auth_keys().await.expect("pre-auth keys");
    let now = jiff::Timestamp::now();
    for (kind, agent_tag) in [
        ("egress", egress.status.as_ref().and_then(|s| s.tag.clone())),
        (
            "ingress",
            ingress.status.as_ref().and_then(|s| s.tag.clone()),
        ),
    ] {
        let agent_tag = agent_tag.unwrap_or_else(|| panic!("{kind} status has no tag"));
        let mine: Vec<_> = keys
            .iter()
            .filter(|k| k.acl_tags.contains(&agent_tag))
            .collect();
        assert!(!mine.is_empty(), "no pre-auth key tagged {agent_tag}");
        let mut observed = Vec::new();
        for key in &mine {
            let lifetime = match (key.created_at, key.expiration) {
                (Some(created), Some(expires)) => expires.duration_since(created).as_secs(),
                _ => i64::MAX,
            };
            let expired = key.expiration.is_some_and(|e| e <= now);
            observed.push(format!(
                "reusable={} tags={:?} lifetime={lifetime}s used={} expired={expired}",
                key.reusable, key.acl_tags, key.used
            ));
            assert!(!key.reusable, "{kind} pre-auth key is reusable");
            assert!(lifetime <= 3600, "{kind} pre-auth key lives {lifetime}s");
            assert!(
                key.used || expired,
                "{kind} pre-auth key still usable after the node exists"
            );
        }
        row(
            &format!("{kind} pre-auth key(s)"),
            "single-use, tagged, ≤ 1 h, used or expired once the node exists",
            &observed.join("; "),
        );
    }
}

/// Returns the thief's node (kept until the end of the test).
async fn stolen_auth_secret_refused(sec: &Sec<'_>, auth_keys: &[(String, String)]) -> JoinedNode {
    let &Sec {
        env, ns, headscale, ..
    } = sec;
    // A stolen auth Secret: log a fresh node in with it.
    let thief = join_client_node(env, "thief", ns).await;
    let nodes_before = headscale.list_nodes().await.expect("nodes").len();
    for (kind, stolen) in auth_keys {
        let socket = thief.node.state_dir().join("tailscaled.sock");
        let mut command = thief
            .netns
            .command(&env.tailnet().binaries.tailscale)
            .expect("tailscale command");
        command
            .arg(format!("--socket={}", socket.display()))
            .args(["up", "--force-reauth", "--timeout=20s", "--reset"])
            .arg(format!("--login-server={}", env.headscale_url()))
            .arg(format!("--auth-key={stolen}"))
            .arg("--hostname=stolen-login");
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .expect("join")
            .expect("tailscale up");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let nodes = headscale.list_nodes().await.expect("nodes");
        let stolen_node = nodes
            .iter()
            .any(|n| n.given_name.contains("stolen-login") || n.name.contains("stolen-login"));
        row(
            &format!(
                "`tailscale up --auth-key` with the {kind} agent's auth Secret on a fresh node"
            ),
            "refused; no node registered",
            &format!(
                "exit {:?}: {}; nodes {nodes_before} → {}",
                output.status.code(),
                stderr
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .chars()
                    .take(120)
                    .collect::<String>(),
                nodes.len()
            ),
        );
        assert!(
            !output.status.success(),
            "the stolen {kind} key logged a node in: {stderr}"
        );
        assert!(!stolen_node, "a node registered with the stolen {kind} key");
    }
    thief
}

async fn tailnet_scan_finds_declared_ports_only(
    sec: &Sec<'_>,
    egress: &TailnetEgress,
    ingress: &TailnetIngress,
) {
    let &Sec { env, .. } = sec;
    // (d) From the tailnet, the ingress agent answers on its declared ports only (the laptop
    // is in allowFrom); the egress agent on none.
    let laptop = env.tailnet().laptop.node.local_api();
    let ipv4 = |ips: Vec<String>| tailnet_ipv4(&ips).expect("tailnet IPv4");
    let ingress_ip = ipv4(ingress.status.clone().unwrap_or_default().tailnet_ips);
    let egress_ip = ipv4(egress.status.clone().unwrap_or_default().tailnet_ips);
    wait_for(
        "declared port 5432 reachable from the laptop",
        WAIT,
        || async {
            if dial_opens(&laptop, &ingress_ip, 5432).await {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        },
    )
    .await;
    let scanned: [u16; 14] = [
        22, 80, 1055, 1080, 3128, 5252, 6443, 8080, 8443, 9002, 9090, 9180, 10000, 41112,
    ];
    let mut open = Vec::new();
    for port in scanned {
        for (kind, ip) in [("ingress", &ingress_ip), ("egress", &egress_ip)] {
            if dial_opens(&laptop, ip, port).await {
                open.push(format!("{kind}:{port}"));
            }
        }
    }
    let egress_declared = dial_opens(&laptop, &egress_ip, 5432).await;
    row(
        "laptop (in allowFrom) scans the agents' tailnet IPs",
        "ingress: 443/5432 only; egress: nothing",
        &format!(
            "ingress 5432 open; ports {scanned:?} open: {open:?}; egress 5432: {}",
            if egress_declared { "open" } else { "closed" }
        ),
    );
    assert!(
        open.is_empty(),
        "undeclared ports answer from the tailnet: {open:?}"
    );
    assert!(
        !egress_declared,
        "the egress agent accepts tailnet connections"
    );
}

async fn ingress_agent_listeners(sec: &Sec<'_>) {
    let &Sec { pods, agents, .. } = sec;
    // Listeners inside the ingress agent's network namespace: the admin port on the pod IP.
    let agent_pod = agent_pods(pods, &agents[1].1.base)
        .await
        .expect("pods")
        .into_iter()
        .next()
        .expect("ingress agent pod");
    let pod_ip = agent_pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    // The kubelet runs the pods on this host: not finding the agent process is a failure,
    // not a reason to skip the check. Its socket table must show the declared loopback
    // listeners (443 once the certificate is loaded, 5432), so it is the agent's.
    let declared = ["127.0.0.1:443", "127.0.0.1:5432"];
    let listeners = wait_for(
        "the ingress agent's socket table with its declared listeners",
        WAIT,
        || async {
            let listeners = agent_listeners(&pod_ip)?;
            if declared
                .iter()
                .all(|d| listeners.iter().any(|(a, _)| a == d))
            {
                Ok(listeners)
            } else {
                Err(format!("declared {declared:?}, listening {listeners:?}"))
            }
        },
    )
    .await;
    row(
        "TCP listeners in the ingress agent pod (/proc/<agent>/net/tcp)",
        "admin 9180 on the pod IP only; loopback 443/5432 only; no proxy ports",
        &format!("{listeners:?}"),
    );
    let addresses: Vec<&str> = listeners.iter().map(|(a, _)| a.as_str()).collect();
    assert!(
        addresses.contains(&format!("{pod_ip}:9180").as_str()),
        "{listeners:?}"
    );
    assert!(
        !addresses
            .iter()
            .any(|a| a.ends_with(":9180") && !a.starts_with(&pod_ip)),
        "admin port bound beyond the pod IP: {listeners:?}"
    );
    assert!(
        !addresses
            .iter()
            .any(|a| a.ends_with(":1055") || a.ends_with(":1080") || a.ends_with(":3128")),
        "a proxy port listens: {listeners:?}"
    );
    // Loopback is where tailscaled forwards tailnet connections: only the declared ports.
    for address in &addresses {
        if address.starts_with("127.0.0.1:") {
            assert!(
                declared.contains(address),
                "undeclared loopback listener {address}: {listeners:?}"
            );
        }
    }
}

async fn no_secret_values_anywhere(
    sec: &Sec<'_>,
    operator: &OperatorProcess,
    auth_keys: &[(String, String)],
    key_pem: &str,
) {
    let &Sec {
        env,
        client,
        tailnet_name,
        secrets,
        egresses,
        ingresses,
        agents,
        headscale,
        ..
    } = sec;
    // (b) No secret value anywhere the operator writes.
    let mut needles: Vec<(String, String)> =
        vec![("Headscale API key".into(), env.api_key().to_string())];
    for (kind, key) in auth_keys {
        needles.push((format!("{kind} pre-auth key"), key.clone()));
    }
    let key_body = key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .max_by_key(|l| l.len())
        .unwrap_or_default()
        .to_string();
    needles.push(("TLS private key".into(), key_body));
    for (kind, names) in agents {
        if let Ok(Some(state)) = secrets.get_opt(&names.state_secret).await {
            for (key, value) in state.data.unwrap_or_default() {
                let mut values = Vec::new();
                secret_needles(&value.0, &mut values);
                for value in values {
                    needles.push((format!("{kind} state Secret key {key}"), value));
                }
            }
        }
    }
    let mut haystacks: Vec<(&str, String)> = vec![("operator log (trace)", operator.log_text())];
    let events = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("events");
    haystacks.push((
        "Events",
        serde_json::to_string(&events.items).unwrap_or_default(),
    ));
    haystacks.push((
        "TailnetEgress/TailnetIngress/Tailnet objects",
        format!(
            "{}{}{}",
            serde_json::to_string(
                &egresses
                    .list(&ListParams::default())
                    .await
                    .expect("egresses")
                    .items
            )
            .unwrap_or_default(),
            serde_json::to_string(
                &ingresses
                    .list(&ListParams::default())
                    .await
                    .expect("ingresses")
                    .items
            )
            .unwrap_or_default(),
            serde_json::to_string(
                &Api::<tailnet_api::Tailnet>::all(client.clone())
                    .get(tailnet_name)
                    .await
                    .expect("tailnet")
            )
            .unwrap_or_default(),
        ),
    ));
    haystacks.push((
        "operator metrics",
        operator.metrics().await.unwrap_or_default(),
    ));
    let config_maps = Api::<ConfigMap>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("configmaps");
    haystacks.push((
        "ConfigMaps (all namespaces)",
        serde_json::to_string(&config_maps.items).unwrap_or_default(),
    ));
    haystacks.push((
        "live Headscale policy",
        headscale
            .get_policy()
            .await
            .map(|p| format!("{p:?}"))
            .unwrap_or_default(),
    ));
    let state_keys = needles
        .iter()
        .filter(|(what, _)| what.contains("state Secret"))
        .count();
    assert!(
        state_keys >= 2,
        "no private keys found in the agents' state Secrets ({state_keys}); the check would prove nothing"
    );
    let needle_count = needles.len();
    for (place, haystack) in &haystacks {
        let found: Vec<&str> = needles
            .iter()
            .filter(|(_, value)| !value.is_empty() && haystack.contains(value.as_str()))
            .map(|(what, _)| what.as_str())
            .collect();
        row(
            &format!("secret values in {place}"),
            "none",
            &format!(
                "{} bytes searched for {needle_count} values: {}",
                haystack.len(),
                if found.is_empty() {
                    "none found".to_string()
                } else {
                    format!("FOUND {found:?}")
                }
            ),
        );
        assert!(found.is_empty(), "secret values in {place}: {found:?}");
    }
    assert!(
        haystacks[0].1.contains("TRACE") || haystacks[0].1.contains("DEBUG"),
        "the operator log has no debug/trace lines; the check would prove nothing"
    );
    assert!(
        needle_count >= 4,
        "too few secret values collected: {needle_count}"
    );
}

/// TCP listeners (`ip:port`, owning process) in the network namespace of the tailnet-agent
/// process whose `POD_IP` is `pod_ip`, from `/proc/<pid>/net/tcp` (the socket table of its
/// network namespace). An error when no such process is found or its table cannot be read.
fn agent_listeners(pod_ip: &str) -> Result<Vec<(String, String)>, String> {
    let entries = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    let mut agents_seen = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline).contains("tailnet-agent") {
            continue;
        }
        agents_seen += 1;
        let Ok(environ) = std::fs::read(path.join("environ")) else {
            continue;
        };
        let wanted = format!("POD_IP={pod_ip}");
        if !environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()) {
            continue;
        }
        let table = std::fs::read_to_string(path.join("net/tcp"))
            .map_err(|e| format!("{}/net/tcp: {e}", path.display()))?;
        let owners = socket_owners(&path);
        let listeners = table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if fields.get(3) != Some(&"0A") {
                    return None;
                }
                let (ip, port) = fields.get(1)?.split_once(':')?;
                let ip = u32::from_str_radix(ip, 16).ok()?;
                let port = u16::from_str_radix(port, 16).ok()?;
                let owner = fields
                    .get(9)
                    .and_then(|inode| owners.get(*inode))
                    .map_or("?", String::as_str);
                Some((
                    format!("{}:{port}", std::net::Ipv4Addr::from(ip.swap_bytes())),
                    owner.to_string(),
                ))
            })
            .collect();
        return Ok(listeners);
    }
    Err(format!(
        "no tailnet-agent process with POD_IP={pod_ip} ({agents_seen} tailnet-agent processes seen)"
    ))
}

/// Socket inode → process name, for every process in the network namespace of `process`.
fn socket_owners(process: &std::path::Path) -> BTreeMap<String, String> {
    let mut owners = BTreeMap::new();
    let Ok(netns) = std::fs::read_link(process.join("ns/net")) else {
        return owners;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return owners;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if std::fs::read_link(path.join("ns/net")).ok().as_ref() != Some(&netns) {
            continue;
        }
        let name = std::fs::read_to_string(path.join("comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        let Ok(fds) = std::fs::read_dir(path.join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|t| t.strip_suffix(']'))
                {
                    owners.insert(inode.to_string(), name.clone());
                }
            }
        }
    }
    owners
}

/// tailscaled reads its login config once, at start: a key control refuses (one that expired
/// before the first login, say) leaves it waiting for a login. Once the operator writes a
/// fresh key into the auth Secret, the agent has tailscaled re-read the config and log in with
/// it: the node comes up in the same pod, no container restarted. The refused key is planted
/// in the auth Secret before the egress exists, annotated as a pending key the operator keeps;
/// deleting the Secret makes the operator mint a real one.
async fn a_refused_key_is_replaced_without_a_restart(sec: &Sec<'_>) {
    const REFUSED_KEY: &str = "hskey-auth-refusedrefusedrefusedrefusedrefused";
    let names = AgentNames::new(AgentKind::Egress, "relogin");
    let login = tailnet_render::pod::TailscaledLogin::for_agent(
        AgentKind::Egress,
        &sec.env.headscale_url(),
        &names.base,
    );
    let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_mins(50);
    let planted: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": names.auth_secret, "namespace": sec.ns, "annotations": {
            "tailnet-operator.dev/pre-auth-key-id": "999999",
            "tailnet-operator.dev/pre-auth-key-expires": expires.to_string()}},
        "stringData": {"authkey": REFUSED_KEY, "tailscaled.json": login.config_json(REFUSED_KEY)}
    }))
    .expect("Secret");
    sec.secrets
        .create(&PostParams::default(), &planted)
        .await
        .expect("plant the refused key");
    apply_egress(
        sec.egresses,
        sec.ns,
        "relogin",
        sec.tailnet_name,
        json!([remote_db_target()]),
    )
    .await
    .expect("egress relogin");
    // Witness: tailscaled got no login with the refused key and the agent had it retry (its
    // own metrics say so), before any fresh key exists.
    let waiting = wait_for(
        "the relogin agent retrying tailscaled's login",
        WAIT,
        || async {
            let pod = agent_pods(sec.pods, &names.base)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .next()
                .ok_or("no agent pod yet")?;
            let ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .ok_or("no pod IP yet")?;
            let metrics = support::agent::agent_metrics(sec.env, &ip).await?;
            let retries =
                support::agent::metric_sum(&metrics, "tailnet_agent_login_retries_total", &[]);
            let connected =
                support::agent::metric_sum(&metrics, "tailnet_agent_tailnet_connected", &[]);
            if retries >= 1.0 && connected == 0.0 {
                Ok(pod)
            } else {
                let states: Vec<&str> = metrics
                    .lines()
                    .filter(|l| l.starts_with("tailnet_agent_tailnet_state"))
                    .collect();
                Err(format!(
                    "login retries {retries}, connected {connected}, {states:?}"
                ))
            }
        },
    )
    .await;
    sec.secrets
        .delete(&names.auth_secret, &Default::default())
        .await
        .expect("delete the refused key's Secret");
    let egress = wait_for_condition(
        sec.egresses,
        "relogin",
        ConditionIs::new("NodeOnline", "True"),
        None,
    )
    .await;
    let pod = agent_pods(sec.pods, &names.base)
        .await
        .expect("agent pods")
        .into_iter()
        .next()
        .expect("the agent pod");
    let restarts: i32 = pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|c| c.restart_count)
        .sum();
    row(
        "refused pre-auth key, then a fresh one in the auth Secret",
        "the node comes up in the same pod, no container restarted",
        &format!(
            "NodeOnline (node {:?}); pod {} (was {}), restarts {restarts}",
            egress.status.as_ref().and_then(|s| s.node_id.clone()),
            pod.uid().unwrap_or_default(),
            waiting.uid().unwrap_or_default()
        ),
    );
    assert_eq!(pod.uid(), waiting.uid(), "the agent pod was replaced");
    assert_eq!(restarts, 0, "a container restarted: {:?}", pod.status);
    sec.egresses
        .delete("relogin", &Default::default())
        .await
        .expect("delete egress relogin");
}
