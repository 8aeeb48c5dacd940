//! Hostname templates (`ingressNameTemplate`/`ingressAliasTemplate`) and the name helpers
//! around them. Input: `template\0name\0namespace` (missing parts are empty).
//! Invariants: no panic; an accepted template expands to a valid DNS hostname without
//! placeholders; derived names never exceed their limits.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tailnet_api::naming::{MAX_AGENT_NAME, MAX_NAME, shorten};
use tailnet_api::validate::{TargetAddress, expand_template, parse_duration};

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
        // Labels over 63 characters were accepted until 2161b4a (regression input:
        // fuzz/regressions/templates/label-over-63).
        assert!(
            hostname
                .split('.')
                .all(|label| !label.is_empty() && label.len() <= 63),
            "{template:?} expanded to {hostname:?} with an invalid label"
        );
    }

    // Kubernetes object names are ASCII (DNS-1123); `shorten` is only defined there.
    if name.is_ascii() {
        for max in [MAX_NAME, MAX_AGENT_NAME] {
            let short = shorten(name, max);
            assert!(short.len() <= max, "shorten({name:?}, {max}) = {short:?}");
        }
    }

    // Panicked in kube-core's parser on huge values until 2161b4a (regression input:
    // fuzz/regressions/templates/duration-overflow).
    if let Ok(duration) = parse_duration("spec.exposes[0].timeouts.request", template) {
        assert!(!duration.is_zero(), "{template:?} parsed to zero");
    }
    let _ = TargetAddress::parse("spec.targets[0].address", template);
});
