//! Typed client for the Headscale REST API v1 (the grpc-gateway under `/api/v1`), written
//! against Headscale 0.29.x (`proto/headscale/v1`) and tolerant of 0.30's problem+json errors.
//!
//! - Bearer auth with an API key that never appears in `Debug`, `Display` or logs.
//! - IDs are `u64` on our side and JSON strings on the wire (protojson encodes `uint64` so).
//! - Keys are always created with an `expiration`: Headscale stores a key without one as
//!   already expired.
//! - Errors are typed ([`Error`]) and carry Headscale's message; transport failures are
//!   classified (DNS, connect, TLS, timeout) so a condition can name the cause.
//! - Only idempotent calls are retried, with exponential backoff.

mod client;
mod error;
mod secret;
mod types;

pub use client::{CallObserver, Client, ClientOptions, Endpoint, server_ca_certificates};
pub use error::{Error, TransportKind};
pub use secret::Secret;
pub use types::*;
