//! One desired-state pipeline (issue 13): `tailnet-operator render` and the controllers'
//! decide steps, given the same declarations and the same observed state, produce the same
//! agent objects, the same policy document and the same DNS entries, byte for byte. Run over
//! `examples/` and a richer set (IPv6 and DNS-name targets, a disabled probe, a 3-expose
//! ingress with tcp + http + verified HTTPS backend, an administrative cross-namespace
//! ingress, a Service of the tailnet `loadBalancerClass`) in `tests/fixtures/rich/`, and a
//! Gateway API set (a Gateway with HTTPS, TLS passthrough and TCP listeners, two HTTPRoutes,
//! a TLSRoute, a TCPRoute, a cross-namespace backend with its ReferenceGrant, a Gateway of
//! another class) added to `examples/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use serde_json::Value;
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tailnet_render::backends::{ObjectKey, ObservedBackends};
use tailnet_render::intent::{ServiceIntent, TailnetScope};

use crate::cli::manifests::Manifests;
use crate::cli::render::{Observed, PREVIEW_UID, RenderArgs, render};
use crate::controllers::agent::decide as agent;
use crate::controllers::agent::observation::{AgentObserved, AuthSecret, Observation, TailnetView};
use crate::controllers::config::OperatorConfig;
use crate::controllers::gateway::decide::GatewayEntrance;
use crate::controllers::gateway::observation::{ClassState, GatewayObserved};
use crate::controllers::status::Problem;
use crate::controllers::tailnet::gather::TailnetObservation;
use crate::controllers::{egress, gateway, gateway_class, ingress, service, tailnet};
use tailnet_gateway_api::Gateway;
use tailnet_render::gateway::{ClusterFacts, SecretFact};
use tailnet_render::intent::IngressIntent;

const OPERATOR_NAMESPACE: &str = "tailnet-system";
/// The decisions' clock (inside the test certificate's validity).
const NOW: &str = "2026-06-01T12:00:00Z";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    render: RenderArgs,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn config() -> OperatorConfig {
    OperatorConfig {
        operator_namespace: OPERATOR_NAMESPACE.to_string(),
        installation_id: "preview".to_string(),
        headscale_poll: std::time::Duration::from_secs(10),
        headscale_timeout: std::time::Duration::from_secs(5),
        images: tailnet_render::images::Images::default(),
        cluster_domain: "cluster.local".to_string(),
        approve_routes: true,
        reapply_interval: std::time::Duration::from_secs(600),
        max_concurrent_reconciles: 16,
        scope: crate::scope::WatchScope::Cluster,
        cluster_network: None,
        restrict_agent_egress: true,
    }
}

/// One part of the CLI's output (`--only <part>`).
fn cli_part(inputs: &[PathBuf], observed: &Path, only: &str, installation_id: &str) -> String {
    let mut argv: Vec<String> = vec!["render".into()];
    argv.extend(inputs.iter().map(|p| p.display().to_string()));
    argv.extend(
        [
            "--observed",
            &observed.display().to_string(),
            "--only",
            only,
            "--operator-namespace",
            OPERATOR_NAMESPACE,
            "--installation-id",
            installation_id,
        ]
        .map(String::from),
    );
    let cli = Cli::try_parse_from(argv).expect("render arguments");
    render(&cli.render).expect("render")
}

/// YAML documents as JSON values.
fn yaml_documents(text: &str) -> Vec<Value> {
    text.split("\n---")
        .map(|d| d.trim_start_matches("---"))
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.starts_with('#'))
        })
        .map(|d| serde_yaml::from_str::<Value>(d).expect("a YAML document"))
        .collect()
}

/// `Kind namespace/name` → the object as canonical JSON text (keys sorted).
fn keyed(objects: Vec<Value>) -> BTreeMap<String, String> {
    objects
        .into_iter()
        .map(|o| {
            let key = format!(
                "{} {}/{}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            );
            (key, serde_json::to_string(&o).expect("json"))
        })
        .collect()
}

/// A k8s-openapi object as the CLI prints it: with apiVersion and kind.
fn typed<T: serde::Serialize + kube::Resource<DynamicType = ()>>(object: &T) -> Value {
    let mut value = serde_json::to_value(object).expect("object");
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), T::api_version(&()).into());
        map.insert("kind".into(), T::kind(&()).into());
    }
    value
}

fn with_uid<K: kube::Resource>(mut object: K) -> K {
    object
        .meta_mut()
        .uid
        .get_or_insert_with(|| PREVIEW_UID.to_string());
    object
}

/// A certificate for every name under these wildcard domains, valid at [`NOW`].
fn certificate(domains: &[String]) -> Vec<u8> {
    let mut params =
        rcgen::CertificateParams::new(domains.iter().map(|d| format!("*.{d}")).collect::<Vec<_>>())
            .expect("params");
    params.not_before = rcgen::date_time_ymd(2026, 1, 1);
    params.not_after = rcgen::date_time_ymd(2027, 1, 1);
    let key = rcgen::KeyPair::generate().expect("key");
    params.self_signed(&key).expect("cert").pem().into_bytes()
}

/// Per egress target: the CLI note's prefix, the class and the node the controller decided.
type TargetKinds = Vec<(String, &'static str, Option<String>)>;

/// What the controllers decide for the inputs, as the CLI prints it: (objects, policy, DNS,
/// target classes).
fn controllers_output(
    manifests: &Manifests,
    observed: &Observed,
) -> (BTreeMap<String, String>, String, Option<Value>, TargetKinds) {
    let config = config();
    let now: Timestamp = NOW.parse().expect("timestamp");
    assert_eq!(manifests.tailnets.len(), 1, "one Tailnet per input set");
    let tailnet: Tailnet = with_uid(manifests.tailnets[0].object.clone());
    let egresses: Vec<TailnetEgress> = manifests
        .egresses
        .iter()
        .map(|e| with_uid(e.object.clone()))
        .collect();
    let ingresses: Vec<TailnetIngress> = manifests
        .ingresses
        .iter()
        .map(|i| with_uid(i.object.clone()))
        .collect();
    let access = TailnetView {
        tailnet: tailnet.clone(),
        headscale: Err(Problem::new("Unknown", "not asked")),
        server_ca: None,
        owner_keys: None,
    };
    let (mut objects, target_kinds) =
        egress_decisions(&egresses, &access, &headscale_nodes(observed), &config, now);
    let backends = backends_of(manifests, observed);
    let services: Vec<Service> = manifests
        .services
        .iter()
        .filter(|s| tailnet_api::service::is_tailnet_load_balancer(&s.object))
        .map(|s| with_uid(s.object.clone()))
        .collect();
    let tailnet_name = tailnet.name_any();
    let scope = TailnetScope {
        name: &tailnet_name,
        spec: &tailnet.spec,
        operator_namespace: OPERATOR_NAMESPACE,
    };
    let entrances: Vec<ServiceIntent> = services
        .iter()
        .map(|s| ServiceIntent::new(s, &scope))
        .collect();
    let inputs = Inputs {
        ingresses: &ingresses,
        entrances: &entrances,
        access: &access,
        backends: &backends,
        config: &config,
        now,
    };
    objects.extend(ingress_decisions(&inputs));
    objects.extend(service_decisions(&inputs, &services));
    objects.extend(gateway_decisions(manifests, &inputs));
    let (policy, dns) = tailnet_decision(
        manifests, observed, &tailnet, egresses, ingresses, &config, now,
    );
    (keyed(objects), policy, dns, target_kinds)
}

/// The observed nodes as Headscale's API reports them.
fn headscale_nodes(observed: &Observed) -> Vec<tailnet_headscale::Node> {
    observed
        .nodes
        .iter()
        .map(|n| tailnet_headscale::Node {
            id: n.id,
            name: n.name.clone(),
            given_name: n.name.clone(),
            tags: n.tags.clone(),
            ip_addresses: n.ip_addresses.iter().map(|ip| ip.to_string()).collect(),
            available_routes: n.available_routes.iter().map(|r| r.to_string()).collect(),
            approved_routes: n.approved_routes.iter().map(|r| r.to_string()).collect(),
            online: n.online,
            ..Default::default()
        })
        .collect()
}

/// The egress controller's objects and target classes for every egress.
fn egress_decisions(
    egresses: &[TailnetEgress],
    access: &TailnetView,
    nodes: &[tailnet_headscale::Node],
    config: &OperatorConfig,
    now: Timestamp,
) -> (Vec<Value>, TargetKinds) {
    let mut objects = Vec::new();
    let mut target_kinds = Vec::new();
    for e in egresses {
        let valid = agent::validated::<egress::Egress>(e, now).expect("valid egress");
        let observation = Observation {
            access: Ok(access.clone()),
            agent: AgentObserved {
                nodes: Ok(Arc::new(nodes.to_vec())),
                auth_secret: AuthSecret::Absent,
                deployment: None,
                report: None,
            },
            kind: Default::default(),
        };
        let decision = agent::decide::<egress::Egress>(e, &valid, &observation, config, now)
            .expect("egress decision");
        for t in &decision.status.targets {
            target_kinds.push((
                format!(
                    "TailnetEgress {}/{}: target {} ",
                    e.namespace().unwrap_or_default(),
                    e.name_any(),
                    t.name
                ),
                t.kind.expect("a kind (the nodes are observed)").label(),
                t.node.as_ref().map(|n| n.name.clone()),
            ));
        }
        let plan = decision.agent.expect("egress plan");
        let o = plan.objects.as_ref().expect("egress objects");
        objects.extend([
            typed(&o.service_account),
            typed(&o.role),
            typed(&o.role_binding),
            typed(&o.state_secret),
            typed(&o.config_map),
            typed(&o.deployment),
            typed(&o.network_policy),
        ]);
        objects.extend(plan.kind.services.iter().map(typed));
    }
    (objects, target_kinds)
}

/// The backends as the CLI sees them: the observed file plus the manifests.
fn backends_of(manifests: &Manifests, observed: &Observed) -> ObservedBackends {
    let mut backends = ObservedBackends::default();
    for (key, ports) in &observed.services {
        let (ns, name) = key.split_once('/').expect("namespace/name");
        backends
            .services
            .insert(ObjectKey::new(ns, name), ports.clone());
    }
    for (key, keys) in &observed.config_maps {
        let (ns, name) = key.split_once('/').expect("namespace/name");
        backends
            .config_maps
            .insert(ObjectKey::new(ns, name), keys.clone());
    }
    manifests
        .services
        .iter()
        .for_each(|s| backends.add_service(&s.object));
    manifests
        .config_maps
        .iter()
        .for_each(|c| backends.add_config_map(&c.object));
    backends
}

/// What the ingress and Service decisions read.
struct Inputs<'a> {
    ingresses: &'a [TailnetIngress],
    /// The Services of the tailnet class, read as ingresses.
    entrances: &'a [ServiceIntent],
    access: &'a TailnetView,
    backends: &'a ObservedBackends,
    config: &'a OperatorConfig,
    now: Timestamp,
}

/// The Service controller's objects for every Service of the tailnet class (its tag among the
/// Services, as its gather step assigns it).
fn service_decisions(inputs: &Inputs<'_>, services: &[Service]) -> Vec<Value> {
    let tailnet = &inputs.access.tailnet;
    let name = tailnet.name_any();
    let others: Vec<Arc<TailnetIngress>> = inputs.ingresses.iter().cloned().map(Arc::new).collect();
    let mut objects = Vec::new();
    for (s, own) in services.iter().zip(inputs.entrances) {
        let valid =
            agent::validated::<service::LoadBalancer>(s, inputs.now).expect("valid Service");
        let entrances: Vec<_> = inputs
            .entrances
            .iter()
            .filter(|e| e.intent.claim != own.intent.claim)
            .map(|e| e.intent.clone())
            .collect();
        let tag = tailnet_render::claims::ingress_tag_of(
            &name,
            &tailnet.spec.policy.tag_prefix,
            &own.intent.claim,
            entrances.iter().map(|e| &e.claim),
        );
        let mut observation =
            Observation::<ingress::observation::IngressObserved>::only_access(Ok(inputs
                .access
                .clone()));
        observation.kind.others = others.clone();
        observation.kind.entrances = entrances;
        observation.kind.backends = inputs.backends.clone();
        observation.kind.tag = Some(tag);
        let decision = agent::decide::<service::LoadBalancer>(
            s,
            &valid,
            &observation,
            inputs.config,
            inputs.now,
        )
        .expect("decision");
        let plan = decision.agent.expect("Service plan");
        let o = plan.objects.expect("Service agent objects");
        objects.extend([
            typed(&o.service_account),
            typed(&o.role),
            typed(&o.role_binding),
            typed(&o.state_secret),
            typed(&o.config_map),
            typed(&o.deployment),
            typed(&o.network_policy),
        ]);
    }
    objects
}

/// The ingress controller's objects for every ingress (each with a certificate covering it).
fn ingress_decisions(inputs: &Inputs<'_>) -> Vec<Value> {
    let &Inputs {
        ingresses,
        access,
        backends,
        config,
        now,
        ..
    } = inputs;
    let mut domains: Vec<String> = ingresses
        .iter()
        .map(|i| format!("{}.lab.example.net", i.namespace().unwrap_or_default()))
        .collect();
    domains.push("lab.example.net".into());
    let pem = certificate(&domains);
    let others: Vec<Arc<TailnetIngress>> = ingresses.iter().cloned().map(Arc::new).collect();
    let mut objects = Vec::new();
    for i in ingresses {
        let valid = agent::validated::<ingress::Ingress>(i, now).expect("valid ingress");
        let mut observation =
            Observation::<ingress::observation::IngressObserved>::only_access(Ok(access.clone()));
        observation.kind.others = others.clone();
        observation.kind.entrances = inputs.entrances.iter().map(|e| e.intent.clone()).collect();
        observation.kind.backends = backends.clone();
        observation.kind.tls_certificate = Some(pem.clone());
        let decision = agent::decide::<ingress::Ingress>(i, &valid, &observation, config, now)
            .expect("decision");
        let plan = decision.agent.expect("ingress plan");
        let o = plan
            .objects
            .expect("ingress objects (every backend resolves)");
        objects.extend([
            typed(&o.service_account),
            typed(&o.role),
            typed(&o.role_binding),
            typed(&o.state_secret),
            typed(&o.config_map),
            typed(&o.deployment),
            typed(&o.network_policy),
        ]);
        if let Some(cert) = &o.certificate {
            objects.push(serde_json::to_value(cert).expect("certificate"));
        }
        // Split horizon: applied by the ingress controller's act step (act.rs) too.
        if let Some(service) = &o.in_cluster_service {
            objects.push(typed(service));
        }
    }
    objects
}

/// The Tailnet controller's policy document and DNS ConfigMap (without its owner reference).
fn tailnet_decision(
    manifests: &Manifests,
    observed: &Observed,
    tailnet: &Tailnet,
    egresses: Vec<TailnetEgress>,
    ingresses: Vec<TailnetIngress>,
    config: &OperatorConfig,
    now: Timestamp,
) -> (String, Option<Value>) {
    // The Tailnet: policy and DNS from the observed nodes and ClusterIPs.
    let base = manifests
        .config_maps
        .iter()
        .find(|c| Some(c.object.name_any()) == tailnet.spec.policy.base_config_map)
        .and_then(|c| {
            c.object
                .data
                .clone()?
                .get(tailnet::locations::BASE_POLICY_KEY)
                .cloned()
        });
    let observation = TailnetObservation {
        contributor_reads: Vec::new(),
        contribution_store: Default::default(),
        headscale: Ok("v0.29.2".into()),
        nodes: Some(observed.nodes.clone()),
        live_policy: None,
        api_key: None,
        base: Ok(base),
        egresses,
        ingresses,
        services: manifests
            .services
            .iter()
            .filter(|s| tailnet_api::service::is_tailnet_load_balancer(&s.object))
            .map(|s| with_uid(s.object.clone()))
            .collect(),
        gateways: gateway_intents(manifests, tailnet),
        egress_cluster_ips: observed
            .service_cluster_ips
            .iter()
            .map(|(k, ip)| {
                let (ns, name) = k.split_once('/').expect("namespace/name");
                (ObjectKey::new(ns, name), *ip)
            })
            .collect(),
        dns_config_map: None,
    };
    let plan = tailnet::decide::plan(tailnet, &observation, config, now);
    let policy = plan.rendered.expect("rendered policy").document;
    let dns = plan.dns.map(|cm| {
        let mut value = typed(&cm);
        // The controller's copy is owned by the Tailnet (garbage-collected with it).
        if let Some(meta) = value["metadata"].as_object_mut() {
            meta.remove("ownerReferences");
        }
        value
    });
    (policy, dns)
}

/// Each Gateway's class as the Gateway controller's gather step reads it (the GatewayClass
/// controller's verdict on the parameters among the manifests).
fn gateway_classes(manifests: &Manifests) -> Vec<(Gateway, ClassState)> {
    let tailnets: Vec<String> = manifests
        .tailnets
        .iter()
        .map(|t| t.object.name_any())
        .collect();
    let default = tailnet_api::service::default_tailnet(&tailnets).map_err(|e| e.to_string());
    let lookup = |name: &str| {
        manifests
            .tailnets
            .iter()
            .find(|t| t.object.name_any() == name)
            .map(|t| t.object.spec.clone())
    };
    manifests
        .gateways
        .iter()
        .map(|g| {
            let class = manifests
                .gateway_classes
                .iter()
                .map(|c| &c.object)
                .find(|c| c.name_any() == g.object.spec.gateway_class_name);
            let state = match class {
                Some(class) if gateway_class::decide::ours(class) => {
                    let wanted = gateway_class::decide::parameters_ref(class).ok().flatten();
                    let parameters = wanted.map(|(ns, name)| {
                        manifests
                            .gateway_parameters
                            .iter()
                            .find(|p| {
                                p.object.name_any() == name
                                    && p.object.namespace().as_deref() == Some(ns.as_str())
                            })
                            .map(|p| &p.object.spec)
                    });
                    let observed = gateway_class::decide::ClassObserved {
                        parameters,
                        default_tailnet: default.clone(),
                        tailnet: &lookup,
                    };
                    ClassState::Ours(gateway_class::decide::verdict(class, &observed))
                }
                _ => ClassState::NotOurs,
            };
            (with_uid(g.object.clone()), state)
        })
        .collect()
}

/// The Gateways' entrances as the Tailnet controller reads them (`intents::of_tailnet`).
fn gateway_intents(manifests: &Manifests, tailnet: &Tailnet) -> Vec<IngressIntent> {
    gateway_classes(manifests)
        .iter()
        .filter_map(|(g, class)| gateway::intents::intent_in(g, class, None, &tailnet.name_any()))
        .collect()
}

/// The Gateway controller's objects for every Gateway of a class of ours (its certificate copy
/// as the CLI prints it: redacted).
fn gateway_decisions(manifests: &Manifests, inputs: &Inputs<'_>) -> Vec<Value> {
    let mut facts = ClusterFacts::default();
    let mut key_pairs = BTreeMap::new();
    for s in &manifests.tls_secrets {
        let key = ObjectKey::new(
            s.object.namespace().unwrap_or_default(),
            s.object.name_any(),
        );
        let stored = crate::cli::render_gateway::as_stored(&s.object);
        let pair = gateway::gather::key_pair(&stored).expect("a usable certificate");
        facts.secrets.insert(key.clone(), SecretFact::TlsKeyPair);
        key_pairs.insert(key, pair);
    }
    facts.services = inputs.backends.services.keys().cloned().collect();
    use crate::cli::render_gateway::objects;
    let classes = gateway_classes(manifests);
    let others: Vec<Arc<Gateway>> = classes.iter().map(|(g, _)| Arc::new(g.clone())).collect();
    let mut out = Vec::new();
    for (g, class) in classes
        .iter()
        .filter(|(_, c)| matches!(c, ClassState::Ours(Ok(_))))
    {
        let mut observation =
            Observation::<GatewayObserved>::only_access(Ok(inputs.access.clone()));
        observation.kind = GatewayObserved {
            class: class.clone(),
            others: others.clone(),
            http_routes: objects(&manifests.http_routes),
            tls_routes: objects(&manifests.tls_routes),
            tcp_routes: objects(&manifests.tcp_routes),
            reference_grants: objects(&manifests.reference_grants),
            facts: facts.clone(),
            key_pairs: key_pairs.clone(),
            backends: inputs.backends.clone(),
        };
        // A Gateway's intent is `()`: its spec is the Gateway API decision's to judge.
        agent::validated::<GatewayEntrance>(g, inputs.now).expect("valid Gateway");
        let decision =
            agent::decide::<GatewayEntrance>(g, &(), &observation, inputs.config, inputs.now)
                .expect("Gateway decision");
        let plan = decision.agent.expect("Gateway plan");
        let o = plan.objects.as_ref().expect("Gateway agent objects");
        out.extend([
            typed(&o.agent.service_account),
            typed(&o.agent.role),
            typed(&o.agent.role_binding),
            typed(&o.agent.state_secret),
            typed(&o.agent.config_map),
            typed(&o.agent.deployment),
            typed(&o.agent.network_policy),
        ]);
        if let Some(copy) = &o.certificates {
            out.push(typed(&crate::cli::render_gateway::redacted(copy)));
        }
    }
    out
}

fn assert_same_output(inputs: &[PathBuf], observed_path: &Path) {
    let manifests = Manifests::load(inputs, OPERATOR_NAMESPACE).expect("manifests");
    let observed: Observed =
        serde_json::from_str(&std::fs::read_to_string(observed_path).expect("observed file"))
            .expect("observed state");
    let (objects, policy, dns, kinds) = controllers_output(&manifests, &observed);
    let tailnet = manifests.tailnets[0].object.name_any();
    // `render --installation-id` takes the operator's installation id (what `run
    // --installation-id` takes); both write `<id>/<tailnet>` into the marker.
    let marker = config().installation_id;
    let cli_objects = keyed(yaml_documents(&cli_part(
        inputs,
        observed_path,
        "objects",
        &marker,
    )));
    assert!(
        objects.len() >= 10,
        "only {} objects: {:?}",
        objects.len(),
        objects.keys()
    );
    assert_eq!(
        cli_objects.keys().collect::<Vec<_>>(),
        objects.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (key, controller) in &objects {
        pretty_assertions::assert_eq!(&cli_objects[key], controller, "{key}");
    }
    let cli_policy = cli_part(inputs, observed_path, "policy", &marker);
    pretty_assertions::assert_eq!(cli_policy.trim_end(), policy.trim_end(), "policy document");
    assert_eq!(
        cli_policy.lines().next(),
        Some(
            format!(
                "// tailnet-operator-installation: {}",
                tailnet::decide::installation_id(&config(), &tailnet)
            )
            .as_str()
        ),
        "the operator's ownership marker"
    );
    let cli_dns = yaml_documents(&cli_part(inputs, observed_path, "dns", &marker));
    pretty_assertions::assert_eq!(cli_dns.first(), dns.as_ref(), "DNS ConfigMap");
    assert!(dns.is_some(), "both sets configure DNS");
    // Every target classified alike: the CLI's note says the class (and node) the
    // controller puts into status.targets[].kind (and .node).
    let text = cli_text(inputs, observed_path, &marker);
    for (prefix, kind, node) in &kinds {
        let line = text
            .lines()
            .find(|l| l.contains(prefix.as_str()))
            .unwrap_or_else(|| panic!("no CLI note for {prefix:?} in\n{text}"));
        assert!(line.contains(&format!(" is {kind}, ")), "{kind}: {line}");
        if let Some(node) = node {
            assert!(line.contains(&format!("node {node}")), "{node}: {line}");
        }
    }
}

/// The CLI's whole text output (notes included).
fn cli_text(inputs: &[PathBuf], observed: &Path, installation_id: &str) -> String {
    let mut argv: Vec<String> = vec!["render".into()];
    argv.extend(inputs.iter().map(|p| p.display().to_string()));
    argv.extend(
        [
            "--observed",
            &observed.display().to_string(),
            "--operator-namespace",
            OPERATOR_NAMESPACE,
            "--installation-id",
            installation_id,
        ]
        .map(String::from),
    );
    let cli = Cli::try_parse_from(argv).expect("render arguments");
    render(&cli.render).expect("render")
}

#[test]
fn examples_render_the_same_through_the_cli_and_the_controllers() {
    let examples = repo().join("examples");
    let inputs: Vec<PathBuf> = [
        "10-tailnet.yaml",
        "11-base-policy.yaml",
        "20-egress.yaml",
        "21-egress-devices.yaml",
        "30-ingress.yaml",
    ]
    .iter()
    .map(|f| examples.join(f))
    .collect();
    assert_same_output(&inputs, &examples.join("observed/headscale-state.json"));
}

#[test]
fn the_rich_set_renders_the_same_through_the_cli_and_the_controllers() {
    let rich = repo().join("crates/operator/tests/fixtures/rich");
    assert_same_output(&[rich.join("manifests.yaml")], &rich.join("observed.json"));
    // The device targets: classified from the observed nodes, the node addresses granted
    // (IPv4 and IPv6, no route), the MagicDNS name left to the base.
    let manifests =
        Manifests::load(&[rich.join("manifests.yaml")], OPERATOR_NAMESPACE).expect("manifests");
    let observed: Observed = serde_json::from_str(
        &std::fs::read_to_string(rich.join("observed.json")).expect("observed"),
    )
    .expect("observed state");
    let (_, policy, _, kinds) = controllers_output(&manifests, &observed);
    let kind_of = |target: &str| {
        kinds
            .iter()
            .find(|(p, _, _)| p.ends_with(&format!("target {target} ")))
            .map(|(_, k, n)| (*k, n.clone()))
    };
    assert_eq!(kind_of("nas"), Some(("TailnetNode", Some("nas".into()))));
    assert_eq!(kind_of("nas-v6"), Some(("TailnetNode", Some("nas".into()))));
    assert_eq!(kind_of("nas-web"), Some(("MagicDNS", Some("nas".into()))));
    assert_eq!(kind_of("site-db-v6"), Some(("SubnetRoute", None)));
    assert_eq!(kind_of("site-wiki"), Some(("DNSName", None)));
    for grant in [
        r#""dst": ["100.64.0.20/32"], "ip": ["tcp:445"]"#,
        r#""dst": ["fd7a:115c:a1e0::20/128"], "ip": ["tcp:445"]"#,
    ] {
        assert!(policy.contains(grant), "{grant} in\n{policy}");
    }
    assert!(
        !policy.contains("tcp:443\"]}, // nas"),
        "no grant for the name"
    );
}

/// A contributor's fragment: `render --fragment` prints byte for byte what the controller
/// publishes in `<tailnet>-policy-fragment` for the same inputs.
#[test]
fn a_contributors_fragment_is_the_same_through_the_cli_and_the_controller() {
    let examples = repo().join("examples");
    let dir = std::env::temp_dir().join(format!("tno-fragment-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let tailnet_text = std::fs::read_to_string(examples.join("10-tailnet.yaml")).expect("tailnet");
    assert!(
        tailnet_text.contains("mode: DryRun"),
        "the example's mode changed"
    );
    let contributing = tailnet_text.replace("mode: DryRun", "mode: Contribute");
    std::fs::write(dir.join("10-tailnet.yaml"), contributing).expect("write");
    let inputs: Vec<PathBuf> = vec![
        dir.join("10-tailnet.yaml"),
        examples.join("20-egress.yaml"),
        examples.join("30-ingress.yaml"),
    ];
    let observed_path = examples.join("observed/headscale-state.json");
    let cli = cli_part(&inputs, &observed_path, "fragment", "preview");

    let manifests = Manifests::load(&inputs, OPERATOR_NAMESPACE).expect("manifests");
    let observed: Observed =
        serde_json::from_str(&std::fs::read_to_string(&observed_path).expect("observed"))
            .expect("observed state");
    let tailnet: Tailnet = with_uid(manifests.tailnets[0].object.clone());
    let observation = TailnetObservation {
        contributor_reads: Vec::new(),
        contribution_store: Default::default(),
        headscale: Ok("v0.29.2".into()),
        nodes: Some(observed.nodes.clone()),
        live_policy: Some("{}".into()),
        api_key: None,
        base: Ok(None),
        services: Vec::new(),
        gateways: vec![],
        egresses: manifests
            .egresses
            .iter()
            .map(|e| with_uid(e.object.clone()))
            .collect(),
        ingresses: manifests
            .ingresses
            .iter()
            .map(|i| with_uid(i.object.clone()))
            .collect(),
        egress_cluster_ips: BTreeMap::new(),
        dns_config_map: None,
    };
    let plan = tailnet::decide::plan(&tailnet, &observation, &config(), NOW.parse().expect("now"));
    let published = plan
        .fragment
        .and_then(|cm| cm.data)
        .and_then(|d| d.get(tailnet_api::fragment::FRAGMENT_KEY).cloned())
        .expect("the controller publishes a fragment");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(cli, published);
    assert!(published.contains("\"grants\""), "{published}");
    assert!(published.contains("tag:"), "{published}");
}

/// Gateways: the CLI prints the Gateway controller's agent objects (certificate copy
/// redacted) and the Tailnet controller's policy and DNS with the Gateways' entrances.
#[test]
fn gateways_render_the_same_through_the_cli_and_the_controllers() {
    use crate::cli::render_gateway::tests::{GATEWAY, GRANT, certificate_secret};
    let examples = repo().join("examples");
    let dir = tempfile::tempdir().expect("temp dir");
    let (secret, _) = certificate_secret();
    std::fs::write(dir.path().join("40-gateway.yaml"), GATEWAY).expect("write");
    std::fs::write(dir.path().join("41-grant.yaml"), GRANT).expect("write");
    std::fs::write(dir.path().join("42-secret.yaml"), secret).expect("write");
    let mut observed: Value = serde_json::from_str(
        &std::fs::read_to_string(examples.join("observed/headscale-state.json")).expect("observed"),
    )
    .expect("observed JSON");
    // The Gateway's node: its listener hostname gets a record.
    observed["nodes"]
        .as_array_mut()
        .expect("nodes")
        .push(serde_json::json!({
            "id": 40, "name": "tno-gw-infra-web", "tags": ["tag:tno-gw-infra-web"],
            "ipAddresses": ["100.64.0.40"], "availableRoutes": [], "approvedRoutes": [],
            "online": true,
        }));
    let observed_path = dir.path().join("observed.json");
    std::fs::write(&observed_path, observed.to_string()).expect("write");
    let mut inputs: Vec<PathBuf> = [
        "10-tailnet.yaml",
        "11-base-policy.yaml",
        "20-egress.yaml",
        "30-ingress.yaml",
    ]
    .iter()
    .map(|f| examples.join(f))
    .collect();
    inputs.extend(
        ["40-gateway.yaml", "41-grant.yaml", "42-secret.yaml"]
            .iter()
            .map(|f| dir.path().join(f)),
    );
    // The example Tailnet allows group:team-a, the parameters' source.
    assert_same_output(&inputs, &observed_path);
    let manifests = Manifests::load(&inputs, OPERATOR_NAMESPACE).expect("manifests");
    let observed: Observed = serde_json::from_value(observed).expect("observed state");
    let (objects, policy, dns, _) = controllers_output(&manifests, &observed);
    assert!(
        objects.contains_key("Deployment infra/tailnet-gateway-web"),
        "{:?}",
        objects.keys()
    );
    assert!(objects.contains_key("Secret infra/tailnet-gateway-web-tls"));
    assert!(!objects.keys().any(|k| k.contains("elsewhere")));
    assert!(policy.contains("tag:tno-gw-infra-web"), "{policy}");
    let hosts = dns.map(|d| d.to_string()).unwrap_or_default();
    assert!(hosts.contains("app.example.net"), "{hosts}");
}
