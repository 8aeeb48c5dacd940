//! Benchmark 1: the agent's TCP forwarder in isolation (loopback, no tailnet) against socat
//! (what the hand-made gateway ran) and a direct connection, in one run.
//!
//! The agent's egress listener dials through tailscaled's LocalAPI; its `tcp` ingress
//! listener runs the same relay (`tailnet_agent::relay::relay`, the same buffers and
//! accept loop) with a plain TCP connect to its backend. That listener is the forwarder
//! without the tailnet, so it is what is measured here; the LocalAPI dial and tailscaled's
//! userspace stack are benchmark 2's subject.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;
use tno_netlab::ChildProcess;

use crate::Settings;
use crate::lab::{AGENT_ADMIN_PORT, Lab, POD_IP, RssPeak, mib, rss_kib, wait_for_port};
use crate::report::Table;
use crate::stats::{Spread, percentile};
use crate::tcpload;

const BACKEND_PORT: u16 = 17000;
const AGENT_PORT: u16 = 17001;
const SOCAT_PORT: u16 = 17002;
const BASELINE_PORT: u16 = 17003;
/// The baseline agent's admin listener (the measured agent has [`AGENT_ADMIN_PORT`]).
const BASELINE_ADMIN_PORT: u16 = AGENT_ADMIN_PORT + 1;
const RATE_CLIENTS: usize = 8;
const MIB: f64 = 1024.0 * 1024.0;

fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Runs the benchmark in a fresh lab; the calling thread must not be needed elsewhere (it
/// enters the lab's netns).
pub fn run(settings: &Settings, bench_exe: &Path) -> Result<Table> {
    let lab = Lab::create("bench-egress")?;
    lab.enter()?;
    let port = BACKEND_PORT.to_string();
    let mut backend = lab.spawn("backend", bench_exe, &["serve-tcp", "--port", &port], &[])?;
    wait_for_port(local(BACKEND_PORT), &mut backend)?;

    let mut agent = start_agent(&lab, &settings.agent, "agent", AGENT_PORT, AGENT_ADMIN_PORT)?;
    wait_for_port(local(AGENT_PORT), &mut agent)?;
    let mut baseline = match &settings.baseline_agent {
        Some(binary) => {
            let mut baseline =
                start_agent(&lab, binary, "baseline", BASELINE_PORT, BASELINE_ADMIN_PORT)?;
            wait_for_port(local(BASELINE_PORT), &mut baseline)?;
            Some(baseline)
        }
        None => None,
    };

    let listen = format!("TCP-LISTEN:{SOCAT_PORT},bind=127.0.0.1,fork,reuseaddr,backlog=1024");
    let connect = format!("TCP:127.0.0.1:{BACKEND_PORT}");
    let mut socat = lab.spawn("socat", Path::new("socat"), &[&listen, &connect], &[])?;
    wait_for_port(local(SOCAT_PORT), &mut socat)?;

    let mut ports = BTreeMap::from([
        ("direct", BACKEND_PORT),
        ("agent", AGENT_PORT),
        ("socat", SOCAT_PORT),
    ]);
    let mut variants = vec!["direct", "agent"];
    if baseline.is_some() {
        ports.insert("baseline", BASELINE_PORT);
        variants.push("baseline");
    }
    variants.push("socat");
    let agent_idle_kib = rss_kib(agent.pid());
    let agent_peak = RssPeak::start(agent.pid());
    let values = measure(settings, &ports, &variants)?;
    let agent_peak_kib = agent_peak.finish();
    let table = forwarding_table(settings, &values, &variants, agent_idle_kib, agent_peak_kib);
    // Stopped (dropped) only now: the baseline ran alongside until the last workload.
    drop(baseline.take());
    Ok(table)
}

/// metric → variant → one value per repetition
type Values = BTreeMap<&'static str, BTreeMap<&'static str, Vec<f64>>>;

/// Every workload against every variant, `settings.repeat` times, in a rotating order.
fn measure(
    settings: &Settings,
    ports: &BTreeMap<&'static str, u16>,
    variants: &[&'static str],
) -> Result<Values> {
    let mut values: Values = BTreeMap::new();
    let mut record = |metric: &'static str, variant: &'static str, value: f64| {
        values
            .entry(metric)
            .or_default()
            .entry(variant)
            .or_default()
            .push(value);
    };
    for repetition in 0..settings.repeat {
        // A different order each time, so no variant always runs first (or last).
        let mut order = variants.to_vec();
        order.rotate_left(repetition % variants.len());
        for &variant in &order {
            let address = local(ports[variant]);
            let single = tcpload::download(address, settings.stream_bytes)?;
            record(
                "single",
                variant,
                settings.stream_bytes as f64 / MIB / single.as_secs_f64(),
            );
        }
        for &variant in &order {
            let address = local(ports[variant]);
            let all = tcpload::parallel_download(
                address,
                settings.stream_bytes,
                settings.parallel_streams,
            )?;
            record(
                "parallel",
                variant,
                settings.stream_bytes as f64 / MIB / all.as_secs_f64(),
            );
        }
        for &variant in &order {
            let address = local(ports[variant]);
            let rate = tcpload::connection_rate(address, RATE_CLIENTS, settings.load_duration)?;
            record("rate", variant, rate);
            // Let TIME_WAIT and socat's children settle before the next variant.
            std::thread::sleep(Duration::from_millis(500));
        }
        for &variant in &order {
            let address = local(ports[variant]);
            let samples = tcpload::ping_pong(address, settings.ping_pongs)?;
            let micros = |p| percentile(&samples, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6);
            record("p50", variant, micros(50.0));
            record("p99", variant, micros(99.0));
        }
    }
    Ok(values)
}

/// The table: each workload's median (min–max) per variant and the ratios between them.
fn forwarding_table(
    settings: &Settings,
    values: &Values,
    variants: &[&'static str],
    agent_idle_kib: u64,
    agent_peak_kib: u64,
) -> Table {
    let has_baseline = variants.contains(&"baseline");
    let mut header = vec!["workload", "direct", "agent"];
    if has_baseline {
        header.push("agent baseline");
    }
    header.extend(["socat", "agent / socat", "agent vs direct"]);
    if has_baseline {
        header.extend(["baseline vs direct", "agent / baseline"]);
    }
    let mut table = Table::new(
        "Egress TCP forwarding, loopback (agent forwarder vs socat vs direct)",
        &header,
    );
    let rows: [(&str, String, bool); 5] = [
        (
            "single",
            format!(
                "1 stream, {} MiB (MiB/s)",
                settings.stream_bytes / (1 << 20)
            ),
            false,
        ),
        (
            "parallel",
            format!(
                "{} streams, {} MiB total (MiB/s)",
                settings.parallel_streams,
                settings.stream_bytes / (1 << 20)
            ),
            false,
        ),
        (
            "rate",
            format!("short connections, {RATE_CLIENTS} clients (conn/s)"),
            false,
        ),
        ("p50", "64 B ping-pong p50 (µs)".to_owned(), true),
        ("p99", "64 B ping-pong p99 (µs)".to_owned(), true),
    ];
    for (metric, label, latency) in rows {
        let by_variant = &values[metric];
        let show = |variant: &str| {
            Spread::of(&by_variant[variant])
                .map_or("–".into(), |s| s.show(if latency { 1 } else { 0 }))
        };
        let per_rep = |f: &dyn Fn(f64, f64) -> f64, a: &str, b: &str| -> Vec<f64> {
            by_variant[a]
                .iter()
                .zip(&by_variant[b])
                .map(|(x, y)| f(*x, *y))
                .collect()
        };
        // Latency: lower is better, "× faster" = theirs / ours, and the time added over
        // direct is the difference; throughput: ours / theirs, and the share of direct.
        let versus = |a: &str, b: &str| {
            if latency {
                Spread::of(&per_rep(&|a, b| b / a, a, b))
                    .map_or("–".into(), |s| format!("{}× faster", s.show(2)))
            } else {
                Spread::of(&per_rep(&|a, b| a / b, a, b))
                    .map_or("–".into(), |s| format!("{}×", s.show(2)))
            }
        };
        let versus_direct = |a: &str| {
            if latency {
                Spread::of(&per_rep(&|a, d| a - d, a, "direct"))
                    .map_or("–".into(), |s| format!("+{} µs", s.show(1)))
            } else {
                Spread::of(&per_rep(&|a, d| a / d, a, "direct")).map_or("–".into(), |s| {
                    format!(
                        "{:.0} % ({:.0}–{:.0} %)",
                        s.median * 100.0,
                        s.min * 100.0,
                        s.max * 100.0
                    )
                })
            }
        };
        let mut cells = vec![label, show("direct"), show("agent")];
        if has_baseline {
            cells.push(show("baseline"));
        }
        cells.extend([
            show("socat"),
            versus("agent", "socat"),
            versus_direct("agent"),
        ]);
        if has_baseline {
            cells.extend([versus_direct("baseline"), versus("agent", "baseline")]);
        }
        table.row(cells);
    }
    table.note(format!(
        "Median (min–max) of {} repetitions; ratios are taken within each repetition. \
         Agent RSS: {} MiB idle, {} MiB peak during the run.",
        settings.repeat,
        mib(agent_idle_kib),
        mib(agent_peak_kib)
    ));
    if let Some(baseline) = &settings.baseline_agent {
        table.note(format!(
            "agent baseline: {} (another build of the agent, measured in the same run, \
             interleaved with the others).",
            baseline.display()
        ));
    }
    table
}

/// An agent whose only listener is a `tcp` forward on `port` to the backend.
fn start_agent(
    lab: &Lab,
    binary: &Path,
    name: &str,
    port: u16,
    admin_port: u16,
) -> Result<ChildProcess> {
    let config = json!({
        "localapiSocket": lab.path("no-tailscaled.sock"),
        "adminPort": admin_port,
        "ingress": [{"mode": "tcp", "name": "bench", "port": port,
                     "backend": {"host": "127.0.0.1", "port": BACKEND_PORT}}],
    });
    let config_path = lab.path(&format!("{name}.json"));
    std::fs::write(&config_path, config.to_string()).context("agent config")?;
    let config_arg = config_path.to_string_lossy().into_owned();
    let pod_ip = POD_IP.to_string();
    lab.spawn(
        name,
        binary,
        &["--config", &config_arg, "--pod-ip", &pod_ip],
        &[("RUST_LOG", "warn")],
    )
}
