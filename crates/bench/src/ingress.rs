//! Benchmark 3: HTTPS ingress — the agent's TLS termination + reverse proxy against nginx
//! (Debian) and Caddy (deps/build.sh), same certificate (ECDSA P-256), same backend, same
//! loopback, in one run.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::json;
use tno_netlab::ChildProcess;

use crate::Settings;
use crate::httpload::{self, WrkResult};
use crate::lab::{AGENT_ADMIN_PORT, Lab, POD_IP, RssPeak, mib, tree_rss_kib, wait_for_port};
use crate::report::Table;
use crate::stats::Spread;

pub const SERVER_NAME: &str = "bench.test";
const BACKEND_PORT: u16 = 18080;
const HANDSHAKE_CLIENTS: usize = 16;
const AGENT_PORT: u16 = 8443;
/// The baseline agent (`--baseline-agent`), when there is one.
const BASELINE_PORT: u16 = 8446;
/// The floor of the agent's HTTP stack (`--hyper-floor`), when measured.
const FLOOR_PORT: u16 = 8447;
/// Its column's name.
const FLOOR: &str = "hyper-floor";

struct Server {
    name: &'static str,
    port: u16,
    process: ChildProcess,
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// CA and a leaf for [`SERVER_NAME`], written to the lab dir: (ca, cert, key) paths.
fn write_pki(lab: &Lab) -> Result<(String, String, String)> {
    let mut ca_params = CertificateParams::new(Vec::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Distinct subjects: OpenSSL (curl, nginx) takes a leaf named like its issuer for
    // self-signed.
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tno-bench CA");
    let issuer = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let mut leaf_params = CertificateParams::new(vec![SERVER_NAME.to_owned()])?;
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, SERVER_NAME);
    let cert = leaf_params.signed_by(&key, &issuer)?;
    let paths = (
        lab.path("ca.pem"),
        lab.path("cert.pem"),
        lab.path("key.pem"),
    );
    std::fs::write(&paths.0, issuer.pem())?;
    // Leaf then CA: every server sends the same chain.
    std::fs::write(&paths.1, format!("{}{}", cert.pem(), issuer.pem()))?;
    std::fs::write(&paths.2, key.serialize_pem())?;
    let text = |p: &Path| p.to_string_lossy().into_owned();
    Ok((text(&paths.0), text(&paths.1), text(&paths.2)))
}

fn nginx_config(lab: &Lab, port: u16, cert: &str, key: &str) -> String {
    let dir = lab.dir.display();
    format!(
        r#"# Equivalent to the agent's route: TLS 1.2/1.3, h2 + http/1.1, streaming (no buffering),
# keep-alive connections to the backend, X-Forwarded-* set, no access log, no request cap,
# 64 KiB upstream reads.
worker_processes 2;
daemon off;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/nginx-body;
  proxy_temp_path {dir}/nginx-proxy;
  fastcgi_temp_path {dir}/nginx-fastcgi;
  uwsgi_temp_path {dir}/nginx-uwsgi;
  scgi_temp_path {dir}/nginx-scgi;
  keepalive_requests 100000000;
  upstream backend {{ server 127.0.0.1:{BACKEND_PORT}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port} ssl http2;
    server_name {SERVER_NAME};
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $remote_addr;
      proxy_set_header X-Forwarded-Proto https;
      proxy_set_header X-Forwarded-Host $host;
      proxy_buffering off;
      # Unbuffered proxying reads the upstream in chunks of this size (default 4-8k, which
      # would make nginx's download a strawman).
      proxy_buffer_size 64k;
      proxy_buffers 4 64k;
      proxy_busy_buffers_size 128k;
    }}
  }}
}}
"#
    )
}

fn caddy_config(port: u16, cert: &str, key: &str) -> String {
    format!(
        r#"# Equivalent to the agent's route: the given certificate, reverse proxy with Caddy's
# defaults (keep-alive to the backend, X-Forwarded-* set, streaming), no admin API, no logs.
{{
  admin off
  auto_https off
  persist_config off
}}
https://{SERVER_NAME}:{port} {{
  bind 127.0.0.1
  tls {cert} {key}
  reverse_proxy 127.0.0.1:{BACKEND_PORT}
}}
"#
    )
}

/// An agent with one `http` ingress listener on `port`: route `bench.test` → the backend.
fn start_agent(
    lab: &Lab,
    binary: &Path,
    name: &str,
    port: u16,
    admin_port: u16,
    cert: &str,
    key: &str,
) -> Result<ChildProcess> {
    let config = json!({
        "localapiSocket": lab.path("localapi.sock"),
        "adminPort": admin_port,
        "ingress": [{"mode": "http", "port": port, "routes": [{
            "name": "bench", "hostnames": [SERVER_NAME],
            "backend": {"host": "127.0.0.1", "port": BACKEND_PORT}}]}],
        "tls": {"certFile": cert, "keyFile": key},
    });
    let config_path = lab.path(&format!("{name}.json"));
    std::fs::write(&config_path, config.to_string())?;
    let config_arg = config_path.to_string_lossy().into_owned();
    let pod_ip = POD_IP.to_string();
    lab.spawn(
        name,
        binary,
        &["--config", &config_arg, "--pod-ip", &pod_ip],
        &[("RUST_LOG", "warn")],
    )
}

fn start_servers(
    lab: &Lab,
    settings: &Settings,
    bench_exe: &Path,
    cert: &str,
    key: &str,
) -> Result<Vec<Server>> {
    let mut servers = Vec::new();

    servers.push(Server {
        name: "agent",
        port: AGENT_PORT,
        process: start_agent(
            lab,
            &settings.agent,
            "agent",
            AGENT_PORT,
            AGENT_ADMIN_PORT,
            cert,
            key,
        )?,
    });
    if let Some(binary) = &settings.baseline_agent {
        servers.push(Server {
            name: "baseline",
            port: BASELINE_PORT,
            process: start_agent(
                lab,
                binary,
                "baseline",
                BASELINE_PORT,
                AGENT_ADMIN_PORT + 1,
                cert,
                key,
            )?,
        });
    }

    if settings.hyper_floor {
        let floor = lab.spawn(
            FLOOR,
            bench_exe,
            &[
                "serve-proxy",
                "--port",
                &FLOOR_PORT.to_string(),
                "--backend-port",
                &BACKEND_PORT.to_string(),
                "--cert",
                cert,
                "--key",
                key,
            ],
            &[],
        )?;
        servers.push(Server {
            name: FLOOR,
            port: FLOOR_PORT,
            process: floor,
        });
    }

    let nginx_path = lab.path("nginx.conf");
    std::fs::write(&nginx_path, nginx_config(lab, 8444, cert, key))?;
    let prefix = lab.dir.to_string_lossy().into_owned();
    let error_log = lab.path("nginx-error.log").to_string_lossy().into_owned();
    let nginx = lab.spawn(
        "nginx",
        Path::new("nginx"),
        &[
            "-p",
            &prefix,
            "-e",
            &error_log,
            "-c",
            &nginx_path.to_string_lossy(),
        ],
        &[],
    )?;
    servers.push(Server {
        name: "nginx",
        port: 8444,
        process: nginx,
    });

    if let Some(caddy) = &settings.caddy {
        let caddyfile = lab.path("Caddyfile");
        std::fs::write(&caddyfile, caddy_config(8445, cert, key))?;
        let home = prefix.as_str();
        let caddy = lab.spawn(
            "caddy",
            caddy,
            &[
                "run",
                "--adapter",
                "caddyfile",
                "--config",
                &caddyfile.to_string_lossy(),
            ],
            &[
                ("HOME", home),
                ("XDG_DATA_HOME", home),
                ("XDG_CONFIG_HOME", home),
            ],
        )?;
        servers.push(Server {
            name: "caddy",
            port: 8445,
            process: caddy,
        });
    }
    for server in &mut servers {
        wait_for_port(local(server.port), &mut server.process)?;
    }
    Ok(servers)
}

/// Runs the benchmark in a fresh lab (the calling thread enters its netns).
pub fn run(settings: &Settings, bench_exe: &Path) -> Result<Vec<Table>> {
    let lab = Lab::create("bench-ingress")?;
    lab.enter()?;
    let (ca, cert, key) = write_pki(&lab)?;
    let hosts = lab.path("hosts");
    std::fs::write(
        &hosts,
        format!("127.0.0.1 localhost {SERVER_NAME}\n::1 localhost\n"),
    )?;
    let localapi = lab.path("localapi.sock").to_string_lossy().into_owned();
    let mut backend = lab.spawn(
        "backend",
        bench_exe,
        &[
            "serve-http",
            "--port",
            &BACKEND_PORT.to_string(),
            "--localapi-socket",
            &localapi,
        ],
        &[],
    )?;
    wait_for_port(local(BACKEND_PORT), &mut backend)?;
    let mut servers = start_servers(&lab, settings, bench_exe, &cert, &key)?;
    // Settle (Caddy and the agent load certificates lazily or on a timer).
    std::thread::sleep(Duration::from_secs(1));
    let idle: BTreeMap<&str, u64> = servers
        .iter()
        .map(|s| (s.name, tree_rss_kib(s.process.pid())))
        .collect();
    let peaks: Vec<(&str, RssPeak)> = servers
        .iter()
        .map(|s| (s.name, RssPeak::start(s.process.pid())))
        .collect();

    let names: Vec<&'static str> = servers.iter().map(|s| s.name).collect();
    let ports: BTreeMap<&str, u16> = servers.iter().map(|s| (s.name, s.port)).collect();
    let (values, errors) = measure(settings, &names, &ports, &hosts, &ca)?;
    let peak: BTreeMap<&str, u64> = peaks
        .into_iter()
        .map(|(name, sampler)| (name, sampler.finish()))
        .collect();
    for server in &mut servers {
        if let Ok(Some(status)) = server.process.exit_status() {
            bail!(
                "{} exited during the benchmark ({status}):\n{}",
                server.name,
                server.process.log_tail(30)
            );
        }
    }
    let table = throughput_table(settings, &names, &values, &errors);
    let mut memory = Table::new(
        "Ingress server memory (RSS, MiB; nginx: master + workers)",
        &["server", "idle (after start)", "peak during the runs"],
    );
    for &name in &names {
        memory.row(vec![
            name.to_owned(),
            mib(idle.get(name).copied().unwrap_or(0)),
            mib(peak.get(name).copied().unwrap_or(0)),
        ]);
    }
    Ok(vec![table, memory])
}

/// (metric, server) → one value per repetition
type Values = BTreeMap<(String, &'static str), Vec<f64>>;

/// Every workload against every server, `settings.repeat` times in a rotating order; also
/// the wrk errors per server.
fn measure(
    settings: &Settings,
    names: &[&'static str],
    ports: &BTreeMap<&'static str, u16>,
    hosts: &Path,
    ca: &str,
) -> Result<(Values, BTreeMap<&'static str, u64>)> {
    let mut values: Values = BTreeMap::new();
    let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
    for repetition in 0..settings.repeat {
        let mut order = names.to_vec();
        order.rotate_left(repetition % names.len());
        for &connections in &settings.http_connections {
            for &server in &order {
                let url = format!("https://{SERVER_NAME}:{}/1k", ports[server]);
                let WrkResult {
                    requests_per_second,
                    p50_micros,
                    p99_micros,
                    errors: failed,
                    ..
                } = httpload::wrk(hosts, &url, connections, settings.load_duration)?;
                *errors.entry(server).or_default() += failed;
                for (metric, value) in [
                    ("rps", requests_per_second),
                    ("p50", p50_micros),
                    ("p99", p99_micros),
                ] {
                    values
                        .entry((format!("{metric} c{connections}"), server))
                        .or_default()
                        .push(value);
                }
            }
        }
        for &server in &order {
            let rate = httpload::handshake_rate(
                local(ports[server]),
                SERVER_NAME,
                &std::fs::read_to_string(ca)?,
                HANDSHAKE_CLIENTS,
                settings.load_duration,
            )
            .with_context(|| format!("handshakes against {server}"))?;
            values
                .entry(("handshakes".into(), server))
                .or_default()
                .push(rate);
        }
        for &server in &order {
            let speed = httpload::curl_download(
                Path::new(&ca),
                SERVER_NAME,
                ports[server],
                settings.download_bytes,
            )
            .with_context(|| format!("download from {server}"))?;
            values
                .entry(("download".into(), server))
                .or_default()
                .push(speed);
        }
    }
    Ok((values, errors))
}

/// Each workload's median (min–max) per server and the agent's ratio to each other server.
fn throughput_table(
    settings: &Settings,
    names: &[&'static str],
    values: &Values,
    errors: &BTreeMap<&'static str, u64>,
) -> Table {
    // agent / every other server, and the stack's floor / nginx when both ran.
    let mut pairs: Vec<(&str, &str)> = names
        .iter()
        .filter(|n| **n != "agent")
        .map(|other| ("agent", *other))
        .collect();
    if names.contains(&FLOOR) && names.contains(&"nginx") {
        pairs.push((FLOOR, "nginx"));
    }
    let mut header = vec!["workload".to_owned()];
    header.extend(names.iter().map(|n| (*n).to_owned()));
    header.extend(pairs.iter().map(|(one, other)| format!("{one} / {other}")));
    let mut table = Table {
        title: if names.contains(&"baseline") {
            "Ingress HTTPS, loopback (agent vs its baseline build vs nginx vs Caddy)".into()
        } else {
            "Ingress HTTPS, loopback (agent vs nginx vs Caddy)".into()
        },
        header,
        ..Table::default()
    };
    let mut rows: Vec<(String, String, usize)> = Vec::new();
    for &c in &settings.http_connections {
        rows.push((format!("rps c{c}"), format!("1 KiB, {c} conn: req/s"), 0));
        rows.push((format!("p50 c{c}"), format!("1 KiB, {c} conn: p50 µs"), 0));
        rows.push((format!("p99 c{c}"), format!("1 KiB, {c} conn: p99 µs"), 0));
    }
    rows.push((
        "handshakes".into(),
        format!("new TLS connections/s ({HANDSHAKE_CLIENTS} clients, full handshake + GET /1k)"),
        0,
    ));
    rows.push((
        "download".into(),
        format!("download {} MiB: MiB/s", settings.download_bytes >> 20),
        0,
    ));
    for (metric, label, decimals) in rows {
        let mut cells = vec![label];
        for &name in names {
            cells.push(
                values
                    .get(&(metric.clone(), name))
                    .and_then(|v| Spread::of(v))
                    .map_or("–".into(), |s| s.show(decimals)),
            );
        }
        for &(one, other) in &pairs {
            let (Some(ours), Some(theirs)) = (
                values.get(&(metric.clone(), one)),
                values.get(&(metric.clone(), other)),
            ) else {
                cells.push("–".into());
                continue;
            };
            let ratios: Vec<f64> = ours.iter().zip(theirs).map(|(a, o)| a / o).collect();
            cells.push(Spread::of(&ratios).map_or("–".into(), |s| format!("{}×", s.show(2))));
        }
        table.row(cells);
    }
    table.note(format!(
        "Median (min–max) of {} repetitions, ratios within each repetition (for req/s, \
         connections/s and MiB/s above 1 is better for the agent; for latency below 1). wrk \
         errors (socket errors + non-2xx): {}.",
        settings.repeat,
        names
            .iter()
            .map(|n| format!("{n} {}", errors.get(n).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if settings.hyper_floor {
        table.note(format!(
            "{FLOOR}: the floor of the agent's HTTP stack, a bare reverse proxy of the same \
             libraries and connection model (crates/bench/src/hyper_floor.rs): no routing, \
             rules, identity, metrics, limits or timeouts."
        ));
    }
    if let Some(baseline) = &settings.baseline_agent {
        table.note(format!(
            "baseline: {} (another build of the agent, measured in the same run, \
             interleaved with the others).",
            baseline.display()
        ));
    }
    table
}
