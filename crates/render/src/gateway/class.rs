//! GatewayClass acceptance: a class is ours when its `controllerName` is
//! [`super::CONTROLLER_NAME`]; it is Accepted when its parameters resolved (the parameters
//! kind is the caller's to read and check; this only turns the verdict into status).

use tailnet_api::conditions::{Status, condition};
use tailnet_gateway_api::GatewayClass;
use tailnet_gateway_api::conditions::gateway_class;
use tailnet_gateway_api::gatewayclass::{GatewayClassStatus, SupportedFeature};

use super::CONTROLLER_NAME;

/// The caller's verdict on a class's `parametersRef` (including "none given", which the
/// caller decides is acceptable or not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parameters {
    Ok,
    /// Missing, of an unsupported kind, or malformed: the message says which.
    Invalid(String),
}

/// The core features of the profiles this implementation serves (GATEWAY-HTTP, -TLS, -TCP).
pub const CORE_FEATURES: &[&str] = &[
    "Gateway",
    "HTTPRoute",
    "ReferenceGrant",
    "TCPRoute",
    "TLSRoute",
];

/// The extended features the agent implements and the conformance suite passed
/// (docs/conformance/gateway-api-v1.6.3-extended.yaml). Not claimed:
/// `HTTPRouteBackendRequestHeaderModification` (header filters on a `backendRef` apply only
/// when the rule has that one backend: its test fails).
pub const EXTENDED_FEATURES: &[&str] = &[
    "GatewayHTTPListenerIsolation",
    "GatewayPort8080",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendTimeout",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
];

/// What every GatewayClass of ours claims in `status.supportedFeatures` (the suite tests what
/// is claimed when it is not told otherwise): [`CORE_FEATURES`] and [`EXTENDED_FEATURES`].
pub fn supported_features() -> Vec<&'static str> {
    CORE_FEATURES
        .iter()
        .chain(EXTENDED_FEATURES)
        .copied()
        .collect()
}

/// The status of a class, or `None` when the class is not ours (another controller's; never
/// touch its status).
pub fn decide(
    class: &GatewayClass,
    parameters: &Parameters,
    supported_features: &[&str],
) -> Option<GatewayClassStatus> {
    if class.spec.controller_name != CONTROLLER_NAME {
        return None;
    }
    let generation = class.metadata.generation;
    let accepted = match parameters {
        Parameters::Ok => condition(
            gateway_class::ACCEPTED,
            Status::True,
            gateway_class::reasons::ACCEPTED,
            "handled by tailnet-operator",
            generation,
        ),
        Parameters::Invalid(message) => condition(
            gateway_class::ACCEPTED,
            Status::False,
            gateway_class::reasons::INVALID_PARAMETERS,
            message.as_str(),
            generation,
        ),
    };
    let mut features: Vec<&str> = supported_features.to_vec();
    features.sort_unstable();
    features.dedup();
    Some(GatewayClassStatus {
        conditions: vec![accepted],
        supported_features: features
            .into_iter()
            .map(|name| SupportedFeature {
                name: name.to_string(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tailnet_gateway_api::GatewayClassSpec;

    fn class(controller: &str) -> GatewayClass {
        GatewayClass {
            metadata: ObjectMeta {
                name: Some("tailnet".into()),
                generation: Some(7),
                ..ObjectMeta::default()
            },
            spec: GatewayClassSpec {
                controller_name: controller.into(),
                ..GatewayClassSpec::default()
            },
            status: None,
        }
    }

    #[test]
    fn another_controllers_class_gets_no_status() {
        assert_eq!(
            decide(
                &class("example.net/gateway"),
                &Parameters::Ok,
                CORE_FEATURES
            ),
            None
        );
    }

    #[test]
    fn accepted_with_valid_parameters_and_observed_generation() {
        let status =
            decide(&class(CONTROLLER_NAME), &Parameters::Ok, CORE_FEATURES).expect("our class");
        let c = &status.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Accepted", "True", "Accepted")
        );
        assert_eq!(c.observed_generation, Some(7));
    }

    #[test]
    fn invalid_parameters_refuse_the_class() {
        let status = decide(
            &class(CONTROLLER_NAME),
            &Parameters::Invalid("TailnetGatewayParameters ops/p not found".into()),
            CORE_FEATURES,
        )
        .expect("our class");
        let c = &status.conditions[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "False",
                "InvalidParameters",
                "TailnetGatewayParameters ops/p not found"
            )
        );
    }

    #[test]
    fn supported_features_sorted_and_unique() {
        let status = decide(
            &class(CONTROLLER_NAME),
            &Parameters::Ok,
            &["TLSRoute", "Gateway", "HTTPRouteMethodMatching", "Gateway"],
        )
        .expect("our class");
        let names: Vec<&str> = status
            .supported_features
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(names, ["Gateway", "HTTPRouteMethodMatching", "TLSRoute"]);
    }

    /// Every claimed extended feature was declared in the committed extended conformance run
    /// and is not named by a failed test's feature; the one that failed is not claimed.
    #[test]
    fn claimed_extended_features_are_the_ones_the_committed_report_passed() {
        let report = include_str!("../../../../docs/conformance/gateway-api-v1.6.3-extended.yaml");
        let declared: Vec<&str> = report
            .lines()
            .skip_while(|l| l.trim() != "supportedFeatures:")
            .skip(1)
            .take_while(|l| l.trim_start().starts_with("- "))
            .map(|l| l.trim_start().trim_start_matches("- ").trim())
            .collect();
        assert!(!declared.is_empty(), "no supportedFeatures in the report");
        for feature in EXTENDED_FEATURES {
            assert!(
                declared.contains(feature),
                "{feature} is claimed but was not declared in the extended run"
            );
        }
        assert!(
            !EXTENDED_FEATURES.contains(&"HTTPRouteBackendRequestHeaderModification"),
            "its conformance test fails (docs/gateway-api.md Limits)"
        );
        let all = supported_features();
        assert_eq!(all.len(), CORE_FEATURES.len() + EXTENDED_FEATURES.len());
    }
}
