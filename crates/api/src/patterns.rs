//! Regular expressions shared by the CRD schema (as `pattern`) and the Rust-side validation,
//! so that `tailnet-operator render` rejects exactly what the apiserver would.

/// RFC 1123 DNS label: namespaces, expose names, DNS labels.
pub const DNS_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// RFC 1035 label: Service names (must start with a letter).
pub const SERVICE_NAME: &str = r"^[a-z]([-a-z0-9]*[a-z0-9])?$";
/// RFC 1123 subdomain: object names (ConfigMaps, Secrets, issuers) and hostnames.
pub const DNS_SUBDOMAIN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A fully qualified hostname with at least two labels (aliases, TLS server names).
pub const HOSTNAME: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// A DNS name of an egress target: one or more labels, the last one starting with a letter
/// (so that `192.0.2.300` is not mistaken for a name).
pub const TARGET_DNS_NAME: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z]([-a-z0-9]*[a-z0-9])?$";
/// A Go `time.Duration` string as Kubernetes uses it, e.g. `600s`, `1m30s`, `1.5h`. A
/// superset of [`GEP_2257_DURATION`] (what HTTPRoute's timeouts accept), so both forms are
/// valid and values stored under earlier releases stay valid.
pub const DURATION: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";
/// The Gateway API duration format (GEP-2257), e.g. `1h30m`, `500ms`: every string it matches
/// also matches [`DURATION`] and parses to the same value (tested).
pub const GEP_2257_DURATION: &str = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$";
/// A Headscale policy principal: `group:x`, `tag:x`, `autogroup:x`, `user@` / `user@domain`, `*`.
pub const PRINCIPAL: &str = r"^(\*|group:[a-zA-Z0-9][-_.a-zA-Z0-9]*|tag:[a-z0-9][-a-z0-9]*|autogroup:[a-z][-a-z]*|[^\s@,:]+@[-.a-zA-Z0-9]*)$";
/// A name template: labels, dots and the `{name}` / `{namespace}` placeholders.
pub const NAME_TEMPLATE: &str = r"^([a-z0-9.-]|\{name\}|\{namespace\})+$";
/// The Headscale server URL.
pub const SERVER_URL: &str = r"^https?://[^\s/?#]+(/[^\s?#]*)?$";
/// An agent log filter (`RUST_LOG`): levels and `target=level` directives, comma-separated;
/// no spans or field filters.
pub const LOG_FILTER: &str = r"^[A-Za-z0-9_:.=,-]+$";
/// Tag prefix used in generated tags (`tag:<prefix>-egress-...`).
pub const TAG_PREFIX: &str = r"^[a-z][-a-z0-9]{0,15}$";
