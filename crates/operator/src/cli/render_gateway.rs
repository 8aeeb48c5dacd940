//! The Gateways of `tailnet-operator render`: Gateway API objects among the inputs, decided
//! offline with the controllers' own pure functions — the class's verdict
//! (`gateway_class::decide::verdict`), each Gateway's entrance in its Tailnet's policy and DNS
//! (`gateway::intents::intent_in`), the Gateway API decision
//! (`tailnet_render::gateway::decide_gateway`, with the runtime the controller plans with) and
//! the agent's objects (`gateway::decide::gateway_objects`). What the Gateway, its listeners
//! and its routes would report is said in notes naming the object and field.
//!
//! Certificate Secrets: the agent's copy is printed with every data value emptied (keys kept)
//! and the annotation [`REDACTED_ANNOTATION`]: the preview shows which files the agent gets,
//! never key material.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use tailnet_api::Tailnet;
use tailnet_api::naming::AgentKind;
use tailnet_gateway_api::{Gateway, HTTPRoute, ReferenceGrant, TCPRoute, TLSRoute};
use tailnet_render::RenderContext;
use tailnet_render::backends::{ObjectKey, ObservedBackends};
use tailnet_render::gateway::objects::KeyPair;
use tailnet_render::gateway::{
    self as core, ClusterFacts, GatewayDecision, RouteParents, SecretFact,
};
use tailnet_render::intent::IngressIntent;
use tailnet_render::meta::Owner;

use super::manifests::{Manifests, Origin};
use super::render_output::{PREVIEW_UID, RenderCommandError, json};
use crate::controllers::gateway::decide::{claim, class_accepted, gateway_objects, starting};
use crate::controllers::gateway::gather::key_pair;
use crate::controllers::gateway::intents::intent_in;
use crate::controllers::gateway::observation::ClassState;
use crate::controllers::gateway_class::decide::{ClassObserved, ours, parameters_ref, verdict};

/// Annotation on the agent's copy of the certificate Secrets: its data values are emptied.
pub const REDACTED_ANNOTATION: &str = "render.tailnet-operator.dev/redacted";

/// One Gateway of the inputs as the operator would see it.
pub struct GatewayView {
    pub origin: Origin,
    /// With [`PREVIEW_UID`] when the manifest has no uid.
    pub gateway: Gateway,
    pub class: ClassState,
}

/// The Gateways of the inputs, their classes judged; what makes a Gateway not ours (or its
/// class not Accepted) is in `warnings`.
#[derive(Default)]
pub struct Gateways {
    pub views: Vec<GatewayView>,
    /// The default Tailnet (the only one among the inputs), as the controllers take it.
    pub default_tailnet: Option<String>,
    pub warnings: Vec<String>,
}

/// The class state of each GatewayClass of the inputs (by name), with the controllers'
/// verdict on its parameters (read from the inputs).
fn class_states(
    manifests: &Manifests,
    default: &Result<String, String>,
) -> BTreeMap<String, ClassState> {
    let lookup = |name: &str| {
        manifests
            .tailnets
            .iter()
            .find(|t| t.object.name_any() == name)
            .map(|t| t.object.spec.clone())
    };
    let mut states = BTreeMap::new();
    for class in &manifests.gateway_classes {
        let state = if ours(&class.object) {
            let parameters = match parameters_ref(&class.object) {
                Ok(Some((namespace, name))) => Some(
                    manifests
                        .gateway_parameters
                        .iter()
                        .find(|p| {
                            p.object.name_any() == name
                                && p.object.namespace().as_deref() == Some(namespace.as_str())
                        })
                        .map(|p| &p.object.spec),
                ),
                Ok(None) | Err(_) => None,
            };
            let observed = ClassObserved {
                parameters,
                default_tailnet: default.clone(),
                tailnet: &lookup,
            };
            ClassState::Ours(verdict(&class.object, &observed))
        } else {
            ClassState::NotOurs
        };
        states.insert(class.object.name_any(), state);
    }
    states
}

/// Judges every Gateway's class as the controllers do: a class missing from the inputs or of
/// another controller makes the Gateway not ours (ignored); a class of ours whose parameters
/// do not resolve is not Accepted (the Gateway gets no agent).
pub fn resolve(manifests: &Manifests) -> Gateways {
    let names: Vec<String> = manifests
        .tailnets
        .iter()
        .map(|t| t.object.name_any())
        .collect();
    let default = tailnet_api::service::default_tailnet(&names).map_err(|e| e.to_string());
    let states = class_states(manifests, &default);
    let mut out = Gateways {
        default_tailnet: default.ok(),
        ..Gateways::default()
    };
    for class in &manifests.gateway_classes {
        if let Some(ClassState::Ours(Err(why))) = states.get(&class.object.name_any()) {
            out.warnings.push(format!(
                "{}: would not be Accepted (InvalidParameters): {why}; its Gateways get no agent, no grant and no DNS records",
                class.origin
            ));
        }
    }
    let mut gateways: Vec<&super::manifests::Sourced<Gateway>> =
        manifests.gateways.iter().collect();
    gateways.sort_by_key(|g| (g.object.namespace(), g.object.name_any()));
    for g in gateways {
        let class_name = &g.object.spec.gateway_class_name;
        let found = manifests
            .gateway_classes
            .iter()
            .find(|c| c.object.name_any() == *class_name);
        let class = states.get(class_name).cloned().unwrap_or_default();
        match (found, &class) {
            (None, _) => out.warnings.push(format!(
                "{}: spec.gatewayClassName: GatewayClass {class_name} is not among the inputs; the Gateway is ignored (the operator serves Gateways of a class with controllerName {})",
                g.origin,
                core::CONTROLLER_NAME
            )),
            (Some(c), ClassState::NotOurs) => out.warnings.push(format!(
                "{}: spec.gatewayClassName: GatewayClass {class_name} has controllerName {} (not {}); the Gateway is ignored",
                g.origin,
                c.object.spec.controller_name,
                core::CONTROLLER_NAME
            )),
            (Some(_), ClassState::Ours(Err(_))) => out.warnings.push(format!(
                "{}: Accepted=False (Invalid): GatewayClass {class_name} is not Accepted (see above); no agent",
                g.origin
            )),
            (Some(_), ClassState::Ours(Ok(_))) => {}
        }
        let mut gateway = g.object.clone();
        gateway
            .metadata
            .uid
            .get_or_insert_with(|| PREVIEW_UID.to_string());
        out.views.push(GatewayView {
            origin: g.origin.clone(),
            gateway,
            class,
        });
    }
    out
}

impl Gateways {
    /// The Gateways of Tailnet `tailnet` (class ours and Accepted, its parameters naming it).
    pub fn of_tailnet<'a>(
        &'a self,
        tailnet: &'a str,
    ) -> impl Iterator<Item = (&'a GatewayView, IngressIntent)> + 'a {
        self.views.iter().filter_map(move |v| {
            intent_in(
                &v.gateway,
                &v.class,
                self.default_tailnet.as_deref(),
                tailnet,
            )
            .map(|intent| (v, intent))
        })
    }

    /// Their intents, as the Tailnet controller adds them after the ingresses.
    pub fn intents(&self, tailnet: &str) -> Vec<IngressIntent> {
        self.of_tailnet(tailnet).map(|(_, intent)| intent).collect()
    }
}

/// What the Gateway decisions read besides the Gateway: routes, grants and cluster facts.
pub struct Cluster {
    pub http_routes: Vec<HTTPRoute>,
    pub tls_routes: Vec<TLSRoute>,
    pub tcp_routes: Vec<TCPRoute>,
    pub reference_grants: Vec<ReferenceGrant>,
    pub facts: ClusterFacts,
    /// Usable certificate pairs (never printed); an `--observed` `tlsSecrets` entry has empty
    /// content (its copy is printed redacted anyway).
    pub key_pairs: BTreeMap<ObjectKey, KeyPair>,
}

/// The routes, grants, namespaces' labels, certificate Secrets (the inputs' and those
/// `--observed` lists as usable) and backend Services (`backends`: the inputs' and
/// `--observed`'s) as the Gateway controller gathers them.
pub fn cluster(
    manifests: &Manifests,
    backends: &ObservedBackends,
    tls_secrets: &[ObjectKey],
) -> Cluster {
    let mut facts = ClusterFacts::default();
    let mut key_pairs = BTreeMap::new();
    for key in tls_secrets {
        facts.secrets.insert(key.clone(), SecretFact::TlsKeyPair);
        key_pairs.insert(
            key.clone(),
            KeyPair {
                certificate: Vec::new(),
                key: Vec::new(),
            },
        );
    }
    // A manifest wins over an --observed entry of the same Secret.
    for s in &manifests.tls_secrets {
        let key = ObjectKey::new(
            s.object.namespace().unwrap_or_default(),
            s.object.name_any(),
        );
        match key_pair(&as_stored(&s.object)) {
            Ok(pair) => {
                facts.secrets.insert(key.clone(), SecretFact::TlsKeyPair);
                key_pairs.insert(key, pair);
            }
            Err(why) => {
                key_pairs.remove(&key);
                facts.secrets.insert(key, SecretFact::Unusable(why));
            }
        }
    }
    facts.services = backends.services.keys().cloned().collect();
    for service in &manifests.services {
        if let Some(ports) = tailnet_render::gateway::headless_target_ports(&service.object) {
            let key = ObjectKey::new(
                service.object.namespace().unwrap_or_default(),
                service.object.name_any(),
            );
            facts.headless_target_ports.insert(key, ports);
        }
    }
    facts.namespace_labels = manifests
        .namespaces
        .iter()
        .map(|n| (n.object.name_any(), n.object.labels().clone()))
        .collect();
    Cluster {
        http_routes: objects(&manifests.http_routes),
        tls_routes: objects(&manifests.tls_routes),
        tcp_routes: objects(&manifests.tcp_routes),
        reference_grants: objects(&manifests.reference_grants),
        facts,
        key_pairs,
    }
}

/// The objects of some manifests.
pub(crate) fn objects<T: Clone>(sourced: &[super::manifests::Sourced<T>]) -> Vec<T> {
    sourced.iter().map(|s| s.object.clone()).collect()
}

/// A Secret manifest as the apiserver stores it: `stringData` merged into `data`.
pub(crate) fn as_stored(secret: &Secret) -> Secret {
    let mut stored = secret.clone();
    if let Some(strings) = stored.string_data.take() {
        let data = stored.data.get_or_insert_with(BTreeMap::new);
        for (key, value) in strings {
            data.insert(key, ByteString(value.into_bytes()));
        }
    }
    stored
}

/// The Gateway API decision for `view` as the controller plans it (agent being deployed).
pub fn decision(view: &GatewayView, cluster: &Cluster) -> GatewayDecision {
    let class = class_accepted(&view.class);
    core::decide_gateway(&core::GatewayInputs {
        gateway: &view.gateway,
        class_accepted: &class,
        http_routes: &cluster.http_routes,
        tls_routes: &cluster.tls_routes,
        tcp_routes: &cluster.tcp_routes,
        reference_grants: &cluster.reference_grants,
        facts: &cluster.facts,
        runtime: &starting(),
    })
}

/// What one Gateway renders to.
#[derive(Default)]
pub struct GatewayOutput {
    /// The agent's objects, the certificate copy redacted; empty when the Gateway is not
    /// Accepted or has no tag of its own.
    pub objects: Vec<serde_json::Value>,
    pub notes: Vec<String>,
}

/// The objects and notes of every Gateway of Tailnet `tailnet`.
pub fn render(
    gateways: &Gateways,
    cluster: &Cluster,
    tailnet: &Tailnet,
    ctx: &RenderContext<'_>,
    backends: &ObservedBackends,
) -> Result<GatewayOutput, RenderCommandError> {
    let name = tailnet.name_any();
    let mine: Vec<&GatewayView> = gateways.of_tailnet(&name).map(|(v, _)| v).collect();
    let claims: Vec<_> = mine.iter().map(|v| claim(&v.gateway, &name)).collect();
    let mut out = GatewayOutput::default();
    for view in mine {
        let owner_name = format!(
            "Gateway {}/{}",
            view.gateway.namespace().unwrap_or_default(),
            view.gateway.name_any()
        );
        let decided = decision(view, cluster);
        out.notes
            .extend(status_notes(&owner_name, &view.gateway, &decided, cluster));
        let Some(plan) = &decided.plan else {
            continue;
        };
        let tag = match tailnet_render::claims::ingress_tag_of(
            &name,
            &tailnet.spec.policy.tag_prefix,
            &claim(&view.gateway, &name),
            &claims,
        ) {
            Ok(tag) => tag,
            Err(holder) => {
                out.notes.push(format!(
                    "{owner_name}: no tag of its own: the tag it would get is held by {holder}; rename this Gateway (or its namespace); no agent"
                ));
                continue;
            }
        };
        let owner = Owner::from_meta(AgentKind::Gateway, &view.gateway.metadata, &name)
            .map_err(|e| invalid(&view.origin, e))?;
        let (objects, agent_notes) = gateway_objects(
            &owner,
            ctx,
            plan,
            &tag,
            &cluster.key_pairs,
            backends,
            &view.gateway,
            view.class.in_cluster_namespaces(),
        )
        .map_err(|e| invalid(&view.origin, e))?;
        out.notes.extend(
            agent_notes
                .iter()
                .map(|n| format!("{owner_name}: not served by the agent: {n}")),
        );
        let agent = &objects.agent;
        out.objects.extend([
            json(&agent.service_account)?,
            json(&agent.role)?,
            json(&agent.role_binding)?,
            json(&agent.state_secret)?,
            json(&agent.config_map)?,
            json(&agent.deployment)?,
            json(&agent.network_policy)?,
        ]);
        if let Some(copy) = &objects.certificates {
            out.objects.push(json(&redacted(copy))?);
        }
    }
    Ok(out)
}

fn invalid(origin: &Origin, error: tailnet_render::RenderError) -> RenderCommandError {
    RenderCommandError::Invalid(vec![format!("{origin}: {error}")])
}

/// The agent's copy of the certificate Secrets as `render` prints it: every data value
/// emptied (the keys say which files the agent gets), [`REDACTED_ANNOTATION`] saying so.
pub fn redacted(copy: &Secret) -> Secret {
    let mut secret = copy.clone();
    if let Some(data) = secret.data.as_mut() {
        for value in data.values_mut() {
            *value = ByteString(Vec::new());
        }
    }
    secret.string_data = None;
    secret.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(
        REDACTED_ANNOTATION.to_string(),
        "data: the operator copies tls.crt and tls.key of the listeners' certificate Secrets here; render never prints key material".to_string(),
    );
    secret
}

/// Condition (type, status) pairs worth a note: what is not as it should be. `Programmed` is
/// left out (offline the agent never runs).
fn notable(type_: &str, status: &str) -> bool {
    use tailnet_gateway_api::conditions::{listener, route};
    match type_ {
        listener::CONFLICTED | listener::OVERLAPPING_TLS_CONFIG | route::PARTIALLY_INVALID => {
            status == "True"
        }
        listener::PROGRAMMED => false,
        _ => status != "True",
    }
}

/// A hint for what offline input would change a reason.
fn hint(reason: &str) -> &'static str {
    use tailnet_gateway_api::conditions::{listener, route};
    match reason {
        listener::reasons::INVALID_CERTIFICATE_REF => {
            "; add the Secret (type kubernetes.io/tls) to the inputs, or list it in --observed tlsSecrets"
        }
        route::reasons::BACKEND_NOT_FOUND => {
            "; add the Service manifest to the inputs, or its ports to --observed services"
        }
        route::reasons::REF_NOT_PERMITTED => {
            "; a ReferenceGrant in the referenced object's namespace must allow the reference"
        }
        _ => "",
    }
}

/// What the Gateway, its listeners and its routes would report, one note per condition that is
/// not as it should be, naming object and field.
pub fn status_notes(
    owner: &str,
    gateway: &Gateway,
    decided: &GatewayDecision,
    cluster: &Cluster,
) -> Vec<String> {
    use tailnet_gateway_api::conditions::gateway as gw;
    let mut notes = Vec::new();
    for c in &decided.status.conditions {
        let listeners_invalid =
            c.type_ == gw::ACCEPTED && c.reason == gw::reasons::LISTENERS_NOT_VALID;
        if c.type_ == gw::ACCEPTED && (c.status != "True" || listeners_invalid) {
            notes.push(format!(
                "{owner}: Accepted={} ({}): {}",
                c.status, c.reason, c.message
            ));
        }
    }
    for l in &decided.status.listeners {
        let index = gateway
            .spec
            .listeners
            .iter()
            .position(|s| s.name == l.name)
            .unwrap_or_default();
        for c in l.conditions.iter().filter(|c| notable(&c.type_, &c.status)) {
            notes.push(format!(
                "{owner}: spec.listeners[{index}] ({}): {}={} ({}): {}{}",
                l.name,
                c.type_,
                c.status,
                c.reason,
                c.message,
                hint(&c.reason)
            ));
        }
    }
    for route in &decided.routes {
        notes.extend(route_notes(owner, route, cluster));
    }
    notes
}

/// The notes of one route's entries for the Gateway `owner`.
fn route_notes(owner: &str, route: &RouteParents, cluster: &Cluster) -> Vec<String> {
    use tailnet_gateway_api::conditions::route as r;
    let id = &route.route;
    let is = |meta: &kube::api::ObjectMeta| {
        meta.namespace.as_deref() == Some(id.namespace.as_str())
            && meta.name.as_deref() == Some(id.name.as_str())
    };
    let parent_refs = match id.kind {
        core::RouteKind::HTTPRoute => cluster
            .http_routes
            .iter()
            .find(|x| is(&x.metadata))
            .map(|x| &x.spec.parent_refs),
        core::RouteKind::TLSRoute => cluster
            .tls_routes
            .iter()
            .find(|x| is(&x.metadata))
            .map(|x| &x.spec.parent_refs),
        core::RouteKind::TCPRoute => cluster
            .tcp_routes
            .iter()
            .find(|x| is(&x.metadata))
            .map(|x| &x.spec.parent_refs),
    };
    let mut notes = Vec::new();
    for parent in &route.parents {
        let index = parent_refs
            .and_then(|refs| refs.iter().position(|p| *p == parent.parent_ref))
            .unwrap_or_default();
        for c in parent
            .conditions
            .iter()
            .filter(|c| notable(&c.type_, &c.status))
        {
            let field = match c.type_.as_str() {
                r::RESOLVED_REFS => "spec.rules[].backendRefs".to_string(),
                r::PARTIALLY_INVALID => "spec.rules".to_string(),
                _ => format!("spec.parentRefs[{index}]"),
            };
            notes.push(format!(
                "{} {}/{}: {field} (parent {owner}): {}={} ({}): {}{}",
                id.kind.as_str(),
                id.namespace,
                id.name,
                c.type_,
                c.status,
                c.reason,
                c.message,
                hint(&c.reason)
            ));
        }
    }
    notes
}

#[cfg(test)]
#[path = "render_gateway_tests.rs"]
pub(crate) mod tests;
