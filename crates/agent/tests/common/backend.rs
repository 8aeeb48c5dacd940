//! Real HTTP backends for the proxy tests: the test environment's HTTP backend
//! (`tno_testenv_kube::http_backend`, which pods run as `tno-test-servers http-backend`), here
//! in-process in the agent's netns.

use std::net::SocketAddr;
use std::sync::Arc;

// Each test binary uses a different part of it.
#[allow(unused_imports)]
pub use tno_testenv_kube::http_backend::{CHUNK, blob, gzip_body, pattern_chunk, pattern_sha256};

/// Serves the test endpoints on `address` (HTTP/1.1, plain or TLS).
pub async fn spawn(address: SocketAddr, tls: Option<Arc<rustls::ServerConfig>>) {
    tno_testenv_kube::http_backend::spawn(address, tls)
        .await
        .unwrap_or_else(|e| panic!("backend bind {address}: {e}"));
}
