//! Installs CustomResourceDefinitions from YAML files and waits until they are served.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Deserialize;

use crate::error::{Error, IoContext, KubeContext, Result};
use crate::process::poll_until;

const FIELD_MANAGER: &str = "tno-testenv";

/// The `*.yaml`/`*.yml` files directly in `dir`, sorted; none if `dir` does not exist.
pub fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Io {
                context: format!("listing {}", dir.display()),
                source,
            });
        }
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            matches!(
                path.extension().and_then(|ext| ext.to_str()),
                Some("yaml" | "yml")
            )
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Every CRD in `files` (multi-document YAML; other kinds are ignored).
pub fn read_crds(files: &[PathBuf]) -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(path).io_context(|| format!("reading {path:?}"))?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(document).map_err(|source| Error::Yaml {
                path: path.clone(),
                source,
            })?;
            if value.get("kind").and_then(|kind| kind.as_str()) != Some("CustomResourceDefinition")
            {
                continue;
            }
            let crd: CustomResourceDefinition =
                serde_yaml::from_value(value).map_err(|source| Error::Yaml {
                    path: path.clone(),
                    source,
                })?;
            crds.push(crd);
        }
    }
    Ok(crds)
}

/// Server-side applies `crds` and waits until each is `Established`. Returns their names.
pub async fn install_crds(
    client: &kube::Client,
    crds: &[CustomResourceDefinition],
    deadline: Duration,
) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut body = crd.clone();
        body.metadata.managed_fields = None;
        body.metadata.resource_version = None;
        api.patch(&name, &params, &Patch::Apply(&body))
            .await
            .kube_context(|| format!("applying CRD {name}"))?;
        names.push(name);
    }
    for name in &names {
        poll_until(
            &format!("CRD {name} to be Established"),
            deadline,
            || async {
                let crd = api.get_opt(name).await.ok().flatten()?;
                let established = crd.status?.conditions?.iter().any(|condition| {
                    condition.type_ == "Established" && condition.status == "True"
                });
                established.then_some(())
            },
        )
        .await?;
    }
    Ok(names)
}

/// Installs the Gateway API Standard-channel CRDs of `deps/build.sh gateway-api`
/// ([`tno_deps::gateway_api_crds`]: `TNO_GATEWAY_API_CRDS`, else the deps cache) and waits
/// until they are Established (idempotent: other tests of a shared environment may have
/// installed them). Returns their names.
pub async fn install_gateway_api_crds(
    client: &kube::Client,
    workspace: &Path,
    deadline: Duration,
) -> Result<Vec<String>> {
    let setup = |reason: String| Error::Setup {
        what: "Gateway API CRDs".to_string(),
        reason,
    };
    let dir = tno_deps::gateway_api_crds(workspace).map_err(setup)?;
    let files = yaml_files(&dir)?;
    if files.is_empty() {
        return Err(setup(format!(
            "{} has no CRDs: run deps/build.sh gateway-api",
            dir.display()
        )));
    }
    install_crds(client, &read_crds(&files)?, deadline).await
}
