//! Real Headscale, real tailscaled, real namespaces. Needs root and `deps/build.sh` binaries.
//! One environment per test binary ([`TailnetEnv::shared`]); only
//! `subnet_route_needs_grant_and_approval` changes the policy and route approvals, only
//! `extra_records_file_reaches_the_nodes_resolver` the extra records (with the kubelet's
//! `..data` symlink swap). `kernel_mode_node_lets_any_process_of_its_netns_reach_the_tailnet`
//! runs a node with a kernel TUN device.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use tno_netlab::Netns;
use tno_testenv_tailnet::{
    BASE_DOMAIN, Behaviour, CLIENT_TAG, Dialed, ExtraRecord, JoinOptions, KERNEL_TUN_DEVICE,
    LAPTOP_USER, LocalApi, SERVER_PORT, SERVER_TAG, SITE_BANNER, SITE_ECHO, SITE_ROUTES,
    TailnetEnv, TcpTestServer, TunMode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One dial attempt; a dial that the ACL drops hangs, so this bounds it.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long policy, route and peer changes may take to reach the nodes.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a path must stay closed to count as closed.
const CLOSED_WINDOW: Duration = Duration::from_secs(6);

/// Prints the tails of the given logs when the test panics, so CI failures are diagnosable.
struct DumpLogsOnPanic(Vec<PathBuf>);

impl DumpLogsOnPanic {
    fn new(env: &TailnetEnv) -> Self {
        DumpLogsOnPanic(vec![
            env.headscale.log_path(),
            env.site.router.log_path(),
            env.laptop.node.log_path(),
        ])
    }
}

impl Drop for DumpLogsOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for path in &self.0 {
                eprintln!(
                    "==== {} ====\n{}",
                    path.display(),
                    tno_netlab::process::log_tail(path, 40)
                );
            }
        }
    }
}

async fn shared_env() -> &'static TailnetEnv {
    match TailnetEnv::shared().await {
        Ok(env) => env,
        Err(error) => panic!("tailnet environment: {error}"),
    }
}

/// Dials `host:port` through the node's LocalAPI, writes `payload` and reads as many bytes
/// back. `Err` says why not (Dial-Self, HTTP error, timeout, short read).
async fn echo_through(
    api: &LocalApi,
    host: &str,
    port: u16,
    payload: &[u8],
) -> Result<Vec<u8>, String> {
    let attempt = async {
        let mut stream = match api.dial(host, port).await.map_err(|e| e.to_string())? {
            Dialed::Tailnet(stream) => stream,
            Dialed::DialSelf { addr } => {
                return Err(format!("Dial-Self ({addr}): not routed via the tailnet"));
            }
        };
        stream
            .write_all(payload)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut echoed = vec![0u8; payload.len()];
        stream
            .read_exact(&mut echoed)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok(echoed)
    };
    tokio::time::timeout(ATTEMPT_TIMEOUT, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {ATTEMPT_TIMEOUT:?}")))
}

/// Retries until the echo comes back, or fails with the last reason after `CONVERGE_TIMEOUT`.
async fn wait_until_echo(api: &LocalApi, host: &str, port: u16, what: &str) {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let payload = format!("hello {what}").into_bytes();
    loop {
        match echo_through(api, host, port, &payload).await {
            Ok(echoed) if echoed == payload => return,
            Ok(echoed) => panic!("{what}: wrong echo {echoed:?}"),
            Err(reason) if Instant::now() > deadline => {
                panic!("{what}: not reachable within {CONVERGE_TIMEOUT:?}: {reason}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Retries until the echo fails (the change that closes the path has propagated).
async fn wait_until_closed(api: &LocalApi, host: &str, port: u16, what: &str) -> String {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        match echo_through(api, host, port, b"still open?").await {
            Err(reason) => return reason,
            Ok(_) if Instant::now() > deadline => {
                panic!("{what}: still reachable after {CONVERGE_TIMEOUT:?}")
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Fails if any attempt within `CLOSED_WINDOW` gets through; returns the last reason.
async fn assert_stays_closed(api: &LocalApi, host: &str, port: u16, what: &str) -> String {
    let deadline = Instant::now() + CLOSED_WINDOW;
    loop {
        match echo_through(api, host, port, b"must not arrive").await {
            Ok(_) => panic!("{what}: reachable, but must not be"),
            Err(reason) if Instant::now() > deadline => return reason,
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// An echo server on the node's loopback that records who connected, via LocalAPI whois
/// (tailscaled forwards tailnet connections to unclaimed ports to 127.0.0.1).
fn spawn_whois_echo(
    listener: std::net::TcpListener,
    api: LocalApi,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (seen_tx, seen_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let Ok(listener) = listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
        else {
            return;
        };
        while let Ok((mut stream, peer)) = listener.accept().await {
            let (api, seen_tx) = (api.clone(), seen_tx.clone());
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let Ok(read) = stream.read(&mut buffer).await else {
                    return;
                };
                // After the first byte, as the SPEC's ingress path does.
                let login = match api.whois(&peer.to_string(), Some("tcp")).await {
                    Ok(Some(whois)) => whois.user_profile.login_name,
                    Ok(None) => "<unknown peer>".into(),
                    Err(error) => format!("<whois failed: {error}>"),
                };
                let _ = seen_tx.send(login);
                let _ = stream.write_all(&buffer[..read]).await;
                let mut rest = [0u8; 4096];
                while let Ok(read) = stream.read(&mut rest).await {
                    if read == 0 || stream.write_all(&rest[..read]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    seen_rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tagged_nodes_talk_across_the_tailnet_and_whois_names_the_user() {
    let env = shared_env().await;
    let mut logs = DumpLogsOnPanic::new(env);
    let server_options = JoinOptions {
        tags: vec![SERVER_TAG.into()],
        ..JoinOptions::default()
    };
    let client_options = JoinOptions {
        tags: vec![CLIENT_TAG.into()],
        ..JoinOptions::default()
    };
    let (server, client) = tokio::join!(
        env.join_node("t1-server", server_options),
        env.join_node("t1-client", client_options)
    );
    let server = server.expect("server node joins with a tagged key");
    let client = client.expect("client node joins with a tagged key");
    logs.0
        .extend([server.node.log_path(), client.node.log_path()]);

    let listener = server
        .netns
        .bind_tcp(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::LOCALHOST,
            SERVER_PORT,
        )))
        .expect("listener on the server node's loopback");
    let mut seen = spawn_whois_echo(listener, server.node.local_api());
    let server_ip = server.node.tailnet_ipv4().await.expect("server tailnet IP");

    let nodes = env.headscale.api().list_nodes().await.expect("list nodes");
    let server_entry = nodes
        .iter()
        .find(|node| node.given_name == "t1-server")
        .expect("headscale lists the server node");
    assert_eq!(server_entry.tags, vec![SERVER_TAG.to_owned()]);
    assert!(
        server_entry.ip_addresses.contains(&server_ip),
        "{server_entry:?}"
    );

    wait_until_echo(
        &client.node.local_api(),
        &server_ip,
        SERVER_PORT,
        "client → server",
    )
    .await;
    let first = seen.recv().await.expect("server saw the client");
    assert!(
        !first.contains(LAPTOP_USER),
        "a tagged client is not alice: {first}"
    );

    // The laptop (alice, group:team-a) is allowed by the group grant, and whois names her.
    wait_until_echo(
        &env.laptop.node.local_api(),
        &server_ip,
        SERVER_PORT,
        "laptop → server",
    )
    .await;
    let mut logins = Vec::new();
    while let Ok(login) = seen.try_recv() {
        logins.push(login);
    }
    assert!(
        logins.iter().any(|login| login.contains(LAPTOP_USER)),
        "whois of the laptop's connections: {logins:?}"
    );

    // A port the policy does not open stays closed.
    let other_port = SERVER_PORT + 1;
    let _other = server
        .netns
        .bind_tcp(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::LOCALHOST,
            other_port,
        )))
        .expect("second listener");
    assert_stays_closed(
        &client.node.local_api(),
        &server_ip,
        other_port,
        "ungranted port",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subnet_route_needs_grant_and_approval() {
    let env = shared_env().await;
    let mut logs = DumpLogsOnPanic::new(env);
    let api = env.headscale.api();
    let client = env
        .join_node(
            "t2-client",
            JoinOptions {
                tags: vec![CLIENT_TAG.into()],
                accept_routes: true,
                ..JoinOptions::default()
            },
        )
        .await
        .expect("client joins");
    logs.0.push(client.node.log_path());
    let local_api = client.node.local_api();
    let echo_host = SITE_ECHO.ip().to_string();

    // The router's advertisement reaches Headscale; nothing is approved yet.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let router = loop {
        let nodes = api.list_nodes().await.expect("list nodes");
        if let Some(router) = nodes.into_iter().find(|node| node.given_name == "router")
            && SITE_ROUTES
                .iter()
                .all(|route| router.available_routes.iter().any(|r| r == route))
        {
            break router;
        }
        assert!(
            Instant::now() < deadline,
            "router never advertised {SITE_ROUTES:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(router.approved_routes.is_empty(), "{router:?}");

    let grant = json!({
        "src": [CLIENT_TAG],
        "dst": [format!("{}/32", SITE_ECHO.ip())],
        "ip": [format!("tcp:{}", SITE_ECHO.port())],
    });
    let granted = env.policy_with_grants(&[grant]).expect("policy");
    api.check_policy(&granted)
        .await
        .expect("headscale accepts the policy");
    api.set_policy(&granted).await.expect("set policy");

    // Granted but not approved: no path.
    let reason =
        assert_stays_closed(&local_api, &echo_host, SITE_ECHO.port(), "unapproved route").await;
    eprintln!("granted, unapproved: {reason}");

    // Approved via the API: the echo crosses client → DERP → router → 192.0.2.10.
    let approved = api
        .approve_routes(router.id, &SITE_ROUTES)
        .await
        .expect("approve routes");
    assert_eq!(
        approved.approved_routes.len(),
        SITE_ROUTES.len(),
        "{approved:?}"
    );
    wait_until_echo(
        &local_api,
        &echo_host,
        SITE_ECHO.port(),
        "client → 192.0.2.10:5432",
    )
    .await;

    // The grant is per destination: the banner server on the other approved route stays closed.
    let banner_reason = assert_stays_closed(
        &local_api,
        &SITE_BANNER.ip().to_string(),
        SITE_BANNER.port(),
        "ungranted 198.51.100.20:443",
    )
    .await;
    eprintln!("approved, ungranted destination: {banner_reason}");

    // Without the grant the path closes again.
    api.set_policy(&env.policy_with_grants(&[]).expect("policy"))
        .await
        .expect("reset policy");
    let reason = wait_until_closed(&local_api, &echo_host, SITE_ECHO.port(), "revoked grant").await;
    eprintln!("approved, grant revoked: {reason}");
    assert_stays_closed(&local_api, &echo_host, SITE_ECHO.port(), "revoked grant").await;

    api.approve_routes(router.id, &[])
        .await
        .expect("unapprove routes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_has_no_path_to_the_remote_site() {
    let env = shared_env().await;
    let _logs = DumpLogsOnPanic::new(env);
    let target = SocketAddr::V4(SITE_ECHO);

    // The server is up: from inside the site it answers.
    env.site
        .netns
        .connect_tcp(target, ATTEMPT_TIMEOUT)
        .expect("enter site netns")
        .expect("192.0.2.10:5432 answers inside the remote site");

    let pod = env.lab.add_pod_netns("leak-probe").expect("pod netns");
    for netns in [env.lab.netns(), &*pod.netns, &env.laptop.netns] {
        let started = Instant::now();
        let result = netns
            .connect_tcp(target, ATTEMPT_TIMEOUT)
            .expect("enter netns");
        assert!(
            result.is_err(),
            "{} reached {target} outside the tailnet",
            netns.name()
        );
        eprintln!(
            "{}: {:?} after {:?}",
            netns.name(),
            result.err(),
            started.elapsed()
        );
    }
    env.lab
        .remove_pod_netns("leak-probe")
        .expect("remove pod netns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_check_rejects_an_invalid_document_and_keeps_the_live_one() {
    let env = shared_env().await;
    let _logs = DumpLogsOnPanic::new(env);
    let api = env.headscale.api();
    let invalid = r#"{"grants": [{"src": ["tag:undeclared"], "dst": ["*"], "ip": ["*"]}]}"#;
    let error = api
        .check_policy(invalid)
        .await
        .expect_err("a grant from an undeclared tag is rejected");
    eprintln!("check rejected: {error}");
    assert!(
        api.set_policy(invalid).await.is_err(),
        "set must reject it too"
    );
    let live = api.get_policy().await.expect("get policy");
    assert!(live.contains("tag:router"), "live policy replaced: {live}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_records_file_reaches_the_nodes_resolver() {
    let env = shared_env().await;
    let _logs = DumpLogsOnPanic::new(env);
    let name = format!("grafana.{BASE_DOMAIN}");
    let address = Ipv4Addr::new(100, 64, 0, 250);
    let laptop = env.laptop.node.local_api();
    let resolves = |expected: bool| {
        let (laptop, name) = (laptop.clone(), name.clone());
        async move {
            let deadline = Instant::now() + CONVERGE_TIMEOUT;
            loop {
                let answer = laptop.resolve_ipv4(&name).await;
                match &answer {
                    Ok(addresses) if addresses.contains(&address) == expected => return,
                    _ if Instant::now() > deadline => {
                        panic!("{name} → {address} expected {expected}, last answer {answer:?}")
                    }
                    _ => tokio::time::sleep(Duration::from_millis(300)).await,
                }
            }
        }
    };
    resolves(false).await;
    // The directory is laid out as a mounted ConfigMap, and each write is the kubelet's update
    // of it: a new data directory, `..data` swapped, the old one removed. Headscale watches
    // the file the symlink pointed at; the swap removes that file, and Headscale re-adds its
    // watch on the path (now the new target) and reloads.
    let link = std::fs::read_link(env.headscale.extra_records_path()).expect("a symlink");
    assert_eq!(link, Path::new("..data/extra-records.json"));
    let mut data_dirs = BTreeSet::new();
    for (records, expected) in [
        (vec![ExtraRecord::a(&name, address)], true),
        (vec![], false),
        (vec![ExtraRecord::a(&name, address)], true),
    ] {
        let t0 = Instant::now();
        env.headscale
            .write_extra_records(&records)
            .expect("kubelet-style update");
        let data =
            std::fs::read_link(env.headscale.extra_records_dir().join("..data")).expect("..data");
        assert!(
            data_dirs.insert(data),
            "each update is a new data directory"
        );
        resolves(expected).await;
        eprintln!(
            "kubelet-style swap → resolves {expected} after {:?}",
            t0.elapsed()
        );
    }
}

/// A plain process in `netns` — bash's `/dev/tcp`, no LocalAPI, so only the netns' routes
/// decide where it goes — connects to `ip:port`, writes `payload` and prints as many bytes
/// as come back (at most 5 s, then `timeout` kills it). `Err` says why not.
async fn process_echo(netns: &Netns, ip: &str, port: u16, payload: &str) -> Result<String, String> {
    let mut command = netns.command("timeout").map_err(|e| e.to_string())?;
    command.args([
        "5",
        "bash",
        "-c",
        r#"exec 3<>"/dev/tcp/$0/$1" && printf %s "$2" >&3 && head -c "${#2}" <&3"#,
        ip,
        &port.to_string(),
        payload,
    ]);
    let output = tokio::process::Command::from(command)
        .output()
        .await
        .map_err(|e| format!("running bash: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The mount namespace of a process (`/proc/<pid>/ns/mnt`'s link text).
fn mount_namespace(pid: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .map(|link| link.display().to_string())
        .unwrap_or_else(|error| panic!("mount namespace of {pid}: {error}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_mode_node_lets_any_process_of_its_netns_reach_the_tailnet() {
    let host_resolv_conf = std::fs::read("/etc/resolv.conf").ok();
    let env = shared_env().await;
    let mut logs = DumpLogsOnPanic::new(env);
    let (server, client) = tokio::join!(
        env.join_node(
            "k-server",
            JoinOptions {
                tags: vec![SERVER_TAG.into()],
                ..JoinOptions::default()
            }
        ),
        env.join_node(
            "k-client",
            JoinOptions {
                tags: vec![CLIENT_TAG.into()],
                tun: TunMode::Kernel,
                ..JoinOptions::default()
            }
        )
    );
    let server = server.expect("server node joins");
    let client = client.expect("kernel-mode client joins");
    logs.0
        .extend([server.node.log_path(), client.node.log_path()]);
    assert_eq!(client.node.tun_mode(), TunMode::Kernel);

    // The device carries the node's tailnet addresses.
    let status = client.node.local_api().status().await.expect("status");
    let client_ips = status.tailscale_ips.unwrap_or_default();
    assert_eq!(client_ips.len(), 2, "IPv4 and IPv6: {client_ips:?}");
    let device = client
        .netns
        .ip(&["-o", "addr", "show", "dev", KERNEL_TUN_DEVICE])
        .expect("tailscale0 exists in the client's netns");
    for ip in &client_ips {
        assert!(device.contains(ip.as_str()), "{ip} on {device}");
    }
    // tailscaled has its own mount namespace (private resolv.conf), the server's does not.
    assert_ne!(
        mount_namespace(&client.node.pid().to_string()),
        mount_namespace("self")
    );
    assert_eq!(
        mount_namespace(&server.node.pid().to_string()),
        mount_namespace("self")
    );

    // Echo servers on the server's loopback: its userspace tailscaled delivers tailnet
    // connections there.
    let _echo_v4 = TcpTestServer::start(
        Some(&server.netns),
        SocketAddr::from((Ipv4Addr::LOCALHOST, SERVER_PORT)),
        Behaviour::Echo,
    )
    .expect("IPv4 echo");
    let _echo_v6 = TcpTestServer::start(
        Some(&server.netns),
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, SERVER_PORT)),
        Behaviour::Echo,
    )
    .expect("IPv6 echo");
    let server_status = server.node.local_api().status().await.expect("status");
    let server_ips = server_status.tailscale_ips.unwrap_or_default();
    assert_eq!(server_ips.len(), 2, "{server_ips:?}");
    for ip in &server_ips {
        let payload = format!("kernel-mode bytes to {ip}");
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            match process_echo(&client.netns, ip, SERVER_PORT, &payload).await {
                Ok(echoed) => {
                    assert_eq!(echoed, payload, "echo from {ip}");
                    break;
                }
                Err(reason) if Instant::now() > deadline => {
                    panic!("{ip}:{SERVER_PORT} not reached from the kernel-mode netns: {reason}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    }

    // What carried them: the kernel's route to each peer address is the TUN device.
    for ip in &server_ips {
        let route = client
            .netns
            .ip(&["route", "get", ip])
            .expect("route lookup");
        assert!(route.contains(KERNEL_TUN_DEVICE), "route to {ip}: {route}");
    }

    // The policy still applies: a port it does not open stays closed, listener or not.
    let other_port = SERVER_PORT + 1;
    let _other = TcpTestServer::start(
        Some(&server.netns),
        SocketAddr::from((Ipv4Addr::LOCALHOST, other_port)),
        Behaviour::Echo,
    )
    .expect("second listener");
    let refused = process_echo(&client.netns, &server_ips[0], other_port, "must not arrive").await;
    assert!(refused.is_err(), "ungranted port answered: {refused:?}");

    // Nothing of the host's resolver configuration changed.
    assert_eq!(std::fs::read("/etc/resolv.conf").ok(), host_resolv_conf);
}
