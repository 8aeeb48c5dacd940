//! DNS entries of one Tailnet into `spec.dns.hostsConfigMap` (SPEC §5).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::api::ListParams;
use kube::{Api, Resource, ResourceExt};
use tailnet_api::conditions::{self, Status, reasons, types};
use tailnet_api::naming::{ingress_tag, labels};
use tailnet_api::{Tailnet, TailnetIngress, validate};
use tailnet_render::dns::{self, DnsEntry, DnsInputs, PendingName};

use super::super::ReconcileError;
use super::super::context::Context;
use super::HeadscaleState;

pub async fn sync(
    ctx: &Context,
    tailnet: &Tailnet,
    ingresses: &[TailnetIngress],
    state: &HeadscaleState,
    conditions_out: &mut Vec<Condition>,
    now: &Time,
) -> Result<(), ReconcileError> {
    let name = tailnet.name_any();
    let generation = tailnet.metadata.generation;
    let Some(cm_name) = tailnet
        .spec
        .dns
        .as_ref()
        .and_then(|d| d.hosts_config_map.clone())
    else {
        conditions::upsert(
            conditions_out,
            conditions::condition(
                types::DNS_RENDERED,
                Status::True,
                reasons::NOT_CONFIGURED,
                "spec.dns.hostsConfigMap is not set: no DNS entries are rendered",
                generation,
            ),
            now,
        );
        return Ok(());
    };
    let ns = &ctx.config.operator_namespace;
    let mut inputs = DnsInputs::default();

    // Egress aliases → ClusterIP of the target Service.
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!(
        "{}=TailnetEgress,{}={}",
        labels::OWNER_KIND,
        labels::TAILNET,
        name
    );
    let listed = services
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(ReconcileError::kube("list egress Services"))?;
    let cluster_ips: BTreeMap<String, String> = listed
        .items
        .iter()
        .filter_map(|s| Some((s.name_any(), s.spec.as_ref()?.cluster_ip.clone()?)))
        .collect();
    for egress in ctx.egresses.state() {
        if egress.spec.tailnet_ref.name != name
            || egress.namespace().as_deref() != Some(ns.as_str())
        {
            continue;
        }
        let owner = format!("TailnetEgress/{ns}/{}", egress.name_any());
        for target in &egress.spec.targets {
            for alias in &target.aliases {
                match cluster_ips.get(&target.name).and_then(|ip| ip.parse().ok()) {
                    Some(address) => inputs.egress_aliases.push(DnsEntry {
                        hostname: alias.clone(),
                        address,
                        owner: owner.clone(),
                    }),
                    None => inputs.pending.push(PendingName {
                        hostname: alias.clone(),
                        owner: owner.clone(),
                        reason: format!("Service {ns}/{} has no ClusterIP yet", target.name),
                    }),
                }
            }
        }
    }

    // Ingress names → the agent node's tailnet IPs.
    for ingress in ingresses {
        if ingress.spec.tailnet_ref.name != name {
            continue;
        }
        let namespace = ingress.namespace().unwrap_or_default();
        let Ok(names) =
            validate::ingress_in_context(&namespace, ns, &ingress.spec, &name, &tailnet.spec)
        else {
            continue;
        };
        let owner = format!("TailnetIngress/{namespace}/{}", ingress.name_any());
        let tag = ingress_tag(
            &tailnet.spec.policy.tag_prefix,
            &namespace,
            &ingress.name_any(),
        );
        let ips: Vec<_> = state
            .policy_nodes
            .iter()
            .filter(|n| n.tags.contains(&tag))
            .flat_map(|n| n.ip_addresses.clone())
            .collect();
        for hostname in names.iter().flat_map(|n| n.hostnames.clone()) {
            if ips.is_empty() {
                inputs.pending.push(PendingName {
                    hostname: hostname.clone(),
                    owner: owner.clone(),
                    reason: format!("no Headscale node tagged {tag} yet"),
                });
            }
            for address in &ips {
                inputs.ingress_names.push(DnsEntry {
                    hostname: hostname.clone(),
                    address: *address,
                    owner: owner.clone(),
                });
            }
        }
    }

    let rendered = dns::render(&inputs);
    // The ConfigMap may live where CoreDNS runs and may be shared with other keys (e.g.
    // kube-system/coredns): only our two keys are applied, and it is owned by the Tailnet
    // (garbage-collected with it) only if the operator created it.
    let cm_namespace = tailnet
        .spec
        .dns
        .as_ref()
        .and_then(|d| d.hosts_config_map_namespace.clone())
        .unwrap_or_else(|| ns.clone());
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &cm_namespace);
    let current = api
        .get_opt(&cm_name)
        .await
        .map_err(ReconcileError::kube(format!(
            "get ConfigMap {cm_namespace}/{cm_name}"
        )))?;
    let ours = current.as_ref().is_none_or(|c| {
        c.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == tailnet.metadata.uid.as_ref())
    });
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(cm_name.clone()),
            namespace: Some(cm_namespace.clone()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "tailnet-operator".to_string(),
                ),
                (labels::TAILNET.to_string(), name.clone()),
            ])),
            owner_references: if ours {
                tailnet.controller_owner_ref(&()).map(|o| vec![o])
            } else {
                None
            },
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (dns::HOSTS_KEY.to_string(), rendered.hosts.clone()),
            (
                dns::EXTRA_RECORDS_KEY.to_string(),
                rendered.extra_records_json.clone(),
            ),
        ])),
        ..ConfigMap::default()
    };
    // Only write on change of the keys we own.
    let keys = [dns::HOSTS_KEY, dns::EXTRA_RECORDS_KEY];
    let pick = |data: Option<&BTreeMap<String, String>>| {
        keys.map(|k| data.and_then(|d| d.get(k)).cloned())
    };
    if pick(current.as_ref().and_then(|c| c.data.as_ref())) != pick(cm.data.as_ref()) {
        super::super::apply(&api, &cm_name, &cm).await?;
    }
    let names = rendered
        .hosts
        .lines()
        .filter(|l| !l.starts_with('#'))
        .count();
    let mut message = format!("{names} entries in ConfigMap {cm_namespace}/{cm_name}");
    if !rendered.pending.is_empty() {
        message.push_str(&format!(
            "; {} pending: {}",
            rendered.pending.len(),
            rendered
                .pending
                .iter()
                .map(|p| format!("{} ({})", p.hostname, p.reason))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !rendered.conflicts.is_empty() {
        message.push_str(&format!(
            "; conflicting names kept by their first owner: {}",
            rendered
                .conflicts
                .iter()
                .map(|(h, _)| h.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    conditions::upsert(
        conditions_out,
        conditions::condition(
            types::DNS_RENDERED,
            Status::True,
            reasons::RENDERED,
            message,
            generation,
        ),
        now,
    );
    Ok(())
}
