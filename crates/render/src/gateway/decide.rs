//! [`decide_gateway`]: the Gateway's and its listeners' status, every route's status for this
//! parent, and the data plan.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tailnet_api::conditions::{Status, condition};
use tailnet_gateway_api::conditions::{gateway, route};
use tailnet_gateway_api::gateway::{GatewayStatus, GatewayStatusAddress};
use tailnet_gateway_api::{BackendRef, HTTPRoute, RouteParentStatus, address_types};

use super::http::{self, CompiledRoute};
use super::listeners::{ListenerVerdict, Protocol};
use super::plan::{
    BackendTarget, GatewayPlan, HttpEntry, HttpServe, ListenerPlan, ListenerServe, SniRoute,
    TcpForward, VirtualHost, WeightedBackend,
};
use super::routes::{self, RouteView};
use super::{CONTROLLER_NAME, GatewayDecision, GatewayInputs, Problem, RouteParents, hostnames};
use crate::backends::ObjectKey;

/// One route as this decision sees it.
struct RouteState<'a> {
    view: RouteView<'a>,
    /// Backend refs of all rules, in order, with their resolution.
    backends: Vec<(&'a BackendRef, Result<BackendTarget, Problem>)>,
    /// HTTPRoutes only.
    http: Option<(&'a HTTPRoute, CompiledRoute)>,
    /// Per parentRef naming this Gateway: the attached listeners or why none.
    attachments: Vec<(usize, Result<Vec<usize>, Problem>)>,
}

/// Decides everything for one Gateway (see the module documentation of [`super`]).
pub fn decide_gateway(inputs: &GatewayInputs<'_>) -> GatewayDecision {
    let gw = inputs.gateway;
    let namespace = gw.metadata.namespace.as_deref().unwrap_or_default();
    let name = gw.metadata.name.as_deref().unwrap_or_default();
    let generation = gw.metadata.generation;
    let listeners = super::listeners::evaluate(gw, inputs.reference_grants, inputs.facts);
    let accepted = gateway_accepted(inputs, &listeners);
    let programmed = gateway_programmed(inputs, accepted.is_ok());

    let mut states = route_states(inputs, namespace, name);
    for state in &mut states {
        attach_all(state, &listeners, namespace, inputs);
    }
    let mut attached = vec![0i32; listeners.len()];
    for state in &states {
        let mut on: BTreeSet<usize> = BTreeSet::new();
        for (_, result) in &state.attachments {
            on.extend(result.iter().flatten());
        }
        for i in on {
            attached[i] += 1;
        }
    }

    let gateway_programmed = programmed
        .as_ref()
        .map(|_| ())
        .map_err(|p| p.message.clone());
    let status = GatewayStatus {
        addresses: inputs
            .runtime
            .addresses
            .iter()
            .map(|ip| GatewayStatusAddress {
                type_: Some(address_types::IP_ADDRESS.to_string()),
                value: ip.to_string(),
            })
            .collect(),
        conditions: vec![
            gateway_condition(gateway::ACCEPTED, &accepted, generation),
            gateway_condition(gateway::PROGRAMMED, &programmed, generation),
        ],
        listeners: listeners
            .iter()
            .zip(&attached)
            .map(|(l, &n)| l.status(generation, n, &gateway_programmed))
            .collect(),
    };
    let plan = accepted.is_ok().then(|| build_plan(&listeners, &states));
    let routes = states.iter().map(route_parents).collect();
    GatewayDecision {
        status,
        routes,
        plan,
    }
}

type Verdict = Result<(&'static str, String), Problem>;

fn gateway_condition(type_: &str, verdict: &Verdict, generation: Option<i64>) -> Condition {
    match verdict {
        Ok((reason, message)) => {
            condition(type_, Status::True, reason, message.as_str(), generation)
        }
        Err(p) => condition(
            type_,
            Status::False,
            p.reason,
            p.message.as_str(),
            generation,
        ),
    }
}

/// `Accepted`: the class must be Accepted, the Gateway's own parametersRef (unsupported) and
/// address types acceptable, and at least one listener Accepted (ListenersNotValid names the
/// others, with True while some are valid).
fn gateway_accepted(inputs: &GatewayInputs<'_>, listeners: &[ListenerVerdict]) -> Verdict {
    let spec = &inputs.gateway.spec;
    if let Err(why) = inputs.class_accepted {
        return Err(Problem::new(
            gateway::reasons::INVALID,
            format!(
                "GatewayClass {} is not Accepted: {why}",
                spec.gateway_class_name
            ),
        ));
    }
    if let Some(params) = spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        return Err(Problem::new(
            gateway::reasons::INVALID_PARAMETERS,
            format!(
                "spec.infrastructure.parametersRef ({}/{} {}) is not supported: parameters come from the GatewayClass",
                params.group, params.kind, params.name
            ),
        ));
    }
    for address in &spec.addresses {
        let kind = address
            .type_
            .as_deref()
            .unwrap_or(address_types::IP_ADDRESS);
        if kind != address_types::IP_ADDRESS {
            return Err(Problem::new(
                gateway::reasons::UNSUPPORTED_ADDRESS,
                format!(
                    "address type {kind} is not supported (a Gateway has its tailnet node's IP addresses)"
                ),
            ));
        }
    }
    let invalid: Vec<&str> = listeners
        .iter()
        .filter(|l| !l.accepted())
        .map(|l| l.name.as_str())
        .collect();
    if invalid.is_empty() {
        return Ok((
            gateway::reasons::ACCEPTED,
            "all listeners are valid".to_string(),
        ));
    }
    let message = format!("listeners not accepted: {}", invalid.join(", "));
    if invalid.len() == listeners.len() {
        Err(Problem::new(gateway::reasons::LISTENERS_NOT_VALID, message))
    } else {
        Ok((gateway::reasons::LISTENERS_NOT_VALID, message))
    }
}

/// `Programmed`: Accepted, the agent ready, addresses assigned, and every requested address
/// among them.
fn gateway_programmed(inputs: &GatewayInputs<'_>, accepted: bool) -> Verdict {
    let runtime = inputs.runtime;
    if !accepted {
        return Err(Problem::new(
            gateway::reasons::INVALID,
            "the Gateway is not Accepted",
        ));
    }
    if let Some(not_ready) = &runtime.not_ready {
        return Err(Problem::new(
            not_ready.reason.as_str(),
            not_ready.message.clone(),
        ));
    }
    if runtime.addresses.is_empty() {
        return Err(Problem::new(
            gateway::reasons::ADDRESS_NOT_ASSIGNED,
            "the Gateway's tailnet node has no address yet",
        ));
    }
    let assigned: Vec<String> = runtime.addresses.iter().map(ToString::to_string).collect();
    for wanted in inputs
        .gateway
        .spec
        .addresses
        .iter()
        .filter_map(|a| a.value.as_deref())
    {
        if !assigned.iter().any(|a| a == wanted) {
            return Err(Problem::new(
                gateway::reasons::ADDRESS_NOT_USABLE,
                format!(
                    "requested address {wanted} is not one of the tailnet node's ({})",
                    assigned.join(", ")
                ),
            ));
        }
    }
    Ok((
        gateway::reasons::PROGRAMMED,
        format!("served at {}", assigned.join(", ")),
    ))
}

/// Every route with a parentRef naming this Gateway, ordered by kind, namespace and name.
fn route_states<'a>(
    inputs: &GatewayInputs<'a>,
    namespace: &str,
    name: &str,
) -> Vec<RouteState<'a>> {
    let names_us = |view: &RouteView<'_>| {
        view.parent_refs
            .iter()
            .any(|p| routes::references_gateway(p, &view.id.namespace, namespace, name))
    };
    let resolve_all = |view: &RouteView<'_>, refs: Vec<&'a BackendRef>| {
        refs.into_iter()
            .map(|b| {
                let resolved =
                    routes::resolve_backend(b, view, inputs.reference_grants, inputs.facts);
                (b, resolved)
            })
            .collect::<Vec<_>>()
    };
    let mut states = Vec::new();
    for r in inputs.http_routes {
        let view = RouteView::http(r);
        if !names_us(&view) {
            continue;
        }
        let refs = r
            .spec
            .rules
            .iter()
            .flat_map(|rule| rule.backend_refs.iter().map(|b| &b.backend_ref))
            .collect();
        let resolve = |b: &BackendRef| {
            routes::target_or_invalid(&routes::resolve_backend(
                b,
                &view,
                inputs.reference_grants,
                inputs.facts,
            ))
        };
        let compiled = http::compile(r, &view, &resolve);
        states.push(RouteState {
            backends: resolve_all(&view, refs),
            http: Some((r, compiled)),
            view,
            attachments: Vec::new(),
        });
    }
    let others = inputs
        .tls_routes
        .iter()
        .map(|r| {
            (
                RouteView::tls(r),
                r.spec.rules.iter().flat_map(|x| &x.backend_refs).collect(),
            )
        })
        .chain(inputs.tcp_routes.iter().map(|r| {
            (
                RouteView::tcp(r),
                r.spec.rules.iter().flat_map(|x| &x.backend_refs).collect(),
            )
        }));
    for (view, refs) in others {
        if names_us(&view) {
            states.push(RouteState {
                backends: resolve_all(&view, refs),
                view,
                http: None,
                attachments: Vec::new(),
            });
        }
    }
    states.sort_by(|a, b| a.view.id.cmp(&b.view.id));
    states
}

/// Attaches each parentRef naming this Gateway; a route whose rules were all dropped is not
/// Accepted (it attaches nowhere).
fn attach_all(
    state: &mut RouteState<'_>,
    listeners: &[ListenerVerdict],
    namespace: &str,
    inputs: &GatewayInputs<'_>,
) {
    let gw_name = inputs.gateway.metadata.name.as_deref().unwrap_or_default();
    let all_dropped = state
        .http
        .as_ref()
        .and_then(|(_, c)| c.rules.is_empty().then(|| c.dropped.first()).flatten())
        .map(|(_, p)| p.clone());
    for (i, parent) in state.view.parent_refs.iter().enumerate() {
        if !routes::references_gateway(parent, &state.view.id.namespace, namespace, gw_name) {
            continue;
        }
        let mut result = routes::attach(&state.view, parent, listeners, namespace, inputs.facts);
        if let (Ok(_), Some(problem)) = (&result, &all_dropped) {
            result = Err(problem.clone());
        }
        state.attachments.push((i, result));
    }
}

/// The route's status entries for the parentRefs naming this Gateway.
fn route_parents(state: &RouteState<'_>) -> RouteParents {
    let generation = state.view.generation;
    let problems: Vec<&Problem> = state
        .backends
        .iter()
        .filter_map(|(_, resolved)| resolved.as_ref().err())
        .collect();
    let resolved = match problems.first() {
        None => condition(
            route::RESOLVED_REFS,
            Status::True,
            route::reasons::RESOLVED_REFS,
            "all backendRefs resolved",
            generation,
        ),
        Some(first) => condition(
            route::RESOLVED_REFS,
            Status::False,
            first.reason,
            problems
                .iter()
                .map(|p| p.message.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            generation,
        ),
    };
    let dropped = state
        .http
        .as_ref()
        .map(|(_, c)| c.dropped.as_slice())
        .unwrap_or_default();
    let parents = state
        .attachments
        .iter()
        .map(|(i, result)| {
            let mut conditions = vec![match result {
                Ok(_) => condition(
                    route::ACCEPTED,
                    Status::True,
                    route::reasons::ACCEPTED,
                    "accepted by the Gateway",
                    generation,
                ),
                Err(p) => condition(
                    route::ACCEPTED,
                    Status::False,
                    p.reason,
                    p.message.as_str(),
                    generation,
                ),
            }];
            conditions.push(resolved.clone());
            if result.is_ok() && !dropped.is_empty() {
                let list: Vec<String> = dropped
                    .iter()
                    .map(|(rule, p)| format!("rule {rule}: {}", p.message))
                    .collect();
                conditions.push(condition(
                    route::PARTIALLY_INVALID,
                    Status::True,
                    dropped[0].1.reason,
                    format!("Dropped Rule(s): {}", list.join("; ")),
                    generation,
                ));
            }
            RouteParentStatus {
                parent_ref: state.view.parent_refs[*i].clone(),
                controller_name: CONTROLLER_NAME.to_string(),
                conditions,
            }
        })
        .collect();
    RouteParents {
        route: state.view.id.clone(),
        parents,
    }
}

/// The listeners (indices) a route is attached to.
fn attached_to(state: &RouteState<'_>) -> BTreeSet<usize> {
    state
        .attachments
        .iter()
        .flat_map(|(_, r)| r.iter().flatten().copied())
        .collect()
}

fn build_plan(listeners: &[ListenerVerdict], states: &[RouteState<'_>]) -> GatewayPlan {
    let mut plans: Vec<ListenerPlan> = Vec::new();
    for (i, listener) in listeners.iter().enumerate() {
        let (Some(protocol), true) = (listener.protocol, listener.serves()) else {
            continue;
        };
        let Ok(port) = u16::try_from(listener.port) else {
            continue;
        };
        let on_listener: Vec<&RouteState<'_>> = states
            .iter()
            .filter(|s| attached_to(s).contains(&i) && s.view.id.kind == protocol.route_kinds()[0])
            .collect();
        let serve = match protocol {
            Protocol::Http => ListenerServe::Http(http_serve(listener, &on_listener)),
            Protocol::Https => ListenerServe::Https {
                certificates: listener.certificates.clone(),
                http: http_serve(listener, &on_listener),
            },
            Protocol::Tls => ListenerServe::TlsPassthrough {
                routes: sni_routes(listener, &on_listener),
            },
            Protocol::Tcp => ListenerServe::Tcp {
                route: tcp_forward(&on_listener),
            },
        };
        plans.push(ListenerPlan {
            name: listener.name.clone(),
            port,
            hostname: listener.hostname.clone(),
            serve,
        });
    }
    plans.sort_by(|a, b| {
        a.port
            .cmp(&b.port)
            .then_with(|| hostnames::by_precedence(a.hostname.as_deref(), b.hostname.as_deref()))
            .then_with(|| a.name.cmp(&b.name))
    });
    GatewayPlan { listeners: plans }
}

fn http_serve(listener: &ListenerVerdict, on_listener: &[&RouteState<'_>]) -> HttpServe {
    let mut serve = HttpServe::default();
    // hostname → (entry, route index in on_listener, rule index, match index)
    type Placed = (HttpEntry, usize, usize, usize);
    let mut hosts: BTreeMap<Option<String>, Vec<Placed>> = BTreeMap::new();
    for (r, state) in on_listener.iter().enumerate() {
        let Some((_, compiled)) = &state.http else {
            continue;
        };
        let names = hostnames::effective(listener.hostname.as_deref(), state.view.hostnames);
        for rule in &compiled.rules {
            let action = serve.actions.len();
            serve.actions.push(rule.action.clone());
            for (m, entry) in rule.entries.iter().enumerate() {
                let mut entry = entry.clone();
                entry.action = action;
                for name in &names {
                    hosts
                        .entry(name.clone())
                        .or_default()
                        .push((entry.clone(), r, rule.index, m));
                }
            }
        }
    }
    for (hostname, mut entries) in hosts {
        entries.sort_by(|a, b| {
            http::entry_precedence(
                (&a.0, &on_listener[a.1].view, a.2, a.3),
                (&b.0, &on_listener[b.1].view, b.2, b.3),
            )
        });
        serve.virtual_hosts.push(VirtualHost {
            hostname,
            entries: entries.into_iter().map(|e| e.0).collect(),
        });
    }
    serve
        .virtual_hosts
        .sort_by(|a, b| hostnames::by_precedence(a.hostname.as_deref(), b.hostname.as_deref()));
    serve
}

/// The TLS/TCP backends of a route with weight > 0, each its Service or Invalid.
fn weighted(state: &RouteState<'_>) -> Vec<WeightedBackend> {
    state
        .backends
        .iter()
        .filter(|(b, _)| routes::weight(b) > 0)
        .map(|(b, resolved)| WeightedBackend {
            weight: routes::weight(b),
            target: routes::target_or_invalid(resolved),
        })
        .collect()
}

fn object_key(view: &RouteView<'_>) -> ObjectKey {
    ObjectKey::new(&view.id.namespace, &view.id.name)
}

/// SNI routes, most specific hostname first; of two routes with the same hostname the older
/// one wins (both stay Accepted: the spec resolves such conflicts by age).
fn sni_routes(listener: &ListenerVerdict, on_listener: &[&RouteState<'_>]) -> Vec<SniRoute> {
    let mut candidates: Vec<(String, &RouteState<'_>)> = Vec::new();
    for state in on_listener {
        let names = hostnames::effective(listener.hostname.as_deref(), state.view.hostnames);
        for name in names.into_iter().flatten() {
            candidates.push((name, state));
        }
    }
    candidates.sort_by(|a, b| {
        hostnames::by_precedence(Some(&a.0), Some(&b.0))
            .then_with(|| a.1.view.age_key().cmp(&b.1.view.age_key()))
    });
    candidates.dedup_by(|later, earlier| later.0 == earlier.0);
    candidates
        .into_iter()
        .map(|(hostname, state)| SniRoute {
            hostname,
            route: object_key(&state.view),
            backends: weighted(state),
        })
        .collect()
}

/// The oldest attached TCPRoute (the spec: only the oldest binds; all stay Accepted).
fn tcp_forward(on_listener: &[&RouteState<'_>]) -> Option<TcpForward> {
    let oldest = on_listener
        .iter()
        .min_by(|a, b| a.view.age_key().cmp(&b.view.age_key()))?;
    Some(TcpForward {
        route: object_key(&oldest.view),
        backends: weighted(oldest),
    })
}
