//! The GatewayClass decisions (pure): which `parametersRef` a class of ours names, what the
//! parameters say once read and checked against their Tailnet, and the class's status
//! (conditions merged by type, `lastTransitionTime` kept while the status stays).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tailnet_api::gateway_parameters::{self, GatewayParameters, TailnetGatewayParametersSpec};
use tailnet_api::tailnet::TailnetSpec;
use tailnet_api::validate::summarize;
use tailnet_gateway_api::GatewayClass;
use tailnet_gateway_api::gatewayclass::GatewayClassStatus;
use tailnet_render::gateway::CONTROLLER_NAME;
use tailnet_render::gateway::class::{self, Parameters};

/// Whether the class is handled by this operator (never touch another controller's).
pub fn ours(class: &GatewayClass) -> bool {
    class.spec.controller_name == CONTROLLER_NAME
}

/// The `TailnetGatewayParameters` a class names (`namespace`, `name`); `Ok(None)`: no
/// `parametersRef`; `Err`: a reference this operator cannot follow, the message says why.
pub fn parameters_ref(class: &GatewayClass) -> Result<Option<(String, String)>, String> {
    let Some(reference) = &class.spec.parameters_ref else {
        return Ok(None);
    };
    if reference.group != tailnet_api::GROUP || reference.kind != gateway_parameters::KIND {
        return Err(format!(
            "spec.parametersRef names {}/{}; only {}/{} is supported",
            reference.group,
            reference.kind,
            tailnet_api::GROUP,
            gateway_parameters::KIND
        ));
    }
    let Some(namespace) = reference.namespace.clone().filter(|n| !n.is_empty()) else {
        return Err(format!(
            "spec.parametersRef.namespace is required: {} is namespaced",
            gateway_parameters::KIND
        ));
    };
    Ok(Some((namespace, reference.name.clone())))
}

/// What was read for a class: its parameters (if it names any) and its Tailnet.
#[derive(Clone)]
pub struct ClassObserved<'a> {
    /// `None` without a `parametersRef`; `Some(None)`: named but not found.
    pub parameters: Option<Option<&'a TailnetGatewayParametersSpec>>,
    /// The default Tailnet's name, or why there is none.
    pub default_tailnet: Result<String, String>,
    /// The spec of a Tailnet by name (`None`: it does not exist).
    pub tailnet: &'a dyn Fn(&str) -> Option<TailnetSpec>,
}

/// The class's parameters, checked, or why the class is not Accepted (naming the field).
/// No `parametersRef`: the default Tailnet and no `allowFrom` (no grant).
pub fn verdict(
    class: &GatewayClass,
    observed: &ClassObserved<'_>,
) -> Result<GatewayParameters, String> {
    let reference = parameters_ref(class)?;
    let default_spec = TailnetGatewayParametersSpec::default();
    let spec = match (&reference, observed.parameters) {
        (None, _) | (Some(_), None) => &default_spec,
        (Some((namespace, name)), Some(None)) => {
            return Err(format!(
                "spec.parametersRef: {} {namespace}/{name} does not exist; create it or fix the reference",
                gateway_parameters::KIND
            ));
        }
        (Some(_), Some(Some(spec))) => spec,
    };
    let tailnet_name = match &spec.tailnet_ref {
        Some(reference) => reference.name.clone(),
        None => observed.default_tailnet.clone().map_err(|why| {
            format!("no default Tailnet ({why}); set spec.tailnetRef of the parameters")
        })?,
    };
    let tailnet = (observed.tailnet)(&tailnet_name);
    let mut parameters =
        gateway_parameters::check(spec, &tailnet_name, tailnet.as_ref()).map_err(|errors| {
            let at = reference
                .as_ref()
                .map(|(ns, name)| format!("{} {ns}/{name}: ", gateway_parameters::KIND))
                .unwrap_or_default();
            format!("{at}{}", summarize(&errors))
        })?;
    parameters.tailnet = Some(tailnet_name);
    Ok(parameters)
}

/// The class's status from the verdict; `None` for a class of another controller. Conditions
/// keep their `lastTransitionTime` while their status stays.
pub fn status(
    class: &GatewayClass,
    verdict: &Result<GatewayParameters, String>,
    features: &[&str],
    now: Timestamp,
) -> Option<GatewayClassStatus> {
    let parameters = match verdict {
        Ok(_) => Parameters::Ok,
        Err(message) => Parameters::Invalid(tailnet_api::bounded::bounded(
            message,
            tailnet_api::bounded::MAX_MESSAGE_BYTES,
        )),
    };
    let mut decided = class::decide(class, &parameters, features)?;
    let mut merged = class
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    for condition in std::mem::take(&mut decided.conditions) {
        tailnet_api::conditions::upsert(&mut merged, condition, &Time(now));
    }
    decided.conditions = merged;
    Some(decided)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_api::common::TailnetRef;
    use tailnet_gateway_api::GatewayClassSpec;
    use tailnet_gateway_api::shared::ParametersReference;

    fn class(reference: Option<ParametersReference>) -> GatewayClass {
        GatewayClass {
            metadata: kube::api::ObjectMeta {
                name: Some("tailnet".into()),
                generation: Some(3),
                ..Default::default()
            },
            spec: GatewayClassSpec {
                controller_name: CONTROLLER_NAME.into(),
                parameters_ref: reference,
                description: None,
            },
            status: None,
        }
    }

    fn reference(group: &str, kind: &str, namespace: Option<&str>) -> ParametersReference {
        ParametersReference {
            group: group.into(),
            kind: kind.into(),
            name: "params".into(),
            namespace: namespace.map(str::to_string),
        }
    }

    fn ours_ref() -> ParametersReference {
        reference(tailnet_api::GROUP, gateway_parameters::KIND, Some("infra"))
    }

    fn tailnet_spec() -> TailnetSpec {
        serde_json::from_value(serde_json::json!({
            "server": "https://hs.example.net",
            "apiSecretRef": {"name": "k", "key": "k"},
            "policy": {"tagOwners": ["group:ops"], "ingressSourceAllowlist": ["group:team-a"]},
        }))
        .expect("tailnet fixture")
    }

    fn only_demo(name: &str) -> Option<TailnetSpec> {
        (name == "demo").then(tailnet_spec)
    }

    fn observed<'a>(
        parameters: Option<Option<&'a TailnetGatewayParametersSpec>>,
    ) -> ClassObserved<'a> {
        ClassObserved {
            parameters,
            default_tailnet: Ok("demo".into()),
            tailnet: &only_demo,
        }
    }

    fn spec(tailnet: Option<&str>, allow: &[&str]) -> TailnetGatewayParametersSpec {
        TailnetGatewayParametersSpec {
            tailnet_ref: tailnet.map(|name| TailnetRef { name: name.into() }),
            allow_from: allow.iter().map(|s| s.to_string()).collect(),
            in_cluster: None,
        }
    }

    #[test]
    fn another_controllers_class_is_not_ours_and_gets_no_status() {
        let mut other = class(None);
        other.spec.controller_name = "example.net/gateway".into();
        assert!(!ours(&other));
        assert!(ours(&class(None)));
        assert_eq!(
            status(
                &other,
                &Ok(GatewayParameters::default()),
                &[],
                Timestamp::UNIX_EPOCH
            ),
            None
        );
    }

    #[test]
    fn no_parameters_ref_means_the_default_tailnet_and_no_sources() {
        let got = verdict(&class(None), &observed(None));
        assert_eq!(
            got,
            Ok(GatewayParameters {
                tailnet: Some("demo".into()),
                allow_from: Vec::new(),
                in_cluster_namespaces: Vec::new(),
            })
        );
        let mut none = observed(None);
        none.default_tailnet = Err("no Tailnet exists".into());
        let why = verdict(&class(None), &none).expect_err("no default");
        assert!(why.contains("no default Tailnet"), "{why}");
    }

    #[test]
    fn valid_parameters_are_accepted() {
        let p = spec(Some("demo"), &["group:team-a"]);
        let got = verdict(&class(Some(ours_ref())), &observed(Some(Some(&p))));
        assert_eq!(
            got,
            Ok(GatewayParameters {
                tailnet: Some("demo".into()),
                allow_from: vec!["group:team-a".into()],
                in_cluster_namespaces: Vec::new(),
            })
        );
    }

    /// Every way the parameters can be wrong is refused with the field named.
    #[test]
    fn invalid_parameters_name_the_field() {
        let outside = spec(None, &["group:other"]);
        let missing_tailnet = spec(Some("gone"), &[]);
        let cases: Vec<(GatewayClass, ClassObserved<'_>, &str)> = vec![
            (
                class(Some(reference("example.net", "Params", Some("infra")))),
                observed(None),
                "only tailnet-operator.dev/TailnetGatewayParameters is supported",
            ),
            (
                class(Some(reference(
                    tailnet_api::GROUP,
                    gateway_parameters::KIND,
                    None,
                ))),
                observed(None),
                "spec.parametersRef.namespace is required",
            ),
            (
                class(Some(ours_ref())),
                observed(Some(None)),
                "TailnetGatewayParameters infra/params does not exist",
            ),
            (
                class(Some(ours_ref())),
                observed(Some(Some(&outside))),
                "spec.allowFrom[0]",
            ),
            (
                class(Some(ours_ref())),
                observed(Some(Some(&missing_tailnet))),
                "spec.tailnetRef.name",
            ),
        ];
        for (class, observed, wanted) in cases {
            let why = verdict(&class, &observed).expect_err(wanted);
            assert!(why.contains(wanted), "{why} should contain {wanted}");
        }
    }

    #[test]
    fn status_keeps_transition_times_while_the_status_stays() {
        let t0 = Timestamp::from_second(100).expect("time");
        let t1 = Timestamp::from_second(200).expect("time");
        let mut c = class(None);
        let ok = Ok(GatewayParameters::default());
        let first = status(&c, &ok, class::CORE_FEATURES, t0).expect("ours");
        assert_eq!(first.conditions[0].last_transition_time.0, t0);
        assert_eq!(first.conditions[0].status, "True");
        assert_eq!(first.supported_features.len(), class::CORE_FEATURES.len());
        c.status = Some(first);
        let again = status(&c, &ok, class::CORE_FEATURES, t1).expect("ours");
        assert_eq!(again.conditions[0].last_transition_time.0, t0);
        let refused = status(&c, &Err("spec.allowFrom[0]: no".into()), &[], t1).expect("ours");
        let condition = &refused.conditions[0];
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "InvalidParameters")
        );
        assert_eq!(condition.last_transition_time.0, t1);
        assert_eq!(condition.observed_generation, Some(3));
    }
}
