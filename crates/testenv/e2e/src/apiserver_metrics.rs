//! The apiserver's own request counters: the independent witness of what the operator sends
//! (used by the steady-state assertion of the egress e2e test and by benchmark 4).

use std::collections::BTreeMap;

use crate::{E2eError, Result};

/// Mutating requests the apiserver answered with 2xx, summed by `VERB resource[/subresource]`
/// (e.g. `APPLY deployments`, `PATCH tailnetegresses/status`), from its
/// `apiserver_request_total` counter. Every client is counted (kubelet, controller-manager,
/// the operator, the test itself).
pub async fn apiserver_writes(client: &kube::Client) -> Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| E2eError::Io {
            context: "building the apiserver /metrics request".into(),
            source: std::io::Error::other(e),
        })?;
    let text = client
        .request_text(request)
        .await
        .map_err(|source| E2eError::KubeApi {
            context: "GET /metrics of the apiserver".into(),
            source,
        })?;
    Ok(parse_writes(&text))
}

/// One `apiserver_request_total` sample of the apiserver's `/metrics` text.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiserverRequests {
    pub verb: String,
    /// `resource`, or `resource/subresource`.
    pub resource: String,
    pub code: String,
    pub count: f64,
}

/// Every `apiserver_request_total` sample of a `/metrics` text.
pub fn apiserver_requests(text: &str) -> Vec<ApiserverRequests> {
    let mut samples = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split("\",")
                .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let subresource = label("subresource");
        let resource = if subresource.is_empty() {
            label("resource")
        } else {
            format!("{}/{subresource}", label("resource"))
        };
        samples.push(ApiserverRequests {
            verb: label("verb"),
            resource,
            code: label("code"),
            count: value.trim().parse::<f64>().unwrap_or(0.0),
        });
    }
    samples
}

fn parse_writes(text: &str) -> BTreeMap<String, f64> {
    let mut writes = BTreeMap::new();
    for sample in apiserver_requests(text) {
        if !matches!(
            sample.verb.as_str(),
            "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY" | "DELETECOLLECTION"
        ) || !sample.code.starts_with('2')
        {
            continue;
        }
        *writes
            .entry(format!("{} {}", sample.verb, sample.resource))
            .or_insert(0.0) += sample.count;
    }
    writes
}

/// What grew between two readings of [`apiserver_writes`] (only entries that grew).
pub fn writes_between(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let grown = v - before.get(k).copied().unwrap_or(0.0);
            (grown > 0.0).then(|| (k.clone(), grown))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_successful_mutations_by_verb_and_resource() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="",verb="APPLY",version="v1"} 7
apiserver_request_total{code="201",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="",verb="APPLY",version="v1"} 2
apiserver_request_total{code="409",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="",verb="APPLY",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="tailnet-operator.dev",resource="tailnetegresses",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 40
"#;
        let writes = parse_writes(text);
        assert_eq!(writes.get("APPLY deployments"), Some(&9.0));
        assert_eq!(writes.get("APPLY tailnetegresses/status"), Some(&3.0));
        assert_eq!(writes.len(), 2, "{writes:?}");
        let later = BTreeMap::from([
            ("APPLY deployments".to_string(), 9.0),
            ("APPLY tailnetegresses/status".to_string(), 4.0),
            ("POST events".to_string(), 1.0),
        ]);
        assert_eq!(
            writes_between(&writes, &later),
            BTreeMap::from([
                ("APPLY tailnetegresses/status".to_string(), 1.0),
                ("POST events".to_string(), 1.0),
            ])
        );
    }
}
