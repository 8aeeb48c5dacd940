use std::sync::Arc;

use rustls::pki_types::ServerName;
use serde_json::json;

use super::*;

/// The first flight of a real rustls client for `server_name` (SNI is sent for DNS names,
/// not for IP addresses).
fn client_hello(server_name: &str) -> Vec<u8> {
    let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("versions: {e}"))
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = ServerName::try_from(server_name.to_owned()).unwrap_or_else(|e| panic!("{e}"));
    let mut connection = rustls::ClientConnection::new(Arc::new(config), name)
        .unwrap_or_else(|e| panic!("client: {e}"));
    let mut bytes = Vec::new();
    while connection.wants_write() {
        connection
            .write_tls(&mut bytes)
            .unwrap_or_else(|e| panic!("write_tls: {e}"));
    }
    bytes
}

/// The same handshake message cut into records of at most `size` bytes.
fn refragment(hello: &[u8], size: usize) -> Vec<u8> {
    let payload = &hello[5..];
    let mut out = Vec::new();
    for chunk in payload.chunks(size) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&u16::try_from(chunk.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

fn sni(bytes: &[u8]) -> Result<Hello, HelloError> {
    parse_client_hello(bytes)
}

#[test]
fn a_real_client_hello_yields_its_sni_and_every_prefix_is_incomplete() {
    let hello = client_hello("Backend-A.Example.COM");
    assert_eq!(
        sni(&hello),
        Ok(Hello::Complete {
            server_name: Some("backend-a.example.com".into())
        })
    );
    for cut in 0..hello.len() {
        assert_eq!(sni(&hello[..cut]), Ok(Hello::Incomplete), "prefix {cut}");
    }
    // Bytes after the ClientHello (e.g. early data) do not matter.
    let mut more = hello.clone();
    more.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
    assert!(matches!(sni(&more), Ok(Hello::Complete { .. })));
}

#[test]
fn a_client_hello_split_over_records_is_reassembled() {
    let hello = client_hello("b.example.com");
    for size in [1, 7, 100, 512] {
        let split = refragment(&hello, size);
        assert_eq!(
            sni(&split),
            Ok(Hello::Complete {
                server_name: Some("b.example.com".into())
            }),
            "records of {size}"
        );
        assert_eq!(sni(&split[..split.len() - 1]), Ok(Hello::Incomplete));
    }
}

#[test]
fn no_sni_for_an_ip_address() {
    assert_eq!(
        sni(&client_hello("192.0.2.1")),
        Ok(Hello::Complete { server_name: None })
    );
}

#[test]
fn garbage_is_refused_without_panicking() {
    let hello = client_hello("a.example.com");
    assert_eq!(sni(b"GET / HTTP/1.1\r\n\r\n"), Err(HelloError::NotTls));
    let mut server_hello = hello.clone();
    server_hello[5] = 2;
    assert_eq!(sni(&server_hello), Err(HelloError::NotClientHello));
    let mut empty_record = hello.clone();
    empty_record[3..5].copy_from_slice(&[0, 0]);
    assert_eq!(
        sni(&empty_record),
        Err(HelloError::Malformed("record length"))
    );
    let mut huge_record = hello.clone();
    huge_record[3..5].copy_from_slice(&[0x48, 0x01]);
    assert_eq!(
        sni(&huge_record),
        Err(HelloError::Malformed("record length"))
    );
    let mut huge_message = hello.clone();
    huge_message[6..9].copy_from_slice(&[0x01, 0, 0]);
    assert_eq!(sni(&huge_message), Err(HelloError::TooLarge));
    // A non-handshake record in the middle of a fragmented ClientHello.
    let mut interleaved = refragment(&hello, 50);
    interleaved[55] = 23;
    assert!(matches!(sni(&interleaved), Err(HelloError::Malformed(_))));
    // Every single-byte corruption of the body: an answer, never a panic.
    for index in 5..hello.len() {
        for value in [0u8, 0xff] {
            let mut corrupt = hello.clone();
            corrupt[index] = value;
            let _ = sni(&corrupt);
        }
    }
}

/// A minimal ClientHello body around an SNI extension with `names` (type, bytes).
fn hello_with_names(names: &[(u8, &[u8])]) -> Vec<u8> {
    let mut list = Vec::new();
    for (kind, name) in names {
        list.push(*kind);
        list.extend_from_slice(&u16::try_from(name.len()).unwrap_or(0).to_be_bytes());
        list.extend_from_slice(name);
    }
    let mut extension = (u16::try_from(list.len()).unwrap_or(0))
        .to_be_bytes()
        .to_vec();
    extension.extend_from_slice(&list);
    let mut extensions = vec![0, 0];
    extensions.extend_from_slice(&u16::try_from(extension.len()).unwrap_or(0).to_be_bytes());
    extensions.extend_from_slice(&extension);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[0; 32]);
    body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&u16::try_from(extensions.len()).unwrap_or(0).to_be_bytes());
    body.extend_from_slice(&extensions);
    let mut message = vec![1, 0];
    message.extend_from_slice(&u16::try_from(body.len()).unwrap_or(0).to_be_bytes());
    message.extend_from_slice(&body);
    let mut record = vec![22, 3, 1];
    record.extend_from_slice(&u16::try_from(message.len()).unwrap_or(0).to_be_bytes());
    record.extend_from_slice(&message);
    record
}

#[test]
fn the_first_host_name_entry_counts_and_bad_names_are_malformed() {
    assert_eq!(
        sni(&hello_with_names(&[
            (7, b"ignored"),
            (0, b"db.example.com.")
        ])),
        Ok(Hello::Complete {
            server_name: Some("db.example.com".into())
        })
    );
    assert_eq!(
        sni(&hello_with_names(&[(7, b"other")])),
        Ok(Hello::Complete { server_name: None })
    );
    for bad in [&b"a b"[..], b"", b"\xc3\xa4.example", b"."] {
        assert_eq!(
            sni(&hello_with_names(&[(0, bad)])),
            Err(HelloError::Malformed("server name is not a host name")),
            "{bad:?}"
        );
    }
}

fn site() -> PassthroughSite {
    let routes: Vec<PassthroughRoute> = serde_json::from_value(json!([
        {"name": "a", "hostnames": ["a.example.com"],
         "backends": [{"backend": {"host": "127.0.0.1", "port": 1}}]},
        {"name": "wild", "hostnames": ["*.example.com"],
         "backends": [{"backend": {"host": "127.0.0.1", "port": 2}, "weight": 0},
                      {"weight": 1}]},
    ]))
    .unwrap_or_else(|e| panic!("{e}"));
    PassthroughSite::new("tls-443".into(), &routes)
}

#[test]
fn routes_by_sni_exact_before_wildcard_and_none_without_catch_all() {
    let site = site();
    let name = |sni: Option<&str>| site.route_for(sni).map(|target| target.name.clone());
    assert_eq!(name(Some("a.example.com")).as_deref(), Some("a"));
    assert_eq!(name(Some("b.example.com")).as_deref(), Some("wild"));
    assert_eq!(name(Some("example.com")), None);
    assert_eq!(name(None), None, "no SNI, no catch-all");
    let wild = site.route_for(Some("x.example.com"));
    assert_eq!(wild.map(|target| target.weights.clone()), Some(vec![0, 1]));
    assert_eq!(wild.map(|target| target.backends[1].is_none()), Some(true));

    let any: Vec<PassthroughRoute> = serde_json::from_value(json!([
        {"name": "any", "hostnames": ["*"], "backends": []}
    ]))
    .unwrap_or_else(|e| panic!("{e}"));
    let any = PassthroughSite::new("tls".into(), &any);
    assert_eq!(any.route_for(None).map(|t| t.name.as_str()), Some("any"));
    assert_eq!(
        any.route_for(Some("whatever.test"))
            .map(|t| t.name.as_str()),
        Some("any")
    );
}
