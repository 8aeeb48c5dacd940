//! Dialing an egress target through tailscaled, never around it.
//!
//! tailscaled ≥ 1.100 classifies a dial by the *first* address a name resolves to
//! (`UserDialPlan`) but then dials the *name* again with happy eyeballs across all of its
//! addresses (`UserDial`, tailscale commit f3a117e81), and `dialOneUser` sends every candidate
//! that is not a tailnet route to `SystemDial` — the pod's own network. A DNS name with one
//! routed and one unrouted address could therefore leak. So the agent resolves names itself
//! (the pod's resolver, which tailscaled would use too) and hands tailscaled only IP literals,
//! for which classification and dial agree. Names the pod's DNS does not know are asked of
//! tailscaled's own resolver (LocalAPI `dns-query`: MagicDNS, Headscale extra records and
//! split DNS — tailscaled's dial itself would ask only the pod's resolver for a name outside
//! the netmap, so a split-DNS name would never resolve) and dialed as literals too; a name
//! neither knows goes to tailscaled by name (its error names the failure).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::localapi::{DialFailureReason, Dialed, LocalApi, TunnelStream};
use crate::state::AgentState;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DialFailure {
    pub reason: DialFailureReason,
    pub message: String,
}

impl DialFailure {
    fn new(reason: DialFailureReason, message: impl Into<String>) -> Self {
        DialFailure {
            reason,
            message: message.into(),
        }
    }
}

/// Dials tailnet targets through the LocalAPI.
#[derive(Clone, Debug)]
pub struct TailnetDialer {
    api: LocalApi,
    timeout: Duration,
    state: Arc<AgentState>,
}

impl TailnetDialer {
    pub fn new(api: LocalApi, timeout: Duration, state: Arc<AgentState>) -> Self {
        TailnetDialer {
            api,
            timeout,
            state,
        }
    }

    /// A stream to `host:port` through the tailnet, or why not. Bounded by the dial timeout
    /// as a whole (resolution and every candidate).
    pub async fn dial(&self, host: &str, port: u16) -> Result<TunnelStream, DialFailure> {
        // Fail closed until tailscaled is known to answer Dial-Self: an older one would dial
        // unrouted targets from the pod network itself.
        if let Err(message) = self.state.dial_permitted() {
            return Err(DialFailure::new(DialFailureReason::Error, message));
        }
        let deadline = Instant::now() + self.timeout;
        let candidates =
            match tokio::time::timeout(self.timeout, candidates(&self.api, host, port)).await {
                Ok(candidates) => candidates,
                Err(_) => {
                    return Err(DialFailure::new(
                        DialFailureReason::Timeout,
                        format!("resolving {host} took longer than the dial timeout"),
                    ));
                }
            };
        let mut failures = Vec::new();
        for candidate in &candidates {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                failures.push(DialFailure::new(
                    DialFailureReason::Timeout,
                    format!("no connection to {host}:{port} within the dial timeout"),
                ));
                break;
            }
            match self.api.dial(candidate, port, remaining).await {
                Ok(Dialed::Tunnel(stream)) => return Ok(stream),
                Ok(Dialed::Refused { reason, message }) => {
                    failures.push(DialFailure::new(reason, format!("{candidate}: {message}")));
                }
                Err(error) => {
                    failures.push(DialFailure::new(
                        DialFailureReason::Error,
                        error_chain(&error),
                    ));
                }
            }
        }
        Err(summarize(failures))
    }
}

/// Which hosts to hand tailscaled for `host`: the literal itself, the pod resolver's
/// addresses (deduplicated, in resolver order), else tailscaled's resolver's (IPv4 first),
/// or the name when neither knows it.
async fn candidates(api: &LocalApi, host: &str, port: u16) -> Vec<String> {
    let host = host.trim();
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.parse::<IpAddr>().is_ok() {
        return vec![bare.to_owned()];
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    // A single label is a MagicDNS short name; the pod's search list would turn it into a
    // cluster name that tailscaled would never have chosen.
    if !name.contains('.') {
        return vec![name.to_owned()];
    }
    // Absolute, so the pod's search domains do not rewrite a tailnet name.
    match tokio::net::lookup_host((format!("{name}."), port)).await {
        Ok(addresses) => {
            let mut ips: Vec<IpAddr> = Vec::new();
            for address in addresses {
                if !ips.contains(&address.ip()) {
                    ips.push(address.ip());
                }
            }
            if ips.is_empty() {
                tailnet_candidates(api, name).await
            } else {
                ips.iter().map(IpAddr::to_string).collect()
            }
        }
        Err(_) => tailnet_candidates(api, name).await,
    }
}

/// `name` as tailscaled's resolver answers it (A, then AAAA), or the name itself.
async fn tailnet_candidates(api: &LocalApi, name: &str) -> Vec<String> {
    let (v4, v6) = tokio::join!(api.resolve(name, false), api.resolve(name, true));
    let ips: Vec<String> = v4
        .unwrap_or_default()
        .into_iter()
        .chain(v6.unwrap_or_default())
        .map(|ip| ip.to_string())
        .collect();
    if ips.is_empty() {
        vec![name.to_owned()]
    } else {
        ips
    }
}

/// One failure for the caller: Dial-Self only when no candidate got further than that
/// (then the target as a whole is not routed), else the first real failure.
fn summarize(failures: Vec<DialFailure>) -> DialFailure {
    let mut first_dial_self = None;
    for failure in failures {
        if failure.reason != DialFailureReason::DialSelf {
            return failure;
        }
        first_dial_self.get_or_insert(failure);
    }
    first_dial_self.unwrap_or_else(|| {
        DialFailure::new(
            DialFailureReason::Error,
            "the target resolved to no address",
        )
    })
}

/// `error: cause: cause` for logs and status messages.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn literals_and_short_names_are_not_resolved() {
        let api = LocalApi::new("/nonexistent/tailscaled.sock");
        assert_eq!(
            candidates(&api, "192.0.2.10", 5432).await,
            vec!["192.0.2.10"]
        );
        assert_eq!(
            candidates(&api, "[fd7a:115c::1]", 80).await,
            vec!["fd7a:115c::1"]
        );
        assert_eq!(candidates(&api, "nas", 445).await, vec!["nas"]);
        // Unknown to the pod's resolver and (no tailscaled here) to the tailnet's: the name.
        assert_eq!(
            candidates(&api, "db.site.invalid", 5432).await,
            vec!["db.site.invalid"]
        );
    }

    #[test]
    fn dial_self_is_reported_only_when_nothing_got_further() {
        let dial_self = DialFailure::new(DialFailureReason::DialSelf, "a");
        let refused = DialFailure::new(DialFailureReason::Refused, "b");
        assert_eq!(summarize(vec![dial_self.clone(), refused.clone()]), refused);
        assert_eq!(summarize(vec![dial_self.clone()]), dial_self);
        assert_eq!(summarize(Vec::new()).reason, DialFailureReason::Error);
    }
}
