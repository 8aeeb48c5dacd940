//! `process_*` metrics as Prometheus' client libraries name them, read from `/proc/self` at
//! scrape time (a few small files and one directory listing; nothing runs between scrapes).
//! prometheus-client has no process collector. Not on Linux (no `/proc`): none are exported.

use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What one scrape reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_memory_bytes: f64,
    pub virtual_memory_bytes: f64,
    pub threads: f64,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
    pub start_time_seconds: Option<f64>,
}

/// Fields of `/proc/<pid>/stat` we use, in clock ticks, pages and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    pub threads: u64,
    pub start_ticks: u64,
    pub vsize_bytes: u64,
    pub rss_pages: u64,
}

/// Parses `/proc/<pid>/stat` (proc(5)). The command name (field 2) may hold spaces and
/// parentheses: the fields are counted from its last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): field n is fields[n - 3].
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        threads: field(20)?,
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// The soft "Max open files" of `/proc/<pid>/limits` (`None` when unlimited).
pub fn parse_max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `btime` of `/proc/stat`: boot time, Unix seconds.
pub fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf only reads a system constant; no pointers are involved.
    let value = unsafe { libc::sysconf(name) };
    u64::try_from(value).ok().filter(|v| *v > 0)
}

/// Clock ticks per second and page size.
fn units() -> Option<(u64, u64)> {
    static UNITS: OnceLock<Option<(u64, u64)>> = OnceLock::new();
    *UNITS.get_or_init(|| Some((sysconf(libc::_SC_CLK_TCK)?, sysconf(libc::_SC_PAGESIZE)?)))
}

/// The process' start, Unix seconds (read once: it does not change).
fn start_time(stat: &Stat, ticks: u64) -> Option<f64> {
    static START: OnceLock<Option<f64>> = OnceLock::new();
    *START.get_or_init(|| {
        let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
        Some(boot as f64 + stat.start_ticks as f64 / ticks as f64)
    })
}

/// This process' numbers now; `None` without `/proc/self`.
pub fn read() -> Option<ProcessStats> {
    let stat = parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let (ticks, page) = units()?;
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|entries| entries.count() as f64);
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| parse_max_open_files(&limits))
        .map(|max| max as f64);
    Some(ProcessStats {
        cpu_seconds: (stat.utime_ticks + stat.stime_ticks) as f64 / ticks as f64,
        resident_memory_bytes: (stat.rss_pages * page) as f64,
        virtual_memory_bytes: stat.vsize_bytes as f64,
        threads: stat.threads as f64,
        open_fds,
        max_fds,
        start_time_seconds: start_time(&stat, ticks),
    })
}

/// Emits the `process_*` metrics; register it on the root (unprefixed) registry.
#[derive(Debug, Default)]
pub struct ProcessCollector {}

impl ProcessCollector {
    pub fn new() -> Self {
        ProcessCollector {}
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: Option<f64>,
) -> Result<(), std::fmt::Error> {
    let Some(value) = value else {
        return Ok(());
    };
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(metric)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(stats) = read() else {
            return Ok(());
        };
        let cpu = encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(stats.cpu_seconds).encode(cpu)?;
        let e = &mut encoder;
        gauge(
            e,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            Some(stats.resident_memory_bytes),
        )?;
        gauge(
            e,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            Some(stats.virtual_memory_bytes),
        )?;
        gauge(
            e,
            "process_open_fds",
            "Number of open file descriptors.",
            stats.open_fds,
        )?;
        gauge(
            e,
            "process_max_fds",
            "Maximum number of open file descriptors (soft limit).",
            stats.max_fds,
        )?;
        gauge(
            e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            stats.start_time_seconds,
        )?;
        gauge(
            e,
            "process_threads",
            "Number of OS threads in the process.",
            Some(stats.threads),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::Format;
    use prometheus_client::registry::Registry;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis; values from a real process.
        let stat = "4242 (tailnet (agent) 2) S 1 4242 4242 0 -1 4194560 1934 0 0 0 \
                    151 37 0 0 20 0 9 0 123456 52199424 1503 18446744073709551615 1 1 0 0 \
                    0 0 0 4096 17003 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0";
        assert_eq!(
            parse_stat(stat),
            Some(Stat {
                utime_ticks: 151,
                stime_ticks: 37,
                threads: 9,
                start_ticks: 123456,
                vsize_bytes: 52_199_424,
                rss_pages: 1503,
            })
        );
        assert_eq!(parse_stat("4242 (truncated) S 1 2"), None);
    }

    #[test]
    fn limits_and_boot_time_parse() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1048576              1048576              files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1_048_576));
        assert_eq!(
            parse_max_open_files(
                "Max open files            unlimited            unlimited            files"
            ),
            None
        );
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nintr 5\nbtime 1767225600\nprocesses 9\n"),
            Some(1_767_225_600)
        );
    }

    /// This very process, read through the collector: the numbers are its own.
    #[test]
    fn the_collector_reports_this_process() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new()));
        let file = std::fs::File::open("/proc/self/stat").expect("an open file");
        let text = Format::Prometheus.encode(&registry).expect("text");
        drop(file);
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
                .parse()
                .expect("a number")
        };
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(value("process_cpu_seconds_total") >= 0.0);
        let rss = value("process_resident_memory_bytes");
        assert!(
            rss > 1_000_000.0 && rss <= value("process_virtual_memory_bytes"),
            "{text}"
        );
        assert!(
            value("process_open_fds") >= 4.0,
            "stdin/out/err and the file: {text}"
        );
        assert!(
            value("process_max_fds") >= value("process_open_fds"),
            "{text}"
        );
        assert!(value("process_threads") >= 1.0, "{text}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "{started} vs {now}"
        );
    }
}
