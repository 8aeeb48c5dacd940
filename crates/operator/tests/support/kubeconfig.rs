//! A kubeconfig for a lab apiserver whose only credential is a ServiceAccount token
//! (TokenRequest API): what the operator gets when it runs with exactly some RBAC.

use std::path::Path;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// A token of `service_account` (namespace `namespace`, valid one hour) and `lab_kubeconfig`
/// (the apiserver's lab address and CA, e.g. `E2eEnv::lab_kubeconfig`) with that token as its
/// only user. `admin` is a client of the same cluster.
pub async fn token_kubeconfig(
    lab_kubeconfig: &Path,
    admin: &kube::Client,
    namespace: &str,
    service_account: &str,
) -> (String, Value) {
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(
            service_account,
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    audiences: vec![],
                    expiration_seconds: Some(3600),
                    ..TokenRequestSpec::default()
                },
                ..TokenRequest::default()
            },
        )
        .await
        .expect("TokenRequest")
        .status
        .expect("token status")
        .token;
    let mut kubeconfig: Value =
        serde_yaml::from_str(&std::fs::read_to_string(lab_kubeconfig).expect("kubeconfig"))
            .expect("kubeconfig YAML");
    kubeconfig["users"] = json!([{"name": service_account, "user": {"token": token}}]);
    for context in kubeconfig["contexts"].as_array_mut().expect("contexts") {
        context["context"]["user"] = json!(service_account);
    }
    (token, kubeconfig)
}
