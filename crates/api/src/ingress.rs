//! `TailnetIngress`: a private TCP/HTTPS entrance from the tailnet to Services.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{KeyRef, TailnetRef};

/// Exposes Services to the tailnet through one agent (one tailnet identity, one access rule).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    doc = "Exposes Services of its namespace to the tailnet (TCP, or HTTPS terminated in the agent with a certificate for your own names) through one agent pod with one tailnet identity and one access rule (allowFrom).",
    group = "tailnet-operator.dev",
    version = "v1alpha1",
    kind = "TailnetIngress",
    namespaced,
    shortname = "tni",
    category = "tailnet-operator",
    status = "TailnetIngressStatus",
    printcolumn = r#"{"name":"Tailnet","type":"string","jsonPath":".spec.tailnetRef.name"}"#,
    printcolumn = r#"{"name":"Hostnames","type":"string","jsonPath":".status.summary"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.tailnetIPs[0]","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TailnetIngressSpec {
    pub tailnet_ref: TailnetRef,
    /// Tailnet principals allowed to connect (must be within the Tailnet's
    /// `policy.ingressSourceAllowlist`), e.g. `["group:team-a"]`.
    #[schemars(
        length(min = 1, max = 32),
        inner(regex(
            pattern = r"^(\*|group:[a-zA-Z0-9][-_.a-zA-Z0-9]*|tag:[a-z0-9][-a-z0-9]*|autogroup:[a-z][-a-z]*|[^\s@,:]+@[-.a-zA-Z0-9]*)$"
        ))
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub allow_from: Vec<String>,
    /// Certificate for all `http` exposes; without `secretName` a cert-manager Certificate is
    /// requested from the Tailnet's `defaults.tls.issuerRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<IngressTls>,
    /// What is exposed. `http` exposes sharing a port are virtual hosts (by SNI/Host).
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = Rule::new("self.all(a, self.all(b, a.port != b.port || (a.mode == 'http' && b.mode == 'http') || a.name == b.name))").message("a tcp expose needs a port of its own; only http exposes may share a port"))]
    #[x_kube(validation = Rule::new("self.all(a, self.all(b, a.name == b.name || a.dnsLabel != b.dnsLabel || a.port != b.port))").message("dnsLabel and port must be unique together"))]
    pub exposes: Vec<Expose>,
    /// Concurrent connection limits of the agent (defaults: 1024 per agent, 512 per
    /// listener, i.e. per tcp expose or https port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::egress::AgentLimits>,
    /// In-cluster clients (split horizon): the cluster's DNS never answers these names with a
    /// tailnet address (pods cannot route to one). With namespaces listed, the names resolve
    /// in-cluster to a ClusterIP Service in front of the agent, which serves the same
    /// certificate, virtual hosts and tcp exposes on its pod IP to pods of these namespaces
    /// only (its NetworkPolicy), without tailnet identity headers. Without (the default), the
    /// names are not in the cluster's records at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_cluster: Option<InCluster>,
}

/// Who may use an ingress from inside the cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InCluster {
    /// Namespaces whose pods may connect to the in-cluster Service (empty: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(
            length(min = 1, max = 63),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        )
    )]
    pub namespaces: Vec<String>,
}

impl TailnetIngressSpec {
    /// The namespaces of `spec.inCluster` (empty: no in-cluster entrance).
    pub fn in_cluster_namespaces(&self) -> &[String] {
        self.in_cluster
            .as_ref()
            .map(|c| c.namespaces.as_slice())
            .unwrap_or_default()
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressTls {
    /// Existing `kubernetes.io/tls` Secret in this namespace covering every http name and alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub secret_name: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.backend.tls) || self.mode == 'http'").message("backend.tls requires mode: http (tcp exposes forward bytes unchanged)"))]
#[x_kube(validation = Rule::new("!has(self.timeouts) || self.mode == 'http'").message("timeouts require mode: http"))]
pub struct Expose {
    /// Name of the expose, unique in this resource.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Fills `{name}` in the Tailnet's name templates.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub dns_label: String,
    /// Also publish the `ingressAliasTemplate` name.
    #[serde(default)]
    pub alias: bool,
    /// `http`: TLS terminated at the agent, HTTP reverse proxy; `tcp`: raw TCP forward.
    pub mode: ExposeMode,
    /// Port on the agent's tailnet address.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The in-cluster Service that receives the traffic.
    pub backend: Backend,
    /// HTTP timeouts (`http` mode only). Without them a request is not bounded as a whole and
    /// the backend's response headers are awaited for 60 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Timeouts>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExposeMode {
    Http,
    Tcp,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// Service name.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub service: String,
    /// Namespace of the Service (default: this TailnetIngress's namespace). Another namespace
    /// is only allowed for TailnetIngress objects in the operator namespace: elsewhere the
    /// chart's ValidatingAdmissionPolicy refuses it at apply time, and the operator reports
    /// `CrossNamespaceBackendNotAllowed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
    /// Service port number or name.
    pub port: IntOrString,
    /// Verified HTTPS to the backend (never an unverified fallback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BackendTls>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendTls {
    /// Name the backend's certificate must carry.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub server_name: String,
    /// CA bundle (PEM) in a ConfigMap of this resource's namespace (mounted into the agent).
    pub ca_config_map_ref: KeyRef,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// Bounds the whole exchange including the upload, e.g. `600s` or `10m`; a duration as in
    /// HTTPRoute's timeouts (GEP-2257: `1h30m`, `500ms`; Go forms such as `1.5h` are accepted
    /// too). More than 0 (omit the field for no bound), at most `168h`. WebSockets are exempt
    /// once established.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    pub request: Option<String>,
    /// Bounds the wait for the backend's response headers, e.g. `60s` (default `60s`); same
    /// format and limits as `request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    pub backend_request: Option<String>,
}

/// What the operator observed; written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TailnetIngressStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` plus `SpecValid`, `TailnetReady`, `SourcesAllowed`, `BackendsResolved`,
    /// `HostnamesUnique`, `CertificateReady`, `AgentReady`, `NodeOnline`, `PolicyEffective`,
    /// `BackendsReachable` (see docs/troubleshooting.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// e.g. `portal.team-a.lab.example.net (+2)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The generated tag of this ingress's node (`allowFrom` is granted access to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Headscale node id of the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Tailnet addresses of the agent's node (the DNS names point here).
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "tailnetIPs")]
    pub tailnet_ips: Vec<String>,
    /// Every hostname of every expose (names and aliases).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// `https://…` and `tcp://…` URLs a tailnet peer can use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    /// One entry per `spec.exposes` entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposes: Vec<ExposeStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExposeStatus {
    /// `spec.exposes[].name`.
    pub name: String,
    /// Hostnames of this expose (name, and alias when `alias: true`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// `Ready`, or `NotServed` (an `http` expose waits for a certificate covering every name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Why the expose is not served, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
