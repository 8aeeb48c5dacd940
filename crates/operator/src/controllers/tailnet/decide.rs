//! Decide steps of the Tailnet controller (pure). The policy sync needs Headscale's answer in
//! the middle, so the decision comes in steps that the act step feeds:
//! [`plan`] (from the observation: `HeadscaleReachable`, `BaseValid`, `DNSRendered`, the
//! rendered policy, its diff and ConfigMap, the route approvals, the DNS ConfigMap), then
//! [`after_check`] (Headscale's check: DryRun, Rejected, OwnedElsewhere, unchanged or PUT),
//! [`after_set`] (Headscale's answer to the PUT), then [`finish`] (`PolicyApplied`, the policy
//! status, which grants are live, `Ready`).
//!
//! Purity: this module and those it imports (observation, role, contributions, dns,
//! effective, locations, config, status) do no I/O; the observation types live in
//! `observation.rs`, which gather fills.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tailnet_api::conditions::{reasons, types};
use tailnet_api::fragment::FragmentDnsRecord;
use tailnet_api::tailnet::{AcceptedNotice, FragmentStatus, TailnetStatus};
use tailnet_api::{Tailnet, validate};
use tailnet_policy::{BasePolicy, PolicyInputs, PolicyNotice, RenderedPolicy, RouteApproval};

use super::super::config::OperatorConfig;
use super::super::status::{ConditionSet, Problem};
use super::locations::BASE_POLICY_KEY;
use super::observation::{ApiKeyFacts, TailnetObservation};
use super::role::{OwnerMode, Role};
use super::{contributions, dns, effective};
use tailnet_render::desired;
use tailnet_render::intent::TailnetScope;

/// Upper bound for the rendered-policy ConfigMap's data: the apiserver refuses a ConfigMap
/// whose data exceeds 1 MiB (1,048,576 bytes); some room is left for the key names.
const RENDERED_POLICY_BUDGET: usize = 1_000_000;

/// Name of the ConfigMap holding the rendered document, its diff and a summary.
pub fn rendered_policy_config_map(tailnet: &str) -> String {
    format!("{tailnet}-rendered-policy")
}

/// Installation identity written into this Tailnet's policy marker.
pub fn installation_id(config: &OperatorConfig, tailnet: &str) -> String {
    tailnet_api::tailnet::marker_installation_id(&config.installation_id, tailnet)
}

pub use tailnet_api::digest::sha256_hex as sha256;

/// A condition's value, decided before it is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    True(&'static str, String),
    False(Problem),
    Unknown(Problem),
}

impl Verdict {
    pub fn set(self, c: &mut ConditionSet, type_: &str) {
        match self {
            Verdict::True(reason, message) => c.ok(type_, reason, message),
            Verdict::False(problem) => c.fail(type_, problem),
            Verdict::Unknown(problem) => c.unknown(type_, problem),
        }
    }
}

/// Headscale's answer to a policy check or PUT, as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Headscale answered with an error: it refuses the document (its message says why).
    Rejected(String),
    /// The call failed otherwise (transport, key, unexpected answer).
    Failed(Problem),
}

pub type Answer = Result<(), Refusal>;

/// An Event to publish about the Tailnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyEvent {
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// What the act step does for one Tailnet, decided from the observation.
#[derive(Clone, Debug)]
pub struct TailnetPlan {
    /// `HeadscaleReachable`, `BaseValid`, `DNSRendered`, and `PolicyApplied` when it does not
    /// depend on Headscale's answer.
    pub conditions: ConditionSet,
    /// The status without conditions (they are added by [`finish`]).
    pub status: TailnetStatus,
    pub rendered: Option<RenderedPolicy>,
    /// `Some` when the rendered policy can be compared with the live one: then the act step
    /// publishes the rendered-policy ConfigMap and asks Headscale to check the document.
    pub sync: Option<PolicySync>,
    /// The live policy as observed.
    pub live_policy: Option<String>,
    /// Route approvals to send (Apply mode, route approval on, nodes known).
    pub approvals: Vec<RouteApproval>,
    /// The DNS ConfigMap to apply, when our keys in it changed.
    pub dns: Option<ConfigMap>,
    /// Events that follow from the observation alone (e.g. [`INSECURE_SERVER_EVENT`]).
    pub events: Vec<PolicyEvent>,
    /// Contributor: the fragment ConfigMap to publish (nothing goes to Headscale).
    pub fragment: Option<ConfigMap>,
    /// Owner: the store of accepted fragments, when it changed.
    pub contribution_store: Option<ConfigMap>,
    /// Owner or contributor, as decided from the spec.
    pub role: Role,
    /// Owner with merged contributions: the same sync without each contributor's entries in
    /// turn (then without all of them), for when Headscale refuses the merged document.
    pub exclusions: Vec<Exclusion>,
    /// Owner: each contributor's accepted tags (the keys it may get, see `feed.rs`).
    pub contributed_tags: BTreeMap<String, Vec<String>>,
}

/// What the owner applies instead when Headscale refuses the merged document and accepts it
/// without `contributors`' entries (see [`exclude`]).
#[derive(Clone, Debug)]
pub struct Exclusion {
    /// Whose entries are left out.
    pub contributors: Vec<String>,
    pub sync: PolicySync,
    pub rendered: RenderedPolicy,
    pub approvals: Vec<RouteApproval>,
    /// The DNS ConfigMap without their records (`None`: unchanged).
    pub dns: Option<ConfigMap>,
    /// The store with their entries as they were (`None`: unchanged): only what Headscale
    /// accepted is persisted as last accepted.
    pub contribution_store: Option<ConfigMap>,
}

/// Event reason: `spec.server` is plain `http://` to a host outside the machine and the
/// cluster, so the admin API key crosses the network in clear.
pub const INSECURE_SERVER_EVENT: &str = "InsecureServer";
/// Appended to `HeadscaleReachable`'s message while the server is insecure; its presence in
/// the previous status is what makes the Warning Event fire once, not on every poll.
pub const INSECURE_SERVER_NOTE: &str = "warning: spec.server is plain http:// to a host outside this machine and the cluster, so the Headscale API key travels in clear; use https://";

/// Plain `http://` to a host that is neither loopback nor cluster-internal (the API key would
/// travel in clear over a network). Loopback: 127.0.0.0/8, ::1, `localhost`; cluster-internal:
/// `*.svc`, `*.svc.cluster.local`, `*.cluster.local` (and a bare in-namespace Service name is
/// not a URL host the schema accepts without a dot, so it is judged like any other host).
pub fn insecure_server(server: &str) -> bool {
    let Ok(url) = url::Url::parse(server) else {
        return false;
    };
    if url.scheme() != "http" {
        return false;
    }
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return !ip.is_loopback();
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let local = host == "localhost"
        || host.ends_with(".localhost")
        || host.ends_with(".svc")
        || host.ends_with(".svc.cluster.local")
        || host.ends_with(".cluster.local");
    !local
}

/// The Warning Event about an insecure `spec.server`, once: not when the previous status
/// already carried [`INSECURE_SERVER_NOTE`].
fn insecure_server_event(tailnet: &Tailnet, previous: &TailnetStatus) -> Option<PolicyEvent> {
    if !insecure_server(&tailnet.spec.server) {
        return None;
    }
    let warned = tailnet_api::conditions::find(&previous.conditions, types::HEADSCALE_REACHABLE)
        .is_some_and(|c| c.message.contains(INSECURE_SERVER_NOTE));
    (!warned).then(|| PolicyEvent {
        type_: EventType::Warning,
        reason: INSECURE_SERVER_EVENT,
        action: "Reconcile",
        note: format!(
            "spec.server {} is plain http:// to a host outside this machine and the cluster: the Headscale admin API key travels in clear; use https:// (or an in-cluster Service address)",
            tailnet.spec.server
        ),
    })
}

/// From this many days before the API key's expiry on, `HeadscaleReachable` warns and a
/// Warning Event [`API_KEY_EXPIRING_EVENT`] is published (once).
pub const API_KEY_WARNING_DAYS: i64 = 14;
/// Event reason: the operator's Headscale API key expires within [`API_KEY_WARNING_DAYS`].
pub const API_KEY_EXPIRING_EVENT: &str = "ApiKeyExpiring";
/// Starts `HeadscaleReachable`'s key note while the key expires soon; its presence in the
/// previous status is what makes the Event fire once.
pub const API_KEY_EXPIRING_NOTE: &str = "warning: the Headscale API key";

/// The sentence about the API key's lifetime in `HeadscaleReachable`, and whether it
/// expires within [`API_KEY_WARNING_DAYS`]. Names the key by its public prefix only.
pub fn api_key_note(key: &ApiKeyFacts, now: Timestamp) -> (String, bool) {
    let Some(expiration) = key.expiration else {
        return (format!("the API key {} does not expire", key.prefix), false);
    };
    let left = expiration.as_second().saturating_sub(now.as_second());
    let days = left / 86_400;
    let hours = (left % 86_400) / 3_600;
    let within = if left <= 0 {
        "now".to_string()
    } else {
        format!("in {days}d {hours}h")
    };
    if left < API_KEY_WARNING_DAYS * 86_400 {
        (
            format!(
                "{API_KEY_EXPIRING_NOTE} {} expires {expiration} ({within}): create a new key and put it into the Secret before then, the operator picks it up at its next poll (docs/prerequisites.md#rotating-the-api-key)",
                key.prefix
            ),
            true,
        )
    } else {
        (
            format!("the API key {} expires {expiration} ({within})", key.prefix),
            false,
        )
    }
}

/// The Warning Event about a key that expires soon, once: not when the previous status's
/// `HeadscaleReachable` already carried [`API_KEY_EXPIRING_NOTE`].
fn api_key_event(
    observed: &TailnetObservation,
    previous: &TailnetStatus,
    now: Timestamp,
) -> Option<PolicyEvent> {
    let key = observed
        .api_key
        .as_ref()
        .filter(|_| observed.headscale.is_ok())?;
    let (note, soon) = api_key_note(key, now);
    let warned = tailnet_api::conditions::find(&previous.conditions, types::HEADSCALE_REACHABLE)
        .is_some_and(|c| c.message.contains(API_KEY_EXPIRING_NOTE));
    (soon && !warned).then_some(PolicyEvent {
        type_: EventType::Warning,
        reason: API_KEY_EXPIRING_EVENT,
        action: "Reconcile",
        note,
    })
}

/// The rendered document against the live one.
#[derive(Clone, Debug)]
pub struct PolicySync {
    pub mode: OwnerMode,
    pub document: String,
    pub live: String,
    pub diff: String,
    pub added: usize,
    pub removed: usize,
    /// The render summary (long form).
    pub summary: String,
    /// The rendered-policy ConfigMap (document, diff, summary, notices).
    pub config_map: ConfigMap,
    /// The document turns an allow-all base deny-by-default and the Tailnet does not accept
    /// that (`spec.policy.acceptedNotices`): Apply refuses it unless the live policy already
    /// is ours and states rules (see [`lockdown_refusal`]).
    pub locks_down: bool,
}

/// What the policy sync came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyOutcome {
    /// `PolicyApplied`.
    pub verdict: Verdict,
    /// `policy_syncs` result label.
    pub metric: Option<&'static str>,
    pub event: Option<PolicyEvent>,
    /// The rendered document is live (`status.policy.appliedHash` follows it).
    pub applied: bool,
    /// The rendered document was just written (it is the live one now).
    pub written: bool,
}

/// The step after Headscale's check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyStep {
    Done(PolicyOutcome),
    /// PUT the document; on success, publish `event`.
    Put {
        event: PolicyEvent,
    },
}

/// The status written for a spec that fails validation (the schema already checks; this
/// catches what slipped past, e.g. objects stored before a schema change). `None`: valid.
pub fn refuse_invalid(tailnet: &Tailnet, now: Timestamp) -> Option<TailnetStatus> {
    let errors = validate::tailnet(&tailnet.spec);
    if errors.is_empty() {
        return None;
    }
    let previous = tailnet.status.clone().unwrap_or_default();
    let mut c = ConditionSet::new(&previous.conditions, tailnet.metadata.generation, now);
    c.fail(
        types::READY,
        Problem::new(reasons::INVALID_SPEC, validate::summarize(&errors)),
    );
    Some(TailnetStatus {
        observed_generation: tailnet.metadata.generation,
        conditions: c.into_list(),
        ..previous
    })
}

/// Everything that follows from the observation alone. The role is decided first; each
/// step that differs between owner and contributor branches on it once.
pub fn plan(
    tailnet: &Tailnet,
    observed: &TailnetObservation,
    config: &OperatorConfig,
    now: Timestamp,
) -> TailnetPlan {
    let role = Role::of(&tailnet.spec.policy);
    let previous = tailnet.status.clone().unwrap_or_default();
    let mut c = ConditionSet::new(&previous.conditions, tailnet.metadata.generation, now);
    let mut status = TailnetStatus {
        observed_generation: tailnet.metadata.generation,
        conditions: Vec::new(),
        ..previous.clone()
    };
    reachability(tailnet, observed, now, &mut c, &mut status);
    let events = insecure_server_event(tailnet, &previous)
        .into_iter()
        .chain(api_key_event(observed, &previous, now))
        .collect();
    let desired = desired_inputs(tailnet, observed, config);
    let composed = compose(&role, tailnet, observed, config, desired, &mut c, now);
    status.contributors = composed.merge.statuses.clone();
    let mut policy = previous.policy.clone().unwrap_or_default();
    if role == Role::Contributor
        && tailnet.spec.api_secret_ref.is_none()
        && live_policy(observed).is_none()
    {
        // Without a key, no (or an expired) feed from the owner: nothing is known to be live.
        policy.effective_for.clear();
    }
    policy.rendered_hash = composed.rendered.as_ref().map(|r| sha256(&r.document));
    if let Some(rendered) = &composed.rendered {
        policy.summary = Some(short_summary(rendered));
    }
    status.policy = Some(policy);
    let target = match &role {
        Role::Owner { mode, .. } => {
            owner_target(*mode, tailnet, observed, config, &composed, &mut c)
        }
        Role::Contributor => {
            let previous = previous.fragment.clone();
            contributor_target(tailnet, observed, config, &composed, previous, &mut c)
        }
    };
    status.fragment = target.fragment_status;
    let exclusions = match (&role, &target.sync) {
        (Role::Owner { mode, .. }, Some(_)) => {
            exclusions(*mode, tailnet, observed, config, &composed, &c)
        }
        _ => Vec::new(),
    };
    let Composed {
        inputs: _,
        dns_inputs,
        merge,
        rendered,
        base: _,
    } = composed;
    let dns = dns::decide(
        tailnet,
        observed,
        config,
        dns_inputs,
        &merge.dns_records,
        &mut c,
    );
    let contribution_store = merge
        .store
        .as_ref()
        .map(|store| contributions::store_object(tailnet, config, store));
    let contributed_tags = merge
        .contributions
        .iter()
        .map(|c| (c.contributor.clone(), c.tags.clone()))
        .collect();
    TailnetPlan {
        contributed_tags,
        fragment: target.fragment,
        contribution_store,
        role,
        conditions: c,
        status,
        rendered,
        sync: target.sync,
        live_policy: observed.live_policy.clone(),
        approvals: target.approvals,
        dns,
        events,
        exclusions,
    }
}

/// The owner's sync without each merged contributor's entries in turn, then (with two or
/// more) without all of them: what [`exclude`] picks from when Headscale refuses the merged
/// document. Empty without contributions.
fn exclusions(
    mode: OwnerMode,
    tailnet: &Tailnet,
    observed: &TailnetObservation,
    config: &OperatorConfig,
    composed: &Composed,
    c: &ConditionSet,
) -> Vec<Exclusion> {
    let (Some(base), Some(live)) = (&composed.base, live_policy(observed)) else {
        return Vec::new();
    };
    let names: Vec<String> = composed
        .inputs
        .contributions
        .iter()
        .map(|contribution| contribution.contributor.clone())
        .collect();
    let mut groups: Vec<Vec<String>> = names.iter().map(|name| vec![name.clone()]).collect();
    if names.len() > 1 {
        groups.push(names);
    }
    groups
        .into_iter()
        .filter_map(|left_out| {
            let mut inputs = composed.inputs.clone();
            inputs
                .contributions
                .retain(|contribution| !left_out.contains(&contribution.contributor));
            let rendered = render(base, &inputs).ok()?;
            let sync = policy_sync(mode, tailnet, config, &rendered, live);
            let approvals = if mode == OwnerMode::Apply
                && config.approve_routes
                && observed.headscale.is_ok()
                && observed.nodes.is_some()
            {
                tailnet_policy::routes_needing_approval(&inputs)
            } else {
                Vec::new()
            };
            let records: Vec<_> = composed
                .merge
                .dns_records
                .iter()
                .filter(|(contributor, _)| !left_out.contains(contributor))
                .cloned()
                .collect();
            let dns = dns::decide(
                tailnet,
                observed,
                config,
                composed.dns_inputs.clone(),
                &records,
                &mut c.clone(),
            );
            let contribution_store =
                store_without(&composed.merge, &observed.contribution_store, &left_out)
                    .map(|store| contributions::store_object(tailnet, config, &store));
            Some(Exclusion {
                contributors: left_out,
                sync,
                rendered,
                approvals,
                dns,
                contribution_store,
            })
        })
        .collect()
}

/// The store as the merge wants it, but with `left_out`'s entries as they were stored
/// (`None`: that is the stored one).
fn store_without(
    merge: &contributions::OwnerMerge,
    stored: &BTreeMap<String, super::observation::StoredFragment>,
    left_out: &[String],
) -> Option<BTreeMap<String, super::observation::StoredFragment>> {
    let mut store = merge.store.clone()?;
    for name in left_out {
        match stored.get(name) {
            Some(previous) => store.insert(name.clone(), previous.clone()),
            None => store.remove(name),
        };
    }
    (store != *stored).then_some(store)
}

/// Headscale refused the merged document (`reason`) and accepted `plan.exclusions[index]`:
/// that one becomes the plan — its document, approvals, DNS and store — and the left-out
/// contributors' `status.contributors[]` entries and `ContributionsAccepted` say why. The
/// owner's own changes apply; nothing of the refused entries is persisted as accepted.
pub fn exclude(plan: &mut TailnetPlan, index: usize, reason: &str) {
    if index >= plan.exclusions.len() {
        return;
    }
    let exclusion = plan.exclusions.swap_remove(index);
    plan.exclusions.clear();
    let note = format!(
        "Headscale refused the merged policy with this contributor's entries, which are left out (the owner's policy applies without them): {reason}"
    );
    for status in &mut plan.status.contributors {
        if exclusion.contributors.contains(&status.name) {
            status.state = tailnet_api::tailnet::contributor_state::REFUSED.to_string();
            status.merged_hash = None;
            status.merged = None;
            status.refused.insert(0, note.clone());
        }
    }
    plan.conditions.fail(
        types::CONTRIBUTIONS_ACCEPTED,
        Problem::new(
            reasons::CONTRIBUTION_REFUSED,
            format!(
                "Headscale refused the merged policy; left out the entries of {}: {reason}",
                exclusion.contributors.join(", ")
            ),
        ),
    );
    if let Some(policy) = plan.status.policy.as_mut() {
        policy.rendered_hash = Some(sha256(&exclusion.rendered.document));
        policy.summary = Some(short_summary(&exclusion.rendered));
    }
    plan.sync = Some(exclusion.sync);
    plan.rendered = Some(exclusion.rendered);
    plan.approvals = exclusion.approvals;
    plan.dns = exclusion.dns;
    plan.contribution_store = exclusion.contribution_store;
}

/// After the sync: a document Headscale refused (no exclusion it accepted either) persists
/// nothing new as last accepted — the store of accepted fragments is not written.
pub fn keep_store_unless_accepted(plan: &mut TailnetPlan, outcome: Option<&PolicyOutcome>) {
    let refused = outcome.is_some_and(|outcome| {
        matches!(&outcome.verdict, Verdict::False(problem) if problem.reason == reasons::REJECTED)
    });
    if refused {
        plan.contribution_store = None;
    }
}

/// `HeadscaleReachable` (with the insecure-server note) and the version seen.
fn reachability(
    tailnet: &Tailnet,
    observed: &TailnetObservation,
    now: Timestamp,
    c: &mut ConditionSet,
    status: &mut TailnetStatus,
) {
    let insecure = insecure_server(&tailnet.spec.server);
    let key_note = observed
        .api_key
        .as_ref()
        .map(|key| api_key_note(key, now).0);
    let with_note = |message: String| {
        let message = match &key_note {
            Some(note) => format!("{message}; {note}"),
            None => message,
        };
        if insecure {
            format!("{message}; {INSECURE_SERVER_NOTE}")
        } else {
            message
        }
    };
    match &observed.headscale {
        Ok(version) if tailnet.spec.api_secret_ref.is_none() => {
            status.headscale_version = Some(version.clone());
            c.ok(
                types::HEADSCALE_REACHABLE,
                reasons::REACHABLE,
                with_note(format!(
                    "Headscale {version} at {}, as the owner reports it in Secret {}: this installation holds no Headscale key (its agents' pre-auth keys and node facts come from that Secret)",
                    tailnet.spec.server,
                    tailnet_api::owner_feed::owner_keys_secret(&tailnet.name_any())
                )),
            );
        }
        Ok(version) => {
            status.headscale_version = Some(version.clone());
            c.ok(
                types::HEADSCALE_REACHABLE,
                reasons::REACHABLE,
                with_note(format!(
                    "Headscale {version} at {} accepts the API key",
                    tailnet.spec.server
                )),
            );
        }
        Err(problem) => {
            let mut problem = problem.clone();
            problem.message = with_note(problem.message);
            c.fail(types::HEADSCALE_REACHABLE, problem)
        }
    }
}

/// The renderer's inputs for this Tailnet's policy and DNS (its egresses and ingresses,
/// Headscale's nodes). The one place the Tailnet controller calls
/// `tailnet_render::desired`, the same functions as `tailnet-operator render`.
pub struct DesiredInputs {
    pub policy: PolicyInputs,
    pub dns: tailnet_render::dns::DnsInputs,
}

pub fn desired_inputs(
    tailnet: &Tailnet,
    observed: &TailnetObservation,
    config: &OperatorConfig,
) -> DesiredInputs {
    let nodes = observed.nodes.as_deref().unwrap_or(&[]);
    // Each egress and ingress read once into its typed intent, as the composition reads them.
    let name = tailnet.name_any();
    let scope = TailnetScope {
        name: &name,
        spec: &tailnet.spec,
        operator_namespace: &config.operator_namespace,
    };
    let (egresses, mut ingresses) = tailnet_render::compose::intents(
        &scope,
        &observed.egresses,
        &observed.ingresses,
        &observed.services,
    );
    // Gateways are entrances like ingresses, after them.
    ingresses.extend(observed.gateways.iter().cloned());
    // With route approval off, route approval is left to the Headscale admin and no
    // autoApprovers are rendered either.
    let policy = desired::policy(
        tailnet,
        &installation_id(config, &name),
        &egresses,
        &ingresses,
        nodes,
        config.approve_routes,
    );
    let dns = desired::dns_inputs(
        tailnet,
        &config.operator_namespace,
        &egresses,
        &ingresses,
        &observed.egress_cluster_ips,
        nodes,
    );
    DesiredInputs { policy, dns }
}

/// The policy as composed for the role: the base, the contributors merged in (owner), the
/// rendered document.
struct Composed {
    /// The renderer's inputs, with the accepted contributions.
    inputs: PolicyInputs,
    dns_inputs: tailnet_render::dns::DnsInputs,
    /// The owner's merge of its contributors (empty for a contributor, or when the base is
    /// invalid).
    merge: contributions::OwnerMerge,
    /// `None`: the base is invalid (see `BaseValid`).
    rendered: Option<RenderedPolicy>,
    /// The parsed base (owner; for the exclusions).
    base: Option<BasePolicy>,
}

/// Sets `ContributionsAccepted` (owner) and `BaseValid`, and renders the policy.
fn compose(
    role: &Role,
    tailnet: &Tailnet,
    observed: &TailnetObservation,
    config: &OperatorConfig,
    desired: DesiredInputs,
    c: &mut ConditionSet,
    now: Timestamp,
) -> Composed {
    let DesiredInputs {
        policy: mut inputs,
        dns: dns_inputs,
    } = desired;
    let (base, valid_message) = match role {
        Role::Owner { .. } => (
            base_policy(tailnet, config, &observed.base),
            "the base policy parses",
        ),
        // A contributor's base is the owner's business: it renders its part alone.
        Role::Contributor => (
            tailnet_policy::parse_base("{}")
                .map_err(|e| Problem::new(reasons::INVALID_BASE, e.to_string())),
            "mode Contribute: no base policy of this installation is used (the owner's is)",
        ),
    };
    let merge = match (role, &base) {
        (Role::Owner { contributors, .. }, Ok(base)) => {
            let taken = contributions::Taken {
                tags: base.value()["tagOwners"]
                    .as_object()
                    .map(|o| o.keys().cloned().collect())
                    .unwrap_or_default(),
                // Pending names (no node yet, or no node list) are the owner's claims too:
                // a contributor cannot take them while they wait.
                names: dns_inputs
                    .egress_aliases
                    .iter()
                    .chain(dns_inputs.ingress_names.iter())
                    .map(|e| e.hostname.clone())
                    .chain(dns_inputs.pending.iter().map(|p| p.hostname.clone()))
                    .collect(),
                dns_bytes: dns::owner_entry_bytes(&dns_inputs),
            };
            let owner = contributions::OwnerFacts {
                policy: &tailnet.spec.policy,
                cluster_domain: &config.cluster_domain,
                nodes: observed.nodes.as_deref(),
            };
            let merge = contributions::merge(
                &owner,
                contributors,
                &observed.contributor_reads,
                &observed.contribution_store,
                taken,
                c,
                now,
            );
            inputs.contributions = merge.contributions.clone();
            merge
        }
        _ => contributions::OwnerMerge::default(),
    };
    let rendered = base
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|base| render(base, &inputs));
    match &rendered {
        Ok(_) => c.ok(types::BASE_VALID, reasons::VALID, valid_message),
        Err(problem) => c.fail(types::BASE_VALID, problem.clone()),
    }
    Composed {
        inputs,
        dns_inputs,
        merge,
        rendered: rendered.ok(),
        base: base.ok(),
    }
}

/// Where the rendered policy goes: the owner's sync with Headscale (and route approvals),
/// or the contributor's fragment.
struct Target {
    sync: Option<PolicySync>,
    approvals: Vec<RouteApproval>,
    /// The fragment ConfigMap to publish.
    fragment: Option<ConfigMap>,
    fragment_status: Option<FragmentStatus>,
}

/// The live policy, when Headscale answered.
fn live_policy(observed: &TailnetObservation) -> Option<&String> {
    observed
        .live_policy
        .as_ref()
        .filter(|_| observed.headscale.is_ok())
}

/// Owner: `PolicyApplied` when it does not depend on Headscale's answer, the sync, and the
/// route approval catch-up (Apply only: autoApprovers only fire when a route changes).
fn owner_target(
    mode: OwnerMode,
    tailnet: &Tailnet,
    observed: &TailnetObservation,
    config: &OperatorConfig,
    composed: &Composed,
    c: &mut ConditionSet,
) -> Target {
    c.remove(types::FRAGMENT_LIVE);
    let sync = match (&composed.rendered, live_policy(observed)) {
        (Some(rendered), Some(live)) => Some(policy_sync(mode, tailnet, config, rendered, live)),
        (None, _) => {
            c.fail(
                types::POLICY_APPLIED,
                Problem::new(
                    reasons::BASE_INVALID,
                    "the policy cannot be rendered until the base policy is fixed (see BaseValid)",
                ),
            );
            None
        }
        (Some(_), None) => {
            c.unknown(types::POLICY_APPLIED, headscale_unreachable());
            None
        }
    };
    let approvals = if mode == OwnerMode::Apply
        && config.approve_routes
        && observed.headscale.is_ok()
        && observed.nodes.is_some()
    {
        tailnet_policy::routes_needing_approval(&composed.inputs)
    } else {
        Vec::new()
    };
    Target {
        sync,
        approvals,
        fragment: None,
        fragment_status: None,
    }
}

/// Contributor: no `PolicyApplied` (nothing is written), the fragment and `FragmentLive`
/// (without a rendered policy, the previous fragment status stays).
fn contributor_target(
    tailnet: &Tailnet,
    observed: &TailnetObservation,
    config: &OperatorConfig,
    composed: &Composed,
    previous: Option<FragmentStatus>,
    c: &mut ConditionSet,
) -> Target {
    c.remove(types::POLICY_APPLIED);
    let fragment = composed.rendered.as_ref().map(|rendered| {
        let records = contributed_dns_records(&tailnet_render::dns::render(&composed.dns_inputs));
        contributions::contribute(
            tailnet,
            config,
            &installation_id(config, &tailnet.name_any()),
            rendered,
            &records,
            live_policy(observed).map(String::as_str),
            c,
        )
    });
    let (fragment, fragment_status) = match fragment {
        Some((config_map, status)) => (Some(config_map), Some(status)),
        None => (None, previous),
    };
    Target {
        sync: None,
        approvals: Vec::new(),
        fragment,
        fragment_status,
    }
}

fn headscale_unreachable() -> Problem {
    Problem::new(
        reasons::HEADSCALE_UNREACHABLE,
        "the live policy cannot be compared until Headscale is reachable (see HeadscaleReachable)",
    )
}

/// The base policy parsed, or why `BaseValid` is False.
fn base_policy(
    tailnet: &Tailnet,
    config: &OperatorConfig,
    text: &Result<Option<String>, Problem>,
) -> Result<BasePolicy, Problem> {
    match text {
        Err(problem) => Err(problem.clone()),
        Ok(None) => tailnet_policy::parse_base("{}")
            .map_err(|e| Problem::new(reasons::INVALID_BASE, e.to_string())),
        Ok(Some(text)) => tailnet_policy::parse_base(text).map_err(|e| {
            let ns = &config.operator_namespace;
            let name = tailnet
                .spec
                .policy
                .base_config_map
                .as_deref()
                .unwrap_or_default();
            Problem::new(
                reasons::SYNTAX_ERROR,
                format!(
                    "ConfigMap {ns}/{name} key {BASE_POLICY_KEY}: line {}, column {}: {}",
                    e.line, e.column, e.message
                ),
            )
        }),
    }
}

fn render(base: &BasePolicy, inputs: &PolicyInputs) -> Result<RenderedPolicy, Problem> {
    tailnet_policy::render(base, inputs)
        .map_err(|e| Problem::new(reasons::INVALID_BASE, e.to_string()))
}

fn policy_sync(
    mode: OwnerMode,
    tailnet: &Tailnet,
    config: &OperatorConfig,
    rendered: &RenderedPolicy,
    live: &str,
) -> PolicySync {
    let diff = tailnet_policy::diff(live, &rendered.document);
    let (added, removed) = diff_stats(&diff);
    let summary = format!(
        "{} (+{added}/-{removed} lines against the live policy)",
        rendered.summary
    );
    let notices: Vec<String> = rendered.notices.iter().map(ToString::to_string).collect();
    let locks_down = rendered.notices.contains(&PolicyNotice::BaseHadNoRules)
        && !tailnet
            .spec
            .policy
            .accepted_notices
            .contains(&AcceptedNotice::BaseHadNoRules);
    let config_map = rendered_policy_object(
        tailnet,
        config,
        RenderedPolicyData {
            document: &rendered.document,
            diff: &diff,
            summary: &summary,
            notices: &notices,
        },
    );
    PolicySync {
        mode,
        document: rendered.document.clone(),
        live: live.to_string(),
        diff,
        added,
        removed,
        summary: rendered.summary.to_string(),
        config_map,
        locks_down,
    }
}

/// After Headscale checked the rendered document: the outcome, or a PUT.
pub fn after_check(sync: &PolicySync, check: Answer, previous: &TailnetStatus) -> PolicyStep {
    match (check, sync.mode) {
        (Err(Refusal::Rejected(message)), _) => {
            let previous_reason =
                tailnet_api::conditions::find(&previous.conditions, types::POLICY_APPLIED)
                    .map(|c| c.reason.as_str());
            let event = (previous_reason != Some(reasons::REJECTED)).then(|| PolicyEvent {
                type_: EventType::Warning,
                reason: reasons::REJECTED,
                action: "CheckPolicy",
                note: format!("Headscale rejected the rendered policy: {message}"),
            });
            PolicyStep::Done(PolicyOutcome {
                event,
                ..rejected(sync, &message)
            })
        }
        (Err(Refusal::Failed(problem)), _) => PolicyStep::Done(unknown(
            problem.reason,
            format!("checking the policy failed: {}", problem.message),
        )),
        (Ok(()), OwnerMode::DryRun) => {
            let change = if sync.diff.is_empty() {
                "no change to the live policy".to_string()
            } else {
                format!(
                    "would change the live policy by +{}/-{} lines",
                    sync.added, sync.removed
                )
            };
            let change = match lockdown_refusal(sync) {
                Some(lockdown) => format!("{change}; {lockdown}"),
                None => change,
            };
            PolicyStep::Done(PolicyOutcome {
                verdict: Verdict::False(Problem::new(
                    reasons::DRY_RUN,
                    format!(
                        "DryRun: {change}; {}; review ConfigMap {}, then set spec.policy.mode: Apply",
                        sync.summary,
                        sync.config_map.name_any()
                    ),
                )),
                metric: Some("dry_run"),
                event: None,
                applied: false,
                written: false,
            })
        }
        (Ok(()), OwnerMode::Apply) => apply_step(sync, previous),
    }
}

/// Apply mode, the document passed the check: refuse another installation's policy, keep an
/// up-to-date one, otherwise PUT (and say what the PUT replaces).
fn apply_step(sync: &PolicySync, previous: &TailnetStatus) -> PolicyStep {
    if let Some(lockdown) = lockdown_refusal(sync) {
        return PolicyStep::Done(would_lock_down(&lockdown, previous));
    }
    let ours = tailnet_policy::ownership_marker(&sync.document);
    let theirs = tailnet_policy::ownership_marker(&sync.live);
    if let Some(owner) = theirs.as_ref().filter(|t| Some(*t) != ours.as_ref()) {
        return PolicyStep::Done(PolicyOutcome {
            verdict: Verdict::False(Problem::new(
                reasons::OWNED_ELSEWHERE,
                format!(
                    "the live policy is owned by installation {owner:?}; refusing to overwrite it (only one installation per Headscale server may write)"
                ),
            )),
            metric: Some("owned_elsewhere"),
            event: None,
            applied: false,
            written: false,
        });
    }
    if tailnet_policy::up_to_date(&sync.live, &sync.document).unwrap_or(false) {
        return PolicyStep::Done(PolicyOutcome {
            metric: Some("unchanged"),
            written: false,
            ..applied(sync)
        });
    }
    let live_hash = sha256(&sync.live);
    let applied_hash = previous
        .policy
        .as_ref()
        .and_then(|p| p.applied_hash.as_deref());
    let manual_edit = theirs.is_some() && applied_hash.is_some_and(|h| h != live_hash);
    let event = if manual_edit {
        manual_edit_event(&sync.diff)
    } else if theirs.is_none() && !sync.live.trim().is_empty() {
        PolicyEvent {
            type_: EventType::Normal,
            reason: "PolicyTakenOver",
            action: "SetPolicy",
            note: format!(
                "the operator now owns the policy; replaced: {}",
                lost_lines(&sync.diff, 10)
            ),
        }
    } else {
        PolicyEvent {
            type_: EventType::Normal,
            reason: "PolicyApplied",
            action: "SetPolicy",
            note: format!("+{}/-{} lines; {}", sync.added, sync.removed, sync.summary),
        }
    };
    PolicyStep::Put { event }
}

/// Why applying `sync` would lock the tailnet down by surprise, or `None`. The document
/// turns a base without rules deny-by-default (not accepted by the Tailnet); that is a
/// surprise unless the live policy already is ours and was rendered from a rule-less base as
/// well (deny-by-default already, since an earlier accepted apply: only generated parts
/// change). A live policy of ours whose base part had rules would lose them; a foreign live
/// policy allows all or has rules of its own; one that does not parse is not known.
pub fn lockdown_refusal(sync: &PolicySync) -> Option<String> {
    if !sync.locks_down {
        return None;
    }
    let ours = tailnet_policy::ownership_marker(&sync.document);
    let live_is_ours = ours.is_some() && tailnet_policy::ownership_marker(&sync.live) == ours;
    let now = if live_is_ours {
        match tailnet_policy::base_states_rules(&sync.live) {
            Some(false) => return None,
            Some(true) => "the live policy's rules from the earlier base would be dropped",
            None => "the live policy does not parse",
        }
    } else {
        match tailnet_policy::states_rules(&sync.live) {
            Some(false) => "the live policy allows all (neither acls nor grants)",
            Some(true) => "the live policy's own rules would be replaced",
            None => "the live policy does not parse",
        }
    };
    Some(format!(
        "the base states no acls or grants (Headscale's allow-all) and {now}: applying adds deny-by-default for everything but the generated grants; give the base its own rules (docs/prerequisites.md has a starter that keeps today's access) or accept the change with spec.policy.acceptedNotices: [BaseHadNoRules]"
    ))
}

/// The route approvals to send after the sync: none while Apply refuses the document as a
/// lockdown (nothing of the refused document is acted on), else the plan's.
pub fn approvals_after<'p>(
    plan: &'p TailnetPlan,
    outcome: Option<&PolicyOutcome>,
) -> &'p [RouteApproval] {
    let refused = outcome.is_some_and(|o| o.metric == Some(WOULD_LOCK_DOWN_METRIC));
    if refused { &[] } else { &plan.approvals }
}

/// `policy_syncs` result of a document refused as a lockdown.
pub const WOULD_LOCK_DOWN_METRIC: &str = "would_lock_down";

/// Apply refused the document: it would lock the tailnet down (the live policy stays). A
/// Warning Event when the refusal is new.
fn would_lock_down(lockdown: &str, previous: &TailnetStatus) -> PolicyOutcome {
    let previous_reason =
        tailnet_api::conditions::find(&previous.conditions, types::POLICY_APPLIED)
            .map(|c| c.reason.as_str());
    let event = (previous_reason != Some(reasons::WOULD_LOCK_DOWN)).then(|| PolicyEvent {
        type_: EventType::Warning,
        reason: reasons::WOULD_LOCK_DOWN,
        action: "SetPolicy",
        note: format!("not applied, the live policy stays: {lockdown}"),
    });
    PolicyOutcome {
        verdict: Verdict::False(Problem::new(
            reasons::WOULD_LOCK_DOWN,
            format!("not applied, the live policy stays: {lockdown}"),
        )),
        metric: Some(WOULD_LOCK_DOWN_METRIC),
        event,
        applied: false,
        written: false,
    }
}

/// Event reason of a live policy edited outside the operator and overwritten.
pub const MANUAL_EDIT_EVENT: &str = "ManualEditOverwritten";

/// `sync` against a live document read later (diff and counts recomputed; the document and
/// the published ConfigMap stay).
pub fn with_live(sync: &PolicySync, live: &str) -> PolicySync {
    let diff = tailnet_policy::diff(live, &sync.document);
    let (added, removed) = diff_stats(&diff);
    PolicySync {
        live: live.to_string(),
        diff,
        added,
        removed,
        ..sync.clone()
    }
}

/// Right before the PUT: the live policy read again (`fresh`), because the check takes
/// seconds and an edit made meanwhile would otherwise be overwritten unreported. Unchanged
/// since gather: PUT as decided. Changed: decide again against the fresh document (another
/// installation's marker now refuses, a copy of ours needs no write), and a PUT reports the
/// edit as [`MANUAL_EDIT_EVENT`] with what it loses. Unreadable: no PUT this time (the next
/// poll retries); the PUT never goes out blind. Returns the sync the PUT must use.
pub fn before_put(
    sync: &PolicySync,
    event: PolicyEvent,
    fresh: Result<String, Refusal>,
    previous: &TailnetStatus,
) -> (PolicySync, PolicyStep) {
    let fresh = match fresh {
        Ok(fresh) => fresh,
        Err(Refusal::Rejected(message)) => {
            return (
                sync.clone(),
                PolicyStep::Done(unknown(
                    reasons::HEADSCALE_UNREACHABLE,
                    format!("re-reading the live policy before writing failed: {message}"),
                )),
            );
        }
        Err(Refusal::Failed(problem)) => {
            return (
                sync.clone(),
                PolicyStep::Done(unknown(
                    problem.reason,
                    format!(
                        "re-reading the live policy before writing failed: {}",
                        problem.message
                    ),
                )),
            );
        }
    };
    if fresh == sync.live {
        return (sync.clone(), PolicyStep::Put { event });
    }
    let fresh_sync = with_live(sync, &fresh);
    let step = match apply_step(&fresh_sync, previous) {
        PolicyStep::Put { event } if event.reason != MANUAL_EDIT_EVENT => PolicyStep::Put {
            event: manual_edit_event(&fresh_sync.diff),
        },
        step => step,
    };
    (fresh_sync, step)
}

fn manual_edit_event(diff: &str) -> PolicyEvent {
    PolicyEvent {
        type_: EventType::Warning,
        reason: MANUAL_EDIT_EVENT,
        action: "SetPolicy",
        note: format!(
            "the live policy had been edited outside the operator; overwritten. Lost: {}",
            lost_lines(diff, 10)
        ),
    }
}

/// After Headscale answered the PUT; `event` is the one [`after_check`] chose for success.
pub fn after_set(sync: &PolicySync, event: PolicyEvent, set: Answer) -> PolicyOutcome {
    match set {
        Ok(()) => PolicyOutcome {
            event: Some(event),
            ..applied(sync)
        },
        Err(Refusal::Rejected(message)) => PolicyOutcome {
            event: Some(PolicyEvent {
                type_: EventType::Warning,
                reason: reasons::REJECTED,
                action: "SetPolicy",
                note: format!("Headscale rejected the policy: {message}"),
            }),
            ..rejected(sync, &message)
        },
        Err(Refusal::Failed(problem)) => unknown(
            problem.reason,
            format!("writing the policy failed: {}", problem.message),
        ),
    }
}

fn applied(sync: &PolicySync) -> PolicyOutcome {
    PolicyOutcome {
        verdict: Verdict::True(reasons::APPLIED, format!("live: {}", sync.summary)),
        metric: Some("applied"),
        event: None,
        applied: true,
        written: true,
    }
}

fn rejected(sync: &PolicySync, message: &str) -> PolicyOutcome {
    PolicyOutcome {
        verdict: Verdict::False(Problem::new(
            reasons::REJECTED,
            format!(
                "Headscale rejected the rendered policy (the previous one stays live): {message}; see ConfigMap {}",
                sync.config_map.name_any()
            ),
        )),
        metric: Some("rejected"),
        event: None,
        applied: false,
        written: false,
    }
}

fn unknown(reason: &'static str, message: String) -> PolicyOutcome {
    PolicyOutcome {
        verdict: Verdict::Unknown(Problem::new(reason, message)),
        metric: None,
        event: None,
        applied: false,
        written: false,
    }
}

/// The policy Headscale enforces after the act step: the document just written, else the
/// live one as observed.
pub fn live_after<'p>(plan: &'p TailnetPlan, outcome: Option<&PolicyOutcome>) -> Option<&'p str> {
    match (outcome, &plan.sync) {
        (Some(outcome), Some(sync)) if outcome.written => Some(sync.document.as_str()),
        _ => plan.live_policy.as_deref(),
    }
}

/// The status to write: `PolicyApplied` from the sync's outcome (when there was a sync), the
/// policy status, which resources' grants are live, and `Ready`.
pub fn finish(plan: TailnetPlan, outcome: Option<&PolicyOutcome>) -> TailnetStatus {
    let TailnetPlan {
        mut conditions,
        mut status,
        rendered,
        sync,
        live_policy,
        role,
        ..
    } = plan;
    let mut policy = status.policy.take().unwrap_or_default();
    let mut live = live_policy;
    match (outcome, &sync) {
        (Some(outcome), Some(sync)) => {
            outcome
                .verdict
                .clone()
                .set(&mut conditions, types::POLICY_APPLIED);
            if outcome.applied {
                policy.applied_hash = Some(sha256(&sync.document));
            }
            if outcome.written {
                live = Some(sync.document.clone());
            }
        }
        // A sync without an answer: the act step had no client.
        (None, Some(_)) => conditions.unknown(types::POLICY_APPLIED, headscale_unreachable()),
        _ => {}
    }
    if let (Some(rendered), Some(live)) = (&rendered, &live) {
        policy.effective_for = effective::effective_resources(live, &rendered.resources);
    }
    status.policy = Some(policy);
    status.conditions = conditions.finish(role.required(), &[]);
    status
}

/// The ingress records of a contributor's DNS render (Headscale's extra-records format is the
/// fragment's).
fn contributed_dns_records(rendered: &tailnet_render::dns::RenderedDns) -> Vec<FragmentDnsRecord> {
    serde_json::from_str(&rendered.extra_records_json).unwrap_or_default()
}

/// The rendered-policy ConfigMap (operator namespace, owned by the Tailnet).
fn rendered_policy_object(
    tailnet: &Tailnet,
    config: &OperatorConfig,
    data: RenderedPolicyData<'_>,
) -> ConfigMap {
    ConfigMap {
        metadata: contributions::owned_meta(
            tailnet,
            config,
            rendered_policy_config_map(&tailnet.name_any()),
        ),
        data: Some(rendered_policy_data(data)),
        ..ConfigMap::default()
    }
}

/// What the rendered-policy ConfigMap shows.
#[derive(Clone, Copy, Debug)]
pub struct RenderedPolicyData<'a> {
    pub document: &'a str,
    pub diff: &'a str,
    pub summary: &'a str,
    /// The renderer's notices, one sentence each (key `notices`, one per line).
    pub notices: &'a [String],
}

/// The rendered-policy ConfigMap's data: the document, its diff against the live policy, a
/// summary and the notices. At about 1,000 resources document + diff passed the apiserver's
/// limit and the refused write stopped the whole policy sync (benchmark 4): when they do not
/// fit, the diff is left out, then the document, each replaced by a line that says so.
pub fn rendered_policy_data(data: RenderedPolicyData<'_>) -> BTreeMap<String, String> {
    let RenderedPolicyData {
        document,
        diff,
        summary,
        notices,
    } = data;
    // Notices are few and short (one per route or group at most); they are bounded by the
    // policy's inputs and kept whole.
    let notices: String = notices.iter().map(|n| format!("{n}\n")).collect();
    let summary_len = summary.len() + notices.len();
    let omitted = |what: &str, bytes: usize| {
        format!(
            "omitted: the {what} is {bytes} bytes; the ConfigMap would exceed the apiserver's 1 MiB limit (the policy itself is synced regardless)\n"
        )
    };
    let mut document_value = document.to_string();
    let mut diff_value = diff.to_string();
    if summary_len + document.len() + diff.len() > RENDERED_POLICY_BUDGET {
        diff_value = omitted("diff", diff.len());
    }
    if summary_len + document.len() + diff_value.len() > RENDERED_POLICY_BUDGET {
        document_value = omitted("rendered document", document.len());
    }
    BTreeMap::from([
        (BASE_POLICY_KEY.to_string(), document_value),
        ("diff".to_string(), diff_value),
        ("summary".to_string(), summary.to_string()),
        ("notices".to_string(), notices),
    ])
}

/// A printer-column sized summary: `3 tags, 4 grants, 2 routes` (+ `, 1 with issues`).
pub fn short_summary(rendered: &RenderedPolicy) -> String {
    let s = &rendered.summary;
    let mut text = format!(
        "{} tags, {} grants, {} routes",
        s.generated_tag_owners,
        s.egress_grants + s.ingress_grants + s.contributed_grants,
        s.auto_approver_routes
    );
    if s.resources_with_issues > 0 {
        text.push_str(&format!(", {} with issues", s.resources_with_issues));
    }
    text
}

/// `+`/`-` line counts of a unified diff.
pub fn diff_stats(diff: &str) -> (usize, usize) {
    let added = diff
        .lines()
        .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
        .count();
    let removed = diff
        .lines()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
        .count();
    (added, removed)
}

/// The removed lines of a diff, for an Event about a manual edit being overwritten.
pub fn lost_lines(diff: &str, limit: usize) -> String {
    let lost: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
        .collect();
    let mut text = lost
        .iter()
        .take(limit)
        .map(|l| l.trim_start_matches('-').trim())
        .collect::<Vec<_>>()
        .join(" | ");
    if lost.len() > limit {
        text.push_str(&format!(" | … ({} more lines)", lost.len() - limit));
    }
    text
}

/// The Event note for one route approval.
pub fn routes_approved_note(approval: &RouteApproval) -> String {
    let added: Vec<String> = approval.added.iter().map(ToString::to_string).collect();
    format!(
        "approved {} on node {} (id {})",
        added.join(", "),
        approval.node_name,
        approval.node_id
    )
}
