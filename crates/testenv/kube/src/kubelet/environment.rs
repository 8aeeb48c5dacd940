//! A container's environment and command line, as the kubelet computes them.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;

use crate::error::{Error, KubeContext, Result};
use crate::kubelet::downward;

/// Node-level facts every container sees.
pub struct EnvironmentContext<'a> {
    pub client: &'a kube::Client,
    pub pod: &'a Pod,
    pub namespace: &'a str,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub path: &'a str,
    /// `KUBERNETES_SERVICE_HOST`/`_PORT`: the `kubernetes` Service's ClusterIP and port.
    pub kubernetes_service: (&'a str, u16),
    /// The image's ENV defaults.
    pub image_env: &'a [(String, String)],
}

/// The ordered environment of `container` (later entries of the same name win, as in Kubernetes).
pub async fn container_environment(
    context: &EnvironmentContext<'_>,
    container: &Container,
) -> Result<Vec<(String, String)>> {
    let pod_name = context.pod.metadata.name.clone().unwrap_or_default();
    let (service_host, service_port) = context.kubernetes_service;
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), context.path.to_string()),
        ("HOSTNAME".into(), pod_name.clone()),
        ("HOME".into(), "/root".into()),
        ("KUBERNETES_SERVICE_HOST".into(), service_host.to_string()),
        ("KUBERNETES_SERVICE_PORT".into(), service_port.to_string()),
        (
            "KUBERNETES_SERVICE_PORT_HTTPS".into(),
            service_port.to_string(),
        ),
        (
            "KUBERNETES_PORT".into(),
            format!("tcp://{service_host}:{service_port}"),
        ),
    ];
    env.extend(context.image_env.iter().cloned());
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.clone().unwrap_or_default();
        let data = if let Some(reference) = &source.config_map_ref {
            config_map(context, &reference.name, reference.optional).await?
        } else if let Some(reference) = &source.secret_ref {
            secret(context, &reference.name, reference.optional).await?
        } else {
            BTreeMap::new()
        };
        env.extend(
            data.into_iter()
                .map(|(key, value)| (format!("{prefix}{key}"), value)),
        );
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(value) = &var.value {
            expand(value, &env)
        } else if let Some(source) = &var.value_from {
            if let Some(field) = &source.field_ref {
                downward::field_value(
                    context.pod,
                    context.pod_ip,
                    context.host_ip,
                    &field.field_path,
                )
                .ok_or_else(|| Error::Pod {
                    pod: pod_name.clone(),
                    reason: format!("unsupported downward API field {}", field.field_path),
                })?
            } else if let Some(key) = &source.config_map_key_ref {
                let data = config_map(context, &key.name, key.optional).await?;
                match data.get(&key.key) {
                    Some(value) => value.clone(),
                    None if key.optional == Some(true) => continue,
                    None => return Err(missing_key(&pod_name, "ConfigMap", &key.name, &key.key)),
                }
            } else if let Some(key) = &source.secret_key_ref {
                let data = secret(context, &key.name, key.optional).await?;
                match data.get(&key.key) {
                    Some(value) => value.clone(),
                    None if key.optional == Some(true) => continue,
                    None => return Err(missing_key(&pod_name, "Secret", &key.name, &key.key)),
                }
            } else {
                // resourceFieldRef: this kubelet enforces no resources.
                String::new()
            }
        } else {
            String::new()
        };
        env.push((var.name.clone(), value));
    }
    Ok(env)
}

fn missing_key(pod: &str, kind: &str, name: &str, key: &str) -> Error {
    Error::Pod {
        pod: pod.to_string(),
        reason: format!("{kind} {name} has no key {key}"),
    }
}

async fn config_map(
    context: &EnvironmentContext<'_>,
    name: &str,
    optional: Option<bool>,
) -> Result<BTreeMap<String, String>> {
    let api: Api<ConfigMap> = Api::namespaced(context.client.clone(), context.namespace);
    match api
        .get_opt(name)
        .await
        .kube_context(|| format!("reading ConfigMap {}/{name}", context.namespace))?
    {
        Some(config_map) => Ok(config_map.data.unwrap_or_default()),
        None if optional == Some(true) => Ok(BTreeMap::new()),
        None => Err(Error::Pod {
            pod: context.pod.metadata.name.clone().unwrap_or_default(),
            reason: format!("ConfigMap {}/{name} not found", context.namespace),
        }),
    }
}

async fn secret(
    context: &EnvironmentContext<'_>,
    name: &str,
    optional: Option<bool>,
) -> Result<BTreeMap<String, String>> {
    let api: Api<Secret> = Api::namespaced(context.client.clone(), context.namespace);
    match api
        .get_opt(name)
        .await
        .kube_context(|| format!("reading Secret {}/{name}", context.namespace))?
    {
        Some(secret) => Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(key, ByteString(bytes))| (key, String::from_utf8_lossy(&bytes).into_owned()))
            .collect()),
        None if optional == Some(true) => Ok(BTreeMap::new()),
        None => Err(Error::Pod {
            pod: context.pod.metadata.name.clone().unwrap_or_default(),
            reason: format!("Secret {}/{name} not found", context.namespace),
        }),
    }
}

/// Kubernetes' `$(VAR)` expansion: known variables are replaced, `$$` escapes a `$`, unknown
/// references stay as written.
pub fn expand(input: &str, env: &[(String, String)]) -> String {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    let mut output = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(dollar) = rest.find('$') {
        output.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            output.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(close) = body.find(')')
        {
            let name = &body[..close];
            match lookup(name) {
                Some(value) => output.push_str(&value),
                None => output.push_str(&rest[dollar..dollar + 2 + close + 1]),
            }
            rest = &body[close + 1..];
        } else {
            output.push('$');
            rest = after;
        }
    }
    output.push_str(rest);
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let env = vec![("POD_IP".to_string(), "10.244.1.2".to_string())];
        assert_eq!(
            expand("--listen=$(POD_IP):80", &env),
            "--listen=10.244.1.2:80"
        );
        assert_eq!(
            expand("$(MISSING) $$(POD_IP) $", &env),
            "$(MISSING) $(POD_IP) $"
        );
    }
}
