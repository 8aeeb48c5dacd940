//! Helpers of the operator's real-environment tests, in one place so each test reads as its
//! scenario: polling ([`wait`]), CRD status conditions ([`conditions`]), the operator as a
//! process ([`lab_operator`] in the e2e lab, [`local_operator`] on the host), the objects the
//! tests apply ([`objects`]), TLS/TCP over a tailnet node's LocalAPI ([`tailnet`]) and an
//! agent pod's metrics from the lab ([`agent`]).

// Every test binary compiles all of it and uses a part.
#![allow(dead_code)]

pub mod agent;
pub mod conditions;
pub mod lab_operator;
pub mod lab_tls;
pub mod local_operator;
pub mod objects;
pub mod tailnet;
pub mod wait;
