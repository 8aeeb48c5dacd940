//! The ingress's decisions (pure): its intent, its tag among the Tailnet's ingresses, its
//! hostnames (first claim wins), the certificate that must cover every http name before
//! http is served, its backends, the grants of `allowFrom`, and the exposes/URLs/hostnames in
//! the status. The Tailnet, the identity and `Ready` are decided by `agent/decide.rs`, which
//! calls [`Decide::plan`] and [`Decide::report`] around the identity.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;
use tailnet_api::conditions::{self, reasons, types};
use tailnet_api::ingress::{ExposeMode, ExposeStatus, TailnetIngressStatus};
use tailnet_api::naming::{AgentKind, AgentNames};
use tailnet_api::validate::{self, ExposeNames, FieldError, ValidIngress};
use tailnet_api::{Tailnet, TailnetIngress};
use tailnet_headscale::Node;
use tailnet_render::RenderError;
use tailnet_render::ingress::IngressObjects;
use tailnet_render::meta::Owner;

use super::super::agent::conditions as shared;
use super::super::agent::decide::{AgentObjects, AgentStatus, Decide, Input, Planned};
use super::super::agent::identity::Identity;
use super::super::config::OperatorConfig;
use super::super::status::{ConditionSet, Problem};
use super::certificates::{self, CertificateVerdict};
use super::desired;
use super::observation::{IngressObserved, tls_secret_name};

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

/// The TailnetIngress kind.
#[derive(Debug)]
pub struct Ingress;

/// What the ingress decided beyond its agent (read by `report`).
#[derive(Clone, Debug)]
pub struct IngressPlan {
    /// Per expose, the hostnames it serves.
    names: Vec<ExposeNames>,
    /// A certificate covers every http name: http exposes are served.
    serve_http: bool,
    /// `allowFrom` entries outside the Tailnet's allowlist (they get no grant).
    not_allowed: Vec<String>,
}

impl IngressPlan {
    /// `allowFrom` entries outside the Tailnet's allowlist.
    pub fn not_allowed(&self) -> &[String] {
        &self.not_allowed
    }
}

/// What the ingress's act step reports back.
#[derive(Debug, Default)]
pub struct Acted {
    /// The cert-manager Certificate could not be applied (e.g. cert-manager is not
    /// installed): this error. Not a reconcile error: the status says it.
    pub certificate_error: Option<String>,
}

impl AgentStatus for TailnetIngressStatus {
    fn set_observed_generation(&mut self, generation: Option<i64>) {
        self.observed_generation = generation;
    }

    fn record_node(&mut self, node: &Node) {
        self.node_id = Some(node.id.to_string());
        self.tailnet_ips = node.ip_addresses.clone();
    }
}

impl Decide for Ingress {
    type Object = TailnetIngress;
    type Status = TailnetIngressStatus;
    type Intent = ValidIngress;
    type Observed = IngressObserved;
    type Objects = IngressObjects;
    type Plan = IngressPlan;
    type Acted = Acted;

    const AGENT: AgentKind = AgentKind::Ingress;
    const REQUIRED: &'static [&'static str] = &REQUIRED;
    const OBSERVED_IF_KNOWN: &'static [&'static str] = &OBSERVED_IF_KNOWN;

    fn status(ingress: &TailnetIngress) -> Option<&TailnetIngressStatus> {
        ingress.status.as_ref()
    }

    fn tailnet_name(ingress: &TailnetIngress) -> Option<&str> {
        Some(&ingress.spec.tailnet_ref.name)
    }

    fn intent(ingress: &TailnetIngress) -> Result<ValidIngress, Vec<FieldError>> {
        validate::valid_ingress(&ingress.spec)
    }

    /// An ingress's node is named after its tag ([`tailnet_api::naming::tag_hostname`]);
    /// releases before it used the object name, `tailnet-ingress-<name>`, which a node keeps
    /// until its pod restarts.
    fn hostnames(names: &AgentNames, tag: &str) -> Vec<String> {
        vec![tailnet_api::naming::tag_hostname(tag), names.base.clone()]
    }

    fn plan(
        input: &Input<'_, Ingress>,
        c: &mut ConditionSet,
        status: &mut TailnetIngressStatus,
    ) -> Result<Option<Planned<Ingress>>, RenderError> {
        plan(input, c, status)
    }

    fn report(
        input: &Input<'_, Ingress>,
        planned: &Planned<Ingress>,
        _identity: &Identity,
        c: &mut ConditionSet,
        status: &mut TailnetIngressStatus,
    ) {
        let plan = &planned.plan;
        status.exposes = expose_status(&plan.names, plan.serve_http);
        status.urls = urls(&plan.names);
        policy_effective(
            c,
            input.object,
            input.owner,
            input.tailnet,
            &plan.not_allowed,
        );
        status.summary = Some(summary(&status.hostnames));
        shared::reachability(
            c,
            types::BACKENDS_REACHABLE,
            input.agent().report.as_ref().map(|r| r.backends.as_slice()),
        );
    }

    fn agent_objects(objects: &IngressObjects) -> AgentObjects<'_> {
        let IngressObjects {
            service_account,
            role,
            role_binding,
            state_secret,
            config_map,
            deployment,
            network_policy,
            login,
            in_cluster_service: _,
            certificate: _,
            config: _,
            hostnames: _,
            http_hostnames: _,
            tls_secret: _,
        } = objects;
        AgentObjects {
            service_account,
            role,
            role_binding,
            state_secret,
            config_map,
            network_policy,
            deployment,
            login,
        }
    }

    /// The one its status records when that is one of its own forms, else the one the
    /// assignment gives it; `None` when it has none of its own (then nothing in Headscale is
    /// deleted on its behalf).
    fn cleanup_tag(
        tailnet: &Tailnet,
        ingress: &TailnetIngress,
        all: &[Arc<TailnetIngress>],
    ) -> Option<String> {
        let prefix = &tailnet.spec.policy.tag_prefix;
        desired::tag(ingress, &tailnet.name_any(), prefix, all).ok()
    }

    fn amend(
        ingress: &TailnetIngress,
        status: TailnetIngressStatus,
        acted: &Acted,
        now: Timestamp,
    ) -> TailnetIngressStatus {
        match &acted.certificate_error {
            Some(error) => certificate_not_created(ingress, &status, error, now),
            None => status,
        }
    }
}

/// Before the identity: the tag, the context rules, the sources, the hostnames (an older
/// ingress keeps its claims), the certificate and the backends; the agent's objects only when
/// every backend resolves (else the last good configuration stays and no key is minted).
fn plan(
    input: &Input<'_, Ingress>,
    c: &mut ConditionSet,
    status: &mut TailnetIngressStatus,
) -> Result<Option<Planned<Ingress>>, RenderError> {
    let (ingress, tailnet, observed) = (input.object, input.tailnet, input.kind());
    // Its own tag, or nothing of anyone else's is touched: no key, no agent, no grant.
    let Some(tag) = own_tag(input, c, status) else {
        return Ok(None);
    };
    let render_ctx = input.render_context();
    // Context rules (cross-namespace backends, templates, a certificate source), then the
    // hostnames an older ingress keeps (first claim wins).
    let intent = match desired::intent(ingress, &render_ctx, input.owner.kind) {
        Ok(intent) => intent,
        Err(errors) => return Ok(out_of_context(c, &errors)),
    };
    let not_allowed = sources_allowed(c, ingress, tailnet);
    let names = match desired::names(&intent, &observed.others, &observed.entrances, &render_ctx) {
        Ok(names) => names,
        Err(errors) => return Ok(out_of_context(c, &errors)),
    };
    hostnames_unique(c, &names.claimed);
    let serve_http = certificate_ready(c, input, &names.http_hostnames);
    let wanted = desired::Observed {
        backends: &observed.backends,
        certificate_ready: serve_http,
        tag: &tag,
        kind: input.owner.kind,
    };
    let desired = desired::objects(ingress, input.intent, names, &render_ctx, &wanted)?;
    let unwatched = unwatched_backends(&ingress.metadata, input.intent, input.config);
    let problems: Vec<String> = desired
        .problems
        .iter()
        .map(ToString::to_string)
        .chain(unwatched.iter().cloned())
        .collect();
    backends_resolved(c, &problems, !unwatched.is_empty());
    if let Some(objects) = &desired.objects {
        status.hostnames = objects.hostnames.clone();
    }
    // The agent is only deployed (and so a pre-auth key only minted) without problems;
    // nothing is rendered for backends the operator cannot read (as for missing ones).
    let objects = desired.objects.filter(|_| problems.is_empty());
    Ok(Some(Planned {
        tag,
        objects,
        plan: IngressPlan {
            names: desired.names.names,
            serve_http,
            not_allowed,
        },
    }))
}

/// The ingress's tag (recorded in the status), or `AgentReady=False/TagConflict` naming the
/// ingress that holds the tag it would get.
fn own_tag(
    input: &Input<'_, Ingress>,
    c: &mut ConditionSet,
    status: &mut TailnetIngressStatus,
) -> Option<String> {
    let (ingress, tailnet, observed) = (input.object, input.tailnet, input.kind());
    let assigned = observed.tag.clone().unwrap_or_else(|| {
        desired::tag(
            ingress,
            &tailnet.name_any(),
            &tailnet.spec.policy.tag_prefix,
            &observed.others,
        )
    });
    match assigned {
        Ok(tag) => {
            status.tag = Some(tag.clone());
            Some(tag)
        }
        Err(holder) => {
            status.tag = None;
            let (namespace, name) = (ingress.namespace().unwrap_or_default(), ingress.name_any());
            c.fail(
                types::AGENT_READY,
                Problem::new(
                    reasons::TAG_CONFLICT,
                    format!(
                        "no tag of its own for {namespace}/{name}: the tag it would get is held by {holder}; rename this ingress (or its namespace)"
                    ),
                ),
            );
            None
        }
    }
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
fn out_of_context(c: &mut ConditionSet, errors: &[FieldError]) -> Option<Planned<Ingress>> {
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
    None
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
            "no other TailnetIngress or Service claims these names",
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
    input: &Input<'_, Ingress>,
    http_names: &[String],
) -> bool {
    let (ingress, owner, now) = (input.object, input.owner, input.now);
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
    let verdict = input
        .kind()
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
    owner: &Owner,
    tailnet: &Tailnet,
    not_allowed: &[String],
) {
    let resource_key = format!(
        "{}/{}/{}",
        owner.kind.resource_kind(),
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
