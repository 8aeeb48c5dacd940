//! The log subscriber of both binaries: `RUST_LOG` (tracing's `EnvFilter` syntax, default
//! `info`) and text or JSON. JSON is flat, the same shape in both: one object per line with
//! `timestamp`, `level`, the event's fields (`message`, …) and `target` at the top level,
//! plus `span`/`spans` when inside spans.

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The default filter when `RUST_LOG` is unset or invalid.
pub const DEFAULT_FILTER: &str = "info";

/// `RUST_LOG` as a filter; an invalid one falls back to [`DEFAULT_FILTER`] with the error
/// (to be logged once the subscriber runs).
pub fn env_filter(rust_log: Option<&str>) -> (EnvFilter, Option<String>) {
    match rust_log {
        None => (EnvFilter::new(DEFAULT_FILTER), None),
        Some(directives) => match EnvFilter::try_new(directives) {
            Ok(filter) => (filter, None),
            Err(error) => (
                EnvFilter::new(DEFAULT_FILTER),
                Some(format!(
                    "RUST_LOG={directives:?} is not a valid filter: {error}"
                )),
            ),
        },
    }
}

/// The subscriber writing `format` to `writer`; text has colours only with `ansi` (a
/// terminal), never in a container's log.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(builder.json().flatten_event(true).finish()),
    }
}

/// Installs the subscriber for the whole process (a second call changes nothing); `ansi`:
/// whether the writer is a terminal.
pub fn init<W>(format: LogFormat, writer: W, ansi: bool)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let rust_log = std::env::var("RUST_LOG").ok();
    let (filter, rejected) = env_filter(rust_log.as_deref());
    if tracing::subscriber::set_global_default(subscriber(format, filter, writer, ansi)).is_ok()
        && let Some(error) = rejected
    {
        tracing::warn!(%error, "logging at {DEFAULT_FILTER}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    fn log_one(format: LogFormat, rust_log: Option<&str>) -> String {
        let out = Captured::default();
        let (filter, _) = env_filter(rust_log);
        tracing::subscriber::with_default(subscriber(format, filter, out.clone(), false), || {
            let span = tracing::info_span!("reconcile", object = "ns/site");
            let _entered = span.enter();
            tracing::debug!(hidden = true, "only at debug");
            tracing::info!(listener = "db", bytes = 42_u64, "connection closed");
        });
        let bytes = out.0.lock().expect("log buffer").clone();
        String::from_utf8(bytes).expect("UTF-8 log")
    }

    /// The operator's JSON used to nest the event's fields under "fields"; both binaries
    /// now log them at the top level.
    #[test]
    fn json_lines_are_flat() {
        let text = log_one(LogFormat::Json, None);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "info only: {text}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).expect("one JSON object");
        assert_eq!(line["message"], "connection closed", "{line}");
        assert_eq!(line["listener"], "db", "{line}");
        assert_eq!(line["bytes"], 42, "{line}");
        assert_eq!(line["level"], "INFO", "{line}");
        assert!(line["timestamp"].is_string(), "{line}");
        assert!(line["target"].is_string(), "{line}");
        assert!(line.get("fields").is_none(), "nested fields: {line}");
        assert_eq!(line["span"]["object"], "ns/site", "{line}");
    }

    #[test]
    fn text_and_filters() {
        let text = log_one(LogFormat::Text, Some("debug"));
        assert!(text.contains("only at debug"), "{text}");
        assert!(
            text.contains("reconcile{object=\"ns/site\"}: tailnet_telemetry::logging::tests: connection closed listener=\"db\" bytes=42"),
            "no colours off a terminal: {text}"
        );
        assert!(
            serde_json::from_str::<serde_json::Value>(text.lines().next().unwrap_or("")).is_err()
        );
        let (_, rejected) = env_filter(Some("info,[=nonsense"));
        assert!(rejected.is_some_and(|e| e.contains("not a valid filter")));
        assert!(
            env_filter(Some("warn,tailnet_agent::proxy=debug"))
                .1
                .is_none()
        );
    }
}
