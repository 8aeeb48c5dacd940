//! `tailnet-operator render`: the DryRun preview for GitOps CI. Reads manifests and an optional
//! file of observed Headscale state, prints what the operator would write: the policy, the DNS
//! ConfigMap and the agent objects. Offline: no cluster, no Headscale.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use serde::Deserialize;
use tailnet_api::service::{is_tailnet_load_balancer, resolve_tailnet};
use tailnet_api::validate::{self, BackendPort, FieldError};
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tailnet_policy::{ObservedNode, RenderedPolicy};
use tailnet_render::RenderContext;
use tailnet_render::backends::{BackendProblem, ObjectKey, ObservedBackends, ServicePortInfo};
use tailnet_render::compose;
use tailnet_render::dns::PendingName;
use tailnet_render::images::Images;

use super::manifests::{Manifests, Origin};
use super::render_gateway::{self, Gateways};
use super::render_output::json;
pub use super::render_output::{PREVIEW_UID, RenderCommandError};

/// Key of the base policy in its ConfigMap.
pub const BASE_POLICY_KEY: &str = "policy.hujson";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Only {
    /// The policy document (HuJSON) only, whatever `-o` says.
    Policy,
    /// The DNS hosts ConfigMap.
    Dns,
    /// The agents' Kubernetes objects.
    Objects,
    /// The policy fragment (JSON) a `mode: Contribute` Tailnet publishes, as the owner reads
    /// it (`fragment.json`); one Tailnet. Same as `--fragment`.
    Fragment,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people: the policy (HuJSON), then YAML documents, with `#` comment headers.
    #[default]
    Text,
    /// One `v1` List (YAML): the objects plus the policy and DNS as ConfigMap-shaped data.
    Yaml,
    /// The same List as JSON.
    Json,
}

/// Installation id used when `--installation-id` is not given: visibly not the operator's.
pub const UNKNOWN_INSTALLATION_ID: &str = "KUBE-SYSTEM-UID";
/// Annotation on every item of `-o yaml|json`: the Tailnet it was rendered for.
pub const TAILNET_ANNOTATION: &str = "render.tailnet-operator.dev/tailnet";
/// Annotation on every item of `-o yaml|json`: `policy`, `dns` or `object`.
pub const PART_ANNOTATION: &str = "render.tailnet-operator.dev/part";
/// Annotation on the DNS ConfigMap of `-o yaml|json`: names whose address is not known
/// offline, one `hostname (owner): reason` per line.
pub const PENDING_ANNOTATION: &str = "render.tailnet-operator.dev/pending";

#[derive(Args)]
pub struct RenderArgs {
    /// Manifest files or directories (multi-document YAML or JSON, `v1` Lists too; `-` reads
    /// standard input): Tailnet, TailnetEgress, TailnetIngress, the base-policy ConfigMap,
    /// optionally backend Services and CA ConfigMaps; Services of `loadBalancerClass:
    /// tailnet-operator.dev/tailnet` are rendered like ingresses. Gateway API: GatewayClass,
    /// TailnetGatewayParameters, Gateway, HTTPRoute, TLSRoute, TCPRoute, ReferenceGrant,
    /// Namespaces (labels) and certificate Secrets (type kubernetes.io/tls; never printed).
    /// Directories are not read recursively.
    #[arg(required = true, value_name = "PATH|-")]
    pub paths: Vec<PathBuf>,
    /// JSON file with observed Headscale and cluster state: `{"nodes": [...],
    /// "serviceClusterIPs": {...}, "services": {...}, "configMaps": {...}, "tlsSecrets":
    /// [...]}`. Without it, ClusterIPs and node IPs are unknown: those DNS names are listed as
    /// pending.
    #[arg(long, value_name = "FILE")]
    pub observed: Option<PathBuf>,
    /// Print only one part. `policy` prints just the HuJSON document (one Tailnet: see
    /// --tailnet).
    #[arg(long, value_enum)]
    pub only: Option<Only>,
    /// Print the policy fragment of the (one) Tailnet, as its ConfigMap
    /// `<tailnet>-policy-fragment` would hold it: for delivering it to the owner through Git
    /// (see docs/several-clusters.md). Same as `--only fragment`.
    #[arg(long, conflicts_with = "only")]
    pub fragment: bool,
    /// Output format: `text` (default; HuJSON and YAML with comment headers, for reading),
    /// `yaml` or `json` (one parseable `v1` List).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text)]
    pub output: Format,
    /// Write one file per object into this directory (created if missing) instead of
    /// printing: `NN-<kind>-<namespace>-<name>.yaml` (`.json` with `-o json`) and
    /// `<tailnet>.policy.hujson`.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Render only this Tailnet (default: every Tailnet among the inputs).
    #[arg(long, value_name = "NAME")]
    pub tailnet: Option<String>,
    /// Namespace the operator runs in (the chart's release namespace). Namespaced inputs
    /// without a namespace are put here, as `kubectl apply -n` would.
    #[arg(long, default_value = "tailnet-system", value_name = "NAMESPACE")]
    pub operator_namespace: String,
    /// The operator's installation id, for the policy's ownership marker: the operator's
    /// `--installation-id` if set, else the uid of namespace kube-system, see
    /// `kubectl get ns kube-system -o jsonpath='{.metadata.uid}'`. Without it, the marker
    /// says KUBE-SYSTEM-UID (and a warning says so).
    #[arg(long, value_name = "ID")]
    pub installation_id: Option<String>,
    /// Cluster DNS domain, as the operator's `--cluster-domain` (backend Service names in
    /// the agent configuration).
    #[arg(long, default_value = "cluster.local", value_name = "DOMAIN")]
    pub cluster_domain: String,
    /// Exit 0 even when resources have policy issues (they are still printed, and listed on
    /// stderr).
    #[arg(long)]
    pub allow_issues: bool,
    /// As the operator's `--route-approval`: `false` renders no autoApprovers.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
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
    /// Certificate Secrets (type `kubernetes.io/tls`) named by Gateway listeners and not among
    /// the manifests, taken as usable key pairs, keyed `namespace/name`:
    /// `["infra/web-cert"]`.
    #[serde(default)]
    pub tls_secrets: Vec<String>,
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
    /// What the Gateway decisions read (routes, grants, certificates, namespaces).
    gateway: render_gateway::Cluster,
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
        let tls_secrets = observed
            .tls_secrets
            .iter()
            .map(|key| observed_key(path, "tlsSecrets", key))
            .collect::<Result<Vec<_>, _>>()?;
        let gateway = render_gateway::cluster(manifests, &backends, &tls_secrets);
        Ok(Cluster {
            observed,
            backends,
            service_cluster_ips,
            gateway,
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
    /// `fragment.json` of this Tailnet's part (what a contributor publishes).
    fragment: String,
    dns: Option<ConfigMap>,
    dns_pending: Vec<PendingName>,
    objects: Vec<serde_json::Value>,
    notes: Vec<String>,
}

/// Everything one `render` run produced, before formatting.
pub struct Rendered {
    tailnets: Vec<TailnetOutput>,
    ignored: Vec<Origin>,
    /// What the preview could not know or decide, for stderr.
    warnings: Vec<String>,
}

pub fn run(args: &RenderArgs) -> Result<(), RenderCommandError> {
    let rendered = render_parts(args)?;
    for warning in &rendered.warnings {
        eprintln!("warning: {warning}");
    }
    match &args.output_dir {
        Some(dir) => {
            let written = write_dir(args, &rendered, dir)?;
            eprintln!("wrote {} files into {}", written, dir.display());
        }
        None => {
            use std::io::Write;
            let text = format_rendered(args, &rendered)?;
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(|e| RenderCommandError::Io(format!("writing to stdout: {e}")))?;
        }
    }
    Ok(())
}

fn load_observed(path: &PathBuf) -> Result<Observed, RenderCommandError> {
    let text = std::fs::read_to_string(path).map_err(|e| RenderCommandError::ObservedRead {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let mut de = serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| RenderCommandError::Observed {
        path: path.clone(),
        message: format!("{}: {}", e.path(), e.inner()),
    })
}

/// Everything `run` prints (stdout) and warns about (stderr), tested directly.
#[cfg(test)]
pub fn render_with_warnings(
    args: &RenderArgs,
) -> Result<(String, Vec<String>), RenderCommandError> {
    let rendered = render_parts(args)?;
    Ok((format_rendered(args, &rendered)?, rendered.warnings))
}

/// Everything `run` prints, as one string (tested directly).
#[cfg_attr(not(test), allow(dead_code))]
pub fn render(args: &RenderArgs) -> Result<String, RenderCommandError> {
    format_rendered(args, &render_parts(args)?)
}

/// Renders every Tailnet of the inputs (or `--tailnet`).
pub fn render_parts(args: &RenderArgs) -> Result<Rendered, RenderCommandError> {
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
    for s in manifests
        .services
        .iter()
        .filter(|s| is_tailnet_load_balancer(&s.object))
    {
        match resolve_tailnet(&s.object, &tailnet_names) {
            Ok(name) if !tailnet_names.contains(&name) => invalid.push(format!(
                "{}: metadata.annotations[{}]: Tailnet {name:?} is not among the inputs",
                s.origin,
                tailnet_api::service::annotations::TAILNET
            )),
            Ok(_) => {}
            Err(e) => invalid.push(format!("{}: {e}", s.origin)),
        }
    }
    if !invalid.is_empty() {
        return Err(RenderCommandError::Invalid(invalid));
    }
    if manifests.tailnets.is_empty() {
        return Err(RenderCommandError::NoTailnet);
    }

    let mut tailnets: Vec<&Tailnet> = manifests.tailnets.iter().map(|t| &t.object).collect();
    if let Some(only) = &args.tailnet {
        tailnets.retain(|t| t.name_any() == *only);
        if tailnets.is_empty() {
            return Err(RenderCommandError::UnknownTailnet(only.clone()));
        }
    }
    tailnets.sort_by_key(|t| t.name_any());
    if matches!(args.only, Some(Only::Policy | Only::Fragment)) && tailnets.len() > 1 {
        let names: Vec<String> = tailnets.iter().map(|t| t.name_any()).collect();
        return Err(RenderCommandError::SeveralPolicies(names.join(", ")));
    }
    let mut outputs = Vec::new();
    let mut issues = Vec::new();
    let mut warnings = Vec::new();
    if args.installation_id.is_none() {
        warnings.push(format!(
            "--installation-id not given: the ownership marker says {UNKNOWN_INSTALLATION_ID}; the operator writes its --installation-id, else the uid of namespace kube-system (kubectl get ns kube-system -o jsonpath='{{.metadata.uid}}')"
        ));
    }
    let gateways = render_gateway::resolve(&manifests);
    warnings.extend(gateways.warnings.iter().cloned());
    for tailnet in tailnets {
        let out = render_tailnet(args, &manifests, &cluster, &gateways, tailnet)?;
        for resource in &out.policy.resources {
            for issue in &resource.issues {
                issues.push(format!(
                    "Tailnet {}: {:?} {}: {issue}",
                    out.name, resource.kind, resource.owner
                ));
            }
        }
        if out.dns.is_some() {
            for p in &out.dns_pending {
                warnings.push(format!(
                    "Tailnet {}: DNS name {} ({}) is pending, not rendered: {}; pass its address in --observed",
                    out.name, p.hostname, p.owner, p.reason
                ));
            }
        }
        for note in &out.notes {
            warnings.push(format!("Tailnet {}: {note}", out.name));
        }
        outputs.push(out);
    }
    if !issues.is_empty() && !args.allow_issues {
        return Err(RenderCommandError::Issues(issues));
    }
    warnings.extend(issues.into_iter().map(|i| format!("policy issue: {i}")));
    for ignored in &manifests.ignored {
        warnings.push(format!("ignored (not a kind render reads): {ignored}"));
    }
    Ok(Rendered {
        tailnets: outputs,
        ignored: manifests.ignored.clone(),
        warnings,
    })
}

fn render_tailnet(
    args: &RenderArgs,
    manifests: &Manifests,
    cluster: &Cluster,
    gateways: &Gateways,
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
    // Services of the tailnet loadBalancerClass of this Tailnet (checked to resolve above).
    let all_tailnets: Vec<String> = manifests
        .tailnets
        .iter()
        .map(|t| t.object.name_any())
        .collect();
    let services: Vec<(Origin, Service)> = manifests
        .services
        .iter()
        .filter(|s| is_tailnet_load_balancer(&s.object))
        .filter(|s| resolve_tailnet(&s.object, &all_tailnets).ok().as_deref() == Some(&name))
        .map(|s| (s.origin.clone(), with_uid(s.object.clone())))
        .collect();
    let base = base_policy(args, manifests, tailnet)?;
    let marker = tailnet_api::tailnet::marker_installation_id(
        args.installation_id
            .as_deref()
            .unwrap_or(UNKNOWN_INSTALLATION_ID),
        &name,
    );
    let ingress_objects: Vec<TailnetIngress> = ingresses.iter().map(|(_, i)| i.clone()).collect();
    let settings = compose::Settings {
        render: RenderContext {
            operator_namespace: &args.operator_namespace,
            tailnet_name: &name,
            tailnet: spec,
            images: Images::resolve(&Images::default(), spec.agent.as_ref()),
            cluster_domain: &args.cluster_domain,
            // Offline: the ConfigMap is not read (the agents' CA volume is left out).
            server_ca_pem: None,
            // Offline: no control plane is observed, so no agent gets egress rules anyway.
            cluster_network: None,
            restrict_agent_egress: true,
        },
        marker: &marker,
        route_approval: args.route_approval,
    };
    let observed = compose::Observed {
        nodes: &cluster.observed.nodes,
        service_cluster_ips: &cluster.service_cluster_ips,
        backends: &cluster.backends,
    };
    let service_objects: Vec<Service> = services.iter().map(|(_, s)| s.clone()).collect();
    let gateway_intents = gateways.intents(&name);
    let composed = compose::tailnet(
        tailnet,
        &base,
        &compose::Declared {
            egresses: &egresses,
            ingresses: &ingress_objects,
            services: &service_objects,
            gateways: &gateway_intents,
        },
        &observed,
        &settings,
    )
    .map_err(|e| RenderCommandError::Policy {
        tailnet: name.clone(),
        message: e.to_string(),
    })?;
    let mut out = Printed::default();
    egress_output(
        &mut out,
        tailnet,
        &egresses,
        &composed,
        &cluster.observed.nodes,
    )?;
    for (origin, service) in &services {
        let refused = tailnet_api::service::service_entrance(service, &name).refused;
        if !refused.is_empty() {
            out.notes.push(format!(
                "{origin}: {} not served (only TCP ports are exposed on the tailnet)",
                refused
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let origins: Vec<&Origin> = ingresses
        .iter()
        .map(|(origin, _)| origin)
        .chain(services.iter().map(|(origin, _)| origin))
        .collect();
    ingress_output(&mut out, &name, &origins, &composed)?;
    let gateway_out = render_gateway::render(
        gateways,
        &cluster.gateway,
        tailnet,
        &settings.render,
        &cluster.backends,
    )?;
    out.objects.extend(gateway_out.objects);
    out.notes.extend(gateway_out.notes);
    for (hostname, losers) in &composed.dns.conflicts {
        out.notes.push(format!(
            "hostname {hostname} is claimed by several resources; not rendered for {}",
            losers.join(", ")
        ));
    }
    Ok(TailnetOutput {
        name,
        mode: format!("{:?}", spec.policy.mode),
        fragment: composed.fragment,
        policy: composed.policy,
        dns: composed.dns_config_map,
        dns_pending: composed.dns.pending,
        objects: out.objects,
        notes: out.notes,
    })
}

/// The base policy of `tailnet` from the inputs. A contributor renders its part alone, as the
/// controller does (the owner's base applies).
fn base_policy(
    args: &RenderArgs,
    manifests: &Manifests,
    tailnet: &Tailnet,
) -> Result<tailnet_policy::BasePolicy, RenderCommandError> {
    let name = tailnet.name_any();
    let contributing = tailnet.spec.policy.mode == tailnet_api::tailnet::PolicyMode::Contribute;
    let base_text = match &tailnet.spec.policy.base_config_map {
        _ if contributing => "{}".to_string(),
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
    tailnet_policy::parse_base(&base_text).map_err(|e| RenderCommandError::Policy {
        tailnet: name,
        message: e.to_string(),
    })
}

/// The objects and notes printed for one Tailnet.
#[derive(Default)]
struct Printed {
    objects: Vec<serde_json::Value>,
    notes: Vec<String>,
}

/// The egresses' objects and target notes; the first invalid egress ends the command.
fn egress_output(
    out: &mut Printed,
    tailnet: &Tailnet,
    egresses: &[TailnetEgress],
    composed: &compose::TailnetComposition,
    nodes: &[ObservedNode],
) -> Result<(), RenderCommandError> {
    for e in &composed.egresses {
        let at = format!("TailnetEgress {}/{}", e.claim.namespace, e.claim.name);
        let (valid, rendered) = match &e.outcome {
            Ok(done) => done,
            Err(compose::EgressRefusal::Invalid(errors)) => {
                return Err(RenderCommandError::Invalid(
                    errors.iter().map(|err| format!("{at}: {err}")).collect(),
                ));
            }
            Err(compose::EgressRefusal::Render(err)) => {
                return Err(RenderCommandError::Invalid(vec![format!("{at}: {err}")]));
            }
        };
        let Some(egress) = egresses.iter().find(|x| {
            x.name_any() == e.claim.name && x.namespace() == Some(e.claim.namespace.clone())
        }) else {
            continue;
        };
        out.notes
            .extend(target_notes(tailnet, egress, valid, nodes));
        out.objects.push(json(&rendered.service_account)?);
        out.objects.push(json(&rendered.role)?);
        out.objects.push(json(&rendered.role_binding)?);
        out.objects.push(json(&rendered.state_secret)?);
        out.objects.push(json(&rendered.config_map)?);
        out.objects.push(json(&rendered.deployment)?);
        for service in &rendered.services {
            out.objects.push(json(service)?);
        }
        out.objects.push(json(&rendered.network_policy)?);
    }
    Ok(())
}

/// The ingresses' objects and notes; every ingress's problems are collected, and any makes
/// the command fail (objects are only printed while none was found).
fn ingress_output(
    out: &mut Printed,
    tailnet_name: &str,
    origins: &[&Origin],
    composed: &compose::TailnetComposition,
) -> Result<(), RenderCommandError> {
    let mut context_errors = Vec::new();
    for (origin, i) in origins.iter().copied().zip(&composed.ingresses) {
        let decided = match &i.outcome {
            compose::IngressOutcome::Invalid(errors)
            | compose::IngressOutcome::OutOfContext(errors) => {
                context_errors.extend(field_errors(origin, errors.clone()));
                continue;
            }
            // The policy's issues name the conflict; nothing of this ingress is rendered.
            compose::IngressOutcome::NoTag => continue,
            compose::IngressOutcome::Render(err) => {
                return Err(RenderCommandError::Invalid(vec![format!(
                    "{origin}: {err}"
                )]));
            }
            compose::IngressOutcome::Decided(decided) => decided,
        };
        context_errors.extend(
            decided
                .problems
                .iter()
                .map(|p| offline_backend_problem(origin, p)),
        );
        let owner = i.claim.owner();
        for (hostname, holder) in &decided.names.claimed {
            out.notes.push(format!(
                "{owner}: hostname {hostname} is kept by the older {holder}; not served here"
            ));
        }
        let Some(rendered) = &decided.objects else {
            continue;
        };
        if context_errors.is_empty() {
            ingress_objects(out, tailnet_name, &owner, rendered)?;
        }
    }
    if !context_errors.is_empty() {
        return Err(RenderCommandError::Invalid(context_errors));
    }
    Ok(())
}

fn ingress_objects(
    out: &mut Printed,
    tailnet_name: &str,
    owner: &str,
    rendered: &tailnet_render::ingress::IngressObjects,
) -> Result<(), RenderCommandError> {
    if rendered.certificate.is_none() && rendered.tls_secret.is_some() {
        out.notes.push(format!(
            "{owner}: http exposes use the existing Secret {} (must cover {})",
            rendered.tls_secret.clone().unwrap_or_default(),
            rendered.http_hostnames.join(", ")
        ));
    }
    out.objects.push(json(&rendered.service_account)?);
    out.objects.push(json(&rendered.role)?);
    out.objects.push(json(&rendered.role_binding)?);
    out.objects.push(json(&rendered.state_secret)?);
    out.objects.push(json(&rendered.config_map)?);
    out.objects.push(json(&rendered.deployment)?);
    out.objects.push(json(&rendered.network_policy)?);
    if let Some(service) = &rendered.in_cluster_service {
        out.objects.push(json(service)?);
    }
    if let Some(cert) = &rendered.certificate {
        out.objects.push(
            serde_json::to_value(cert).map_err(|e| RenderCommandError::Policy {
                tailnet: tailnet_name.to_string(),
                message: e.to_string(),
            })?,
        );
    }
    Ok(())
}

/// One note per egress target: its class (as the controller's `status.targets[].kind`
/// says it), decided from the observed nodes, and what that means for grants and routes.
pub(crate) fn target_notes(
    tailnet: &Tailnet,
    egress: &TailnetEgress,
    valid: &validate::ValidEgress,
    nodes: &[tailnet_policy::ObservedNode],
) -> Vec<String> {
    use tailnet_render::targets::{self, NodeView, TargetClass};
    let views: Vec<NodeView> = nodes.iter().map(NodeView::from).collect();
    let domain = tailnet
        .spec
        .dns
        .as_ref()
        .and_then(|d| d.magic_dns_domain.as_deref());
    let owner = format!(
        "TailnetEgress {}/{}",
        egress.namespace().unwrap_or_default(),
        egress.name_any()
    );
    let tag = tailnet_api::naming::egress_tag(&tailnet.spec.policy.tag_prefix, &egress.name_any());
    valid
        .targets
        .iter()
        .map(|t| {
            let class = targets::classify(&t.address, &views, domain);
            let what = match &class {
                TargetClass::TailnetNode(n) => format!(
                    "on tailnet node {}: the grant is generated, no route is involved",
                    n.name
                ),
                TargetClass::UnknownNodeAddress => {
                    "in the tailnet's range, but no observed node holds it".to_string()
                }
                TargetClass::Subnet => {
                    "behind a subnet router: grant and route approval are generated".to_string()
                }
                TargetClass::MagicDns(n) => format!(
                    "the MagicDNS name of node {}: no grant is generated for names; the base policy must grant {}",
                    n.name,
                    targets::grant_line(&tag, n, t.port)
                ),
                TargetClass::UnknownMagicDnsName => {
                    "under the MagicDNS domain, but no observed node has that name".to_string()
                }
                TargetClass::DnsName => {
                    "a DNS name: grant it in the base policy (no grant or route is generated)"
                        .to_string()
                }
            };
            let address = match &t.address {
                validate::TargetAddress::Ip(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
                other => other.to_string(),
            };
            format!(
                "{owner}: target {} ({address}:{}) is {}, {what}",
                t.name,
                t.port,
                class.kind().label()
            )
        })
        .collect()
}

fn with_uid<K: kube::Resource>(mut object: K) -> K {
    if object.meta().uid.is_none() {
        object.meta_mut().uid = Some(PREVIEW_UID.to_string());
    }
    object
}

fn format_rendered(args: &RenderArgs, rendered: &Rendered) -> Result<String, RenderCommandError> {
    if args.only == Some(Only::Fragment) {
        return Ok(rendered
            .tailnets
            .iter()
            .map(|t| t.fragment.clone())
            .collect());
    }
    if args.only == Some(Only::Policy) {
        let mut out = String::new();
        for t in &rendered.tailnets {
            out.push_str(&t.policy.document);
            if !t.policy.document.ends_with('\n') {
                out.push('\n');
            }
        }
        return Ok(out);
    }
    match args.output {
        Format::Text => format_text(args.only, rendered),
        Format::Yaml => Ok(serde_yaml::to_string(&list(args, rendered))?),
        Format::Json => {
            let mut text = serde_json::to_string_pretty(&list(args, rendered))
                .map_err(|e| RenderCommandError::Io(format!("writing JSON: {e}")))?;
            text.push('\n');
            Ok(text)
        }
    }
}

fn lines(items: impl IntoIterator<Item = String>) -> Option<String> {
    let text: Vec<String> = items.into_iter().collect();
    (!text.is_empty()).then(|| text.join("\n") + "\n")
}

fn pending_lines(t: &TailnetOutput) -> Option<String> {
    lines(
        t.dns_pending
            .iter()
            .map(|p| format!("{} ({}): {}", p.hostname, p.owner, p.reason)),
    )
}

/// The policy of one Tailnet as a ConfigMap-shaped data object (named like the operator's
/// `<tailnet>-rendered-policy`), with what the preview found beside the document.
fn policy_object(operator_namespace: &str, t: &TailnetOutput) -> serde_json::Value {
    let mut data = serde_json::Map::new();
    data.insert("policy.hujson".into(), t.policy.document.clone().into());
    data.insert("mode".into(), t.mode.clone().into());
    data.insert("summary".into(), t.policy.summary.to_string().into());
    let issues = lines(t.policy.resources.iter().flat_map(|r| {
        r.issues
            .iter()
            .map(move |i| format!("{:?} {}: {i}", r.kind, r.owner))
    }));
    let notices = lines(t.policy.notices.iter().map(|n| n.to_string()));
    let notes = lines(t.notes.iter().cloned());
    let pending = if t.dns.is_some() {
        pending_lines(t)
    } else {
        None
    };
    for (key, value) in [
        ("issues", issues),
        ("notices", notices),
        ("notes", notes),
        ("pending", pending),
    ] {
        if let Some(value) = value {
            data.insert(key.into(), value.into());
        }
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": format!("{}-rendered-policy", t.name),
            "namespace": operator_namespace,
        },
        "data": data,
    })
}

fn annotate(mut object: serde_json::Value, tailnet: &str, part: &str) -> serde_json::Value {
    if let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(TAILNET_ANNOTATION.into(), tailnet.into());
            annotations.insert(PART_ANNOTATION.into(), part.into());
        }
    }
    object
}

/// The items of `-o yaml|json` (and of `--output-dir`), in order.
fn items(args: &RenderArgs, rendered: &Rendered) -> Vec<serde_json::Value> {
    let mut items = Vec::new();
    for t in &rendered.tailnets {
        if args.only.is_none() {
            items.push(annotate(
                policy_object(&args.operator_namespace, t),
                &t.name,
                "policy",
            ));
        }
        if matches!(args.only, None | Some(Only::Dns))
            && let Some(cm) = &t.dns
            && let Ok(mut cm) = json(cm)
        {
            if let Some(pending) = pending_lines(t)
                && let Some(meta) = cm.get_mut("metadata").and_then(|m| m.as_object_mut())
            {
                let annotations = meta
                    .entry("annotations")
                    .or_insert_with(|| serde_json::Value::Object(Default::default()));
                if let Some(annotations) = annotations.as_object_mut() {
                    annotations.insert(PENDING_ANNOTATION.into(), pending.into());
                }
            }
            items.push(annotate(cm, &t.name, "dns"));
        }
        if matches!(args.only, None | Some(Only::Objects)) {
            for object in &t.objects {
                items.push(annotate(object.clone(), &t.name, "object"));
            }
        }
    }
    items
}

fn list(args: &RenderArgs, rendered: &Rendered) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {},
        "items": items(args, rendered),
    })
}

fn file_part(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// `--output-dir`: one file per object; returns how many were written.
fn write_dir(
    args: &RenderArgs,
    rendered: &Rendered,
    dir: &Path,
) -> Result<usize, RenderCommandError> {
    let io = |path: &Path, e: std::io::Error| {
        RenderCommandError::Io(format!("writing {}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let mut written = 0;
    if matches!(args.only, None | Some(Only::Policy)) {
        for t in &rendered.tailnets {
            let path = dir.join(format!("{}.policy.hujson", file_part(&t.name)));
            std::fs::write(&path, &t.policy.document).map_err(|e| io(&path, e))?;
            written += 1;
        }
    }
    if args.only == Some(Only::Policy) {
        return Ok(written);
    }
    for (index, item) in items(args, rendered).iter().enumerate() {
        let meta = &item["metadata"];
        let name = format!(
            "{:02}-{}-{}-{}",
            index + 1,
            file_part(item["kind"].as_str().unwrap_or("object")),
            file_part(meta["namespace"].as_str().unwrap_or("cluster")),
            file_part(meta["name"].as_str().unwrap_or("unnamed")),
        );
        let (path, text) = match args.output {
            Format::Json => (
                dir.join(format!("{name}.json")),
                serde_json::to_string_pretty(item)
                    .map_err(|e| RenderCommandError::Io(format!("writing JSON: {e}")))?
                    + "\n",
            ),
            Format::Text | Format::Yaml => (
                dir.join(format!("{name}.yaml")),
                serde_yaml::to_string(item)?,
            ),
        };
        std::fs::write(&path, text).map_err(|e| io(&path, e))?;
        written += 1;
    }
    Ok(written)
}

fn format_text(only: Option<Only>, rendered: &Rendered) -> Result<String, RenderCommandError> {
    let mut out = String::new();
    for t in &rendered.tailnets {
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
            out.push_str(&t.policy.document);
            if !t.policy.document.ends_with('\n') {
                out.push('\n');
            }
        }
        if matches!(only, None | Some(Only::Dns)) {
            if only.is_none() {
                out.push_str(&format!("# ==== DNS of Tailnet {} ====\n", t.name));
            }
            match &t.dns {
                Some(cm) => {
                    out.push_str("---\n");
                    out.push_str(&serde_yaml::to_string(&json(cm)?)?);
                    // After the document (still part of it, as comments): every name whose
                    // address the preview does not know.
                    for p in &t.dns_pending {
                        out.push_str(&format!(
                            "# pending (not in data above): {} ({}): {}\n",
                            p.hostname, p.owner, p.reason
                        ));
                    }
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
        for ignored in &rendered.ignored {
            out.push_str(&format!("# ignored: {ignored}\n"));
        }
    }
    Ok(out)
}

/// `render --help` examples.
pub const AFTER_HELP: &str = "\
Reads no environment variables: everything comes from the flags.

Examples:
  # Preview, for reading (policy, DNS, objects, with # comments):
  tailnet-operator render examples/ --observed examples/observed/headscale-state.json

  # CI: one parseable v1 List; the policy of the Tailnet as ConfigMap-shaped data:
  tailnet-operator render -o yaml manifests/ | yq '.items[].kind'
  tailnet-operator render -o json manifests/ \\
      | jq -r '.items[] | select(.metadata.annotations[\"render.tailnet-operator.dev/part\"] == \"policy\") | .data[\"policy.hujson\"]'

  # Just the HuJSON policy document, with the operator's ownership marker:
  tailnet-operator render --only policy --installation-id \"$(kubectl get ns kube-system -o jsonpath='{.metadata.uid}')\" manifests/

  # From standard input; one file per object:
  kustomize build overlays/prod | tailnet-operator render - --output-dir out/

Exit codes: 0 rendered; 1 reading or writing failed; 2 usage (bad flag); 3 invalid input
(manifest, base policy, --observed file); 4 policy issues (print anyway: --allow-issues).
Gateways of a GatewayClass with controllerName tailnet-operator.dev/gateway are rendered as
the Gateway controller plans them (certificate copies with their data emptied); what their
listeners and routes would report is listed in the notes.
Names whose address is not known offline (egress aliases without a ClusterIP, ingress names
without a Headscale node) are listed as pending: on stderr, in text mode as comments after
the DNS ConfigMap, with -o yaml|json in the annotation render.tailnet-operator.dev/pending
of the DNS ConfigMap and in data.pending of the policy object.
";
