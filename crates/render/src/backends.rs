//! Backend resolution of an ingress, pure and shared by the controller and `render`: each
//! expose's `backend.port` must name a port of the backend Service (a number is a Service
//! `port`, a name a Service port's `name`), and `backend.tls.caConfigMapRef` must name a
//! ConfigMap key that exists. The caller gathers the observed objects (watch cache, or the
//! offline command's manifests and `--observed` file); this decides.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use tailnet_api::validate::{BackendPort, ValidExpose};

/// `namespace/name` of an observed object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
        self.services.insert(key, ports);
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
