//! A Gateway as the Tailnet's policy and DNS read an entrance (pure): the claim of kind
//! `Gateway` (its tag, policy owner key `Gateway/<namespace>/<name>`), one `tcp` expose per
//! listener port (the grant's ports), the class parameters' `allowFrom` (the grant's sources)
//! and, as its names, the listeners' precise hostnames (DNS records like ingress names;
//! wildcards have no record).

use tailnet_api::agent_config::{ConnectionLimits, is_dns_name};
use tailnet_api::ingress::ExposeMode;
use tailnet_api::naming::AgentKind;
use tailnet_api::validate::{
    BackendPort, ExposeNames, ValidBackend, ValidExpose, ValidIngress, ValidTimeouts,
};
use tailnet_gateway_api::Gateway;

use crate::intent::{Claim, IngressIntent};

/// The intent of `gateway` in Tailnet `tailnet` with its class's `allow_from`.
pub fn gateway_intent(gateway: &Gateway, tailnet: &str, allow_from: &[String]) -> IngressIntent {
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
    let mut allow_from = allow_from.to_vec();
    allow_from.sort();
    allow_from.dedup();
    IngressIntent {
        claim,
        spec: Ok(ValidIngress {
            allow_from,
            tls_secret_name: None,
            exposes,
            limits: ConnectionLimits::default(),
            in_cluster_namespaces: Vec::new(),
        }),
        names: Ok(names),
        in_cluster: false,
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
        let intent = gateway_intent(
            &gateway,
            "demo",
            &[
                "group:b".to_string(),
                "group:a".to_string(),
                "group:a".to_string(),
            ],
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
    }
}
