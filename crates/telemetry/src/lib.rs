//! What `tailnet-operator` and `tailnet-agent` expose the same way:
//!
//! - [`exposition`]: `/metrics` in the format the scraper asks for: OpenMetrics for
//!   `Accept: application/openmetrics-text` (what Prometheus asks for first), else the
//!   Prometheus text format 0.0.4 (curl, `promtool check metrics`, older scrapers), where a
//!   counter's `# HELP`/`# TYPE` name carries its `_total` suffix;
//! - [`build`]: `<prefix>_build_info{version,git_commit,rustc_version,target} 1`;
//! - [`process`]: `process_cpu_seconds_total`, `process_resident_memory_bytes`, … read from
//!   `/proc/self` at scrape time;
//! - [`logging`]: the log subscriber: `RUST_LOG` filter (default `info`), text or flat JSON
//!   (an event's fields next to `timestamp`, `level`, `target`, never nested under `fields`).

pub mod build;
pub mod exposition;
pub mod logging;
pub mod process;

use prometheus_client::registry::Registry;

/// Registers what every binary exports besides its own metrics: `<prefix>_build_info` and
/// the `process_*` metrics. `registry` must be the root (unprefixed) registry.
pub fn register_common(registry: &mut Registry, prefix: &str, version: &'static str) {
    build::register(registry.sub_registry_with_prefix(prefix), version);
    registry.register_collector(Box::new(process::ProcessCollector::new()));
}
