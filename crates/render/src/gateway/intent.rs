//! A Gateway as the Tailnet's policy and DNS read an entrance (pure): the claim of kind
//! `Gateway` (its tag, policy owner key `Gateway/<namespace>/<name>`), one `tcp` expose per
//! listener port (the grant's ports), the class parameters' `allowFrom` (the grant's sources)
//! and, as its names, the listeners' precise hostnames (DNS records like ingress names;
//! wildcards have no record).

use tailnet_api::agent_config::{ADMIN_PORT, ConnectionLimits, is_dns_name};
use tailnet_api::gateway_parameters::GatewayParameters;
use tailnet_api::ingress::ExposeMode;
use tailnet_api::naming::AgentKind;
use tailnet_api::validate::{
    BackendPort, ExposeNames, ValidBackend, ValidExpose, ValidIngress, ValidTimeouts,
};
use tailnet_gateway_api::Gateway;

use crate::intent::{Claim, IngressIntent};

/// The namespaces whose pods reach `gateway` in-cluster: its class's (`class_namespaces`),
/// unless a listener uses the agent's admin port, which the agent also binds on the pod IP
/// (then none, and `Err` says why for the Gateway's status).
pub fn in_cluster_namespaces<'a>(
    gateway: &Gateway,
    class_namespaces: &'a [String],
) -> Result<&'a [String], String> {
    let admin = gateway
        .spec
        .listeners
        .iter()
        .find(|l| l.port == i32::from(ADMIN_PORT));
    match admin {
        Some(listener) if !class_namespaces.is_empty() => Err(format!(
            "listener {} uses port {ADMIN_PORT}, the agent's admin port on the pod IP: no in-cluster entrance for this Gateway (its class lists inCluster namespaces); use another port",
            listener.name
        )),
        _ => Ok(class_namespaces),
    }
}

/// The intent of `gateway` in Tailnet `tailnet` with its class's parameters (`allowFrom`,
/// the in-cluster namespaces: then its names resolve in-cluster to its in-cluster Service).
pub fn gateway_intent(
    gateway: &Gateway,
    tailnet: &str,
    parameters: &GatewayParameters,
) -> IngressIntent {
    let meta = &gateway.metadata;
    let claim = Claim {
        kind: AgentKind::Gateway,
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        tailnet: tailnet.to_string(),
        recorded_tag: None,
    };
    let mut exposes = Vec::new();
    let mut names = Vec::new();
    for listener in &gateway.spec.listeners {
        let Ok(port) = u16::try_from(listener.port) else {
            continue;
        };
        if port == 0 {
            continue;
        }
        exposes.push(ValidExpose {
            name: listener.name.clone(),
            dns_label: String::new(),
            alias: false,
            mode: ExposeMode::Tcp,
            port,
            // Not dialled: the grant and the names read only the port.
            backend: ValidBackend {
                service: String::new(),
                namespace: None,
                port: BackendPort::Number(port),
                tls: None,
            },
            timeouts: ValidTimeouts::default(),
        });
        let hostnames: Vec<String> = listener
            .hostname
            .iter()
            .filter(|h| !h.starts_with('*') && is_dns_name(h))
            .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
            .collect();
        names.push(ExposeNames {
            expose: listener.name.clone(),
            mode: ExposeMode::Tcp,
            port,
            hostnames,
        });
    }
    let in_cluster = in_cluster_namespaces(gateway, &parameters.in_cluster_namespaces)
        .unwrap_or_default()
        .to_vec();
    let listed = !in_cluster.is_empty();
    let mut allow_from = parameters.allow_from.clone();
    allow_from.sort();
    allow_from.dedup();
    IngressIntent {
        claim,
        spec: Ok(ValidIngress {
            allow_from,
            tls_secret_name: None,
            exposes,
            limits: ConnectionLimits::default(),
            in_cluster_namespaces: in_cluster,
        }),
        names: Ok(names),
        in_cluster: listed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_ports_and_precise_hostnames_are_the_entrance() {
        let gateway: Gateway = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "web", "namespace": "infra"},
            "spec": {"gatewayClassName": "tailnet", "listeners": [
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "App.Example.com"},
                {"name": "wild", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com"},
                {"name": "db", "port": 5432, "protocol": "TCP"},
                {"name": "bad", "port": 70000, "protocol": "TCP"},
            ]},
        }))
        .expect("gateway");
        let parameters = GatewayParameters {
            tailnet: None,
            allow_from: vec!["group:b".into(), "group:a".into(), "group:a".into()],
            in_cluster_namespaces: Vec::new(),
        };
        let intent = gateway_intent(&gateway, "demo", &parameters);
        assert!(
            !intent.in_cluster,
            "no in-cluster namespaces: not in the cluster's records"
        );
        assert_eq!(intent.claim.owner(), "Gateway/infra/web");
        assert_eq!(intent.claim.tailnet, "demo");
        let spec = intent.spec.expect("valid");
        assert_eq!(spec.allow_from, ["group:a", "group:b"]);
        let ports: Vec<u16> = spec.exposes.iter().map(|e| e.port).collect();
        assert_eq!(ports, [443, 443, 5432]);
        let names: Vec<Vec<String>> = intent
            .names
            .expect("names")
            .into_iter()
            .map(|n| n.hostnames)
            .collect();
        assert_eq!(
            names,
            vec![vec!["app.example.com".to_string()], vec![], vec![]]
        );
        let in_cluster = GatewayParameters {
            in_cluster_namespaces: vec!["team-a".into()],
            ..parameters
        };
        let intent = gateway_intent(&gateway, "demo", &in_cluster);
        assert!(intent.in_cluster);
        assert_eq!(
            intent.spec.expect("valid").in_cluster_namespaces,
            ["team-a"]
        );
    }

    /// The agent binds its admin port on the pod IP: a Gateway with a listener on it gets no
    /// in-cluster entrance (said why), and is not in the cluster's records.
    #[test]
    fn a_listener_on_the_admin_port_rules_out_the_in_cluster_entrance() {
        let gateway: Gateway = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "web", "namespace": "infra"},
            "spec": {"gatewayClassName": "tailnet", "listeners": [
                {"name": "odd", "port": ADMIN_PORT, "protocol": "TCP"},
            ]},
        }))
        .expect("gateway");
        let listed = vec!["team-a".to_string()];
        let why = in_cluster_namespaces(&gateway, &listed).expect_err("admin port");
        assert!(
            why.contains("listener odd") && why.contains("9180"),
            "{why}"
        );
        assert_eq!(in_cluster_namespaces(&gateway, &[]), Ok(&[][..]));
        let parameters = GatewayParameters {
            tailnet: None,
            allow_from: Vec::new(),
            in_cluster_namespaces: listed,
        };
        assert!(!gateway_intent(&gateway, "demo", &parameters).in_cluster);
    }
}
