//! The body and error types the HTTP proxy and its dedicated backend connections share.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;
