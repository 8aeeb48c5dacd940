//! The TailnetIngress controller: one agent per ingress in the application's namespace,
//! names from the Tailnet's templates, a certificate that must cover every http name before
//! http is served, grants from `allowFrom`, and a status that names the missing precondition.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tailnet_api::conditions::{Status, reasons, types};
use tailnet_api::ingress::{ExposeMode, ExposeStatus, TailnetIngressStatus};
use tailnet_api::naming::{AgentKind, ingress_tag};
use tailnet_api::validate::{self, ExposeNames};
use tailnet_api::{FIELD_MANAGER, Tailnet, TailnetIngress};
use tailnet_render::RenderContext;
use tailnet_render::images::Images;
use tailnet_render::ingress::{self as render_ingress, IngressInputs};
use tailnet_render::meta::Owner;

use super::ReconcileError;
use super::agent;
use super::applied::{self, ChildRef, Decision, Live};
use super::certificates::{self, CertificateVerdict};
use super::context::Context;

const CONTROLLER: &str = "ingress";

fn key(i: &TailnetIngress) -> String {
    format!(
        "ingress/{}/{}",
        i.namespace().unwrap_or_default(),
        i.name_any()
    )
}

pub async fn reconcile(
    ingress: Arc<TailnetIngress>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let namespace = ingress.namespace().unwrap_or_default();
    let api: Api<TailnetIngress> = Api::namespaced(ctx.client.clone(), &namespace);
    let run = finalizer(&api, super::lifecycle::FINALIZER, ingress.clone(), |event| {
        let ctx = ctx.clone();
        async move {
            match event {
                finalizer::Event::Apply(i) => apply_ingress(&i, &ctx).await,
                finalizer::Event::Cleanup(i) => cleanup(&i, &ctx).await,
            }
        }
    });
    let run = async {
        run.await
            .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
    };
    super::instrumented(&ctx, CONTROLLER, &key(&ingress), run).await
}

pub fn error_policy(
    ingress: Arc<TailnetIngress>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    super::backoff_on_error(&ctx, CONTROLLER, &key(&ingress), error)
}

const REQUIRED: [&str; 8] = [
    types::TAILNET_READY,
    types::SOURCES_ALLOWED,
    types::BACKENDS_RESOLVED,
    types::CERTIFICATE_READY,
    types::AGENT_READY,
    types::NODE_ONLINE,
    types::POLICY_EFFECTIVE,
    types::HOSTNAMES_UNIQUE,
];

/// Hostnames another (older) TailnetIngress already claims: the first owner keeps a name
/// (ordered by creation time, then namespace/name).
fn claimed_elsewhere(
    ctx: &Context,
    ingress: &TailnetIngress,
    tailnet: &Tailnet,
    names: &[ExposeNames],
) -> BTreeMap<String, String> {
    let ours: BTreeSet<&str> = names
        .iter()
        .flat_map(|n| n.hostnames.iter().map(String::as_str))
        .collect();
    let rank = |i: &TailnetIngress| {
        (
            i.creation_timestamp().map(|t| t.0),
            i.namespace().unwrap_or_default(),
            i.name_any(),
        )
    };
    let my_rank = rank(ingress);
    let mut claimed = BTreeMap::new();
    for other in ctx.ingresses.state() {
        if other.uid() == ingress.uid()
            || other.spec.tailnet_ref.name != tailnet.name_any()
            || rank(&other) >= my_rank
        {
            continue;
        }
        let ns = other.namespace().unwrap_or_default();
        let Ok(other_names) = validate::ingress_in_context(
            &ns,
            &ctx.config.operator_namespace,
            &other.spec,
            &tailnet.name_any(),
            &tailnet.spec,
        ) else {
            continue;
        };
        for hostname in other_names.iter().flat_map(|n| n.hostnames.iter()) {
            if ours.contains(hostname.as_str()) {
                claimed.insert(hostname.clone(), format!("{ns}/{}", other.name_any()));
            }
        }
    }
    claimed
}

/// Resolves each expose's backend port against its Service; collects what is missing.
async fn resolve_backends(
    ctx: &Context,
    ingress: &TailnetIngress,
    namespace: &str,
) -> Result<(BTreeMap<String, u16>, Vec<String>), ReconcileError> {
    let mut ports = BTreeMap::new();
    let mut problems = Vec::new();
    for expose in &ingress.spec.exposes {
        let backend = &expose.backend;
        let ns = backend
            .namespace
            .clone()
            .unwrap_or_else(|| namespace.to_string());
        let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
        let Some(service) = super::get_opt_cached(&services, &backend.service)
            .await
            .map_err(ReconcileError::kube("get backend Service"))?
        else {
            problems.push(format!(
                "exposes[{}]: Service {ns}/{} does not exist",
                expose.name, backend.service
            ));
            continue;
        };
        let service_ports = service.spec.and_then(|s| s.ports).unwrap_or_default();
        let found = match &backend.port {
            IntOrString::Int(n) => service_ports.iter().find(|p| p.port == *n).map(|p| p.port),
            IntOrString::String(name) => service_ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.port),
        };
        match found.and_then(|p| u16::try_from(p).ok()) {
            Some(port) => {
                ports.insert(expose.name.clone(), port);
            }
            None => problems.push(format!(
                "exposes[{}]: Service {ns}/{} has no port {}",
                expose.name,
                backend.service,
                match &backend.port {
                    IntOrString::Int(n) => n.to_string(),
                    IntOrString::String(s) => format!("named {s:?}"),
                }
            )),
        }
        if let Some(tls) = &backend.tls {
            let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
            let cm = super::get_opt_cached(&cms, &tls.ca_config_map_ref.name)
                .await
                .map_err(ReconcileError::kube("get CA ConfigMap"))?;
            let has_key = cm
                .as_ref()
                .and_then(|c| c.data.as_ref())
                .is_some_and(|d| d.contains_key(&tls.ca_config_map_ref.key));
            if !has_key {
                problems.push(format!(
                    "exposes[{}]: ConfigMap {namespace}/{} with key {:?} (backend.tls.caConfigMapRef) does not exist",
                    expose.name, tls.ca_config_map_ref.name, tls.ca_config_map_ref.key
                ));
            }
        }
    }
    Ok((ports, problems))
}

fn certificate_api(ctx: &Context, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cert-manager.io",
        "v1",
        "Certificate",
    ));
    Api::namespaced_with(ctx.client.clone(), namespace, &resource)
}

async fn apply_ingress(ingress: &TailnetIngress, ctx: &Context) -> Result<Action, ReconcileError> {
    let namespace = ingress.namespace().unwrap_or_default();
    let name = ingress.name_any();
    let api: Api<TailnetIngress> = Api::namespaced(ctx.client.clone(), &namespace);
    let previous = ingress.status.clone().unwrap_or_default();
    let mut c = agent::Conditions {
        list: previous.conditions.clone(),
        generation: ingress.metadata.generation,
        now: Time(Timestamp::now()),
    };
    let mut status = TailnetIngressStatus {
        observed_generation: ingress.metadata.generation,
        ..previous.clone()
    };
    let poll = Action::requeue(ctx.config.headscale_poll);

    let errors = validate::ingress(&ingress.spec);
    if !errors.is_empty() {
        c.set(
            types::SPEC_VALID,
            Status::False,
            reasons::INVALID_SPEC,
            format!(
                "{}; the last valid configuration stays applied",
                validate::summarize(&errors)
            ),
        );
        status.conditions = c.finish(&[types::SPEC_VALID]);
        return agent::write_status_if_changed(
            &api,
            &ingress.name_any(),
            "TailnetIngress",
            &previous,
            status,
            |s| &mut s.conditions,
        )
        .await
        .map(|_| poll);
    }
    c.list.retain(|x| x.type_ != types::SPEC_VALID);

    let access = match agent::tailnet_access(ctx, &ingress.spec.tailnet_ref.name).await {
        Ok(access) => access,
        Err((reason, message)) => {
            c.set(types::TAILNET_READY, Status::False, &reason, message);
            status.conditions = c.finish(&REQUIRED);
            return agent::write_status_if_changed(
                &api,
                &ingress.name_any(),
                "TailnetIngress",
                &previous,
                status,
                |s| &mut s.conditions,
            )
            .await
            .map(|_| poll);
        }
    };
    let tailnet = &access.tailnet;
    let tailnet_name = tailnet.name_any();
    let tag = ingress_tag(&tailnet.spec.policy.tag_prefix, &namespace, &name);
    status.tag = Some(tag.clone());
    match &access.headscale {
        Ok(_) => c.set(
            types::TAILNET_READY,
            Status::True,
            reasons::READY,
            format!("Tailnet {tailnet_name} at {}", tailnet.spec.server),
        ),
        Err((reason, message)) => c.set(
            types::TAILNET_READY,
            Status::False,
            reason,
            format!("Tailnet {tailnet_name}: {message}"),
        ),
    }

    // Context rules: cross-namespace backends, templates, a certificate source.
    let mut names = match validate::ingress_in_context(
        &namespace,
        &ctx.config.operator_namespace,
        &ingress.spec,
        &tailnet_name,
        &tailnet.spec,
    ) {
        Ok(names) => names,
        Err(errors) => {
            let cross = errors
                .iter()
                .any(|e| e.field.ends_with(".backend.namespace"));
            let reason = if cross {
                reasons::CROSS_NAMESPACE_BACKEND
            } else {
                reasons::INVALID_SPEC
            };
            c.set(
                types::BACKENDS_RESOLVED,
                Status::False,
                reason,
                validate::summarize(&errors),
            );
            status.conditions = c.finish(&REQUIRED);
            return agent::write_status_if_changed(
                &api,
                &ingress.name_any(),
                "TailnetIngress",
                &previous,
                status,
                |s| &mut s.conditions,
            )
            .await
            .map(|_| poll);
        }
    };

    // allowFrom within the allowlist (else no grant is generated).
    let not_allowed = validate::sources_not_allowed(&ingress.spec, &tailnet.spec);
    if not_allowed.is_empty() {
        c.set(
            types::SOURCES_ALLOWED,
            Status::True,
            reasons::READY,
            format!(
                "allowFrom {} is within the Tailnet's ingressSourceAllowlist",
                ingress.spec.allow_from.join(", ")
            ),
        );
    } else {
        c.set(
            types::SOURCES_ALLOWED,
            Status::False,
            reasons::SOURCE_NOT_ALLOWED,
            format!("{} not in Tailnet {tailnet_name}'s policy.ingressSourceAllowlist [{}]: they get no grant (the allowed sources keep theirs); remove them or ask the platform team to allow them", not_allowed.join(", "), tailnet.spec.policy.ingress_source_allowlist.join(", ")),
        );
    }

    // Hostnames: the first owner keeps a contested name.
    let claimed = claimed_elsewhere(ctx, ingress, tailnet, &names);
    if claimed.is_empty() {
        c.set(
            types::HOSTNAMES_UNIQUE,
            Status::True,
            reasons::READY,
            "no other TailnetIngress claims these names",
        );
    } else {
        let list: Vec<String> = claimed
            .iter()
            .map(|(h, o)| format!("{h} (kept by {o})"))
            .collect();
        c.set(
            types::HOSTNAMES_UNIQUE,
            Status::False,
            reasons::HOSTNAME_CONFLICT,
            format!(
                "names already claimed: {}; they are not served here",
                list.join(", ")
            ),
        );
        for n in &mut names {
            n.hostnames.retain(|h| !claimed.contains_key(h));
        }
    }

    // Backends.
    let (backend_ports, problems) = resolve_backends(ctx, ingress, &namespace).await?;
    if problems.is_empty() {
        c.set(
            types::BACKENDS_RESOLVED,
            Status::True,
            reasons::READY,
            "every backend Service and port exists",
        );
    } else {
        c.set(
            types::BACKENDS_RESOLVED,
            Status::False,
            reasons::BACKEND_NOT_FOUND,
            problems.join("; "),
        );
    }

    // Certificate: cover every http name, valid, or http is not served at all.
    let http_names: Vec<String> = {
        let set: BTreeSet<String> = names
            .iter()
            .filter(|n| n.mode == ExposeMode::Http)
            .flat_map(|n| n.hostnames.clone())
            .collect();
        set.into_iter().collect()
    };
    let has_http = ingress
        .spec
        .exposes
        .iter()
        .any(|e| e.mode == ExposeMode::Http);
    let owner = Owner::from_meta(AgentKind::Ingress, &ingress.metadata, &tailnet_name)?;
    let user_secret = ingress
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.secret_name.clone());
    let secret_name = user_secret.clone().unwrap_or_else(|| owner.names().tls);
    let mut serve_http = false;
    if has_http {
        let secret = agent::read_secret(ctx, &namespace, &secret_name).await?;
        let pem = secret
            .as_ref()
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get("tls.crt"))
            .map(|b| b.0.clone());
        let verdict =
            pem.map(|p| certificates::check(&p, &http_names, Timestamp::now().as_second()));
        let issuing = user_secret.is_none();
        match verdict {
            Some(CertificateVerdict::Valid { not_after }) => {
                serve_http = true;
                c.set(types::CERTIFICATE_READY, Status::True, reasons::READY, format!("Secret {secret_name} covers {} (valid until {not_after})", http_names.join(", ")));
            }
            None if issuing => c.set(types::CERTIFICATE_READY, Status::False, reasons::ISSUING, format!("waiting for cert-manager to issue Secret {secret_name} for {}; http exposes are not served until then", http_names.join(", "))),
            None => c.set(types::CERTIFICATE_READY, Status::False, reasons::SECRET_MISSING, format!("Secret {namespace}/{secret_name} (spec.tls.secretName) does not exist or has no tls.crt; http exposes are not served")),
            Some(CertificateVerdict::NamesNotCovered(missing)) if issuing => c.set(types::CERTIFICATE_READY, Status::False, reasons::ISSUING, format!("Secret {secret_name} does not cover {} yet (re-issuing); http exposes are not served", missing.join(", "))),
            Some(CertificateVerdict::NamesNotCovered(missing)) => c.set(types::CERTIFICATE_READY, Status::False, reasons::NAMES_NOT_COVERED, format!("Secret {secret_name} does not cover {}; http exposes are not served until it does", missing.join(", "))),
            Some(CertificateVerdict::Expired { not_after }) => c.set(types::CERTIFICATE_READY, Status::False, reasons::EXPIRED, format!("the certificate in Secret {secret_name} expired at {not_after}; http exposes are not served")),
            Some(CertificateVerdict::NotYetValid { not_before }) => c.set(types::CERTIFICATE_READY, Status::False, reasons::NOT_YET_VALID, format!("the certificate in Secret {secret_name} is valid only from {not_before}")),
            Some(CertificateVerdict::Invalid(message)) => c.set(types::CERTIFICATE_READY, Status::False, reasons::INVALID_CERTIFICATE, format!("Secret {secret_name}: {message}")),
        }
    } else {
        c.set(
            types::CERTIFICATE_READY,
            Status::True,
            reasons::NOT_APPLICABLE,
            "no http exposes",
        );
    }

    // Node and key before the Deployment (see the egress controller: a pod started before its
    // auth Secret exists waits a minute for an interactive login).
    // The agent is only deployed (and so a pre-auth key only minted) without problems.
    let deployable = problems.is_empty();
    let observed =
        agent::observe_node(ctx, ingress, &access, &owner, &tag, deployable, &mut c).await?;
    if let Some(n) = &observed.node {
        status.node_id = Some(n.id.to_string());
        status.tailnet_ips = n.ip_addresses.clone();
    }

    // Render and apply the agent (only when every backend resolved: the last good config
    // stays applied otherwise).
    let render_ctx = RenderContext {
        operator_namespace: &ctx.config.operator_namespace,
        tailnet_name: &tailnet_name,
        tailnet: &tailnet.spec,
        images: Images::resolve(&ctx.config.images, tailnet.spec.agent.as_ref()),
        cluster_domain: &ctx.config.cluster_domain,
    };
    let deployment;
    if problems.is_empty() {
        let objects = render_ingress::render(
            ingress,
            &render_ctx,
            &IngressInputs {
                names: names.clone(),
                backend_ports,
                serve_http,
            },
        )?;
        agent::apply_basics(
            ctx,
            &namespace,
            agent::AgentBasics {
                service_account: &objects.service_account,
                role: &objects.role,
                role_binding: &objects.role_binding,
                state_secret: &objects.state_secret,
                config_map: &objects.config_map,
                network_policy: &objects.network_policy,
            },
        )
        .await?;
        if let Some(cert) = &objects.certificate {
            let value =
                serde_json::to_value(cert).map_err(|e| ReconcileError::HeadscaleUnusable {
                    action: "serialize Certificate".into(),
                    reason: "Serialize".into(),
                    message: e.to_string(),
                })?;
            let certs = certificate_api(ctx, &namespace);
            let cert_name = cert.metadata.name.clone().unwrap_or_default();
            // Not watched (cert-manager may not even be installed): skipped while unchanged
            // and younger than the re-apply interval, like the other unwatched children.
            let child = ChildRef {
                kind: "Certificate".to_string(),
                namespace: namespace.clone(),
                name: cert_name.clone(),
            };
            let fingerprint = applied::fingerprint(&value).ok();
            let unchanged = fingerprint.as_ref().is_some_and(|f| {
                ctx.applied.decide(&child, f, Live::Unwatched) == Decision::Unchanged
            });
            if !unchanged {
                match certs
                    .patch(
                        &cert_name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&value),
                    )
                    .await
                {
                    Ok(applied) => {
                        if let Some(f) = fingerprint {
                            ctx.applied
                                .record(child, f, applied.metadata.resource_version);
                        }
                    }
                    Err(e) => {
                        c.set(types::CERTIFICATE_READY, Status::False, reasons::CERTIFICATE_NOT_CREATED, format!("creating the cert-manager Certificate failed (is cert-manager installed?): {e}"));
                    }
                }
            }
        }
        deployment = Some(agent::apply_deployment(ctx, &namespace, &objects.deployment).await?);
        status.hostnames = objects.hostnames.clone();
    } else {
        deployment = super::from_cache_or_get(
            &ctx.caches.deployments,
            &Api::<Deployment>::namespaced(ctx.client.clone(), &namespace),
            &ObjectRef::new(&owner.names().base).within(&namespace),
        )
        .await
        .map_err(ReconcileError::kube("get Deployment"))?;
    }
    let (agent_ready, agent_message) = agent::deployment_state(deployment.as_ref());
    c.set(
        types::AGENT_READY,
        Status::from_bool(agent_ready),
        if agent_ready {
            reasons::READY
        } else {
            reasons::AGENT_NOT_READY
        },
        agent_message,
    );

    // Exposes, URLs.
    status.exposes = names
        .iter()
        .map(|n| {
            let (state, message) = match n.mode {
                ExposeMode::Http if !serve_http => (
                    reasons::NOT_SERVED.to_string(),
                    "waiting for a certificate covering every name (see CertificateReady)"
                        .to_string(),
                ),
                _ => (reasons::READY.to_string(), String::new()),
            };
            ExposeStatus {
                name: n.expose.clone(),
                hostnames: n.hostnames.clone(),
                state: Some(state),
                message: (!message.is_empty()).then_some(message),
            }
        })
        .collect();
    status.urls = names
        .iter()
        .flat_map(|n| {
            n.hostnames.iter().map(move |h| match (n.mode, n.port) {
                (ExposeMode::Http, 443) => format!("https://{h}/"),
                (ExposeMode::Http, p) => format!("https://{h}:{p}/"),
                (ExposeMode::Tcp, p) => format!("tcp://{h}:{p}"),
            })
        })
        .collect();
    status.urls.sort();
    status.urls.dedup();

    // Grants.
    let resource_key = format!("TailnetIngress/{namespace}/{name}");
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
    let blocked = allowed.is_empty().then_some((
        reasons::SOURCE_NOT_ALLOWED,
        "no grant is generated: every allowFrom entry is outside the allowlist (see SourcesAllowed)",
    ));
    agent::policy_effective(&mut c, tailnet, &resource_key, &live, blocked);

    let first = status.hostnames.first().cloned().unwrap_or_default();
    status.summary = Some(match status.hostnames.len() {
        0 => "no hostnames".to_string(),
        1 => first,
        n => format!("{first} (+{})", n - 1),
    });
    let report = agent::agent_status(ctx, &owner).await;
    agent::reachability(
        &mut c,
        types::BACKENDS_REACHABLE,
        report.as_ref().map(|r| r.backends.as_slice()),
    );
    let required = agent::required_with_observed(&c, &REQUIRED, &[types::BACKENDS_REACHABLE]);
    status.conditions = c.finish(&required);
    agent::publish_ready_transition(ctx, ingress, &previous.conditions, &status.conditions).await;
    agent::write_status_if_changed(
        &api,
        &ingress.name_any(),
        "TailnetIngress",
        &previous,
        status,
        |s| &mut s.conditions,
    )
    .await?;
    Ok(poll)
}

async fn cleanup(ingress: &TailnetIngress, ctx: &Context) -> Result<Action, ReconcileError> {
    let (namespace, name) = (ingress.namespace().unwrap_or_default(), ingress.name_any());
    agent::cleanup(
        ctx,
        ingress,
        AgentKind::Ingress,
        &ingress.spec.tailnet_ref.name,
        |t| ingress_tag(&t.spec.policy.tag_prefix, &namespace, &name),
    )
    .await
}
