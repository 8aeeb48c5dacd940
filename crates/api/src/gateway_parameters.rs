//! `TailnetGatewayParameters`: what a GatewayClass of `tailnet-operator.dev/gateway` names in
//! its `parametersRef` — the Tailnet its Gateways join and who may reach them. Pure: the type
//! and the checks that decide the class's `Accepted` condition.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::common::TailnetRef;
use crate::tailnet::TailnetSpec;
use crate::validate::FieldError;

/// The `kind` a GatewayClass's `parametersRef` names (group [`crate::GROUP`]).
pub const KIND: &str = "TailnetGatewayParameters";

/// Parameters of a GatewayClass whose `controllerName` is `tailnet-operator.dev/gateway`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    doc = "Parameters of a Gateway API GatewayClass handled by tailnet-operator (controllerName tailnet-operator.dev/gateway): the Tailnet its Gateways join and the tailnet principals granted access to their listener ports.",
    group = "tailnet-operator.dev",
    version = "v1alpha1",
    kind = "TailnetGatewayParameters",
    plural = "tailnetgatewayparameters",
    namespaced,
    shortname = "tngwp",
    category = "tailnet-operator",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Tailnet","type":"string","jsonPath":".spec.tailnetRef.name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TailnetGatewayParametersSpec {
    /// The Tailnet the class's Gateways join (default: the only Tailnet of the cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tailnet_ref: Option<TailnetRef>,
    /// Tailnet principals granted access to every listener port of the class's Gateways; each
    /// must be within the Tailnet's `policy.ingressSourceAllowlist`. Empty: no grant (nobody on
    /// the tailnet reaches the Gateways until the policy allows it otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(regex(
            pattern = r"^(\*|group:[a-zA-Z0-9][-_.a-zA-Z0-9]*|tag:[a-z0-9][-a-z0-9]*|autogroup:[a-z][-a-z]*|[^\s@,:]+@[-.a-zA-Z0-9]*)$"
        ))
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub allow_from: Vec<String>,
    /// In-cluster clients (split horizon), as a TailnetIngress's `spec.inCluster`: the
    /// cluster's DNS never answers the Gateways' listener hostnames with a tailnet address.
    /// With namespaces listed, each Gateway of the class gets a ClusterIP Service in front of
    /// its agent serving the same listeners (certificates, routes) on the pod IP to pods of
    /// these namespaces only (its NetworkPolicy), without tailnet identity headers, and its
    /// precise listener hostnames resolve to that Service in-cluster. Without (the default),
    /// the names are not in the cluster's records at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_cluster: Option<crate::ingress::InCluster>,
}

/// The parameters of a class, checked against its Tailnet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayParameters {
    /// `None`: the default Tailnet.
    pub tailnet: Option<String>,
    pub allow_from: Vec<String>,
    /// `spec.inCluster.namespaces`, sorted and unique (empty: no in-cluster entrance).
    pub in_cluster_namespaces: Vec<String>,
}

/// Checks `spec` in the context of its Tailnet (`tailnet`: the Tailnet's spec, `None` when it
/// does not exist): principals well-formed and within `ingressSourceAllowlist`. Errors name
/// the field and the fix.
pub fn check(
    spec: &TailnetGatewayParametersSpec,
    tailnet_name: &str,
    tailnet: Option<&TailnetSpec>,
) -> Result<GatewayParameters, Vec<FieldError>> {
    let mut errors = Vec::new();
    let Some(tailnet) = tailnet else {
        return Err(vec![FieldError::new(
            "spec.tailnetRef.name",
            format!("Tailnet {tailnet_name} does not exist; name an existing Tailnet"),
        )]);
    };
    let allowed = &tailnet.policy.ingress_source_allowlist;
    for (i, source) in spec.allow_from.iter().enumerate() {
        let field = format!("spec.allowFrom[{i}]");
        if !crate::validate::is_principal(source) {
            errors.push(FieldError::new(
                field,
                format!("{source:?} is not a policy principal; use group:<name>, tag:<name>, autogroup:<name> or <user>@"),
            ));
        } else if !allowed.contains(source) {
            errors.push(FieldError::new(
                field,
                format!(
                    "{source} is not in Tailnet {tailnet_name}'s policy.ingressSourceAllowlist [{}]; remove it or ask the platform team to allow it",
                    allowed.join(", ")
                ),
            ));
        }
    }
    if errors.is_empty() {
        let mut in_cluster_namespaces: Vec<String> = spec
            .in_cluster
            .as_ref()
            .map(|c| c.namespaces.clone())
            .unwrap_or_default();
        in_cluster_namespaces.sort();
        in_cluster_namespaces.dedup();
        Ok(GatewayParameters {
            tailnet: spec.tailnet_ref.as_ref().map(|t| t.name.clone()),
            allow_from: spec.allow_from.clone(),
            in_cluster_namespaces,
        })
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tailnet(allowlist: &[&str]) -> TailnetSpec {
        let mut spec: TailnetSpec = serde_json::from_value(serde_json::json!({
            "server": "https://hs.example.net",
            "apiSecretRef": {"name": "k", "key": "k"},
            "policy": {"tagOwners": ["group:ops"]},
        }))
        .expect("tailnet fixture");
        spec.policy.ingress_source_allowlist = allowlist.iter().map(|s| s.to_string()).collect();
        spec
    }

    fn spec(tailnet: Option<&str>, allow: &[&str]) -> TailnetGatewayParametersSpec {
        TailnetGatewayParametersSpec {
            tailnet_ref: tailnet.map(|name| TailnetRef { name: name.into() }),
            allow_from: allow.iter().map(|s| s.to_string()).collect(),
            in_cluster: None,
        }
    }

    #[test]
    fn sources_within_the_allowlist_are_accepted() {
        let t = tailnet(&["group:team-a", "tag:ci"]);
        let got = check(&spec(Some("demo"), &["group:team-a"]), "demo", Some(&t));
        assert_eq!(
            got,
            Ok(GatewayParameters {
                tailnet: Some("demo".into()),
                allow_from: vec!["group:team-a".into()],
                in_cluster_namespaces: Vec::new(),
            })
        );
        // In-cluster namespaces: sorted and unique.
        let mut in_cluster = spec(Some("demo"), &[]);
        in_cluster.in_cluster = Some(crate::ingress::InCluster {
            namespaces: vec!["team-b".into(), "team-a".into(), "team-b".into()],
        });
        assert_eq!(
            check(&in_cluster, "demo", Some(&t)).map(|p| p.in_cluster_namespaces),
            Ok(vec!["team-a".to_string(), "team-b".to_string()])
        );
        // No sources: accepted (no grant).
        assert_eq!(
            check(&spec(None, &[]), "demo", Some(&t)),
            Ok(GatewayParameters::default())
        );
    }

    #[test]
    fn each_refused_source_names_its_field() {
        let t = tailnet(&["group:team-a"]);
        let errors = check(
            &spec(None, &["group:team-a", "group:other", "not a principal"]),
            "demo",
            Some(&t),
        )
        .expect_err("refused");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.allowFrom[1]", "spec.allowFrom[2]"]);
        assert!(errors[0].message.contains("ingressSourceAllowlist"));
        assert!(errors[1].message.contains("not a policy principal"));
    }

    #[test]
    fn a_missing_tailnet_is_named() {
        let errors = check(&spec(Some("gone"), &[]), "gone", None).expect_err("refused");
        assert_eq!(errors[0].field, "spec.tailnetRef.name");
        assert!(errors[0].message.contains("Tailnet gone does not exist"));
    }
}
