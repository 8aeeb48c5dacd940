//! `run --apply-tailnet <file>`: a Tailnet manifest (the Helm chart's `tailnet.create`, mounted
//! from its ConfigMap) that the operator server-side applies at start, once the Tailnet CRD is
//! served. A Tailnet cannot be a plain template of the release that installs the CRDs (Helm
//! maps every kind of a release before it creates anything), and a hook would be outside the
//! release's three-way merge (Helm deletes and recreates hook objects, which would tear down
//! every agent of the Tailnet on each upgrade). Every replica applies it (the same bytes, one
//! field manager): idempotent, and a changed file rolls the pods (the chart's checksum).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::Value;
use tailnet_api::Tailnet;
use tokio_util::sync::CancellationToken;

/// The field manager of the applied fields (`kubectl get tailnet -o yaml --show-managed-fields`).
pub const FIELD_MANAGER: &str = "tailnet-operator-chart";
/// First and longest wait between attempts while the CRD is not served yet (or RBAC refuses).
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ChartTailnetError {
    #[error("reading the Tailnet manifest {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the Tailnet manifest {path} is not YAML: {source}")]
    Yaml {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("the Tailnet manifest {path} is not a valid Tailnet: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// A checked Tailnet manifest: the object as written (applied as is, so the chart's field
/// manager owns only the fields it sets) and its name.
#[derive(Clone, Debug)]
pub struct ChartTailnet {
    pub name: String,
    pub object: Value,
}

impl ChartTailnet {
    /// Reads and checks `path`: one object of apiVersion `tailnet-operator.dev/v1alpha1`,
    /// kind `Tailnet`, a name, no namespace, a spec the Tailnet type accepts.
    pub fn read(path: &Path) -> Result<Self, ChartTailnetError> {
        let text = std::fs::read_to_string(path).map_err(|source| ChartTailnetError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, ChartTailnetError> {
        let invalid = |reason: String| ChartTailnetError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let object: Value =
            serde_yaml::from_str(text).map_err(|source| ChartTailnetError::Yaml {
                path: path.to_path_buf(),
                source,
            })?;
        if object["apiVersion"] != "tailnet-operator.dev/v1alpha1" || object["kind"] != "Tailnet" {
            return Err(invalid(format!(
                "apiVersion/kind must be tailnet-operator.dev/v1alpha1 Tailnet, got {} {}",
                object["apiVersion"], object["kind"]
            )));
        }
        if !object["metadata"]["namespace"].is_null() {
            return Err(invalid(
                "metadata.namespace: a Tailnet is cluster-scoped".into(),
            ));
        }
        let name = object["metadata"]["name"]
            .as_str()
            .filter(|name| !name.is_empty())
            .ok_or_else(|| invalid("metadata.name is missing".into()))?
            .to_string();
        serde_json::from_value::<Tailnet>(object.clone())
            .map_err(|error| invalid(format!("spec: {error}")))?;
        Ok(Self { name, object })
    }
}

/// Applies `tailnet` until the apiserver takes it (the CRD may be created by the same
/// `helm install` a moment after this pod starts) or `shutdown`; each failed attempt is
/// logged with the apiserver's answer.
pub async fn apply_until_done(
    client: kube::Client,
    tailnet: ChartTailnet,
    shutdown: CancellationToken,
) {
    let api: Api<Tailnet> = Api::all(client);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut wait = FIRST_RETRY;
    loop {
        match api
            .patch(&tailnet.name, &params, &Patch::Apply(&tailnet.object))
            .await
        {
            Ok(applied) => {
                tracing::info!(tailnet = %tailnet.name, generation = ?applied.metadata.generation, "applied the chart's Tailnet (--apply-tailnet)");
                return;
            }
            Err(error) => {
                tracing::warn!(tailnet = %tailnet.name, error = %error, retry_in = ?wait, "cannot apply the chart's Tailnet yet (--apply-tailnet); retrying");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(MAX_RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ChartTailnet, ChartTailnetError> {
        ChartTailnet::parse(Path::new("tailnet.yaml"), text)
    }

    const GOOD: &str = r#"
apiVersion: tailnet-operator.dev/v1alpha1
kind: Tailnet
metadata:
  name: main
spec:
  server: https://headscale.example.net
  apiSecretRef: {name: headscale-api-key, key: api-key}
  dns:
    ingressNameTemplate: "{name}.{namespace}.example.net"
  policy:
    mode: DryRun
    tagOwners: ["group:platform"]
"#;

    #[test]
    fn a_chart_tailnet_is_read_as_written() {
        let tailnet = parse(GOOD).expect("valid");
        assert_eq!(tailnet.name, "main");
        assert_eq!(
            tailnet.object["spec"]["dns"]["ingressNameTemplate"],
            "{name}.{namespace}.example.net"
        );
        // Applied as written: no defaulted fields appear.
        assert!(tailnet.object["spec"]["policy"].get("tagPrefix").is_none());
    }

    #[test]
    fn other_kinds_namespaces_and_bad_specs_are_refused() {
        for (text, expected) in [
            (GOOD.replace("kind: Tailnet", "kind: TailnetEgress"), "kind"),
            (
                GOOD.replace("name: main", "name: main\n  namespace: x"),
                "cluster-scoped",
            ),
            (
                GOOD.replace("  name: main\n", "  labels: {}\n"),
                "metadata.name",
            ),
            (GOOD.replace("mode: DryRun", "mode: Sometimes"), "spec"),
            ("[1, 2".to_string(), "not YAML"),
        ] {
            let error = parse(&text).expect_err(expected).to_string();
            assert!(error.contains(expected), "{expected}: {error}");
        }
    }
}
