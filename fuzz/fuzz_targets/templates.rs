//! Hostname templates (`ingressNameTemplate`/`ingressAliasTemplate`) and the name helpers
//! around them. Input: `template\0name\0namespace` (missing parts are empty).
//! Invariants: no panic; an accepted template expands to a valid DNS hostname without
//! placeholders; derived names never exceed their limits.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tailnet_api::naming::{MAX_AGENT_NAME, MAX_NAME, shorten};
use tailnet_api::validate::{TargetAddress, expand_template};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.split('\0');
    let template = parts.next().unwrap_or_default();
    let name = parts.next().unwrap_or_default();
    let namespace = parts.next().unwrap_or_default();

    if let Ok(hostname) = expand_template("spec.dns.ingressNameTemplate", template, name, namespace)
    {
        assert!(hostname.len() <= 253, "{hostname:?} too long");
        assert!(
            hostname
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'),
            "{template:?} expanded to {hostname:?}"
        );
        assert!(
            hostname.split('.').all(|label| !label.is_empty()),
            "{template:?} expanded to {hostname:?} with an empty label"
        );
        // KNOWN, not yet fixed (crates/api): labels longer than 63 characters are accepted,
        // e.g. "{name}{name}.example.net" with a 40-character dnsLabel. Reproducer:
        // fuzz/regressions/templates/label-over-63. Enable once expand_template checks it:
        // assert!(hostname.split('.').all(|label| label.len() <= 63));
    }

    // Kubernetes object names are ASCII (DNS-1123); `shorten` is only defined there.
    if name.is_ascii() {
        for max in [MAX_NAME, MAX_AGENT_NAME] {
            let short = shorten(name, max);
            assert!(short.len() <= max, "shorten({name:?}, {max}) = {short:?}");
        }
    }

    // KNOWN CRASH, not yet fixed (crates/api is owned elsewhere): parse_duration panics in
    // kube-core's Duration parser on huge values such as "6222…2ns6ns" ("cannot convert float
    // seconds to Duration"); the CRD pattern has no maxLength, so the apiserver accepts them.
    // Reproducer: fuzz/regressions/templates/duration-overflow. Enable once bounded:
    // let _ = parse_duration("spec.exposes[0].timeouts.request", template);
    let _ = TargetAddress::parse("spec.targets[0].address", template);
});
