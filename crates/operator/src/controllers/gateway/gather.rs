//! The Gateway's own gather step (I/O): its class and parameters, the routes and
//! ReferenceGrants of the watched namespaces, namespace labels (only for listeners that
//! select namespaces), the certificate Secrets its listeners name (parsed; their key pairs
//! kept for the agent's copy and never logged) and the backend Services its routes name.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use kube::api::ListParams;
use kube::{Api, Resource, ResourceExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::de::DeserializeOwned;
use tailnet_gateway_api::{
    BackendRef, Gateway, GatewayClass, HTTPRoute, ParentReference, ReferenceGrant, TCPRoute,
    TLSRoute, from_namespaces, kinds,
};
use tailnet_render::backends::{ObjectKey, ObservedBackends};
use tailnet_render::gateway::objects::KeyPair;
use tailnet_render::gateway::routes::references_gateway;
use tailnet_render::gateway::{ClusterFacts, SecretFact};

use super::super::agent::kind::GatherInput;
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::gateway_class::class_verdict;
use super::super::gateway_class::decide::ours;
use super::super::kube_io::get_opt_cached;
use super::observation::{ClassState, GatewayObserved};
use crate::runtime::caches::{api_in, scope_parts};

/// The Gateway's class, or `None` when it does not exist.
pub async fn class_of(
    ctx: &Context,
    gateway: &Gateway,
) -> Result<Option<GatewayClass>, ReconcileError> {
    let api: Api<GatewayClass> = Api::all(ctx.client.clone());
    get_opt_cached(&api, &gateway.spec.gateway_class_name)
        .await
        .map_err(ReconcileError::kube("get GatewayClass"))
}

/// The class as this operator sees it.
pub async fn class_state(ctx: &Context, gateway: &Gateway) -> Result<ClassState, ReconcileError> {
    match class_of(ctx, gateway).await? {
        Some(class) if ours(&class) => Ok(ClassState::Ours(class_verdict(ctx, &class).await?)),
        _ => Ok(ClassState::NotOurs),
    }
}

pub async fn gather(
    ctx: &Context,
    gateway: &Gateway,
    input: GatherInput<'_>,
) -> Result<GatewayObserved, ReconcileError> {
    let class = class_state(ctx, gateway).await?;
    let others = ctx.kinds.objects::<Gateway>();
    let http_routes: Vec<HTTPRoute> = list_scoped(ctx, "list HTTPRoutes").await?;
    let tls_routes: Vec<TLSRoute> = list_scoped(ctx, "list TLSRoutes").await?;
    let tcp_routes: Vec<TCPRoute> = list_scoped(ctx, "list TCPRoutes").await?;
    let reference_grants: Vec<ReferenceGrant> = list_scoped(ctx, "list ReferenceGrants").await?;
    let mut facts = ClusterFacts::default();
    let mut key_pairs = BTreeMap::new();
    certificates(ctx, gateway, &mut facts, &mut key_pairs).await?;
    let namespace = gateway.namespace().unwrap_or_default();
    let name = gateway.name_any();
    let names_us = |route_namespace: &str, parents: &[ParentReference]| {
        parents
            .iter()
            .any(|p| references_gateway(p, route_namespace, &namespace, &name))
    };
    let mut wanted: BTreeSet<ObjectKey> = BTreeSet::new();
    let mut route_namespaces: BTreeSet<String> = BTreeSet::new();
    let mut want = |meta: &kube::api::ObjectMeta, refs: Vec<&BackendRef>| {
        let route_namespace = meta.namespace.clone().unwrap_or_default();
        for r in refs {
            if r.group.as_deref().unwrap_or_default().is_empty()
                && r.kind.as_deref().unwrap_or(kinds::SERVICE) == kinds::SERVICE
            {
                let ns = r
                    .namespace
                    .clone()
                    .unwrap_or_else(|| route_namespace.clone());
                wanted.insert(ObjectKey::new(ns, &r.name));
            }
        }
        route_namespaces.insert(route_namespace);
    };
    for r in http_routes
        .iter()
        .filter(|r| names_us(&r.namespace().unwrap_or_default(), &r.spec.parent_refs))
    {
        let refs = r
            .spec
            .rules
            .iter()
            .flat_map(|rule| rule.backend_refs.iter().map(|b| &b.backend_ref))
            .collect();
        want(&r.metadata, refs);
    }
    for r in tls_routes
        .iter()
        .filter(|r| names_us(&r.namespace().unwrap_or_default(), &r.spec.parent_refs))
    {
        want(
            &r.metadata,
            r.spec.rules.iter().flat_map(|x| &x.backend_refs).collect(),
        );
    }
    for r in tcp_routes
        .iter()
        .filter(|r| names_us(&r.namespace().unwrap_or_default(), &r.spec.parent_refs))
    {
        want(
            &r.metadata,
            r.spec.rules.iter().flat_map(|x| &x.backend_refs).collect(),
        );
    }
    let mut backends = ObservedBackends::default();
    for key in &wanted {
        if !ctx.config.scope.contains(&key.namespace) {
            continue;
        }
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &key.namespace);
        if let Some(service) = get_opt_cached(&api, &key.name)
            .await
            .map_err(ReconcileError::kube("get backend Service"))?
        {
            facts.services.insert(key.clone());
            if let Some(ports) = tailnet_render::gateway::headless_target_ports(&service) {
                facts.headless_target_ports.insert(key.clone(), ports);
            }
            backends.add_service(&service);
        }
    }
    if selects_namespaces(gateway) {
        facts.namespace_labels = namespace_labels(ctx, &route_namespaces).await;
    }
    super::super::reach::observe(ctx, &input.access.tailnet.spec.server, &mut backends).await;
    Ok(GatewayObserved {
        class,
        others,
        http_routes,
        tls_routes,
        tcp_routes,
        reference_grants,
        facts,
        key_pairs,
        backends,
    })
}

/// Every object of a kind in the watched namespaces (served from the apiserver's cache).
async fn list_scoped<K>(ctx: &Context, what: &'static str) -> Result<Vec<K>, ReconcileError>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned,
{
    let mut all = Vec::new();
    for part in scope_parts(&ctx.config.scope) {
        let api: Api<K> = api_in(&ctx.client, part.as_deref());
        let list = api
            .list(&ListParams::default().match_any())
            .await
            .map_err(ReconcileError::kube(what))?;
        all.extend(list.items);
    }
    Ok(all)
}

/// Whether a listener admits routes by namespace selector (then namespace labels matter).
fn selects_namespaces(gateway: &Gateway) -> bool {
    gateway.spec.listeners.iter().any(|l| {
        l.allowed_routes
            .as_ref()
            .and_then(|a| a.namespaces.as_ref())
            .and_then(|n| n.from.as_deref())
            == Some(from_namespaces::SELECTOR)
    })
}

/// The labels of the routes' namespaces (a namespace that cannot be read is left out: no
/// selector matches it).
async fn namespace_labels(
    ctx: &Context,
    namespaces: &BTreeSet<String>,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let mut labels = BTreeMap::new();
    for name in namespaces {
        match get_opt_cached(&api, name).await {
            Ok(Some(namespace)) => {
                labels.insert(name.clone(), namespace.labels().clone());
            }
            Ok(None) => {}
            Err(error) => tracing::debug!(%error, namespace = %name, "namespace labels not read"),
        }
    }
    labels
}

/// The Secrets the listeners' certificateRefs name (core Secrets only; other kinds are the
/// decision's to refuse), as facts, and the usable ones' key pairs.
async fn certificates(
    ctx: &Context,
    gateway: &Gateway,
    facts: &mut ClusterFacts,
    key_pairs: &mut BTreeMap<ObjectKey, KeyPair>,
) -> Result<(), ReconcileError> {
    let namespace = gateway.namespace().unwrap_or_default();
    let refs = gateway
        .spec
        .listeners
        .iter()
        .filter_map(|l| l.tls.as_ref())
        .flat_map(|tls| &tls.certificate_refs)
        .filter(|r| {
            r.group.as_deref().unwrap_or_default().is_empty()
                && r.kind.as_deref().unwrap_or(kinds::SECRET) == kinds::SECRET
        });
    let keys: BTreeSet<ObjectKey> = refs
        .map(|r| {
            ObjectKey::new(
                r.namespace.clone().unwrap_or_else(|| namespace.clone()),
                &r.name,
            )
        })
        .collect();
    for key in keys {
        if !ctx.config.scope.contains(&key.namespace) {
            continue;
        }
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &key.namespace);
        let Some(secret) = get_opt_cached(&api, &key.name)
            .await
            .map_err(ReconcileError::kube("get certificate Secret"))?
        else {
            continue;
        };
        match key_pair(&secret) {
            Ok(pair) => {
                facts.secrets.insert(key.clone(), SecretFact::TlsKeyPair);
                key_pairs.insert(key, pair);
            }
            Err(why) => {
                facts.secrets.insert(key, SecretFact::Unusable(why));
            }
        }
    }
    Ok(())
}

/// `tls.crt` (a PEM chain) and `tls.key` (a PEM private key) of a Secret, or why it cannot
/// serve TLS. The message never quotes the content.
pub fn key_pair(secret: &Secret) -> Result<KeyPair, String> {
    let data = secret.data.clone().unwrap_or_default();
    let certificate = data
        .get("tls.crt")
        .map(|b| b.0.clone())
        .ok_or_else(|| "it has no tls.crt".to_string())?;
    let key = data
        .get("tls.key")
        .map(|b| b.0.clone())
        .ok_or_else(|| "it has no tls.key".to_string())?;
    let chain: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(&certificate)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.crt is not a PEM certificate chain ({e})"))?;
    if chain.is_empty() {
        return Err("tls.crt holds no certificate".into());
    }
    PrivateKeyDer::from_pem_slice(&key)
        .map_err(|e| format!("tls.key is not a PEM private key ({e})"))?;
    Ok(KeyPair { certificate, key })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(entries: &[(&str, &[u8])]) -> Secret {
        Secret {
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn a_key_pair_needs_a_pem_chain_and_a_pem_key_and_errors_never_quote_them() {
        let issued =
            rcgen::generate_simple_self_signed(vec!["a.example.com".into()]).expect("certificate");
        let cert = issued.cert.pem();
        let key = issued.signing_key.serialize_pem();
        let pair = key_pair(&secret(&[
            ("tls.crt", cert.as_bytes()),
            ("tls.key", key.as_bytes()),
        ]))
        .expect("usable");
        assert_eq!(pair.certificate, cert.as_bytes());
        let cases: Vec<(Secret, &str)> = vec![
            (secret(&[("tls.key", key.as_bytes())]), "no tls.crt"),
            (secret(&[("tls.crt", cert.as_bytes())]), "no tls.key"),
            (
                secret(&[("tls.crt", b"garbage"), ("tls.key", key.as_bytes())]),
                "holds no certificate",
            ),
            (
                secret(&[("tls.crt", cert.as_bytes()), ("tls.key", b"SECRET-garbage")]),
                "not a PEM private key",
            ),
        ];
        for (s, wanted) in cases {
            let why = key_pair(&s).expect_err(wanted);
            assert!(why.contains(wanted), "{why}");
            assert!(!why.contains("SECRET") && !why.contains("BEGIN"), "{why}");
        }
    }
}
