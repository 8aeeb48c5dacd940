//! `Tailnet`: one Headscale server, its API credentials, DNS templates and policy ownership.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::KeyRef;

/// A Headscale tailnet that egresses and ingresses of this cluster connect to.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    doc = "A Headscale tailnet that egresses and ingresses of this cluster connect to: the server URL, the API key Secret, DNS templates, defaults, ownership of the Headscale policy and overrides for the agent pods. Cluster-scoped.",
    group = "tailnet-operator.dev",
    version = "v1alpha1",
    kind = "Tailnet",
    shortname = "tn",
    category = "tailnet-operator",
    status = "TailnetStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.policy.mode"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Headscale","type":"string","jsonPath":".status.headscaleVersion","priority":1}"#,
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".status.policy.summary","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.apiSecretRef) || (has(self.policy.mode) && self.policy.mode == 'Contribute')").message("spec.apiSecretRef is required unless spec.policy.mode is Contribute (a contributor without a key gets its agents' pre-auth keys and node facts from the owner)"))]
pub struct TailnetSpec {
    /// URL of the Headscale server, e.g. `https://control.example.net`.
    #[schemars(
        length(max = 2048),
        regex(pattern = r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    )]
    pub server: String,
    /// Secret in the operator namespace holding the bootstrap API key. The operator only reads it.
    /// Required unless `policy.mode` is `Contribute`: a contributor without it holds no
    /// Headscale key and reads its agents' pre-auth keys and node facts from Secret
    /// `<tailnet>-owner-keys` (operator namespace), which the owner writes (see
    /// docs/several-clusters.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_secret_ref: Option<KeyRef>,
    /// DNS entries the operator renders (it is not a DNS server; see docs/dns.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<TailnetDns>,
    /// Defaults for the resources that reference this Tailnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<TailnetDefaults>,
    /// Ownership of the Headscale policy.
    pub policy: TailnetPolicy,
    /// Overrides for the agent pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentOverrides>,
    /// The private CA that signed `server`'s certificate (a PEM bundle in a ConfigMap of the
    /// operator namespace). The operator's Headscale client trusts it besides the system
    /// roots, and every agent's tailscale container gets it (`SSL_CERT_DIR`), so tailscaled
    /// logs in over it. Not needed for a publicly trusted certificate.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "serverCA")]
    pub server_ca: Option<ServerCa>,
}

/// Where the CA bundle of the Headscale server is.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServerCa {
    /// A key of a ConfigMap in the operator namespace holding one or more PEM certificates
    /// (e.g. `{name: headscale-ca, key: ca.crt}`).
    pub config_map_ref: KeyRef,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TailnetDns {
    /// ConfigMap (in `hostsConfigMapNamespace`, default the operator namespace) that receives
    /// three keys: `hosts` (CoreDNS hosts format), `tailnet.server` (a CoreDNS server block to
    /// import) and `extra-records.json` (Headscale `dns.extra_records_path` format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub hosts_config_map: Option<String>,
    /// Namespace of `hostsConfigMap` (default: the operator namespace). Point it at the
    /// namespace CoreDNS runs in (e.g. `kube-system`) so CoreDNS can mount it; the operator
    /// server-side applies only its three keys, so a shared ConfigMap keeps its other keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub hosts_config_map_namespace: Option<String>,
    /// Hostname of each ingress expose; placeholders `{name}` (the expose's `dnsLabel`) and
    /// `{namespace}`, e.g. `{name}.{namespace}.lab.example.net`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^([a-z0-9.-]|\{name\}|\{namespace\})+$")
    )]
    #[x_kube(validation = Rule::new("self.contains('{name}')").message("must contain the {name} placeholder"))]
    pub ingress_name_template: Option<String>,
    /// Additional hostname for exposes with `alias: true`, e.g. `{name}.lab.example.net`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^([a-z0-9.-]|\{name\}|\{namespace\})+$")
    )]
    #[x_kube(validation = Rule::new("self.contains('{name}')").message("must contain the {name} placeholder"))]
    pub ingress_alias_template: Option<String>,
    /// Headscale's MagicDNS domain (`dns.base_domain` of its config), e.g. `ts.example.net`.
    /// With it, an egress target `<node>.<domain>` is recognised as the MagicDNS name of a
    /// node (its status then follows that node and says whether the policy grants it);
    /// without it only a node's short name (`nas`) is.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "magicDNSDomain"
    )]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub magic_dns_domain: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TailnetDefaults {
    /// Default TLS for TailnetIngress objects without `tls.secretName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<DefaultTls>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefaultTls {
    /// cert-manager issuer for the ingress certificates.
    pub issuer_ref: IssuerRef,
}

/// A cert-manager issuer reference.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// Name of the `Issuer` or `ClusterIssuer`.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// `Issuer` (in the ingress's namespace) or `ClusterIssuer`.
    #[serde(default)]
    pub kind: IssuerKind,
    /// API group of the issuer; `cert-manager.io` unless an external issuer is used.
    #[serde(default = "default_issuer_group")]
    #[schemars(length(min = 1, max = 253))]
    pub group: String,
}

fn default_issuer_group() -> String {
    "cert-manager.io".to_string()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum IssuerKind {
    #[default]
    Issuer,
    ClusterIssuer,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.contributors) || self.contributors.all(c, c.tagPrefix != self.tagPrefix && !c.tagPrefix.startsWith(self.tagPrefix + '-') && !self.tagPrefix.startsWith(c.tagPrefix + '-'))").message("a contributor's tagPrefix must differ from this Tailnet's and not extend it (tags would overlap)"))]
#[x_kube(validation = Rule::new("!has(self.contributors) || !has(self.mode) || self.mode != 'Contribute'").message("a Tailnet in mode Contribute has no contributors of its own (the owner lists them)"))]
pub struct TailnetPolicy {
    /// ConfigMap (operator namespace) whose key `policy.hujson` holds the human-owned base policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub base_config_map: Option<String>,
    /// `DryRun` renders and checks only; `Apply` writes the policy to Headscale.
    #[serde(default)]
    pub mode: PolicyMode,
    /// Owners of every generated tag, e.g. `["group:platform"]`.
    #[schemars(
        length(min = 1, max = 32),
        inner(regex(
            pattern = r"^(\*|group:[a-zA-Z0-9][-_.a-zA-Z0-9]*|tag:[a-z0-9][-a-z0-9]*|autogroup:[a-z][-a-z]*|[^\s@,:]+@[-.a-zA-Z0-9]*)$"
        ))
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub tag_owners: Vec<String>,
    /// Principals whose advertised routes may be approved for egress targets, e.g. `["tag:router"]`.
    #[serde(default)]
    #[schemars(
        length(max = 32),
        inner(regex(
            pattern = r"^(\*|group:[a-zA-Z0-9][-_.a-zA-Z0-9]*|tag:[a-z0-9][-a-z0-9]*|autogroup:[a-z][-a-z]*|[^\s@,:]+@[-.a-zA-Z0-9]*)$"
        ))
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub route_approvers: Vec<String>,
    /// What a TailnetIngress may put into `allowFrom`.
    #[serde(default)]
    #[schemars(
        length(max = 64),
        inner(regex(
            pattern = r"^(\*|group:[a-zA-Z0-9][-_.a-zA-Z0-9]*|tag:[a-z0-9][-a-z0-9]*|autogroup:[a-z][-a-z]*|[^\s@,:]+@[-.a-zA-Z0-9]*)$"
        ))
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub ingress_source_allowlist: Vec<String>,
    /// Prefix of generated tags: `tag:<prefix>-egress-<name>`, `tag:<prefix>-ingress-<ns>-<name>`.
    #[serde(default = "default_tag_prefix")]
    #[schemars(length(max = 16), regex(pattern = r"^[a-z][-a-z0-9]{0,15}$"))]
    pub tag_prefix: String,
    /// Other installations (clusters) on the same Headscale whose policy fragments this
    /// Tailnet merges into the one document it writes (owner only: `DryRun`/`Apply`). Each
    /// entry is checked against the contributor's tag prefix and limits; what fails is
    /// refused and reported in `status.contributors`. See docs/several-clusters.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = Rule::new("self.all(c, self.exists_one(d, d.tagPrefix == c.tagPrefix))").message("contributor tag prefixes must be unique"))]
    #[x_kube(validation = Rule::new("self.all(c, self.all(d, c.name == d.name || (!c.tagPrefix.startsWith(d.tagPrefix + '-') && !d.tagPrefix.startsWith(c.tagPrefix + '-'))))").message("one contributor's tag prefix must not extend another's (tags would overlap)"))]
    pub contributors: Vec<Contributor>,
    /// Notices of the rendered policy that `Apply` acts on anyway. `BaseHadNoRules`: the base
    /// states neither `acls` nor `grants`, which Headscale treats as allow-all, so applying
    /// the generated grants denies everything else. Without this entry `Apply` refuses such
    /// a document (`PolicyApplied=False`, reason `WouldLockDown`; the live policy stays),
    /// unless the live policy already is this installation's and states rules. The fix that
    /// needs no acceptance: give the base its own rules (docs/prerequisites.md has a starter).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub accepted_notices: Vec<AcceptedNotice>,
}

/// A policy notice a Tailnet accepts in `Apply` (see `spec.policy.acceptedNotices`).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum AcceptedNotice {
    /// Applying turns an allow-all tailnet deny-by-default except the generated grants.
    BaseHadNoRules,
}

/// An installation that contributes a policy fragment (its Tailnet runs `mode: Contribute`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Contributor {
    /// Name of the contributor (a cluster, e.g. `cosmos`): used in comments and the status.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// The contributor's `policy.tagPrefix`: every tag it may contribute starts with
    /// `tag:<prefix>-`. Must differ from this Tailnet's prefix and every other contributor's.
    #[schemars(length(max = 16), regex(pattern = r"^[a-z][-a-z0-9]{0,15}$"))]
    pub tag_prefix: String,
    /// Where the fragment is read.
    pub source: FragmentSource,
    /// What the contributor's entries may name beyond its own tags.
    #[serde(default)]
    pub limits: ContributorLimits,
    /// Where the owner writes the contributor's agents' pre-auth keys and the node facts its
    /// status needs, so that the contributor holds no Headscale key (its Tailnet has no
    /// `apiSecretRef`). Unset: nothing is written (the contributor holds its own key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeysDelivery>,
}

/// One Secret in a contributor's cluster that the owner writes (keys `feed.json`): its
/// agents' single-use pre-auth keys (tags under its prefix, only for tags its accepted
/// fragment lists and that have no node yet) and the node facts its conditions need.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeysDelivery {
    /// Secret (operator namespace) and key holding a kubeconfig for the contributor's cluster
    /// (may be the fragment's): its user may `get`, `update` and `patch` that one Secret.
    pub secret_ref: KeyRef,
    /// The contributor's operator namespace.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: String,
    /// Name of the Secret there: `<its tailnet>-owner-keys` (its operator creates it empty).
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub secret: String,
}

/// Where a contributor's fragment is read: exactly one of the two.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.configMap) != has(self.kubeconfig)").message("set exactly one of configMap and kubeconfig"))]
pub struct FragmentSource {
    /// A ConfigMap in the operator namespace holding the fragment under key `fragment.json`
    /// (delivered through Git, e.g. the output of `tailnet-operator render --fragment`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub config_map: Option<String>,
    /// The contributor's cluster: a kubeconfig in a Secret of the operator namespace, with
    /// only `get`/`watch` on the one fragment ConfigMap there (see docs/several-clusters.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<KubeconfigSource>,
}

/// A fragment ConfigMap in another cluster, read with a kubeconfig from a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigSource {
    /// Secret (operator namespace) and key holding the kubeconfig.
    pub secret_ref: KeyRef,
    /// Namespace of the fragment ConfigMap in the contributor's cluster (its operator namespace).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: String,
    /// Name of the fragment ConfigMap there: `<its tailnet>-policy-fragment`.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub config_map: String,
}

/// What a contributor's fragment may ask for besides its own tags.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContributorLimits {
    /// Sources its ingress grants may name (exact strings, e.g. `group:team-b`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub ingress_source_allowlist: Vec<String>,
    /// Where its egress grants may lead: CIDRs (`192.0.2.0/24`, `fd00::/64`) or host names.
    /// Empty: no egress grant is accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub egress_destinations: Vec<String>,
    /// DNS suffixes its ingress records may use (`cosmos.example.net` allows
    /// `portal.cosmos.example.net`). Empty: no record is accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 253)))]
    pub dns_suffixes: Vec<String>,
}

pub fn default_tag_prefix() -> String {
    "tno".to_string()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum PolicyMode {
    #[default]
    DryRun,
    Apply,
    /// Another installation owns the policy: render this installation's fragment and
    /// publish it in ConfigMap `<tailnet>-policy-fragment` (operator namespace); never write
    /// the policy, DNS records or route approvals to Headscale.
    Contribute,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentOverrides {
    /// Image of the tailnet-agent container. Default: the operator's `--agent-image` (chart
    /// value `agent.image`), else `ghcr.io/tailnet-operator/tailnet-agent:v<operator version>`,
    /// a tag, not a digest; pin a digest here (`repo@sha256:...`) if you need one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Image of the tailscale container (the pod runs its `/usr/local/bin/tailscaled`).
    /// Default: the operator's `--tailscale-image` (chart value `agent.tailscaleImage`), else
    /// `ghcr.io/tailnet-operator/tailnet-tailscaled:v<operator version>` (tailscaled with only
    /// the features an agent uses); the official `ghcr.io/tailscale/tailscale` image works too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub tailscale_image: Option<String>,
    /// Resources of the tailnet-agent container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Resources of the tailscale container. Default: requests 20m CPU and 64Mi memory, limit
    /// 256Mi memory. Its memory limit also sets tailscaled's `GOMEMLIMIT` to 90 % of it (the Go
    /// runtime collects harder near the limit instead of being OOM-killed); without a memory
    /// limit there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tailscale_resources: Option<ResourceRequirements>,
    /// Pull Secrets (in each agent's namespace) for private copies of the agent images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Node labels the agent pods must match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the agent pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Affinity of the agent pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// PriorityClass of the agent pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
    /// Log filter of the tailnet-agent container (its `RUST_LOG`): a level (`error`, `warn`,
    /// `info`, `debug`, `trace`) or comma-separated directives such as
    /// `info,tailnet_agent::proxy=debug` (access logs have target `access`). Default: `info`.
    /// Changing it restarts the agent pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9_:.=,-]+$"))]
    pub log_level: Option<String>,
    /// See [`AgentLogFormat`] (the CRD shows the type's description).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_format: Option<AgentLogFormat>,
}

/// Log format of the tailnet-agent container: `text` (default) or `json` (one flat JSON object
/// per line, the shape of the operator's `--log-format json`). Changing it restarts the agent
/// pods.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AgentLogFormat {
    /// Human-readable lines.
    Text,
    /// One flat JSON object per line.
    Json,
}

impl AgentLogFormat {
    /// The agent's `--log-format` value.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentLogFormat::Text => "text",
            AgentLogFormat::Json => "json",
        }
    }
}

/// What the operator observed; written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TailnetStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` plus `HeadscaleReachable`, `BaseValid`, `PolicyApplied`, `DNSRendered`
    /// (see docs/troubleshooting.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Version reported by Headscale's `/version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headscale_version: Option<String>,
    /// The rendered and the applied policy (the document itself is in ConfigMap
    /// `<tailnet>-rendered-policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyStatus>,
    /// Owner: what each listed contributor's fragment came to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contributors: Vec<ContributorStatus>,
    /// Contributor (`mode: Contribute`): the published fragment and how much of it is live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragment: Option<FragmentStatus>,
}

/// Values of `status.contributors[].state`.
pub mod contributor_state {
    pub const ACCEPTED: &str = "Accepted";
    pub const PARTLY_REFUSED: &str = "PartlyRefused";
    pub const REFUSED: &str = "Refused";
    pub const STALE: &str = "Stale";
}

/// The owner's verdict on one contributor's fragment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContributorStatus {
    pub name: String,
    /// `Accepted`, `PartlyRefused`, `Refused` (malformed: nothing of this version merged),
    /// `Stale` (unreadable: the last accepted fragment stays merged), `Missing` (never read).
    pub state: String,
    /// SHA-256 of the fragment in the policy now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged_hash: Option<String>,
    /// When the merged fragment was last read successfully (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_read: Option<String>,
    /// Entries merged: tags, grants, routes, DNS records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<String>,
    /// Refused entries with the reason (at most 20; `message` of the condition says how many).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
    /// Why the fragment could not be read or parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `keys`: what the owner delivered to the contributor's Secret (how many nodes,
    /// which tags have a pre-auth key waiting), or why it could not. Never a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<String>,
}

/// A contributor's published fragment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FragmentStatus {
    /// ConfigMap (operator namespace) holding it.
    pub config_map: String,
    /// SHA-256 of `fragment.json`.
    pub hash: String,
    /// e.g. `3 tags, 4 grants, 1 route, 2 DNS records`.
    pub summary: String,
    /// Entries not (yet) in the live policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_live: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// SHA-256 of the rendered document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendered_hash: Option<String>,
    /// SHA-256 of the document the operator last wrote to Headscale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_hash: Option<String>,
    /// One-line summary, e.g. `3 tags, 4 grants, 1 route`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Resources (`Kind/namespace/name`) whose grants are live in Headscale.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effective_for: Vec<String>,
}

/// The installation id written into a Tailnet's policy ownership marker
/// (`// tailnet-operator-installation: <this>`): `<installation id>/<tailnet name>`. The
/// operator's installation id defaults to the uid of namespace kube-system
/// (`kubectl get ns kube-system -o jsonpath='{.metadata.uid}'`); `tailnet-operator render
/// --installation-id` takes the same value, so preview and operator write the same line.
pub fn marker_installation_id(installation_id: &str, tailnet: &str) -> String {
    format!("{installation_id}/{tailnet}")
}
