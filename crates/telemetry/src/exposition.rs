//! `/metrics` content negotiation.
//!
//! prometheus-client encodes OpenMetrics, where a counter's family is named without `_total`
//! (`# HELP x_connections …`, sample `x_connections_total`). Read as the Prometheus text
//! format (curl piped into `promtool check metrics`, scrapers that do not ask for
//! OpenMetrics) that is a sample-less family plus an untyped `x_connections_total` without
//! HELP. So the format follows `Accept`, as Prometheus' own client libraries do: OpenMetrics
//! when asked for, else the Prometheus text format 0.0.4 (HELP and TYPE on `x_total`).

use prometheus_client::registry::Registry;

pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Prometheus,
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
}

/// One media range of an `Accept` header: its type and quality.
fn media_ranges(accept: &str) -> impl Iterator<Item = (String, f32, Option<String>)> + '_ {
    accept.split(',').filter_map(|range| {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next()?.to_ascii_lowercase();
        if media.is_empty() {
            return None;
        }
        let mut quality = 1.0;
        let mut version = None;
        for parameter in parts {
            let Some((key, value)) = parameter.split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"');
            match key.trim().to_ascii_lowercase().as_str() {
                "q" => quality = value.parse().unwrap_or(0.0),
                "version" => version = Some(value.to_string()),
                _ => {}
            }
        }
        Some((media, quality, version))
    })
}

impl Format {
    /// The format for a request's `Accept` header: among the ranges we can serve, the one of
    /// highest quality (the first of equal quality); none (or no header): Prometheus text.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let mut best: Option<(f32, Format)> = None;
        for (media, quality, version) in media_ranges(accept.unwrap_or_default()) {
            let format = match (media.as_str(), version.as_deref()) {
                ("application/openmetrics-text", None | Some("1.0.0" | "0.0.1")) => {
                    Format::OpenMetrics
                }
                ("text/plain" | "text/*" | "*/*", _) => Format::Prometheus,
                _ => continue,
            };
            if quality > 0.0 && best.is_none_or(|(q, _)| quality > q) {
                best = Some((quality, format));
            }
        }
        best.map_or(Format::Prometheus, |(_, format)| format)
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }

    /// The registry's metrics in this format.
    pub fn encode(self, registry: &Registry) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        match self {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?;
            }
            Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry)?,
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Listener {
        listener: String,
    }

    #[test]
    fn prometheus_asks_for_openmetrics_curl_gets_text() {
        // Prometheus 3's default scrape_protocols.
        let prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,\
            application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;\
            escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        // Prometheus 2.
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                 version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            Format::OpenMetrics
        );
        for text in [
            None,
            Some("*/*"),
            Some(""),
            Some("text/plain"),
            Some("text/plain;version=0.0.4"),
            Some("application/json"),
            // Asked for, but less than text.
            Some("application/openmetrics-text;q=0.2, text/plain;q=0.9"),
            // Refused outright.
            Some("application/openmetrics-text;q=0"),
            // A version we do not write.
            Some("application/openmetrics-text;version=2.0.0"),
        ] {
            assert_eq!(Format::negotiate(text), Format::Prometheus, "{text:?}");
        }
        assert_eq!(
            Format::negotiate(Some("text/plain;q=0.5, Application/OpenMetrics-Text")),
            Format::OpenMetrics
        );
    }

    /// The bug: only OpenMetrics was served, and promtool (text format) saw counters without
    /// HELP. The text format names the counter's family with `_total`.
    #[test]
    fn counters_carry_help_under_their_sample_name_in_the_text_format() {
        let mut registry = Registry::default();
        let connections = Family::<Listener, Counter>::default();
        registry.sub_registry_with_prefix("x").register(
            "connections",
            "Connections",
            connections.clone(),
        );
        connections
            .get_or_create(&Listener {
                listener: "db".into(),
            })
            .inc();
        let text = Format::Prometheus.encode(&registry).expect("text");
        assert!(
            text.contains("# HELP x_connections_total Connections.\n# TYPE x_connections_total counter\nx_connections_total{listener=\"db\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        let open = Format::OpenMetrics.encode(&registry).expect("OpenMetrics");
        assert!(
            open.contains("# HELP x_connections Connections.\n# TYPE x_connections counter\nx_connections_total{listener=\"db\"} 1\n"),
            "{open}"
        );
        assert!(open.ends_with("# EOF\n"), "{open}");
    }
}
