//! Kubernetes-native entrance: a `Service` of `type: LoadBalancer` with
//! `loadBalancerClass: tailnet-operator.dev/tailnet` (SPEC §3). Pure: which Services are ours,
//! what their annotations say, and the TailnetIngress spec a Service is read as (one `tcp`
//! expose per TCP port, the Service itself as the backend), so that tags, grants, DNS, the
//! agent and the status vocabulary are the ingress ones.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::common::TailnetRef;
use crate::ingress::{Backend, Expose, ExposeMode, InCluster, TailnetIngressSpec};
use crate::validate::FieldError;

/// The `spec.loadBalancerClass` the operator implements.
pub const LOAD_BALANCER_CLASS: &str = "tailnet-operator.dev/tailnet";

/// Annotations a Service of [`LOAD_BALANCER_CLASS`] is configured with.
pub mod annotations {
    /// The Tailnet's name (default: the only Tailnet of the cluster).
    pub const TAILNET: &str = "tailnet-operator.dev/tailnet";
    /// Comma-separated policy principals allowed to connect (required; bounded by the
    /// Tailnet's `policy.ingressSourceAllowlist` as a TailnetIngress's `allowFrom`).
    pub const ALLOW_FROM: &str = "tailnet-operator.dev/allow-from";
    /// Fills `{name}` of the Tailnet's `ingressNameTemplate` (default: the Service's name).
    pub const DNS_LABEL: &str = "tailnet-operator.dev/dns-label";
    /// Comma-separated namespaces whose pods may use the entrance in-cluster (split horizon,
    /// as a TailnetIngress's `spec.inCluster.namespaces`; default: none, and then the name is
    /// not in the cluster's DNS records at all).
    pub const IN_CLUSTER_NAMESPACES: &str = "tailnet-operator.dev/in-cluster-namespaces";
}

/// Whether the operator implements this Service: `type: LoadBalancer` and our class.
pub fn is_tailnet_load_balancer(service: &Service) -> bool {
    service.spec.as_ref().is_some_and(|spec| {
        spec.type_.as_deref() == Some("LoadBalancer")
            && spec.load_balancer_class.as_deref() == Some(LOAD_BALANCER_CLASS)
    })
}

/// The annotation `key` of the Service, trimmed; `None` when absent or empty.
pub fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

/// The Tailnet named by the annotation; `None`: the default (the only Tailnet).
pub fn tailnet_annotation(service: &Service) -> Option<&str> {
    annotation(service, annotations::TAILNET)
}

/// Why a Service has no Tailnet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoTailnet {
    #[error(
        "no Tailnet exists; create one (or name one in annotation {})",
        annotations::TAILNET
    )]
    NoneExists,
    #[error("several Tailnets exist ({}); name one in annotation {}", .0.join(", "), annotations::TAILNET)]
    Several(Vec<String>),
}

/// The Tailnet of a Service: its annotation, else the only one of `tailnets` (the names of
/// the cluster's Tailnets).
pub fn resolve_tailnet<S: AsRef<str>>(
    service: &Service,
    tailnets: &[S],
) -> Result<String, NoTailnet> {
    if let Some(name) = tailnet_annotation(service) {
        return Ok(name.to_string());
    }
    default_tailnet(tailnets)
}

/// The default Tailnet of a Service without the annotation: the only one of `tailnets`.
pub fn default_tailnet<S: AsRef<str>>(tailnets: &[S]) -> Result<String, NoTailnet> {
    match tailnets {
        [] => Err(NoTailnet::NoneExists),
        [only] => Ok(only.as_ref().to_string()),
        several => {
            let mut names: Vec<String> = several.iter().map(|s| s.as_ref().to_string()).collect();
            names.sort();
            Err(NoTailnet::Several(names))
        }
    }
}

/// A Service port the tailnet entrance does not serve (only TCP is).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedPort {
    /// The port's name, or its number when unnamed.
    pub name: String,
    pub port: i32,
    pub protocol: String,
}

impl std::fmt::Display for RefusedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}/{})", self.name, self.port, self.protocol)
    }
}

/// A Service read as a TailnetIngress spec.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceEntrance {
    /// `tailnetRef.name` is `tailnet` as given (the caller resolves the default).
    pub spec: TailnetIngressSpec,
    /// Non-TCP ports: not served, reported.
    pub refused: Vec<RefusedPort>,
}

/// The Service as a TailnetIngress spec in Tailnet `tailnet`: `allowFrom` from
/// [`annotations::ALLOW_FROM`], one `tcp` expose per TCP port (named after the port, or
/// `port-<number>`), all with the DNS label of [`annotations::DNS_LABEL`] (default: the
/// Service's name) and the Service itself as the backend. Only the annotations are checked
/// here; the spec is validated like any TailnetIngress's ([`crate::validate::valid_ingress`],
/// whose field names [`annotation_field`] maps back to the annotations).
pub fn service_entrance(service: &Service, tailnet: &str) -> ServiceEntrance {
    let name = service.metadata.name.clone().unwrap_or_default();
    let allow_from = list_annotation(service, annotations::ALLOW_FROM);
    let in_cluster_namespaces = list_annotation(service, annotations::IN_CLUSTER_NAMESPACES);
    let dns_label = annotation(service, annotations::DNS_LABEL)
        .unwrap_or(&name)
        .to_string();
    let mut exposes = Vec::new();
    let mut refused = Vec::new();
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    for port in ports.into_iter().flatten() {
        let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".to_string());
        let port_name = port
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("port-{}", port.port));
        if protocol != "TCP" {
            refused.push(RefusedPort {
                name: port_name,
                port: port.port,
                protocol,
            });
            continue;
        }
        exposes.push(Expose {
            name: port_name,
            dns_label: dns_label.clone(),
            alias: false,
            mode: ExposeMode::Tcp,
            port: port.port,
            backend: Backend {
                service: name.clone(),
                namespace: None,
                port: IntOrString::Int(port.port),
                tls: None,
            },
            timeouts: None,
        });
    }
    ServiceEntrance {
        spec: TailnetIngressSpec {
            tailnet_ref: TailnetRef {
                name: tailnet.to_string(),
            },
            allow_from,
            tls: None,
            exposes,
            limits: None,
            in_cluster: (!in_cluster_namespaces.is_empty()).then_some(InCluster {
                namespaces: in_cluster_namespaces,
            }),
        },
        refused,
    }
}

/// A comma-separated annotation as a list (entries trimmed, empty ones dropped).
fn list_annotation(service: &Service, key: &str) -> Vec<String> {
    annotation(service, key)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Where a field of the TailnetIngress spec a Service is read as comes from in the Service.
pub fn annotation_field(field: &str) -> String {
    if field.starts_with("spec.allowFrom") {
        return format!("metadata.annotations[{}]", annotations::ALLOW_FROM);
    }
    if field.starts_with("spec.inCluster") {
        return format!(
            "metadata.annotations[{}]",
            annotations::IN_CLUSTER_NAMESPACES
        );
    }
    if field.ends_with(".dnsLabel") {
        return format!("metadata.annotations[{}]", annotations::DNS_LABEL);
    }
    if field == "spec.exposes" {
        return "spec.ports (no TCP port)".to_string();
    }
    field.replace("spec.exposes[", "spec.ports[")
}

/// The errors of the spec a Service is read as, named after the Service's fields.
pub fn service_errors(errors: Vec<FieldError>) -> Vec<FieldError> {
    errors
        .into_iter()
        .map(|e| FieldError {
            field: annotation_field(&e.field),
            ..e
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(class: Option<&str>, annotations: &[(&str, &str)]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "apps",
                "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>()},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": class,
                "ports": [
                    {"name": "http", "port": 80, "targetPort": 8080},
                    {"port": 5432, "protocol": "TCP"},
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                ]},
        }))
        .expect("service")
    }

    #[test]
    fn only_our_class_of_load_balancer_is_ours() {
        assert!(is_tailnet_load_balancer(&service(
            Some(LOAD_BALANCER_CLASS),
            &[]
        )));
        assert!(!is_tailnet_load_balancer(&service(Some("other"), &[])));
        assert!(!is_tailnet_load_balancer(&service(None, &[])));
        let mut cluster_ip = service(Some(LOAD_BALANCER_CLASS), &[]);
        if let Some(spec) = cluster_ip.spec.as_mut() {
            spec.type_ = Some("ClusterIP".into());
        }
        assert!(!is_tailnet_load_balancer(&cluster_ip));
    }

    #[test]
    fn tcp_ports_become_exposes_and_udp_is_refused() {
        let svc = service(
            Some(LOAD_BALANCER_CLASS),
            &[
                (annotations::ALLOW_FROM, " group:a, tag:b ,"),
                (annotations::DNS_LABEL, "portal"),
            ],
        );
        let entrance = service_entrance(&svc, "demo");
        assert_eq!(entrance.spec.tailnet_ref.name, "demo");
        assert_eq!(entrance.spec.allow_from, vec!["group:a", "tag:b"]);
        let exposes: Vec<(&str, i32, &str)> = entrance
            .spec
            .exposes
            .iter()
            .map(|e| (e.name.as_str(), e.port, e.dns_label.as_str()))
            .collect();
        assert_eq!(
            exposes,
            vec![("http", 80, "portal"), ("port-5432", 5432, "portal")]
        );
        assert!(
            entrance
                .spec
                .exposes
                .iter()
                .all(|e| e.mode == ExposeMode::Tcp
                    && e.backend.service == "web"
                    && e.backend.port == IntOrString::Int(e.port))
        );
        assert_eq!(
            entrance.refused,
            vec![RefusedPort {
                name: "dns".into(),
                port: 53,
                protocol: "UDP".into()
            }]
        );
        let valid = crate::validate::valid_ingress(&entrance.spec).expect("valid");
        assert_eq!(valid.exposes.len(), 2);
    }

    #[test]
    fn in_cluster_namespaces_come_from_their_annotation() {
        let plain = service(
            Some(LOAD_BALANCER_CLASS),
            &[(annotations::ALLOW_FROM, "group:a")],
        );
        assert_eq!(service_entrance(&plain, "demo").spec.in_cluster, None);
        let listed = service(
            Some(LOAD_BALANCER_CLASS),
            &[
                (annotations::ALLOW_FROM, "group:a"),
                (annotations::IN_CLUSTER_NAMESPACES, " team-b, team-a ,"),
            ],
        );
        let spec = service_entrance(&listed, "demo").spec;
        assert_eq!(spec.in_cluster_namespaces(), ["team-b", "team-a"]);
        let valid = crate::validate::valid_ingress(&spec).expect("valid");
        assert_eq!(valid.in_cluster_namespaces, vec!["team-a", "team-b"]);
        let bad = service(
            Some(LOAD_BALANCER_CLASS),
            &[
                (annotations::ALLOW_FROM, "group:a"),
                (annotations::IN_CLUSTER_NAMESPACES, "Bad_NS"),
            ],
        );
        let errors = crate::validate::valid_ingress(&service_entrance(&bad, "demo").spec)
            .expect_err("bad namespace");
        assert_eq!(
            service_errors(errors)[0].field,
            "metadata.annotations[tailnet-operator.dev/in-cluster-namespaces]"
        );
    }

    #[test]
    fn the_tailnet_is_the_annotation_else_the_only_one() {
        let plain = service(Some(LOAD_BALANCER_CLASS), &[]);
        assert_eq!(resolve_tailnet(&plain, &["demo"]), Ok("demo".to_string()));
        assert_eq!(
            resolve_tailnet(&plain, &["b", "a"]),
            Err(NoTailnet::Several(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            resolve_tailnet::<&str>(&plain, &[]),
            Err(NoTailnet::NoneExists)
        );
        let named = service(Some(LOAD_BALANCER_CLASS), &[(annotations::TAILNET, "b")]);
        assert_eq!(resolve_tailnet(&named, &["a", "b"]), Ok("b".to_string()));
    }

    #[test]
    fn missing_allow_from_names_the_annotation() {
        let svc = service(Some(LOAD_BALANCER_CLASS), &[]);
        let entrance = service_entrance(&svc, "demo");
        assert_eq!(entrance.spec.exposes[0].dns_label, "web");
        let errors = crate::validate::valid_ingress(&entrance.spec).expect_err("no sources");
        let errors = service_errors(errors);
        assert!(
            errors
                .iter()
                .any(|e| e.field == "metadata.annotations[tailnet-operator.dev/allow-from]"),
            "{errors:?}"
        );
    }

    #[test]
    fn a_hostile_label_is_refused_by_the_ingress_validation() {
        let svc = service(
            Some(LOAD_BALANCER_CLASS),
            &[
                (annotations::ALLOW_FROM, "group:a"),
                (annotations::DNS_LABEL, "Bad Label!"),
            ],
        );
        let errors = crate::validate::valid_ingress(&service_entrance(&svc, "demo").spec)
            .expect_err("bad label");
        let errors = service_errors(errors);
        assert!(
            errors
                .iter()
                .any(|e| e.field == "metadata.annotations[tailnet-operator.dev/dns-label]"),
            "{errors:?}"
        );
    }
}
