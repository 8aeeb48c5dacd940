//! Backend resolution of an ingress, pure and shared by the controller and `render`: each
//! expose's `backend.port` must name a port of the backend Service (a number is a Service
//! `port`, a name a Service port's `name`), and `backend.tls.caConfigMapRef` must name a
//! ConfigMap key that exists. The caller gathers the observed objects (watch cache, or the
//! offline command's manifests and `--observed` file); this decides.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tailnet_api::validate::{BackendPort, ValidExpose};

/// `namespace/name` of an observed object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One port of an observed Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePortInfo {
    #[serde(default)]
    pub name: Option<String>,
    pub port: i32,
}

/// What the cluster holds that backend resolution looks at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedBackends {
    /// Ports of each observed Service; a Service that is not here does not exist.
    pub services: BTreeMap<ObjectKey, Vec<ServicePortInfo>>,
    /// Data keys of each observed ConfigMap (only CA ConfigMaps are needed).
    pub config_maps: BTreeMap<ObjectKey, BTreeSet<String>>,
    /// Where each observed Service's TCP ports lead (its selector and `targetPort`s, or, without
    /// a selector, the names its EndpointSlices' ports go by): what the egress NetworkPolicy
    /// of an agent admits ([`crate::reach`]).
    pub endpoints: BTreeMap<ObjectKey, ServiceEndpoints>,
    /// The EndpointSlices of each observed Service without a selector (hand-made endpoints),
    /// when they were read; a Service missing here had its slices not read.
    pub endpoint_slices: BTreeMap<ObjectKey, SliceEndpoints>,
    /// Addresses an agent's containers must reach besides its backends: the Kubernetes API's
    /// endpoints (tailscaled keeps its state in a Secret) and Headscale's (control and its
    /// embedded DERP). Observed by the operator; empty offline.
    pub control_plane: Vec<std::net::SocketAddr>,
}

/// Where a Service's TCP ports lead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceEndpoints {
    /// `spec.selector` (`None`: no selector, or an empty one: hand-made EndpointSlices).
    pub selector: Option<BTreeMap<String, String>>,
    /// `type: ExternalName`: the backend is a DNS name outside the cluster's objects.
    pub external_name: bool,
    /// The TCP ports, in the Service's order.
    pub tcp_ports: Vec<TcpServicePort>,
}

/// One TCP port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpServicePort {
    pub port: i32,
    pub name: Option<String>,
    /// `targetPort` (a number or a container port's name; the port itself without one).
    pub target: IntOrString,
}

/// The endpoints of a Service without a selector, from its EndpointSlices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceEndpoints {
    /// Every endpoint address (ready or not) of its IPv4/IPv6 slices.
    pub addresses: BTreeSet<IpAddr>,
    /// TCP port number by the slice port's name (`""` for an unnamed port, as kube-proxy
    /// matches them to the Service's port names).
    pub tcp_ports: BTreeMap<String, Vec<u16>>,
    /// A slice of `addressType: FQDN`: names no NetworkPolicy can hold.
    pub fqdn: bool,
}

impl SliceEndpoints {
    /// What the EndpointSlices of one Service say (those labelled
    /// `kubernetes.io/service-name` with its name).
    pub fn from_slices(slices: &[EndpointSlice]) -> Self {
        let mut found = SliceEndpoints::default();
        for slice in slices {
            if slice.address_type == "FQDN" {
                found.fqdn = true;
                continue;
            }
            found.addresses.extend(
                slice
                    .endpoints
                    .iter()
                    .flat_map(|e| e.addresses.iter())
                    .filter_map(|a| a.parse::<IpAddr>().ok()),
            );
            for port in slice.ports.iter().flatten() {
                if port.protocol.as_deref().unwrap_or("TCP") != "TCP" {
                    continue;
                }
                let Some(number) = port.port.and_then(|p| u16::try_from(p).ok()) else {
                    continue;
                };
                let numbers = found
                    .tcp_ports
                    .entry(port.name.clone().unwrap_or_default())
                    .or_default();
                if !numbers.contains(&number) {
                    numbers.push(number);
                }
            }
        }
        found
    }
}

impl ObservedBackends {
    /// Records a Service as the apiserver returns it.
    pub fn add_service(&mut self, service: &Service) {
        let key = ObjectKey::new(
            service.metadata.namespace.clone().unwrap_or_default(),
            service.metadata.name.clone().unwrap_or_default(),
        );
        let ports = service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .map(|ports| {
                ports
                    .iter()
                    .map(|p| ServicePortInfo {
                        name: p.name.clone(),
                        port: p.port,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let spec = service.spec.as_ref();
        let tcp_ports = spec
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
            .map(|p| TcpServicePort {
                port: p.port,
                name: p.name.clone(),
                target: p.target_port.clone().unwrap_or(IntOrString::Int(p.port)),
            })
            .collect();
        self.endpoints.insert(
            key.clone(),
            ServiceEndpoints {
                selector: spec
                    .and_then(|s| s.selector.clone())
                    .filter(|s| !s.is_empty()),
                external_name: spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName"),
                tcp_ports,
            },
        );
        self.services.insert(key, ports);
    }

    /// The observed Services whose endpoints are hand-made (no selector, not `ExternalName`):
    /// their EndpointSlices are read for [`ObservedBackends::add_endpoint_slices`].
    pub fn without_selector(&self) -> Vec<ObjectKey> {
        self.endpoints
            .iter()
            .filter(|(_, e)| e.selector.is_none() && !e.external_name)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Records the EndpointSlices of the Service `service` (see [`SliceEndpoints`]).
    pub fn add_endpoint_slices(&mut self, service: ObjectKey, slices: &[EndpointSlice]) {
        self.endpoint_slices
            .insert(service, SliceEndpoints::from_slices(slices));
    }

    /// Records a ConfigMap's keys (`data` and `binaryData`).
    pub fn add_config_map(&mut self, config_map: &ConfigMap) {
        let key = ObjectKey::new(
            config_map.metadata.namespace.clone().unwrap_or_default(),
            config_map.metadata.name.clone().unwrap_or_default(),
        );
        let keys = config_map
            .data
            .iter()
            .flat_map(|d| d.keys().cloned())
            .chain(
                config_map
                    .binary_data
                    .iter()
                    .flat_map(|d| d.keys().cloned()),
            )
            .collect();
        self.config_maps.insert(key, keys);
    }
}

/// The objects an ingress in `namespace` needs observed: the gather step fetches these.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendObjects {
    pub services: BTreeSet<ObjectKey>,
    pub config_maps: BTreeSet<ObjectKey>,
}

/// Which Services and CA ConfigMaps the exposes of an ingress in `namespace` refer to.
pub fn referenced(namespace: &str, exposes: &[ValidExpose]) -> BackendObjects {
    let mut wanted = BackendObjects::default();
    for expose in exposes {
        let backend = &expose.backend;
        wanted.services.insert(ObjectKey::new(
            backend.namespace_or(namespace),
            &backend.service,
        ));
        if let Some(tls) = &backend.tls {
            wanted
                .config_maps
                .insert(ObjectKey::new(namespace, &tls.ca_config_map_ref.name));
        }
    }
    wanted
}

/// Why a backend cannot be served. The messages are the `BackendsResolved` condition's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendProblem {
    #[error("exposes[{expose}]: {}", self.message())]
    ServiceMissing {
        expose: String,
        service: ObjectKey,
        /// The port the expose asks for (for hints).
        port: BackendPort,
    },
    #[error("exposes[{expose}]: {}", self.message())]
    PortMissing {
        expose: String,
        service: ObjectKey,
        port: BackendPort,
    },
    #[error("exposes[{expose}]: {}", self.message())]
    CaMissing {
        expose: String,
        config_map: ObjectKey,
        key: String,
    },
}

impl BackendProblem {
    /// The spec field to fix, e.g. `spec.exposes[web].backend.port`.
    pub fn field(&self) -> String {
        match self {
            BackendProblem::ServiceMissing { expose, .. } => {
                format!("spec.exposes[{expose}].backend.service")
            }
            BackendProblem::PortMissing { expose, .. } => {
                format!("spec.exposes[{expose}].backend.port")
            }
            BackendProblem::CaMissing { expose, .. } => {
                format!("spec.exposes[{expose}].backend.tls.caConfigMapRef")
            }
        }
    }

    /// What is missing, without the expose (for messages that name the field instead).
    pub fn message(&self) -> String {
        match self {
            BackendProblem::ServiceMissing { service, .. } => {
                format!("Service {service} does not exist")
            }
            BackendProblem::PortMissing { service, port, .. } => {
                format!("Service {service} has no port {port}")
            }
            BackendProblem::CaMissing {
                config_map, key, ..
            } => format!(
                "ConfigMap {config_map} with key {key:?} (backend.tls.caConfigMapRef) does not exist"
            ),
        }
    }
}

/// The outcome of resolving every expose's backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvedBackends {
    /// The Service port number per expose name (only exposes whose port resolved).
    pub ports: BTreeMap<String, u16>,
    /// In expose order; empty when every backend resolved.
    pub problems: Vec<BackendProblem>,
}

/// Resolves the backends of an ingress in `namespace` against what is observed. CA
/// ConfigMaps are looked up in the ingress's namespace: the agent runs there and mounts them.
pub fn resolve(
    namespace: &str,
    exposes: &[ValidExpose],
    observed: &ObservedBackends,
) -> ResolvedBackends {
    let mut resolved = ResolvedBackends::default();
    for expose in exposes {
        let backend = &expose.backend;
        let service = ObjectKey::new(backend.namespace_or(namespace), &backend.service);
        match observed.services.get(&service) {
            None => resolved.problems.push(BackendProblem::ServiceMissing {
                expose: expose.name.clone(),
                service,
                port: backend.port.clone(),
            }),
            Some(ports) => {
                let found = ports.iter().find(|p| match &backend.port {
                    BackendPort::Number(n) => p.port == i32::from(*n),
                    BackendPort::Name(name) => p.name.as_deref() == Some(name.as_str()),
                });
                match found.and_then(|p| u16::try_from(p.port).ok()) {
                    Some(port) => {
                        resolved.ports.insert(expose.name.clone(), port);
                    }
                    None => resolved.problems.push(BackendProblem::PortMissing {
                        expose: expose.name.clone(),
                        service,
                        port: backend.port.clone(),
                    }),
                }
            }
        }
        if let Some(tls) = &backend.tls {
            let cm = &tls.ca_config_map_ref;
            let config_map = ObjectKey::new(namespace, &cm.name);
            let has_key = observed
                .config_maps
                .get(&config_map)
                .is_some_and(|keys| keys.contains(&cm.key));
            if !has_key {
                resolved.problems.push(BackendProblem::CaMissing {
                    expose: expose.name.clone(),
                    config_map,
                    key: cm.key.clone(),
                });
            }
        }
    }
    resolved
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use tailnet_api::TailnetIngressSpec;
    use tailnet_api::validate::valid_ingress;

    /// The exposes of an ingress from YAML (validated like the controller does).
    fn exposes(yaml: &str) -> Vec<ValidExpose> {
        let spec: TailnetIngressSpec = serde_yaml::from_str(&format!(
            "tailnetRef: {{name: demo}}\nallowFrom: [\"group:team-a\"]\nexposes:\n{yaml}"
        ))
        .expect("fixture");
        valid_ingress(&spec).expect("valid fixture").exposes
    }

    fn key(namespace: &str, name: &str) -> ObjectKey {
        ObjectKey::new(namespace, name)
    }

    fn port(name: Option<&str>, port: i32) -> ServicePortInfo {
        ServicePortInfo {
            name: name.map(str::to_string),
            port,
        }
    }

    fn observed() -> ObservedBackends {
        ObservedBackends {
            services: BTreeMap::from([
                (
                    key("team-a", "frontend"),
                    vec![port(Some("http"), 8080), port(Some("metrics"), 9090)],
                ),
                (key("team-a", "unnamed"), vec![port(None, 80)]),
                (key("other", "shared"), vec![port(Some("https"), 8443)]),
            ]),
            config_maps: BTreeMap::from([(
                key("team-a", "backend-ca"),
                BTreeSet::from(["ca.crt".to_string()]),
            )]),
            ..ObservedBackends::default()
        }
    }

    const WEB: &str = "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: frontend, port: 8080}}\n";

    #[test]
    fn resolves_numbered_and_named_ports_against_the_service() {
        let table: Vec<(&str, &str, u16)> = vec![
            ("number", WEB, 8080),
            (
                "name",
                "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: frontend, port: metrics}}\n",
                9090,
            ),
            (
                "unnamed port by number",
                "  - {name: web, dnsLabel: web, mode: tcp, port: 80, backend: {service: unnamed, port: 80}}\n",
                80,
            ),
            (
                "other namespace",
                "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: shared, namespace: other, port: https}}\n",
                8443,
            ),
            (
                "CA key present",
                "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: frontend, port: http, tls: {serverName: frontend.team-a.svc, caConfigMapRef: {name: backend-ca, key: ca.crt}}}}\n",
                8080,
            ),
        ];
        for (case, yaml, expected) in table {
            let resolved = resolve("team-a", &exposes(yaml), &observed());
            assert_eq!(resolved.problems, vec![], "{case}");
            assert_eq!(
                resolved.ports,
                BTreeMap::from([("web".to_string(), expected)]),
                "{case}"
            );
        }
    }

    #[test]
    fn every_problem_names_the_expose_and_what_is_missing() {
        let table: Vec<(&str, &str, &str, &str)> = vec![
            (
                "missing Service",
                "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: nothing, port: 8080}}\n",
                "exposes[web]: Service team-a/nothing does not exist",
                "spec.exposes[web].backend.service",
            ),
            (
                "Service looked up in backend.namespace",
                "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: frontend, namespace: other, port: 8080}}\n",
                "exposes[web]: Service other/frontend does not exist",
                "spec.exposes[web].backend.service",
            ),
            (
                "no such port number (a targetPort does not count)",
                "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: frontend, port: 8081}}\n",
                "exposes[web]: Service team-a/frontend has no port 8081",
                "spec.exposes[web].backend.port",
            ),
            (
                "no such port name",
                "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: frontend, port: grpc}}\n",
                "exposes[web]: Service team-a/frontend has no port named \"grpc\"",
                "spec.exposes[web].backend.port",
            ),
            (
                "missing CA ConfigMap",
                "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: frontend, port: 8080, tls: {serverName: x.team-a.svc, caConfigMapRef: {name: other-ca, key: ca.crt}}}}\n",
                "exposes[web]: ConfigMap team-a/other-ca with key \"ca.crt\" (backend.tls.caConfigMapRef) does not exist",
                "spec.exposes[web].backend.tls.caConfigMapRef",
            ),
            (
                "missing CA key",
                "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: frontend, port: 8080, tls: {serverName: x.team-a.svc, caConfigMapRef: {name: backend-ca, key: root.pem}}}}\n",
                "exposes[web]: ConfigMap team-a/backend-ca with key \"root.pem\" (backend.tls.caConfigMapRef) does not exist",
                "spec.exposes[web].backend.tls.caConfigMapRef",
            ),
        ];
        for (case, yaml, message, field) in table {
            let resolved = resolve("team-a", &exposes(yaml), &observed());
            let problems: Vec<(String, String)> = resolved
                .problems
                .iter()
                .map(|p| (p.to_string(), p.field()))
                .collect();
            assert_eq!(
                problems,
                vec![(message.to_string(), field.to_string())],
                "{case}"
            );
            let prefix = "exposes[web]: ";
            assert_eq!(
                format!("{prefix}{}", resolved.problems[0].message()),
                message,
                "{case}"
            );
        }
    }

    #[test]
    fn a_missing_ca_does_not_hide_the_resolved_port_and_problems_keep_expose_order() {
        let yaml = "  - {name: b, dnsLabel: b, mode: http, port: 443, backend: {service: gone, port: 1}}\n  - {name: a, dnsLabel: a, mode: http, port: 443, backend: {service: frontend, port: 8080, tls: {serverName: x.team-a.svc, caConfigMapRef: {name: nope, key: ca.crt}}}}\n";
        let resolved = resolve("team-a", &exposes(yaml), &observed());
        assert_eq!(resolved.ports, BTreeMap::from([("a".to_string(), 8080)]));
        let order: Vec<&str> = resolved
            .problems
            .iter()
            .map(|p| match p {
                BackendProblem::ServiceMissing { expose, .. }
                | BackendProblem::PortMissing { expose, .. }
                | BackendProblem::CaMissing { expose, .. } => expose.as_str(),
            })
            .collect();
        assert_eq!(order, vec!["b", "a"]);
    }

    #[test]
    fn referenced_lists_what_the_gather_step_fetches() {
        let yaml = "  - {name: a, dnsLabel: a, mode: http, port: 443, backend: {service: frontend, port: 8080, tls: {serverName: x.team-a.svc, caConfigMapRef: {name: backend-ca, key: ca.crt}}}}\n  - {name: b, dnsLabel: b, mode: tcp, port: 22, backend: {service: shared, namespace: other, port: 22}}\n";
        assert_eq!(
            referenced("team-a", &exposes(yaml)),
            BackendObjects {
                services: BTreeSet::from([key("other", "shared"), key("team-a", "frontend")]),
                config_maps: BTreeSet::from([key("team-a", "backend-ca")]),
            }
        );
    }

    #[test]
    fn observed_objects_are_recorded_as_the_apiserver_returns_them() {
        let service: Service = serde_yaml::from_str(
            "metadata: {name: frontend, namespace: team-a}\nspec: {ports: [{name: http, port: 8080, targetPort: 80}, {port: 9090}]}",
        )
        .expect("service");
        let config_map: ConfigMap = serde_yaml::from_str(
            "metadata: {name: backend-ca, namespace: team-a}\ndata: {ca.crt: x}\nbinaryData: {ca.der: eA==}",
        )
        .expect("config map");
        let mut observed = ObservedBackends::default();
        observed.add_service(&service);
        observed.add_config_map(&config_map);
        assert_eq!(
            observed.services[&key("team-a", "frontend")],
            vec![port(Some("http"), 8080), port(None, 9090)]
        );
        assert_eq!(
            observed.config_maps[&key("team-a", "backend-ca")],
            BTreeSet::from(["ca.crt".to_string(), "ca.der".to_string()])
        );
        assert_eq!(key("team-a", "frontend").to_string(), "team-a/frontend");
    }
}
