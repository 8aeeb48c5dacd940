//! The client against a real Headscale 0.29 (started by the test environment over HTTPS with
//! a certificate of the run's lab CA, with a real subnet router advertising 192.0.2.0/24 and
//! 198.51.100.0/24).

use std::time::Duration;

use ipnet::IpNet;
use jiff::{SignedDuration, Timestamp};
use tailnet_headscale::{Client, ClientOptions, CreatePreAuthKey, Error, Secret};
use tno_testenv_tailnet::TailnetEnv;

fn client(env: &TailnetEnv, key: &str) -> Client {
    Client::new(
        &env.headscale.root_url(),
        Secret::new(key),
        ClientOptions {
            server_ca_pem: Some(env.headscale.ca_pem().to_owned()),
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

fn in_minutes(m: i64) -> Timestamp {
    Timestamp::now() + SignedDuration::from_mins(m)
}

/// One environment for all checks: starting Headscale and the nodes is the expensive part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_against_real_headscale() {
    let env = TailnetEnv::start().await.expect("test environment");
    let result = tokio::time::timeout(Duration::from_secs(240), checks(&env)).await;
    if !matches!(result, Ok(())) {
        eprintln!("{}", env.log_report(&[]));
        panic!("checks did not finish: {result:?}");
    }
}

async fn checks(env: &TailnetEnv) {
    let hs = client(env, env.headscale.api_key());
    version_health_and_failures(env, &hs).await;
    policy_round_trip(&hs).await;
    pre_auth_keys(&hs).await;
    route_approval(&hs).await;
    users_and_api_keys(env, &hs).await;
    node_deletion(env, &hs).await;
}

async fn version_health_and_failures(env: &TailnetEnv, hs: &Client) {
    // Version and authenticated health.
    let version = hs.version().await.expect("version");
    assert!(version.version.contains("0.29"), "version {version:?}");
    // The matrix run (TNO_HEADSCALE_VERSION) must really talk to the version it names.
    if let Ok(wanted) = std::env::var("TNO_HEADSCALE_VERSION") {
        assert!(
            version.version.contains(wanted.trim_start_matches('v')),
            "TNO_HEADSCALE_VERSION={wanted}, Headscale says {version:?}"
        );
    }
    println!("real Headscale: {}", version.version);
    assert!(hs.health().await.expect("health"));

    // A wrong key is a typed 401 whose message never contains the key.
    let wrong = client(env, "hskey-api-wrongwrongwr-notthekeyatall");
    let err = wrong.list_nodes().await.expect_err("401");
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    assert!(
        !err.to_string().contains("notthekeyatall")
            && !format!("{err:?}").contains("notthekeyatall")
    );
    assert_eq!(err.reason(), "Unauthorized");

    // Unreachable server: classified transport error, not a hang.
    let dead = Client::new(
        "http://127.0.0.1:9",
        Secret::new("k"),
        ClientOptions {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(10),
            ..ClientOptions::default()
        },
    )
    .expect("client");
    let err = dead.version().await.expect_err("refused");
    assert_eq!(err.reason(), "ConnectionFailed", "{err}");

    server_certificate_trust(env).await;
}

/// Headscale's certificate is only trusted with the CA that signed it: the system roots alone
/// and another CA are `CertificateUntrusted`; a bundle without a certificate is refused when
/// the client is built.
async fn server_certificate_trust(env: &TailnetEnv) {
    let with_ca = |ca: Option<String>| {
        Client::new(
            &env.headscale.root_url(),
            Secret::new(env.headscale.api_key()),
            ClientOptions {
                server_ca_pem: ca,
                max_attempts: 1,
                ..ClientOptions::default()
            },
        )
    };
    let system_roots_only = with_ca(None).expect("client");
    let err = system_roots_only.version().await.expect_err("untrusted");
    assert_eq!(err.reason(), "CertificateUntrusted", "{err}");

    let dir = std::env::temp_dir().join(format!("other-ca-{}", std::process::id()));
    let other = tno_testenv_tailnet::LabCa::generate(&dir, "another CA").expect("other CA");
    let other_ca = with_ca(Some(other.cert_pem().to_owned())).expect("client");
    let err = other_ca.version().await.expect_err("untrusted");
    assert_eq!(err.reason(), "CertificateUntrusted", "{err}");
    let _ = std::fs::remove_dir_all(&dir);

    let err = with_ca(Some("# only a comment\n".into())).expect_err("no certificate");
    assert_eq!(err.reason(), "ServerCAInvalid", "{err}");
    let err = with_ca(Some(
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n".into(),
    ))
    .expect_err("not a certificate");
    assert_eq!(err.reason(), "ServerCAInvalid", "{err}");

    let trusted = with_ca(Some(env.headscale.ca_pem().to_owned())).expect("client");
    assert!(trusted.version().await.is_ok());
}

async fn policy_round_trip(hs: &Client) {
    // Policy: stored byte for byte (comments kept), check rejects without storing.
    let live = hs.get_policy().await.expect("get policy");
    let with_comment = format!("// marker: test-installation\n{}", live.policy);
    hs.check_policy(&with_comment)
        .await
        .expect("valid policy passes check");
    let stored = hs.set_policy(&with_comment).await.expect("set policy");
    assert!(stored.updated_at.is_some());
    assert_eq!(hs.get_policy().await.expect("get").policy, with_comment);
    let invalid =
        r#"{"grants": [{"src": ["group:nobody"], "dst": ["tag:undefined"], "ip": ["tcp:1"]}]}"#;
    let err = hs.check_policy(invalid).await.expect_err("invalid policy");
    match &err {
        Error::Api {
            status, message, ..
        } => {
            assert!((400..500).contains(status), "{err}");
            assert!(!message.is_empty());
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(hs.set_policy(invalid).await.is_err());
    assert_eq!(
        hs.get_policy().await.expect("get").policy,
        with_comment,
        "a rejected policy leaves the old one live"
    );
}

async fn pre_auth_keys(hs: &Client) {
    // Pre-auth keys: tagged, single use, with expiration; expire by id.
    let key = hs
        .create_pre_auth_key(&CreatePreAuthKey::single_use_tagged(
            vec!["tag:client".into()],
            in_minutes(10),
        ))
        .await
        .expect("create pre-auth key");
    assert!(!key.key.is_empty());
    assert_eq!(key.acl_tags, vec!["tag:client"]);
    assert!(!key.reusable);
    let expiration = key.expiration.expect("expiration stored");
    assert!(
        expiration > Timestamp::now(),
        "a key created with expiration must not be already expired"
    );
    let listed = hs.list_pre_auth_keys().await.expect("list keys");
    assert!(listed.iter().any(|k| k.id == key.id));
    hs.expire_pre_auth_key(key.id).await.expect("expire key");
    let expired = hs
        .list_pre_auth_keys()
        .await
        .expect("list keys")
        .into_iter()
        .find(|k| k.id == key.id)
        .expect("still listed");
    assert!(expired.expiration.expect("expiration") <= Timestamp::now());
}

async fn route_approval(hs: &Client) {
    // Nodes and routes: the router advertises the site's routes (two IPv4, one IPv6 ULA),
    // none approved; approving one (full set semantics) and then another keeps the first.
    let nodes = hs.list_nodes().await.expect("list nodes");
    let router = nodes
        .iter()
        .find(|n| n.tags.contains(&"tag:router".to_string()))
        .expect("router node");
    let mut advertised = router.available_routes.clone();
    advertised.sort();
    assert_eq!(
        advertised,
        vec!["192.0.2.0/24", "198.51.100.0/24", "fd00:5ee::/64"],
        "{router:?}"
    );
    assert!(router.approved_routes.is_empty(), "{router:?}");
    let first: IpNet = "192.0.2.0/24".parse().expect("net");
    let second: IpNet = "198.51.100.0/24".parse().expect("net");
    let node = hs
        .approve_routes(router.id, &[first])
        .await
        .expect("approve");
    assert_eq!(node.approved_routes, vec!["192.0.2.0/24"]);
    let node = hs
        .approve_routes(router.id, &[first, second])
        .await
        .expect("approve both");
    let mut approved = node.approved_routes.clone();
    approved.sort();
    assert_eq!(approved, vec!["192.0.2.0/24", "198.51.100.0/24"]);
    assert_eq!(
        hs.get_node(router.id)
            .await
            .expect("get node")
            .approved_routes
            .len(),
        2
    );
}

async fn users_and_api_keys(env: &TailnetEnv, hs: &Client) {
    // Users.
    let users = hs.list_users().await.expect("users");
    assert!(users.iter().any(|u| u.name == "alice"));

    // Working API keys: created with expiration, usable, expired by prefix.
    let before: Vec<u64> = hs
        .list_api_keys()
        .await
        .expect("keys")
        .iter()
        .map(|k| k.id)
        .collect();
    let working = hs.create_api_key(in_minutes(30)).await.expect("api key");
    let with_working = client(env, working.expose());
    assert!(with_working.health().await.expect("new key works"));
    let created = hs
        .list_api_keys()
        .await
        .expect("keys")
        .into_iter()
        .find(|k| !before.contains(&k.id))
        .expect("new key listed");
    assert!(created.expiration.expect("expiration") > Timestamp::now());
    hs.expire_api_key(&created.prefix)
        .await
        .expect("expire api key");
    assert!(matches!(
        with_working.health().await,
        Err(Error::Unauthorized { .. })
    ));
}

async fn node_deletion(env: &TailnetEnv, hs: &Client) {
    // Deleting a node.
    let joined = env
        .join_node(
            "doomed",
            tno_testenv_tailnet::JoinOptions {
                tags: vec!["tag:client".into()],
                ..Default::default()
            },
        )
        .await
        .expect("join node");
    let id = env
        .node_id(joined.node.hostname())
        .await
        .expect("node id")
        .expect("node exists");
    hs.delete_node(id).await.expect("delete node");
    assert!(
        hs.list_nodes()
            .await
            .expect("nodes")
            .iter()
            .all(|n| n.id != id)
    );
}
