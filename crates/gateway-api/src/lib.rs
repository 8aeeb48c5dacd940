//! Gateway API types (`gateway.networking.k8s.io`, Standard channel of
//! [`BUNDLE_VERSION`]) for the kinds tailnet-operator implements: GatewayClass, Gateway,
//! HTTPRoute, TLSRoute, TCPRoute and ReferenceGrant.
//!
//! The CRDs are the user's to install; these types only have to read what the apiserver
//! returns and write the status the spec defines. So they carry the fields the operator reads
//! or writes, with the upstream JSON names, and nothing else: unknown fields are ignored on
//! read (never `deny_unknown_fields`), and every enum-like field is a plain string, because
//! the spec adds values over time and an unknown value must become a condition, not a
//! deserialization error. The `crd_drift` test checks every serialized field path against the
//! upstream CRD schemas.
//!
//! Condition types and reasons are in [`conditions`], exactly as the spec spells them.

pub mod conditions;
pub mod gateway;
pub mod gatewayclass;
pub mod httproute;
pub mod referencegrant;
pub mod shared;
pub mod tcproute;
pub mod tlsroute;

pub use gateway::{Gateway, GatewaySpec, GatewayStatus, Listener, ListenerStatus};
pub use gatewayclass::{GatewayClass, GatewayClassSpec, GatewayClassStatus};
pub use httproute::{HTTPRoute, HTTPRouteSpec};
pub use referencegrant::{ReferenceGrant, ReferenceGrantSpec};
pub use shared::{
    BackendRef, ParentReference, RouteGroupKind, RouteParentStatus, RouteStatus,
    SecretObjectReference,
};
pub use tcproute::{TCPRoute, TCPRouteSpec};
pub use tlsroute::{TLSRoute, TLSRouteSpec};

/// The Gateway API release whose Standard-channel CRDs these types follow.
pub const BUNDLE_VERSION: &str = "v1.6.3";

/// The API group of every Gateway API kind.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// The version every kind here is served at in [`BUNDLE_VERSION`]'s Standard channel.
pub const VERSION: &str = "v1";

/// The core API group (`""`), as references spell it.
pub const CORE_GROUP: &str = "";

/// Kind names as references and ReferenceGrants spell them.
pub mod kinds {
    pub const GATEWAY_CLASS: &str = "GatewayClass";
    pub const GATEWAY: &str = "Gateway";
    pub const HTTP_ROUTE: &str = "HTTPRoute";
    pub const TLS_ROUTE: &str = "TLSRoute";
    pub const TCP_ROUTE: &str = "TCPRoute";
    pub const GRPC_ROUTE: &str = "GRPCRoute";
    pub const UDP_ROUTE: &str = "UDPRoute";
    pub const REFERENCE_GRANT: &str = "ReferenceGrant";
    pub const SECRET: &str = "Secret";
    pub const SERVICE: &str = "Service";
}

/// `Listener.protocol` values the spec defines (other, domain-prefixed values are allowed by
/// the schema).
pub mod protocols {
    pub const HTTP: &str = "HTTP";
    pub const HTTPS: &str = "HTTPS";
    pub const TLS: &str = "TLS";
    pub const TCP: &str = "TCP";
    pub const UDP: &str = "UDP";
}

/// `ListenerTLSConfig.mode` values.
pub mod tls_modes {
    pub const TERMINATE: &str = "Terminate";
    pub const PASSTHROUGH: &str = "Passthrough";
}

/// `RouteNamespaces.from` values.
pub mod from_namespaces {
    pub const ALL: &str = "All";
    pub const SELECTOR: &str = "Selector";
    pub const SAME: &str = "Same";
}

/// `GatewaySpecAddress.type` / `GatewayStatusAddress.type` values.
pub mod address_types {
    pub const IP_ADDRESS: &str = "IPAddress";
    pub const HOSTNAME: &str = "Hostname";
}
