//! `promtool check metrics` (promtool from `deps/build.sh prometheus`) on a scrape: the lint
//! Prometheus users run on an exporter (HELP on every family, counter suffixes, base units).

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::error::{E2eError, Result};

/// Lints `exposition` (Prometheus text format) with `promtool check metrics`. `Ok(())` only
/// when promtool exits 0 and reports nothing; else `CommandFailed` with its report.
pub fn promtool_check_metrics(exposition: &str) -> Result<()> {
    let promtool = tno_testenv_kube::binaries::tool("prometheus", "promtool")?;
    let command = format!("{} check metrics", promtool.display());
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| E2eError::io(format!("starting {command}"), e))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| E2eError::io(&command, std::io::Error::other("no stdin pipe")))?;
    stdin
        .write_all(exposition.as_bytes())
        .map_err(|e| E2eError::io(format!("writing the scrape to {command}"), e))?;
    drop(stdin);
    let output = child
        .wait_with_output()
        .map_err(|e| E2eError::io(format!("waiting for {command}"), e))?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() && report.trim().is_empty() {
        Ok(())
    } else {
        Err(E2eError::CommandFailed {
            command,
            status: output.status,
            output: report,
        })
    }
}

/// The body of a raw HTTP/1.x response (after the blank line ending the head).
pub fn http_body(response: &str) -> Option<&str> {
    response.split_once("\r\n\r\n").map(|(_, body)| body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn promtool_here() -> bool {
        let found = tno_testenv_kube::binaries::tool("prometheus", "promtool").is_ok();
        assert!(
            found || std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
            "promtool missing (deps/build.sh prometheus)"
        );
        found
    }

    /// The check bites: OpenMetrics' counter naming read as text (the bug on the live
    /// scrapes) and a counter without `_total` are reported; a clean exposition passes.
    #[test]
    fn promtool_reports_a_counter_without_help_and_passes_a_clean_scrape() {
        if !promtool_here() {
            return;
        }
        let missing_help = "# HELP x_connections Connections.\n# TYPE x_connections counter\n\
                            x_connections_total{listener=\"db\"} 1\n# EOF\n";
        let error =
            promtool_check_metrics(missing_help).expect_err("no HELP on x_connections_total");
        assert!(
            error
                .to_string()
                .contains("x_connections_total no help text"),
            "{error}"
        );
        let bad_suffix =
            "# HELP x_connections Connections.\n# TYPE x_connections counter\nx_connections 1\n";
        let error = promtool_check_metrics(bad_suffix).expect_err("no _total");
        assert!(error.to_string().contains("_total"), "{error}");
        let clean = "# HELP x_connections_total Connections.\n# TYPE x_connections_total counter\n\
                     x_connections_total{listener=\"db\"} 1\n";
        promtool_check_metrics(clean).expect("a clean exposition");
    }

    #[test]
    fn the_body_follows_the_head() {
        assert_eq!(
            http_body("HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\n# HELP a b\n"),
            Some("# HELP a b\n")
        );
        assert_eq!(http_body("HTTP/1.0 200 OK\r\n"), None);
    }
}
