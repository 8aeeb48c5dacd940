//! Decide step of the TailnetIngress controller (pure): from the ingress and what was
//! observed, every condition, the exposes/URLs/hostnames in the status, the objects to apply
//! and the key to mint.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use kube::ResourceExt;
use tailnet_api::conditions::{self, reasons, types};
use tailnet_api::ingress::{ExposeMode, ExposeStatus, TailnetIngressStatus};
use tailnet_api::naming::AgentKind;
use tailnet_api::validate::{self, ExposeNames, FieldError, ValidIngress};
use tailnet_api::{Tailnet, TailnetIngress};
use tailnet_render::compose;
use tailnet_render::desired;
use tailnet_render::images::Images;
use tailnet_render::ingress::IngressObjects;
use tailnet_render::intent::{IngressIntent, TailnetScope};
use tailnet_render::meta::Owner;
use tailnet_render::{RenderContext, RenderError};

use super::super::agent_conditions as shared;
use super::super::certificates::{self, CertificateVerdict};
use super::super::config::OperatorConfig;
use super::super::identity::{
    KeyAction, KeyState, agent_hostnames, decide_key, find_node, foreign_nodes, tag_shared,
};
use super::super::status::{ConditionSet, Problem};
use super::gather::{IngressObservation, tls_secret_name};

/// Conditions that must hold for `Ready`, in the order of their dependencies.
pub const REQUIRED: [&str; 8] = [
    types::TAILNET_READY,
    types::SOURCES_ALLOWED,
    types::BACKENDS_RESOLVED,
    types::CERTIFICATE_READY,
    types::AGENT_READY,
    types::NODE_ONLINE,
    types::POLICY_EFFECTIVE,
    types::HOSTNAMES_UNIQUE,
];
/// Conditions that count for `Ready` once they have been observed.
pub const OBSERVED_IF_KNOWN: [&str; 1] = [types::BACKENDS_REACHABLE];

/// What the act step does for one ingress.
#[derive(Clone, Debug)]
pub struct IngressDecision {
    pub status: TailnetIngressStatus,
    /// `None`: nothing is done (the Tailnet is missing, or the spec is invalid in itself or
    /// in the Tailnet's context: the last valid configuration stays applied).
    pub agent: Option<Box<AgentPlan>>,
}

#[derive(Clone, Debug)]
pub struct AgentPlan {
    pub owner: Owner,
    pub tag: String,
    /// The agent's objects; `None` while a backend does not resolve (the last good
    /// configuration stays applied, and no key is minted).
    pub objects: Option<IngressObjects>,
    pub key: KeyAction,
}

/// The typed, validated spec; an invalid one is refused with a decision that only says what
/// to fix (nothing is applied: the last good configuration stays).
pub fn validated(
    ingress: &TailnetIngress,
    now: Timestamp,
) -> Result<ValidIngress, Box<IngressDecision>> {
    let errors = match validate::valid_ingress(&ingress.spec) {
        Ok(valid) => return Ok(valid),
        Err(errors) => errors,
    };
    let previous = ingress.status.clone().unwrap_or_default();
    let conditions = shared::invalid_spec(
        &previous.conditions,
        ingress.metadata.generation,
        &errors,
        now,
    );
    Err(Box::new(IngressDecision {
        status: TailnetIngressStatus {
            observed_generation: ingress.metadata.generation,
            conditions,
            ..previous
        },
        agent: None,
    }))
}

/// Decides a valid ingress (see [`validated`]).
pub fn decide(
    ingress: &TailnetIngress,
    valid: &ValidIngress,
    observed: &IngressObservation,
    config: &OperatorConfig,
    now: Timestamp,
) -> Result<IngressDecision, RenderError> {
    let previous = ingress.status.clone().unwrap_or_default();
    let mut c = ConditionSet::new(&previous.conditions, ingress.metadata.generation, now);
    c.remove(types::SPEC_VALID);
    let mut status = TailnetIngressStatus {
        observed_generation: ingress.metadata.generation,
        ..previous
    };
    let access = match &observed.access {
        Ok(access) => access,
        Err(problem) => {
            c.fail(types::TAILNET_READY, problem.clone());
            status.conditions = c.finish(&REQUIRED, &OBSERVED_IF_KNOWN);
            return Ok(IngressDecision {
                status,
                agent: None,
            });
        }
    };
    let tailnet = &access.tailnet;
    let tailnet_name = tailnet.name_any();
    let (namespace, name) = (ingress.namespace().unwrap_or_default(), ingress.name_any());
    shared::tailnet_ready(&mut c, access);
    // Its own tag, or nothing of anyone else's is touched: no key, no agent, no grant.
    let assigned = observed.tag.clone().unwrap_or_else(|| {
        super::gather::ingress_tag(
            ingress,
            &tailnet_name,
            &tailnet.spec.policy.tag_prefix,
            &observed.others,
        )
    });
    let tag = match &assigned {
        Ok(tag) => tag.clone(),
        Err(holder) => {
            status.tag = None;
            c.fail(
                types::AGENT_READY,
                Problem::new(
                    reasons::TAG_CONFLICT,
                    format!(
                        "no tag of its own for {namespace}/{name}: the tag it would get is held by {holder}; rename this ingress (or its namespace)"
                    ),
                ),
            );
            status.conditions = c.finish(&REQUIRED, &OBSERVED_IF_KNOWN);
            return Ok(IngressDecision {
                status,
                agent: None,
            });
        }
    };
    status.tag = Some(tag.clone());

    let render_ctx = RenderContext {
        operator_namespace: &config.operator_namespace,
        tailnet_name: &tailnet_name,
        tailnet: &tailnet.spec,
        images: Images::resolve(&config.images, tailnet.spec.agent.as_ref()),
        cluster_domain: &config.cluster_domain,
    };
    // Context rules (cross-namespace backends, templates, a certificate source), then the
    // hostnames an older ingress keeps (first claim wins): the composition's step.
    let scope = TailnetScope {
        name: &tailnet_name,
        spec: &tailnet.spec,
        operator_namespace: &config.operator_namespace,
    };
    let intent = IngressIntent::new(ingress, &scope);
    if let Err(errors) = &intent.names {
        return Ok(out_of_context(c, status, errors));
    }
    let not_allowed = sources_allowed(&mut c, ingress, tailnet);
    // Only ingresses that claimed before this one can hold its names.
    let earlier: Vec<IngressIntent> = observed
        .others
        .iter()
        .filter(|o| desired::may_claim_before(&intent.claim, o))
        .map(|o| IngressIntent::new(o, &scope))
        .collect();
    let names = match compose::ingress_names_among(&intent, &earlier) {
        Ok(names) => names,
        Err(errors) => return Ok(out_of_context(c, status, &errors)),
    };
    hostnames_unique(&mut c, &names.claimed);
    let owner = Owner::from_meta(AgentKind::Ingress, &ingress.metadata, &tailnet_name)?;
    let serve_http = certificate_ready(
        &mut c,
        ingress,
        &owner,
        &names.http_hostnames,
        observed,
        now,
    );
    // Backends resolved and the agent rendered by the pipeline `tailnet-operator render`
    // uses too; nothing is rendered (the last good config stays) while a backend is missing.
    let wanted = desired::IngressObserved {
        backends: &observed.backends,
        certificate_ready: serve_http,
        tag: &tag,
    };
    let desired = desired::ingress(&ingress.metadata, valid, names, &render_ctx, &wanted)?;
    let unwatched = unwatched_backends(&ingress.metadata, valid, config);
    let problems: Vec<String> = desired
        .problems
        .iter()
        .map(ToString::to_string)
        .chain(unwatched.iter().cloned())
        .collect();
    backends_resolved(&mut c, &problems, !unwatched.is_empty());

    // The agent is only deployed (and so a pre-auth key only minted) without problems.
    let deployable = problems.is_empty();
    let hostnames = agent_hostnames(AgentKind::Ingress, &owner.names(), &tag);
    let nodes: &[tailnet_headscale::Node] = observed.nodes.as_deref().map_or(&[], |n| n);
    let node = find_node(nodes, &tag, &hostnames).cloned();
    let foreign = foreign_nodes(nodes, &tag, &hostnames);
    let mintable = deployable && foreign.is_empty();
    let (key, key_state) = match &observed.nodes {
        // Without the node list nothing is minted: the node may well exist.
        Ok(_) => decide_key(node.is_some(), mintable, &observed.auth_secret, now),
        Err(_) => (KeyAction::Keep, KeyState::NodeExists),
    };
    shared::node_online(&mut c, &observed.nodes, node.as_ref(), &key_state);
    if let Some(n) = &node {
        status.node_id = Some(n.id.to_string());
        status.tailnet_ips = n.ip_addresses.clone();
    }
    if let Some(objects) = &desired.objects {
        status.hostnames = objects.hostnames.clone();
    }
    // Nothing is rendered for backends the operator cannot read (as for missing ones).
    let objects = desired.objects.filter(|_| unwatched.is_empty());
    let names = desired.names.names;
    shared::agent_ready(&mut c, observed.deployment.as_ref());
    tag_shared(&mut c, &tag, &foreign, node.is_some());
    status.exposes = expose_status(&names, serve_http);
    status.urls = urls(&names);
    policy_effective(&mut c, ingress, tailnet, &not_allowed);
    status.summary = Some(summary(&status.hostnames));
    shared::reachability(
        &mut c,
        types::BACKENDS_REACHABLE,
        observed.report.as_ref().map(|r| r.backends.as_slice()),
    );
    status.conditions = c.finish(&REQUIRED, &OBSERVED_IF_KNOWN);
    Ok(IngressDecision {
        status,
        agent: Some(Box::new(AgentPlan {
            owner,
            tag,
            objects,
            key,
        })),
    })
}

/// The cert-manager Certificate could not be created: `CertificateReady` says so (over what
/// the decision said) and `Ready` is derived again. `status` is the decision's.
pub fn certificate_not_created(
    ingress: &TailnetIngress,
    status: &TailnetIngressStatus,
    error: &str,
    now: Timestamp,
) -> TailnetIngressStatus {
    // `Ready` keeps its transition time from the object's status, not from the decision's.
    let previous_ready = ingress
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::READY))
        .cloned();
    let mut list: Vec<_> = status
        .conditions
        .iter()
        .filter(|c| c.type_ != types::READY)
        .cloned()
        .collect();
    list.extend(previous_ready);
    let mut c = ConditionSet::new(&list, status.observed_generation, now);
    c.fail(
        types::CERTIFICATE_READY,
        Problem::new(
            reasons::CERTIFICATE_NOT_CREATED,
            format!(
                "creating the cert-manager Certificate failed (is cert-manager installed?): {error}"
            ),
        ),
    );
    TailnetIngressStatus {
        conditions: c.finish(&REQUIRED, &OBSERVED_IF_KNOWN),
        ..status.clone()
    }
}

/// The spec does not hold in the Tailnet's context: `BackendsResolved=False`, nothing is
/// applied.
fn out_of_context(
    mut c: ConditionSet,
    mut status: TailnetIngressStatus,
    errors: &[FieldError],
) -> IngressDecision {
    let cross = errors
        .iter()
        .any(|e| e.field.ends_with(".backend.namespace"));
    let reason = if cross {
        reasons::CROSS_NAMESPACE_BACKEND
    } else {
        reasons::INVALID_SPEC
    };
    c.fail(
        types::BACKENDS_RESOLVED,
        Problem::new(reason, validate::summarize(errors)),
    );
    status.conditions = c.finish(&REQUIRED, &OBSERVED_IF_KNOWN);
    IngressDecision {
        status,
        agent: None,
    }
}

/// `SourcesAllowed`: `allowFrom` within the allowlist (else those get no grant). Returns the
/// sources that are not allowed.
fn sources_allowed(
    c: &mut ConditionSet,
    ingress: &TailnetIngress,
    tailnet: &Tailnet,
) -> Vec<String> {
    let not_allowed = validate::sources_not_allowed(&ingress.spec, &tailnet.spec);
    if not_allowed.is_empty() {
        c.ok(
            types::SOURCES_ALLOWED,
            reasons::READY,
            format!(
                "allowFrom {} is within the Tailnet's ingressSourceAllowlist",
                ingress.spec.allow_from.join(", ")
            ),
        );
    } else {
        c.fail(
            types::SOURCES_ALLOWED,
            Problem::new(
                reasons::SOURCE_NOT_ALLOWED,
                format!(
                    "{} not in Tailnet {}'s policy.ingressSourceAllowlist [{}]: they get no grant (the allowed sources keep theirs); remove them or ask the platform team to allow them",
                    not_allowed.join(", "),
                    tailnet.name_any(),
                    tailnet.spec.policy.ingress_source_allowlist.join(", ")
                ),
            ),
        );
    }
    not_allowed
}

/// `HostnamesUnique`: which of our names an older ingress keeps (they are not served here).
fn hostnames_unique(c: &mut ConditionSet, claimed: &BTreeMap<String, String>) {
    if claimed.is_empty() {
        c.ok(
            types::HOSTNAMES_UNIQUE,
            reasons::READY,
            "no other TailnetIngress claims these names",
        );
        return;
    }
    let list: Vec<String> = claimed
        .iter()
        .map(|(h, o)| format!("{h} (kept by {o})"))
        .collect();
    c.fail(
        types::HOSTNAMES_UNIQUE,
        Problem::new(
            reasons::HOSTNAME_CONFLICT,
            format!(
                "names already claimed: {}; they are not served here",
                list.join(", ")
            ),
        ),
    );
}

/// Backends in namespaces a namespace-scoped operator does not watch (it cannot read them;
/// only an ingress in the operator namespace may name another namespace at all).
fn unwatched_backends(
    meta: &kube::api::ObjectMeta,
    valid: &ValidIngress,
    config: &OperatorConfig,
) -> Vec<String> {
    let namespace = meta.namespace.clone().unwrap_or_default();
    let wanted = tailnet_render::backends::referenced(&namespace, &valid.exposes);
    use k8s_openapi::api::core::v1::{ConfigMap, Service};
    use kube::Resource;
    let (service, config_map) = (Service::kind(&()), ConfigMap::kind(&()));
    let keys = wanted.services.iter().map(|k| (service.clone(), k));
    let keys = keys.chain(wanted.config_maps.iter().map(|k| (config_map.clone(), k)));
    keys.filter(|(_, key)| !config.scope.contains(&key.namespace))
        .map(|(kind, key)| {
            format!(
                "{kind} {}/{} is in a namespace this operator does not watch ({}): add {} to the chart's watchNamespaces (--watch-namespaces)",
                key.namespace,
                key.name,
                config.scope.describe(),
                key.namespace
            )
        })
        .collect()
}

fn backends_resolved(c: &mut ConditionSet, problems: &[String], unwatched: bool) {
    if unwatched {
        c.fail(
            types::BACKENDS_RESOLVED,
            Problem::new(reasons::BACKEND_NAMESPACE_NOT_WATCHED, problems.join("; ")),
        );
    } else if problems.is_empty() {
        c.ok(
            types::BACKENDS_RESOLVED,
            reasons::READY,
            "every backend Service and port exists",
        );
    } else {
        c.fail(
            types::BACKENDS_RESOLVED,
            Problem::new(reasons::BACKEND_NOT_FOUND, problems.join("; ")),
        );
    }
}

/// `CertificateReady`: a certificate covering every http name, valid now, or http is not
/// served at all. Returns whether http exposes are served.
fn certificate_ready(
    c: &mut ConditionSet,
    ingress: &TailnetIngress,
    owner: &Owner,
    http_names: &[String],
    observed: &IngressObservation,
    now: Timestamp,
) -> bool {
    if !ingress
        .spec
        .exposes
        .iter()
        .any(|e| e.mode == ExposeMode::Http)
    {
        c.ok(
            types::CERTIFICATE_READY,
            reasons::NOT_APPLICABLE,
            "no http exposes",
        );
        return false;
    }
    let verdict = observed
        .tls_certificate
        .as_deref()
        .map(|pem| certificates::check(pem, http_names, now.as_second()));
    let secret = Secret {
        name: tls_secret_name(ingress, owner),
        namespace: &owner.namespace,
        issuing: ingress
            .spec
            .tls
            .as_ref()
            .and_then(|t| t.secret_name.as_ref())
            .is_none(),
    };
    match certificate_state(verdict, &secret, http_names) {
        Ok(message) => {
            c.ok(types::CERTIFICATE_READY, reasons::READY, message);
            true
        }
        Err(problem) => {
            c.fail(types::CERTIFICATE_READY, problem);
            false
        }
    }
}

/// The TLS Secret: its name, and whether cert-manager issues it (no `spec.tls.secretName`).
struct Secret<'a> {
    name: String,
    namespace: &'a str,
    issuing: bool,
}

/// What a certificate verdict (`None`: no Secret or no `tls.crt`) means for the http exposes.
fn certificate_state(
    verdict: Option<CertificateVerdict>,
    secret: &Secret,
    http_names: &[String],
) -> Result<String, Problem> {
    let name = &secret.name;
    let fail = |reason, message: String| Err(Problem::new(reason, message));
    match verdict {
        Some(CertificateVerdict::Valid { not_after }) => Ok(format!(
            "Secret {name} covers {} (valid until {not_after})",
            http_names.join(", ")
        )),
        None if secret.issuing => fail(
            reasons::ISSUING,
            format!(
                "waiting for cert-manager to issue Secret {name} for {}; http exposes are not served until then",
                http_names.join(", ")
            ),
        ),
        None => fail(
            reasons::SECRET_MISSING,
            format!(
                "Secret {}/{name} (spec.tls.secretName) does not exist or has no tls.crt; http exposes are not served",
                secret.namespace
            ),
        ),
        Some(CertificateVerdict::NamesNotCovered(missing)) if secret.issuing => fail(
            reasons::ISSUING,
            format!(
                "Secret {name} does not cover {} yet (re-issuing); http exposes are not served",
                missing.join(", ")
            ),
        ),
        Some(CertificateVerdict::NamesNotCovered(missing)) => fail(
            reasons::NAMES_NOT_COVERED,
            format!(
                "Secret {name} does not cover {}; http exposes are not served until it does",
                missing.join(", ")
            ),
        ),
        Some(CertificateVerdict::Expired { not_after }) => fail(
            reasons::EXPIRED,
            format!(
                "the certificate in Secret {name} expired at {not_after}; http exposes are not served"
            ),
        ),
        Some(CertificateVerdict::NotYetValid { not_before }) => fail(
            reasons::NOT_YET_VALID,
            format!("the certificate in Secret {name} is valid only from {not_before}"),
        ),
        Some(CertificateVerdict::Invalid(message)) => fail(
            reasons::INVALID_CERTIFICATE,
            format!("Secret {name}: {message}"),
        ),
    }
}

/// Per-expose status: its hostnames, and whether it is served.
fn expose_status(names: &[ExposeNames], serve_http: bool) -> Vec<ExposeStatus> {
    names
        .iter()
        .map(|n| {
            let not_served = n.mode == ExposeMode::Http && !serve_http;
            ExposeStatus {
                name: n.expose.clone(),
                hostnames: n.hostnames.clone(),
                state: Some(
                    if not_served {
                        reasons::NOT_SERVED
                    } else {
                        reasons::READY
                    }
                    .to_string(),
                ),
                message: not_served.then(|| {
                    "waiting for a certificate covering every name (see CertificateReady)"
                        .to_string()
                }),
            }
        })
        .collect()
}

/// Every URL, sorted.
fn urls(names: &[ExposeNames]) -> Vec<String> {
    let urls: BTreeSet<String> = names
        .iter()
        .flat_map(|n| {
            n.hostnames.iter().map(move |h| match (n.mode, n.port) {
                (ExposeMode::Http, 443) => format!("https://{h}/"),
                (ExposeMode::Http, p) => format!("https://{h}:{p}/"),
                (ExposeMode::Tcp, p) => format!("tcp://{h}:{p}"),
            })
        })
        .collect();
    urls.into_iter().collect()
}

/// `PolicyEffective`: the grant of the allowed sources is live; blocked when no source is
/// allowed (no grant is generated at all).
fn policy_effective(
    c: &mut ConditionSet,
    ingress: &TailnetIngress,
    tailnet: &Tailnet,
    not_allowed: &[String],
) {
    let resource_key = format!(
        "TailnetIngress/{}/{}",
        ingress.namespace().unwrap_or_default(),
        ingress.name_any()
    );
    let allowed: Vec<&str> = ingress
        .spec
        .allow_from
        .iter()
        .map(String::as_str)
        .filter(|s| !not_allowed.iter().any(|n| n == s))
        .collect();
    let mut live = format!(
        "{} may connect: the grant is live in Headscale",
        allowed.join(", ")
    );
    if !not_allowed.is_empty() {
        live.push_str(&format!(
            "; {} get no grant (see SourcesAllowed)",
            not_allowed.join(", ")
        ));
    }
    let blocked = allowed.is_empty().then(|| {
        Problem::new(
            reasons::SOURCE_NOT_ALLOWED,
            "no grant is generated: every allowFrom entry is outside the allowlist (see SourcesAllowed)",
        )
    });
    shared::policy_effective(c, tailnet, &resource_key, &live, blocked);
}

fn summary(hostnames: &[String]) -> String {
    match hostnames {
        [] => "no hostnames".to_string(),
        [only] => only.clone(),
        [first, rest @ ..] => format!("{first} (+{})", rest.len()),
    }
}
