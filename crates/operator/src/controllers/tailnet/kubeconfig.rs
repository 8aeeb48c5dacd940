//! The contributor's kubeconfig, honoured only in part (pure): a contributor is less trusted
//! than the owner, and the owner's operator pod holds credentials of its own (its
//! ServiceAccount token, the Headscale key in a Secret it can read). Only the selected
//! context's `server` (https), `certificate-authority-data`, `token` and
//! `client-certificate-data`/`client-key-data` are used; a kubeconfig that asks for anything
//! that runs a command, reads a file, goes through a proxy or skips TLS verification is
//! refused whole, naming the field, before a client exists (so nothing is sent anywhere).

use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

/// Largest kubeconfig accepted (bytes of the Secret's value); a real one with inline
/// certificate data is a few KiB.
pub const MAX_KUBECONFIG_BYTES: usize = 64 * 1024;

/// Why a contributor's kubeconfig is not used. The messages name fields, never values (a
/// kubeconfig holds secrets).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KubeconfigRefusal {
    #[error("the kubeconfig is {size} bytes, more than the {MAX_KUBECONFIG_BYTES} accepted")]
    TooLarge { size: usize },
    #[error("the kubeconfig is not UTF-8")]
    NotUtf8,
    #[error("the kubeconfig does not parse")]
    Syntax,
    #[error(
        "the kubeconfig names no context to use (set current-context, or define exactly one context)"
    )]
    NoContext,
    #[error("the kubeconfig's {what} {name:?} is not defined")]
    Undefined { what: &'static str, name: String },
    #[error(
        "the kubeconfig's {field} is not https:// (a contributor is read over TLS only); nothing was sent"
    )]
    NotHttps { field: String },
    #[error(
        "the kubeconfig sets {field}, which is not honoured for a contributor (only server, certificate-authority-data, token, client-certificate-data and client-key-data are); nothing was sent"
    )]
    Refused { field: String },
}

/// The kubeconfig reduced to what is honoured, or why it is refused.
pub fn restrict(bytes: &[u8]) -> Result<Kubeconfig, KubeconfigRefusal> {
    if bytes.len() > MAX_KUBECONFIG_BYTES {
        return Err(KubeconfigRefusal::TooLarge { size: bytes.len() });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| KubeconfigRefusal::NotUtf8)?;
    let parsed = Kubeconfig::from_yaml(text).map_err(|_| KubeconfigRefusal::Syntax)?;
    let context = selected_context(&parsed)?;
    let cluster_entry = parsed
        .clusters
        .iter()
        .find(|c| c.name == context.context.cluster)
        .ok_or_else(|| KubeconfigRefusal::Undefined {
            what: "cluster",
            name: context.context.cluster.clone(),
        })?;
    let cluster = restrict_cluster(cluster_entry)?;
    let user = match &context.context.user {
        None => None,
        Some(name) => {
            let entry = parsed
                .auth_infos
                .iter()
                .find(|u| &u.name == name)
                .ok_or_else(|| KubeconfigRefusal::Undefined {
                    what: "user",
                    name: name.clone(),
                })?;
            Some(restrict_user(entry)?)
        }
    };
    Ok(Kubeconfig {
        clusters: vec![NamedCluster {
            name: cluster_entry.name.clone(),
            cluster: Some(cluster),
            ..NamedCluster::default()
        }],
        auth_infos: user
            .into_iter()
            .map(|(name, auth_info)| NamedAuthInfo {
                name,
                auth_info: Some(auth_info),
                ..NamedAuthInfo::default()
            })
            .collect(),
        contexts: vec![NamedContext {
            name: context.name.clone(),
            context: Some(Context {
                cluster: context.context.cluster.clone(),
                user: context.context.user.clone(),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(context.name.clone()),
        ..Kubeconfig::default()
    })
}

/// A context with its (present) body.
struct Selected {
    name: String,
    context: Context,
}

/// `current-context`, or the only context.
fn selected_context(parsed: &Kubeconfig) -> Result<Selected, KubeconfigRefusal> {
    let entry = match &parsed.current_context {
        Some(name) if !name.is_empty() => parsed
            .contexts
            .iter()
            .find(|c| &c.name == name)
            .ok_or_else(|| KubeconfigRefusal::Undefined {
                what: "context",
                name: name.clone(),
            })?,
        _ => match parsed.contexts.as_slice() {
            [only] => only,
            _ => return Err(KubeconfigRefusal::NoContext),
        },
    };
    let context = entry
        .context
        .clone()
        .ok_or_else(|| KubeconfigRefusal::Undefined {
            what: "context",
            name: entry.name.clone(),
        })?;
    Ok(Selected {
        name: entry.name.clone(),
        context,
    })
}

fn refused(field: String) -> KubeconfigRefusal {
    KubeconfigRefusal::Refused { field }
}

/// The cluster: an https `server` and inline CA data only.
fn restrict_cluster(entry: &NamedCluster) -> Result<Cluster, KubeconfigRefusal> {
    let at = |field: &str| format!("clusters[{:?}].cluster.{field}", entry.name);
    let Some(cluster) = &entry.cluster else {
        return Err(KubeconfigRefusal::Undefined {
            what: "cluster",
            name: entry.name.clone(),
        });
    };
    if cluster.insecure_skip_tls_verify == Some(true) {
        return Err(refused(at("insecure-skip-tls-verify")));
    }
    for (field, set) in [
        (
            "certificate-authority",
            cluster.certificate_authority.is_some(),
        ),
        ("proxy-url", cluster.proxy_url.is_some()),
        ("tls-server-name", cluster.tls_server_name.is_some()),
    ] {
        if set {
            return Err(refused(at(field)));
        }
    }
    let server = cluster.server.clone().unwrap_or_default();
    let https = url::Url::parse(&server)
        .ok()
        .is_some_and(|u| u.scheme() == "https" && u.host_str().is_some());
    if !https {
        return Err(KubeconfigRefusal::NotHttps {
            field: at("server"),
        });
    }
    Ok(Cluster {
        server: Some(server),
        certificate_authority_data: cluster.certificate_authority_data.clone(),
        ..Cluster::default()
    })
}

/// The user: a bearer token and/or inline client certificate data only.
fn restrict_user(entry: &NamedAuthInfo) -> Result<(String, AuthInfo), KubeconfigRefusal> {
    let at = |field: &str| format!("users[{:?}].user.{field}", entry.name);
    let Some(user) = &entry.auth_info else {
        return Ok((entry.name.clone(), AuthInfo::default()));
    };
    for (field, set) in [
        ("exec", user.exec.is_some()),
        ("auth-provider", user.auth_provider.is_some()),
        ("tokenFile", user.token_file.is_some()),
        ("client-certificate", user.client_certificate.is_some()),
        ("client-key", user.client_key.is_some()),
        ("username", user.username.is_some()),
        ("password", user.password.is_some()),
        ("as", user.impersonate.is_some()),
        ("as-uid", user.impersonate_uid.is_some()),
        ("as-groups", user.impersonate_groups.is_some()),
        ("as-user-extra", user.impersonate_user_extra.is_some()),
    ] {
        if set {
            return Err(refused(at(field)));
        }
    }
    Ok((
        entry.name.clone(),
        AuthInfo {
            token: user.token.clone(),
            client_certificate_data: user.client_certificate_data.clone(),
            client_key_data: user.client_key_data.clone(),
            ..AuthInfo::default()
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(cluster_extra: &str, user_extra: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: b\n\
             clusters:\n- name: b\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0E=\n{cluster_extra}\
             users:\n- name: reader\n  user:\n    token: s3cr3t-token\n{user_extra}\
             contexts:\n- name: b\n  context:\n    cluster: b\n    user: reader\n    namespace: x\n"
        )
    }

    /// Issue 26 item 2: every field that runs a command, reads a file, goes through a proxy,
    /// skips verification or borrows another identity is refused, named, and no value (the
    /// token) appears in the message.
    #[test]
    fn only_server_ca_data_token_and_client_cert_data_are_honoured() {
        let cases = [
            (
                "    insecure-skip-tls-verify: true\n",
                "",
                "clusters[\"b\"].cluster.insecure-skip-tls-verify",
            ),
            (
                "    certificate-authority: /dev/zero\n",
                "",
                "clusters[\"b\"].cluster.certificate-authority",
            ),
            (
                "    proxy-url: http://proxy:3128\n",
                "",
                "clusters[\"b\"].cluster.proxy-url",
            ),
            (
                "    tls-server-name: other\n",
                "",
                "clusters[\"b\"].cluster.tls-server-name",
            ),
            (
                "",
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                "users[\"reader\"].user.tokenFile",
            ),
            (
                "",
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n",
                "users[\"reader\"].user.exec",
            ),
            (
                "",
                "    auth-provider:\n      name: oidc\n      config: {}\n",
                "users[\"reader\"].user.auth-provider",
            ),
            (
                "",
                "    client-certificate: /etc/passwd\n",
                "users[\"reader\"].user.client-certificate",
            ),
            (
                "",
                "    client-key: /etc/shadow\n",
                "users[\"reader\"].user.client-key",
            ),
            (
                "",
                "    username: admin\n",
                "users[\"reader\"].user.username",
            ),
            ("", "    as: system:admin\n", "users[\"reader\"].user.as"),
        ];
        for (cluster, user, field) in cases {
            let error = restrict(kubeconfig(cluster, user).as_bytes()).expect_err(field);
            let message = error.to_string();
            assert!(message.contains(field), "{field}: {message}");
            assert!(message.contains("nothing was sent"), "{message}");
            assert!(!message.contains("s3cr3t"), "{message}");
        }
        let plain = kubeconfig("", "").replace("https://", "http://");
        assert_eq!(
            restrict(plain.as_bytes()).err(),
            Some(KubeconfigRefusal::NotHttps {
                field: "clusters[\"b\"].cluster.server".into()
            })
        );
        // A harmless `insecure-skip-tls-verify: false` is fine.
        let ok = restrict(kubeconfig("    insecure-skip-tls-verify: false\n", "").as_bytes())
            .expect("valid kubeconfig");
        let cluster = ok.clusters[0].cluster.clone().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        assert_eq!(cluster.insecure_skip_tls_verify, None);
        let user = ok.auth_infos[0].auth_info.clone().expect("user");
        assert!(user.token.is_some() && user.token_file.is_none() && user.exec.is_none());
        assert_eq!(ok.current_context.as_deref(), Some("b"));
    }

    #[test]
    fn size_encoding_syntax_and_context_are_checked_first() {
        let big = vec![b' '; MAX_KUBECONFIG_BYTES + 1];
        assert_eq!(
            restrict(&big).err(),
            Some(KubeconfigRefusal::TooLarge {
                size: MAX_KUBECONFIG_BYTES + 1
            })
        );
        assert_eq!(
            restrict(&[0xff, 0xfe]).err(),
            Some(KubeconfigRefusal::NotUtf8)
        );
        assert_eq!(
            restrict(b"clusters: 3").err(),
            Some(KubeconfigRefusal::Syntax)
        );
        let two = kubeconfig("", "").replace("current-context: b\n", "")
            + "- name: c\n  context:\n    cluster: b\n";
        assert_eq!(
            restrict(two.as_bytes()).err(),
            Some(KubeconfigRefusal::NoContext)
        );
        let missing = kubeconfig("", "").replace("current-context: b", "current-context: z");
        assert_eq!(
            restrict(missing.as_bytes()).err(),
            Some(KubeconfigRefusal::Undefined {
                what: "context",
                name: "z".into()
            })
        );
        // Entries of other contexts are never used, whatever they hold.
        let other = kubeconfig("", "").replace(
            "contexts:",
            "- name: evil\n  user:\n    exec:\n      command: /bin/sh\ncontexts:",
        );
        let ok = restrict(other.as_bytes()).expect("the selected context is clean");
        assert_eq!(ok.auth_infos.len(), 1);
    }
}
