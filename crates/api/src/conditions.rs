//! Condition helpers: stable `lastTransitionTime`, `observedGeneration`, comparison that
//! ignores timestamps (so status is written only when something really changed).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// `status` of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    pub fn from_bool(ok: bool) -> Self {
        if ok { Status::True } else { Status::False }
    }
}

/// Condition types used by the three resources (SPEC §6).
pub mod types {
    pub const READY: &str = "Ready";
    // Tailnet
    pub const HEADSCALE_REACHABLE: &str = "HeadscaleReachable";
    pub const BASE_VALID: &str = "BaseValid";
    pub const POLICY_APPLIED: &str = "PolicyApplied";
    pub const DNS_RENDERED: &str = "DNSRendered";
    /// Owner with `policy.contributors`: every contributor's fragment read and accepted.
    pub const CONTRIBUTIONS_ACCEPTED: &str = "ContributionsAccepted";
    /// `mode: Contribute`: the whole published fragment is in the live policy.
    pub const FRAGMENT_LIVE: &str = "FragmentLive";
    // Egress and ingress
    pub const TAILNET_READY: &str = "TailnetReady";
    pub const AGENT_READY: &str = "AgentReady";
    pub const NODE_ONLINE: &str = "NodeOnline";
    pub const POLICY_EFFECTIVE: &str = "PolicyEffective";
    pub const ROUTES_READY: &str = "RoutesReady";
    pub const SERVICES_READY: &str = "ServicesReady";
    pub const TARGETS_REACHABLE: &str = "TargetsReachable";
    pub const SOURCES_ALLOWED: &str = "SourcesAllowed";
    pub const BACKENDS_RESOLVED: &str = "BackendsResolved";
    pub const BACKENDS_REACHABLE: &str = "BackendsReachable";
    pub const CERTIFICATE_READY: &str = "CertificateReady";
    pub const HOSTNAMES_UNIQUE: &str = "HostnamesUnique";
    pub const SPEC_VALID: &str = "SpecValid";
    /// Service of the tailnet `loadBalancerClass`: every port's protocol is served (TCP).
    pub const PORTS_SUPPORTED: &str = "PortsSupported";
}

/// Every condition reason the operator sets (CamelCase). Each one has an anchor
/// `#<lowercased reason>` in `docs/troubleshooting.md` (a test checks it), so alert runbook
/// links and `kubectl describe` output lead to what it means and how to fix it.
pub mod reasons {
    // Any condition.
    pub const READY: &str = "Ready";
    /// `Ready=Unknown`: a required condition has not been evaluated yet.
    pub const PENDING: &str = "Pending";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const WRONG_NAMESPACE: &str = "WrongNamespace";
    // Tailnet: HeadscaleReachable (plus the Headscale client reasons in [`headscale`]).
    pub const REACHABLE: &str = "Reachable";
    pub const SECRET_MISSING: &str = "SecretMissing";
    pub const SECRET_UNREADABLE: &str = "SecretUnreadable";
    pub const SECRET_KEY_MISSING: &str = "SecretKeyMissing";
    /// `spec.serverCA` names a ConfigMap or key that does not exist.
    pub const SERVER_CA_MISSING: &str = "ServerCAMissing";
    /// `spec.serverCA`'s key holds no PEM certificate.
    pub const SERVER_CA_INVALID: &str = "ServerCAInvalid";
    // Tailnet: BaseValid.
    pub const VALID: &str = "Valid";
    pub const CONFIG_MAP_NOT_FOUND: &str = "ConfigMapNotFound";
    pub const CONFIG_MAP_UNREADABLE: &str = "ConfigMapUnreadable";
    pub const KEY_MISSING: &str = "KeyMissing";
    pub const SYNTAX_ERROR: &str = "SyntaxError";
    pub const INVALID_BASE: &str = "InvalidBase";
    // Tailnet: PolicyApplied (also passed on to PolicyEffective).
    pub const DRY_RUN: &str = "DryRun";
    pub const APPLIED: &str = "Applied";
    pub const REJECTED: &str = "Rejected";
    pub const OWNED_ELSEWHERE: &str = "OwnedElsewhere";
    /// Apply refused a document that would turn an allow-all tailnet deny-by-default
    /// (base without `acls`/`grants`, not accepted in `spec.policy.acceptedNotices`).
    pub const WOULD_LOCK_DOWN: &str = "WouldLockDown";
    pub const BASE_INVALID: &str = "BaseInvalid";
    pub const HEADSCALE_UNREACHABLE: &str = "HeadscaleUnreachable";
    // Tailnet: ContributionsAccepted (owner) and FragmentLive (contributor).
    pub const ACCEPTED: &str = "Accepted";
    pub const CONTRIBUTION_REFUSED: &str = "ContributionRefused";
    pub const CONTRIBUTOR_STALE: &str = "ContributorStale";
    /// Named in a contributor's refused entries (`ContributionRefused`): a DNS record over
    /// the DNS ConfigMap's budget, a fragment over its share of the contributions store.
    pub const DNS_BUDGET_EXCEEDED: &str = "DnsBudgetExceeded";
    pub const STORE_BUDGET_EXCEEDED: &str = "StoreBudgetExceeded";
    pub const FRAGMENT_LIVE: &str = "FragmentLive";
    pub const FRAGMENT_NOT_LIVE: &str = "FragmentNotLive";
    /// PolicyEffective of a contributor's resources is judged on the owner's live policy.
    pub const CONTRIBUTING: &str = "Contributing";
    /// A contributor without a Headscale key (no `apiSecretRef`): the owner has not written
    /// its Secret `<tailnet>-owner-keys` yet (HeadscaleReachable, TailnetReady), or the one
    /// it wrote does not parse (`OwnerFeedInvalid`).
    pub const AWAITING_OWNER: &str = "AwaitingOwner";
    pub const OWNER_FEED_INVALID: &str = "OwnerFeedInvalid";
    /// NodeOnline of a contributor's agent without a node: the owner has not written a
    /// pre-auth key for its tag yet (transient: it does once its fragment's tag is live).
    pub const AWAITING_OWNER_KEY: &str = "AwaitingOwnerKey";
    // Tailnet: DNSRendered.
    pub const RENDERED: &str = "Rendered";
    pub const NOT_CONFIGURED: &str = "NotConfigured";
    // Egress and ingress: TailnetReady, AgentReady, NodeOnline, PolicyEffective.
    pub const TAILNET_NOT_FOUND: &str = "TailnetNotFound";
    pub const TAILNET_UNREADABLE: &str = "TailnetUnreadable";
    pub const AGENT_NOT_READY: &str = "AgentNotReady";
    pub const ONLINE: &str = "Online";
    pub const NODE_OFFLINE: &str = "NodeOffline";
    pub const NODE_NOT_REGISTERED: &str = "NodeNotRegistered";
    pub const NOT_EFFECTIVE: &str = "NotEffective";
    // Egress: ServicesReady, RoutesReady (also per-target states in the status).
    pub const SERVICE_NAME_CONFLICT: &str = "ServiceNameConflict";
    pub const ROUTE_NOT_ADVERTISED: &str = "RouteNotAdvertised";
    pub const ROUTE_NOT_APPROVED: &str = "RouteNotApproved";
    pub const NOT_APPLICABLE: &str = "NotApplicable";
    // Egress: TargetsReachable from Headscale's view of a target node (a tailnet node address
    // or a MagicDNS name), and PolicyEffective for a MagicDNS target the live policy does not
    // grant.
    pub const TARGET_NODE_UNKNOWN: &str = "TargetNodeUnknown";
    pub const TARGET_NODE_OFFLINE: &str = "TargetNodeOffline";
    pub const TARGET_NODE_EXPIRED: &str = "TargetNodeExpired";
    pub const GRANT_MISSING: &str = "GrantMissing";
    // Ingress: SourcesAllowed, BackendsResolved, HostnamesUnique, CertificateReady.
    pub const SOURCE_NOT_ALLOWED: &str = "SourceNotAllowed";
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    pub const CROSS_NAMESPACE_BACKEND: &str = "CrossNamespaceBackendNotAllowed";
    /// BackendsResolved: a backend in a namespace a namespace-scoped operator does not watch.
    pub const BACKEND_NAMESPACE_NOT_WATCHED: &str = "BackendNamespaceNotWatched";
    pub const HOSTNAME_CONFLICT: &str = "HostnameConflict";
    /// AgentReady: the ingress's tag is held by another resource (no key, no node of its own).
    pub const TAG_CONFLICT: &str = "TagConflict";
    pub const ISSUING: &str = "Issuing";
    pub const NAMES_NOT_COVERED: &str = "NamesNotCovered";
    pub const EXPIRED: &str = "Expired";
    pub const NOT_YET_VALID: &str = "NotYetValid";
    pub const INVALID_CERTIFICATE: &str = "InvalidCertificate";
    pub const CERTIFICATE_NOT_CREATED: &str = "CertificateNotCreated";
    /// PortsSupported (Service): a UDP or SCTP port, not served (the TCP ports are).
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    /// TailnetReady (Service): several Tailnets exist and no annotation names one.
    pub const TAILNET_REQUIRED: &str = "TailnetRequired";
    /// Per-expose state in the ingress status (not a condition reason).
    pub const NOT_SERVED: &str = "NotServed";
    // TargetsReachable / BackendsReachable: the agent's probe results
    // ([`crate::agent_status::ProbeState::label`]) plus what the operator observed.
    pub const NO_ROUTE: &str = "NoRoute";
    pub const REFUSED: &str = "Refused";
    pub const TIMEOUT: &str = "Timeout";
    pub const PROBE_ERROR: &str = "Error";
    pub const NOT_OBSERVED: &str = "NotObserved";
    pub const NOT_PROBED_YET: &str = "NotProbedYet";
    /// The agent's tailscaled has not reached `Running` yet (pod just started, logging in):
    /// probes through the tailnet cannot succeed yet; transient, not a fault.
    pub const AGENT_STARTING: &str = "AgentStarting";

    /// Reasons that come from the Headscale client (`tailnet_headscale::Error::reason`) and
    /// end up in `HeadscaleReachable`, `PolicyApplied`, `NodeOnline`, `TailnetReady` and
    /// `PolicyEffective`. Mirrored here so the docs test sees them; a test in this crate
    /// checks the mirror against the client.
    pub mod headscale {
        pub const DNS_ERROR: &str = "DNSError";
        pub const CONNECTION_FAILED: &str = "ConnectionFailed";
        pub const TLS_ERROR: &str = "TLSError";
        /// Headscale's certificate is not signed by a CA the operator trusts (set or fix
        /// `spec.serverCA`) or not valid for the server's name.
        pub const CERTIFICATE_UNTRUSTED: &str = "CertificateUntrusted";
        pub const TIMEOUT: &str = "Timeout";
        pub const TRANSPORT_ERROR: &str = "TransportError";
        pub const UNAUTHORIZED: &str = "Unauthorized";
        pub const API_ERROR: &str = "APIError";
        pub const UNEXPECTED_RESPONSE: &str = "UnexpectedResponse";
        pub const RESPONSE_TOO_LARGE: &str = "ResponseTooLarge";
        pub const INVALID_URL: &str = "InvalidURL";
        pub const CLIENT_ERROR: &str = "ClientError";

        pub const ALL: &[&str] = &[
            DNS_ERROR,
            CONNECTION_FAILED,
            CERTIFICATE_UNTRUSTED,
            TLS_ERROR,
            TIMEOUT,
            TRANSPORT_ERROR,
            UNAUTHORIZED,
            API_ERROR,
            UNEXPECTED_RESPONSE,
            RESPONSE_TOO_LARGE,
            INVALID_URL,
            CLIENT_ERROR,
            // The client refuses a `spec.serverCA` bundle it cannot read (the operator names
            // that before building a client; this is the client's own check).
            super::SERVER_CA_INVALID,
        ];
    }
}

/// Builds a condition; `last_transition_time` is filled by [`upsert`].
pub fn condition(
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        // Messages can grow with their inputs (names, contributors' entries): bounded.
        message: crate::bounded::bounded(&message.into(), crate::bounded::MAX_MESSAGE_BYTES),
        observed_generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

/// Inserts or replaces the condition of the same type. The transition time is kept when the
/// status did not change (Kubernetes API conventions) and set to `now` otherwise.
pub fn upsert(conditions: &mut Vec<Condition>, mut new: Condition, now: &Time) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            new.last_transition_time = if existing.status == new.status {
                existing.last_transition_time.clone()
            } else {
                now.clone()
            };
            *existing = new;
        }
        None => {
            new.last_transition_time = now.clone();
            conditions.push(new);
        }
    }
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// Finds a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when both lists say the same thing, ignoring transition timestamps.
pub fn same_ignoring_time(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().all(|ca| {
            find(b, &ca.type_).is_some_and(|cb| {
                ca.status == cb.status
                    && ca.reason == cb.reason
                    && ca.message == cb.message
                    && ca.observed_generation == cb.observed_generation
            })
        })
}

/// Derives `Ready` from the given condition types: the first one that is not `True` (in the
/// order given, which should be the order of dependencies) names the missing precondition.
pub fn ready_from(
    conditions: &[Condition],
    required: &[&str],
    observed_generation: Option<i64>,
) -> Condition {
    for type_ in required {
        match find(conditions, type_) {
            Some(c) if c.status == "True" => continue,
            Some(c) => {
                return condition(
                    types::READY,
                    Status::False,
                    &c.reason,
                    format!("{}: {}", c.type_, c.message),
                    observed_generation,
                );
            }
            None => {
                return condition(
                    types::READY,
                    Status::Unknown,
                    reasons::PENDING,
                    format!("{type_} has not been evaluated yet"),
                    observed_generation,
                );
            }
        }
    }
    condition(
        types::READY,
        Status::True,
        reasons::READY,
        "all preconditions hold",
        observed_generation,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("valid timestamp"))
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let mut list = Vec::new();
        upsert(
            &mut list,
            condition("A", Status::True, "Ok", "first", Some(1)),
            &at(10),
        );
        upsert(
            &mut list,
            condition("A", Status::True, "Ok", "second", Some(2)),
            &at(20),
        );
        assert_eq!(list[0].last_transition_time, at(10));
        assert_eq!(list[0].message, "second");
        upsert(
            &mut list,
            condition("A", Status::False, "Broken", "third", Some(2)),
            &at(30),
        );
        assert_eq!(list[0].last_transition_time, at(30));
    }

    #[test]
    fn comparison_ignores_timestamps_only() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        upsert(
            &mut a,
            condition("A", Status::True, "Ok", "m", Some(1)),
            &at(10),
        );
        upsert(
            &mut b,
            condition("A", Status::True, "Ok", "m", Some(1)),
            &at(99),
        );
        assert!(same_ignoring_time(&a, &b));
        upsert(
            &mut b,
            condition("A", Status::True, "Ok", "other", Some(1)),
            &at(99),
        );
        assert!(!same_ignoring_time(&a, &b));
    }

    #[test]
    fn ready_names_first_missing_precondition() {
        let mut list = Vec::new();
        upsert(
            &mut list,
            condition("TailnetReady", Status::True, "Ready", "ok", Some(3)),
            &at(1),
        );
        upsert(
            &mut list,
            condition(
                "RoutesReady",
                Status::False,
                "RouteNotApproved",
                "approve 192.0.2.0/24",
                Some(3),
            ),
            &at(1),
        );
        let ready = ready_from(&list, &["TailnetReady", "RoutesReady"], Some(3));
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, "RouteNotApproved");
        assert_eq!(ready.message, "RoutesReady: approve 192.0.2.0/24");
        let pending = ready_from(&list, &["TailnetReady", "AgentReady"], Some(3));
        assert_eq!(pending.status, "Unknown");
        let ok = ready_from(&list, &["TailnetReady"], Some(3));
        assert_eq!(ok.status, "True");
    }
}
