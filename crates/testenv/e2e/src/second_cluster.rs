//! A second Kubernetes cluster on the same Headscale (SPEC §4a, the seeds' hydra and cosmos):
//! its own etcd, kube-apiserver, kube-controller-manager, test kubelet, kube-proxy and CoreDNS
//! on its own node netns `<run>-lab-b`, with other pod and Service CIDRs
//! ([`ClusterNetwork::SECOND`]). It shares only what two real clusters on one Headscale share:
//! Headscale (exposed in its lab at the same `server_url`) and the tailnet. Its apiserver is
//! also reachable from the first cluster's lab at the same lab URL, as a second cluster's API
//! is from the first's network, so the first cluster's operator can read through it.
//!
//! ```text
//!  root netns: Headscale 127.0.0.1:<h>, apiserver A 127.0.0.1:<a>, apiserver B 127.0.0.1:<b>
//!  <run>-lab   (cluster A) 10.244.0.1:<h> → Headscale, :<a> → A, :<b> → B; pods 10.244.1.x
//!  <run2>-lab-b (cluster B) 10.244.0.1:<h> → Headscale, :<b> → B;          pods 10.245.1.x
//! ```
//!
//! Pods of the two clusters have no route to each other or to the remote site and the laptop:
//! they meet only through the tailnet (DERP, relayed by Headscale).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use tno_netlab::{Lab, TcpForwarder};
use tno_testenv_kube::binaries::Binaries;
use tno_testenv_kube::network::ClusterNetwork;
use tno_testenv_kube::{KubeEnv, KubeEnvOptions, TestNamespace};

use crate::env::{E2eEnv, write_lab_kubeconfig};
use crate::error::{E2eError, Result};
use crate::operator::{OperatorProcess, spawn_operator};
use crate::pods::{PodRun, run_pod_in, tcp_check_in};

/// The second cluster. Dropping it stops everything it started and removes its scratch
/// directory (kept with `TNO_KEEP_SCRATCH=1`).
pub struct SecondCluster {
    // Field order is drop order: the forwarders into the labs, the cluster, then its files.
    _headscale_in_lab: TcpForwarder,
    _api_in_first_lab: TcpForwarder,
    kube: KubeEnv,
    lab_kubeconfig: PathBuf,
    _scratch: ScratchDir,
}

/// Credentials of [`SecondCluster::fragment_reader`].
pub struct FragmentReader {
    /// The ServiceAccount token (to check that it never reaches a log).
    pub token: String,
    /// A kubeconfig with the token as its only user.
    pub kubeconfig: Value,
}

impl std::fmt::Debug for FragmentReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FragmentReader { token: <redacted>, kubeconfig: <redacted> }")
    }
}

/// Deletes the cluster's node netns (and its pods' netns) and then its scratch directory,
/// once everything else of the cluster is dropped. The kubelet's loops may still hold the
/// lab, so its own drop would not delete it; and nothing at process exit knows this run.
struct ScratchDir(PathBuf, Arc<Lab>);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(error) = self.1.delete() {
            eprintln!("tno-testenv: deleting the second cluster's netns: {error}");
        }
        if std::env::var_os("TNO_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            eprintln!("tno-testenv: kept {}", self.0.display());
        }
    }
}

impl E2eEnv {
    /// Starts a second cluster ([`ClusterNetwork::SECOND`]) beside this environment's, on the
    /// caller's runtime (which must outlive it), with the repository's CRDs and CoreDNS, and
    /// connects it to this environment's Headscale. Takes about as long as the first cluster's
    /// start (~20 s).
    pub async fn start_second_cluster(&self) -> Result<SecondCluster> {
        let binaries = Binaries::discover()?;
        let options = KubeEnvOptions::second_cluster(&binaries);
        let kube = KubeEnv::start(binaries, options).await?;
        let headscale_in_lab = kube
            .lab()
            .expose_root_port(self.tailnet().headscale.port())?;
        let api_in_first_lab = self.lab().expose_root_port(kube.api_port())?;
        let lab_kubeconfig =
            write_lab_kubeconfig(kube.kubeconfig(), &kube.api_server_url_in_lab())?;
        let scratch = ScratchDir(kube.run_id().scratch_dir(), kube.lab().clone());
        Ok(SecondCluster {
            _headscale_in_lab: headscale_in_lab,
            _api_in_first_lab: api_in_first_lab,
            kube,
            lab_kubeconfig,
            _scratch: scratch,
        })
    }

    /// Runs an operator in the second cluster's lab with its admin credentials (see
    /// [`E2eEnv::start_operator`]).
    pub async fn start_operator_in(
        &self,
        cluster: &SecondCluster,
        binary: &Path,
        args: &[String],
    ) -> Result<OperatorProcess> {
        let seq = self.next_operator.fetch_add(1, Ordering::Relaxed);
        let name = format!("operator-b-{seq}");
        let log_path = self.dir().join(format!("{name}.log"));
        spawn_operator(
            cluster.kube.lab().clone(),
            name,
            binary,
            args,
            &cluster.lab_kubeconfig,
            &log_path,
        )
        .await
    }
}

impl SecondCluster {
    pub fn kube(&self) -> &KubeEnv {
        &self.kube
    }

    pub fn network(&self) -> &ClusterNetwork {
        self.kube().network()
    }

    /// The admin kubeconfig with the apiserver's lab URL `https://10.244.0.1:<port>`: valid
    /// in both labs (the first cluster's operator reads the second's API through it).
    pub fn lab_kubeconfig(&self) -> &Path {
        &self.lab_kubeconfig
    }

    /// A fresh cluster-admin client of this cluster (root netns).
    pub async fn client(&self) -> Result<kube::Client> {
        Ok(self.kube().client().await?)
    }

    /// A namespace of this cluster, deleted on drop (prints this cluster's logs on panic).
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace<'_>> {
        Ok(self.kube().namespace(prefix).await?)
    }

    /// [`E2eEnv::run_pod`] in this cluster.
    pub async fn run_pod(
        &self,
        client: &kube::Client,
        namespace: &str,
        pod: serde_json::Value,
        deadline: std::time::Duration,
    ) -> Result<PodRun> {
        run_pod_in(self.kube(), client, namespace, pod, deadline).await
    }

    /// [`E2eEnv::tcp_check`] from a pod of this cluster.
    pub async fn tcp_check(
        &self,
        client: &kube::Client,
        namespace: &str,
        pod_name: &str,
        target: &str,
        attempts: u32,
    ) -> Result<PodRun> {
        tcp_check_in(self.kube(), client, namespace, pod_name, target, attempts).await
    }

    /// What an owner in another cluster needs to read one fragment ConfigMap of this cluster
    /// (docs/several-clusters.md): ServiceAccount `reader` in `namespace`, a Role allowing
    /// `get`/`watch` on ConfigMap `config_map` only, its RoleBinding (named `reader` too;
    /// delete it to revoke), and a kubeconfig (the lab URL, valid in both labs) whose only
    /// user is a one-hour token of that ServiceAccount. With `owner_keys` (a contributor
    /// without a Headscale key), the Role also allows `get`, `update`, `patch` on that one
    /// Secret, which the owner writes its agents' keys into. Never log the kubeconfig.
    pub async fn fragment_reader(
        &self,
        namespace: &str,
        config_map: &str,
        owner_keys: Option<&str>,
        reader: &str,
    ) -> Result<FragmentReader> {
        let client = self.client().await?;
        let apply = PatchParams::apply("tno-testenv").force();
        let mut rules = vec![json!({"apiGroups": [""], "resources": ["configmaps"],
                                    "resourceNames": [config_map], "verbs": ["get", "watch"]})];
        if let Some(secret) = owner_keys {
            rules.push(json!({"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": [secret], "verbs": ["get", "update", "patch"]}));
        }
        let objects = (
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": reader}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": reader},
                   "rules": rules}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": reader},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": reader},
                   "subjects": [{"kind": "ServiceAccount", "name": reader, "namespace": namespace}]}),
        );
        let context =
            |what: &str| format!("creating the fragment reader's {what} {namespace}/{reader}");
        let service_accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        service_accounts
            .patch(reader, &apply, &Patch::Apply(objects.0))
            .await
            .map_err(|e| E2eError::kube(context("ServiceAccount"), e))?;
        Api::<Role>::namespaced(client.clone(), namespace)
            .patch(reader, &apply, &Patch::Apply(objects.1))
            .await
            .map_err(|e| E2eError::kube(context("Role"), e))?;
        Api::<RoleBinding>::namespaced(client.clone(), namespace)
            .patch(reader, &apply, &Patch::Apply(objects.2))
            .await
            .map_err(|e| E2eError::kube(context("RoleBinding"), e))?;
        let (token, mut kubeconfig) =
            token_kubeconfig(&self.lab_kubeconfig, &client, namespace, reader).await?;
        inline_certificate_authorities(&mut kubeconfig)?;
        Ok(FragmentReader { token, kubeconfig })
    }

    /// Component and container logs of this cluster (of `namespace` only, if given).
    pub fn diagnostics(&self, namespace: Option<&str>) -> String {
        self.kube().diagnostics(namespace, 40)
    }
}

/// Replaces each cluster's `certificate-authority` (a file path) with its content as
/// `certificate-authority-data`: an owner honours no file path in a contributor's kubeconfig.
fn inline_certificate_authorities(kubeconfig: &mut Value) -> Result<()> {
    let Some(clusters) = kubeconfig["clusters"].as_array_mut() else {
        return Ok(());
    };
    for cluster in clusters {
        let Some(path) = cluster["cluster"]["certificate-authority"]
            .as_str()
            .map(str::to_string)
        else {
            continue;
        };
        let pem = std::fs::read(&path).map_err(|e| E2eError::io(format!("reading {path}"), e))?;
        // ByteString serializes as base64, the kubeconfig's encoding of `-data` fields.
        let data = serde_json::to_value(k8s_openapi::ByteString(pem)).map_err(|source| {
            E2eError::Json {
                what: "certificate-authority-data".into(),
                source,
            }
        })?;
        if let Some(fields) = cluster["cluster"].as_object_mut() {
            fields.remove("certificate-authority");
            fields.insert("certificate-authority-data".into(), data);
        }
    }
    Ok(())
}

/// A one-hour token of `service_account` (namespace `namespace`, TokenRequest API) and
/// `lab_kubeconfig` (the apiserver's lab address and CA, e.g. [`E2eEnv::lab_kubeconfig`])
/// with that token as its only user: what a process gets that runs with exactly that
/// account's RBAC. `admin` is a client of the same cluster. Never log either.
pub async fn token_kubeconfig(
    lab_kubeconfig: &Path,
    admin: &kube::Client,
    namespace: &str,
    service_account: &str,
) -> Result<(String, Value)> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .map_err(|e| E2eError::kube(format!("a token of {namespace}/{service_account}"), e))?
        .status
        .map(|status| status.token)
        .unwrap_or_default();
    let text = std::fs::read_to_string(lab_kubeconfig)
        .map_err(|e| E2eError::io(format!("reading {}", lab_kubeconfig.display()), e))?;
    let mut kubeconfig: Value =
        serde_yaml::from_str(&text).map_err(|source| E2eError::Kubeconfig {
            path: lab_kubeconfig.to_owned(),
            source,
        })?;
    kubeconfig["users"] = json!([{"name": service_account, "user": {"token": token}}]);
    if let Some(contexts) = kubeconfig["contexts"].as_array_mut() {
        for context in contexts {
            context["context"]["user"] = json!(service_account);
        }
    }
    Ok((token, kubeconfig))
}
