//! ReferenceGrant: a reference from an object in one namespace to an object in another is
//! allowed only when a ReferenceGrant in the target namespace lists the referring group, kind
//! and namespace in `from` and the target's group, kind and (optionally) name in `to`.

use tailnet_gateway_api::ReferenceGrant;

/// The referring side of a cross-namespace reference.
#[derive(Clone, Copy, Debug)]
pub struct From<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
}

/// The referenced side.
#[derive(Clone, Copy, Debug)]
pub struct To<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// Whether the reference is allowed: same namespace, or a grant in the target's namespace
/// permits it.
pub fn permitted(grants: &[ReferenceGrant], from: From<'_>, to: To<'_>) -> bool {
    from.namespace == to.namespace
        || grants.iter().any(|grant| {
            grant.metadata.namespace.as_deref() == Some(to.namespace)
                && grant.spec.from.iter().any(|f| {
                    f.group == from.group && f.kind == from.kind && f.namespace == from.namespace
                })
                && grant.spec.to.iter().any(|t| {
                    t.group == to.group
                        && t.kind == to.kind
                        && t.name.as_deref().is_none_or(|name| name == to.name)
                })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tailnet_gateway_api::ReferenceGrantSpec;
    use tailnet_gateway_api::referencegrant::{ReferenceGrantFrom, ReferenceGrantTo};

    fn grant(
        namespace: &str,
        from: (&str, &str, &str),
        to: (&str, &str, Option<&str>),
    ) -> ReferenceGrant {
        ReferenceGrant {
            metadata: ObjectMeta {
                name: Some("g".into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            spec: ReferenceGrantSpec {
                from: vec![ReferenceGrantFrom {
                    group: from.0.into(),
                    kind: from.1.into(),
                    namespace: from.2.into(),
                }],
                to: vec![ReferenceGrantTo {
                    group: to.0.into(),
                    kind: to.1.into(),
                    name: to.2.map(str::to_string),
                }],
            },
        }
    }

    const GW: &str = "gateway.networking.k8s.io";

    fn secret_ref(grants: &[ReferenceGrant]) -> bool {
        permitted(
            grants,
            From {
                group: GW,
                kind: "Gateway",
                namespace: "infra",
            },
            To {
                group: "",
                kind: "Secret",
                namespace: "web",
                name: "certificate",
            },
        )
    }

    #[test]
    fn same_namespace_needs_no_grant() {
        let allowed = permitted(
            &[],
            From {
                group: GW,
                kind: "HTTPRoute",
                namespace: "a",
            },
            To {
                group: "",
                kind: "Service",
                namespace: "a",
                name: "s",
            },
        );
        assert!(allowed);
    }

    #[test]
    fn a_matching_grant_permits_by_name_or_for_all_names() {
        let by_name = grant(
            "web",
            (GW, "Gateway", "infra"),
            ("", "Secret", Some("certificate")),
        );
        let all = grant("web", (GW, "Gateway", "infra"), ("", "Secret", None));
        assert!(secret_ref(&[by_name]));
        assert!(secret_ref(&[all]));
        assert!(!secret_ref(&[]));
    }

    /// Each wrong field of a grant refuses (conformance GatewaySecretInvalidReferenceGrant).
    #[test]
    fn a_grant_wrong_in_any_field_refuses() {
        let wrong = [
            grant(
                "app",
                (GW, "Gateway", "infra"),
                ("", "Secret", Some("certificate")),
            ),
            grant(
                "web",
                ("other", "Gateway", "infra"),
                ("", "Secret", Some("certificate")),
            ),
            grant(
                "web",
                (GW, "HTTPRoute", "infra"),
                ("", "Secret", Some("certificate")),
            ),
            grant(
                "web",
                (GW, "Gateway", "other"),
                ("", "Secret", Some("certificate")),
            ),
            grant(
                "web",
                (GW, "Gateway", "infra"),
                ("other", "Secret", Some("certificate")),
            ),
            grant(
                "web",
                (GW, "Gateway", "infra"),
                ("", "Service", Some("certificate")),
            ),
            grant(
                "web",
                (GW, "Gateway", "infra"),
                ("", "Secret", Some("other")),
            ),
        ];
        for g in &wrong {
            assert!(!secret_ref(std::slice::from_ref(g)), "{g:?}");
        }
        assert!(!secret_ref(&wrong));
    }
}
