//! The forwarding headers both floors set on every request, as nginx's configuration in the
//! ingress benchmark does (`proxy_set_header X-Forwarded-*`).

use hyper::header::HeaderName;

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
