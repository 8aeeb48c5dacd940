//! `tailnet-operator render`: the DryRun preview for GitOps CI. Reads manifests and an optional
//! file of observed Headscale state, prints what the operator would write: the policy, the DNS
//! ConfigMap and the agent objects. Offline: no cluster, no Headscale.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use serde::Deserialize;
use tailnet_api::validate::{self, BackendPort, FieldError};
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tailnet_policy::{ObservedNode, RenderedPolicy};
use tailnet_render::RenderContext;
use tailnet_render::backends::{BackendProblem, ObjectKey, ObservedBackends, ServicePortInfo};
use tailnet_render::desired;
use tailnet_render::dns::PendingName;
use tailnet_render::images::Images;

use super::manifests::{ManifestError, Manifests, Origin};

/// Key of the base policy in its ConfigMap.
pub const BASE_POLICY_KEY: &str = "policy.hujson";
/// Stand-in for `metadata.uid` of objects that were not read from a cluster.
pub const PREVIEW_UID: &str = "00000000-0000-0000-0000-000000000000";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Only {
    Policy,
    Dns,
    Objects,
}

#[derive(Args)]
pub struct RenderArgs {
    /// Manifest files or directories (multi-document YAML): Tailnet, TailnetEgress,
    /// TailnetIngress, the base-policy ConfigMap, optionally backend Services.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// JSON file with observed Headscale and cluster state: `{"nodes": [...],
    /// "serviceClusterIPs": {...}, "services": {...}, "configMaps": {...}}`.
    #[arg(long)]
    pub observed: Option<PathBuf>,
    /// Print only one part.
    #[arg(long, value_enum)]
    pub only: Option<Only>,
    /// Namespace the operator runs in.
    #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "tailnet-system")]
    pub operator_namespace: String,
    /// Identity written into the policy's ownership marker.
    #[arg(long, env = "INSTALLATION_ID", default_value = "tailnet-operator")]
    pub installation_id: String,
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Exit 0 even when resources have policy issues (they are still printed).
    #[arg(long)]
    pub allow_issues: bool,
    /// As the operator's `--route-approval`: `false` renders no autoApprovers.
    #[arg(long, env = "ROUTE_APPROVAL", default_value_t = true, action = clap::ArgAction::Set)]
    pub route_approval: bool,
}

/// Observed state the offline preview cannot know by itself.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Observed {
    /// Headscale nodes (routers with their routes, agent nodes with their IPs and tags).
    #[serde(default)]
    pub nodes: Vec<ObservedNode>,
    /// ClusterIP per egress Service, keyed `namespace/name`.
    #[serde(default, rename = "serviceClusterIPs")]
    pub service_cluster_ips: BTreeMap<String, IpAddr>,
    /// Ports of backend Services not among the manifests, keyed `namespace/name`:
    /// `{"team-a/frontend": [{"name": "http", "port": 8080}]}`.
    #[serde(default)]
    pub services: BTreeMap<String, Vec<ServicePortInfo>>,
    /// Keys of CA ConfigMaps (`backend.tls.caConfigMapRef`) not among the manifests, keyed
    /// `namespace/name`: `{"team-a/backend-ca": ["ca.crt"]}`.
    #[serde(default)]
    pub config_maps: BTreeMap<String, BTreeSet<String>>,
}

/// `namespace/name` from an `--observed` key; `what` names the map for the error.
fn observed_key(path: &Path, what: &str, key: &str) -> Result<ObjectKey, RenderCommandError> {
    match key.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok(ObjectKey::new(namespace, name))
        }
        _ => Err(RenderCommandError::Observed {
            path: path.to_path_buf(),
            message: format!(
                "{what}: key {key:?} is not namespace/name; write e.g. \"team-a/frontend\""
            ),
        }),
    }
}

/// What the offline render knows of the cluster: the `--observed` file plus the manifests
/// given (a manifest wins over an observed entry of the same object).
struct Cluster {
    observed: Observed,
    backends: ObservedBackends,
    service_cluster_ips: BTreeMap<ObjectKey, IpAddr>,
}

impl Cluster {
    fn new(
        observed: Observed,
        observed_path: Option<&Path>,
        manifests: &Manifests,
    ) -> Result<Self, RenderCommandError> {
        let path = observed_path.unwrap_or(Path::new("--observed"));
        let mut backends = ObservedBackends::default();
        for (key, ports) in &observed.services {
            backends
                .services
                .insert(observed_key(path, "services", key)?, ports.clone());
        }
        for (key, keys) in &observed.config_maps {
            backends
                .config_maps
                .insert(observed_key(path, "configMaps", key)?, keys.clone());
        }
        for service in &manifests.services {
            backends.add_service(&service.object);
        }
        for config_map in &manifests.config_maps {
            backends.add_config_map(&config_map.object);
        }
        let mut service_cluster_ips = BTreeMap::new();
        for (key, ip) in &observed.service_cluster_ips {
            service_cluster_ips.insert(observed_key(path, "serviceClusterIPs", key)?, *ip);
        }
        Ok(Cluster {
            observed,
            backends,
            service_cluster_ips,
        })
    }
}

/// A backend problem as the offline command reports it: the field, what is missing (the
/// controller's words) and what to add to the inputs.
fn offline_backend_problem(origin: &Origin, problem: &BackendProblem) -> String {
    let hint = match problem {
        BackendProblem::ServiceMissing { service, port, .. } => {
            let entry = match port {
                BackendPort::Number(n) => format!("{{\"port\": {n}}}"),
                BackendPort::Name(name) => format!("{{\"name\": {name:?}, \"port\": <number>}}"),
            };
            format!(
                "add the Service manifest to the inputs, or its ports to the --observed file: \"services\": {{\"{service}\": [{entry}]}}"
            )
        }
        BackendProblem::PortMissing { service, .. } => format!(
            "use a port Service {service} has, or add the port to the Service in the inputs"
        ),
        BackendProblem::CaMissing {
            config_map, key, ..
        } => format!(
            "add the ConfigMap manifest to the inputs, or its keys to the --observed file: \"configMaps\": {{\"{config_map}\": [{key:?}]}}"
        ),
    };
    format!(
        "{origin}: {}: {} among the inputs; {hint}",
        problem.field(),
        problem.message()
    )
}

#[derive(Debug, thiserror::Error)]
pub enum RenderCommandError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{path}: {message}")]
    Observed { path: PathBuf, message: String },
    #[error("invalid input:\n{}", .0.join("\n"))]
    Invalid(Vec<String>),
    #[error("no Tailnet in the inputs: add the Tailnet manifest the egresses/ingresses reference")]
    NoTailnet,
    #[error(
        "Tailnet {tailnet}: base policy ConfigMap {namespace}/{name} (spec.policy.baseConfigMap) is not among the inputs"
    )]
    BaseMissing {
        tailnet: String,
        namespace: String,
        name: String,
    },
    #[error(
        "{origin}: data.{key}: the base policy is not valid HuJSON at line {line}, column {column}: {message}"
    )]
    BaseInvalid {
        origin: Origin,
        key: &'static str,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("Tailnet {tailnet}: rendering the policy: {message}")]
    Policy { tailnet: String, message: String },
    #[error("policy issues (use --allow-issues to print anyway):\n{}", .0.join("\n"))]
    Issues(Vec<String>),
    #[error("writing YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

fn field_errors(origin: &Origin, errors: Vec<FieldError>) -> Vec<String> {
    errors
        .into_iter()
        .map(|e| format!("{origin}: {e}"))
        .collect()
}

/// One rendered Tailnet.
struct TailnetOutput {
    name: String,
    mode: String,
    policy: RenderedPolicy,
    dns: Option<ConfigMap>,
    dns_pending: Vec<PendingName>,
    objects: Vec<serde_json::Value>,
    notes: Vec<String>,
}

pub fn run(args: &RenderArgs) -> Result<(), Box<dyn std::error::Error>> {
    let output = render(args)?;
    print!("{output}");
    Ok(())
}

fn load_observed(path: &PathBuf) -> Result<Observed, RenderCommandError> {
    let text = std::fs::read_to_string(path).map_err(|e| RenderCommandError::Observed {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let mut de = serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| RenderCommandError::Observed {
        path: path.clone(),
        message: format!("{}: {}", e.path(), e.inner()),
    })
}

/// Everything `run` prints, as one string (tested directly).
pub fn render(args: &RenderArgs) -> Result<String, RenderCommandError> {
    let manifests = Manifests::load(&args.paths, &args.operator_namespace)?;
    let observed = args
        .observed
        .as_ref()
        .map(load_observed)
        .transpose()?
        .unwrap_or_default();
    let cluster = Cluster::new(observed, args.observed.as_deref(), &manifests)?;

    let mut invalid = Vec::new();
    for t in &manifests.tailnets {
        invalid.extend(field_errors(&t.origin, validate::tailnet(&t.object.spec)));
    }
    for e in &manifests.egresses {
        invalid.extend(field_errors(&e.origin, validate::egress(&e.object.spec)));
        if let Err(err) = validate::egress_namespace(
            &e.object.namespace().unwrap_or_default(),
            &args.operator_namespace,
        ) {
            invalid.push(format!("{}: {err}", e.origin));
        }
    }
    for i in &manifests.ingresses {
        invalid.extend(field_errors(&i.origin, validate::ingress(&i.object.spec)));
    }
    let tailnet_names: Vec<String> = manifests
        .tailnets
        .iter()
        .map(|t| t.object.name_any())
        .collect();
    for (origin, reference) in manifests
        .egresses
        .iter()
        .map(|e| (&e.origin, &e.object.spec.tailnet_ref.name))
        .chain(
            manifests
                .ingresses
                .iter()
                .map(|i| (&i.origin, &i.object.spec.tailnet_ref.name)),
        )
    {
        if !tailnet_names.contains(reference) {
            invalid.push(format!(
                "{origin}: spec.tailnetRef.name: Tailnet {reference:?} is not among the inputs"
            ));
        }
    }
    if !invalid.is_empty() {
        return Err(RenderCommandError::Invalid(invalid));
    }
    if manifests.tailnets.is_empty() {
        return Err(RenderCommandError::NoTailnet);
    }

    let mut tailnets: Vec<&Tailnet> = manifests.tailnets.iter().map(|t| &t.object).collect();
    tailnets.sort_by_key(|t| t.name_any());
    let mut outputs = Vec::new();
    let mut issues = Vec::new();
    for tailnet in tailnets {
        let out = render_tailnet(args, &manifests, &cluster, tailnet)?;
        for resource in &out.policy.resources {
            for issue in &resource.issues {
                issues.push(format!(
                    "Tailnet {}: {:?} {}: {issue}",
                    out.name, resource.kind, resource.owner
                ));
            }
        }
        outputs.push(out);
    }
    if !issues.is_empty() && !args.allow_issues {
        return Err(RenderCommandError::Issues(issues));
    }
    format_output(args.only, &outputs, &manifests)
}

fn render_tailnet(
    args: &RenderArgs,
    manifests: &Manifests,
    cluster: &Cluster,
    tailnet: &Tailnet,
) -> Result<TailnetOutput, RenderCommandError> {
    let name = tailnet.name_any();
    let spec = &tailnet.spec;
    let egresses: Vec<TailnetEgress> = manifests
        .egresses
        .iter()
        .filter(|e| e.object.spec.tailnet_ref.name == name)
        .map(|e| with_uid(e.object.clone()))
        .collect();
    let ingresses: Vec<(Origin, TailnetIngress)> = manifests
        .ingresses
        .iter()
        .filter(|i| i.object.spec.tailnet_ref.name == name)
        .map(|i| (i.origin.clone(), with_uid(i.object.clone())))
        .collect();

    // Policy.
    let base_text = match &spec.policy.base_config_map {
        None => "{}".to_string(),
        Some(cm_name) => {
            let found = manifests.config_maps.iter().find(|c| {
                c.object.name_any() == *cm_name
                    && c.object.namespace().as_deref() == Some(args.operator_namespace.as_str())
            });
            let Some(cm) = found else {
                return Err(RenderCommandError::BaseMissing {
                    tailnet: name,
                    namespace: args.operator_namespace.clone(),
                    name: cm_name.clone(),
                });
            };
            let text = cm
                .object
                .data
                .as_ref()
                .and_then(|d| d.get(BASE_POLICY_KEY))
                .cloned();
            let text = text.ok_or_else(|| {
                RenderCommandError::Invalid(vec![format!("{}: data.{BASE_POLICY_KEY}: missing; put the base policy (HuJSON) under this key", cm.origin)])
            })?;
            if let Err(e) = tailnet_policy::parse_base(&text) {
                return Err(RenderCommandError::BaseInvalid {
                    origin: cm.origin.clone(),
                    key: BASE_POLICY_KEY,
                    line: e.line,
                    column: e.column,
                    message: e.message,
                });
            }
            text
        }
    };
    let base = tailnet_policy::parse_base(&base_text).map_err(|e| RenderCommandError::Policy {
        tailnet: name.clone(),
        message: e.to_string(),
    })?;
    let ingress_objects: Vec<TailnetIngress> = ingresses.iter().map(|(_, i)| i.clone()).collect();
    let inputs = desired::policy(
        tailnet,
        &args.installation_id,
        &args.operator_namespace,
        &egresses,
        &ingress_objects,
        &cluster.observed.nodes,
        args.route_approval,
    );
    let policy =
        tailnet_policy::render(&base, &inputs).map_err(|e| RenderCommandError::Policy {
            tailnet: name.clone(),
            message: e.to_string(),
        })?;

    // Agent objects.
    let ctx = RenderContext {
        operator_namespace: &args.operator_namespace,
        tailnet_name: &name,
        tailnet: spec,
        images: Images::resolve(&Images::default(), spec.agent.as_ref()),
        cluster_domain: &args.cluster_domain,
    };
    let mut objects = Vec::new();
    let mut notes = Vec::new();
    let mut sorted_egresses = egresses.clone();
    sorted_egresses.sort_by_key(|e| e.name_any());
    for e in &sorted_egresses {
        let at = format!(
            "TailnetEgress {}/{}",
            e.namespace().unwrap_or_default(),
            e.name_any()
        );
        let valid = validate::valid_egress(&e.spec).map_err(|errors| {
            RenderCommandError::Invalid(errors.iter().map(|err| format!("{at}: {err}")).collect())
        })?;
        let rendered = desired::egress(&e.metadata, &valid, &ctx, &BTreeMap::new())
            .map_err(|err| RenderCommandError::Invalid(vec![format!("{at}: {err}")]))?;
        objects.push(json(&rendered.service_account)?);
        objects.push(json(&rendered.role)?);
        objects.push(json(&rendered.role_binding)?);
        objects.push(json(&rendered.state_secret)?);
        objects.push(json(&rendered.config_map)?);
        objects.push(json(&rendered.deployment)?);
        for service in &rendered.services {
            objects.push(json(service)?);
        }
        objects.push(json(&rendered.network_policy)?);
    }
    let mut context_errors = Vec::new();
    for (origin, i) in &ingresses {
        let namespace = i.namespace().unwrap_or_default();
        let valid = match validate::valid_ingress(&i.spec) {
            Ok(valid) => valid,
            Err(errors) => {
                context_errors.extend(field_errors(origin, errors));
                continue;
            }
        };
        // Claims as the controller sees them: the older ingress keeps a contested name.
        let names = match desired::ingress_names(&namespace, &valid, &ctx, &BTreeMap::new()) {
            Ok(names) => names,
            Err(errors) => {
                context_errors.extend(field_errors(origin, errors));
                continue;
            }
        };
        let claimed = desired::claimed_elsewhere(i, &names.names, &ingress_objects, &ctx);
        let observed = desired::IngressObserved {
            backends: &cluster.backends,
            claimed: &claimed,
            // Offline, the certificate is assumed ready (see the README).
            certificate_ready: true,
        };
        let decided = match desired::ingress(&i.metadata, &valid, &ctx, &observed) {
            Ok(decided) => decided,
            Err(desired::IngressError::Context(errors)) => {
                context_errors.extend(field_errors(origin, errors));
                continue;
            }
            Err(desired::IngressError::Render(err)) => {
                return Err(RenderCommandError::Invalid(vec![format!(
                    "{origin}: {err}"
                )]));
            }
        };
        context_errors.extend(
            decided
                .problems
                .iter()
                .map(|p| offline_backend_problem(origin, p)),
        );
        let owner = format!("TailnetIngress/{namespace}/{}", i.name_any());
        for (hostname, holder) in &decided.names.claimed {
            notes.push(format!(
                "{owner}: hostname {hostname} is kept by the older TailnetIngress {holder}; not served here"
            ));
        }
        let Some(rendered) = decided.objects else {
            continue;
        };
        if context_errors.is_empty() {
            if rendered.certificate.is_none() && rendered.tls_secret.is_some() {
                notes.push(format!(
                    "{owner}: http exposes use the existing Secret {} (must cover {})",
                    rendered.tls_secret.clone().unwrap_or_default(),
                    rendered.http_hostnames.join(", ")
                ));
            }
            objects.push(json(&rendered.service_account)?);
            objects.push(json(&rendered.role)?);
            objects.push(json(&rendered.role_binding)?);
            objects.push(json(&rendered.state_secret)?);
            objects.push(json(&rendered.config_map)?);
            objects.push(json(&rendered.deployment)?);
            objects.push(json(&rendered.network_policy)?);
            if let Some(cert) = &rendered.certificate {
                objects.push(serde_json::to_value(cert).map_err(|e| {
                    RenderCommandError::Policy {
                        tailnet: name.clone(),
                        message: e.to_string(),
                    }
                })?);
            }
        }
    }
    if !context_errors.is_empty() {
        return Err(RenderCommandError::Invalid(context_errors));
    }
    let dns = desired::dns_inputs(
        tailnet,
        &args.operator_namespace,
        &egresses,
        &ingress_objects,
        &cluster.service_cluster_ips,
        &cluster.observed.nodes,
    );
    let rendered_dns = tailnet_render::dns::render(&dns);
    for (hostname, losers) in &rendered_dns.conflicts {
        notes.push(format!(
            "hostname {hostname} is claimed by several resources; not rendered for {}",
            losers.join(", ")
        ));
    }
    let dns_cm = desired::dns_config_map(tailnet, &args.operator_namespace, &rendered_dns, None);
    for resource in &policy.resources {
        for target in resource.dns_targets_skipped() {
            notes.push(format!("{:?} {}: target {target} is a DNS name; grant it in the base policy (no grant or route is generated)", resource.kind, resource.owner));
        }
    }
    Ok(TailnetOutput {
        name,
        mode: format!("{:?}", spec.policy.mode),
        policy,
        dns: dns_cm,
        dns_pending: rendered_dns.pending,
        objects,
        notes,
    })
}

fn with_uid<K: kube::Resource>(mut object: K) -> K {
    if object.meta().uid.is_none() {
        object.meta_mut().uid = Some(PREVIEW_UID.to_string());
    }
    object
}

fn json<T: serde::Serialize + kube::Resource<DynamicType = ()>>(
    object: &T,
) -> Result<serde_json::Value, RenderCommandError> {
    let mut value = serde_json::to_value(object).map_err(|e| RenderCommandError::Policy {
        tailnet: String::new(),
        message: e.to_string(),
    })?;
    if let Some(map) = value.as_object_mut() {
        // k8s-openapi types carry no TypeMeta: add it so the output is kubectl-applyable.
        let mut typed = serde_json::Map::new();
        typed.insert("apiVersion".to_string(), T::api_version(&()).into());
        typed.insert("kind".to_string(), T::kind(&()).into());
        typed.append(map);
        value = serde_json::Value::Object(typed);
    }
    Ok(value)
}

fn format_output(
    only: Option<Only>,
    outputs: &[TailnetOutput],
    manifests: &Manifests,
) -> Result<String, RenderCommandError> {
    let mut out = String::new();
    for t in outputs {
        if matches!(only, None | Some(Only::Policy)) {
            if only.is_none() {
                out.push_str(&format!(
                    "# ==== Policy of Tailnet {} (mode {}): {} ====\n",
                    t.name, t.mode, t.policy.summary
                ));
                for resource in &t.policy.resources {
                    for issue in &resource.issues {
                        out.push_str(&format!(
                            "# ISSUE {:?} {}: {issue}\n",
                            resource.kind, resource.owner
                        ));
                    }
                }
                for notice in &t.policy.notices {
                    out.push_str(&format!("# note: {notice}\n"));
                }
            }
            out.push_str(&t.policy.document);
            if !t.policy.document.ends_with('\n') {
                out.push('\n');
            }
        }
        if matches!(only, None | Some(Only::Dns)) {
            if only.is_none() {
                out.push_str(&format!("# ==== DNS of Tailnet {} ====\n", t.name));
                for p in &t.dns_pending {
                    out.push_str(&format!(
                        "# pending: {} ({}): {}\n",
                        p.hostname, p.owner, p.reason
                    ));
                }
            }
            match &t.dns {
                Some(cm) => {
                    out.push_str("---\n");
                    out.push_str(&serde_yaml::to_string(&json(cm)?)?);
                }
                None if only.is_none() => out.push_str(
                    "# spec.dns.hostsConfigMap is not set: no DNS entries are rendered\n",
                ),
                None => {}
            }
        }
        if matches!(only, None | Some(Only::Objects)) {
            if only.is_none() {
                out.push_str(&format!(
                    "# ==== Kubernetes objects of Tailnet {} ====\n",
                    t.name
                ));
                for note in &t.notes {
                    out.push_str(&format!("# note: {note}\n"));
                }
            }
            for object in &t.objects {
                out.push_str("---\n");
                out.push_str(&serde_yaml::to_string(object)?);
            }
        }
    }
    if only.is_none() {
        for ignored in &manifests.ignored {
            out.push_str(&format!("# ignored: {ignored}\n"));
        }
    }
    Ok(out)
}
