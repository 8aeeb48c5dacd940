//! Real namespaces, real veths, real sockets: needs root and iproute2.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::time::Duration;

use tno_netlab::{ChildProcess, Lab, Netns, RunId, TcpForwarder, cleanup_stale_runs, list_netns};

const TIMEOUT: Duration = Duration::from_secs(5);

fn v4(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ip, port))
}

/// Accepts one connection and echoes it (std thread, so it works from any netns listener).
fn echo_once(listener: TcpListener) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let mut buffer = [0u8; 1024];
            while let Ok(read) = stream.read(&mut buffer) {
                if read == 0 || stream.write_all(&buffer[..read]).is_err() {
                    break;
                }
            }
        }
    })
}

fn round_trip(mut stream: TcpStream, payload: &[u8]) -> Vec<u8> {
    stream
        .set_read_timeout(Some(TIMEOUT))
        .expect("read timeout");
    stream.write_all(payload).expect("write");
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("half-close");
    let mut echoed = Vec::new();
    stream.read_to_end(&mut echoed).expect("read echo");
    echoed
}

#[test]
fn pods_reach_each_other_and_the_gateway_but_nothing_else() {
    cleanup_stale_runs().expect("stale cleanup");
    let run = RunId::generate().expect("run id");
    let lab = Lab::create(&run).expect("lab");
    let server_pod = lab.add_pod_netns("server-uid").expect("server pod");
    let client_pod = lab.add_pod_netns("client-uid").expect("client pod");
    assert_ne!(server_pod.ip, client_pod.ip);

    // Pod to pod, routed through the lab.
    let listener = server_pod
        .netns
        .bind_tcp(v4(server_pod.ip, 7000))
        .expect("bind in pod");
    let echo = echo_once(listener);
    let stream = client_pod
        .netns
        .connect_tcp(v4(server_pod.ip, 7000), TIMEOUT)
        .expect("enter pod netns")
        .expect("pod-to-pod connect");
    assert_eq!(round_trip(stream, b"pod to pod"), b"pod to pod");
    echo.join().expect("echo thread");

    // A root-netns server exposed on the gateway.
    let root_listener = TcpListener::bind("127.0.0.1:0").expect("root bind");
    let port = root_listener.local_addr().expect("addr").port();
    let echo = echo_once(root_listener);
    let _forwarder = lab.expose_root_port(port).expect("expose");
    let stream = client_pod
        .netns
        .connect_tcp(v4(lab.gateway(), port), TIMEOUT)
        .expect("enter pod netns")
        .expect("connect to gateway forwarder");
    assert_eq!(round_trip(stream, b"via gateway"), b"via gateway");
    echo.join().expect("echo thread");

    // No leak: documentation addresses are not routed by the lab.
    let remote = lab
        .attach_netns("remote", Ipv4Addr::new(10, 244, 0, 10))
        .expect("attach");
    remote
        .ip(&["addr", "add", "192.0.2.10/32", "dev", "lo"])
        .expect("remote address");
    let site_listener = remote
        .bind_tcp(v4(Ipv4Addr::new(192, 0, 2, 10), 5432))
        .expect("bind");
    for netns in [lab.netns(), &*client_pod.netns] {
        let error = netns
            .connect_tcp(v4(Ipv4Addr::new(192, 0, 2, 10), 5432), TIMEOUT)
            .expect("enter netns")
            .expect_err("192.0.2.10 must not be reachable from the lab");
        assert!(
            matches!(
                error.kind(),
                ErrorKind::NetworkUnreachable | ErrorKind::HostUnreachable
            ),
            "unexpected error from {}: {error}",
            netns.name()
        );
    }
    drop(site_listener);

    // Teardown removes the pods' netns.
    let names = [server_pod.netns.name().to_owned(), remote.name().to_owned()];
    lab.remove_pod_netns("server-uid").expect("remove pod");
    drop(remote);
    let left = list_netns().expect("list");
    for name in &names {
        assert!(!left.contains(name), "{name} still exists");
    }
    let lab_name = lab.netns().name().to_owned();
    drop(lab);
    let left = list_netns().expect("list");
    assert!(
        !left.iter().any(|name| name.starts_with(run.as_str())),
        "{lab_name}: {left:?}"
    );
}

#[test]
fn forwarder_connects_into_a_netns_and_processes_die_with_it() {
    let run = RunId::generate().expect("run id");
    let netns = Netns::create(run.netns_name("fwd")).expect("netns");
    let inner = netns
        .bind_tcp(v4(Ipv4Addr::LOCALHOST, 0))
        .expect("bind inside");
    let inner_addr = inner.local_addr().expect("addr");
    let echo = echo_once(inner);
    let forwarder = TcpForwarder::start(None, v4(Ipv4Addr::LOCALHOST, 0), Some(&netns), inner_addr)
        .expect("forwarder");
    let stream = TcpStream::connect(forwarder.local_addr()).expect("connect root side");
    assert_eq!(round_trip(stream, b"into the netns"), b"into the netns");
    echo.join().expect("echo thread");

    let scratch = run.scratch_dir();
    std::fs::create_dir_all(&scratch).expect("scratch");
    let mut command = netns.command("sleep").expect("command");
    command.arg("600");
    let mut sleeper =
        ChildProcess::spawn("sleeper", command, &scratch.join("sleep.log")).expect("spawn");
    assert_eq!(netns.pids().expect("pids"), vec![sleeper.pid()]);
    netns.delete().expect("delete");
    let deadline = std::time::Instant::now() + TIMEOUT;
    while sleeper.exit_status().expect("wait").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "sleeper survived its netns"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_dir_all(scratch).expect("remove scratch");
}

#[test]
fn stale_runs_are_cleaned_and_live_ones_kept() {
    let dead = Netns::adopt("tno-4294967290-1-0-lab");
    tno_netlab::run_checked(std::process::Command::new("ip").args(["netns", "add", dead.name()]))
        .expect("create fake stale netns");
    let live_run = RunId::generate().expect("run id");
    let live = Netns::create(live_run.netns_name("live")).expect("live netns");
    // Another test may clean it first: only its absence afterwards matters.
    cleanup_stale_runs().expect("cleanup");
    let left = list_netns().expect("list");
    assert!(left.contains(&live.name().to_owned()));
    assert!(!left.contains(&dead.name().to_owned()));
}
