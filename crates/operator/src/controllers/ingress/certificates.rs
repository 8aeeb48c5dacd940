//! Does a TLS Secret carry a certificate that covers the ingress's names and is valid now?
//! Pure: PEM in, verdict out. Never a plaintext fallback: anything short of "covers every
//! name and is valid" keeps http exposes unserved.

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateVerdict {
    Valid {
        not_after: String,
    },
    /// The PEM is missing or not a certificate.
    Invalid(String),
    NamesNotCovered(Vec<String>),
    Expired {
        not_after: String,
    },
    NotYetValid {
        not_before: String,
    },
}

/// Whether `pattern` (a SAN, possibly `*.example.net`) matches `name`.
fn matches(pattern: &str, name: &str) -> bool {
    let pattern = pattern.to_ascii_lowercase();
    let name = name.to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        // A wildcard covers exactly one label.
        Some(suffix) => name
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == suffix),
        None => pattern == name,
    }
}

/// Checks the leaf certificate of `pem` against `names` at unix time `now`.
pub fn check(pem: &[u8], names: &[String], now: i64) -> CertificateVerdict {
    let Some(Ok(der)) = CertificateDer::pem_slice_iter(pem).next() else {
        return CertificateVerdict::Invalid("no PEM certificate in tls.crt".to_string());
    };
    let cert = match X509Certificate::from_der(der.as_ref()) {
        Ok((_, cert)) => cert,
        Err(e) => {
            return CertificateVerdict::Invalid(format!(
                "tls.crt is not a valid X.509 certificate: {e}"
            ));
        }
    };
    let validity = cert.validity();
    if now < validity.not_before.timestamp() {
        return CertificateVerdict::NotYetValid {
            not_before: validity.not_before.to_string(),
        };
    }
    if now > validity.not_after.timestamp() {
        return CertificateVerdict::Expired {
            not_after: validity.not_after.to_string(),
        };
    }
    let sans: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let missing: Vec<String> = names
        .iter()
        .filter(|n| !sans.iter().any(|s| matches(s, n)))
        .cloned()
        .collect();
    if missing.is_empty() {
        CertificateVerdict::Valid {
            not_after: validity.not_after.to_string(),
        }
    } else {
        CertificateVerdict::NamesNotCovered(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(names: &[&str], not_before: (i32, u8, u8), not_after: (i32, u8, u8)) -> String {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").pem()
    }

    const NOW_2026: i64 = 1_790_000_000; // 2026-09

    #[test]
    fn covers_names_and_wildcards() {
        let pem = cert(
            &["portal.team-a.lab.example.net", "*.lab.example.net"],
            (2026, 1, 1),
            (2027, 1, 1),
        );
        let names = vec![
            "portal.team-a.lab.example.net".to_string(),
            "portal.lab.example.net".to_string(),
        ];
        assert!(matches!(
            check(pem.as_bytes(), &names, NOW_2026),
            CertificateVerdict::Valid { .. }
        ));
        let more = vec![
            "admin.team-a.lab.example.net".to_string(),
            "a.b.lab.example.net".to_string(),
        ];
        assert_eq!(
            check(pem.as_bytes(), &more, NOW_2026),
            CertificateVerdict::NamesNotCovered(more.clone())
        );
    }

    #[test]
    fn expired_and_not_yet_valid() {
        let names = vec!["x.example.net".to_string()];
        let old = cert(&["x.example.net"], (2020, 1, 1), (2021, 1, 1));
        assert!(matches!(
            check(old.as_bytes(), &names, NOW_2026),
            CertificateVerdict::Expired { .. }
        ));
        let future = cert(&["x.example.net"], (2030, 1, 1), (2031, 1, 1));
        assert!(matches!(
            check(future.as_bytes(), &names, NOW_2026),
            CertificateVerdict::NotYetValid { .. }
        ));
    }

    #[test]
    fn garbage_is_invalid() {
        assert!(matches!(
            check(b"not a pem", &[], NOW_2026),
            CertificateVerdict::Invalid(_)
        ));
    }

    #[test]
    fn wildcard_rules() {
        assert!(matches("*.example.net", "a.example.net"));
        assert!(!matches("*.example.net", "example.net"));
        assert!(!matches("*.example.net", "a.b.example.net"));
        assert!(matches("A.Example.net", "a.example.net"));
    }
}
