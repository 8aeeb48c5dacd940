//! The CRD manifests, generated from the Rust types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{Tailnet, TailnetEgress, TailnetIngress};

/// All CRDs with the file name they are checked in under (`deploy/crds/<file>`).
pub fn all() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("tailnets.yaml", Tailnet::crd()),
        ("tailnetegresses.yaml", TailnetEgress::crd()),
        ("tailnetingresses.yaml", TailnetIngress::crd()),
    ]
}
