//! The agent's config file (JSON rendered by the operator, read by the agent at start and on
//! every change). Invariants: no panic; an accepted config survives a serialize/parse round
//! trip unchanged.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tailnet_agent::config::from_bytes;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("/fuzz/config.json");
    let Ok(config) = from_bytes(path, data) else {
        return;
    };
    let again = serde_json::to_vec(&config).unwrap_or_else(|e| panic!("serialize: {e}"));
    match from_bytes(path, &again) {
        Ok(reparsed) => assert_eq!(reparsed, config, "round trip changed the config"),
        Err(error) => panic!("an accepted config does not re-parse: {error}"),
    }
});
