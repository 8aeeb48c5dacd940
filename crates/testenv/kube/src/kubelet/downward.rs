//! The downward API: pod fields exposed through env vars and volume files.

use k8s_openapi::api::core::v1::Pod;

/// The value of a `fieldRef.fieldPath`, `None` for fields this kubelet does not know.
pub fn field_value(pod: &Pod, pod_ip: &str, host_ip: &str, field_path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    if let Some(key) = bracketed(field_path, "metadata.labels") {
        return Some(meta.labels.as_ref()?.get(key)?.clone());
    }
    if let Some(key) = bracketed(field_path, "metadata.annotations") {
        return Some(meta.annotations.as_ref()?.get(key)?.clone());
    }
    match field_path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "metadata.labels" => Some(key_value_lines(meta.labels.as_ref())),
        "metadata.annotations" => Some(key_value_lines(meta.annotations.as_ref())),
        "spec.nodeName" => spec?.node_name.clone(),
        "spec.serviceAccountName" => spec?.service_account_name.clone(),
        "status.podIP" | "status.podIPs" => Some(pod_ip.to_string()),
        "status.hostIP" | "status.hostIPs" => Some(host_ip.to_string()),
        _ => None,
    }
}

/// `metadata.labels['app']` → `app`.
fn bracketed<'a>(field_path: &'a str, prefix: &str) -> Option<&'a str> {
    field_path
        .strip_prefix(prefix)?
        .strip_prefix("['")?
        .strip_suffix("']")
}

fn key_value_lines(map: Option<&std::collections::BTreeMap<String, String>>) -> String {
    map.map(|map| {
        map.iter()
            .map(|(key, value)| format!("{key}={value:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn known_fields_resolve() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        assert_eq!(
            field_value(&pod, "10.244.1.2", "10.244.0.1", "status.podIP").as_deref(),
            Some("10.244.1.2")
        );
        assert_eq!(
            field_value(&pod, "", "", "metadata.namespace").as_deref(),
            Some("ns")
        );
        assert_eq!(
            field_value(&pod, "", "", "metadata.labels['app']").as_deref(),
            Some("web")
        );
        assert_eq!(field_value(&pod, "", "", "spec.unknown"), None);
    }
}
